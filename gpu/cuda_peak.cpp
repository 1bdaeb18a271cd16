#include "gpu/cuda_peak.hpp"

#if defined(EXASERVE_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace exa::gpu {

double datasheet_bandwidth(std::string_view name) noexcept {
  struct entry {
    std::string_view name;  // matched as a substring, most specific first
    double gb_per_s;
  };
  static constexpr entry table[] = {
      {"GH200", 4000},         {"H200", 4800},           {"H100 NVL", 3900}, {"H100 PCIe", 2000},
      {"H100", 3350},          {"A100-SXM4-80GB", 2039}, {"A100 80GB PCIe", 1935},
      {"A100", 1555},          {"L40S", 864},            {"L4", 300},        {"A10G", 600},
  };
  for (const entry& e : table)
    if (name.find(e.name) != std::string_view::npos) return e.gb_per_s * 1e9;
  return 0;
}

expected<cuda_memory_peak> cuda_peak_bandwidth(int device) {
#if defined(EXASERVE_HAVE_CUDA)
  cudaDeviceProp prop{};
  if (cudaError_t rc = cudaGetDeviceProperties(&prop, device); rc != cudaSuccess)
    return make_error(errc::unavailable, std::string("cudaGetDeviceProperties: ") + cudaGetErrorString(rc));
  cuda_memory_peak p;
  p.device_name = prop.name;
  if (const double d = datasheet_bandwidth(p.device_name); d > 0) {
    p.bytes_per_s = d;
    p.source = "datasheet";
    return p;
  }
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  p.bytes_per_s = 2.0 * clock_khz * 1e3 * bus_bits / 8.0;
  p.source = "clock x bus width";
  return p;
#else
  (void)device;
  return make_error(errc::unavailable, "ExaServe was built without CUDA");
#endif
}

}  // namespace exa::gpu
