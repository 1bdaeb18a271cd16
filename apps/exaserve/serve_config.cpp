#include "serve_config.hpp"

#include <charconv>
#include <functional>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "args.hpp"
#include "cluster/routing.hpp"
#include "engine/speculative.hpp"
#include "gpu/device_select.hpp"
#include "template/chat_template.hpp"

namespace exa::app {
namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

expected<std::uint64_t> to_uint(const std::string& v, std::uint64_t min, std::uint64_t max, const std::string& what) {
  std::uint64_t out = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size())
    return make_error(errc::invalid_argument, what + " must be an integer, got '" + v + "'");
  if (out < min || out > max)
    return make_error(errc::invalid_argument, what + " must be in [" + std::to_string(min) + ", " +
                                                  std::to_string(max) + "], got " + v);
  return out;
}

using setter = std::function<expected<void>(const std::string&, const std::string&)>;

template <class T>
setter uint_setter(T& dst, std::uint64_t min, std::uint64_t max, std::uint64_t scale = 1) {
  return [&dst, min, max, scale](const std::string& v, const std::string& what) -> expected<void> {
    auto n = to_uint(v, min, max, what);
    if (!n) return std::unexpected(n.error());
    dst = static_cast<T>(*n * scale);
    return {};
  };
}

setter positive_double_setter(double& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(x > 0) || x > 1e9)
      return make_error(errc::invalid_argument, what + ": expected a number above 0, got '" + v + "'");
    dst = x;
    return {};
  };
}

// prefix_aware's load_slack_ratio: a plain number, range-checked by the
// router's own check so the file and a deploy request refuse the same values.
setter prefix_slack_ratio_setter(double& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !cluster::check_prefix_slack(0, x, 0))
      return make_error(errc::invalid_argument, what + " must be a number in [0, " +
                                                    fmt::format("{}", cluster::prefix_slack_ratio_max) + "], got '" +
                                                    v + "'");
    dst = x;
    return {};
  };
}

// prefix_aware's load_slack_s: seconds, range-checked by the router's check.
setter prefix_slack_s_setter(double& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !cluster::check_prefix_slack(0, 0, x))
      return make_error(errc::invalid_argument, what + " must be a number of seconds in [0, " +
                                                    fmt::format("{}", cluster::prefix_slack_s_max) + "], got '" +
                                                    v + "'");
    dst = x;
    return {};
  };
}

setter bool_setter(bool& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    if (v != "true" && v != "false") return make_error(errc::invalid_argument, what + ": must be true or false, got '" + v + "'");
    dst = v == "true";
    return {};
  };
}

setter string_setter(std::string& dst) {
  return [&dst](const std::string& v, const std::string&) -> expected<void> {
    dst = v;
    return {};
  };
}

// A deployment's chat_template = NAME|FILE becomes the template's text at
// once: a FILE is read where the config is, and the text is what the deploy
// request, the journal and the routers' announces carry.
setter template_setter(std::string& dst, const std::string& deployment) {
  return [&dst, deployment](const std::string& v, const std::string& what) -> expected<void> {
    auto t = jinja::resolve_template_override(v);
    if (!t) return make_error(t.error().code, what + " of deployment '" + deployment + "': " + t.error().message);
    dst = std::move(t->text);
    return {};
  };
}

// A file path that must be given (an empty one would silently mean "none").
setter path_setter(std::string& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    if (v.empty()) return make_error(errc::invalid_argument, what + " needs a file (leave the key out for none)");
    dst = v;
    return {};
  };
}

setter engine_setter(std::string& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    if (v != "cpu" && v != "null") return make_error(errc::invalid_argument, what + " must be cpu or null, got '" + v + "'");
    dst = v;
    return {};
  };
}

// cpu, cuda or auto (gpu::parse_kind_request), checked while parsing.
setter device_kind_setter(std::string& dst) {
  return [&dst](const std::string& v, const std::string& what) -> expected<void> {
    if (auto k = gpu::parse_kind_request(v); !k) return make_error(errc::invalid_argument, what + ": " + k.error().message);
    dst = v;
    return {};
  };
}

