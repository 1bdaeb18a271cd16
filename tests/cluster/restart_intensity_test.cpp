// OTP restart intensity: at most N restarts in any window of T.

#include <catch2/catch.hpp>

#include "cluster/restart_intensity.hpp"

using exa::cluster::restart_intensity;
using namespace std::chrono_literals;

TEST_CASE("restarts beyond the intensity are refused until the window slides", "[supervision]") {
  restart_intensity r(3, 10s);
  CHECK(r.allow(1s));
  CHECK(r.allow(2s));
  CHECK(r.allow(3s));
  CHECK_FALSE(r.allow(4s));  // a fourth within 10 s: give up
  CHECK(r.recent(4s) == 3);
  CHECK(r.recent(11s) == 2);  // the restart at 1 s left the window
  CHECK(r.allow(11s));
  CHECK_FALSE(r.allow(11s));
}

TEST_CASE("zero intensity never restarts", "[supervision]") {
  restart_intensity r(0, 1s);
  CHECK_FALSE(r.allow(0s));
}
