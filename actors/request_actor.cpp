#include "actors/request_actor.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "actors/cluster_metrics.hpp"
#include "actors/cluster_supervisor.hpp"
#include "cluster/fair_queue.hpp"
#include "cluster/rollout.hpp"
#include "engine/engine.hpp"
#include "model/llama_model.hpp"
#include "model/prefix_hash.hpp"

namespace exa::actors {
namespace {

using self_ptr = caf::stateful_actor<request_actor_state>*;

std::int64_t now_ns(self_ptr self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self->clock().now().time_since_epoch()).count();
}

void try_replica(self_ptr self);

// Ends the request once: tells the client, the router and the replica.
void finish(self_ptr self, api::finish_reason reason, std::optional<error> err = std::nullopt) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  if (st.replica && reason != api::finish_reason::stop && reason != api::finish_reason::length)
    self->send(st.replica, cancel_msg{st.ctx.number});
  api::generate_result r;
  r.reason = reason;
  r.err = std::move(err);
  r.usage = {static_cast<std::uint32_t>(st.prompt.size()), static_cast<std::uint32_t>(st.generated.size()),
             std::min(st.cached_tokens, static_cast<std::uint32_t>(st.prompt.size()))};
  const std::int64_t end = now_ns(self);
  r.timings.e2e_ms = (end - st.start_ns) / 1e6;
  if (st.first_token_ns) {
    r.timings.ttft_ms = (st.first_token_ns - st.start_ns) / 1e6;
    if (st.generated.size() > 1) r.timings.tpot_ms = (end - st.first_token_ns) / 1e6 / (st.generated.size() - 1);
  }
  r.replica = st.replica_id ? std::to_string(st.replica_id) : "";
  r.resumes = st.resumes;
  if (const auto& m = st.ctx.metrics) {
    const std::string& model = st.ctx.request.model;
    const char* outcome = reason == api::finish_reason::error       ? "error"
                          : reason == api::finish_reason::cancelled ? "cancelled"
                                                                    : "completed";
    const std::string& tenant = st.ctx.request.tenant;
    cluster_metrics::series(m->requests, model, tenant, outcome)->inc();
    cluster_metrics::series(m->prompt_tokens, model)->inc(st.prompt.size());
    cluster_metrics::series(m->generated_tokens, model)->inc(st.generated.size());
    // The router resolved the model to the deployment that serves it: NAME,
    // or NAME@V for a version a rollout added.
    const auto deployment = cluster::split_version(model).base;
    const std::string version = cluster::version_of(model);
    const auto latency = [&](metrics::histogram_family* f) {
      return cluster_metrics::series(f, model, deployment, version, tenant);
    };
    latency(m->e2e_ms)->observe(r.timings.e2e_ms);
    if (st.first_token_ns) latency(m->ttft_ms)->observe(r.timings.ttft_ms);
    if (st.generated.size() > 1) latency(m->tpot_ms)->observe(r.timings.tpot_ms);
  }
  spdlog::debug("event=request_done request={} reason={} tokens={} ttft_ms={:.2f} e2e_ms={:.2f} replica={} attempts={}{}",
                st.ctx.request.request_id, static_cast<int>(reason), st.generated.size(), r.timings.ttft_ms,
                r.timings.e2e_ms, r.replica, st.attempts, r.err ? " error=\"" + to_string(*r.err) + "\"" : "");
  // The evidence a rollout judges versions by (the router keeps it only for
  // deployments under rollout). A cancelled request says nothing of either,
  // nor does one the caller got wrong.
  const bool callers_fault = r.err && r.err->code == errc::invalid_argument;
  if (st.router && reason != api::finish_reason::cancelled && !callers_fault)
    self->send(st.router, request_sample{st.ctx.request.model, reason != api::finish_reason::error, r.timings.ttft_ms,
                                         r.timings.tpot_ms});
  st.ctx.sink->on_done(r);
  // A monitor outlives its observer in CAF: the replica would keep a
  // reference to this finished actor, and with it the actor's memory.
  if (st.replica) self->demonitor(st.replica);
  if (st.router) self->demonitor(st.router);  // the same holds for the router
  self->quit();
}

