#include "engine/isa.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace exa::engine {

std::string_view to_string(isa i) noexcept {
  switch (i) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avxvnni: return "avxvnni";
    case isa::avx512: return "avx512";
    case isa::amx: return "amx";
  }
  return "unknown";
}

namespace {

// Linux hands out the AMX tile data state only on request (5.16 and later:
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); without it the
// first tile instruction faults. Asked once per process, and only when the
// amx variant is chosen (the permission enlarges every thread's signal
// frames); a kernel without the call refuses it.
bool request_amx_permission() noexcept {
#if defined(__linux__) && defined(__x86_64__)
  static const bool granted = [] {
    constexpr long arch_req_xcomp_perm = 0x1023;
    constexpr long xfeature_xtiledata = 18;
    return ::syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

}  // namespace

cpu_caps detect_cpu() noexcept {
  cpu_caps c;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return c;
  __cpuid_count(1, 0, a, b, cx, d);
  c.fma = (cx >> 12) & 1;
  c.f16c = (cx >> 29) & 1;
  const bool osxsave = (cx >> 27) & 1;
  const bool avx = (cx >> 28) & 1;
  if (osxsave && avx) {
    std::uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    c.os_avx = (lo & 0x6) == 0x6;           // SSE and YMM state
    c.os_avx512 = c.os_avx && (lo & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
    c.os_amx = (lo & 0x60000) == 0x60000;   // XTILECFG and XTILEDATA
  }
  __cpuid_count(7, 0, a, b, cx, d);
  c.avx2 = (b >> 5) & 1;
  c.avx512f = (b >> 16) & 1;
  c.avx512bw = (b >> 30) & 1;
  c.avx512vl = (b >> 31) & 1;
  c.avx512vnni = (cx >> 11) & 1;
  c.amx_tile = (d >> 24) & 1;
  c.amx_int8 = (d >> 25) & 1;
  __cpuid_count(7, 1, a, b, cx, d);
  c.avxvnni = (a >> 4) & 1;
  c.avx512bf16 = (a >> 5) & 1;
#endif
  return c;
}

namespace {

// The first feature variant `i` needs and `caps` lacks, or nullptr.
const char* missing(const cpu_caps& c, isa i) noexcept {
  if (i == isa::scalar) return nullptr;
  if (!c.os_avx) return "OS support for AVX state (XCR0)";
  if (!c.avx2) return "avx2";
  if (!c.fma) return "fma";
  if (!c.f16c) return "f16c";
  if (i == isa::avx2) return nullptr;
  if (i == isa::avxvnni) return c.avxvnni ? nullptr : "avx_vnni";
  if (!c.os_avx512) return "OS support for AVX-512 state (XCR0)";
  if (!c.avx512f) return "avx512f";
  if (!c.avx512bw) return "avx512bw";
  if (!c.avx512vl) return "avx512vl";
  if (!c.avx512vnni) return "avx512_vnni";
  if (i == isa::avx512) return nullptr;
  if (!c.amx_tile) return "amx_tile";
  if (!c.amx_int8) return "amx_int8";
  if (!c.os_amx) return "OS support for AMX tile state (XCR0)";
  return nullptr;
}

std::atomic<int> g_active{-1};

// What choosing `i` needs from the OS beyond what the CPU reports.
expected<isa> enable(expected<isa> i) {
  if (i && !request_os_state(*i))
    return make_error(errc::unavailable,
                      "engine ISA 'amx' cannot run here: the OS refused the AMX tile state "
                      "(arch_prctl ARCH_REQ_XCOMP_PERM; Linux 5.16 or later grants it)");
  return i;
}

}  // namespace

bool supports(const cpu_caps& caps, isa i) noexcept { return missing(caps, i) == nullptr; }

bool request_os_state(isa i) noexcept { return i != isa::amx || request_amx_permission(); }

// AMX is not picked on its own: on the one AMX host we measured (a
// Sapphire Rapids VM) its q8_0 tiles matched the AVX-512 ones for prefill
// and gained only on one-thread batched decode (docs/PERFORMANCE.md), so
// it runs where asked for (EXA_ENGINE_ISA=amx).
isa best_isa(const cpu_caps& caps) noexcept {
  if (supports(caps, isa::avx512)) return isa::avx512;
  if (supports(caps, isa::avxvnni)) return isa::avxvnni;
  if (supports(caps, isa::avx2)) return isa::avx2;
  return isa::scalar;
}

expected<isa> choose_isa(const cpu_caps& caps, std::string_view requested) {
  if (requested.empty() || requested == "auto") return best_isa(caps);
  for (const isa i : {isa::scalar, isa::avx2, isa::avxvnni, isa::avx512, isa::amx}) {
    if (requested != to_string(i)) continue;
    if (const char* m = missing(caps, i))
      return make_error(errc::unavailable, "engine ISA '" + std::string(requested) +
                                               "' cannot run on this CPU: it lacks " + m);
    return i;
  }
  return make_error(errc::invalid_argument, "unknown engine ISA '" + std::string(requested) +
                                                "': use auto, scalar, avx2, avxvnni, avx512 or amx");
}

std::string describe(const cpu_caps& c) {
  std::string out;
  const auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(c.avx2, "avx2");
  add(c.fma, "fma");
  add(c.f16c, "f16c");
  add(c.avxvnni, "avx_vnni");
  add(c.avx512f, "avx512f");
  add(c.avx512bw, "avx512bw");
  add(c.avx512vl, "avx512vl");
  add(c.avx512vnni, "avx512_vnni");
  add(c.avx512bf16, "avx512_bf16");
  add(c.amx_tile, "amx_tile");
  add(c.amx_int8, "amx_int8");
  return out.empty() ? "baseline x86-64" : out;
}

isa active_isa() noexcept {
  int v = g_active.load(std::memory_order_acquire);
  if (v >= 0) return static_cast<isa>(v);
  const cpu_caps caps = detect_cpu();
  isa chosen = best_isa(caps);
  if (const char* env = std::getenv("EXA_ENGINE_ISA"); env != nullptr) {
    if (auto c = enable(choose_isa(caps, env))) chosen = *c;
    else std::fprintf(stderr, "EXA_ENGINE_ISA ignored: %s\n", c.error().message.c_str());
  }
  int expect = -1;
  g_active.compare_exchange_strong(expect, static_cast<int>(chosen), std::memory_order_acq_rel);
  return static_cast<isa>(g_active.load(std::memory_order_acquire));
}

expected<isa> set_active_isa(std::string_view requested) {
  auto c = enable(choose_isa(detect_cpu(), requested));
  if (c) g_active.store(static_cast<int>(*c), std::memory_order_release);
  return c;
}

}  // namespace exa::engine
