#include "processes.hpp"

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

namespace exa::test {

child_process::child_process(const std::vector<std::string>& argv, const std::string& dir, const std::string& name) {
  auto c = chaos::child_process::start(argv, dir, name);
  if (!c) throw std::runtime_error(c.error().message);
  c_ = std::move(*c);
}

std::string child_process::wait_for(const std::string& needle, std::chrono::milliseconds timeout, bool in_err) {
  auto text = c_->wait_for(needle, timeout, in_err);
  if (!text) throw std::runtime_error(text.error().message);
  return *text;
}

std::string fresh_test_dir(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/" + name + "-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace exa::test
