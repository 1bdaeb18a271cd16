#include "gpu/device_select.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "gpu/cpu_device.hpp"
#include "gpu/cuda_device.hpp"

namespace exa::gpu {

expected<kind_request> parse_kind_request(std::string_view text) {
  if (text == "cpu") return kind_request::cpu;
  if (text == "cuda") return kind_request::cuda;
  if (text == "auto") return kind_request::automatic;
  return make_error(errc::invalid_argument,
                    "device kind must be cpu, cuda or auto, got '" + std::string(text) + "'");
}

std::string_view to_string(kind_request request) noexcept {
  switch (request) {
    case kind_request::cpu: return "cpu";
    case kind_request::cuda: return "cuda";
    case kind_request::automatic: return "auto";
  }
  return "unknown";
}

expected<kind_choice> choose_device_kind(kind_request request, std::uint32_t needed,
                                         const expected<int>& cuda_devices) {
  if (request == kind_request::cpu) return kind_choice{device_kind::cpu, ""};
  std::string why;
  if (!cuda_devices) {
    why = cuda_devices.error().message;
  } else if (*cuda_devices < 0 || static_cast<std::uint32_t>(*cuda_devices) < needed) {
    why = std::to_string(needed) + " CUDA device" + (needed == 1 ? "" : "s") + " needed, " +
          std::to_string(std::max(0, *cuda_devices)) + " present";
  } else {
    return kind_choice{device_kind::cuda, ""};
  }
  if (request == kind_request::cuda) return make_error(errc::unavailable, "CUDA devices unavailable: " + why);
  return kind_choice{device_kind::cpu, why};
}

expected<std::shared_ptr<device>> open_device(device_kind kind, std::uint32_t index, const device_options& options) {
  if (kind == device_kind::cuda) return open_cuda_device(index, options);
  auto d = cpu_device::open(index, options);
  if (!d) return std::unexpected(d.error());
  return std::shared_ptr<device>(std::move(*d));
}

expected<kind_choice> resolve_device_kind(kind_request request, std::uint32_t needed, const cuda_count_probe& probe) {
  expected<int> cuda = 0;
  if (request != kind_request::cpu) cuda = probe ? probe() : cuda_device_count();
  auto choice = choose_device_kind(request, needed, cuda);
  if (choice && !choice->fallback_reason.empty())
    spdlog::warn("event=device_kind_fallback requested=auto kind=cpu reason=\"{}\"", choice->fallback_reason);
  return choice;
}

expected<std::vector<std::shared_ptr<device>>> open_devices(device_kind kind, std::uint32_t count,
                                                            const device_options& options) {
  std::vector<std::shared_ptr<device>> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    auto d = open_device(kind, i, options);
    if (!d)
      return make_error(d.error().code,
                        std::string(to_string(kind)) + " device " + std::to_string(i) + ": " + d.error().message);
    out.push_back(std::move(*d));
  }
  return out;
}

std::uint64_t min_memory_budget(const std::vector<std::shared_ptr<device>>& devices) {
  std::uint64_t out = 0;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const auto b = devices[i]->read_telemetry().memory_budget_bytes;
    out = i == 0 ? b : std::min(out, b);
  }
  return out;
}

std::uint64_t cuda_memory_budget(std::uint64_t requested, std::uint64_t free_bytes, std::uint64_t total_bytes) {
  // The CUDA context, cuBLAS workspaces and NCCL buffers live outside the
  // budget: leave 5 % of the card to them.
  const std::uint64_t headroom = total_bytes / 20;
  const std::uint64_t usable = free_bytes > headroom ? free_bytes - headroom : 0;
  return std::min(requested, usable);
}

device_opener reuse(std::shared_ptr<device> dev) {
  return [dev]() -> expected<std::shared_ptr<device>> { return dev; };
}

}  // namespace exa::gpu
