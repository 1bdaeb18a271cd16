#pragma once
// The memory ledger: what one replica costs on each device it uses (weights,
// KV cache, activation reserve, framework overhead), and per device the
// replicas admitted so far. Placement admits a replica only where it fits;
// the ledger never goes negative and never holds more than its capacity.
// docs/PLANNING.md walks through the formulas with a worked example.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "cluster/hardware.hpp"
#include "cluster/model_shape.hpp"
#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

/// Largest tensor-parallel group: one node's NVLink domain.
constexpr std::uint32_t max_tensor_parallel = 8;
/// Bounds on a replica's configuration; past them the numbers stop meaning
/// anything and products could overflow.
constexpr std::uint64_t max_kv_tokens = std::uint64_t{1} << 31;
constexpr std::uint32_t max_batch_tokens_limit = 1u << 20;
constexpr std::uint64_t max_replica_overhead_bytes = std::uint64_t{1} << 40;

/// True for 1, 2, 4 and 8.
bool valid_tensor_parallel(std::uint32_t tp) noexcept;

/// How one replica runs: what its memory depends on besides the model.
struct replica_config {
  /// Devices of one node the replica is sharded over: 1, 2, 4 or 8.
  std::uint32_t tensor_parallel = 1;
  /// KV cache capacity of the replica, in tokens, summed over all sequences.
  std::uint64_t kv_tokens = 0;
  /// Tokens one engine step processes (prefill chunk plus one per decoding
  /// sequence): sizes the activation reserve.
  std::uint32_t max_batch_tokens = 2048;
  /// Sequences whose logits one step produces (one row of vocab each).
  std::uint32_t max_batch_sequences = 1;
  /// Fixed framework cost per replica shard (device_spec::replica_overhead_bytes).
  std::uint64_t replica_overhead_bytes = 0;
  /// A draft model for speculative decoding (engine/speculative.hpp), none
  /// if empty. The engine keeps it whole beside each shard, with a KV cache
  /// of as many tokens as the replica's and its own activations.
  std::optional<model_shape> draft;
};

/// What one replica holds on each device of its TP group.
struct memory_breakdown {
  std::uint64_t weights_bytes = 0;
  std::uint64_t kv_bytes = 0;
  std::uint64_t activations_bytes = 0;
  std::uint64_t overhead_bytes = 0;

  std::uint64_t total_bytes() const noexcept {
    return weights_bytes + kv_bytes + activations_bytes + overhead_bytes;
  }
  friend bool operator==(const memory_breakdown&, const memory_breakdown&) = default;
};

/// Per-device memory of one replica of `model` run as `config`:
///   weights     = ceil(weight_bytes / tp)
///   kv          = kv_tokens × 2 × layers × ceil(kv_heads / tp) × head_dim × kv_elem_bytes
///                 (= kv_tokens × kv_bytes_per_token / tp when tp divides kv_heads;
///                 with more shards than KV heads each shard keeps a whole head)
///   activations = max_batch_tokens × (4·dim + 2·ff_dim) × 4
///                 + max_batch_sequences × vocab × 4
///                 (f32 intermediates: residual, normed input, Q, attention
///                 output, FFN gate and up; then the logits. Not divided by tp:
///                 a deliberate over-reserve, small next to weights and KV.)
///   overhead    = replica_overhead_bytes
/// With a draft, its weights, KV (kv_tokens of it) and activations, computed
/// alike unsharded (tp 1), add to the weights, KV and activations.
/// Errors (invalid_argument, naming the field): an invalid shape, tp not in
/// {1, 2, 4, 8} or not dividing n_heads, a size out of bounds.
expected<memory_breakdown> estimate(const model_shape& model, const replica_config& config);

/// "14.21 GiB" (or MiB, KiB, B for smaller amounts): for messages and reports.
std::string format_bytes(std::uint64_t bytes);

/// The memory of one device: its capacity, a fixed reserve taken before any
/// replica (the CUDA context), and one entry per admitted replica.
class device_ledger {
 public:
  /// Requires reserved_bytes <= capacity_bytes (callers validate first).
  explicit device_ledger(std::uint64_t capacity_bytes, std::uint64_t reserved_bytes = 0);

  std::uint64_t capacity_bytes() const noexcept { return capacity_bytes_; }
  std::uint64_t reserved_bytes() const noexcept { return reserved_bytes_; }
  /// Reserve plus every admitted replica.
  std::uint64_t used_bytes() const noexcept { return used_bytes_; }
  std::uint64_t free_bytes() const noexcept { return capacity_bytes_ - used_bytes_; }

  bool can_admit(const memory_breakdown& m) const noexcept { return m.total_bytes() <= free_bytes(); }

  /// Records `replica` as holding `m`. Errors: out_of_memory naming the need,
  /// the free and the capacity; invalid_argument if `replica` is already here.
  expected<void> admit(replica_id replica, const memory_breakdown& m);

  /// Gives `replica`'s memory back. Errors: not_found if it is not here
  /// (released twice, or never admitted).
  expected<void> release(replica_id replica);

  bool holds(replica_id replica) const { return entries_.count(replica) != 0; }
  std::size_t replica_count() const noexcept { return entries_.size(); }
  const std::map<replica_id, memory_breakdown>& entries() const noexcept { return entries_; }

 private:
  void check_invariants() const;

  std::uint64_t capacity_bytes_ = 0;
  std::uint64_t reserved_bytes_ = 0;
  std::uint64_t used_bytes_ = 0;
  std::map<replica_id, memory_breakdown> entries_;
};

/// Replica shards of `per_device` that fit one empty `device` (after its reserve).
std::uint64_t shards_per_device(const memory_breakdown& per_device, const device_spec& device) noexcept;

/// Whole replicas of `tp` shards that fit a node of `devices` devices, each
/// holding `shards` shards: every TP group needs `tp` distinct devices, which
/// floor(devices × shards / tp) groups always find when tp <= devices.
std::uint64_t replicas_per_node(std::uint64_t shards, std::uint32_t devices, std::uint32_t tp) noexcept;

/// The smallest tensor_parallel in {1, 2, 4, 8}, at most `devices_per_node`,
/// at which one replica's per-device share fits an empty `device`; nullopt if
/// none does. `config.tensor_parallel` is ignored. Errors: as estimate().
expected<std::optional<std::uint32_t>> min_tensor_parallel(const model_shape& model, replica_config config,
                                                           const device_spec& device,
                                                           std::uint32_t devices_per_node);

}  // namespace exa::cluster
