#pragma once
// Device presets: the public figures of the GPUs ExaServe plans for, and a CPU
// device whose memory is given explicitly. Data only: the planner reads the
// memory figures; the simulator's cost model reads bandwidth and throughput.
//
// Sources (NVIDIA datasheets): A100 80GB SXM ("NVIDIA A100 Tensor Core GPU"
// datasheet), H100 SXM ("NVIDIA H100 Tensor Core GPU" datasheet), H200 SXM
// ("NVIDIA H200 Tensor Core GPU" datasheet). Throughputs are the dense
// figures (the datasheets' headline numbers are with 2:4 sparsity, twice these).
//
// Memory: the total that nvidia-smi reports (MiB × 2^20), which is what a
// process can ask the driver for before the CUDA context takes its share:
// A100 80GB 81920 MiB (exactly 80 GiB), H100 80GB HBM3 81559 MiB (79.6 GiB),
// H200 143771 MiB (140.4 GiB; marketed as 141 GB).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.hpp"

namespace exa::cluster {

enum class device_kind : std::uint8_t { gpu, cpu };

/// "gpu" or "cpu".
std::string_view to_string(device_kind k) noexcept;

constexpr std::uint64_t mib_bytes = std::uint64_t{1} << 20;
constexpr std::uint64_t gib_bytes = std::uint64_t{1} << 30;

/// Memory the CUDA context, cuBLAS/NCCL handles and the driver's own pools take
/// on every GPU before any replica loads (~500 MiB in practice).
constexpr std::uint64_t gpu_device_reserved_bytes = 512 * mib_bytes;
/// Per replica on a GPU: its streams, cuBLAS workspace, NCCL buffers for its
/// TP group and the engine's fixed buffers.
constexpr std::uint64_t gpu_replica_overhead_bytes = 256 * mib_bytes;

/// One kind of device. Rates are per device, in base units per second.
struct device_spec {
  std::string name;
  device_kind kind = device_kind::gpu;
  std::uint64_t memory_bytes = 0;
  double memory_bandwidth_bytes_per_s = 0;
  /// Dense fp16/bf16 tensor-core throughput.
  double fp16_flops_per_s = 0;
  /// Dense int8 tensor-core throughput.
  double int8_ops_per_s = 0;
  /// NVLink bandwidth per GPU (all links, both directions); 0 without NVLink.
  double nvlink_bytes_per_s = 0;
  /// Taken once per device before any replica (CUDA context); 0 on CPU.
  std::uint64_t device_reserved_bytes = 0;
  /// Taken once per replica shard on this device; 0 on CPU.
  std::uint64_t replica_overhead_bytes = 0;
};

/// Names of the GPU presets plus "cpu", in a stable order.
const std::vector<std::string>& device_preset_names();

/// The preset `name` (case-insensitive): a100-80gb, h100-80gb, h200-141gb.
/// "cpu" needs `memory_bytes`; for a GPU, `memory_bytes` overrides the preset's
/// figure (a partitioned or differently sized card). Errors: not_found listing
/// the valid names; invalid_argument for "cpu" without memory.
expected<device_spec> device_preset(std::string_view name, std::optional<std::uint64_t> memory_bytes = {});

/// A CPU device with `memory_bytes` for replicas. Bandwidth and throughput are
/// nominal figures for one server socket (DDR5, 8 channels; AVX-512 fp32),
/// good for order-of-magnitude simulation only: measure with bench-engine.
device_spec cpu_device(std::uint64_t memory_bytes);

}  // namespace exa::cluster
