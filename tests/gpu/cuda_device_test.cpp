// The CUDA device on a real GPU: opening it (budget, pool, name), telemetry
// (NVML readings where the driver has them), its executor's completions
// (reported from the stream), errors, the health check and the engine
// factory. Exits 77 (ctest: SKIPPED) with the reason when there is no usable
// GPU; never reports a pass it did not run.

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/cuda_device.hpp"
#include "gpu/device_select.hpp"
#include "gpu/nvml.hpp"

using namespace exa;

namespace {

std::vector<std::string> failures;

void check(bool ok, const std::string& what) {
  if (!ok) failures.push_back(what);
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}

}  // namespace

int main() {
  auto count = gpu::cuda_device_count();
  if (!count) {
    std::printf("SKIPPED: %s\n", count.error().message.c_str());
    return 77;
  }
  gpu::device_options o;
  o.memory_bytes = 1ull << 30;
  o.page_bytes = 64 * 1024;
  auto d = gpu::open_device(gpu::device_kind::cuda, 0, o);
  check(d.has_value(), "open CUDA device 0" + (d ? "" : ": " + d.error().message));
  if (!d) return 1;
  auto dev = *d;
  check(dev->kind() == gpu::device_kind::cuda, "kind is cuda");
  std::printf("     name: %s\n", dev->name().c_str());
  const auto t = dev->read_telemetry();
  check(t.memory_budget_bytes == o.memory_bytes, "budget is what was asked (1 GiB fits)");
  check(t.memory_reserved_bytes >= o.memory_bytes / 2 - o.page_bytes, "KV pool holds half of the budget");
  check(t.memory_used_bytes == 0, "no page in use");
  check(t.error.empty(), "no error state");
  const bool have_nvml = gpu::nvml::get() != nullptr;
  std::printf("     nvml: %s temperature=%s utilization=%s\n", have_nvml ? "yes" : "no",
              t.temperature_c ? std::to_string(*t.temperature_c).c_str() : "-",
              t.utilization_percent ? std::to_string(*t.utilization_percent).c_str() : "-");
  if (have_nvml) check(t.temperature_c.has_value(), "NVML reports a temperature");
  check(dev->check_health().has_value(), "healthy");

  std::mutex m;
  std::condition_variable cv;
  std::vector<gpu::task_outcome> got;
  const auto sink = [&](gpu::task_outcome out) {
    std::lock_guard lock(m);
    got.push_back(std::move(out));
    cv.notify_all();
  };
  for (int i = 0; i < 100; ++i) dev->exec().submit([] {}, sink);
  dev->exec().submit([] { throw std::runtime_error("engine bug"); }, sink);
  {
    std::unique_lock lock(m);
    check(cv.wait_for(lock, std::chrono::seconds(30), [&] { return got.size() == 101; }),
          "101 completions from the stream within 30 s");
  }
  std::size_t ok = 0;
  for (std::size_t i = 0; i + 1 < got.size(); ++i) ok += !got[i].failure;
  check(ok == 100, "100 tasks completed without error");
  check(got.size() == 101 && got.back().failure.has_value(), "a throwing task is reported failed");
  auto eng = dev->make_engine(nullptr, {});
  check(!eng && (eng.error().code == errc::unsupported || eng.error().code == errc::invalid_argument),
        "the engine factory answers (unsupported until the CUDA engine is built)");
  auto too_many = gpu::open_device(gpu::device_kind::cuda, static_cast<std::uint32_t>(*count), o);
  check(!too_many && too_many.error().code == errc::invalid_argument, "a GPU index past the last is refused");
  std::printf("%s: %zu failure(s)\n", failures.empty() ? "PASSED" : "FAILED", failures.size());
  return failures.empty() ? 0 : 1;
}
