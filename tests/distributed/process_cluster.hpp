#pragma once
// A distributed cluster as real processes on loopback for the multi-process
// tests: a controller, nodes and gateways started from the exaserve binary,
// driven over HTTP and through exaserve-cli. Every wait is bounded; every
// process is killed by its pid when its handle goes away.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chaos/sse_client.hpp"
#include "processes.hpp"
#include "run_process.hpp"

namespace exa::test {

using namespace std::chrono_literals;

inline const std::string& exaserve = exaserve_bin;
inline const std::string& cli = cli_bin;

// Fast failure detection, so a confirmed failure takes about a second.
inline const std::string fast_timings =
    "[cluster]\n"
    "heartbeat_interval_ms = 100\n"
    "suspect_after_missed = 3\n"
    "observation_window_ms = 600\n";

// A model slow enough on the CPU (about 10 ms a token) that a kill lands
// while a stream of 150 tokens is still being generated.
inline std::string slow_model(const std::string& dir) {
  const std::string path = dir + "/slow.gguf";
  auto r = run_process({exaserve, "gen-model", "--preset", "tiny", "--layers", "12", "--dim", "768", "--ff", "2048",
                        "--heads", "12", "--kv-heads", "4", "--context", "1024", "--type", "q8_0", "--out", path},
                       60s);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return path;
}

struct replica_row {
  std::string id, deployment, state;
  unsigned slot = 0, epoch = 0, node = 0, running = 0, queued = 0, kv_used = 0, kv_capacity = 0;
};

// The rows of one table of `exaserve-cli status` (the lines after the one
// starting with `title` and its header row, up to the first blank line).
inline std::vector<std::string> status_table_rows(const std::string& status, const std::string& title) {
  std::vector<std::string> rows;
  std::istringstream in(status);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind(title, 0) == 0) {
      in_table = true;
      std::getline(in, line);  // the header row
      continue;
    }
    if (!in_table) continue;
    if (line.find_first_not_of(' ') == std::string::npos) break;
    rows.push_back(line);
  }
  return rows;
}

// The REPLICAS table of `exaserve-cli status`.
inline std::vector<replica_row> parse_replicas(const std::string& status) {
  std::vector<replica_row> out;
  for (const std::string& line : status_table_rows(status, "REPLICAS")) {
    std::istringstream row(line);
    replica_row r;
    std::string node_dev;
    std::string kv;
    row >> r.id >> r.deployment >> r.slot >> r.epoch >> r.state >> node_dev >> r.running >> r.queued >> kv;
    r.node = static_cast<unsigned>(std::stoul(node_dev.substr(0, node_dev.find('/'))));
    r.kv_used = static_cast<unsigned>(std::stoul(kv.substr(0, kv.find('/'))));
    if (kv.find('/') != std::string::npos) r.kv_capacity = static_cast<unsigned>(std::stoul(kv.substr(kv.find('/') + 1)));
    out.push_back(r);
  }
  return out;
}

class process_cluster {
 public:
  explicit process_cluster(const std::string& name) : dir_(fresh_test_dir(name)) {}

  const std::string& dir() const { return dir_; }

  void write_config(const std::string& text) {
    std::ofstream(dir_ + "/cluster.ini") << text;
  }

