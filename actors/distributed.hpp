#pragma once
// The distributed cluster: the embedded cluster's roles, cut along process
// lines and joined by CAF's middleman (BASP over TCP).
//
//   controller process   health monitor, controller, a hub standing in for
//                        every gateway's router, and a published directory
//                        that new processes say hello to
//   node process         one node subtree (devices, model cache, replicas)
//                        and a published hub that gateways subscribe at
//   gateway process      a router with its request actors, behind the HTTP
//                        and RPC front doors; it connects to every node
//                        directly, so tokens never pass the controller
//
// The actors are the embedded cluster's own; only the wiring differs. This
// header keeps CAF out of its includers, as embedded_cluster.hpp does.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/embedded_cluster.hpp"
#include "api/gateway.hpp"
#include "auth/quota_board.hpp"
#include "common/error.hpp"

namespace exa::actors {

/// What every role checks at join: the cluster it belongs to and the
/// protocol version of its build.
struct cluster_identity {
  std::string cluster = "exaserve";
  /// This build's version; a test may override it to prove mismatches are
  /// refused (EXASERVE_PROTOCOL_VERSION in the environment).
  std::string version;
};

/// This build's protocol version ("exaserve/<project version>").
std::string build_version();

struct host_port {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
};

/// Mutual TLS between cluster processes (CAF's OpenSSL module): this
/// process's certificate and key, and the cluster CA every peer's
/// certificate must be signed by. All three or none.
struct tls_options {
  std::string cert, key, ca;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

/// Checks a process's transport choice: TLS with all three files, or plain
/// TCP only where every address it listens on or joins is loopback, unless
/// `insecure` says the operator means it. Errors name the flag to give.
expected<void> check_transport(const tls_options& tls, bool insecure, const std::vector<host_port>& addresses);
/// Parses "HOST:PORT" (port 0..65535; HOST non-empty). Errors name the text.
expected<host_port> parse_host_port(const std::string& text);

struct controller_options {
  tls_options tls;
  bool insecure = false;  // plain TCP beyond loopback, on purpose
  cluster_identity identity;
  host_port listen{"127.0.0.1", 7100};
  /// Deployments, engine, default model and timings; nodes are not listed:
  /// they join.
  cluster_options cluster;
  /// The configured deployments are placed once this many nodes joined.
  std::uint32_t deploy_after_nodes = 1;
  /// The journal's directory (required): deployments, epochs and replica ids
  /// survive a controller restart.
  std::string state_dir;
};

class controller_process {
 public:
  static expected<std::unique_ptr<controller_process>> start(controller_options options);
  ~controller_process();
  std::uint16_t port() const;
  /// This process's metrics in the Prometheus text format (its status port).
  std::string metrics_text() const;
  void stop();

 private:
  struct impl;
  explicit controller_process(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

struct node_options {
  tls_options tls;
  bool insecure = false;  // plain TCP beyond loopback, on purpose
  cluster_identity identity;
  host_port join;                          // the controller
  host_port listen{"127.0.0.1", 0};        // where gateways reach this node
  std::uint32_t node = 0;
  std::uint32_t rack = 0;
  std::string region;  // "" = none
  std::uint32_t devices = 1;
  std::uint64_t device_memory_bytes = 1ull << 30;
  std::string engine;  // "" = the controller's; "cpu" or "null" overrides
  std::uint32_t device_threads = 1;
  /// Engines may stop a step part way for a lighter tenant's prompt
  /// (replica_context::step_stop); `node --no-step-stop` turns it off.
  bool step_stop = true;
  /// "cpu", "cuda" or "auto" (gpu::parse_kind_request): `cuda` without
  /// `devices` usable GPUs fails start() with the CUDA runtime's reason.
  std::string device_kind = "cpu";
  std::uint32_t join_timeout_ms = 60000;  // keeps trying to reach the controller this long
  std::shared_ptr<cluster::event_log> event_log;  // --event-log: replica states, clock offsets
  std::string model_dir;  // --model-dir: models missing at their deployed path, by sha256 or name
  std::string model_store;      // --model-store: fetched from here when found nowhere on the node
  std::string model_cache_dir;  // --model-cache-dir: where fetched models go
  std::uint64_t model_cache_bytes = 64ull << 30;  // --model-cache-mb
};

class node_process {
 public:
  /// Connects, says hello (refused: a clear error naming the mismatch) and
  /// starts the node subtree.
  static expected<std::unique_ptr<node_process>> start(node_options options);
  ~node_process();
  std::uint16_t port() const;
  /// This process's metrics in the Prometheus text format (its status port).
  std::string metrics_text() const;
  /// Ready once none of its replicas is still starting (creating, loading,
  /// warming); the error names how many are, in which state.
  expected<void> ready() const;
  /// Before a stop (SIGTERM): asks the controller to move this node's slots
  /// and drain its replicas within `deadline`, and waits until none is left
  /// (at most deadline + 5 s; less when the controller cannot be told).
  /// Returns how many replicas were still running when it stopped waiting.
  std::size_t drain(std::chrono::milliseconds deadline);
  /// Blocks until the node subtree ended (or `stop`).
  void stop();

 private:
  struct impl;
  explicit node_process(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

struct gateway_options {
  tls_options tls;
  bool insecure = false;  // plain TCP beyond loopback, on purpose
  cluster_identity identity;
  host_port join;
  std::uint32_t join_timeout_ms = 60000;
  std::uint32_t request_deadline_ms = 120000;
  std::uint32_t queued_per_model_max = 1024;
  std::uint32_t queued_global_max = 4096;
  std::uint32_t max_attempts = 4;
  std::string default_routing = "least_outstanding";
  std::shared_ptr<cluster::event_log> event_log;  // --event-log: what the router detects
  std::string region;  // "" = none: replicas of this region first, others when those are saturated or down
  std::string chat_template;  // router_config::chat_template ("": each file's own)
  /// Tenant limits shared with the other gateways through the controller
  /// (router_config::quotas); the front door admits on the same board.
  /// Null: this gateway enforces whole limits on its own.
  std::shared_ptr<auth::quota_board> quotas;
  /// Weighted fair queuing shared with the other gateways through the
  /// controller (router_config::fair_shares); false: this gateway's fair
  /// queues count only what it served.
  bool fair_across_gateways = true;
};

class gateway_process {
 public:
  static expected<std::unique_ptr<gateway_process>> start(gateway_options options);
  ~gateway_process();
  std::shared_ptr<api::gateway_backend> backend() const;
  void stop();

 private:
  struct impl;
  explicit gateway_process(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa::actors
