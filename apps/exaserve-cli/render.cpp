#include "render.hpp"

#include <fmt/format.h>

#include <algorithm>

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

std::string replicas_table(const api::cluster_status& s) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : s.replicas)
    rows.push_back({r.id, r.deployment, std::to_string(r.slot), std::to_string(r.epoch), r.state,
                    fmt::format("{}/{}", r.node, r.device), std::to_string(r.running), std::to_string(r.queued),
                    fmt::format("{}/{}", r.kv_used_tokens, r.kv_capacity_tokens),
                    percent(r.kv_used_tokens, r.kv_capacity_tokens)});
  return render_table({"REPLICA", "DEPLOYMENT", "SLOT", "EPOCH", "STATE", "NODE/DEV", "RUNNING", "QUEUED",
                       "KV TOKENS", "KV USE"},
                      rows);
}

}  // namespace

std::string render_models(const std::vector<api::model_info>& models) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : models)
    rows.push_back({m.name, m.model_file, fmt::format("{}/{}", m.replicas_ready, m.replicas_desired),
                    std::to_string(m.context_length)});
  return render_table({"NAME", "MODEL FILE", "READY/DESIRED", "CONTEXT"}, rows);
}

std::string render_status(const api::cluster_status& s) {
  std::vector<std::vector<std::string>> nodes;
  for (const auto& n : s.nodes)
    nodes.push_back({std::to_string(n.id), std::to_string(n.rack),
                     n.drained.empty() ? n.state : n.state + ",drained(" + n.drained + ")",
                     n.address.empty() ? "-" : n.address, fmt::format("{:+.1f} ms", n.clock_offset_ms)});
  std::string out;
  out += fmt::format("NODES ({})\n", s.nodes.size()) + render_table({"NODE", "RACK", "STATE", "ADDRESS", "CLOCK"}, nodes);
  out += fmt::format("\nDEVICES ({})\n", s.devices.size()) + devices_table(s);
  out += fmt::format("\nREPLICAS ({})\n", s.replicas.size()) + replicas_table(s);
  out += fmt::format("\nDEPLOYMENTS ({})\n", s.models.size()) + render_models(s.models);
  return out;
}

}  // namespace exa::cli
