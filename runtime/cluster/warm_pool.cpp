#include "cluster/warm_pool.hpp"

#include <algorithm>

namespace exa::cluster {

std::uint32_t warm_count(std::uint32_t serving, std::uint32_t percent) noexcept {
  percent = std::min(percent, max_warm_pool_percent);
  return static_cast<std::uint32_t>(std::uint64_t{serving} * percent / 100);
}

namespace {

// How soon a member can serve: a warm standby now, a ready one now, then by
// how far its load has come.
int readiness(replica_state s) noexcept {
  switch (s) {
    case replica_state::standby: return 0;
    case replica_state::ready:
    case replica_state::serving:
    case replica_state::degraded: return 1;
    case replica_state::warming: return 2;
    case replica_state::loading: return 3;
    default: return 4;
  }
}

}  // namespace

pool_changes rebalance(const std::vector<pool_member>& members, std::uint32_t serving) {
  std::vector<const pool_member*> active, standby;
  for (const auto& m : members) (m.standby ? standby : active).push_back(&m);
  pool_changes out;
  if (active.size() < serving) {
    std::sort(standby.begin(), standby.end(), [](const pool_member* a, const pool_member* b) {
      const int ra = readiness(a->state), rb = readiness(b->state);
      return ra != rb ? ra < rb : a->id < b->id;
    });
    for (std::size_t i = 0; i < standby.size() && active.size() + out.activate.size() < serving; ++i)
      out.activate.push_back(standby[i]->id);
  } else if (active.size() > serving) {
    // Not loaded yet first, then idle, then the least busy; newest first among equals.
    std::sort(active.begin(), active.end(), [](const pool_member* a, const pool_member* b) {
      const bool la = readiness(a->state) >= 2, lb = readiness(b->state) >= 2;
      if (la != lb) return la;
      if (a->in_flight != b->in_flight) return a->in_flight < b->in_flight;
      return a->id > b->id;
    });
    for (std::size_t i = 0; i < active.size() - serving; ++i) out.deactivate.push_back(active[i]->id);
  }
  return out;
}

}  // namespace exa::cluster
