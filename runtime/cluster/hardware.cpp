#include "cluster/hardware.hpp"

#include <fmt/format.h>

#include <array>

namespace exa::cluster {
namespace {

constexpr double tera = 1e12;
constexpr double giga = 1e9;

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

device_spec gpu(std::string name, std::uint64_t memory_mib, double bandwidth_tb_s, double fp16_tflops,
                double int8_tops, double nvlink_gb_s) {
  device_spec d;
  d.name = std::move(name);
  d.kind = device_kind::gpu;
  d.memory_bytes = memory_mib * mib_bytes;
  d.memory_bandwidth_bytes_per_s = bandwidth_tb_s * tera;
  d.fp16_flops_per_s = fp16_tflops * tera;
  d.int8_ops_per_s = int8_tops * tera;
  d.nvlink_bytes_per_s = nvlink_gb_s * giga;
  d.device_reserved_bytes = gpu_device_reserved_bytes;
  d.replica_overhead_bytes = gpu_replica_overhead_bytes;
  return d;
}

// See the header for sources; memory in MiB as nvidia-smi reports it.
const std::array<device_spec, 3>& gpu_presets() {
  static const std::array<device_spec, 3> presets = {
      gpu("a100-80gb", 81920, 2.039, 312, 624, 600),
      gpu("h100-80gb", 81559, 3.35, 989, 1979, 900),
      gpu("h200-141gb", 143771, 4.8, 989, 1979, 900),
  };
  return presets;
}

}  // namespace

std::string_view to_string(device_kind k) noexcept {
  return k == device_kind::gpu ? "gpu" : "cpu";
}

const std::vector<std::string>& device_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const device_spec& d : gpu_presets()) out.push_back(d.name);
    out.emplace_back("cpu");
    return out;
  }();
  return names;
}

device_spec cpu_device(std::uint64_t memory_bytes) {
  device_spec d;
  d.name = "cpu";
  d.kind = device_kind::cpu;
  d.memory_bytes = memory_bytes;
  d.memory_bandwidth_bytes_per_s = 300 * giga;  // 8 × DDR5-4800 channels ≈ 307 GB/s
  d.fp16_flops_per_s = 2 * tera;                // fp32 FMA on AVX-512 cores; no fp16 units
  d.int8_ops_per_s = 4 * tera;                  // VNNI
  return d;
}

expected<device_spec> device_preset(std::string_view name, std::optional<std::uint64_t> memory_bytes) {
  if (memory_bytes && *memory_bytes == 0) {
    return make_error(errc::invalid_argument, fmt::format("device '{}': memory must be positive", name));
  }
  if (iequals(name, "cpu")) {
    if (!memory_bytes) {
      return make_error(errc::invalid_argument, "device 'cpu' needs its memory given explicitly");
    }
    return cpu_device(*memory_bytes);
  }
  for (const device_spec& d : gpu_presets()) {
    if (!iequals(name, d.name)) continue;
    device_spec out = d;
    if (memory_bytes) out.memory_bytes = *memory_bytes;
    return out;
  }
  std::string valid;
  for (const std::string& n : device_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  return make_error(errc::not_found, fmt::format("unknown device preset '{}' (valid: {})", name, valid));
}

}  // namespace exa::cluster
