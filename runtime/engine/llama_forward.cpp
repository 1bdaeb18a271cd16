#include "engine/llama_forward.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "common/assert.hpp"
#include "engine/communicator.hpp"
#include "engine/kernel_table.hpp"
#include "engine/ops.hpp"
#include "engine/thread_pool.hpp"

namespace exa::engine {
namespace {

std::vector<float> dequantize_vector(const model::weight_view& w) {
  std::vector<float> out(w.cols);
  dequantize_row(w, 0, out.data());
  return out;
}

std::vector<float> dequantize_optional(const std::optional<model::weight_view>& w) {
  return w ? dequantize_vector(*w) : std::vector<float>{};
}

// x[i] += b[i]; nothing when the layer has no such bias.
void add_bias(float* x, const std::vector<float>& b) noexcept {
  for (std::size_t i = 0; i < b.size(); ++i) x[i] += b[i];
}

}  // namespace

llama_forward::llama_forward(const model::llama_config& config,
                             const model::llama_weights& weights, kv_cache& cache,
                             thread_pool& pool, resident_options resident)
    : llama_forward(config, weights, cache.pages(), pool, nullptr, resident) {}

llama_forward::llama_forward(const model::llama_config& config, const model::llama_weights& weights,
                             kv_pages pages, thread_pool& pool, communicator& comm, resident_options resident)
    : llama_forward(config, weights, pages, pool, &comm, resident) {}

llama_forward::llama_forward(const model::llama_config& config,
                             const model::llama_weights& weights, kv_pages pages,
                             thread_pool& pool, communicator* comm, resident_options resident)
    : config_(config), weights_(weights), resident_(resident), cache_(pages), pool_(pool), comm_(comm) {
  const std::size_t members = comm_ == nullptr ? 1 : static_cast<std::size_t>(comm_->size());
  EXA_ASSERT(members >= 1 && config_.n_heads % members == 0 && config_.n_kv_heads % members == 0 &&
             config_.ff_dim % members == 0);
  n_heads_ = config_.n_heads / members;
  n_kv_heads_ = config_.n_kv_heads / members;
  q_dim_ = n_heads_ * config_.head_dim();
  kv_dim_ = n_kv_heads_ * config_.head_dim();
  ff_ = config_.ff_dim / members;
  EXA_ASSERT(weights_.layers.size() == config_.n_layers);
  EXA_ASSERT(cache_.layout().n_layers == config_.n_layers);
  EXA_ASSERT(cache_.layout().kv_dim == kv_dim_);
  // Decided once: a pass that finds another variant active (tests switch)
  // reads the same layout, every variant having both kernels.
  k_transposed_ = active_kernels().k_transposed && cache_.layout().block_tokens % 16 == 0 &&
                  config_.head_dim() <= 256;
  for (const auto& l : weights_.layers) {
    // A member's shard must be the share its group size implies (tp_weights.hpp).
    EXA_ASSERT_MSG(l.wq.rows == q_dim_ && l.wk.rows == kv_dim_ && l.wv.rows == kv_dim_ && l.wo.cols == q_dim_ &&
                       l.w_gate.rows == ff_ && l.w_up.rows == ff_ && l.w_down.cols == ff_,
                   "weights that are not this member's shard");
    attn_norm_.push_back(dequantize_vector(l.attn_norm));
    ffn_norm_.push_back(dequantize_vector(l.ffn_norm));
    bq_.push_back(dequantize_optional(l.bq));
    bk_.push_back(dequantize_optional(l.bk));
    bv_.push_back(dequantize_optional(l.bv));
    bo_.push_back(dequantize_optional(l.bo));
  }
  layers_ = weights_.layers;
  output_ = weights_.output;
  std::vector<model::weight_view*> matrices;
  for (auto& l : layers_)
    for (model::weight_view* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) matrices.push_back(v);
  if (comm_ == nullptr || comm_->rank() == 0) matrices.push_back(&output_);  // the others compute no logits
  resident_.place(matrices, &pool_);
  output_norm_ = dequantize_vector(weights_.output_norm);
  rope_factors_ = dequantize_optional(weights_.rope_freqs);
  EXA_ASSERT(rope_factors_.empty() || rope_factors_.size() == config_.rope_dim / 2);
  rope_.rope_dim = config_.rope_dim;
  rope_.freq_base = config_.rope_freq_base;
  rope_.freq_scale = config_.rope_freq_scale;
  rope_.freq_factors = rope_factors_.empty() ? nullptr : rope_factors_.data();
  rope_.halves = config_.rope_pairs == model::rope_pairing::halves;
}

expected<void> llama_forward::all_reduce(float* data, std::size_t n) {
  if (comm_ == nullptr) return {};
  return comm_->all_reduce_sum(data, n);
}

template <class Fn>
void llama_forward::for_tokens(std::size_t n_tok, Fn&& fn) {
  pool_.parallel_for(n_tok, 1, [&](std::size_t b, std::size_t e) {
    for (std::size_t t = b; t < e; ++t) fn(t);
  });
}

void llama_forward::norm_tokens(const float* w, std::size_t n_tok) {
  // Tokens in runs of up to 8 (rms_norm_rows): each norm's double sum is a
  // chain of dependent additions, and 8 chains side by side overlap.
  const std::size_t dim = config_.dim;
  pool_.parallel_for((n_tok + 7) / 8, 1, [&](std::size_t b, std::size_t e) {
    const std::size_t t0 = b * 8, t1 = std::min(n_tok, e * 8);
    rms_norm_rows(x_.data() + t0 * dim, dim, w, dim, config_.rms_eps, xn_.data() + t0 * dim, dim, t1 - t0);
  });
}

void llama_forward::project(const model::weight_view& w, std::size_t n_tok, float* y,
                            std::size_t y_stride) {
  if (xn_acts_.serves(w.type, w.cols)) return matmul(w, xn_acts_, y, y_stride, pool_);
  return matmul(w, xn_.data(), config_.dim, n_tok, y, y_stride, pool_, other_acts_);
}

void llama_forward::project_all(std::span<const matmul_target> targets, std::size_t n_tok) {
  // One parallel_for for all of them when they share the activations (the
  // usual case: one type for a layer's matrices): one wait instead of one
  // per matrix, which at batch 1 with 2 threads is a step's tens of
  // microseconds a layer.
  bool shared = true;
  for (const matmul_target& t : targets) shared = shared && xn_acts_.serves(t.w->type, t.w->cols);
  if (shared) return matmul_many(targets, xn_acts_, pool_);
  for (const matmul_target& t : targets) project(*t.w, n_tok, t.y, t.y_stride);
}

void llama_forward::attend(const forward_batch& batch, std::uint32_t layer, attend_run run, std::size_t kv_head,
                           attend_scratch& s) {
  const forward_token& first = batch.tokens[run.first];
  const std::vector<block_id>& table = *batch.tables[first.seq_index];
  const std::size_t hd = config_.head_dim();
  // The query heads that share this KV head, of each token of the run, each
  // against every position it sees: per head the same operations as one
  // head of one token at a time. Head i of the run is token i / group's
  // head head0 + i % group.
  const std::size_t group = n_heads_ / n_kv_heads_;
  const std::size_t head0 = kv_head * group;
  const std::size_t heads = run.count * group;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  s.q.resize(heads * hd);
  // A token's heads of the group are adjacent: round them to f16 in one call.
  for (std::size_t i = 0; i < run.count; ++i)
    kernels_->round_f16(q_.data() + (run.first + i) * q_dim_ + head0 * hd, s.q.data() + i * group * hd, group * hd);

  // The run's first token sees positions [0, n_first), its i-th [0, n_first + i).
  const std::size_t n_first = std::size_t{first.pos} + 1;
  const std::size_t n = n_first + run.count - 1;
  // Every head's scores against all n positions, rows n apart: the last
  // tokens' positions are scored for the earlier tokens too (they are in the
  // cache: the batch stored its K and V first) and not used.
  s.scores.resize(heads * n);
  float* scores = s.scores.data();
  // One KV block at a time: its positions' K (and V) vectors are kv_dim apart.
  const std::uint32_t bt = cache_.layout().block_tokens;
  const std::size_t stride = kv_dim_;
  // Each block's rows are fetched ahead, one block before they are read:
  // this head's part of a row is a few cache lines every kv_dim elements, a
  // stride the hardware prefetchers do not follow across blocks.
  const auto fetch = [&](const std::uint16_t* rows, std::size_t m) {
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t b = 0; b < hd * sizeof(std::uint16_t); b += 64)
        __builtin_prefetch(reinterpret_cast<const char*>(rows + r * stride) + b);
  };
  // Transposed, this head's K in a block is one span: hd rows of bt positions.
  const auto fetch_kt = [&](const std::uint16_t* kt) {
    for (std::size_t b = 0; b < hd * bt * sizeof(std::uint16_t); b += 64)
      __builtin_prefetch(reinterpret_cast<const char*>(kt) + b);
  };
  for (std::uint32_t j0 = 0; j0 < n; j0 += bt) {
    const std::size_t m = std::min<std::size_t>(bt, n - j0);
    if (j0 + bt >= n) fetch(cache_.v(table, layer, 0) + kv_head * hd, std::min<std::size_t>(bt, n));
    else if (k_transposed_) fetch_kt(cache_.k_block(table, layer, j0 + bt) + kv_head * hd * bt);
    else fetch(cache_.k(table, layer, j0 + bt) + kv_head * hd, std::min<std::size_t>(bt, n - j0 - bt));
    if (k_transposed_)
      kernels_->dot_f16_kt(s.q.data(), hd, heads, cache_.k_block(table, layer, j0) + kv_head * hd * bt, bt, m, hd,
                           scores + j0, n);
    else
      kernels_->dot_f16_rows(s.q.data(), hd, heads, cache_.k(table, layer, j0) + kv_head * hd, stride, m, hd,
                             scores + j0, n);
  }
  for (std::size_t h = 0; h < heads; ++h) {
    const std::size_t seen = n_first + h / group;
    for (std::size_t j = 0; j < seen; ++j) scores[h * n + j] *= scale;
    kernels_->softmax(scores + h * n, seen);
  }
  // One token: its group's heads are adjacent in att_, summed there. More:
  // summed in s.out, head after head, then copied.
  float* out = att_.data() + run.first * q_dim_ + head0 * hd;
  if (run.count > 1) {
    s.out.resize(heads * hd);
    out = s.out.data();
  }
  for (std::size_t i = 0; i < heads * hd; ++i) out[i] = 0.0f;
  for (std::uint32_t j0 = 0; j0 < n; j0 += bt) {
    const std::size_t m = std::min<std::size_t>(bt, n - j0);
    if (j0 + bt < n) fetch(cache_.v(table, layer, j0 + bt) + kv_head * hd, std::min<std::size_t>(bt, n - j0 - bt));
    const std::uint16_t* v = cache_.v(table, layer, j0) + kv_head * hd;
    // The positions every token sees, for all heads; then each later
    // position for the tokens that see it (the run's last ones), in order:
    // every head still adds its positions one by one, first to last.
    const std::size_t shared = j0 < n_first ? std::min(m, n_first - j0) : 0;
    if (shared > 0) kernels_->axpy_f16_rows(scores + j0, n, heads, v, stride, shared, hd, out, hd);
    for (std::size_t r = shared; r < m; ++r) {
      const std::size_t h = (j0 + r - n_first + 1) * group;  // the first head that sees position j0 + r
      kernels_->axpy_f16_rows(scores + h * n + j0 + r, n, heads - h, v + r * stride, stride, 1, hd, out + h * hd,
                              hd);
    }
  }
  if (run.count > 1)
    for (std::size_t i = 0; i < run.count; ++i)
      std::copy_n(out + i * group * hd, group * hd, att_.data() + (run.first + i) * q_dim_ + head0 * hd);
}

