#include "cluster/restart_intensity.hpp"

namespace exa::cluster {

void restart_intensity::expire(duration now) {
  while (!restarts_.empty() && restarts_.front() + window_ <= now) restarts_.pop_front();
}

bool restart_intensity::allow(duration now) {
  expire(now);
  if (restarts_.size() >= max_restarts_) return false;
  restarts_.push_back(now);
  return true;
}

std::uint32_t restart_intensity::recent(duration now) {
  expire(now);
  return static_cast<std::uint32_t>(restarts_.size());
}

}  // namespace exa::cluster
