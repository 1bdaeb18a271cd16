#pragma once
// Human-readable tables for the CLI.

#include <string>
#include <vector>

#include "api/gateway.hpp"

namespace exa::cli {

/// Left-aligned columns, two spaces apart, header first.
std::string render_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

/// Nodes, devices (memory), replicas (lifecycle state, load, KV use) and
/// deployments, one table each.
std::string render_status(const api::cluster_status& status);

std::string render_models(const std::vector<api::model_info>& models);

/// One screen of `exaserve-cli top`: a summary line (nodes and replicas by
/// state), deployments (replicas by state, requests running and queued, KV
/// use), nodes (state and drain, replicas, load, memory), and the replicas
/// worth watching: every one not ready or serving, then the busiest, at
/// most `replica_rows` in all. `now` is printed as given.
std::string render_top(const api::cluster_status& status, const std::string& now, std::size_t replica_rows = 15);

/// "1.5 GiB"-style sizes.
std::string human_bytes(std::uint64_t bytes);

}  // namespace exa::cli
