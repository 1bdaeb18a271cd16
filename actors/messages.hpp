#pragma once
// Every message the actors exchange, in one place. Types that will cross
// process boundaries in the distributed mode have an `inspect` overload and
// are registered by name in register_message_types(); types that carry local
// pointers (engines, models, client sinks) are marked local-only and must
// never leave the process.

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/gateway.hpp"
#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::engine {
class inference_engine;
struct step_result;
}  // namespace exa::engine
namespace exa::model {
class llama_model;
}  // namespace exa::model

namespace exa::actors {

// ---------------------------------------------------------------- atoms

using tick_atom = caf::atom_constant<caf::atom("tick")>;          // periodic timer
using step_atom = caf::atom_constant<caf::atom("step")>;          // run an engine step
using status_atom = caf::atom_constant<caf::atom("status")>;      // cluster status
using models_atom = caf::atom_constant<caf::atom("models")>;      // deployments list
using ready_atom = caf::atom_constant<caf::atom("ready")>;        // readiness probe
using deadline_atom = caf::atom_constant<caf::atom("deadline")>;  // request deadline
using warmed_atom = caf::atom_constant<caf::atom("warmed")>;      // warm-up finished
using ok_atom = caf::atom_constant<caf::atom("ok")>;
using loads_atom = caf::atom_constant<caf::atom("loads")>;        // router's load table
using check_atom = caf::atom_constant<caf::atom("check")>;        // device health check
using unhang_atom = caf::atom_constant<caf::atom("unhang")>;      // a device hang ends
using nodes_atom = caf::atom_constant<caf::atom("nodes")>;        // health monitor's node view

// ------------------------------------------------------- error on the wire

/// An exa::error that can travel in a message.
struct wire_error {
  std::uint8_t code = 0;  // exa::errc
  std::string message;

