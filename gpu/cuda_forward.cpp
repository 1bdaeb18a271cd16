#include "gpu/cuda_forward.hpp"

#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "common/assert.hpp"
#include "engine/det_math.hpp"
#include "engine/kv_cache.hpp"
#include "engine/matmul.hpp"
#include "engine/tp_weights.hpp"
#include "gpu/cuda_graph_policy.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/cuda_peak.hpp"
#include "gpu/cuda_stage_pipeline.hpp"
#include "gpu/cuda_weight_plan.hpp"
#include "gpu/nccl_communicator.hpp"
#include "gpu/ops/attention.cuh"
#include "gpu/ops/convert.cuh"
#include "gpu/ops/embed.cuh"
#include "gpu/ops/matmul.cuh"
#include "gpu/ops/rms_norm.cuh"
#include "gpu/ops/rope_kv.cuh"
#include "gpu/ops/swiglu.cuh"

namespace exa::gpu {
namespace {

std::string cuda_text(const char* what, cudaError_t rc) {
  return std::string(what) + ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
}

expected<void> check(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return {};
  return make_error(rc == cudaErrorMemoryAllocation ? errc::out_of_memory : errc::unavailable, cuda_text(what, rc));
}

// Device memory, freed with its owner.
class device_buffer {
 public:
  device_buffer() = default;
  ~device_buffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  expected<void> allocate(std::size_t bytes, const char* what) {
    EXA_ASSERT(ptr_ == nullptr);
    if (cudaError_t rc = cudaMalloc(&ptr_, std::max<std::size_t>(bytes, 256)); rc != cudaSuccess) {
      ptr_ = nullptr;
      return make_error(errc::out_of_memory, "cudaMalloc of " + std::to_string(bytes) + " bytes for " + what + ": " +
                                                 cudaGetErrorString(rc));
    }
    return {};
  }
  template <class T = void>
  T* get() const noexcept {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

ops::weight_type to_ops(device_format f) {
  switch (f) {
    case device_format::f32: return ops::weight_type::f32;
    case device_format::f16: return ops::weight_type::f16;
    case device_format::bf16: return ops::weight_type::bf16;
    case device_format::q8_0: return ops::weight_type::q8_0;
  }
  return ops::weight_type::f32;
}

ops::act_type act_for(ops::weight_type t) {
  switch (t) {
    case ops::weight_type::bf16: return ops::act_type::bf16;
    case ops::weight_type::q8_0: return ops::act_type::q8_0;
    default: return ops::act_type::f16;
  }
}

// Host staging for the upload: a tensor goes up in pieces of at most this
// many bytes, so a large model never needs a second copy in host memory.
constexpr std::size_t staging_bytes = std::size_t{64} << 20;

}  // namespace

struct cuda_forward::impl {
  struct layer {
    ops::matrix_view wq, wk, wv, wo, gate, up, down;
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* bo = nullptr;
    // Q, K and V as one matrix (and gate with up) when the plan laid them out
    // back to back: one launch instead of three (two), over a wider grid.
    // The rows are the same rows, so every output is computed as before.
    std::optional<ops::matrix_view> qkv, gate_up;
    const float* bqkv = nullptr;  // [bq | bk | bv], zeros where one is absent
  };

  std::shared_ptr<const model::llama_model> model;
  cuda_forward_config cfg;
  model::llama_config c;
  // Tensor-parallel member (cfg.comm): its shard of the weights, and its
  // share of the heads and MLP rows; the whole model (wt = the model's) otherwise.
  std::unique_ptr<engine::tp_weights> shard;
  const model::llama_weights* wt = nullptr;
  nccl_communicator* comm = nullptr;
  int rank = 0;
  std::uint32_t heads = 0, kv_heads = 0, q_dim = 0, kv_dim = 0, ff = 0;
  std::optional<error> enqueue_failed;  // a collective that failed to enqueue this step
  weight_plan plan;
  cudaStream_t stream = nullptr;
  bool own_stream = false;
  device_buffer weights;
  std::vector<layer> layers;
  ops::matrix_view embd, output;
  const float* output_norm = nullptr;
  ops::rope_view rope;
  // Some layer's Q/K/V or gate/up differ in type: the normalized input stays
  // in f32 (xn) to be converted once per type, as the CPU engine does.
  bool mixed_types = false;

  // The step's buffers, sized for the bounds once: their addresses never
  // change, which is what lets a recorded graph replay.
  // qkv holds each token's Q, K and V side by side, gu its gate and up.
  device_buffer x, xn, qkv, att, gu, act, act_scales, logits, meta, biases;
  std::size_t table_capacity = 0;  // block ids one step can name
  int* host_meta = nullptr;        // pinned mirror of `meta`
  std::vector<std::uint32_t> seq_blocks, seq_offset;  // staging scratch
  void* kv_base = nullptr;
  long long page_bytes = 0;
  std::optional<error> pending;  // a failed copy_block, reported by the next execute()

