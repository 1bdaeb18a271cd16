// The exaserve-cli binary against a front door on loopback.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "cluster/routing.hpp"
#include "run_process.hpp"
#include "test_server.hpp"

using namespace exa;
using namespace exa::test;
using namespace std::chrono_literals;

namespace {

const std::string cli = std::string(EXA_BIN_DIR) + "/exaserve-cli";

process_result run_cli(std::uint16_t port, std::vector<std::string> args) {
  std::vector<std::string> argv = {cli, "--connect", "127.0.0.1:" + std::to_string(port)};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_process(argv, 60s);
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  REQUIRE_FALSE(r.timed_out);
  return r;
}

}  // namespace

TEST_CASE("cli status prints nodes and devices and replicas and deployments", "[cli]") {
  test_server s;
  auto r = run_cli(s.rpc_port(), {"status"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("NODES (1)") != std::string::npos);
  CHECK(r.out.find("healthy") != std::string::npos);
  CHECK(r.out.find("DEVICES (1)") != std::string::npos);
  CHECK(r.out.find("8.0 GiB") != std::string::npos);
  CHECK(r.out.find("REPLICAS (1)") != std::string::npos);
  CHECK(r.out.find("fake/0") != std::string::npos);
  CHECK(r.out.find("ready") != std::string::npos);
  CHECK(r.out.find("128/4096") != std::string::npos);
  CHECK(r.out.find("DEPLOYMENTS (1)") != std::string::npos);
}

TEST_CASE("cli status and top show each node's region, carried over RPC", "[cli]") {
  test_server s;
  auto status = run_cli(s.rpc_port(), {"status"});
  CHECK(status.exit_code == 0);
  const auto nodes = status.out.substr(0, status.out.find("DEVICES"));
  CHECK(nodes.find("REGION") != std::string::npos);
  CHECK(nodes.find("eu-west") != std::string::npos);
  auto top = run_cli(s.rpc_port(), {"top"});
  CHECK(top.exit_code == 0);
  const auto at = top.out.find("\nNODES");
  REQUIRE(at != std::string::npos);
  const auto top_nodes = top.out.substr(at);
  CHECK(top_nodes.find("REGION") != std::string::npos);
  CHECK(top_nodes.find("eu-west") != std::string::npos);
}

TEST_CASE("cli generate streams the completion to stdout", "[cli]") {
  test_server s;
  s.backend->set_behavior("fake", {.cached_tokens = 3});
  auto r = run_cli(s.rpc_port(), {"generate", "--model", "fake", "--max-tokens", "5", "--temperature", "0.5",
                                  "--seed", "9", "hello world"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out == "dlrow\n");
  // The usage line on stderr, with the prompt tokens read from the prefix cache.
  CHECK_THAT(r.err, Catch::Contains("prompt_tokens=11 cached_tokens=3 completion_tokens=5"));
  auto req = s.backend->requests().at(0);
  CHECK(req.max_tokens == 5);
  CHECK(req.sampling.temperature == Approx(0.5));
  CHECK(req.sampling.seed == 9);

  // No --model: the first deployment.
  r = run_cli(s.rpc_port(), {"generate", "abc"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "cba\n");

  r = run_cli(s.rpc_port(), {"generate", "--model", "nope", "x"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("not_found: model 'nope' is not deployed") != std::string::npos);
}

TEST_CASE("cli deploy then models then scale then undeploy", "[cli]") {
  test_server s;
  auto r = run_cli(s.rpc_port(), {"deploy", "--name", "big", "--model-file", "m.gguf", "--replicas", "2",
                                  "--kv-tokens", "1000", "--routing", "least_loaded"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "deployed big (2 replicas)\n");
  CHECK(s.backend->admin_log().back() == "deploy name=big model_file=m.gguf replicas=2 kv_tokens=1000 routing=least_loaded");

  r = run_cli(s.rpc_port(), {"scale", "big", "3"});
  CHECK(r.exit_code == 0);
  CHECK(s.backend->admin_log().back() == "scale name=big replicas=3");
  r = run_cli(s.rpc_port(), {"models"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("big") != std::string::npos);
  CHECK(r.out.find("3/3") != std::string::npos);

  CHECK(run_cli(s.rpc_port(), {"undeploy", "big"}).exit_code == 0);
  r = run_cli(s.rpc_port(), {"undeploy", "big"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("not_found: deployment 'big' does not exist") != std::string::npos);
}

TEST_CASE("cli drain and undrain reach the admin API and report what they did", "[cli]") {
  test_server s;
  auto r = run_cli(s.rpc_port(), {"drain", "node", "0", "--deadline-s", "30"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "draining node 0: 1 replicas, deadline 30 s\n");
  r = run_cli(s.rpc_port(), {"drain", "replica", "0"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "draining replica 0: 1 replicas, deadline 60 s\n");
  r = run_cli(s.rpc_port(), {"undrain", "node", "0"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "undrained node 0\n");
  r = run_cli(s.rpc_port(), {"drain", "replica", "5"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("not_found: no replica 5") != std::string::npos);
  const auto log = s.backend->admin_log();
  REQUIRE(log.size() == 4);
  CHECK(log[0] == "drain node=0 deadline_ms=30000");
  CHECK(log[2] == "undrain node=0 deadline_ms=0");
  // Usage errors never reach the server.
  CHECK(run_cli(s.rpc_port(), {"drain", "node"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"drain", "rack", "1"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"drain", "node", "x"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"drain", "node", "1", "--deadline-s", "0"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"undrain", "node", "1", "--deadline-s", "5"}).exit_code == 2);
  CHECK(s.backend->admin_log().size() == 4);
}

TEST_CASE("cli rollout carries its plan over RPC and prints the status line", "[cli]") {
  test_server s;
  auto r = run_cli(s.rpc_port(), {"rollout", "tiny", "--model-file", "v2.gguf", "--version", "2", "--steps", "5,50,100",
                                  "--bake-s", "60", "--surge", "0", "--max-unavailable", "2", "--min-samples", "40"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "in_progress step 1/3 split 1=99% 2=1% verdict none yet\n");
  r = run_cli(s.rpc_port(), {"rollout", "tiny", "--model-file", "v3.gguf"});  // the defaults
  CHECK(r.exit_code == 0);
  r = run_cli(s.rpc_port(), {"rollout", "pause", "tiny"});
  CHECK(r.exit_code == 0);
  r = run_cli(s.rpc_port(), {"rollout", "status", "nope"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("not_found: no deployment named 'nope'") != std::string::npos);
  const auto log = s.backend->admin_log();
  REQUIRE(log.size() == 4);
  CHECK(log[0] == "rollout start name=tiny file=v2.gguf version=2 steps=5,50,100 bake_s=60 max_unavailable=2 surge=0 "
                  "min_samples=40");
  CHECK(log[1] == "rollout start name=tiny file=v3.gguf version= steps= bake_s=0 max_unavailable=1 surge=1 min_samples=0");
  CHECK(log[2] == "rollout pause name=tiny file= version= steps= bake_s=0 max_unavailable=1 surge=1 min_samples=0");
  // Usage errors never reach the server.
  CHECK(run_cli(s.rpc_port(), {"rollout", "tiny"}).exit_code == 2);                       // no --model-file
  CHECK(run_cli(s.rpc_port(), {"rollout", "status", "tiny", "--surge", "1"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"rollout", "tiny", "--model-file", "f", "--surge", "x"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"rollout"}).exit_code == 2);
  CHECK(s.backend->admin_log().size() == 4);
  // status and top show the rollout, and top each deployment's version.
  r = run_cli(s.rpc_port(), {"status"});
  CHECK(r.out.find("ROLLOUTS (1)\ntiny  in_progress step 1/3") != std::string::npos);
  r = run_cli(s.rpc_port(), {"top"});
  CHECK(r.out.find("ROLLOUTS\ntiny  in_progress step 1/3") != std::string::npos);
  CHECK(r.out.find("VERSION") != std::string::npos);
}

TEST_CASE("cli top shows deployments, nodes and the replicas to watch, a bounded number of times", "[cli]") {
  test_server s;
  auto r = run_cli(s.rpc_port(), {"top", "--iterations", "2", "--interval-s", "1"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("exaserve top") != std::string::npos);
  CHECK(r.out.find("nodes 1 (not healthy 0, drained 0)  replicas 1 (ready 1)") != std::string::npos);
  CHECK(r.out.find("DEPLOYMENTS") != std::string::npos);
  // Each deployment's TTFT and TPOT p50/p99 over the last minute, through the RPC.
  CHECK(r.out.find("TTFT P50/P99 MS") != std::string::npos);
  CHECK(r.out.find("12/80") != std::string::npos);
  CHECK(r.out.find("3/9") != std::string::npos);
  CHECK(r.out.find("NODES") != std::string::npos);
  CHECK(r.out.find("REPLICAS TO WATCH (0 of 0") != std::string::npos);
  // Two screens, not cleared (stdout is not a terminal).
  CHECK(r.out.find("exaserve top", r.out.find("exaserve top") + 1) != std::string::npos);
  CHECK(r.out.find("\x1b[2J") == std::string::npos);
  CHECK(run_cli(s.rpc_port(), {"top", "--interval-s", "0"}).exit_code == 2);
  CHECK(run_cli(s.rpc_port(), {"top", "extra"}).exit_code == 2);
}

TEST_CASE("cli usage errors exit 2 and a server that is not there is named", "[cli]") {
  std::uint16_t port = 0;
  {
    test_server s;
    port = s.rpc_port();
    auto r = run_cli(port, {"scale", "big"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("scale takes NAME REPLICAS") != std::string::npos);
    CHECK(run_cli(port, {"generate", "--frobnicate", "1", "x"}).exit_code == 2);
    CHECK(run_cli(port, {"deploy"}).exit_code == 2);
  }
  // The server is gone: its port refuses connections now.
  auto r = run_cli(port, {"status"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("cannot connect to 127.0.0.1:" + std::to_string(port) +
                   ": connection refused; is `exaserve serve` running?") != std::string::npos);
}

TEST_CASE("cli deploy --chat-template reads the file where it runs and sends its text", "[cli][chat_template]") {
  test_server s;
  const std::string file = std::string(EXA_TEST_TMPDIR) + "/cli_deploy_template.jinja";
  const std::string text = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  {
    std::ofstream out(file, std::ios::binary);
    out << text;
  }
  auto r = run_cli(s.rpc_port(), {"deploy", "--name", "chat", "--chat-template", file});
  CHECK(r.exit_code == 0);
  CHECK(s.backend->admin_log().back().ends_with(" chat_template=" + text));
  // A name that is neither a built-in nor a file never reaches the server.
  const auto before = s.backend->admin_log().size();
  r = run_cli(s.rpc_port(), {"deploy", "--name", "chat2", "--chat-template", "no-such-template"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("chat template 'no-such-template' is neither a built-in") != std::string::npos);
  CHECK(s.backend->admin_log().size() == before);
}

TEST_CASE("cli deploy sends prefix_aware's slack over RPC, its defaults when not given, and refuses a bad one",
          "[cli][prefix]") {
  test_server s;
  auto r = run_cli(s.rpc_port(), {"deploy", "--name", "chat", "--routing", "prefix_aware", "--prefix-slack-tokens",
                                  "512", "--prefix-slack-ratio", "0.5", "--prefix-slack-s", "0.05"});
  CHECK(r.exit_code == 0);
  CHECK(s.backend->admin_log().back().find(" prefix_slack=512/0.5/0.05") != std::string::npos);
  // Not given: the schema's defaults, which are the router's.
  r = run_cli(s.rpc_port(), {"deploy", "--name", "chat2", "--routing", "prefix_aware"});
  CHECK(r.exit_code == 0);
  const cluster::prefix_aware_config router;
  CHECK(s.backend->admin_log().back().find(fmt::format(" prefix_slack={}/{}/{}", router.load_slack_tokens,
                                                       router.load_slack_ratio, router.load_slack_s)) !=
        std::string::npos);
  // `models` (and status's DEPLOYMENTS) shows each one's routing over RPC,
  // with prefix_aware's slack; other policies by name alone.
  r = run_cli(s.rpc_port(), {"deploy", "--name", "plain", "--routing", "least_outstanding"});
  CHECK(r.exit_code == 0);
  r = run_cli(s.rpc_port(), {"models"});
  CHECK(r.exit_code == 0);
  INFO(r.out);
  CHECK_THAT(r.out, Catch::Contains("ROUTING"));
  const auto row = [&](const std::string& name) {
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (const auto at = line.find(name + " "); at != std::string::npos && at == line.find_first_not_of(' '))
        return line;
    return std::string();
  };
  CHECK_THAT(row("chat"), Catch::EndsWith("prefix_aware(512tok,0.05s,x0.5)"));
  CHECK_THAT(row("chat2"), Catch::EndsWith(fmt::format("prefix_aware({}tok,{}s,x{})", router.load_slack_tokens,
                                                router.load_slack_s, router.load_slack_ratio)));
  CHECK_THAT(row("plain"), Catch::EndsWith(" least_outstanding"));
  // A server that does not say (this fake, with no --routing): "-".
  REQUIRE(run_cli(s.rpc_port(), {"deploy", "--name", "unsaid"}).exit_code == 0);
  r = run_cli(s.rpc_port(), {"models"});
  CHECK_THAT(row("unsaid"), Catch::EndsWith(" -"));
  const auto before = s.backend->admin_log().size();
  r = run_cli(s.rpc_port(), {"deploy", "--name", "x", "--routing", "prefix_aware", "--prefix-slack-s", "200ms"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--prefix-slack-s: expected a number of seconds, got '200ms'") != std::string::npos);
  CHECK(s.backend->admin_log().size() == before);
}

TEST_CASE("cli deploy and generate name a bad flag before connecting, with no server to connect to", "[cli]") {
  // Port 1 on loopback: nothing listens there, so any connection is refused.
  for (const auto& [args, words] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"deploy", "--name", "x", "--prefix-slack-s", "200ms"}, "--prefix-slack-s: expected a number of seconds"},
           {{"deploy", "--replicas", "2"}, "--name is required"},
           {{"deploy", "--name", "x", "--draft-tokens", "2"}, "need --draft-model"},
           {{"generate", "--max-tokens", "many", "hi"}, "--max-tokens must be an integer"}}) {
    const auto r = run_cli(1, args);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(words) != std::string::npos);
    CHECK(r.err.find("cannot connect") == std::string::npos);
  }
  // Valid flags do go on to connect, and say why that failed.
  const auto r = run_cli(1, {"deploy", "--name", "x", "--prefix-slack-s", "0.5"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("cannot connect") != std::string::npos);
}

TEST_CASE("cli deploy --draft-model sends the draft over RPC, and bad draft flags never reach the server",
          "[cli][speculative]") {
  test_server s;
  const std::string sha(64, 'd');
  auto r = run_cli(s.rpc_port(), {"deploy", "--name", "spec", "--draft-model", "/models/draft.gguf", "--draft-sha256",
                                  sha, "--draft-tokens", "3"});
  CHECK(r.exit_code == 0);
  CHECK(s.backend->admin_log().back().find(" draft_model=/models/draft.gguf draft_sha256=" + sha + " draft_tokens=3") !=
        std::string::npos);
  r = run_cli(s.rpc_port(), {"deploy", "--name", "spec2", "--draft-model", "/models/draft.gguf"});
  CHECK(r.exit_code == 0);
  CHECK(s.backend->admin_log().back().find(" draft_model=/models/draft.gguf draft_sha256= draft_tokens=0") !=
        std::string::npos);
  const auto before = s.backend->admin_log().size();
  r = run_cli(s.rpc_port(), {"deploy", "--name", "x", "--draft-model", "/d.gguf", "--draft-tokens", "9"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--draft-tokens must be in [1, 8], got '9'") != std::string::npos);
  r = run_cli(s.rpc_port(), {"deploy", "--name", "x", "--draft-tokens", "2"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("need --draft-model") != std::string::npos);
  CHECK(s.backend->admin_log().size() == before);
}
