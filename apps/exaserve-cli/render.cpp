#include "render.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace exa::cli {

std::string render_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows)
    for (std::size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out = " ";
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string& cell = c < cells.size() ? cells[c] : std::string();
      out += " " + cell;
      if (c + 1 < width.size()) out += std::string(width[c] - cell.size() + 1, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

std::string human_bytes(std::uint64_t bytes) {
  constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

namespace {

std::string percent(std::uint64_t used, std::uint64_t total) {
  return total == 0 ? "-" : fmt::format("{:.0f}%", 100.0 * static_cast<double>(used) / static_cast<double>(total));
}

std::string devices_table(const api::cluster_status& s) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& d : s.devices)
    rows.push_back({std::to_string(d.node), std::to_string(d.device), d.kind, human_bytes(d.memory_used_bytes),
                    human_bytes(d.memory_bytes), percent(d.memory_used_bytes, d.memory_bytes)});
  return render_table({"NODE", "DEVICE", "KIND", "MEM USED", "MEM TOTAL", "USE"}, rows);
}

// "node/device", or "node/d0,d1,..." for a replica on a tensor-parallel group.
std::string node_devices(const api::replica_status& r) {
  if (r.devices.size() <= 1) return fmt::format("{}/{}", r.node, r.device);
  std::string out = fmt::format("{}/", r.node);
  for (std::size_t i = 0; i < r.devices.size(); ++i) out += (i ? "," : "") + std::to_string(r.devices[i]);
  return out;
}

// The deployment a listed model is: "tiny" at version 2 is tiny@2.
std::string deployment_of(const api::model_info& m) {
  if (m.name.find('@') != std::string::npos || m.version.empty() || m.version == "1") return m.name;
  return m.name + "@" + m.version;
}

// A deployment's draft model as a table cell: "FILE,k=K" (the file's name,
// not its directory, so the column stays narrow), "-" without one.
std::string draft_cell(const api::model_info& m) {
  if (m.draft_model.empty()) return "-";
  const auto slash = m.draft_model.find_last_of('/');
  const std::string file = slash == std::string::npos ? m.draft_model : m.draft_model.substr(slash + 1);
  return fmt::format("{},k={}", file, m.draft_tokens);
}

// A deployment's routing as a table cell: the policy's name, with
// prefix_aware's load slack as "(TOKENStok,SECONDSs,xRATIO)" (the bound it
// routes by; the other policies do not read it); "-" when the server did not say.
std::string routing_cell(const api::model_info& m) {
  if (m.routing.empty()) return "-";
  if (m.routing != "prefix_aware") return m.routing;
  return fmt::format("{}({}tok,{}s,x{})", m.routing, m.prefix_slack_tokens, m.prefix_slack_s, m.prefix_slack_ratio);
}

// A measured speed as a table cell: whole tokens a second, "-" before any.
std::string speed_cell(double tokens_per_s) {
  if (!(tokens_per_s > 0) || !std::isfinite(tokens_per_s)) return "-";
  return fmt::format("{:.0f}", tokens_per_s);
}

// DRAFT is last so that a reader splitting rows on spaces keeps its columns.
std::string replicas_table(const api::cluster_status& s) {
  std::map<std::string, std::string> drafts;  // deployment -> its DRAFT cell
  for (const auto& m : s.models) drafts[deployment_of(m)] = draft_cell(m);
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : s.replicas) {
    const auto d = drafts.find(r.deployment);
    rows.push_back({r.id, r.deployment, std::to_string(r.slot), std::to_string(r.epoch), r.state,
                    node_devices(r), std::to_string(r.running), std::to_string(r.queued),
                    fmt::format("{}/{}", r.kv_used_tokens, r.kv_capacity_tokens),
                    percent(r.kv_used_tokens, r.kv_capacity_tokens), speed_cell(r.prefill_tokens_per_s),
                    speed_cell(r.decode_tokens_per_s), d == drafts.end() ? "-" : d->second});
  }
  return render_table({"REPLICA", "DEPLOYMENT", "SLOT", "EPOCH", "STATE", "NODE/DEV", "RUNNING", "QUEUED",
                       "KV TOKENS", "KV USE", "PREFILL/S", "DECODE/S", "DRAFT"},
                      rows);
}

}  // namespace

std::string render_models(const std::vector<api::model_info>& models) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : models)
    rows.push_back({m.name, m.version.empty() ? "-" : m.version, m.model_file,
                    fmt::format("{}/{}", m.replicas_ready, m.replicas_desired), std::to_string(m.context_length),
                    m.architecture.empty() ? "-" : m.architecture, m.quantization.empty() ? "-" : m.quantization,
                    m.tokenizer.empty() ? "-" : m.tokenizer, draft_cell(m), routing_cell(m)});
  return render_table({"NAME", "VERSION", "MODEL FILE", "READY/DESIRED", "CONTEXT", "ARCH", "QUANT", "TOKENIZER",
                       "DRAFT", "ROUTING"},
                      rows);
}

std::string render_status(const api::cluster_status& s) {
  std::vector<std::vector<std::string>> nodes;
  for (const auto& n : s.nodes)
    nodes.push_back({std::to_string(n.id), n.region.empty() ? "-" : n.region, std::to_string(n.rack),
                     n.drained.empty() ? n.state : n.state + ",drained(" + n.drained + ")",
                     n.address.empty() ? "-" : n.address, fmt::format("{:+.1f} ms", n.clock_offset_ms)});
  std::string out;
  out += fmt::format("NODES ({})\n", s.nodes.size()) + render_table({"NODE", "REGION", "RACK", "STATE", "ADDRESS", "CLOCK"}, nodes);
  out += fmt::format("\nDEVICES ({})\n", s.devices.size()) + devices_table(s);
  out += fmt::format("\nREPLICAS ({})\n", s.replicas.size()) + replicas_table(s);
  out += fmt::format("\nDEPLOYMENTS ({})\n", s.models.size()) + render_models(s.models);
  if (!s.rollouts.empty()) {
    out += fmt::format("\nROLLOUTS ({})\n", s.rollouts.size());
    for (const auto& r : s.rollouts) out += r.name + "  " + r.status + "\n";
  }
  return out;
}

