#pragma once
// The warm pool, as pure logic: a deployment keeps some replicas loaded and
// warmed but taking no traffic (`standby`), so that failure recovery and
// scale-up take a replica that is ready now and load its replacement in the
// background, off the critical path.
//
// A deployment asking for N serving replicas with a pool of P percent has
// N + warm_count(N, P) slots. Which live replicas serve and which stand by
// is not tied to the slot: `rebalance` picks, from what is alive, N to
// serve -- keeping those that serve now, then promoting standbys that are
// warm before ones still loading -- and sends the rest to standby, the ones
// not yet loaded first (so a demotion never takes a busy replica when an
// idle or unloaded one will do).

#include <cstdint>
#include <vector>

#include "cluster/lifecycle.hpp"
#include "cluster/types.hpp"

namespace exa::cluster {

/// The largest pool: half the serving replicas.
inline constexpr std::uint32_t max_warm_pool_percent = 50;

/// Standby replicas for `serving` at `percent` (clamped to
/// max_warm_pool_percent): floor(serving × percent / 100), so the default
/// 10 % gives a pool from 10 serving replicas on.
std::uint32_t warm_count(std::uint32_t serving, std::uint32_t percent) noexcept;

/// One live replica of a deployment (not draining, not stopped or failed).
struct pool_member {
  replica_id id = 0;
  bool standby = false;  // designated to stand by (whatever its state now)
  replica_state state = replica_state::creating;
  std::uint32_t in_flight = 0;  // requests it runs now (0 when unknown)
};

struct pool_changes {
  std::vector<replica_id> activate;    // standby -> serving
  std::vector<replica_id> deactivate;  // serving -> standby
  bool empty() const noexcept { return activate.empty() && deactivate.empty(); }
};

/// The moves that leave exactly min(serving, members) members designated to
/// serve. Deterministic: ties are broken by replica id.
pool_changes rebalance(const std::vector<pool_member>& members, std::uint32_t serving);

}  // namespace exa::cluster
