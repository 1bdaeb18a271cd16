#include "cluster/token_sequencer.hpp"

namespace exa::cluster {

void token_sequencer::restart(std::uint32_t have) {
  next_ = have;
  held_.clear();
}

token_sequencer::offered token_sequencer::offer(std::uint32_t first_index, std::span<const std::int32_t> tokens) {
  offered out;
  if (tokens.empty()) return out;
  if (first_index > next_) {
    auto& slot = held_[first_index];
    if (tokens.size() > slot.size()) slot.assign(tokens.begin(), tokens.end());  // a longer copy wins
    out.overflow = held_.size() > max_held_;
    return out;
  }
  // Append the part past what is delivered, then every held chunk it reaches.
  const auto append = [&](std::uint32_t first, std::span<const std::int32_t> t) {
    if (first + t.size() <= next_) return;
    const std::size_t skip = next_ - first;
    out.ready.insert(out.ready.end(), t.begin() + static_cast<std::ptrdiff_t>(skip), t.end());
    next_ = first + static_cast<std::uint32_t>(t.size());
  };
  append(first_index, tokens);
  while (!held_.empty() && held_.begin()->first <= next_) {
    auto node = held_.extract(held_.begin());
    append(node.key(), node.mapped());
  }
  return out;
}

}  // namespace exa::cluster
