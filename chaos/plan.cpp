#include "chaos/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>

#include "chaos/plan_json.hpp"
#include "common/assert.hpp"
#include "common/json_syntax.hpp"
#include "common/splitmix64.hpp"

namespace exa::chaos {

namespace {

using json_detail::field_errors;
using json_detail::is_object_field;
using json_detail::json;
using json_detail::object_reader;
using json_detail::valid_name;

constexpr std::uint32_t max_nodes = 1024;
constexpr std::uint32_t max_devices_per_node = 64;
constexpr std::uint32_t max_gateways = 16;
constexpr std::uint32_t max_replicas = max_nodes * max_devices_per_node;
constexpr std::uint32_t max_heartbeat_interval_ms = 600'000;
constexpr std::uint32_t max_window_ms = 3'600'000;
constexpr std::uint32_t max_request_deadline_ms = 86'400'000;
constexpr std::uint32_t max_migration_parallelism = 1024;
constexpr std::uint32_t max_suspect_after_missed = 100;
constexpr double max_rate_per_s = 100'000;
constexpr double max_duration_s = 86'400;
constexpr std::uint32_t max_prompt_tokens = 4096;
constexpr std::uint32_t max_max_tokens = 4096;
constexpr double max_temperature = 2;
constexpr std::uint32_t max_prompts = 1024;
constexpr double max_rate_per_min = 6000;
constexpr double max_fault_duration_s = 86'400;
constexpr std::uint32_t max_delay_ms = 3'600'000;

// The prompt tag alphabet: 64 printable characters, so two of them tell 4096
// prompts apart.
constexpr std::string_view tag_alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+-";

// ---------------------------------------------------------------------------
// Sections.

void parse_cluster(const object_reader& r, cluster_spec& c) {
  r.known_keys({"nodes", "devices_per_node", "racks", "replicas", "engine", "heartbeat_interval_ms",
                "suspect_after_missed", "observation_window_ms", "device_check_interval_ms",
                "request_deadline_ms", "migration_parallelism", "gateways", "degraded_step_ms",
                "degraded_replace_after_ms"});
  r.u32("nodes", 1, max_nodes, c.nodes);
  r.u32("gateways", 1, max_gateways, c.gateways);
  r.u32("devices_per_node", 1, max_devices_per_node, c.devices_per_node);
  r.u32("racks", 1, max_nodes, c.racks);
  if (!r.errors().failed() && c.racks > c.nodes)
    r.errors().fail(r.field("racks"), fmt::format("{} racks for {} nodes leaves racks empty", c.racks, c.nodes));
  r.u32("replicas", 1, max_replicas, c.replicas);
  r.string("engine", 16, c.engine);
  if (!r.errors().failed() && c.engine != "cpu" && c.engine != "null")
    r.errors().fail(r.field("engine"), "must be \"cpu\" or \"null\" (got \"" + c.engine + "\")");
  r.u32("heartbeat_interval_ms", 1, max_heartbeat_interval_ms, c.heartbeat_interval_ms);
  r.u32("suspect_after_missed", 1, max_suspect_after_missed, c.suspect_after_missed);
  r.u32("observation_window_ms", 1, max_window_ms, c.observation_window_ms);
  r.u32("device_check_interval_ms", 1, max_window_ms, c.device_check_interval_ms);
  r.u32("request_deadline_ms", 1, max_request_deadline_ms, c.request_deadline_ms);
  r.u32("migration_parallelism", 1, max_migration_parallelism, c.migration_parallelism);
  r.u32("degraded_step_ms", 0, max_window_ms, c.degraded_step_ms);
  r.u32("degraded_replace_after_ms", 0, max_window_ms, c.degraded_replace_after_ms);
}

std::optional<workload_kind> workload_kind_from_string(std::string_view s) {
  if (s == "steady") return workload_kind::steady;
  if (s == "ramp") return workload_kind::ramp;
  if (s == "chaos") return workload_kind::chaos;
  return std::nullopt;
}

void parse_workload(const object_reader& r, workload_spec& w) {
  r.known_keys({"kind", "rate_per_s", "end_rate_per_s", "duration_s", "prompt_tokens", "max_tokens",
                "temperature", "prompts"});
  std::string kind = "steady";
  r.string("kind", 16, kind);
  const auto k = workload_kind_from_string(kind);
  if (!r.errors().failed() && !k)
    return r.errors().fail(r.field("kind"), "must be \"steady\", \"ramp\" or \"chaos\" (got \"" + kind + "\")");
  if (k) w.kind = *k;
  r.number("rate_per_s", 0, true, max_rate_per_s, w.rate_per_s);
  if (w.kind != workload_kind::ramp) r.forbid("end_rate_per_s", "only applies to \"ramp\" workloads");
  r.number("end_rate_per_s", 0, true, max_rate_per_s, w.end_rate_per_s);
  r.number("duration_s", 0, true, max_duration_s, w.duration_s);
  r.u32("prompt_tokens", 1, max_prompt_tokens, w.prompt_tokens);
  r.u32("max_tokens", 1, max_max_tokens, w.max_tokens);
  r.number("temperature", 0, false, max_temperature, w.temperature);
  r.u32("prompts", 1, max_prompts, w.prompts);
  if (r.errors().failed()) return;
  if (w.prompt_tokens == 1 && w.prompts > tag_alphabet.size())
    return r.errors().fail(r.field("prompts"),
                           fmt::format("{} distinct prompts need prompt_tokens >= 2 (one byte tells {} apart)",
                                       w.prompts, tag_alphabet.size()));
  const double end_rate = w.kind == workload_kind::ramp ? w.end_rate_per_s : w.rate_per_s;
  const double expected_requests = (w.rate_per_s + end_rate) / 2 * w.duration_s;
  if (expected_requests > max_workload_requests)
    r.errors().fail(r.field("rate_per_s"), fmt::format("the workload expects {:.0f} requests, more than {:.0f}",
                                                       expected_requests, max_workload_requests));
}

// Which optional fields each fault kind uses; node is always accepted.
enum class use : std::uint8_t { no, required, optional };

struct kind_fields {
  bool node_required = true;
  bool device = false;
  use duration = use::no;
  use delay = use::no;
  use probability = use::no;
  bool gateway = false;
};

kind_fields fields_of(fault_kind k) {
  switch (k) {
    case fault_kind::kill_replica: return {.node_required = false};
    case fault_kind::kill_node: return {};
    case fault_kind::partition_node: return {.duration = use::required};
    case fault_kind::heartbeat_jitter: return {.duration = use::required, .delay = use::required};
    case fault_kind::fail_device: return {.device = true};
    case fault_kind::hang_device: return {.device = true, .duration = use::required};
    case fault_kind::slow_model_load: return {.duration = use::required, .delay = use::required};
    case fault_kind::slow_device: return {.device = true, .duration = use::required, .delay = use::required};
    case fault_kind::drop_messages: return {.duration = use::required, .probability = use::required};
    case fault_kind::delay_messages: return {.duration = use::required, .delay = use::required};
    case fault_kind::duplicate_messages: return {.duration = use::required, .probability = use::required};
    case fault_kind::kill_router:
    case fault_kind::kill_controller:
    case fault_kind::kill_health_monitor: return {.node_required = false};
    case fault_kind::kill_process: return {};
    case fault_kind::stop_process: return {.duration = use::optional};
    case fault_kind::cont_process: return {};
    case fault_kind::partition_host: return {.duration = use::required};
    case fault_kind::netem:
      return {.duration = use::required, .delay = use::optional, .probability = use::optional};
    case fault_kind::restart_controller: return {.node_required = false};
    case fault_kind::kill_gateway: return {.node_required = false, .gateway = true};
  }
  return {};
}

void parse_fault_timing(const object_reader& r, const workload_spec& w, fault_spec& f) {
  if (!r.errors().failed() && r.has("at_s") == r.has("rate_per_min"))
    return r.errors().fail(r.field("at_s"), "exactly one of at_s or rate_per_min is required");
  if (r.has("at_s")) {
    r.forbid("from_s", "only applies with rate_per_min");
    r.forbid("to_s", "only applies with rate_per_min");
    r.number("at_s", 0, false, w.duration_s, f.at_s);
    return;
  }
  r.number("rate_per_min", 0, true, max_rate_per_min, f.rate_per_min);
  f.from_s = 0;
  f.to_s = w.duration_s;
  r.number("from_s", 0, false, w.duration_s, f.from_s);
  r.number("to_s", 0, true, w.duration_s, f.to_s);
  if (r.errors().failed()) return;
  if (f.from_s >= f.to_s)
    return r.errors().fail(r.field("to_s"), fmt::format("must be after from_s (from_s {}, to_s {})", f.from_s, f.to_s));
  const double expected_faults = *f.rate_per_min * (f.to_s - f.from_s) / 60;
  if (expected_faults > max_random_faults_per_process)
    r.errors().fail(r.field("rate_per_min"), fmt::format("expects {:.0f} faults, more than {:.0f}", expected_faults,
                                                         max_random_faults_per_process));
}

void parse_fault_target(const object_reader& r, const cluster_spec& c, const kind_fields& k, fault_spec& f) {
  const std::string kind(to_string(f.kind));
  if (k.gateway) {
    r.forbid("node", "does not apply to " + kind + " (it takes \"gateway\")");
    r.require("gateway", "required for " + kind);
    std::uint32_t g = 0;
    r.u32("gateway", 0, std::numeric_limits<std::uint32_t>::max(), g);
    if (!r.errors().failed() && g >= c.gateways)
      return r.errors().fail(r.field("gateway"), fmt::format("{} is not a gateway of a cluster with {}", g, c.gateways));
    f.gateway = g;
  } else {
    r.forbid("gateway", "only applies to kill_gateway");
  }
  if (k.node_required) r.require("node", "required for " + kind);
  std::uint32_t node = 0;
  r.u32("node", 0, std::numeric_limits<std::uint32_t>::max(), node);
  if (!r.errors().failed() && r.has("node")) {
    if (node >= c.nodes)
      return r.errors().fail(r.field("node"), fmt::format("{} is not a node of a {}-node cluster", node, c.nodes));
    f.node = node;
  }
  if (!k.device) return r.forbid("device", "does not apply to " + kind);
  r.require("device", "required for " + kind);
  std::uint32_t device = 0;
  r.u32("device", 0, std::numeric_limits<std::uint32_t>::max(), device);
  if (r.errors().failed()) return;
  if (device >= c.devices_per_node)
    return r.errors().fail(r.field("device"), fmt::format("{} is not a device of a node with {} devices", device,
                                                          c.devices_per_node));
  f.device = device;
}

// Whether `key` may, must or must not be given for this kind.
bool field_wanted(const object_reader& r, use u, const char* key, const std::string& kind) {
  if (u == use::no) {
    r.forbid(key, "does not apply to " + kind);
    return false;
  }
  if (u == use::required) r.require(key, "required for " + kind);
  return r.has(key);
}

void parse_fault_params(const object_reader& r, const kind_fields& k, fault_spec& f) {
  const std::string kind(to_string(f.kind));
  if (field_wanted(r, k.duration, "duration_s", kind)) r.number("duration_s", 0, true, max_fault_duration_s, f.duration_s);
  if (field_wanted(r, k.delay, "delay_ms", kind)) r.u32("delay_ms", 1, max_delay_ms, f.delay_ms);
  if (field_wanted(r, k.probability, "probability", kind)) r.number("probability", 0, true, 1, f.probability);
  else if (k.probability == use::optional) f.probability = 0;
  if (!r.errors().failed() && f.kind == fault_kind::netem && f.delay_ms == 0 && f.probability == 0)
    r.errors().fail(r.field("kind"), "netem needs delay_ms, probability (the loss) or both");
}

}  // namespace

void json_detail::parse_fault(const object_reader& r, const cluster_spec& c, const workload_spec& w,
                              fault_spec& f) {
  r.known_keys({"kind", "at_s", "rate_per_min", "from_s", "to_s", "node", "device", "duration_s", "delay_ms",
                "probability", "gateway"});
  r.require("kind");
  std::string kind;
  r.string("kind", 32, kind);
  if (r.errors().failed()) return;
  const auto k = fault_kind_from_string(kind);
  if (!k) return r.errors().fail(r.field("kind"), "unknown fault kind \"" + kind + "\"");
  f.kind = *k;
  const kind_fields fields = fields_of(f.kind);
  parse_fault_timing(r, w, f);
  parse_fault_target(r, c, fields, f);
  parse_fault_params(r, fields, f);
}

namespace {

void parse_faults(const object_reader& r, plan& p) {
  if (r.errors().failed() || !r.has("faults")) return;
  const json& arr = r.at("faults");
  if (!arr.is_array()) return r.errors().fail("faults", "must be an array");
  if (arr.size() > max_faults) return r.errors().fail("faults", fmt::format("more than {} faults", max_faults));
  for (std::size_t i = 0; i < arr.size() && !r.errors().failed(); ++i) {
    const std::string path = fmt::format("faults[{}]", i);
    if (!arr[i].is_object()) return r.errors().fail(path, "must be an object");
    fault_spec f;
    json_detail::parse_fault(object_reader(arr[i], path, r.errors()), p.cluster, p.workload, f);
    p.faults.push_back(f);
  }
}

}  // namespace

std::string_view to_string(fault_kind k) noexcept {
  switch (k) {
    case fault_kind::kill_replica: return "kill_replica";
    case fault_kind::kill_node: return "kill_node";
    case fault_kind::partition_node: return "partition_node";
    case fault_kind::heartbeat_jitter: return "heartbeat_jitter";
    case fault_kind::fail_device: return "fail_device";
    case fault_kind::hang_device: return "hang_device";
    case fault_kind::slow_model_load: return "slow_model_load";
    case fault_kind::drop_messages: return "drop_messages";
    case fault_kind::delay_messages: return "delay_messages";
    case fault_kind::duplicate_messages: return "duplicate_messages";
    case fault_kind::kill_router: return "kill_router";
    case fault_kind::kill_controller: return "kill_controller";
    case fault_kind::kill_health_monitor: return "kill_health_monitor";
    case fault_kind::kill_process: return "kill_process";
    case fault_kind::stop_process: return "stop_process";
    case fault_kind::cont_process: return "cont_process";
    case fault_kind::partition_host: return "partition_host";
    case fault_kind::netem: return "netem";
    case fault_kind::restart_controller: return "restart_controller";
    case fault_kind::kill_gateway: return "kill_gateway";
    case fault_kind::slow_device: return "slow_device";
  }
  return "unknown";
}

std::optional<fault_kind> fault_kind_from_string(std::string_view s) noexcept {
  constexpr std::array all = {fault_kind::kill_replica,    fault_kind::kill_node,     fault_kind::partition_node,
                              fault_kind::heartbeat_jitter, fault_kind::fail_device,   fault_kind::hang_device,
                              fault_kind::slow_model_load,  fault_kind::drop_messages, fault_kind::delay_messages,
                              fault_kind::duplicate_messages, fault_kind::kill_router, fault_kind::kill_controller,
                              fault_kind::kill_health_monitor, fault_kind::kill_process, fault_kind::stop_process,
                              fault_kind::cont_process,    fault_kind::partition_host, fault_kind::netem,
                              fault_kind::restart_controller, fault_kind::kill_gateway, fault_kind::slow_device};
  for (fault_kind k : all)
    if (to_string(k) == s) return k;
  return std::nullopt;
}

expected<json_detail::json> json_detail::parse_json_object(const std::string& text, std::size_t max_bytes,
                                                          std::string_view what) {
  if (text.size() > max_bytes)
    return make_error(errc::invalid_argument, fmt::format("{}: larger than {} bytes", what, max_bytes));
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return make_error(errc::invalid_argument, fmt::format("{}: not valid JSON: {}", what, json_syntax_error(text)));
  }
  if (!doc.is_object()) return make_error(errc::invalid_argument, fmt::format("{}: must be a JSON object", what));
  return doc;
}

