#pragma once
// Model loads against the storage they read, as a fluid model for the
// simulator's cold start: the model store ("central storage") has one read
// bandwidth shared by every fetch at once, each node has a link to it and a
// local disk. A load whose node's cache holds the file reads it from the
// disk; otherwise the node first fetches the file from the store (one fetch
// per node and file, shared by every load there that waits for it, as the
// node's model cache shares it), and then each load reads it from the disk.
//
// Rates are max-min fair: local reads split their node's disk evenly;
// fetches split the store evenly, except that a fetch held back by its
// node's link leaves its share to the others (progressive filling). Between
// events every rate is constant, so the model moves from event to event:
// next_event_s() says when the next transfer ends, advance() goes there.
// What it leaves out: the disk writes of a fetch, the page cache (a
// freshly fetched file is read at disk speed), store slowdowns under many
// readers, and replicas that stop while loading (their transfers run on).
// Deterministic: ordered containers, no clock of its own.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cluster/types.hpp"
#include "common/error.hpp"

namespace exa::cluster {

struct storage_config {
  /// The model store's read bandwidth, shared by every fetch at once.
  double store_bytes_per_s = 25e9;
  /// Each node's link to the store; 0: only the store limits a fetch.
  double node_network_bytes_per_s = 0;
  /// Each node's local disk, shared by the loads reading from its cache.
  double node_disk_bytes_per_s = 3e9;
};

class storage_model {
 public:
  using load_id = std::uint64_t;

  /// invalid_argument naming the field for a store or disk bandwidth that is
  /// not positive, or a negative (or NaN) network bandwidth.
  static expected<storage_model> create(const storage_config& config);

  /// The node's cache holds `file` (a warm cache at start, or a fetch done).
  void add_cached(node_id node, const std::string& file);
  bool cached(node_id node, const std::string& file) const;

  /// Starts loading `bytes` of `file` onto `node` at `now_s` (not before the
  /// last call's time). invalid_argument for an id in use or zero bytes.
  expected<void> start(load_id id, node_id node, const std::string& file, std::uint64_t bytes, double now_s);
  /// Forgets a load (its replica is gone). A fetch it waited for runs on:
  /// the copy lands in the node's cache, as a real fetch would.
  void cancel(load_id id, double now_s);

  /// When the next transfer ends at the current rates; nullopt when idle.
  std::optional<double> next_event_s() const;
  /// Moves to `now_s`: transfers progress, fetches that end fill their
  /// node's cache and start their waiting loads' reads, and the loads whose
  /// reads end are returned (ascending ids).
  std::vector<load_id> advance(double now_s);

  /// The fetches that ended since the last call: (node, file), in order.
  std::vector<std::pair<node_id, std::string>> take_fetched();

  double store_rate_bytes_per_s() const noexcept { return store_rate_; }
  double peak_store_rate_bytes_per_s() const noexcept { return peak_store_rate_; }
  /// Bytes read from the store so far.
  double store_bytes() const noexcept { return store_bytes_; }
  std::uint32_t fetches() const noexcept { return fetches_started_; }
  /// Loads that found their file in their node's cache when they started.
  std::uint32_t loads_from_cache() const noexcept { return loads_from_cache_; }
  std::size_t active_loads() const noexcept { return waiting_.size() + reads_.size(); }
  const storage_config& config() const noexcept { return config_; }

 private:
  using file_key = std::pair<node_id, std::string>;
  struct fetch {
    double remaining = 0;
    double rate = 0;
    std::set<load_id> waiting;  // loads that read the file once it is here
  };
  struct read {
    node_id node = 0;
    double remaining = 0;
    double rate = 0;
  };
  struct waiter {
    file_key key;
    std::uint64_t bytes = 0;
  };

  explicit storage_model(const storage_config& c) : config_(c) {}
  void progress(double now_s);
  void share();
  void share_fetches();

  storage_config config_;
  std::set<file_key> cached_;
  std::map<file_key, fetch> fetches_;
  std::map<load_id, read> reads_;
  std::map<load_id, waiter> waiting_;
  std::vector<file_key> fetched_;  // ended, not taken yet
  double now_s_ = 0;
  double store_rate_ = 0, peak_store_rate_ = 0, store_bytes_ = 0;
  std::uint32_t fetches_started_ = 0, loads_from_cache_ = 0;
};

}  // namespace exa::cluster
