// The distributed cluster as real processes on loopback: a controller, node
// processes and gateways started from the exaserve binary, driven over HTTP
// and through exaserve-cli, and failed for real (SIGKILL, SIGSTOP). Every
// wait is bounded; every process is killed by its pid when a test ends.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "chaos/sse_client.hpp"
#include "http_client.hpp"
#include "process_cluster.hpp"
#include "processes.hpp"
#include "run_process.hpp"

using namespace exa;
using namespace exa::test;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

TEST_CASE("controller, nodes and a gateway as processes serve and show the whole cluster", "[process]") {
  process_cluster c("process-serve");
  auto rows = c.start_two_nodes("[deployment tiny]\nreplicas = 2\n");
  // Spread over both nodes: the deployment waited for them.
  CHECK(rows[0].node != rows[1].node);

  const std::string status = c.status();
  CHECK_THAT(status, Contains("NODES (2)"));
  CHECK_THAT(status, Contains("ADDRESS"));
  CHECK_THAT(status, Contains("127.0.0.1:"));  // each node's own address
  // Clock offsets estimated from heartbeat round trips: one host, one clock.
  CHECK_THAT(status, Contains("CLOCK"));
  CHECK_THAT(c.controller().err(), !Contains("event=node_clock_skewed"));
  // ClusterStatus.models is filled in (it used to be empty).
  CHECK_THAT(status, Contains("DEPLOYMENTS (1)"));
  CHECK_THAT(status, Contains("2/2"));

  auto resp = http_request(c.http_port(), "POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "Hello", "max_tokens": 8})");
  CHECK(resp.status == 200);
  CHECK_THAT(resp.body, Contains("\"completion_tokens\":8"));
  // One grep for the request id finds it in the gateway's log and in the
  // log of the node whose replica served it.
  const std::string id = resp.header("x-request-id");
  REQUIRE_FALSE(id.empty());
  // The gateway writes its request line once the response is out: wait for it.
  CHECK_THAT(c.gateway().wait_for("request_id=" + id, 10s, true), Contains("request_id=" + id));
  CHECK_THAT(c.node(1).err() + c.node(2).err(), Contains("event=replica_request_started request_id=" + id + " "));

  // Once idle, every replica reports zero load (they used to keep their
  // last busy numbers, so a draining gateway waited out its whole grace).
  c.wait_replicas(
      [](const auto& r) {
        for (const auto& x : r)
          if (x.running != 0) return false;
        return true;
      },
      10s, "idle replicas reporting zero running");

  // Admin calls travel gateway -> controller as messages.
  auto scaled = c.cli_run({"scale", "tiny", "3"});
  INFO(scaled.err);
  CHECK(scaled.exit_code == 0);
  c.wait_replicas([](const auto& r) { return all_ready(r, 3); }, 30s, "3 ready replicas after scale");
  auto unknown = c.cli_run({"scale", "nope", "1"});
  CHECK(unknown.exit_code != 0);
  CHECK_THAT(unknown.err, Contains("no deployment named 'nope'"));
}

TEST_CASE("a node of another cluster or another build is refused at join, in both logs", "[process]") {
  process_cluster c("process-refuse");
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\n");
  c.start_controller();

  child_process other({exaserve, "node", "--join", c.join_address(), "--node-id", "5", "--cluster", "staging"},
                      c.dir(), "node-other-cluster");
  auto rc = other.wait_exit(20s);
  REQUIRE(rc);
  CHECK(*rc != 0);
  CHECK_THAT(other.err(), Contains("refused") && Contains("cluster 'staging'"));
  c.controller().wait_for("cluster 'staging'", 10s, true);
  CHECK_THAT(c.controller().err(), Contains("event=join_refused role=node node=5"));

  ::setenv("EXASERVE_PROTOCOL_VERSION", "exaserve/0.0.1-other", 1);
  child_process old({exaserve, "node", "--join", c.join_address(), "--node-id", "6"}, c.dir(), "node-other-build");
  ::unsetenv("EXASERVE_PROTOCOL_VERSION");
  rc = old.wait_exit(20s);
  REQUIRE(rc);
  CHECK(*rc != 0);
  CHECK_THAT(old.err(), Contains("exaserve/0.0.1-other") && Contains("same build"));
  c.controller().wait_for("exaserve/0.0.1-other", 10s, true);

  // Nothing reachable at the address: a clear error, not a hang.
  child_process lost({exaserve, "node", "--join", "127.0.0.1:1", "--node-id", "7", "--join-timeout-ms", "500"}, c.dir(),
                     "node-no-controller");
  rc = lost.wait_exit(20s);
  REQUIRE(rc);
  CHECK(*rc != 0);
  CHECK_THAT(lost.err(), Contains("cannot reach the controller at 127.0.0.1:1") && Contains("attempts"));
  CHECK_THAT(lost.err(), Contains("event=join_retry"));
}

