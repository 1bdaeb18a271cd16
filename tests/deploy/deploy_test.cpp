// The deployment files against the binaries they run: every flag a
// Kubernetes manifest passes exists in `exaserve <role> --help`, every port a
// process is told to serve on is a containerPort, every probe asks a port
// that serves /healthz and /readyz; every metric the alert rules and the
// Grafana dashboard name is one `exaserve metric-names` lists; and the
// dashboard's queries are valid PromQL (promtool, when installed).

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "run_process.hpp"

using namespace exa::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string source_dir = EXA_SOURCE_DIR;
const std::string exaserve = std::string(EXA_BIN_DIR) + "/exaserve";

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::set<std::string> help_flags(const std::string& role) {
  auto r = run_process({exaserve, role, "--help"}, 20s);
  REQUIRE(r.exit_code == 0);
  std::set<std::string> out;
  const std::regex flag(R"(--([a-z][a-z0-9-]*))");
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), flag), end; it != end; ++it) out.insert((*it)[1]);
  REQUIRE_FALSE(out.empty());
  return out;
}

struct invocation {
  std::string file;
  std::string role;
  std::map<std::string, std::string> flags;  // name -> value ("" for switches)
};

std::string unquote(std::string v) {
  while (!v.empty() && (v.back() == '\\' || v.back() == ' ')) v.pop_back();
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
  return v;
}

// Every exaserve invocation in a manifest: `exaserve ROLE` in a shell
// script, or command ["exaserve"] with ROLE first in args; its flags run to
// the next YAML key.
std::vector<invocation> invocations(const std::string& file) {
  std::ifstream in(file);
  std::stringstream ss;
  ss << in.rdbuf();
  const auto lines = lines_of(ss.str());
  const std::regex script(R"(exaserve (controller|node|gateway|aggregate)\b)");
  const std::regex list_role(R"(^\s*- (controller|node|gateway|aggregate)\s*$)");
  const std::regex yaml_key(R"(^\s*-?\s*[A-Za-z][A-Za-z0-9]*:(\s|$))");
  const std::regex flag(R"(--([a-z][a-z0-9-]*)(?:[= ]("[^"]*"|[^\s\\]+))?)");
  std::vector<invocation> out;
  bool after_command = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    std::string role;
    if (lines[i].find("command: [\"exaserve\"]") != std::string::npos) {
      after_command = true;
      continue;
    }
    if (std::regex_search(lines[i], m, script)) role = m[1];
    if (after_command && std::regex_search(lines[i], m, list_role)) role = m[1];
    if (role.empty()) continue;
    after_command = false;
    invocation inv{file, role, {}};
    for (std::size_t j = i; j < lines.size(); ++j) {
      if (j > i && std::regex_search(lines[j], yaml_key)) break;
      const std::string& l = lines[j];
      for (std::sregex_iterator it(l.begin(), l.end(), flag), end; it != end; ++it) {
        const std::string value = (*it)[2].matched ? unquote((*it)[2]) : "";
        inv.flags[(*it)[1]] = value.rfind("--", 0) == 0 ? "" : value;
      }
    }
    out.push_back(std::move(inv));
  }
  return out;
}

std::vector<std::string> manifests() {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(source_dir + "/deploy/k8s"))
    if (e.path().extension() == ".yaml") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<unsigned> numbers_after(const std::string& text, const std::string& key) {
  std::set<unsigned> out;
  const std::regex re(key + R"(:\s*(\d+))");
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) out.insert(std::stoul((*it)[1]));
  return out;
}

unsigned port_of(const std::string& value) {
  const auto colon = value.rfind(':');
  return static_cast<unsigned>(std::stoul(colon == std::string::npos ? value : value.substr(colon + 1)));
}

std::map<std::string, std::string> metric_names() {
  auto r = run_process({exaserve, "metric-names"}, 20s);
  REQUIRE(r.exit_code == 0);
  std::map<std::string, std::string> out;
  for (const auto& l : lines_of(r.out)) out[l.substr(0, l.find(' '))] = l.substr(l.find(' ') + 1);
  REQUIRE(out.size() > 10);
  return out;
}

// A metric name as written in a query: a family, or a histogram's
// _bucket/_sum/_count series.
bool exported(const std::map<std::string, std::string>& names, const std::string& n) {
  if (names.count(n)) return true;
  for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
    if (n.size() > suffix.size() && n.ends_with(suffix)) {
      const auto it = names.find(n.substr(0, n.size() - suffix.size()));
      if (it != names.end() && it->second == "histogram") return true;
    }
  }
  return false;
}

