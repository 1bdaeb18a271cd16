#include "actors/sim_storage_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <cmath>

#include "actors/chaos_hooks.hpp"
#include "actors/messages.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<sim_storage_state>*;
using wake_atom = caf::atom_constant<caf::atom("storwake")>;

double now_s(self_ptr self) { return static_cast<double>(clock_ns(self) - self->state.start_ns) / 1e9; }

void record(self_ptr self) {
  auto& st = self->state;
  if (!st.stats) return;
  const auto& m = *st.model;
  st.stats->peak_store_bytes_per_s = m.peak_store_rate_bytes_per_s();
  st.stats->store_bytes = m.store_bytes();
  st.stats->fetches = m.fetches();
  st.stats->loads_from_cache = m.loads_from_cache();
  auto& series = st.stats->store_rate_series;
  const double rate = m.store_rate_bytes_per_s();
  if (!series.empty() && series.back().second == rate) return;
  if (series.size() >= sim_storage_stats::series_max) {  // bounded: keep every other point
    std::vector<std::pair<double, double>> half;
    for (std::size_t i = 0; i < series.size(); i += 2) half.push_back(series[i]);
    series = std::move(half);
  }
  series.emplace_back(now_s(self), rate);
}

void answer(self_ptr self, const std::vector<cluster::storage_model::load_id>& done) {
  auto& st = self->state;
  for (const auto id : done) {
    if (auto it = st.waiting.find(id); it != st.waiting.end()) {
      it->second.deliver(ok_atom::value);
      st.waiting.erase(it);
    }
  }
}

// Answers the loads that are done and sets a timer for the next transfer
// to end (older timers are ignored by their generation).
void settle(self_ptr self) {
  auto& st = self->state;
  answer(self, st.model->advance(now_s(self)));
  // As a node's model cache would: its fetch is done, its loads need the store no more.
  for (const auto& [node, name] : st.model->take_fetched())
    if (st.controller) self->send(st.controller, node_cached_file{node, st.files[name]});
  record(self);
  const auto next = st.model->next_event_s();
  if (!next) return;
  // Rounded up to whole nanoseconds: the transfer has ended when it fires.
  const auto delay_ns = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil((*next - now_s(self)) * 1e9)));
  self->delayed_send(self, std::chrono::nanoseconds(delay_ns), wake_atom::value, ++st.timer_generation);
}

}  // namespace

caf::behavior sim_storage_actor(caf::stateful_actor<sim_storage_state>* self, cluster::storage_model model,
                                std::vector<std::pair<cluster::node_id, std::string>> warm,
                                std::shared_ptr<sim_storage_stats> stats) {
  auto& st = self->state;
  st.model.emplace(std::move(model));
  st.start_ns = clock_ns(self);
  st.stats = std::move(stats);
  for (const auto& [node, file] : warm) st.model->add_cached(node, file);
  spdlog::info("event=sim_storage_started store_bytes_per_s={:.0f} node_network_bytes_per_s={:.0f} "
               "node_disk_bytes_per_s={:.0f} warm_node_files={}",
               st.model->config().store_bytes_per_s, st.model->config().node_network_bytes_per_s,
               st.model->config().node_disk_bytes_per_s, warm.size());
  return {
      [=](const sim_load& m) -> caf::result<ok_atom> {
        auto& s = self->state;
        answer(self, s.model->advance(now_s(self)));  // what ends now ends before this one starts
        const auto id = s.next_id++;
        if (auto ok = s.model->start(id, m.node, m.file.name, m.file.bytes, now_s(self)); !ok)
          return to_caf(ok.error());
        s.files.emplace(m.file.name, m.file);
        if (s.stats) ++s.stats->loads;
        auto promise = self->make_response_promise<ok_atom>();
        s.waiting.emplace(id, promise);
        settle(self);
        return promise;
      },
      [=](const sim_storage_watch& m) { self->state.controller = m.controller; },
      [=](wake_atom, std::uint64_t generation) {
        if (generation != self->state.timer_generation) return;
        settle(self);
      },
  };
}

}  // namespace exa::actors
