#pragma once
// Speculative decoding for the CPU engine. A small draft model with the
// target's vocabulary runs beside it: for each sequence whose step ends at its
// last token, the draft proposes up to k tokens (k cheap draft steps, batched
// across sequences), the target computes all k+1 positions in its one forward
// batch, and each position is decided by the standard rule:
//
//   greedy  -- accept the draft token while it is the target's argmax; the
//              first mismatch emits the target's argmax, k accepts emit the
//              target's argmax after them (the bonus token). The output is the
//              target's own greedy output, token for token.
//   sampled -- accept draft token x with probability min(1, p_t(x) / p_d(x)),
//              else emit a sample of normalize(max(0, p_t - p_d)), where p_t
//              and p_d are the distributions sampler::sample draws from
//              (temperature, top-k, top-p applied). The emitted token is
//              distributed exactly as p_t.
//
// Every position is decided by the same rule whatever window it falls in: the
// draft's three draws at generated-token index g (propose, accept, residual)
// are pure functions of (seed, g), and the position after k accepted tokens is
// decided like the others (the draft computes its p_d then), so a sampled
// output depends on the seed and the draft only -- not on k, on how many
// tokens a step could speculate (KV pressure), on the batch, on preemption or
// on resume. Tests check this.
//
// The draft keeps its own paged KV cache in a host block pool of its own,
// sized like the target's share (same block size, as many blocks): the device
// pool's blocks are sized and budgeted for the target, and a draft position
// never needs more blocks than the same target position, so without prefix
// sharing the draft never runs out. (With the target's prefix cache sharing
// blocks it can; a sequence whose draft KV cannot be reserved decodes that
// step without speculation: still the target's distribution, greedy still
// exact.) Rejected positions' KV, in both caches, lies past `computed` and is
// overwritten later; it is never written into a block other sequences share,
// because blocks at or past `computed` are the sequence's own.

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/error.hpp"
#include "engine/batch_scheduler.hpp"
#include "engine/kv_cache.hpp"
#include "engine/llama_forward.hpp"
#include "engine/sampler.hpp"
#include "model/llama_model.hpp"

namespace exa::engine {

class thread_pool;

/// Bounds on the tokens a draft proposes per step: more costs draft steps and
/// target positions that are rarely accepted (acceptance decays
/// geometrically), and bounds the per-step scratch (logits rows).
inline constexpr std::uint32_t default_draft_tokens = 4;
inline constexpr std::uint32_t max_draft_tokens = 8;

/// invalid_argument when `draft` cannot draft for `target`: a different
/// vocabulary (size, or any token's text), a shorter context, or
/// draft_tokens outside [1, max_draft_tokens].
expected<void> check_draft(const model::llama_model& target, const model::llama_model& draft,
                           std::uint32_t draft_tokens);

/// True when `p` picks the argmax (what sampler::sample does for it).
bool is_greedy(const sampling_params& p) noexcept;

/// The distribution sampler::sample(logits, vocab, p, ·) draws from, dense
/// over `vocab` ids (zero outside the kept candidates), for a non-greedy `p`.
void sampling_distribution(const float* logits, std::size_t vocab, const sampling_params& p,
                           std::vector<float>& probs);

/// The draws of speculative sampling at generated-token index `index`: one
/// stream each for the draft's proposal, the acceptance test and the residual.
double draft_draw(std::uint64_t seed, std::uint64_t index) noexcept;
double accept_draw(std::uint64_t seed, std::uint64_t index) noexcept;
double residual_draw(std::uint64_t seed, std::uint64_t index) noexcept;

/// Inverse-CDF pick from unnormalized weights `w` with u in [0, 1): the first
/// id whose running sum exceeds u × sum (only ids of positive weight).
model::token_id pick(std::span<const float> w, double u) noexcept;

/// The rejection-sampling rule at one position: `drafted` was drawn from
/// p_draft; returns the token to emit and sets `accepted` when it is `drafted`.
model::token_id speculative_choice(std::span<const float> p_target, std::span<const float> p_draft,
                                   model::token_id drafted, double u_accept, double u_residual,
                                   bool& accepted);

struct speculation_stats {
  std::uint64_t proposed = 0;  // draft tokens the target verified
  std::uint64_t accepted = 0;  // of them, accepted
  std::uint64_t rejected = 0;  // windows that ended at a rejected draft token
  /// Per-token acceptance: accepted tokens over tokens decided by the rule
  /// (accepted / proposed undercounts it: proposals after a rejection are
  /// never judged).
  double token_acceptance() const noexcept {
    return accepted + rejected == 0 ? 0.0 : static_cast<double>(accepted) / static_cast<double>(accepted + rejected);
  }
};

/// The draft side of one engine: its model, cache and forward pass, and the
/// per-step windows. The engine calls propose() after planning a step,
/// appends proposals() to each sequence's tokens in its forward batch (each
/// with logits), calls verify() with each sequence's logits rows, and emits
/// decided() in order (stopping where a stop token or max_tokens ends it).
class speculator {
 public:
  /// `capacity_blocks` of `block_tokens` positions: the target's share.
  speculator(std::shared_ptr<const model::llama_model> draft, std::uint32_t draft_tokens,
             std::uint32_t block_tokens, std::uint32_t capacity_blocks, thread_pool& threads,
             resident_options resident = {});
  ~speculator();
  speculator(const speculator&) = delete;
  speculator& operator=(const speculator&) = delete;

