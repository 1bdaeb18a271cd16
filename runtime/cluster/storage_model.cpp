#include "cluster/storage_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/assert.hpp"

namespace exa::cluster {
namespace {

// A transfer is over when at most a byte, or two nanoseconds of it, is left:
// event times are rounded up to whole nanoseconds by the caller's clock.
bool finished(double remaining, double rate) { return remaining <= std::max(1.0, rate * 2e-9); }

}  // namespace

expected<storage_model> storage_model::create(const storage_config& c) {
  if (!(c.store_bytes_per_s > 0) || !std::isfinite(c.store_bytes_per_s))
    return make_error(errc::invalid_argument, "store_bytes_per_s must be a positive number");
  if (!(c.node_disk_bytes_per_s > 0) || !std::isfinite(c.node_disk_bytes_per_s))
    return make_error(errc::invalid_argument, "node_disk_bytes_per_s must be a positive number");
  if (!(c.node_network_bytes_per_s >= 0) || !std::isfinite(c.node_network_bytes_per_s))
    return make_error(errc::invalid_argument, "node_network_bytes_per_s must be 0 (no limit) or positive");
  return storage_model(c);
}

void storage_model::add_cached(node_id node, const std::string& file) { cached_.insert({node, file}); }

bool storage_model::cached(node_id node, const std::string& file) const { return cached_.count({node, file}) != 0; }

expected<void> storage_model::start(load_id id, node_id node, const std::string& file, std::uint64_t bytes,
                                    double now_s) {
  if (bytes == 0) return make_error(errc::invalid_argument, "a load of 0 bytes");
  if (reads_.count(id) || waiting_.count(id))
    return make_error(errc::invalid_argument, "load " + std::to_string(id) + " is running already");
  progress(now_s);
  if (cached(node, file)) {
    reads_[id] = read{node, static_cast<double>(bytes), 0};
    ++loads_from_cache_;
  } else {
    const file_key key{node, file};
    auto [it, fresh] = fetches_.try_emplace(key);
    if (fresh) {
      it->second.remaining = static_cast<double>(bytes);
      ++fetches_started_;
    }
    it->second.waiting.insert(id);
    waiting_[id] = waiter{key, bytes};
  }
  share();
  return {};
}

void storage_model::cancel(load_id id, double now_s) {
  progress(now_s);
  reads_.erase(id);
  if (const auto w = waiting_.find(id); w != waiting_.end()) {
    if (auto f = fetches_.find(w->second.key); f != fetches_.end()) f->second.waiting.erase(id);
    waiting_.erase(w);
  }
  share();
}

std::optional<double> storage_model::next_event_s() const {
  double next = std::numeric_limits<double>::infinity();
  for (const auto& [key, f] : fetches_)
    if (f.rate > 0) next = std::min(next, now_s_ + f.remaining / f.rate);
  for (const auto& [id, r] : reads_)
    if (r.rate > 0) next = std::min(next, now_s_ + r.remaining / r.rate);
  if (!std::isfinite(next)) return std::nullopt;
  return next;
}

std::vector<storage_model::load_id> storage_model::advance(double now_s) {
  progress(now_s);
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    if (!finished(it->second.remaining, it->second.rate)) {
      ++it;
      continue;
    }
    cached_.insert(it->first);
    fetched_.push_back(it->first);
    for (const auto id : it->second.waiting) {
      reads_[id] = read{it->first.first, static_cast<double>(waiting_.at(id).bytes), 0};
      waiting_.erase(id);
    }
    it = fetches_.erase(it);
  }
  std::vector<load_id> done;
  for (auto it = reads_.begin(); it != reads_.end();) {
    if (finished(it->second.remaining, it->second.rate)) {
      done.push_back(it->first);
      it = reads_.erase(it);
    } else {
      ++it;
    }
  }
  share();
  return done;
}

std::vector<std::pair<node_id, std::string>> storage_model::take_fetched() {
  std::vector<std::pair<node_id, std::string>> out;
  out.swap(fetched_);
  return out;
}

void storage_model::progress(double now_s) {
  const double dt = now_s - now_s_;
  if (!(dt > 0)) return;
  now_s_ = now_s;
  for (auto& [key, f] : fetches_) {
    const double moved = std::min(f.remaining, f.rate * dt);
    f.remaining -= moved;
    store_bytes_ += moved;
  }
  for (auto& [id, r] : reads_) r.remaining -= std::min(r.remaining, r.rate * dt);
}

void storage_model::share() {
  std::map<node_id, std::uint32_t> readers;
  for (const auto& [id, r] : reads_) ++readers[r.node];
  for (auto& [id, r] : reads_) r.rate = config_.node_disk_bytes_per_s / readers.at(r.node);
  share_fetches();
  store_rate_ = 0;
  for (const auto& [key, f] : fetches_) store_rate_ += f.rate;
  peak_store_rate_ = std::max(peak_store_rate_, store_rate_);
  EXA_ASSERT_MSG(store_rate_ <= config_.store_bytes_per_s * (1 + 1e-9), "fetches exceed the store's bandwidth");
}

// Max-min fair shares of the store among fetches whose nodes' links cap
// them: the nodes whose link allows less than the even share take what it
// allows (fewest per fetch first), the rest split what is left evenly.
void storage_model::share_fetches() {
  if (fetches_.empty()) return;
  std::map<node_id, std::uint32_t> per_node;
  for (const auto& [key, f] : fetches_) ++per_node[key.first];
  std::map<node_id, double> rate_of;
  double left = config_.store_bytes_per_s;
  std::size_t flows = fetches_.size();
  if (config_.node_network_bytes_per_s > 0) {
    std::vector<std::pair<double, node_id>> caps;  // per fetch, by node
    for (const auto& [node, k] : per_node) caps.emplace_back(config_.node_network_bytes_per_s / k, node);
    std::sort(caps.begin(), caps.end());
    for (const auto& [cap, node] : caps) {
      if (cap * static_cast<double>(flows) > left) break;  // this node and the rest get the even share
      rate_of[node] = cap;
      left -= cap * per_node[node];
      flows -= per_node[node];
    }
  }
  const double level = flows > 0 ? std::max(0.0, left) / static_cast<double>(flows) : 0;
  for (auto& [key, f] : fetches_) {
    const auto r = rate_of.find(key.first);
    f.rate = r != rate_of.end() ? r->second : level;
  }
}

}  // namespace exa::cluster
