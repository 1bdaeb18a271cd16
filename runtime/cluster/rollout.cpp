#include "cluster/rollout.hpp"

#include <algorithm>
#include <charconv>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace exa::cluster {

expected<std::vector<std::uint32_t>> parse_steps(std::string_view text) {
  std::vector<std::uint32_t> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const auto comma = text.find(',', at);
    const auto part = text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    std::uint32_t v = 0;
    const auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || ec != std::errc{} || p != part.data() + part.size() || v < 1 || v > 100)
      return make_error(errc::invalid_argument,
                        "step '" + std::string(part) + "' of '" + std::string(text) + "' is not a percentage in [1, 100]");
    if (!out.empty() && v <= out.back())
      return make_error(errc::invalid_argument, "steps must grow: " + std::to_string(v) + " after " +
                                                    std::to_string(out.back()) + " in '" + std::string(text) + "'");
    out.push_back(v);
    if (out.size() > 16) return make_error(errc::invalid_argument, "at most 16 steps");
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  if (out.empty() || out.back() != 100)
    return make_error(errc::invalid_argument, "the last step must be 100 (all traffic), in '" + std::string(text) + "'");
  return out;
}

expected<void> validate(const rollout_plan& plan) {
  std::string text;
  for (const auto s : plan.steps) text += (text.empty() ? "" : ",") + std::to_string(s);
  if (auto ok = parse_steps(text); !ok) return std::unexpected(ok.error());
  if (plan.surge == 0 && plan.max_unavailable == 0)
    return make_error(errc::invalid_argument, "surge and max_unavailable cannot both be 0: no replica could be replaced");
  return {};
}

void version_window::push(std::vector<double>& v, std::size_t& next, double x) {
  if (v.size() < capacity_) v.push_back(x);
  else v[next] = x;
  next = (next + 1) % capacity_;
}

void version_window::add_success(double ttft_ms, double tpot_ms) {
  push(ttft_, next_ttft_, ttft_ms);
  push(tpot_, next_tpot_, tpot_ms);
  ++requests_;
}

void version_window::add_failure() {
  ++requests_;
  ++failures_;
}

void version_window::clear() {
  ttft_.clear();
  tpot_.clear();
  next_ttft_ = next_tpot_ = 0;
  requests_ = failures_ = 0;
}

double version_window::error_rate() const noexcept {
  return requests_ == 0 ? 0.0 : static_cast<double>(failures_) / static_cast<double>(requests_);
}

double version_window::p99(const std::vector<double>& v) {
  if (v.empty()) return 0;
  auto copy = v;
  const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(copy.size()))) - 1;
  std::nth_element(copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(rank), copy.end());
  return copy[rank];
}

verdict judge(const version_window& o, const version_window& n, const verdict_policy& p) {
  if (o.samples() < p.min_samples || n.samples() < p.min_samples)
    return {verdict::kind::insufficient, fmt::format("{} old and {} new samples, {} of each needed", o.samples(),
                                                     n.samples(), p.min_samples)};
  const auto limit = [&](double old_ms) { return old_ms * (1 + p.latency_ratio) + p.latency_slack_ms; };
  const double ttft_old = o.ttft_p99_ms(), ttft_new = n.ttft_p99_ms();
  const double tpot_old = o.tpot_p99_ms(), tpot_new = n.tpot_p99_ms();
  const double err_old = o.error_rate(), err_new = n.error_rate();
  const std::string numbers =
      fmt::format("ttft p99 {:.1f} ms vs {:.1f} ms, tpot p99 {:.1f} ms vs {:.1f} ms, errors {:.1f}% vs {:.1f}%",
                  ttft_new, ttft_old, tpot_new, tpot_old, err_new * 100, err_old * 100);
  if (err_new > err_old + p.error_rate_slack)
    return {verdict::kind::regression, fmt::format("error rate {:.1f}% above {:.1f}% + {:.1f} points; {}",
                                                   err_new * 100, err_old * 100, p.error_rate_slack * 100, numbers)};
  if (ttft_new > limit(ttft_old))
    return {verdict::kind::regression,
            fmt::format("ttft p99 above its limit of {:.1f} ms; {}", limit(ttft_old), numbers)};
  if (tpot_new > limit(tpot_old))
    return {verdict::kind::regression,
            fmt::format("tpot p99 above its limit of {:.1f} ms; {}", limit(tpot_old), numbers)};
  return {verdict::kind::pass, numbers};
}

bool goes_to_new(std::uint32_t new_percent, std::string_view key, double draw) {
  if (new_percent >= 100) return true;
  if (new_percent == 0) return false;
  if (key.empty()) return draw * 100 < new_percent;
  // FNV-1a, then a finalizer: a stable bucket in [0, 10000) per key.
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : key) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h % 10000 < std::uint64_t{new_percent} * 100;
}

