// exaserve aggregate: one level of the metrics hierarchy. It scrapes the
// status ports (or /metrics) of the processes below it every interval, sums
// their series by the level's rule (metrics/aggregate.hpp) and serves the
// result on its own status port, for the level above or for Prometheus.
//
//   nodes of rack 3 --> exaserve aggregate --name rack-3 --add-label rack=3
//   racks, gateways, controller --> exaserve aggregate --name global
//   Prometheus --> the global aggregator (and, to drill down, a rack's)

#include <spdlog/spdlog.h>

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "actors/cluster_metrics.hpp"
#include "actors/distributed.hpp"
#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "frontdoor.hpp"
#include "metrics/aggregate.hpp"
#include "metrics/prometheus.hpp"
#include "serving.hpp"
#include "status_door.hpp"

namespace exa::app {
namespace {

std::vector<flag_spec> aggregate_flags() {
  return {
      {"listen", true, "HOST:PORT this aggregator serves /metrics, /healthz and /readyz on (default 127.0.0.1:9400)"},
      {"targets", true, "comma-separated URLs to scrape, e.g. http://10.0.0.5:9101/metrics"},
      {"targets-file", true, "a file of URLs to scrape, one per line ('#' starts a comment); with --targets, both"},
      {"targets-dns", true,
       "NAME:PORT[,NAME:PORT]: scrape http://ADDRESS:PORT/metrics for every address NAME resolves to, resolved "
       "again every pass (a Kubernetes headless Service); targets that leave keep their counters in the sums"},
      {"name", true, "this aggregator's name in its own metrics, e.g. rack-3 or global (default aggregator)"},
      {"drop-labels", true,
       "labels summed away at this level, comma-separated (default replica; 'none' keeps every label)"},
      {"add-label", true, "labels naming this level, NAME=VALUE[,NAME=VALUE] (e.g. rack=3); a target's own wins"},
      {"max-gauges", true,
       "gauge families combined by maximum rather than sum, comma-separated (besides *_ratio, *_utilization, "
       "*_temperature_celsius and *_max)"},
      {"interval-ms", true, "time between scrapes (default 5000)"},
      {"timeout-ms", true, "a target's scrape must answer within this (default 2000, at most the interval)"},
      {"series-max", true, "series per family at this level; more fold into its _overflow series (default 10000)"},
      {"help", false, "show this help"},
  };
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t\r");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
  }
  return out;
}

expected<std::vector<std::string>> read_targets(const args& a) {
  std::vector<std::string> targets;
  if (auto t = a.get("targets")) targets = split(*t, ',');
  if (auto path = a.get("targets-file")) {
    std::ifstream in(*path);
    if (!in) return make_error(errc::invalid_argument, "--targets-file '" + *path + "' cannot be read");
    std::string line;
    while (std::getline(in, line)) {
      line = line.substr(0, line.find('#'));
      for (auto& t : split(line, ',')) targets.push_back(std::move(t));
    }
  }
  std::set<std::string> seen;
  for (const auto& t : targets) {
    if (!t.starts_with("http://"))
      return make_error(errc::invalid_argument, "scrape target '" + t + "' is not an http:// URL");
    if (!seen.insert(t).second) return make_error(errc::invalid_argument, "scrape target '" + t + "' is given twice");
  }
  if (targets.empty() && !a.has("targets-dns"))
    return make_error(errc::invalid_argument, "no scrape targets: give --targets, --targets-file or --targets-dns");
  return targets;
}

expected<metrics::aggregation_rule> read_rule(const args& a) {
  metrics::aggregation_rule rule;
  const auto drop = a.get_or("drop-labels", "replica");
  if (drop != "none")
    for (auto& l : split(drop, ',')) rule.drop_labels.insert(std::move(l));
  if (auto add = a.get("add-label")) {
    for (const auto& pair : split(*add, ',')) {
      const auto eq = pair.find('=');
      if (eq == std::string::npos || eq == 0)
        return make_error(errc::invalid_argument, "--add-label '" + pair + "' is not NAME=VALUE");
      rule.add_labels.emplace_back(pair.substr(0, eq), pair.substr(eq + 1));
    }
  }
  if (auto max = a.get("max-gauges"))
    for (auto& g : split(*max, ',')) rule.max_gauges.insert(std::move(g));
  auto series = a.get_int("series-max", 10000, 1, 1000000);
  if (!series) return std::unexpected(series.error());
  rule.series_max = static_cast<std::size_t>(*series);
  return rule;
}

struct dns_target {
  std::string name;
  std::string port;
};

expected<std::vector<dns_target>> read_dns_targets(const args& a) {
  std::vector<dns_target> out;
  auto v = a.get("targets-dns");
  if (!v) return out;
  for (const auto& item : split(*v, ',')) {
    const auto colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == item.size())
      return make_error(errc::invalid_argument, "--targets-dns '" + item + "' is not NAME:PORT");
    out.push_back({item.substr(0, colon), item.substr(colon + 1)});
  }
  return out;
}

