#pragma once
// A rollout as pure logic: the plan (traffic steps, bake time, batch
// limits), the per-version samples a verdict compares, the verdict itself,
// which version a request goes to (pinned, or sticky per conversation), and
// the phase machine that moves through the steps and rolls back.
//
//   in_progress ──bake passed──> next step ... ──last step passed──> complete
//        │  ^                                                    (promote: at once)
//   pause│  │resume
//        v  │
//      paused          regression at any step ──> rolled_back
//                      abort (operator)        ──> aborted
//
// A verdict needs min_samples of each version in the same window; until then
// it is `insufficient` and the step bakes on. A regression: the new
// version's TTFT p99 or TPOT p99 above the old one's by more than the
// tolerance (a ratio plus an absolute slack, so that tiny latencies do not
// flap), or its error rate above the old one's by more than the tolerance.
//
// A step at 100 % leaves the old version no traffic in the same window, so
// latency is not compared there (a window from an earlier step saw another
// load): the new version is judged on its error rate, against the previous
// step's old error rate (kept as the baseline) plus the slack.
//
// Versions: a deployment's first version is named plainly ("tiny", version
// "1"); the versions a rollout brings are deployments of their own named
// "tiny@2". Requests name "tiny" (the traffic split decides) or pin
// "tiny@2". The controller wires this (actors/controller_actor.cpp).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::cluster {

struct rollout_plan {
  std::vector<std::uint32_t> steps = {1, 10, 100};  // percent of traffic on the new version
  std::uint32_t bake_s = 300;                       // at least this long per step before a verdict moves it
  std::uint32_t max_unavailable = 1;                // replicas replaced at once
  std::uint32_t surge = 1;                          // extra replicas started first (0: replace in place)
};

/// Parses "1,10,100": ascending percentages in [1, 100] ending at 100, at
/// most 16 steps. invalid_argument naming the bad step.
expected<std::vector<std::uint32_t>> parse_steps(std::string_view text);
/// invalid_argument for a plan that cannot work (no steps, surge and
/// max_unavailable both 0, steps as parse_steps would refuse).
expected<void> validate(const rollout_plan& plan);

struct verdict_policy {
  std::uint32_t min_samples = 100;    // per version, per window
  double latency_ratio = 0.2;         // new p99 may exceed old p99 by 20 % ...
  double latency_slack_ms = 5;        // ... plus 5 ms
  double error_rate_slack = 0.01;     // new error rate may exceed old by 1 point
};

/// A version's samples over a window: bounded (the newest `capacity`).
class version_window {
 public:
  explicit version_window(std::size_t capacity = 4096) : capacity_(capacity ? capacity : 1) {}
  /// A finished request: its TTFT and TPOT in ms.
  void add_success(double ttft_ms, double tpot_ms);
  void add_failure();
  void clear();
  std::size_t samples() const noexcept { return requests_; }
  double error_rate() const noexcept;
  /// 99th percentile (nearest rank) of the successes; 0 when none.
  double ttft_p99_ms() const { return p99(ttft_); }
  double tpot_p99_ms() const { return p99(tpot_); }

 private:
  static double p99(const std::vector<double>& v);
  void push(std::vector<double>& v, std::size_t& next, double x);
  std::size_t capacity_;
  std::vector<double> ttft_, tpot_;
  std::size_t next_ttft_ = 0, next_tpot_ = 0;
  std::size_t requests_ = 0, failures_ = 0;
};

struct verdict {
  enum class kind : std::uint8_t { insufficient, pass, regression };
  kind result = kind::insufficient;
  std::string reason;  // with the numbers: "ttft p99 412.0 ms vs 180.0 ms (limit 221.0 ms)"
};
verdict judge(const version_window& old_version, const version_window& new_version, const verdict_policy& policy);

/// Which version a request goes to. A pinned one always wins (routing never
/// sends it elsewhere). Otherwise a conversation key (the OpenAI `user`, a
/// session header) picks by a stable hash, so one conversation stays on one
/// version while the share grows (a key on the new version at 10 % is still
/// on it at 50 %); without a key, `draw` (uniform in [0, 1)) decides.
bool goes_to_new(std::uint32_t new_percent, std::string_view conversation_key, double draw);