expected<void> llama_forward::attention_layer(const forward_batch& batch, std::uint32_t layer) {
  const std::size_t n_tok = batch.tokens.size();
  const std::size_t dim = config_.dim, q_dim = q_dim_, kv_dim = kv_dim_, hd = config_.head_dim();
  const auto& w = layers_[layer];
  xn_acts_.convert(w.wq.type, xn_.data(), dim, n_tok, dim, &pool_);
  const matmul_target qkv[] = {{&w.wq, q_.data(), q_dim}, {&w.wk, k_.data(), kv_dim}, {&w.wv, v_.data(), kv_dim}};
  project_all(qkv, n_tok);

  // Biases and RoPE, then store this batch's K and V so every token can
  // attend to the earlier positions of its own chunk.
  for_tokens(n_tok, [&](std::size_t t) {
    const forward_token& tok = batch.tokens[t];
    add_bias(q_.data() + t * q_dim, bq_[layer]);
    add_bias(k_.data() + t * kv_dim, bk_[layer]);
    add_bias(v_.data() + t * kv_dim, bv_[layer]);
    const float* cos_t = rope_cs_.data() + t * rope_.rope_dim;
    const float* sin_t = cos_t + rope_.rope_dim / 2;
    rope_rotate(q_.data() + t * q_dim, n_heads_, hd, cos_t, sin_t, rope_);
    rope_rotate(k_.data() + t * kv_dim, n_kv_heads_, hd, cos_t, sin_t, rope_);
    const std::vector<block_id>& table = *batch.tables[tok.seq_index];
    kernels_->to_f16(v_.data() + t * kv_dim, cache_.v(table, layer, tok.pos), kv_dim);
    if (k_transposed_) {  // element i of this position at kt[i · bt + slot]
      const std::uint32_t bt = cache_.layout().block_tokens;
      std::uint16_t* kt = cache_.k_block(table, layer, tok.pos) + tok.pos % bt;
      std::uint16_t bits[256];  // converted a piece at a time, then spread
      for (std::size_t i0 = 0; i0 < kv_dim; i0 += std::size(bits)) {
        const std::size_t m = std::min(std::size(bits), kv_dim - i0);
        kernels_->to_f16(k_.data() + t * kv_dim + i0, bits, m);
        for (std::size_t i = 0; i < m; ++i) kt[(i0 + i) * bt] = bits[i];
      }
    } else {
      kernels_->to_f16(k_.data() + t * kv_dim, cache_.k(table, layer, tok.pos), kv_dim);
    }
  });

  // A token's attention costs in proportion to its position, so the last
  // chunks of a prompt are the heaviest: small chunks keep the threads even.
  // The runs (run_layers) go out with each KV head.
  pool_.parallel_for(
      attend_runs_.size() * n_kv_heads_, 1,
      [&](std::size_t begin, std::size_t end) {
        attend_scratch s;
        for (std::size_t i = begin; i < end; ++i) attend(batch, layer, attend_runs_[i / n_kv_heads_], i % n_kv_heads_, s);
      },
      16);
  matmul(w.wo, att_.data(), q_dim, n_tok, proj_.data(), dim, pool_, other_acts_);
  // Row-parallel: each member holds a partial sum over its heads. The bias
  // is added once, to the sum.
  if (auto ok = all_reduce(proj_.data(), n_tok * dim); !ok) return ok;
  for_tokens(n_tok, [&](std::size_t t) {
    add_bias(proj_.data() + t * dim, bo_[layer]);
    for (std::size_t i = t * dim; i < (t + 1) * dim; ++i) x_[i] += proj_[i];
  });
  return {};
}