TEST_CASE("kill -9 of a node mid-stream: the stream resumes on another node token-exact", "[process]") {
  process_cluster c("process-kill-node");
  const std::string model = slow_model(c.dir());
  c.start_two_nodes("[deployment slow]\nmodel = " + model + "\nreplicas = 2\n");

  const unsigned tokens = 150;
  const streamed reference = stream_completion(c.http_port(), "slow", tokens);
  REQUIRE(reference.error.empty());
  REQUIRE(reference.done);

  unsigned killed = 0;
  const streamed run = stream_completion(c.http_port(), "slow", tokens, [&](std::size_t n) {
    if (n != 8) return;
    // The node whose replica is generating this stream dies now.
    for (const auto& r : parse_replicas(c.status()))
      if (r.running > 0) killed = r.node;
    REQUIRE(killed != 0);
    c.node(killed).signal(SIGKILL);
  });
  REQUIRE(killed != 0);
  INFO("gateway log:\n" << c.gateway().err());
  CHECK(run.error.empty());
  CHECK(run.done);
  // One continuous stream, equal to the failure-free one: no gap, no duplicate.
  CHECK(run.text == reference.text);
  CHECK_THAT(c.gateway().err(), Contains("event=request_resume"));

  // The lost node's slot is placed again on the survivor, under a new epoch.
  const unsigned survivor = killed == 1 ? 2 : 1;
  auto rows = c.wait_replicas(
      [&](const auto& r) { return all_ready_on(r, 2, survivor); },
      30s, "both slots ready on the surviving node");
  unsigned max_epoch = 0;
  for (const auto& r : rows) max_epoch = std::max(max_epoch, r.epoch);
  CHECK(max_epoch == 2);
  CHECK_THAT(c.controller().err(), Contains("event=node_lost node=" + std::to_string(killed)));
}

TEST_CASE("SIGSTOP of a node: suspected, confirmed, migrated, and after SIGCONT its stale replica stops", "[process]") {
  process_cluster c("process-freeze");
  auto before = c.start_two_nodes("[deployment tiny]\nreplicas = 2\n");
  std::string frozen_replica;
  for (const auto& r : before)
    if (r.node == 1) frozen_replica = r.id;
  REQUIRE_FALSE(frozen_replica.empty());

  c.node(1).signal(SIGSTOP);
  // Suspect first (k missed heartbeats), confirmed after the window, and only
  // then moved: suspicion alone moves nothing.
  const auto log = c.controller().wait_for("event=node_lost node=1", 20s, true);
  const auto suspect = log.find("event=node_health node=1 from=healthy to=suspect");
  const auto confirmed = log.find("event=node_health node=1 from=suspect to=confirmed");
  REQUIRE(suspect != std::string::npos);
  REQUIRE(confirmed != std::string::npos);
  CHECK(suspect < confirmed);
  CHECK(confirmed < log.find("event=node_lost node=1"));
  auto moved = c.wait_replicas(
      [&](const auto& r) { return all_ready_on(r, 2, 2); },
      20s, "both slots ready on node 2");
  for (const auto& r : moved) CHECK(r.id != frozen_replica);
  // The data plane serves on through it.
  auto resp = http_request(c.http_port(), "POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})");
  CHECK(resp.status == 200);

  c.node(1).signal(SIGCONT);
  // Its lease ran out while it was frozen: its replica stops itself instead
  // of serving a slot that has moved on.
  c.node(1).wait_for("event=node_self_fenced node=1", 20s, true);
  c.wait_replicas(
      [&](const auto& r) {
        if (!all_ready(r, 2)) return false;
        for (const auto& x : r)
          if (x.id == frozen_replica || x.node != 2) return false;
        return true;
      },
      20s, "still exactly the two replicas on node 2");
  // And the node comes back as healthy, able to take new replicas.
  // Node 1's row of the NODES table (NODE REGION RACK STATE ...), whatever
  // the column widths.
  const std::regex node1_healthy(R"((^|\n)\s*1\s+\S+\s+0\s+healthy\s)");
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::string status;
  do {
    status = c.status();
    if (std::regex_search(status, node1_healthy)) break;
    std::this_thread::sleep_for(100ms);
  } while (std::chrono::steady_clock::now() < deadline);
  INFO(status);
  CHECK(std::regex_search(status, node1_healthy));
}