std::vector<std::string> dashboard_queries(const nlohmann::json& dash) {
  std::vector<std::string> out;
  for (const auto& p : dash["panels"])
    if (p.contains("targets"))
      for (const auto& t : p["targets"]) out.push_back(t.value("expr", ""));
  for (const auto& v : dash["templating"]["list"])
    if (v.contains("definition")) out.push_back(v["definition"]);
  return out;
}

}  // namespace

TEST_CASE("every flag the Kubernetes manifests pass exists in the binary", "[deploy]") {
  std::map<std::string, std::set<std::string>> known;
  std::set<std::string> roles_seen;
  for (const auto& file : manifests()) {
    for (const auto& inv : invocations(file)) {
      roles_seen.insert(inv.role);
      if (!known.count(inv.role)) known[inv.role] = help_flags(inv.role);
      for (const auto& [name, value] : inv.flags) {
        INFO(file << ": exaserve " << inv.role << " --" << name);
        CHECK(known[inv.role].count(name) == 1);
      }
    }
  }
  CHECK(roles_seen == std::set<std::string>{"aggregate", "controller", "gateway", "node"});
}

TEST_CASE("manifest ports and probes match what the processes serve", "[deploy]") {
  std::map<std::string, unsigned> controller_listen;
  std::vector<std::pair<std::string, unsigned>> joins;
  for (const auto& file : manifests()) {
    const auto text = read(file);
    const auto container_ports = numbers_after(text, "containerPort");
    std::set<unsigned> http_ports;  // ports that serve /healthz and /readyz
    for (const auto& inv : invocations(file)) {
      for (const auto& [name, value] : inv.flags) {
        if (name != "listen" && name != "metrics-listen" && name != "http-port" && name != "rpc-port") continue;
        const auto port = port_of(value);
        INFO(file << ": exaserve " << inv.role << " --" << name << " " << value);
        CHECK(container_ports.count(port) == 1);
        if (name == "metrics-listen" || name == "http-port" || (inv.role == "aggregate" && name == "listen"))
          http_ports.insert(port);
        if (inv.role == "controller" && name == "listen") controller_listen[file] = port;
      }
      if (inv.flags.count("join")) joins.emplace_back(file, port_of(inv.flags.at("join")));
    }
    // Probes: only the status paths, only on a port that serves them.
    const std::regex probe(R"(httpGet:\s*\{path:\s*(\S+),\s*port:\s*(\d+)\})");
    for (std::sregex_iterator it(text.begin(), text.end(), probe), end; it != end; ++it) {
      INFO(file << ": probe " << (*it)[0]);
      const std::string path = (*it)[1];
      CHECK((path == "/healthz" || path == "/readyz"));
      CHECK(http_ports.count(std::stoul((*it)[2])) == 1);
    }
    // A startup probe guards every liveness probe (a long model load must
    // never be killed by liveness before it is up).
    const auto count = [&](const std::string& what) {
      std::size_t n = 0;
      for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
      return n;
    };
    INFO(file);
    CHECK(count("livenessProbe:") == count("startupProbe:"));
  }
  REQUIRE(controller_listen.size() == 1);
  REQUIRE(joins.size() >= 2);
  for (const auto& [file, port] : joins) {
    INFO(file << " joins port " << port);
    CHECK(port == controller_listen.begin()->second);
  }
}

TEST_CASE("the services the aggregator resolves exist with the ports it scrapes", "[deploy]") {
  std::string all;
  for (const auto& file : manifests()) all += read(file);
  bool found = false;
  for (const auto& file : manifests()) {
    for (const auto& inv : invocations(file)) {
      if (inv.role != "aggregate" || !inv.flags.count("targets-dns")) continue;
      found = true;
      std::istringstream in(inv.flags.at("targets-dns"));
      std::string item;
      while (std::getline(in, item, ',')) {
        const auto name = item.substr(0, item.find(':'));
        const auto port = item.substr(item.find(':') + 1);
        INFO(item);
        // A headless Service of that name listing that port.
        const std::regex service("kind: Service\\nmetadata:\\n  name: " + name + "\\n[\\s\\S]*?clusterIP: None[\\s\\S]*?port: " + port + "\\b");
        CHECK(std::regex_search(all, service));
      }
    }
  }
  CHECK(found);
}

