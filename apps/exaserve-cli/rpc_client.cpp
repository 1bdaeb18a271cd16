#include "rpc_client.hpp"

#include <sstream>

#include <fstream>

#include <capnp/rpc-twoparty.h>
#include <kj/compat/tls.h>
#include <fmt/format.h>
#include <kj/async-io.h>
#include <kj/debug.h>

#include <optional>
#include <string_view>

#include "schemas/exaserve.capnp.h"

namespace exa::cli {

namespace {

/// Admin calls and the connection attempt give up after this; generate has
/// no limit (a long completion is not a hung server).
constexpr auto call_timeout = 30 * kj::SECONDS;

std::optional<errc> errc_from_name(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(errc::permission_denied); ++i)
    if (to_string(static_cast<errc>(i)) == name) return static_cast<errc>(i);
  return std::nullopt;
}

/// Servers describe failures as "<code>: <message>"; capnp prefixes remote
/// ones with "remote exception: ". Recover the code so exit paths and
/// messages match what the server meant.
error from_exception(const kj::Exception& e, const std::string& where) {
  std::string_view d = e.getDescription().cStr();
  constexpr std::string_view remote = "remote exception: ";
  if (d.starts_with(remote)) d.remove_prefix(remote.size());
  if (e.getType() == kj::Exception::Type::DISCONNECTED)
    return {errc::unavailable, fmt::format("connection to {} lost: {}", where, d)};
  if (auto colon = d.find(": "); colon != std::string_view::npos)
    if (auto code = errc_from_name(d.substr(0, colon))) return {*code, std::string(d.substr(colon + 2))};
  switch (e.getType()) {
    case kj::Exception::Type::OVERLOADED: return {errc::overloaded, std::string(d)};
    case kj::Exception::Type::UNIMPLEMENTED: return {errc::unsupported, std::string(d)};
    default: return {errc::internal, std::string(d)};
  }
}

api::model_info to_api(rpc::ModelInfo::Reader m) {
  return {m.getName(),     m.getModelFile(), m.getReplicasReady(), m.getReplicasDesired(),
          m.getContextLength(), m.getTenant(), m.getVersion(),       m.getTtftP50Ms(),
          m.getTtftP99Ms(),   m.getTpotP50Ms(), m.getTpotP99Ms(), m.getArchitecture(), m.getQuantization(),
          m.getTokenizer(),   m.getDraftModel(), m.getDraftTokens(),  m.getRouting(), m.getPrefixSlackTokens(),
          m.getPrefixSlackRatio(), m.getPrefixSlackS()};
}

api::cluster_status to_api(rpc::ClusterStatus::Reader s) {
  api::cluster_status out;
  for (auto n : s.getNodes())
    out.nodes.push_back({n.getId(), n.getRack(), n.getState(), n.getAddress(), n.getClockOffsetMs(), n.getDrained(),
                         n.getRegion()});
  for (auto d : s.getDevices())
    out.devices.push_back({d.getNode(), d.getDevice(), d.getKind(), d.getMemoryBytes(), d.getMemoryUsedBytes()});
  for (auto r : s.getReplicas()) {
    out.replicas.push_back({r.getId(), r.getDeployment(), r.getSlot(), r.getEpoch(), r.getState(), r.getNode(),
                            r.getDevice(), r.getRunning(), r.getQueued(), r.getKvUsedTokens(),
                            r.getKvCapacityTokens(), {}, r.getPrefillTokensPerS(), r.getDecodeTokensPerS()});
    for (auto d : r.getDevices()) out.replicas.back().devices.push_back(d);
  }
  for (auto m : s.getModels()) out.models.push_back(to_api(m));
  for (auto r : s.getRollouts()) out.rollouts.push_back({r.getName(), r.getStatus()});
  return out;
}

api::finish_reason to_api(rpc::FinishReason r) {
  switch (r) {
    case rpc::FinishReason::STOP: return api::finish_reason::stop;
    case rpc::FinishReason::LENGTH: return api::finish_reason::length;
    case rpc::FinishReason::CANCELLED: return api::finish_reason::cancelled;
    case rpc::FinishReason::ERROR: return api::finish_reason::error;
  }
  return api::finish_reason::error;
}

api::generate_result to_api(rpc::GenerateResult::Reader r) {
  api::generate_result out;
  out.reason = to_api(r.getFinishReason());
  out.usage = {r.getUsage().getPromptTokens(), r.getUsage().getCompletionTokens(), r.getUsage().getCachedTokens()};
  out.timings = {r.getTimings().getTtftMs(), r.getTimings().getTpotMs(), r.getTimings().getE2eMs()};
  if (r.hasError()) {
    const std::string code = r.getError().getCode();
    out.err = error{errc_from_name(code).value_or(errc::internal), r.getError().getMessage()};
  }
  out.replica = r.getReplica();
  return out;
}

/// Hands each chunk to the caller as it arrives; returning at once keeps the
/// server's flow-control window open.
class sink_impl final : public rpc::TokenSink::Server {
 public:
  explicit sink_impl(std::function<void(const api::token_chunk&)> on_chunk) : on_chunk_(std::move(on_chunk)) {}