// Releases as much text as can be: everything but a tail that might still
// become a stop sequence. Returns true when a stop sequence ended the text.
bool release_text(request_actor_state& st, std::string& out) {
  const auto& stops = st.ctx.request.stop;
  for (const auto& s : stops) {
    if (s.empty()) continue;
    const auto pos = st.held_text.find(s);
    if (pos != std::string::npos) {
      out += st.held_text.substr(0, pos);
      st.held_text.clear();
      return true;
    }
  }
  std::size_t keep = 0;
  for (const auto& s : stops)
    for (std::size_t n = std::min(s.size() - 1, st.held_text.size()); n > keep; --n)
      if (st.held_text.compare(st.held_text.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  out += st.held_text.substr(0, st.held_text.size() - keep);
  st.held_text.erase(0, st.held_text.size() - keep);
  return false;
}

void emit(self_ptr self, std::string text) {
  auto& st = self->state;
  if (text.empty() && st.unsent_tokens.empty()) return;
  api::token_chunk chunk;
  chunk.tokens = std::move(st.unsent_tokens);
  st.unsent_tokens.clear();
  chunk.logprobs = std::move(st.unsent_logprobs);
  st.unsent_logprobs.clear();
  chunk.first_index = st.sent_index;
  st.sent_index += static_cast<std::uint32_t>(chunk.tokens.size());
  chunk.text = std::move(text);
  st.ctx.sink->on_chunk(chunk);
}

// Fired reorder_timeout_ms after a gap opened in the current replica's stream.
using reorder_atom = caf::atom_constant<caf::atom("reorder")>;

void failover(self_ptr self, const std::string& why);
void on_finish(self_ptr self, const finish_msg& m);

// Waits reorder_timeout_ms for the gap at the sequencer's current position.
void arm_gap_timer(self_ptr self) {
  auto& st = self->state;
  if (st.gap_timer) return;
  st.gap_timer = true;
  self->delayed_send(self, std::chrono::milliseconds(st.ctx.reorder_timeout_ms), reorder_atom::value, st.stream,
                     st.sequencer.next());
}

// Leaves a replica whose stream cannot be put back in order: it is told to
// stop, and the request resumes elsewhere from the tokens it has in order.
void abandon_stream(self_ptr self, const std::string& why) {
  auto& st = self->state;
  spdlog::warn("event=request_stream_gap request={} replica={} have={} held={} reason=\"{}\"", st.ctx.request.request_id,
               st.replica_id, st.generated.size(), st.sequencer.held(), why);
  if (st.replica) self->send(st.replica, cancel_msg{st.ctx.number});
  failover(self, why);
}

void on_reorder_timeout(self_ptr self, std::uint32_t stream, std::uint32_t at) {
  auto& st = self->state;
  if (stream != st.stream) return;  // a replica we left
  st.gap_timer = false;
  if (st.done || (!st.sequencer.gap() && !st.held_finish)) return;
  if (st.sequencer.next() != at) return arm_gap_timer(self);  // it moved on; a later gap gets its own wait
  abandon_stream(self, "tokens from index " + std::to_string(at) + " of replica " + std::to_string(st.replica_id) +
                           " did not arrive within " + std::to_string(st.ctx.reorder_timeout_ms) +
                           " ms while later ones did");
}

// The logprobs of generated token `index`, with each token's text, for the
// client; false when the replica sent none for it.
bool take_logprobs(request_actor_state& st, std::uint32_t index, model::token_id token,
                   const model::tokenizer* tok) {
  auto it = st.pending_logprobs.find(index);
  if (it == st.pending_logprobs.end()) return false;
  const token_logprob_msg& lp = it->second;
  // Special tokens by their text: an alternative "<|eot_id|>" says more
  // than an empty string (the generated text itself never shows them).
  const auto text = [&](model::token_id id) { return tok ? tok->decode_token(id, /*special=*/true) : std::string(); };
  api::token_logprob out{token, text(token), lp.logprob, {}};
  for (std::size_t i = 0; i < lp.top_ids.size() && i < lp.top_logprobs.size(); ++i)
    out.top.push_back({lp.top_ids[i], text(lp.top_ids[i]), lp.top_logprobs[i]});
  st.unsent_logprobs.push_back(std::move(out));
  st.pending_logprobs.erase(it);
  return true;
}

void on_tokens(self_ptr self, const token_msg& m) {
  auto& st = self->state;
  if (st.done || self->current_sender() != st.replica.address()) return;  // a replica we left
  // Logprobs wait by index until their tokens are in order; those of tokens
  // the request already has (a resumed replica re-sending) are never needed.
  if (st.ctx.request.logprobs)
    for (std::size_t i = 0; i < m.logprobs.size() && i < m.tokens.size(); ++i)
      if (m.first_index + i >= st.sequencer.next())
        st.pending_logprobs.insert_or_assign(m.first_index + static_cast<std::uint32_t>(i), m.logprobs[i]);
  // In order, whatever route each chunk took; a resumed replica's re-sent
  // tokens are dropped.
  auto in_order = st.sequencer.offer(m.first_index, m.tokens);
  if (in_order.overflow)
    return abandon_stream(self, "replica " + std::to_string(st.replica_id) + " sent " +
                                    std::to_string(st.sequencer.held()) + " chunks past a gap at token " +
                                    std::to_string(st.sequencer.next()));
  if (st.sequencer.gap()) arm_gap_timer(self);
  if (!in_order.ready.empty()) {
    if (!st.first_token_ns) st.first_token_ns = now_ns(self);
    const model::tokenizer* tok = st.ctx.model ? &st.ctx.model->tokenizer() : nullptr;
    for (const auto t : in_order.ready) {
      const auto index = static_cast<std::uint32_t>(st.generated.size());
      if (st.ctx.request.logprobs && !take_logprobs(st, index, t, tok))
        return finish(self, api::finish_reason::error,
                      error{errc::internal, "replica " + std::to_string(st.replica_id) + " sent token " +
                                                std::to_string(index) + " without the logprobs asked for"});
      st.generated.push_back(t);
      st.unsent_tokens.push_back(t);
      if (tok) st.held_text += st.utf8.push(tok->decode_token(t));  // simulated models have no text
    }
    std::string out;
    const bool stopped = release_text(st, out);
    emit(self, std::move(out));
    if (stopped) {
      // The replica would go on to max_tokens for nobody: stop it now.
      if (st.replica) self->send(st.replica, cancel_msg{st.ctx.number});
      return finish(self, api::finish_reason::stop);
    }
  }
  // What stays pending belongs to held chunks past a gap (bounded with them).
  std::erase_if(st.pending_logprobs, [&](const auto& e) { return e.first < st.sequencer.next(); });
  if (st.held_finish && st.sequencer.complete(st.held_finish->generated)) {
    const finish_msg f = *st.held_finish;
    st.held_finish.reset();
    on_finish(self, f);
  }
}

void on_finish(self_ptr self, const finish_msg& m) {
  auto& st = self->state;
  if (st.done || self->current_sender() != st.replica.address()) return;
  const auto reason = static_cast<engine::finish_reason>(m.reason);
  if (reason == engine::finish_reason::cancelled) {  // the replica dropped us: go elsewhere
    st.tried.push_back(st.replica_id);
    return try_replica(self);
  }
  if (!st.sequencer.complete(m.generated)) {  // it overtook its last tokens: wait for them
    st.held_finish = m;
    arm_gap_timer(self);
    return;
  }
  st.held_text += st.utf8.flush();
  std::string out;
  release_text(st, out);
  out += st.held_text;  // the stream ended: a partial stop sequence is just text
  st.held_text.clear();
  emit(self, std::move(out));
  st.cached_tokens = m.cached_tokens;
  self->send(st.router, replica_outcome{st.replica_id, true});
  if (reason == engine::finish_reason::nonfinite_logits) {
    // The same file gives the same numbers on any replica: no resume.
    spdlog::warn("event=request_nonfinite_logits request={} replica={} generated={}", st.ctx.request.request_id,
                 st.replica_id, st.generated.size());
    return finish(self, api::finish_reason::error,
                  error{errc::internal, engine::nonfinite_logits_message(static_cast<std::uint32_t>(st.generated.size()))});
  }
  finish(self, reason == engine::finish_reason::stop ? api::finish_reason::stop : api::finish_reason::length);
}

// Leaves the current replica (if any) and looks for the next one.
void failover(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.done) return;
  spdlog::info("event=request_resume request={} from_replica={} generated={} reason=\"{}\"", st.ctx.request.request_id,
               st.replica_id, st.generated.size(), why);
  st.last_failure = why;
  if (st.replica) {
    self->demonitor(st.replica);
    if (st.failed_actors.size() < 64) st.failed_actors.push_back(st.replica.address());
  }
  if (st.replica_id) {
    ++st.resumes;
    st.tried.push_back(st.replica_id);
    self->send(st.router, replica_outcome{st.replica_id, false});
  }
  if (st.ctx.metrics) cluster_metrics::series(st.ctx.metrics->resumes, st.ctx.request.model)->inc();
  st.replica = nullptr;
  st.replica_id = 0;
  try_replica(self);
}

void submit(self_ptr self, const picked_replica& p) {
  auto& st = self->state;
  st.replica = p.handle;
  st.replica_id = p.id;
  ++st.stream;
  st.gap_timer = false;
  st.sequencer.restart(static_cast<std::uint32_t>(st.generated.size()));
  st.pending_logprobs.clear();  // they went with the last replica's held chunks
  st.held_finish.reset();
  self->monitor(p.handle);
  const auto& r = st.ctx.request;
  submit_msg m{st.ctx.number, st.prompt, st.generated, r.max_tokens, r.sampling.temperature, r.sampling.top_p,
               r.sampling.top_k, r.sampling.seed, st.stop_tokens, p.epoch, r.request_id, r.logprobs, r.top_logprobs};
  // Who asked, so the replica can schedule across tenants (a priority the
  // router could not parse is interactive there too).
  m.tenant = r.tenant;
  m.tenant_weight = std::isfinite(r.tenant_weight) && r.tenant_weight > 0 ? r.tenant_weight : 1.0;  // as the router reads it
  const auto priority = cluster::parse_priority_class(r.priority.empty() ? "interactive" : r.priority);
  m.priority = static_cast<std::uint8_t>(priority ? *priority : cluster::priority_class::interactive);
  // Accepting (not finishing) a request is quick; a replica that does not
  // even accept it within submit_timeout_ms is treated as failed for it.
  self->request(p.handle, std::chrono::milliseconds(st.ctx.submit_timeout_ms), std::move(m))
      .then([](ok_atom) {},
            [=, handle = p.handle](const caf::error& err) {
              // A replica we already left (its down message came first, and
              // the request moved on): its refusal is old news. Failing over
              // again would leave the replica now serving us and could
              // submit twice to one replica.
              if (self->state.replica != handle) return;
              const error e = from_caf(err);
              // The caller's mistake, or a feature this deployment's engine
              // lacks (logprobs on a simulated one): another replica of it
              // would answer the same.
              if (e.code == errc::invalid_argument || e.code == errc::unsupported)
                return finish(self, api::finish_reason::error, e);
              failover(self, e.message);
            });
}

// Picks that may wait for the router to learn that an actor which failed
// this request is gone (see try_replica), per request.
constexpr std::uint32_t max_repicks = 8;
// Prompt blocks hashed for routing (128 Ki tokens at 16 per block): a
// longer shared prefix is rare and gains little more.
constexpr std::size_t max_prefix_blocks = 8192;

void try_replica(self_ptr self) {
  auto& st = self->state;
  if (st.done || st.picking) return;
  if (st.attempts >= st.ctx.max_attempts)
    return finish(self, api::finish_reason::error,
                  error{errc::unavailable, "gave up after " + std::to_string(st.attempts) + " replicas failed"});
  ++st.attempts;
  pick_replica pick{st.ctx.request.model, static_cast<std::uint32_t>(st.prompt.size() + st.generated.size()),
                    st.ctx.request.max_tokens - static_cast<std::uint32_t>(st.generated.size()), st.tried};
  if (!st.prefix_hashed) {
    // Hashed here, once, so the router's one thread does not hash prompts.
    st.prefix_hashed = true;
    st.prefix_hashes = model::prefix_block_hashes(st.prompt, st.ctx.prefix_block_tokens, max_prefix_blocks);
  }
  pick.prefix_block_tokens = st.prefix_hashes.empty() ? 0 : st.ctx.prefix_block_tokens;
  pick.prefix_hashes = st.prefix_hashes;
  if (!st.router) {  // between routers: look again shortly
    --st.attempts;
    self->delayed_send(self, std::chrono::milliseconds(st.ctx.retry_backoff_ms), tick_atom::value);
    return;
  }
  // One pick at a time: a backoff tick and a failover must not both pick.
  st.picking = true;
  self->request(st.router, std::chrono::milliseconds(st.ctx.submit_timeout_ms), std::move(pick))
      .then(
          [=](const picked_replica& p) {
            auto& s = self->state;
            s.picking = false;
            if (s.done) return;
            // The router handed back the very actor that just failed this
            // request: it has not heard yet that the actor is gone (its
            // events are on the way). Submitting at once would fail at once
            // and burn the whole budget in a millisecond. Wait a growing
            // backoff and pick again, a few times, without spending an
            // attempt; then try it anyway. (A replica restarted in place
            // keeps its id but is a new actor: that one is used at once.)
            const bool failed_actor = std::find(s.failed_actors.begin(), s.failed_actors.end(), p.handle.address()) !=
                                      s.failed_actors.end();
            if (failed_actor && s.repicks < max_repicks) {
              ++s.repicks;
              --s.attempts;
              s.backoff_ms = s.backoff_ms == 0 ? s.ctx.retry_backoff_ms : std::min(s.backoff_ms * 2, 2000u);
              self->delayed_send(self, std::chrono::milliseconds(s.backoff_ms), tick_atom::value);
              return;
            }
            submit(self, p);
          },
            [=](const caf::error& err) {
              self->state.picking = false;
              if (self->state.done) return;
              const error e = from_caf(err);
              if (e.code == errc::not_found) return finish(self, api::finish_reason::error, e);
              // No capacity right now: wait and try again, until the deadline
              // ends it. Waiting does not use up the replica budget.
              auto& s = self->state;
              s.last_failure = e.message;
              --s.attempts;
              s.tried.clear();
              s.backoff_ms = s.backoff_ms == 0 ? s.ctx.retry_backoff_ms : std::min(s.backoff_ms * 2, 2000u);
              self->delayed_send(self, std::chrono::milliseconds(s.backoff_ms), tick_atom::value);
            });
}

// Looks up the router that replaced a crashed one (the supervisor restarts
// it and registers it by name), at most 200 times 10 ms apart.
void find_router(self_ptr self) {
  auto& st = self->state;
  if (st.done || st.router) return;
  auto r = caf::actor_cast<caf::actor>(self->home_system().registry().get(router_atom::value));
  if (!r || r == st.ctx.router) {
    if (++st.router_lookups >= 200)
      return finish(self, api::finish_reason::error, error{errc::unavailable, "the router was lost and did not come back"});
    self->delayed_send(self, std::chrono::milliseconds(10), router_atom::value);
    return;
  }
  st.router = r;
  st.ctx.router = r;
  self->monitor(r);
  self->send(r, adopt_request{st.ctx.request.request_id, st.ctx.request.model, st.deadline_ns});
  spdlog::info("event=request_router_found request={}", st.ctx.request.request_id);
}

// The tokens that end generation: the one place that decides it. Every
// token llama.cpp treats as end of generation (is_eog: eos, eot, eom and the
// file's <|im_end|>-like ones), so a Llama 3 chat stops at <|eot_id|>.
std::vector<model::token_id> end_of_generation_tokens(const model::tokenizer& tok) { return tok.eog_ids(); }

// A conversation rendered with the deployment's chat template and tokenized
// the way llama.cpp's server does (common/chat.cpp): a leading bos_token text
// is dropped when the tokenizer adds BOS itself (so there is one BOS, not
// two), then the text is tokenized adding the file's BOS/EOS and parsing
// special tokens, since the template writes them as text. A template that
// raises is the client's to fix: its message comes back as a 400.
expected<std::vector<model::token_id>> chat_prompt_ids(const request_context& ctx, std::int64_t now_unix_s) {
  const auto& r = ctx.request;
  if (!ctx.chat)
    return make_error(errc::unsupported, "model '" + r.model + "' cannot render chat messages: " + ctx.chat_error);
  jinja::list messages;
  messages.reserve(r.messages->size());
  for (const auto& msg : *r.messages) messages.push_back(jinja::make_message(msg.role, msg.content));
  jinja::chat_inputs in;
  in.messages = jinja::value(std::move(messages));
  in.add_generation_prompt = r.add_generation_prompt;
  auto text = ctx.chat->render(in, now_unix_s);
  if (!text) return std::unexpected(text.error());
  const auto& tok = ctx.model->tokenizer();
  const std::string prompt = jinja::strip_special_affixes(std::move(*text), ctx.chat->bos_token(), tok.add_bos(),
                                                          ctx.chat->eos_token(), tok.add_eos());
  return tok.encode(prompt, /*add_special=*/true, /*parse_special=*/true);
}

// Validates and tokenizes; an error here is the client's to fix.
// `now_unix_s` is the wall clock, for templates that print today's date.
expected<void> prepare(request_actor_state& st, std::int64_t now_unix_s) {
  const auto& r = st.ctx.request;
  const model::llama_model* m = st.ctx.model.get();
  if (r.prompt_ids) {
    st.prompt = *r.prompt_ids;
  } else if (r.messages && m) {
    auto ids = chat_prompt_ids(st.ctx, now_unix_s);
    if (!ids) return std::unexpected(ids.error());
    st.prompt = std::move(*ids);
  } else if (m) {
    auto ids = m->tokenizer().encode(r.prompt_text.value_or(""), true);
    if (!ids) return std::unexpected(ids.error());
    st.prompt = std::move(*ids);
  } else {
    return make_error(errc::unsupported, "model '" + r.model + "' is simulated and has no tokenizer: send token ids");
  }
  if (r.logprobs && !m)
    return make_error(errc::unsupported, "model '" + r.model + "' is simulated: it has no logits, so no logprobs");
  if (st.prompt.empty()) return make_error(errc::invalid_argument, "prompt is empty");
  for (const auto t : st.prompt)
    if (t < 0 || static_cast<std::uint32_t>(t) >= st.ctx.vocab_size)
      return make_error(errc::invalid_argument, "prompt token id " + std::to_string(t) +
                                                    " is outside the vocabulary of model '" + r.model + "'");
  if (st.prompt.size() + std::uint64_t{r.max_tokens} > st.ctx.context_length)
    return make_error(errc::invalid_argument,
                      "prompt (" + std::to_string(st.prompt.size()) + " tokens) + max_tokens (" +
                          std::to_string(r.max_tokens) + ") exceeds the context length " +
                          std::to_string(st.ctx.context_length) + " of model '" + r.model + "'");
  if (!r.ignore_eos && m) st.stop_tokens = end_of_generation_tokens(m->tokenizer());
  return {};
}

}  // namespace

