#pragma once
// Which connection manager a distributed process dials through: the OpenSSL
// module's (mutual TLS) when it is loaded, else the plain middleman's.

#include <caf/fwd.hpp>
#include <caf/io/middleman_actor.hpp>

namespace exa::actors {

/// The middleman actor to send connect requests to.
caf::io::middleman_actor connector(caf::actor_system& sys);

}  // namespace exa::actors
