#pragma once
// Reading the Prometheus text exposition format (0.0.4) back into registry
// snapshots: what an aggregator scrapes from the processes below it, merged
// (aggregate.hpp) and rendered again (prometheus.hpp).
//
// Pure functions of text. Every error names the line and what is wrong with
// it; nothing here throws or aborts on bad input.

#include <cstddef>
#include <string_view>

#include "common/error.hpp"
#include "metrics/metrics.hpp"

namespace exa::metrics {

struct parse_limits {
  std::size_t max_bytes = 64u << 20;  // a larger scrape is refused, not read
  std::size_t max_series = 200000;    // samples (histogram: series) in one scrape
};

/// Parses a scrape. What it accepts:
///   - `# HELP name text` and `# TYPE name counter|gauge|histogram|untyped`
///     (untyped and families without TYPE are read as gauges); other
///     comments and blank lines are skipped;
///   - samples `name{a="x",b="y"} value [timestamp]` (the timestamp is
///     ignored); escaped label values (\\, \", \n);
///   - histograms as name_bucket{...,le="b"} (cumulative), name_sum and
///     name_count, turned back into per-bucket counts.
/// Series of one family with different label sets get the union of the
/// names, a missing label reading as "" (Prometheus' own rule). Errors
/// (invalid_argument, "line N: ..."): a malformed line, a value that is not
/// a number, a family whose histogram bounds differ between series or whose
/// cumulative counts decrease, a sample after its family's TYPE says
/// otherwise, a duplicate series, and a scrape past the limits.
expected<registry_snapshot> parse_prometheus(std::string_view text, const parse_limits& limits = {});

}  // namespace exa::metrics
