// The NCCL communicator on real devices: one member per visible GPU (NCCL
// does not allow two members of a group on one device), each on its own
// thread and stream. Exits 77 (ctest: SKIPPED) with the reason when there is
// no GPU or no usable NCCL; never reports a pass it did not run.
//
// Checks: every collective against exact expectations (small integers, so
// sums are exact whatever order NCCL adds in), wait() and barrier(), abort()
// failing later calls with the reason, and a group whose second member never
// joins timing out in create() instead of hanging.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu/communicator.hpp"
#include "gpu/cuda_memory_pool.hpp"

#if defined(EXASERVE_HAVE_NCCL)
#include <cuda_runtime_api.h>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>
#endif

namespace {

int skipped(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  return 77;
}

#if defined(EXASERVE_HAVE_NCCL)
using namespace exa;

std::mutex failures_mu;
std::vector<std::string> failures;

void fail(const std::string& what) {
  std::lock_guard lock(failures_mu);
  failures.push_back(what);
}

#define NCCL_CHECK(cond, what)                                              \
  do {                                                                      \
    if (!(cond)) fail(std::string(what) + " (line " + std::to_string(__LINE__) + ")"); \
  } while (false)

// Member r's value at index i: small integers, exact in float when summed.
float value(int r, std::size_t i) { return static_cast<float>((r + 1) * static_cast<int>(i % 13 + 1)); }

void run_member(const gpu::nccl_unique_id& id, int rank, int size) {
  constexpr std::size_t count = 4099;  // odd, several NCCL chunks on a small group
  if (cudaSetDevice(rank) != cudaSuccess) return fail("cudaSetDevice");
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) return fail("cudaStreamCreate");
  auto comm = gpu::nccl_communicator::create(id, rank, size, rank, stream, std::chrono::milliseconds(60000));
  if (!comm) return fail("create: " + comm.error().message);
  gpu::nccl_communicator& c = **comm;
  NCCL_CHECK(c.rank() == rank && c.size() == size, "rank/size");

  const std::size_t total = count * static_cast<std::size_t>(size);
  float* dev = nullptr;
  float* dev_big = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&dev), count * sizeof(float));
  cudaMalloc(reinterpret_cast<void**>(&dev_big), total * sizeof(float));
  std::vector<float> host(count), big(total);

  // all_reduce_sum
  for (std::size_t i = 0; i < count; ++i) host[i] = value(rank, i);
  cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  NCCL_CHECK(c.all_reduce_sum(dev, count).has_value(), "all_reduce_sum enqueue");
  NCCL_CHECK(c.wait().has_value(), "all_reduce_sum wait");
  cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost);
  const int ranks_sum = size * (size + 1) / 2;
  for (std::size_t i = 0; i < count; ++i)
    NCCL_CHECK(host[i] == static_cast<float>(ranks_sum * static_cast<int>(i % 13 + 1)), "all_reduce_sum value");

  // reduce_scatter_sum: member r gets chunk r summed
  for (std::size_t i = 0; i < total; ++i) big[i] = value(rank, i);
  cudaMemcpy(dev_big, big.data(), total * sizeof(float), cudaMemcpyHostToDevice);
  NCCL_CHECK(c.reduce_scatter_sum(dev_big, dev, count).has_value(), "reduce_scatter_sum enqueue");
  NCCL_CHECK(c.wait().has_value(), "reduce_scatter_sum wait");
  cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t g = static_cast<std::size_t>(rank) * count + i;
    NCCL_CHECK(host[i] == static_cast<float>(ranks_sum * static_cast<int>(g % 13 + 1)), "reduce_scatter value");
  }

  // all_gather: rank order
  for (std::size_t i = 0; i < count; ++i) host[i] = value(rank, i);
  cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  NCCL_CHECK(c.all_gather(dev, dev_big, count).has_value(), "all_gather enqueue");
  NCCL_CHECK(c.wait().has_value(), "all_gather wait");
  cudaMemcpy(big.data(), dev_big, total * sizeof(float), cudaMemcpyDeviceToHost);
  for (std::size_t i = 0; i < total; ++i)
    NCCL_CHECK(big[i] == value(static_cast<int>(i / count), i % count), "all_gather value");

  // broadcast from the last member
  for (std::size_t i = 0; i < count; ++i) host[i] = value(rank, i);
  cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  NCCL_CHECK(c.broadcast(dev, count, size - 1).has_value(), "broadcast enqueue");
  NCCL_CHECK(c.barrier().has_value(), "barrier");
  cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost);
  for (std::size_t i = 0; i < count; ++i) NCCL_CHECK(host[i] == value(size - 1, i), "broadcast value");

  // abort: later calls fail at once with the reason (every member aborts its
  // own communicator, so no peer is left waiting in a collective)
  c.abort("test abort");
  auto after = c.all_reduce_sum(dev, count);
  NCCL_CHECK(!after && after.error().code == errc::unavailable &&
                 after.error().message.find("test abort") != std::string::npos,
             "call after abort");
  NCCL_CHECK(!c.wait().has_value(), "wait after abort");

  cudaFree(dev);
  cudaFree(dev_big);
  comm->reset();
  cudaStreamDestroy(stream);
}

/// A group of two whose second member never calls create(): rank 0 must get
/// `unavailable` after the timeout instead of hanging.
void check_join_timeout() {
  auto id = gpu::nccl_make_unique_id();
  if (!id) return fail("unique id: " + id.error().message);
  cudaSetDevice(0);
  const auto start = std::chrono::steady_clock::now();
  auto comm = gpu::nccl_communicator::create(*id, 0, 2, 0, nullptr, std::chrono::milliseconds(3000));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  NCCL_CHECK(!comm.has_value(), "create without the second member must fail");
  if (!comm) {
    NCCL_CHECK(comm.error().code == errc::unavailable, "join timeout code");
    std::printf("join timeout after %.2f s: %s\n", s, comm.error().message.c_str());
  }
  NCCL_CHECK(s < 30.0, "join timeout is bounded");
}
#endif

}  // namespace

int main() {
#if !defined(EXASERVE_HAVE_NCCL)
  return skipped("this build has no NCCL support (CUDA or nccl.h not found at build time)");
#else
  auto devices = exa::gpu::cuda_device_count();
  if (!devices) return skipped(devices.error().message);
  if (auto usable = exa::gpu::nccl_available(); !usable) return skipped(usable.error().message);
  const int size = std::min(*devices, 8);
  auto id = exa::gpu::nccl_make_unique_id();
  if (!id) {
    std::printf("FAILED: %s\n", id.error().message.c_str());
    return 1;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] { run_member(*id, r, size); });
  for (auto& t : threads) t.join();
  check_join_timeout();
  for (const auto& f : failures) std::printf("FAILED: %s\n", f.c_str());
  std::printf("nccl_test: %d member(s), %zu failure(s)\n", size, failures.size());
  return failures.empty() ? 0 : 1;
#endif
}
