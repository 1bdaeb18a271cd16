// exaserve plan: placeholder until the ledger lands (being written now).
#include <cstdio>

#include "commands.hpp"

namespace exa::app {
int cmd_plan(int, char**) {
  std::fprintf(stderr, "exaserve plan: not available in this build yet\n");
  return 1;
}
}  // namespace exa::app
