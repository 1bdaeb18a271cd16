#include "cluster/fair_share_board.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace exa::cluster {

// ------------------------------------------------------------ the authority

fair_share_authority::fair_share_authority(fair_share_authority_config config) : config_(config) {}

bool fair_share_authority::backlogged(const std::string& deployment, const std::string& tenant) const {
  const key k{deployment, tenant};
  for (const auto& [id, l] : gateways_)
    if (auto it = l.entries.find(k); it != l.entries.end() && it->second.waiting > 0) return true;
  return false;
}

// The counter a tenant becoming backlogged is lifted to: the smallest of
// the backlogged tenants', or with none the largest served.
double fair_share_authority::floor(const std::string& deployment, const deployment_state& d) const {
  double f = std::numeric_limits<double>::infinity();
  for (const auto& [tenant, c] : d.counters)
    if (c < f && backlogged(deployment, tenant)) f = c;
  // A backlogged tenant without a kept counter (past entries_max) stands
  // at the floor itself: it does not lower it.
  return std::isinf(f) ? d.last_served : f;
}

void fair_share_authority::forget_idle(const std::string& deployment) {
  auto d = deployments_.find(deployment);
  if (d == deployments_.end()) return;
  const double f = floor(deployment, d->second);
  for (auto it = d->second.counters.begin(); it != d->second.counters.end();) {
    if (it->second <= f && !backlogged(deployment, it->first)) {
      it = d->second.counters.erase(it);
      --counters_;
    } else {
      ++it;
    }
  }
  // No live gateway reports the deployment any more: nothing to keep.
  bool reported = false;
  for (const auto& [id, l] : gateways_) {
    auto it = l.entries.lower_bound(key{deployment, std::string{}});
    if (it != l.entries.end() && it->first.first == deployment) reported = true;
  }
  if (!reported) {
    counters_ -= d->second.counters.size();
    deployments_.erase(d);
  }
}

