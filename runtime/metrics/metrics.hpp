#pragma once
// Counters, gauges and histograms with labels, grouped in families with a
// fixed label set ({model, replica}), plus plain-data snapshots that travel
// in messages and merge (node → region → global).
//
// Threading: updates come from actors on many threads. A metric update is
// one relaxed atomic operation (histograms: two), never a lock; registering
// a family or creating a new label combination takes a mutex, so hot code
// looks its handle up once and keeps the pointer (stable for the registry's
// lifetime). Snapshots read each value atomically; a snapshot taken during
// updates is a consistent-enough view (a histogram's count is derived from
// its buckets, so `_count` always equals the `+Inf` bucket).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::metrics {

enum class metric_type : std::uint8_t { counter, gauge, histogram };

/// "counter", "gauge" or "histogram" (the Prometheus TYPE names).
std::string_view to_string(metric_type type) noexcept;

/// Latency bucket bounds in milliseconds, for TTFT and per-token latency:
/// 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000.
std::span<const double> latency_buckets_ms() noexcept;

/// A monotonically increasing count.
class counter {
 public:
  void inc(std::uint64_t n = 1) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }
  std::uint64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> value_{0};
};

/// A value that goes up and down.
class gauge {
 public:
  void set(double v) noexcept { value_.store(v, std::memory_order_relaxed); }
  void add(double delta) noexcept { value_.fetch_add(delta, std::memory_order_relaxed); }
  void sub(double delta) noexcept { value_.fetch_sub(delta, std::memory_order_relaxed); }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

/// Counts of observations per bucket, for one series.
struct histogram_snapshot {
  std::vector<double> bounds;          // upper bounds (inclusive), strictly increasing
  std::vector<std::uint64_t> counts;   // per bucket, not cumulative; counts.back() is above every bound
  double sum = 0;

  std::uint64_t count() const noexcept;
};

/// Observations in fixed buckets: a value v lands in the first bucket whose
/// bound b satisfies v <= b (Prometheus `le`), or in the +Inf bucket.
class histogram {
 public:
  /// `bounds` must outlive the histogram (its family owns them).
  explicit histogram(std::span<const double> bounds);

  /// Records one value; NaN is ignored (it would poison the sum forever).
  void observe(double value) noexcept;
  histogram_snapshot snapshot() const;

 private:
  std::span<const double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // bounds_.size() + 1
  std::atomic<double> sum_{0};
};

/// Estimated q-quantile (0 <= q <= 1) from bucket counts, interpolating
/// linearly inside the bucket like Prometheus' histogram_quantile; values in
/// the +Inf bucket are reported as the highest bound. NaN when empty or q is
/// out of range.
double quantile(std::span<const double> bounds, std::span<const std::uint64_t> counts, double q);
inline double quantile(const histogram_snapshot& h, double q) { return quantile(h.bounds, h.counts, q); }

// ---- snapshots: plain data, mergeable, rendered by prometheus.hpp ------------

struct series_snapshot {
  std::vector<std::string> label_values;
  double value = 0;                          // counter and gauge
  std::vector<std::uint64_t> bucket_counts;  // histogram: per bucket, +Inf last
  double sum = 0;                            // histogram
};

struct family_snapshot {
  std::string name;
  std::string help;
  metric_type type = metric_type::counter;
  std::vector<std::string> label_names;
  std::vector<double> bounds;            // histogram only
  std::vector<series_snapshot> series;   // sorted by label values
};

struct registry_snapshot {
  std::vector<family_snapshot> families;  // sorted by name
};

/// Adds `from` into `into`: counters, gauges, histogram buckets and sums of
/// the same family and labels are summed; families or series only in `from`
/// are copied. Gauges are summed too, so a gauge that is not additive (a
/// ratio) must carry a label that keeps sources apart (node, replica).
/// invalid_argument, leaving `into` unchanged, when a family's type, labels
/// or bounds differ between the two.
expected<void> merge_into(registry_snapshot& into, const registry_snapshot& from);

// ---- families and the registry -----------------------------------------------------

/// What every family shares: identity, label names, the series bound.
class family_base {
 public:
  virtual ~family_base() = default;

