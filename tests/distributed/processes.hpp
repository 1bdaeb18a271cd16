#pragma once
// Real processes for the multi-process tests: chaos::child_process (output
// to files in the test's own directory, every wait bounded, every child
// killed by its pid and reaped when its handle goes away), with errors
// thrown so a test fails with the child's output.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chaos/child_process.hpp"

namespace exa::test {

class child_process {
 public:
  /// Starts argv[0] (an absolute path) with stdin from /dev/null; output
  /// goes to DIR/NAME.out and DIR/NAME.err. Throws std::runtime_error.
  child_process(const std::vector<std::string>& argv, const std::string& dir, const std::string& name);

  pid_t pid() const { return c_->pid(); }
  const std::string& name() const { return c_->name(); }
  std::string out() const { return c_->out(); }
  std::string err() const { return c_->err(); }
  /// Sends `sig`; SIGKILL also reaps the child.
  void signal(int sig) { c_->signal(sig); }
  /// Waits (bounded) for the child to exit; its exit status, or nullopt.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) { return c_->wait_exit(timeout); }
  bool running() { return c_->running(); }
  /// Waits until `needle` appears in stdout (or stderr with `in_err`), up
  /// to `timeout`; returns the whole text then. Throws with the child's
  /// output on timeout or when the child exits first.
  std::string wait_for(const std::string& needle, std::chrono::milliseconds timeout, bool in_err = false);

 private:
  std::unique_ptr<chaos::child_process> c_;
};

/// The binaries under test.
inline const std::string exaserve_bin = std::string(EXA_BIN_DIR) + "/exaserve";
inline const std::string cli_bin = std::string(EXA_BIN_DIR) + "/exaserve-cli";

/// A fresh, empty directory under the build's test-tmp for one test.
std::string fresh_test_dir(const std::string& name);

using chaos::number_after;

}  // namespace exa::test
