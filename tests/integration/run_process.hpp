#pragma once
// Runs a program to completion with its output captured, killing it if it
// outlives a deadline (so a hung client fails its test instead of hanging it).

#include <chrono>
#include <string>
#include <vector>

namespace exa::test {

struct process_result {
  int exit_code = -1;  // -1 if killed by a signal
  bool signaled = false;  // ended by a signal (the deadline's SIGKILL too)
  int signal = 0;
  bool timed_out = false;
  std::string out;
  std::string err;
};

process_result run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

/// A whole file's bytes ("" when it cannot be read).
std::string read_file(const std::string& path);

}  // namespace exa::test
