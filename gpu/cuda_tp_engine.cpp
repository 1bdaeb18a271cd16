// CUDA tensor parallelism: NCCL group forming and the member forwards under
// engine::tp_engine. UNPROVEN ON HARDWARE (see the header).
#include "gpu/cuda_tp_engine.hpp"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "engine/tp_engine.hpp"
#include "engine/tp_weights.hpp"
#include "gpu/cuda_forward.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/cuda_weight_plan.hpp"
#include "gpu/nccl_communicator.hpp"

namespace exa::gpu {
namespace {

// A stream per member on its device, destroyed after everything that uses it.
struct member_stream {
  int device = 0;
  cudaStream_t stream = nullptr;
  ~member_stream() {
    if (stream == nullptr) return;
    cudaSetDevice(device);
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
};

// Destroyed bottom up: the engine (its forwards) before the communicators,
// pools and streams it uses.
class cuda_tp_device_engine final : public engine::inference_engine {
 public:
  std::vector<std::unique_ptr<member_stream>> streams;
  std::vector<std::unique_ptr<cuda_memory_pool>> own_pools;
  std::vector<std::shared_ptr<nccl_communicator>> comms;
  std::unique_ptr<engine::tp_engine> inner;

  expected<void> submit(engine::generation_request request) override { return inner->submit(std::move(request)); }
  void cancel(engine::seq_id id) override { inner->cancel(id); }
  bool idle() const override { return inner->idle(); }
  engine::step_result step() override { return inner->step(); }
  engine::engine_stats stats() const override { return inner->stats(); }
  std::optional<std::string> fault() const override { return inner->fault(); }
};

expected<void> check_request(const model::llama_model* model, const cuda_tp_options& o) {
  if (model == nullptr) return make_error(errc::invalid_argument, "no model to run");
  if (o.engine.draft) return make_error(errc::unsupported, "speculative decoding under tensor parallelism is not supported");
  if (o.devices.size() < 2)
    return make_error(errc::invalid_argument, "a CUDA tensor-parallel group needs two devices or more");
  for (std::size_t r = 0; r < o.devices.size(); ++r)
    for (std::size_t s = 0; s < r; ++s)
      if (o.devices[s] == o.devices[r])
        return make_error(errc::invalid_argument, "CUDA device " + std::to_string(o.devices[r]) +
                                                      " is listed twice in a tensor-parallel group");
  if (!o.kv_pools.empty() && o.kv_pools.size() != o.devices.size())
    return make_error(errc::invalid_argument, "give one KV pool per CUDA device of the group, or none");
  if (o.kv_pools.empty() && o.own_kv_blocks == 0)
    return make_error(errc::invalid_argument, "give the CUDA tensor-parallel engine KV pools or a number of blocks to reserve");
  if (o.engine.kv_block_tokens == 0) return make_error(errc::invalid_argument, "KV blocks must hold at least one token");
  const auto g = static_cast<std::uint32_t>(o.devices.size());
  if (auto ok = engine::check_tp_split(model->config(), model->weights(), g); !ok) return ok;
  // A member's shard must be what the kernels take (a width of 32s): named on any machine.
  auto shard = engine::tp_weights::shard(model->config(), model->weights(), 0, g);
  if (!shard) return std::unexpected(shard.error());
  if (auto plan = plan_weights(model->config(), shard->weights()); !plan) return std::unexpected(plan.error());
  return {};
}

// Every member joins the group on a thread of its own: NCCL's init returns
// only once all members have called it.
expected<std::vector<std::shared_ptr<nccl_communicator>>> form_group(
    const std::vector<std::unique_ptr<member_stream>>& streams, std::chrono::milliseconds timeout) {
  if (auto ok = nccl_available(); !ok) return std::unexpected(ok.error());
  auto id = nccl_make_unique_id();
  if (!id) return std::unexpected(id.error());
  const int g = static_cast<int>(streams.size());
  std::vector<std::optional<expected<std::unique_ptr<nccl_communicator>>>> made(streams.size());
  {
    std::vector<std::jthread> joiners;
    for (int r = 0; r < g; ++r)
      joiners.emplace_back([&, r] {
        made[r] = nccl_communicator::create(*id, r, g, streams[r]->device, streams[r]->stream, timeout);
      });
  }  // each create is bounded by the timeout: the joins are too
  std::vector<std::shared_ptr<nccl_communicator>> comms;
  std::optional<error> first;
  for (auto& m : made) {
    if (m && *m) {
      comms.push_back(std::move(**m));
    } else if (!first) {
      first = m ? (*m).error() : error{errc::unavailable, "an NCCL member did not report"};
    }
  }
  if (first) {
    for (auto& c : comms) c->abort("another member failed to join: " + first->message);
    return std::unexpected(*first);
  }
  return comms;
}

}  // namespace

expected<cuda_tp_engine> make_cuda_tp_engine(std::shared_ptr<const model::llama_model> model, cuda_tp_options o) {
  if (auto ok = check_request(model.get(), o); !ok) return std::unexpected(ok.error());
  auto count = cuda_device_count();
  if (!count) return std::unexpected(count.error());
  for (int d : o.devices)
    if (d < 0 || d >= *count)
      return make_error(errc::invalid_argument, "CUDA device " + std::to_string(d) + " does not exist (" +
                                                    std::to_string(*count) + " present)");
  const auto g = static_cast<std::uint32_t>(o.devices.size());
  const auto& c = model->config();
  const std::uint32_t bt = o.engine.kv_block_tokens;
  auto out = std::make_unique<cuda_tp_device_engine>();
  for (int d : o.devices) {
    auto s = std::make_unique<member_stream>();
    s->device = d;
    if (auto rc = cudaSetDevice(d); rc != cudaSuccess)
      return make_error(errc::unavailable, std::string("cudaSetDevice: ") + cudaGetErrorString(rc));
    if (auto rc = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking); rc != cudaSuccess) {
      s->stream = nullptr;
      return make_error(errc::unavailable, std::string("cudaStreamCreate: ") + cudaGetErrorString(rc));
    }
    out->streams.push_back(std::move(s));
  }
  std::vector<engine::block_pool*> pools = o.kv_pools;
  if (pools.empty()) {
    for (int d : o.devices) {
      auto p = cuda_memory_pool::create(d, engine::tp_engine::kv_block_bytes(c, bt, g), o.own_kv_blocks);
      if (!p) return std::unexpected(p.error());
      pools.push_back(p->get());
      out->own_pools.push_back(std::move(*p));
    }
  }
  auto comms = form_group(out->streams, o.collective_timeout);
  if (!comms) return std::unexpected(comms.error());
  out->comms = std::move(*comms);
  std::vector<engine::tp_device_member> members;
  for (std::uint32_t r = 0; r < g; ++r) {
    engine::tp_device_member m;
    m.kv_pool = pools[r];
    m.comm = out->comms[r];
    nccl_communicator* comm = out->comms[r].get();
    const int device = o.devices[r];
    const auto& ec = o.engine;
    m.make_forward = [&model, comm, device, pool = pools[r], &ec](engine::kv_layout layout)
        -> expected<std::unique_ptr<engine::forward_executor>> {
      cuda_forward_config fc;
      fc.device = device;
      fc.kv_pool = pool;
      fc.block_tokens = layout.block_tokens;
      fc.max_tokens = ec.scheduler.max_batch_tokens;
      fc.max_sequences = ec.scheduler.max_running;
      fc.comm = comm;
      auto f = cuda_forward::create(model, fc);
      if (!f) return std::unexpected(f.error());
      return std::unique_ptr<engine::forward_executor>(std::move(*f));
    };
    members.push_back(std::move(m));
  }
  auto inner = engine::tp_engine::create(model, std::move(members), o.engine);
  if (!inner) {
    for (auto& cm : out->comms) cm->abort("the tensor-parallel engine was not made: " + inner.error().message);
    return std::unexpected(inner.error());
  }
  out->inner = std::move(*inner);
  std::string devices;
  for (int d : o.devices) devices += (devices.empty() ? "" : ",") + std::to_string(d);
  spdlog::info("event=cuda_tensor_parallel_engine devices={} tp={} kv_block_tokens={} timeout_ms={}", devices, g, bt,
               o.collective_timeout.count());
  cuda_tp_engine result;
  result.abort = [comms = out->comms](const std::string& reason) {
    for (const auto& cm : comms) cm->abort(reason);
  };
  result.engine = std::move(out);
  return result;
}

}  // namespace exa::gpu