expected<void> llama_forward::mlp_layer(std::uint32_t layer, std::size_t n_tok) {
  const std::size_t dim = config_.dim, ff = ff_;
  const auto& w = layers_[layer];
  norm_tokens(ffn_norm_[layer].data(), n_tok);
  xn_acts_.convert(w.w_gate.type, xn_.data(), dim, n_tok, dim, &pool_);
  const matmul_target gate_up[] = {{&w.w_gate, gate_.data(), ff}, {&w.w_up, up_.data(), ff}};
  project_all(gate_up, n_tok);
  for_tokens(n_tok, [&](std::size_t t) { kernels_->silu_mul(gate_.data() + t * ff, up_.data() + t * ff, ff); });
  matmul(w.w_down, gate_.data(), ff, n_tok, proj_.data(), dim, pool_, other_acts_);
  if (auto ok = all_reduce(proj_.data(), n_tok * dim); !ok) return ok;  // row-parallel, as O
  for_tokens(n_tok, [&](std::size_t t) {
    for (std::size_t i = t * dim; i < (t + 1) * dim; ++i) x_[i] += proj_[i];
  });
  return {};
}

void llama_forward::run(const forward_batch& batch, std::vector<float>& logits) {
  EXA_ASSERT_MSG(comm_ == nullptr, "a tensor-parallel member runs through execute()");
  const auto ok = execute(batch, logits);
  EXA_ASSERT(ok.has_value());
}

