// Metrics: exact Prometheus text for a small registry, exact totals under
// concurrent updates, inclusive bucket bounds, quantiles from buckets,
// merging node snapshots, and registration mistakes reported as errors.

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "metrics/metrics.hpp"
#include "metrics/prometheus.hpp"

using namespace exa;
using namespace exa::metrics;

TEST_CASE("exposition text is exact for a small registry", "[metrics]") {
  registry r;
  auto* requests = *r.register_counter("exa_requests_total", "Requests received.", {"model", "replica"});
  (*requests->with({"llama", "1"}))->inc(3);
  (*requests->with({"llama", "0"}))->inc();
  auto* depth = *r.register_gauge("exa_queue_depth", "Queued requests.", {});
  (*depth->with({}))->set(2.5);
  auto* ttft = *r.register_histogram("exa_ttft_ms", "Time to first token\\in ms.\nPer model.", {"model"},
                                     {1, 10, 100});
  auto* series = *ttft->with({"a\"b\\c\nd"});
  for (const double v : {0.5, 1.0, 10.0, 50.0, 1000.0}) series->observe(v);
  REQUIRE(r.register_counter("exa_unused_total", "Nothing yet.", {}));  // no series: not exposed

  const std::string expected =
      "# HELP exa_queue_depth Queued requests.\n"
      "# TYPE exa_queue_depth gauge\n"
      "exa_queue_depth 2.5\n"
      "# HELP exa_requests_total Requests received.\n"
      "# TYPE exa_requests_total counter\n"
      "exa_requests_total{model=\"llama\",replica=\"0\"} 1\n"
      "exa_requests_total{model=\"llama\",replica=\"1\"} 3\n"
      "# HELP exa_ttft_ms Time to first token\\\\in ms.\\nPer model.\n"
      "# TYPE exa_ttft_ms histogram\n"
      "exa_ttft_ms_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"1\"} 2\n"
      "exa_ttft_ms_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"10\"} 3\n"
      "exa_ttft_ms_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"100\"} 4\n"
      "exa_ttft_ms_bucket{model=\"a\\\"b\\\\c\\nd\",le=\"+Inf\"} 5\n"
      "exa_ttft_ms_sum{model=\"a\\\"b\\\\c\\nd\"} 1061.5\n"
      "exa_ttft_ms_count{model=\"a\\\"b\\\\c\\nd\"} 5\n";
  CHECK(render_prometheus(r) == expected);
  CHECK(prometheus_content_type == "text/plain; version=0.0.4; charset=utf-8");
}

TEST_CASE("sample values and escapes follow the text format", "[metrics]") {
  CHECK(format_sample_value(3) == "3");
  CHECK(format_sample_value(0.1) == "0.1");
  CHECK(format_sample_value(-2.5) == "-2.5");
  CHECK(format_sample_value(10000) == "10000");
  CHECK(format_sample_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(format_sample_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(format_sample_value(std::nan("")) == "NaN");
  CHECK(escape_label_value("plain") == "plain");
  CHECK(escape_label_value("q\"b\\n\n") == "q\\\"b\\\\n\\n");
  CHECK(escape_help("say \"hi\"\\\n") == "say \"hi\"\\\\\\n");
}

TEST_CASE("a value equal to a bound lands in that bound's bucket", "[metrics]") {
  const auto bounds = latency_buckets_ms();
  REQUIRE(bounds.size() == 13);
  CHECK(bounds.front() == 1);
  CHECK(bounds.back() == 10000);
  std::vector<double> owned(bounds.begin(), bounds.end());
  histogram h(owned);
  for (const double b : bounds) h.observe(b);  // one per bucket
  auto snap = h.snapshot();
  REQUIRE(snap.counts.size() == 14);
  for (std::size_t i = 0; i < 13; ++i) CHECK(snap.counts[i] == 1);
  CHECK(snap.counts[13] == 0);

  histogram edges(owned);
  edges.observe(std::nextafter(1.0, 2.0));      // just above 1 → le="2"
  edges.observe(-5);                            // below every bound → le="1"
  edges.observe(0);
  edges.observe(std::nextafter(10000.0, 1e9));  // just above the last bound → +Inf
  edges.observe(std::numeric_limits<double>::infinity());
  edges.observe(std::nan(""));                  // ignored
  snap = edges.snapshot();
  CHECK(snap.counts[0] == 2);
  CHECK(snap.counts[1] == 1);
  CHECK(snap.counts[13] == 2);
  CHECK(snap.count() == 5);
}

TEST_CASE("concurrent updates add up exactly", "[metrics]") {
  registry r;
  auto* tokens = *r.register_counter("exa_tokens_total", "Tokens.", {"model"});
  auto* inflight = *r.register_gauge("exa_in_flight", "In flight.", {"model"});
  auto* latency =
      *r.register_histogram("exa_token_latency_ms", "Per-token latency.", {"model"},
                            std::vector<double>(latency_buckets_ms().begin(), latency_buckets_ms().end()));
  constexpr int threads = 8;
  constexpr int per_thread = 50000;
  std::vector<counter*> seen(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Every thread creates/looks up the same series concurrently.
      counter* c = *tokens->with({"llama"});
      gauge* g = *inflight->with({"llama"});
      histogram* h = *latency->with({"llama"});
      seen[t] = c;
      for (int i = 0; i < per_thread; ++i) {
        c->inc(2);
        g->add(1);
        h->observe(i % 2 == 0 ? 5.0 : 20000.0);
      }
    });
  }
  for (auto& w : workers) w.join();
  for (const auto* c : seen) CHECK(c == seen[0]);
  CHECK(seen[0]->value() == 2ull * threads * per_thread);
  CHECK((*inflight->with({"llama"}))->value() == double{threads} * per_thread);
  const auto snap = (*latency->with({"llama"}))->snapshot();
  CHECK(snap.count() == std::uint64_t{threads} * per_thread);
  CHECK(snap.counts[2] == std::uint64_t{threads} * per_thread / 2);   // le="5"
  CHECK(snap.counts[13] == std::uint64_t{threads} * per_thread / 2);  // +Inf
  CHECK(snap.sum == (5.0 + 20000.0) * threads * per_thread / 2);
}

