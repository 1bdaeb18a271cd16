#pragma once
// Per-tenant service inside one engine, so a replica's scheduler can favour
// the tenant it has served least lately (issue 13's fairness: a tenant
// flooding at ten times its share must not slow another's first token).
//
//   - Every token the engine computes for a sequence (prompt chunk or decode)
//     is charged to its tenant. A tenant's usage is its charged tokens
//     divided by its weight.
//   - Usage follows recent service: every `window_tokens` tokens the engine
//     computes, all counters halve. A tenant that flooded a minute ago is
//     not held back now, and one that was idle gets precedence for a burst
//     of about a window at most, after which its own usage catches up. So
//     the advantage is bounded and nothing starves: the lighter tenant's
//     usage grows with every token it gets until it is no longer lighter.
//   - Scheduling across tenants starts only when there are two of them: with
//     one tenant (or none named: the open tenant "" is a tenant too) every
//     engine keeps its first-come order.
//
// Pure and deterministic: no clock (decay is by tokens, so the simulated and
// the real engines behave alike), no randomness. Bounded: at most
// `max_tenants` slots; past that, new tenants share the last one.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::engine {

/// Interactive requests' prompts go before batch ones' within a replica, as
/// they do in the router's queue (cluster::priority_class).
enum class request_priority : std::uint8_t { interactive = 0, batch = 1 };

/// A request's tenant weight must be a positive, finite number:
/// invalid_argument naming it otherwise.
expected<void> check_tenant_weight(double weight);

struct tenant_usage_config {
  std::uint64_t window_tokens = 1u << 18;  // counters halve each time the engine computes this many
  std::uint32_t max_tenants = 256;      // slots; later tenants share the last one
  /// A tenant counts as served lately while its decayed count is at least
  /// this: a replica's own warm-up and health probes (a few tokens of the
  /// open tenant) do not make a second tenant.
  double lately_tokens = 64;
};

class tenant_usage {
 public:
  using slot = std::uint32_t;

  explicit tenant_usage(tenant_usage_config config = {});

  /// The tenant's slot, made at first sight. The weight (> 0, checked by the
  /// engine at submit) is the latest one given; for a known tenant it takes
  /// effect at the next adopt_weights().
  slot intern(std::string_view tenant, double weight);
  /// Engines call this as a step begins, so that a step, and a replay of it
  /// after a cut, see the same weights whatever was submitted meanwhile.
  void adopt_weights() { weight_.assign(next_weight_.begin(), next_weight_.end()); }
  /// Charges `tokens` computed for the tenant in `s`.
  void charge(slot s, std::uint64_t tokens);
  /// Halvings so far: a charge made when this was `h` has been halved
  /// halvings() - h times since.
  std::uint64_t halvings() const noexcept { return halvings_; }
  /// Takes back `tokens` charged to `s` when halvings() was `charged_at`, as
  /// they have decayed since (a step that was dropped before it completed
  /// and will be charged again when planned again). Never below zero.
  void refund(slot s, std::uint64_t tokens, std::uint64_t charged_at);
  /// The tenant's slot if it has one (the overflow slot past max_tenants).
  std::optional<slot> find(std::string_view tenant) const;
  /// Charged tokens (decayed) over the tenant's weight.
  double usage(slot s) const;
  /// Served at least lately_tokens (decayed) within the last few windows.
  bool served_lately(slot s) const { return served_[s] >= config_.lately_tokens; }
  /// Its service is above its weight's share of the service of the tenants
  /// served lately and `beside` (a tenant with work here that may not have
  /// been served yet).
  bool over_share(slot s, slot beside) const;
  std::size_t slots() const noexcept { return served_.size(); }

  /// The counters, for an engine that undoes a step (sim_engine's rollback).
  struct snapshot {
    std::vector<double> served;
    std::uint64_t since_halving = 0;
    std::uint64_t halvings = 0;
  };
  void save(snapshot& into) const {
    into.served.assign(served_.begin(), served_.end());  // no allocation once it has grown
    into.since_halving = since_halving_;
    into.halvings = halvings_;
  }
  /// Back to `saved`; slots made since then keep nothing charged.
  void restore(const snapshot& saved);

 private:
  tenant_usage_config config_;
  std::map<std::string, slot, std::less<>> slot_of_;
  std::vector<double> served_;  // decayed tokens, by slot
  std::vector<double> weight_;       // by slot, in effect
  std::vector<double> next_weight_;  // by slot, the latest given
  std::uint64_t since_halving_ = 0;
  std::uint64_t halvings_ = 0;
};

/// Whether ordering across tenants matters: two tenants served lately or
/// with work here, or two priority classes with work here; otherwise engines
/// keep their first-come schedule. `each_with_work(visit)` calls
/// visit(tenant, priority) for every sequence with work, stopping (and
/// returning true) as soon as visit returns true.
template <class EachWithWork>
bool tenants_contended(const tenant_usage& usage, EachWithWork&& each_with_work) {
  std::optional<tenant_usage::slot> tenant;
  std::optional<request_priority> priority;
  const auto differs = [](auto& first, auto value) {
    if (!first) first = value;
    return *first != value;
  };
  for (tenant_usage::slot i = 0; i < usage.slots(); ++i)
    if (usage.served_lately(i) && differs(tenant, i)) return true;
  return each_with_work([&](tenant_usage::slot t, request_priority p) { return differs(tenant, t) || differs(priority, p); });
}

/// Whether a replica admits one more sequence of a tenant over its share
/// while scheduling across tenants: always when that tenant has nothing
/// running there (it progresses, and over_share keeps it from falling below
/// its share), otherwise only while the running set's cost with the newcomer
/// stays within `budget` (a step-time or token bound; 0 or less: no bound).
/// Bounding what the heavy tenant keeps in the batch bounds the step a light
/// tenant's request waits out when it arrives (sim_engine's
/// fair_step_budget, batch_scheduler's fair_context_tokens).
constexpr bool over_share_admits(std::uint32_t tenant_running, double cost_with, double budget) noexcept {
  return budget <= 0 || tenant_running == 0 || cost_with <= budget;
}

/// How engines order prompts that wait for prefill when scheduling across
/// tenants: interactive before batch, then the tenant served least lately,
/// then first come (`order`, smaller first).
struct fair_key {
  request_priority priority = request_priority::interactive;
  double usage = 0;
  std::uint64_t order = 0;

  friend bool operator<(const fair_key& a, const fair_key& b) noexcept {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.usage != b.usage) return a.usage < b.usage;
    return a.order < b.order;
  }
};

}  // namespace exa::engine
