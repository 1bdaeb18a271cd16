#pragma once
// Runs a program with arguments and captures its exit status and output, for
// tests of the command-line contract.

#include <string>
#include <vector>

namespace exa::test {

struct command_result {
  int exit_code = -1;   // valid when !signaled
  bool signaled = false;
  int signal = 0;
  std::string out;
  std::string err;
};

/// Runs `argv[0]` with `argv`, stdin from /dev/null, waiting for it to exit.
command_result run_command(const std::vector<std::string>& argv);

}  // namespace exa::test
