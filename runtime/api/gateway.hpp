#pragma once
// The seam between the front doors (HTTP and Cap'n Proto RPC, running on a KJ
// event loop) and the cluster (CAF actors). Front doors parse and validate what
// clients send, call a gateway_backend, and turn its callbacks into responses;
// the backend routes, generates and reports. Neither side sees the other's
// framework, so each is tested with a fake of the other.
//
// Threading: every backend method returns at once (never blocks the caller's
// event loop); results arrive through callbacks that the backend may invoke
// from any thread. Implementations of stream_sink and the callbacks must be
// thread-safe (front doors hop back onto their own loop).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::api {

using token_id = std::int32_t;

struct sampling_params {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;
  std::uint32_t top_k = 0;
  std::uint64_t seed = 0;
};

/// Named bounds on what one request may ask for.
struct request_limits {
  std::uint32_t max_tokens_max = 16384;
  std::size_t prompt_bytes_max = 1 << 20;
  std::size_t prompt_tokens_max = 1 << 18;
  std::size_t stop_sequences_max = 4;
  std::size_t stop_sequence_bytes_max = 256;
};

/// One chat message as /v1/chat/completions carries it (text content only).
struct chat_message {
  std::string role;  // system | user | assistant | tool: the template decides what it accepts
  std::string content;
};

struct generate_request {
  std::string request_id;  // assigned by the front door, unique per process
  std::string model;       // deployment name (what /v1/models lists)
  /// Exactly one of these is used: text is tokenized by the backend with the
  /// model's tokenizer (BOS added); ids are used as given; messages are
  /// rendered by the backend with the model's chat template (the file's, or
  /// the --chat-template of serve/gateway) and tokenized with special tokens
  /// parsed, as llama.cpp's server does.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<token_id>> prompt_ids;
  std::optional<std::vector<chat_message>> messages;
  /// With messages: end the prompt with the template's cue for the reply.
  bool add_generation_prompt = true;
  std::uint32_t max_tokens = 16;
  sampling_params sampling;
  std::vector<std::string> stop;  // stop sequences (text); generation ends before them
  bool ignore_eos = false;
  std::uint32_t deadline_ms = 0;  // 0: the backend's default
  /// The caller's tenant (its API key's), checked against the deployment's:
  /// a deployment of another tenant answers not_found, as if it did not
  /// exist. "": no check (no keys, or an admin key).
  std::string tenant;
  /// "interactive" (also when empty) or "batch": while replicas are full,
  /// interactive requests are served first (batch ones wait longer).
  std::string priority;
  /// The tenant's fair-share weight (its keys file entry; 1 without one).
  double tenant_weight = 1;
  /// The conversation (the OpenAI `user` field, or an X-Session-Id header):
  /// during a rollout, one conversation stays on one version. "": none.
  std::string user;
  /// Each generated token's log-probability, with the top_logprobs (at most
  /// max_top_logprobs) most likely alternatives at its position. Engines
  /// without logits (simulated, null) refuse it as unsupported.
  bool logprobs = false;
  std::uint32_t top_logprobs = 0;
};

/// OpenAI's bound on top_logprobs (and engine::max_top_logprobs).
inline constexpr std::uint32_t max_top_logprobs = 20;

/// One alternative at a generated position.
struct top_logprob {
  token_id id = 0;
  std::string token;  // the token's bytes as the tokenizer decodes it (may be part of a character)
  float logprob = 0;  // natural log; -inf when impossible
};

/// A generated token's log-probability: log-softmax of the model's raw
/// logits (before temperature, top-k, top-p), and the most likely tokens at
/// its position, best first.
struct token_logprob {
  token_id id = 0;
  std::string token;
  float logprob = 0;
  std::vector<top_logprob> top;
};

/// Tokens produced since the last chunk, with their text. Text is valid UTF-8:
/// bytes of an incomplete character are held back to the next chunk.
struct token_chunk {
  std::vector<token_id> tokens;
  std::string text;
  std::uint32_t first_index = 0;  // index of tokens[0] among generated tokens
  /// One per token (same order) when the request asked for logprobs; else empty.
  std::vector<token_logprob> logprobs;
};

enum class finish_reason { stop, length, cancelled, error };

struct token_usage {
  std::uint32_t prompt_tokens = 0;
  std::uint32_t completion_tokens = 0;
  /// Prompt tokens whose KV came from the replica's prefix cache (OpenAI's
  /// prompt_tokens_details.cached_tokens); never more than prompt_tokens.
  std::uint32_t cached_tokens = 0;
};

struct request_timings {
  double ttft_ms = 0;  // request accepted -> first token
  double tpot_ms = 0;  // mean time per output token after the first
  double e2e_ms = 0;   // accepted -> finished
};

struct generate_result {
  finish_reason reason = finish_reason::stop;
  token_usage usage;
  request_timings timings;
  std::optional<error> err;  // set when reason == error (or a request was refused)
  std::string replica;       // which replica finished it (diagnostics)
  std::uint32_t resumes = 0; // times it moved to another replica mid-way (diagnostics)
  std::uint32_t retry_after_ms = 0;  // for an overloaded refusal: when to try again
};