TEST_CASE("quantiles interpolate inside buckets", "[metrics]") {
  const std::vector<double> bounds = {1, 2, 5, 10};
  CHECK(quantile(bounds, std::vector<std::uint64_t>{10, 10, 0, 0, 0}, 0.5) == Approx(1.0));
  CHECK(quantile(bounds, std::vector<std::uint64_t>{10, 10, 0, 0, 0}, 0.75) == Approx(1.5));
  CHECK(quantile(bounds, std::vector<std::uint64_t>{10, 10, 0, 0, 0}, 1.0) == Approx(2.0));
  CHECK(quantile(bounds, std::vector<std::uint64_t>{0, 0, 4, 0, 0}, 0.0) == Approx(2.0));
  CHECK(quantile(bounds, std::vector<std::uint64_t>{0, 0, 4, 0, 0}, 0.5) == Approx(3.5));
  CHECK(quantile(bounds, std::vector<std::uint64_t>{1, 0, 0, 0, 9}, 0.99) == 10);  // +Inf: highest bound
  CHECK(std::isnan(quantile(bounds, std::vector<std::uint64_t>{0, 0, 0, 0, 0}, 0.5)));
  CHECK(std::isnan(quantile(bounds, std::vector<std::uint64_t>{1, 0, 0, 0, 0}, 1.5)));
  std::vector<double> owned(latency_buckets_ms().begin(), latency_buckets_ms().end());
  histogram h(owned);
  for (int i = 0; i < 90; ++i) h.observe(15);   // (10, 20]
  for (int i = 0; i < 10; ++i) h.observe(700);  // (500, 1000]
  CHECK(quantile(h.snapshot(), 0.5) == Approx(10 + 10 * 50.0 / 90));
  CHECK(quantile(h.snapshot(), 0.95) == Approx(500 + 500 * 0.5));
}

