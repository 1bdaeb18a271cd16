#include "frontdoor.hpp"

#include <capnp/rpc-twoparty.h>
#include <fmt/format.h>
#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/compat/tls.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "common/assert.hpp"
#include "door_context.hpp"
#include "error_mapping.hpp"
#include "http_service.hpp"
#include "openai.hpp"
#include "rpc_service.hpp"
#include "watched_stream.hpp"

namespace exa {

namespace door {
namespace {

/// After an accept() failure (e.g. out of file descriptors), wait this long
/// before accepting again instead of spinning or giving up serving.
constexpr auto accept_retry_delay = 100 * kj::MILLISECONDS;

/// A client refused for being over max_connections gets its 429 and this
/// long to finish sending before the socket is closed (closing with unread
/// input would reset the connection and could destroy the 429 in flight).
constexpr auto refusal_linger = 1 * kj::SECONDS;

/// Everything that serves, on the loop thread. Members are destroyed in
/// reverse order: the accept loops, then the connections (dropping their
/// handlers, which cancels in-flight requests on the backend), then the
/// servers they used.
class loop_servers final : private kj::TaskSet::ErrorHandler {
 public:
  loop_servers(std::shared_ptr<door_context> ctx, kj::Own<kj::ConnectionReceiver> http_listener,
               kj::Own<kj::ConnectionReceiver> rpc_listener, kj::Own<kj::TlsContext> tls)
      : ctx_(std::move(ctx)),
        tls_(kj::mv(tls)),
        table_builder_(),
        ids_(table_builder_),
        table_(table_builder_.build()),
        error_handler_(ctx_, *table_),
        http_server_(ctx_->timer, *table_, make_factory(), make_settings()),
        rpc_server_(make_rpc_service(ctx_)),
        http_listener_(kj::mv(http_listener)),
        rpc_listener_(kj::mv(rpc_listener)),
        connections_(*this) {
    http_accept_ = accept_http().eagerlyEvaluate(nullptr);
    rpc_accept_ = accept_rpc().eagerlyEvaluate(nullptr);
  }

  /// Stops taking connections: the listening sockets close, so new clients
  /// are refused by the kernel, while open connections carry on.
  void close_listeners() {
    http_accept_ = nullptr;
    rpc_accept_ = nullptr;
    http_listener_ = nullptr;
    rpc_listener_ = nullptr;
  }

  /// New connections handshake with `tls` from now on; the old context is
  /// kept (connections made with it may still use it) until the door stops.
  void replace_tls(kj::Own<kj::TlsContext> tls) {
    if (tls_) retired_tls_.add(kj::mv(tls_));
    tls_ = kj::mv(tls);
  }

  std::uint16_t http_port() { return static_cast<std::uint16_t>(http_listener_->getPort()); }
  std::uint16_t rpc_port() { return static_cast<std::uint16_t>(rpc_listener_->getPort()); }

 private:
  kj::HttpServer::HttpServiceFactory make_factory() {
    return [this](kj::AsyncIoStream& stream) -> kj::Own<kj::HttpService> {
      // Every HTTP connection comes from accept_http(), which wraps it.
      auto* watched = dynamic_cast<watched_stream*>(&stream);
      EXA_ASSERT(watched != nullptr);
      return kj::heap<http_service>(ctx_, *table_, ids_, *watched);
    };
  }

  kj::HttpServerSettings make_settings() {
    kj::HttpServerSettings settings;
    settings.headerTimeout = ctx_->config.header_timeout_ms * kj::MILLISECONDS;
    settings.errorHandler = error_handler_;
    return settings;
  }

  // With TLS: the handshake first, per connection, bounded by the header
  // timeout; one that fails (plain HTTP on the TLS port, a wrong CA, a client
  // without the required certificate) closes that connection only.
  template <class Serve>
  void handshake_then(kj::Own<kj::AsyncIoStream> raw, const char* protocol, Serve serve) {
    if (!tls_) return serve(kj::mv(raw));
    auto shake = tls_->wrapServer(kj::mv(raw))
                     .exclusiveJoin(ctx_->timer.afterDelay(ctx_->config.header_timeout_ms * kj::MILLISECONDS)
                                        .then([]() -> kj::Own<kj::AsyncIoStream> {
                                          KJ_FAIL_REQUIRE("TLS handshake timed out");
                                        }));
    connections_.add(shake.then([serve](kj::Own<kj::AsyncIoStream> s) mutable { serve(kj::mv(s)); },
                                [this, protocol](kj::Exception&& e) {
                                  ++ctx_->counters.tls_handshake_failures;
                                  spdlog::info("event=tls_handshake_failed protocol={} description=\"{}\"", protocol,
                                               e.getDescription().cStr());
                                }));
  }

