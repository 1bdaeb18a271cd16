#include "actors/replica_actor.hpp"

#include "common/assert.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "actors/cluster_metrics.hpp"
#include "actors/device_actor.hpp"
#include "common/assert.hpp"
#include "cluster/model_ref.hpp"
#include "engine/null_engine.hpp"
#include "engine/sim_engine.hpp"
#include "model/llama_model.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<replica_actor_state>*;
using cluster::replica_state;
using probe_atom = caf::atom_constant<caf::atom("probe")>;

std::int64_t now_ns(self_ptr self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

// The node's gauge of its replicas by state.
void count_state(const replica_actor_state& st, replica_state state, int delta) {
  if (!st.ctx.metrics) return;
  cluster_metrics::series(st.ctx.metrics->node_replicas, std::to_string(st.ctx.node), cluster::to_string(state))
      ->add(delta);
}

void announce_state(self_ptr self, const std::string& reason);

// Moves to `to` if the lifecycle allows it and tells the controller and
// router. Returns false (and changes nothing) for an invalid move.
bool move_to(self_ptr self, replica_state to, const std::string& reason = {}) {
  auto& st = self->state;
  if (st.state == to) return true;
  if (auto ok = cluster::transition(st.state, to); !ok) {
    spdlog::warn("event=replica_transition_refused replica={} deployment={} slot={} error=\"{}\"", st.ctx.spec.id,
                 st.ctx.spec.deployment, st.ctx.spec.slot, ok.error().message);
    return false;
  }
  // ready <-> serving flips with every request: debug, the rest is info.
  const bool routine = (st.state == replica_state::ready && to == replica_state::serving) ||
                       (st.state == replica_state::serving && to == replica_state::ready);
  spdlog::log(routine ? spdlog::level::debug : spdlog::level::info,
               "event=replica_state replica={} deployment={} slot={} epoch={} node={} device={} from={} to={}{}{}",
               st.ctx.spec.id, st.ctx.spec.deployment, st.ctx.spec.slot, st.ctx.spec.epoch, st.ctx.node,
               st.ctx.spec.device, cluster::to_string(st.state), cluster::to_string(to),
               reason.empty() ? "" : " reason=", reason.empty() ? "" : "\"" + reason + "\"");
  count_state(st, st.state, -1);
  count_state(st, to, +1);
  st.state = to;
  announce_state(self, reason);
  return true;
}

// Tells the controller and the router (and the event log) the state it is in.
void announce_state(self_ptr self, const std::string& reason) {
  auto& st = self->state;
  const auto to = st.state;
  const replica_event ev{st.ctx.spec.id, st.ctx.spec.deployment, st.ctx.spec.slot, st.ctx.spec.epoch, st.ctx.node,
                         st.ctx.spec.device, static_cast<std::uint8_t>(to), reason, caf::actor_cast<caf::actor>(self)};
  control_send(self, st.ctx.hooks, st.ctx.node, cluster::message_class::control, st.ctx.controller, ev);
  control_send(self, st.ctx.hooks, st.ctx.node, cluster::message_class::control, st.ctx.router, ev);
  cluster::event e;
  e.kind = cluster::event_kind::replica_state;
  e.replica = st.ctx.spec.id;
  e.deployment = st.ctx.spec.deployment;
  e.slot = st.ctx.spec.slot;
  e.epoch = st.ctx.spec.epoch;
  e.node = st.ctx.node;
  e.device = st.ctx.spec.device;
  e.detail = std::string(cluster::to_string(to));
  log_event(self, st.ctx.hooks, e);
}

// Crashes on purpose: the node (its supervisor) decides between a restart
// and giving the slot up, and reports either.
void fail(self_ptr self, const std::string& reason) {
  auto& st = self->state;
  spdlog::error("event=replica_crash replica={} deployment={} slot={} node={} reason=\"{}\"", st.ctx.spec.id,
                st.ctx.spec.deployment, st.ctx.spec.slot, st.ctx.node, reason);
  self->quit(caf::make_error(caf::sec::runtime_error, reason));
}

// The deployment's prefix-cache counters grow by what the engine counted
// since the last export; the replica's cached-blocks gauge is set.
void export_prefix_stats(replica_actor_state& st, const engine::engine_stats& s) {
  if (!st.ctx.metrics) return;
  const auto& m = *st.ctx.metrics;
  // A counter grows by what the engine counted since the last export, so it
  // never goes backwards.
  const auto grow = [&](auto* family, std::uint64_t total, std::uint64_t& exported) {
    if (total <= exported) return;
    cluster_metrics::series(family, st.ctx.spec.deployment)->inc(static_cast<double>(total - exported));
    exported = total;
  };
  EXA_ASSERT_MSG(s.prefix_hit_tokens <= s.prefix_lookup_tokens, "prefix cache hits exceed lookups");
  grow(m.prefix_lookup_tokens, s.prefix_lookup_tokens, st.prefix_lookup_exported);
  grow(m.prefix_hit_tokens, s.prefix_hit_tokens, st.prefix_hit_exported);
  grow(m.prefix_evicted_blocks, s.prefix_evicted_blocks, st.prefix_evicted_exported);
  grow(m.prefix_evicted_miss_tokens, s.prefix_evicted_miss_tokens, st.prefix_evicted_miss_exported);
  cluster_metrics::series(m.prefix_cached_blocks, std::to_string(st.ctx.spec.id))
      ->set(static_cast<double>(s.prefix_cached_blocks));
  EXA_ASSERT_MSG(s.draft_accepted_tokens <= s.draft_proposed_tokens, "draft tokens accepted exceed those proposed");
  grow(m.draft_proposed_tokens, s.draft_proposed_tokens, st.draft_proposed_exported);
  grow(m.draft_accepted_tokens, s.draft_accepted_tokens, st.draft_accepted_exported);
  grow(m.stopped_steps, s.yielded_steps, st.stopped_steps_exported);
  grow(m.nonfinite_logits, s.nonfinite_logit_finishes, st.nonfinite_logits_exported);
}

void report_load(self_ptr self, bool force) {
  auto& st = self->state;
  const auto now = now_ns(self);
  if (!force && now - st.last_load_report_ns < std::int64_t{st.ctx.load_report_interval_ms} * 1000000) return;
  st.last_load_report_ns = now;
  replica_load load;
  load.id = st.ctx.spec.id;
  std::uint64_t outstanding = 0;
  // Work still ahead: tokens to generate, plus whole prompts not yet
  // prefilled (a long prompt is most of a request's cost before its first token).
  for (const auto& [id, r] : st.active)
    outstanding += r.max_tokens - std::min(r.max_tokens, r.generated) + (r.first_token_seen ? 0 : r.prompt_tokens);
  load.outstanding_tokens = outstanding;
  if (st.engine) {
    const auto s = st.engine->stats();
    load.running = s.running;
    load.queued = s.waiting;
    load.kv_capacity_tokens = s.kv_capacity_tokens;
    load.kv_used_tokens = s.kv_capacity_tokens - s.kv_free_tokens;
    export_prefix_stats(st, s);
  }
  if (st.ctx.metrics) {
    const auto id = std::to_string(st.ctx.spec.id);
    cluster_metrics::series(st.ctx.metrics->kv_used_tokens, id)->set(static_cast<double>(load.kv_used_tokens));
    cluster_metrics::series(st.ctx.metrics->kv_capacity_tokens, id)->set(static_cast<double>(load.kv_capacity_tokens));
  }
  load.decode_tokens_per_s = st.decode_tokens_per_s;
  load.prefill_tokens_per_s = st.prefill_tokens_per_s;
  // What the prefix cache holds, for prefix-aware routing: bounded, most
  // recently used first; nothing from engines without a prefix cache.
  if (st.engine && st.ctx.prefix_hashes_reported > 0) {
    auto summary = st.engine->cached_prefixes(st.ctx.prefix_hashes_reported);
    load.prefix_block_tokens = summary.block_tokens;
    load.prefix_hashes = std::move(summary.hashes);
  }
  control_send(self, st.ctx.hooks, st.ctx.node, cluster::message_class::control, st.ctx.router, load);
}

void maybe_step(self_ptr self);
bool lease_lapsed(self_ptr self);
void with_engine_probe(self_ptr self);

// Degraded when steps are slow or requests fail (runtime/cluster/degradation);
// recovered when they are not, as far as the detector can tell.
void judge_health(self_ptr self) {
  auto& st = self->state;
  if (!st.health) return;
  const bool routable = cluster::accepts_requests(st.state);
  if (!routable && st.state != replica_state::degraded) return;  // warming, draining: not judged
  const auto verdict = st.health->evaluate(now_ns(self));
  if (verdict == cluster::health_verdict::degrade && routable) {
    if (move_to(self, replica_state::degraded, st.health->reason())) {
      cluster::event e;  // for the chaos harness: a slow device is detected here
      e.kind = cluster::event_kind::fault_detected;
      e.replica = st.ctx.spec.id;
      e.node = st.ctx.node;
      e.device = st.ctx.spec.device;
      e.detail = "degraded";
      log_event(self, st.ctx.hooks, e);
      self->delayed_send(self, st.ctx.degradation.probe_interval, probe_atom::value);
    }
  } else if (verdict == cluster::health_verdict::recover && st.state == replica_state::degraded) {
    move_to(self, st.active.empty() ? replica_state::ready : replica_state::serving, st.health->reason());
  }
}

// While degraded: a tiny request through the engine now and then, so a
// replica the router passes over can still show it behaves again.
void on_probe(self_ptr self) {
  auto& st = self->state;
  if (st.state != replica_state::degraded || !st.health) return;
  self->delayed_send(self, st.ctx.degradation.probe_interval, probe_atom::value);
  if (st.probe_out || !st.health->probe_due(now_ns(self))) return;
  with_engine_probe(self);
}

void on_step_done(self_ptr self, const step_done& done) {
  auto& st = self->state;
  st.step_in_flight = false;
  st.step_out = false;
  // A step that was out while the node froze past its lease: its tokens
  // are not sent (the slot may be someone else's by now).
  if (lease_lapsed(self)) return;
  // An engine that failed for good (a tensor-parallel group whose
  // collective failed) serves nothing more: its requests resume elsewhere.
  if (auto f = st.engine->fault()) return fail(self, "engine failed: " + *f);
  const engine::step_result& r = *done.result;
  if (st.health) st.health->observe_step(static_cast<std::int64_t>(done.seconds * 1e9));
  // Speeds for the predictive router: exponentially weighted, per kind of step.
  if (done.seconds > 0) {
    constexpr double alpha = 0.2;
    if (r.prefill_tokens > 0) {
      const double tps = r.prefill_tokens / done.seconds;
      st.prefill_tokens_per_s = st.prefill_tokens_per_s == 0 ? tps : alpha * tps + (1 - alpha) * st.prefill_tokens_per_s;
    } else if (r.decode_tokens > 0) {
      const double tps = r.decode_tokens / done.seconds;
      st.decode_tokens_per_s = st.decode_tokens_per_s == 0 ? tps : alpha * tps + (1 - alpha) * st.decode_tokens_per_s;
    }
  }
  // Group each request's tokens into one message.
  std::map<std::uint64_t, token_msg> batches;
  for (const auto& t : r.tokens) {
    if (t.id == warmup_request_id) continue;
    auto& b = batches[t.id];
    if (b.tokens.empty()) {
      b.request = t.id;
      b.first_index = t.index;
    }
    b.tokens.push_back(t.token);
    if (t.logprobs) b.logprobs.push_back({t.logprobs->logprob, t.logprobs->top_ids, t.logprobs->top_logprobs});
  }
  for (auto& [id, msg] : batches) {
    auto it = st.active.find(id);
    if (it == st.active.end()) continue;
    it->second.generated += static_cast<std::uint32_t>(msg.tokens.size());
    it->second.first_token_seen = true;
    self->send(it->second.requester, std::move(msg));
  }
  for (const auto& f : r.finished) {
    if (f.id == warmup_request_id) {
      const bool nonfinite = f.reason == engine::finish_reason::nonfinite_logits;
      if (st.probe_out) {  // a probe of a degraded replica: it served, or its numbers are not finite
        st.probe_out = false;
        if (st.health) st.health->observe_request(nonfinite);
        continue;
      }
      // A model that cannot run four tokens to a finite logit is not fit to
      // serve (requests may end the same way): the replica does not become
      // ready; its supervisor restarts it, then gives the slot up.
      if (nonfinite)
        return fail(self, "warm-up: " + engine::nonfinite_logits_message(f.generated) +
                              " (exaserve check-model --model FILE finds non-finite weights, if that is the cause)");
      if (move_to(self, st.ctx.spec.standby ? replica_state::standby : replica_state::ready)) report_load(self, true);
      continue;
    }
    auto it = st.active.find(f.id);
    if (it == st.active.end()) continue;
    if (st.health) st.health->observe_request(false);
    self->send(it->second.requester,
               finish_msg{f.id, static_cast<std::uint8_t>(f.reason), f.generated, f.cached_tokens});
    self->demonitor(it->second.requester);
    st.active.erase(it);
  }
  // Run what waited for this step with stepping held off: each deferred
  // submit ends in maybe_step(), and a step started by the first one would
  // run on the device thread while the next one touches the engine here.
  // Holding off also batches every deferred request into the next step.
  auto deferred = std::move(st.deferred);
  st.deferred.clear();
  st.step_in_flight = true;
  for (auto& fn : deferred) fn();
  st.step_in_flight = false;
  if (st.state == replica_state::serving && st.active.empty()) move_to(self, replica_state::ready);
  judge_health(self);
  if (st.state == replica_state::draining && st.active.empty()) {
    move_to(self, replica_state::stopped, "drained");
    self->quit();
    return;
  }
  // Throttled while busy; but the report that says "idle" always goes, or
  // routers (and a draining gateway) would see the last busy load forever.
  report_load(self, st.active.empty() || (st.engine && st.engine->idle()));
  maybe_step(self);
}

// Whether the node's lease lapsed (a freeze or a cut outlasted it): then
// the slot may already be someone else's, so this replica stops now, before
// it serves anything, rather than when the node's own check comes round.
bool lease_lapsed(self_ptr self) {
  auto& st = self->state;
  if (!st.ctx.lease_until || clock_ns(self) < st.ctx.lease_until->load()) return false;
  move_to(self, replica_state::failed,
          "self-fenced: node " + std::to_string(st.ctx.node) + "'s lease lapsed (no heartbeat ack in time)");
  self->quit();
  return true;
}

void maybe_step(self_ptr self) {
  auto& st = self->state;
  if (st.step_in_flight || !st.engine || st.engine->idle()) return;
  if (lease_lapsed(self)) return;
  st.step_in_flight = true;
  st.step_out = true;
  const auto on_error = [=](const caf::error& err) {
    const bool timed_out = err == caf::sec::request_timeout;
    fail(self, "engine step on node " + std::to_string(self->state.ctx.node) + " device " +
                   std::to_string(self->state.ctx.spec.device) +
                   (timed_out ? " took longer than step_timeout_ms=" + std::to_string(self->state.ctx.step_timeout_ms) +
                                    " (the device is hung)"
                              : " failed: " + caf::to_string(err)));
  };
  // A step that does not come back in step_timeout_ms means a hung device;
  // the node's periodic device check would find it too, but much later. The
  // timer is cancelled when the step returns. 0 (deterministic runs, where
  // steps take modeled virtual time): no timer, the device check covers it.
  if (st.ctx.step_timeout_ms == 0) {
    self->request(st.ctx.device, caf::infinite, step_job{st.engine})
        .then([=](const step_done& done) { on_step_done(self, done); }, on_error);
    return;
  }
  self->request(st.ctx.device, std::chrono::milliseconds(st.ctx.step_timeout_ms), step_job{st.engine})
      .then([=](const step_done& done) { on_step_done(self, done); }, on_error);
}

// Runs `fn` against the engine now, or after the step that is out.
void with_engine(self_ptr self, std::function<void()> fn) {
  if (self->state.step_in_flight) self->state.deferred.push_back(std::move(fn));
  else fn();
}

void with_engine_probe(self_ptr self) {
  with_engine(self, [=] {
    auto& s = self->state;
    if (s.probe_out || s.state != replica_state::degraded) return;
    engine::generation_request probe;
    probe.id = warmup_request_id;
    probe.prompt = {1, 2, 3, 4};
    probe.max_tokens = 1;
    s.health->probe_sent(now_ns(self));
    if (auto ok = s.engine->submit(probe); !ok) {
      s.health->observe_request(true);
      spdlog::warn("event=replica_probe_refused replica={} error=\"{}\"", s.ctx.spec.id, ok.error().message);
      return;
    }
    s.probe_out = true;
    maybe_step(self);
  });
}

// The cost model of this replica's model on its device.
expected<engine::sim_cost_model> sim_cost(const replica_spec& spec, const std::optional<engine::sim_device>& device) {
  auto ref = cluster::parse_model_ref(spec.model_file);
  if (!ref) return std::unexpected(ref.error());
  if (!ref->is_preset())
    return make_error(errc::invalid_argument, "simulated replicas serve model presets, not files: " + spec.model_file);
  if (!device) return make_error(errc::invalid_argument, "a simulated replica needs a simulated device");
  const auto& m = *ref->preset;
  engine::sim_model sm;
  sm.parameters = m.parameter_count();
  sm.weight_bytes = m.weight_bytes;
  sm.kv_bytes_per_token = m.kv_bytes_per_token();
  sm.n_layers = m.n_layers;
  sm.dim = m.dim;
  sm.vocab_size = m.vocab_size;
  sm.context_length = m.context_length;
  sm.int8_compute = m.weight_precision == cluster::precision::int8 || m.weight_precision == cluster::precision::int4;
  return engine::sim_cost_model(sm, *device);
}

expected<std::shared_ptr<engine::inference_engine>> make_sim_engine(const replica_spec& spec,
                                                                   const device_resources& res) {
  auto cost = sim_cost(spec, res.sim);
  if (!cost) return std::unexpected(cost.error());
  engine::sim_engine_config c;
  c.kv_capacity_tokens = spec.kv_tokens;
  c.prefill_ends_step = true;  // first tokens at the moment they exist: exact TTFT
  c.prefix_block_tokens = res.sim_prefix_block_tokens;
  engine::set_step_stop(c, res.sim_step_stop, cost->model().n_layers);
  return std::make_shared<engine::sim_engine>(*cost, c);
}

// The zero-cost engine (serving benchmarks): nothing runs on the device.
std::shared_ptr<engine::inference_engine> make_null_engine(const replica_actor_state& st) {
  const auto& cfg = st.model->config();
  engine::null_engine_config nc;
  nc.vocab_size = cfg.vocab_size;
  nc.context_length = cfg.context_length;
  nc.kv_capacity_tokens = st.ctx.spec.kv_tokens;
  return std::make_shared<engine::null_engine>(nc);
}

void warm_up(self_ptr self) {
  auto& st = self->state;
  move_to(self, replica_state::warming);
  // A real forward pass through every layer before the first client request.
  engine::generation_request warm;
  warm.id = warmup_request_id;
  warm.prompt = {1, 2, 3, 4};
  warm.max_tokens = 1;
  if (auto ok = st.engine->submit(warm); !ok) return fail(self, "warm-up refused: " + ok.error().message);
  maybe_step(self);
}

void start_engine(self_ptr self, std::shared_ptr<engine::inference_engine> eng) {
  self->state.engine = std::move(eng);
  // A CPU engine's own copy of its weights (engine/weight_store.hpp): memory
  // this replica holds beside the file's page cache.
  if (const auto s = self->state.engine->stats(); s.weight_copy_bytes > 0)
    spdlog::info("event=replica_weights replica={} node={} copy_bytes={} huge_pages={}", self->state.ctx.spec.id,
                 self->state.ctx.node, s.weight_copy_bytes, s.weight_huge_pages);
  warm_up(self);
}

// The engine: a simulated one from the device's parameters, the null one
// here, a real one from the device (which knows its kind and builds it on
// its executor).
void make_engine(self_ptr self) {
  auto& st = self->state;
  const auto& spec = st.ctx.spec;
  const auto device_failed = [=](const caf::error& err) {
    fail(self, "engine on node " + std::to_string(self->state.ctx.node) + " device " +
                   std::to_string(self->state.ctx.spec.device) + ": " + to_string(from_caf(err)));
  };
  if (spec.engine == "sim") {
    self->request(st.ctx.device, caf::infinite, resources_atom::value)
        .then(
            [=](const device_resources& res) {
              auto eng = make_sim_engine(self->state.ctx.spec, res);
              if (!eng) return fail(self, eng.error().message);
              start_engine(self, std::move(*eng));
            },
            device_failed);
    return;
  }
  if (spec.engine == "null") return start_engine(self, make_null_engine(st));
  if (spec.engine != "cpu") return fail(self, "unknown engine '" + spec.engine + "'");
  auto req = std::make_shared<engine_request>();
  req->model = st.model;
  req->options.kv_tokens = spec.kv_tokens;
  req->options.draft = st.draft;
  req->options.draft_tokens = spec.draft_tokens;
  // A collective waiting past the step timeout means a member is stuck.
  req->collective_timeout = std::chrono::milliseconds(st.ctx.step_timeout_ms ? st.ctx.step_timeout_ms : 60000);
  const auto ask_first = [=] {
    self->request(self->state.ctx.device, caf::infinite, *req)
        .then(
            [=](const engine_reply& r) {
              self->state.abort_group = r.abort;
              start_engine(self, r.engine);
            },
            device_failed);
  };
  // A tensor-parallel group: the first device builds the engine over the
  // others', which it is handed first.
  const auto peers = st.ctx.devices.size() > 1 ? st.ctx.devices.size() - 1 : 0;
  if (peers == 0) return ask_first();
  req->peers.resize(peers);
  auto missing = std::make_shared<std::size_t>(peers);
  for (std::size_t i = 0; i < peers; ++i)
    self->request(st.ctx.devices[i + 1], caf::infinite, device_atom::value)
        .then(
            [=](const device_handle& h) {
              req->peers[i] = h.device;
              if (--*missing == 0) ask_first();
            },
            device_failed);
}

void start_simulated(self_ptr self);

// Simulation with the storage modelled (chaos_hooks::sim_storage): the
// model's bytes come over the store or from the node's cache, as fast as
// they share them; then the rest of the simulated start (whose own load
// time is zero then).
void load_from_sim_storage(self_ptr self) {
  const auto& spec = self->state.ctx.spec;
  const auto ref = cluster::parse_model_ref(spec.model_file);
  if (!ref || !ref->is_preset()) return fail(self, "simulated replicas serve model presets, not files: " + spec.model_file);
  const sim_load load{self->state.ctx.node,
                      cluster::cache_entry_for(spec.model_file, spec.model_sha256, ref->preset->weight_bytes)};
  self->request(self->state.ctx.hooks.sim_storage, caf::infinite, load)
      .then(
          [=](ok_atom) {
            self->state.sim_storage_loaded = true;
            start_simulated(self);
          },
          [=](const caf::error& err) { fail(self, "model store unavailable: " + caf::to_string(err)); });
}

// Simulation: no weights to map; loading takes the modeled time to move the
// model's bytes over the storage network.
void start_simulated(self_ptr self) {
  auto& st = self->state;
  move_to(self, replica_state::loading);
  if (st.ctx.hooks.sim_storage && !st.sim_storage_loaded) return load_from_sim_storage(self);
  self->request(st.ctx.device, caf::infinite, resources_atom::value)
      .then(
          [=](const device_resources& res) {
            auto cost = sim_cost(self->state.ctx.spec, res.sim);
            if (!cost) return fail(self, cost.error().message);
            self->delayed_send(self, std::chrono::nanoseconds(static_cast<std::int64_t>(cost->load_s() * 1e9)),
                               deferred_call{[=] { make_engine(self); }});
          },
          [=](const caf::error& err) { fail(self, "device unavailable: " + caf::to_string(err)); });
}

// The draft (speculative decoding), from the node's model cache like the
// model and pinned there alike; then the engine.
void acquire_draft(self_ptr self) {
  auto& st = self->state;
  if (st.ctx.spec.draft_model.empty() || st.ctx.spec.engine != "cpu") return make_engine(self);
  st.draft_requested = true;
  self->request(st.ctx.model_cache, caf::infinite, acquire_model{st.ctx.spec.draft_model, st.ctx.spec.draft_sha256})
      .then(
          [=](const model_handle& h) {
            if (!h.model) {
              self->state.draft_requested = false;
              return fail(self, "draft model load failed: " + h.error.message);
            }
            self->state.draft = h.model;
            make_engine(self);
          },
          [=](const caf::error& err) { fail(self, "model cache unavailable: " + caf::to_string(err)); });
}

void start(self_ptr self) {
  auto& st = self->state;
  if (st.ctx.spec.engine == "sim") return start_simulated(self);
  move_to(self, replica_state::loading);
  st.model_requested = true;
  self->request(st.ctx.model_cache, caf::infinite, acquire_model{st.ctx.spec.model_file, st.ctx.spec.model_sha256})
      .then([=](const model_handle& h) {
        if (!h.model) {
          self->state.model_requested = false;  // nothing was pinned
          return fail(self, "model load failed: " + h.error.message);
        }
        self->state.model = h.model;
        acquire_draft(self);
      },
      [=](const caf::error& err) { fail(self, "model cache unavailable: " + caf::to_string(err)); });
}

caf::result<ok_atom> refused(self_ptr self, const submit_msg& m, error e) {
  spdlog::info("event=replica_request_refused request_id={} replica={} error=\"{}\"",
               m.request_id.empty() ? "-" : m.request_id, self->state.ctx.spec.id, to_string(e));
  return to_caf(e);
}

caf::result<ok_atom> on_submit(self_ptr self, const submit_msg& m) {
  auto& st = self->state;
  if (lease_lapsed(self))
    return refused(self, m, {errc::unavailable, "replica " + std::to_string(st.ctx.spec.id) + " stopped: its node's lease lapsed"});
  if (!cluster::serves_requests(st.state))
    return refused(self, m, {errc::unavailable, "replica " + std::to_string(st.ctx.spec.id) + " is " +
                                          std::string(cluster::to_string(st.state)) + " and takes no new requests"});
  if (m.epoch != st.ctx.spec.epoch)
    return refused(self, m, {errc::stale_epoch, "replica " + std::to_string(st.ctx.spec.id) + " serves epoch " +
                                          std::to_string(st.ctx.spec.epoch) + ", request routed under epoch " +
                                          std::to_string(m.epoch)});
  auto requester = caf::actor_cast<caf::actor>(self->current_sender());
  engine::generation_request req;
  req.id = m.request;
  req.prompt = m.prompt;
  req.resume_tokens = m.resume;
  req.max_tokens = m.max_tokens;
  req.sampling = {m.temperature, m.top_p, m.top_k, m.seed};
  req.stop_tokens = m.stop_tokens;
  req.logprobs = m.logprobs;
  req.top_logprobs = m.top_logprobs;
  req.tenant = m.tenant;
  req.tenant_weight = m.tenant_weight;
  req.priority = m.priority == 0 ? engine::request_priority::interactive : engine::request_priority::batch;
  auto promise = self->make_response_promise<ok_atom>();
  // A simulated step covers many decode steps: cut it at the next boundary
  // so this request joins when it would on a real engine.
  // A step may stop at a layer boundary for this request's prompt when it
  // goes before everything in the step (a light tenant beside heavy ones):
  // the engine decides, on its own thread (engine.hpp); a simulated one when
  // the cut below asks.
  if (st.ctx.step_stop && st.step_in_flight && st.engine)
    st.engine->offer_arrival({req.id, req.tenant, req.tenant_weight, req.priority});
  if (st.step_in_flight && st.ctx.spec.engine == "sim") self->send(st.ctx.device, interrupt_step{st.engine.get()});
  with_engine(self, [=]() mutable {
    auto& s = self->state;
    EXA_ASSERT_MSG(!s.step_out, "engine submit while a step is out on the device");
    if (auto ok = s.engine->submit(req); !ok) {
      if (s.health) s.health->observe_request(true);
      promise.deliver(to_caf(ok.error()));
      return;
    }
    s.active[req.id] = {requester, static_cast<std::uint32_t>(req.prompt.size()), req.max_tokens,
                        static_cast<std::uint32_t>(req.resume_tokens.size()), false, m.request_id};
    // One line per request on the node too, so one grep for the id follows
    // it from the gateway to the replica that served it.
    spdlog::info("event=replica_request_started request_id={} replica={} node={} prompt_tokens={} resumed_tokens={} "
                 "max_tokens={}",
                 m.request_id.empty() ? "-" : m.request_id, s.ctx.spec.id, s.ctx.node, req.prompt.size(),
                 req.resume_tokens.size(), req.max_tokens);
    self->monitor(requester);
    if (s.state == replica_state::ready) move_to(self, replica_state::serving);
    promise.deliver(ok_atom::value);
    report_load(self, true);
    maybe_step(self);
  });
  return promise;
}

void on_cancel(self_ptr self, std::uint64_t request) {
  with_engine(self, [=] {
    auto& s = self->state;
    auto it = s.active.find(request);
    if (it == s.active.end()) return;
    spdlog::info("event=replica_request_cancelled request_id={} replica={} generated={}",
                 it->second.request_id.empty() ? "-" : it->second.request_id, s.ctx.spec.id, it->second.generated);
    self->demonitor(it->second.requester);
    s.active.erase(it);
    EXA_ASSERT_MSG(!s.step_out, "engine cancel while a step is out on the device");
    s.engine->cancel(request);  // frees the request's KV blocks now
    if (s.engine->idle()) report_load(self, true);  // no step follows to report it
    maybe_step(self);           // reports the cancellation and moves on
  });
}

}  // namespace

