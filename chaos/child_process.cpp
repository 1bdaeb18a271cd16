#include "chaos/child_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace exa::chaos {

expected<std::unique_ptr<child_process>> child_process::start(const std::vector<std::string>& argv,
                                                              const std::string& dir, const std::string& name) {
  if (argv.empty()) return make_error(errc::invalid_argument, "no program to start for " + name);
  std::unique_ptr<child_process> c(new child_process());
  c->name_ = name;
  c->out_path_ = dir + "/" + name + ".out";
  c->err_path_ = dir + "/" + name + ".err";
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return make_error(errc::io_error, "cannot start " + argv[0] + " for " + name + ": " + std::strerror(errno));
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. It dies with its
    // parent, so a driver or test killed outright leaves no process behind.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent is already gone
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(c->out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(c->err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || err < 0 || ::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(127);
    ::execv(args[0], args.data());
    ::_exit(127);  // exec failed: the exit status says so
  }
  c->pid_ = pid;
  return c;
}

child_process::~child_process() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status_, 0);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string child_process::out() const { return read_text(out_path_); }
std::string child_process::err() const { return read_text(err_path_); }

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
    if (r < 0 && errno == EINTR) continue;
    if (r == pid_ || (r < 0 && errno == ECHILD)) {  // exited (or reaped elsewhere)
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

bool child_process::running() { return !reaped_ && !wait_exit(std::chrono::milliseconds(0)); }

int child_process::stop(std::chrono::milliseconds grace) {
  if (!reaped_) {
    ::kill(pid_, SIGCONT);  // a stopped child cannot act on SIGTERM
    ::kill(pid_, SIGTERM);
  }
  if (auto rc = wait_exit(grace)) return *rc;
  signal(SIGKILL);
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

expected<std::string> child_process::wait_for(const std::string& needle, std::chrono::milliseconds timeout,
                                              bool in_err) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto tail = [](const std::string& s) { return s.substr(s.size() > 4000 ? s.size() - 4000 : 0); };
  for (;;) {
    std::string text = in_err ? err() : out();
    if (text.find(needle) != std::string::npos) return text;
    if (!running())
      return make_error(errc::unavailable, name_ + " exited before printing '" + needle + "'\nstdout:\n" +
                                               tail(out()) + "\nstderr (tail):\n" + tail(err()));
    if (std::chrono::steady_clock::now() > deadline)
      return make_error(errc::deadline_exceeded, name_ + " did not print '" + needle + "' in time\nstdout:\n" + tail(out()) +
                                           "\nstderr (tail):\n" + tail(err()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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

}  // namespace exa::chaos
