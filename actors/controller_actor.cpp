#include "actors/controller_actor.hpp"

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <limits>

#include "actors/cluster_metrics.hpp"
#include "auth/api_keys.hpp"
#include "cluster/journal.hpp"
#include "cluster/model_ref.hpp"
#include "cluster/model_shape.hpp"
#include "cluster/node_cache.hpp"
#include "cluster/routing.hpp"
#include "engine/speculative.hpp"
#include "engine/tp_weights.hpp"
#include "model/file_digest.hpp"
#include "model/llama_model.hpp"
#include "template/chat_template.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<controller_state>*;
using cluster::replica_state;
using reconcile_atom = caf::atom_constant<caf::atom("reconcile")>;
using drain_deadline_atom = caf::atom_constant<caf::atom("draindl")>;

constexpr std::uint32_t max_replicas_per_deployment = 4096;

expected<void> check_plain_name(const std::string& name);

// A deployment's name: plain ("tiny"), or a version a rollout brought ("tiny@2").
expected<void> check_name(const std::string& name) {
  const auto v = cluster::split_version(name);
  if (name.find('@') == std::string::npos) return check_plain_name(name);
  if (auto ok = check_plain_name(std::string(v.base)); !ok) return ok;
  return cluster::check_version(v.version);
}

expected<void> check_plain_name(const std::string& name) {
  if (name.empty() || name.size() > 64)
    return make_error(errc::invalid_argument, "deployment name must be 1..64 characters");
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return make_error(errc::invalid_argument,
                        "deployment name '" + name + "' may use only letters, digits, '-', '_' and '.'");
  return {};
}

// Writes a record to the journal (distributed mode) before the controller
// acts on it. A failing disk is logged loudly; the controller keeps serving.
void persist(self_ptr self, const cluster::journal_record& r) {
  auto& j = self->state.config.journal;
  if (!j) return;
  if (auto ok = j->append(r); !ok)
    spdlog::error("event=journal_write_failed dir={} error=\"{}\"", j->dir(), to_string(ok.error()));
}

void admit_loads(self_ptr self);
void tell_split(self_ptr self, const std::string& base);
bool rollout_active(const controller_state& st, const std::string& base);
void rebalance_pool(self_ptr self, const std::string& name);
void count_pool_event(self_ptr self, const std::string& deployment, std::string_view event);
void update_standby_gauge(self_ptr self, const std::string& deployment);
void count_migration(self_ptr self, std::string_view reason);

// The warm pool a deployment keeps now: none while its plain name is in a
// rollout (the rollout counts replicas as they serve), else its share.
std::uint32_t pool_size(const controller_state& st, const std::string& name,
                        const controller_state::deployment& dep) {
  const std::string base(cluster::split_version(name).base);
  if (rollout_active(st, base)) return 0;
  if (auto r = st.rollouts.find(base); r != st.rollouts.end() && r->second.finishing) return 0;
  return cluster::warm_count(dep.serving, dep.warm_percent);
}
void roll_back_interrupted(self_ptr self, std::map<std::string, api::deploy_request>& deployments,
                           const std::string& base, const cluster::durable_state::rollout_entry& e);
void drop_leftover_versions(self_ptr self, std::map<std::string, api::deploy_request>& deployments);

// Whether a replica counts toward its deployment's serving count and pool:
// not draining or stopping (a drain, a slot above the count), not ended.
bool in_pool(const controller_state& st, cluster::replica_id id, const controller_state::replica_record& r) {
  if (cluster::is_terminal(r.state) || r.state == replica_state::draining || st.drains->draining(id)) return false;
  const auto dep = st.deployments.find(r.deployment);
  return dep != st.deployments.end() && r.slot < dep->second.spec.replicas;
}

// Starts the replica of a placed slot on its node once the load gate lets
// it: placed (its memory reserved) now, loading in its turn.
void start_slot(self_ptr self, const cluster::placed_slot& p, cluster::epoch_t epoch) {
  auto& st = self->state;
  const auto& dep = st.deployments.at(p.slot.deployment);
  replica_spec spec;
  spec.id = p.replica;
  spec.deployment = p.slot.deployment;
  spec.slot = p.slot.index;
  spec.epoch = epoch;
  spec.model_file = dep.model_file;
  spec.device = p.devices.front();
  spec.devices = p.devices;  // the TP group runs on all of them
  spec.kv_tokens = static_cast<std::uint32_t>(dep.spec.replica.kv_tokens);
  spec.engine = st.config.engine;
  spec.model_sha256 = dep.model_sha256;
  spec.draft_model = dep.draft_model;
  spec.draft_sha256 = dep.draft_sha256;
  spec.draft_tokens = dep.draft_tokens;
  // Serving places first; once the deployment has its serving count, a new
  // replica stands by (the warm pool), whatever its slot.
  std::uint32_t serving = 0;
  for (const auto& [id, r] : st.replicas)
    serving += r.deployment == p.slot.deployment && !r.standby && in_pool(st, id, r);
  spec.standby = serving >= dep.serving;
  // Durable before any node hears of it: a restarted controller must never
  // meet an epoch or a replica id it does not know.
  if (st.slots->raise_epoch(p.slot, epoch))
    persist(self, cluster::journal_record::slot_epoch(p.slot.deployment, p.slot.index, epoch));
  persist(self, cluster::journal_record::replica_taken(p.replica));
  auto& rec = st.replicas[p.replica];
  rec = controller_state::replica_record{};
  rec.id = p.replica;
  rec.deployment = p.slot.deployment;
  rec.slot = p.slot.index;
  rec.epoch = epoch;
  rec.node = p.node;
  rec.device = spec.device;
  rec.spawned = false;
  rec.admitted = false;
  rec.spec = spec;
  rec.standby = rec.told_standby = spec.standby;
  if (spec.standby) count_pool_event(self, p.slot.deployment, "refill");
  spdlog::info("event=replica_placed replica={} deployment={} slot={} epoch={} node={} device={} bytes={}{}", p.replica,
               spec.deployment, spec.slot, epoch, p.node, spec.device, p.per_device.total_bytes(),
               spec.standby ? " standby=true" : "");
  if (auto q = st.loads->enqueue(p.replica, p.node); !q) {
    // The queue bound: start it anyway rather than leave a placed slot dark.
    spdlog::error("event=replica_load_queue_full replica={} error=\"{}\"", p.replica, to_string(q.error()));
    rec.admitted = true;
  }
  admit_loads(self);
  if (rec.admitted && !rec.spawned) {
    const auto node = st.nodes.find(p.node);
    if (node != st.nodes.end() && node->second) {  // else: sent when the node comes up
      self->send(node->second, spawn_replica{spec});
      rec.spawned = true;
    }
  }
}

// Whether a replica's node is known to hold its deployment's file.
bool loads_from_cache(const controller_state& st, cluster::replica_id id, cluster::node_id node) {
  const auto r = st.replicas.find(id);
  if (r == st.replicas.end()) return false;
  const auto dep = st.deployments.find(r->second.deployment);
  return dep != st.deployments.end() && dep->second.spec.cached_on.count(node) != 0;
}

// Spawns the replicas whose turn to load has come (on nodes that are up;
// the others are spawned when their node joins).
void admit_loads(self_ptr self) {
  auto& st = self->state;
  // A replica whose node's cache holds its file reads no store: it needs
  // only its node's turn (load_gate).
  const auto from_cache = [&st](cluster::replica_id id, cluster::node_id node) { return loads_from_cache(st, id, node); };
  const auto admitted = st.config.cache_affinity ? st.loads->admit(from_cache) : st.loads->admit();
  for (const auto id : admitted) {
    auto it = st.replicas.find(id);
    if (it == st.replicas.end()) {
      st.loads->finished(id);
      continue;
    }
    auto& rec = it->second;
    rec.admitted = true;
    const auto node = st.nodes.find(rec.node);
    if (node != st.nodes.end() && node->second && !rec.spawned) {
      self->send(node->second, spawn_replica{rec.spec});
      rec.spawned = true;
    }
  }
  if (st.loads->waiting_count() > 0)
    spdlog::debug("event=replica_loads_waiting waiting={} loading={}", st.loads->waiting_count(),
                  st.loads->loading_count());
}

deployment_announce announce(const std::string& name, const controller_state::deployment& dep) {
  return {name,        dep.model_file,          dep.spec.model.vocab_size, dep.spec.model.context_length,
          dep.routing, dep.prefix_slack_tokens, dep.prefix_slack_ratio,    dep.prefix_slack_s,
          dep.tenant,  dep.autoscale.enabled(), dep.chat_template};
}

void remember(self_ptr self, const api::deploy_request& req) {
  {
    std::lock_guard lock(self->state.config.desired->mutex);
    self->state.config.desired->deployments[req.name] = req;
  }
  persist(self, cluster::journal_record::deploy(req));
}

void forget(self_ptr self, const std::string& name) {
  {
    std::lock_guard lock(self->state.config.desired->mutex);
    self->state.config.desired->deployments.erase(name);
  }
  persist(self, cluster::journal_record::undeploy(name));
}

bool try_defrag(self_ptr self, const std::string& name);

// The model cache's key for a deployment's file (model_cache_actor keys
// by content when a digest is pinned).
std::string model_key(const controller_state::deployment& dep) {
  return dep.model_sha256.empty() ? "path:" + dep.model_file : "sha256:" + dep.model_sha256;
}

// Where a deployment's file is cached: nodes that loaded it, and nodes
// that announced it in their join (placement's cached_on).
std::set<cluster::node_id> cache_holders(const controller_state& st, const controller_state::deployment& dep) {
  if (!st.config.cache_affinity) return {};
  auto out = cluster::nodes_holding(st.node_files, dep.model_file, dep.model_sha256);
  if (const auto it = st.cached_models.find(model_key(dep)); it != st.cached_models.end())
    out.insert(it->second.begin(), it->second.end());
  return out;
}

// Every deployment of that file learns where it is cached ("" = every
// deployment, after a node's announcement changed).
void note_cached(self_ptr self, const std::string& key) {
  auto& st = self->state;
  for (auto& [name, dep] : st.deployments)
    if (key.empty() || model_key(dep) == key) dep.spec.cached_on = cache_holders(st, dep);
}

// Places every missing slot of a deployment; returns how many are still missing.
std::size_t place_missing(self_ptr self, const std::string& name, std::string* why) {
  auto& st = self->state;
  auto& dep = st.deployments.at(name);
  const auto& cordoned = st.slots->cordoned_nodes();
  auto plan = cluster::place(*st.placement, {dep.spec}, {cordoned.begin(), cordoned.end()});
  if (!plan) {
    if (why) *why = plan.error().message;
    return dep.serving;
  }
  for (const auto& p : plan->placed) start_slot(self, p, st.slots->epoch(p.slot) + 1);
  // The warm pool's places are the first to go short: only replicas
  // missing beyond them are missing serving replicas.
  const std::size_t pool = dep.spec.replicas - dep.serving;
  const std::size_t missing = plan->unplaced.size() > pool ? plan->unplaced.size() - pool : 0;
  if (!plan->unplaced.empty() && missing == 0)
    spdlog::info("event=warm_pool_short deployment={} standby_wanted={} unplaced={} reason=\"{}\"", name, pool,
                 plan->unplaced.size(), plan->unplaced.front().reason);
  else
    for (const auto& u : plan->unplaced)
      spdlog::warn("event=replica_unplaced deployment={} slot={} reason=\"{}\"", name, u.slot.index, u.reason);
  if (why && !plan->unplaced.empty()) *why = plan->unplaced.front().reason;
  if (missing > 0 && st.config.defragment) try_defrag(self, name);
  return missing;
}

// Places queued slots, at most `migration_parallelism` warming at a time.
void pump_migrations(self_ptr self) {
  auto& st = self->state;
  std::set<cluster::node_id> down;
  for (const auto& [id, handle] : st.nodes)
    if (!handle) down.insert(id);
  const auto spec_of = [&](const std::string& name) -> const cluster::deployment_spec* {
    auto it = st.deployments.find(name);
    return it == st.deployments.end() ? nullptr : &it->second.spec;
  };
  auto r = st.slots->pump(*st.placement, spec_of, down);
  for (const auto& started : r.started) start_slot(self, started.placed, started.epoch);
  // No room now (nodes down or cordoned): it stays queued; a node coming
  // back or memory being released pumps again.
  if (r.waiting)
    spdlog::warn("event=replica_waiting_for_capacity deployment={} slot={} reason=\"{}\"", r.waiting->first.deployment,
                 r.waiting->first.index, r.waiting->second);
}

// A slot lost its replica: fence it (a new epoch, so the router and any
// straggler of the old replica know it is stale) and queue its placement
// elsewhere than `excluded`, if the deployment still wants it.
void replace_slot(self_ptr self, const std::string& deployment, std::uint32_t slot,
                  const std::vector<cluster::node_id>& excluded) {
  auto& st = self->state;
  auto it = st.deployments.find(deployment);
  if (it == st.deployments.end() || slot >= it->second.spec.replicas) return;
  const cluster::slot_ref ref{deployment, slot};
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch());
  const auto r = st.slots->replace(ref, excluded, now);
  if (!r.fenced) {
    // Quarantined for a while, not forever: capacity the slot needs may come
    // back (a node rejoins), and a transient cause may pass.
    spdlog::error("event=slot_given_up deployment={} slot={} replacements={} retry_in_ms={} "
                  "reason=\"keeps failing wherever it is placed\"",
                  deployment, slot, st.config.slot_max_replacements, st.config.slot_retry_after_ms);
    self->delayed_send(self, std::chrono::milliseconds(st.config.slot_retry_after_ms), retry_slot{deployment, slot});
    return;
  }
  persist(self, cluster::journal_record::slot_epoch(deployment, slot, r.epoch));
  self->send(st.router, fence_slot{deployment, slot, r.epoch});
  spdlog::info("event=slot_fenced deployment={} slot={} epoch={}", deployment, slot, r.epoch);
  pump_migrations(self);
}

