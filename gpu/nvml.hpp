#pragma once
// NVML (the driver's management library), loaded at run time with dlopen
// where the driver provides libnvidia-ml.so.1: programs never link it, and
// on a host without it the readings are empty (never zero).

#include <memory>
#include <optional>
#include <string>

namespace exa::gpu {

class nvml {
 public:
  /// The process's NVML session, opened on first use; nullptr when the
  /// library is absent or does not initialize (no driver, no GPU).
  static std::shared_ptr<const nvml> get();
  ~nvml();

  struct reading {
    std::optional<double> temperature_c;
    std::optional<double> utilization_percent;  // of the last sample period
  };
  /// The GPU with this PCI bus id (cudaDeviceGetPCIBusId's form). A reading
  /// NVML cannot give stays empty.
  reading read(const std::string& pci_bus_id) const;

  struct api;  // the resolved entry points

 private:
  explicit nvml(std::unique_ptr<api> a);
  std::unique_ptr<api> api_;
};

}  // namespace exa::gpu
