#pragma once
// The Cap'n Proto front door: the bootstrap Service and the Gateway and Admin
// implementations behind it (schemas/exaserve.capnp), calling the backend.
// Kept apart so that only rpc_service.cpp and frontdoor.cpp see the
// generated code.

#include <capnp/capability.h>

#include <memory>

#include "door_context.hpp"

namespace exa::door {

/// Generate calls served over RPC at once, across all connections; one more
/// is refused with an OVERLOADED exception (each holds a backend request).
inline constexpr std::int64_t rpc_generate_in_flight_max = 4096;

/// The bootstrap capability (exa::rpc::Service) handed to every connection.
capnp::Capability::Client make_rpc_service(std::shared_ptr<door_context> ctx);

}  // namespace exa::door
