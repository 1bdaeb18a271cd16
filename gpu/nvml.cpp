#include "gpu/nvml.hpp"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <mutex>

namespace exa::gpu {
namespace {

// The few NVML types used, as nvml.h declares them (a stable C ABI).
using nvml_return = int;  // NVML_SUCCESS = 0
using nvml_device = void*;
struct nvml_utilization {
  unsigned int gpu;
  unsigned int memory;
};
constexpr unsigned int nvml_temperature_gpu = 0;

}  // namespace

struct nvml::api {
  void* lib = nullptr;
  nvml_return (*init)() = nullptr;
  nvml_return (*shutdown)() = nullptr;
  nvml_return (*by_pci)(const char*, nvml_device*) = nullptr;
  nvml_return (*temperature)(nvml_device, unsigned int, unsigned int*) = nullptr;
  nvml_return (*utilization)(nvml_device, nvml_utilization*) = nullptr;
};

namespace {

template <class Fn>
bool resolve(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  return out != nullptr;
}

std::unique_ptr<nvml::api> load_api() {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    spdlog::debug("event=nvml_absent reason=\"{}\"", dlerror());
    return nullptr;
  }
  auto a = std::make_unique<nvml::api>();
  a->lib = lib;
  const bool ok = resolve(lib, "nvmlInit_v2", a->init) && resolve(lib, "nvmlShutdown", a->shutdown) &&
                  resolve(lib, "nvmlDeviceGetHandleByPciBusId_v2", a->by_pci) &&
                  resolve(lib, "nvmlDeviceGetTemperature", a->temperature) &&
                  resolve(lib, "nvmlDeviceGetUtilizationRates", a->utilization);
  if (!ok || a->init() != 0) {
    spdlog::warn("event=nvml_unusable detail=\"libnvidia-ml.so.1 found but {}\"",
                 ok ? "nvmlInit failed" : "an entry point is missing");
    dlclose(lib);
    return nullptr;
  }
  return a;
}

}  // namespace

nvml::nvml(std::unique_ptr<api> a) : api_(std::move(a)) {}

nvml::~nvml() {
  api_->shutdown();
  dlclose(api_->lib);
}

std::shared_ptr<const nvml> nvml::get() {
  static std::once_flag once;
  static std::shared_ptr<const nvml> session;
  std::call_once(once, [] {
    if (auto a = load_api()) session = std::shared_ptr<const nvml>(new nvml(std::move(a)));
  });
  return session;
}

nvml::reading nvml::read(const std::string& pci_bus_id) const {
  reading r;
  nvml_device dev = nullptr;
  if (api_->by_pci(pci_bus_id.c_str(), &dev) != 0) return r;
  unsigned int t = 0;
  if (api_->temperature(dev, nvml_temperature_gpu, &t) == 0) r.temperature_c = t;
  nvml_utilization u{};
  if (api_->utilization(dev, &u) == 0) r.utilization_percent = u.gpu;
  return r;
}

}  // namespace exa::gpu
