#pragma once
// The gateway backend over the actor system: generate/cancel go to the
// router as messages; admin calls run as short-lived actors that ask the
// controller and call back. Nothing here blocks the caller.

#include <caf/fwd.hpp>

#include <memory>

#include "api/gateway.hpp"

namespace exa::actors {

struct cluster_metrics;

std::shared_ptr<api::gateway_backend> make_gateway_bridge(caf::actor_system& sys,
                                                          std::shared_ptr<cluster_metrics> metrics);

}  // namespace exa::actors
