// NCCL through dlopen: built when CUDA and nccl.h are found (EXASERVE_HAVE_NCCL),
// but the library is only loaded when a group is made. UNPROVEN ON HARDWARE
// (see the header); the parts most likely to need a fix on a real GPU are
// marked "unverified".
#include "gpu/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace exa::gpu {
namespace {

// Non-blocking communicators (ncclConfig_t::blocking = 0), which let every
// wait below be bounded, arrived in NCCL 2.14.
constexpr int nccl_version_min = 21400;
// How long a bounded wait sleeps between polls of the stream and NCCL's
// asynchronous error state: short next to a decode step, long next to a poll.
constexpr auto poll_interval = std::chrono::microseconds(50);

/// The NCCL entry points we call, resolved from libnccl.so.2 at run time. The
/// declarations in nccl.h give the types; nothing links against the library.
struct nccl_api {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) async_error = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
};

template <class F>
bool resolve(void* lib, const char* name, F& slot, std::string& missing) {
  slot = reinterpret_cast<F>(dlsym(lib, name));
  if (slot == nullptr) missing += missing.empty() ? name : std::string(", ") + name;
  return slot != nullptr;
}

expected<nccl_api> load_api() {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#if defined(EXASERVE_NCCL_LIBRARY)
  // The library the build found, for machines whose loader path lacks it.
  if (lib == nullptr) lib = dlopen(EXASERVE_NCCL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
#endif
  if (lib == nullptr) {
    const char* why = dlerror();
    return make_error(errc::unavailable, std::string("NCCL is not usable: cannot load libnccl.so.2: ") +
                                             (why != nullptr ? why : "unknown loader error"));
  }
  // Never dlclose: communicators may outlive any one caller.
  nccl_api api;
  std::string missing;
  resolve(lib, "ncclGetVersion", api.get_version, missing);
  resolve(lib, "ncclGetUniqueId", api.get_unique_id, missing);
  resolve(lib, "ncclCommInitRankConfig", api.init_rank_config, missing);
  resolve(lib, "ncclCommGetAsyncError", api.async_error, missing);
  resolve(lib, "ncclCommAbort", api.comm_abort, missing);
  resolve(lib, "ncclGetErrorString", api.error_string, missing);
  resolve(lib, "ncclGetLastError", api.last_error, missing);
  resolve(lib, "ncclAllReduce", api.all_reduce, missing);
  resolve(lib, "ncclReduceScatter", api.reduce_scatter, missing);
  resolve(lib, "ncclAllGather", api.all_gather, missing);
  resolve(lib, "ncclBroadcast", api.broadcast, missing);
  if (!missing.empty())
    return make_error(errc::unavailable, "NCCL is not usable: libnccl.so.2 lacks " + missing);
  int version = 0;
  if (api.get_version(&version) != ncclSuccess || version < nccl_version_min)
    return make_error(errc::unavailable, "NCCL is not usable: libnccl.so.2 is version " + std::to_string(version) +
                                             ", need at least " + std::to_string(nccl_version_min));
  return api;
}

/// Loaded once per process; the answer (library or reason) is kept.
const expected<nccl_api>& nccl() {
  static const expected<nccl_api> api = load_api();
  return api;
}

std::string describe(const nccl_api& api, const char* what, ncclResult_t rc, ncclComm_t comm) {
  std::string out = std::string(what) + ": " + api.error_string(rc);
  const char* detail = api.last_error(comm);
  if (detail != nullptr && *detail != '\0') out += std::string(" (") + detail + ")";
  return out;
}

std::string cuda_reason(const char* what, cudaError_t rc) {
  return std::string(what) + ": " + cudaGetErrorString(rc);
}

class nccl_member final : public nccl_communicator {
 public:
  nccl_member(const nccl_api& api, ncclComm_t comm, int rank, int size, int device, cudaStream_t stream,
              std::chrono::milliseconds timeout, float* barrier_word)
      : api_(api), comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream),
        timeout_(timeout), barrier_word_(barrier_word) {}

  ~nccl_member() override {
    // ncclCommAbort rather than finalize + destroy: it is local (it cannot
    // wait on a peer that is gone) and frees the same resources.
    std::lock_guard lock(mu_);
    if (comm_ != nullptr) {
      cudaSetDevice(device_);
      api_.comm_abort(comm_);
    }
    if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int device() const noexcept override { return device_; }
  void* stream() const noexcept override { return stream_; }

  expected<void> all_reduce_sum(float* data, std::size_t count) override {
    return enqueue("ncclAllReduce", [&] {
      return api_.all_reduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  expected<void> reduce_scatter_sum(const float* send, float* recv, std::size_t count) override {
    return enqueue("ncclReduceScatter", [&] {
      return api_.reduce_scatter(send, recv, count, ncclFloat32, ncclSum, comm_, stream_);
    });
  }
  expected<void> all_gather(const float* send, float* recv, std::size_t count) override {
    return enqueue("ncclAllGather", [&] {
      return api_.all_gather(send, recv, count, ncclFloat32, comm_, stream_);
    });
  }
  expected<void> broadcast(float* data, std::size_t count, int root) override {
    if (root < 0 || root >= size_) {
      const std::string why = "broadcast root " + std::to_string(root) + " outside 0.." + std::to_string(size_ - 1);
      abort("member " + std::to_string(rank_) + " passed an invalid " + why);
      return make_error(errc::invalid_argument, why);
    }
    return enqueue("ncclBroadcast", [&] {
      return api_.broadcast(data, data, count, ncclFloat32, root, comm_, stream_);
    });
  }
  expected<void> barrier() override {
    if (auto r = all_reduce_sum(barrier_word_, 1); !r) return r;
    return wait();
  }

  expected<void> wait() override;

  void abort(const std::string& reason) override {
    std::lock_guard lock(mu_);
    abort_locked(reason);
  }
  bool aborted() const noexcept override { return aborted_.load(std::memory_order_acquire); }

 private:
  template <class Call>
  expected<void> enqueue(const char* what, Call&& call);
  expected<void> settle(const char* what, std::unique_lock<std::mutex>& lock);
  std::unexpected<error> failure_locked(const char* what) const {
    return make_error(errc::unavailable, std::string(what) + ": NCCL group aborted: " + reason_);
  }
  void abort_locked(const std::string& reason) {
    if (aborted_.load(std::memory_order_relaxed)) return;
    reason_ = reason;
    aborted_.store(true, std::memory_order_release);
    // Stops this member's kernels that wait on peers; the peers' own waits
    // time out (or the replica actor aborts them on our failure message).
    cudaSetDevice(device_);
    api_.comm_abort(comm_);
    comm_ = nullptr;
  }

  const nccl_api& api_;
  // Every NCCL call on comm_ holds mu_; non-blocking mode keeps each short, so
  // abort() from another thread waits at most one poll.
  mutable std::mutex mu_;
  ncclComm_t comm_;
  const int rank_;
  const int size_;
  const int device_;
  cudaStream_t stream_;
  const std::chrono::milliseconds timeout_;
  float* barrier_word_;  // one device float, the payload of barrier()
  std::string reason_;
  std::atomic<bool> aborted_{false};
};

template <class Call>
expected<void> nccl_member::enqueue(const char* what, Call&& call) {
  std::unique_lock lock(mu_);
  if (aborted_.load(std::memory_order_relaxed)) return failure_locked(what);
  if (cudaError_t rc = cudaSetDevice(device_); rc != cudaSuccess) {
    abort_locked(cuda_reason("cudaSetDevice", rc));
    return failure_locked(what);
  }
  const ncclResult_t rc = call();
  // A non-blocking communicator may still be enqueueing when the call returns.
  if (rc == ncclInProgress) return settle(what, lock);
  if (rc != ncclSuccess) {
    abort_locked(describe(api_, what, rc, comm_));
    return failure_locked(what);
  }
  return {};
}

/// Polls NCCL's state until an operation in progress has been enqueued (or
/// failed), releasing the lock between polls so abort() stays prompt.
expected<void> nccl_member::settle(const char* what, std::unique_lock<std::mutex>& lock) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    if (aborted_.load(std::memory_order_relaxed)) return failure_locked(what);
    ncclResult_t state = ncclInProgress;
    if (ncclResult_t rc = api_.async_error(comm_, &state); rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return {};
    if (state != ncclInProgress) {
      abort_locked(describe(api_, what, state, comm_));
      return failure_locked(what);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      abort_locked(std::string(what) + " was still being enqueued after " + std::to_string(timeout_.count()) + " ms");
      return failure_locked(what);
    }
    lock.unlock();
    std::this_thread::sleep_for(poll_interval);
    lock.lock();
  }
}

expected<void> nccl_member::wait() {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  std::unique_lock lock(mu_);
  for (;;) {
    if (aborted_.load(std::memory_order_relaxed)) return failure_locked("wait");
    cudaSetDevice(device_);
    const cudaError_t query = cudaStreamQuery(stream_);
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t rc = api_.async_error(comm_, &state); rc != ncclSuccess) state = rc;
    if (state != ncclSuccess && state != ncclInProgress) {
      abort_locked(describe(api_, "NCCL asynchronous error", state, comm_));
      return failure_locked("wait");
    }
    if (query == cudaSuccess) return {};
    if (query != cudaErrorNotReady) {
      abort_locked(cuda_reason("cudaStreamQuery", query));
      return failure_locked("wait");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      abort_locked("collectives did not complete within " + std::to_string(timeout_.count()) +
                   " ms (a peer is gone or stuck)");
      return failure_locked("wait");
    }
    lock.unlock();
    std::this_thread::sleep_for(poll_interval);
    lock.lock();
  }
}

/// Waits for a non-blocking ncclCommInitRankConfig to finish: every member
/// must join within the timeout.
expected<void> await_init(const nccl_api& api, ncclComm_t comm, int size, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    if (ncclResult_t rc = api.async_error(comm, &state); rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return {};
    if (state != ncclInProgress)
      return make_error(errc::unavailable, describe(api, "ncclCommInitRankConfig", state, comm));
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(errc::unavailable, "ncclCommInitRankConfig: the group's " + std::to_string(size) +
                                               " members did not all join within " +
                                               std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(poll_interval);
  }
}

}  // namespace

expected<void> nccl_available() {
  if (!nccl()) return std::unexpected(nccl().error());
  return {};
}

expected<nccl_unique_id> nccl_make_unique_id() {
  const auto& api = nccl();
  if (!api) return std::unexpected(api.error());
  static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<nccl_unique_id>);
  ncclUniqueId raw{};
  if (ncclResult_t rc = api->get_unique_id(&raw); rc != ncclSuccess)
    return make_error(errc::unavailable, describe(*api, "ncclGetUniqueId", rc, nullptr));
  nccl_unique_id id;
  std::memcpy(id.data(), &raw, id.size());
  return id;
}

expected<std::unique_ptr<nccl_communicator>> nccl_communicator::create(const nccl_unique_id& id, int rank,
                                                                       int size, int device, void* stream,
                                                                       std::chrono::milliseconds timeout) {
  const auto& api = nccl();
  if (!api) return std::unexpected(api.error());
  if (size < 1 || rank < 0 || rank >= size)
    return make_error(errc::invalid_argument, "NCCL rank " + std::to_string(rank) + " of group size " +
                                                  std::to_string(size) + " is out of range");
  if (timeout.count() <= 0) return make_error(errc::invalid_argument, "NCCL timeout must be positive");
  if (cudaError_t rc = cudaSetDevice(device); rc != cudaSuccess)
    return make_error(errc::unavailable, cuda_reason("cudaSetDevice", rc));

  ncclUniqueId raw;
  std::memcpy(&raw, id.data(), id.size());
  // The struct is nccl.h's (2.28 here); an older library reads the prefix it
  // knows, as NCCL's versioned config promises (unverified on old libraries).
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = api->init_rank_config(&comm, size, raw, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm != nullptr) api->comm_abort(comm);
    return make_error(errc::unavailable, describe(*api, "ncclCommInitRankConfig", rc, comm));
  }
  if (auto joined = await_init(*api, comm, size, timeout); !joined) {
    api->comm_abort(comm);
    return std::unexpected(joined.error());
  }
  float* word = nullptr;
  if (cudaError_t mrc = cudaMalloc(reinterpret_cast<void**>(&word), sizeof(float)); mrc != cudaSuccess) {
    api->comm_abort(comm);
    return make_error(errc::out_of_memory, cuda_reason("cudaMalloc of the barrier word", mrc));
  }
  cudaMemset(word, 0, sizeof(float));  // a defined payload; its value is never read
  return std::unique_ptr<nccl_communicator>(new nccl_member(*api, comm, rank, size, device,
                                                            static_cast<cudaStream_t>(stream), timeout, word));
}

}  // namespace exa::gpu
