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
#include "auth/quota_share.hpp"
#include "cluster/fair_share_board.hpp"
#include "cluster/node_cache.hpp"
#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::engine {
class inference_engine;
class block_pool;
class thread_pool;
struct step_result;
}  // namespace exa::engine
namespace exa::model {
class llama_model;
}  // namespace exa::model

// The public API's value types cross processes too (admin calls from a
// gateway to the controller); their inspect overloads live here, beside the
// registration, so runtime/ stays free of CAF.
namespace exa::api {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_info& x) {
  return f(caf::meta::type_name("exa.model_info"), x.name, x.model_file, x.replicas_ready, x.replicas_desired,
           x.context_length, x.tenant, x.version, x.ttft_p50_ms, x.ttft_p99_ms, x.tpot_p50_ms, x.tpot_p99_ms,
           x.architecture, x.quantization, x.tokenizer, x.draft_model, x.draft_tokens, x.routing,
           x.prefix_slack_tokens, x.prefix_slack_ratio, x.prefix_slack_s);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_request& x) {
  return f(caf::meta::type_name("exa.rollout_request"), x.what, x.name, x.model_file, x.model_sha256, x.version,
           x.steps, x.bake_s, x.max_unavailable, x.surge, x.min_samples);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_status& x) {
  return f(caf::meta::type_name("exa.replica_status"), x.id, x.deployment, x.slot, x.epoch, x.state, x.node,
           x.device, x.running, x.queued, x.kv_used_tokens, x.kv_capacity_tokens, x.devices, x.prefill_tokens_per_s,
           x.decode_tokens_per_s);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_status& x) {
  return f(caf::meta::type_name("exa.device_status"), x.node, x.device, x.kind, x.memory_bytes,
           x.memory_used_bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_status& x) {
  return f(caf::meta::type_name("exa.node_status"), x.id, x.rack, x.state, x.address, x.clock_offset_ms, x.drained,
           x.region);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_status& x) {
  return f(caf::meta::type_name("exa.cluster_status"), x.nodes, x.devices, x.replicas, x.models, x.rollouts);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_status& x) {
  return f(caf::meta::type_name("exa.rollout_status"), x.name, x.status);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deploy_request& x) {
  return f(caf::meta::type_name("exa.deploy_request"), x.name, x.model_file, x.replicas, x.kv_tokens, x.routing,
           x.max_replicas_per_node, x.model_sha256, x.tenant, x.chat_template, x.warm_pool_percent,
           x.autoscale_min, x.autoscale_max, x.autoscale_metric, x.autoscale_target, x.idle_to_zero_s,
           x.draft_model, x.draft_sha256, x.draft_tokens, x.tensor_parallel, x.prefix_slack_tokens,
           x.prefix_slack_ratio, x.prefix_slack_s);
}

}  // namespace exa::api

namespace exa::cluster {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cached_file& x) {
  return f(caf::meta::type_name("exa.cached_file"), x.name, x.bytes, x.sha256);
}

}  // namespace exa::cluster

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
  std::string model_sha256;     // "" = not pinned (api::deploy_request::model_sha256)
  bool standby = false;         // warmed, it stands by (the warm pool) instead of taking traffic
  /// Speculative decoding (api::deploy_request::draft_model): the draft's
  /// file and digest, loaded through the node's model cache like the model;
  /// "" = none. draft_tokens 0: the engine's default.
  std::string draft_model;
  std::string draft_sha256;
  std::uint32_t draft_tokens = 0;
  /// Every device of the replica's placement, ascending (its tensor-parallel
  /// group; one for TP 1); `device` is the first. Empty (a spec from before
  /// TP groups): just `device`.
  std::vector<std::uint32_t> devices;
};
/// The devices a replica runs on: spec.devices, or {spec.device}.
std::vector<std::uint32_t> devices_of(const replica_spec& spec);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_spec& x) {
  return f(caf::meta::type_name("exa.replica_spec"), x.id, x.deployment, x.slot, x.epoch, x.model_file,
           x.device, x.kv_tokens, x.engine, x.model_sha256, x.standby, x.draft_model, x.draft_sha256,
           x.draft_tokens, x.devices);
}

