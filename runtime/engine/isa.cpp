#include "engine/isa.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace exa::engine {

std::string_view to_string(isa i) noexcept {
  switch (i) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avxvnni: return "avxvnni";
    case isa::avx512: return "avx512";
  }
  return "unknown";
}

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
  }
  __cpuid_count(7, 0, a, b, cx, d);
  c.avx2 = (b >> 5) & 1;
  c.avx512f = (b >> 16) & 1;
  c.avx512bw = (b >> 30) & 1;
  c.avx512vl = (b >> 31) & 1;
  c.avx512vnni = (cx >> 11) & 1;
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
  return nullptr;
}

std::atomic<int> g_active{-1};

}  // namespace

bool supports(const cpu_caps& caps, isa i) noexcept { return missing(caps, i) == nullptr; }

isa best_isa(const cpu_caps& caps) noexcept {
  if (supports(caps, isa::avx512)) return isa::avx512;
  if (supports(caps, isa::avxvnni)) return isa::avxvnni;
  if (supports(caps, isa::avx2)) return isa::avx2;
  return isa::scalar;
}

expected<isa> choose_isa(const cpu_caps& caps, std::string_view requested) {
  if (requested.empty() || requested == "auto") return best_isa(caps);
  for (const isa i : {isa::scalar, isa::avx2, isa::avxvnni, isa::avx512}) {
    if (requested != to_string(i)) continue;
    if (const char* m = missing(caps, i))
      return make_error(errc::unavailable, "engine ISA '" + std::string(requested) +
                                               "' cannot run on this CPU: it lacks " + m);
    return i;
  }
  return make_error(errc::invalid_argument, "unknown engine ISA '" + std::string(requested) +
                                                "': use auto, scalar, avx2, avxvnni or avx512");
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
  return out.empty() ? "baseline x86-64" : out;
}

isa active_isa() noexcept {
  int v = g_active.load(std::memory_order_acquire);
  if (v >= 0) return static_cast<isa>(v);
  const cpu_caps caps = detect_cpu();
  isa chosen = best_isa(caps);
  if (const char* env = std::getenv("EXA_ENGINE_ISA"); env != nullptr) {
    if (auto c = choose_isa(caps, env)) chosen = *c;
    else std::fprintf(stderr, "EXA_ENGINE_ISA ignored: %s\n", c.error().message.c_str());
  }
  int expect = -1;
  g_active.compare_exchange_strong(expect, static_cast<int>(chosen), std::memory_order_acq_rel);
  return static_cast<isa>(g_active.load(std::memory_order_acquire));
}

expected<isa> set_active_isa(std::string_view requested) {
  auto c = choose_isa(detect_cpu(), requested);
  if (c) g_active.store(static_cast<int>(*c), std::memory_order_release);
  return c;
}

}  // namespace exa::engine
