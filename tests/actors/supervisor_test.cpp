// The OTP-style supervisor on CAF's test scheduler: restart strategies,
// restart intensity and escalation to the parent.

#include <catch2/catch.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include <map>
#include <optional>

#include "actors/messages.hpp"
#include "actors/supervisor.hpp"

using namespace exa;
using exa::actors::tick_atom;

namespace {

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using who_atom = caf::atom_constant<caf::atom("who")>;

// A child that dies with an error when told to.
caf::behavior crasher(caf::event_based_actor* self) {
  return {[=](crash_atom) { self->quit(caf::make_error(caf::sec::runtime_error, "boom")); }};
}

struct parent_state {
  std::optional<actors::supervisor> sup;
  std::map<std::string, int> starts;  // how often each child was started
};

caf::behavior parent(caf::stateful_actor<parent_state>* self, actors::supervision_strategy strategy) {
  auto& sup = self->state.sup.emplace(self, "test", strategy, 2, std::chrono::seconds(10));
  sup.on_started = [=](const std::string& name, const caf::actor&) { ++self->state.starts[name]; };
  self->set_exit_handler([=](const caf::exit_msg& m) {
    if (!self->state.sup->on_exit(m)) self->quit(m.reason);
  });
  for (const char* name : {"a", "b", "c"})
    sup.add_child({name, [](caf::scheduled_actor* p) { return p->spawn(crasher); }, actors::restart_policy::permanent});
  return {
      [=](who_atom, const std::string& name) { return self->state.sup->child(name); },
      [=](tick_atom, const std::string& name) { return self->state.starts[name]; },
  };
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;

  fixture() {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }
  void run() { sched->run(); }

  template <class T, class... Ts>
  T ask(const caf::actor& to, Ts... xs) {
    auto out = std::make_shared<T>();
    sys->spawn([=](caf::event_based_actor* self) {
      self->request(to, caf::infinite, xs...).then([=](const T& v) { *out = v; });
    });
    run();
    return *out;
  }
};

}  // namespace

TEST_CASE("one_for_one restarts only the crashed child", "[supervision]") {
  fixture f;
  auto p = f.sys->spawn(parent, actors::supervision_strategy::one_for_one);
  f.run();
  const auto a = f.ask<caf::actor>(p, who_atom::value, std::string("a"));
  const auto b = f.ask<caf::actor>(p, who_atom::value, std::string("b"));
  caf::anon_send(b, crash_atom::value);
  f.run();
  CHECK(f.ask<caf::actor>(p, who_atom::value, std::string("a")) == a);
  CHECK(f.ask<caf::actor>(p, who_atom::value, std::string("b")) != b);
  CHECK(f.ask<int>(p, tick_atom::value, std::string("b")) == 2);
  CHECK(f.ask<int>(p, tick_atom::value, std::string("c")) == 1);
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  f.run();
}

TEST_CASE("rest_for_one restarts the crashed child and those started after it", "[supervision]") {
  fixture f;
  auto p = f.sys->spawn(parent, actors::supervision_strategy::rest_for_one);
  f.run();
  const auto a = f.ask<caf::actor>(p, who_atom::value, std::string("a"));
  caf::anon_send(f.ask<caf::actor>(p, who_atom::value, std::string("b")), crash_atom::value);
  f.run();
  CHECK(f.ask<caf::actor>(p, who_atom::value, std::string("a")) == a);
  CHECK(f.ask<int>(p, tick_atom::value, std::string("a")) == 1);
  CHECK(f.ask<int>(p, tick_atom::value, std::string("b")) == 2);
  CHECK(f.ask<int>(p, tick_atom::value, std::string("c")) == 2);
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  f.run();
}

TEST_CASE("beyond its restart intensity a supervisor gives up and escalates", "[supervision]") {
  fixture f;
  auto p = f.sys->spawn(parent, actors::supervision_strategy::one_for_one);
  f.run();
  auto exit_reason = std::make_shared<caf::error>();
  auto watcher = f.sys->spawn([=](caf::event_based_actor* self) {
    self->monitor(p);
    self->set_down_handler([=](const caf::down_msg& dm) { *exit_reason = dm.reason; });
    return caf::behavior{[](tick_atom) {}};
  });
  f.run();
  // Intensity 2 in 10 s: the third crash within the window is one too many.
  for (int i = 0; i < 3; ++i) {
    caf::anon_send(f.ask<caf::actor>(p, who_atom::value, std::string("a")), crash_atom::value);
    f.run();
    f.sched->advance_time(std::chrono::seconds(1));
    f.run();
  }
  CHECK(*exit_reason == actors::restart_intensity_exceeded());
  caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
  f.run();
}

TEST_CASE("restarts spread over more than the window are all allowed", "[supervision]") {
  fixture f;
  auto p = f.sys->spawn(parent, actors::supervision_strategy::one_for_one);
  f.run();
  for (int i = 0; i < 5; ++i) {
    caf::anon_send(f.ask<caf::actor>(p, who_atom::value, std::string("a")), crash_atom::value);
    f.run();
    f.sched->advance_time(std::chrono::seconds(6));  // two restarts never share a 10 s window
    f.run();
  }
  CHECK(f.ask<int>(p, tick_atom::value, std::string("a")) == 6);
  caf::anon_send_exit(p, caf::exit_reason::user_shutdown);
  f.run();
}
