#pragma once
// A front door on ephemeral loopback ports in front of a fake backend.

#include <memory>

#include "fake_backend.hpp"
#include "frontdoor.hpp"

namespace exa::test {

/// Test defaults: ephemeral ports, small limits where tests probe them.
frontdoor_config test_config();

struct test_server {
  explicit test_server(frontdoor_config config = test_config());
  ~test_server();

  std::uint16_t http_port() const { return door->http_port(); }
  std::uint16_t rpc_port() const { return door->rpc_port(); }

  std::shared_ptr<fake_backend> backend = std::make_shared<fake_backend>();
  std::unique_ptr<frontdoor> door;
};

}  // namespace exa::test
