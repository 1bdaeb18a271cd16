#include "gpu/cuda_device.hpp"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <mutex>

#include "gpu/cuda_engine.hpp"
#include "gpu/device_engine.hpp"
#include "gpu/nvml.hpp"

namespace exa::gpu {
namespace {

std::string cuda_message(const char* what, cudaError_t rc) {
  return std::string(what) + ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
}

// A task's completion, waiting for the stream to run what the task enqueued.
struct stream_completion {
  executor::completion done;
  task_outcome outcome;
  std::chrono::steady_clock::time_point started;
};

// Runs on a CUDA runtime thread once the stream reached it: no CUDA calls
// here (the runtime forbids them), only the hand-over.
void CUDART_CB on_stream_reached(void* p) {
  std::unique_ptr<stream_completion> c(static_cast<stream_completion*>(p));
  c->outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c->started).count();
  c->done(std::move(c->outcome));
}

class cuda_device final : public device {
 public:
  static expected<std::shared_ptr<device>> open(std::uint32_t index, const device_options& options);
  ~cuda_device() override;

  device_kind kind() const noexcept override { return device_kind::cuda; }
  std::uint32_t index() const noexcept override { return index_; }
  std::string name() const override { return name_; }
  engine::block_pool& pool() noexcept override { return *pool_; }
  executor& exec() noexcept override { return *exec_; }
  expected<std::shared_ptr<engine::inference_engine>> make_engine(std::shared_ptr<const model::llama_model> model,
                                                                  const engine_options& options) override;
  expected<void> check_health() override;
  telemetry read_telemetry() const override;

 private:
  cuda_device() = default;
  void finish(task_outcome outcome, executor::completion done);
  void record_fault(const std::string& why);

  std::uint32_t index_ = 0;
  std::string name_;
  std::string pci_bus_id_;
  std::uint64_t budget_bytes_ = 0;
  std::unique_ptr<cuda_memory_pool> pool_;
  cudaStream_t stream_ = nullptr;
  // Queried by check_health() from the actor's thread. Never stream_: the
  // executor thread may be recording a CUDA graph on it, and querying a
  // capturing stream is illegal -- it fails and invalidates the capture.
  cudaStream_t health_stream_ = nullptr;
  mutable std::mutex fault_mutex_;
  std::string fault_;  // guarded by fault_mutex_: the first CUDA error seen
  std::unique_ptr<executor> exec_;  // last: stopped before the stream and pool go
};

expected<std::shared_ptr<device>> cuda_device::open(std::uint32_t index, const device_options& options) {
  auto count = cuda_device_count();
  if (!count) return std::unexpected(count.error());
  if (index >= static_cast<std::uint32_t>(*count))
    return make_error(errc::invalid_argument, "CUDA device " + std::to_string(index) + " does not exist (" +
                                                  std::to_string(*count) + " present)");
  if (auto rc = cudaSetDevice(static_cast<int>(index)); rc != cudaSuccess)
    return make_error(errc::unavailable, cuda_message("cudaSetDevice", rc));
  std::size_t free_bytes = 0, total_bytes = 0;
  if (auto rc = cudaMemGetInfo(&free_bytes, &total_bytes); rc != cudaSuccess)
    return make_error(errc::unavailable, cuda_message("cudaMemGetInfo", rc));
  std::shared_ptr<cuda_device> d(new cuda_device());
  d->index_ = index;
  d->budget_bytes_ = cuda_memory_budget(options.memory_bytes, free_bytes, total_bytes);
  const std::uint64_t kv_bytes = d->budget_bytes_ / 100 * options.kv_pool_percent;
  if (options.page_bytes == 0 || kv_bytes < options.page_bytes)
    return make_error(errc::invalid_argument, "CUDA device " + std::to_string(index) + ": a KV pool of " +
                                                  std::to_string(kv_bytes) + " bytes holds no page (" +
                                                  std::to_string(free_bytes) + " bytes free of " +
                                                  std::to_string(total_bytes) + ")");
  auto pool = cuda_memory_pool::create(static_cast<int>(index), options.page_bytes,
                                       static_cast<std::uint32_t>(std::min<std::uint64_t>(kv_bytes / options.page_bytes, UINT32_MAX)));
  if (!pool) return std::unexpected(pool.error());
  d->pool_ = std::move(*pool);
  if (auto rc = cudaStreamCreateWithFlags(&d->stream_, cudaStreamNonBlocking); rc != cudaSuccess)
    return make_error(errc::unavailable, cuda_message("cudaStreamCreate", rc));
  if (auto rc = cudaStreamCreateWithFlags(&d->health_stream_, cudaStreamNonBlocking); rc != cudaSuccess)
    return make_error(errc::unavailable, cuda_message("cudaStreamCreate", rc));
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, static_cast<int>(index)) == cudaSuccess) d->name_ = prop.name;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, static_cast<int>(index)) == cudaSuccess) d->pci_bus_id_ = bus;
  auto* raw = d.get();  // the executor is a member: it never outlives the device
  d->exec_ = std::make_unique<thread_executor>(
      "exa-cuda" + std::to_string(index), options.queue_max, [index] { cudaSetDevice(static_cast<int>(index)); },
      [raw](task_outcome o, executor::completion done) { raw->finish(std::move(o), std::move(done)); });
  spdlog::info("event=cuda_device_opened device={} name=\"{}\" pci={} free_bytes={} total_bytes={} budget_bytes={} "
               "kv_pool_bytes={}",
               index, d->name_, d->pci_bus_id_, free_bytes, total_bytes, d->budget_bytes_,
               std::uint64_t{d->pool_->block_bytes()} * d->pool_->capacity_blocks());
  return std::shared_ptr<device>(std::move(d));
}

