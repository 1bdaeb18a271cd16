#include "metrics/metrics.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "common/assert.hpp"

namespace exa::metrics {

namespace {

constexpr std::array<double, 13> latency_bounds_ms = {1,   2,    5,    10,   20,   50,   100,
                                                      200, 500, 1000, 2000, 5000, 10000};

bool is_name_start(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}

// Prometheus data model: metric names [a-zA-Z_:][a-zA-Z0-9_:]*, label names
// [a-zA-Z_][a-zA-Z0-9_]* with the "__" prefix reserved.
bool is_valid_name(std::string_view name, bool metric) {
  if (name.empty() || !is_name_start(name[0], metric)) return false;
  for (const char c : name) {
    if (!is_name_start(c, metric) && !(c >= '0' && c <= '9')) return false;
  }
  return metric || !name.starts_with("__");
}

std::string join(const std::vector<std::string>& names) {
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i > 0 ? ", " : "") + names[i];
  return out + "}";
}

}  // namespace

std::string_view to_string(metric_type type) noexcept {
  switch (type) {
    case metric_type::counter: return "counter";
    case metric_type::gauge: return "gauge";
    case metric_type::histogram: return "histogram";
  }
  return "untyped";
}

std::span<const double> latency_buckets_ms() noexcept { return latency_bounds_ms; }

// ---- histogram -------------------------------------------------------------------

std::uint64_t histogram_snapshot::count() const noexcept {
  std::uint64_t total = 0;
  for (const auto c : counts) total += c;
  return total;
}

histogram::histogram(std::span<const double> bounds)
    : bounds_(bounds), counts_(std::make_unique<std::atomic<std::uint64_t>[]>(bounds.size() + 1)) {
  EXA_ASSERT(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void histogram::observe(double value) noexcept {
  if (std::isnan(value)) return;
  // First bound >= value: `le` is inclusive, so a value equal to a bound
  // belongs to that bound's bucket. Past the last bound: the +Inf bucket.
  const auto index = static_cast<std::size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[index].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

histogram_snapshot histogram::snapshot() const {
  histogram_snapshot out;
  out.bounds.assign(bounds_.begin(), bounds_.end());
  out.counts.resize(bounds_.size() + 1);
  for (std::size_t i = 0; i <= bounds_.size(); ++i)
    out.counts[i] = counts_[i].load(std::memory_order_relaxed);
  out.sum = sum_.load(std::memory_order_relaxed);
  return out;
}

double quantile(std::span<const double> bounds, std::span<const std::uint64_t> counts, double q) {
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  if (!(q >= 0 && q <= 1) || counts.size() != bounds.size() + 1 || bounds.empty()) return nan;
  std::uint64_t total = 0;
  for (const auto c : counts) total += c;
  if (total == 0) return nan;
  const double rank = q * static_cast<double>(total);
  double below = 0;  // observations in earlier buckets
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double in_bucket = static_cast<double>(counts[i]);
    // Skip empty buckets so that q = 0 lands in the first occupied one.
    if (in_bucket == 0 || below + in_bucket < rank) {
      below += in_bucket;
      continue;
    }
    if (i == bounds.size()) return bounds.back();  // +Inf bucket: no upper edge to interpolate to
    const double upper = bounds[i];
    const double lower = i > 0 ? bounds[i - 1] : std::min(0.0, upper);
    return lower + (upper - lower) * (rank - below) / in_bucket;
  }
  return bounds.back();
}

// ---- families ------------------------------------------------------------------------

family_base::family_base(std::string name, std::string help, metric_type type,
                         std::vector<std::string> label_names, std::vector<double> bounds,
                         std::size_t series_max)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)),
      series_max_(series_max) {}

expected<std::vector<std::string>> family_base::key_for(std::span<const std::string_view> values,
                                                        std::size_t series_now) const {
  if (values.size() != label_names_.size()) {
    return make_error(errc::invalid_argument, "metric '" + name_ + "' has labels " + join(label_names_) +
                                                  " but " + std::to_string(values.size()) +
                                                  " values were given");
  }
  if (series_now >= series_max_) {
    return make_error(errc::overloaded, "metric '" + name_ + "' has " + std::to_string(series_now) +
                                            " label combinations (limit); a label has unbounded values");
  }
  return std::vector<std::string>(values.begin(), values.end());
}