std::size_t fair_share_authority::expire(std::int64_t now_ns) {
  std::set<std::string> touched;
  std::size_t n = 0;
  for (auto it = gateways_.begin(); it != gateways_.end();) {
    if (now_ns - it->second.reported_ns > config_.lease_ns) {
      for (const auto& [k, s] : it->second.entries) touched.insert(k.first);
      it = gateways_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  for (const auto& d : touched) forget_idle(d);
  return n;
}

// Replaces `r.gateway`'s lease with its report's totals; returns what each
// total grew by since its last report.
std::map<fair_share_authority::key, double> fair_share_authority::merge(const fair_share_report& r,
                                                                         std::int64_t now_ns) {
  lease next;
  next.reported_ns = now_ns;
  const auto prev = gateways_.find(r.gateway);
  std::map<key, double> grown;
  for (const auto& e : r.entries) {
    if (!std::isfinite(e.charged) || e.charged < 0) continue;  // nonsense: ignored
    key k{e.deployment, e.tenant};
    double delta = e.charged;  // a new entry, a new generation or a total that went down: all of it
    if (prev != gateways_.end())
      if (auto p = prev->second.entries.find(k); p != prev->second.entries.end() &&
                                                 p->second.generation == e.generation && e.charged >= p->second.charged)
        delta = e.charged - p->second.charged;
    next.entries[k] = {e.generation, e.charged, e.waiting, e.held, e.slots};
    if (delta > 0) grown[k] += delta;
  }
  gateways_[r.gateway] = std::move(next);
  return grown;
}

// Lifts the tenants `gateway` now has waiting on `deployment` that no
// gateway had waiting `before` to the floor of those that had.
void fair_share_authority::lift(const std::string& deployment, std::uint64_t gateway, const std::set<key>& before) {
  auto& d = deployments_[deployment];
  const auto& mine = gateways_.at(gateway).entries;
  std::vector<std::string> lifted;
  for (auto it = mine.lower_bound(key{deployment, std::string{}}); it != mine.end() && it->first.first == deployment;
       ++it)
    if (it->second.waiting > 0 && !before.count(it->first)) lifted.push_back(it->first.second);
  if (lifted.empty()) return;
  double f = std::numeric_limits<double>::infinity();
  for (const auto& [tenant, c] : d.counters)
    if (c < f && before.count(key{deployment, tenant})) f = c;
  if (std::isinf(f)) f = d.last_served;
  for (const auto& t : lifted) {
    auto c = d.counters.find(t);
    if (c == d.counters.end()) {
      if (counters_ >= config_.entries_max) continue;  // bounded: stands at the floor
      c = d.counters.emplace(t, 0.0).first;
      ++counters_;
    }
    c->second = std::max(c->second, f);
  }
}

fair_deployment_counters fair_share_authority::counters_of(const std::string& deployment,
                                                           const deployment_state& d, std::size_t& extra) const {
  fair_deployment_counters out;
  out.deployment = deployment;
  out.floor = floor(deployment, d);
  // Places: each gateway's on the deployment (the largest of its entries'
  // figures, which are all the same), who holds them and who waits.
  std::map<std::string, std::uint64_t> held;
  std::set<std::string> active;
  std::uint64_t slots = 0;
  for (const auto& [id, l] : gateways_) {
    std::uint32_t here = 0;
    for (auto it = l.entries.lower_bound(key{deployment, std::string{}});
         it != l.entries.end() && it->first.first == deployment; ++it) {
      here = std::max(here, it->second.slots);
      if (it->second.held > 0) held[it->first.second] += it->second.held;
      if (it->second.held > 0 || it->second.waiting > 0) active.insert(it->first.second);
    }
    slots += here;
  }
  const auto clamp = [](std::uint64_t v) { return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, UINT32_MAX)); };
  out.slots = clamp(slots);
  out.active = clamp(active.size());
  for (const auto& [tenant, v] : d.counters) {
    const auto h = held.find(tenant);
    out.counters.push_back({tenant, backlogged(deployment, tenant) ? v : std::max(v, out.floor),
                            h == held.end() ? 0u : clamp(h->second)});
  }
  // Holding places without a kept counter: at the floor, with its places.
  for (const auto& [tenant, h] : held) {
    if (extra == 0) break;
    if (d.counters.count(tenant)) continue;
    out.counters.push_back({tenant, out.floor, clamp(h)});
    --extra;
  }
  return out;
}

expected<fair_share_answer> fair_share_authority::report(const fair_share_report& r, std::int64_t now_ns) {
  if (r.entries.size() > config_.entries_max)
    return make_error(errc::invalid_argument, "a fair-share report of " + std::to_string(r.entries.size()) +
                                                  " entries is over the limit of " +
                                                  std::to_string(config_.entries_max));
  expire(now_ns);
  if (!gateways_.count(r.gateway) && gateways_.size() >= config_.gateways_max)
    return make_error(errc::overloaded, std::to_string(config_.gateways_max) +
                                            " gateways already share fair-queue counters");
  std::set<std::string> reported;
  for (const auto& e : r.entries) reported.insert(e.deployment);
  std::set<key> before;  // waiting somewhere before this report
  for (const auto& [id, l] : gateways_)
    for (const auto& [k, s] : l.entries)
      if (s.waiting > 0 && reported.count(k.first)) before.insert(k);
  const auto grown = merge(r, now_ns);
  // Lift those newly backlogged before charging them: idleness banks no credit.
  for (const auto& d : reported) lift(d, r.gateway, before);
  // A tenant served while not kept starts at its deployment's floor before
  // this report's charges (the same for all, whatever their order).
  std::map<std::string, double> floors;
  for (const auto& d : reported) floors[d] = floor(d, deployments_[d]);
  for (const auto& [k, delta] : grown) {
    auto& d = deployments_[k.first];
    auto c = d.counters.find(k.second);
    if (c == d.counters.end()) {
      if (counters_ >= config_.entries_max) continue;
      c = d.counters.emplace(k.second, floors[k.first]).first;
      ++counters_;
    }
    c->second += delta;
    d.last_served = std::max(d.last_served, c->second);
  }
  fair_share_answer out;
  out.gateways = static_cast<std::uint32_t>(gateways_.size());
  for (const auto& d : reported) forget_idle(d);
  // The kept counters of these deployments (at most entries_max in all),
  // then holders without one while the answer has room.
  std::size_t kept = 0;
  for (const auto& d : reported)
    if (auto it = deployments_.find(d); it != deployments_.end()) kept += it->second.counters.size();
  std::size_t extra = config_.entries_max > kept ? config_.entries_max - kept : 0;
  for (const auto& d : reported)
    if (auto it = deployments_.find(d); it != deployments_.end())
      out.deployments.push_back(counters_of(d, it->second, extra));
  return out;
}