namespace {

// "ready 3, serving 1, draining 1" for the states present, in lifecycle order.
std::string by_state(const std::map<std::string, std::size_t>& counts) {
  static const char* order[] = {"creating", "loading", "warming", "standby", "ready", "serving", "degraded", "draining",
                                "stopped", "failed"};
  std::string out;
  for (const char* st : order)
    if (auto it = counts.find(st); it != counts.end() && it->second > 0)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", st, it->second);
  return out.empty() ? "-" : out;
}

}  // namespace

namespace {
// "12/80" in ms over the last minute; "-" when no request finished in it.
std::string latency_pair(double p50, double p99) {
  if (p50 < 0 && p99 < 0) return "-";
  const auto one = [](double v) { return v < 0 ? std::string("-") : fmt::format("{:.0f}", v); };
  return one(p50) + "/" + one(p99);
}
}  // namespace

std::string render_top(const api::cluster_status& s, const std::string& now, std::size_t replica_rows) {
  std::map<std::string, std::size_t> all_states;
  for (const auto& r : s.replicas) ++all_states[r.state];
  std::size_t drained = 0, unhealthy = 0;
  for (const auto& n : s.nodes) {
    drained += !n.drained.empty();
    unhealthy += n.state != "healthy";
  }
  std::string out = fmt::format("exaserve top  {}  nodes {} (not healthy {}, drained {})  replicas {} ({})\n\n", now,
                                s.nodes.size(), unhealthy, drained, s.replicas.size(), by_state(all_states));

  std::vector<std::vector<std::string>> deps;
  for (const auto& m : s.models) {
    std::map<std::string, std::size_t> states;
    std::uint64_t running = 0, queued = 0, kv_used = 0, kv_total = 0;
    for (const auto& r : s.replicas) {
      if (r.deployment != deployment_of(m)) continue;
      ++states[r.state];
      running += r.running;
      queued += r.queued;
      kv_used += r.kv_used_tokens;
      kv_total += r.kv_capacity_tokens;
    }
    deps.push_back({m.name, m.version.empty() ? "-" : m.version, fmt::format("{}/{}", m.replicas_ready, m.replicas_desired), by_state(states),
                    std::to_string(running), std::to_string(queued), percent(kv_used, kv_total),
                    latency_pair(m.ttft_p50_ms, m.ttft_p99_ms), latency_pair(m.tpot_p50_ms, m.tpot_p99_ms),
                    m.tenant.empty() ? "-" : m.tenant});
  }
  out += "DEPLOYMENTS\n" + render_table({"NAME", "VERSION", "READY/DESIRED", "REPLICAS", "RUNNING", "QUEUED", "KV USE",
                                         "TTFT P50/P99 MS", "TPOT P50/P99 MS", "TENANT"},
                                        deps);
  if (!s.rollouts.empty()) {
    out += "\nROLLOUTS\n";
    for (const auto& r : s.rollouts) out += r.name + "  " + r.status + "\n";
  }

  std::vector<std::vector<std::string>> nodes;
  for (const auto& n : s.nodes) {
    std::size_t replicas = 0;
    std::uint64_t running = 0, queued = 0, mem_used = 0, mem_total = 0;
    for (const auto& r : s.replicas)
      if (r.node == n.id) {
        ++replicas;
        running += r.running;
        queued += r.queued;
      }
    for (const auto& d : s.devices)
      if (d.node == n.id) {
        mem_used += d.memory_used_bytes;
        mem_total += d.memory_bytes;
      }
    nodes.push_back({std::to_string(n.id), n.region.empty() ? "-" : n.region, std::to_string(n.rack), n.state,
                     n.drained.empty() ? "-" : n.drained,
                     std::to_string(replicas), std::to_string(running), std::to_string(queued),
                     percent(mem_used, mem_total)});
  }
  out += "\nNODES\n" +
         render_table({"NODE", "REGION", "RACK", "STATE", "DRAINED", "REPLICAS", "RUNNING", "QUEUED", "MEM USE"}, nodes);

  // Replicas to watch: not ready/serving first (by id), then the busiest.
  std::vector<const api::replica_status*> watch;
  for (const auto& r : s.replicas)
    if (r.state != "ready" && r.state != "serving") watch.push_back(&r);
  std::vector<const api::replica_status*> busy;
  for (const auto& r : s.replicas)
    if ((r.state == "ready" || r.state == "serving") && r.running + r.queued > 0) busy.push_back(&r);
  std::stable_sort(busy.begin(), busy.end(), [](const auto* a, const auto* b) {
    return a->running + a->queued > b->running + b->queued;
  });
  watch.insert(watch.end(), busy.begin(), busy.end());
  const std::size_t shown = std::min(watch.size(), replica_rows);
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& r = *watch[i];
    rows.push_back({r.id, r.deployment, std::to_string(r.slot), r.state, node_devices(r),
                    std::to_string(r.running), std::to_string(r.queued), percent(r.kv_used_tokens, r.kv_capacity_tokens)});
  }
  out += fmt::format("\nREPLICAS TO WATCH ({} of {} not idle and ready)\n", shown, watch.size()) +
         render_table({"REPLICA", "DEPLOYMENT", "SLOT", "STATE", "NODE/DEV", "RUNNING", "QUEUED", "KV USE"}, rows);
  return out;
}

}  // namespace exa::cli
