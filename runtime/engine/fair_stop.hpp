#pragma once
// The rule both engines use across tenants to decide whether a prompt goes
// before work already scheduled (batch_scheduler.hpp's held decodes and
// stopped steps, sim_engine.hpp's layer_yield): one definition, so the
// simulated engine decides as the CPU engine does. Pure.

#include <cstdint>

#include "engine/tenant_usage.hpp"

namespace exa::engine::fair {

/// The CUDA engine's step stop (gpu/cuda_stage_pipeline.hpp), shared with the
/// simulator that models it (sim_engine_config): the host's time to launch
/// one stage's kernels eagerly -- an estimate (about ten launches of a few
/// microseconds), to be measured on a GPU -- and the shortest decode step it
/// runs stage by stage, weighing its reads at the device's peak bandwidth:
/// as long as the launches of its `stages` (at `launch_s` each), so that
/// they keep pace with the device (the host launches a stage while the
/// device runs the one before). docs/PERFORMANCE.md ("Fairness across
/// tenants") gives what the simulator makes of this bound and of others.
inline constexpr double cuda_stage_launch_s = 30e-6;
constexpr double cuda_stoppable_decode_s(std::uint32_t stages, double launch_s = cuda_stage_launch_s) noexcept {
  return stages * launch_s;
}

/// Whether work of `tenant` in class `priority` yields to a prompt of
/// `to_tenant` in `to_priority`: batch work to an interactive prompt; within
/// a class, a tenant over its share to a tenant it has been served more than.
inline bool yields_to(const tenant_usage& usage, tenant_usage::slot tenant, request_priority priority,
                      tenant_usage::slot to_tenant, request_priority to_priority) {
  if (priority != to_priority) return priority > to_priority;
  return tenant != to_tenant && usage.over_share(tenant, to_tenant) && usage.usage(tenant) > usage.usage(to_tenant);
}

/// Whether a prompt of `tenant` in `priority` goes before a step's `work`
/// (member_of(w) gives each item's tenant and class): some of it yields to
/// the prompt and the rest is the prompt's own tenant's, in its class, so
/// stopping the step for it delays nobody it does not go before.
template <class Work, class MemberOf>
bool goes_before(const tenant_usage& usage, const Work& work, MemberOf member_of, tenant_usage::slot tenant,
                 request_priority priority) {
  bool any = false;
  for (const auto& w : work) {
    const auto [t, p] = member_of(w);
    if (yields_to(usage, t, p, tenant, priority)) {
      any = true;
      continue;
    }
    if (t != tenant || p != priority) return false;
  }
  return any;
}

}  // namespace exa::engine::fair
