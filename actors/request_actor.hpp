#pragma once
// One actor per client request: tokenizes the prompt, asks the router for a
// replica, submits, turns the replica's tokens into the client's stream
// (valid UTF-8, stop sequences cut), and keeps time (TTFT, time per output
// token, end to end). It monitors -- not links -- its replica: when the
// replica dies or turns out fenced, the request resumes on another replica
// with the prompt plus the tokens already streamed and the same sampling
// state, so the client sees one continuous stream. Its deadline and a bounded
// retry budget make sure it always ends with a result or a clear error.

#include <caf/actor_addr.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "cluster/token_sequencer.hpp"
#include "api/gateway.hpp"
#include "model/utf8.hpp"
#include "template/chat_template.hpp"

namespace exa::actors {

struct cluster_metrics;

struct request_context {
  std::uint64_t number = 0;  // engine-level id, unique in the process
  api::generate_request request;
  std::shared_ptr<api::stream_sink> sink;
  std::shared_ptr<const model::llama_model> model;  // tokenizer; null for simulated models
  /// The deployment's chat template (compiled once by the router); null when
  /// it has none usable, with chat_error saying why.
  std::shared_ptr<const jinja::chat_renderer> chat;
  std::string chat_error;
  std::uint32_t vocab_size = 0;
  std::uint32_t context_length = 0;
  caf::actor router;
  std::uint32_t deadline_ms = 120000;     // when the request gives none
  std::uint32_t max_attempts = 4;         // replicas tried before giving up
  std::uint32_t submit_timeout_ms = 10000;
  std::uint32_t retry_backoff_ms = 50;    // first wait when no replica is free; doubles
  /// How long tokens that overtook earlier ones (the replica's route to this
  /// process changed mid-stream) wait for the gap to fill before the
  /// request gives up on that replica and resumes elsewhere.
  std::uint32_t reorder_timeout_ms = 2000;
  std::uint32_t effective_deadline_ms = 0;  // the request's own, or deadline_ms
  std::shared_ptr<cluster_metrics> metrics;  // may be null
  /// Block size of the deployment's prefix caches as the router knows it
  /// (replica_table::prefix_block_tokens): the request hashes its prompt's
  /// blocks with it for prefix-aware routing; 0: no hashes.
  std::uint32_t prefix_block_tokens = 0;
};

struct request_actor_state {
  request_context ctx;
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> stop_tokens;
  std::vector<std::int32_t> generated;
  std::vector<std::int32_t> unsent_tokens;  // generated, not yet in a chunk
  /// Logprobs the replica sent with tokens not yet in order, by token index
  /// (bounded like the sequencer's held chunks); and those of unsent_tokens.
  std::map<std::uint32_t, token_logprob_msg> pending_logprobs;
  std::vector<api::token_logprob> unsent_logprobs;
  cluster::token_sequencer sequencer;        // the current replica's stream, in order
  std::optional<finish_msg> held_finish;     // a finish that overtook its last tokens
  std::uint32_t stream = 0;                  // counts submits: which replica a gap timer is for
  bool gap_timer = false;                    // a reorder timeout is pending
  model::utf8_stream utf8;
  std::string held_text;  // text that may be the start of a stop sequence
  std::uint32_t sent_index = 0;
  caf::actor router;  // the current one: a restarted router replaces ctx.router
  std::uint32_t router_lookups = 0;  // since the router was lost
  caf::actor replica;
  cluster::replica_id replica_id = 0;
  std::vector<cluster::replica_id> tried;
  /// The prompt's block hashes for prefix-aware routing, computed at the
  /// first pick (a resumed request's prompt still starts with them).
  std::vector<std::uint64_t> prefix_hashes;
  bool prefix_hashed = false;
  std::uint32_t attempts = 0;
  bool picking = false;  // a pick_replica is out
  std::uint32_t backoff_ms = 0;
  std::uint32_t repicks = 0;  // waits for the router to learn a failed actor is gone
  std::vector<caf::actor_addr> failed_actors;  // replica actors that failed this request (bounded)
  bool done = false;
  std::uint32_t resumes = 0;  // moves to another replica after one was serving it
  /// Prompt tokens the finishing replica read from its prefix cache. A
  /// resumed request reports what the replica that finished it reused: its
  /// admission covered the prompt and the tokens already streamed, and only
  /// the prompt's share counts (capped at the prompt in finish()). The
  /// replicas left behind never said (the engine tells at finish only), and
  /// that admission produced the answer the client got.
  std::uint32_t cached_tokens = 0;
  std::string last_failure;  // why the last attempt failed, for the final error
  std::int64_t start_ns = 0, first_token_ns = 0;
  std::int64_t deadline_ns = 0;  // absolute, for a router that adopts us
  static inline const char* name = "request";
};

caf::behavior request_actor(caf::stateful_actor<request_actor_state>* self, request_context ctx);

}  // namespace exa::actors
