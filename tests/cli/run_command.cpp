#include "run_command.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

extern char** environ;

namespace exa::test {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

command_result run_command(const std::vector<std::string>& argv) {
  char out_path[] = "/tmp/exa-cli-out-XXXXXX";
  char err_path[] = "/tmp/exa-cli-err-XXXXXX";
  const int out_fd = ::mkstemp(out_path), err_fd = ::mkstemp(err_path);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_fd, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  command_result r;
  pid_t pid = 0;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) == 0) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
      r.signaled = true;
      r.signal = WTERMSIG(status);
    } else {
      r.exit_code = WEXITSTATUS(status);
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_fd);
  ::close(err_fd);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  ::unlink(out_path);
  ::unlink(err_path);
  return r;
}

}  // namespace exa::test