std::map<std::string, setter> cluster_keys(actors::cluster_options& c) {
  return {{"nodes", uint_setter(c.nodes, 1, 1024)},
          {"devices_per_node", uint_setter(c.devices_per_node, 1, 64)},
          {"racks", uint_setter(c.racks, 1, 1024)},
          {"regions", uint_setter(c.regions, 0, 64)},
          {"gateway_region", string_setter(c.gateway_region)},
          {"device_memory_mb", uint_setter(c.device_memory_bytes, 16, 1 << 22, 1ull << 20)},
          {"kv_page_kb", uint_setter(c.kv_page_bytes, 4, 65536, 1024)},
          {"device_threads", uint_setter(c.device_threads, 1, 256)},
          {"engine", engine_setter(c.engine)},
          {"device_kind", device_kind_setter(c.device_kind)},
          {"kv_tokens", uint_setter(c.default_kv_tokens, 16, 1u << 24)},
          {"routing", string_setter(c.default_routing)},
          {"heartbeat_interval_ms", uint_setter(c.heartbeat_interval_ms, 10, 600000)},
          {"suspect_after_missed", uint_setter(c.suspect_after_missed, 1, 1000)},
          {"observation_window_ms", uint_setter(c.observation_window_ms, 0, 3600000)},
          {"request_deadline_ms", uint_setter(c.request_deadline_ms, 100, 86400000)},
          {"chat_template", string_setter(c.chat_template)},
          {"queued_per_model_max", uint_setter(c.queued_per_model_max, 1, 1u << 20)},
          {"drain_deadline_ms", uint_setter(c.drain_deadline_ms, 100, 3600000)},
          {"loads_max", uint_setter(c.loads_max, 1, 1u << 20)},
          {"model_cache_mb", uint_setter(c.model_cache_bytes, 1, 1ull << 30, 1ull << 20)},
          {"model_store", string_setter(c.model_store)},
          {"model_cache_dir", string_setter(c.model_cache_dir)},
          {"loads_per_node_max", uint_setter(c.loads_per_node_max, 1, 4096)},
          {"degraded_step_ms", uint_setter(c.degraded_step_ms, 0, 3600000)},
          {"degraded_error_percent", uint_setter(c.degraded_error_percent, 1, 101)},
          {"degraded_replace_after_ms", uint_setter(c.degraded_replace_after_ms, 0, 86400000)},
          {"rollout_bake_s", uint_setter(c.rollout_bake_s, 1, 7 * 86400)},
          {"rollout_min_samples", uint_setter(c.rollout_min_samples, 1, 1u << 20)},
          {"rollout_tick_ms", uint_setter(c.rollout_tick_ms, 10, 60000)},
          {"rollout_latency_percent", uint_setter(c.rollout_latency_percent, 0, 1000)},
          {"rollout_latency_slack_ms", uint_setter(c.rollout_latency_slack_ms, 0, 600000)},
          {"rollout_error_points", uint_setter(c.rollout_error_points, 0, 100)},
          {"rollout_start_timeout_ms", uint_setter(c.rollout_start_timeout_ms, 1000, 86400000)},
          {"rollout_drop_grace_ms", uint_setter(c.rollout_drop_grace_ms, 0, 3600000)},
          {"autoscale_up_window_s", uint_setter(c.autoscale_up_window_s, 1, 3600)},
          {"autoscale_down_window_s", uint_setter(c.autoscale_down_window_s, 1, 86400)},
          {"autoscale_up_cooldown_s", uint_setter(c.autoscale_up_cooldown_s, 0, 3600)},
          {"autoscale_down_cooldown_s", uint_setter(c.autoscale_down_cooldown_s, 0, 86400)},
          {"autoscale_tolerance_percent", uint_setter(c.autoscale_tolerance_percent, 0, 99)},
          {"autoscale_max_down_percent", uint_setter(c.autoscale_max_down_percent, 1, 100)},
          {"autoscale_tick_ms", uint_setter(c.autoscale_tick_ms, 10, 60000)},
          {"consolidate", bool_setter(c.consolidate)},
          {"step_stop", bool_setter(c.step_stop)}};
}

std::map<std::string, setter> server_keys(frontdoor_config& s) {
  return {{"host", string_setter(s.host)},
          {"http_port", uint_setter(s.http_port, 0, 65535)},
          {"rpc_port", uint_setter(s.rpc_port, 0, 65535)},
          {"max_body_kb", uint_setter(s.max_body_bytes, 1, 1 << 20, 1024)}};
}

std::map<std::string, setter> deployment_keys(api::deploy_request& d) {
  return {{"model", string_setter(d.model_file)},
          {"replicas", uint_setter(d.replicas, 1, 4096)},
          {"kv_tokens", uint_setter(d.kv_tokens, 16, 1u << 24)},
          {"routing", string_setter(d.routing)},
          {"prefix_slack_tokens", uint_setter(d.prefix_slack_tokens, 0, cluster::prefix_slack_tokens_max)},
          {"prefix_slack_ratio", prefix_slack_ratio_setter(d.prefix_slack_ratio)},
          {"prefix_slack_s", prefix_slack_s_setter(d.prefix_slack_s)},
          {"sha256", string_setter(d.model_sha256)},
          {"tenant", string_setter(d.tenant)},
          {"warm_pool_percent", uint_setter(d.warm_pool_percent, 0, 50)},
          {"autoscale_min", uint_setter(d.autoscale_min, 0, 4096)},
          {"autoscale_max", uint_setter(d.autoscale_max, 0, 4096)},
          {"autoscale_metric", string_setter(d.autoscale_metric)},
          {"autoscale_target", positive_double_setter(d.autoscale_target)},
          {"idle_to_zero_s", uint_setter(d.idle_to_zero_s, 0, 604800)},
          {"chat_template", template_setter(d.chat_template, d.name)},
          {"draft_model", path_setter(d.draft_model)},
          {"draft_sha256", string_setter(d.draft_sha256)},
          {"draft_tokens", uint_setter(d.draft_tokens, 1, engine::max_draft_tokens)},
          {"tensor_parallel", uint_setter(d.tensor_parallel, 1, 8)}};
}

