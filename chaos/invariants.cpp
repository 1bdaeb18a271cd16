#include "chaos/invariants.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

namespace exa::chaos {

namespace {

/// Collects violations, listing at most max_violations_per_invariant of each
/// kind and counting the rest.
class violation_sink {
 public:
  void add(std::string_view invariant, std::string detail) {
    std::size_t& n = counts_[std::string(invariant)];
    if (n++ < max_violations_per_invariant) out_.push_back({std::string(invariant), std::move(detail)});
  }
  std::vector<violation> finish() && {
    for (const auto& [name, n] : counts_) {
      if (n > max_violations_per_invariant)
        out_.push_back({name, fmt::format("{} more {} violations not listed", n - max_violations_per_invariant, name)});
    }
    return std::move(out_);
  }

 private:
  std::map<std::string, std::size_t> counts_;
  std::vector<violation> out_;
};

double ms(std::int64_t t_ns) { return static_cast<double>(t_ns) / 1e6; }

// ---------------------------------------------------------------------------
// Requests: accepted once, finished once, one contiguous token stream.

struct request_track {
  bool accepted = false;
  bool greedy = false;
  std::size_t accepted_event = 0;
  std::uint32_t finishes = 0;
  bool stream_broken = false;  // a gap or duplicate was already reported
  std::vector<std::int32_t> tokens;  // what the client saw, by index
};

class request_checker {
 public:
  request_checker(const invariant_inputs& inputs, violation_sink& sink) : inputs_(inputs), sink_(sink) {}

  void on_event(std::size_t i, const event& e) {
    switch (e.kind) {
      case event_kind::request_accepted: return on_accepted(i, e);
      case event_kind::request_tokens: return on_tokens(i, e);
      case event_kind::request_finished: return on_finished(i, e);
      default: return;
    }
  }

  void finish() {
    for (const std::string& id : order_) {
      const request_track& r = requests_.at(id);
      if (r.accepted && r.finishes == 0)
        sink_.add("lost_request", fmt::format("request {} accepted at #{} never finished ({} tokens streamed)", id,
                                              r.accepted_event, r.tokens.size()));
    }
  }

 private:
  request_track& track(const std::string& id) {
    auto [it, inserted] = requests_.try_emplace(id);
    if (inserted) order_.push_back(id);
    return it->second;
  }

  void on_accepted(std::size_t i, const event& e) {
    request_track& r = track(e.request_id);
    if (r.accepted) {
      sink_.add("accepted_twice", fmt::format("request {} accepted at #{} and again at #{}", e.request_id,
                                              r.accepted_event, i));
      return;
    }
    r.accepted = true;
    r.accepted_event = i;
    r.greedy = e.detail == "greedy";
  }

  void on_tokens(std::size_t i, const event& e) {
    request_track& r = track(e.request_id);
    if (!r.accepted) sink_.add("unaccepted_request", fmt::format("request {}: tokens at #{} before it was accepted", e.request_id, i));
    if (r.finishes > 0)
      sink_.add("tokens_after_finish", fmt::format("request {}: {} tokens at #{} after it finished", e.request_id,
                                                   e.tokens.size(), i));
    if (e.tokens.empty()) return;  // an empty event claims no index
    const std::uint64_t next = r.tokens.size();
    if (e.index > next) {
      sink_.add("token_gap", fmt::format("request {}: token indices {}..{} never sent (#{} starts at {})", e.request_id,
                                         next, e.index - 1, i, e.index));
      r.stream_broken = true;
      r.tokens.resize(e.index, -1);
    }
    if (e.index < next) report_duplicates(i, e, r);
    for (std::size_t j = 0; j < e.tokens.size(); ++j) {
      if (e.index + j >= r.tokens.size()) r.tokens.push_back(e.tokens[j]);
    }
  }