/// Receives one request's stream. on_chunk is called zero or more times, then
/// on_done exactly once (also for refused requests: err set, no chunks).
class stream_sink {
 public:
  virtual ~stream_sink() = default;
  virtual void on_chunk(const token_chunk& chunk) = 0;
  virtual void on_done(const generate_result& result) = 0;
};

struct model_info {
  std::string name;        // deployment name
  std::string model_file;  // what it serves
  std::uint32_t replicas_ready = 0;
  std::uint32_t replicas_desired = 0;
  std::uint32_t context_length = 0;
  std::string tenant;  // who owns it; "": shared by every tenant
  std::string version;  // "1" for a plain deployment; what follows '@' for a rollout's
  /// Latency of its requests over the last minute, as the gateways saw it
  /// (the worst gateway's); < 0: no request finished in that time.
  double ttft_p50_ms = -1, ttft_p99_ms = -1;
  double tpot_p50_ms = -1, tpot_p99_ms = -1;
  /// What the file is (model/model_facts.hpp): general.architecture
  /// ("llama", "qwen2"; "simulated" for a preset), llama.cpp's file type
  /// ("Q4_K_M") or else the dominant weight type, tokenizer.ggml.model
  /// ("llama", "gpt2"). "" where unknown.
  std::string architecture;
  std::string quantization;
  std::string tokenizer;
  /// Speculative decoding (deploy_request::draft_model): the draft's GGUF
  /// path, "" when the deployment has none, and the tokens it proposes per
  /// step (the engine's default filled in; 0 without a draft).
  std::string draft_model;
  std::uint32_t draft_tokens = 0;
  /// How its requests are routed: the policy's name (the cluster's default
  /// filled in; "" from a server that does not say), and prefix_aware's load
  /// slack (deploy_request::prefix_slack_*), kept whatever the policy.
  std::string routing;
  std::uint64_t prefix_slack_tokens = 0;
  double prefix_slack_ratio = 0;
  double prefix_slack_s = 0;
};

struct replica_status {
  std::string id;
  std::string deployment;
  std::uint32_t slot = 0;
  std::uint64_t epoch = 0;
  std::string state;  // lifecycle state name
  std::uint32_t node = 0;
  std::uint32_t device = 0;
  std::uint32_t running = 0;
  std::uint32_t queued = 0;
  std::uint32_t kv_used_tokens = 0;
  std::uint32_t kv_capacity_tokens = 0;
  /// Every device it runs on (its tensor-parallel group), ascending; `device`
  /// is the first. Empty from a server that does not say: just `device`.
  std::vector<std::uint32_t> devices;
  /// Its measured speeds as it reports them with its load (smoothed over
  /// steps with prefill, and over decode-only steps): what `predictive`
  /// estimates with and `prefix_aware` sizes its slack in time by. 0: none yet.
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
};

struct device_status {
  std::uint32_t node = 0;
  std::uint32_t device = 0;
  std::string kind;  // "cpu" or "cuda"
  std::uint64_t memory_bytes = 0;
  std::uint64_t memory_used_bytes = 0;  // ledger
};

struct node_status {
  std::uint32_t id = 0;
  std::uint32_t rack = 0;
  std::string state;  // "healthy", "suspect", "down"
  std::string address;  // host:port the node serves on ("" in the embedded cluster)
  double clock_offset_ms = 0;  // its wall clock minus the controller's, estimated from heartbeats
  /// Drained: nothing new is placed on it until undrained ("" = not drained;
  /// else why: "node" for an operator's drain, "shutdown" for a stopping process).
  std::string drained;
  std::string region;  // the region it joined with ("" = none)
};

/// The latest rollout of a deployment (kept once finished).
struct rollout_status {
  std::string name;    // the deployment's plain name
  std::string status;  // the line `rollout status` prints
};

struct cluster_status {
  std::vector<node_status> nodes;
  std::vector<device_status> devices;
  std::vector<replica_status> replicas;
  std::vector<model_info> models;
  std::vector<rollout_status> rollouts;
};