family_snapshot family_base::empty_snapshot() const {
  family_snapshot out;
  out.name = name_;
  out.help = help_;
  out.type = type_;
  out.label_names = label_names_;
  out.bounds = bounds_;
  return out;
}

template <class Metric>
expected<Metric*> family<Metric>::with(std::span<const std::string_view> values) {
  const std::lock_guard lock(mutex_);
  // Transparent lookup: the common call finds a series without allocating.
  if (const auto existing = series_.find(values); existing != series_.end()) return existing->second.get();
  auto key = key_for(values, series_.size());
  if (!key) return std::unexpected(key.error());
  std::unique_ptr<Metric> metric;
  if constexpr (std::is_same_v<Metric, histogram>) {
    metric = std::make_unique<histogram>(bounds());
  } else {
    metric = std::make_unique<Metric>();
  }
  Metric* out = metric.get();
  series_.emplace(std::move(*key), std::move(metric));
  return out;
}

template <class Metric>
expected<Metric*> family<Metric>::with_or_overflow(std::initializer_list<std::string_view> values) {
  auto r = with(values);
  if (r || r.error().code != errc::overloaded) return r;
  const std::lock_guard lock(mutex_);
  std::vector<std::string> key(label_names().size(), "_overflow");
  auto it = series_.find(key);
  if (it == series_.end()) {
    spdlog::warn("event=metrics_series_overflow family={} limit={} detail=\"further label combinations are counted "
                 "under the _overflow series\"",
                 name(), series_.size());
    std::unique_ptr<Metric> metric;
    if constexpr (std::is_same_v<Metric, histogram>) {
      metric = std::make_unique<histogram>(bounds());
    } else {
      metric = std::make_unique<Metric>();
    }
    it = series_.emplace(std::move(key), std::move(metric)).first;
  }
  ++overflowed_;
  return it->second.get();
}

template <class Metric>
std::uint64_t family<Metric>::overflowed() const {
  const std::lock_guard lock(mutex_);
  return overflowed_;
}

template <class Metric>
family_snapshot family<Metric>::snapshot() const {
  family_snapshot out = empty_snapshot();
  const std::lock_guard lock(mutex_);
  out.series.reserve(series_.size());
  for (const auto& [labels, metric] : series_) {  // std::map: already sorted by label values
    series_snapshot s;
    s.label_values = labels;
    if constexpr (std::is_same_v<Metric, histogram>) {
      auto h = metric->snapshot();
      s.bucket_counts = std::move(h.counts);
      s.sum = h.sum;
    } else {
      s.value = static_cast<double>(metric->value());
    }
    out.series.push_back(std::move(s));
  }
  return out;
}

template class family<counter>;
template class family<gauge>;
template class family<histogram>;

// ---- registry --------------------------------------------------------------------------

registry::registry(std::size_t series_max_per_family) : series_max_(series_max_per_family) {
  EXA_ASSERT(series_max_ > 0);
}

expected<family_base*> registry::add(std::unique_ptr<family_base> candidate) {
  if (!is_valid_name(candidate->name(), true)) {
    return make_error(errc::invalid_argument, "invalid metric name '" + candidate->name() + "'");
  }
  for (const auto& label : candidate->label_names()) {
    const bool reserved = candidate->type() == metric_type::histogram && label == "le";
    if (!is_valid_name(label, false) || reserved) {
      return make_error(errc::invalid_argument,
                        "invalid label name '" + label + "' for metric '" + candidate->name() + "'");
    }
  }
  const std::lock_guard lock(mutex_);
  const auto it = families_.find(candidate->name());
  if (it == families_.end()) {
    family_base* out = candidate.get();
    families_.emplace(candidate->name(), std::move(candidate));
    return out;
  }
  const family_base& existing = *it->second;
  if (existing.type() != candidate->type() || existing.label_names() != candidate->label_names() ||
      existing.bounds() != candidate->bounds()) {
    return make_error(errc::invalid_argument,
                      "metric '" + candidate->name() + "' is already registered as a " +
                          std::string(to_string(existing.type())) + " with labels " +
                          join(existing.label_names()) + " (and its own bounds)");
  }
  return it->second.get();
}