TEST_CASE("every kustomization names files that exist", "[deploy]") {
  for (const auto& dir : {"/deploy/k8s/base", "/deploy/k8s/overlays/gpu"}) {
    const std::string base = source_dir + dir;
    const auto lines = lines_of(read(base + "/kustomization.yaml"));
    bool in_list = false;
    std::size_t listed = 0;
    for (const auto& l : lines) {
      if (l == "resources:" || l.find("- path:") != std::string::npos) {
        in_list = l == "resources:";
        if (!in_list) {
          const auto path = l.substr(l.find("path:") + 6);
          INFO(base << ": " << path);
          CHECK(fs::exists(base + "/" + path));
          ++listed;
        }
        continue;
      }
      if (in_list && l.rfind("  - ", 0) == 0) {
        const auto path = l.substr(4);
        INFO(base << ": " << path);
        CHECK(fs::exists(base + "/" + path));
        ++listed;
      } else if (in_list) {
        in_list = false;
      }
    }
    CHECK(listed > 0);
  }
}

TEST_CASE("alert rules and the dashboard name only metrics exaserve exports", "[deploy]") {
  const auto names = metric_names();
  std::string text = read(source_dir + "/deploy/prometheus/alerts.yml") +
                     read(source_dir + "/deploy/prometheus/alerts_test.yml");
  const auto dash = nlohmann::json::parse(read(source_dir + "/deploy/grafana/exaserve.json"));
  for (const auto& q : dashboard_queries(dash)) text += "\n" + q;
  const std::regex metric(R"(\bexaserve_[a-z0-9_]+)");
  std::set<std::string> used;
  for (std::sregex_iterator it(text.begin(), text.end(), metric), end; it != end; ++it) used.insert((*it)[0]);
  CHECK(used.size() > 10);
  for (const auto& n : used) {
    INFO(n);
    CHECK(exported(names, n));
  }
}

TEST_CASE("the dashboard has a fleet, a deployment and a node row, each with panels that query", "[deploy]") {
  const auto dash = nlohmann::json::parse(read(source_dir + "/deploy/grafana/exaserve.json"));
  CHECK(dash.value("uid", "") == "exaserve-fleet");
  std::vector<std::string> rows;
  std::map<std::string, int> panels_in;
  std::string row;
  for (const auto& p : dash["panels"]) {
    if (p["type"] == "row") {
      row = p["title"];
      rows.push_back(row);
      continue;
    }
    REQUIRE(p.contains("targets"));
    for (const auto& t : p["targets"]) CHECK_FALSE(t.value("expr", "").empty());
    ++panels_in[row];
  }
  REQUIRE(rows.size() == 3);
  CHECK(rows[0] == "Fleet overview");
  CHECK_THAT(rows[1], Catch::Contains("$model"));
  CHECK_THAT(rows[2], Catch::Contains("$node"));
  for (const auto& r : rows) CHECK(panels_in[r] >= 3);
}

TEST_CASE("the dashboard's queries are valid PromQL", "[deploy][promtool]") {
  if (::access("/usr/bin/promtool", X_OK) != 0) {
    WARN("skipped: /usr/bin/promtool is not installed (Debian package prometheus; make test installs it)");
    std::exit(77);
  }
  // promtool checks PromQL in rule files: each query becomes a recording
  // rule, with the dashboard's variables set to match anything.
  const auto dash = nlohmann::json::parse(read(source_dir + "/deploy/grafana/exaserve.json"));
  const std::string file = std::string(EXA_TEST_TMPDIR) + "/dashboard_queries.rules.yml";
  fs::create_directories(EXA_TEST_TMPDIR);
  {
    std::ofstream out(file);
    out << "groups:\n  - name: dashboard\n    rules:\n";
    int i = 0;
    for (auto q : dashboard_queries(dash)) {
      if (q.rfind("label_values(", 0) == 0) continue;  // a Grafana function, not PromQL
      for (const std::string var : {"$model", "$node"})
        for (auto p = q.find(var); p != std::string::npos; p = q.find(var)) q.replace(p, var.size(), ".*");
      out << "      - record: dashboard:query" << i++ << "\n        expr: " << nlohmann::json(q).dump() << "\n";
    }
  }
  auto r = run_process({"/usr/bin/promtool", "check", "rules", file}, 30s);
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
}
