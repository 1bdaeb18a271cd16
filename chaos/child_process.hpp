#pragma once
// A child process of a multi-process chaos run (or test): stdin from
// /dev/null, stdout and stderr to files, signalled and reaped by its pid.
// The handle kills (SIGKILL) and reaps a child still running when it goes
// away; and the child gets SIGKILL from the kernel when the thread that
// started it dies (PR_SET_PDEATHSIG), so even an owner killed outright or
// aborted leaves no process behind.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace exa::chaos {

class child_process {
 public:
  /// Starts argv[0] (an absolute path); output goes to DIR/NAME.out and
  /// DIR/NAME.err. Errors: io_error naming the program (a program that
  /// cannot be executed exits with status 127). Start children from a
  /// thread that outlives them: they die with it.
  static expected<std::unique_ptr<child_process>> start(const std::vector<std::string>& argv, const std::string& dir,
                                                        const std::string& name);
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  std::string out() const;
  std::string err() const;

  /// Sends `sig` (nothing once reaped); SIGKILL also reaps the child.
  void signal(int sig);
  /// Waits (bounded) for the child to exit: its exit status (128 + signal
  /// when killed by one), or nullopt on timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  bool running();
  /// SIGTERM, up to `grace` for it to exit, then SIGKILL; the exit status.
  int stop(std::chrono::milliseconds grace);

  /// Waits until `needle` appears in stdout (or stderr with `in_err`), up to
  /// `timeout`. The whole text then; an error naming the child, with the tail
  /// of its output, on timeout or when it exits first.
  expected<std::string> wait_for(const std::string& needle, std::chrono::milliseconds timeout, bool in_err = false);

 private:
  child_process() = default;
  pid_t pid_ = -1;
  std::string name_, out_path_, err_path_;
  bool reaped_ = false;
  int status_ = 0;
};

/// The whole of a (small) text file; "" when it cannot be read.
std::string read_text(const std::string& path);

/// The number after `prefix` in `text` (e.g. a port after "127.0.0.1:").
std::optional<unsigned> number_after(const std::string& text, const std::string& prefix);

}  // namespace exa::chaos
