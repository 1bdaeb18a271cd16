#pragma once
// The replica lifecycle as data: the states a replica passes through, which
// state may follow which, and a small recorder of one replica's recent
// transitions. The replica actor asks `transition` before it moves, so an
// out-of-order message (a late "warmed" after a "fail") cannot resurrect a
// replica; the router asks `accepts_requests`, and passes degraded
// replicas over while a healthy one can serve.
//
//   creating → loading → warming → ready ⇄ serving → draining → stopped
//   ready/serving → degraded → ready/serving/draining      (slow or erroring, recovered)
//   warming/ready/serving → standby → ready/serving/draining (the warm pool: no new traffic;
//                                                            what runs when it is sent back finishes)
//   every non-terminal state → failed;  stopped and failed are terminal.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::cluster {

/// Where a replica is in its life.
enum class replica_state : std::uint8_t {
  /// Spec accepted; the replica actor and its engine are being set up.
  creating,
  /// Weights are being read into device memory.
  loading,
  /// Weights loaded; warm-up passes run before the first real request.
  warming,
  /// Warm and idle: accepts requests.
  ready,
  /// Has in-flight requests and accepts more.
  serving,
  /// Finishes its in-flight requests and accepts no new ones.
  draining,
  /// Drained and released its device memory. Terminal.
  stopped,
  /// Slow or erroring but still reachable: the router sends it new requests
  /// only when no healthy replica can take them, until it recovers.
  degraded,
  /// Crashed, fenced or lost. Terminal: a replacement is a new replica.
  failed,
  /// Loaded and warmed but taking no traffic: the deployment's warm pool.
  /// The controller moves it to ready when it is needed (a failure, a
  /// scale-up) and back when it is not (runtime/cluster/warm_pool).
  standby,
};

inline constexpr std::size_t replica_state_count = 10;

/// Every state, in declaration order (for tables and exhaustive tests).
inline constexpr std::array<replica_state, replica_state_count> all_replica_states = {
    replica_state::creating, replica_state::loading,  replica_state::warming,
    replica_state::ready,    replica_state::serving,  replica_state::draining,
    replica_state::stopped,  replica_state::degraded, replica_state::failed,
    replica_state::standby,
};

/// Stable lower-case name, used in logs, metrics labels and error messages.
std::string_view to_string(replica_state state) noexcept;

/// Whether `to` may directly follow `from`. A state never follows itself.
bool is_valid_transition(replica_state from, replica_state to) noexcept;

/// `to` when the move is allowed, otherwise invalid_argument naming both states.
expected<replica_state> transition(replica_state from, replica_state to);

/// Ready and serving replicas are routed to: routing policies choose among them.
constexpr bool accepts_requests(replica_state state) noexcept {
  return state == replica_state::ready || state == replica_state::serving;
}

/// What a replica itself takes: the routable states plus degraded (which
/// the router uses only as a last resort).
constexpr bool serves_requests(replica_state state) noexcept {
  return accepts_requests(state) || state == replica_state::degraded;
}

/// Stopped and failed replicas never change state again.
constexpr bool is_terminal(replica_state state) noexcept {
  return state == replica_state::stopped || state == replica_state::failed;
}

/// One recorded move, stamped with the caller's clock.
struct state_change {
  replica_state from = replica_state::creating;
  replica_state to = replica_state::creating;
  std::uint64_t at_ns = 0;

  friend bool operator==(const state_change&, const state_change&) = default;
};

/// One replica's current state plus its last `history_max` transitions. Time
/// is a parameter (the actor passes its clock's now), so tests replay exactly.
class lifecycle {
 public:
  /// Enough to see how a replica reached its state without growing forever.
  static constexpr std::size_t history_max = 32;

  explicit lifecycle(std::uint64_t created_at_ns) noexcept;

  replica_state state() const noexcept { return state_; }
  /// When the current state was entered.
  std::uint64_t entered_at_ns() const noexcept { return entered_at_ns_; }
  /// Transitions made since creation, including those dropped from the history.
  std::uint64_t transitions_total() const noexcept { return transitions_total_; }

  /// Moves to `to` at `now_ns`. invalid_argument (and no change) for a move the
  /// table forbids or for a clock that went backwards.
  expected<replica_state> advance(replica_state to, std::uint64_t now_ns);

  /// Retained transitions, oldest first (at most history_max).
  std::vector<state_change> history() const;

 private:
  replica_state state_ = replica_state::creating;
  std::uint64_t entered_at_ns_ = 0;
  std::uint64_t transitions_total_ = 0;
  std::array<state_change, history_max> ring_{};  // ring_[transitions_total_ % max] is next
};

}  // namespace exa::cluster
