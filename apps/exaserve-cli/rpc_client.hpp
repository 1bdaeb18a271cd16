#pragma once
// A blocking Cap'n Proto client of the ExaServe RPC API, for the CLI. Every
// call runs the client's own KJ event loop until its answer arrives; remote
// exceptions and connection failures come back as error values.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/gateway.hpp"
#include "common/error.hpp"

namespace exa::cli {

class rpc_client {
 public:
  /// Connects to host:port. A refused connection says so, and suggests
  /// starting the server. `api_key` goes with every call (servers started
  /// with a keys file want one; admin calls want an admin key).
  /// With `tls.ca`: TLS, checking the server's certificate against that CA
  /// and the host name; `tls.cert`/`tls.key` present a client certificate.
  struct tls_files {
    std::string ca, cert, key;
    std::string server_name;  // the name the certificate must carry ("": the host; "localhost" for loopback)
  };
  static expected<std::unique_ptr<rpc_client>> connect(const std::string& host, std::uint16_t port,
                                                       std::string api_key = {}, const tls_files& tls = {});
  ~rpc_client();
  rpc_client(const rpc_client&) = delete;
  rpc_client& operator=(const rpc_client&) = delete;

  expected<api::cluster_status> status();
  expected<std::vector<api::model_info>> models();
  expected<void> deploy(const api::deploy_request& request);
  expected<void> undeploy(const std::string& name);
  expected<void> scale(const std::string& name, std::uint32_t replicas);
  expected<api::drain_result> drain(const api::drain_request& request);
  expected<api::rollout_result> rollout(const api::rollout_request& request);
  /// Generates, calling `on_chunk` for each chunk as it arrives. The result
  /// may still carry an error (refused or failed request).
  expected<api::generate_result> generate(const api::generate_request& request,
                                          std::function<void(const api::token_chunk&)> on_chunk);

  struct impl;

 private:
  explicit rpc_client(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa::cli