expected<plan> parse_plan(const std::string& json_text) {
  auto parsed = json_detail::parse_json_object(json_text, max_plan_bytes, "plan");
  if (!parsed) return std::unexpected(parsed.error());
  const json& doc = *parsed;

  plan p;
  field_errors errs;
  const object_reader top(doc, "", errs);
  top.known_keys({"name", "description", "seed", "cluster", "workload", "faults"});
  top.require("name");
  top.string("name", max_plan_name_chars, p.name);
  if (!errs.failed() && !valid_name(p.name)) errs.fail("name", "must be letters, digits, '.', '_' or '-'");
  top.string("description", max_plan_description_chars, p.description);
  top.u64("seed", 0, std::numeric_limits<std::uint64_t>::max(), p.seed);
  if (is_object_field(top, "cluster")) parse_cluster(object_reader(doc.at("cluster"), "cluster", errs), p.cluster);
  if (is_object_field(top, "workload"))
    parse_workload(object_reader(doc.at("workload"), "workload", errs), p.workload);
  parse_faults(top, p);
  if (errs.failed()) return std::unexpected(errs.first());
  return p;
}

expected<std::string> json_detail::read_text_file(const std::string& path, std::size_t max_bytes,
                                                  std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io_error, fmt::format("cannot open {} file {}", what, path));
  // Read one byte past the limit so an oversized file is told apart from one
  // exactly at it, without reading an arbitrarily large file into memory.
  std::string text(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return make_error(errc::io_error, fmt::format("cannot read {} file {}", what, path));
  text.resize(static_cast<std::size_t>(in.gcount()));
  return text;
}

