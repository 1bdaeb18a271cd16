// Hostile input at the HTTP front door: every input of a kept corpus, and
// seeded mutations of them, must get a 2xx/4xx (or a closed connection),
// never a 5xx, a crash or a hang; and the JSON body decoder must turn any
// bytes into a request or an error that names the problem.
//
// A blind, seeded mutator stands in for libFuzzer/AFL++: clang 14 (the
// Debian 12 toolchain that has libFuzzer) cannot compile this code base
// (libstdc++ 12's <expected> needs newer concepts support). An input that
// fails is written to test-tmp/fuzz-failures/ to be added to the corpus.
// EXA_FUZZ_ITERATIONS and EXA_FUZZ_SEED run a longer campaign
// (scripts/fuzz.sh).

#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "http_client.hpp"
#include "openai.hpp"
#include "test_server.hpp"
#include "validate.hpp"

using namespace exa;
using namespace exa::test;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> corpus(const std::string& kind) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(std::string(EXA_FUZZ_CORPUS_DIR) + "/" + kind)) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // the same order everywhere: mutations are reproducible
  std::vector<std::string> out;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

// One random edit of `s`, now and then spliced with another corpus input.
std::string mutate(std::string s, const std::vector<std::string>& all, std::mt19937_64& rng) {
  static const std::vector<std::string> tokens = {"\r\n", "\r\n\r\n", "{", "}", "[", "\"", ":", ",", "-1", "0",
                                                  "1e309", "null", "\xff", "\xc3", "%", "\\u", "\\ud800",
                                                  "Content-Length: ", "Transfer-Encoding: chunked\r\n", "ffffffff",
                                                  std::string(1, '\0'), "HTTP/1.1", " ", "\t"};
  const auto pick = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < edits; ++i) {
    const std::size_t at = pick(s.size() + 1);
    switch (rng() % 7) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1: s.insert(at, 1, static_cast<char>(rng() % 256)); break;
      case 2: s.erase(at, pick(16) + 1); break;
      case 3: s.insert(at, tokens[pick(tokens.size())]); break;
      case 4: {
        const std::size_t len = std::min<std::size_t>(pick(32) + 1, s.size() - std::min(at, s.size()));
        s.insert(at, s.substr(at, len));
        break;
      }
      case 5: {
        const std::string& other = all[pick(all.size())];
        const std::size_t from = pick(other.size() + 1);
        s = s.substr(0, at) + other.substr(from);
        break;
      }
      default: s.resize(at); break;  // truncated
    }
  }
  return s;
}

void keep_failure(const std::string& kind, std::uint64_t n, const std::string& input) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/fuzz-failures/" + kind;
  fs::create_directories(dir);
  std::ofstream(dir + "/" + std::to_string(n) + ".bin", std::ios::binary) << input;
}

// Sends raw bytes, closes the sending side and reads what comes back (at
// most `timeout`): the status of the first response, 0 when the server
// closed without one, -1 when it neither answered nor closed in time.
int exchange(std::uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  for (std::size_t off = 0; off < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early on garbage
    off += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int result = -1;
  while (got.find("\r\n") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      result = 0;
      break;
    }
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (got.rfind("HTTP/1.", 0) == 0 && got.size() >= 12) return std::atoi(got.c_str() + 9);
  return got.empty() ? result : 0;
}

}  // namespace

TEST_CASE("fuzz: HTTP requests from the corpus and their mutations never get a 5xx", "[http][fuzz]") {
  frontdoor_config config = test_config();
  config.body_timeout_ms = 500;      // an incomplete body ends quickly
  config.max_body_bytes = 16 * 1024;
  test_server s(config);
  const auto inputs = corpus("http");
  REQUIRE(inputs.size() >= 5);
  const std::uint64_t iterations = env_or("EXA_FUZZ_ITERATIONS", 600);
  std::mt19937_64 rng(env_or("EXA_FUZZ_SEED", 1));
  std::uint64_t answered = 0, closed = 0;
  for (std::uint64_t i = 0; i < inputs.size() + iterations; ++i) {
    const std::string input = i < inputs.size() ? inputs[i] : mutate(inputs[rng() % inputs.size()], inputs, rng);
    const int status = exchange(s.http_port(), input, std::chrono::seconds(5));
    if (status >= 500 || status < 0) keep_failure("http", i, input);
    INFO("input " << i << " (" << input.size() << " bytes): " << input.substr(0, 200));
    REQUIRE(status >= 0);   // answered or closed, never left hanging
    REQUIRE(status < 500);  // the client's bytes are never the server's error
    (status > 0 ? answered : closed) += 1;
  }
  // Most inputs get an answer (a 400 names what is wrong), not a silent close.
  CHECK(answered > closed);
  const auto ok = http_request(s.http_port(), "GET", "/healthz");
  CHECK(ok.status == 200);
}

TEST_CASE("fuzz: any body bytes decode to a request or an error that names the problem", "[http][fuzz]") {
  const auto inputs = corpus("json");
  REQUIRE(inputs.size() >= 5);
  const std::uint64_t iterations = env_or("EXA_FUZZ_ITERATIONS", 600) * 20;
  std::mt19937_64 rng(env_or("EXA_FUZZ_SEED", 1));
  api::request_limits limits;
  std::uint64_t parsed = 0;
  for (std::uint64_t i = 0; i < inputs.size() + iterations; ++i) {
    const std::string input = i < inputs.size() ? inputs[i] : mutate(inputs[rng() % inputs.size()], inputs, rng);
    for (const auto kind : {door::api_kind::completion, door::api_kind::chat}) {
      bool threw = false;
      std::string message;
      try {
        auto r = door::parse_openai_request(kind, input, limits);
        if (r) {
          ++parsed;
          if (auto bad = door::validate_generate(r->gen, limits)) message = bad->message;
        } else {
          message = r.error().err.message;
          if (message.empty()) keep_failure("json", i, input);
          INFO("input " << i << ": " << input.substr(0, 200));
          CHECK_FALSE(message.empty());
        }
      } catch (...) {
        threw = true;
      }
      if (threw) keep_failure("json", i, input);
      INFO("input " << i << ": " << input.substr(0, 200));
      REQUIRE_FALSE(threw);
    }
  }
  CHECK(parsed > 0);  // the corpus's valid bodies still decode
}
