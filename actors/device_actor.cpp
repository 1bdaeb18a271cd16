#include "actors/device_actor.hpp"

#include "actors/cluster_metrics.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <chrono>

#include "engine/engine.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"

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

// The exaserve_device_memory_bytes gauges: the region reserved at start and
// the KV pages in use (two atomic stores; called on health checks and steps).
void report_memory(const device_state& s) {
  if (!s.config.metrics || !s.pool) return;
  const auto node = std::to_string(s.config.node);
  const auto device = std::to_string(s.config.index);
  const auto block = static_cast<double>(s.pool->block_bytes());
  cluster_metrics::series(s.config.metrics->device_memory, node, device, "reserved")
      ->set(block * s.pool->capacity_blocks());
  cluster_metrics::series(s.config.metrics->device_memory, node, device, "used")
      ->set(block * (s.pool->capacity_blocks() - s.pool->free_blocks()));
}

}  // namespace

caf::behavior device_actor(caf::stateful_actor<device_state>* self, device_config config) {
  auto& st = self->state;
  st.config = config;
  if (config.sim) {  // no memory to reserve, no threads: a cost model
    spdlog::debug("event=device_started node={} device={} kind=sim", config.node, config.index);
    return {
        [=](resources_atom) { return device_resources{nullptr, nullptr, self->state.config.page_bytes, self->state.config.sim,
                                                       self->state.config.sim_prefix_block_tokens}; },
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
  const std::uint32_t pages = static_cast<std::uint32_t>(config.memory_bytes / config.page_bytes);
  auto pool = gpu::cpu_memory_pool::create(config.page_bytes, pages);
  if (!pool) {
    spdlog::error("event=device_start_failed node={} device={} error=\"{}\"", config.node, config.index,
                  to_string(pool.error()));
    self->quit(caf::make_error(caf::sec::runtime_error, to_string(pool.error())));
    return {};
  }
  st.pool = std::move(*pool);
  st.threads = std::make_shared<engine::thread_pool>(config.threads);
  report_memory(self->state);
  spdlog::info("event=device_started node={} device={} kind=cpu memory_bytes={} pages={} page_bytes={} threads={}",
               config.node, config.index, config.memory_bytes, pages, config.page_bytes, st.threads->size());
  return {
      [=](resources_atom) {
        auto& s = self->state;
        return device_resources{s.pool, s.threads, s.config.page_bytes, std::nullopt, 0};
      },
      [=](check_atom) -> caf::result<ok_atom> {
        auto& s = self->state;
        report_memory(s);
        if (!s.hung) return ok_atom::value;
        auto promise = self->make_response_promise<ok_atom>();
        s.held.push_back([promise]() mutable { promise.deliver(ok_atom::value); });
        return promise;
      },
      [=](const inject_fault& f) {
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
      },
      [=](unhang_atom) {
        auto& s = self->state;
        s.hung = false;
        auto held = std::move(s.held);
        s.held.clear();
        for (auto& fn : held) fn();
      },
      [=](const step_job& job) -> caf::result<step_done> {
        auto& s = self->state;
        report_memory(s);
        if (s.hung) {  // the step waits (and its replica's step timeout runs)
          auto promise = self->make_response_promise<step_done>();
          s.held.push_back([self, job, promise]() mutable {
            auto r = std::make_shared<engine::step_result>(job.engine->step());
            promise.deliver(step_done{std::move(r), 0.0});
          });
          return promise;
        }
        const auto t0 = std::chrono::steady_clock::now();
        auto result = std::make_shared<engine::step_result>(job.engine->step());
        ++s.steps;
        double seconds = 0;
        if (s.config.measure_wall_time) {
          seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
        if (deliver_in_ns == 0) return step_done{std::move(result), seconds};
        const auto id = ++s.next_token;
        auto promise = self->make_response_promise<step_done>();
        s.timed_steps[id] = {promise, std::move(result), seconds};
        self->delayed_send(self, std::chrono::nanoseconds(deliver_in_ns), deliver_step{nullptr, id});
        return promise;
      },
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
