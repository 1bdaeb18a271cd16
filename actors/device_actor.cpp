#include "actors/device_actor.hpp"

#include "actors/cluster_metrics.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/assert.hpp"
#include "engine/engine.hpp"
#include "gpu/executor.hpp"
#include "gpu/tensor_parallel.hpp"

namespace exa::actors {

namespace {

using self_ptr = caf::stateful_actor<device_state>*;

std::int64_t now_ns(self_ptr self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

void schedule_delivery(self_ptr self, device_state::sim_step& s) {
  s.token = ++self->state.next_token;
  const auto due_ns = s.start_ns + static_cast<std::int64_t>(s.result->duration_s * 1e9);
  const auto wait = std::chrono::nanoseconds(std::max<std::int64_t>(0, due_ns - now_ns(self)));
  self->delayed_send(self, wait, deliver_step{s.engine.get(), s.token});
}

// A simulated step: modeled, then answered when its duration has passed.
caf::result<step_done> sim_step(self_ptr self, const step_job& job) {
  auto& st = self->state;
  job.engine->set_device_sharing(static_cast<std::uint32_t>(st.sim_steps.size() + 1));
  auto result = std::make_shared<engine::step_result>(job.engine->step());
  ++st.steps;
  if (result->duration_s <= 0) return step_done{std::move(result), 0.0};
  auto& s = st.sim_steps[job.engine.get()];
  s = {job.engine, self->make_response_promise(), std::move(result), now_ns(self), 0};
  schedule_delivery(self, s);
  return caf::delegated<step_done>();
}

}  // namespace

namespace {

// The device's gauges: exaserve_device_memory_bytes (the KV region reserved
// at start and the pages in use) and, where the device reports them, its
// temperature and utilization (absent readings leave no series, never a 0).
void report_telemetry(const device_state& s) {
  if (!s.config.metrics || !s.device) return;
  const auto t = s.device->read_telemetry();
  const auto node = std::to_string(s.config.node);
  const auto device = std::to_string(s.config.index);
  const auto& m = *s.config.metrics;
  cluster_metrics::series(m.device_memory, node, device, "reserved")->set(static_cast<double>(t.memory_reserved_bytes));
  cluster_metrics::series(m.device_memory, node, device, "used")->set(static_cast<double>(t.memory_used_bytes));
  if (t.temperature_c) cluster_metrics::series(m.device_temperature, node, device)->set(*t.temperature_c);
  if (t.utilization_percent)
    cluster_metrics::series(m.device_utilization, node, device)->set(*t.utilization_percent / 100.0);
}

// The memory gauges alone (every step: reads the pool's counters only).
void report_memory(const device_state& s) {
  if (!s.config.metrics || !s.device) return;
  auto& pool = s.device->pool();
  const auto node = std::to_string(s.config.node);
  const auto device = std::to_string(s.config.index);
  const auto block = static_cast<double>(pool.block_bytes());
  cluster_metrics::series(s.config.metrics->device_memory, node, device, "reserved")->set(block * pool.capacity_blocks());
  cluster_metrics::series(s.config.metrics->device_memory, node, device, "used")
      ->set(block * (pool.capacity_blocks() - pool.free_blocks()));
}

// Runs `work` on the device's executor; `then` gets its outcome here, on
// the actor's thread: at once when the executor ran it inline, else when
// the completion message arrives.
void run_on_device(self_ptr self, gpu::executor::task work, std::function<void(gpu::task_outcome)> then) {
  auto& s = self->state;
  const auto id = ++s.next_task;
  auto latch = std::make_shared<gpu::completion_latch>();
  auto me = caf::actor_cast<caf::weak_actor_ptr>(self->ctrl());
  s.tasks.emplace(id, std::move(then));
  s.device->exec().submit(std::move(work), [latch, me, id](gpu::task_outcome outcome) {
    if (latch->offer(outcome)) return;
    if (auto strong = me.lock()) caf::anon_send(caf::actor_cast<caf::actor>(strong), task_finished{id, std::move(outcome)});
  });
  if (auto early = latch->close()) {
    auto it = s.tasks.find(id);
    auto fn = std::move(it->second);
    s.tasks.erase(it);
    fn(std::move(*early));
  }
}

void on_task_finished(self_ptr self, task_finished& m) {
  auto& s = self->state;
  auto it = s.tasks.find(m.id);
  if (it == s.tasks.end()) return;
  auto fn = std::move(it->second);
  s.tasks.erase(it);
  fn(std::move(m.outcome));
}

// A step's result is back: its time (measured, or modeled in deterministic
// runs), a slow device's delay (injected), and the device's queue when
// steps take modeled time; then the replica gets it.
void finish_step(self_ptr self, caf::response_promise promise, std::shared_ptr<engine::step_result> result,
                 const gpu::task_outcome& outcome) {
  auto& s = self->state;
  if (outcome.failure) {
    spdlog::error("event=device_step_failed node={} device={} error=\"{}\"", s.config.node, s.config.index,
                  to_string(*outcome.failure));
    promise.deliver(to_caf(*outcome.failure));
    return;
  }
  ++s.steps;
  report_memory(s);
  double seconds = 0;
  if (s.config.measure_wall_time) {
    seconds = outcome.seconds;
  } else {  // a fixed cost per token keeps deterministic tests deterministic
    seconds = 1e-4 * (1 + result->prefill_tokens + result->decode_tokens);
  }
  const auto now = now_ns(self);
  // A slow device (injected): the step comes back late, and says so.
  const std::int64_t slow_ns = s.slow_delay_ns > 0 && now < s.slow_until_ns ? s.slow_delay_ns : 0;
  seconds += slow_ns / 1e9;
  std::int64_t deliver_in_ns = slow_ns;
  if (!s.config.measure_wall_time && s.config.model_step_time) {
    // The device runs one step at a time: replicas sharing it queue.
    s.busy_until_ns = std::max(now, s.busy_until_ns) + static_cast<std::int64_t>(seconds * 1e9);
    deliver_in_ns = s.busy_until_ns - now;
  }
  if (deliver_in_ns == 0) {
    promise.deliver(step_done{std::move(result), seconds});
    return;
  }
  const auto id = ++s.next_token;
  s.timed_steps[id] = {std::move(promise), std::move(result), seconds};
  self->delayed_send(self, std::chrono::nanoseconds(deliver_in_ns), deliver_step{nullptr, id});
}

void start_step(self_ptr self, const step_job& job, caf::response_promise promise, bool was_held) {
  auto result = std::make_shared<engine::step_result>();
  run_on_device(
      self, [engine = job.engine, result] { *result = engine->step(); },
      [self, promise, result, was_held](gpu::task_outcome outcome) mutable {
        // A step held through a hang is answered as soon as it ran, unmeasured.
        if (was_held && !outcome.failure) promise.deliver(step_done{std::move(result), 0.0});
        else finish_step(self, std::move(promise), std::move(result), outcome);
      });
}

// One device's engine, or a tensor-parallel group's over this device and
// its peers; built on this device's executor (a CUDA engine uploads its
// weights there, a group shards them).
caf::result<engine_reply> make_engine(self_ptr self, const engine_request& m) {
  auto promise = self->make_response_promise<engine_reply>();
  auto made = std::make_shared<expected<gpu::group_engine>>(make_error(errc::internal, "engine creation did not run"));
  auto device = self->state.device;
  run_on_device(
      self,
      [device, made, m] {
        if (m.peers.empty()) {
          auto e = device->make_engine(m.model, m.options);
          *made = e ? expected<gpu::group_engine>(gpu::group_engine{std::move(*e), {}})
                    : expected<gpu::group_engine>(std::unexpected(e.error()));
          return;
        }
        std::vector<std::shared_ptr<gpu::device>> members{device};
        members.insert(members.end(), m.peers.begin(), m.peers.end());
        *made = gpu::make_group_engine(std::move(members), m.model, m.options, m.collective_timeout);
      },
      [self, promise, made](gpu::task_outcome outcome) mutable {
        if (outcome.failure) {
          promise.deliver(to_caf(*outcome.failure));
        } else if (!*made) {
          promise.deliver(to_caf(made->error()));
        } else {
          report_memory(self->state);
          promise.deliver(engine_reply{std::move((*made)->engine), std::move((*made)->abort)});
        }
      });
  return promise;
}

caf::behavior simulated_device(self_ptr self);

}  // namespace

gpu::device_options device_options_of(const device_config& config) {
  gpu::device_options o;
  o.memory_bytes = config.memory_bytes;
  o.page_bytes = config.page_bytes;
  o.threads = config.threads;
  o.inline_executor = config.inline_executor;
  return o;
}

namespace {

// A simulated device: no memory to reserve, no threads; steps take their
// modeled duration in virtual time.
caf::behavior simulated_device(self_ptr self) {
  spdlog::debug("event=device_started node={} device={} kind=sim", self->state.config.node, self->state.config.index);
  return {
      [=](resources_atom) {
        auto& c = self->state.config;
        return device_resources{c.page_bytes, c.sim, c.sim_prefix_block_tokens, c.sim_step_stop};
      },
      [=](check_atom) { return ok_atom::value; },
      [=](const step_job& job) { return sim_step(self, job); },
      [=](const interrupt_step& m) {
        auto& s = self->state;
        auto it = s.sim_steps.find(m.engine);
        if (it == s.sim_steps.end()) return;
        const double elapsed = (now_ns(self) - it->second.start_ns) / 1e9;
        if (auto cut = it->second.engine->truncate_last_step(elapsed)) {
          *it->second.result = std::move(*cut);
          schedule_delivery(self, it->second);  // the earlier delivery is now stale
        }
      },
      [=](const deliver_step& m) {
        auto& s = self->state;
        auto it = s.sim_steps.find(m.engine);
        if (it == s.sim_steps.end() || it->second.token != m.token) return;
        s.busy_s += it->second.result->duration_s;
        if (auto& busy = s.config.hooks.device_busy_us)
          busy->fetch_add(static_cast<std::uint64_t>(it->second.result->duration_s * 1e6));
        it->second.promise.deliver(step_done{it->second.result, it->second.result->duration_s});
        s.sim_steps.erase(it);
      },
      [=](const inject_fault&) {},
  };
}

void on_inject_fault(self_ptr self, const inject_fault& f) {
  auto& s = self->state;
  if (f.kind == "slow") {
    spdlog::warn("event=chaos_slow_device node={} device={} delay_ms={} duration_ms={}", s.config.node,
                 s.config.index, f.delay_ms, f.duration_ms);
    s.slow_delay_ns = std::int64_t{f.delay_ms} * 1000000;
    s.slow_until_ns = now_ns(self) + std::int64_t{f.duration_ms} * 1000000;
    return;
  }
  if (f.kind != "hang") return;
  spdlog::warn("event=chaos_hang_device node={} device={} duration_ms={}", s.config.node, s.config.index,
               f.duration_ms);
  s.hung = true;
  self->delayed_send(self, std::chrono::milliseconds(f.duration_ms), unhang_atom::value);
}

// The health check: a hung device (injected) does not answer until the hang
// ends; a device in an error state (CUDA's sticky error) answers the error.
caf::result<ok_atom> on_check(self_ptr self) {
  auto& s = self->state;
  report_telemetry(s);
  if (s.hung) {
    auto promise = self->make_response_promise<ok_atom>();
    s.held.push_back([promise]() mutable { promise.deliver(ok_atom::value); });
    return promise;
  }
  if (auto ok = s.device->check_health(); !ok) {
    spdlog::error("event=device_unhealthy node={} device={} error=\"{}\"", s.config.node, s.config.index,
                  to_string(ok.error()));
    return to_caf(ok.error());
  }
  return ok_atom::value;
}

}  // namespace

caf::behavior device_actor(caf::stateful_actor<device_state>* self, device_config config) {
  auto& st = self->state;
  st.config = std::move(config);
  if (st.config.sim) return simulated_device(self);
  EXA_ASSERT_MSG(static_cast<bool>(st.config.open), "a device actor needs a device to open");
  auto dev = st.config.open();
  if (!dev) {
    spdlog::error("event=device_start_failed node={} device={} error=\"{}\"", st.config.node, st.config.index,
                  to_string(dev.error()));
    self->quit(caf::make_error(caf::sec::runtime_error, to_string(dev.error())));
    return {};
  }
  st.device = std::move(*dev);
  report_telemetry(st);
  const auto t = st.device->read_telemetry();
  spdlog::info("event=device_started node={} device={} kind={} name=\"{}\" memory_budget_bytes={} "
               "kv_reserved_bytes={} page_bytes={}",
               st.config.node, st.config.index, gpu::to_string(st.device->kind()), st.device->name(),
               t.memory_budget_bytes, t.memory_reserved_bytes, st.device->pool().block_bytes());
  return {
      [=](const engine_request& m) { return make_engine(self, m); },
      [=](device_atom) { return device_handle{self->state.device}; },
      [=](check_atom) { return on_check(self); },
      [=](const inject_fault& f) { on_inject_fault(self, f); },
      [=](unhang_atom) {
        auto& s = self->state;
        s.hung = false;
        auto held = std::move(s.held);
        s.held.clear();
        for (auto& fn : held) fn();
      },
      [=](const step_job& job) -> caf::result<step_done> {
        auto& s = self->state;
        auto promise = self->make_response_promise<step_done>();
        if (s.hung) {  // the step waits (and its replica's step timeout runs)
          s.held.push_back([self, job, promise]() mutable { start_step(self, job, std::move(promise), true); });
          return promise;
        }
        start_step(self, job, promise, false);
        return promise;
      },
      [=](task_finished& m) { on_task_finished(self, m); },
      [=](const deliver_step& m) {
        auto& s = self->state;
        auto it = s.timed_steps.find(m.token);
        if (it == s.timed_steps.end()) return;
        it->second.promise.deliver(step_done{std::move(it->second.result), it->second.seconds});
        s.timed_steps.erase(it);
      },
  };
}

}  // namespace exa::actors