  graph_policy graphs{0};
  std::vector<std::pair<graph_key, cudaGraphExec_t>> execs;
  // The ends of a stoppable step's stages, alternately (cuda_stage_pipeline.hpp
  // keeps at most two stages in flight).
  cudaEvent_t stage_done[2] = {nullptr, nullptr};
  stage_cost_model step_cost;  // which steps run stage by stage (stoppable_step)
  cuda_forward_stats stats;

  ~impl();
  expected<void> init(std::shared_ptr<const model::llama_model> m, const cuda_forward_config& config);
  expected<void> attach_pool();
  expected<void> upload_weights();
  expected<void> upload_tensor(const planned_tensor& t);
  void bind_views();
  expected<void> fuse_biases();
  std::size_t qkv_width() const { return std::size_t{q_dim} + 2 * std::size_t{kv_dim}; }
  expected<void> join_group();
  // Row-parallel O and down: the epilogue of a member's partial product into
  // x, then the all-reduce that sums x over the group (tp_reduce).
  ops::matmul_epilogue residual(const float* bias) const { return {rank == 0 ? bias : nullptr, rank == 0}; }
  void tp_reduce(std::uint32_t n_tok);
  expected<void> allocate_step_buffers();

  // Meta layout (ints): tokens, positions, table offsets (max_tokens each),
  // logits rows (max_sequences), then the block tables.
  int* meta_tokens(int* base) const { return base; }
  int* meta_pos(int* base) const { return base + cfg.max_tokens; }
  int* meta_table_off(int* base) const { return base + 2 * std::size_t{cfg.max_tokens}; }
  int* meta_out_rows(int* base) const { return base + 3 * std::size_t{cfg.max_tokens}; }
  int* meta_tables(int* base) const { return meta_out_rows(base) + cfg.max_sequences; }
  ops::step_meta device_meta() const;