  void report_duplicates(std::size_t i, const event& e, request_track& r) {
    const std::uint64_t last = std::min<std::uint64_t>(r.tokens.size(), e.index + e.tokens.size()) - 1;
    const std::int32_t first_token = r.tokens[e.index];
    sink_.add("duplicate_token", fmt::format("request {}: token indices {}..{} sent again at #{} (index {} was {}, "
                                             "now {})",
                                             e.request_id, e.index, last, i, e.index, first_token, e.tokens[0]));
    r.stream_broken = true;
  }

  void on_finished(std::size_t i, const event& e) {
    request_track& r = track(e.request_id);
    if (!r.accepted) sink_.add("unaccepted_request", fmt::format("request {}: finished at #{} but never accepted", e.request_id, i));
    if (++r.finishes > 1) {
      sink_.add("finished_twice", fmt::format("request {}: finished again at #{} ({})", e.request_id, i, e.outcome));
      return;
    }
    if (e.outcome == "error" || e.outcome == "cancelled") {
      if (e.detail.empty())
        sink_.add("bad_outcome", fmt::format("request {}: outcome {} at #{} carries no error code", e.request_id,
                                             e.outcome, i));
      return;
    }
    if (e.outcome != "completed") {
      sink_.add("bad_outcome", fmt::format("request {}: unknown outcome \"{}\" at #{}", e.request_id, e.outcome, i));
      return;
    }
    if (e.count != r.tokens.size()) {
      sink_.add("token_gap", fmt::format("request {}: completed at #{} with {} tokens generated but {} streamed",
                                         e.request_id, i, e.count, r.tokens.size()));
      r.stream_broken = true;
    }
    if (r.greedy && !r.stream_broken) check_output(i, e.request_id, r);
  }

  void check_output(std::size_t i, const std::string& id, const request_track& r) {
    auto it = inputs_.expected_tokens.find(id);
    if (it == inputs_.expected_tokens.end()) return;
    const std::vector<std::int32_t>& want = it->second;
    if (want == r.tokens) return;
    const auto [got_it, want_it] = std::mismatch(r.tokens.begin(), r.tokens.end(), want.begin(), want.end());
    const auto at = static_cast<std::size_t>(got_it - r.tokens.begin());
    const std::string got_s = got_it == r.tokens.end() ? "end" : std::to_string(*got_it);
    const std::string want_s = want_it == want.end() ? "end" : std::to_string(*want_it);
    sink_.add("output_mismatch", fmt::format("request {}: completed at #{}: token {} is {}, expected {} ({} tokens "
                                             "streamed, {} expected)",
                                             id, i, at, got_s, want_s, r.tokens.size(), want.size()));
  }

  const invariant_inputs& inputs_;
  violation_sink& sink_;
  std::map<std::string, request_track> requests_;
  std::vector<std::string> order_;  // first-seen order, for a readable report
};

// ---------------------------------------------------------------------------
// Replicas: one ready-or-serving replica per slot, epochs only move forward.

bool is_up(std::string_view state) { return state == "ready" || state == "serving"; }

using slot_key = std::pair<std::string, std::int64_t>;  // (deployment, slot)

struct replica_track {
  std::string deployment;
  std::int64_t slot = -1;
  std::uint64_t epoch = 0;
  std::int64_t node = -1;
  std::string state;
  bool alive = true;
  bool up() const { return alive && slot >= 0 && is_up(state); }
};

class replica_checker {
 public:
  explicit replica_checker(violation_sink& sink) : sink_(sink) {}

  void on_event(std::size_t i, const event& e) {
    if (e.kind == event_kind::replica_state) return on_state(i, e);
    if (e.kind == event_kind::node_state && e.detail == "down") return kill_node(e.node);
    if (e.kind != event_kind::fault_injected) return;
    // A killed node process, like a killed node actor, ends its replicas
    // without a word; a frozen one's cannot serve until it wakes and says so.
    if (e.detail == "kill_node" || e.detail == "kill_process" || e.detail == "stop_process") return kill_node(e.node);
    if (e.detail == "kill_replica") {
      auto it = replicas_.find(e.replica);
      if (it != replicas_.end()) set_dead(it->first, it->second);
    }
  }

