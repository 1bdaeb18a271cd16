#pragma once
// Erlang/OTP-style supervision for CAF actors: child specs, one_for_one and
// rest_for_one strategies, restart intensity (at most N restarts in T; then
// the supervisor gives up and exits, escalating to its own parent). An actor
// that supervises holds one of these in its state and forwards its exit
// messages to on_exit().

#include <caf/actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/fwd.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "cluster/restart_intensity.hpp"

namespace exa::actors {

/// When a child is restarted: always, only after an abnormal exit, never.
enum class restart_policy { permanent, transient, temporary };

enum class supervision_strategy {
  one_for_one,  // restart only the child that exited
  rest_for_one, // restart it and every child started after it
};

struct child_spec {
  std::string name;
  /// Spawns the child (the supervisor links to it). Called again on restart.
  std::function<caf::actor(caf::scheduled_actor* parent)> start;
  restart_policy restart = restart_policy::permanent;
};

class supervisor {
 public:
  supervisor(caf::scheduled_actor* self, std::string name, supervision_strategy strategy,
             std::uint32_t max_restarts, std::chrono::nanoseconds window);

  /// Starts a child now and supervises it from then on.
  caf::actor add_child(child_spec spec);
  /// Stops supervising a child and shuts it down (no restart).
  void remove_child(const std::string& name, caf::exit_reason reason = caf::exit_reason::user_shutdown);

  /// The child's current actor (invalid if unknown or not running).
  caf::actor child(const std::string& name) const;
  std::vector<std::string> children() const;

  /// Handles an exit message. Returns false when it did not come from a child
  /// (the caller decides, usually by quitting with that reason). When the
  /// restart intensity is exceeded the supervisor quits its actor with
  /// `restart_intensity_exceeded`, escalating to its parent.
  bool on_exit(const caf::exit_msg& msg);

  /// Shuts every child down, newest first.
  void shutdown(caf::exit_reason reason = caf::exit_reason::user_shutdown);

  /// Called after each (re)start with the child's name and new handle, so the
  /// owner can update whoever needs the handle.
  std::function<void(const std::string&, const caf::actor&)> on_started;

  std::uint64_t restarts() const noexcept { return restarts_; }

 private:
  struct child_entry {
    child_spec spec;
    caf::actor handle;
  };
  void start(child_entry& c);
  void restart_from(std::size_t index, const caf::error& reason);

  caf::scheduled_actor* self_;
  std::string name_;
  supervision_strategy strategy_;
  cluster::restart_intensity intensity_;
  std::vector<child_entry> children_;  // start order
  std::uint64_t restarts_ = 0;
};

/// The exit reason a supervisor uses when it gives up.
caf::error restart_intensity_exceeded();

}  // namespace exa::actors
