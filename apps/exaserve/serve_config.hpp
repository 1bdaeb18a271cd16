#pragma once
// Configuration of `exaserve serve`: a small INI-style file plus flags that
// override it. Every key is checked (unknown keys and sections are errors that
// name the line), every number is range-checked.
//
//   [cluster]                 nodes, devices_per_node, racks, device_memory_mb,
//                             kv_page_kb, device_threads, engine (cpu|null),
//                             device_kind (cpu|cuda|auto; default cpu),
//                             kv_tokens, routing, heartbeat_interval_ms,
//                             suspect_after_missed, observation_window_ms,
//                             request_deadline_ms, queued_per_model_max,
//                             chat_template (built-in name or file)
//   [server]                  host, http_port, rpc_port, max_body_kb
//   [deployment NAME]         model (GGUF path; empty = the default model),
//                             replicas, kv_tokens, routing, prefix_slack_tokens,
//                             prefix_slack_ratio and prefix_slack_s
//                             (prefix_aware's load bound), sha256, tenant,
//                             warm_pool_percent, autoscale_*, idle_to_zero_s,
//                             chat_template (built-in name or file, read and
//                             compiled while parsing: the deployment carries
//                             the text; it wins over [cluster] chat_template),
//                             draft_model (a draft GGUF for speculative
//                             decoding), draft_sha256, draft_tokens (1-8),
//                             tensor_parallel (1, 2, 4 or 8: devices of one
//                             node each replica runs on)

#include <cstdint>
#include <string>

#include "actors/embedded_cluster.hpp"
#include "common/error.hpp"
#include "frontdoor.hpp"

namespace exa::app {

class args;

struct serve_config {
  actors::cluster_options cluster;
  frontdoor_config server;
};

/// The defaults: 2 nodes × 2 CPU devices, one deployment "tiny" of 2 replicas
/// of the default model, HTTP on 127.0.0.1:8000 and RPC on :7000.
serve_config default_serve_config();

/// Applies a config file's text on top of `config`. Errors name the line.
expected<void> apply_config_text(const std::string& text, serve_config& config);

/// Applies command-line flags (see cmd_serve.cpp) on top of `config`.
expected<void> apply_serve_flags(const args& a, serve_config& config);

}  // namespace exa::app
