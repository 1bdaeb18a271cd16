#include "cluster/fair_queue.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace exa::cluster {

std::string_view to_string(priority_class p) noexcept {
  return p == priority_class::interactive ? "interactive" : "batch";
}

expected<priority_class> parse_priority_class(std::string_view text) {
  if (text == "interactive") return priority_class::interactive;
  if (text == "batch") return priority_class::batch;
  return make_error(errc::invalid_argument,
                    "priority must be \"interactive\" or \"batch\", got \"" + std::string(text) + "\"");
}

fair_queue::fair_queue(fair_queue_config config) : config_(config) {}

double fair_queue::floor_counter(const std::string& except) const {
  double floor = std::numeric_limits<double>::infinity();
  for (const auto& [name, t] : tenants_)
    if (name != except && t.size() > 0) floor = std::min(floor, t.counter);
  return std::isinf(floor) ? last_served_ : floor;
}

expected<void> fair_queue::push(std::uint64_t id, std::string_view tenant, priority_class priority,
                                std::uint64_t cost, double weight) {
  if (!(weight > 0) || std::isinf(weight))
    return make_error(errc::invalid_argument, "a tenant's weight must be a positive number");
  if (index_.count(id)) return make_error(errc::invalid_argument, "request " + std::to_string(id) + " is already queued");
  if (waiting_ >= config_.max_waiting)
    return make_error(errc::overloaded,
                      "the fair queue is full (" + std::to_string(config_.max_waiting) + " requests waiting)");
  auto it = tenants_.find(tenant);
  if (it != tenants_.end() && it->second.size() >= config_.max_waiting_per_tenant)
    return make_error(errc::overloaded, "tenant '" + std::string(tenant) + "' already has " +
                                            std::to_string(config_.max_waiting_per_tenant) + " requests waiting");
  if (it == tenants_.end()) it = tenants_.emplace(std::string(tenant), tenant_state{}).first;
  auto& t = it->second;
  t.weight = weight;
  // Back from idle: no credit for the time it was away.
  if (t.size() == 0) t.counter = std::max(t.counter, floor_counter(it->first));
  t.queued[static_cast<int>(priority)].push_back({id, cost, ++seq_});
  index_[id] = {it->first, priority};
  ++waiting_;
  return {};
}

const std::pair<const std::string, fair_queue::tenant_state>* fair_queue::next(
    priority_class* cls, const std::function<bool(std::string_view)>* eligible) const {
  for (const int c : {0, 1}) {
    const std::pair<const std::string, tenant_state>* best = nullptr;
    for (const auto& entry : tenants_) {
      const auto& q = entry.second.queued[c];
      if (q.empty()) continue;
      if (eligible && !(*eligible)(entry.first)) continue;
      if (!best || entry.second.counter < best->second.counter ||
          (entry.second.counter == best->second.counter && q.front().seq < best->second.queued[c].front().seq))
        best = &entry;
    }
    if (best) {
      *cls = static_cast<priority_class>(c);
      return best;
    }
  }
  return nullptr;
}

std::optional<std::uint64_t> fair_queue::peek() const {
  priority_class cls{};
  const auto* t = next(&cls);
  if (!t) return std::nullopt;
  return t->second.queued[static_cast<int>(cls)].front().id;
}

std::optional<std::uint64_t> fair_queue::peek_if(const std::function<bool(std::string_view)>& eligible) const {
  priority_class cls{};
  const auto* t = next(&cls, &eligible);
  if (!t) return std::nullopt;
  return t->second.queued[static_cast<int>(cls)].front().id;
}

void fair_queue::pop() {
  if (const auto head = peek()) pop(*head);
}

bool fair_queue::pop(std::uint64_t id) {
  const auto w = index_.find(id);
  if (w == index_.end()) return false;
  auto& t = tenants_.find(w->second.tenant)->second;
  auto& q = t.queued[static_cast<int>(w->second.priority)];
  const auto it = std::find_if(q.begin(), q.end(), [&](const entry& e) { return e.id == id; });
  const std::uint64_t cost = it->cost;
  q.erase(it);
  index_.erase(w);
  --waiting_;
  charge(t, cost);
  return true;
}

void fair_queue::charge(tenant_state& t, std::uint64_t cost) {
  t.counter += static_cast<double>(cost) / t.weight;
  last_served_ = std::max(last_served_, t.counter);
  // Forget idle tenants the lift would bring back to the same counter anyway
  // (bounds the map by the tenants that matter). The floor is the same for
  // every idle tenant: only backlogged ones count in it.
  const double floor = floor_counter(std::string(1, '\0'));  // excludes no real tenant
  for (auto it = tenants_.begin(); it != tenants_.end();) {
    if (it->second.size() == 0 && it->second.counter <= floor)
      it = tenants_.erase(it);
    else
      ++it;
  }
}

std::uint32_t tenant_slot_limit(std::uint32_t slots, std::uint32_t other_active_tenants,
                                std::uint32_t headroom_per_tenant) {
  if (other_active_tenants == 0) return slots;
  const std::uint64_t active = std::uint64_t{other_active_tenants} + 1;
  const auto fair = static_cast<std::uint32_t>((slots + active - 1) / active);
  const std::uint64_t reserve = std::uint64_t{other_active_tenants} * headroom_per_tenant;
  const auto limit = reserve >= slots ? 0u : static_cast<std::uint32_t>(slots - reserve);
  return std::max(limit, fair);
}

bool fair_queue::remove(std::uint64_t id) {
  const auto w = index_.find(id);
  if (w == index_.end()) return false;
  auto& t = tenants_.find(w->second.tenant)->second;
  auto& q = t.queued[static_cast<int>(w->second.priority)];
  q.erase(std::find_if(q.begin(), q.end(), [&](const entry& e) { return e.id == id; }));
  index_.erase(w);
  --waiting_;
  return true;
}

std::size_t fair_queue::waiting(std::string_view tenant) const {
  const auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.size();
}

double fair_queue::counter(std::string_view tenant) const {
  const auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.counter;
}

void fair_queue::raise_counter(std::string_view tenant, double at_least) {
  const auto it = tenants_.find(tenant);
  if (it == tenants_.end() || !std::isfinite(at_least) || at_least <= it->second.counter) return;
  it->second.counter = at_least;
}

std::vector<std::pair<std::string, std::size_t>> fair_queue::backlog() const {
  std::vector<std::pair<std::string, std::size_t>> out;
  for (const auto& [name, t] : tenants_)
    if (t.size() > 0) out.emplace_back(name, t.size());
  return out;
}

}  // namespace exa::cluster