 protected:
  kj::Promise<void> chunk(ChunkContext context) override {
    auto c = context.getParams().getChunk();
    api::token_chunk out;
    for (auto id : c.getTokens()) out.tokens.push_back(id);
    out.text = c.getText();
    out.first_index = c.getFirstIndex();
    on_chunk_(out);
    return kj::READY_NOW;
  }

 private:
  std::function<void(const api::token_chunk&)> on_chunk_;
};

}  // namespace

struct rpc_client::impl {
  impl() : io(kj::setupAsyncIo()) {}
  std::string api_key;  // sent with each capability request; empty when none

  /// Runs `make` (which builds a promise) to completion on this thread's loop,
  /// converting KJ exceptions (remote ones included) into error values.
  template <class T, class Make>
  expected<T> run(Make make, bool with_timeout) {
    std::optional<T> value;
    bool timed_out = false;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
                  kj::Promise<T> p = make();
                  if (with_timeout) {
                    p = p.exclusiveJoin(io.provider->getTimer().afterDelay(call_timeout).then([&]() -> kj::Promise<T> {
                      timed_out = true;
                      return KJ_EXCEPTION(FAILED, "timed out");
                    }));
                  }
                  value.emplace(p.wait(io.waitScope));
                })) {
      if (timed_out) return make_error(errc::deadline_exceeded, fmt::format("no answer from {} within 30 s", where));
      return std::unexpected(from_exception(*e, where));
    }
    return std::move(*value);
  }

  kj::AsyncIoContext io;
  std::string where;
  // TLS (declared before the stream: the stream refers to them).
  kj::Own<kj::TlsKeypair> keypair;
  kj::Array<kj::TlsCertificate> trusted;
  kj::Own<kj::TlsContext> tls;
  kj::Own<kj::AsyncIoStream> stream;
  kj::Own<capnp::TwoPartyClient> client;
  rpc::Service::Client service = nullptr;
};

rpc_client::rpc_client(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}
rpc_client::~rpc_client() = default;

namespace {

// The capabilities, asked for with the API key (servers without keys ignore it).
rpc::Admin::Client admin_of(rpc_client::impl& s) {
  auto r = s.service.adminRequest();
  r.setApiKey(s.api_key);
  return r.send().getAdmin();
}
rpc::Gateway::Client gateway_of(rpc_client::impl& s) {
  auto r = s.service.gatewayRequest();
  r.setApiKey(s.api_key);
  return r.send().getGateway();
}

}  // namespace

