#pragma once
// A CUDA device's peak memory bandwidth, for reading a benchmark's achieved
// bandwidth as a fraction of what the memory can deliver. The datasheet
// figure where the device is known by name (the runtime's clock attributes
// understate HBM3e parts such as the H200), else memory clock × bus width ×
// 2 (double data rate) from the runtime.

#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::gpu {

struct cuda_memory_peak {
  std::string device_name;
  double bytes_per_s = 0;
  std::string source;  // "datasheet" or "clock x bus width"
};

/// Datasheet bandwidth in bytes/s of a device whose name (as the runtime
/// reports it, e.g. "NVIDIA H200") contains a known model; 0 when unknown.
double datasheet_bandwidth(std::string_view device_name) noexcept;

/// The peak of CUDA device `device`. Errors: unavailable (no CUDA, no such
/// device), with the runtime's reason.
expected<cuda_memory_peak> cuda_peak_bandwidth(int device);

}  // namespace exa::gpu