expected<counter_family*> registry::register_counter(std::string name, std::string help,
                                                     std::vector<std::string> label_names) {
  auto added =
      add(std::make_unique<counter_family>(std::move(name), std::move(help), metric_type::counter,
                                           std::move(label_names), std::vector<double>{}, series_max_));
  if (!added) return std::unexpected(added.error());
  return static_cast<counter_family*>(*added);
}

expected<gauge_family*> registry::register_gauge(std::string name, std::string help,
                                                 std::vector<std::string> label_names) {
  auto added =
      add(std::make_unique<gauge_family>(std::move(name), std::move(help), metric_type::gauge,
                                         std::move(label_names), std::vector<double>{}, series_max_));
  if (!added) return std::unexpected(added.error());
  return static_cast<gauge_family*>(*added);
}

expected<histogram_family*> registry::register_histogram(std::string name, std::string help,
                                                         std::vector<std::string> label_names,
                                                         std::vector<double> bounds) {
  const bool increasing =
      std::adjacent_find(bounds.begin(), bounds.end(), std::greater_equal<>()) == bounds.end();
  const bool finite = std::all_of(bounds.begin(), bounds.end(), [](double b) { return std::isfinite(b); });
  if (bounds.empty() || !increasing || !finite) {
    return make_error(errc::invalid_argument, "histogram '" + name +
                                                  "' needs finite, strictly increasing bucket bounds");
  }
  auto added =
      add(std::make_unique<histogram_family>(std::move(name), std::move(help), metric_type::histogram,
                                             std::move(label_names), std::move(bounds), series_max_));
  if (!added) return std::unexpected(added.error());
  return static_cast<histogram_family*>(*added);
}

registry_snapshot registry::snapshot() const {
  registry_snapshot out;
  const std::lock_guard lock(mutex_);
  out.families.reserve(families_.size());
  for (const auto& [name, fam] : families_) out.families.push_back(fam->snapshot());
  return out;
}

// ---- merge -------------------------------------------------------------------------------

namespace {

bool same_shape(const family_snapshot& a, const family_snapshot& b) {
  return a.type == b.type && a.label_names == b.label_names && a.bounds == b.bounds;
}

void add_series(family_snapshot& into, const series_snapshot& from) {
  const auto it = std::lower_bound(into.series.begin(), into.series.end(), from.label_values,
                                   [](const series_snapshot& s, const std::vector<std::string>& labels) {
                                     return s.label_values < labels;
                                   });
  if (it == into.series.end() || it->label_values != from.label_values) {
    into.series.insert(it, from);
    return;
  }
  it->value += from.value;
  it->sum += from.sum;
  EXA_ASSERT(it->bucket_counts.size() == from.bucket_counts.size());
  for (std::size_t i = 0; i < from.bucket_counts.size(); ++i) it->bucket_counts[i] += from.bucket_counts[i];
}

}  // namespace

expected<void> merge_into(registry_snapshot& into, const registry_snapshot& from) {
  const auto by_name = [](const family_snapshot& f, const std::string& name) { return f.name < name; };
  // Check every family first, so a conflict leaves `into` untouched.
  for (const auto& fam : from.families) {
    const auto it = std::lower_bound(into.families.begin(), into.families.end(), fam.name, by_name);
    if (it != into.families.end() && it->name == fam.name && !same_shape(*it, fam)) {
      return make_error(errc::invalid_argument, "cannot merge metric '" + fam.name +
                                                    "': its type, labels or bounds differ between sources");
    }
  }
  for (const auto& fam : from.families) {
    auto it = std::lower_bound(into.families.begin(), into.families.end(), fam.name, by_name);
    if (it == into.families.end() || it->name != fam.name) {
      into.families.insert(it, fam);
      continue;
    }
    for (const auto& s : fam.series) add_series(*it, s);
  }
  return {};
}

}  // namespace exa::metrics
