#pragma once
// Identifiers shared by the cluster logic (placement, routing, failure
// detection, lifecycle) and the actors that host it.

#include <compare>
#include <cstdint>
#include <string>

namespace exa::cluster {

using node_id = std::uint32_t;
using rack_id = std::uint32_t;
/// A replica instance; never reused within a cluster's lifetime.
using replica_id = std::uint64_t;
/// Fencing epoch of a replica slot: only grows.
using epoch_t = std::uint64_t;

/// One device (GPU or CPU device) of one node.
struct device_ref {
  node_id node = 0;
  std::uint32_t device = 0;
  friend auto operator<=>(const device_ref&, const device_ref&) = default;
};

/// A deployment's replica slot: "deployment llama-7b, replica #3". The replica
/// filling a slot changes when it is migrated; the slot's epoch then grows.
struct slot_ref {
  std::string deployment;
  std::uint32_t index = 0;
  friend auto operator<=>(const slot_ref&, const slot_ref&) = default;
};

/// Where a node sits: failure domains for anti-affinity.
struct node_info {
  node_id id = 0;
  rack_id rack = 0;
  std::uint32_t devices = 0;
  std::uint64_t device_memory_bytes = 0;  // per device
};

}  // namespace exa::cluster
