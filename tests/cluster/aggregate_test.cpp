// Scrapes read back (exposition.hpp) and aggregated (aggregate.hpp): what
// the rack and global aggregators compute. Round trips through the renderer,
// errors that name the line, sums that add up, max gauges, dropped and added
// labels, the series bound, and counters that stay monotonic across a
// source's restart.

#include <catch2/catch.hpp>

#include <cmath>

#include "metrics/aggregate.hpp"
#include "metrics/exposition.hpp"
#include "metrics/metrics.hpp"
#include "metrics/prometheus.hpp"

using namespace exa;
using namespace exa::metrics;

namespace {

registry_snapshot node_snapshot(const std::string& replica, std::uint64_t requests, double kv,
                                std::initializer_list<double> ttfts, double util) {
  registry r;
  (*(*r.register_counter("x_requests_total", "Requests.", {"model", "outcome"}))->with({"tiny", "completed"}))
      ->inc(requests);
  (*(*r.register_gauge("x_kv_used_tokens", "KV in use.", {"replica"}))->with({replica}))->set(kv);
  (*(*r.register_gauge("x_device_utilization", "Busy share.", {"replica"}))->with({replica}))->set(util);
  auto* h = *(*r.register_histogram("x_ttft_ms", "TTFT.", {"model"}, {10, 100}))->with({"tiny"});
  for (const double v : ttfts) h->observe(v);
  return r.snapshot();
}

const family_snapshot& fam(const registry_snapshot& s, const std::string& name) {
  for (const auto& f : s.families)
    if (f.name == name) return f;
  FAIL("no family " << name);
  throw;
}

}  // namespace

TEST_CASE("a rendered registry parses back to the same snapshot", "[metrics][aggregate]") {
  const auto original = node_snapshot("r\"1\\\n", 7, 12.5, {1, 50, 500}, 0.25);
  auto parsed = parse_prometheus(render_prometheus(original));
  REQUIRE(parsed);
  REQUIRE(parsed->families.size() == original.families.size());
  for (std::size_t i = 0; i < original.families.size(); ++i) {
    const auto& a = original.families[i];
    const auto& b = parsed->families[i];
    CHECK(a.name == b.name);
    CHECK(a.help == b.help);
    CHECK(a.type == b.type);
    CHECK(a.label_names == b.label_names);
    CHECK(a.bounds == b.bounds);
    REQUIRE(a.series.size() == b.series.size());
    for (std::size_t j = 0; j < a.series.size(); ++j) {
      CHECK(a.series[j].label_values == b.series[j].label_values);
      CHECK(a.series[j].value == b.series[j].value);
      CHECK(a.series[j].bucket_counts == b.series[j].bucket_counts);
      CHECK(a.series[j].sum == b.series[j].sum);
    }
  }
  CHECK(render_prometheus(*parsed) == render_prometheus(original));
}

TEST_CASE("the parser reads what other exporters write", "[metrics][aggregate]") {
  auto s = parse_prometheus(
      "# A comment that is neither HELP nor TYPE\r\n"
      "\n"
      "up 1 1700000000000\n"
      "# TYPE go_info untyped\n"
      "go_info{version=\"go1.21\",} 1\n"
      "# TYPE http_requests_total counter\n"
      "http_requests_total{code=\"200\"} 3\n"
      "http_requests_total{code=\"500\",path=\"/x\"} +1e3\n"
      "temp NaN\n");
  REQUIRE(s);
  const auto& http = fam(*s, "http_requests_total");
  CHECK(http.type == metric_type::counter);
  CHECK(http.label_names == std::vector<std::string>{"code", "path"});
  REQUIRE(http.series.size() == 2);
  CHECK(http.series[0].label_values == std::vector<std::string>{"200", ""});  // missing label reads as ""
  CHECK(http.series[1].value == 1000);
  CHECK(fam(*s, "up").type == metric_type::gauge);
  CHECK(fam(*s, "up").series[0].value == 1);
  CHECK(fam(*s, "go_info").series[0].label_values == std::vector<std::string>{"go1.21"});
  CHECK(std::isnan(fam(*s, "temp").series[0].value));
}