  expected<std::uint32_t> stage(const engine::forward_batch& batch, std::size_t& tables_used);
  expected<void> run(std::uint32_t n_tok, std::uint32_t n_out);
  expected<void> capture(graph_key key, cudaGraphExec_t& exec);
  void enqueue(std::uint32_t n_tok, std::uint32_t n_out);
  // Stage st of the layers: layer st / 2's attention (even) or MLP (odd).
  void enqueue_stage(std::uint32_t st, std::uint32_t n_tok);
  // The final norm and the output head over the tokens that want logits.
  void enqueue_head(std::uint32_t n_out);
  // A step's common start and end: the bounds checked, the batch's meta
  // uploaded (returns the tokens wanting logits); the logits brought back
  // and the stream (or the group) waited for.
  expected<std::uint32_t> begin(const engine::forward_batch& batch);
  expected<void> finish(std::uint32_t n_out, std::vector<float>& logits);
  expected<void> drained(expected<void> failed);
  void enqueue_attention(const layer& w, std::uint32_t l, std::uint32_t n_tok);
  void enqueue_mlp(const layer& w, std::uint32_t n_tok);
  ops::act_view act_view_for(const ops::matrix_view& w) const;
  void mm(const ops::matrix_view& w, std::uint32_t n_tok, float* y, std::uint32_t y_stride,
          ops::matmul_epilogue e = {}) const;
  void destroy_graph(graph_key key);
};

cuda_forward::impl::~impl() {
  cudaSetDevice(cfg.device);
  if (stream != nullptr) cudaStreamSynchronize(stream);
  for (auto& [key, exec] : execs) cudaGraphExecDestroy(exec);
  for (cudaEvent_t e : stage_done)
    if (e != nullptr) cudaEventDestroy(e);
  if (host_meta != nullptr) cudaFreeHost(host_meta);
  if (own_stream && stream != nullptr) cudaStreamDestroy(stream);
}

expected<void> cuda_forward::impl::init(std::shared_ptr<const model::llama_model> m, const cuda_forward_config& config) {
  model = std::move(m);
  cfg = config;
  c = model->config();
  if (cfg.max_tokens == 0 || cfg.max_sequences == 0 || cfg.block_tokens == 0)
    return make_error(errc::invalid_argument, "the CUDA forward needs nonzero step bounds and block size");
  if (auto ok = join_group(); !ok) return ok;
  auto p = plan_weights(c, *wt);
  if (!p) return std::unexpected(p.error());
  plan = std::move(*p);
  if (auto ok = check(cudaSetDevice(cfg.device), "cudaSetDevice"); !ok) return ok;
  if (auto ok = attach_pool(); !ok) return ok;
  if (comm != nullptr) {
    stream = static_cast<cudaStream_t>(comm->stream());  // NCCL enqueues there: the forward must too
  } else if (cfg.stream != nullptr) {
    stream = static_cast<cudaStream_t>(cfg.stream);
  } else {
    if (auto ok = check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate"); !ok) return ok;
    own_stream = true;
  }
  if (auto ok = upload_weights(); !ok) return ok;
  bind_views();
  if (auto ok = fuse_biases(); !ok) return ok;
  if (auto ok = allocate_step_buffers(); !ok) return ok;
  // A member runs eagerly: its all-reduces poll NCCL on the host, which a
  // graph capture would not record.
  graphs = graph_policy(comm != nullptr ? 0 : cfg.max_graphs);
  for (cudaEvent_t& e : stage_done)
    if (auto ok = check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"); !ok) {
      e = nullptr;
      return ok;
    }
  // A step reads every weight once but the embedding table, of which it
  // reads a row a token (unless the output head is that table).
  step_cost.weight_bytes = static_cast<double>(stats.weight_bytes);
  if (!wt->tied_output)
    if (const planned_tensor* e = plan.find(wt->token_embd))
      step_cost.weight_bytes -= static_cast<double>(e->bytes + e->scales_bytes);
  step_cost.kv_bytes_per_position =
      static_cast<double>(engine::kv_layout{c.n_layers, kv_dim, cfg.block_tokens}.block_bytes()) / cfg.block_tokens;
  // Unknown bandwidth (0) leaves decode steps whole, as before.
  if (auto peak = cuda_peak_bandwidth(cfg.device)) step_cost.read_bytes_per_s = peak->bytes_per_s;
  return {};
}

expected<void> cuda_forward::impl::join_group() {
  wt = &model->weights();
  heads = c.n_heads, kv_heads = c.n_kv_heads, ff = c.ff_dim;
  if (cfg.comm != nullptr) {
    comm = dynamic_cast<nccl_communicator*>(cfg.comm);
    if (comm == nullptr)
      return make_error(errc::invalid_argument, "a CUDA tensor-parallel member needs an NCCL communicator");
    if (comm->device() != cfg.device)
      return make_error(errc::invalid_argument, "the NCCL communicator is on CUDA device " +
                                                    std::to_string(comm->device()) + ", the forward on device " +
                                                    std::to_string(cfg.device));
    rank = comm->rank();
    const auto g = static_cast<std::uint32_t>(comm->size());
    auto sh = engine::tp_weights::shard(c, model->weights(), static_cast<std::uint32_t>(rank), g);
    if (!sh) return std::unexpected(sh.error());
    shard = std::make_unique<engine::tp_weights>(std::move(*sh));
    wt = &shard->weights();
    heads /= g, kv_heads /= g, ff /= g;
  }
  q_dim = heads * c.head_dim();
  kv_dim = kv_heads * c.head_dim();
  return {};
}

void cuda_forward::impl::tp_reduce(std::uint32_t n_tok) {
  if (comm == nullptr) return;
  // Rank 0's x holds x + its partial (+ bias), the others' their partial
  // alone: the sum is the residual plus the whole projection, on every member.
  auto ok = comm->all_reduce_sum(x.get<float>(), std::size_t{n_tok} * c.dim);
  if (!ok && !enqueue_failed) enqueue_failed = std::move(ok.error());
}

expected<void> cuda_forward::impl::attach_pool() {
  auto* pool = dynamic_cast<cuda_memory_pool*>(cfg.kv_pool);
  if (pool == nullptr) return make_error(errc::invalid_argument, "the CUDA forward needs a CUDA memory pool for its KV pages");
  if (pool->device() != cfg.device)
    return make_error(errc::invalid_argument, "the KV pool is on CUDA device " + std::to_string(pool->device()) +
                                                  ", the forward on device " + std::to_string(cfg.device));
  const std::size_t need = engine::kv_layout{c.n_layers, kv_dim, cfg.block_tokens}.block_bytes();
  if (pool->block_bytes() < need || pool->capacity_blocks() == 0)
    return make_error(errc::invalid_argument, "KV pages of " + std::to_string(pool->block_bytes()) + " bytes cannot hold " +
                                                  std::to_string(cfg.block_tokens) + " tokens (" + std::to_string(need) +
                                                  " bytes)");
  kv_base = pool->address(0);
  page_bytes = static_cast<long long>(pool->block_bytes());
  return {};
}

expected<void> cuda_forward::impl::upload_tensor(const planned_tensor& t) {
  const model::weight_view& w = *t.src;
  auto* base = weights.get<std::byte>();
  const bool as_is = (t.format == device_format::f16 && w.type == model::tensor_type::f16) ||
                     (t.format == device_format::bf16 && w.type == model::tensor_type::bf16) ||
                     (t.format == device_format::f32 && w.type == model::tensor_type::f32);
  if (as_is) return check(cudaMemcpy(base + t.offset, w.data, t.bytes, cudaMemcpyHostToDevice), "cudaMemcpy (weights)");
  // Repacked or dequantized, a slab of rows at a time.
  const std::uint64_t row_out = std::max<std::uint64_t>(1, t.bytes / w.rows);
  const std::uint64_t rows_per_slab = std::max<std::uint64_t>(1, staging_bytes / (row_out + 4 * (w.cols / 32 + 1)));
  std::vector<std::byte> out(rows_per_slab * row_out);
  std::vector<float> scales(t.format == device_format::q8_0 ? rows_per_slab * (w.cols / 32) : 0);
  for (std::uint64_t r0 = 0; r0 < w.rows; r0 += rows_per_slab) {
    const std::uint64_t n = std::min(rows_per_slab, w.rows - r0);
    if (t.format == device_format::q8_0) {
      EXA_ASSERT(w.type == model::tensor_type::q8_0);
      repack_q8_0(w.row(r0), n, w.cols, reinterpret_cast<std::int8_t*>(out.data()), scales.data());
      const std::uint64_t sb = n * (w.cols / 32) * sizeof(float);
      if (auto ok = check(cudaMemcpy(base + t.scales_offset + r0 * (w.cols / 32) * sizeof(float), scales.data(), sb,
                                     cudaMemcpyHostToDevice), "cudaMemcpy (scales)");
          !ok)
        return ok;
    } else {
      EXA_ASSERT(t.format == device_format::f32);
      for (std::uint64_t r = 0; r < n; ++r)
        engine::dequantize_row(w, r0 + r, reinterpret_cast<float*>(out.data()) + r * w.cols);
    }
    if (auto ok = check(cudaMemcpy(base + t.offset + r0 * row_out, out.data(), n * row_out, cudaMemcpyHostToDevice),
                        "cudaMemcpy (weights)");
        !ok)
      return ok;
  }
  return {};
}

expected<void> cuda_forward::impl::upload_weights() {
  if (auto ok = weights.allocate(plan.total_bytes, "the weights"); !ok) return ok;
  for (const planned_tensor& t : plan.tensors)
    if (auto ok = upload_tensor(t); !ok) return ok;
  stats.weight_bytes = plan.total_bytes;
  return {};
}

void cuda_forward::impl::bind_views() {
  auto* base = weights.get<std::byte>();
  const auto matrix = [&](const model::weight_view& w) {
    const planned_tensor* t = plan.find(w);
    EXA_ASSERT_MSG(t != nullptr, "a weight missing from the upload plan");
    ops::matrix_view m;
    m.type = to_ops(t->format);
    m.data = base + t->offset;
    m.scales = t->scales_bytes > 0 ? reinterpret_cast<const float*>(base + t->scales_offset) : nullptr;
    m.rows = static_cast<int>(w.rows);
    m.cols = static_cast<int>(w.cols);
    return m;
  };
  const auto vec = [&](const model::weight_view& w) { return static_cast<const float*>(matrix(w).data); };
  const auto opt = [&](const std::optional<model::weight_view>& w) { return w ? vec(*w) : nullptr; };
  const auto& wt = *this->wt;
  embd = matrix(wt.token_embd);
  output = matrix(wt.tied_output ? wt.token_embd : wt.output);
  output_norm = vec(wt.output_norm);
  for (const model::llama_layer_weights& l : wt.layers) {
    layer x;
    x.wq = matrix(l.wq), x.wk = matrix(l.wk), x.wv = matrix(l.wv), x.wo = matrix(l.wo);
    x.gate = matrix(l.w_gate), x.up = matrix(l.w_up), x.down = matrix(l.w_down);
    x.attn_norm = vec(l.attn_norm), x.ffn_norm = vec(l.ffn_norm);
    x.bq = opt(l.bq), x.bk = opt(l.bk), x.bv = opt(l.bv), x.bo = opt(l.bo);
    mixed_types = mixed_types || x.wq.type != x.wk.type || x.wq.type != x.wv.type || x.gate.type != x.up.type;
    if (plan.contiguous({&l.wq, &l.wk, &l.wv})) {
      x.qkv = x.wq;
      x.qkv->rows = x.wq.rows + x.wk.rows + x.wv.rows;
    }
    if (plan.contiguous({&l.w_gate, &l.w_up})) {
      x.gate_up = x.gate;
      x.gate_up->rows = x.gate.rows + x.up.rows;
    }
    layers.push_back(x);
  }
  // RoPE as the CPU engine computes it (engine/ops.cpp): the same theta_scale bits.
  rope.rope_dim = static_cast<int>(c.rope_dim);
  rope.theta_scale = static_cast<float>(engine::det::pow(static_cast<double>(c.rope_freq_base),
                                                         static_cast<double>(-2.0f / static_cast<float>(c.rope_dim))));
  rope.freq_scale = c.rope_freq_scale;
  rope.factors = opt(wt.rope_freqs);
  rope.halves = c.rope_pairs == model::rope_pairing::halves;
}

expected<void> cuda_forward::impl::fuse_biases() {
  // A fused Q/K/V projection adds one bias vector: the three side by side.
  const auto& wt = *this->wt;
  std::vector<float> host;
  std::vector<std::size_t> at(layers.size(), SIZE_MAX);
  for (std::size_t l = 0; l < layers.size(); ++l) {
    const auto& w = wt.layers[l];
    if (!layers[l].qkv || !(w.bq || w.bk || w.bv)) continue;
    at[l] = host.size();
    for (const auto* b : {&w.bq, &w.bk, &w.bv}) {
      const std::size_t n = b == &w.bq ? q_dim : kv_dim;
      const std::size_t base = host.size();
      host.resize(base + n, 0.0f);
      if (*b) engine::dequantize_row(**b, 0, host.data() + base);
    }
  }
  if (host.empty()) return {};
  if (auto ok = biases.allocate(host.size() * 4, "fused biases"); !ok) return ok;
  if (auto ok = check(cudaMemcpy(biases.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy (biases)");
      !ok)
    return ok;
  for (std::size_t l = 0; l < layers.size(); ++l)
    if (at[l] != SIZE_MAX) layers[l].bqkv = biases.get<float>() + at[l];
  return {};
}

expected<void> cuda_forward::impl::allocate_step_buffers() {
  const std::size_t t = cfg.max_tokens, dim = c.dim, kv = c.kv_dim(), ff = c.ff_dim;
  const std::size_t widest = std::max(dim, ff);
  const std::size_t vocab = output.rows;
  // A step names at most the blocks of max_sequences sequences of the
  // longest context.
  table_capacity = std::size_t{cfg.max_sequences} * ((c.context_length + cfg.block_tokens - 1) / cfg.block_tokens + 1);
  const std::size_t meta_ints = 3 * t + cfg.max_sequences + table_capacity;
  const std::pair<device_buffer*, std::size_t> sizes[] = {
      {&x, t * dim * 4},       {&xn, t * dim * 4},     {&qkv, t * (dim + 2 * kv) * 4},
      {&att, t * dim * 4},     {&gu, t * 2 * ff * 4},  {&act, t * widest * 2},
      {&act_scales, t * (widest / 32) * 4},            {&logits, std::size_t{cfg.max_sequences} * vocab * 4},
      {&meta, meta_ints * 4}};
  for (const auto& [buffer, bytes] : sizes)
    if (auto ok = buffer->allocate(bytes, "the step's activations"); !ok) return ok;
  if (auto ok = check(cudaMallocHost(reinterpret_cast<void**>(&host_meta), meta_ints * 4), "cudaMallocHost"); !ok) {
    host_meta = nullptr;
    return ok;
  }
  return {};
}

ops::step_meta cuda_forward::impl::device_meta() const {
  int* base = meta.get<int>();
  return {meta_tokens(base), meta_pos(base), meta_table_off(base), meta_tables(base), meta_out_rows(base)};
}

ops::act_view cuda_forward::impl::act_view_for(const ops::matrix_view& w) const {
  return {act_for(w.type), act.get(), act_scales.get<float>(), w.cols};
}

void cuda_forward::impl::mm(const ops::matrix_view& w, std::uint32_t n_tok, float* y, std::uint32_t y_stride,
                            ops::matmul_epilogue e) const {
  const bool ok = ops::matmul(w, act_view_for(w), static_cast<int>(n_tok), y, static_cast<int>(y_stride), e, stream);
  EXA_ASSERT_MSG(ok, "a matmul the weight plan should have refused");
}

void cuda_forward::impl::enqueue_attention(const layer& w, std::uint32_t l, std::uint32_t n_tok) {
  // Q width, K/V width and heads: this member's share (the whole model's on one device).
  const int n = static_cast<int>(n_tok), dim = static_cast<int>(c.dim), qd = static_cast<int>(q_dim),
            kv_dim = static_cast<int>(this->kv_dim);
  const int hd = static_cast<int>(c.head_dim()), heads = static_cast<int>(this->heads),
            kv_heads = static_cast<int>(this->kv_heads);
  const auto width = static_cast<std::uint32_t>(qkv_width());
  float* q = qkv.get<float>();
  float* k = q + qd;
  float* v = k + kv_dim;
  ops::rms_norm(x.get<float>(), nullptr, n, dim, w.attn_norm, c.rms_eps, mixed_types ? xn.get<float>() : nullptr,
                act_view_for(w.wq), stream);
  if (w.qkv) {
    mm(*w.qkv, n_tok, q, width, {w.bqkv, false});
  } else {
    mm(w.wq, n_tok, q, width, {w.bq, false});
    if (w.wk.type != w.wq.type) ops::convert(xn.get<float>(), dim, n, dim, act_view_for(w.wk), stream);
    mm(w.wk, n_tok, k, width, {w.bk, false});
    if (w.wv.type != w.wk.type) ops::convert(xn.get<float>(), dim, n, dim, act_view_for(w.wv), stream);
    mm(w.wv, n_tok, v, width, {w.bv, false});
  }
  const ops::kv_view kv{kv_base, page_bytes, static_cast<int>(cfg.block_tokens), kv_dim, static_cast<int>(l)};
  const ops::step_meta meta_view = device_meta();
  ops::rope_kv(q, k, v, static_cast<int>(width), static_cast<int>(width), n, heads, kv_heads, hd, rope, meta_view, kv,
               stream);
  ops::attention(q, static_cast<int>(width), att.get<float>(), n, heads, kv_heads, hd, meta_view, kv, stream);
  ops::convert(att.get<float>(), qd, n, qd, act_view_for(w.wo), stream);
  mm(w.wo, n_tok, x.get<float>(), c.dim, residual(w.bo));  // x += att · Woᵀ (+ bo)
  tp_reduce(n_tok);
}

void cuda_forward::impl::enqueue_mlp(const layer& w, std::uint32_t n_tok) {
  const int n = static_cast<int>(n_tok), dim = static_cast<int>(c.dim), ff = static_cast<int>(this->ff);
  float* gate = gu.get<float>();
  float* up = gate + ff;
  ops::rms_norm(x.get<float>(), nullptr, n, dim, w.ffn_norm, c.rms_eps, mixed_types ? xn.get<float>() : nullptr,
                act_view_for(w.gate), stream);
  if (w.gate_up) {
    mm(*w.gate_up, n_tok, gate, 2 * this->ff);
  } else {
    mm(w.gate, n_tok, gate, 2 * this->ff);
    if (w.up.type != w.gate.type) ops::convert(xn.get<float>(), dim, n, dim, act_view_for(w.up), stream);
    mm(w.up, n_tok, up, 2 * this->ff);
  }
  ops::swiglu(gate, up, 2 * ff, n, ff, act_view_for(w.down), stream);
  mm(w.down, n_tok, x.get<float>(), c.dim, residual(nullptr));  // x += h · Wdownᵀ
  tp_reduce(n_tok);
}

void cuda_forward::impl::enqueue_stage(std::uint32_t st, std::uint32_t n_tok) {
  const std::uint32_t l = st / 2;
  if (st % 2 == 0)
    enqueue_attention(layers[l], l, n_tok);
  else
    enqueue_mlp(layers[l], n_tok);
}

void cuda_forward::impl::enqueue_head(std::uint32_t n_out) {
  // Only the tokens that need logits go through the final norm and the head.
  ops::rms_norm(x.get<float>(), device_meta().out_rows, static_cast<int>(n_out), static_cast<int>(c.dim), output_norm,
                c.rms_eps, nullptr, act_view_for(output), stream);
  mm(output, n_out, logits.get<float>(), static_cast<std::uint32_t>(output.rows));
}

void cuda_forward::impl::enqueue(std::uint32_t n_tok, std::uint32_t n_out) {
  ops::embed(embd, device_meta().tokens, static_cast<int>(n_tok), x.get<float>(), stream);
  for (std::uint32_t st = 0; st < 2 * c.n_layers; ++st) enqueue_stage(st, n_tok);
  // Every member holds the same hidden state now: rank 0 alone computes logits.
  if (rank == 0) enqueue_head(n_out);
}

expected<std::uint32_t> cuda_forward::impl::stage(const engine::forward_batch& batch, std::size_t& tables_used) {
  const std::size_t n_seq = batch.tables.size();
  seq_blocks.assign(n_seq, 0);
  seq_offset.assign(n_seq, 0);
  for (const engine::forward_token& t : batch.tokens) {
    EXA_ASSERT(t.seq_index < n_seq);
    EXA_ASSERT(t.token >= 0 && t.token < embd.rows);
    seq_blocks[t.seq_index] = std::max(seq_blocks[t.seq_index], t.pos / cfg.block_tokens + 1);
  }
  int* h = host_meta;
  tables_used = 0;
  for (std::size_t s = 0; s < n_seq; ++s) {
    const std::vector<engine::block_id>& table = *batch.tables[s];
    EXA_ASSERT_MSG(seq_blocks[s] <= table.size(), "a block table that does not cover the batch's positions");
    if (tables_used + seq_blocks[s] > table_capacity)
      return make_error(errc::invalid_argument, "a step naming more KV blocks than the CUDA forward was sized for");
    seq_offset[s] = static_cast<std::uint32_t>(tables_used);
    for (std::uint32_t b = 0; b < seq_blocks[s]; ++b) meta_tables(h)[tables_used++] = static_cast<int>(table[b]);
  }
  std::uint32_t n_out = 0;
  for (std::size_t i = 0; i < batch.tokens.size(); ++i) {
    const engine::forward_token& t = batch.tokens[i];
    meta_tokens(h)[i] = t.token;
    meta_pos(h)[i] = static_cast<int>(t.pos);
    meta_table_off(h)[i] = static_cast<int>(seq_offset[t.seq_index]);
    if (!t.logits) continue;
    if (n_out == cfg.max_sequences)
      return make_error(errc::invalid_argument, "more tokens want logits than the CUDA forward's " +
                                                    std::to_string(cfg.max_sequences) + " sequences");
    meta_out_rows(h)[n_out++] = static_cast<int>(i);
  }
  return n_out;
}

void cuda_forward::impl::destroy_graph(graph_key key) {
  const auto it = std::find_if(execs.begin(), execs.end(), [&](const auto& e) { return e.first == key; });
  if (it == execs.end()) return;
  cudaGraphExecDestroy(it->second);
  execs.erase(it);
}

expected<void> cuda_forward::impl::capture(graph_key key, cudaGraphExec_t& exec) {
  // Thread-local capture: other engines' threads keep using CUDA meanwhile.
  if (auto ok = check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture"); !ok)
    return ok;
  try {
    enqueue(key.n_tokens, key.n_logits);
  } catch (...) {
    // The stream leaves capture mode before the error goes on: otherwise the
    // device's completion callback for this task would be captured into a
    // graph never launched, and the task would never complete.
    cudaGraph_t discarded = nullptr;
    cudaStreamEndCapture(stream, &discarded);
    if (discarded != nullptr) cudaGraphDestroy(discarded);
    throw;
  }
  cudaGraph_t graph = nullptr;
  if (auto ok = check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture"); !ok) return ok;
  const cudaError_t rc = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  return check(rc, "cudaGraphInstantiate");
}

expected<void> cuda_forward::impl::run(std::uint32_t n_tok, std::uint32_t n_out) {
  const graph_key key{n_tok, n_out};
  const graph_decision d = graphs.next(key);
  if (d.evict) destroy_graph(*d.evict);
  if (d.what == graph_decision::action::capture) {
    cudaGraphExec_t exec = nullptr;
    if (auto ok = capture(key, exec); !ok) {
      // A graph is an optimization: run this shape eagerly from now on.
      spdlog::warn("event=cuda_graph_capture_failed tokens={} logits={} error=\"{}\"", n_tok, n_out, ok.error().message);
      graphs.forget(key);
      cudaGetLastError();  // clear a non-sticky launch error left by the capture
    } else {
      execs.emplace_back(key, exec);
      ++stats.graph_captures;
    }
  }
  const auto it = std::find_if(execs.begin(), execs.end(), [&](const auto& e) { return e.first == key; });
  if (it != execs.end()) {
    if (d.what == graph_decision::action::replay) ++stats.graph_replays;
    return check(cudaGraphLaunch(it->second, stream), "cudaGraphLaunch");
  }
  enqueue_failed.reset();
  enqueue(n_tok, n_out);
  if (enqueue_failed) return std::unexpected(*enqueue_failed);
  return check(cudaGetLastError(), "kernel launch");
}

cuda_forward::cuda_forward(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
cuda_forward::~cuda_forward() = default;

expected<std::unique_ptr<cuda_forward>> cuda_forward::create(std::shared_ptr<const model::llama_model> model,
                                                             const cuda_forward_config& config) {
  if (!model) return make_error(errc::invalid_argument, "no model to run");
  auto p = std::make_unique<impl>();
  p->cfg = config;  // the destructor needs the device even when init fails
  if (auto ok = p->init(std::move(model), config); !ok) return std::unexpected(ok.error());
  return std::unique_ptr<cuda_forward>(new cuda_forward(std::move(p)));
}

cuda_forward_stats cuda_forward::stats() const noexcept { return impl_->stats; }

void cuda_forward::copy_block(engine::block_id dst, engine::block_id src) {
  impl& s = *impl_;
  const std::size_t bytes = engine::kv_layout{s.c.n_layers, s.kv_dim, s.cfg.block_tokens}.block_bytes();
  auto* base = static_cast<std::byte*>(s.kv_base);
  const cudaError_t rc = cudaMemcpyAsync(base + dst * s.page_bytes, base + src * s.page_bytes, bytes,
                                         cudaMemcpyDeviceToDevice, s.stream);
  if (rc != cudaSuccess && !s.pending) s.pending = error{errc::unavailable, cuda_text("cudaMemcpyAsync (KV page)", rc)};
}

expected<void> cuda_forward::impl::drained(expected<void> failed) {
  // A failure after the first copy is enqueued waits for the stream before
  // it returns: the next step rewrites host_meta, which a pending copy (or
  // the kernels it feeds) may still read.
  cudaStreamSynchronize(stream);
  return failed;
}

expected<std::uint32_t> cuda_forward::impl::begin(const engine::forward_batch& batch) {
  const std::size_t n_tok = batch.tokens.size();
  if (n_tok > cfg.max_tokens || batch.tables.size() > cfg.max_sequences)
    return make_error(errc::invalid_argument, "a step of " + std::to_string(n_tok) + " tokens and " +
                                                  std::to_string(batch.tables.size()) +
                                                  " sequences is over the CUDA forward's bounds");
  if (auto ok = check(cudaSetDevice(cfg.device), "cudaSetDevice"); !ok) return std::unexpected(ok.error());
  if (pending) return std::unexpected(*pending);
  std::size_t tables_used = 0;
  auto n_out = stage(batch, tables_used);
  if (!n_out) return std::unexpected(n_out.error());
  // The fixed part of the meta block (tokens, positions, offsets, logits
  // rows: a few KB) goes up whole; the tables as far as used.
  const std::size_t head_ints = 3 * std::size_t{cfg.max_tokens} + cfg.max_sequences;
  int* dev = meta.get<int>();
  if (auto ok = check(cudaMemcpyAsync(dev, host_meta, head_ints * 4, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      !ok)
    return std::unexpected(drained(ok).error());
  if (tables_used > 0) {
    if (auto ok = check(cudaMemcpyAsync(dev + head_ints, host_meta + head_ints, tables_used * 4,
                                        cudaMemcpyHostToDevice, stream),
                        "cudaMemcpyAsync");
        !ok)
      return std::unexpected(drained(ok).error());
  }
  return n_out;
}

expected<void> cuda_forward::impl::finish(std::uint32_t n_out, std::vector<float>& out) {
  const std::size_t vocab = static_cast<std::size_t>(output.rows);
  out.resize(rank == 0 ? std::size_t{n_out} * vocab : 0);  // a member other than rank 0 returns none
  if (!out.empty()) {
    if (auto ok = check(cudaMemcpyAsync(out.data(), logits.get(), out.size() * 4, cudaMemcpyDeviceToHost, stream),
                        "cudaMemcpyAsync (logits)");
        !ok)
      return drained(ok);
  }
  // A member waits bounded by its group's timeout (a peer gone would hold its
  // all-reduces forever); past it the group is aborted.
  if (comm != nullptr) {
    if (auto ok = comm->wait(); !ok) {
      out.clear();
      return drained(ok);  // the abort released the collectives: the stream drains
    }
  } else if (auto ok = check(cudaStreamSynchronize(stream), "the step"); !ok) {
    return ok;
  }
  ++stats.steps;
  return {};
}

expected<void> cuda_forward::execute(const engine::forward_batch& batch, std::vector<float>& logits) {
  impl& s = *impl_;
  logits.clear();
  const std::size_t n_tok = batch.tokens.size();
  if (n_tok == 0) return {};
  auto n_out = s.begin(batch);
  if (!n_out) return std::unexpected(n_out.error());
  if (auto ok = s.run(static_cast<std::uint32_t>(n_tok), *n_out); !ok) return s.drained(ok);
  return s.finish(*n_out, logits);
}

bool cuda_forward::can_yield() const noexcept { return impl_->comm == nullptr; }

expected<bool> cuda_forward::execute_yielding(const engine::forward_batch& batch, std::vector<float>& logits,
                                              engine::forward_suspension& state,
                                              const std::function<bool()>& should_yield) {
  impl& s = *impl_;
  const std::uint32_t stages = 2 * s.c.n_layers;
  if (!can_yield() || !stoppable_step(batch, stages, s.step_cost)) {
    if (state.next_stage != 0)
      return make_error(errc::internal, "a suspended CUDA step came back as one that cannot stop");
    if (auto ok = execute(batch, logits); !ok) return std::unexpected(ok.error());
    return false;
  }
  logits.clear();
  const auto n_tok = static_cast<std::uint32_t>(batch.tokens.size());
  const std::size_t hidden_floats = std::size_t{n_tok} * s.c.dim;
  if (state.next_stage >= stages || (state.next_stage != 0 && state.hidden.size() != hidden_floats))
    return make_error(errc::internal, "a suspended CUDA step that does not match its batch");
  // Another step may have run since this one stopped: its meta and hidden
  // state go up again (the same batch stages the same meta).
  auto n_out = s.begin(batch);
  if (!n_out) return std::unexpected(n_out.error());
  float* x = s.x.get<float>();
  if (state.next_stage == 0) {
    ops::embed(s.embd, s.device_meta().tokens, static_cast<int>(n_tok), x, s.stream);
  } else if (auto ok = check(cudaMemcpyAsync(x, state.hidden.data(), hidden_floats * 4, cudaMemcpyHostToDevice, s.stream),
                             "cudaMemcpyAsync (hidden state up)");
             !ok) {
    return std::unexpected(s.drained(ok).error());
  }
  std::optional<error> failed;
  const auto note = [&](cudaError_t rc, const char* what) {
    if (rc != cudaSuccess && !failed) failed = check(rc, what).error();
  };
  const stage_hooks hooks{
      [&](std::uint32_t st) {
        const auto t0 = std::chrono::steady_clock::now();
        s.enqueue_stage(st, n_tok);
        note(cudaGetLastError(), "kernel launch");
        note(cudaEventRecord(s.stage_done[st % 2], s.stream), "cudaEventRecord");
        s.stats.stage_launch_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++s.stats.stages_launched;
      },
      [&](std::uint32_t st) { note(cudaEventSynchronize(s.stage_done[st % 2]), "cudaEventSynchronize"); },
      // A launch or a wait that failed ends the pipeline at once (as a stop
      // would), and the step returns its error below.
      [&] { return failed.has_value() || should_yield(); }};
  const std::uint32_t stopped_before = run_stages(state.next_stage, stages, 2, hooks);
  if (failed) return std::unexpected(s.drained(std::unexpected(*failed)).error());
  if (stopped_before < stages) {
    state.hidden.resize(hidden_floats);
    if (auto ok = check(cudaMemcpyAsync(state.hidden.data(), x, hidden_floats * 4, cudaMemcpyDeviceToHost, s.stream),
                        "cudaMemcpyAsync (hidden state down)");
        !ok)
      return std::unexpected(s.drained(ok).error());
    if (auto ok = check(cudaStreamSynchronize(s.stream), "the stopped step"); !ok) return std::unexpected(ok.error());
    state.next_stage = stopped_before;
    ++s.stats.stopped_steps;
    return true;
  }
  state.next_stage = 0;
  s.enqueue_head(*n_out);
  if (auto ok = check(cudaGetLastError(), "kernel launch"); !ok) return std::unexpected(s.drained(ok).error());
  if (auto ok = s.finish(*n_out, logits); !ok) return std::unexpected(ok.error());
  return false;
}

}  // namespace exa::gpu