cuda_device::~cuda_device() {
  exec_.reset();  // no new work; queued tasks fail
  if (stream_) {
    cudaSetDevice(static_cast<int>(index_));
    cudaStreamSynchronize(stream_);  // pending host callbacks run before the stream goes
    cudaStreamDestroy(stream_);
  }
  if (health_stream_) cudaStreamDestroy(health_stream_);
}

void cuda_device::record_fault(const std::string& why) {
  std::lock_guard lock(fault_mutex_);
  if (fault_.empty()) fault_ = why;
}

// On the executor's thread after each task: a CUDA error fails the task (and
// marks the device). Every completion, a failed one too, waits for the stream,
// so tasks complete in the order they were submitted: a task that threw is
// not reported before the tasks ahead of it, still running on the device
// (seen on an H200: the throwing 101st task came back first). Only where the
// stream cannot take the callback (a broken context) is it reported at once.
void cuda_device::finish(task_outcome outcome, executor::completion done) {
  if (!outcome.failure) {
    if (auto rc = cudaGetLastError(); rc != cudaSuccess) {
      record_fault(cuda_message("after a task", rc));
      outcome.failure = error{errc::unavailable, "CUDA device " + std::to_string(index_) + ": " + cuda_message("after a task", rc)};
    }
  }
  // A stream still capturing a graph (a task that failed mid-capture) would
  // record the callback instead of running it: report at once.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone) {
    record_fault("the stream was left capturing a graph after a task");
    if (!outcome.failure) outcome.failure = error{errc::unavailable, "CUDA device " + std::to_string(index_) +
                                                                         ": the stream was left capturing a graph"};
    return done(std::move(outcome));
  }
  const auto started = std::chrono::steady_clock::now() -
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(outcome.seconds));
  auto* c = new stream_completion{std::move(done), std::move(outcome), started};
  if (auto rc = cudaLaunchHostFunc(stream_, on_stream_reached, c); rc != cudaSuccess) {
    std::unique_ptr<stream_completion> own(c);
    record_fault(cuda_message("cudaLaunchHostFunc", rc));
    if (!own->outcome.failure) own->outcome.failure = error{errc::unavailable, cuda_message("cudaLaunchHostFunc", rc)};
    own->done(std::move(own->outcome));
  }
}

// The CUDA engine (gpu/cuda_engine.hpp) on this device's pool and stream.
expected<std::shared_ptr<engine::inference_engine>> cuda_device::make_engine(
    std::shared_ptr<const model::llama_model> model, const engine_options& options) {
  if (!model) return make_error(errc::invalid_argument, "no model to run");
  auto ec = paged_kv_config(engine::cpu_engine::kv_block_bytes(model->config(), 1), pool_->block_bytes(),
                            options.kv_tokens);
  if (!ec) return std::unexpected(ec.error());
  if (options.draft) {  // checked like everywhere; the engine then says whether it drafts
    auto k = checked_draft_tokens(*model, options);
    if (!k) return std::unexpected(k.error());
    ec->draft = options.draft;
    ec->draft_tokens = *k;
  }
  cuda_engine_options co;
  co.engine = *ec;
  co.kv_pool = pool_.get();
  co.stream = stream_;
  auto made = make_cuda_engine(std::move(model), static_cast<int>(index_), co);
  if (!made) return std::unexpected(made.error());
  return bind_to_device(shared_from_this(), std::move(*made));
}

expected<void> cuda_device::check_health() {
  {
    std::lock_guard lock(fault_mutex_);
    if (!fault_.empty()) return make_error(errc::unavailable, "CUDA device " + std::to_string(index_) + ": " + fault_);
  }
  if (auto rc = cudaSetDevice(static_cast<int>(index_)); rc != cudaSuccess)
    return make_error(errc::unavailable, cuda_message("cudaSetDevice", rc));
  // A sticky error (a faulted kernel) poisons the context: every call fails.
  // Querying a stream asks the device without waiting for it -- an idle one
  // of our own, never stream_, which the executor may be capturing.
  const auto rc = cudaStreamQuery(health_stream_);
  if (rc != cudaSuccess && rc != cudaErrorNotReady) {
    record_fault(cuda_message("cudaStreamQuery", rc));
    return make_error(errc::unavailable, "CUDA device " + std::to_string(index_) + ": " + cuda_message("cudaStreamQuery", rc));
  }
  if (auto e = cudaPeekAtLastError(); e != cudaSuccess)
    return make_error(errc::unavailable, "CUDA device " + std::to_string(index_) + ": " + cuda_message("pending error", e));
  return {};
}

telemetry cuda_device::read_telemetry() const {
  telemetry t;
  t.memory_budget_bytes = budget_bytes_;
  const auto block = static_cast<std::uint64_t>(pool_->block_bytes());
  t.memory_reserved_bytes = block * pool_->capacity_blocks();
  t.memory_used_bytes = block * (pool_->capacity_blocks() - pool_->free_blocks());
  {
    std::lock_guard lock(fault_mutex_);
    t.error = fault_;
  }
  if (auto n = nvml::get(); n && !pci_bus_id_.empty()) {
    const auto r = n->read(pci_bus_id_);
    t.temperature_c = r.temperature_c;
    t.utilization_percent = r.utilization_percent;
  }
  return t;
}

}  // namespace

expected<std::shared_ptr<device>> open_cuda_device(std::uint32_t index, const device_options& options) {
  return cuda_device::open(index, options);
}

}  // namespace exa::gpu
