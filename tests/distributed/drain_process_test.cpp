// Drains across real processes: SIGTERM to a node process drains it (its
// stream finishes, its slots move, it exits 0), and an operator's drain
// through exaserve-cli moves every replica off a node, keeps it drained
// across a controller restart, and is lifted by undrain.

#include <catch2/catch.hpp>

#include <csignal>

#include "http_client.hpp"
#include "process_cluster.hpp"

using namespace exa;
using namespace exa::test;
using Catch::Matchers::Contains;

TEST_CASE("SIGTERM of a node mid-stream: the stream finishes, the slots move, the process exits 0", "[process][drain]") {
  process_cluster c("process-sigterm-drain");
  const std::string model = slow_model(c.dir());
  c.start_two_nodes("[deployment slow]\nmodel = " + model + "\nreplicas = 2\n");

  const unsigned tokens = 150;
  const streamed reference = stream_completion(c.http_port(), "slow", tokens);
  REQUIRE(reference.done);

  unsigned stopped = 0;
  const streamed run = stream_completion(c.http_port(), "slow", tokens, [&](std::size_t n) {
    if (n != 8) return;
    for (const auto& r : parse_replicas(c.status()))
      if (r.running > 0) stopped = r.node;
    REQUIRE(stopped != 0);
    c.node(stopped).signal(SIGTERM);
  });
  REQUIRE(stopped != 0);
  INFO("gateway log:\n" << c.gateway().err() << "\nnode log:\n" << c.node(stopped).err());
  CHECK(run.error.empty());
  CHECK(run.done);
  CHECK(run.text == reference.text);
  // Finished where it was: the drain waited for it.
  CHECK_THAT(c.gateway().err(), !Contains("event=request_resume"));
  const auto code = c.node(stopped).wait_exit(30s);
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK_THAT(c.node(stopped).err(), Contains("event=node_drained node=" + std::to_string(stopped)));
  CHECK_THAT(c.controller().err(), Contains("event=node_drain_started node=" + std::to_string(stopped) + " cause=shutdown"));
  const unsigned survivor = stopped == 1 ? 2 : 1;
  c.wait_replicas([&](const auto& r) { return all_ready_on(r, 2, survivor); }, 30s,
                  "both slots ready on the node that stayed");
  // A new process of the same node may take slots again (the shutdown's drain is over).
  c.start_node(stopped);
  CHECK_THAT(c.controller().wait_for("restarted after its shutdown drain", 20s, true),
             Contains("node_undrained node=" + std::to_string(stopped)));
}

TEST_CASE("exaserve-cli drain node moves every replica, survives a controller restart, and undrain lifts it",
          "[process][drain]") {
  process_cluster c("process-cli-drain");
  c.start_two_nodes("[deployment tiny]\nreplicas = 2\n");

  auto r = c.cli_run({"drain", "node", "1", "--deadline-s", "5"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("draining node 1") && Contains("deadline 5 s"));
  c.wait_replicas([](const auto& rows) { return all_ready_on(rows, 2, 2); }, 30s, "both replicas on node 2");
  CHECK_THAT(c.status(), Contains("healthy,drained(node)"));

  auto bad = c.cli_run({"drain", "replica", "424242"});
  CHECK(bad.exit_code == 1);
  CHECK_THAT(bad.err, Contains("no replica 424242"));
  auto usage = c.cli_run({"drain", "rack", "1"});
  CHECK(usage.exit_code == 2);

  c.restart_controller();
  c.controller().wait_for("event=reconcile_done", 30s, true);
  c.wait_replicas([](const auto& rows) { return all_ready_on(rows, 2, 2); }, 30s, "adopted on node 2");
  CHECK_THAT(c.status(), Contains("drained(node)"));  // from the journal

  auto u = c.cli_run({"undrain", "node", "1"});
  INFO(u.err);
  REQUIRE(u.exit_code == 0);
  CHECK_THAT(u.out, Contains("undrained node 1"));
  CHECK_THAT(c.status(), !Contains("drained("));
  auto again = c.cli_run({"undrain", "node", "1"});
  CHECK(again.exit_code == 1);
  CHECK_THAT(again.err, Contains("not drained"));
}

TEST_CASE("a deployment scaled to zero stays cold across a controller restart, and a request wakes it",
          "[process][cold]") {
  process_cluster c("process-cold");
  c.start_two_nodes("[deployment tiny]\nreplicas = 2\n");
  auto r = c.cli_run({"scale", "tiny", "0"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  c.wait_replicas([](const auto& rows) { return rows.empty(); }, 30s, "no replica left");

  c.restart_controller();
  c.controller().wait_for("event=reconcile_done", 30s, true);
  CHECK(parse_replicas(c.status()).empty());  // still cold: nothing placed at the end of the reconcile
  const auto resp = http_request(c.http_port(), "POST", "/v1/completions",
                                 R"({"model": "tiny", "prompt": "Hello", "max_tokens": 4})");
  INFO(resp.body << "\ngateway log:\n" << c.gateway().err());
  CHECK(resp.status == 200);  // it waited for the woken replica
  CHECK_THAT(c.gateway().err(), Contains("event=deployment_woken deployment=tiny"));
  c.wait_replicas([](const auto& rows) { return all_ready(rows, 1); }, 30s, "one woken replica");
}
