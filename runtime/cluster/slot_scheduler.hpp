#pragma once
// The controller's slot state machine, as pure logic: each slot's epoch
// (fencing), how often it may be replaced (a slot failing wherever it goes
// is given up for a while instead of ping-ponging), the queue of slots to
// place again and the replacements still warming (a lost node's replicas
// move a few at a time, so they do not all load their model at once), and
// the cordoned nodes (confirmed failed: nothing is placed there). The
// controller actor wires it: it persists raised epochs, tells the router,
// and starts the replicas the pump placed.
//
//   replica lost ──replace()──> epoch + 1, queued ──pump()──> placed, warming
//        ^             │ (budget spent: given up; retry() later)    │
//        └─────────────┴──────── settled(): ready, or ended <───────┘

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster/placement.hpp"
#include "cluster/restart_intensity.hpp"
#include "cluster/types.hpp"

namespace exa::cluster {

struct slot_scheduler_config {
  std::uint32_t migration_parallelism = 4;  // replacements warming at once (0 counts as 1)
  std::uint32_t slot_max_replacements = 5;  // within the window, per slot
  std::chrono::nanoseconds slot_replacement_window = std::chrono::minutes(5);
};

class slot_scheduler {
 public:
  explicit slot_scheduler(slot_scheduler_config config) : config_(config) {}

  // -- Epochs: only ever move forward.
  /// The slot's current epoch; 0 before its first replica.
  epoch_t epoch(const slot_ref& slot) const;
  /// Raises the slot's epoch to `e`; true if it rose (the caller persists it
  /// before any node hears of the epoch).
  bool raise_epoch(const slot_ref& slot, epoch_t e);
  /// Whether a replica of epoch `e` for the slot is stale (a newer one exists).
  bool stale(const slot_ref& slot, epoch_t e) const { return e < epoch(slot); }
  const std::map<slot_ref, epoch_t>& epochs() const noexcept { return epochs_; }

  // -- Replacement.
  struct replacement {
    bool fenced = false;  // false: the budget is spent, the slot is given up for now
    epoch_t epoch = 0;    // the new epoch (fenced)
  };
  /// The slot lost its replica. Within its replacement budget: a new epoch,
  /// and the slot queued for placement on any node but `excluded`.
  /// Otherwise given up (nothing queued); retry() it later.
  replacement replace(const slot_ref& slot, std::vector<node_id> excluded, std::chrono::nanoseconds now);
  /// A planned move (a drain): a new epoch and the slot queued, as for
  /// replace(), but never given up and not charged to the slot's budget.
  epoch_t move(const slot_ref& slot, std::vector<node_id> excluded);
  /// A given-up slot's time is up: its budget starts afresh. False when the
  /// slot is queued anyway (nothing to retry).
  bool retry(const slot_ref& slot);
  bool queued(const slot_ref& slot) const;

  // -- Nodes.
  void cordon(node_id node) { cordoned_.insert(node); }
  void uncordon(node_id node) { cordoned_.erase(node); }
  bool cordoned(node_id node) const { return cordoned_.count(node) != 0; }
  const std::set<node_id>& cordoned_nodes() const noexcept { return cordoned_; }
  /// A node joined again: queued slots may go back to it (unless cordoned).
  void node_rejoined(node_id node);

  // -- The pump.
  struct start {
    placed_slot placed;  // committed to the placement state
    epoch_t epoch = 0;
  };
  struct pump_result {
    std::vector<start> started;
    /// The slot at the head of the queue that fits nowhere now, and why: it
    /// stays queued until a node comes back or memory is released.
    std::optional<std::pair<slot_ref, std::string>> waiting;
  };
  /// Places queued slots while fewer than migration_parallelism replacements
  /// are warming. `spec_of` gives a deployment's spec (nullptr: undeployed);
  /// slots of deployments gone or scaled below them, and slots whose epoch
  /// moved on since they were queued, are dropped. Never places on a
  /// cordoned node or one in `down`.
  pump_result pump(cluster_state& placement, const std::function<const deployment_spec*(const std::string&)>& spec_of,
                   const std::set<node_id>& down);
  /// A replacement became ready or ended: it stops counting as warming.
  /// True if it was one (then pump again).
  bool settled(replica_id replica) { return warming_.erase(replica) != 0; }

  std::size_t warming() const noexcept { return warming_.size(); }
  std::size_t queue_length() const noexcept { return queue_.size(); }

 private:
  struct migration {
    slot_ref slot;
    epoch_t epoch = 0;
    std::vector<node_id> excluded;
  };
  slot_scheduler_config config_;
  std::map<slot_ref, epoch_t> epochs_;
  std::map<slot_ref, restart_intensity> budgets_;
  std::deque<migration> queue_;
  std::set<replica_id> warming_;
  std::set<node_id> cordoned_;
};

}  // namespace exa::cluster
