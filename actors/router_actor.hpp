#pragma once
// The router: admission control (bounded queues, `overloaded` with a
// Retry-After when full), one request actor per accepted request, and the
// replica choice for each attempt of each request (the deployment's routing
// policy over its ready, non-suspect, current-epoch replicas). It follows
// every replica's lifecycle and load reports, and monitors replica actors so a
// crashed one stops receiving requests at once.

#include <caf/fwd.hpp>
#include <caf/response_promise.hpp>

#include <deque>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>

#include "actors/messages.hpp"
#include "template/chat_template.hpp"
#include "actors/chaos_hooks.hpp"
#include "auth/quota_board.hpp"
#include "cluster/admission.hpp"
#include "cluster/failure_detector.hpp"
#include "cluster/fair_queue.hpp"
#include "cluster/fair_share_board.hpp"
#include "cluster/routing.hpp"

namespace exa::actors {

struct cluster_metrics;

struct router_config {
  /// Deployments the cluster was started with: requests to them wait (as
  /// for deployment_starting) instead of being refused as unknown before the
  /// controller's first announcement reaches this router.
  std::vector<std::string> starting;
  /// A gateway process's router: until the controller's first full list of
  /// deployments (deployment_set, sent when the gateway joins), a request to
  /// a model it has not heard of waits (as for a starting deployment, bounded
  /// by the queue limits and the deadline) instead of being refused as
  /// unknown; the list then answers those the controller does not have.
  /// (Without it a request sent just as a gateway started got 404 for a
  /// configured model.)
  bool await_controller = false;
  cluster::replica_table_config table;
  cluster::admission_config admission;
  std::uint32_t request_deadline_ms = 120000;
  std::uint32_t max_attempts = 4;
  /// --chat-template: a built-in template name or a template file used for
  /// every deployment's chat requests instead of its file's own ("": the
  /// file's, ChatML when the file has none).
  std::string chat_template;
  /// Request numbers start above this: gateways sharing replicas each draw
  /// their own range, so two never submit the same number.
  std::uint64_t request_number_base = 0;
  std::uint32_t submit_timeout_ms = 10000;
  std::uint32_t retry_backoff_ms = 50;
  std::uint32_t deadline_sweep_ms = 100;  // how often expired requests are told
  /// While a deployment's replicas are all at their in-flight limit, picks
  /// wait here in fair order (fair_queue.hpp) for at most this long, then
  /// are answered overloaded and the request backs off and asks again.
  /// Keep it below submit_timeout_ms.
  std::uint32_t pick_hold_ms = 2000;
  cluster::fair_queue_config fair_queue;
  bool fair_across_tenants = true;  // false: one queue, first come first served
  /// While other tenants are active on a deployment, one tenant holds at
  /// most all but this many places per other active tenant (never below its
  /// fair share; tenant_slot_limit), so their requests find room at once.
  std::uint32_t tenant_headroom_slots = 2;
  /// A tenant counts as active on a deployment while it has requests there,
  /// or sent one within this window.
  std::uint32_t tenant_active_window_ms = 10000;
  cluster::error_rate_config error_rate;  // request-level replica health
  /// This gateway's region ("" = none): replicas on nodes of the region
  /// are chosen first; others only when none of those can take a request
  /// (saturated, down, suspect).
  std::string region;
  /// How often the load of autoscaled deployments goes to the controller.
  std::uint32_t load_report_ms = 1000;
  /// Tenant limits shared across gateways (auth/quota_board.hpp): every
  /// quota_report_ms the router sends the demand the front door noted on
  /// this board to the controller, and applies the shares it answers (or,
  /// with no answer for the board's shares_keep_ns, limit / gateways). Null:
  /// the front door enforces whole limits on its own.
  std::shared_ptr<auth::quota_board> quotas;
  std::uint64_t gateway_id = 0;  // this gateway in its quota reports: unique per gateway
  std::uint32_t quota_report_ms = 1000;
  /// Weighted fair queuing shared across gateways (cluster/
  /// fair_share_board.hpp): with the quota report, every quota_report_ms,
  /// what this router's fair queues charged and their backlog go to the
  /// controller, and its global counters come back; the pick queues order
  /// by them plus what was charged here since (without answers for the
  /// board's keep_ns: by their own counters). Null: each gateway's fair
  /// queues count only what it served itself (one gateway: the same).
  std::shared_ptr<cluster::fair_share_board> fair_shares;
  chaos_hooks hooks;
};

/// router -> router: a starting deployment's waiting requests ran out of time.
struct start_timeout {
  std::string deployment;
};

struct router_state {
  router_config config;
  std::optional<cluster::replica_table> table;
  std::optional<cluster::admission_controller> admission;
  std::map<cluster::replica_id, caf::actor> replicas;
  std::map<cluster::replica_id, replica_load> loads;
  struct replica_where {
    cluster::node_id node = 0;
    cluster::slot_ref slot;
    cluster::epoch_t epoch = 0;
  };
  std::map<cluster::replica_id, replica_where> where;
  std::set<cluster::node_id> suspect_nodes;
  std::optional<cluster::error_rate_tracker> errors;
  std::set<cluster::replica_id> error_suspects;  // suspected for their error rate
  struct deployment_entry {
    deployment_announce info;
    std::shared_ptr<const model::llama_model> model;  // the tokenizer; null for simulated models
    std::shared_ptr<const jinja::chat_renderer> chat;  // null: chat_error says why
    std::string chat_error;
  };
  std::map<std::string, deployment_entry> deployments;
  struct request_entry {
    caf::actor actor;
    cluster::admission_ticket ticket;
    std::string deployment;
    std::int64_t deadline_ns = 0;
    bool expired = false;
    std::string tenant;
    cluster::priority_class priority = cluster::priority_class::interactive;
    bool dispatched = false;  // holds a place on a replica (counted in tenant_places)
    double weight = 1;        // the tenant's fair-share weight
  };
  std::map<std::string, request_entry> requests;  // by client request id
  std::map<caf::actor_addr, std::string> request_ids;
  std::map<std::string, std::vector<route_request>> waiting_for_start;  // by deployment
  /// Deployments the controller is bringing up (deployment_starting, until
  /// their announce): a request for one waits for it, bounded, instead of
  /// being told it does not exist.
  std::set<std::string> starting;
  /// False until the controller's first deployment_set when await_controller.
  bool view_complete = true;
  /// Deployments scaled to zero (deployment_cold), and those woken by a
  /// request whose first replica is not ready yet: requests wait for them
  /// (in waiting_for_start, bounded by the queue limit and the deadline).
  std::set<std::string> cold;
  std::set<std::string> waking;
  std::uint64_t next_request_number = 1;
  /// Picks waiting for capacity, per deployment, in fair order.
  struct held_pick {
    caf::response_promise promise;
    pick_replica pick;
    caf::actor_addr requester;
    std::int64_t until_ns = 0;
  };
  std::map<std::string, cluster::fair_queue> pick_queues;  // by deployment
  std::map<std::uint64_t, held_pick> held_picks;
  /// Per deployment: places each tenant holds, and when each last sent.
  std::map<std::string, std::map<std::string, std::uint32_t>> tenant_places;
  std::map<std::string, std::map<std::string, std::int64_t>> tenant_seen_ns;
  std::uint64_t next_hold = 1;
  /// Plain names split between versions during (and after) rollouts, by
  /// base name (traffic_split).
  std::map<std::string, traffic_split> splits;
  std::map<cluster::node_id, std::string> node_regions;
  /// Per deployment, the replicas outside this gateway's region (computed
  /// on a pick, dropped when a replica appears, moves or goes, or a node's
  /// region is learned): picks do not scan every replica.
  std::map<std::string, std::vector<cluster::replica_id>> outside_region;
  /// Samples of deployments under rollout, sent to the controller in
  /// batches (bounded: at most sample_batch_max per deployment between sends).
  std::map<std::string, version_samples> samples;
  bool samples_flush_due = false;
  /// Per deployment: arrivals and TTFTs since the last load report (TTFTs
  /// bounded: at most sample_batch_max per deployment between reports), and
  /// the last minute's latencies (at most latency_window_max) for status.
  struct autoscale_window {
    std::uint64_t arrivals = 0;
    std::vector<double> ttft_ms;
  };
  std::map<std::string, autoscale_window> autoscale;
  struct latency_sample {
    std::int64_t at_ns = 0;
    double ttft_ms = 0, tpot_ms = 0;
  };
  std::map<std::string, std::deque<latency_sample>> latencies;
  bool load_report_armed = false;
  bool quota_pending = false;      // a quota report awaits its answer
  bool fair_share_pending = false;  // a fair-share report awaits its answer
  std::int64_t quota_since_ns = 0;  // the current demand period began
  std::uint64_t split_rng = 0x9e3779b97f4a7c15ull;  // seeded: draws for requests without a conversation key
  std::shared_ptr<cluster_metrics> metrics;
  static inline const char* name = "router";
};

caf::behavior router_actor(caf::stateful_actor<router_state>* self, router_config config,
                           std::shared_ptr<cluster_metrics> metrics);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::start_timeout)