namespace {
expected<std::string> read_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return make_error(errc::invalid_argument, fmt::format("{} '{}' cannot be read", what, path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

expected<std::unique_ptr<rpc_client>> rpc_client::connect(const std::string& host, std::uint16_t port,
                                                         std::string api_key, const tls_files& tls) {
  auto self = std::make_unique<impl>();
  self->api_key = std::move(api_key);
  if (!tls.ca.empty()) {
    auto ca = read_file(tls.ca, "--tls-ca");
    if (!ca) return std::unexpected(ca.error());
    std::optional<std::string> cert, key;
    if (!tls.cert.empty()) {
      auto c = read_file(tls.cert, "--tls-cert");
      auto k = read_file(tls.key, "--tls-key");
      if (!c) return std::unexpected(c.error());
      if (!k) return std::unexpected(k.error());
      cert = *c;
      key = *k;
    }
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
                  kj::TlsContext::Options o;
                  self->trusted = kj::heapArray<kj::TlsCertificate>({kj::TlsCertificate(kj::StringPtr(ca->c_str()))});
                  o.trustedCertificates = self->trusted;
                  o.useSystemTrustStore = false;
                  if (cert) {
                    self->keypair = kj::heap<kj::TlsKeypair>(kj::TlsKeypair{
                        kj::TlsPrivateKey(kj::StringPtr(key->c_str())), kj::TlsCertificate(kj::StringPtr(cert->c_str()))});
                    o.defaultKeypair = *self->keypair;
                  }
                  self->tls = kj::heap<kj::TlsContext>(kj::mv(o));
                })) {
      return make_error(errc::invalid_argument, fmt::format("TLS files: {}", e->getDescription().cStr()));
    }
  }
  self->where = fmt::format("{}:{}", host, port);
  auto& s = *self;
  // KJ checks the certificate against a host name, never an IP address: a
  // loopback address is checked as "localhost" (gen-certs puts both in its
  // certificates), any other address needs --tls-server-name.
  const bool loopback = host.rfind("127.", 0) == 0 || host == "::1";
  const std::string name = !tls.server_name.empty() ? tls.server_name : loopback ? "localhost" : host;
  auto stream = s.run<kj::Own<kj::AsyncIoStream>>(
      [&] {
        return s.io.provider->getNetwork()
            .parseAddress(host.c_str(), port)
            .then([](kj::Own<kj::NetworkAddress> address) { return address->connect().attach(kj::mv(address)); })
            .then([&s, name](kj::Own<kj::AsyncIoStream> raw) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
              if (!s.tls) return kj::mv(raw);
              return s.tls->wrapClient(kj::mv(raw), name);  // checks the certificate names `name`
            });
      },
      true);
  if (!stream) {
    const auto& msg = stream.error().message;
    if (msg.find("Connection refused") != std::string::npos || msg.find("ECONNREFUSED") != std::string::npos)
      return make_error(errc::unavailable,
                        fmt::format("cannot connect to {}: connection refused; is `exaserve serve` running?", s.where));
    return make_error(stream.error().code, fmt::format("cannot connect to {}: {}", s.where, msg));
  }
  s.stream = kj::mv(*stream);
  s.client = kj::heap<capnp::TwoPartyClient>(*s.stream);
  s.service = s.client->bootstrap().castAs<rpc::Service>();
  return std::unique_ptr<rpc_client>(new rpc_client(std::move(self)));
}

expected<api::cluster_status> rpc_client::status() {
  auto& s = *impl_;
  return s.run<api::cluster_status>(
      [&] {
        auto admin = admin_of(s);
        return admin.statusRequest().send().then([](auto r) { return to_api(r.getStatus()); });
      },
      true);
}

expected<std::vector<api::model_info>> rpc_client::models() {
  auto& s = *impl_;
  return s.run<std::vector<api::model_info>>(
      [&] {
        auto admin = admin_of(s);
        return admin.modelsRequest().send().then([](auto r) {
          std::vector<api::model_info> out;
          for (auto m : r.getModels()) out.push_back(to_api(m));
          return out;
        });
      },
      true);
}

expected<void> rpc_client::deploy(const api::deploy_request& request) {
  auto& s = *impl_;
  auto r = s.run<bool>(
      [&] {
        auto req = admin_of(s).deployRequest();
        auto d = req.initRequest();
        d.setName(request.name);
        d.setModelFile(request.model_file);
        d.setReplicas(request.replicas);
        d.setKvTokens(request.kv_tokens);
        d.setRouting(request.routing);
        d.setModelSha256(request.model_sha256);
        d.setTenant(request.tenant);
        d.setWarmPoolPercent(request.warm_pool_percent);
        d.setAutoscaleMin(request.autoscale_min);
        d.setAutoscaleMax(request.autoscale_max);
        d.setAutoscaleMetric(request.autoscale_metric);
        d.setAutoscaleTarget(request.autoscale_target);
        d.setIdleToZeroS(request.idle_to_zero_s);
        d.setChatTemplate(request.chat_template);
        d.setDraftModel(request.draft_model);
        d.setDraftSha256(request.draft_sha256);
        d.setDraftTokens(request.draft_tokens);
        d.setTensorParallel(request.tensor_parallel);
        d.setPrefixSlackTokens(request.prefix_slack_tokens);
        d.setPrefixSlackRatio(request.prefix_slack_ratio);
        d.setPrefixSlackS(request.prefix_slack_s);
        return req.send().then([](auto) { return true; });
      },
      true);
  if (!r) return std::unexpected(r.error());
  return {};
}