versioned_name split_version(std::string_view name) noexcept {
  const auto at = name.rfind('@');
  if (at == std::string_view::npos) return {name, {}};
  return {name.substr(0, at), name.substr(at + 1)};
}

std::string version_of(std::string_view deployment) {
  const auto v = split_version(deployment).version;
  return v.empty() ? std::string("1") : std::string(v);
}

std::string deployment_for(std::string_view base, std::string_view version) {
  if (version.empty() || version == "1") return std::string(base);
  return std::string(base) + "@" + std::string(version);
}

expected<void> check_version(std::string_view version) {
  if (version.empty() || version.size() > 32)
    return make_error(errc::invalid_argument, "a version must be 1..32 characters, got '" + std::string(version) + "'");
  for (const char c : version)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.')
      return make_error(errc::invalid_argument,
                        "version '" + std::string(version) + "' may use only letters, digits, '-', '_' and '.'");
  return {};
}

std::string next_version(const std::vector<std::string>& existing) {
  std::uint64_t highest = 0;
  for (const auto& v : existing) {
    std::uint64_t n = 0;
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec == std::errc{} && p == v.data() + v.size()) highest = std::max(highest, n);
  }
  return std::to_string(std::max<std::uint64_t>(highest, 1) + 1);
}

version_counts step_targets(std::uint32_t total, std::uint32_t new_percent, const rollout_plan& plan) {
  if (total == 0) return {};
  if (new_percent >= 100) return {0, total};
  const auto share = static_cast<std::uint32_t>((std::uint64_t{total} * new_percent + 99) / 100);
  const std::uint32_t n = std::clamp<std::uint32_t>(share, 1, total);
  std::uint32_t o = total - n;
  // Below 100 % the old version keeps serving its share (and giving the
  // verdict its baseline): surging, on an extra replica; in place, on one of
  // the total when there are two or more.
  if (o == 0 && plan.surge > 0) o = 1;
  else if (o == 0 && total >= 2) return {1, total - 1};
  return {o, n};
}

version_counts next_counts(std::uint32_t total, std::uint32_t new_percent, const rollout_plan& plan,
                           version_counts wanted, version_counts ready) {
  const auto target = step_targets(total, new_percent, plan);
  version_counts out = wanted;
  if (wanted.old_replicas < target.old_replicas && target.new_replicas <= wanted.new_replicas) {
    out.old_replicas = target.old_replicas;  // back up (a resumed or shrunk step)
    return out;
  }
  const std::uint32_t unavailable =
      total > ready.old_replicas + ready.new_replicas ? total - ready.old_replicas - ready.new_replicas : 0;
  const bool new_caught_up = ready.new_replicas >= wanted.new_replicas;
  if (plan.surge > 0) {
    const std::uint32_t in_use = wanted.old_replicas + wanted.new_replicas;
    const std::uint32_t room = total + plan.surge > in_use ? total + plan.surge - in_use : 0;
    if (wanted.new_replicas < target.new_replicas && room > 0 && new_caught_up) {
      out.new_replicas += std::min({room, plan.surge, target.new_replicas - wanted.new_replicas});
      return out;
    }
    if (wanted.old_replicas > target.old_replicas && new_caught_up) {
      // Never below `total` serving: old ones stop only for ready new ones.
      const std::uint32_t batch = std::max<std::uint32_t>(plan.max_unavailable, 1);
      const std::uint32_t floor = total > ready.new_replicas ? total - ready.new_replicas : 0;
      out.old_replicas = std::max({target.old_replicas, floor, wanted.old_replicas - std::min(batch, wanted.old_replicas)});
    }
    return out;
  }
  // Zero surge: free a place, then fill it, never more than max_unavailable down.
  if (wanted.new_replicas < target.new_replicas && wanted.old_replicas + wanted.new_replicas < total) {
    out.new_replicas += std::min(total - wanted.old_replicas - wanted.new_replicas,
                                 target.new_replicas - wanted.new_replicas);
    return out;
  }
  if (wanted.old_replicas > target.old_replicas && new_caught_up && unavailable < plan.max_unavailable)
    out.old_replicas -= std::min(plan.max_unavailable - unavailable, wanted.old_replicas - target.old_replicas);
  return out;
}

std::string_view to_string(rollout_phase p) noexcept {
  switch (p) {
    case rollout_phase::in_progress: return "in_progress";
    case rollout_phase::paused: return "paused";
    case rollout_phase::complete: return "complete";
    case rollout_phase::rolled_back: return "rolled_back";
    case rollout_phase::aborted: return "aborted";
  }
  return "unknown";
}

rollout_machine::rollout_machine(std::string old_version, std::string new_version, rollout_plan plan,
                                 verdict_policy policy, std::int64_t now_ns)
    : old_version_(std::move(old_version)), new_version_(std::move(new_version)), plan_(std::move(plan)),
      policy_(policy) {
  if (plan_.steps.empty()) plan_.steps = {100};  // validate() refuses it; never index an empty plan
  start_step(now_ns);
}

