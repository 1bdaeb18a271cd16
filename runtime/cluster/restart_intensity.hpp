#pragma once
// Restart intensity, as in Erlang/OTP supervisors: at most `max_restarts`
// restarts within any window of `window` length. A supervisor asks before each
// restart; once the limit is hit it stops restarting and escalates (or, for a
// replica slot, quarantines it so the controller places it elsewhere).

#include <chrono>
#include <cstdint>
#include <deque>

namespace exa::cluster {

class restart_intensity {
 public:
  using duration = std::chrono::nanoseconds;

  restart_intensity(std::uint32_t max_restarts, duration window)
      : max_restarts_(max_restarts), window_(window) {}

  /// Records a restart at `now` and returns true if it is allowed; false when
  /// it would be more than max_restarts within the window (the restart is then
  /// not recorded: the caller gives up).
  bool allow(duration now);

  /// Restarts counted in the window ending at `now`.
  std::uint32_t recent(duration now);

  std::uint32_t max_restarts() const noexcept { return max_restarts_; }
  duration window() const noexcept { return window_; }

 private:
  void expire(duration now);

  std::uint32_t max_restarts_;
  duration window_;
  std::deque<duration> restarts_;  // times of recent restarts, oldest first
};

}  // namespace exa::cluster