caf::behavior request_actor(caf::stateful_actor<request_actor_state>* self, request_context ctx) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.start_ns = now_ns(self);
  st.router = st.ctx.router;
  st.deadline_ns = st.start_ns + std::int64_t{st.ctx.effective_deadline_ms ? st.ctx.effective_deadline_ms
                                                                          : st.ctx.deadline_ms} * 1000000;
  if (st.router) self->monitor(st.router);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source == s.replica.address()) return failover(self, "replica went down: " + caf::to_string(dm.reason));
    if (s.router && dm.source == s.router.address()) {
      // Our router crashed: its deadline sweep and cancel routing went with
      // it. Find its successor and hand ourselves over.
      spdlog::warn("event=request_router_lost request={} reason=\"{}\"", s.ctx.request.request_id,
                   caf::to_string(dm.reason));
      s.router = nullptr;
      s.router_lookups = 0;
      self->send(self, router_atom::value);
    }
  });
  if (auto ok = prepare(st, std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch()).count()); !ok) {
    finish(self, api::finish_reason::error, ok.error());
    return {};
  }
  // The deadline is enforced by the router's sweep (one timer for all
  // requests; a timer per request would hold every finished actor alive
  // until it fired).
  try_replica(self);
  return {
      [=](const token_msg& m) { on_tokens(self, m); },
      [=](const finish_msg& m) { on_finish(self, m); },
      [=](tick_atom) { try_replica(self); },
      [=](reorder_atom, std::uint32_t stream, std::uint32_t at) { on_reorder_timeout(self, stream, at); },
      [=](router_atom) { find_router(self); },
      [=](deadline_atom) {
        const auto& s = self->state;
        finish(self, api::finish_reason::error,
               error{errc::deadline_exceeded,
                     "request deadline passed after " + std::to_string(s.generated.size()) + " tokens" +
                         (s.last_failure.empty() ? std::string() : " (last failure: " + s.last_failure + ")")});
      },
      [=](const cancel_request&) {
        finish(self, api::finish_reason::cancelled);
      },
  };
}

}  // namespace exa::actors