/// controller -> replica: stand by (the warm pool: loaded, no new traffic)
/// or serve. A busy replica stands by at once; what it runs finishes.
struct set_standby {
  cluster::replica_id id = 0;
  bool standby = false;
  /// Say the current state again even when nothing changes (a restarted
  /// controller adopting the replica does not know it).
  bool announce = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, set_standby& x) {
  return f(caf::meta::type_name("exa.set_standby"), x.id, x.standby, x.announce);
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
  /// Draining: stop anyway this long after the stop began (0: only when
  /// told), so a replica whose controller went quiet still ends its drain.
  std::uint32_t deadline_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stop_replica& x) {
  return f(caf::meta::type_name("exa.stop_replica"), x.id, x.drain, x.deadline_ms);
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
  /// The engine's prefix cache (engine::prefix_summary): block size, 0 when
  /// it has none, and at most replica_context::prefix_hashes_reported block
  /// hashes, most recently used first (prefix-aware routing).
  std::uint32_t prefix_block_tokens = 0;
  std::vector<std::uint64_t> prefix_hashes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_load& x) {
  return f(caf::meta::type_name("exa.replica_load"), x.id, x.running, x.queued, x.outstanding_tokens,
           x.decode_tokens_per_s, x.prefill_tokens_per_s, x.kv_used_tokens, x.kv_capacity_tokens,
           x.prefix_block_tokens, x.prefix_hashes);
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
  std::string request_id;      // the client-visible id, for the replica's log lines
  bool logprobs = false;           // send each token's log-probability (engine::compute_logprobs)
  std::uint32_t top_logprobs = 0;  // and this many alternatives with it
  /// For the engine's scheduling across tenants (engine/tenant_usage.hpp).
  std::string tenant;          // the request's tenant ("" = the open one)
  double tenant_weight = 1;    // its fair-share weight, > 0
  std::uint8_t priority = 0;   // engine::request_priority: 0 interactive, 1 batch
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, submit_msg& x) {
  return f(caf::meta::type_name("exa.submit"), x.request, x.prompt, x.resume, x.max_tokens, x.temperature,
           x.top_p, x.top_k, x.seed, x.stop_tokens, x.epoch, x.request_id, x.logprobs, x.top_logprobs, x.tenant,
           x.tenant_weight, x.priority);
}

/// One generated token's log-probability and the most likely alternatives
/// at its position (engine::token_logprobs on the wire).
struct token_logprob_msg {
  float logprob = 0;
  std::vector<std::int32_t> top_ids;  // best first
  std::vector<float> top_logprobs;    // same order
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprob_msg& x) {
  return f(caf::meta::type_name("exa.token_logprob"), x.logprob, x.top_ids, x.top_logprobs);
}

/// replica -> request: new tokens of a request, in order.
struct token_msg {
  std::uint64_t request = 0;
  std::vector<std::int32_t> tokens;
  std::uint32_t first_index = 0;
  /// One per token when the request asked for logprobs; else empty (and
  /// nothing extra crosses the wire).
  std::vector<token_logprob_msg> logprobs;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_msg& x) {
  return f(caf::meta::type_name("exa.tokens"), x.request, x.tokens, x.first_index, x.logprobs);
}