TEST_CASE("node snapshots merge into region and global totals", "[metrics]") {
  const auto node = [](std::uint64_t requests, const char* replica, double latency) {
    registry r;
    (*(*r.register_counter("exa_requests_total", "Requests.", {"model"}))->with({"llama"}))->inc(requests);
    (*(*r.register_counter("exa_replica_requests_total", "Per replica.", {"replica"}))->with({replica}))
        ->inc(requests);
    (*(*r.register_histogram("exa_ttft_ms", "TTFT.", {}, {10, 100}))->with({}))->observe(latency);
    return r.snapshot();
  };
  registry_snapshot region;
  REQUIRE(merge_into(region, node(3, "r1", 5)));
  REQUIRE(merge_into(region, node(4, "r2", 50)));
  registry_snapshot global;
  REQUIRE(merge_into(global, region));
  REQUIRE(merge_into(global, node(10, "r3", 500)));
  const std::string text = render_prometheus(global);
  CHECK(text.find("exa_requests_total{model=\"llama\"} 17\n") != std::string::npos);
  CHECK(text.find("exa_replica_requests_total{replica=\"r1\"} 3\n"
                  "exa_replica_requests_total{replica=\"r2\"} 4\n"
                  "exa_replica_requests_total{replica=\"r3\"} 10\n") != std::string::npos);
  CHECK(text.find("exa_ttft_ms_bucket{le=\"10\"} 1\n"
                  "exa_ttft_ms_bucket{le=\"100\"} 2\n"
                  "exa_ttft_ms_bucket{le=\"+Inf\"} 3\n"
                  "exa_ttft_ms_sum 555\n"
                  "exa_ttft_ms_count 3\n") != std::string::npos);

  // A family whose shape differs refuses to merge and changes nothing.
  registry odd;
  (*(*odd.register_gauge("exa_requests_total", "Wrong type.", {"model"}))->with({"llama"}))->set(1);
  const auto before = render_prometheus(global);
  const auto conflict = merge_into(global, odd.snapshot());
  REQUIRE_FALSE(conflict);
  CHECK(conflict.error().code == errc::invalid_argument);
  CHECK(render_prometheus(global) == before);
}

TEST_CASE("registration mistakes are errors", "[metrics]") {
  registry r(2);
  auto* a = *r.register_counter("exa_x_total", "X.", {"model"});
  CHECK(*r.register_counter("exa_x_total", "Other help is fine.", {"model"}) == a);
  CHECK(r.register_counter("exa_x_total", "X.", {"replica"}).error().code == errc::invalid_argument);
  CHECK(r.register_gauge("exa_x_total", "X.", {"model"}).error().code == errc::invalid_argument);
  CHECK_FALSE(r.register_counter("9starts_with_digit", "", {}));
  CHECK_FALSE(r.register_counter("has-dash", "", {}));
  CHECK(r.register_counter("ok:colon_name", "", {}));
  CHECK_FALSE(r.register_counter("exa_y_total", "", {"__reserved"}));
  CHECK_FALSE(r.register_counter("exa_z_total", "", {"bad:label"}));
  CHECK_FALSE(r.register_histogram("exa_h", "", {"le"}, {1, 2}));
  CHECK_FALSE(r.register_histogram("exa_h", "", {}, {2, 1}));
  CHECK_FALSE(r.register_histogram("exa_h", "", {}, {}));
  CHECK_FALSE(r.register_histogram("exa_h", "", {}, {1, std::numeric_limits<double>::infinity()}));
  auto* h = *r.register_histogram("exa_h", "", {}, {1, 2});
  CHECK(r.register_histogram("exa_h", "", {}, {1, 3}).error().code == errc::invalid_argument);
  CHECK(*r.register_histogram("exa_h", "", {}, {1, 2}) == h);

  CHECK(a->with({"m", "extra"}).error().code == errc::invalid_argument);
  REQUIRE(a->with({"m1"}));
  REQUIRE(a->with({"m2"}));
  CHECK(a->with({"m1"}));  // existing series are always found
  const auto third = a->with({"m3"});
  REQUIRE_FALSE(third);
  CHECK(third.error().code == errc::overloaded);
}

TEST_CASE("past its series cap a family counts under one _overflow series instead of failing", "[metrics]") {
  metrics::registry r(2);
  auto* f = *r.register_counter("exa_requests_total", "", {"model"});
  auto* m1 = *f->with_or_overflow({"m1"});
  auto* m2 = *f->with_or_overflow({"m2"});
  auto* m3 = *f->with_or_overflow({"m3"});
  auto* m4 = *f->with_or_overflow({"m4"});
  CHECK(m1 != m2);
  CHECK(m3 == m4);  // both folded into the overflow series
  CHECK(m3 != m1);
  CHECK(*f->with_or_overflow({"m1"}) == m1);  // existing series are still found
  m1->inc();
  m3->inc(2);
  m4->inc(3);
  CHECK(f->overflowed() == 2);
  const auto snap = f->snapshot();
  REQUIRE(snap.series.size() == 3);  // m1, m2 and _overflow
  double total = 0, overflow = 0;
  for (const auto& s : snap.series) {
    total += s.value;
    if (s.label_values == std::vector<std::string>{"_overflow"}) overflow = s.value;
  }
  CHECK(total == 6);
  CHECK(overflow == 5);
  CHECK(f->with_or_overflow({"a", "b"}).error().code == errc::invalid_argument);
}
