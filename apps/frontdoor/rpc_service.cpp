#include "rpc_service.hpp"

#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <string>

#include "error_mapping.hpp"
#include "schemas/exaserve.capnp.h"
#include "validate.hpp"

namespace exa::door {

namespace {

// --- conversions at the edge ------------------------------------------------

api::generate_request from_rpc(rpc::GenerateRequest::Reader r) {
  api::generate_request out;
  out.model = r.getModel();
  auto prompt = r.getPrompt();
  if (prompt.isText()) {
    out.prompt_text = std::string(prompt.getText());
  } else {
    std::vector<api::token_id> ids;
    for (auto id : prompt.getTokenIds()) ids.push_back(id);
    out.prompt_ids = std::move(ids);
  }
  out.max_tokens = r.getMaxTokens();
  auto s = r.getSampling();
  out.sampling.temperature = s.getTemperature();
  out.sampling.top_p = s.getTopP();
  out.sampling.top_k = s.getTopK();
  out.sampling.seed = s.getSeed();
  for (auto stop : r.getStop()) out.stop.emplace_back(stop);
  out.ignore_eos = r.getIgnoreEos();
  out.deadline_ms = r.getDeadlineMs();
  if (r.getPriority() == rpc::Priority::BATCH) out.priority = "batch";
  out.user = r.getUser();
  return out;
}

rpc::FinishReason to_rpc(api::finish_reason r) {
  switch (r) {
    case api::finish_reason::stop: return rpc::FinishReason::STOP;
    case api::finish_reason::length: return rpc::FinishReason::LENGTH;
    case api::finish_reason::cancelled: return rpc::FinishReason::CANCELLED;
    case api::finish_reason::error: return rpc::FinishReason::ERROR;
  }
  return rpc::FinishReason::ERROR;
}

const char* finish_name(api::finish_reason r) {
  switch (r) {
    case api::finish_reason::stop: return "stop";
    case api::finish_reason::length: return "length";
    case api::finish_reason::cancelled: return "cancelled";
    case api::finish_reason::error: return "error";
  }
  return "unknown";
}

void set_error(rpc::Error::Builder out, const error& e) {
  const auto code = to_string(e.code);
  out.setCode(capnp::Text::Reader(code.data(), code.size()));
  out.setMessage(e.message);
}

void fill(rpc::GenerateResult::Builder out, const api::generate_result& r, const std::string& request_id) {
  out.setFinishReason(to_rpc(r.reason));
  out.initUsage().setPromptTokens(r.usage.prompt_tokens);
  out.getUsage().setCompletionTokens(r.usage.completion_tokens);
  out.getUsage().setCachedTokens(r.usage.cached_tokens);
  auto t = out.initTimings();
  t.setTtftMs(r.timings.ttft_ms);
  t.setTpotMs(r.timings.tpot_ms);
  t.setE2eMs(r.timings.e2e_ms);
  if (r.err) set_error(out.initError(), *r.err);
  out.setReplica(r.replica);
  out.setRequestId(request_id);
}

void fill(rpc::ModelInfo::Builder out, const api::model_info& m) {
  out.setName(m.name);
  out.setModelFile(m.model_file);
  out.setReplicasReady(m.replicas_ready);
  out.setVersion(m.version);
  out.setReplicasDesired(m.replicas_desired);
  out.setContextLength(m.context_length);
  out.setTenant(m.tenant);
  out.setTtftP50Ms(m.ttft_p50_ms);
  out.setTtftP99Ms(m.ttft_p99_ms);
  out.setTpotP50Ms(m.tpot_p50_ms);
  out.setTpotP99Ms(m.tpot_p99_ms);
  out.setArchitecture(m.architecture);
  out.setQuantization(m.quantization);
  out.setTokenizer(m.tokenizer);
  out.setDraftModel(m.draft_model);
  out.setDraftTokens(m.draft_tokens);
  out.setRouting(m.routing);
  out.setPrefixSlackTokens(m.prefix_slack_tokens);
  out.setPrefixSlackRatio(m.prefix_slack_ratio);
  out.setPrefixSlackS(m.prefix_slack_s);
}

void fill(rpc::ReplicaStatus::Builder out, const api::replica_status& r) {
  out.setId(r.id);
  out.setDeployment(r.deployment);
  out.setSlot(r.slot);
  out.setEpoch(r.epoch);
  out.setState(r.state);
  out.setNode(r.node);
  out.setDevice(r.device);
  out.setRunning(r.running);
  out.setQueued(r.queued);
  out.setKvUsedTokens(r.kv_used_tokens);
  out.setKvCapacityTokens(r.kv_capacity_tokens);
  auto devices = out.initDevices(static_cast<unsigned>(r.devices.size()));
  for (unsigned i = 0; i < devices.size(); ++i) devices.set(i, r.devices[i]);
  out.setPrefillTokensPerS(r.prefill_tokens_per_s);
  out.setDecodeTokensPerS(r.decode_tokens_per_s);
}

void fill(rpc::ClusterStatus::Builder out, const api::cluster_status& s) {
  auto nodes = out.initNodes(static_cast<unsigned>(s.nodes.size()));
  for (unsigned i = 0; i < nodes.size(); ++i) {
    nodes[i].setId(s.nodes[i].id);
    nodes[i].setRack(s.nodes[i].rack);
    nodes[i].setState(s.nodes[i].state);
    nodes[i].setAddress(s.nodes[i].address);
    nodes[i].setClockOffsetMs(s.nodes[i].clock_offset_ms);
    nodes[i].setDrained(s.nodes[i].drained);
    nodes[i].setRegion(s.nodes[i].region);
  }
  auto devices = out.initDevices(static_cast<unsigned>(s.devices.size()));
  for (unsigned i = 0; i < devices.size(); ++i) {
    const auto& d = s.devices[i];
    devices[i].setNode(d.node);
    devices[i].setDevice(d.device);
    devices[i].setKind(d.kind);
    devices[i].setMemoryBytes(d.memory_bytes);
    devices[i].setMemoryUsedBytes(d.memory_used_bytes);
  }
  auto replicas = out.initReplicas(static_cast<unsigned>(s.replicas.size()));
  for (unsigned i = 0; i < replicas.size(); ++i) fill(replicas[i], s.replicas[i]);
  auto models = out.initModels(static_cast<unsigned>(s.models.size()));
  for (unsigned i = 0; i < models.size(); ++i) fill(models[i], s.models[i]);
  auto rollouts = out.initRollouts(static_cast<unsigned>(s.rollouts.size()));
  for (unsigned i = 0; i < rollouts.size(); ++i) {
    rollouts[i].setName(s.rollouts[i].name);
    rollouts[i].setStatus(s.rollouts[i].status);
  }
}

// --- Gateway -----------------------------------------------------------------

/// Client tags (clientRequestId) of one Gateway's in-flight calls -> the
/// server's request ids. Shared with the calls, which may outlive the
/// Gateway object's last reference.
using tag_map = std::map<std::string, std::string>;

/// Streams one request's chunks to the client's TokenSink, one message in
/// flight at a time (the stream promise is the client's backpressure).
struct rpc_stream {
  rpc_stream(std::shared_ptr<door_context> c, kj::Own<generate_call> g, rpc::TokenSink::Client s,
             std::shared_ptr<tag_map> t, std::string g_tag)
      : ctx(std::move(c)), call(kj::mv(g)), sink(kj::mv(s)), tags(std::move(t)), tag(std::move(g_tag)) {
    ++ctx->counters.rpc_generate_in_flight;
    if (!tag.empty()) (*tags)[tag] = call->id();
  }
  rpc_stream(const rpc_stream&) = delete;
  rpc_stream& operator=(const rpc_stream&) = delete;
  ~rpc_stream() {
    --ctx->counters.rpc_generate_in_flight;
    if (!tag.empty()) tags->erase(tag);
  }

