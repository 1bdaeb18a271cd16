#include "cluster/admission.hpp"

#include <algorithm>
#include <cmath>

#include "common/assert.hpp"

namespace exa::cluster {

// ---- event_rate ----------------------------------------------------------------

event_rate::event_rate(std::uint64_t window_ns) noexcept
    : bucket_ns_(std::max<std::uint64_t>(window_ns / buckets, 1)) {}

void event_rate::record(std::uint64_t now_ns) noexcept {
  // Clocks passed in are monotonic; tolerate a stale timestamp from a late
  // message by counting it in the newest bucket rather than rewriting history.
  now_ns = std::max(now_ns, latest_ns_);
  latest_ns_ = now_ns;
  if (!seen_) {
    first_ns_ = now_ns;
    seen_ = true;
  }
  const std::uint64_t bucket = now_ns / bucket_ns_;
  const std::size_t slot = bucket % buckets;
  if (bucket_of_[slot] != bucket || counts_[slot] == 0) {
    bucket_of_[slot] = bucket;
    counts_[slot] = 0;
  }
  ++counts_[slot];
}

double event_rate::per_s(std::uint64_t now_ns) const noexcept {
  if (!seen_) return 0;
  now_ns = std::max(now_ns, latest_ns_);
  const std::uint64_t newest = now_ns / bucket_ns_;
  std::uint64_t events = 0;
  for (std::size_t slot = 0; slot < buckets; ++slot) {
    if (counts_[slot] != 0 && bucket_of_[slot] + buckets > newest) events += counts_[slot];
  }
  if (events == 0) return 0;
  // The window is the full span of the buckets, or less right after the
  // first event (never below one bucket, so one early event is not a huge rate).
  const std::uint64_t window_ns = bucket_ns_ * buckets;
  const std::uint64_t covered_ns = std::clamp<std::uint64_t>(now_ns - first_ns_, bucket_ns_, window_ns);
  return static_cast<double>(events) * 1e9 / static_cast<double>(covered_ns);
}

// ---- admission_controller -----------------------------------------------------------

expected<admission_controller> admission_controller::create(admission_config config) {
  if (config.in_flight_per_replica_max == 0 || config.queued_global_max == 0 ||
      config.queued_per_model_max == 0 || config.models_max == 0 || config.replicas_max == 0) {
    return make_error(errc::invalid_argument, "admission limits must be positive");
  }
  if (config.retry_after_ms_min > config.retry_after_ms_max) {
    return make_error(errc::invalid_argument, "retry_after_ms_min exceeds retry_after_ms_max");
  }
  if (config.drain_window_ns < event_rate::buckets) {
    return make_error(errc::invalid_argument, "drain_window_ns is too short to estimate a rate");
  }
  return admission_controller(config);
}

admission_controller::admission_controller(admission_config config)
    : config_(config), global_departures_(config.drain_window_ns) {}

const admission_controller::model_queue* admission_controller::find_model(
    std::string_view model) const noexcept {
  const auto it = model_index_.find(model);
  return it == model_index_.end() ? nullptr : &models_[it->second];
}

std::uint32_t admission_controller::estimate_ms(std::uint64_t backlog, const event_rate& rate,
                                                std::uint64_t now_ns) const {
  const double per_s = rate.per_s(now_ns);
  double ms = config_.retry_after_ms_default;
  if (per_s > 0) ms = std::ceil(static_cast<double>(backlog) * 1000.0 / per_s);
  ms = std::clamp(ms, static_cast<double>(config_.retry_after_ms_min),
                  static_cast<double>(config_.retry_after_ms_max));
  return static_cast<std::uint32_t>(ms);
}

std::uint32_t admission_controller::retry_after_ms(std::string_view model, std::uint64_t now_ns) const {
  if (queued_total_ >= config_.queued_global_max) {
    return estimate_ms(queued_total_, global_departures_, now_ns);
  }
  const model_queue* queue = find_model(model);
  if (queue != nullptr && queue->queued >= config_.queued_per_model_max) {
    return estimate_ms(queue->queued, queue->departures, now_ns);
  }
  return 0;
}

expected<admission_ticket> admission_controller::try_admit(std::string_view model, std::uint64_t now_ns) {
  if (queued_total_ >= config_.queued_global_max) {
    return make_error(errc::overloaded,
                      "all models together have " + std::to_string(queued_total_) +
                          " queued requests (limit " + std::to_string(config_.queued_global_max) +
                          "); retry after " + std::to_string(retry_after_ms(model, now_ns)) + " ms");
  }
  auto it = model_index_.find(model);
  if (it == model_index_.end()) {
    if (models_.size() >= config_.models_max) {
      return make_error(errc::overloaded, "admission tracks " + std::to_string(config_.models_max) +
                                              " models (limit); cannot add '" + std::string(model) + "'");
    }
    models_.push_back(model_queue{std::string(model), 0, event_rate(config_.drain_window_ns)});
    it = model_index_.emplace(std::string(model), static_cast<std::uint32_t>(models_.size() - 1)).first;
  }
  model_queue& queue = models_[it->second];
  if (queue.queued >= config_.queued_per_model_max) {
    return make_error(errc::overloaded,
                      "model '" + queue.name + "' has " + std::to_string(queue.queued) +
                          " queued requests (limit " + std::to_string(config_.queued_per_model_max) +
                          "); retry after " + std::to_string(retry_after_ms(model, now_ns)) + " ms");
  }
  ++queue.queued;
  ++queued_total_;
  EXA_ASSERT(queue.queued <= config_.queued_per_model_max);
  const admission_ticket ticket{next_ticket_++};
  tickets_.emplace(ticket.id, ticket_state{it->second, false, 0});
  check_invariants();
  return ticket;
}

expected<void> admission_controller::try_dispatch(const admission_ticket& ticket, replica_id replica,
                                                  std::uint64_t now_ns) {
  const auto it = tickets_.find(ticket.id);
  if (it == tickets_.end()) {
    return make_error(errc::not_found, "unknown admission ticket " + std::to_string(ticket.id));
  }
  ticket_state& state = it->second;
  if (state.dispatched && state.replica == replica) return {};
  const auto slot = in_flight_.find(replica);
  const std::uint32_t current = slot == in_flight_.end() ? 0 : slot->second;
  if (current >= config_.in_flight_per_replica_max) {
    return make_error(errc::overloaded, "replica " + std::to_string(replica) + " has " +
                                            std::to_string(current) + " requests in flight (limit " +
                                            std::to_string(config_.in_flight_per_replica_max) + ")");
  }
  if (slot == in_flight_.end() && in_flight_.size() >= config_.replicas_max) {
    return make_error(errc::overloaded, "admission tracks " + std::to_string(config_.replicas_max) +
                                            " replicas with requests in flight (limit)");
  }
  if (state.dispatched) {
    leave_replica(state);
  } else {
    leave_queue(state, now_ns);
  }
  const std::uint32_t now_in_flight = ++in_flight_[replica];
  EXA_ASSERT(now_in_flight <= config_.in_flight_per_replica_max);
  ++in_flight_total_;
  state.dispatched = true;
  state.replica = replica;
  check_invariants();
  return {};
}

expected<void> admission_controller::release(const admission_ticket& ticket, std::uint64_t now_ns) {
  const auto it = tickets_.find(ticket.id);
  if (it == tickets_.end()) {
    return make_error(errc::not_found,
                      "unknown or already released admission ticket " + std::to_string(ticket.id));
  }
  if (it->second.dispatched) {
    leave_replica(it->second);
  } else {
    leave_queue(it->second, now_ns);
  }
  tickets_.erase(it);
  check_invariants();
  return {};
}

// A departure from the queue, by dispatch or by release, is what makes room,
// so it is what the drain rate counts.
void admission_controller::leave_queue(ticket_state& state, std::uint64_t now_ns) {
  model_queue& queue = models_[state.model];
  EXA_ASSERT(queue.queued > 0 && queued_total_ > 0);
  --queue.queued;
  --queued_total_;
  queue.departures.record(now_ns);
  global_departures_.record(now_ns);
}

void admission_controller::leave_replica(const ticket_state& state) {
  const auto it = in_flight_.find(state.replica);
  EXA_ASSERT(it != in_flight_.end() && it->second > 0 && in_flight_total_ > 0);
  --in_flight_total_;
  if (--it->second == 0) in_flight_.erase(it);  // bounded by replicas with work
}

std::uint32_t admission_controller::queued(std::string_view model) const noexcept {
  const model_queue* queue = find_model(model);
  return queue == nullptr ? 0 : queue->queued;
}

std::uint32_t admission_controller::in_flight(replica_id replica) const noexcept {
  const auto it = in_flight_.find(replica);
  return it == in_flight_.end() ? 0 : it->second;
}

// O(1): the per-model and per-replica bounds are asserted where they change.
void admission_controller::check_invariants() const {
  EXA_ASSERT(queued_total_ <= config_.queued_global_max);
  EXA_ASSERT(tickets_.size() == queued_total_ + in_flight_total_);
  EXA_ASSERT(models_.size() <= config_.models_max && in_flight_.size() <= config_.replicas_max);
}

}  // namespace exa::cluster