/// "tiny@2" -> {"tiny", "2"}; "tiny" -> {"tiny", ""}.
struct versioned_name {
  std::string_view base;
  std::string_view version;  // "" when the name pins none
};
versioned_name split_version(std::string_view name) noexcept;
/// The version label of a deployment: what follows '@', else "1".
std::string version_of(std::string_view deployment);
/// The deployment that serves `version` of `base` ("1" is the plain name).
std::string deployment_for(std::string_view base, std::string_view version);
/// A version label: 1..32 letters, digits, '-', '_' or '.'; invalid_argument otherwise.
expected<void> check_version(std::string_view version);
/// The label after the highest numeric one of `existing` ("2" after {"1"}).
std::string next_version(const std::vector<std::string>& existing);

/// Replica counts of the old and the new version.
struct version_counts {
  std::uint32_t old_replicas = 0;
  std::uint32_t new_replicas = 0;
  bool operator==(const version_counts&) const = default;
};
/// What a step wants: the new version's share of `total` replicas (at least
/// one, all at 100 %), the old one the rest; below 100 % the old version
/// keeps one (an extra one while surging; in place, one of the total, so a
/// one-replica deployment cannot be compared in place).
version_counts step_targets(std::uint32_t total, std::uint32_t new_percent, const rollout_plan& plan);
/// One move toward the step's targets, batch by batch. Surge: new replicas
/// start first (at most total + surge wanted at once) and old ones stop only
/// once the new ones are ready. Zero surge ("no extra GPUs"): an old replica
/// stops first and a new one takes its place, with at most max_unavailable
/// of `total` not ready at any time. Returns `wanted` when nothing may move.
version_counts next_counts(std::uint32_t total, std::uint32_t new_percent, const rollout_plan& plan,
                           version_counts wanted, version_counts ready);

enum class rollout_phase : std::uint8_t { in_progress, paused, complete, rolled_back, aborted };
std::string_view to_string(rollout_phase p) noexcept;
constexpr bool is_final(rollout_phase p) noexcept {
  return p == rollout_phase::complete || p == rollout_phase::rolled_back || p == rollout_phase::aborted;
}

class rollout_machine {
 public:
  rollout_machine(std::string old_version, std::string new_version, rollout_plan plan, verdict_policy policy,
                  std::int64_t now_ns);

  rollout_phase phase() const noexcept { return phase_; }
  std::size_t step() const noexcept { return step_; }  // index into plan().steps
  /// The new version's share of traffic now: the step's, 0 once rolled back
  /// or aborted, 100 once complete.
  std::uint32_t new_percent() const noexcept;
  const rollout_plan& plan() const noexcept { return plan_; }
  const verdict& last_verdict() const noexcept { return last_; }

  /// Samples of the current step's window (both versions, same window).
  version_window& old_window() { return old_; }
  version_window& new_window() { return new_; }

  /// Judges the window once the step has baked; moves on, completes or
  /// rolls back. Returns true when the phase or step changed.
  bool tick(std::int64_t now_ns);

  // Operator commands; invalid_argument naming the phase when not allowed.
  expected<void> pause();
  expected<void> resume(std::int64_t now_ns);
  expected<void> abort();
  /// Straight to 100 %, complete.
  expected<void> promote();
  /// The step's bake starts again from now (its samples stay): while
  /// replicas are still being replaced, a step is not yet what it says.
  void hold(std::int64_t now_ns);
  /// Rolled back for a reason found outside the windows (the new version
  /// never became ready), kept as the last verdict.
  expected<void> roll_back(std::string reason);

  /// One line, starting with the phase: "in_progress step 2/3 split 1=90% 2=10%
  /// verdict pass ttft p99 ...".
  std::string status_line() const;

 private:
  void start_step(std::int64_t now_ns);
  std::string old_version_, new_version_;
  rollout_plan plan_;
  verdict_policy policy_;
  rollout_phase phase_ = rollout_phase::in_progress;
  std::size_t step_ = 0;
  std::int64_t step_started_ns_ = 0;
  version_window old_, new_;
  verdict last_;
};

}  // namespace exa::cluster