expected<void> llama_forward::execute(const forward_batch& batch, std::vector<float>& logits) {
  auto ran = run_layers(batch, logits, nullptr, nullptr);
  if (!ran) return std::unexpected(ran.error());
  return {};
}

expected<bool> llama_forward::execute_yielding(const forward_batch& batch, std::vector<float>& logits,
                                               forward_suspension& state, const std::function<bool()>& should_yield) {
  if (comm_ != nullptr) {
    if (state.next_stage != 0) return make_error(errc::internal, "a tensor-parallel member cannot resume a suspended batch");
    return run_layers(batch, logits, nullptr, nullptr);
  }
  return run_layers(batch, logits, &state, &should_yield);
}

expected<bool> llama_forward::run_layers(const forward_batch& batch, std::vector<float>& logits,
                                         forward_suspension* state, const std::function<bool()>* should_yield) {
  const std::size_t n_tok = batch.tokens.size();
  const std::size_t dim = config_.dim;
  logits.clear();
  if (n_tok == 0) return false;
  kernels_ = &active_kernels();
  x_.resize(n_tok * dim);
  xn_.resize(n_tok * dim);
  q_.resize(n_tok * q_dim_);
  att_.resize(n_tok * q_dim_);
  proj_.resize(n_tok * dim);
  k_.resize(n_tok * kv_dim_);
  v_.resize(n_tok * kv_dim_);
  gate_.resize(n_tok * ff_);
  up_.resize(n_tok * ff_);

  // A suspended batch goes on from its hidden state; a new one starts from
  // its tokens' embeddings.
  const std::uint32_t first_stage = state != nullptr ? state->next_stage : 0;
  if (first_stage != 0) {
    EXA_ASSERT_MSG(first_stage < 2 * config_.n_layers && state->hidden.size() == n_tok * dim,
                   "a suspended forward resumed with another batch");
    std::copy(state->hidden.begin(), state->hidden.end(), x_.begin());
    state->next_stage = 0;
  } else {
    for (std::size_t t = 0; t < n_tok; ++t) {
      const auto token = batch.tokens[t].token;
      EXA_ASSERT(token >= 0 && static_cast<std::uint64_t>(token) < weights_.token_embd.rows);
      EXA_ASSERT(batch.tokens[t].seq_index < batch.tables.size());
      dequantize_row(weights_.token_embd, static_cast<std::size_t>(token), x_.data() + t * dim);
    }
  }

  // Each token's RoPE angles, once for all the layers.
  rope_cs_.resize(n_tok * rope_.rope_dim);
  for_tokens(n_tok, [&](std::size_t t) {
    float* cos_t = rope_cs_.data() + t * rope_.rope_dim;
    rope_table(batch.tokens[t].pos, rope_, cos_t, cos_t + rope_.rope_dim / 2);
  });

  // Attention's runs, once for all the layers: one sequence's consecutive
  // tokens (a prompt's chunk) share each K and V row's load and conversion
  // (and, with K by slot, the dot kernels' transpose of 16 rows), up to 16
  // query heads a KV head (a run's scores: 16 rows).
  const std::size_t max_run = std::max<std::size_t>(1, 16 / (n_heads_ / n_kv_heads_));
  attend_runs_.clear();
  for (std::size_t t = 0; t < n_tok;) {
    std::size_t e = t + 1;
    while (e < n_tok && e - t < max_run && batch.tokens[e].seq_index == batch.tokens[t].seq_index &&
           batch.tokens[e].pos == batch.tokens[e - 1].pos + 1)
      ++e;
    attend_runs_.push_back({static_cast<std::uint32_t>(t), static_cast<std::uint32_t>(e - t)});
    t = e;
  }

  // Stage 2l is layer l's attention, 2l + 1 its MLP.
  for (std::uint32_t stage = first_stage; stage < 2 * config_.n_layers; ++stage) {
    // Between stages x_ is the whole state (the K/V of the attention done
    // is in the cache), so keeping it is stopping here.
    if (stage > first_stage && should_yield != nullptr && (*should_yield)()) {
      state->hidden.assign(x_.begin(), x_.begin() + static_cast<std::ptrdiff_t>(n_tok * dim));
      state->next_stage = stage;
      return true;
    }
    const std::uint32_t l = stage / 2;
    if (stage % 2 == 1) {
      if (auto ok = mlp_layer(l, n_tok); !ok) return std::unexpected(ok.error());
      continue;
    }
    norm_tokens(attn_norm_[l].data(), n_tok);
    if (auto ok = attention_layer(batch, l); !ok) return std::unexpected(ok.error());
  }
  // Every member holds the same hidden state now: rank 0 alone computes logits.
  if (comm_ != nullptr && comm_->rank() != 0) return false;

  // Only the tokens that need logits go through the final norm and head.
  std::size_t n_out = 0;
  for (std::size_t t = 0; t < n_tok; ++t) {
    if (!batch.tokens[t].logits) continue;
    rms_norm(x_.data() + t * dim, output_norm_.data(), dim, config_.rms_eps, xn_.data() + n_out * dim);
    ++n_out;
  }
  const std::size_t vocab = output_.rows;
  logits.resize(n_out * vocab);
  matmul(output_, xn_.data(), dim, n_out, logits.data(), vocab, pool_, other_acts_);
  return false;
}

}  // namespace exa::engine
