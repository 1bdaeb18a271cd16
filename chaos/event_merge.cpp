#include "chaos/event_merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

namespace exa::chaos {
namespace {

using json = nlohmann::json;

std::optional<event_kind> kind_from_string(std::string_view s) {
  for (auto k : {event_kind::request_accepted, event_kind::request_tokens, event_kind::request_finished,
                 event_kind::replica_state, event_kind::node_state, event_kind::fault_injected,
                 event_kind::fault_detected, event_kind::fault_recovered, event_kind::fault_cleared,
                 event_kind::clock_offset, event_kind::rollout})
    if (to_string(k) == s) return k;
  return std::nullopt;
}

// Reads an optional field of one type; a field of another type is an error.
template <class T>
bool read_field(const json& j, const char* key, T& out, std::string& error) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  try {
    out = it->get<T>();
    return true;
  } catch (const json::exception&) {
    error = fmt::format("{}: has the wrong type ({})", key, it->type_name());
    return false;
  }
}

}  // namespace

expected<event> parse_event_line(std::string_view line) {
  const json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_argument, "not a JSON object");
  event e;
  std::string kind, error;
  if (!j.contains("t_ns") || !j.contains("kind")) return make_error(errc::invalid_argument, "t_ns and kind are required");
  bool ok = read_field(j, "t_ns", e.t_ns, error) && read_field(j, "kind", kind, error) &&
            read_field(j, "request_id", e.request_id, error) && read_field(j, "deployment", e.deployment, error) &&
            read_field(j, "replica", e.replica, error) && read_field(j, "slot", e.slot, error) &&
            read_field(j, "epoch", e.epoch, error) && read_field(j, "node", e.node, error) &&
            read_field(j, "device", e.device, error) && read_field(j, "fault_id", e.fault_id, error) &&
            read_field(j, "outcome", e.outcome, error) && read_field(j, "detail", e.detail, error) &&
            read_field(j, "index", e.index, error) && read_field(j, "count", e.count, error) &&
            read_field(j, "tokens", e.tokens, error);
  if (ok && j.contains("value_ms")) {
    // to_json_line writes null for a value that was not finite.
    e.value_ms = j["value_ms"].is_null() ? std::nan("") : 0;
    ok = read_field(j, "value_ms", e.value_ms, error);
  }
  if (ok && j.contains("value2_ms")) {
    e.value2_ms = j["value2_ms"].is_null() ? std::nan("") : 0;
    ok = read_field(j, "value2_ms", e.value2_ms, error);
  }
  if (!ok) return make_error(errc::invalid_argument, error);
  const auto k = kind_from_string(kind);
  if (!k) return make_error(errc::invalid_argument, "kind: unknown event kind \"" + kind + "\"");
  e.kind = *k;
  return e;
}

expected<read_log_result> read_event_log(const std::string& path, std::size_t max_events) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io_error, "cannot open event log " + path);
  read_log_result out;
  std::string line;
  std::size_t number = 0;
  std::optional<std::pair<std::size_t, std::string>> bad;  // a bad line, an error unless it is the last
  while (std::getline(in, line)) {
    ++number;
    if (bad) return make_error(errc::invalid_argument, fmt::format("{}:{}: {}", path, bad->first, bad->second));
    if (line.empty()) continue;
    auto e = parse_event_line(line);
    if (!e) {
      bad.emplace(number, e.error().message);
      continue;
    }
    if (out.events.size() >= max_events)
      return make_error(errc::io_error, fmt::format("{}: more than {} events", path, max_events));
    out.events.push_back(std::move(*e));
  }
  if (in.bad()) return make_error(errc::io_error, "cannot read event log " + path);
  if (bad) out.torn_lines = 1;
  return out;
}

std::vector<event> merge_logs(const std::vector<std::vector<event>>& logs) {
  struct keyed {
    std::int64_t t;
    std::size_t log, index;
  };
  std::vector<keyed> order;
  for (std::size_t l = 0; l < logs.size(); ++l) {
    const auto& log = logs[l];
    std::int64_t offset = 0;
    for (const auto& e : log)
      if (e.kind == event_kind::clock_offset) {
        offset = std::llround(e.value_ms * 1e6);
        break;
      }
    for (std::size_t i = 0; i < log.size(); ++i) {
      if (log[i].kind == event_kind::clock_offset) offset = std::llround(log[i].value_ms * 1e6);
      order.push_back({log[i].t_ns - offset, l, i});
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const keyed& a, const keyed& b) { return a.t < b.t; });
  std::vector<event> out;
  out.reserve(order.size());
  for (const auto& k : order) {
    out.push_back(logs[k.log][k.index]);
    out.back().t_ns = k.t;
  }
  return out;
}

}  // namespace exa::chaos