// A replica is gone for good (or never ran): its memory, its place in the
// load gate and among the warming replacements go with it. Returns its
// drain record, if it was draining.
std::optional<cluster::draining_replica> forget_replica(self_ptr self, cluster::replica_id id) {
  auto& st = self->state;
  if (st.placement->replicas().count(id)) (void)st.placement->release(id);
  st.replicas.erase(id);
  st.slots->settled(id);
  if (st.loads->finished(id)) admit_loads(self);
  return st.drains->ended(id);
}

// Replicas by lifecycle state, for the exaserve_replicas gauge.
void update_replica_gauge(self_ptr self) {
  auto& st = self->state;
  if (!st.config.metrics) return;
  std::map<cluster::replica_state, std::size_t> counts;
  for (const auto& [id, r] : st.replicas) ++counts[r.state];
  for (const auto s : cluster::all_replica_states)
    cluster_metrics::series(st.config.metrics->replicas, cluster::to_string(s))->set(static_cast<double>(counts[s]));
}

// A replica of `name` fits nowhere: if moving a few others (within the
// migration limit) makes room, they drain toward their planned nodes and
// the slot is placed as they stop (defrag_progress). True when begun or
// already under way.
expected<bool> begin_drain(self_ptr self, cluster::replica_id id, cluster::drain_cause cause,
                           std::chrono::milliseconds deadline, const std::vector<cluster::node_id>& avoid);

bool try_defrag(self_ptr self, const std::string& name) {
  auto& st = self->state;
  if (st.defrag_waiting.count(name)) return true;
  // A rollout's versions trade room by their own steps (an in-place
  // replacement waits for the old replica to stop): nothing moves for them.
  const std::string base(cluster::split_version(name).base);
  if (auto r = st.rollouts.find(base); r != st.rollouts.end() && (rollout_active(st, base) || r->second.finishing))
    return false;
  const auto& dep = st.deployments.at(name);
  auto per = cluster::estimate(dep.spec.model, dep.spec.replica);
  if (!per) return false;
  cluster::defrag_request req;
  req.bytes_per_device = per->total_bytes();
  req.tensor_parallel = dep.spec.replica.tensor_parallel;
  req.max_moves = st.config.migration_parallelism;
  for (const auto n : st.slots->cordoned_nodes()) req.excluded.insert(n);
  for (const auto& n : st.placement->nodes()) {
    const auto h = st.nodes.find(n.id);
    if (h == st.nodes.end() || !h->second || st.drains->node_cause(n.id)) req.excluded.insert(n.id);
  }
  // Only replicas that serve or stand by, settled, move.
  for (const auto& [id, r] : st.replicas)
    if (!(cluster::accepts_requests(r.state) || r.state == replica_state::standby) || !in_pool(st, id, r))
      req.pinned.insert(id);
  req.may_host = [&st](const cluster::placed_slot& p, cluster::node_id node) {
    const auto d = st.deployments.find(p.slot.deployment);
    if (d == st.deployments.end() || !d->second.spec.max_replicas_per_node) return true;
    std::uint32_t there = 0;
    for (const auto& [id, r] : st.replicas) there += r.deployment == p.slot.deployment && r.node == node && id != p.replica;
    return there < *d->second.spec.max_replicas_per_node;
  };
  // Its own anti-affinity on the target node (as placement counts it).
  std::uint32_t limit = dep.spec.max_replicas_per_node.value_or(0);
  if (limit == 0) {
    const std::uint32_t usable = std::max<std::uint32_t>(
        1, static_cast<std::uint32_t>(st.placement->nodes().size() - std::min(st.placement->nodes().size(), req.excluded.size())));
    limit = (dep.spec.replicas + usable - 1) / usable;
  }
  req.may_target = [&st, &name, limit](cluster::node_id node) {
    std::uint32_t there = 0;
    for (const auto& [id, r] : st.replicas) there += r.deployment == name && r.node == node;
    return there < limit;
  };
  auto plan = cluster::plan_defrag(*st.placement, req);
  if (!plan) {
    spdlog::debug("event=defrag_none deployment={} reason=\"{}\"", name, plan.error().message);
    return false;
  }
  if (plan->moves.empty()) return false;  // room exists: what failed was not memory (anti-affinity)
  spdlog::info("event=defrag_plan deployment={} node={} moves={} bytes_moved={}", name, plan->node,
               plan->moves.size(), plan->bytes_moved);
  auto& movers = st.defrag_waiting[name];
  for (const auto& m : plan->moves) {
    // Off the target node, placed again by placement's own rules (the plan
    // proved a destination exists): never back into the room being made.
    const std::vector<cluster::node_id> avoid = {plan->node};
    spdlog::info("event=defrag_move deployment={} replica={} from_node={} from_device={} to_node={} to_device={}",
                 name, m.replica, m.from_node, m.from_device, m.to_node, m.to_device);
    auto begun = begin_drain(self, m.replica, cluster::drain_cause::defrag,
                             std::chrono::milliseconds(st.config.drain_deadline_ms), avoid);
    if (begun && *begun) movers.insert(m.replica);
  }
  if (movers.empty()) st.defrag_waiting.erase(name);
  return !movers.empty();
}

// A replica moving out of the way stopped (its memory is free): the
// deployments waiting for it try their slots again; once none of their
// movers is left, what still does not fit is reported.
void defrag_progress(self_ptr self, cluster::replica_id gone) {
  auto& st = self->state;
  std::vector<std::string> names;
  for (auto& [name, movers] : st.defrag_waiting)
    if (movers.erase(gone)) names.push_back(name);
  for (const auto& name : names) {
    if (!st.deployments.count(name)) {
      st.defrag_waiting.erase(name);
      continue;
    }
    const bool last = st.defrag_waiting[name].empty();
    if (!last) continue;  // the rest of the room is still being made
    st.defrag_waiting.erase(name);
    std::string why;
    const auto missing = place_missing(self, name, &why);  // may plan the next replica's room
    if (missing == 0) {
      spdlog::info("event=defrag_done deployment={}", name);
      st.defrag_rounds.erase(name);
    } else if (!st.defrag_waiting.count(name) || ++st.defrag_rounds[name] > 8) {
      spdlog::warn("event=defrag_incomplete deployment={} missing={} reason=\"{}\"", name, missing, why);
      st.defrag_waiting.erase(name);
      st.defrag_rounds.erase(name);
    }
  }
}

// Which live replicas of a deployment serve and which stand by
// (runtime/cluster/warm_pool): after a failure, a drain, a scale or a
// replica coming up. Nothing to do for a deployment without a pool.
void rebalance_pool(self_ptr self, const std::string& name) {
  auto& st = self->state;
  auto dep = st.deployments.find(name);
  if (dep == st.deployments.end()) return;
  std::vector<cluster::pool_member> members;
  bool any_standby = false;
  for (const auto& [id, r] : st.replicas) {
    if (r.deployment != name || !in_pool(st, id, r)) continue;
    members.push_back({id, r.standby, r.state, 0});
    any_standby |= r.standby;
  }
  if (!any_standby && dep->second.warm_percent == 0) return;
  const auto changes = cluster::rebalance(members, dep->second.serving);
  const auto tell = [&](cluster::replica_id id, bool standby) {
    auto& r = st.replicas.at(id);
    r.standby = standby;
    r.spec.standby = standby;  // a replica not spawned yet starts that way
    spdlog::info("event={} replica={} deployment={} slot={} state={}", standby ? "warm_pool_return" : "warm_pool_take",
                 id, name, r.slot, cluster::to_string(r.state));
    count_pool_event(self, name, standby ? "return" : "take");
    if (r.handle && r.told_standby != standby) {
      r.told_standby = standby;
      self->send(r.handle, set_standby{id, standby});
    } else if (!r.spawned) {
      r.told_standby = standby;
    }
  };
  for (const auto id : changes.activate) tell(id, false);
  for (const auto id : changes.deactivate) tell(id, true);
  update_standby_gauge(self, name);
}

void count_pool_event(self_ptr self, const std::string& deployment, std::string_view event) {
  if (self->state.config.metrics)
    cluster_metrics::series(self->state.config.metrics->warm_pool_events, deployment, event)->inc();
}

// Only loaded standbys count: one still loading cannot take a failed
// replica's place without a load on the critical path. The wanted size
// goes with it, so that an alert on an empty pool can tell a pool that
// should hold standbys (0 of 2) from one suspended or too small (0 of 0);
// an undeployed deployment reads 0 of 0.
void update_standby_gauge(self_ptr self, const std::string& deployment) {
  auto& st = self->state;
  if (!st.config.metrics) return;
  std::size_t ready = 0;
  for (const auto& [id, r] : st.replicas)
    ready += r.deployment == deployment && r.standby && r.state == replica_state::standby;
  const auto dep = st.deployments.find(deployment);
  const auto wanted = dep == st.deployments.end() ? 0 : pool_size(st, deployment, dep->second);
  cluster_metrics::series(st.config.metrics->warm_pool_standby, deployment)->set(static_cast<double>(ready));
  cluster_metrics::series(st.config.metrics->warm_pool_wanted, deployment)->set(static_cast<double>(wanted));
}

void count_migration(self_ptr self, std::string_view reason) {
  if (self->state.config.metrics) cluster_metrics::series(self->state.config.metrics->migrations, reason)->inc();
}

// Queues the slot's placement elsewhere now (make before break): a planned
// move, so it has a new epoch but spends no crash budget.
void move_slot(self_ptr self, const std::string& deployment, std::uint32_t slot,
               const std::vector<cluster::node_id>& excluded) {
  auto& st = self->state;
  auto it = st.deployments.find(deployment);
  if (it == st.deployments.end() || slot >= it->second.spec.replicas) return;
  const cluster::slot_ref ref{deployment, slot};
  const auto epoch = st.slots->move(ref, excluded);
  persist(self, cluster::journal_record::slot_epoch(deployment, slot, epoch));
  self->send(st.router, fence_slot{deployment, slot, epoch});
  spdlog::info("event=slot_moving deployment={} slot={} epoch={}", deployment, slot, epoch);
}

// One timer for every drain: set for the earliest deadline, and only when
// none is set for that moment or earlier (a node drain of N replicas must
// not start N timer chains).
void schedule_drain_deadline(self_ptr self) {
  auto& st = self->state;
  const auto next = st.drains->next_deadline_ns();
  if (!next || (st.drain_timer_ns && *st.drain_timer_ns <= *next)) return;
  st.drain_timer_ns = *next;
  const auto in = std::max<std::int64_t>(0, *next - clock_ns(self));
  self->delayed_send(self, std::chrono::nanoseconds(in), drain_deadline_atom::value);
}

void drain_moved(self_ptr self, cluster::replica_id id);

// Starts draining one replica: no new requests (it says `draining`, and
// then its slot is placed elsewhere: see drain_moved), in-flight requests
// finish or are resumed elsewhere at the deadline. False when it was
// draining already.
expected<bool> begin_drain(self_ptr self, cluster::replica_id id, cluster::drain_cause cause,
                           std::chrono::milliseconds deadline, const std::vector<cluster::node_id>& avoid) {
  auto& st = self->state;
  const auto& r = st.replicas.at(id);
  auto begun = st.drains->begin(id, r.node, {r.deployment, r.slot}, cause, clock_ns(self), deadline, avoid);
  if (!begun || !*begun) return begun;
  spdlog::info("event=replica_drain_started replica={} deployment={} slot={} node={} state={} cause={} deadline_ms={}",
               id, r.deployment, r.slot, r.node, cluster::to_string(r.state), cluster::to_string(cause),
               deadline.count());
  if (st.config.metrics) cluster_metrics::series(st.config.metrics->drains, std::string(cluster::to_string(cause)))->inc();
  rebalance_pool(self, r.deployment);  // a standby serves in its stead now
  if (!r.spawned) {  // never started (waiting for its turn or its node): nothing to drain
    drain_moved(self, id);
    forget_replica(self, id);
    update_replica_gauge(self);
    pump_migrations(self);
    return true;
  }
  const auto node = st.nodes.find(r.node);
  if (node != st.nodes.end() && node->second)
    self->send(node->second, stop_replica{id, true, static_cast<std::uint32_t>(deadline.count())});
  schedule_drain_deadline(self);
  return true;
}

// A draining replica's slot goes elsewhere now, once: when it says it
// drains (it can no longer be fenced mid-request), or when it ended first.
void drain_moved(self_ptr self, cluster::replica_id id) {
  auto& st = self->state;
  if (!st.drains->mark_slot_moved(id)) return;
  const auto* d = st.drains->find(id);
  count_migration(self, cluster::to_string(d->cause));
  move_slot(self, d->slot.deployment, d->slot.index, d->avoid);
  pump_migrations(self);
}

// Whether the deployment still wants `slot` and no replica but those in
// the middle of a drain fills it.
bool slot_wanted_and_empty(self_ptr self, const std::string& deployment, std::uint32_t slot) {
  auto& st = self->state;
  auto dep = st.deployments.find(deployment);
  if (dep == st.deployments.end() || slot >= dep->second.spec.replicas) return false;
  if (st.slots->queued({deployment, slot})) return false;
  for (const auto& [id, r] : st.replicas)
    if (r.deployment == deployment && r.slot == slot && !st.drains->draining(id)) return false;
  return true;
}