double fair_share_authority::counter(const std::string& deployment, const std::string& tenant) const {
  auto d = deployments_.find(deployment);
  if (d == deployments_.end()) return 0;
  const double f = floor(deployment, d->second);
  auto c = d->second.counters.find(tenant);
  if (c == d->second.counters.end()) return f;
  return backlogged(deployment, tenant) ? c->second : std::max(c->second, f);
}

std::size_t fair_share_authority::counters() const { return counters_; }

bool below_share_of_all_places(std::uint32_t held, std::uint32_t slots, std::uint32_t active,
                               const places_elsewhere& e) noexcept {
  const std::uint64_t all = std::uint64_t{slots} + e.slots;
  const std::uint64_t tenants = std::max<std::uint64_t>({active, e.active, 1});
  const std::uint64_t fair = (all + tenants - 1) / tenants;
  return std::uint64_t{held} + e.held < fair;
}

// ------------------------------------------------------------ a gateway's board

fair_share_board::fair_share_board(fair_share_board_config config) : config_(config) {}

fair_share_board::tracked* fair_share_board::track(const key& k) {
  auto it = entries_.find(k);
  if (it != entries_.end()) return &it->second;
  if (entries_.size() >= config_.entries_max) return nullptr;
  auto& t = entries_[k];
  t.generation = next_generation_++;
  return &t;
}

void fair_share_board::note_charged(const std::string& deployment, const std::string& tenant, double weighted_tokens) {
  if (!std::isfinite(weighted_tokens) || weighted_tokens <= 0) return;
  auto* t = track({deployment, tenant});
  if (!t) {
    ++untracked_;
    return;
  }
  t->charged += weighted_tokens;
  t->charged_since_report = true;
}

double fair_share_board::counter(const std::string& deployment, const std::string& tenant) const {
  double local = 0;
  if (auto it = entries_.find({deployment, tenant}); it != entries_.end())
    local = it->second.charged - (have_answer_ && !fell_back_ ? it->second.answered : 0);
  if (!have_answer_ || fell_back_) return 0;  // the fair queue's own counters decide
  auto d = global_.find(deployment);
  if (d == global_.end()) return local;
  auto c = d->second.counters.find(tenant);
  return (c == d->second.counters.end() ? d->second.floor : c->second) + local;
}

void fair_share_board::apply_to(const std::string& deployment, fair_queue& queue) const {
  if (!have_answer_ || fell_back_) return;
  for (const auto& [tenant, n] : queue.backlog()) queue.raise_counter(tenant, counter(deployment, tenant));
}