TEST_CASE("malformed scrapes are refused with the line and the reason", "[metrics][aggregate]") {
  struct bad {
    const char* text;
    const char* needle;
  };
  const bad cases[] = {
      {"ok 1\n{x=\"1\"} 2\n", "line 2: expected a metric name"},
      {"m{a=\"1\" 2\n", "line 1: expected ',' or '}' after label 'a'"},
      {"m{a=1} 2\n", "expected '\"' to open the value of label 'a'"},
      {"m{a=\"1} 2\n", "unterminated value of label 'a'"},
      {"m{a=\"\\q\"} 2\n", "bad escape"},
      {"m{a=\"1\",a=\"2\"} 2\n", "label 'a' given twice"},
      {"m abc\n", "line 1: 'abc' is not a number"},
      {"m 1 2 3\n", "unexpected '2 3' after the value"},
      {"m\n", "expected a space before the value"},
      {"m 1\nm 2\n", "line 2: m: a series given twice"},
      {"# TYPE m summary\n", "unknown type 'summary' for m"},
      {"m 1\n# TYPE m counter\n", "TYPE of m comes after its samples"},
      {"# TYPE h histogram\nh 1\n", "histogram h has a sample without _bucket, _sum or _count"},
      {"# TYPE h histogram\nh_bucket 1\n", "h_bucket without an le label"},
      {"# TYPE h histogram\nh_bucket{le=\"x\"} 1\n", "le=\"x\" is not a number"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 1\n", "a series has no le=\"+Inf\" bucket"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 5\nh_bucket{le=\"+Inf\"} 3\n", "cumulative bucket counts decrease"},
      {"# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1.5\n", "is not a whole non-negative number"},
      {"# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 3\n", "_count 3 differs from the +Inf bucket 2"},
      {"# TYPE h histogram\nh_bucket{a=\"1\",le=\"1\"} 1\nh_bucket{a=\"1\",le=\"+Inf\"} 1\n"
       "h_bucket{a=\"2\",le=\"2\"} 1\nh_bucket{a=\"2\",le=\"+Inf\"} 1\n",
       "different bucket bounds"},
      {"# TYPE 9bad counter\n", "'9bad' is not a metric name"},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    auto r = parse_prometheus(c.text);
    REQUIRE_FALSE(r);
    CHECK(r.error().code == errc::invalid_argument);
    CHECK_THAT(r.error().message, Catch::Contains(c.needle));
  }
  parse_limits small;
  small.max_bytes = 8;
  CHECK_THAT(parse_prometheus("m 1\nn 2\nn2 3\n", small).error().message, Catch::Contains("over the limit of 8 bytes"));
  small = {};
  small.max_series = 2;
  CHECK_THAT(parse_prometheus("a 1\nb 2\nc 3\n", small).error().message, Catch::Contains("more than 2 samples"));
}

TEST_CASE("a rack sums its nodes: counters, histograms and gauges, by their meaning", "[metrics][aggregate]") {
  const registry_snapshot nodes[] = {node_snapshot("1", 3, 100, {5, 50}, 0.5),
                                     node_snapshot("2", 4, 30, {500}, 0.875)};
  aggregation_rule rule;
  rule.drop_labels = {"replica"};
  rule.add_labels = {{"rack", "r7"}};
  aggregation_report report;
  const auto rack = aggregate(nodes, rule, &report);
  CHECK(report.series_in == 8);
  CHECK(report.series_out == 4);
  CHECK(report.conflicts.empty());

  const auto& requests = fam(rack, "x_requests_total");
  CHECK(requests.label_names == std::vector<std::string>{"model", "outcome", "rack"});
  REQUIRE(requests.series.size() == 1);
  CHECK(requests.series[0].label_values == std::vector<std::string>{"tiny", "completed", "r7"});
  CHECK(requests.series[0].value == 7);

  const auto& kv = fam(rack, "x_kv_used_tokens");
  CHECK(kv.label_names == std::vector<std::string>{"rack"});
  CHECK(kv.series.at(0).value == 130);  // an amount: summed
  CHECK(fam(rack, "x_device_utilization").series.at(0).value == 0.875);  // a level: the maximum

  const auto& ttft = fam(rack, "x_ttft_ms");
  REQUIRE(ttft.series.size() == 1);
  CHECK(ttft.series[0].bucket_counts == std::vector<std::uint64_t>{1, 1, 1});
  CHECK(ttft.series[0].sum == 555);
  CHECK(quantile(ttft.bounds, ttft.series[0].bucket_counts, 0.5) == 55);

  // The global level over two racks: the sum of sums, the rack label kept
  // for drill-down or dropped for totals.
  aggregation_rule other = rule;
  other.add_labels = {{"rack", "r8"}};
  const registry_snapshot racks[] = {rack, aggregate(nodes, other)};
  const auto by_rack = aggregate(racks, aggregation_rule{});
  CHECK(fam(by_rack, "x_requests_total").series.size() == 2);
  aggregation_rule totals;
  totals.drop_labels = {"rack"};
  const auto global = aggregate(racks, totals);
  CHECK(fam(global, "x_requests_total").series.at(0).value == 14);
  CHECK(fam(global, "x_ttft_ms").series.at(0).bucket_counts == std::vector<std::uint64_t>{2, 2, 2});
  // A source's own label wins over the level's added one.
  aggregation_rule relabel;
  relabel.add_labels = {{"rack", "global"}};
  CHECK(fam(aggregate(racks, relabel), "x_requests_total").series.size() == 2);
}

TEST_CASE("a family that disagrees between sources is left out of the one that disagrees", "[metrics][aggregate]") {
  auto a = parse_prometheus("# TYPE m counter\nm 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 1\n");
  auto b = parse_prometheus("# TYPE m gauge\nm 5\n# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"+Inf\"} 1\n");
  auto c = parse_prometheus("# TYPE m counter\nm 2\n");
  REQUIRE((a && b && c));
  const registry_snapshot sources[] = {*a, *b, *c};
  aggregation_report report;
  const auto out = aggregate(sources, {}, &report);
  CHECK(fam(out, "m").series.at(0).value == 3);
  CHECK(fam(out, "h").series.at(0).bucket_counts == std::vector<std::uint64_t>{1, 0});
  REQUIRE(report.conflicts.size() == 2);
  CHECK_THAT(report.conflicts[0], Catch::Contains("h: histogram bounds differ (source 1)"));
  CHECK_THAT(report.conflicts[1], Catch::Contains("m: type gauge here, counter before (source 1)"));
}

TEST_CASE("past the series bound, series fold into _overflow and the totals still add up", "[metrics][aggregate]") {
  registry r;
  auto* f = *r.register_counter("m_total", "M.", {"replica"});
  for (int i = 0; i < 10; ++i) (*f->with({std::to_string(i)}))->inc(static_cast<std::uint64_t>(i + 1));
  const registry_snapshot sources[] = {r.snapshot()};
  aggregation_rule rule;
  rule.series_max = 4;
  aggregation_report report;
  const auto out = aggregate(sources, rule, &report);
  const auto& m = fam(out, "m_total");
  REQUIRE(m.series.size() == 4);
  double total = 0;
  for (const auto& s : m.series) total += s.value;
  CHECK(total == 55);
  CHECK(m.series.back().label_values == std::vector<std::string>{"_overflow"});
  CHECK(m.series.back().value == 55 - 1 - 2 - 3);  // replicas "0", "1", "2" stay
  CHECK(report.folded == 7);
  CHECK(report.folded_by_family.at("m_total") == 7);
  CHECK(report.series_out == 4);
}

TEST_CASE("counters stay monotonic when a source restarts or loses a series", "[metrics][aggregate]") {
  counter_continuity c;
  auto scrape = [](const char* text) {
    auto s = parse_prometheus(text);
    REQUIRE(s);
    return *s;
  };
  const char* hist = "# TYPE h histogram\nh_bucket{le=\"1\"} %d\nh_bucket{le=\"+Inf\"} %d\nh_sum %d\n";
  auto with_hist = [&](const std::string& head, int b, int inf, int sum) {
    char buf[256];
    std::snprintf(buf, sizeof buf, hist, b, inf, sum);
    return scrape((head + buf).c_str());
  };
  auto value = [](const registry_snapshot& s, const std::string& name, std::size_t i = 0) {
    return fam(s, name).series.at(i).value;
  };
  auto out = c.next(with_hist("# TYPE m counter\nm{k=\"a\"} 10\nm{k=\"b\"} 4\ng 7\n", 2, 3, 9));
  CHECK(value(out, "m") == 10);
  // The process restarted: its counters start again from zero.
  out = c.next(with_hist("# TYPE m counter\nm{k=\"a\"} 2\nm{k=\"b\"} 5\ng 1\n", 0, 1, 2));
  CHECK(value(out, "m", 0) == 12);
  CHECK(value(out, "m", 1) == 5);
  CHECK(value(out, "g") == 1);  // gauges are what they are
  CHECK(fam(out, "h").series.at(0).bucket_counts == std::vector<std::uint64_t>{2, 2});
  CHECK(fam(out, "h").series.at(0).sum == 11);
  // Series b vanished: it keeps its last value; when it comes back it adds on.
  out = c.next(with_hist("# TYPE m counter\nm{k=\"a\"} 3\n", 1, 2, 3));
  REQUIRE(fam(out, "m").series.size() == 2);
  CHECK(value(out, "m", 1) == 5);
  out = c.next(with_hist("# TYPE m counter\nm{k=\"a\"} 3\nm{k=\"b\"} 1\n", 1, 2, 3));
  CHECK(value(out, "m", 1) == 6);
  // A source that stopped answering still contributes its counters, not its gauges.
  c.next(with_hist("# TYPE m counter\nm{k=\"a\"} 3\nm{k=\"b\"} 1\ng 4\n", 1, 2, 3));
  const auto frozen = c.counters_only();
  for (const auto& f : frozen.families) CHECK(f.type != metric_type::gauge);
  CHECK(value(frozen, "m", 0) == 13);
  CHECK(value(frozen, "m", 1) == 6);
}

TEST_CASE("an aggregator tracks its targets and keeps a lost one's counters", "[metrics][aggregate]") {
  aggregation_rule rule;
  rule.drop_labels = {"replica"};
  rule.add_labels = {{"rack", "0"}};
  scrape_aggregator agg("rack-0", {"http://a/metrics", "http://b/metrics", "http://c/metrics"}, rule);
  agg.on_scrape(0, std::string("# TYPE m_total counter\nm_total{replica=\"1\"} 5\nkv{replica=\"1\"} 10\n"), 1000);
  agg.on_scrape(1, std::string("# TYPE m_total counter\nm_total{replica=\"2\"} 7\nkv{replica=\"2\"} 20\n"), 1000);
  agg.on_scrape(2, std::string("this is not the text format\n"), 1000);
  auto out = agg.result();
  CHECK(fam(out, "m_total").series.at(0).value == 12);
  CHECK(fam(out, "m_total").series.at(0).label_values == std::vector<std::string>{"0"});
  CHECK(fam(out, "kv").series.at(0).value == 30);
  const auto& up = fam(out, "exaserve_aggregator_target_up");
  REQUIRE(up.series.size() == 3);
  CHECK(up.series[0].value == 1);
  CHECK(up.series[2].value == 0);
  CHECK_THAT(agg.targets()[2].last_error, Catch::Contains("line 1"));
  CHECK(fam(out, "exaserve_aggregator_scrape_errors_total").series.at(2).value == 1);

  // b stops answering: its counter stays in the sum, its gauge leaves.
  agg.on_scrape(0, std::string("# TYPE m_total counter\nm_total{replica=\"1\"} 6\nkv{replica=\"1\"} 11\n"), 2000);
  agg.on_scrape(1, expected<std::string>(make_error(errc::unavailable, "connection refused")), 2000);
  out = agg.result();
  CHECK(fam(out, "m_total").series.at(0).value == 13);
  CHECK(fam(out, "kv").series.at(0).value == 11);
  CHECK(fam(out, "exaserve_aggregator_target_up").series.at(1).value == 0);
  CHECK(agg.targets()[1].last_error == "connection refused");
  CHECK(agg.targets()[0].last_success_ms == 2000);

  // The rendered aggregate parses back, and a global aggregator over it
  // merges the rack's own families with its own.
  auto text = render_prometheus(out);
  scrape_aggregator global("global", {"http://rack0/metrics"}, aggregation_rule{});
  global.on_scrape(0, text, 3000);
  const auto g = global.result();
  CHECK(fam(g, "m_total").series.at(0).value == 13);
  CHECK(fam(g, "exaserve_aggregator_target_up").series.size() == 4);  // three from the rack, one of its own
}

TEST_CASE("targets found by DNS come and go without the sums going backwards", "[metrics][aggregate]") {
  scrape_aggregator agg("dns", {}, aggregation_rule{});
  CHECK(agg.set_targets({"http://a/metrics", "http://b/metrics"}) == std::pair<std::size_t, std::size_t>{2, 0});
  agg.on_scrape(0, std::string("# TYPE m_total counter\nm_total{node=\"a\"} 5\ng{node=\"a\"} 1\n"), 1);
  agg.on_scrape(1, std::string("# TYPE m_total counter\nm_total{node=\"b\"} 7\ng{node=\"b\"} 1\n"), 1);
  CHECK(fam(agg.result(), "m_total").series.size() == 2);
  // b leaves DNS: its counter stays (frozen), its gauge goes.
  CHECK(agg.set_targets({"http://a/metrics"}) == std::pair<std::size_t, std::size_t>{0, 1});
  REQUIRE(agg.targets().size() == 1);
  auto out = agg.result();
  CHECK(fam(out, "m_total").series.at(1).value == 7);
  CHECK(fam(out, "g").series.size() == 1);
  // b comes back, its process still counting: no double count.
  CHECK(agg.set_targets({"http://b/metrics", "http://a/metrics"}) == std::pair<std::size_t, std::size_t>{1, 0});
  CHECK(agg.targets()[0].url == "http://b/metrics");
  agg.on_scrape(0, std::string("# TYPE m_total counter\nm_total{node=\"b\"} 9\n"), 2);
  out = agg.result();
  CHECK(fam(out, "m_total").series.at(1).value == 9);
  CHECK(agg.set_targets({"http://a/metrics", "http://a/metrics"}).second == 1);  // twice is once
  CHECK(agg.targets().size() == 1);
}

TEST_CASE("an aggregator above another takes its counters as they are", "[metrics][aggregate]") {
  // A rack aggregator's sum may go down a little (a departed target
  // forgotten): that is not a restart, and carrying the last value would
  // count what remains twice.
  scrape_aggregator global("global", {"http://rack/metrics"}, aggregation_rule{});
  const char* head = "# TYPE exaserve_aggregator_target_up gauge\nexaserve_aggregator_target_up{target=\"x\"} 1\n"
                     "# TYPE m_total counter\n";
  global.on_scrape(0, std::string(head) + "m_total 100\n", 1);
  global.on_scrape(0, std::string(head) + "m_total 90\n", 2);
  CHECK(fam(global.result(), "m_total").series.at(0).value == 90);
  CHECK(global.targets()[0].aggregator);
  // A node's restart is carried, as before.
  scrape_aggregator rack("rack", {"http://node/metrics"}, aggregation_rule{});
  rack.on_scrape(0, std::string("# TYPE m_total counter\nm_total 100\n"), 1);
  rack.on_scrape(0, std::string("# TYPE m_total counter\nm_total 5\n"), 2);
  CHECK(fam(rack.result(), "m_total").series.at(0).value == 105);
}

TEST_CASE("an empty label is no label, and the overflow series keeps the level's labels", "[metrics][aggregate]") {
  auto s = parse_prometheus("m{a=\"x\"} 1\nm{a=\"x\",b=\"\"} 2\n");
  REQUIRE_FALSE(s);  // the same series twice
  CHECK_THAT(s.error().message, Catch::Contains("a series given twice"));
  registry r;
  auto* f = *r.register_counter("n_total", "N.", {"replica"});
  for (int i = 0; i < 5; ++i) (*f->with({std::to_string(i)}))->inc();
  const registry_snapshot sources[] = {r.snapshot()};
  aggregation_rule rule;
  rule.series_max = 2;
  rule.add_labels = {{"rack", "3"}};
  const auto out = aggregate(sources, rule);
  const auto& n = fam(out, "n_total");
  REQUIRE(n.series.size() == 2);
  CHECK(n.label_names == std::vector<std::string>{"replica", "rack"});
  CHECK(n.series.back().label_values == std::vector<std::string>{"_overflow", "3"});
}