TEST_CASE("kill -9 of the controller: serving goes on, and restarted on its state dir it adopts every replica",
          "[process]") {
  process_cluster c("process-controller");
  auto before = c.start_two_nodes("[deployment tiny]\nreplicas = 2\n");

  c.controller().signal(SIGKILL);
  c.node(1).wait_for("event=control_plane_lost", 10s, true);
  // Nothing migrates and nothing stops: the gateway routes on its table and
  // the nodes hold their leases (no controller can give their slots away).
  for (int i = 0; i < 5; ++i) {
    auto resp = http_request(c.http_port(), "POST", "/v1/completions",
                             R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})");
    CHECK(resp.status == 200);
    std::this_thread::sleep_for(300ms);  // past the 0.8 s lease, in all
  }
  CHECK_THAT(c.node(1).err(), Contains("event=node_lease_held"));
  CHECK_THAT(c.node(1).err(), !Contains("event=node_self_fenced"));
  auto down = c.cli_run({"status"});
  CHECK(down.exit_code != 0);
  CHECK_THAT(down.err, Contains("controller"));

  c.restart_controller();
  c.controller().wait_for("event=replica_adopted", 20s, true);
  auto after = c.wait_replicas([](const auto& r) { return all_ready(r, 2); }, 30s, "2 ready replicas again");
  // The same replicas under the same epochs: adopted, not restarted.
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].id == before[i].id);
    CHECK(after[i].epoch == before[i].epoch);
    CHECK(after[i].node == before[i].node);
  }
  const auto log = c.controller().wait_for("event=reconcile_done", 30s, true);
  CHECK_THAT(log, Contains("event=journal_opened") && Contains("deployments=1"));
  CHECK_THAT(log, Contains("event=reconcile_done adopted=2 placed=0"));
  // The restarted controller runs the cluster: a node loss is handled again.
  c.node(2).signal(SIGKILL);
  c.wait_replicas(
      [&](const auto& r) { return all_ready_on(r, 2, 1); },
      30s, "both slots on node 1 after node 2 died");
}

TEST_CASE("kill -9 of a gateway: another keeps serving, and the dead one's requests are cancelled on the nodes",
          "[process]") {
  process_cluster c("process-gateway");
  const std::string model = slow_model(c.dir());
  c.write_config(fast_timings + "[deployment slow]\nmodel = " + model + "\nreplicas = 2\n");
  c.start_controller({"--wait-nodes", "2"});
  c.start_node(1);
  c.start_node(2);
  c.start_gateway(0);
  c.start_gateway(1);
  c.use_gateway(1);
  c.wait_replicas([](const auto& r) { return all_ready(r, 2); }, 60s, "2 ready replicas");

  // A long stream through gateway 0 (about 8 s of generation)...
  std::atomic<bool> streaming{false};
  std::thread client([&] {
    try {
      (void)try_stream_completion(c.http_port(0), "slow", 600, [&](std::size_t n) {
        if (n == 4) streaming = true;
      });
    } catch (...) {
    }
  });
  const auto started = std::chrono::steady_clock::now();
  while (!streaming && std::chrono::steady_clock::now() - started < 30s) std::this_thread::sleep_for(10ms);
  REQUIRE(streaming);
  bool busy = false;
  for (const auto& r : parse_replicas(c.status())) busy |= r.running > 0;
  CHECK(busy);

  // ...and its gateway dies. The node hears of it and frees the request's KV
  // at once, long before the 600 tokens would have been done.
  c.gateway(0).signal(SIGKILL);
  client.join();
  c.wait_replicas(
      [](const auto& r) {
        for (const auto& x : r)
          if (x.running != 0 || x.queued != 0 || x.kv_used != 0) return false;
        return r.size() == 2;
      },
      3s, "no running request and no KV in use after the gateway died");

  // The other gateway serves on.
  const streamed after = stream_completion(c.http_port(1), "slow", 8);
  CHECK(after.error.empty());
  CHECK(after.done);
  CHECK(after.events >= 8);
}