  const std::string& name() const noexcept { return name_; }
  const std::string& help() const noexcept { return help_; }
  metric_type type() const noexcept { return type_; }
  const std::vector<std::string>& label_names() const noexcept { return label_names_; }
  const std::vector<double>& bounds() const noexcept { return bounds_; }

  virtual family_snapshot snapshot() const = 0;

 protected:
  family_base(std::string name, std::string help, metric_type type, std::vector<std::string> label_names,
              std::vector<double> bounds, std::size_t series_max);
  /// invalid_argument for the wrong number of values; overloaded when a new
  /// combination would pass series_max (a label with unbounded values is a bug).
  expected<std::vector<std::string>> key_for(std::span<const std::string_view> values,
                                             std::size_t series_now) const;
  family_snapshot empty_snapshot() const;

  mutable std::mutex mutex_;  // guards series creation and iteration

 private:
  std::string name_;
  std::string help_;
  metric_type type_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;
  std::size_t series_max_;
};

/// Orders label-value lists lexicographically, and lets a list of
/// string_views find a stored list of strings without allocating.
struct label_values_less {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }
};

/// The series of one metric family, one per distinct label-value list.
template <class Metric>
class family final : public family_base {
 public:
  family(std::string name, std::string help, metric_type type, std::vector<std::string> label_names,
         std::vector<double> bounds, std::size_t series_max)
      : family_base(std::move(name), std::move(help), type, std::move(label_names), std::move(bounds),
                    series_max) {}

  /// The series for these label values, created on first use. The pointer is
  /// never null and stays valid as long as the registry.
  expected<Metric*> with(std::initializer_list<std::string_view> values) {
    return with(std::span<const std::string_view>(values.begin(), values.size()));
  }
  expected<Metric*> with(std::span<const std::string_view> values);
  /// The series for these values, or -- when the family is full -- its one
  /// overflow series (every label "_overflow"), so what passes the cap is
  /// still counted, and the totals still add up. invalid_argument stays an
  /// error (a wrong number of values is a bug at the call site).
  expected<Metric*> with_or_overflow(std::initializer_list<std::string_view> values);
  /// Distinct label combinations folded into the overflow series so far.
  std::uint64_t overflowed() const;

  family_snapshot snapshot() const override;

 private:
  std::map<std::vector<std::string>, std::unique_ptr<Metric>, label_values_less> series_;
  std::uint64_t overflowed_ = 0;  // guarded by mutex_
};

using counter_family = family<counter>;
using gauge_family = family<gauge>;
using histogram_family = family<histogram>;

/// All families of one process (or one simulated node). No global instance:
/// whoever owns the node owns its registry.
class registry {
 public:
  /// Label combinations allowed per family (bounds memory and scrape size).
  static constexpr std::size_t default_series_max = 10000;

  explicit registry(std::size_t series_max_per_family = default_series_max);

  /// Registers a family, or returns the existing one when name, type, labels
  /// (and bounds) match. invalid_argument for a bad metric or label name, a
  /// conflicting re-registration, or histogram bounds that are not finite and
  /// strictly increasing.
  expected<counter_family*> register_counter(std::string name, std::string help,
                                             std::vector<std::string> label_names);
  expected<gauge_family*> register_gauge(std::string name, std::string help,
                                         std::vector<std::string> label_names);
  expected<histogram_family*> register_histogram(std::string name, std::string help,
                                                 std::vector<std::string> label_names,
                                                 std::vector<double> bounds);

  registry_snapshot snapshot() const;

 private:
  expected<family_base*> add(std::unique_ptr<family_base> candidate);

  std::size_t series_max_;
  mutable std::mutex mutex_;  // guards families_ (registration, snapshot)
  std::map<std::string, std::unique_ptr<family_base>> families_;
};

}  // namespace exa::metrics