// Every address of every name, as scrape URLs. A name that does not resolve
// keeps the addresses it last resolved to (a DNS blip must not make every
// target leave), or none before it ever resolved; logged when that changes.
std::vector<std::string> resolve(const std::vector<dns_target>& names, std::map<std::string, bool>& resolved_before,
                                 std::map<std::string, std::vector<std::string>>& last_good) {
  std::vector<std::string> urls;
  for (const auto& n : names) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(n.name.c_str(), n.port.c_str(), &hints, &res);
    const bool ok = rc == 0;
    if (resolved_before.count(n.name) == 0 || resolved_before[n.name] != ok) {
      if (ok)
        spdlog::info("event=targets_dns_resolved name={}", n.name);
      else
        spdlog::warn("event=targets_dns_failed name={} error=\"{}\"", n.name, gai_strerror(rc));
      resolved_before[n.name] = ok;
    }
    const std::string key = n.name + ":" + n.port;
    if (!ok) {
      for (const auto& u : last_good[key]) urls.push_back(u);
      continue;
    }
    std::set<std::string> seen;
    std::vector<std::string> found;
    for (auto* p = res; p; p = p->ai_next) {
      char host[NI_MAXHOST];
      if (getnameinfo(p->ai_addr, p->ai_addrlen, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0) continue;
      const std::string h = p->ai_family == AF_INET6 ? "[" + std::string(host) + "]" : std::string(host);
      if (seen.insert(h).second) found.push_back("http://" + h + ":" + n.port + "/metrics");
    }
    freeaddrinfo(res);
    last_good[key] = found;
    urls.insert(urls.end(), found.begin(), found.end());
  }
  std::sort(urls.begin(), urls.end());
  return urls;
}

std::int64_t wall_ms() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

