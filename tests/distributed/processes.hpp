#pragma once
// Real processes for the multi-process tests: each child's stdout and stderr
// go to files in the test's own directory, every wait is bounded, and every
// child is killed (by its pid) and reaped when its handle goes away, however
// the test ends.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace exa::test {

class child_process {
 public:
  /// Starts argv[0] (an absolute path) with stdin from /dev/null; output
  /// goes to DIR/NAME.out and DIR/NAME.err. Throws std::runtime_error.
  child_process(const std::vector<std::string>& argv, const std::string& dir, const std::string& name);
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  std::string out() const;
  std::string err() const;

  /// Sends `sig`; SIGKILL also reaps the child.
  void signal(int sig);
  /// Waits (bounded) for the child to exit; its exit status, or nullopt.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  bool running();

  /// Waits until `needle` appears in stdout (or stderr with `in_err`), up
  /// to `timeout`; returns the whole text then. Throws with the child's
  /// output on timeout or when the child exits first.
  std::string wait_for(const std::string& needle, std::chrono::milliseconds timeout, bool in_err = false);

 private:
  pid_t pid_ = -1;
  std::string name_, out_path_, err_path_;
  bool reaped_ = false;
  int status_ = 0;
};

/// The binaries under test.
inline const std::string exaserve_bin = std::string(EXA_BIN_DIR) + "/exaserve";
inline const std::string cli_bin = std::string(EXA_BIN_DIR) + "/exaserve-cli";

/// A fresh, empty directory under the build's test-tmp for one test.
std::string fresh_test_dir(const std::string& name);

/// The number after `prefix` in `text` (e.g. a port after "127.0.0.1:").
std::optional<unsigned> number_after(const std::string& text, const std::string& prefix);

}  // namespace exa::test