struct deploy_request {
  std::string name;        // deployment name
  std::string model_file;  // GGUF path ("" = the default model)
  std::uint32_t replicas = 1;
  std::uint32_t kv_tokens = 0;  // per replica; 0 = default
  std::string routing;          // policy name; "" = default
  std::uint32_t max_replicas_per_node = 0;  // anti-affinity; 0 = spread evenly
  /// prefix_aware routing's load bound (cluster::prefix_aware_config): a
  /// replica holding a longer cached prefix is preferred while its queue is
  /// at most the least loaded one's + max(slack, ratio x that queue), slack
  /// being min(tokens, what the replica prefills in prefix_slack_s seconds;
  /// 0 = tokens alone). Read only by prefix_aware; the defaults are the config's.
  std::uint64_t prefix_slack_tokens = 2048;
  double prefix_slack_ratio = 0.25;
  double prefix_slack_s = 0.2;
  /// SHA-256 (hex) the model file must have; "" = not pinned. Nodes check it
  /// before loading, find the file in their --model-dir by it when the path
  /// is missing, and share one load among deployments of the same content.
  std::string model_sha256;
  /// The tenant that owns it: only that tenant's keys (and admin keys) see
  /// and reach it. "": shared by every tenant.
  std::string tenant;
  /// The warm pool: floor(replicas × percent / 100) more replicas (at most
  /// half) are loaded and stand by, taking no traffic, so that a failure or
  /// a scale-up takes a warm replica at once. 0: none.
  std::uint32_t warm_pool_percent = 10;
  /// Autoscaling, off while autoscale_max is 0 (runtime/cluster/autoscaler):
  /// the replica count moves within [autoscale_min, autoscale_max] to keep
  /// the metric at its target. 0 min with idle_to_zero_s: scaled to zero
  /// when idle, woken by the next request.
  std::uint32_t autoscale_min = 1;
  std::uint32_t autoscale_max = 0;
  std::string autoscale_metric;  // queue_depth (""), ttft_p99_ms or kv_utilization
  double autoscale_target = 0;   // 0: the metric's default
  std::uint32_t idle_to_zero_s = 0;
  /// The deployment's own chat template, as its TEXT (a built-in's or a
  /// file's, resolved where the deploy is issued; at most
  /// jinja::deployment_template_bytes_max bytes). It wins over the
  /// gateway's --chat-template and the model file's. "": none.
  std::string chat_template;
  /// Speculative decoding (engine/speculative.hpp): a draft model's GGUF
  /// path, with the deployment model's vocabulary and at least its context,
  /// whose proposals the model verifies; greedy outputs stay the model's own.
  /// Nodes load it through their model cache like the model, and its weights
  /// and KV cache count in each replica's memory. "": none.
  std::string draft_model;
  std::string draft_sha256;  // SHA-256 (hex) the draft file must have; "" = not pinned
  /// Tokens the draft proposes per step, in [1, engine::max_draft_tokens];
  /// 0: the engine's default. Only with draft_model.
  std::uint32_t draft_tokens = 0;
  /// Each replica runs tensor-parallel over this many devices of one node
  /// (1, 2, 4 or 8; 0 = 1): placement reserves memory on all of them and the
  /// replica runs on all of them.
  std::uint32_t tensor_parallel = 0;
  bool operator==(const deploy_request&) const = default;
};

/// Drain (or undrain) a node or a replica: no new requests; in-flight ones
/// finish or, past the deadline, resume elsewhere; the slots are placed
/// elsewhere. Only nodes can be undrained (a draining replica is replaced).
struct drain_request {
  enum class target : std::uint8_t { node, replica };
  target kind = target::node;
  std::uint64_t id = 0;
  std::uint32_t deadline_ms = 0;  // 0 = the controller's default
  bool undrain = false;
  bool operator==(const drain_request&) const = default;
};

struct drain_result {
  std::uint32_t replicas = 0;     // replicas that began draining now
  std::uint32_t deadline_ms = 0;  // the deadline they have
};

/// A rollout of a new model version (exaserve-cli rollout): start it, or
/// ask about or steer the one in progress.
struct rollout_request {
  enum class op : std::uint8_t { start, status, pause, resume, abort, promote };
  op what = op::status;
  std::string name;        // the deployment (its plain name)
  // start only:
  std::string model_file;
  std::string model_sha256;  // "" = not pinned
  std::string version;       // "" = the next number
  std::string steps;         // "" = 1,10,100
  std::uint32_t bake_s = 0;  // 0 = the controller's default
  std::uint32_t max_unavailable = 1;
  std::uint32_t surge = 1;
  std::uint32_t min_samples = 0;  // per version per step before a verdict; 0 = the default
  bool operator==(const rollout_request&) const = default;
};

struct rollout_result {
  std::string status;  // one line, starting with the phase
};

class gateway_backend {
 public:
  virtual ~gateway_backend() = default;

  /// Starts a request; the sink hears about it until on_done. Refusals
  /// (unknown model, overloaded, bad prompt) also arrive as on_done with err.
  virtual void generate(generate_request request, std::shared_ptr<stream_sink> sink) = 0;
  /// Cancels a request by id (a client went away); its KV blocks are freed.
  /// The sink then gets on_done(cancelled). Unknown ids are ignored.
  virtual void cancel(const std::string& request_id) = 0;

  virtual void models(std::function<void(std::vector<model_info>)> done) = 0;
  virtual void status(std::function<void(expected<cluster_status>)> done) = 0;
  /// Prometheus text exposition of the cluster's metrics.
  virtual void metrics(std::function<void(std::string)> done) = 0;
  /// True once every deployment has at least one ready replica.
  virtual void ready(std::function<void(bool)> done) = 0;

  virtual void deploy(deploy_request request, std::function<void(expected<void>)> done) = 0;
  virtual void undeploy(std::string name, std::function<void(expected<void>)> done) = 0;
  virtual void scale(std::string name, std::uint32_t replicas, std::function<void(expected<void>)> done) = 0;
  virtual void drain(drain_request request, std::function<void(expected<drain_result>)> done) = 0;
  virtual void rollout(rollout_request request, std::function<void(expected<rollout_result>)> done) = 0;
};

}  // namespace exa::api
