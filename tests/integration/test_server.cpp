#include "test_server.hpp"

#include <stdexcept>

namespace exa::test {

frontdoor_config test_config() {
  frontdoor_config c;
  c.http_port = 0;
  c.rpc_port = 0;
  c.max_body_bytes = 64 * 1024;
  return c;
}

test_server::test_server(frontdoor_config config) {
  auto started = frontdoor::start(std::move(config), backend);
  if (!started) throw std::runtime_error("frontdoor::start: " + to_string(started.error()));
  door = std::move(*started);
}

test_server::~test_server() {
  // The front door first: its teardown cancels requests on the backend.
  door->stop();
  door.reset();
  backend.reset();
}

}  // namespace exa::test