TEST_CASE("mutual TLS: the cluster serves, and a process without a certificate of its CA cannot join", "[process]") {
  process_cluster c("process-tls");
  const std::string certs = c.dir() + "/certs", other = c.dir() + "/other";
  for (const auto& d : {certs, other}) {
    auto r = run_process({exaserve, "gen-certs", d}, 30s);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  auto again = run_process({exaserve, "gen-certs", certs}, 30s);
  CHECK(again.exit_code != 0);  // never overwrites a CA by accident
  CHECK_THAT(again.err, Contains("--force"));
  const auto tls = [&](const std::string& dir, const std::string& role, const std::string& ca) {
    return std::vector<std::string>{"--tls-cert", dir + "/" + role + ".pem", "--tls-key", dir + "/" + role + ".key",
                                    "--tls-ca", ca + "/ca.pem"};
  };
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\n");
  c.start_controller(tls(certs, "controller", certs));
  CHECK_THAT(c.controller().out(), Contains("mutual TLS"));
  c.start_node(1, tls(certs, "node", certs));
  c.start_gateway(0, tls(certs, "gateway", certs));
  c.start_gateway(1, tls(certs, "gateway", certs));
  c.wait_replicas([](const auto& r) { return all_ready(r, 1); }, 30s, "1 ready replica over TLS");
  const std::string completion = R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})";
  auto resp = http_request(c.http_port(1), "POST", "/v1/completions", completion);
  CHECK(resp.status == 200);

  // One TLS peer dying abruptly is that peer's loss only: its "unexpected
  // eof" once stayed in OpenSSL's per-thread error queue and closed every
  // other connection of the controller (and of the node) with it.
  c.gateway(1).signal(SIGKILL);
  c.controller().wait_for("event=gateway_lost", 10s, true);
  resp = http_request(c.http_port(0), "POST", "/v1/completions", completion);
  CHECK(resp.status == 200);

  struct attempt {
    const char* what;
    std::vector<std::string> flags;
  };
  const std::vector<attempt> refused = {
      {"no certificate at all", {}},
      {"a certificate of another CA", tls(other, "node", other)},
      {"another CA's certificate, trusting ours", tls(other, "node", certs)},
  };
  unsigned id = 10;
  for (const auto& a : refused) {
    std::vector<std::string> argv{exaserve, "node", "--join", c.join_address(), "--node-id", std::to_string(id++),
                                  "--join-timeout-ms", "1500"};
    argv.insert(argv.end(), a.flags.begin(), a.flags.end());
    auto r = run_process(argv, 30s);
    INFO(a.what << "\n" << r.err);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, Contains("cannot reach the controller"));
  }
  // Only the node with the cluster's certificate ever joined, and neither
  // the dead gateway nor the refused handshakes cost it its link.
  const std::string log = c.controller().err();
  CHECK_THAT(log, !Contains("event=node_lost"));
  CHECK_THAT(c.node(1).err(), !Contains("event=control_plane_lost"));
  CHECK_THAT(c.gateway(0).err(), !Contains("event=control_plane_lost"));
  CHECK_THAT(log, Contains("event=node_added node=1 "));
  CHECK_THAT(log, !Contains("event=node_added node=10") && !Contains("event=node_added node=11") &&
                      !Contains("event=node_added node=12"));
}

TEST_CASE("plain TCP beyond loopback needs --insecure, and TLS needs all three files", "[process]") {
  const std::string dir = fresh_test_dir("process-transport");
  auto plain = run_process({exaserve, "node", "--join", "10.213.250.1:7100", "--node-id", "1"}, 20s);
  CHECK(plain.exit_code != 0);
  CHECK_THAT(plain.err, Contains("is not loopback") && Contains("--insecure") && Contains("gen-certs"));
  auto half = run_process({exaserve, "controller", "--state-dir", dir + "/s", "--tls-cert", dir + "/x.pem"}, 20s);
  CHECK(half.exit_code != 0);
  CHECK_THAT(half.err, Contains("--tls-key is missing"));
  auto unreadable = run_process({exaserve, "gateway", "--join", "127.0.0.1:1", "--tls-cert", dir + "/none.pem",
                                 "--tls-key", dir + "/none.key", "--tls-ca", dir + "/none-ca.pem"},
                                20s);
  CHECK(unreadable.exit_code != 0);
  CHECK_THAT(unreadable.err, Contains("--tls-cert '" + dir + "/none.pem' cannot be read"));
}

