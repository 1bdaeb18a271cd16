#include "actors/messages.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/sec.hpp>
#include <caf/to_string.hpp>

namespace exa::actors {

namespace {
constexpr caf::atom_value exa_category = caf::atom("exa");
}

// caf::error treats code 0 as "no error", and errc starts at 0: shift by one.
caf::error to_caf(const error& e) {
  return caf::error(static_cast<std::uint8_t>(static_cast<int>(e.code) + 1), exa_category,
                    caf::make_message(e.message));
}

error from_caf(const caf::error& e) {
  if (!e) return {errc::internal, "no error"};
  if (e.category() == exa_category) {
    std::string message;
    if (e.context().match_elements<std::string>()) message = e.context().get_as<std::string>(0);
    return {static_cast<errc>(e.code() - 1), std::move(message)};
  }
  if (e.category() == caf::atom("system")) {
    switch (static_cast<caf::sec>(e.code())) {
      case caf::sec::request_timeout: return {errc::unavailable, "no answer in time: " + caf::to_string(e)};
      case caf::sec::request_receiver_down: return {errc::unavailable, "receiver is down"};
      default: break;
    }
  }
  return {errc::internal, caf::to_string(e)};
}

std::vector<std::uint32_t> devices_of(const replica_spec& spec) {
  if (spec.devices.empty()) return {spec.device};
  return spec.devices;
}

void register_message_types(caf::actor_system_config& cfg) {
  // Names must match on every node of a distributed cluster.
  cfg.add_message_type<wire_error>("exa.wire_error");
  cfg.add_message_type<replica_spec>("exa.replica_spec");
  cfg.add_message_type<spawn_replica>("exa.spawn_replica");
  cfg.add_message_type<stop_replica>("exa.stop_replica");
  cfg.add_message_type<replica_event>("exa.replica_event");
  cfg.add_message_type<replica_load>("exa.replica_load");
  cfg.add_message_type<submit_msg>("exa.submit");
  cfg.add_message_type<token_msg>("exa.tokens");
  cfg.add_message_type<token_logprob_msg>("exa.token_logprob");
  cfg.add_message_type<finish_msg>("exa.finish");
  cfg.add_message_type<cancel_msg>("exa.cancel");
  cfg.add_message_type<pick_replica>("exa.pick_replica");
  cfg.add_message_type<picked_replica>("exa.picked_replica");
  cfg.add_message_type<heartbeat>("exa.heartbeat");
  cfg.add_message_type<heartbeat_ack>("exa.heartbeat_ack");
  cfg.add_message_type<node_clock_msg>("exa.node_clock");
  cfg.add_message_type<replica_outcome>("exa.replica_outcome");
  cfg.add_message_type<unsuspect_replica>("exa.unsuspect_replica");
  cfg.add_message_type<kill_replica>("exa.kill_replica");
  cfg.add_message_type<get_node>("exa.get_node");
  cfg.add_message_type<node_health_msg>("exa.node_health");
  cfg.add_message_type<fence_slot>("exa.fence_slot");
  cfg.add_message_type<fence_notice>("exa.fence_notice");
  cfg.add_message_type<device_fault>("exa.device_fault");
  cfg.add_message_type<inject_fault>("exa.inject_fault");
  cfg.add_message_type<api::model_info>("exa.model_info");
  cfg.add_message_type<api::replica_status>("exa.replica_status");
  cfg.add_message_type<api::device_status>("exa.device_status");
  cfg.add_message_type<api::node_status>("exa.node_status");
  cfg.add_message_type<api::cluster_status>("exa.cluster_status");
  cfg.add_message_type<api::deploy_request>("exa.deploy_request");
  cfg.add_message_type<deployment_announce>("exa.deployment_announce");
  cfg.add_message_type<deployment_removed>("exa.deployment_removed");
  cfg.add_message_type<deployment_cold>("exa.deployment_cold");
  cfg.add_message_type<wake_deployment>("exa.wake_deployment");
  cfg.add_message_type<deployment_starting>("exa.deployment_starting");
  cfg.add_message_type<deploy_msg>("exa.deploy");
  cfg.add_message_type<undeploy_msg>("exa.undeploy");
  cfg.add_message_type<scale_msg>("exa.scale");
  cfg.add_message_type<drain_msg>("exa.drain");
  cfg.add_message_type<drain_reply>("exa.drain_reply");
  cfg.add_message_type<api::rollout_request>("exa.rollout_request");
  cfg.add_message_type<rollout_msg>("exa.rollout");
  cfg.add_message_type<rollout_reply>("exa.rollout_reply");
  cfg.add_message_type<traffic_split>("exa.traffic_split");
  cfg.add_message_type<deployment_set>("exa.deployment_set");
  cfg.add_message_type<node_region>("exa.node_region");
  cfg.add_message_type<request_sample>("exa.request_sample");
  cfg.add_message_type<version_samples>("exa.version_samples");
  cfg.add_message_type<set_standby>("exa.set_standby");
  cfg.add_message_type<deployment_load>("exa.deployment_load");
  cfg.add_message_type<std::vector<deployment_load>>("exa.deployment_load_list");
  cfg.add_message_type<deployment_loads>("exa.deployment_loads");
  cfg.add_message_type<auth::quota_demand>("exa.quota_demand");
  cfg.add_message_type<std::vector<auth::quota_demand>>("exa.quota_demand_list");
  cfg.add_message_type<auth::quota_share>("exa.quota_share");
  cfg.add_message_type<std::vector<auth::quota_share>>("exa.quota_share_list");
  cfg.add_message_type<auth::quota_grant>("exa.quota_grant");
  cfg.add_message_type<quota_report>("exa.quota_report");
  cfg.add_message_type<quota_grant_msg>("exa.quota_grant_msg");
  cfg.add_message_type<cluster::fair_share_entry>("exa.fair_share_entry");
  cfg.add_message_type<std::vector<cluster::fair_share_entry>>("exa.fair_share_entry_list");
  cfg.add_message_type<cluster::fair_share_report>("exa.fair_share_report");
  cfg.add_message_type<cluster::fair_counter>("exa.fair_counter");
  cfg.add_message_type<std::vector<cluster::fair_counter>>("exa.fair_counter_list");
  cfg.add_message_type<cluster::fair_deployment_counters>("exa.fair_deployment_counters");
  cfg.add_message_type<std::vector<cluster::fair_deployment_counters>>("exa.fair_deployment_counters_list");
  cfg.add_message_type<cluster::fair_share_answer>("exa.fair_share_answer");
  cfg.add_message_type<fair_share_report_msg>("exa.fair_share_report_msg");
  cfg.add_message_type<fair_share_answer_msg>("exa.fair_share_answer_msg");
  cfg.add_message_type<node_leaving>("exa.node_leaving");
  cfg.add_message_type<models_reply>("exa.models_reply");
  cfg.add_message_type<status_reply>("exa.status_reply");
  cfg.add_message_type<join_identity>("exa.join_identity");
  cfg.add_message_type<hello_msg>("exa.hello");
  cfg.add_message_type<welcome_msg>("exa.welcome");
  cfg.add_message_type<running_replica>("exa.running_replica");
  cfg.add_message_type<cluster::cached_file>("exa.cached_file");
  cfg.add_message_type<cached_files_msg>("exa.cached_files");
  cfg.add_message_type<sim_load>("exa.sim_load");
  cfg.add_message_type<node_cached_file>("exa.node_cached_file");
  cfg.add_message_type<node_join>("exa.node_join");
  cfg.add_message_type<node_announce>("exa.node_announce");
  cfg.add_message_type<gateway_join>("exa.gateway_join");
  cfg.add_message_type<subscribe_msg>("exa.subscribe");
  cfg.add_message_type<std::vector<replica_load>>("exa.replica_loads");
  cfg.add_message_type<std::vector<std::pair<cluster::node_id, std::uint8_t>>>("exa.node_healths");
}

}  // namespace exa::actors
