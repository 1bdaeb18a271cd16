// Metrics from every process, aggregated node -> rack -> global, as real
// processes: nodes and the controller serve a status port, `exaserve
// aggregate` sums them per rack and over racks, and the global numbers must
// equal the per-process ones. A real Prometheus (Debian's, when installed;
// skipped with 77 otherwise) scrapes the nodes and the global aggregator and
// its query API must see the same sums. Every wait is bounded; every process
// is killed by its pid when the test ends.

#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "http_client.hpp"
#include "metrics/exposition.hpp"
#include "process_cluster.hpp"
#include "processes.hpp"

using namespace exa;
using namespace exa::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

std::uint16_t port_in(const std::string& text, const std::string& before) {
  auto p = number_after(text, before);
  REQUIRE(p);
  return static_cast<std::uint16_t>(*p);
}

metrics::registry_snapshot scrape(std::uint16_t port) {
  auto r = http_request(port, "GET", "/metrics");
  REQUIRE(r.status == 200);
  auto parsed = metrics::parse_prometheus(r.body);
  INFO(r.body);
  REQUIRE(parsed);
  return *parsed;
}

/// Sum of a family's series whose labels include every pair in `where`.
double sum_of(const metrics::registry_snapshot& s, const std::string& family,
              const std::map<std::string, std::string>& where = {}) {
  double total = 0;
  for (const auto& f : s.families) {
    if (f.name != family) continue;
    for (const auto& series : f.series) {
      bool match = true;
      for (const auto& [name, value] : where) {
        const auto it = std::find(f.label_names.begin(), f.label_names.end(), name);
        match = match && it != f.label_names.end() && series.label_values[it - f.label_names.begin()] == value;
      }
      if (match) total += series.value;
    }
  }
  return total;
}

bool has_label(const metrics::registry_snapshot& s, const std::string& family, const std::string& label) {
  for (const auto& f : s.families)
    if (f.name == family) return std::find(f.label_names.begin(), f.label_names.end(), label) != f.label_names.end();
  return false;
}

/// Three nodes in two racks, a gateway, per-rack and global aggregators.
struct observed_cluster {
  process_cluster c{"observability"};
  std::map<unsigned, std::uint16_t> node_status;  // node id -> status port
  std::uint16_t controller_status = 0;
  std::unique_ptr<child_process> rack0, rack1, global;
  std::uint16_t rack0_port = 0, rack1_port = 0, global_port = 0;

  observed_cluster() {
    c.write_config(fast_timings + "[deployment tiny]\nreplicas = 3\n");
    c.start_controller({"--wait-nodes", "3", "--metrics-listen", "127.0.0.1:0"});
    controller_status = port_in(c.controller().wait_for("status port at", 10s), "status port at http://127.0.0.1:");
    for (const auto& [id, rack] : std::map<unsigned, unsigned>{{1, 0}, {2, 0}, {3, 1}}) {
      auto& n = c.start_node(id, {"--rack", std::to_string(rack), "--metrics-listen", "127.0.0.1:0"});
      node_status[id] = port_in(n.wait_for("status port at", 10s), "status port at http://127.0.0.1:");
    }
    c.start_gateway();
    c.wait_replicas([](const auto& r) { return all_ready(r, 3); }, 30s, "3 ready replicas");
    rack0 = start_aggregator("rack-0", {node_status[1], node_status[2]}, {"--add-label", "rack=0"}, rack0_port);
    rack1 = start_aggregator("rack-1", {node_status[3]}, {"--add-label", "rack=1"}, rack1_port);
    global = start_aggregator("global", {rack0_port, rack1_port, c.http_port(), controller_status}, {}, global_port);
  }

