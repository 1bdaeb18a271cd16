#pragma once
// Puts one replica's token stream back in order at the request.
//
// Messages between two actors on one connection arrive in order, but a
// replica's route to a gateway can change under a stream: its first tokens
// go through the controller (before the gateway's direct connection to the
// node is up, or after it broke) and later ones go direct, overtaking them.
// A chunk that starts past what the request has is held until the gap is
// filled; a chunk it already has (a resumed replica re-sending) is dropped.
// The caller gives up on the replica when a gap outlives its timeout or the
// held chunks reach their bound, and resumes elsewhere from `next()`.

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

namespace exa::cluster {

class token_sequencer {
 public:
  /// At most `max_held` chunks wait for a gap (each at most one engine step).
  explicit token_sequencer(std::size_t max_held = 64) : max_held_(max_held) {}

  /// A new replica takes over; the request already has `have` tokens.
  /// Whatever the last one left held is dropped.
  void restart(std::uint32_t have);

  struct offered {
    std::vector<std::int32_t> ready;  // now in order, to append (maybe empty)
    bool overflow = false;            // too many chunks held: give up on this replica
  };
  /// A chunk whose first token is the `first_index`-th of the stream.
  offered offer(std::uint32_t first_index, std::span<const std::int32_t> tokens);

  /// Tokens delivered in order so far.
  std::uint32_t next() const noexcept { return next_; }
  /// Whether chunks wait for a gap to close.
  bool gap() const noexcept { return !held_.empty(); }
  /// How many chunks are held.
  std::size_t held() const noexcept { return held_.size(); }
  /// Whether a replica's "finished after `total` tokens" can be acted on:
  /// every token it sent has been delivered.
  bool complete(std::uint32_t total) const noexcept { return next_ >= total; }

 private:
  std::size_t max_held_;
  std::uint32_t next_ = 0;
  std::map<std::uint32_t, std::vector<std::int32_t>> held_;  // by first index
};

}  // namespace exa::cluster