int cmd_aggregate(int argc, char** argv) {
  const auto flags = aggregate_flags();
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("aggregate", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve aggregate --targets URL[,URL] [--name NAME] [--listen HOST:PORT]\n%s",
                describe_flags(flags).c_str());
    return 0;
  }
  auto targets = read_targets(*a);
  if (!targets) return fail("aggregate", targets.error());
  auto rule = read_rule(*a);
  if (!rule) return fail("aggregate", rule.error());
  auto listen = actors::parse_host_port(a->get_or("listen", "127.0.0.1:9400"));
  if (!listen) return fail("aggregate", {errc::invalid_argument, "--listen: " + listen.error().message});
  auto interval = a->get_int("interval-ms", 5000, 100, 3600000);
  if (!interval) return fail("aggregate", interval.error());
  auto timeout = a->get_int("timeout-ms", std::min<std::int64_t>(2000, *interval), 10, *interval);
  if (!timeout) return fail("aggregate", timeout.error());
  const std::string name = a->get_or("name", "aggregator");

  // Before any thread starts, so only sigtimedwait sees them.
  sigset_t signals = block_stop_signals();

  auto dns = read_dns_targets(*a);
  if (!dns) return fail("aggregate", dns.error());
  metrics::scrape_aggregator aggregator(name, *targets, *rule);
  std::map<std::string, bool> resolved_before;
  std::map<std::string, std::vector<std::string>> last_good;
  std::mutex mu;
  std::string served;    // guarded by mu: the last aggregate, rendered
  bool scraped = false;  // guarded by mu: one pass done
  status_handlers handlers;
  handlers.metrics = [&] {
    std::lock_guard lock(mu);
    return served;
  };
  handlers.ready = [&]() -> expected<void> {
    std::lock_guard lock(mu);
    if (!scraped) return make_error(errc::unavailable, "no scrape pass has finished yet");
    return {};
  };
  auto door = status_door::start(listen->host, listen->port, handlers);
  if (!door) return fail("aggregate", door.error());
  std::printf("exaserve aggregate %s serving %s/metrics, scraping %zu targets every %lld ms\n", name.c_str(),
              (*door)->url().c_str(), targets->size(), static_cast<long long>(*interval));
  std::fflush(stdout);
  spdlog::info("event=aggregator_started name={} targets={} interval_ms={} timeout_ms={} series_max={}", name,
               targets->size(), *interval, *timeout, rule->series_max);

  std::map<std::string, std::size_t> folded_before;
  std::map<std::string, bool> last_up;  // by URL; absent: not scraped yet (pruned to the current targets)
  for (;;) {
    std::vector<std::string> urls = *targets;
    if (!dns->empty()) {
      for (auto& u : resolve(*dns, resolved_before, last_good)) urls.push_back(std::move(u));
      const auto [added, removed] = aggregator.set_targets(urls);
      if (added || removed)
        spdlog::info("event=targets_changed aggregator={} added={} removed={} targets={}", name, added, removed,
                     aggregator.targets().size());
      urls.clear();
      for (const auto& t : aggregator.targets()) urls.push_back(t.url);
    }
    std::erase_if(last_up, [&](const auto& e) { return std::find(urls.begin(), urls.end(), e.first) == urls.end(); });
    const auto bodies = (*door)->fetch(urls, static_cast<std::uint32_t>(*timeout));
    const auto now = wall_ms();
    for (std::size_t i = 0; i < bodies.size(); ++i) {
      aggregator.on_scrape(i, bodies[i], now);
      const auto& t = aggregator.targets()[i];
      if (const auto it = last_up.find(t.url); it != last_up.end() && it->second == t.up) continue;  // logged on change
      last_up[t.url] = t.up;
      if (t.up)
        spdlog::info("event=scrape_target_up aggregator={} target={} series={}", name, t.url, t.series);
      else
        spdlog::warn("event=scrape_target_down aggregator={} target={} error=\"{}\"", name, t.url, t.last_error);
    }
    metrics::aggregation_report report;
    auto text = metrics::render_prometheus(aggregator.result(&report));
    for (const auto& [family, n] : report.folded_by_family)
      if (folded_before[family] != n)
        spdlog::warn("event=aggregator_series_folded aggregator={} family={} folded={} series_max={} detail=\"series "
                     "past the bound are summed into the family's _overflow series\"",
                     name, family, n, rule->series_max);
    folded_before = report.folded_by_family;
    for (const auto& c : report.conflicts) spdlog::warn("event=aggregator_conflict aggregator={} detail=\"{}\"", name, c);
    {
      std::lock_guard lock(mu);
      served = std::move(text);
      scraped = true;
    }
    // The wait between passes doubles as the wait for a stop signal.
    timespec wait{static_cast<time_t>(*interval / 1000), static_cast<long>(*interval % 1000) * 1000000};
    siginfo_t info{};
    const int sig = sigtimedwait(&signals, &info, &wait);
    if (sig == SIGINT || sig == SIGTERM) {
      spdlog::info("event=shutdown signal={}", sig == SIGINT ? "SIGINT" : "SIGTERM");
      break;
    }
  }
  (*door)->stop();
  spdlog::info("event=stopped role=aggregator name={}", name);
  return 0;
}

}  // namespace exa::app

namespace exa::app {

// exaserve metric-names: every metric family an exaserve process can
// export, "name type" per line, for dashboards, alert rules and the test
// that checks they name only real metrics.
int cmd_metric_names(int argc, char** argv) {
  if (argc > 2 && std::string_view(argv[2]) == "--help") {
    std::printf("usage: exaserve metric-names\nprints every metric family exaserve exports, as NAME TYPE lines\n");
    return 0;
  }
  if (argc > 2) return fail("metric-names", {errc::invalid_argument, std::string("unexpected argument '") + argv[2] + "'"});
  std::map<std::string, std::string> names;
  for (const auto& f : actors::cluster_metrics::create()->registry->snapshot().families)
    names[f.name] = std::string(metrics::to_string(f.type));
  for (const auto& [name, type] : frontdoor_metric_families()) names[name] = type;
  for (const auto& [name, type] : metrics::scrape_aggregator::own_families()) names[name] = type;
  for (const auto& [name, type] : names) std::printf("%s %s\n", name.c_str(), type.c_str());
  return 0;
}

}  // namespace exa::app
