#pragma once
// Which kind of device a process runs on (`--device-kind cpu|cuda|auto`) and
// opening them. The choice is a pure function of the request, the number of
// devices wanted and what the CUDA runtime reports, so it is tested without
// a GPU; the CUDA query is a parameter.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"
#include "gpu/device.hpp"

namespace exa::gpu {

/// What the operator asked for: a kind, or `automatic` (CUDA when there are
/// enough GPUs, else CPU).
enum class kind_request : std::uint8_t { cpu, cuda, automatic };

/// "cpu", "cuda" or "auto"; anything else is invalid_argument naming the
/// valid values.
expected<kind_request> parse_kind_request(std::string_view text);
std::string_view to_string(kind_request request) noexcept;

/// CUDA devices visible, or an `unavailable` error with the runtime's reason.
using cuda_count_probe = std::function<expected<int>()>;

struct kind_choice {
  device_kind kind = device_kind::cpu;
  /// `auto` fell back to CPU devices: why (the CUDA runtime's reason, or too
  /// few GPUs). Empty otherwise.
  std::string fallback_reason;
};

/// `cuda` without `needed` usable GPUs is `unavailable` naming the reason;
/// `auto` then falls back to CPU and says why; `cpu` never asks CUDA.
expected<kind_choice> choose_device_kind(kind_request request, std::uint32_t needed,
                                         const expected<int>& cuda_devices);

/// Opens device `index` of `kind` (CUDA: the GPU with that runtime index).
expected<std::shared_ptr<device>> open_device(device_kind kind, std::uint32_t index, const device_options& options);

/// choose_device_kind() with what the CUDA runtime (or `probe`) reports,
/// asked only when the request may use CUDA; a fallback is logged.
expected<kind_choice> resolve_device_kind(kind_request request, std::uint32_t needed,
                                          const cuda_count_probe& probe = {});

/// Opens devices 0..count-1 of `kind`. Errors name the device that failed.
expected<std::vector<std::shared_ptr<device>>> open_devices(device_kind kind, std::uint32_t count,
                                                            const device_options& options);

/// The smallest memory budget among `devices` (what every device of a node
/// can give the ledger); 0 for none.
std::uint64_t min_memory_budget(const std::vector<std::shared_ptr<device>>& devices);

/// An opener that hands out the same, already opened, device every time:
/// a restarted device actor takes the device its predecessor had.
device_opener reuse(std::shared_ptr<device> dev);

}  // namespace exa::gpu