  /// Brings the draft cache of every planned sequence up to the end of its
  /// chunk; for each chunk that is one decoding token, reserves target KV for
  /// up to draft_tokens more positions (fewer near max_tokens or when the
  /// target cache is short) and runs the draft steps that propose them.
  /// Drops the draft KV of sequences no longer running.
  void propose(const std::vector<scheduled_chunk>& plan, batch_scheduler& scheduler, kv_cache& target);

  /// The draft tokens to verify after `seq`'s last token (empty: none).
  std::span<const model::token_id> proposals(const sequence& seq) const;
  /// True when `seq`'s tokens this step are decided by verify() (false: the
  /// engine samples as without a draft).
  bool speculates(const sequence& seq) const;

  /// Decides every speculating sequence's tokens from its target logits: one
  /// row per position, proposals().size() + 1 rows from `rows`.
  void verify(const std::vector<std::pair<sequence*, const float*>>& rows);
  /// The tokens verify() decided for `seq`, in order: accepted draft tokens,
  /// then the target's (correction or bonus). Their KV, but the last one's, is
  /// in the target cache.
  std::span<const model::token_id> decided(const sequence& seq) const;

  /// Drops a finished or cancelled sequence's draft KV and window (the id
  /// may come back as a new request).
  void forget(seq_id id);

  const speculation_stats& stats() const noexcept { return stats_; }
  const kv_cache& cache() const noexcept;
  /// The draft forward's weight copies (weight_store.hpp).
  resident_memory weights_memory() const noexcept;
  std::uint32_t draft_tokens() const noexcept { return draft_tokens_; }

 private:
  struct window;
  struct draft_seq;

  void drop_stale(batch_scheduler& scheduler);
  std::uint32_t reserve_window(sequence& seq, kv_cache& target);
  void first_step(const std::vector<scheduled_chunk>& plan, kv_cache& target);
  void next_steps(const std::vector<scheduled_chunk>& plan);
  void draft_from_row(const sequence& seq, window& w, const float* logits);
  model::token_id decide_at(const sequence& seq, window& w, std::uint32_t i, const float* target_row,
                            bool& accepted);
  void run_bonus(const std::vector<std::pair<sequence*, const float*>>& rows);

  std::shared_ptr<const model::llama_model> draft_;
  std::uint32_t draft_tokens_;
  std::size_t vocab_;
  std::unique_ptr<block_pool> pool_;
  std::unique_ptr<kv_cache> cache_;
  std::unique_ptr<llama_forward> forward_;
  sampler sampler_;
  std::unordered_map<seq_id, draft_seq> seqs_;
  std::vector<float> logits_, p_target_;
  speculation_stats stats_;
};

}  // namespace exa::engine
