#include "actors/gateway_bridge.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/cluster_metrics.hpp"
#include "actors/cluster_supervisor.hpp"
#include "metrics/prometheus.hpp"
#include "actors/messages.hpp"

namespace exa::actors {
namespace {

constexpr auto admin_timeout = std::chrono::seconds(30);

class bridge final : public api::gateway_backend {
 public:
  bridge(caf::actor_system& sys, std::shared_ptr<cluster_metrics> metrics)
      : sys_(sys), metrics_(std::move(metrics)) {}

  void generate(api::generate_request request, std::shared_ptr<api::stream_sink> sink) override {
    auto router = lookup(router_atom::value);
    if (!router) return refuse(*sink, {errc::unavailable, "the router is restarting; retry shortly"});
    caf::anon_send(router, route_request{std::move(request), std::move(sink)});
  }

  void cancel(const std::string& request_id) override {
    if (auto router = lookup(router_atom::value)) caf::anon_send(router, cancel_request{request_id});
  }

  void models(std::function<void(std::vector<api::model_info>)> done) override {
    ask<models_reply>(models_atom::value, [done](const models_reply& r) { done(r.models); },
                   [done](const error&) { done({}); });
  }

  void status(std::function<void(expected<api::cluster_status>)> done) override {
    // The controller knows placement and lifecycle; loads live in this
    // gateway's router, which hears them from the replicas.
    auto router = lookup(router_atom::value);
    ask<status_reply>(status_atom::value,
                      [this, router, done](const status_reply& r) { with_loads(router, r.status, done); },
                      [done](const error& e) { done(std::unexpected(e)); });
  }

  void metrics(std::function<void(std::string)> done) override;

  void ready(std::function<void(bool)> done) override {
    ask<bool>(ready_atom::value, [done](bool r) { done(r); }, [done](const error&) { done(false); });
  }

  void deploy(api::deploy_request request, std::function<void(expected<void>)> done) override {
    ask<ok_atom>(deploy_msg{std::move(request)}, [done](ok_atom) { done({}); },
                   [done](const error& e) { done(std::unexpected(e)); });
  }

  void drain(api::drain_request request, std::function<void(expected<api::drain_result>)> done) override {
    ask<drain_reply>(drain_msg{static_cast<std::uint8_t>(request.kind), request.id, request.deadline_ms, request.undrain},
                     [done](const drain_reply& r) { done(r.result); },
                     [done](const error& e) { done(std::unexpected(e)); });
  }

  void rollout(api::rollout_request request, std::function<void(expected<api::rollout_result>)> done) override {
    ask<rollout_reply>(rollout_msg{std::move(request)}, [done](const rollout_reply& r) { done(api::rollout_result{r.status}); },
                       [done](const error& e) { done(std::unexpected(e)); });
  }

  void undeploy(std::string name, std::function<void(expected<void>)> done) override {
    ask<ok_atom>(undeploy_msg{std::move(name)}, [done](ok_atom) { done({}); },
                   [done](const error& e) { done(std::unexpected(e)); });
  }

  void scale(std::string name, std::uint32_t replicas, std::function<void(expected<void>)> done) override {
    ask<ok_atom>(scale_msg{std::move(name), replicas}, [done](ok_atom) { done({}); },
                   [done](const error& e) { done(std::unexpected(e)); });
  }

 private:
  void with_loads(const caf::actor& router, api::cluster_status status,
                  std::function<void(expected<api::cluster_status>)> done) {
    if (!router) return done(std::move(status));
    sys_.spawn([router, status = std::move(status), done](caf::event_based_actor* self) mutable {
      self->request(router, std::chrono::seconds(5), loads_atom::value)
          .then(
              [=](const std::vector<replica_load>& loads) mutable {
                for (auto& rs : status.replicas)
                  for (const auto& l : loads)
                    if (std::to_string(l.id) == rs.id) {
                      rs.running = l.running;
                      rs.queued = l.queued;
                      rs.kv_used_tokens = l.kv_used_tokens;
                      rs.kv_capacity_tokens = l.kv_capacity_tokens;
                      rs.prefill_tokens_per_s = l.prefill_tokens_per_s;
                      rs.decode_tokens_per_s = l.decode_tokens_per_s;
                    }
                done(std::move(status));
              },
              [=](const caf::error&) mutable { done(std::move(status)); });
    });
  }

  caf::actor lookup(caf::atom_value name) {
    return caf::actor_cast<caf::actor>(sys_.registry().get(name));
  }

  static void refuse(api::stream_sink& sink, error e) {
    api::generate_result r;
    r.reason = api::finish_reason::error;
    r.err = std::move(e);
    sink.on_done(r);
  }

  // One short-lived actor per admin call: asks, calls back, quits.
  template <class Reply, class Msg, class OnValue, class OnError>
  void ask(Msg msg, OnValue on_value, OnError on_error) {
    auto controller = lookup(controller_atom::value);
    if (!controller) return on_error(error{errc::unavailable, "the controller is restarting; retry shortly"});
    sys_.spawn([controller, msg = std::move(msg), on_value, on_error](caf::event_based_actor* self) mutable {
      self->request(controller, admin_timeout, std::move(msg))
          .then([=](const Reply& x) { on_value(x); }, [=](const caf::error& e) { on_error(from_caf(e)); });
    });
  }

  caf::actor_system& sys_;
  std::shared_ptr<cluster_metrics> metrics_;
};

void bridge::metrics(std::function<void(std::string)> done) {
  // Every update is atomic, so rendering a snapshot needs no actor round trip.
  done(metrics_ ? metrics::render_prometheus(*metrics_->registry) : std::string());
}

}  // namespace

std::shared_ptr<api::gateway_backend> make_gateway_bridge(caf::actor_system& sys,
                                                          std::shared_ptr<cluster_metrics> metrics) {
  return std::make_shared<bridge>(sys, std::move(metrics));
}

}  // namespace exa::actors