  void start_controller(std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{exaserve,     "controller", "--listen",          "127.0.0.1:0",
                                  "--config",   dir_ + "/cluster.ini", "--state-dir", dir_ + "/state"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    controller_ = std::make_unique<child_process>(argv, dir_, "controller");
    const auto out = controller_->wait_for("listening on", 20s);
    auto port = number_after(out, "listening on 127.0.0.1:");
    REQUIRE(port);
    controller_port_ = *port;
  }

  /// A new controller process on the same address and state directory.
  void restart_controller() {
    controller_.reset();
    std::vector<std::string> argv{exaserve,   "controller",          "--listen",    join_address(),
                                  "--config", dir_ + "/cluster.ini", "--state-dir", dir_ + "/state",
                                  "--wait-nodes", "2"};
    controller_ = std::make_unique<child_process>(argv, dir_, "controller-2");
    controller_->wait_for("listening on", 20s);
  }

  std::string join_address() const { return "127.0.0.1:" + std::to_string(controller_port_); }

  child_process& start_node(unsigned id, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{exaserve, "node", "--join", join_address(), "--node-id", std::to_string(id)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    nodes_[id] = std::make_unique<child_process>(argv, dir_, "node-" + std::to_string(id));
    nodes_[id]->wait_for("joined", 20s);
    return *nodes_[id];
  }
  child_process& node(unsigned id) { return *nodes_.at(id); }

  /// Starts gateway `n` (0 is the one the helpers below talk to).
  void start_gateway(unsigned n = 0, std::vector<std::string> extra = {}) {
    auto& g = gateways_[n];
    std::vector<std::string> argv{exaserve, "gateway", "--join", join_address(), "--http-port", "0", "--rpc-port", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    g.process = std::make_unique<child_process>(argv, dir_, "gateway-" + std::to_string(n));
    const auto out = g.process->wait_for("serving HTTP", 20s);
    auto http = number_after(out, "serving HTTP at http://127.0.0.1:");
    auto rpc = number_after(out, "and RPC on 127.0.0.1:");
    REQUIRE(http);
    REQUIRE(rpc);
    g.http_port = static_cast<std::uint16_t>(*http);
    g.rpc_port = static_cast<std::uint16_t>(*rpc);
  }

  /// The usual test cluster: `deployment` (an ini section after the fast
  /// timings) on a controller waiting for nodes 1 and 2, and gateway 0;
  /// returns the replica table once `ready` replicas are (bounded wait).
  std::vector<replica_row> start_two_nodes(const std::string& deployment, std::size_t ready = 2);

  child_process& controller() { return *controller_; }
  child_process& gateway(unsigned n = 0) { return *gateways_.at(n).process; }
  std::uint16_t http_port(unsigned n = 0) const { return gateways_.at(n).http_port; }
  /// Points the helpers (status, cli_run) at gateway `n`.
  void use_gateway(unsigned n) { current_ = n; }

  /// The key exaserve-cli sends (gateways started with --keys-file want an admin key).
  void use_api_key(std::string key) { api_key_ = std::move(key); }

  process_result cli_run(std::vector<std::string> args) {
    std::vector<std::string> argv{cli, "--connect", "127.0.0.1:" + std::to_string(gateways_.at(current_).rpc_port)};
    if (!api_key_.empty()) argv.insert(argv.end(), {"--api-key", api_key_});
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, 20s);
  }

  std::string status() {
    auto r = cli_run({"status"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return r.out;
  }

  /// Waits until `pred` holds for the replica table (bounded); the last table.
  template <class Pred>
  std::vector<replica_row> wait_replicas(Pred pred, std::chrono::milliseconds timeout, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string last;
    for (;;) {
      last = status();
      auto rows = parse_replicas(last);
      if (pred(rows)) return rows;
      if (std::chrono::steady_clock::now() > deadline) {
        INFO("waited for: " << what << "\nlast status:\n" << last << "\ncontroller log:\n" << controller_->err());
        FAIL("the cluster did not get there in time");
      }
      std::this_thread::sleep_for(100ms);
    }
  }

 private:
  std::string dir_;
  std::unique_ptr<child_process> controller_;
  std::map<unsigned, std::unique_ptr<child_process>> nodes_;
  struct gateway_entry {
    std::unique_ptr<child_process> process;
    std::uint16_t http_port = 0, rpc_port = 0;
  };
  std::map<unsigned, gateway_entry> gateways_;
  unsigned current_ = 0;
  std::string api_key_;
  unsigned controller_port_ = 0;
};

inline bool all_ready(const std::vector<replica_row>& rows, std::size_t n) {
  if (rows.size() != n) return false;
  for (const auto& r : rows)
    if (r.state != "ready" && r.state != "serving") return false;
  return true;
}

inline std::vector<replica_row> process_cluster::start_two_nodes(const std::string& deployment, std::size_t ready) {
  write_config(fast_timings + deployment);
  start_controller({"--wait-nodes", "2"});
  start_node(1);
  start_node(2);
  start_gateway();
  return wait_replicas([ready](const auto& r) { return all_ready(r, ready); }, 60s,
                       "every replica ready on the new cluster");
}

// Exactly n replicas, every one ready and on `node`.
inline bool all_ready_on(const std::vector<replica_row>& rows, std::size_t n, unsigned node) {
  if (!all_ready(rows, n)) return false;
  for (const auto& r : rows)
    if (r.node != node) return false;
  return true;
}

struct streamed {
  std::string text;
  std::size_t events = 0;
  bool done = false;
  std::string error;
  int status = 0;
};

// Streams a greedy completion; `after_event(n)` runs after the n-th event.
// Empty when the stream could not be read at all. No Catch macro: safe on a
// client thread (Catch2 v2's assertions are not thread-safe).
inline std::optional<streamed> try_stream_completion(std::uint16_t port, const std::string& model,
                                                     unsigned max_tokens,
                                                     const std::function<void(std::size_t)>& after_event = {}) {
  const std::string body = nlohmann::json{{"model", model},       {"prompt", "Hello"},  {"max_tokens", max_tokens},
                                          {"temperature", 0},     {"ignore_eos", true}, {"stream", true}}
                               .dump();
  streamed s;
  auto r = chaos::post_sse(
      port, "/v1/completions", body,
      [&](std::string_view data) {
        if (data == "[DONE]") {
          s.done = true;
          return;
        }
        auto j = nlohmann::json::parse(data, nullptr, false);
        if (j.is_discarded()) return;
        if (j.contains("error")) s.error = j["error"].dump();
        if (j.contains("choices") && !j["choices"].empty()) s.text += j["choices"][0].value("text", "");
        ++s.events;
        if (after_event) after_event(s.events);
      },
      60s);
  if (!r) return std::nullopt;
  s.status = r->status;
  if (s.status != 200) s.error += r->body;
  return s;
}

inline streamed stream_completion(std::uint16_t port, const std::string& model, unsigned max_tokens,
                                  const std::function<void(std::size_t)>& after_event = {}) {
  auto s = try_stream_completion(port, model, max_tokens, after_event);
  REQUIRE(s.has_value());
  return *s;
}


}  // namespace exa::test
