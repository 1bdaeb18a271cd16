#include "common/assert.hpp"

#include <cstdio>
#include <cstdlib>

namespace exa::detail {

// Deliberately not spdlog: the logger may be the thing that is broken, and an
// assertion must reach stderr before abort() whatever state the process is in.
void assertion_failed(const char* expr, const char* file, int line,
                      const char* message) noexcept {
  std::fprintf(stderr, "exaserve: invariant violated: %s at %s:%d%s%s\n", expr, file,
               line, message ? ": " : "", message ? message : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace exa::detail
