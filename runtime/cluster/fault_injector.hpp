#pragma once
// Fault points on a node's control-plane channel (its heartbeats, replica
// events and load reports, and the control plane's messages to it), active
// only when the chaos harness arms them: partitions (drop everything), jitter
// (delay heartbeats), and random drop / delay / duplicate. Seeded, and
// consulted in message order, so a deterministic run replays exactly.
// Thread-safe: actors on several threads consult it.

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "cluster/types.hpp"

#include "common/splitmix64.hpp"

namespace exa::cluster {

enum class channel_fault : std::uint8_t { partition, jitter, drop, delay, duplicate };

struct message_verdict {
  bool deliver = true;
  std::uint32_t copies = 1;     // > 1: duplicated
  std::int64_t delay_ns = 0;    // > 0: deliver later
};

/// What travels on the channel; jitter delays only heartbeats.
enum class message_class : std::uint8_t { heartbeat, control };

class fault_injector {
 public:
  explicit fault_injector(std::uint64_t seed = 1) : rng_(seed) {}

  /// Arms a fault on `node`'s channel from now until `until_ns` (exclusive).
  /// probability: for drop and duplicate; delay_ns: for jitter and delay.
  void arm(node_id node, channel_fault kind, std::int64_t until_ns, double probability = 1.0,
           std::int64_t delay_ns = 0);
  void clear(node_id node);

  /// The fate of one message on `node`'s channel at `now_ns`.
  message_verdict decide(node_id node, message_class cls, std::int64_t now_ns);

  /// True while a partition isolates `node`.
  bool partitioned(node_id node, std::int64_t now_ns);

 private:
  struct armed {
    channel_fault kind;
    std::int64_t until_ns;
    double probability;
    std::int64_t delay_ns;
  };
  double uniform();

  std::mutex mutex_;
  splitmix64_stream rng_;
  std::map<node_id, std::vector<armed>> faults_;
};

}  // namespace exa::cluster