  std::map<std::string, std::uint32_t> up_by_deployment() const {
    std::map<std::string, std::uint32_t> up;
    for (const auto& [id, r] : replicas_)
      if (r.up()) ++up[r.deployment];
    return up;
  }

  void finish(const invariant_inputs& inputs, std::int64_t end_ns) {
    auto up = up_by_deployment();
    for (const auto& [deployment, desired] : inputs.desired_replicas) {
      const std::uint32_t have = up[deployment];
      if (have < desired)
        sink_.add("not_recovered", fmt::format("deployment {}: {} of {} replicas ready or serving at the end of the "
                                               "log (t={:.3f} ms)",
                                               deployment, have, desired, ms(end_ns)));
    }
  }

 private:
  void on_state(std::size_t i, const event& e) {
    replica_track& r = replicas_[e.replica];
    if (r.up()) serving_[{r.deployment, r.slot}].erase(e.replica);
    r.deployment = e.deployment;
    r.slot = e.slot;
    r.epoch = e.epoch;
    r.node = e.node;
    r.state = e.detail;
    r.alive = true;
    if (!r.up()) return;
    const slot_key key{r.deployment, r.slot};
    std::set<std::uint64_t>& up = serving_[key];
    for (std::uint64_t other : up) {
      const replica_track& o = replicas_.at(other);
      sink_.add("two_serving_replicas",
                fmt::format("deployment {} slot {}: replica {} (epoch {}) became {} at #{} while replica {} (epoch "
                            "{}) was {}",
                            key.first, key.second, e.replica, r.epoch, r.state, i, other, o.epoch, o.state));
    }
    auto [newest, inserted] = newest_epoch_.try_emplace(key, r.epoch);
    if (!inserted && r.epoch < newest->second)
      sink_.add("two_serving_replicas",
                fmt::format("deployment {} slot {}: replica {} of stale epoch {} became {} at #{} after epoch {} was "
                            "ready or serving",
                            key.first, key.second, e.replica, r.epoch, r.state, i, newest->second));
    newest->second = std::max(newest->second, r.epoch);
    up.insert(e.replica);
  }

  void set_dead(std::uint64_t id, replica_track& r) {
    if (r.up()) serving_[{r.deployment, r.slot}].erase(id);
    r.alive = false;
  }

  void kill_node(std::int64_t node) {
    if (node < 0) return;
    for (auto& [id, r] : replicas_)
      if (r.node == node) set_dead(id, r);
  }

  violation_sink& sink_;
  std::map<std::uint64_t, replica_track> replicas_;
  std::map<slot_key, std::set<std::uint64_t>> serving_;   // replicas up now
  std::map<slot_key, std::uint64_t> newest_epoch_;        // highest epoch ever up
};

}  // namespace

std::map<std::string, std::uint32_t> replicas_up(const std::vector<event>& log) {
  violation_sink sink;
  replica_checker replicas(sink);
  for (std::size_t i = 0; i < log.size(); ++i) replicas.on_event(i, log[i]);
  return replicas.up_by_deployment();
}

std::vector<violation> check_invariants(const std::vector<event>& log, const invariant_inputs& inputs) {
  violation_sink sink;
  request_checker requests(inputs, sink);
  replica_checker replicas(sink);
  for (std::size_t i = 0; i < log.size(); ++i) {
    const event& e = log[i];
    if (i > 0 && e.t_ns < log[i - 1].t_ns)
      sink.add("unordered_events", fmt::format("#{} at t={:.3f} ms is before #{} at t={:.3f} ms", i, ms(e.t_ns),
                                               i - 1, ms(log[i - 1].t_ns)));
    requests.on_event(i, e);
    replicas.on_event(i, e);
  }
  requests.finish();
  replicas.finish(inputs, log.empty() ? 0 : log.back().t_ns);
  return std::move(sink).finish();
}

}  // namespace exa::chaos
