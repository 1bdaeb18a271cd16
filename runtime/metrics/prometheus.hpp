#pragma once
// Prometheus text exposition format 0.0.4 over registry snapshots: what the
// metrics actor serves on /metrics. Pure functions of plain data, so the
// output of a merged (region or global) snapshot is rendered the same way as
// a node's.

#include <string>
#include <string_view>

#include "metrics/metrics.hpp"

namespace exa::metrics {

/// The Content-Type of a scrape response.
inline constexpr std::string_view prometheus_content_type = "text/plain; version=0.0.4; charset=utf-8";

/// Every family with at least one series, in name order:
///   # HELP name help
///   # TYPE name counter|gauge|histogram
///   name{label="value",...} value
/// Histograms: cumulative name_bucket{...,le="bound"} lines ending with
/// le="+Inf", then name_sum and name_count.
std::string render_prometheus(const registry_snapshot& snapshot);
inline std::string render_prometheus(const registry& r) { return render_prometheus(r.snapshot()); }

/// A label value with backslash, double quote and newline escaped.
std::string escape_label_value(std::string_view value);
/// HELP text with backslash and newline escaped (quotes stay as they are).
std::string escape_help(std::string_view help);
/// Shortest text that reads back as the same double; "+Inf", "-Inf", "NaN".
std::string format_sample_value(double value);

}  // namespace exa::metrics