/// replica -> request: the request ended (engine::finish_reason).
struct finish_msg {
  std::uint64_t request = 0;
  std::uint8_t reason = 0;
  std::uint32_t generated = 0;
  /// engine::finish_event::cached_tokens: prompt tokens this replica read
  /// from its prefix cache when it admitted the request.
  std::uint32_t cached_tokens = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, finish_msg& x) {
  return f(caf::meta::type_name("exa.finish"), x.request, x.reason, x.generated, x.cached_tokens);
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
  /// The prompt's chained block hashes at prefix_block_tokens per block
  /// (request_context::prefix_block_tokens; none when 0), for prefix-aware
  /// routing: hashed by the request actor, off the router's thread.
  std::uint32_t prefix_block_tokens = 0;
  std::vector<std::uint64_t> prefix_hashes;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pick_replica& x) {
  return f(caf::meta::type_name("exa.pick_replica"), x.deployment, x.prompt_tokens, x.max_tokens, x.exclude,
           x.prefix_block_tokens, x.prefix_hashes);
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
/// The wall-clock stamps let the node estimate its clock offset (see
/// runtime/cluster/clock_offset).
struct heartbeat_ack {
  cluster::node_id node = 0;
  std::uint64_t sequence = 0;
  std::int64_t heartbeat_wall_ns = 0;  // the heartbeat's own stamp, echoed (t0)
  std::int64_t monitor_wall_ns = 0;    // the monitor's clock on receipt (t1)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat_ack& x) {
  return f(caf::meta::type_name("exa.heartbeat_ack"), x.node, x.sequence, x.heartbeat_wall_ns, x.monitor_wall_ns);
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
  std::int64_t wall_ns = 0;           // the node's wall clock when sent
  bool has_offset = false;            // the node's estimate so far:
  std::int64_t clock_offset_ns = 0;   // its clock minus the monitor's
  std::int64_t clock_rtt_ns = 0;      // and the round trip behind it
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat& x) {
  return f(caf::meta::type_name("exa.heartbeat"), x.node, x.sequence, x.wall_ns, x.has_offset, x.clock_offset_ns,
           x.clock_rtt_ns);
}

/// health monitor -> controller: a node's clock offset moved (for status).
struct node_clock_msg {
  cluster::node_id node = 0;
  std::int64_t offset_ns = 0;
  std::int64_t rtt_ns = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_clock_msg& x) {
  return f(caf::meta::type_name("exa.node_clock"), x.node, x.offset_ns, x.rtt_ns);
}

// ------------------------------------------------ deployments and admin

/// controller -> routers: a deployment exists (or changed). Each gateway
/// opens the model file itself for its tokenizer: no pointer crosses.
struct deployment_announce {
  std::string name;
  std::string model_file;  // a GGUF path, or a preset reference (simulation)
  std::uint32_t vocab_size = 0;
  std::uint32_t context_length = 0;
  std::string routing;  // policy name
  std::uint64_t prefix_slack_tokens = 2048;  // api::deploy_request::prefix_slack_tokens
  double prefix_slack_ratio = 0.25;          // api::deploy_request::prefix_slack_ratio
  double prefix_slack_s = 0.2;               // api::deploy_request::prefix_slack_s
  std::string tenant;   // "": shared (api::deploy_request::tenant)
  bool autoscaled = false;  // routers report its load to the controller (deployment_loads)
  /// The deployment's own chat template text (api::deploy_request::
  /// chat_template): the text, not a path, since routers run elsewhere.
  std::string chat_template;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_announce& x) {
  return f(caf::meta::type_name("exa.deployment_announce"), x.name, x.model_file, x.vocab_size, x.context_length,
           x.routing, x.prefix_slack_tokens, x.prefix_slack_ratio, x.prefix_slack_s, x.tenant, x.autoscaled,
           x.chat_template);
}

/// controller -> routers: a deployment is gone.
/// controller -> router: a deployment is wanted but not placed yet (no node
/// joined, or the controller is rebuilding it): requests for it wait for its
/// announce instead of being refused as unknown.
struct deployment_starting {
  std::string name;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_starting& x) {
  return f(caf::meta::type_name("exa.deployment_starting"), x.name);
}

/// controller -> routers: a deployment scaled to zero is cold (kept, with
/// no replica: a request for it wakes it and waits), or no longer cold.
struct deployment_cold {
  std::string name;
  bool cold = true;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_cold& x) {
  return f(caf::meta::type_name("exa.deployment_cold"), x.name, x.cold);
}
/// router -> controller: a request came for a cold deployment.
struct wake_deployment {
  std::string name;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wake_deployment& x) {
  return f(caf::meta::type_name("exa.wake_deployment"), x.name);
}

struct deployment_removed {
  std::string name;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_removed& x) {
  return f(caf::meta::type_name("exa.deployment_removed"), x.name);
}

/// gateway -> controller: admin calls. deploy, undeploy and scale reply
/// ok_atom or an error; models replies models_reply; status status_reply.
struct deploy_msg {
  api::deploy_request request;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deploy_msg& x) {
  return f(caf::meta::type_name("exa.deploy"), x.request);
}
struct undeploy_msg {
  std::string name;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, undeploy_msg& x) {
  return f(caf::meta::type_name("exa.undeploy"), x.name);
}
struct scale_msg {
  std::string name;
  std::uint32_t replicas = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, scale_msg& x) {
  return f(caf::meta::type_name("exa.scale"), x.name, x.replicas);
}
/// gateway -> controller: drain or undrain; replies drain_reply or an error.
struct drain_msg {
  std::uint8_t kind = 0;  // api::drain_request::target
  std::uint64_t id = 0;
  std::uint32_t deadline_ms = 0;
  bool undrain = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drain_msg& x) {
  return f(caf::meta::type_name("exa.drain"), x.kind, x.id, x.deadline_ms, x.undrain);
}
struct drain_reply {
  api::drain_result result;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, drain_reply& x) {
  return f(caf::meta::type_name("exa.drain_reply"), x.result.replicas, x.result.deadline_ms);
}
/// gateway -> controller: a rollout command; replies rollout_reply or an error.
struct rollout_msg {
  api::rollout_request request;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_msg& x) {
  return f(caf::meta::type_name("exa.rollout"), x.request);
}
struct rollout_reply {
  std::string status;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_reply& x) {
  return f(caf::meta::type_name("exa.rollout_reply"), x.status);
}
/// controller -> routers: how a deployment's plain name splits between its
/// versions. Requests naming `base` go to `canary` with `canary_percent`
/// (sticky per conversation) and to `stable` otherwise; "base@V" pins one.
/// stable == base with no canary: no split (the message removes one); an
/// empty base removes every split.
struct traffic_split {
  std::string base;
  std::string stable;  // the deployment serving the current version
  std::string canary;  // "" = none
  std::uint32_t canary_percent = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, traffic_split& x) {
  return f(caf::meta::type_name("exa.traffic_split"), x.base, x.stable, x.canary, x.canary_percent);
}
/// controller -> a joining gateway's router: every deployment there is (or
/// is starting); the router forgets any other, as if removed.
struct deployment_set {
  std::vector<std::string> names;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_set& x) {
  return f(caf::meta::type_name("exa.deployment_set"), x.names);
}
/// request actor -> router: how a request of a deployment ended (the
/// rollout's evidence). ok: it finished (stop or length).
struct request_sample {
  std::string deployment;
  bool ok = true;
  double ttft_ms = 0;
  double tpot_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_sample& x) {
  return f(caf::meta::type_name("exa.request_sample"), x.deployment, x.ok, x.ttft_ms, x.tpot_ms);
}
/// router -> controller: a batch of samples of a deployment under rollout.
struct version_samples {
  std::string deployment;
  std::vector<double> ttft_ms;  // one pair per finished request
  std::vector<double> tpot_ms;
  std::uint32_t failures = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, version_samples& x) {
  return f(caf::meta::type_name("exa.version_samples"), x.deployment, x.ttft_ms, x.tpot_ms, x.failures);
}
/// router -> controller, every second: what one router sees of each
/// deployment (the autoscaler's input, runtime/cluster/autoscaler, and the
/// latency status and top show).
struct deployment_load {
  std::string deployment;
  std::uint32_t replicas = 0;       // replicas taking traffic (ready, busy, degraded)
  std::uint32_t outstanding = 0;    // requests running + queued on them (their load reports)
  std::uint64_t kv_used = 0;        // KV tokens used and granted on them
  std::uint64_t kv_capacity = 0;
  std::uint64_t arrivals = 0;       // requests this router routed to it since its last report
  double ttft_p99_ms = -1;          // over the requests that finished since; < 0: none
  /// Over the last minute's requests (for status and top); < 0: none.
  double recent_ttft_p50_ms = -1, recent_ttft_p99_ms = -1;
  double recent_tpot_p50_ms = -1, recent_tpot_p99_ms = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_load& x) {
  return f(caf::meta::type_name("exa.deployment_load"), x.deployment, x.replicas, x.outstanding, x.kv_used,
           x.kv_capacity, x.arrivals, x.ttft_p99_ms, x.recent_ttft_p50_ms, x.recent_ttft_p99_ms,
           x.recent_tpot_p50_ms, x.recent_tpot_p99_ms);
}
struct deployment_loads {
  std::vector<deployment_load> loads;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, deployment_loads& x) {
  return f(caf::meta::type_name("exa.deployment_loads"), x.loads);
}

}  // namespace exa::actors