void on_replica_event(self_ptr self, const replica_event& ev) {
  auto& st = self->state;
  auto it = st.replicas.find(ev.id);
  if (it == st.replicas.end()) return;  // already forgotten
  const auto state = static_cast<replica_state>(ev.state);
  const auto before = it->second.state;
  it->second.state = state;
  it->second.reason = ev.reason;
  if (ev.handle) it->second.handle = ev.handle;
  bool swapped = false;
  if (cluster::serves_requests(before) && (state == replica_state::creating || state == replica_state::loading) &&
      !it->second.standby) {
    // Restarted in place by its node: it reloads. A warm standby of the
    // deployment serves meanwhile, and this one joins the pool when warm.
    for (const auto& [id, r] : st.replicas)
      if (r.deployment == ev.deployment && r.standby && r.state == replica_state::standby && !st.drains->draining(id)) {
        it->second.standby = it->second.spec.standby = true;
        swapped = true;
        break;
      }
  }
  const bool starting = state == replica_state::creating || state == replica_state::loading;
  if (it->second.handle && !cluster::is_terminal(state) &&
      (starting || it->second.standby != it->second.told_standby)) {
    // A (re)started replica runs the spec it was spawned with; one designated
    // before its handle was known has not heard: told now.
    it->second.told_standby = it->second.standby;
    self->send(it->second.handle, set_standby{ev.id, it->second.standby});
  }
  if (swapped) rebalance_pool(self, ev.deployment);
  // Loaded and warm (serving or standing by): its migration place and its
  // turn to load are done.
  const bool warm = cluster::serves_requests(state) || state == replica_state::standby;
  const bool was_warm = cluster::serves_requests(before) || before == replica_state::standby;
  if (warm && !was_warm) {  // just loaded (not the ready/serving flips of every request)
    if (auto dep = st.deployments.find(it->second.deployment); dep != st.deployments.end()) {
      const auto key = model_key(dep->second);
      if (st.cached_models[key].insert(it->second.node).second) note_cached(self, key);
    }
    if (state == replica_state::standby) update_standby_gauge(self, it->second.deployment);
  }
  if ((cluster::accepts_requests(state) || state == replica_state::standby) && st.slots->settled(ev.id))
    pump_migrations(self);
  if (warm && st.loads->finished(ev.id)) admit_loads(self);  // loaded: the next may go
  if (state == replica_state::degraded && before != replica_state::degraded) {
    // Replaced if it does not recover in time (checked against this entry time).
    it->second.degraded_since_ns = clock_ns(self);
    if (st.config.degraded_replace_after_ms > 0)
      self->delayed_send(self, std::chrono::milliseconds(st.config.degraded_replace_after_ms),
                         degraded_check{ev.id, it->second.degraded_since_ns});
  }
  if (state == replica_state::draining) drain_moved(self, ev.id);
  if (cluster::is_terminal(state)) drain_moved(self, ev.id);  // ended before it said it drains
  if (state == replica_state::stopped) {
    const auto rec = it->second;
    auto drained = forget_replica(self, ev.id);
    defrag_progress(self, ev.id);  // the room it made goes to the deployment waiting for it first
    if (auto d = drained) {
      spdlog::info("event=replica_drained replica={} deployment={} slot={} node={} cause={} forced={} ms={}", ev.id,
                   d->slot.deployment, d->slot.index, d->node, cluster::to_string(d->cause), d->forced,
                   (clock_ns(self) - d->started_ns) / 1000000);
    } else if (slot_wanted_and_empty(self, rec.deployment, rec.slot)) {
      // Stopped without a drain this controller knows of (one begun by its
      // predecessor): the slot is still wanted, so it goes elsewhere.
      count_migration(self, "orphaned");
      move_slot(self, rec.deployment, rec.slot, {});
    }
    pump_migrations(self);
  } else if (state == replica_state::failed) {
    const auto rec = it->second;
    const bool was_draining = forget_replica(self, ev.id).has_value();
    defrag_progress(self, ev.id);
    // A standby takes its place at once; the replacement loads as a standby.
    rebalance_pool(self, rec.deployment);
    // A draining replica's slot was placed again when the drain began.
    if (was_draining) pump_migrations(self);
    // A crash loop on one node: try the others first.
    else replace_slot(self, rec.deployment, rec.slot, {rec.node});
  }
  const bool routine = (before == replica_state::ready && state == replica_state::serving) ||
                       (before == replica_state::serving && state == replica_state::ready);
  if (state != before && !routine &&
      (state == replica_state::standby || state == replica_state::ready || state == replica_state::serving ||
       state == replica_state::stopped || state == replica_state::draining))
    rebalance_pool(self, ev.deployment);
  update_replica_gauge(self);
}

// Every replica on `node` is lost (the node actor died, or its silence was
// confirmed): tell the router, release their memory, place them elsewhere.
void migrate_node(self_ptr self, cluster::node_id node, const std::string& why) {
  auto& st = self->state;
  std::vector<controller_state::replica_record> lost;
  for (const auto& [id, r] : st.replicas)
    if (r.node == node) lost.push_back(r);
  spdlog::error("event=node_lost node={} replicas={} reason=\"{}\"", node, lost.size(), why);
  for (auto& [key, nodes] : st.cached_models)
    if (nodes.erase(node)) note_cached(self, key);
  if (st.node_files.erase(node)) note_cached(self, "");
  std::vector<controller_state::replica_record> to_replace;
  for (const auto& r : lost) {
    const replica_event ev{r.id, r.deployment, r.slot, r.epoch, node, r.device,
                           static_cast<std::uint8_t>(replica_state::failed), why, caf::actor{}};
    self->send(st.router, ev);
    cluster::event e;  // the replica cannot say so itself: its node is gone
    e.kind = cluster::event_kind::replica_state;
    e.replica = r.id;
    e.deployment = r.deployment;
    e.slot = r.slot;
    e.epoch = r.epoch;
    e.node = node;
    e.detail = "failed";
    log_event(self, st.config.hooks, e);
    if (auto d = forget_replica(self, r.id); d && d->slot_moved) continue;  // placed elsewhere already
    to_replace.push_back(r);
  }
  // Standbys elsewhere serve in their stead at once (all of the node's
  // replicas forgotten first, so that none of its own standbys is taken);
  // the replacements then load as standbys.
  std::set<std::string> deployments;
  for (const auto& r : lost) deployments.insert(r.deployment);
  for (const auto& d : deployments) rebalance_pool(self, d);
  for (const auto& r : to_replace) {
    count_migration(self, "node_lost");
    replace_slot(self, r.deployment, r.slot, {node});
  }
  for (const auto& r : lost) defrag_progress(self, r.id);
  pump_migrations(self);
}

void on_node_down(self_ptr self, cluster::node_id node, const caf::error& reason) {
  auto& st = self->state;
  st.nodes[node] = caf::actor{};
  cluster::event e;
  e.kind = cluster::event_kind::fault_detected;
  e.node = node;
  e.detail = "monitor";
  log_event(self, st.config.hooks, e);
  if (!st.config.migrate_on_link_loss && reason == caf::exit_reason::remote_link_unreachable) {
    // Suspected, not lost: giving its slots away now would put a second
    // replica in each while this one may still serve.
    std::size_t replicas = 0;
    for (const auto& [id, r] : st.replicas) replicas += r.node == node;
    spdlog::warn("event=node_link_lost node={} replicas={} detail=\"suspected: it may still serve under its lease; "
                 "its slots move if its heartbeats are confirmed lost\"",
                 node, replicas);
    return;
  }
  migrate_node(self, node, "node actor down");
}

// The health monitor's verdicts: confirmed nodes lose their replicas (they
// are placed elsewhere) and take no new ones; a node that speaks again after
// that learns the current epochs, so what it still runs stops itself.
void on_node_health(self_ptr self, const node_health_msg& m) {
  auto& st = self->state;
  const auto health = static_cast<cluster::node_health>(m.health);
  const auto before = st.node_health[m.node];
  st.node_health[m.node] = health;
  if (health == cluster::node_health::confirmed) {
    st.slots->cordon(m.node);
    migrate_node(self, m.node, "heartbeats confirmed lost");
  } else if (health == cluster::node_health::healthy && before == cluster::node_health::confirmed) {
    if (!st.drains->node_drained(m.node)) st.slots->uncordon(m.node);  // a drained node stays cordoned
    fence_notice notice;
    for (const auto& [slot, epoch] : st.slots->epochs()) notice.slots.push_back({slot.deployment, slot.index, epoch});
    const auto node = st.nodes.find(m.node);
    if (node != st.nodes.end())
      control_send(self, st.config.hooks, m.node, cluster::message_class::control, node->second, notice);
    spdlog::info("event=node_rejoined node={} slots_fenced={}", m.node, notice.slots.size());
    pump_migrations(self);
  }
}

// Drains every replica on a node and keeps new ones off it.
std::uint32_t drain_node_replicas(self_ptr self, cluster::node_id node, cluster::drain_cause cause,
                                  std::chrono::milliseconds deadline) {
  auto& st = self->state;
  st.slots->cordon(node);
  std::vector<cluster::replica_id> ids;
  for (const auto& [id, r] : st.replicas)
    if (r.node == node) ids.push_back(id);
  std::uint32_t begun = 0;
  for (const auto id : ids) {
    auto ok = begin_drain(self, id, cause, deadline, {node});
    if (!ok) spdlog::error("event=replica_drain_refused replica={} node={} error=\"{}\"", id, node, to_string(ok.error()));
    else begun += *ok;
  }
  spdlog::info("event=node_drain_started node={} cause={} replicas={} deadline_ms={}", node, cluster::to_string(cause),
               begun, deadline.count());
  return begun;
}

// Drains past their deadline: stopped now; their in-flight requests see
// the replica go and resume elsewhere from the tokens they have.
void on_drain_deadline(self_ptr self) {
  auto& st = self->state;
  // A timer set for a later moment than this one (a deadline moved earlier
  // since) is still out; only an on-time one clears the mark.
  if (st.drain_timer_ns && *st.drain_timer_ns <= clock_ns(self)) st.drain_timer_ns.reset();
  for (const auto id : st.drains->expire(clock_ns(self))) {
    auto it = st.replicas.find(id);
    if (it == st.replicas.end()) {
      (void)st.drains->ended(id);
      continue;
    }
    spdlog::warn("event=replica_drain_deadline replica={} deployment={} slot={} node={} "
                 "detail=\"in-flight requests resume elsewhere\"",
                 id, it->second.deployment, it->second.slot, it->second.node);
    const auto node = st.nodes.find(it->second.node);
    if (node != st.nodes.end() && node->second) self->send(node->second, stop_replica{id, false});
  }
  schedule_drain_deadline(self);
}

caf::result<drain_reply> on_drain(self_ptr self, const drain_msg& m) {
  auto& st = self->state;
  auto deadline = st.drains->deadline_for(std::chrono::milliseconds(m.deadline_ms));
  if (!deadline) return to_caf(deadline.error());
  const auto deadline_ms = static_cast<std::uint32_t>(deadline->count());
  if (m.kind == static_cast<std::uint8_t>(api::drain_request::target::replica)) {
    if (m.undrain)
      return to_caf({errc::invalid_argument, "a draining replica cannot return to service (its slot is already placed "
                                             "elsewhere); undrain applies to nodes"});
    if (!st.replicas.count(m.id))
      return to_caf({errc::not_found, "no replica " + std::to_string(m.id) + " (exaserve-cli status lists them)"});
    auto ok = begin_drain(self, m.id, cluster::drain_cause::replica, *deadline, {});
    if (!ok) return to_caf(ok.error());
    return drain_reply{{*ok ? 1u : 0u, deadline_ms}};
  }
  const auto node = static_cast<cluster::node_id>(m.id);
  if (m.id > std::numeric_limits<cluster::node_id>::max() || !st.placement->node_index(node))
    return to_caf({errc::not_found, "no node " + std::to_string(m.id) + " (exaserve-cli status lists them)"});
  if (m.undrain) {
    if (!st.drains->undrain_node(node)) return to_caf({errc::invalid_argument, "node " + std::to_string(node) + " is not drained"});
    persist(self, cluster::journal_record::undrain_node(node));
    if (st.node_health[node] != cluster::node_health::confirmed) st.slots->uncordon(node);
    spdlog::info("event=node_undrained node={}", node);
    pump_migrations(self);
    for (const auto& [name, dep] : st.deployments) (void)place_missing(self, name, nullptr);
    return drain_reply{{0, 0}};
  }
  st.drains->drain_node(node, cluster::drain_cause::node);
  persist(self, cluster::journal_record::drain_node(node));
  return drain_reply{{drain_node_replicas(self, node, cluster::drain_cause::node, *deadline), deadline_ms}};
}

// A node process is stopping (SIGTERM): its slots move and its replicas
// drain; a restarted process may take slots again.
void on_node_leaving(self_ptr self, const node_leaving& m) {
  auto& st = self->state;
  if (!st.placement->node_index(m.node)) return;
  auto deadline = st.drains->deadline_for(std::chrono::milliseconds(m.deadline_ms));
  if (!deadline) deadline = std::chrono::milliseconds(st.config.drain_deadline_ms);
  st.drains->drain_node(m.node, cluster::drain_cause::shutdown);
  // Only a new process of the node lifts this drain, not a reconnect of this one.
  if (auto h = st.nodes.find(m.node); h != st.nodes.end() && h->second) st.leaving_handles[m.node] = h->second.address();
  drain_node_replicas(self, m.node, cluster::drain_cause::shutdown, *deadline);
}

// Still degraded since the same moment, past the limit: replace it.
void on_degraded_check(self_ptr self, const degraded_check& m) {
  auto& st = self->state;
  auto it = st.replicas.find(m.id);
  if (it == st.replicas.end() || it->second.state != replica_state::degraded ||
      it->second.degraded_since_ns != m.since_ns)
    return;
  spdlog::warn("event=replica_degraded_too_long replica={} deployment={} slot={} node={} degraded_ms={} reason=\"{}\"",
               m.id, it->second.deployment, it->second.slot, it->second.node, st.config.degraded_replace_after_ms,
               it->second.reason);
  auto ok = begin_drain(self, m.id, cluster::drain_cause::degraded, std::chrono::milliseconds(st.config.drain_deadline_ms),
                        {it->second.node});
  if (!ok) spdlog::error("event=replica_drain_refused replica={} error=\"{}\"", m.id, to_string(ok.error()));
}

