#pragma once
// What every front door checks in a generate request, whatever its wire
// format: HTTP parsing checks types and ranges as it reads JSON, and both
// doors run this afterwards, so a bound cannot be forgotten on one path.

#include <optional>

#include "api/gateway.hpp"
#include "common/error.hpp"

namespace exa::door {

/// The first problem with `request` under `limits` (invalid_argument), or
/// nothing. Messages name fields in snake_case ("max_tokens").
std::optional<error> validate_generate(const api::generate_request& request, const api::request_limits& limits);

}  // namespace exa::door