replica_actor_state::~replica_actor_state() {
  // However it ended, the replica no longer counts on its node.
  if (ctx.metrics) {
    count_state(*this, state, -1);
    const auto id = std::to_string(ctx.spec.id);
    cluster_metrics::series(ctx.metrics->kv_used_tokens, id)->set(0);
    cluster_metrics::series(ctx.metrics->kv_capacity_tokens, id)->set(0);
    cluster_metrics::series(ctx.metrics->prefix_cached_blocks, id)->set(0);
  }
  // Unpin the model in the node's cache, however the replica ended -- also
  // when it was asked for and had not arrived yet (the cache pins it anyway).
  if ((model || model_requested) && ctx.model_cache)
    caf::anon_send(ctx.model_cache, release_model{ctx.spec.model_file, ctx.spec.model_sha256});
  if ((draft || draft_requested) && ctx.model_cache)
    caf::anon_send(ctx.model_cache, release_model{ctx.spec.draft_model, ctx.spec.draft_sha256});
}

caf::behavior replica_actor(caf::stateful_actor<replica_actor_state>* self, replica_context ctx) {
  self->state.ctx = std::move(ctx);
  // Simulated steps cover many decode steps (their length says nothing of
  // health): simulated replicas are not judged.
  if (self->state.ctx.spec.engine != "sim" && cluster::validate(self->state.ctx.degradation))
    self->state.health.emplace(self->state.ctx.degradation);
  count_state(self->state, self->state.state, +1);
  // No device, no replica; but a replica's crash must not take the device
  // (shared with other replicas) down: monitor, do not link. A member of a
  // tensor-parallel group lost takes the whole group down: its collectives
  // are aborted, so a step out on the first device returns at once.
  if (self->state.ctx.devices.empty()) self->state.ctx.devices.push_back(self->state.ctx.device);
  for (const auto& d : self->state.ctx.devices) self->monitor(d);
  self->set_down_handler([=](const caf::down_msg& dm) {
    const auto& devices = self->state.ctx.devices;
    for (std::size_t i = 0; i < devices.size(); ++i)
      if (dm.source == devices[i].address()) {
        const auto spec_devices = devices_of(self->state.ctx.spec);
        const std::string why = "device " + std::to_string(i < spec_devices.size() ? spec_devices[i] : i) +
                                " lost: " + caf::to_string(dm.reason);
        if (self->state.abort_group) self->state.abort_group(why);
        return fail(self, why);
      }
    // A requester vanished: stop its generation and free its blocks.
    for (const auto& [id, r] : self->state.active)
      if (r.requester.address() == dm.source) return on_cancel(self, id);
  });
  start(self);
  return {
      [=](const submit_msg& m) { return on_submit(self, m); },
      [=](const cancel_msg& m) { on_cancel(self, m.request); },
      [=](const deferred_call& c) { c.fn(); },
      [=](self_fence_atom) {
        move_to(self, replica_state::failed, "self-fenced: node " + std::to_string(self->state.ctx.node) +
                                                 " lost the control plane");
        self->quit();
      },
      [=](const fence_notice& n) {
        auto& s = self->state;
        for (const auto& f : n.slots)
          if (f.deployment == s.ctx.spec.deployment && f.slot == s.ctx.spec.slot && f.epoch > s.ctx.spec.epoch) {
            if (s.state == replica_state::draining) {
              // A drain moved the slot on purpose (make before break): we take
              // nothing new already, and finish what we have, or are stopped
              // at the drain's deadline. Its requests never run twice: a
              // request that left us ignores what we still send.
              if (!s.fenced_while_draining)
                spdlog::info("event=replica_fenced_while_draining replica={} epoch={} slot_epoch={} in_flight={}",
                             s.ctx.spec.id, s.ctx.spec.epoch, f.epoch, s.active.size());
              s.fenced_while_draining = true;
              return;
            }
            // Our slot moved on while we were cut off: never serve it again.
            // Requests still here resume elsewhere when we are gone.
            move_to(self, replica_state::failed, "fenced: epoch " + std::to_string(s.ctx.spec.epoch) +
                                                     " is stale, the slot is at " + std::to_string(f.epoch));
            self->quit();
            return;
          }
      },
      [=](probe_atom) { on_probe(self); },
      [=](const set_standby& m) {
        auto& s = self->state;
        if (m.id != s.ctx.spec.id) return;
        if (s.ctx.spec.standby != m.standby) {
          s.ctx.spec.standby = m.standby;
          if (!m.standby && s.state == replica_state::standby) {
            // Requests a deferred submit started meanwhile keep it busy.
            // The engine may be stepping (those requests): its stats after the step.
            if (move_to(self, s.active.empty() ? replica_state::ready : replica_state::serving, "taken from the warm pool"))
              with_engine(self, [=] { report_load(self, true); });
            return;
          }
          if (m.standby && (s.state == replica_state::ready || s.state == replica_state::serving)) {
            // No new requests from now; what runs finishes here.
            move_to(self, replica_state::standby, "back to the warm pool");
            return;
          }  // loading: it stands by (or not) when warmed
        }
        if (m.announce) announce_state(self, "announced again");
      },
      [=](const stop_replica& m) {
        if (!m.drain && self->state.state == replica_state::draining) {
          // A drain past its deadline: what is in flight resumes elsewhere
          // (each request sees this replica go and continues from its tokens).
          move_to(self, replica_state::stopped,
                  "drain deadline passed: " + std::to_string(self->state.active.size()) +
                      " in-flight requests resume elsewhere");
          self->quit();
          return;
        }
        if (!m.drain) {
          // Said in the lifecycle's own steps (ready -> stopped is not one):
          // a stop nobody hears of looks like a replica still serving.
          if (cluster::serves_requests(self->state.state) || self->state.state == replica_state::standby) {
            move_to(self, replica_state::draining, "stop without draining");
            move_to(self, replica_state::stopped, "stopped without draining");
          } else {
            move_to(self, replica_state::failed, "stopped before it was ready");
          }
          self->quit();
          return;
        }
        if (self->state.state == replica_state::draining) return;  // draining already
        if (!cluster::serves_requests(self->state.state) && self->state.state != replica_state::standby) {
          // not ready yet: nothing to drain
          move_to(self, replica_state::failed, "stopped before it was ready");
          self->quit();
          return;
        }
        if (!move_to(self, replica_state::draining, "stop requested")) return;
        if (m.deadline_ms > 0)  // its own deadline, a little after the controller's: ends the drain for sure
          self->delayed_send(self, std::chrono::milliseconds(m.deadline_ms) + std::chrono::seconds(1),
                             stop_replica{m.id, false, 0});
        if (self->state.active.empty() && !self->state.step_in_flight) {
          move_to(self, replica_state::stopped, "drained");
          self->quit();
        }
      },
  };
}

}  // namespace exa::actors
