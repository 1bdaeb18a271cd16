#include "run_command.hpp"

#include "run_process.hpp"

namespace exa::test {

command_result run_command(const std::vector<std::string>& argv) {
  // Generous: a command that has not finished in ten minutes is hung.
  const auto p = run_process(argv, std::chrono::minutes(10));
  command_result r;
  r.exit_code = p.exit_code;
  r.signaled = p.signaled;
  r.signal = p.signal;
  r.out = p.out;
  r.err = p.err;
  return r;
}

}  // namespace exa::test