// A deployment's draft (api::deploy_request::draft_model): checked against
// its model here, where the deploy is refused with both files named, rather
// than on every node; its shape joins the replica's memory estimate.
expected<void> add_draft(controller_state::deployment& dep, const api::deploy_request& req,
                         const model::llama_model* target) {
  const std::string who = "deployment '" + req.name + "': ";
  if (req.draft_model.empty()) {
    if (req.draft_tokens != 0 || !req.draft_sha256.empty())
      return make_error(errc::invalid_argument, who + "draft_tokens and draft_sha256 need a draft_model");
    return {};
  }
  if (!req.draft_sha256.empty() && !model::is_sha256_hex(req.draft_sha256))
    return make_error(errc::invalid_argument, who + "draft sha256 must be 64 hex digits, got '" + req.draft_sha256 + "'");
  if (!target)
    return make_error(errc::invalid_argument, who + "a draft model needs a model file to draft for, not the preset '" +
                                                  dep.model_file + "'");
  auto draft = model::llama_model::load(req.draft_model);
  if (!draft) return make_error(draft.error().code, who + "draft model: " + draft.error().message);
  const auto k = req.draft_tokens ? req.draft_tokens : engine::default_draft_tokens;
  if (auto ok = engine::check_draft(*target, **draft, k); !ok)
    return make_error(ok.error().code, who + ok.error().message);
  dep.draft_model = req.draft_model;
  dep.draft_sha256 = model::normalize_sha256(req.draft_sha256);
  dep.draft_tokens = req.draft_tokens;
  dep.spec.replica.draft = cluster::model_shape_from(**draft);
  return {};
}

// Validates a deploy request and reads the model's shape. Errors are the
// caller's to fix (bad name, file, policy, counts).
expected<controller_state::deployment> make_deployment(self_ptr self, const api::deploy_request& req,
                                                       bool allow_cold = true) {
  auto& st = self->state;
  if (auto ok = check_name(req.name); !ok) return std::unexpected(ok.error());
  if ((req.replicas == 0 && !allow_cold) || req.replicas > max_replicas_per_deployment)
    return make_error(errc::invalid_argument, "replicas must be in [0, " + std::to_string(max_replicas_per_deployment) +
                                                  "] (0: cold, started by its first request)");
  const std::string routing = req.routing.empty() ? st.config.default_routing : req.routing;
  if (auto policy = cluster::make_routing_policy(routing); !policy) return std::unexpected(policy.error());
  static_assert(api::deploy_request{}.prefix_slack_tokens == cluster::prefix_aware_config{}.load_slack_tokens &&
                    api::deploy_request{}.prefix_slack_ratio == cluster::prefix_aware_config{}.load_slack_ratio &&
                    api::deploy_request{}.prefix_slack_s == cluster::prefix_aware_config{}.load_slack_s,
                "a deployment's default prefix slack is the router's");
  if (auto ok = cluster::check_prefix_slack(req.prefix_slack_tokens, req.prefix_slack_ratio, req.prefix_slack_s); !ok)
    return make_error(ok.error().code, "deployment '" + req.name + "': " + ok.error().message);
  const std::string file = req.model_file.empty() ? st.config.default_model_file : req.model_file;
  auto ref = cluster::parse_model_ref(file);
  if (!ref) return std::unexpected(ref.error());
  if (!req.model_sha256.empty() && !model::is_sha256_hex(req.model_sha256))
    return make_error(errc::invalid_argument, "sha256 must be 64 hex digits, got '" + req.model_sha256 + "'");
  if (!req.tenant.empty())
    if (auto ok = auth::check_tenant(req.tenant); !ok) return std::unexpected(ok.error());
  // Refused here rather than at each router, where it would only fail chats.
  if (auto ok = jinja::check_template_text(req.chat_template); !ok)
    return make_error(ok.error().code, "deployment '" + req.name + "': " + ok.error().message);
  // Tensor parallelism: every replica on `tp` devices of one node.
  const std::uint32_t tp = req.tensor_parallel ? req.tensor_parallel : 1;
  if (!cluster::valid_tensor_parallel(tp))
    return make_error(errc::invalid_argument, "deployment '" + req.name + "': tensor_parallel must be 1, 2, 4 or 8, got " +
                                                  std::to_string(tp));
  if (tp > 1 && !req.draft_model.empty())
    return make_error(errc::unsupported, "deployment '" + req.name +
                                             "': speculative decoding under tensor parallelism is not supported");
  controller_state::deployment dep;
  dep.spec.replica.tensor_parallel = tp;
  dep.chat_template = req.chat_template;
  dep.model_sha256 = model::normalize_sha256(req.model_sha256);
  dep.tenant = req.tenant;
  dep.model_file = file;
  if (ref->is_preset()) {  // simulation: a published shape, no weights
    dep.spec.model = *ref->preset;
    dep.facts = {"simulated", std::string(cluster::to_string(dep.spec.model.weight_precision)), ""};
    if (auto ok = add_draft(dep, req, nullptr); !ok) return std::unexpected(ok.error());
  } else {
    // Read for its shape only: nodes and gateways open the file themselves.
    auto model = model::llama_model::load(file);
    if (!model) return std::unexpected(model.error());
    dep.spec.model = cluster::model_shape_from(**model);
    dep.facts = model::describe_model((*model)->file());
    if (tp > 1)  // the weights themselves must split: heads, FFN and whole quant blocks
      if (auto ok = engine::check_tp_split((*model)->config(), (*model)->weights(), tp); !ok)
        return make_error(ok.error().code, "deployment '" + req.name + "': tensor_parallel " + std::to_string(tp) +
                                               ": " + ok.error().message);
    if (auto ok = add_draft(dep, req, model->get()); !ok) return std::unexpected(ok.error());
  }
  dep.routing = routing;
  dep.prefix_slack_tokens = req.prefix_slack_tokens;
  dep.prefix_slack_ratio = req.prefix_slack_ratio;
  dep.prefix_slack_s = req.prefix_slack_s;
  dep.spec.name = req.name;
  dep.serving = req.replicas;
  dep.warm_percent = std::min(req.warm_pool_percent, cluster::max_warm_pool_percent);
  dep.spec.replicas = req.replicas + cluster::warm_count(dep.serving, dep.warm_percent);
  if (req.autoscale_max > max_replicas_per_deployment || req.idle_to_zero_s > 604800)
    return make_error(errc::invalid_argument, "autoscale_max must be at most " +
                                                  std::to_string(max_replicas_per_deployment) +
                                                  " and idle_to_zero_s at most 604800 (a week)");
  if (req.autoscale_max > 0) {
    auto& a = dep.autoscale;
    a = st.config.autoscale;
    a.min_replicas = req.autoscale_min;
    a.max_replicas = req.autoscale_max;
    if (!req.autoscale_metric.empty()) {
      auto m = cluster::scale_metric_from_string(req.autoscale_metric);
      if (!m) return std::unexpected(m.error());
      a.metric = *m;
    } else {
      a.metric = cluster::scale_metric::queue_depth;
    }
    a.target = req.autoscale_target > 0 ? req.autoscale_target : cluster::default_target(a.metric);
    a.idle_to_zero_ms = req.idle_to_zero_s * 1000;
    if (a.idle_to_zero_ms > 0 && a.min_replicas > 0)
      return make_error(errc::invalid_argument, "idle_to_zero_s needs autoscale_min 0 (it scales to zero)");
    if (auto ok = cluster::validate(a); !ok) return std::unexpected(ok.error());
    dep.spec.pack_nodes = st.config.consolidate;
  }
  if (req.max_replicas_per_node) dep.spec.max_replicas_per_node = req.max_replicas_per_node;
  dep.spec.replica.kv_tokens = req.kv_tokens ? req.kv_tokens : st.config.default_kv_tokens;
  dep.spec.replica.max_batch_tokens = st.config.max_batch_tokens;
  dep.spec.replica.replica_overhead_bytes = st.config.replica_overhead_bytes;
  return dep;
}

void arm_autoscale_tick(self_ptr self);

void register_deployment(self_ptr self, const std::string& name, const controller_state::deployment& dep) {
  self->state.deployments[name] = dep;
  self->state.deployments[name].spec.cached_on = cache_holders(self->state, dep);
  if (dep.autoscale.enabled()) {
    self->state.scalers.insert_or_assign(name, cluster::autoscaler(dep.autoscale));
    arm_autoscale_tick(self);
  } else {
    self->state.scalers.erase(name);
  }
  self->send(self->state.router, announce(name, dep));
}

caf::result<ok_atom> on_deploy(self_ptr self, const api::deploy_request& req, bool version_of_rollout = false) {
  auto& st = self->state;
  if (!version_of_rollout && req.name.find('@') != std::string::npos)
    return to_caf({errc::invalid_argument, "'" + req.name + "': '@' names a version; deploy the plain name and add "
                                           "versions with exaserve-cli rollout"});
  if (auto cur = st.current_versions.find(req.name); !version_of_rollout && cur != st.current_versions.end())
    return to_caf({errc::invalid_argument, "deployment '" + req.name + "' exists (its current version is " +
                                               cur->second + "); use scale, rollout or undeploy"});
  if (st.deployments.count(req.name))
    return to_caf({errc::invalid_argument, "deployment '" + req.name + "' exists; use scale or undeploy"});
  auto dep = make_deployment(self, req);
  if (!dep) return to_caf(dep.error());
  register_deployment(self, req.name, *dep);
  if (req.replicas == 0) {  // cold from the start: its first request wakes it
    self->send(st.router, deployment_cold{req.name, true});
    spdlog::info("event=deployed deployment={} model={} replicas=0 cold=true", req.name, dep->model_file);
    api::deploy_request resolved = req;
    resolved.model_file = dep->model_file;
    remember(self, resolved);
    return ok_atom::value;
  }
  std::string why;
  const std::size_t missing = place_missing(self, req.name, &why);
  spdlog::info("event=deployed deployment={} model={} replicas={} placed={} routing={}", req.name, dep->model_file,
               req.replicas, req.replicas - missing, dep->routing);
  // Nothing fits: refuse rather than keep an empty deployment -- unless
  // replicas are moving out of the way to make room for it.
  if (missing == req.replicas && !st.defrag_waiting.count(req.name)) {  // nothing fits: refuse rather than keep an empty deployment
    st.deployments.erase(req.name);
    self->send(st.router, deployment_removed{req.name});
    return to_caf({errc::unavailable, "cannot place any replica of '" + req.name + "': " + why});
  }
  api::deploy_request resolved = req;
  resolved.model_file = dep->model_file;
  remember(self, resolved);
  return ok_atom::value;
}

void stop_slots(self_ptr self, const std::string& name, std::uint32_t from_slot) {
  auto& st = self->state;
  std::vector<cluster::replica_id> never_started;
  for (auto& [id, r] : st.replicas) {
    if (r.deployment != name || r.slot < from_slot) continue;
    if (!r.spawned) {  // still waiting for its turn to load (or for its node): nothing runs
      never_started.push_back(id);
      continue;
    }
    const auto node = st.nodes.find(r.node);
    if (node != st.nodes.end() && node->second) self->send(node->second, stop_replica{id, true});
  }
  for (const auto id : never_started) forget_replica(self, id);
  update_replica_gauge(self);
}


// The plain name a deployment's current version is served under, or the
// deployment itself.
std::string current_of(const controller_state& st, const std::string& base) {
  const auto it = st.current_versions.find(base);
  return it == st.current_versions.end() ? base : it->second;
}

