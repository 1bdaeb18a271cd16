#pragma once
// Which vector instruction set the engine's kernels use, chosen at run time
// from what the CPU reports (the binary is built for baseline x86-64 and
// carries every variant). Every variant computes each output element with the
// same sequence of IEEE operations (16 logical float lanes, one fixed
// reduction tree, exact integer dot products), so the choice changes speed,
// never a logit: a request resumed on a node with another ISA stays
// token-exact.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::engine {

enum class isa : std::uint8_t {
  scalar,  // portable C++, one lane at a time (fmaf for every multiply-add)
  avx2,    // AVX2 + FMA + F16C: each 16-lane vector is two 256-bit registers
  avxvnni, // AVX2 + AVX-VNNI (vpdpbusd on 256 bits, without AVX-512: Alder Lake and later)
  avx512,  // AVX-512 F/BW/VL + VNNI: one 512-bit register, vpdpbusd for int8
  amx,     // avx512 + AMX-INT8 tiles for q8_0 matrices against 16 tokens and more (only when asked: best_isa)
};

std::string_view to_string(isa i) noexcept;

/// What the CPU (and the OS, which must save the wider registers) supports.
struct cpu_caps {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
  bool avxvnni = false;
  bool os_avx = false;     // XCR0 has SSE and AVX state
  bool os_avx512 = false;  // XCR0 has opmask and ZMM state
  bool amx_tile = false, amx_int8 = false;
  bool os_amx = false;  // XCR0 has tile state (Linux's per-process permission is asked when amx is chosen)
};

/// Reads CPUID and XGETBV (all false off x86-64).
cpu_caps detect_cpu() noexcept;

/// True when `caps` can run variant `i`.
bool supports(const cpu_caps& caps, isa i) noexcept;

/// The fastest variant `caps` supports.
isa best_isa(const cpu_caps& caps) noexcept;

/// `requested` is "", "auto" (the best), or a variant name. Errors:
/// invalid_argument for an unknown name, unavailable for a variant this CPU
/// cannot run (the message names the missing feature).
expected<isa> choose_isa(const cpu_caps& caps, std::string_view requested);

/// "avx2 fma f16c avx512f ..." for logs and bench output.
std::string describe(const cpu_caps& caps);

/// The variant the engine uses in this process. Chosen on first use from the
/// environment variable EXA_ENGINE_ISA (as choose_isa; an invalid value is
/// reported on stderr and ignored) or the best the CPU supports.
isa active_isa() noexcept;

/// Asks the OS for what variant `i` needs beyond the CPU's features (amx:
/// Linux's permission for the tile state, once per process); true when
/// granted or nothing is needed.
bool request_os_state(isa i) noexcept;

/// Switches the process's variant (tests, `--isa` flags). Errors as choose_isa.
/// Engines read it when they run, so switch only while no engine is running.
expected<isa> set_active_isa(std::string_view requested);

}  // namespace exa::engine