TEST_CASE("a request sent before any node joined waits for its deployment instead of a refusal", "[process]") {
  process_cluster c("process-starting");
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\n");
  c.start_controller({"--wait-nodes", "1"});
  c.start_gateway();  // the deployment is configured but placed nowhere yet
  http_response early;
  std::string client_error;
  std::thread client([&] {
    try {  // a failure must reach the test, not terminate the process
      early = http_request(c.http_port(), "POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})");
    } catch (const std::exception& e) {
      client_error = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);  // the request is at the gateway, waiting
  c.start_node(1);
  client.join();
  REQUIRE(client_error.empty());
  INFO(early.body);
  CHECK(early.status == 200);
  CHECK_THAT(early.body, Contains("\"completion_tokens\":4"));
  // A model nobody configured is still refused at once.
  auto unknown = http_request(c.http_port(), "POST", "/v1/completions", R"({"model": "nope", "prompt": "Hi"})");
  CHECK(unknown.status == 404);
}

TEST_CASE("a gateway joining a quiet cluster knows every replica's KV capacity at once", "[process]") {
  process_cluster c("process-late-gateway");
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\n");
  c.start_controller({"--wait-nodes", "1"});
  c.start_node(1);
  c.start_gateway(0);
  c.wait_replicas([](const auto& r) { return all_ready(r, 1); }, 30s, "1 ready replica");
  auto resp = http_request(c.http_port(), "POST", "/v1/completions",
                           R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})");
  REQUIRE(resp.status == 200);
  c.wait_replicas([](const auto& r) { return r.size() == 1 && r[0].kv_capacity > 0; }, 10s, "KV capacity at gateway 0");
  // The cluster is idle from here: nothing steps, so nothing reports a load.
  c.start_gateway(1);
  c.use_gateway(1);
  auto rows = c.wait_replicas([](const auto& r) { return r.size() == 1 && r[0].kv_capacity > 0; }, 5s,
                              "KV capacity at the late gateway without a request");
  CHECK(rows[0].kv_used == 0);
}

TEST_CASE("a gateway with --keys-file: keys made by `exaserve keys`, revoked on SIGHUP", "[process][auth]") {
  process_cluster c("process-keys");
  const std::string keys = c.dir() + "/keys";
  const auto add = run_process({exaserve, "keys", "add", "--file", keys, "--tenant", "acme"}, 20s);
  REQUIRE(add.exit_code == 0);
  const std::string key = add.out.substr(0, add.out.find('\n'));
  REQUIRE(key.rfind("exa-", 0) == 0);
  CHECK_THAT(exa::chaos::read_text(keys), !Contains(key));  // the file holds its hash only
  const auto admin = run_process({exaserve, "keys", "add", "--file", keys, "--tenant", "ops", "--admin"}, 20s);
  REQUIRE(admin.exit_code == 0);
  const std::string admin_key = admin.out.substr(0, admin.out.find('\n'));
  const auto other = run_process({exaserve, "keys", "add", "--file", keys, "--tenant", "beta"}, 20s);
  REQUIRE(other.exit_code == 0);
  const std::string beta_key = other.out.substr(0, other.out.find('\n'));
  // tiny is acme's: for beta it does not exist.
  c.write_config(fast_timings + "[deployment tiny]\nreplicas = 1\ntenant = acme\n");
  c.start_controller();
  c.start_node(1);
  // Both modes at once is a contradiction, refused with its reason.
  auto both = run_process({exaserve, "gateway", "--join", c.join_address(), "--keys-file", keys, "--no-auth"}, 20s);
  CHECK(both.exit_code != 0);
  CHECK_THAT(both.err, Contains("contradict"));
  c.start_gateway(0, {"--keys-file", keys});
  // The admin RPC wants an admin key: none, or a tenant's, is refused.
  auto open = c.cli_run({"status"});
  CHECK(open.exit_code != 0);
  CHECK_THAT(open.err, Contains("unauthenticated") && Contains("--api-key"));
  c.use_api_key(key);
  auto user = c.cli_run({"status"});
  CHECK(user.exit_code != 0);
  CHECK_THAT(user.err, Contains("permission_denied") && Contains("not an admin key"));
  c.use_api_key(admin_key);
  c.wait_replicas([](const auto& r) { return all_ready(r, 1); }, 30s, "1 ready replica");
  CHECK_THAT(c.gateway().err(), Contains("event=auth_enabled") && Contains("keys=3"));
  const std::string body = R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})";
  const std::string auth = "Authorization: Bearer " + key + "\r\n";
  CHECK(http_request(c.http_port(), "POST", "/v1/completions", body).status == 401);
  CHECK(http_request(c.http_port(), "POST", "/v1/completions", body, auth).status == 200);
  const std::string beta = "Authorization: Bearer " + beta_key + "\r\n";
  auto hidden = http_request(c.http_port(), "POST", "/v1/completions", body, beta);
  CHECK(hidden.status == 404);
  CHECK_THAT(hidden.body, Contains("unknown model 'tiny'") && !Contains("serving: tiny"));
  CHECK_THAT(http_request(c.http_port(), "GET", "/v1/models", {}, beta).body, !Contains("\"tiny\""));
  CHECK(http_request(c.http_port(), "GET", "/v1/models/tiny", {}, beta).status == 404);
  CHECK_THAT(http_request(c.http_port(), "GET", "/v1/models", {}, auth).body, Contains("\"tiny\""));
  CHECK_THAT(http_request(c.http_port(), "GET", "/v1/models", {}, "Authorization: Bearer " + admin_key + "\r\n").body,
             Contains("\"tiny\""));
  // Latency and outcomes are per tenant in the metrics; the key never is.
  const auto metrics = http_request(c.http_port(), "GET", "/metrics").body;
  CHECK_THAT(metrics, Contains("exaserve_requests_total{model=\"tiny\",tenant=\"acme\",outcome=\"completed\"} 1"));
  CHECK_THAT(metrics,
             Contains("exaserve_time_to_first_token_ms_count{model=\"tiny\",deployment=\"tiny\",version=\"1\",tenant=\"acme\"} 1"));
  CHECK_THAT(metrics, !Contains(key));
  // The owner is kept in the controller's journal, so a restart keeps it.
  CHECK_THAT(exa::chaos::read_text(c.dir() + "/state/journal.log"), Contains("\"tenant\":\"acme\""));

  const auto list = run_process({exaserve, "keys", "list", "--file", keys}, 20s);
  REQUIRE(list.exit_code == 0);
  CHECK_THAT(list.out, Contains("acme") && !Contains(key));
  const auto row = list.out.find("acme");
  REQUIRE(row != std::string::npos);
  const std::string id = list.out.substr(list.out.rfind('\n', row) + 1, 12);
  REQUIRE(run_process({exaserve, "keys", "revoke", id, "--file", keys}, 20s).exit_code == 0);
  c.gateway().signal(SIGHUP);
  c.gateway().wait_for("event=keys_reloaded", 10s, true);
  CHECK(http_request(c.http_port(), "POST", "/v1/completions", body, auth).status == 401);
  // The key itself is in no log line.
  CHECK_THAT(c.gateway().err() + c.gateway().out(), !Contains(key) && !Contains(admin_key) && !Contains(beta_key));
}

