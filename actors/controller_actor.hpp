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
#include "cluster/failure_detector.hpp"
#include "cluster/restart_intensity.hpp"
#include "actors/chaos_hooks.hpp"

namespace exa::actors {

struct cluster_metrics;

/// The desired deployments, kept outside the controller so that a restarted
/// controller picks up where the crashed one left off.
struct desired_state {
  std::mutex mutex;
  std::map<std::string, api::deploy_request> deployments;  // guarded by mutex
};

struct controller_config {
  std::vector<cluster::node_info> nodes;
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
};

/// A node (re)started: the controller (re)learns its handle.
struct node_up {
  cluster::node_id node = 0;
  caf::actor handle;
};
struct deploy_msg {
  api::deploy_request request;
};
struct undeploy_msg {
  std::string name;
};
struct scale_msg {
  std::string name;
  std::uint32_t replicas = 0;
};
/// controller -> controller: try a given-up slot again.
struct retry_slot {
  std::string deployment;
  std::uint32_t slot = 0;
};
struct models_reply {
  std::vector<api::model_info> models;
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
  struct deployment {
    cluster::deployment_spec spec;
    std::string model_file;
    std::shared_ptr<const model::llama_model> model;
    std::string routing;
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
    replica_spec spec;
  };
  std::map<cluster::replica_id, replica_record> replicas;
  std::map<cluster::slot_ref, cluster::epoch_t> slot_epochs;
  /// Replacements per slot: a slot that keeps failing wherever it goes is
  /// given up (reported, not placed again) instead of ping-ponging forever.
  std::map<cluster::slot_ref, cluster::restart_intensity> slot_failures;
  /// Slots waiting to be placed again, and replacements still warming: a
  /// lost node's replicas move a few at a time, so they do not all load
  /// their model at once.
  struct migration {
    std::string deployment;
    std::uint32_t slot = 0;
    cluster::epoch_t epoch = 0;
    std::vector<cluster::node_id> excluded;
  };
  std::deque<migration> pending_migrations;
  std::set<cluster::replica_id> migrating;
  std::set<cluster::node_id> cordoned;  // confirmed failed: nothing is placed there
  std::map<cluster::node_id, cluster::node_health> node_health;
  static inline const char* name = "controller";
};

caf::behavior controller_actor(caf::stateful_actor<controller_state>* self, controller_config config,
                               caf::actor router, caf::actor health_monitor);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::node_up)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deploy_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::undeploy_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::scale_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::models_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::retry_slot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::node_states)
