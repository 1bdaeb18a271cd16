#include "serving.hpp"

#include <spdlog/spdlog.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "args.hpp"
#include "cli_util.hpp"

namespace exa::app {

expected<serve_config> load_serve_config(const args& a) {
  serve_config config = default_serve_config();
  if (auto path = a.get("config")) {
    std::ifstream in(*path);
    if (!in) return make_error(errc::io_error, "cannot read config file '" + *path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    if (auto ok = apply_config_text(ss.str(), config); !ok)
      return make_error(ok.error().code, *path + ": " + ok.error().message);
  }
  if (auto ok = apply_serve_flags(a, config); !ok) return std::unexpected(ok.error());
  bool needs_default = false;
  for (const auto& d : config.cluster.deployments) needs_default |= d.model_file.empty();
  if (needs_default) {
    auto def = default_model_path();
    if (!def) return std::unexpected(def.error());
    config.cluster.default_model_file = *def;
  }
  return config;
}

flag_spec keys_file_flag() {
  return {"keys-file", true,
          "API keys (exaserve keys add): /v1 calls need 'Authorization: Bearer KEY'; re-read on SIGHUP"};
}
flag_spec no_auth_flag() {
  return {"no-auth", false, "serve /v1 to anyone who reaches the port (local use; the default without --keys-file)"};
}

std::vector<flag_spec> door_tls_flags() {
  return {{"door-tls-cert", true, "HTTPS and RPC over TLS: the front doors' certificate (PEM)"},
          {"door-tls-key", true, "its private key (PEM)"},
          {"door-tls-client-ca", true, "with TLS: clients must present a certificate this CA (PEM) signed"}};
}

expected<void> door_tls_from_flags(const args& a, frontdoor_config& door) {
  const auto cert = a.get("door-tls-cert"), key = a.get("door-tls-key"), ca = a.get("door-tls-client-ca");
  if (cert.has_value() != key.has_value())
    return make_error(errc::invalid_argument, "--door-tls-cert and --door-tls-key go together: give both");
  if (ca && !cert)
    return make_error(errc::invalid_argument, "--door-tls-client-ca needs --door-tls-cert and --door-tls-key");
  door.tls_cert = cert.value_or("");
  door.tls_key = key.value_or("");
  door.tls_client_ca = ca.value_or("");
  return {};
}

expected<std::shared_ptr<auth::key_store>> keys_from_flags(const args& a) {
  const auto path = a.get("keys-file");
  if (path && a.has("no-auth"))
    return make_error(errc::invalid_argument, "--keys-file and --no-auth contradict each other: give one");
  if (!path) {
    spdlog::warn("event=auth_disabled detail=\"{}\"",
                 a.has("no-auth") ? "--no-auth: /v1 and admin calls are open to anyone who reaches the ports"
                                  : "no --keys-file: /v1 and admin calls are open to anyone who reaches the ports");
    return std::shared_ptr<auth::key_store>{};
  }
  auto store = auth::key_store::open(*path);
  if (!store) return make_error(store.error().code, "--keys-file: " + store.error().message);
  const auto keys = (*store)->current();
  std::set<std::string> tenants;
  for (const auto& e : keys->entries()) tenants.insert(e.tenant);
  spdlog::info("event=auth_enabled keys_file={} keys={} tenants={}", *path, keys->entries().size(), tenants.size());
  if (keys->empty())
    spdlog::warn("event=auth_no_keys keys_file={} detail=\"every /v1 call is refused until a key is added and the "
                 "process gets SIGHUP\"",
                 *path);
  return store;
}

sigset_t block_stop_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGINT);
  sigaddset(&s, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  return s;
}

void block_reload_signal(sigset_t& s) {
  sigaddset(&s, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

int wait_for_stop_signal(sigset_t& s, auth::key_store* keys, frontdoor* door) {
  for (;;) {
    int sig = 0;
    sigwait(&s, &sig);
    if (sig != SIGHUP) return sig;
    if (door && door->tls_enabled())
      if (auto ok = door->reload_tls(); !ok)
        spdlog::error("event=tls_reload_failed error=\"{}\" detail=\"the previous certificate stays in use\"",
                      ok.error().message);
    if (!keys) {
      spdlog::info("event=sighup detail=\"no keys file to re-read\"");
      continue;
    }
    if (auto n = keys->reload())
      spdlog::info("event=keys_reloaded keys_file={} keys={}", keys->path(), *n);
    else
      spdlog::error("event=keys_reload_failed keys_file={} error=\"{}\" detail=\"the previous keys stay in force\"",
                    keys->path(), n.error().message);
  }
}

bool wait_ready(api::gateway_backend& backend, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = ask<bool>([&](auto cb) { backend.ready(cb); }, std::chrono::seconds(5));
    if (r && *r) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

void drain(api::gateway_backend& backend, std::chrono::seconds grace) {
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = ask<expected<api::cluster_status>>([&](auto cb) { backend.status(cb); }, std::chrono::seconds(2));
    std::uint32_t busy = 0;
    if (s && *s)
      for (const auto& r : (*s)->replicas) busy += r.running + r.queued;
    if (busy == 0) return;
    spdlog::info("event=draining requests_in_flight={}", busy);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace exa::app
