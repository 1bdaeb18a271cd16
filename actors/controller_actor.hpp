#pragma once
// The controller holds the desired state -- deployments: which model, how
// many replicas -- and makes it so: it places replica slots on devices within
// their memory ledgers (runtime/cluster/placement), tells nodes to start
// replicas, follows their lifecycle, releases memory when they stop, and
// places a slot again when its replica or its node is lost (with the slot's
// epoch raised, so a stale replica can never serve that slot again). It also
// answers the admin API: status, models, readiness, deploy, undeploy, scale.

#include <caf/fwd.hpp>

#include <deque>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "api/gateway.hpp"
#include "cluster/lifecycle.hpp"
#include "cluster/placement.hpp"
#include "cluster/drain.hpp"
#include "cluster/load_gate.hpp"
#include "cluster/journal.hpp"
#include "cluster/rollout.hpp"
#include "cluster/autoscaler.hpp"
#include "cluster/warm_pool.hpp"
#include "cluster/defrag.hpp"
#include "model/model_facts.hpp"
#include "cluster/failure_detector.hpp"
#include "cluster/restart_intensity.hpp"
#include "cluster/slot_scheduler.hpp"
#include "actors/chaos_hooks.hpp"

namespace exa::cluster {
class journal;
}

namespace exa::actors {

struct cluster_metrics;

/// The desired deployments, kept outside the controller so that a restarted
/// controller picks up where the crashed one left off.
struct desired_state {
  std::mutex mutex;
  std::map<std::string, api::deploy_request> deployments;  // guarded by mutex
  // Versions, as the journal keeps them (guarded by mutex): the embedded
  // cluster's restarted controller rolls back a rollout it finds unfinished.
  std::map<std::string, std::string> current_versions;
  std::map<std::string, cluster::durable_state::rollout_entry> rollouts;
  std::map<std::string, std::set<std::string>> used_versions;
};

struct controller_config {
  std::vector<cluster::node_info> nodes;
  std::map<cluster::node_id, std::string> node_regions;  // of `nodes` (embedded); joining nodes say theirs
  std::uint64_t device_reserved_bytes = 0;
  std::uint64_t replica_overhead_bytes = 0;  // per replica shard (GPU framework cost)
  std::string engine = "cpu";           // engine of new replicas: "cpu" or "null"
  std::uint32_t default_kv_tokens = 4096;
  std::uint32_t max_batch_tokens = 512;
  std::string default_model_file;       // used when a deploy names no file
  std::string default_routing = "least_outstanding";
  std::shared_ptr<desired_state> desired;  // never null
  std::shared_ptr<cluster_metrics> metrics;  // may be null
  std::uint32_t migration_parallelism = 4;        // replacements warming at once
  chaos_hooks hooks;
  std::uint32_t slot_max_replacements = 5;       // within the window, per slot
  std::uint32_t slot_replacement_window_ms = 300000;
  std::uint32_t slot_retry_after_ms = 30000;     // a given-up slot is tried again after this
  /// Distributed mode: configured deployments are placed once this many
  /// nodes joined (so they spread over the expected nodes, not the first).
  std::uint32_t deploy_after_nodes = 1;
  /// Distributed mode: the journal in --state-dir (null in the embedded
  /// cluster, whose desired state lives in memory).
  std::shared_ptr<cluster::journal> journal;
  /// After a restart from the journal: how long nodes have to rejoin and
  /// report their replicas before missing slots are placed anew.
  std::uint32_t reconcile_window_ms = 10000;
  /// Whether a node actor that goes down with its connection
  /// (remote_link_unreachable) counts as lost at once. Inside one process a
  /// down node actor is dead: true. Across processes a dropped connection
  /// says nothing of the node (a TLS error, a reset, a restart of the
  /// link): it is only suspected, it keeps serving under its lease and
  /// reconnects, and its slots move when its heartbeats are confirmed lost.
  bool migrate_on_link_loss = true;
  /// A drain that names no deadline gets this long before its in-flight
  /// requests are resumed elsewhere.
  std::uint32_t drain_deadline_ms = 60000;
  /// A replica degraded this long is drained and replaced. 0: never.
  std::uint32_t degraded_replace_after_ms = 120000;
  /// Replicas loading at once, cluster-wide and per node: every start
  /// (deploy, scale-up, replacement, drain) waits its turn.
  cluster::load_limits loads;
  /// Cache affinity: placement prefers nodes whose cache holds the file, and
  /// their loads need no cluster-wide turn (they read no store). Off only to
  /// measure what it is worth (the simulator's cold-start comparison).
  bool cache_affinity = true;
  /// Night-time consolidation: autoscaled deployments spread over devices
  /// and pack over nodes (placement's pack_nodes), so the slots a
  /// scale-down stops are on the nodes filled last and whole nodes empty.
  bool consolidate = false;
  /// Rollouts: how versions are judged, how long a step bakes unless the
  /// rollout names it, how often the controller looks, and how long the new
  /// version may have no ready replica before the rollout gives up on it.
  cluster::verdict_policy rollout_policy;
  std::uint32_t rollout_bake_s = 300;
  std::uint32_t rollout_tick_ms = 1000;
  std::uint32_t rollout_start_timeout_ms = 300000;
  /// After a rollout ends, the losing version keeps serving this long for
  /// requests already routed to it.
  std::uint32_t rollout_drop_grace_ms = 5000;
  /// Autoscaling: windows, cooldowns and step limits of every autoscaled
  /// deployment (each names its own min, max, metric and target), and how
  /// often the controller decides.
  cluster::autoscale_policy autoscale;
  std::uint32_t autoscale_tick_ms = 1000;
  /// A new replica that fits nowhere though the memory is free in total:
  /// move at most migration_parallelism others (drains) to make room.
  bool defragment = true;
};

/// controller -> controller: is this replica still degraded since `since_ns`?
struct degraded_check {
  cluster::replica_id id = 0;
  std::int64_t since_ns = 0;
};

/// controller -> controller: try a given-up slot again.
struct retry_slot {
  std::string deployment;
  std::uint32_t slot = 0;
};
/// health monitor -> controller: what it knows of each node.
struct node_states {
  std::vector<api::node_status> nodes;
};

struct controller_state {
  controller_config config;
  std::optional<cluster::cluster_state> placement;
  caf::actor router;
  caf::actor health_monitor;
  std::map<cluster::node_id, caf::actor> nodes;
  struct node_contact {
    std::string address;  // where gateways reach it ("" in the embedded cluster)
    caf::actor hub;       // where routers subscribe to it
  };
  std::map<cluster::node_id, node_contact> contacts;
  std::map<cluster::node_id, std::string> node_regions;  // nodes that joined with a region
  std::map<cluster::node_id, std::int64_t> clock_offsets_ns;  // from the health monitor
  std::vector<caf::actor> gateway_agents;  // told of every node that joins
  std::vector<api::deploy_request> awaiting_nodes;  // configured deployments waiting for a node
  bool reconciling = false;  // restarted from the journal: adopting before placing
  struct deployment {
    cluster::deployment_spec spec;
    std::string model_file;
    std::string model_sha256;  // "" = not pinned
    std::string routing;
    std::uint64_t prefix_slack_tokens = 2048;  // api::deploy_request::prefix_slack_tokens
    double prefix_slack_ratio = 0.25;          // api::deploy_request::prefix_slack_ratio
    double prefix_slack_s = 0.2;               // api::deploy_request::prefix_slack_s
    std::string tenant;  // "" = shared
    std::string chat_template;  // api::deploy_request::chat_template (text; "" = none)
    std::string draft_model;    // api::deploy_request::draft_model ("" = none), checked against the model
    std::string draft_sha256;   // "" = not pinned
    std::uint32_t draft_tokens = 0;  // 0: the engine's default
    /// Replicas taking traffic, as deploy, scale and the autoscaler set
    /// them; spec.replicas is this plus the warm pool (pool_size).
    std::uint32_t serving = 0;
    std::uint32_t warm_percent = 0;        // api::deploy_request::warm_pool_percent
    cluster::autoscale_policy autoscale;   // enabled() false: a fixed count
    model::model_facts facts;  // what /v1/models shows of its file
  };
  std::map<std::string, deployment> deployments;
  struct replica_record {
    cluster::replica_id id = 0;
    std::string deployment;
    std::uint32_t slot = 0;
    cluster::epoch_t epoch = 0;
    cluster::node_id node = 0;
    std::uint32_t device = 0;
    cluster::replica_state state = cluster::replica_state::creating;
    std::string reason;
    bool spawned = false;  // spawn_replica sent (its node was known)
    bool admitted = true;  // its turn to load came (load_gate); spawned once its node is up
    replica_spec spec;
    caf::actor handle;  // the replica actor, once it reported (for gateways joining later)
    std::int64_t degraded_since_ns = 0;  // when it last became degraded
    bool standby = false;       // designated to stand by in the warm pool
    bool told_standby = false;  // what the replica was last told (at spawn: spec.standby)
  };
  std::map<cluster::replica_id, replica_record> replicas;
  /// Epochs, replacement budgets, the migration queue and cordons: the
  /// slot state machine (runtime/cluster/slot_scheduler), set up at start.
  std::optional<cluster::slot_scheduler> slots;
  /// Replicas draining and drained nodes (runtime/cluster/drain).
  std::optional<cluster::drain_tracker> drains;
  /// Starts waiting for their turn to load (runtime/cluster/load_gate).
  std::optional<cluster::load_gate> loads;
  /// Nodes stopping (SIGTERM): the process that asked, so that only a new one lifts the drain.
  std::map<cluster::node_id, caf::actor_addr> leaving_handles;
  /// When the one drain-deadline timer fires (none set: nullopt).
  std::optional<std::int64_t> drain_timer_ns;
  std::map<cluster::node_id, cluster::node_health> node_health;
  /// The latest rollout of each plain name (kept once finished, for status).
  struct rollout_state {
    std::string base, from, to;  // plain name; old and new version's deployments
    std::uint32_t total = 0;     // replicas of the deployment (the old version's count at the start)
    std::optional<cluster::rollout_machine> machine;
    /// Since when the new version has had replicas asked for and not ready (0: none missing).
    std::int64_t unsettled_since_ns = 0;
    /// Final, and still finishing: the losing version serves until the
    /// split has reached every router (drop_after_ns) and the kept one has a
    /// ready replica; then it goes, and the kept one is placed up to `total`.
    bool finishing = false;
    std::int64_t drop_after_ns = 0;
    std::string keep, drop;
    bool finish_warned = false;
  };
  std::map<std::string, rollout_state> rollouts;
  /// Plain names whose current version is another deployment (tiny -> tiny@2).
  std::map<std::string, std::string> current_versions;
  /// Version labels rollouts have used, by plain name (never reused).
  std::map<std::string, std::set<std::string>> used_versions;
  /// The split last told to routers, by plain name.
  std::map<std::string, traffic_split> splits_sent;
  bool rollout_tick_armed = false;
  /// Autoscaled deployments: their autoscaler, and what routers reported
  /// of them since the last tick (each router's latest report; arrivals
  /// and the worst TTFT p99 summed up over reports).
  std::map<std::string, cluster::autoscaler> scalers;
  struct load_seen {
    std::map<caf::actor_addr, std::pair<std::int64_t, deployment_load>> by_router;
    std::uint64_t arrivals = 0;
    double ttft_p99_ms = -1;
  };
  std::map<std::string, load_seen> loads_seen;
  bool autoscale_tick_armed = false;
  /// Tenant limits shared by the gateways: their demand under leases, and
  /// each one's shares (quota_report).
  auth::quota_authority quotas;
  /// Weighted fair queuing across the gateways: the global per-tenant
  /// counters their fair queues order by (fair_share_report_msg).
  cluster::fair_share_authority fair_shares;
  /// Deployments waiting for room that defragmentation is making: the
  /// replicas moving out of the way (placed again as each stops).
  std::map<std::string, std::set<cluster::replica_id>> defrag_waiting;
  std::map<std::string, std::uint32_t> defrag_rounds;  // rooms made in a row for one deployment (bounded)
  /// Nodes that loaded each model (by "sha256:<hex>" or "path:<file>"):
  /// their caches are likely to hold it still, so placement prefers them.
  /// A node that is lost forgets; a stale entry only breaks a tie.
  std::map<std::string, std::set<cluster::node_id>> cached_models;
  /// The model files each node said its cache holds when it (last) joined
  /// (cluster::nodes_holding matches them to deployments); a lost node forgets.
  std::map<cluster::node_id, std::vector<cluster::cached_file>> node_files;
  /// The kind of each node's devices, as it joined ("cpu" until it says).
  std::map<cluster::node_id, std::string> device_kinds;
  static inline const char* name = "controller";
};

caf::behavior controller_actor(caf::stateful_actor<controller_state>* self, controller_config config,
                               caf::actor router, caf::actor health_monitor);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::retry_slot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::node_states)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::degraded_check)