bool is_process_fault(fault_kind k) noexcept {
  switch (k) {
    case fault_kind::kill_process:
    case fault_kind::stop_process:
    case fault_kind::cont_process:
    case fault_kind::partition_host:
    case fault_kind::netem:
    case fault_kind::restart_controller:
    case fault_kind::kill_gateway: return true;
    default: return false;
  }
}

expected<void> check_plan_mode(const plan& p, bool processes) {
  for (std::size_t i = 0; i < p.faults.size(); ++i) {
    const auto k = p.faults[i].kind;
    if (processes && !is_process_fault(k) && k != fault_kind::kill_controller)
      return make_error(errc::invalid_argument,
                        fmt::format("faults[{}]: {} acts on actors inside one process; a --processes plan uses "
                                    "kill_process, stop_process, cont_process, partition_host, netem, "
                                    "kill_controller, restart_controller and kill_gateway",
                                    i, to_string(k)));
    if (!processes && is_process_fault(k))
      return make_error(errc::invalid_argument,
                        fmt::format("faults[{}]: {} acts on real processes: run the plan with --processes", i,
                                    to_string(k)));
  }
  if (!processes && p.cluster.gateways != 1)
    return make_error(errc::invalid_argument, "cluster.gateways: more than one gateway needs --processes");
  return {};
}

