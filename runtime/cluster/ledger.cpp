#include "cluster/ledger.hpp"

#include <fmt/format.h>

#include "common/assert.hpp"

namespace exa::cluster {
namespace {

expected<void> check_config(const model_shape& model, const replica_config& c) {
  if (!valid_tensor_parallel(c.tensor_parallel)) {
    return make_error(errc::invalid_argument,
                      fmt::format("tensor_parallel = {} must be 1, 2, 4 or 8", c.tensor_parallel));
  }
  if (model.n_heads % c.tensor_parallel != 0) {
    return make_error(errc::invalid_argument,
                      fmt::format("tensor_parallel = {} does not divide the {} attention heads of '{}'",
                                  c.tensor_parallel, model.n_heads, model.name));
  }
  if (c.kv_tokens > max_kv_tokens) {
    return make_error(errc::invalid_argument,
                      fmt::format("kv_tokens = {} exceeds the limit {}", c.kv_tokens, max_kv_tokens));
  }
  if (c.max_batch_tokens == 0 || c.max_batch_tokens > max_batch_tokens_limit) {
    return make_error(errc::invalid_argument, fmt::format("max_batch_tokens = {} must be in 1..{}",
                                                          c.max_batch_tokens, max_batch_tokens_limit));
  }
  // Every sequence in a step contributes at least one token.
  if (c.max_batch_sequences == 0 || c.max_batch_sequences > c.max_batch_tokens) {
    return make_error(errc::invalid_argument,
                      fmt::format("max_batch_sequences = {} must be in 1..max_batch_tokens ({})",
                                  c.max_batch_sequences, c.max_batch_tokens));
  }
  if (c.replica_overhead_bytes > max_replica_overhead_bytes) {
    return make_error(errc::invalid_argument, fmt::format("replica_overhead_bytes = {} exceeds the limit {}",
                                                          c.replica_overhead_bytes, max_replica_overhead_bytes));
  }
  return {};
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) noexcept { return (a + b - 1) / b; }

}  // namespace

bool valid_tensor_parallel(std::uint32_t tp) noexcept { return tp == 1 || tp == 2 || tp == 4 || tp == 8; }

expected<memory_breakdown> estimate(const model_shape& model, const replica_config& config) {
  if (auto ok = validate(model); !ok) return std::unexpected(ok.error());
  if (model.weight_bytes == 0) {
    return make_error(errc::invalid_argument, fmt::format("model '{}': weight_bytes is 0", model.name));
  }
  if (auto ok = check_config(model, config); !ok) return std::unexpected(ok.error());
  const std::uint64_t tp = config.tensor_parallel;
  const std::uint64_t f32_bytes = 4;
  memory_breakdown m;
  m.weights_bytes = ceil_div(model.weight_bytes, tp);
  const std::uint64_t kv_heads_per_shard = ceil_div(model.n_kv_heads, tp);
  m.kv_bytes = config.kv_tokens * 2 * model.n_layers * kv_heads_per_shard * model.head_dim() * model.kv_elem_bytes;
  const std::uint64_t per_token = 4 * std::uint64_t{model.dim} + 2 * std::uint64_t{model.ff_dim};
  m.activations_bytes = std::uint64_t{config.max_batch_tokens} * per_token * f32_bytes +
                        std::uint64_t{config.max_batch_sequences} * model.vocab_size * f32_bytes;
  m.overhead_bytes = config.replica_overhead_bytes;
  if (config.draft) {
    replica_config alone = config;
    alone.draft.reset();
    alone.tensor_parallel = 1;
    alone.replica_overhead_bytes = 0;
    auto d = estimate(*config.draft, alone);
    if (!d) return make_error(d.error().code, "draft model: " + d.error().message);
    m.weights_bytes += d->weights_bytes;
    m.kv_bytes += d->kv_bytes;
    m.activations_bytes += d->activations_bytes;
  }
  return m;
}

std::string format_bytes(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= gib_bytes) return fmt::format("{:.2f} GiB", b / static_cast<double>(gib_bytes));
  if (bytes >= mib_bytes) return fmt::format("{:.2f} MiB", b / static_cast<double>(mib_bytes));
  if (bytes >= 1024) return fmt::format("{:.2f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

device_ledger::device_ledger(std::uint64_t capacity_bytes, std::uint64_t reserved_bytes)
    : capacity_bytes_(capacity_bytes), reserved_bytes_(reserved_bytes), used_bytes_(reserved_bytes) {
  EXA_ASSERT_MSG(reserved_bytes <= capacity_bytes, "device reserve exceeds its capacity");
}

expected<void> device_ledger::admit(replica_id replica, const memory_breakdown& m) {
  if (holds(replica)) {
    return make_error(errc::invalid_argument, fmt::format("replica {} is already admitted on this device", replica));
  }
  if (!can_admit(m)) {
    return make_error(errc::out_of_memory,
                      fmt::format("replica {} needs {} (weights {}, KV {}, activations {}, overhead {}), "
                                  "{} free of {}",
                                  replica, format_bytes(m.total_bytes()), format_bytes(m.weights_bytes),
                                  format_bytes(m.kv_bytes), format_bytes(m.activations_bytes),
                                  format_bytes(m.overhead_bytes), format_bytes(free_bytes()),
                                  format_bytes(capacity_bytes_)));
  }
  entries_.emplace(replica, m);
  used_bytes_ += m.total_bytes();
  check_invariants();
  return {};
}

expected<void> device_ledger::release(replica_id replica) {
  const auto it = entries_.find(replica);
  if (it == entries_.end()) {
    return make_error(errc::not_found, fmt::format("replica {} is not admitted on this device", replica));
  }
  const std::uint64_t total = it->second.total_bytes();
  // Going below the reserve would mean the books were already wrong.
  EXA_ASSERT_MSG(used_bytes_ >= reserved_bytes_ + total, "ledger would go negative");
  used_bytes_ -= total;
  entries_.erase(it);
  check_invariants();
  return {};
}

void device_ledger::check_invariants() const {
  EXA_ASSERT(reserved_bytes_ <= used_bytes_);
  EXA_ASSERT(used_bytes_ <= capacity_bytes_);
  // A second path to the same number: a drift between the running total and
  // the entries is a bookkeeping bug. Devices hold a handful of replicas.
  std::uint64_t sum = reserved_bytes_;
  for (const auto& [id, m] : entries_) sum += m.total_bytes();
  EXA_ASSERT_MSG(sum == used_bytes_, "ledger total disagrees with its entries");
}

std::uint64_t shards_per_device(const memory_breakdown& per_device, const device_spec& device) noexcept {
  if (device.device_reserved_bytes >= device.memory_bytes) return 0;
  const std::uint64_t usable = device.memory_bytes - device.device_reserved_bytes;
  const std::uint64_t total = per_device.total_bytes();
  return total == 0 ? 0 : usable / total;
}

std::uint64_t replicas_per_node(std::uint64_t shards, std::uint32_t devices, std::uint32_t tp) noexcept {
  if (tp == 0 || tp > devices) return 0;
  return shards * devices / tp;
}

expected<std::optional<std::uint32_t>> min_tensor_parallel(const model_shape& model, replica_config config,
                                                           const device_spec& device,
                                                           std::uint32_t devices_per_node) {
  for (std::uint32_t tp = 1; tp <= max_tensor_parallel && tp <= devices_per_node; tp *= 2) {
    // A TP degree that does not divide the heads cannot shard this model, and
    // no larger power of two divides them either.
    if (model.n_heads % tp != 0) break;
    config.tensor_parallel = tp;
    auto m = estimate(model, config);
    if (!m) return std::unexpected(m.error());
    if (shards_per_device(*m, device) >= 1) return std::optional<std::uint32_t>(tp);
  }
  return std::optional<std::uint32_t>();
}

}  // namespace exa::cluster
