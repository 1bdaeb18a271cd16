#include "run_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace exa::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

process_result run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  char out_path[] = "/tmp/exa-it-out-XXXXXX";
  char err_path[] = "/tmp/exa-it-err-XXXXXX";
  const int out_fd = ::mkstemp(out_path), err_fd = ::mkstemp(err_path);
  if (out_fd < 0 || err_fd < 0) throw std::runtime_error("mkstemp failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, err_fd, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_fd);
  ::close(err_fd);
  if (rc != 0) throw std::runtime_error("cannot run " + argv[0]);

  // A watchdog kills the child at the deadline; normally it is told to stand
  // down as soon as the child exits.
  std::mutex mu;
  std::condition_variable cv;
  bool exited = false, killed = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return exited; })) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
  });
  int status = 0;
  ::waitpid(pid, &status, 0);
  {
    std::lock_guard lock(mu);
    exited = true;
  }
  cv.notify_all();
  watchdog.join();

  process_result r;
  r.timed_out = killed;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.signaled = WIFSIGNALED(status);
  r.signal = r.signaled ? WTERMSIG(status) : 0;
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  ::unlink(out_path);
  ::unlink(err_path);
  return r;
}

}  // namespace exa::test