expected<plan> load_plan(const std::string& path) {
  auto text = json_detail::read_text_file(path, max_plan_bytes, "plan");
  if (!text) return std::unexpected(text.error());
  auto parsed = parse_plan(*text);
  if (!parsed) return make_error(parsed.error().code, path + ": " + parsed.error().message);
  return parsed;
}

// ---------------------------------------------------------------------------
// Schedules.

namespace {


// Independent streams per purpose and per fault or request, so adding a
// fault to a plan does not move the times of the others.
constexpr std::uint64_t fault_stream = 0x6661756c74ull;     // "fault"
constexpr std::uint64_t request_stream = 0x72657175657374ull;  // "request"
constexpr std::uint64_t arrival_stream = 0x617272697661ull;    // "arrival"
constexpr std::uint64_t prompt_stream = 0x70726f6d7074ull;     // "prompt"

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  return splitmix64_finalize(seed ^ splitmix64_finalize(stream + splitmix64_finalize(index)));
}

// Hard caps behind the parse-time limits, for plans built in code.
constexpr std::size_t max_generated_per_process = 4 * static_cast<std::size_t>(max_random_faults_per_process);
constexpr std::size_t max_generated_requests = 4 * static_cast<std::size_t>(max_workload_requests);

}  // namespace

std::vector<scheduled_fault> schedule(const plan& p, std::optional<std::uint64_t> seed) {
  const std::uint64_t s = seed.value_or(p.seed);
  std::vector<scheduled_fault> out;
  for (std::size_t i = 0; i < p.faults.size(); ++i) {
    const fault_spec& f = p.faults[i];
    if (f.at_s) {
      out.push_back({0, *f.at_s, f});
      continue;
    }
    EXA_ASSERT_MSG(f.rate_per_min.has_value(), "a fault needs at_s or rate_per_min");
    splitmix64_stream rng(derive_seed(s, fault_stream, i));
    const double rate_per_s = *f.rate_per_min / 60;
    double t = f.from_s;
    for (std::size_t n = 0; n < max_generated_per_process; ++n) {
      t += rng.exponential(rate_per_s);
      if (!(t < f.to_s)) break;
      out.push_back({0, t, f});
    }
  }
  // Stable: equal times keep plan order (and a process's own order).
  std::stable_sort(out.begin(), out.end(),
                   [](const scheduled_fault& a, const scheduled_fault& b) { return a.at_s < b.at_s; });
  for (std::size_t i = 0; i < out.size(); ++i) out[i].id = i + 1;
  return out;
}

