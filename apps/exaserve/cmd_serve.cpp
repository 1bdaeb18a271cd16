// exaserve serve. The embedded cluster (actors, HTTP and RPC front doors) is
// the next milestone; until it lands, `serve` says so and generates a
// completion from the default model so `make run` shows the engine working.

#include <spdlog/spdlog.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "commands.hpp"

namespace exa::app {

int cmd_serve(int argc, char** argv) {
  for (int i = 2; i < argc; ++i)
    if (std::string(argv[i]) == "--help") {
      std::printf("usage: exaserve serve\n  (the serving cluster is not built yet; this generates from the default model)\n");
      return 0;
    }
  std::fprintf(stderr,
               "exaserve serve: the embedded cluster with its HTTP and RPC front doors is not built yet.\n"
               "Generating a completion from the default model instead (the tiny preset with random\n"
               "weights, so the text is gibberish by design).\n\n");
  auto path = default_model_path();
  if (!path) return fail("serve", path.error());
  std::string model_flag = "--model=" + *path;
  std::vector<char*> args = {argv[0], const_cast<char*>("generate"), model_flag.data(),
                             const_cast<char*>("--prompt=Hello, ExaServe"),
                             const_cast<char*>("--max-tokens=48"), const_cast<char*>("--temperature=0.8"),
                             const_cast<char*>("--seed=42")};
  return cmd_generate(static_cast<int>(args.size()), args.data());
}

}  // namespace exa::app