  kj::Promise<api::generate_result> run() {
    return call->next().then([this](request_channel::batch b) -> kj::Promise<api::generate_result> {
      // Fell behind: what is buffered cannot reach the client any sooner
      // than what was stuck before it, so report the error now.
      if (b.done && !b.backend_finished) return kj::mv(*b.done);
      auto done = std::move(b.done);
      if (!send(b.chunks)) {
        if (done) return kj::mv(*done);
        return run();
      }
      // One message in flight: the next waits for the client's flow
      // control, unless the client stalls until the buffer overflows.
      auto sent = pending_send.exclusiveJoin(call->when_overflowed());
      return sent.then([this, done = std::move(done)]() mutable -> kj::Promise<api::generate_result> {
        if (done) return kj::mv(*done);
        return run();
      });
    });
  }

  /// Coalesces what the backend made while the previous message was in
  /// flight into one TokenChunk; false when there is nothing to send.
  bool send(const std::vector<api::token_chunk>& chunks) {
    std::size_t tokens = 0;
    std::string text;
    for (const auto& c : chunks) {
      tokens += c.tokens.size();
      text += c.text;
    }
    if (tokens == 0 && text.empty()) return false;
    auto req = sink.chunkRequest();
    auto out = req.initChunk();
    auto ids = out.initTokens(static_cast<unsigned>(tokens));
    unsigned i = 0;
    for (const auto& c : chunks)
      for (auto id : c.tokens) ids.set(i++, id);
    out.setText(text);
    out.setFirstIndex(chunks.front().first_index);
    pending_send = req.send();
    return true;
  }

