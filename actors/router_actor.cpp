#include "actors/router_actor.hpp"

#include "auth/api_keys.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <chrono>

#include "actors/cluster_metrics.hpp"
#include "actors/cluster_supervisor.hpp"
#include "actors/controller_actor.hpp"
#include "actors/request_actor.hpp"
#include "cluster/lifecycle.hpp"
#include "cluster/model_ref.hpp"
#include "cluster/rollout.hpp"
#include "model/llama_model.hpp"
#include "template/model_chat.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<router_state>*;
using cluster::replica_state;

std::uint64_t now_ns(self_ptr self) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count());
}

// Keeps the queue and in-flight gauges of a deployment current.
void update_gauges(self_ptr self, const std::string& model) {
  auto& st = self->state;
  if (!st.metrics) return;
  cluster_metrics::series(st.metrics->queue_depth, model)->set(st.admission->queued(model));
  std::size_t in_flight = 0;
  for (const auto& [id, r] : st.requests) in_flight += r.deployment == model;
  cluster_metrics::series(st.metrics->in_flight, model)->set(static_cast<double>(in_flight));
}

void count_refusal(self_ptr self, const std::string& model, const std::string& tenant) {
  // Client-chosen names must not mint label values: unknown models share one.
  if (self->state.metrics)
    cluster_metrics::series(self->state.metrics->requests, self->state.deployments.count(model) ? model : "unknown",
                            tenant, "refused")
        ->inc();
}

void refuse(const route_request& m, error e, std::uint32_t retry_after_ms = 0) {
  api::generate_result r;
  r.reason = api::finish_reason::error;
  r.err = std::move(e);
  r.retry_after_ms = retry_after_ms;
  m.sink->on_done(r);
}

bool is_starting(self_ptr self, const std::string& model) { return self->state.starting.count(model) != 0; }

// Model names a router that has not had the controller's list yet holds
// requests for (await_controller): beyond them it refuses at once.
constexpr std::size_t unheard_models_max = 64;

// The gateway opens the deployment's file itself (no pointer crosses from
// the controller). A simulated model (preset reference) has no tokenizer.
std::shared_ptr<const model::llama_model> open_tokenizer(const deployment_announce& d) {
  auto ref = cluster::parse_model_ref(d.model_file);
  if (!ref || ref->is_preset()) return nullptr;
  auto model = model::llama_model::load(d.model_file);
  if (!model) {
    spdlog::error("event=router_model_open_failed deployment={} model={} error=\"{}\" "
                  "detail=\"text prompts to it fail; token ids still work\"",
                  d.name, d.model_file, to_string(model.error()));
    return nullptr;
  }
  return *model;
}

// The deployment's chat template, compiled once per model file and
// template: the deployment's own (its announce carries the text) when it has
// one, else the gateway's --chat-template when given, else the file's own
// (ChatML when it has none). A template that does not compile fails chat
// requests with its error, not the deployment.
void open_chat(router_state::deployment_entry& entry, const deployment_announce& d, const std::string& override_spec) {
  entry.chat.reset();
  entry.chat_error.clear();
  auto ref = cluster::parse_model_ref(d.model_file);
  if (!ref || ref->is_preset()) {
    entry.chat_error = "it is simulated and has no tokenizer";
    return;
  }
  auto r = jinja::chat_renderer_for_file(d.model_file, override_spec, d.chat_template);
  if (!r) {
    entry.chat_error = r.error().message;
    spdlog::error("event=router_chat_template_failed deployment={} model={} error=\"{}\"", d.name, d.model_file,
                  to_string(r.error()));
    return;
  }
  spdlog::info("event=router_chat_template deployment={} template=\"{}\"", d.name, r->origin());
  entry.chat = std::make_shared<const jinja::chat_renderer>(std::move(*r));
}

using flush_samples_atom = caf::atom_constant<caf::atom("flushsmp")>;
constexpr std::size_t sample_batch_max = 4096;