// Keys that only mean something together, checked once the file is read.
expected<void> check_deployment(const api::deploy_request& d) {
  if (d.draft_model.empty() && (d.draft_tokens != 0 || !d.draft_sha256.empty()))
    return make_error(errc::invalid_argument,
                      "deployment '" + d.name + "': draft_tokens and draft_sha256 need draft_model (a draft GGUF file)");
  return {};
}

}  // namespace

serve_config default_serve_config() {
  serve_config c;
  api::deploy_request d;
  d.name = "tiny";
  d.replicas = 2;
  c.cluster.deployments.push_back(d);
  return c;
}

expected<void> apply_config_text(const std::string& text, serve_config& config) {
  std::istringstream in(text);
  std::string line, section;
  api::deploy_request* deployment = nullptr;
  bool saw_deployment = false;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = "line " + std::to_string(n);
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = trim(line);
    if (line.empty()) continue;
    if (line.front() == '[') {
      if (line.back() != ']') return make_error(errc::invalid_argument, where + ": unterminated section header");
      section = trim(line.substr(1, line.size() - 2));
      if (section.rfind("deployment ", 0) == 0) {
        if (!saw_deployment) config.cluster.deployments.clear();  // the file replaces the default one
        saw_deployment = true;
        api::deploy_request d;
        d.name = trim(section.substr(11));
        config.cluster.deployments.push_back(d);
        deployment = &config.cluster.deployments.back();
        section = "deployment";
      } else if (section != "cluster" && section != "server") {
        return make_error(errc::invalid_argument, where + ": unknown section [" + section + "]");
      }
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) return make_error(errc::invalid_argument, where + ": expected key = value");
    const std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    std::map<std::string, setter> keys;
    if (section == "cluster") keys = cluster_keys(config.cluster);
    else if (section == "server") keys = server_keys(config.server);
    else if (section == "deployment") keys = deployment_keys(*deployment);
    else return make_error(errc::invalid_argument, where + ": key '" + key + "' outside any section");
    const auto it = keys.find(key);
    if (it == keys.end()) return make_error(errc::invalid_argument, where + ": unknown key '" + key + "' in [" + section + "]");
    if (auto ok = it->second(value, where + ": " + key); !ok) return ok;
  }
  for (const auto& d : config.cluster.deployments)
    if (auto ok = check_deployment(d); !ok) return ok;
  return {};
}

expected<void> apply_serve_flags(const args& a, serve_config& config) {
  const std::map<std::string, setter> flags = {
      {"nodes", uint_setter(config.cluster.nodes, 1, 1024)},
      {"devices-per-node", uint_setter(config.cluster.devices_per_node, 1, 64)},
      {"device-memory-mb", uint_setter(config.cluster.device_memory_bytes, 16, 1 << 22, 1ull << 20)},
      {"engine", engine_setter(config.cluster.engine)},
      {"device-kind", device_kind_setter(config.cluster.device_kind)},
      {"host", string_setter(config.server.host)},
      {"http-port", uint_setter(config.server.http_port, 0, 65535)},
      {"rpc-port", uint_setter(config.server.rpc_port, 0, 65535)},
      {"chat-template", string_setter(config.cluster.chat_template)},
  };
  for (const auto& [name, set] : flags)
    if (auto v = a.get(name))
      if (auto ok = set(*v, "--" + name); !ok) return ok;
  if (auto m = a.get("model")) {
    if (config.cluster.deployments.empty()) return make_error(errc::invalid_argument, "--model: no deployment to serve it");
    config.cluster.deployments.front().model_file = *m;
  }
  if (auto r = a.get("replicas")) {
    if (config.cluster.deployments.empty()) return make_error(errc::invalid_argument, "--replicas: no deployment");
    auto n = to_uint(*r, 1, 4096, "--replicas");
    if (!n) return std::unexpected(n.error());
    config.cluster.deployments.front().replicas = static_cast<std::uint32_t>(*n);
  }
  return {};
}

}  // namespace exa::app
