#pragma once
// Admission control: bounded queues in front of the replicas, so overload
// turns into a prompt `overloaded` answer with a Retry-After instead of
// unbounded memory and latency.
//
// A request's places, each with a named maximum:
//   try_admit     → queued     (per model: queued_per_model_max; all models: queued_global_max)
//   try_dispatch  → in flight on one replica (in_flight_per_replica_max)
//   release       → gone (completed, cancelled or failed)
// A refused admission's Retry-After is the time the blocking queue needs to
// drain at its recent departure rate (dispatches and releases out of the
// queue over a sliding window), clamped; the configured default when no
// departure was seen. Time is a parameter (`now_ns`), never read here.

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

struct admission_config {
  std::uint32_t in_flight_per_replica_max = 64;
  std::uint32_t queued_global_max = 4096;
  std::uint32_t queued_per_model_max = 1024;
  /// Distinct models and replicas tracked (bounds the bookkeeping itself).
  std::uint32_t models_max = 1024;
  std::uint32_t replicas_max = 1u << 16;
  /// Retry-After when no drain rate is known yet, and its clamp.
  std::uint32_t retry_after_ms_default = 1000;
  std::uint32_t retry_after_ms_min = 100;
  std::uint32_t retry_after_ms_max = 30000;
  /// Window over which queue departures are counted for the drain rate.
  std::uint64_t drain_window_ns = 10'000'000'000;
};

/// Proof that a request holds a place; hand it back through release().
struct admission_ticket {
  std::uint64_t id = 0;
  friend bool operator==(const admission_ticket&, const admission_ticket&) = default;
};

/// Events per second over a sliding window of fixed buckets (O(1) memory).
class event_rate {
 public:
  static constexpr std::size_t buckets = 8;

  explicit event_rate(std::uint64_t window_ns) noexcept;
  void record(std::uint64_t now_ns) noexcept;
  /// Rate over the window ending at now_ns (shorter right after the first
  /// event, so a young system is not judged idle); 0 when nothing was seen.
  double per_s(std::uint64_t now_ns) const noexcept;

 private:
  std::uint64_t bucket_ns_;
  std::array<std::uint64_t, buckets> counts_{};
  std::array<std::uint64_t, buckets> bucket_of_{};  // which absolute bucket each slot holds
  std::uint64_t first_ns_ = 0;
  std::uint64_t latest_ns_ = 0;
  bool seen_ = false;
};

class admission_controller {
 public:
  /// invalid_argument for zero limits or an inverted Retry-After clamp.
  static expected<admission_controller> create(admission_config config = {});

  /// Queues a request for `model`; overloaded (naming the full queue and the
  /// suggested wait) when the model's or the global queue is full.
  expected<admission_ticket> try_admit(std::string_view model, std::uint64_t now_ns);
  /// Puts an admitted request on `replica` (or moves an in-flight one there,
  /// e.g. when it resumes after its replica failed). overloaded when the
  /// replica is at its in-flight limit; the ticket then keeps its place.
  expected<void> try_dispatch(const admission_ticket& ticket, replica_id replica, std::uint64_t now_ns);
  /// Frees the ticket's place; not_found for an unknown or released ticket.
  expected<void> release(const admission_ticket& ticket, std::uint64_t now_ns);

  /// Suggested Retry-After for a request of `model` refused at now_ns: the
  /// global queue's estimate when it is full, else the model queue's; 0 when
  /// neither is full.
  std::uint32_t retry_after_ms(std::string_view model, std::uint64_t now_ns) const;

  std::uint32_t queued(std::string_view model) const noexcept;
  std::uint32_t queued_total() const noexcept { return queued_total_; }
  std::uint32_t in_flight(replica_id replica) const noexcept;
  std::uint64_t in_flight_total() const noexcept { return in_flight_total_; }
  const admission_config& config() const noexcept { return config_; }

 private:
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  struct model_queue {
    std::string name;
    std::uint32_t queued = 0;
    event_rate departures;
  };
  struct ticket_state {
    std::uint32_t model = 0;
    bool dispatched = false;
    replica_id replica = 0;
  };

  explicit admission_controller(admission_config config);
  const model_queue* find_model(std::string_view model) const noexcept;
  std::uint32_t estimate_ms(std::uint64_t backlog, const event_rate& rate, std::uint64_t now_ns) const;
  void leave_queue(ticket_state& state, std::uint64_t now_ns);
  void leave_replica(const ticket_state& state);
  void check_invariants() const;

  admission_config config_;
  std::vector<model_queue> models_;
  std::unordered_map<std::string, std::uint32_t, string_hash, std::equal_to<>> model_index_;
  std::unordered_map<std::uint64_t, ticket_state> tickets_;
  std::unordered_map<replica_id, std::uint32_t> in_flight_;
  event_rate global_departures_;
  std::uint32_t queued_total_ = 0;
  std::uint64_t in_flight_total_ = 0;
  std::uint64_t next_ticket_ = 1;
};

}  // namespace exa::cluster
