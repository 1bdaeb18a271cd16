#include "status_door.hpp"

#include <fmt/format.h>
#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <future>
#include <mutex>
#include <thread>

#include "common/assert.hpp"

namespace exa {

namespace {

std::string host_port(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

class status_service final : public kj::HttpService {
 public:
  status_service(const kj::HttpHeaderTable& table, const status_handlers& handlers)
      : table_(table), handlers_(handlers) {}

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream&, Response& response) override {
    const std::string_view full(url.cStr(), url.size());
    const std::string_view path = full.substr(0, full.find('?'));
    if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD)
      return send(response, 405, "Method Not Allowed", "text/plain; charset=utf-8",
                  "only GET is served on the status port\n");
    if (path == "/metrics") {
      std::string body = handlers_.metrics ? handlers_.metrics() : std::string();
      return send(response, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", std::move(body));
    }
    if (path == "/healthz") return send(response, 200, "OK", "text/plain; charset=utf-8", "ok\n");
    if (path == "/readyz") {
      const auto ready = handlers_.ready ? handlers_.ready() : expected<void>{};
      if (ready) return send(response, 200, "OK", "text/plain; charset=utf-8", "ready\n");
      spdlog::debug("event=status_not_ready reason=\"{}\"", ready.error().message);
      return send(response, 503, "Service Unavailable", "text/plain; charset=utf-8",
                  "not ready: " + ready.error().message + "\n");
    }
    return send(response, 404, "Not Found", "text/plain; charset=utf-8",
                fmt::format("no such path '{}': the status port serves /metrics, /healthz and /readyz\n", path));
  }

 private:
  kj::Promise<void> send(Response& response, unsigned status, const char* reason, const char* type, std::string body) {
    kj::HttpHeaders headers(table_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, type);
    auto owned = kj::heap<std::string>(std::move(body));
    auto out = response.send(status, reason, headers, owned->size());
    auto write = out->write(owned->data(), owned->size());
    return write.attach(kj::mv(out), kj::mv(owned));
  }

  const kj::HttpHeaderTable& table_;
  const status_handlers& handlers_;
};

}  // namespace

struct status_door::impl : private kj::TaskSet::ErrorHandler {
  std::string host;
  status_handlers handlers;
  std::thread thread;
  std::uint16_t port = 0;
  std::mutex mu;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_signal;
  kj::Own<const kj::Executor> executor;
  // Loop-thread objects, valid while it serves.
  kj::Timer* timer = nullptr;
  kj::HttpClient* client = nullptr;
  kj::HttpHeaderTable* table = nullptr;

  void taskFailed(kj::Exception&& e) override {
    spdlog::debug("event=status_connection_ended description=\"{}\"", e.getDescription().cStr());
  }

  void run(std::promise<expected<void>>& started) {
    bool reported = false;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] {
                  auto io = kj::setupAsyncIo();
                  kj::Own<kj::ConnectionReceiver> listener;
                  KJ_IF_MAYBE(bind_error, kj::runCatchingExceptions([&] {
                                auto addr = io.provider->getNetwork().parseAddress(host.c_str(), port).wait(io.waitScope);
                                listener = addr->listen();
                              })) {
                    started.set_value(make_error(errc::unavailable,
                                                 fmt::format("cannot listen for the status port on {}: {}",
                                                             host_port(host, port), bind_error->getDescription().cStr())));
                    reported = true;
                    return;
                  }
                  port = static_cast<std::uint16_t>(listener->getPort());
                  kj::HttpHeaderTable table;
                  status_service service(table, handlers);
                  kj::HttpServerSettings settings;
                  settings.headerTimeout = 10 * kj::SECONDS;
                  kj::HttpServer server(io.provider->getTimer(), table, service, settings);
                  auto served = server.listenHttp(*listener).eagerlyEvaluate(
                      [](kj::Exception&& e) {
                        spdlog::error("event=status_listen_failed description=\"{}\"", e.getDescription().cStr());
                      });
                  kj::HttpClientSettings client_settings;
                  client_settings.idleTimeout = 30 * kj::SECONDS;
                  auto http_client = kj::newHttpClient(io.provider->getTimer(), table, io.provider->getNetwork(),
                                                       nullptr, client_settings);
                  timer = &io.provider->getTimer();
                  client = http_client.get();
                  this->table = &table;
                  executor = kj::getCurrentThreadExecutor().addRef();
                  auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
                  stop_signal = kj::mv(stop.fulfiller);
                  started.set_value({});
                  reported = true;
                  stop.promise.wait(io.waitScope);
                  client = nullptr;
                  timer = nullptr;
                  this->table = nullptr;
                  served = nullptr;
                  io.waitScope.poll();
                })) {
      spdlog::error("event=status_loop_failed description=\"{}\"", e->getDescription().cStr());
      if (!reported) started.set_value(make_error(errc::internal, e->getDescription().cStr()));
    }
  }

  // On the loop thread.
  kj::Promise<expected<std::string>> get(std::string url, std::uint32_t timeout_ms, std::size_t max_bytes) {
    if (!url.starts_with("http://"))
      return expected<std::string>(make_error(
          errc::invalid_argument, fmt::format("scrape target '{}' is not an http:// URL (https is not supported "
                                              "for scrapes: status ports are plain HTTP)", url)));
    auto work = kj::evalNow([&]() -> kj::Promise<expected<std::string>> {
      auto headers = kj::heap<kj::HttpHeaders>(*table);
      auto req = client->request(kj::HttpMethod::GET, kj::StringPtr(url.c_str()), *headers);
      return req.response.then(
          [url, max_bytes](kj::HttpClient::Response&& r) -> kj::Promise<expected<std::string>> {
            if (r.statusCode != 200)
              return expected<std::string>(make_error(
                  errc::invalid_argument, fmt::format("scrape of {} answered {} {}", url, r.statusCode, r.statusText.cStr())));
            auto body = kj::mv(r.body);
            auto& ref = *body;
            // readAllText fails past its limit; that becomes the size error.
            return ref.readAllText(max_bytes)
                .then([](kj::String text) -> expected<std::string> { return std::string(text.cStr(), text.size()); },
                      [url, max_bytes](kj::Exception&&) -> expected<std::string> {
                        return make_error(errc::invalid_argument,
                                          fmt::format("scrape of {} is over {} bytes, or its body broke off", url,
                                                      max_bytes));
                      })
                .attach(kj::mv(body));
          }).attach(kj::mv(headers));
    });
    auto bounded = work.exclusiveJoin(timer->afterDelay(timeout_ms * kj::MILLISECONDS).then([url, timeout_ms] {
      return expected<std::string>(
          make_error(errc::deadline_exceeded, fmt::format("scrape of {} took longer than {} ms", url, timeout_ms)));
    }));
    return bounded.catch_([url](kj::Exception&& e) {
      return expected<std::string>(
          make_error(errc::unavailable, fmt::format("scrape of {} failed: {}", url, e.getDescription().cStr())));
    });
  }
};