void rollout_machine::start_step(std::int64_t now_ns) {
  step_started_ns_ = now_ns;
  // At 100 % the old version gets no traffic: its last window is the baseline.
  if (plan_.steps[step_] < 100) old_.clear();
  new_.clear();
}

namespace {
// At 100 % there is no old traffic in the same window to compare latency
// with (a baseline from an earlier window would compare different loads):
// the new version is judged on its error rate, against the baseline's when
// there is one.
verdict judge_alone(const version_window& o, const version_window& n, const verdict_policy& p) {
  if (n.samples() < p.min_samples)
    return {verdict::kind::insufficient,
            fmt::format("{} new samples, {} needed (all traffic on it: errors only)", n.samples(), p.min_samples)};
  const double base = o.samples() > 0 ? o.error_rate() : 0.0;
  const std::string numbers = fmt::format(
      "all traffic on it: errors {:.1f}% vs {:.1f}% before; ttft p99 {:.1f} ms, tpot p99 {:.1f} ms (not compared)",
      n.error_rate() * 100, base * 100, n.ttft_p99_ms(), n.tpot_p99_ms());
  if (n.error_rate() > base + p.error_rate_slack)
    return {verdict::kind::regression, fmt::format("error rate {:.1f}% above {:.1f}% + {:.1f} points; {}",
                                                   n.error_rate() * 100, base * 100, p.error_rate_slack * 100, numbers)};
  return {verdict::kind::pass, numbers};
}
}  // namespace

std::uint32_t rollout_machine::new_percent() const noexcept {
  if (phase_ == rollout_phase::complete) return 100;
  if (phase_ == rollout_phase::rolled_back || phase_ == rollout_phase::aborted) return 0;
  return plan_.steps[step_];
}

bool rollout_machine::tick(std::int64_t now_ns) {
  if (phase_ != rollout_phase::in_progress) return false;
  last_ = plan_.steps[step_] >= 100 ? judge_alone(old_, new_, policy_) : judge(old_, new_, policy_);
  // A regression rolls back at once; a pass moves on only after the bake.
  if (last_.result == verdict::kind::regression) {
    phase_ = rollout_phase::rolled_back;
    return true;
  }
  const bool baked = now_ns - step_started_ns_ >= std::int64_t{plan_.bake_s} * 1'000'000'000;
  if (last_.result != verdict::kind::pass || !baked) return false;
  if (step_ + 1 == plan_.steps.size()) {
    phase_ = rollout_phase::complete;
    return true;
  }
  ++step_;
  start_step(now_ns);
  return true;
}

expected<void> rollout_machine::pause() {
  if (phase_ != rollout_phase::in_progress)
    return make_error(errc::invalid_argument, "cannot pause a rollout that is " + std::string(to_string(phase_)));
  phase_ = rollout_phase::paused;
  return {};
}

expected<void> rollout_machine::resume(std::int64_t now_ns) {
  if (phase_ != rollout_phase::paused)
    return make_error(errc::invalid_argument, "cannot resume a rollout that is " + std::string(to_string(phase_)));
  phase_ = rollout_phase::in_progress;
  start_step(now_ns);  // judged afresh: what happened while paused is not this step's evidence
  return {};
}

expected<void> rollout_machine::abort() {
  if (is_final(phase_))
    return make_error(errc::invalid_argument, "cannot abort a rollout that is " + std::string(to_string(phase_)));
  phase_ = rollout_phase::aborted;
  return {};
}

expected<void> rollout_machine::promote() {
  if (is_final(phase_))
    return make_error(errc::invalid_argument, "cannot promote a rollout that is " + std::string(to_string(phase_)));
  phase_ = rollout_phase::complete;
  return {};
}

void rollout_machine::hold(std::int64_t now_ns) { step_started_ns_ = now_ns; }

expected<void> rollout_machine::roll_back(std::string reason) {
  if (is_final(phase_))
    return make_error(errc::invalid_argument, "cannot roll back a rollout that is " + std::string(to_string(phase_)));
  phase_ = rollout_phase::rolled_back;
  last_ = {verdict::kind::regression, std::move(reason)};
  return {};
}

std::string rollout_machine::status_line() const {
  const auto pct = new_percent();
  std::string verdict_text = last_.reason.empty() ? "none yet"
                             : last_.result == verdict::kind::pass       ? "pass " + last_.reason
                             : last_.result == verdict::kind::regression ? "regression " + last_.reason
                                                                         : "insufficient " + last_.reason;
  return fmt::format("{} step {}/{} split {}={}% {}={}% verdict {}", to_string(phase_), step_ + 1, plan_.steps.size(),
                     old_version_, 100 - pct, new_version_, pct, verdict_text);
}

}  // namespace exa::cluster