  kj::Promise<void> accept_http() {
    return http_listener_->accept().then(
        [this](kj::Own<kj::AsyncIoStream> raw) {
          handshake_then(kj::mv(raw), "http", [this](kj::Own<kj::AsyncIoStream> stream) { serve_http(kj::mv(stream)); });
          return accept_http();
        },
        [this](kj::Exception&& e) {
          spdlog::error("event=accept_failed protocol=http description=\"{}\"", e.getDescription().cStr());
          return ctx_->timer.afterDelay(accept_retry_delay).then([this] { return accept_http(); });
        });
  }

  void serve_http(kj::Own<kj::AsyncIoStream> stream) {
    auto& counters = ctx_->counters;
    if (counters.http_connections >= static_cast<std::int64_t>(ctx_->config.max_connections)) {
      ++counters.connections_refused;
      spdlog::warn("event=connection_refused protocol=http open={} max={}", counters.http_connections,
                   ctx_->config.max_connections);
      connections_.add(refuse_http(kj::mv(stream)));
    } else {
      ++counters.http_connections;
      auto served = http_server_.listenHttp(kj::heap<watched_stream>(kj::mv(stream)));
      connections_.add(served.attach(kj::defer([this] { --ctx_->counters.http_connections; })));
    }
  }

  kj::Promise<void> accept_rpc() {
    return rpc_listener_->accept().then(
        [this](kj::Own<kj::AsyncIoStream> raw) {
          handshake_then(kj::mv(raw), "rpc", [this](kj::Own<kj::AsyncIoStream> stream) { serve_rpc(kj::mv(stream)); });
          return accept_rpc();
        },
        [this](kj::Exception&& e) {
          spdlog::error("event=accept_failed protocol=rpc description=\"{}\"", e.getDescription().cStr());
          return ctx_->timer.afterDelay(accept_retry_delay).then([this] { return accept_rpc(); });
        });
  }

  void serve_rpc(kj::Own<kj::AsyncIoStream> stream) {
    auto& counters = ctx_->counters;
    if (counters.rpc_connections >= static_cast<std::int64_t>(ctx_->config.max_connections)) {
      // Dropping the stream closes it; an RPC client sees a disconnect.
      ++counters.connections_refused;
      spdlog::warn("event=connection_refused protocol=rpc open={} max={}", counters.rpc_connections,
                   ctx_->config.max_connections);
    } else {
      ++counters.rpc_connections;
      auto served = rpc_server_.accept(*stream);  // resolves when the client disconnects
      connections_.add(served.attach(kj::mv(stream), kj::defer([this] { --ctx_->counters.rpc_connections; })));
    }
  }

  /// A raw 429: the connection never reaches HttpServer, so nothing else
  /// would answer it.
  struct refusal {
    kj::Own<kj::AsyncIoStream> stream;
    std::string text;
    std::array<kj::byte, 4096> buffer{};

    kj::Promise<void> run() {
      return stream->write(text.data(), text.size()).then([this] {
        stream->shutdownWrite();
        return drain();
      });
    }
    kj::Promise<void> drain() {
      return stream->tryRead(buffer.data(), 1, buffer.size()).then([this](size_t n) -> kj::Promise<void> {
        if (n == 0) return kj::READY_NOW;
        return drain();
      });
    }
  };

  kj::Promise<void> refuse_http(kj::Own<kj::AsyncIoStream> stream) {
    const std::string body = render_error(error{
        errc::overloaded, fmt::format("too many connections (at most {}); retry later", ctx_->config.max_connections)});
    auto r = kj::heap<refusal>();
    r->stream = kj::mv(stream);
    r->text = fmt::format(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
        "Retry-After: {}\r\nConnection: close\r\n\r\n{}",
        body.size(), retry_after_s, body);
    auto& ref = *r;
    return ref.run().exclusiveJoin(ctx_->timer.afterDelay(refusal_linger)).attach(kj::mv(r));
  }

  void taskFailed(kj::Exception&& e) override {
    // A connection that ends badly (reset, protocol error) is routine.
    spdlog::debug("event=connection_ended description=\"{}\"", e.getDescription().cStr());
  }