expected<void> rpc_client::undeploy(const std::string& name) {
  auto& s = *impl_;
  auto r = s.run<bool>(
      [&] {
        auto req = admin_of(s).undeployRequest();
        req.setName(name);
        return req.send().then([](auto) { return true; });
      },
      true);
  if (!r) return std::unexpected(r.error());
  return {};
}

expected<void> rpc_client::scale(const std::string& name, std::uint32_t replicas) {
  auto& s = *impl_;
  auto r = s.run<bool>(
      [&] {
        auto req = admin_of(s).scaleRequest();
        req.setName(name);
        req.setReplicas(replicas);
        return req.send().then([](auto) { return true; });
      },
      true);
  if (!r) return std::unexpected(r.error());
  return {};
}

expected<api::drain_result> rpc_client::drain(const api::drain_request& request) {
  auto& s = *impl_;
  return s.run<api::drain_result>(
      [&] {
        auto req = admin_of(s).drainRequest();
        req.setTarget(request.kind == api::drain_request::target::replica ? rpc::DrainTarget::REPLICA : rpc::DrainTarget::NODE);
        req.setId(request.id);
        req.setDeadlineMs(request.deadline_ms);
        req.setUndrain(request.undrain);
        return req.send().then([](auto r) { return api::drain_result{r.getReplicas(), r.getDeadlineMs()}; });
      },
      true);
}

expected<api::rollout_result> rpc_client::rollout(const api::rollout_request& request) {
  auto& s = *impl_;
  return s.run<api::rollout_result>(
      [&] {
        auto req = admin_of(s).rolloutRequest();
        auto r = req.initRequest();
        r.setOp(static_cast<rpc::RolloutOp>(static_cast<std::uint16_t>(request.what)));
        r.setName(request.name);
        r.setModelFile(request.model_file);
        r.setModelSha256(request.model_sha256);
        r.setVersion(request.version);
        r.setSteps(request.steps);
        r.setBakeS(request.bake_s);
        r.setMaxUnavailable(request.max_unavailable);
        r.setSurge(request.surge);
        r.setMinSamples(request.min_samples);
        return req.send().then([](auto res) { return api::rollout_result{res.getStatus()}; });
      },
      true);
}

expected<api::generate_result> rpc_client::generate(const api::generate_request& request,
                                                    std::function<void(const api::token_chunk&)> on_chunk) {
  auto& s = *impl_;
  return s.run<api::generate_result>(
      [&] {
        auto req = gateway_of(s).generateRequest();
        auto g = req.initRequest();
        g.setModel(request.model);
        if (request.prompt_ids) {
          auto ids = g.getPrompt().initTokenIds(static_cast<unsigned>(request.prompt_ids->size()));
          for (unsigned i = 0; i < ids.size(); ++i) ids.set(i, (*request.prompt_ids)[i]);
        } else {
          g.getPrompt().setText(request.prompt_text.value_or(""));
        }
        g.setMaxTokens(request.max_tokens);
        auto sampling = g.initSampling();
        sampling.setTemperature(request.sampling.temperature);
        sampling.setTopP(request.sampling.top_p);
        sampling.setTopK(request.sampling.top_k);
        sampling.setSeed(request.sampling.seed);
        auto stops = g.initStop(static_cast<unsigned>(request.stop.size()));
        for (unsigned i = 0; i < stops.size(); ++i) stops.set(i, request.stop[i]);
        g.setIgnoreEos(request.ignore_eos);
        g.setPriority(request.priority == "batch" ? rpc::Priority::BATCH : rpc::Priority::INTERACTIVE);
        g.setUser(request.user);
        req.setSink(kj::heap<sink_impl>(std::move(on_chunk)));
        return req.send().then([](auto r) { return to_api(r.getResult()); });
      },
      false);
}

}  // namespace exa::cli