  std::shared_ptr<door_context> ctx;
  kj::Own<generate_call> call;
  rpc::TokenSink::Client sink;
  std::shared_ptr<tag_map> tags;
  std::string tag;
  kj::Promise<void> pending_send = nullptr;
};

class gateway_impl final : public rpc::Gateway::Server {
 public:
  /// `tenant`: the scope of the key it was asked for with ("" = every tenant).
  /// `label`: the key's tenant, admin or not, whose limits apply.
  gateway_impl(std::shared_ptr<door_context> ctx, std::string tenant, std::string label)
      : ctx_(std::move(ctx)), tenant_(std::move(tenant)), label_(std::move(label)) {}

 protected:
  kj::Promise<void> generate(GenerateContext context) override {
    // A client that cancels the call (or disconnects) drops this promise,
    // which releases the generate_call and cancels the backend request.
    context.allowCancellation();
    auto params = context.getParams();
    auto request = params.getRequest();
    std::string tag = request.getClientRequestId();
    if (!tag.empty() && tags_->count(tag) != 0)
      return to_rpc_exception(error{errc::invalid_argument,
                                    fmt::format("clientRequestId '{}' is already used by an in-flight call", tag)});
    if (ctx_->counters.rpc_generate_in_flight >= rpc_generate_in_flight_max)
      return to_rpc_exception(error{errc::overloaded, fmt::format("more than {} generate calls in flight",
                                                                  rpc_generate_in_flight_max)});
    auto gen = from_rpc(request);
    gen.tenant = tenant_;
    if (auto bad = validate_generate(gen, ctx_->config.limits)) {
      api::generate_result refused;
      refused.reason = api::finish_reason::error;
      refused.err = *bad;
      fill(context.getResults().initResult(), refused, "");
      return kj::READY_NOW;
    }
    auto admitted = start_limited(ctx_, std::move(gen), label_);
    if (!admitted) {
      api::generate_result refused;
      refused.reason = api::finish_reason::error;
      refused.err = error{admitted.error().code, admitted.error().message};
      fill(context.getResults().initResult(), refused, "");
      return kj::READY_NOW;
    }
    auto call = kj::mv(*admitted);
    const auto started = std::chrono::steady_clock::now();
    auto state = kj::heap<rpc_stream>(ctx_, kj::mv(call), params.getSink(), tags_, std::move(tag));
    auto& s = *state;
    return s.run()
        .then([context, &s, started](api::generate_result result) mutable {
          const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
          spdlog::info("event=rpc_generate request_id={} finish={} completion_tokens={} ms={:.2f}{}", s.call->id(),
                       finish_name(result.reason), result.usage.completion_tokens, ms,
                       result.err ? " error=" + to_string(*result.err) : std::string());
          fill(context.getResults().initResult(), result, s.call->id());
        })
        .attach(kj::mv(state));
  }

  kj::Promise<void> cancel(CancelContext context) override {
    const std::string tag = context.getParams().getRequestId();
    auto it = tags_->find(tag);
    if (it != tags_->end()) {
      spdlog::info("event=request_cancel request_id={} reason=rpc_cancel", it->second);
      ctx_->backend->cancel(it->second);
    }
    return kj::READY_NOW;
  }

 private:
  std::shared_ptr<door_context> ctx_;
  std::string tenant_;
  std::string label_;
  std::shared_ptr<tag_map> tags_ = std::make_shared<tag_map>();
};

// --- Admin -------------------------------------------------------------------

class admin_impl final : public rpc::Admin::Server {
 public:
  explicit admin_impl(std::shared_ptr<door_context> ctx) : ctx_(std::move(ctx)) {}