  static wire_error from(const error& e) { return {static_cast<std::uint8_t>(e.code), e.message}; }
  error to_error() const { return {static_cast<errc>(code), message}; }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wire_error& x) {
  return f(caf::meta::type_name("exa.wire_error"), x.code, x.message);
}

/// Our errors inside caf::error (category "exa"), so request/response
/// failures keep their code across actors; CAF's own errors (timeouts, dead
/// receivers) map to the code a caller can act on.
caf::error to_caf(const error& e);
error from_caf(const caf::error& e);

// ------------------------------------------------------ replicas and nodes

/// What a node needs to start a replica in one of its device slots.
struct replica_spec {
  cluster::replica_id id = 0;
  std::string deployment;
  std::uint32_t slot = 0;
  cluster::epoch_t epoch = 0;
  std::string model_file;
  std::uint32_t device = 0;
  std::uint32_t kv_tokens = 0;  // KV capacity granted by the ledger
  std::string engine = "cpu";   // "cpu" or "null"
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_spec& x) {
  return f(caf::meta::type_name("exa.replica_spec"), x.id, x.deployment, x.slot, x.epoch, x.model_file,
           x.device, x.kv_tokens, x.engine);
}

/// controller -> node: start a replica.
struct spawn_replica {
  replica_spec spec;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, spawn_replica& x) {
  return f(caf::meta::type_name("exa.spawn_replica"), x.spec);
}

/// controller -> node -> replica: stop (draining first when `drain`).
struct stop_replica {
  cluster::replica_id id = 0;
  bool drain = true;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stop_replica& x) {
  return f(caf::meta::type_name("exa.stop_replica"), x.id, x.drain);
}

/// replica -> controller and router: a lifecycle transition.
struct replica_event {
  cluster::replica_id id = 0;
  std::string deployment;
  std::uint32_t slot = 0;
  cluster::epoch_t epoch = 0;
  cluster::node_id node = 0;
  std::uint32_t device = 0;
  std::uint8_t state = 0;  // cluster::replica_state
  std::string reason;
  caf::actor handle;  // the replica actor, to route to
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_event& x) {
  return f(caf::meta::type_name("exa.replica_event"), x.id, x.deployment, x.slot, x.epoch, x.node, x.device,
           x.state, x.reason, x.handle);
}

/// replica -> router: load and speed, after steps (throttled).
struct replica_load {
  cluster::replica_id id = 0;
  std::uint32_t running = 0;
  std::uint32_t queued = 0;
  std::uint64_t outstanding_tokens = 0;
  double decode_tokens_per_s = 0;
  double prefill_tokens_per_s = 0;
  std::uint32_t kv_used_tokens = 0;
  std::uint32_t kv_capacity_tokens = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_load& x) {
  return f(caf::meta::type_name("exa.replica_load"), x.id, x.running, x.queued, x.outstanding_tokens,
           x.decode_tokens_per_s, x.prefill_tokens_per_s, x.kv_used_tokens, x.kv_capacity_tokens);
}

// ------------------------------------------------------------ generation

/// request -> replica: generate. Replies ok_atom, or wire_error when refused.
struct submit_msg {
  std::uint64_t request = 0;  // per-process request number
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> resume;  // tokens already delivered (resume)
  std::uint32_t max_tokens = 0;
  float temperature = 0;
  float top_p = 1;
  std::uint32_t top_k = 0;
  std::uint64_t seed = 0;
  std::vector<std::int32_t> stop_tokens;
  cluster::epoch_t epoch = 0;  // the slot epoch the router chose it under
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_msg& x) {
  return f(caf::meta::type_name("exa.submit"), x.request, x.prompt, x.resume, x.max_tokens, x.temperature,
           x.top_p, x.top_k, x.seed, x.stop_tokens, x.epoch);
}

/// replica -> request: new tokens of a request, in order.
struct token_msg {
  std::uint64_t request = 0;
  std::vector<std::int32_t> tokens;
  std::uint32_t first_index = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_msg& x) {
  return f(caf::meta::type_name("exa.tokens"), x.request, x.tokens, x.first_index);
}

/// replica -> request: the request ended (engine::finish_reason).
struct finish_msg {
  std::uint64_t request = 0;
  std::uint8_t reason = 0;
  std::uint32_t generated = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, finish_msg& x) {
  return f(caf::meta::type_name("exa.finish"), x.request, x.reason, x.generated);
}

/// request -> replica: stop generating and free the KV blocks.
struct cancel_msg {
  std::uint64_t request = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cancel_msg& x) {
  return f(caf::meta::type_name("exa.cancel"), x.request);
}

/// request -> router: a replica of `deployment` for this much work, none of
/// `exclude`. Replies picked_replica or wire_error.
struct pick_replica {
  std::string deployment;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_tokens = 0;
  std::vector<cluster::replica_id> exclude;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pick_replica& x) {
  return f(caf::meta::type_name("exa.pick_replica"), x.deployment, x.prompt_tokens, x.max_tokens, x.exclude);
}

struct picked_replica {
  cluster::replica_id id = 0;
  cluster::epoch_t epoch = 0;
  caf::actor handle;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, picked_replica& x) {
  return f(caf::meta::type_name("exa.picked_replica"), x.id, x.epoch, x.handle);
}

/// chaos -> node: kill this replica actor abruptly (fault injection; the
/// node's supervision then handles it like any crash).
struct kill_replica {
  cluster::replica_id id = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kill_replica& x) {
  return f(caf::meta::type_name("exa.kill_replica"), x.id);
}

/// -> controller: the current handle of a node (replies caf::actor).
struct get_node {
  cluster::node_id node = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, get_node& x) {
  return f(caf::meta::type_name("exa.get_node"), x.node);
}

/// health monitor -> controller, router: a node's health changed
/// (cluster::node_health).
struct node_health_msg {
  cluster::node_id node = 0;
  std::uint8_t health = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_health_msg& x) {
  return f(caf::meta::type_name("exa.node_health"), x.node, x.health);
}

/// controller -> router: a slot moved on to `epoch`; older replicas are stale.
struct fence_slot {
  std::string deployment;
  std::uint32_t slot = 0;
  cluster::epoch_t epoch = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fence_slot& x) {
  return f(caf::meta::type_name("exa.fence_slot"), x.deployment, x.slot, x.epoch);
}

/// controller -> node -> replica, router -> replica: these are the current
/// epochs; a replica serving an older one stops itself.
struct fence_notice {
  std::vector<fence_slot> slots;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fence_notice& x) {
  return f(caf::meta::type_name("exa.fence_notice"), x.slots);
}

/// node -> controller: a device check failed (hung, failed, out of memory).
struct device_fault {
  cluster::node_id node = 0;
  std::uint32_t device = 0;
  std::string reason;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_fault& x) {
  return f(caf::meta::type_name("exa.device_fault"), x.node, x.device, x.reason);
}

/// chaos -> node: fault injection on one of its devices or its model cache.
/// kind: "fail" (the device actor dies), "hang" (steps and checks get no
/// answer for duration_ms), "slow_load" (model loads take delay_ms longer
/// for duration_ms).
struct inject_fault {
  std::string kind;
  std::uint32_t device = 0;
  std::uint32_t duration_ms = 0;
  std::uint32_t delay_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, inject_fault& x) {
  return f(caf::meta::type_name("exa.inject_fault"), x.kind, x.device, x.duration_ms, x.delay_ms);
}

/// health monitor -> node: heard you. A node that hears no ack for its lease
/// assumes it has been declared failed and fences itself first.
struct heartbeat_ack {
  cluster::node_id node = 0;
  std::uint64_t sequence = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat_ack& x) {
  return f(caf::meta::type_name("exa.heartbeat_ack"), x.node, x.sequence);
}

/// node -> replica: the node lost the control plane; stop serving now.
using self_fence_atom = caf::atom_constant<caf::atom("selffence")>;

/// request -> router: how an attempt on a replica went (request-level health
/// signal: a replica failing many requests stops getting new ones).
struct replica_outcome {
  cluster::replica_id replica = 0;
  bool ok = true;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_outcome& x) {
  return f(caf::meta::type_name("exa.replica_outcome"), x.replica, x.ok);
}
/// router -> router: a replica's error-rate suspicion expires.
struct unsuspect_replica {
  cluster::replica_id replica = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unsuspect_replica& x) {
  return f(caf::meta::type_name("exa.unsuspect_replica"), x.replica);
}

/// node -> health monitor: I am alive.
struct heartbeat {
  cluster::node_id node = 0;
  std::uint64_t sequence = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat& x) {
  return f(caf::meta::type_name("exa.heartbeat"), x.node, x.sequence);
}

// ------------------------------------------------- local-only (pointers)

/// replica -> device: run one step of this engine on the device's thread
/// (shared: the engine outlives a replica killed mid-step).
struct step_job {
  std::shared_ptr<engine::inference_engine> engine;
};
/// device -> replica: the step's outcome.
struct step_done {
  std::shared_ptr<engine::step_result> result;
  double seconds = 0;
};
/// replica -> model cache: the loaded model (pinned until release_model).
struct acquire_model {
  std::string path;
};
struct model_handle {
  std::shared_ptr<const model::llama_model> model;  // null when loading failed
  wire_error error;                                 // why, when model is null
};
struct release_model {
  std::string path;
};
/// gateway bridge -> router: a client request and where its stream goes.
struct route_request {
  api::generate_request request;
  std::shared_ptr<api::stream_sink> sink;
};
/// gateway bridge -> router -> request actor: the client went away.
struct cancel_request {
  std::string request_id;
};
/// controller -> router: a deployment exists (or changed) with this model.
struct deployment_info {
  std::string name;
  std::shared_ptr<const model::llama_model> model;  // null for null-engine deployments
  std::uint32_t vocab_size = 0;
  std::uint32_t context_length = 0;
  std::string routing;  // policy name
};
struct deployment_removed {
  std::string name;
};
/// self -> self: run this later (delayed_send), for fault injection delays.
struct deferred_call {
  std::function<void()> fn;
};
/// A callback to run with a value, for replies to the gateway bridge.
struct status_reply {
  std::shared_ptr<api::cluster_status> status;
};

/// Registers the network-capable types with the actor system config.
void register_message_types(caf::actor_system_config& cfg);

}  // namespace exa::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::step_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::step_done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::acquire_model)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::model_handle)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::release_model)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::route_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::cancel_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deployment_info)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deployment_removed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::status_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deferred_call)
