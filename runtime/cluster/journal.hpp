#pragma once
// The controller's journal: what a distributed cluster must not lose when
// its controller dies -- the deployments, each slot's epoch, and the replica
// ids already handed out -- kept in a state directory as an append-only log
// of records (each fsynced before the controller acts on it) plus a periodic
// snapshot. Reopening replays snapshot then log. A record cut off at the end
// (the process died mid-append) is a torn tail: reported by record number
// and cut away. A damaged record with valid ones after it is corruption:
// reported by record number, and the journal refuses to open rather than
// silently drop what followed.
//
// On disk, DIR/snapshot.json (the whole state, replaced atomically by
// rename) and DIR/journal.log: records of [u32 length][u32 CRC-32][payload
// JSON], little-endian.

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "api/gateway.hpp"
#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

struct durable_state {
  std::map<std::string, api::deploy_request> deployments;
  std::map<slot_ref, epoch_t> epochs;
  replica_id next_replica_id = 1;  // ids below it were handed out
  std::set<node_id> drained_nodes;  // drained by an operator: nothing is placed there
  /// Versions: the deployment serving each plain name whose current version
  /// is not the plain deployment itself (after a completed rollout).
  std::map<std::string, std::string> current_versions;
  /// Rollouts begun and not ended: a restarted controller rolls them back.
  struct rollout_entry {
    std::string from, to;       // the old and the new version's deployments
    std::uint32_t replicas = 0;  // the old version's count when it began
    bool operator==(const rollout_entry&) const = default;
  };
  std::map<std::string, rollout_entry> rollouts;  // by plain name
  /// Every version label a rollout ever began, by plain name: never reused,
  /// so a client pinning NAME@V never meets another model under that name.
  std::map<std::string, std::set<std::string>> used_versions;
  bool operator==(const durable_state&) const = default;
};

/// One change to the durable state.
struct journal_record {
  enum class kind : std::uint8_t {
    deploy, undeploy, scale, epoch, replica, node_drain, node_undrain, version_current, rollout_begin, rollout_end
  };
  kind type = kind::deploy;
  api::deploy_request deployment;  // deploy
  std::string name;                // undeploy, scale, epoch: the deployment
  std::uint32_t replicas = 0;      // scale
  std::uint32_t slot = 0;          // epoch
  epoch_t epoch = 0;               // epoch
  replica_id replica = 0;          // replica: this id is taken
  node_id node = 0;                // node_drain, node_undrain
  std::string from, to;            // version_current: to; rollout_begin: both (name: the plain name)

  static journal_record deploy(api::deploy_request r);
  static journal_record undeploy(std::string name);
  static journal_record scale(std::string name, std::uint32_t replicas);
  static journal_record slot_epoch(std::string name, std::uint32_t slot, epoch_t epoch);
  static journal_record replica_taken(replica_id id);
  static journal_record drain_node(node_id node);
  static journal_record undrain_node(node_id node);
  static journal_record version_current(std::string base, std::string deployment);
  static journal_record rollout_begin(std::string base, std::string from, std::string to, std::uint32_t replicas);
  static journal_record rollout_end(std::string base);
};

/// Applies one record: the same function replays the log and serves appends.
void apply(durable_state& state, const journal_record& r);

/// What opening found.
struct journal_recovery {
  bool from_snapshot = false;
  std::size_t records_replayed = 0;  // log records applied after the snapshot
  bool torn_tail = false;
  std::size_t torn_record = 0;       // 1-based number in the log of the cut record
  std::uint64_t torn_offset = 0;     // where the log now ends
};

class journal {
 public:
  /// Records since the last snapshot before append() writes a new one.
  static constexpr std::size_t snapshot_every = 1024;
  /// No record is larger (a hostile or corrupted length is caught).
  static constexpr std::uint32_t record_bytes_max = 1u << 20;

  /// Opens (creating) the journal in `dir`. Errors: io_error (cannot create,
  /// read or write), corrupt_data naming the record and offset.
  static expected<journal> open(const std::string& dir, journal_recovery* report = nullptr);

  journal(journal&& other) noexcept;
  journal& operator=(journal&& other) noexcept;
  journal(const journal&) = delete;
  journal& operator=(const journal&) = delete;
  ~journal();

  const durable_state& state() const noexcept { return state_; }
  /// True when nothing was ever recorded (a fresh state directory).
  bool empty() const noexcept { return empty_; }
  const std::string& dir() const noexcept { return dir_; }

  /// Writes the record and fsyncs it, then applies it; on error the state
  /// is unchanged. Snapshots every snapshot_every records.
  expected<void> append(const journal_record& r);
  /// Writes the whole state as the snapshot and empties the log.
  expected<void> snapshot();

 private:
  journal() = default;
  std::string dir_;
  int fd_ = -1;  // the log, open for append
  durable_state state_;
  std::size_t since_snapshot_ = 0;
  bool empty_ = true;
};

/// CRC-32 (IEEE 802.3, as zlib computes it) of `n` bytes.
std::uint32_t crc32(const void* data, std::size_t n);

}  // namespace exa::cluster
