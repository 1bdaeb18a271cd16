#pragma once
// One host's network namespace for multi-process runs and tests: a
// namespace joined to the root namespace by a veth pair (host side
// host_ip(), namespace side ns_ip()), which can be cut off (both link ends
// down: every packet dropped silently, as a pulled cable) or shaped with
// tc netem. Removed, links and all, when the handle goes away. Needs root
// and iproute2.

#include <cstdint>
#include <memory>
#include <string>

namespace exa::chaos {

class host_link {
 public:
  /// Namespace "exa-chaos-TAG-NODE", links "ecTAGhNODE" / "ecTAGnNODE",
  /// addresses 10.(200 + TAG % 50).NODE.1 / .2 (NODE < 256). Null when
  /// any step fails (what was made is removed).
  static std::unique_ptr<host_link> create(unsigned tag, std::uint32_t node);
  /// Whether this machine can make namespaces at all (root, `ip netns`).
  static bool available();
  ~host_link();
  host_link(const host_link&) = delete;
  host_link& operator=(const host_link&) = delete;

  const std::string& ns() const { return ns_; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }

  /// Both ends down. Overlapping cuts nest: the link comes back when the
  /// last one heals. A cut that fails half-way is rolled back.
  bool cut();
  bool heal();
  /// Delay and/or loss on both ends (tc netem); rolled back if one end fails.
  bool netem(std::uint32_t delay_ms, double loss);
  bool netem_off();
  /// Whether this kernel has the netem qdisc (probed on this link).
  bool netem_works();

 private:
  host_link() = default;
  bool in_ns(const std::string& cmd);
  bool link_up();
  std::string ns_, host_if_, ns_if_, host_ip_, ns_ip_;
  bool made_ = false;
  int cuts_ = 0;
};

}  // namespace exa::chaos
