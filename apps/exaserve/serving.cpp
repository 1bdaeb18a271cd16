#include "serving.hpp"

#include <spdlog/spdlog.h>

#include <fstream>
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