  std::shared_ptr<door_context> ctx_;
  kj::Own<kj::TlsContext> tls_;  // null: plain TCP
  kj::Vector<kj::Own<kj::TlsContext>> retired_tls_;
  kj::HttpHeaderTable::Builder table_builder_;
  http_header_ids ids_;
  kj::Own<kj::HttpHeaderTable> table_;
  http_error_handler error_handler_;
  kj::HttpServer http_server_;
  capnp::TwoPartyServer rpc_server_;
  kj::Own<kj::ConnectionReceiver> http_listener_;
  kj::Own<kj::ConnectionReceiver> rpc_listener_;
  kj::TaskSet connections_;
  kj::Promise<void> http_accept_ = nullptr;
  kj::Promise<void> rpc_accept_ = nullptr;
};

std::string host_port(const std::string& host, std::uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return ipv6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

expected<kj::Own<kj::ConnectionReceiver>> listen_on(kj::AsyncIoContext& io, const std::string& host,
                                                    std::uint16_t port, const char* what) {
  kj::Own<kj::ConnectionReceiver> receiver;
  // KJ reports bind failures as exceptions; this is the edge where they
  // become error values.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto address = io.provider->getNetwork().parseAddress(host.c_str(), port).wait(io.waitScope);
                receiver = address->listen();
              })) {
    return make_error(errc::unavailable, fmt::format("cannot listen for {} on {}: {}", what, host_port(host, port),
                                                     e->getDescription().cStr()));
  }
  return receiver;
}

// The TLS context of the doors and what it points at (KJ keeps references).
struct door_tls {
  kj::Own<kj::TlsKeypair> keypair;
  kj::Array<kj::TlsCertificate> client_cas;
  kj::Own<kj::TlsContext> context;  // null: plain TCP
};

expected<std::string> read_pem(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return make_error(errc::invalid_argument, fmt::format("{} '{}' cannot be read", flag, path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

expected<door_tls> make_tls(const frontdoor_config& c) {
  door_tls out;
  if (!c.tls()) return out;
  if (c.tls_key.empty()) return make_error(errc::invalid_argument, "a TLS certificate needs its key as well");
  auto cert = read_pem(c.tls_cert, "the TLS certificate");
  auto key = read_pem(c.tls_key, "the TLS key");
  if (!cert) return std::unexpected(cert.error());
  if (!key) return std::unexpected(key.error());
  std::optional<std::string> ca;
  if (!c.tls_client_ca.empty()) {
    auto text = read_pem(c.tls_client_ca, "the client CA");
    if (!text) return std::unexpected(text.error());
    ca = *text;
  }
  // KJ throws on a malformed PEM; that becomes an error naming the file.
  std::string where;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
                where = c.tls_cert + " / " + c.tls_key;
                out.keypair = kj::heap<kj::TlsKeypair>(
                    kj::TlsKeypair{kj::TlsPrivateKey(kj::StringPtr(key->c_str())), kj::TlsCertificate(kj::StringPtr(cert->c_str()))});
                kj::TlsContext::Options o;
                o.defaultKeypair = *out.keypair;
                if (ca) {
                  where = c.tls_client_ca;
                  out.client_cas = kj::heapArray<kj::TlsCertificate>({kj::TlsCertificate(kj::StringPtr(ca->c_str()))});
                  o.trustedCertificates = out.client_cas;
                  o.useSystemTrustStore = false;
                  o.verifyClients = true;
                }
                out.context = kj::heap<kj::TlsContext>(kj::mv(o));
              })) {
    return make_error(errc::invalid_argument, fmt::format("TLS files {}: {}", where, e->getDescription().cStr()));
  }
  spdlog::info("event=frontdoor_tls cert={} client_certificates={}", c.tls_cert,
               c.tls_client_ca.empty() ? "not required" : "required, signed by " + c.tls_client_ca);
  return out;
}

}  // namespace
}  // namespace door

struct frontdoor::impl {
  frontdoor_config config;
  std::shared_ptr<api::gateway_backend> backend;
  std::thread thread;
  std::uint16_t http_port = 0;
  std::uint16_t rpc_port = 0;
  std::mutex stop_mu;
  // Created on the loop thread, fulfilled by stop() on any other.
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_signal;
  // The same, fulfilled by stop_accepting().
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> close_signal;
  bool closing = false;  // guarded by stop_mu
  // Set on the loop thread while it serves: reload_tls() runs there.
  kj::Own<const kj::Executor> executor;
  door::loop_servers* servers = nullptr;
  std::vector<door::door_tls> tls_files;  // what the contexts point at, kept until the loop ends

  void run(std::promise<expected<void>>& started);
  void serve(const std::function<void(expected<void>)>& report);
};

void frontdoor::impl::run(std::promise<expected<void>>& started) {
  bool reported = false;
  auto report = [&](expected<void> r) {
    started.set_value(std::move(r));
    reported = true;
  };
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { serve(report); })) {
    spdlog::error("event=frontdoor_loop_failed description=\"{}\"", e->getDescription().cStr());
    if (!reported) report(make_error(errc::internal, e->getDescription().cStr()));
  }
}