std::vector<scheduled_request> schedule_workload(const plan& p, std::optional<std::uint64_t> seed) {
  const std::uint64_t s = seed.value_or(p.seed);
  const workload_spec& w = p.workload;
  const double start_rate = w.rate_per_s;
  const double end_rate = w.kind == workload_kind::ramp ? w.end_rate_per_s : w.rate_per_s;
  // Thinning (Lewis and Shedler): candidates at the peak rate, each kept with
  // probability rate(t) / peak, give a Poisson process of rate rate(t).
  const double peak = std::max(start_rate, end_rate);
  std::vector<scheduled_request> out;
  if (!(peak > 0) || !(w.duration_s > 0) || w.prompts == 0) return out;
  splitmix64_stream rng(derive_seed(s, arrival_stream, 0));
  double t = 0;
  for (std::size_t n = 0; n < max_generated_requests; ++n) {
    t += rng.exponential(peak);
    if (!(t < w.duration_s)) break;
    const double rate = start_rate + (end_rate - start_rate) * (t / w.duration_s);
    if (rng.uniform() * peak >= rate) continue;
    const std::uint64_t index = out.size();
    out.push_back({.id = fmt::format("w{}", index),
                   .at_s = t,
                   .prompt = static_cast<std::uint32_t>(index % w.prompts),
                   .max_tokens = w.max_tokens,
                   .temperature = static_cast<float>(w.temperature),
                   .seed = derive_seed(s, request_stream, index)});
  }
  return out;
}

