#pragma once
// Fair order among requests waiting for a deployment's replicas: weighted
// fair queuing on tokens across tenants, in the spirit of the virtual token
// counter (VTC, Sheng et al. 2024), with two priority classes.
//
//   - Each tenant has a counter: the tokens it was served, divided by its
//     weight. The next request served is the oldest one of the backlogged
//     tenant with the smallest counter, so a tenant that floods is served
//     no more than its share while others wait; an idle tenant's share goes
//     to those who use it.
//   - A tenant that becomes backlogged after being idle has its counter
//     lifted to the smallest counter of the tenants waiting (or, when none
//     is, the largest counter any served request reached), so idleness
//     banks no credit to spend in a burst later.
//   - Interactive requests are served before batch ones; within a class,
//     the rule above.
//   - A request is charged when it is served (its prompt plus max_tokens:
//     known then, while its real length is not).
//
// Pure logic: no clock, no actors. Bounded: at most `max_waiting` requests.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace exa::cluster {

enum class priority_class : std::uint8_t { interactive = 0, batch = 1 };

/// "interactive" or "batch".
std::string_view to_string(priority_class p) noexcept;
/// Parses "interactive" or "batch"; invalid_argument naming the text otherwise.
expected<priority_class> parse_priority_class(std::string_view text);

struct fair_queue_config {
  std::size_t max_waiting = 4096;
  /// One tenant may not fill the queue: past this many of its own waiting,
  /// its next request is refused while others still find room.
  std::size_t max_waiting_per_tenant = 1024;
};

class fair_queue {
 public:
  explicit fair_queue(fair_queue_config config = {});

  /// Queues request `id` of `tenant` ("" is a tenant too: the open one).
  /// invalid_argument for a weight that is not positive or an id already
  /// queued; overloaded when max_waiting are waiting, or the tenant has
  /// max_waiting_per_tenant waiting.
  expected<void> push(std::uint64_t id, std::string_view tenant, priority_class priority, std::uint64_t cost,
                      double weight = 1.0);
  /// The request to serve next; nullopt when none waits.
  std::optional<std::uint64_t> peek() const;
  /// The same among tenants `eligible` accepts (those not at their share of
  /// the replicas, say): a tenant that may not be served now does not hold
  /// up the others.
  std::optional<std::uint64_t> peek_if(const std::function<bool(std::string_view tenant)>& eligible) const;
  /// Removes peek()'s request and charges its tenant. No-op when empty.
  void pop();
  /// Removes request `id` and charges its tenant, as pop() does for the
  /// head (for a request peek_if() chose). false when it is not queued.
  bool pop(std::uint64_t id);
  /// Removes a waiting request that left (expired, cancelled), uncharged.
  /// false when it is not queued.
  bool remove(std::uint64_t id);

  std::size_t size() const noexcept { return waiting_; }
  bool empty() const noexcept { return waiting_ == 0; }
  std::size_t waiting(std::string_view tenant) const;
  /// A tenant's counter (served tokens / weight, lifted as above); 0 for an
  /// unknown tenant.
  double counter(std::string_view tenant) const;
  /// Raises a queued tenant's counter to at least `at_least` (its counter
  /// across gateways: fair_share_board.hpp); no-op for a tenant not known.
  void raise_counter(std::string_view tenant, double at_least);
  /// The tenants with requests waiting, and how many each.
  std::vector<std::pair<std::string, std::size_t>> backlog() const;

 private:
  struct entry {
    std::uint64_t id;
    std::uint64_t cost;
    std::uint64_t seq;  // arrival order, to break ties
  };
  struct tenant_state {
    double counter = 0;
    double weight = 1;
    std::deque<entry> queued[2];  // by priority class
    std::size_t size() const { return queued[0].size() + queued[1].size(); }
  };
  struct where {
    std::string tenant;
    priority_class priority;
  };
  const std::pair<const std::string, tenant_state>* next(
      priority_class* cls, const std::function<bool(std::string_view)>* eligible = nullptr) const;
  void charge(tenant_state& t, std::uint64_t cost);
  double floor_counter(const std::string& except) const;

  fair_queue_config config_;
  std::map<std::string, tenant_state, std::less<>> tenants_;
  std::map<std::uint64_t, where> index_;
  std::size_t waiting_ = 0;
  std::uint64_t seq_ = 0;
  double last_served_ = 0;  // the largest counter a served request reached
};

/// The most places (in-flight requests) one tenant may hold on a
/// deployment's replicas: all `slots` while no other tenant is active;
/// otherwise all but `headroom_per_tenant` for each other active tenant, so
/// a request of another tenant finds a free place at once instead of
/// waiting for one to drain -- but never less than its fair share
/// (slots / active tenants, rounded up). The headroom is kept only while
/// the others are active (the router counts a tenant active while it has
/// requests there or sent one within its activity window); after that its
/// places go to those who use them.
std::uint32_t tenant_slot_limit(std::uint32_t slots, std::uint32_t other_active_tenants,
                                std::uint32_t headroom_per_tenant);

}  // namespace exa::cluster