expected<std::unique_ptr<status_door>> status_door::start(const std::string& host, std::uint16_t port,
                                                          status_handlers handlers) {
  auto self = std::make_unique<impl>();
  self->host = host;
  self->port = port;
  self->handlers = std::move(handlers);
  std::promise<expected<void>> started;
  auto result = started.get_future();
  self->thread = std::thread([s = self.get(), p = std::move(started)]() mutable { s->run(p); });
  if (auto r = result.get(); !r) {
    self->thread.join();
    return std::unexpected(r.error());
  }
  spdlog::info("event=status_port_started address={} paths=/metrics,/healthz,/readyz", host_port(host, self->port));
  return std::unique_ptr<status_door>(new status_door(std::move(self)));
}

status_door::status_door(std::unique_ptr<impl> impl) : impl_(std::move(impl)) {}
status_door::~status_door() { stop(); }
std::uint16_t status_door::port() const { return impl_->port; }
std::string status_door::url() const { return "http://" + host_port(impl_->host, impl_->port); }

std::vector<expected<std::string>> status_door::fetch(const std::vector<std::string>& urls, std::uint32_t timeout_ms,
                                                      std::size_t max_bytes) {
  std::lock_guard lock(impl_->mu);
  if (!impl_->thread.joinable() || !impl_->executor) {
    return std::vector<expected<std::string>>(urls.size(),
                                              make_error(errc::unavailable, "the status door is stopped"));
  }
  EXA_ASSERT_MSG(std::this_thread::get_id() != impl_->thread.get_id(), "status_door::fetch() from its own loop");
  std::vector<expected<std::string>> out;
  // A loop that ended under us makes executeSync throw: every URL fails.
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { out = impl_->executor->executeSync([&]() -> kj::Promise<std::vector<expected<std::string>>> {
    auto results = kj::heap<std::vector<expected<std::string>>>(urls.size());
    kj::Vector<kj::Promise<void>> all;
    for (std::size_t i = 0; i < urls.size(); ++i) {
      auto* slot = &(*results)[i];
      all.add(impl_->get(urls[i], timeout_ms, max_bytes).then([slot](expected<std::string> r) { *slot = std::move(r); }));
    }
    auto* gathered = results.get();
    return kj::joinPromises(all.releaseAsArray())
        .then([gathered] { return std::move(*gathered); })
        .attach(kj::mv(results));
  }); })) {
    return std::vector<expected<std::string>>(
        urls.size(), make_error(errc::unavailable, std::string("the status door's loop failed: ") + e->getDescription().cStr()));
  }
  return out;
}

void status_door::stop() {
  std::lock_guard lock(impl_->mu);
  if (!impl_->thread.joinable()) return;
  impl_->stop_signal->fulfill();
  impl_->thread.join();
  impl_->executor = nullptr;
}

}  // namespace exa