std::vector<api::model_info> list_models(self_ptr self) {
  std::vector<api::model_info> out;
  for (const auto& [name, dep] : self->state.deployments) {
    // The current version is listed under the plain name; others as NAME@V.
    const std::string base(cluster::split_version(name).base);
    const std::string listed = current_of(self->state, base) == name ? base : name;
    api::model_info mi;
    mi.name = listed;
    mi.model_file = dep.model_file;
    mi.replicas_desired = dep.serving;
    mi.context_length = dep.spec.model.context_length;
    mi.tenant = dep.tenant;
    mi.version = cluster::version_of(name);
    mi.architecture = dep.facts.architecture;
    mi.quantization = dep.facts.quantization;
    mi.tokenizer = dep.facts.tokenizer;
    mi.draft_model = dep.draft_model;
    if (!dep.draft_model.empty()) mi.draft_tokens = dep.draft_tokens ? dep.draft_tokens : engine::default_draft_tokens;
    mi.routing = dep.routing;
    mi.prefix_slack_tokens = dep.prefix_slack_tokens;
    mi.prefix_slack_ratio = dep.prefix_slack_ratio;
    mi.prefix_slack_s = dep.prefix_slack_s;
    for (const auto& [id, r] : self->state.replicas)
      if (r.deployment == name && cluster::serves_requests(r.state)) ++mi.replicas_ready;
    // The worst of what the gateways saw over the last minute.
    if (auto seen = self->state.loads_seen.find(name); seen != self->state.loads_seen.end()) {
      const auto now = clock_ns(self);
      std::erase_if(seen->second.by_router, [&](const auto& e) {
        return now - e.second.first > std::int64_t{10'000'000'000};  // a gateway gone quiet
      });
      for (const auto& [router, report] : seen->second.by_router) {
        const auto& l = report.second;
        mi.ttft_p50_ms = std::max(mi.ttft_p50_ms, l.recent_ttft_p50_ms);
        mi.ttft_p99_ms = std::max(mi.ttft_p99_ms, l.recent_ttft_p99_ms);
        mi.tpot_p50_ms = std::max(mi.tpot_p50_ms, l.recent_tpot_p50_ms);
        mi.tpot_p99_ms = std::max(mi.tpot_p99_ms, l.recent_tpot_p99_ms);
      }
    }
    out.push_back(std::move(mi));
  }
  return out;
}

// Stops a replica a node reported that this controller does not want.
void stop_reported(self_ptr self, const caf::actor& node, const running_replica& r, const char* why) {
  spdlog::warn("event=replica_not_adopted replica={} deployment={} slot={} epoch={} reason=\"{}\"", r.spec.id,
               r.spec.deployment, r.spec.slot, r.spec.epoch, why);
  self->send(node, stop_replica{r.spec.id, false});
}

// A node (re)joined reporting a replica. A replica this controller placed
// keeps its record; one it does not know (this controller restarted, or the
// slot moved on while the node was away) is adopted when its slot is free
// and its epoch is the journal's, and stopped otherwise: never two serving
// replicas for one slot.
void reconcile_replica(self_ptr self, const node_join& m, const running_replica& r) {
  auto& st = self->state;
  if (auto it = st.replicas.find(r.spec.id); it != st.replicas.end()) {
    if (it->second.node != m.node) return stop_reported(self, m.handle, r, "its id belongs to another node's replica");
    it->second.handle = r.handle;
    it->second.spawned = true;
    return;
  }
  auto dep = st.deployments.find(r.spec.deployment);
  if (dep == st.deployments.end() || r.spec.slot >= dep->second.spec.replicas)
    return stop_reported(self, m.handle, r, "its deployment no longer wants the slot");
  const cluster::slot_ref ref{r.spec.deployment, r.spec.slot};
  if (st.slots->stale(ref, r.spec.epoch)) return stop_reported(self, m.handle, r, "its epoch is stale");
  for (const auto& [id, rec] : st.replicas)
    if (rec.deployment == ref.deployment && rec.slot == ref.index)
      return stop_reported(self, m.handle, r, "another replica fills its slot");
  auto per_device = cluster::estimate(dep->second.spec.model, dep->second.spec.replica);
  if (!per_device) return stop_reported(self, m.handle, r, "its memory cannot be estimated");
  cluster::placed_slot p{ref, "", r.spec.id, m.node, devices_of(r.spec), *per_device};
  if (auto ok = st.placement->commit(p); !ok) return stop_reported(self, m.handle, r, "its device has no room in the ledger");
  if (st.slots->raise_epoch(ref, r.spec.epoch))
    persist(self, cluster::journal_record::slot_epoch(ref.deployment, ref.index, r.spec.epoch));
  persist(self, cluster::journal_record::replica_taken(r.spec.id));
  auto& rec = st.replicas[r.spec.id];
  rec = {r.spec.id, ref.deployment, ref.index, r.spec.epoch, m.node, r.spec.device, cluster::replica_state::ready,
         "adopted", true, true, r.spec, r.handle};
  // It was spawned so; it may have been told otherwise since. Told again
  // (it then says which state it is in), and rebalanced with the rest.
  rec.standby = rec.told_standby = r.spec.standby;
  if (rec.handle) self->send(rec.handle, set_standby{rec.id, rec.standby, true});
  if (!st.reconciling) rebalance_pool(self, ref.deployment);
  spdlog::info("event=replica_adopted replica={} deployment={} slot={} epoch={} node={}", r.spec.id, ref.deployment,
               ref.index, r.spec.epoch, m.node);
  self->send(st.router, replica_event{rec.id, rec.deployment, rec.slot, rec.epoch, rec.node, rec.device,
                                      static_cast<std::uint8_t>(rec.state), rec.reason, rec.handle});
}

error reconciling_error() {
  return {errc::unavailable, "the controller restarted and is reconciling with its nodes; retry in a few seconds"};
}

// The reconcile window after a restart from the journal is over: nodes that
// meant to come back have; what is still missing is placed now.
void end_reconcile(self_ptr self) {
  auto& st = self->state;
  if (!st.reconciling) return;
  st.reconciling = false;
  std::size_t adopted = st.replicas.size();
  // Nodes drained before the restart give up what was adopted on them.
  for (const auto& [node, cause] : st.drains->drained_nodes())
    if (cause == cluster::drain_cause::node)
      drain_node_replicas(self, node, cause, std::chrono::milliseconds(st.config.drain_deadline_ms));
  for (const auto& [name, dep] : st.deployments) rebalance_pool(self, name);
  for (const auto& [name, dep] : st.deployments) (void)place_missing(self, name, nullptr);
  spdlog::info("event=reconcile_done adopted={} placed={} nodes={}", adopted, st.replicas.size() - adopted,
               st.nodes.size());
}

// A restarted controller takes up the journal's deployments, epochs and
// replica ids, and waits out the reconcile window before placing anything.
void recover(self_ptr self) {
  auto& st = self->state;
  const auto& durable = st.config.journal->state();
  st.placement->reserve_replica_ids(durable.next_replica_id);
  for (const auto& [slot, epoch] : durable.epochs) st.slots->raise_epoch(slot, epoch);
  // Copies: rolling back appends to the journal, which changes `durable`.
  auto deployments = durable.deployments;
  const auto rollouts = durable.rollouts;
  st.current_versions = durable.current_versions;
  st.used_versions = durable.used_versions;
  {
    std::lock_guard lock(st.config.desired->mutex);
    st.config.desired->current_versions = st.current_versions;
    st.config.desired->used_versions = st.used_versions;
  }
  for (const auto& [base, e] : rollouts) roll_back_interrupted(self, deployments, base, e);
  drop_leftover_versions(self, deployments);
  for (const auto node : durable.drained_nodes) {  // an operator's drain outlives the controller
    st.drains->drain_node(node, cluster::drain_cause::node);
    st.slots->cordon(node);
  }
  for (const auto& [name, req] : deployments) {
    auto dep = make_deployment(self, req, /*allow_cold=*/true);  // scaled to zero before the restart
    if (!dep) {
      spdlog::error("event=deploy_failed deployment={} error=\"{}\" detail=\"recovered from the journal\"", name,
                    to_string(dep.error()));
      continue;
    }
    register_deployment(self, name, *dep);
    if (dep->spec.replicas == 0) self->send(st.router, deployment_cold{name, true});
  }
  for (const auto& [base, current] : st.current_versions) tell_split(self, base);
  st.reconciling = true;
  spdlog::info("event=controller_recovered deployments={} slots={} next_replica_id={} reconcile_window_ms={}",
               st.deployments.size(), durable.epochs.size(), durable.next_replica_id, st.config.reconcile_window_ms);
  self->delayed_send(self, std::chrono::milliseconds(st.config.reconcile_window_ms), reconcile_atom::value);
}

// A node (re)started. First sight of its id adds it to placement (nodes of
// the distributed cluster are not known in advance); every join refreshes
// its handle, starts what was placed there meanwhile and tells gateways.
// A joining node's cache: placement prefers it for those files from now on.
void note_node_files(self_ptr self, const node_join& m) {
  auto& s = self->state;
  std::size_t dropped = 0;
  std::string why;
  auto files = cluster::sanitize_cached_files(m.cached, &dropped, &why);
  if (dropped > 0)
    spdlog::warn("event=node_cached_files_dropped node={} dropped={} reason=\"{}\"", m.node, dropped, why);
  if (!files.empty()) {
    std::uint64_t bytes = 0;
    for (const auto& f : files) bytes += f.bytes;
    spdlog::info("event=node_cached_files node={} files={} bytes={}", m.node, files.size(), bytes);
  }
  const auto it = s.node_files.find(m.node);
  if (it == s.node_files.end() ? files.empty() : it->second == files) return;
  if (files.empty()) s.node_files.erase(m.node);
  else s.node_files[m.node] = std::move(files);
  note_cached(self, "");
  admit_loads(self);  // its queued loads may come from its cache now
}

// A node fetched a file from the store: placement prefers it for the file,
// and its loads of it give their cluster-wide turns back.
void on_node_cached_file(self_ptr self, const node_cached_file& m) {
  auto& s = self->state;
  auto files = cluster::sanitize_cached_files({m.file});
  if (files.empty() || !s.placement->node_index(m.node)) return;
  auto& list = s.node_files[m.node];
  if (std::find(list.begin(), list.end(), files.front()) != list.end() || list.size() >= cluster::cached_files_max) return;
  list.push_back(files.front());
  note_cached(self, "");
  if (!s.config.cache_affinity) return;
  const auto n = s.loads->fetched(m.node, [&](cluster::replica_id id) { return loads_from_cache(s, id, m.node); });
  spdlog::debug("event=node_cached_file node={} file={} bytes={} store_turns_returned={}", m.node, files.front().name,
                files.front().bytes, n);
  if (n > 0) admit_loads(self);
}

void on_node_join(self_ptr self, const node_join& m) {
  auto& s = self->state;
  if (!s.placement->node_index(m.node)) {
    cluster::node_info info{m.node, m.rack, m.devices, m.device_memory_bytes};
    if (auto ok = s.placement->add_node(info); !ok) {
      spdlog::error("event=node_join_refused node={} address={} error=\"{}\"", m.node, m.address,
                    to_string(ok.error()));
      if (m.handle) self->send_exit(m.handle, to_caf(ok.error()));
      return;
    }
    spdlog::info("event=node_added node={} rack={} devices={} device_kind={} device_memory_bytes={} address={}",
                 m.node, m.rack, m.devices, m.device_kind, m.device_memory_bytes, m.address.empty() ? "-" : m.address);
  }
  s.nodes[m.node] = m.handle;
  s.contacts[m.node] = {m.address, m.hub};
  s.device_kinds[m.node] = m.device_kind.empty() ? "cpu" : m.device_kind;
  note_node_files(self, m);
  if (!m.region.empty()) {
    s.node_regions[m.node] = m.region;
    (void)s.placement->set_region(m.node, m.region);  // placement spreads over regions
    self->send(s.router, node_region{m.node, m.region});
  }
  self->monitor(m.handle);
  for (const auto& r : m.replicas) reconcile_replica(self, m, r);
  for (auto& [id, r] : s.replicas)
    if (r.node == m.node && !r.spawned && r.admitted) {
      self->send(m.handle, spawn_replica{r.spec});
      r.spawned = true;
    }
  for (const auto& agent : s.gateway_agents) self->send(agent, node_announce{m.node, m.address, m.hub});
  // A restarted node can take slots again (unless it is cordoned): a drain
  // for its process's shutdown is over with the new process.
  const auto leaving = s.leaving_handles.find(m.node);
  const bool new_process = leaving == s.leaving_handles.end() || !m.handle || m.handle.address() != leaving->second;
  if (new_process && s.drains->node_cause(m.node) == cluster::drain_cause::shutdown) s.leaving_handles.erase(m.node);
  if (new_process && s.drains->node_restarted(m.node) && s.node_health[m.node] != cluster::node_health::confirmed) {
    s.slots->uncordon(m.node);
    spdlog::info("event=node_undrained node={} reason=\"restarted after its shutdown drain\"", m.node);
  }
  s.slots->node_rejoined(m.node);
  if (s.reconciling) return;  // placing waits for the window to end
  // Deployments of the config that waited for nodes may go now.
  std::size_t joined = 0;
  for (const auto& [id, h] : s.nodes) joined += h != nullptr;
  if (joined < s.config.deploy_after_nodes) return pump_migrations(self);
  auto waiting = std::move(s.awaiting_nodes);
  s.awaiting_nodes.clear();
  for (const auto& req : waiting)
    if (auto r = on_deploy(self, req, /*version_of_rollout=*/true); r.flag == caf::rt_error) {
      // on_deploy told the router it is gone; it is still wanted.
      s.awaiting_nodes.push_back(req);
      self->send(s.router, deployment_starting{req.name});
    }
  pump_migrations(self);
}

// A gateway joined: it gets the whole picture now and every change after.
void on_gateway_join(self_ptr self, const gateway_join& m) {
  auto& s = self->state;
  spdlog::info("event=gateway_joined gateways={}", s.gateway_agents.size() + 1);
  for (const auto& [name, dep] : s.deployments) self->send(m.router, announce(name, dep));
  {
    // What it knew beyond these (from a controller before a restart) is gone.
    deployment_set known;
    for (const auto& [name, dep] : s.deployments) known.names.push_back(name);
    for (const auto& req : s.awaiting_nodes) known.names.push_back(req.name);
    self->send(m.router, std::move(known));
  }
  for (const auto& req : s.awaiting_nodes) self->send(m.router, deployment_starting{req.name});
  for (const auto& [name, dep] : s.deployments) {
    // A version at 0 replicas inside a rollout is not cold: the rollout sizes it.
    const auto r = s.rollouts.find(std::string(cluster::split_version(name).base));
    const bool rolling = r != s.rollouts.end() && (!cluster::is_final(r->second.machine->phase()) || r->second.finishing);
    if (dep.spec.replicas == 0 && !rolling) self->send(m.router, deployment_cold{name, true});
  }
  self->send(m.router, traffic_split{});  // forget splits a predecessor told it, then the current ones
  for (const auto& [base, split] : s.splits_sent) self->send(m.router, split);
  for (const auto& [node, region] : s.node_regions) self->send(m.router, node_region{node, region});
  for (const auto& [slot, epoch] : s.slots->epochs()) self->send(m.router, fence_slot{slot.deployment, slot.index, epoch});
  for (const auto& [id, r] : s.replicas)
    if (r.handle)
      self->send(m.router, replica_event{r.id, r.deployment, r.slot, r.epoch, r.node, r.device,
                                         static_cast<std::uint8_t>(r.state), r.reason, r.handle});
  for (const auto& [node, health] : s.node_health)
    self->send(m.router, node_health_msg{node, static_cast<std::uint8_t>(health)});
  for (const auto& [node, c] : s.contacts)
    if (s.nodes[node]) self->send(m.agent, node_announce{node, c.address, c.hub});
  self->send(s.router, subscribe_msg{m.router});
  if (m.agent) {
    s.gateway_agents.push_back(m.agent);
    self->monitor(m.agent);
  }
}

// ---- versions and rollouts (runtime/cluster/rollout: the decisions) ----

using rollout_tick_atom = caf::atom_constant<caf::atom("rollttick")>;

std::uint32_t ready_count(self_ptr self, const std::string& deployment) {
  std::uint32_t n = 0;
  for (const auto& [id, r] : self->state.replicas)
    n += r.deployment == deployment && cluster::serves_requests(r.state) && !self->state.drains->draining(id);
  return n;
}

bool rollout_active(const controller_state& st, const std::string& base) {
  const auto it = st.rollouts.find(base);
  return it != st.rollouts.end() && !cluster::is_final(it->second.machine->phase());
}

// The split routers should follow for `base` now. While a rollout runs, the
// new version gets its step's share, but never more than its share of the
// ready replicas (a step whose replicas are still starting would overload
// them), nothing before it has one and everything when the old one has none.
// Once finished, the kept version, or the loser while the kept one has no
// ready replica yet (replaced in place).
traffic_split split_for(self_ptr self, const std::string& base) {
  auto& st = self->state;
  traffic_split out{base, current_of(st, base), "", 0};
  const auto it = st.rollouts.find(base);
  if (it == st.rollouts.end()) return out;
  const auto& r = it->second;
  if (cluster::is_final(r.machine->phase())) {
    // Finishing: the loser still takes the share the kept version cannot
    // yet (its replicas are still starting), weighted by ready replicas.
    if (!r.finishing || !st.deployments.count(r.drop)) return out;
    const auto ready_keep = ready_count(self, r.keep), ready_drop = ready_count(self, r.drop);
    const auto wanted_keep = st.deployments.count(r.keep) ? st.deployments.at(r.keep).spec.replicas : 0;
    if (ready_drop == 0 || ready_keep >= wanted_keep) return out;
    out.stable = r.drop;
    out.canary = r.keep;
    out.canary_percent =
        ready_keep == 0 ? 0 : static_cast<std::uint32_t>(std::uint64_t{100} * ready_keep / (ready_keep + ready_drop));
    return out;
  }
  out.stable = r.from;
  out.canary = r.to;
  // Old replicas the step does not keep are on their way out: not capacity.
  const auto target = cluster::step_targets(r.total, r.machine->new_percent(), r.machine->plan());
  const auto ready_new = ready_count(self, r.to);
  const auto ready_old = std::min(ready_count(self, r.from), target.old_replicas);
  // The step keeps no old replica (in place, at 100 %): routers are told so
  // at once, so that the old ones may stop and make room; until the new
  // ones are ready, each router still sends to whichever side has replicas.
  if (target.old_replicas == 0) {
    out.canary_percent = 100;
    return out;
  }
  if (ready_new == 0) return out;
  if (ready_old == 0) {
    out.canary_percent = 100;
    return out;
  }
  const auto capacity = static_cast<std::uint32_t>(std::uint64_t{100} * ready_new / (ready_new + ready_old));
  out.canary_percent = std::min(r.machine->new_percent(), std::max<std::uint32_t>(capacity, 1));
  return out;
}

void tell_split(self_ptr self, const std::string& base) {
  auto& st = self->state;
  const auto split = split_for(self, base);
  auto& last = st.splits_sent[base];
  if (last.base == split.base && last.stable == split.stable && last.canary == split.canary &&
      last.canary_percent == split.canary_percent)
    return;
  last = split;
  self->send(st.router, split);
  if (st.config.metrics) cluster_metrics::series(st.config.metrics->rollout_canary_percent, base)->set(split.canary_percent);
  if (split.stable == base && split.canary.empty()) st.splits_sent.erase(base);
}

// Slots for the serving count plus the pool it keeps now: the highest
// slots stop, or the missing ones are placed -- after the pool was
// rebalanced, so that standbys take new serving places before anything
// loads. Returns how many serving replicas could not be placed.
std::size_t resize_pool(self_ptr self, const std::string& name, std::string* why) {
  auto& s = self->state;
  auto it = s.deployments.find(name);
  if (it == s.deployments.end()) return 0;
  auto& dep = it->second;
  const std::uint32_t old = dep.spec.replicas;
  dep.spec.replicas = dep.serving + pool_size(s, name, dep);
  if (dep.spec.replicas < old) stop_slots(self, name, dep.spec.replicas);
  rebalance_pool(self, name);
  std::uint32_t live = 0;
  for (const auto& [id, r] : s.replicas) live += r.deployment == name && in_pool(s, id, r);
  return live < dep.spec.replicas ? place_missing(self, name, why) : 0;
}

// A deployment's replica count, as scale sets it (without the cold notice).
void set_replicas(self_ptr self, const std::string& name, std::uint32_t replicas) {
  auto& s = self->state;
  auto it = s.deployments.find(name);
  if (it == s.deployments.end()) return;
  const std::uint32_t old = it->second.serving;
  it->second.serving = replicas;
  {
    std::lock_guard lock(s.config.desired->mutex);
    auto d = s.config.desired->deployments.find(name);
    if (d != s.config.desired->deployments.end()) d->second.replicas = replicas;
  }
  persist(self, cluster::journal_record::scale(name, replicas));
  std::string why;
  if (resize_pool(self, name, &why) > 0)
    spdlog::warn("event=scale_partial deployment={} wanted={} reason=\"{}\"", name, replicas, why);
  spdlog::info("event=scaled deployment={} from={} to={} standby={}", name, old, replicas,
               it->second.spec.replicas - replicas);
}

void remove_deployment(self_ptr self, const std::string& name) {
  auto& s = self->state;
  if (!s.deployments.count(name)) return;
  stop_slots(self, name, 0);
  const bool pooled = s.deployments.at(name).warm_percent > 0;
  s.deployments.erase(name);
  if (pooled) update_standby_gauge(self, name);  // reads 0 of 0 now
  s.scalers.erase(name);
  s.loads_seen.erase(name);
  s.defrag_waiting.erase(name);
  s.defrag_rounds.erase(name);
  forget(self, name);
  self->send(s.router, deployment_removed{name});
  spdlog::info("event=undeployed deployment={}", name);
}

void count_rollout(self_ptr self, const std::string& base, std::string_view what) {
  if (self->state.config.metrics)
    cluster_metrics::series(self->state.config.metrics->rollout_transitions, base, std::string(what))->inc();
  cluster::event e;  // the chaos harness and the simulator time rollouts by these
  e.kind = cluster::event_kind::rollout;
  e.deployment = base;
  e.detail = std::string(what);
  if (auto r = self->state.rollouts.find(base); r != self->state.rollouts.end() && r->second.machine)
    e.outcome = r->second.machine->status_line();
  log_event(self, self->state.config.hooks, e);
}

void remember_versions(self_ptr self) {
  auto& st = self->state;
  std::lock_guard lock(st.config.desired->mutex);
  st.config.desired->current_versions = st.current_versions;
  st.config.desired->used_versions = st.used_versions;
  st.config.desired->rollouts.clear();
  for (const auto& [base, r] : st.rollouts)
    if (!cluster::is_final(r.machine->phase())) st.config.desired->rollouts[base] = {r.from, r.to, r.total};
}

void arm_rollout_tick(self_ptr self);

// A rollout reached a final phase: traffic moves at once (to the loser only
// while the kept version has no ready replica), the kept version is asked
// for its full count, and the loser is removed once every router has the
// new split (finish_step).
void finish_rollout(self_ptr self, controller_state::rollout_state& r) {
  auto& st = self->state;
  const auto phase = r.machine->phase();
  const bool won = phase == cluster::rollout_phase::complete;
  r.keep = won ? r.to : r.from;
  r.drop = won ? r.from : r.to;
  if (won) {
    if (r.to == r.base) st.current_versions.erase(r.base);
    else st.current_versions[r.base] = r.to;
    persist(self, cluster::journal_record::version_current(r.base, r.to));
  }
  r.finishing = true;
  // Requests routed to the loser before the split changed, and waiting for
  // one of its replicas in a router, get a grace to be served there.
  r.drop_after_ns = clock_ns(self) + std::max<std::int64_t>(2 * std::int64_t{st.config.rollout_tick_ms} * 1000000,
                                                            std::int64_t{st.config.rollout_drop_grace_ms} * 1000000);
  tell_split(self, r.base);
  if (auto it = st.deployments.find(r.keep); it != st.deployments.end() && it->second.spec.replicas < r.total)
    set_replicas(self, r.keep, r.total);
  persist(self, cluster::journal_record::rollout_end(r.base));
  remember_versions(self);
  count_rollout(self, r.base, cluster::to_string(phase));
  spdlog::log(won ? spdlog::level::info : spdlog::level::warn,
              "event=rollout_finished deployment={} phase={} serving={} removed={} status=\"{}\"", r.base,
              cluster::to_string(phase), r.keep, r.drop, r.machine->status_line());
  arm_rollout_tick(self);
}

std::uint32_t placed_count(self_ptr self, const std::string& deployment) {
  std::uint32_t n = 0;
  for (const auto& [id, rec] : self->state.replicas) n += rec.deployment == deployment && !self->state.drains->draining(id);
  return n;
}

// After the end: the loser goes once routers had time to take the new split
// and the kept version serves (or, bounded, when it cannot start while the
// loser holds its room); then the kept version is placed up to its count.
// Returns true while there is more to do.
bool finish_step(self_ptr self, controller_state::rollout_state& r) {
  auto& st = self->state;
  const auto now = clock_ns(self);
  auto keep = st.deployments.find(r.keep);
  const std::uint32_t wanted_keep = keep == st.deployments.end() ? 0 : keep->second.spec.replicas;
  if (st.deployments.count(r.drop)) {
    // The loser goes once the grace is over and the kept version serves at
    // its full count -- or, bounded, when the kept version cannot get there
    // while the loser holds the room (replaced in place).
    const bool keep_full = keep == st.deployments.end() || ready_count(self, r.keep) >= wanted_keep;
    const auto give_up_ns = r.drop_after_ns + std::int64_t{st.config.rollout_start_timeout_ms} * 1000000 / 10;
    if (keep != st.deployments.end() && placed_count(self, r.keep) < wanted_keep) (void)place_missing(self, r.keep, nullptr);
    const bool stuck = keep != st.deployments.end() && placed_count(self, r.keep) < wanted_keep;
    if (now < r.drop_after_ns) return true;
    // Placed and still starting: wait for them (bounded). Not placeable:
    // the loser's room is what they need.
    if (!keep_full && !stuck && now < give_up_ns) return true;
    remove_deployment(self, r.drop);
    tell_split(self, r.base);
  }
  // The kept version up to its count, as the loser's room frees (retried
  // every tick until placed).
  if (keep != st.deployments.end() && placed_count(self, r.keep) < wanted_keep) {
    std::string why;
    if (place_missing(self, r.keep, &why) > 0) {
      if (!r.finish_warned && now - r.drop_after_ns > std::int64_t{st.config.rollout_start_timeout_ms} * 1000000) {
        r.finish_warned = true;
        spdlog::warn("event=rollout_finish_partial deployment={} kept={} wanted={} reason=\"{}\" detail=\"still trying\"",
                     r.base, r.keep, wanted_keep, why);
      }
      return true;
    }
  }
  r.finishing = false;
  tell_split(self, r.base);
  (void)resize_pool(self, r.keep, nullptr);  // its warm pool again
  return false;
}

void arm_rollout_tick(self_ptr self) {
  auto& st = self->state;
  if (st.rollout_tick_armed) return;
  st.rollout_tick_armed = true;
  self->delayed_send(self, std::chrono::milliseconds(st.config.rollout_tick_ms), rollout_tick_atom::value);
}

// One move of the replica counts toward the step's targets (batch by batch).
void move_replicas(self_ptr self, controller_state::rollout_state& r) {
  auto& st = self->state;
  auto from = st.deployments.find(r.from), to = st.deployments.find(r.to);
  if (from == st.deployments.end() || to == st.deployments.end()) return;
  const cluster::version_counts wanted{from->second.spec.replicas, to->second.spec.replicas};
  const cluster::version_counts ready{ready_count(self, r.from), ready_count(self, r.to)};
  auto next = cluster::next_counts(r.total, r.machine->new_percent(), r.machine->plan(), wanted, ready);
  // The last old replicas stop only once routers were told to send the old
  // version nothing (a tick earlier): a request routed there meanwhile
  // would find no replica.
  const auto sent = st.splits_sent.find(r.base);
  if (next.old_replicas == 0 && wanted.old_replicas > 0 && (sent == st.splits_sent.end() || sent->second.canary_percent < 100))
    next.old_replicas = wanted.old_replicas;
  if (next.new_replicas != wanted.new_replicas) set_replicas(self, r.to, next.new_replicas);
  if (next.old_replicas != wanted.old_replicas) set_replicas(self, r.from, next.old_replicas);
  // Slots that found no room earlier (an old replica was still draining) are tried again.
  for (const auto& name : {r.from, r.to})
    if (placed_count(self, name) < st.deployments.at(name).spec.replicas) (void)place_missing(self, name, nullptr);
}

// Whether the replica counts are where the step wants them and all ready.
bool settled(self_ptr self, const controller_state::rollout_state& r) {
  auto& st = self->state;
  const auto from = st.deployments.find(r.from), to = st.deployments.find(r.to);
  if (from == st.deployments.end() || to == st.deployments.end()) return true;
  const auto target = cluster::step_targets(r.total, r.machine->new_percent(), r.machine->plan());
  return from->second.spec.replicas == target.old_replicas && to->second.spec.replicas == target.new_replicas &&
         ready_count(self, r.from) >= target.old_replicas && ready_count(self, r.to) >= target.new_replicas;
}

void rollout_step(self_ptr self, controller_state::rollout_state& r) {
  auto& st = self->state;
  const auto now = clock_ns(self);
  const auto step = r.machine->step();
  // A step is judged, and bakes, only once its replicas are in place: until
  // then it is not yet what it says (its samples still count).
  bool changed = false;
  if (settled(self, r)) changed = r.machine->tick(now);
  else if (r.machine->phase() == cluster::rollout_phase::in_progress) r.machine->hold(now);
  // New replicas that do not become ready (they cannot load, they crash,
  // there is no room) give no evidence: past the limit, that is the verdict.
  if (r.machine->phase() == cluster::rollout_phase::in_progress) {
    // Either version short of ready replicas (in place, an old one down
    // holds every move) for too long: the rollout cannot go on.
    const auto short_of = [&](const std::string& name) {
      const auto d = st.deployments.find(name);
      return d != st.deployments.end() && ready_count(self, name) < d->second.spec.replicas;
    };
    const bool new_short = short_of(r.to), missing = new_short || short_of(r.from);
    if (!missing) r.unsettled_since_ns = 0;
    else if (r.unsettled_since_ns == 0) r.unsettled_since_ns = now;
    else if (now - r.unsettled_since_ns >= std::int64_t{st.config.rollout_start_timeout_ms} * 1000000) {
      (void)r.machine->roll_back(std::string(new_short ? "the new" : "the old") + " version's replicas were not ready within " +
                                 std::to_string(st.config.rollout_start_timeout_ms / 1000) + " s");
      changed = true;
    }
  }
  if (changed) {
    if (cluster::is_final(r.machine->phase())) return finish_rollout(self, r);
    if (r.machine->step() != step) {
      count_rollout(self, r.base, "step");
      spdlog::info("event=rollout_step deployment={} step={} canary_percent={} status=\"{}\"", r.base,
                   r.machine->step() + 1, r.machine->new_percent(), r.machine->status_line());
    }
  }
  move_replicas(self, r);
  tell_split(self, r.base);
}

void on_rollout_tick(self_ptr self) {
  auto& st = self->state;
  st.rollout_tick_armed = false;
  bool any = false;
  for (auto& [base, r] : st.rollouts) {
    if (!cluster::is_final(r.machine->phase())) rollout_step(self, r);
    else if (r.finishing) finish_step(self, r);
    any |= !cluster::is_final(r.machine->phase()) || r.finishing;
  }
  if (any) arm_rollout_tick(self);
}

void on_version_samples(self_ptr self, const version_samples& m) {
  auto& st = self->state;
  const std::string base(cluster::split_version(m.deployment).base);
  auto it = st.rollouts.find(base);
  if (it == st.rollouts.end() || it->second.machine->phase() != cluster::rollout_phase::in_progress) return;
  auto& r = it->second;
  if (m.deployment != r.from && m.deployment != r.to) return;
  auto& window = m.deployment == r.to ? r.machine->new_window() : r.machine->old_window();
  const auto n = std::min(m.ttft_ms.size(), m.tpot_ms.size());
  for (std::size_t i = 0; i < n; ++i) window.add_success(m.ttft_ms[i], m.tpot_ms[i]);
  for (std::uint32_t i = 0; i < m.failures; ++i) window.add_failure();
}

// The machine's line, and what routers do now when that differs from the
// step's share (the new version's replicas are still starting).
std::string status_line(self_ptr self, const controller_state::rollout_state& r) {
  auto line = r.machine->status_line();
  if (cluster::is_final(r.machine->phase())) return r.finishing ? line + " (finishing: " + r.drop + " drains)" : line;
  const auto split = split_for(self, r.base);
  if (split.canary_percent != r.machine->new_percent())
    line += fmt::format(" (routing {}% to {} now: {} of {} of its replicas ready)", split.canary_percent, r.to,
                        ready_count(self, r.to), self->state.deployments.count(r.to)
                                                     ? self->state.deployments.at(r.to).spec.replicas
                                                     : 0);
  return line;
}

expected<std::string> start_rollout(self_ptr self, const api::rollout_request& req) {
  auto& st = self->state;
  const std::string base(cluster::split_version(req.name).base);
  if (base != req.name)
    return make_error(errc::invalid_argument, "name the deployment by its plain name ('" + base + "'), not a version");
  const std::string from = current_of(st, base);
  const auto old = st.deployments.find(from);
  if (old == st.deployments.end()) return make_error(errc::not_found, "no deployment named '" + base + "'");
  if (auto prev = st.rollouts.find(base); prev != st.rollouts.end() && prev->second.finishing &&
                                          st.deployments.count(prev->second.drop))
    return make_error(errc::unavailable, "the last rollout of '" + base + "' is finishing (" + prev->second.drop +
                                             " drains); retry in a few seconds");
  if (rollout_active(st, base))
    return make_error(errc::invalid_argument, "a rollout of '" + base + "' is in progress (" +
                                                  st.rollouts.at(base).machine->status_line() +
                                                  "); promote or abort it first");
  if (old->second.serving == 0)
    return make_error(errc::invalid_argument, "'" + base + "' is cold (0 replicas): scale it up before a rollout");
  if (req.model_file.empty()) return make_error(errc::invalid_argument, "a rollout needs the new version's model file");
  cluster::rollout_plan plan;
  if (!req.steps.empty()) {
    auto steps = cluster::parse_steps(req.steps);
    if (!steps) return std::unexpected(steps.error());
    plan.steps = *steps;
  }
  plan.bake_s = req.bake_s ? req.bake_s : st.config.rollout_bake_s;
  plan.max_unavailable = req.max_unavailable;
  plan.surge = req.surge;
  if (auto ok = cluster::validate(plan); !ok) return std::unexpected(ok.error());
  auto policy = st.config.rollout_policy;
  if (req.min_samples) policy.min_samples = req.min_samples;
  if (old->second.serving == 1 && plan.surge == 0 && plan.steps.front() < 100)
    return make_error(errc::invalid_argument, "a deployment of one replica cannot split its traffic in place: use "
                                              "--surge 1 (one extra replica), or --steps 100");
  // Labels in use, and every label a rollout ever used: a pinned NAME@V never changes meaning.
  std::vector<std::string> labels;
  for (const auto& [name, dep] : st.deployments)
    if (cluster::split_version(name).base == base) labels.push_back(cluster::version_of(name));
  if (auto used = st.used_versions.find(base); used != st.used_versions.end())
    labels.insert(labels.end(), used->second.begin(), used->second.end());
  const std::string version = req.version.empty() ? cluster::next_version(labels) : req.version;
  if (auto ok = cluster::check_version(version); !ok) return std::unexpected(ok.error());
  if (version == "1")
    return make_error(errc::invalid_argument, "version 1 is the plain deployment '" + base + "': name another");
  const std::string to = cluster::deployment_for(base, version);
  if (std::find(labels.begin(), labels.end(), version) != labels.end() || st.deployments.count(to))
    return make_error(errc::invalid_argument, "version " + version + " of '" + base + "' exists or was used before");
  api::deploy_request dreq;
  {
    std::lock_guard lock(st.config.desired->mutex);
    auto d = st.config.desired->deployments.find(from);
    if (d != st.config.desired->deployments.end()) dreq = d->second;
  }
  dreq.name = to;
  dreq.model_file = req.model_file;
  dreq.model_sha256 = req.model_sha256;
  dreq.replicas = 0;  // the rollout grows it
  dreq.routing = old->second.routing;
  dreq.prefix_slack_tokens = old->second.prefix_slack_tokens;
  dreq.prefix_slack_ratio = old->second.prefix_slack_ratio;
  dreq.prefix_slack_s = old->second.prefix_slack_s;
  dreq.tenant = old->second.tenant;
  auto dep = make_deployment(self, dreq);
  if (!dep) return std::unexpected(dep.error());
  // Requests move between the versions with their tokens (a conversation
  // may switch at a step): the vocabulary must be the same.
  if (dep->spec.model.vocab_size != old->second.spec.model.vocab_size)
    return make_error(errc::invalid_argument,
                      fmt::format("the new version's vocabulary has {} tokens, the old one's {}: a version keeps its "
                                  "tokenizer (deploy another model under another name)",
                                  dep->spec.model.vocab_size, old->second.spec.model.vocab_size));
  // The rollout first: a restart between the two finds a rollout to roll
  // back, never a stray version deployment.
  const std::uint32_t total = old->second.serving;
  persist(self, cluster::journal_record::rollout_begin(base, from, to, total));
  st.used_versions[base].insert(version);
  register_deployment(self, to, *dep);
  remember(self, dreq);
  auto& r = st.rollouts[base];
  r = controller_state::rollout_state{};
  r.base = base;
  r.from = from;
  r.to = to;
  r.total = total;
  r.machine.emplace(cluster::version_of(from), version, plan, policy, clock_ns(self));
  // No warm pool while the versions trade places: the rollout counts what serves.
  (void)resize_pool(self, from, nullptr);
  remember_versions(self);
  count_rollout(self, base, "started");
  std::string steps_text;
  for (const auto p : plan.steps) steps_text += (steps_text.empty() ? "" : ",") + std::to_string(p);
  spdlog::info("event=rollout_started deployment={} from={} to={} model={} replicas={} steps={} bake_s={} surge={} "
               "max_unavailable={} min_samples={}",
               base, from, to, dep->model_file, total, steps_text, plan.bake_s, plan.surge, plan.max_unavailable,
               policy.min_samples);
  rollout_step(self, r);
  arm_rollout_tick(self);
  return status_line(self, r);
}

caf::result<rollout_reply> on_rollout(self_ptr self, const api::rollout_request& req) {
  auto& st = self->state;
  if (st.reconciling) return to_caf(reconciling_error());
  using op = api::rollout_request::op;
  if (req.what == op::start) {
    auto line = start_rollout(self, req);
    if (!line) return to_caf(line.error());
    return rollout_reply{*line};
  }
  const std::string base(cluster::split_version(req.name).base);
  auto it = st.rollouts.find(base);
  if (it == st.rollouts.end())
    return to_caf({errc::not_found, st.deployments.count(current_of(st, base))
                                        ? "no rollout of '" + base + "' has run since the controller started"
                                        : "no deployment named '" + base + "'"});
  auto& r = it->second;
  const auto now = clock_ns(self);
  expected<void> ok;
  const char* what = "status";
  switch (req.what) {
    case op::pause: ok = r.machine->pause(), what = "paused"; break;
    case op::resume: ok = r.machine->resume(now), what = "resumed"; break;
    case op::abort: ok = r.machine->abort(), what = "aborted"; break;
    case op::promote: ok = r.machine->promote(), what = "complete"; break;
    default: return rollout_reply{status_line(self, r)};
  }
  if (!ok) return to_caf(ok.error());
  spdlog::info("event=rollout_command deployment={} command={} status=\"{}\"", base, what, r.machine->status_line());
  if (cluster::is_final(r.machine->phase())) {
    finish_rollout(self, r);
  } else {
    count_rollout(self, base, what);
    if (req.what == op::resume) arm_rollout_tick(self);
  }
  return rollout_reply{status_line(self, r)};
}

// A rollout the predecessor left unfinished is rolled back (the safe side:
// the old version was serving before it began) -- unless it had already
// won (its version was made current), which is carried through. The losing
// deployment is dropped and the kept one gets its full count again.
void roll_back_interrupted(self_ptr self, std::map<std::string, api::deploy_request>& deployments,
                           const std::string& base, const cluster::durable_state::rollout_entry& e) {
  auto& st = self->state;
  const bool won = current_of(st, base) == e.to;
  const std::string& keep = won ? e.to : e.from;
  const std::string& drop = won ? e.from : e.to;
  spdlog::warn("event={} deployment={} from={} to={} replicas={} reason=\"the controller restarted during the "
               "rollout{}\"",
               won ? "rollout_completed" : "rollout_rolled_back", base, e.from, e.to, e.replicas,
               won ? ", after it was promoted" : "");
  if (auto it = deployments.find(keep); it != deployments.end() && it->second.replicas < e.replicas) {
    it->second.replicas = e.replicas;
    persist(self, cluster::journal_record::scale(keep, e.replicas));
  }
  if (deployments.erase(drop)) persist(self, cluster::journal_record::undeploy(drop));
  persist(self, cluster::journal_record::rollout_end(base));
  // Routers that outlived the predecessor forget its split and the loser.
  self->send(st.router, traffic_split{base, keep, "", 0});
  self->send(st.router, deployment_removed{drop});
  count_rollout(self, base, won ? "complete" : "rolled_back");
  std::lock_guard lock(st.config.desired->mutex);
  auto& d = st.config.desired->deployments;
  if (auto it = d.find(keep); it != d.end()) it->second.replicas = std::max(it->second.replicas, e.replicas);
  d.erase(drop);
  st.config.desired->rollouts.erase(base);
}

// After the rollouts are settled, each plain name has one version: its
// current one. Another left behind (the predecessor stopped before it had
// removed a finished rollout's loser) is removed now.
void drop_leftover_versions(self_ptr self, std::map<std::string, api::deploy_request>& deployments) {
  auto& st = self->state;
  for (auto it = deployments.begin(); it != deployments.end();) {
    const std::string base(cluster::split_version(it->first).base);
    const bool grouped = it->first != base || st.current_versions.count(base);
    if (!grouped || current_of(st, base) == it->first) {
      ++it;
      continue;
    }
    spdlog::warn("event=version_leftover_removed deployment={} current={}", it->first, current_of(st, base));
    persist(self, cluster::journal_record::undeploy(it->first));
    self->send(st.router, deployment_removed{it->first});
    {
      std::lock_guard lock(st.config.desired->mutex);
      st.config.desired->deployments.erase(it->first);
    }
    it = deployments.erase(it);
  }
}

void scale_deployment(self_ptr self, const std::string& name, std::uint32_t replicas);

caf::result<ok_atom> on_scale(self_ptr self, const scale_msg& m) {
  auto& s = self->state;
  if (s.reconciling) return to_caf(reconciling_error());
  // A plain name scales its current version.
  const std::string name = m.name.find('@') == std::string::npos ? current_of(s, m.name) : m.name;
  auto it = s.deployments.find(name);
  if (it == s.deployments.end()) return to_caf({errc::not_found, "no deployment named '" + m.name + "'"});
  const std::string base(cluster::split_version(name).base);
  if (rollout_active(s, base))
    return to_caf({errc::invalid_argument, "a rollout of '" + base + "' is in progress (" +
                                               s.rollouts.at(base).machine->status_line() +
                                               "); promote or abort it before scaling"});
  if (m.replicas > max_replicas_per_deployment)
    return to_caf({errc::invalid_argument, "replicas must be in [0, " +
                                               std::to_string(max_replicas_per_deployment) +
                                               "] (0: cold, woken by its next request); use undeploy to remove"});
  scale_deployment(self, name, m.replicas);
  return ok_atom::value;
}

// One deployment (by its own name, not resolved) to `replicas`, with the
// cold notice when it crosses zero; the autoscaler's cooldowns and windows
// start again whoever scaled it.
void scale_deployment(self_ptr self, const std::string& name, std::uint32_t replicas) {
  auto& s = self->state;
  auto it = s.deployments.find(name);
  if (it == s.deployments.end()) return;
  const std::uint32_t old = it->second.serving;
  if ((old == 0) != (replicas == 0)) self->send(s.router, deployment_cold{name, replicas == 0});
  set_replicas(self, name, replicas);
  if (auto a = s.scalers.find(name); a != s.scalers.end() && replicas != old) a->second.scaled(clock_ns(self), replicas > old);
}

using autoscale_tick_atom = caf::atom_constant<caf::atom("autotick")>;

void arm_autoscale_tick(self_ptr self) {
  auto& st = self->state;
  if (st.autoscale_tick_armed || st.scalers.empty()) return;
  st.autoscale_tick_armed = true;
  self->delayed_send(self, std::chrono::milliseconds(st.config.autoscale_tick_ms), autoscale_tick_atom::value);
}

void on_deployment_loads(self_ptr self, const deployment_loads& m) {
  auto& st = self->state;
  const auto from = caf::actor_cast<caf::actor_addr>(self->current_sender());
  const auto now = clock_ns(self);
  for (const auto& l : m.loads) {
    if (!st.deployments.count(l.deployment)) continue;
    auto& seen = st.loads_seen[l.deployment];
    seen.by_router[from] = {now, l};
    if (!st.scalers.count(l.deployment)) continue;  // only the autoscaler consumes these
    seen.arrivals += l.arrivals;
    seen.ttft_p99_ms = std::max(seen.ttft_p99_ms, l.ttft_p99_ms);
  }
}

// One decision per autoscaled deployment: the routers' reports since the
// last tick make one sample (replica loads: the fullest report, as every
// router hears the same replicas; arrivals: summed; TTFT p99: the worst).
void on_autoscale_tick(self_ptr self) {
  auto& st = self->state;
  st.autoscale_tick_armed = false;
  const auto now = clock_ns(self);
  const std::int64_t fresh_ns = 3 * std::int64_t{st.config.autoscale_tick_ms} * 1000000 + 2000000000;
  std::vector<std::pair<std::string, std::uint32_t>> moves;
  for (auto& [name, scaler] : st.scalers) {
    auto dep = st.deployments.find(name);
    if (dep == st.deployments.end()) continue;
    auto& seen = st.loads_seen[name];
    cluster::load_sample s;
    s.at_ns = now;
    bool any = false;
    for (auto it = seen.by_router.begin(); it != seen.by_router.end();) {
      if (now - it->second.first > fresh_ns) {  // a router gone quiet
        it = seen.by_router.erase(it);
        continue;
      }
      const auto& l = it->second.second;
      any = true;
      s.replicas = std::max(s.replicas, l.replicas);
      s.outstanding = std::max<double>(s.outstanding, l.outstanding);
      if (l.kv_capacity > 0) s.kv_fraction = std::max(s.kv_fraction, static_cast<double>(l.kv_used) / l.kv_capacity);
      ++it;
    }
    s.arrivals = seen.arrivals;
    s.ttft_p99_ms = seen.ttft_p99_ms;
    seen.arrivals = 0;
    seen.ttft_p99_ms = -1;
    if (!any) continue;  // no router reports it: nothing is known of its load
    scaler.observe(s);
    const std::string base(cluster::split_version(name).base);
    if (st.reconciling || (st.rollouts.count(base) && (rollout_active(st, base) || st.rollouts.at(base).finishing)))
      continue;  // a rollout (or its finish) owns the counts
    if (current_of(st, base) != name) continue;  // a version not serving the plain name
    const auto d = scaler.decide(now, dep->second.serving);
    if (!d.changed) continue;
    spdlog::info("event=autoscale deployment={} from={} to={} reason=\"{}\"", name, dep->second.serving, d.replicas,
                 d.reason);
    if (st.config.metrics)
      cluster_metrics::series(st.config.metrics->autoscale_decisions, name,
                              d.replicas > dep->second.serving ? "up" : "down")
          ->inc();
    moves.emplace_back(name, d.replicas);
  }
  for (const auto& [name, n] : moves) scale_deployment(self, name, n);
  arm_autoscale_tick(self);
}

}  // namespace

