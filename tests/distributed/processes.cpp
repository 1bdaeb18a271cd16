#include "processes.hpp"

#include "run_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace exa::test {
child_process::child_process(const std::vector<std::string>& argv, const std::string& dir, const std::string& name)
    : name_(name), out_path_(dir + "/" + name + ".out"), err_path_(dir + "/" + name + ".err") {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("cannot start " + argv[0] + " for " + name);
}

child_process::~child_process() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

std::string child_process::out() const { return read_file(out_path_); }
std::string child_process::err() const { return read_file(err_path_); }

void child_process::signal(int sig) {
  if (reaped_) return;
  ::kill(pid_, sig);
  if (sig == SIGKILL) {
    ::waitpid(pid_, &status_, 0);
    reaped_ = true;
  }
}

std::optional<int> child_process::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    const pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

bool child_process::running() { return !reaped_ && !wait_exit(std::chrono::milliseconds(0)); }

std::string child_process::wait_for(const std::string& needle, std::chrono::milliseconds timeout, bool in_err) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::string text = in_err ? err() : out();
    if (text.find(needle) != std::string::npos) return text;
    if (!running())
      throw std::runtime_error(name_ + " exited before printing '" + needle + "'\nstdout:\n" + out() +
                               "\nstderr:\n" + err());
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error(name_ + " did not print '" + needle + "' in time\nstdout:\n" + out() +
                               "\nstderr (tail):\n" + err().substr(err().size() > 4000 ? err().size() - 4000 : 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string fresh_test_dir(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/" + name + "-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::optional<unsigned> number_after(const std::string& text, const std::string& prefix) {
  const auto at = text.find(prefix);
  if (at == std::string::npos) return std::nullopt;
  std::size_t i = at + prefix.size();
  unsigned v = 0;
  bool any = false;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    v = v * 10 + static_cast<unsigned>(text[i] - '0');
    any = true;
  }
  if (!any) return std::nullopt;
  return v;
}

}  // namespace exa::test