std::optional<places_elsewhere> fair_share_board::places(const std::string& deployment,
                                                         const std::string& tenant) const {
  if (!have_answer_ || fell_back_) return std::nullopt;
  const auto d = global_.find(deployment);
  if (d == global_.end() || d->second.slots == 0) return std::nullopt;
  std::uint32_t my_slots = 0, my_held = 0;
  if (const auto m = answered_places_.find(deployment); m != answered_places_.end()) {
    my_slots = m->second.slots;
    if (const auto h = m->second.held.find(tenant); h != m->second.held.end()) my_held = h->second;
  }
  const auto h = d->second.held.find(tenant);
  const std::uint32_t held = h == d->second.held.end() ? 0 : h->second;
  places_elsewhere out;
  out.slots = d->second.slots > my_slots ? d->second.slots - my_slots : 0;
  out.held = held > my_held ? held - my_held : 0;
  out.active = d->second.active;
  return out;
}

fair_share_report fair_share_board::take_report(
    std::uint64_t gateway, const std::map<std::string, std::vector<std::pair<std::string, std::size_t>>>& backlog,
    const std::map<std::string, gateway_places>& places) {
  fair_share_report r;
  r.gateway = gateway;
  reported_places_.clear();
  for (const auto& [d, p] : places)  // a tenant holding places is reported (bounded by entries_max)
    for (const auto& [t, n] : p.held)
      if (n > 0) track({d, t});
  std::map<key, std::size_t> waiting;
  for (const auto& [d, tenants] : backlog)
    for (const auto& [t, n] : tenants) {
      if (n == 0) continue;
      if (track({d, t})) waiting[{d, t}] = n;
    }
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& t = it->second;
    const auto w = waiting.find(it->first);
    const std::size_t n = w == waiting.end() ? 0 : w->second;
    std::uint32_t held = 0, slots = 0;
    if (const auto p = places.find(it->first.first); p != places.end()) {
      slots = p->second.slots;
      if (const auto h = p->second.held.find(it->first.second); h != p->second.held.end()) held = h->second;
    }
    if (t.charged_since_report || n > 0 || held > 0 || t.answered != t.charged)
      t.idle_reports = 0;
    else if (++t.idle_reports > config_.idle_reports_max) {
      it = entries_.erase(it);
      continue;
    }
    t.charged_since_report = false;
    t.reported = t.charged;
    r.entries.push_back({it->first.first, it->first.second, t.generation, t.charged,
                         static_cast<std::uint32_t>(std::min<std::size_t>(n, UINT32_MAX)), held, slots});
    // What the controller will count of this gateway's places: only what
    // the entries carry (a holder past entries_max is not in them).
    auto& mine = reported_places_[it->first.first];
    mine.slots = slots;
    if (held > 0) mine.held[it->first.second] = held;
    ++it;
  }
  return r;
}

bool fair_share_board::apply(const fair_share_answer& answer, std::int64_t now_ns) {
  for (auto& [k, t] : entries_) t.answered = t.reported;
  answered_places_ = reported_places_;
  global_.clear();
  std::size_t kept = 0;
  for (const auto& d : answer.deployments) {
    auto& g = global_[d.deployment];
    g.floor = std::isfinite(d.floor) ? d.floor : 0;
    for (const auto& c : d.counters) {
      if (c.held > 0 && g.held.size() < config_.entries_max) g.held[c.tenant] = c.held;
      if (kept >= config_.entries_max || !std::isfinite(c.counter)) continue;  // bounded: the rest stand at the floor
      g.counters[c.tenant] = c.counter;
      ++kept;
    }
    g.slots = d.slots;
    g.active = d.active;
  }
  gateways_ = std::max<std::uint32_t>(1, answer.gateways);
  answered_ns_ = now_ns;
  have_answer_ = true;
  return std::exchange(fell_back_, false);
}

bool fair_share_board::expire(std::int64_t now_ns) {
  if (!have_answer_ || fell_back_ || now_ns - answered_ns_ <= config_.keep_ns) return false;
  global_.clear();
  answered_places_.clear();
  for (auto& [k, t] : entries_) {
    t.charged -= t.answered;
    t.reported = t.answered = 0;
    t.generation = next_generation_++;
  }
  fell_back_ = true;
  return true;
}

}  // namespace exa::cluster