std::string workload_prompt(const workload_spec& w, std::uint32_t index) {
  // A small fixed vocabulary keeps prompts readable and tokenizable by any
  // model; the seeded word choice makes prompts differ beyond their tag.
  static constexpr std::array<std::string_view, 32> words = {
      "the",   "river", "stone",  "light", "north",  "quiet", "garden", "signal", "copper", "window", "seven",
      "cloud", "paper", "engine", "maple", "harbor", "amber", "violet", "summer", "bridge", "lantern", "falcon",
      "marble", "orbit", "silver", "meadow", "crystal", "thunder", "velvet", "canyon", "ember", "willow"};
  const std::size_t n = w.prompt_tokens;
  std::string out;
  out.reserve(n + 16);
  out.push_back(tag_alphabet[index % tag_alphabet.size()]);
  out.push_back(tag_alphabet[(index / tag_alphabet.size()) % tag_alphabet.size()]);
  splitmix64_stream rng(derive_seed(0, prompt_stream, index));
  while (out.size() < n) {
    out.push_back(' ');
    out += words[rng.next() % words.size()];
  }
  out.resize(n);
  // A prompt ending in a space tokenizes oddly on some models.
  if (n > 1 && out.back() == ' ') out.back() = '.';
  return out;
}

}  // namespace exa::chaos