 protected:
  kj::Promise<void> status(StatusContext context) override {
    auto cb = make_cross_thread_callback<expected<api::cluster_status>>();
    ctx_->backend->status(std::move(cb.callback));
    return deadline(kj::mv(cb.promise), "status").then([context](expected<api::cluster_status> s) mutable -> kj::Promise<void> {
      if (!s) return to_rpc_exception(s.error());
      fill(context.getResults().initStatus(), *s);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> models(ModelsContext context) override {
    auto cb = make_cross_thread_callback<std::vector<api::model_info>>();
    ctx_->backend->models(std::move(cb.callback));
    auto listed = cb.promise.then([](std::vector<api::model_info> m) { return expected<std::vector<api::model_info>>(std::move(m)); });
    return deadline(kj::mv(listed), "models").then([context](expected<std::vector<api::model_info>> m) mutable -> kj::Promise<void> {
      if (!m) return to_rpc_exception(m.error());
      auto out = context.getResults().initModels(static_cast<unsigned>(m->size()));
      for (unsigned i = 0; i < out.size(); ++i) fill(out[i], (*m)[i]);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> deploy(DeployContext context) override {
    auto r = context.getParams().getRequest();
    api::deploy_request req;
    req.name = r.getName();
    req.model_file = r.getModelFile();
    req.replicas = r.getReplicas();
    req.kv_tokens = r.getKvTokens();
    req.routing = r.getRouting();
    req.model_sha256 = r.getModelSha256();
    req.tenant = r.getTenant();
    req.warm_pool_percent = r.getWarmPoolPercent();
    req.autoscale_min = r.getAutoscaleMin();
    req.autoscale_max = r.getAutoscaleMax();
    req.autoscale_metric = r.getAutoscaleMetric();
    req.autoscale_target = r.getAutoscaleTarget();
    req.idle_to_zero_s = r.getIdleToZeroS();
    req.chat_template = r.getChatTemplate();
    req.draft_model = r.getDraftModel();
    req.draft_sha256 = r.getDraftSha256();
    req.draft_tokens = r.getDraftTokens();
    req.tensor_parallel = r.getTensorParallel();
    req.prefix_slack_tokens = r.getPrefixSlackTokens();
    req.prefix_slack_ratio = r.getPrefixSlackRatio();
    req.prefix_slack_s = r.getPrefixSlackS();
    if (req.name.empty()) return to_rpc_exception(error{errc::invalid_argument, "deployment name must be given"});
    auto cb = make_cross_thread_callback<expected<void>>();
    ctx_->backend->deploy(std::move(req), std::move(cb.callback));
    return acknowledge(kj::mv(cb.promise), "deploy");
  }

  kj::Promise<void> undeploy(UndeployContext context) override {
    auto cb = make_cross_thread_callback<expected<void>>();
    ctx_->backend->undeploy(context.getParams().getName(), std::move(cb.callback));
    return acknowledge(kj::mv(cb.promise), "undeploy");
  }

  kj::Promise<void> scale(ScaleContext context) override {
    auto params = context.getParams();
    auto cb = make_cross_thread_callback<expected<void>>();
    ctx_->backend->scale(params.getName(), params.getReplicas(), std::move(cb.callback));
    return acknowledge(kj::mv(cb.promise), "scale");
  }

  kj::Promise<void> rollout(RolloutContext context) override {
    auto in = context.getParams().getRequest();
    api::rollout_request req;
    req.what = static_cast<api::rollout_request::op>(static_cast<std::uint8_t>(in.getOp()));
    if (req.what > api::rollout_request::op::promote)
      return to_rpc_exception(error{errc::invalid_argument, "unknown rollout operation"});
    req.name = in.getName();
    req.model_file = in.getModelFile();
    req.model_sha256 = in.getModelSha256();
    req.version = in.getVersion();
    req.steps = in.getSteps();
    req.bake_s = in.getBakeS();
    req.max_unavailable = in.getMaxUnavailable();
    req.surge = in.getSurge();
    req.min_samples = in.getMinSamples();
    auto cb = make_cross_thread_callback<expected<api::rollout_result>>();
    ctx_->backend->rollout(req, std::move(cb.callback));
    const auto op = static_cast<int>(req.what);
    return deadline(kj::mv(cb.promise), "rollout")
        .then([context, name = req.name, op](expected<api::rollout_result> r) mutable -> kj::Promise<void> {
          static constexpr const char* ops[] = {"start", "status", "pause", "resume", "abort", "promote"};
          spdlog::info("event=rpc_admin op=rollout_{} deployment={} ok={}{}", ops[op], name, r.has_value(),
                       r ? std::string() : " error=\"" + to_string(r.error()) + "\"");
          if (!r) return to_rpc_exception(r.error());
          context.getResults().setStatus(r->status);
          return kj::READY_NOW;
        });
  }

  kj::Promise<void> drain(DrainContext context) override {
    auto params = context.getParams();
    api::drain_request req;
    req.kind = params.getTarget() == rpc::DrainTarget::REPLICA ? api::drain_request::target::replica
                                                          : api::drain_request::target::node;
    req.id = params.getId();
    req.deadline_ms = params.getDeadlineMs();
    req.undrain = params.getUndrain();
    auto cb = make_cross_thread_callback<expected<api::drain_result>>();
    ctx_->backend->drain(req, std::move(cb.callback));
    const std::string what = fmt::format("{}{} {} {}", req.undrain ? "un" : "",
                                         "drain", req.kind == api::drain_request::target::node ? "node" : "replica", req.id);
    return deadline(kj::mv(cb.promise), "drain").then([context, what](expected<api::drain_result> r) mutable -> kj::Promise<void> {
      spdlog::info("event=rpc_admin op=drain target=\"{}\" ok={}{}", what, r.has_value(),
                   r ? std::string() : " error=\"" + to_string(r.error()) + "\"");
      if (!r) return to_rpc_exception(r.error());
      context.getResults().setReplicas(r->replicas);
      context.getResults().setDeadlineMs(r->deadline_ms);
      return kj::READY_NOW;
    });
  }

 private:
  template <class T>
  kj::Promise<expected<T>> deadline(kj::Promise<expected<T>> p, const char* what) {
    return with_deadline(ctx_->timer, ctx_->config.backend_call_timeout_ms, kj::mv(p), what);
  }

  kj::Promise<void> acknowledge(kj::Promise<expected<void>> p, const char* what) {
    return deadline(kj::mv(p), what).then([what = std::string(what)](expected<void> r) -> kj::Promise<void> {
      spdlog::info("event=rpc_admin op={} ok={}{}", what, r.has_value(),
                   r ? std::string() : " error=\"" + to_string(r.error()) + "\"");
      if (!r) return to_rpc_exception(r.error());
      return kj::READY_NOW;
    });
  }

  std::shared_ptr<door_context> ctx_;
};

// --- Service -----------------------------------------------------------------

class service_impl final : public rpc::Service::Server {
 public:
  explicit service_impl(std::shared_ptr<door_context> ctx) : ctx_(std::move(ctx)) {}

 protected:
  kj::Promise<void> gateway(GatewayContext context) override {
    auto scope = check(context.getParams().getApiKey(), false);
    if (!scope) return to_rpc_exception(scope.error());
    // A fresh Gateway per call: cancel() then only reaches its own requests.
    context.getResults().setGateway(kj::heap<gateway_impl>(ctx_, scope->first, scope->second));
    return kj::READY_NOW;
  }

  kj::Promise<void> admin(AdminContext context) override {
    if (auto scope = check(context.getParams().getApiKey(), true); !scope) return to_rpc_exception(scope.error());
    context.getResults().setAdmin(kj::heap<admin_impl>(ctx_));
    return kj::READY_NOW;
  }

  // With a keys file: the key must be known, and an admin key for admin.
  // The tenant the caller is scoped to ("" = every tenant: no keys, or an
  // admin key).
  // Returns (scope, the key's tenant for its limits).
  expected<std::pair<std::string, std::string>> check(capnp::Text::Reader key, bool admin) const {
    const auto& store = ctx_->config.keys;
    if (!store) return std::pair<std::string, std::string>{};
    if (key.size() == 0)
      return make_error(errc::unauthenticated, "no API key: this server checks keys (exaserve-cli --api-key KEY)");
    const auto keys = store->current();
    const auth::key_entry* e = keys->find(std::string_view(key.cStr(), key.size()));
    if (!e) return make_error(errc::unauthenticated, "the API key is not valid: it was revoked or never issued");
    if (admin && !e->admin)
      return make_error(errc::permission_denied,
                        "key " + e->id + " of tenant " + e->tenant + " is not an admin key (exaserve keys add --admin)");
    spdlog::info("event=rpc_authenticated role={} key={} tenant={}", admin ? "admin" : "gateway", e->id, e->tenant);
    return std::pair<std::string, std::string>{e->admin ? std::string() : e->tenant, e->tenant};
  }

 private:
  std::shared_ptr<door_context> ctx_;
};

}  // namespace

capnp::Capability::Client make_rpc_service(std::shared_ptr<door_context> ctx) {
  return kj::heap<service_impl>(std::move(ctx));
}

}  // namespace exa::door