  std::unique_ptr<child_process> start_aggregator(const std::string& name, const std::vector<std::uint16_t>& ports,
                                                  std::vector<std::string> extra, std::uint16_t& port) {
    std::string targets;
    for (const auto p : ports) targets += (targets.empty() ? "" : ",") + ("http://127.0.0.1:" + std::to_string(p) + "/metrics");
    std::vector<std::string> argv{exaserve, "aggregate", "--name", name, "--listen", "127.0.0.1:0",
                                  "--targets", targets, "--interval-ms", "200", "--timeout-ms", "150"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = std::make_unique<child_process>(argv, c.dir(), "aggregate-" + name);
    port = port_in(p->wait_for("/metrics, scraping", 10s), "serving http://127.0.0.1:");
    return p;
  }

  metrics::registry_snapshot nodes_summed(const std::string& family, double& total,
                                          const std::map<std::string, std::string>& where = {}) {
    total = 0;
    metrics::registry_snapshot last;
    for (const auto& [id, port] : node_status) {
      last = scrape(port);
      total += sum_of(last, family, where);
    }
    return last;
  }
};

/// Polls `pred` (bounded) until it holds; fails with `what` otherwise.
template <class Pred>
void eventually(Pred pred, std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last;
  while (!pred(last)) {
    if (std::chrono::steady_clock::now() > deadline) FAIL("timed out waiting for " << what << "; last: " << last);
    std::this_thread::sleep_for(100ms);
  }
}

std::string url_encode(const std::string& s) {
  std::string out;
  for (const unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      out += buf;
    }
  }
  return out;
}

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

TEST_CASE("metrics sum node -> rack -> global and equal the per-process numbers", "[process][metrics]") {
  observed_cluster o;
  // Traffic, so the gateway's counters and histograms have something in them.
  for (int i = 0; i < 4; ++i) {
    auto r = http_request(o.c.http_port(), "POST", "/v1/completions",
                          R"({"model":"tiny","prompt":"Hello","max_tokens":5,"temperature":0})");
    REQUIRE(r.status == 200);
  }
  // Status ports: nodes are ready once their replicas are; health is plain.
  CHECK(http_request(o.node_status[1], "GET", "/readyz").status == 200);
  CHECK(http_request(o.node_status[1], "GET", "/healthz").body == "ok\n");
  CHECK(http_request(o.node_status[1], "GET", "/nope").status == 404);
  CHECK(http_request(o.node_status[1], "POST", "/metrics", "{}").status == 405);

  double ready_on_nodes = 0, kv_on_nodes = 0, memory_on_nodes = 0;
  o.nodes_summed("exaserve_node_replicas", ready_on_nodes, {{"state", "ready"}});
  o.nodes_summed("exaserve_device_memory_bytes", memory_on_nodes, {{"kind", "reserved"}});
  CHECK(memory_on_nodes > 0);
  o.nodes_summed("exaserve_kv_capacity_tokens", kv_on_nodes);
  CHECK(ready_on_nodes == 3);
  CHECK(kv_on_nodes > 0);
  const auto gateway_completed =
      sum_of(scrape(o.c.http_port()), "exaserve_requests_total", {{"outcome", "completed"}});
  CHECK(gateway_completed == 4);

  metrics::registry_snapshot g;
  eventually(
      [&](std::string& last) {
        g = scrape(o.global_port);
        const double ready = sum_of(g, "exaserve_node_replicas", {{"state", "ready"}});
        const double kv = sum_of(g, "exaserve_kv_capacity_tokens");
        const double completed = sum_of(g, "exaserve_requests_total", {{"outcome", "completed"}});
        last = "ready " + std::to_string(ready) + "/" + std::to_string(ready_on_nodes) + " kv " + std::to_string(kv) +
               "/" + std::to_string(kv_on_nodes) + " completed " + std::to_string(completed) + "/" +
               std::to_string(gateway_completed);
        const double memory = sum_of(g, "exaserve_device_memory_bytes", {{"kind", "reserved"}});
        return ready == ready_on_nodes && kv == kv_on_nodes && completed == gateway_completed &&
               memory == memory_on_nodes;
      },
      15s, "the global aggregate to equal the per-process sums");
  // Drill-down: racks stay apart at the global level, replicas are summed away.
  CHECK(sum_of(g, "exaserve_kv_capacity_tokens", {{"rack", "0"}}) + sum_of(g, "exaserve_kv_capacity_tokens", {{"rack", "1"}}) ==
        kv_on_nodes);
  CHECK_FALSE(has_label(g, "exaserve_kv_capacity_tokens", "replica"));
  // Histograms merge bucket-wise: the gateway's TTFT count reaches the top.
  CHECK(sum_of(scrape(o.global_port), "exaserve_aggregator_target_up") == 4 + 3);  // global's 4, racks' 2 + 1
  CHECK(http_request(o.global_port, "GET", "/readyz").status == 200);
  {
    double count = 0;
    for (const auto& f : g.families)
      if (f.name == "exaserve_time_to_first_token_ms")
        for (const auto& s : f.series)
          for (const auto b : s.bucket_counts) count += static_cast<double>(b);
    CHECK(count == 4);
  }

  // A node that dies: its rack sees it down, its counters stay in the sum,
  // its gauges leave it.
  o.c.node(3).signal(SIGKILL);
  eventually(
      [&](std::string& last) {
        const auto now = scrape(o.global_port);
        const auto up = sum_of(now, "exaserve_aggregator_target_up",
                               {{"target", "http://127.0.0.1:" + std::to_string(o.node_status[3]) + "/metrics"}});
        last = "node 3 up " + std::to_string(up);
        return up == 0 && sum_of(now, "exaserve_kv_capacity_tokens", {{"rack", "1"}}) == 0;
      },
      15s, "rack 1 to see node 3 down");
  CHECK_THAT(o.rack1->wait_for("event=scrape_target_down", 5s, true), Contains("aggregator=rack-1"));
}