namespace exa::auth {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, quota_demand& x) {
  return f(caf::meta::type_name("exa.quota_demand"), x.tenant, x.limit_requests_per_s, x.limit_tokens_per_min,
           x.limit_concurrent, x.requests_per_s, x.tokens_per_min, x.concurrent);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, quota_share& x) {
  return f(caf::meta::type_name("exa.quota_share"), x.tenant, x.requests, x.tokens, x.concurrent);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, quota_grant& x) {
  return f(caf::meta::type_name("exa.quota_grant"), x.shares, x.gateways);
}

}  // namespace exa::auth

namespace exa::actors {

/// router -> controller, every quota_report_ms (router_config): this
/// gateway's demand for each tenant with limits, so the controller divides
/// every limit among the gateways (auth/quota_share.hpp). Answered with a
/// quota_grant_msg (this gateway's shares) or an error.
struct quota_report {
  std::uint64_t gateway = 0;  // router_config::gateway_id
  std::vector<auth::quota_demand> demands;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, quota_report& x) {
  return f(caf::meta::type_name("exa.quota_report"), x.gateway, x.demands);
}
struct quota_grant_msg {
  auth::quota_grant grant;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, quota_grant_msg& x) {
  return f(caf::meta::type_name("exa.quota_grant_msg"), x.grant);
}

}  // namespace exa::actors