// A uniform draw in [0, 1) from the router's seeded generator (splitmix64).
double draw(self_ptr self) {
  std::uint64_t z = (self->state.split_rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / 9007199254740992.0;
}

// The deployment a request's model name means: a plain name follows its
// traffic split (sticky per conversation); "NAME@1" is the plain NAME;
// other pinned names are deployments of their own and route only there.
// A deployment's places: in-flight requests its ready replicas take in all,
// and how many of those are free now.
struct places_count {
  std::uint32_t slots = 0;
  std::uint32_t free = 0;
};
places_count deployment_places(self_ptr self, const std::string& deployment);
bool has_places(self_ptr self, const std::string& deployment);

std::string resolve_model(self_ptr self, const api::generate_request& r) {
  auto& st = self->state;
  if (auto it = st.splits.find(r.model); it != st.splits.end()) {
    const auto& s = it->second;
    if (s.canary.empty() || !st.deployments.count(s.canary)) return s.stable;
    const bool to_canary = cluster::goes_to_new(s.canary_percent, r.user, draw(self));
    const std::string& chosen = to_canary ? s.canary : s.stable;
    const std::string& other = to_canary ? s.stable : s.canary;
    // This router's own view wins over a split that lags it: a side with no
    // ready replica (its last one draining) is passed over for one with some.
    if (!has_places(self, chosen) && st.deployments.count(other) && has_places(self, other)) return other;
    return chosen;
  }
  const auto v = cluster::split_version(r.model);
  if (v.version == "1") return std::string(v.base);
  return r.model;
}

// Whether a deployment is one side of a rollout now (its samples are wanted).
bool sampled(self_ptr self, const std::string& deployment) {
  for (const auto& [base, s] : self->state.splits)
    if (!s.canary.empty() && (s.stable == deployment || s.canary == deployment)) return true;
  return false;
}

using load_report_atom = caf::atom_constant<caf::atom("loadrep")>;

bool known(self_ptr self, const std::string& deployment) {
  return self->state.deployments.count(deployment) > 0;
}

constexpr std::size_t latency_window_max = 1024;
constexpr std::int64_t latency_window_ns = 60'000'000'000;

// Nearest-rank percentile of `v` (reordered); < 0 for none.
double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return -1;
  // The smallest sample with at least p of them at or below it: ceil(n p) - 1.
  const auto rank = static_cast<std::size_t>(std::ceil(static_cast<double>(v.size()) * p));
  const std::size_t k = std::min(v.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

void arm_load_report(self_ptr self) {
  auto& st = self->state;
  if (st.load_report_armed) return;
  st.load_report_armed = true;
  self->delayed_send(self, std::chrono::milliseconds(st.config.load_report_ms), load_report_atom::value);
}

// The load of every deployment as this router sees it, to the controller
// (the autoscaler's input, and the latency status shows); re-armed while
// there is any deployment.
void report_loads(self_ptr self) {
  auto& st = self->state;
  st.load_report_armed = false;
  std::map<std::string, deployment_load> out;
  for (const auto& [name, d] : st.deployments) out[name].deployment = name;
  if (out.empty()) {
    st.autoscale.clear();
    st.latencies.clear();
    return;
  }
  const auto now = static_cast<std::int64_t>(now_ns(self));
  for (auto it = st.latencies.begin(); it != st.latencies.end();) {
    auto& q = it->second;
    while (!q.empty() && now - q.front().at_ns > latency_window_ns) q.pop_front();
    if (q.empty() || !out.count(it->first)) {
      it = st.latencies.erase(it);
      continue;
    }
    std::vector<double> ttft, tpot;
    for (const auto& s : q) {
      ttft.push_back(s.ttft_ms);
      if (s.tpot_ms > 0) tpot.push_back(s.tpot_ms);
    }
    auto& l = out[it->first];
    l.recent_ttft_p50_ms = percentile(ttft, 0.5);
    l.recent_ttft_p99_ms = percentile(ttft, 0.99);
    l.recent_tpot_p50_ms = percentile(tpot, 0.5);
    l.recent_tpot_p99_ms = percentile(tpot, 0.99);
    ++it;
  }
  for (const auto& [id, w] : st.where) {
    auto o = out.find(w.slot.deployment);
    if (o == out.end()) continue;
    const auto* c = st.table->find(id);
    if (!c || !cluster::serves_requests(c->state)) continue;
    ++o->second.replicas;
    if (auto l = st.loads.find(id); l != st.loads.end()) {
      o->second.outstanding += l->second.running + l->second.queued;
      o->second.kv_used += l->second.kv_used_tokens;
      o->second.kv_capacity += l->second.kv_capacity_tokens;
    }
  }
  deployment_loads msg;
  for (auto& [name, l] : out) {
    if (auto w = st.autoscale.find(name); w != st.autoscale.end()) {
      l.arrivals = w->second.arrivals;
      l.ttft_p99_ms = percentile(w->second.ttft_ms, 0.99);
    }
    msg.loads.push_back(std::move(l));
  }
  st.autoscale.clear();
  if (auto c = caf::actor_cast<caf::actor>(self->home_system().registry().get(controller_atom::value)))
    self->send(c, std::move(msg));
  arm_load_report(self);
}

using quota_tick_atom = caf::atom_constant<caf::atom("quotatick")>;

// Weighted fair queuing across gateways: what this router's fair queues
// charged and their backlog to the controller, its global counters back
// onto the board (applied to the queues as they drain). Without an answer
// for the board's keep_ns the queues order by their own counters (logged
// once each way).
void report_fair_shares(self_ptr self, std::int64_t now, std::chrono::milliseconds period) {
  auto& st = self->state;
  auto board = st.config.fair_shares;
  if (board->expire(now))
    spdlog::warn("event=fair_share_fallback gateways={} reason=\"no fair-queue counters from the controller in time: "
                 "each deployment's waiting requests are ordered by this gateway's own counters\"",
                 board->gateways());
  auto c = caf::actor_cast<caf::actor>(self->home_system().registry().get(controller_atom::value));
  if (!c || st.fair_share_pending) return;  // the last report's timeout ends it
  std::map<std::string, std::vector<std::pair<std::string, std::size_t>>> backlog;
  for (const auto& [d, q] : st.pick_queues) backlog[d] = q.backlog();
  // Places here and who holds them (the caps across gateways).
  std::map<std::string, cluster::gateway_places> places;
  for (const auto& [d, held] : st.tenant_places) {
    auto& p = places[d];
    p.slots = deployment_places(self, d).slots;
    for (const auto& [t, n] : held)
      if (n > 0) p.held.emplace(t, n);
  }
  st.fair_share_pending = true;
  self->request(c, period, fair_share_report_msg{board->take_report(st.config.gateway_id, backlog, places)})
      .then(
          [=](const fair_share_answer_msg& m) {
            self->state.fair_share_pending = false;
            const bool first = !board->synced();
            const auto gateways = board->gateways();
            if (board->apply(m.answer, static_cast<std::int64_t>(now_ns(self))))
              spdlog::info("event=fair_share_restored gateways={} deployments={}", m.answer.gateways,
                           m.answer.deployments.size());
            // Who shares the counters: logged when it changes.
            if (first || board->gateways() != gateways)
              spdlog::info("event=fair_share_gateways gateways={}", board->gateways());
          },
          [=](const caf::error& e) {
            self->state.fair_share_pending = false;
            spdlog::debug("event=fair_share_report_failed error=\"{}\"", to_string(from_caf(e)));
          });
}

// Tenant limits shared across gateways: this gateway's demand since the last
// tick to the controller, its shares back onto the board. Without an answer
// in time the board keeps its shares for a while, then falls back to an even
// split (logged once each way).
void report_quota(self_ptr self) {
  auto& st = self->state;
  auto board = st.config.quotas;
  const auto period = std::chrono::milliseconds(st.config.quota_report_ms);
  self->delayed_send(self, period, quota_tick_atom::value);
  const auto now = static_cast<std::int64_t>(now_ns(self));
  if (st.config.fair_shares) report_fair_shares(self, now, period);
  if (!board) return;
  if (board->expire_shares(now))
    spdlog::warn("event=quota_fallback gateways={} reason=\"no shares from the controller in time: each tenant's "
                 "limits are divided evenly by the gateways\"",
                 board->gateways());
  auto demands = board->take_demand(static_cast<double>(now - st.quota_since_ns) / 1e9);
  st.quota_since_ns = now;
  auto c = caf::actor_cast<caf::actor>(self->home_system().registry().get(controller_atom::value));
  if (!c || st.quota_pending) return;  // the last report's timeout ends it
  st.quota_pending = true;
  self->request(c, period, quota_report{st.config.gateway_id, std::move(demands)})
      .then(
          [=](const quota_grant_msg& m) {
            self->state.quota_pending = false;
            if (board->apply(m.grant, static_cast<std::int64_t>(now_ns(self))))
              spdlog::info("event=quota_restored gateways={} tenants={}", m.grant.gateways, m.grant.shares.size());
          },
          [=](const caf::error& e) {
            self->state.quota_pending = false;
            spdlog::debug("event=quota_report_failed error=\"{}\"", to_string(from_caf(e)));
          });
}

void on_sample(self_ptr self, const request_sample& m) {
  auto& st = self->state;
  if (m.ok && known(self, m.deployment)) {
    auto& t = st.autoscale[m.deployment].ttft_ms;
    if (t.size() < sample_batch_max) t.push_back(m.ttft_ms);
    auto& q = st.latencies[m.deployment];
    q.push_back({static_cast<std::int64_t>(now_ns(self)), m.ttft_ms, m.tpot_ms});
    if (q.size() > latency_window_max) q.pop_front();
  }
  if (!sampled(self, m.deployment)) return;
  auto& batch = st.samples[m.deployment];
  batch.deployment = m.deployment;
  if (batch.ttft_ms.size() + batch.failures >= sample_batch_max) return;  // the controller is behind: drop, bounded
  if (m.ok) {
    batch.ttft_ms.push_back(m.ttft_ms);
    batch.tpot_ms.push_back(m.tpot_ms);
  } else {
    ++batch.failures;
  }
  if (!st.samples_flush_due) {
    st.samples_flush_due = true;
    self->delayed_send(self, std::chrono::milliseconds(250), flush_samples_atom::value);
  }
}

void flush_samples(self_ptr self) {
  auto& st = self->state;
  st.samples_flush_due = false;
  auto batches = std::move(st.samples);
  st.samples.clear();
  auto c = caf::actor_cast<caf::actor>(self->home_system().registry().get(controller_atom::value));
  if (!c) return;  // no controller to judge: the samples are of no use later either
  for (auto& [d, b] : batches) self->send(c, std::move(b));
}

void on_route(self_ptr self, const route_request& m) {
  auto& st = self->state;
  auto dep = st.deployments.find(m.request.model);
  // Another tenant's deployment is answered exactly like one that does not exist.
  if (dep != st.deployments.end() && !auth::visible_to(m.request.tenant, dep->second.info.tenant)) dep = st.deployments.end();
  const bool hidden = dep == st.deployments.end() && st.deployments.count(m.request.model) > 0;
  if (dep == st.deployments.end() && !hidden && !is_starting(self, m.request.model) && !st.view_complete) {
    // The controller's list has not come yet: wait for it as for a starting
    // deployment. Bounded: so many unheard-of names are refused at once.
    if (st.starting.size() >= unheard_models_max)
      return refuse(m, {errc::unavailable, "model '" + m.request.model +
                                               "' is not known yet: this gateway has not heard from the controller"});
    st.starting.insert(m.request.model);
  }
  if (dep == st.deployments.end() && !hidden && is_starting(self, m.request.model)) {
    auto& waiting = st.waiting_for_start[m.request.model];
    if (waiting.size() >= st.config.admission.queued_per_model_max)
      return refuse(m, {errc::overloaded, "model '" + m.request.model + "' is starting and its queue is full"});
    if (waiting.empty())
      self->delayed_send(self, std::chrono::milliseconds(st.config.request_deadline_ms), start_timeout{m.request.model});
    waiting.push_back(m);
    return;
  }
  if (dep == st.deployments.end()) {
    std::string known;
    for (const auto& [name, d] : st.deployments)
      if (auth::visible_to(m.request.tenant, d.info.tenant)) known += (known.empty() ? "" : ", ") + name;
    count_refusal(self, m.request.model, m.request.tenant);
    return refuse(m, {errc::not_found, "unknown model '" + m.request.model + "'" +
                                           (known.empty() ? std::string(" (nothing is deployed)") : " (serving: " + known + ")")});
  }
  if (st.cold.count(m.request.model) || st.waking.count(m.request.model)) {
    // Scaled to zero: the first request wakes it, and every request waits
    // for its first replica (bounded by the queue limit and the deadline).
    auto& waiting = st.waiting_for_start[m.request.model];
    if (waiting.size() >= st.config.admission.queued_per_model_max)
      return refuse(m, {errc::overloaded, "model '" + m.request.model + "' is waking up and its queue is full"});
    if (waiting.empty())
      self->delayed_send(self, std::chrono::milliseconds(st.config.request_deadline_ms), start_timeout{m.request.model});
    waiting.push_back(m);
    if (st.waking.insert(m.request.model).second) {
      spdlog::info("event=deployment_wake_requested deployment={} request_id={}", m.request.model, m.request.request_id);
      if (auto c = caf::actor_cast<caf::actor>(self->home_system().registry().get(controller_atom::value)))
        self->send(c, wake_deployment{m.request.model});
    }
    return;
  }
  if (st.requests.count(m.request.request_id))
    return refuse(m, {errc::invalid_argument, "request id '" + m.request.request_id + "' is already in flight"});
  auto ticket = st.admission->try_admit(m.request.model, now_ns(self));
  if (!ticket) {
    count_refusal(self, m.request.model, m.request.tenant);
    return refuse(m, ticket.error(), st.admission->retry_after_ms(m.request.model, now_ns(self)));
  }
  request_context rc;
  rc.number = st.next_request_number++;
  rc.request = m.request;
  rc.sink = m.sink;
  rc.model = dep->second.model;
  rc.chat = dep->second.chat;
  rc.chat_error = dep->second.chat_error;
  rc.vocab_size = dep->second.info.vocab_size;
  rc.context_length = dep->second.info.context_length;
  rc.router = caf::actor_cast<caf::actor>(self);
  rc.deadline_ms = st.config.request_deadline_ms;
  rc.max_attempts = st.config.max_attempts;
  rc.submit_timeout_ms = st.config.submit_timeout_ms;
  rc.retry_backoff_ms = st.config.retry_backoff_ms;
  rc.effective_deadline_ms = m.request.deadline_ms ? m.request.deadline_ms : st.config.request_deadline_ms;
  rc.metrics = st.metrics;
  rc.prefix_block_tokens = st.table->prefix_block_tokens(m.request.model);
  const std::uint32_t deadline_ms = m.request.deadline_ms ? m.request.deadline_ms : st.config.request_deadline_ms;
  auto actor = self->spawn(request_actor, std::move(rc));
  self->monitor(actor);
  st.request_ids[actor.address()] = m.request.request_id;
  st.tenant_seen_ns[m.request.model][m.request.tenant] = static_cast<std::int64_t>(now_ns(self));
  auto priority = cluster::priority_class::interactive;
  if (!m.request.priority.empty())
    if (auto p = cluster::parse_priority_class(m.request.priority)) priority = *p;
  st.requests[m.request.request_id] = {actor,
                                       *ticket,
                                       m.request.model,
                                       static_cast<std::int64_t>(now_ns(self)) + std::int64_t{deadline_ms} * 1000000,
                                       false,
                                       m.request.tenant,
                                       priority,
                                       false,
                                       m.request.tenant_weight > 0 ? m.request.tenant_weight : 1.0};
  update_gauges(self, m.request.model);
}

places_count deployment_places(self_ptr self, const std::string& deployment) {
  auto& st = self->state;
  places_count out;
  const auto per_replica = st.config.admission.in_flight_per_replica_max;
  for (const auto& [id, w] : st.where) {
    if (w.slot.deployment != deployment) continue;
    const auto* c = st.table->find(id);
    if (!c || (c->state != replica_state::ready && c->state != replica_state::serving)) continue;
    out.slots += per_replica;
    const auto used = st.admission->in_flight(id);
    out.free += used < per_replica ? per_replica - used : 0;
  }
  return out;
}

bool has_places(self_ptr self, const std::string& deployment) { return deployment_places(self, deployment).slots > 0; }

// Whether `tenant` holds its share of the deployment's `slots` places while
// other tenants are active there (tenant_slot_limit).
bool tenant_at_share(self_ptr self, const std::string& deployment, const std::string& tenant, std::uint32_t slots) {
  auto& st = self->state;
  if (!st.config.fair_across_tenants) return false;
  const auto now = static_cast<std::int64_t>(now_ns(self));
  const auto window = std::int64_t{st.config.tenant_active_window_ms} * 1000000;
  auto& seen = st.tenant_seen_ns[deployment];
  const auto& places = st.tenant_places[deployment];
  std::uint32_t others = 0;
  for (auto it = seen.begin(); it != seen.end();) {
    const auto held = places.find(it->first);
    const bool busy = held != places.end() && held->second > 0;
    if (!busy && now - it->second > window) {  // gone quiet: forget it
      it = seen.erase(it);
      continue;
    }
    if (it->first != tenant) ++others;
    ++it;
  }
  if (others == 0) return false;
  const auto held = places.find(tenant);
  const std::uint32_t mine = held == places.end() ? 0 : held->second;
  // Below its share of all the gateways' places (a tenant flooding another
  // gateway holds that one's): not held to this gateway's cap.
  if (st.config.fair_shares)
    if (const auto e = st.config.fair_shares->places(deployment, tenant);
        e && cluster::below_share_of_all_places(mine, slots, others + 1, *e))
      return false;
  return mine >= cluster::tenant_slot_limit(slots, others, st.config.tenant_headroom_slots);
}

// Picks a replica for the request that sent `m` and moves its place from
// the queue onto it. overloaded: every replica is at its in-flight limit,
// or the request's tenant holds its share while others are active.
expected<picked_replica> pick_now(self_ptr self, const pick_replica& m, const caf::actor_addr& requester) {
  auto& st = self->state;
  // Removed while the request waited (a version a rollout dropped, an
  // undeploy): it ends now with not_found instead of waiting out its deadline.
  if (!st.deployments.count(m.deployment) && !st.starting.count(m.deployment))
    return make_error(errc::not_found, "model '" + m.deployment + "' is not deployed (any more)");
  // The tenant's share is checked before route(), which charges the chosen
  // replica with the request until its next load report.
  const auto rid = st.request_ids.find(requester);
  if (rid != st.request_ids.end()) {
    auto& entry = st.requests[rid->second];
    if (!entry.dispatched && st.config.fair_across_tenants &&
        tenant_at_share(self, entry.deployment, entry.tenant, deployment_places(self, entry.deployment).slots))
      return make_error(errc::overloaded, "tenant '" + entry.tenant + "' holds its share of '" + entry.deployment +
                                              "' while other tenants wait");
  }
  // A gateway of a region passes over the replicas of other regions while
  // one of its own can serve; route() takes them as the last resort.
  auto exclude = m.exclude;
  if (!st.config.region.empty()) {
    auto cached = st.outside_region.find(m.deployment);
    if (cached == st.outside_region.end()) {
      std::vector<std::pair<cluster::replica_id, cluster::node_id>> members;
      for (const auto& [id, w] : st.where)
        if (w.slot.deployment == m.deployment) members.emplace_back(id, w.node);
      cached = st.outside_region
                   .emplace(m.deployment, cluster::outside_region(st.config.region, members, st.node_regions))
                   .first;
    }
    exclude.insert(exclude.end(), cached->second.begin(), cached->second.end());
  }
  cluster::request_cost cost{m.prompt_tokens, m.max_tokens};
  cost.prefix_block_tokens = m.prefix_block_tokens;
  cost.prefix_hashes = m.prefix_hashes;
  auto chosen = st.table->route(m.deployment, "", cost, exclude);
  if (!chosen) return std::unexpected(chosen.error());
  const auto id = (*chosen)->id;
  const auto epoch = (*chosen)->epoch;
  const auto handle = st.replicas.find(id);
  if (handle == st.replicas.end() || !handle->second)
    return make_error(errc::unavailable, "replica " + std::to_string(id) + " has no live actor");
  if (rid != st.request_ids.end()) {
    auto& entry = st.requests[rid->second];
    // An adopted request (admitted by a crashed predecessor) has no ticket here.
    if (entry.ticket.id != 0)
      if (auto ok = st.admission->try_dispatch(entry.ticket, id, now_ns(self)); !ok) return std::unexpected(ok.error());
    if (!entry.dispatched) {
      entry.dispatched = true;
      ++st.tenant_places[entry.deployment][entry.tenant];
    }
    update_gauges(self, entry.deployment);
    // Every request served counts toward its tenant's counter across
    // gateways, also one that found a free place without waiting.
    if (st.config.fair_shares && st.config.fair_across_tenants)
      st.config.fair_shares->note_charged(
          m.deployment, entry.tenant, static_cast<double>(std::uint64_t{m.prompt_tokens} + m.max_tokens) / entry.weight);
  }
  return picked_replica{id, epoch, handle->second};
}

// Serves a deployment's waiting picks in fair order while there is room.
void drain_picks(self_ptr self, const std::string& deployment) {
  auto& st = self->state;
  auto q = st.pick_queues.find(deployment);
  if (q == st.pick_queues.end()) return;
  if (st.config.fair_shares) st.config.fair_shares->apply_to(deployment, q->second);
  for (;;) {
    // Nothing to try while every place is taken: route() would charge a
    // replica for a request it cannot take.
    const auto places = deployment_places(self, deployment);
    if (places.free == 0) break;
    // A tenant at its share waits without holding up the others.
    const auto eligible = [&](std::string_view tenant) {
      return !tenant_at_share(self, deployment, std::string(tenant), places.slots);
    };
    const auto next = q->second.peek_if(eligible);
    if (!next) break;
    auto h = st.held_picks.find(*next);
    if (h == st.held_picks.end()) {  // cannot happen; do not spin on it
      q->second.remove(*next);
      continue;
    }
    auto r = pick_now(self, h->second.pick, h->second.requester);
    if (!r && r.error().code == errc::overloaded) break;  // still full: the head keeps its turn
    q->second.pop(*next);
    if (r)
      h->second.promise.deliver(*r);
    else
      h->second.promise.deliver(to_caf(r.error()));
    st.held_picks.erase(h);
  }
  if (q->second.empty()) st.pick_queues.erase(q);
}

// Drops held picks past their hold (answered overloaded: the request backs
// off and asks again) or whose request is gone.
void expire_picks(self_ptr self, std::int64_t now) {
  auto& st = self->state;
  for (auto it = st.held_picks.begin(); it != st.held_picks.end();) {
    const bool gone = st.request_ids.count(it->second.requester) == 0;
    if (!gone && it->second.until_ns > now) {
      ++it;
      continue;
    }
    if (auto q = st.pick_queues.find(it->second.pick.deployment); q != st.pick_queues.end()) {
      q->second.remove(it->first);
      if (q->second.empty()) st.pick_queues.erase(q);
    }
    // Answered even when its request looks gone: a requester that is still
    // waiting must never wait out its own timeout for nothing.
    it->second.promise.deliver(to_caf({errc::overloaded, "every replica of '" + it->second.pick.deployment +
                                                             "' stayed at its in-flight limit"}));
    it = st.held_picks.erase(it);
  }
}

caf::result<picked_replica> on_pick(self_ptr self, const pick_replica& m) {
  auto& st = self->state;
  const auto requester = caf::actor_cast<caf::actor_addr>(self->current_sender());
  // Others already wait for this deployment: take a place among them
  // rather than overtake them.
  const bool others_wait = st.pick_queues.count(m.deployment) > 0;
  if (!others_wait) {
    auto r = pick_now(self, m, requester);
    if (r) return *r;
    if (r.error().code != errc::overloaded) return to_caf(r.error());
  }
  std::string tenant;
  auto priority = cluster::priority_class::interactive;
  double weight = 1;
  if (auto rid = st.request_ids.find(requester); rid != st.request_ids.end()) {
    const auto& entry = st.requests[rid->second];
    if (st.config.fair_across_tenants) {
      tenant = entry.tenant;
      weight = entry.weight;
    }
    priority = entry.priority;
  }
  // Waiting counts as active: the headroom keeps protecting this tenant.
  if (!tenant.empty() || st.config.fair_across_tenants)
    st.tenant_seen_ns[m.deployment][tenant] = static_cast<std::int64_t>(now_ns(self));
  auto& q = st.pick_queues.try_emplace(m.deployment, st.config.fair_queue).first->second;
  const auto hold = st.next_hold++;
  if (auto ok = q.push(hold, tenant, priority, std::uint64_t{m.prompt_tokens} + m.max_tokens, weight); !ok) {
    if (q.empty()) st.pick_queues.erase(m.deployment);
    return to_caf(ok.error());
  }
  // Its counter across gateways: no credit for what it was served elsewhere.
  if (st.config.fair_shares) q.raise_counter(tenant, st.config.fair_shares->counter(m.deployment, tenant));
  auto promise = self->make_response_promise();
  st.held_picks[hold] = {promise, m, requester,
                         static_cast<std::int64_t>(now_ns(self)) + std::int64_t{st.config.pick_hold_ms} * 1000000};
  if (others_wait) drain_picks(self, m.deployment);
  return caf::delegated<picked_replica>();
}

// A replica of a slot that has moved on: it stops itself when told.
bool fence_if_stale(self_ptr self, const cluster::slot_ref& slot, cluster::epoch_t epoch, const caf::actor& replica) {
  const auto current = self->state.table->slot_epoch(slot);
  if (epoch >= current || !replica) return false;
  self->send(replica, fence_notice{{fence_slot{slot.deployment, slot.index, current}}});
  return true;
}

// A woken deployment's first replica is ready: what waited for it is routed.
void wake_done(self_ptr self, const std::string& deployment, replica_state state) {
  auto& st = self->state;
  if (!cluster::accepts_requests(state) || st.cold.count(deployment) || !st.waking.erase(deployment)) return;
  auto waiting = std::move(st.waiting_for_start[deployment]);
  st.waiting_for_start.erase(deployment);
  spdlog::info("event=deployment_woken deployment={} waiting={}", deployment, waiting.size());
  for (const auto& m : waiting) on_route(self, m);
}

void on_replica_event(self_ptr self, const replica_event& ev) {
  auto& st = self->state;
  const auto state = static_cast<replica_state>(ev.state);
  if (cluster::is_terminal(state)) {
    (void)st.table->remove(ev.id);
    st.replicas.erase(ev.id);
    st.loads.erase(ev.id);
    if (st.where.erase(ev.id)) st.outside_region.erase(ev.deployment);
    return;
  }
  if (fence_if_stale(self, {ev.deployment, ev.slot}, ev.epoch, ev.handle)) return;
  if (auto w = st.where.find(ev.id); w == st.where.end() || w->second.node != ev.node)
    st.outside_region.erase(ev.deployment);
  st.where[ev.id] = {ev.node, {ev.deployment, ev.slot}, ev.epoch};
  if (ev.handle && st.replicas[ev.id] != ev.handle) {
    st.replicas[ev.id] = ev.handle;
    self->monitor(ev.handle);
  }
  if (!st.table->find(ev.id)) {
    cluster::routing_candidate c;
    c.id = ev.id;
    c.slot = {ev.deployment, ev.slot};
    c.epoch = ev.epoch;
    c.model = ev.deployment;
    c.state = state;
    const bool suspect = st.suspect_nodes.count(ev.node) != 0;
    if (auto ok = st.table->upsert(std::move(c)); !ok)
      spdlog::warn("event=router_upsert_refused replica={} error=\"{}\"", ev.id, to_string(ok.error()));
    else if (suspect)
      (void)st.table->set_suspect(ev.id, true);
    wake_done(self, ev.deployment, state);
    return;
  }
  (void)st.table->set_state(ev.id, state);
  wake_done(self, ev.deployment, state);
}

void on_down(self_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (auto it = st.request_ids.find(dm.source); it != st.request_ids.end()) {
    auto req = st.requests.find(it->second);
    if (req != st.requests.end()) {
      if (req->second.ticket.id != 0) (void)st.admission->release(req->second.ticket, now_ns(self));
      if (req->second.dispatched) {
        auto& places = st.tenant_places[req->second.deployment];
        if (auto p = places.find(req->second.tenant); p != places.end() && --p->second == 0) places.erase(p);
      }
      const std::string model = req->second.deployment;
      st.requests.erase(req);
      update_gauges(self, model);
      st.request_ids.erase(it);
      // A place on a replica freed: the next waiting pick, in fair order.
      expire_picks(self, static_cast<std::int64_t>(now_ns(self)));
      drain_picks(self, model);
      return;
    }
    st.request_ids.erase(it);
    return;
  }
  for (auto it = st.replicas.begin(); it != st.replicas.end(); ++it)
    if (it->second.address() == dm.source) {  // crashed: stop routing to it now
      (void)st.table->set_state(it->first, replica_state::failed);
      if (auto w = st.where.find(it->first); w != st.where.end()) {
        st.outside_region.erase(w->second.slot.deployment);
        st.where.erase(w);
      }
      st.replicas.erase(it);
      return;
    }
}

}  // namespace

caf::behavior router_actor(caf::stateful_actor<router_state>* self, router_config config,
                           std::shared_ptr<cluster_metrics> metrics) {
  auto& st = self->state;
  st.config = std::move(config);
  st.metrics = std::move(metrics);
  st.starting.insert(st.config.starting.begin(), st.config.starting.end());
  st.view_complete = !st.config.await_controller;
  auto table = cluster::replica_table::create(st.config.table);
  auto admission = cluster::admission_controller::create(st.config.admission);
  if (!table || !admission) {
    const error e = !table ? table.error() : admission.error();
    spdlog::error("event=router_start_failed error=\"{}\"", to_string(e));
    self->quit(to_caf(e));
    return {};
  }
  st.table.emplace(std::move(*table));
  st.next_request_number = st.config.request_number_base + 1;
  st.errors.emplace(st.config.error_rate);
  st.admission.emplace(std::move(*admission));
  self->set_down_handler([=](const caf::down_msg& dm) { on_down(self, dm); });
  self->delayed_send(self, std::chrono::milliseconds(st.config.deadline_sweep_ms), deadline_atom::value);
  if (st.config.quotas || st.config.fair_shares) {
    st.quota_since_ns = static_cast<std::int64_t>(now_ns(self));
    self->send(self, quota_tick_atom::value);  // the first report at once: shares before the first flood
  }
  return {
      [=](const deployment_announce& d) {
        auto& s = self->state;
        auto& entry = s.deployments[d.name];
        const bool file_changed = entry.info.model_file != d.model_file || !entry.model;
        if (file_changed) entry.model = open_tokenizer(d);
        if (file_changed || entry.info.chat_template != d.chat_template) open_chat(entry, d, s.config.chat_template);
        entry.info = d;
        arm_load_report(self);
        if (auto ok = s.table->set_policy(d.name, d.routing, d.prefix_slack_tokens, d.prefix_slack_ratio,
                                               d.prefix_slack_s);
            !ok)
          spdlog::warn("event=routing_policy_refused deployment={} error=\"{}\"", d.name, to_string(ok.error()));
        s.starting.erase(d.name);
        auto waiting = std::move(s.waiting_for_start[d.name]);
        s.waiting_for_start.erase(d.name);
        for (const auto& m : waiting) on_route(self, m);
      },
      [=](const deployment_cold& d) {
        auto& s = self->state;
        if (d.cold) s.cold.insert(d.name);
        else s.cold.erase(d.name);  // still waking (if woken) until its first replica is ready
      },
      [=](const deployment_starting& d) {
        if (!self->state.deployments.count(d.name)) self->state.starting.insert(d.name);
      },
      [=](const deployment_set& m) {
        auto& s = self->state;
        s.view_complete = true;  // from now on an unknown model is refused at once
        const std::set<std::string> known(m.names.begin(), m.names.end());
        std::vector<std::string> gone;
        for (const auto& [name, d] : s.deployments)
          if (!known.count(name)) gone.push_back(name);
        for (const auto& name : gone) {
          spdlog::info("event=router_deployment_forgotten deployment={} reason=\"the controller no longer has it\"", name);
          self->send(self, deployment_removed{name});
        }
        // Expected to start but not the controller's (any more): its waiting
        // requests are answered now (not found) instead of at their deadline.
        for (auto it = s.starting.begin(); it != s.starting.end();) {
          if (known.count(*it)) {
            ++it;
            continue;
          }
          auto waiting = std::move(s.waiting_for_start[*it]);
          s.waiting_for_start.erase(*it);
          it = s.starting.erase(it);
          for (const auto& w : waiting) on_route(self, w);
        }
      },
      [=](const deployment_removed& d) {
        auto& s = self->state;
        s.deployments.erase(d.name);
        s.cold.erase(d.name);
        s.waking.erase(d.name);
        s.starting.erase(d.name);
        for (const auto& m : s.waiting_for_start[d.name])
          refuse(m, {errc::unavailable, "deployment '" + d.name + "' could not start"});
        s.waiting_for_start.erase(d.name);
      },
      [=](const start_timeout& t) {
        auto& s = self->state;
        if (!s.waiting_for_start.count(t.deployment)) return;  // woken and routed meanwhile
        s.waking.erase(t.deployment);
        for (const auto& m : s.waiting_for_start[t.deployment])
          refuse(m, {errc::deadline_exceeded, "deployment '" + t.deployment + "' did not start in time"});
        s.waiting_for_start.erase(t.deployment);
      },
      [=](const replica_event& ev) { on_replica_event(self, ev); },
      [=](const node_health_msg& m) {
        // A suspect node's replicas finish what they have and get nothing new.
        auto& s = self->state;
        const bool suspect = static_cast<cluster::node_health>(m.health) != cluster::node_health::healthy;
        if (suspect) s.suspect_nodes.insert(m.node);
        else s.suspect_nodes.erase(m.node);
        for (const auto& [id, w] : s.where)
          if (w.node == m.node) (void)s.table->set_suspect(id, suspect);
      },
      [=](const replica_outcome& o) {
        auto& s = self->state;
        const auto now = static_cast<std::int64_t>(now_ns(self));
        if (!s.errors->record(o.replica, o.ok, now) || s.error_suspects.count(o.replica)) return;
        // Failing too many requests: no new ones for a window, then a retry.
        s.error_suspects.insert(o.replica);
        (void)s.table->set_suspect(o.replica, true);
        spdlog::warn("event=replica_suspect_errors replica={} error_rate={:.2f}", o.replica,
                     s.errors->error_rate(o.replica, now));
        cluster::event e;
        e.kind = cluster::event_kind::fault_detected;
        e.replica = o.replica;
        if (auto w = s.where.find(o.replica); w != s.where.end()) e.node = w->second.node;
        e.detail = "error_rate";
        log_event(self, s.config.hooks, e);
        self->delayed_send(self, std::chrono::duration_cast<std::chrono::milliseconds>(s.config.error_rate.window),
                           unsuspect_replica{o.replica});
      },
      [=](const unsuspect_replica& u) {
        auto& s = self->state;
        s.error_suspects.erase(u.replica);
        s.errors->forget(u.replica);
        const auto w = s.where.find(u.replica);
        const bool node_suspect = w != s.where.end() && s.suspect_nodes.count(w->second.node);
        if (!node_suspect) (void)s.table->set_suspect(u.replica, false);
      },
      [=](const fence_slot& f) {
        auto& s = self->state;
        if (auto ok = s.table->fence({f.deployment, f.slot}, f.epoch); !ok)
          spdlog::warn("event=fence_refused deployment={} slot={} epoch={} error=\"{}\"", f.deployment, f.slot,
                       f.epoch, to_string(ok.error()));
        // Tell the fenced replicas now if they can hear it.
        for (const auto& [id, w] : s.where)
          if (w.slot == cluster::slot_ref{f.deployment, f.slot} && w.epoch < f.epoch)
            if (auto h = s.replicas.find(id); h != s.replicas.end()) self->send(h->second, fence_notice{{f}});
      },
      [=](const replica_load& l) {
        auto& s = self->state;
        if (auto w = s.where.find(l.id); w != s.where.end()) {
          auto h = s.replicas.find(l.id);
          if (fence_if_stale(self, w->second.slot, w->second.epoch, h == s.replicas.end() ? caf::actor{} : h->second))
            return;
        }
        cluster::load_report r;
        r.outstanding_requests = l.running + l.queued;
        r.outstanding_tokens = l.outstanding_tokens;
        r.decode_tokens_per_s = l.decode_tokens_per_s;
        r.prefill_tokens_per_s = l.prefill_tokens_per_s;
        r.prefix_block_tokens = l.prefix_block_tokens;
        r.prefix_hashes = l.prefix_hashes;
        // The loads kept for status answers need no hashes.
        auto& kept = s.loads[l.id];
        kept = l;
        kept.prefix_hashes.clear();
        // KV use is exported by the replica's node, not here: every gateway
        // hears the same load reports, and an aggregate over gateways would
        // count each replica once per gateway.
        (void)s.table->update_load(l.id, r);
      },
      [=](const route_request& m) {
        auto resolved = resolve_model(self, m.request);
        if (known(self, resolved)) ++self->state.autoscale[resolved].arrivals;
        if (resolved == m.request.model) return on_route(self, m);
        route_request r = m;
        r.request.model = std::move(resolved);
        on_route(self, r);
      },
      [=](const traffic_split& m) {
        auto& s = self->state;
        spdlog::info("event=traffic_split deployment={} stable={} canary={} canary_percent={}", m.base, m.stable,
                     m.canary.empty() ? "-" : m.canary, m.canary_percent);
        if (m.base.empty()) s.splits.clear();  // a new controller starts from none
        else if (m.stable == m.base && m.canary.empty()) s.splits.erase(m.base);
        else s.splits[m.base] = m;
      },
      [=](const request_sample& m) { on_sample(self, m); },
      [=](const node_region& m) {
        self->state.node_regions[m.node] = m.region;
        self->state.outside_region.clear();
      },
      [=](flush_samples_atom) { flush_samples(self); },
      [=](load_report_atom) { report_loads(self); },
      [=](quota_tick_atom) { report_quota(self); },
      [=](deadline_atom) {
        // One sweep for every request's deadline.
        auto& s = self->state;
        const auto now = static_cast<std::int64_t>(now_ns(self));
        for (auto& [id, r] : s.requests)
          if (!r.expired && r.deadline_ns <= now) {
            r.expired = true;
            self->send(r.actor, deadline_atom::value);
          }
        expire_picks(self, now);
        // Capacity may have come without a request ending (a replica became
        // ready): try every deployment with waiters.
        std::vector<std::string> waiting;
        for (const auto& [d, q] : s.pick_queues) waiting.push_back(d);
        for (const auto& d : waiting) drain_picks(self, d);
        self->delayed_send(self, std::chrono::milliseconds(s.config.deadline_sweep_ms), deadline_atom::value);
      },
      [=](const pick_replica& m) { return on_pick(self, m); },
      [=](const adopt_request& m) {
        auto& s = self->state;
        auto actor = caf::actor_cast<caf::actor>(self->current_sender());
        if (!actor || s.requests.count(m.request_id)) return;
        self->monitor(actor);
        s.request_ids[actor.address()] = m.request_id;
        s.requests[m.request_id] = {actor, cluster::admission_ticket{}, m.deployment, m.deadline_ns, false};
        spdlog::info("event=router_adopted_request request={}", m.request_id);
      },
      [=](const cancel_request& m) {
        auto it = self->state.requests.find(m.request_id);
        if (it != self->state.requests.end()) self->send(it->second.actor, m);
      },
      [=](loads_atom) {
        std::vector<replica_load> out;
        for (const auto& [id, l] : self->state.loads) out.push_back(l);
        return out;
      },
  };
}

}  // namespace exa::actors