caf::behavior controller_actor(caf::stateful_actor<controller_state>* self, controller_config config,
                               caf::actor router, caf::actor health_monitor) {
  auto& st = self->state;
  st.config = std::move(config);
  st.router = std::move(router);
  st.health_monitor = std::move(health_monitor);
  auto placement = st.config.nodes.empty()
                       ? expected<cluster::cluster_state>(cluster::cluster_state::empty(st.config.device_reserved_bytes))
                       : cluster::cluster_state::create(st.config.nodes, st.config.device_reserved_bytes);
  if (!placement) {
    spdlog::error("event=controller_start_failed error=\"{}\"", to_string(placement.error()));
    self->quit(to_caf(placement.error()));
    return {};
  }
  st.placement.emplace(std::move(*placement));
  for (const auto& [node, region] : st.config.node_regions) (void)st.placement->set_region(node, region);
  st.slots.emplace(cluster::slot_scheduler_config{
      st.config.migration_parallelism, st.config.slot_max_replacements,
      std::chrono::milliseconds(st.config.slot_replacement_window_ms)});
  st.drains.emplace(cluster::drain_config{std::chrono::milliseconds(st.config.drain_deadline_ms)});
  st.loads.emplace(st.config.loads);
  if (st.config.hooks.sim_storage) self->send(st.config.hooks.sim_storage, sim_storage_watch{self});
  // A controller with a journal that holds anything resumes from it; the
  // config's deployments only seed a fresh state directory.
  if (st.config.journal && !st.config.journal->empty()) {
    recover(self);
  } else {
  // A restarted controller rebuilds the deployments its predecessor held.
  std::map<std::string, api::deploy_request> desired;
  std::map<std::string, cluster::durable_state::rollout_entry> rollouts;
  {
    std::lock_guard lock(st.config.desired->mutex);
    desired = st.config.desired->deployments;
    st.current_versions = st.config.desired->current_versions;
    st.used_versions = st.config.desired->used_versions;
    rollouts = st.config.desired->rollouts;
  }
  for (const auto& [base, e] : rollouts) roll_back_interrupted(self, desired, base, e);
  drop_leftover_versions(self, desired);
  for (const auto& [name, req] : desired) self->send(st.router, deployment_starting{name});
  for (const auto& [name, req] : desired)
    if (st.placement->nodes().empty()) {
      // The distributed controller starts before any node joined: deploy
      // when there is somewhere to place.
      st.awaiting_nodes.push_back(req);
    } else if (auto r = on_deploy(self, req, /*version_of_rollout=*/true); r.flag == caf::rt_error) {
      // Not startable (bad file, nothing fits): drop it, so requests waiting
      // for it fail now instead of at their deadline.
      spdlog::error("event=deploy_failed deployment={} error=\"{}\"", name, to_string(from_caf(r.err)));
      forget(self, name);
      self->send(st.router, deployment_removed{name});
    }
  self->send(st.router, traffic_split{});  // routers that outlived the predecessor forget its splits
  for (const auto& [base, current] : st.current_versions) tell_split(self, base);
  }
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& agents = self->state.gateway_agents;
    if (std::erase_if(agents, [&](const caf::actor& a) { return a.address() == dm.source; }) > 0) {
      spdlog::warn("event=gateway_lost gateways={} reason=\"{}\"", agents.size(), caf::to_string(dm.reason));
      return;
    }
    for (auto& [id, handle] : self->state.nodes)
      if (handle && handle.address() == dm.source) return on_node_down(self, id, dm.reason);
  });
  return {
      [=](const node_join& m) { on_node_join(self, m); },
      [=](const node_cached_file& m) { on_node_cached_file(self, m); },
      [=](reconcile_atom) { end_reconcile(self); },
      [=](const node_clock_msg& m) { self->state.clock_offsets_ns[m.node] = m.offset_ns; },
      [=](const gateway_join& m) { on_gateway_join(self, m); },
      [=](const replica_event& ev) { on_replica_event(self, ev); },
      [=](const node_health_msg& m) { on_node_health(self, m); },
      [=](const retry_slot& m) {
        auto& s = self->state;
        // Only if nothing fills the slot by now.
        for (const auto& [id, r] : s.replicas)  // a draining one is on its way out: it does not count
          if (r.deployment == m.deployment && r.slot == m.slot && !s.drains->draining(id)) return;
        if (!s.slots->retry({m.deployment, m.slot})) return;  // queued already
        replace_slot(self, m.deployment, m.slot, {});
      },
      [=](const device_fault& f) {
        // The node restarts the device, and its replicas with it; a device
        // that keeps failing ends in a crash loop and the slots move away.
        spdlog::warn("event=device_fault_reported node={} device={} reason=\"{}\"", f.node, f.device, f.reason);
      },
      [=](const drain_msg& m) -> caf::result<drain_reply> {
        if (self->state.reconciling) return to_caf(reconciling_error());
        return on_drain(self, m);
      },
      [=](drain_deadline_atom) { on_drain_deadline(self); },
      [=](const node_leaving& m) { on_node_leaving(self, m); },
      [=](const degraded_check& m) { on_degraded_check(self, m); },
      [=](const get_node& m) -> caf::actor {
        auto it = self->state.nodes.find(m.node);
        return it == self->state.nodes.end() ? caf::actor{} : it->second;
      },
      [=](const deploy_msg& m) -> caf::result<ok_atom> {
        if (self->state.reconciling) return to_caf(reconciling_error());
        return on_deploy(self, m.request);
      },
      [=](const undeploy_msg& m) -> caf::result<ok_atom> {
        auto& s = self->state;
        if (s.reconciling) return to_caf(reconciling_error());
        // A plain name removes every version (and ends its rollout); NAME@V one version.
        std::vector<std::string> names;
        const bool plain = m.name.find('@') == std::string::npos;
        for (const auto& [name, dep] : s.deployments)
          if (name == m.name || (plain && cluster::split_version(name).base == m.name)) names.push_back(name);
        if (names.empty()) return to_caf({errc::not_found, "no deployment named '" + m.name + "'"});
        const std::string base(cluster::split_version(m.name).base);
        if (!plain && (current_of(s, base) == m.name || rollout_active(s, base)))
          return to_caf({errc::invalid_argument, "'" + m.name + "' serves '" + base +
                                                     "' now; abort its rollout, or undeploy '" + base + "'"});
        if (plain) {
          if (rollout_active(s, base)) persist(self, cluster::journal_record::rollout_end(base));
          s.rollouts.erase(base);
          if (s.current_versions.erase(base)) persist(self, cluster::journal_record::version_current(base, base));
          remember_versions(self);
          tell_split(self, base);
        }
        for (const auto& name : names) remove_deployment(self, name);
        return ok_atom::value;
      },
      [=](const wake_deployment& m) {
        auto& s = self->state;
        auto it = s.deployments.find(m.name);
        if (s.reconciling || it == s.deployments.end() || it->second.serving > 0) {
          // Not cold (woken already, or scaled meanwhile): routers still waiting are told.
          if (it != s.deployments.end()) self->send(s.router, deployment_cold{m.name, false});
          return;
        }
        spdlog::info("event=deployment_waking deployment={} replicas=1 reason=\"a request came for it\"", m.name);
        (void)on_scale(self, scale_msg{m.name, 1});
      },
      [=](const scale_msg& m) -> caf::result<ok_atom> { return on_scale(self, m); },
      [=](const rollout_msg& m) -> caf::result<rollout_reply> { return on_rollout(self, m.request); },
      [=](rollout_tick_atom) { on_rollout_tick(self); },
      [=](const version_samples& m) { on_version_samples(self, m); },
      [=](const deployment_loads& m) { on_deployment_loads(self, m); },
      [=](quota_report& m) -> caf::result<quota_grant_msg> {
        auto g = self->state.quotas.report(m.gateway, std::move(m.demands), clock_ns(self));
        if (!g) return to_caf(g.error());
        return quota_grant_msg{std::move(*g)};
      },
      [=](const fair_share_report_msg& m) -> caf::result<fair_share_answer_msg> {
        auto a = self->state.fair_shares.report(m.report, clock_ns(self));
        if (!a) return to_caf(a.error());
        return fair_share_answer_msg{std::move(*a)};
      },
      [=](autoscale_tick_atom) { on_autoscale_tick(self); },
      [=](models_atom) { return models_reply{list_models(self)}; },
      [=](ready_atom) {
        for (const auto& [name, dep] : self->state.deployments) {
          if (dep.spec.replicas == 0) continue;  // cold: woken by its first request
          bool any = false;
          for (const auto& [id, r] : self->state.replicas) any |= r.deployment == name && cluster::serves_requests(r.state);
          if (!any) return false;
        }
        return true;
      },
      [=](status_atom) {
        auto& s = self->state;
        api::cluster_status status;
        for (const auto& n : s.placement->nodes()) {
          const bool up = s.nodes.count(n.id) && s.nodes[n.id];
          const auto h = s.node_health.count(n.id) ? s.node_health[n.id] : cluster::node_health::healthy;
          const auto contact = s.contacts.find(n.id);
          const auto clock = s.clock_offsets_ns.find(n.id);
          const auto drained = s.drains->node_cause(n.id);
          status.nodes.push_back({n.id, n.rack, !up ? "down" : std::string(cluster::to_string(h)),
                                  contact == s.contacts.end() ? "" : contact->second.address,
                                  clock == s.clock_offsets_ns.end() ? 0.0 : clock->second / 1e6,
                                  drained ? std::string(cluster::to_string(*drained)) : std::string(),
                                  s.placement->region_of(n.id)});
          for (std::uint32_t d = 0; d < n.devices; ++d) {
            const auto* l = s.placement->ledger({n.id, d});
            const auto kind = s.device_kinds.find(n.id);
            status.devices.push_back({n.id, d, kind == s.device_kinds.end() ? "cpu" : kind->second,
                                      l ? l->capacity_bytes() : 0, l ? l->used_bytes() : 0});
          }
        }
        for (const auto& [id, r] : s.replicas) {
          api::replica_status rs;
          rs.id = std::to_string(id);
          rs.deployment = r.deployment;
          rs.slot = r.slot;
          rs.epoch = r.epoch;
          rs.state = std::string(cluster::to_string(r.state));
          rs.node = r.node;
          rs.device = r.device;
          rs.devices = devices_of(r.spec);
          status.replicas.push_back(std::move(rs));
        }
        status.models = list_models(self);
        for (const auto& [base, r] : s.rollouts) status.rollouts.push_back({base, status_line(self, r)});
        return status_reply{std::move(status)};
      },
  };
}

}  // namespace exa::actors