void frontdoor::impl::serve(const std::function<void(expected<void>)>& report) {
  auto io = kj::setupAsyncIo();
  auto http = door::listen_on(io, config.host, config.http_port, "HTTP");
  if (!http) return report(std::unexpected(http.error()));
  auto rpc = door::listen_on(io, config.host, config.rpc_port, "RPC");
  if (!rpc) return report(std::unexpected(rpc.error()));
  auto ctx = std::make_shared<door::door_context>(config, backend, io.provider->getTimer());
  auto tls = door::make_tls(config);
  if (!tls) return report(std::unexpected(tls.error()));
  auto context = kj::mv(tls->context);
  tls_files.push_back(kj::mv(*tls));
  auto servers = kj::heap<door::loop_servers>(ctx, kj::mv(*http), kj::mv(*rpc), kj::mv(context));
  this->servers = servers.get();
  executor = kj::getCurrentThreadExecutor().addRef();
  http_port = servers->http_port();
  rpc_port = servers->rpc_port();
  auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
  stop_signal = kj::mv(stop.fulfiller);
  auto close = kj::newPromiseAndCrossThreadFulfiller<void>();
  close_signal = kj::mv(close.fulfiller);
  auto closed = close.promise
                    .then([&servers] {
                      servers->close_listeners();
                      spdlog::info("event=frontdoor_not_accepting detail=\"open connections finish\"");
                    })
                    .eagerlyEvaluate(nullptr);
  report({});  // publishes the ports and the signals to start()
  stop.promise.wait(io.waitScope);
  ctx->stopping = true;
  closed = nullptr;
  this->servers = nullptr;
  servers = nullptr;
  // Let destruction work that KJ and capnp defer run while the loop exists.
  io.waitScope.poll();
}

expected<std::unique_ptr<frontdoor>> frontdoor::start(frontdoor_config config,
                                                      std::shared_ptr<api::gateway_backend> backend) {
  if (!backend) return make_error(errc::invalid_argument, "frontdoor needs a backend");
  if (config.max_connections == 0 || config.max_body_bytes == 0 || config.stream_buffer_chunks_max == 0)
    return make_error(errc::invalid_argument,
                      "max_connections, max_body_bytes and stream_buffer_chunks_max must be positive");
  auto self = std::make_unique<impl>();
  self->config = std::move(config);
  self->backend = std::move(backend);
  std::promise<expected<void>> started;
  auto result = started.get_future();
  // The thread owns the promise: set_value may still be returning when
  // start() has already woken up and left.
  self->thread = std::thread([s = self.get(), p = std::move(started)]() mutable { s->run(p); });
  if (auto r = result.get(); !r) {
    self->thread.join();
    return std::unexpected(r.error());
  }
  spdlog::info("event=frontdoor_started http={} rpc={}", door::host_port(self->config.host, self->http_port),
               door::host_port(self->config.host, self->rpc_port));
  return std::unique_ptr<frontdoor>(new frontdoor(std::move(self)));
}

frontdoor::frontdoor(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}

frontdoor::~frontdoor() { stop(); }

std::uint16_t frontdoor::http_port() const { return impl_->http_port; }
std::uint16_t frontdoor::rpc_port() const { return impl_->rpc_port; }

std::string frontdoor::http_url() const {
  return (impl_->config.tls() ? "https://" : "http://") + door::host_port(impl_->config.host, impl_->http_port);
}

void frontdoor::stop_accepting() {
  std::lock_guard lock(impl_->stop_mu);
  if (!impl_->thread.joinable() || impl_->closing) return;
  impl_->closing = true;
  impl_->close_signal->fulfill();
}

bool frontdoor::tls_enabled() const { return impl_->config.tls(); }

expected<void> frontdoor::reload_tls() {
  if (!impl_->config.tls()) return make_error(errc::invalid_argument, "this front door has no TLS to reload");
  std::lock_guard lock(impl_->stop_mu);
  if (!impl_->thread.joinable() || !impl_->executor) return make_error(errc::unavailable, "the front door is stopped");
  expected<void> out;
  impl_->executor->executeSync([&] {
    auto tls = door::make_tls(impl_->config);
    if (!tls) {
      out = std::unexpected(tls.error());
      return;
    }
    if (!impl_->servers) return;
    impl_->servers->replace_tls(kj::mv(tls->context));
    impl_->tls_files.push_back(kj::mv(*tls));
  });
  if (out) spdlog::info("event=frontdoor_tls_reloaded cert={}", impl_->config.tls_cert);
  return out;
}

void frontdoor::stop() {
  std::lock_guard lock(impl_->stop_mu);
  if (!impl_->thread.joinable()) return;
  EXA_ASSERT_MSG(std::this_thread::get_id() != impl_->thread.get_id(), "frontdoor::stop() from its own loop");
  impl_->stop_signal->fulfill();
  impl_->thread.join();
  spdlog::info("event=frontdoor_stopped");
}

}  // namespace exa
