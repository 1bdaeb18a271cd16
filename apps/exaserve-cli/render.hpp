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

/// "1.5 GiB"-style sizes.
std::string human_bytes(std::uint64_t bytes);

}  // namespace exa::cli