namespace exa::cluster {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_share_entry& x) {
  return f(caf::meta::type_name("exa.fair_share_entry"), x.deployment, x.tenant, x.generation, x.charged, x.waiting,
           x.held, x.slots);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_share_report& x) {
  return f(caf::meta::type_name("exa.fair_share_report"), x.gateway, x.entries);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_counter& x) {
  return f(caf::meta::type_name("exa.fair_counter"), x.tenant, x.counter, x.held);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_deployment_counters& x) {
  return f(caf::meta::type_name("exa.fair_deployment_counters"), x.deployment, x.floor, x.counters, x.slots,
           x.active);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_share_answer& x) {
  return f(caf::meta::type_name("exa.fair_share_answer"), x.deployments, x.gateways);
}

}  // namespace exa::cluster

namespace exa::actors {

/// router -> controller, with each quota report (router_config::
/// fair_shares): what this gateway's fair queues charged per deployment and
/// tenant, in total, and their backlog, so the controller keeps global
/// fair-queue counters (cluster/fair_share_board.hpp). Answered with a
/// fair_share_answer_msg or an error.
struct fair_share_report_msg {
  cluster::fair_share_report report;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_share_report_msg& x) {
  return f(caf::meta::type_name("exa.fair_share_report_msg"), x.report);
}
struct fair_share_answer_msg {
  cluster::fair_share_answer answer;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fair_share_answer_msg& x) {
  return f(caf::meta::type_name("exa.fair_share_answer_msg"), x.answer);
}

/// node -> controller: this node's process is stopping (SIGTERM): move its
/// slots elsewhere and drain its replicas within `deadline_ms`.
struct node_leaving {
  cluster::node_id node = 0;
  std::uint32_t deadline_ms = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_leaving& x) {
  return f(caf::meta::type_name("exa.node_leaving"), x.node, x.deadline_ms);
}
struct models_reply {
  std::vector<api::model_info> models;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, models_reply& x) {
  return f(caf::meta::type_name("exa.models_reply"), x.models);
}
struct status_reply {
  api::cluster_status status;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, status_reply& x) {
  return f(caf::meta::type_name("exa.status_reply"), x.status);
}

// ------------------------------------------------------ joining a cluster

/// Who is joining, checked by the controller before anything else: a
/// process of another cluster or another build is refused with a reason
/// that both sides log.
struct join_identity {
  std::string cluster;  // the cluster's name
  std::string version;  // the build's protocol version
  std::string role;     // "node" or "gateway"
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_identity& x) {
  return f(caf::meta::type_name("exa.join_identity"), x.cluster, x.version, x.role);
}

/// new process -> controller's directory: may I join? Replies welcome_msg
/// or an error (invalid_argument) naming the mismatch.
struct hello_msg {
  join_identity who;
  cluster::node_id node = 0;  // nodes only
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello_msg& x) {
  return f(caf::meta::type_name("exa.hello"), x.who, x.node);
}
/// The cluster's timings travel with the welcome, so every node heartbeats
/// and fences itself by the controller's configuration.
struct welcome_msg {
  caf::actor controller;
  caf::actor health_monitor;
  std::uint32_t heartbeat_interval_ms = 0;
  std::uint32_t lease_ms = 0;  // self-fence after this long without an ack
  std::string engine;          // the engine the controller places replicas with
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, welcome_msg& x) {
  return f(caf::meta::type_name("exa.welcome"), x.controller, x.health_monitor, x.heartbeat_interval_ms,
           x.lease_ms, x.engine);
}

/// A replica a node runs, as it reports it when it (re)joins: a restarted
/// controller adopts it or tells the node to stop it.
struct running_replica {
  replica_spec spec;
  caf::actor handle;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, running_replica& x) {
  return f(caf::meta::type_name("exa.running_replica"), x.spec, x.handle);
}

/// node -> controller: this node (re)started with these devices. The
/// controller adds it to placement and health watching on first sight, and
/// monitors `handle`: its loss moves the node's replicas elsewhere.
struct node_join {
  cluster::node_id node = 0;
  cluster::rack_id rack = 0;
  std::uint32_t devices = 0;
  std::uint64_t device_memory_bytes = 0;
  std::string address;  // host:port where the node publishes its hub ("" embedded)
  caf::actor handle;    // the node actor
  caf::actor hub;       // where routers subscribe for replica events and loads
  std::vector<running_replica> replicas;  // what it runs (empty on a fresh start)
  std::string region;                     // "" = none
  /// The model files its cache holds (found at start, fetched or loaded
  /// since): cache-aware placement prefers the node for them at once.
  std::vector<cluster::cached_file> cached;
  /// The kind of its devices ("cpu" or "cuda"); device_memory_bytes is what
  /// each of them can give the ledger (a GPU's: what it really reserved).
  std::string device_kind = "cpu";
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_join& x) {
  return f(caf::meta::type_name("exa.node_join"), x.node, x.rack, x.devices, x.device_memory_bytes, x.address,
           x.handle, x.hub, x.replicas, x.region, x.cached, x.device_kind);
}
/// node (its model cache) -> controller: the node's cache holds this file
/// now, fetched from the model store: its loads of it need the store no more
/// and placement prefers the node for it.
struct node_cached_file {
  cluster::node_id node = 0;
  cluster::cached_file file;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_cached_file& x) {
  return f(caf::meta::type_name("exa.node_cached_file"), x.node, x.file);
}
/// controller -> routers: the region a node is in (routers of a region
/// prefer its replicas, and spill over to others when those are saturated
/// or down).
struct node_region {
  cluster::node_id node = 0;
  std::string region;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_region& x) {
  return f(caf::meta::type_name("exa.node_region"), x.node, x.region);
}

/// controller -> gateway agents: a node to connect to directly (the data
/// plane never goes through the controller) and subscribe at.
struct node_announce {
  cluster::node_id node = 0;
  std::string address;
  caf::actor hub;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_announce& x) {
  return f(caf::meta::type_name("exa.node_announce"), x.node, x.address, x.hub);
}

/// gateway -> controller: a gateway's router wants the cluster's control
/// events; its agent wants node announcements. The controller answers with
/// a snapshot (deployments, replicas, epochs, nodes) and keeps both posted.
struct gateway_join {
  caf::actor router;
  caf::actor agent;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, gateway_join& x) {
  return f(caf::meta::type_name("exa.gateway_join"), x.router, x.agent);
}

/// router -> hub: send me what you are sent (replica events, loads, fences).
struct subscribe_msg {
  caf::actor subscriber;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, subscribe_msg& x) {
  return f(caf::meta::type_name("exa.subscribe"), x.subscriber);
}

// ------------------------------------------------- local-only (pointers)

/// replica -> device: run one step of this engine on the device's executor
/// (shared: the engine outlives a replica killed mid-step). An engine holds
/// its device (pool, threads, stream): a job still in a killed device's
/// mailbox may be the engine's last owner, and its KV cache returns its
/// blocks to the pool as it goes.
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
  std::string sha256;  // "" = any content at the path
};
struct model_handle {
  std::shared_ptr<const model::llama_model> model;  // null when loading failed
  wire_error error;                                 // why, when model is null
};
struct release_model {
  std::string path;
  std::string sha256;
};
/// node -> its model cache: what do you hold? (for the node's join)
using cache_contents_atom = caf::atom_constant<caf::atom("cachelist")>;
/// model cache -> node: the files it holds, sha256 only where verified.
struct cached_files_msg {
  std::vector<cluster::cached_file> files;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cached_files_msg& x) {
  return f(caf::meta::type_name("exa.cached_files"), x.files);
}
/// replica -> the simulated storage (simulation with the storage modelled):
/// move `file`'s bytes onto `node`; answered ok_atom once they are there.
struct sim_load {
  cluster::node_id node = 0;
  cluster::cached_file file;  // as the node's cache names it (model::store_name), with its bytes
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sim_load& x) {
  return f(caf::meta::type_name("exa.sim_load"), x.node, x.file);
}
/// controller -> the simulated storage: tell me (node_cached_file) when a
/// node's fetch from the store is done, as a real node's model cache does.
struct sim_storage_watch {
  caf::actor controller;
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
/// request actor -> a restarted router: I am in flight and was admitted by
/// your predecessor; sweep my deadline and route my cancels.
struct adopt_request {
  std::string request_id;
  std::string deployment;
  std::int64_t deadline_ns = 0;
};
/// self -> self: run this later (delayed_send), for fault injection delays.
struct deferred_call {
  std::function<void()> fn;
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
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::adopt_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::deferred_call)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(exa::actors::sim_storage_watch)