TEST_CASE("a real Prometheus scraping nodes and the global aggregator sees the same sums", "[process][metrics][prometheus]") {
  const char* prometheus = "/usr/bin/prometheus";
  if (::access(prometheus, X_OK) != 0) {
    WARN("skipped: " << prometheus << " is not installed (Debian package prometheus; make test installs it)");
    std::exit(77);
  }
  observed_cluster o;
  const auto port = free_port();
  const std::string dir = o.c.dir() + "/prometheus";
  std::string nodes;
  for (const auto& [id, p] : o.node_status) nodes += (nodes.empty() ? "'" : ", '") + ("127.0.0.1:" + std::to_string(p)) + "'";
  std::ofstream(o.c.dir() + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
         "scrape_configs:\n"
         "  - job_name: nodes\n    static_configs:\n      - targets: [" << nodes << "]\n"
         "  - job_name: global\n    static_configs:\n      - targets: ['127.0.0.1:" << o.global_port << "']\n";
  child_process server({prometheus, "--config.file=" + o.c.dir() + "/prometheus.yml", "--storage.tsdb.path=" + dir,
                        "--web.listen-address=127.0.0.1:" + std::to_string(port), "--log.level=warn"},
                       o.c.dir(), "prometheus");
  auto query = [&](const std::string& promql, std::string& last) -> std::optional<double> {
    auto r = http_request(port, "GET", "/api/v1/query?query=" + url_encode(promql));
    last = promql + " -> " + std::to_string(r.status) + " " + r.body;
    if (r.status != 200) return std::nullopt;
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return std::nullopt;
    const auto& result = j["data"]["result"];
    if (!result.is_array() || result.size() != 1) return std::nullopt;
    return std::stod(result[0]["value"][1].get<std::string>());
  };
  // Prometheus is up and has scraped every target at least once.
  eventually(
      [&](std::string& last) {
        if (!server.running()) FAIL("prometheus exited: " << server.err());
        try {
          const auto up = query("sum(up)", last);
          return up && *up == 4;
        } catch (const std::exception& e) {  // not listening yet
          last = e.what();
          return false;
        }
      },
      60s, "Prometheus to scrape 3 nodes and the global aggregator");
  eventually(
      [&](std::string& last) {
        const auto direct = query("sum(exaserve_kv_capacity_tokens{job=\"nodes\"})", last);
        const auto aggregated = query("sum(exaserve_kv_capacity_tokens{job=\"global\"})", last);
        const auto ready_direct = query("sum(exaserve_node_replicas{job=\"nodes\",state=\"ready\"})", last);
        const auto ready_aggregated = query("sum(exaserve_node_replicas{job=\"global\",state=\"ready\"})", last);
        return direct && aggregated && *direct > 0 && *direct == *aggregated && ready_direct && ready_aggregated &&
               *ready_direct == 3 && *ready_aggregated == 3;
      },
      30s, "the aggregated series in Prometheus to add up to the per-node ones");
  // Drill-down by rack works in PromQL too.
  std::string last;
  const auto racks = query("count(count by (rack) (exaserve_kv_capacity_tokens{job=\"global\"}))", last);
  INFO(last);
  REQUIRE(racks);
  CHECK(*racks == 2);
}
