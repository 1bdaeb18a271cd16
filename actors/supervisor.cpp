#include "actors/supervisor.hpp"

#include <caf/actor_cast.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scheduled_actor.hpp>
#include <caf/sec.hpp>
#include <caf/to_string.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace exa::actors {

caf::error restart_intensity_exceeded() {
  return caf::make_error(caf::sec::runtime_error, "restart intensity exceeded");
}

supervisor::supervisor(caf::scheduled_actor* self, std::string name, supervision_strategy strategy,
                       std::uint32_t max_restarts, std::chrono::nanoseconds window)
    : self_(self), name_(std::move(name)), strategy_(strategy), intensity_(max_restarts, window) {}

void supervisor::start(child_entry& c) {
  c.handle = c.spec.start(self_);
  self_->link_to(c.handle);
  if (on_started) on_started(c.spec.name, c.handle);
}

caf::actor supervisor::add_child(child_spec spec) {
  children_.push_back({std::move(spec), caf::actor{}});
  start(children_.back());
  return children_.back().handle;
}

void supervisor::remove_child(const std::string& name, caf::exit_reason reason) {
  const auto it = std::find_if(children_.begin(), children_.end(), [&](const child_entry& c) { return c.spec.name == name; });
  if (it == children_.end()) return;
  if (it->handle) {
    self_->unlink_from(it->handle);
    self_->send_exit(it->handle, reason);
  }
  children_.erase(it);
}

caf::actor supervisor::child(const std::string& name) const {
  for (const auto& c : children_)
    if (c.spec.name == name) return c.handle;
  return {};
}

std::vector<std::string> supervisor::children() const {
  std::vector<std::string> out;
  for (const auto& c : children_) out.push_back(c.spec.name);
  return out;
}

void supervisor::restart_from(std::size_t index, const caf::error& reason) {
  const auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
      self_->clock().now().time_since_epoch());
  if (!intensity_.allow(now)) {
    spdlog::error("event=supervisor_escalate supervisor={} child={} reason=\"{}\" max_restarts={} window_ms={}",
                  name_, children_[index].spec.name, caf::to_string(reason), intensity_.max_restarts(),
                  std::chrono::duration_cast<std::chrono::milliseconds>(intensity_.window()).count());
    shutdown();
    self_->quit(restart_intensity_exceeded());
    return;
  }
  // rest_for_one: the children started after the failed one depend on it;
  // stop them (newest first) and restart everything in start order.
  const std::size_t last = strategy_ == supervision_strategy::rest_for_one ? children_.size() : index + 1;
  for (std::size_t i = last; i-- > index + 1;) {
    if (!children_[i].handle) continue;
    self_->unlink_from(children_[i].handle);
    self_->send_exit(children_[i].handle, caf::exit_reason::kill);
    children_[i].handle = nullptr;
  }
  for (std::size_t i = index; i < last; ++i) {
    ++restarts_;
    spdlog::warn("event=child_restart supervisor={} child={} reason=\"{}\" restarts={}", name_,
                 children_[i].spec.name, i == index ? caf::to_string(reason) : std::string("rest_for_one"),
                 restarts_);
    start(children_[i]);
  }
}

bool supervisor::on_exit(const caf::exit_msg& msg) {
  const auto it = std::find_if(children_.begin(), children_.end(),
                               [&](const child_entry& c) { return c.handle && c.handle.address() == msg.source; });
  if (it == children_.end()) return false;
  const std::size_t index = static_cast<std::size_t>(it - children_.begin());
  const bool normal = !msg.reason || msg.reason == caf::exit_reason::normal;
  it->handle = nullptr;
  switch (it->spec.restart) {
    case restart_policy::temporary:
      children_.erase(it);
      return true;
    case restart_policy::transient:
      if (normal) {
        children_.erase(it);
        return true;
      }
      break;
    case restart_policy::permanent:
      break;
  }
  restart_from(index, msg.reason);
  return true;
}

void supervisor::shutdown(caf::exit_reason reason) {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (!it->handle) continue;
    self_->unlink_from(it->handle);
    self_->send_exit(it->handle, reason);
    it->handle = nullptr;
  }
}

}  // namespace exa::actors