TEST_CASE("HTTPS at the front door: the right CA passes, a wrong one and plain HTTP are refused, client certificates",
          "[process][tls]") {
  const std::string dir = fresh_test_dir("process-door-tls");
  const std::string certs = dir + "/certs", other = dir + "/other";
  for (const auto& d : {certs, other}) REQUIRE(run_process({exaserve, "gen-certs", d}, 30s).exit_code == 0);
  const auto serve = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> argv{exaserve, "serve", "--http-port", "0", "--rpc-port", "0", "--no-auth",
                                  "--door-tls-cert", certs + "/gateway.pem", "--door-tls-key", certs + "/gateway.key"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<child_process>(argv, dir, name);
  };
  const auto curl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"/usr/bin/curl", "-sS", "--max-time", "10"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, 20s);
  };
  auto s = serve("serve", {});
  const auto banner = s->wait_for("Ctrl-C", 120s);
  const auto port = number_after(banner, "https://127.0.0.1:");
  REQUIRE(port);
  const std::string base = "https://127.0.0.1:" + std::to_string(*port);

  auto ok = curl({"--cacert", certs + "/ca.pem", base + "/healthz"});
  INFO(ok.err);
  CHECK(ok.exit_code == 0);
  CHECK(ok.out == "ok\n");
  auto done = curl({"--cacert", certs + "/ca.pem", base + "/v1/completions", "-H", "Content-Type: application/json",
                    "-d", R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})"});
  CHECK(done.exit_code == 0);
  CHECK_THAT(done.out, Contains("\"choices\""));
  auto wrong = curl({"--cacert", other + "/ca.pem", base + "/healthz"});
  // curl: 60, the certificate cannot be verified; or 35, the handshake
  // failed (both CAs are named alike, so it checks a signature that fails).
  CHECK((wrong.exit_code == 60 || wrong.exit_code == 35));
  auto plain = curl({"http://127.0.0.1:" + std::to_string(*port) + "/healthz"});
  CHECK(plain.exit_code != 0);
  CHECK(curl({"--cacert", certs + "/ca.pem", base + "/healthz"}).out == "ok\n");  // still serving
  CHECK_THAT(s->err(), Contains("event=tls_handshake_failed"));
  // The RPC door speaks TLS too.
  const auto rpc = number_after(banner, "Cap'n Proto RPC:          127.0.0.1:");
  REQUIRE(rpc);
  const std::string at = "127.0.0.1:" + std::to_string(*rpc);
  auto models = run_process({cli, "--connect", at, "--tls-ca", certs + "/ca.pem", "models"}, 20s);
  INFO(models.err);
  CHECK(models.exit_code == 0);
  CHECK_THAT(models.out, Contains("tiny"));
  CHECK(run_process({cli, "--connect", at, "--tls-ca", other + "/ca.pem", "models"}, 20s).exit_code != 0);

  // SIGHUP re-reads the certificate: a new one (of another CA) replaces it;
  // a broken file keeps the one in use.
  const std::string next = dir + "/next";
  REQUIRE(run_process({exaserve, "gen-certs", next}, 30s).exit_code == 0);
  std::filesystem::copy_file(next + "/gateway.pem", certs + "/gateway.pem", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(next + "/gateway.key", certs + "/gateway.key", std::filesystem::copy_options::overwrite_existing);
  s->signal(SIGHUP);
  s->wait_for("event=frontdoor_tls_reloaded", 10s, true);
  CHECK(curl({"--cacert", next + "/ca.pem", base + "/healthz"}).out == "ok\n");
  CHECK(curl({"--cacert", certs + "/ca.pem", base + "/healthz"}).exit_code != 0);
  { std::ofstream(certs + "/gateway.pem") << "not a certificate\n"; }
  s->signal(SIGHUP);
  s->wait_for("event=tls_reload_failed", 10s, true);
  CHECK(curl({"--cacert", next + "/ca.pem", base + "/healthz"}).out == "ok\n");
  s->signal(SIGTERM);
  CHECK(s->wait_exit(30s).has_value());

  // With a client CA: no certificate, no connection. (The door now has
  // next's certificate; clients present ones of the first CA.)
  std::filesystem::copy_file(next + "/gateway.pem", certs + "/gateway.pem", std::filesystem::copy_options::overwrite_existing);
  auto strict = serve("serve-mtls", {"--door-tls-client-ca", certs + "/ca.pem"});
  const auto port2 = number_after(strict->wait_for("Ctrl-C", 120s), "https://127.0.0.1:");
  REQUIRE(port2);
  const std::string base2 = "https://127.0.0.1:" + std::to_string(*port2) + "/healthz";
  CHECK(curl({"--cacert", next + "/ca.pem", base2}).exit_code != 0);
  CHECK(curl({"--cacert", next + "/ca.pem", "--cert", other + "/gateway.pem", "--key", other + "/gateway.key", base2})
            .exit_code != 0);
  auto admitted = curl({"--cacert", next + "/ca.pem", "--cert", certs + "/node.pem", "--key", certs + "/node.key", base2});
  INFO(admitted.err);
  CHECK(admitted.out == "ok\n");
  strict->signal(SIGTERM);
  CHECK(strict->wait_exit(30s).has_value());

  // Half a pair is refused before anything starts.
  auto half = run_process({exaserve, "serve", "--no-auth", "--door-tls-cert", certs + "/gateway.pem"}, 20s);
  CHECK(half.exit_code != 0);
  CHECK_THAT(half.err, Contains("go together"));
}
