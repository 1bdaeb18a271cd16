#include "engine/det_math.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>

namespace exa::engine::det {
namespace {

// Rounds to the nearest integer (ties to even) with the 1.5·2^52 trick: exact
// for |x| < 2^51, and no libm call.
double round_even(double x) noexcept {
  // IEEE semantics (no -ffast-math) forbid folding (x + s) − s to x.
  constexpr double shifter = expf_parts::shifter;  // 1.5 · 2^52
  const double t = x + shifter;
  return t - shifter;
}

double scale2(double x, int k) noexcept {  // x · 2^k for k in [-1022, 1023]
  const std::uint64_t bits = static_cast<std::uint64_t>(k + 1023) << 52;
  double p;
  std::memcpy(&p, &bits, sizeof p);
  return x * p;
}

}  // namespace

double exp(double x) noexcept {
  if (x != x) return x;
  if (x > 709.78) return std::numeric_limits<double>::infinity();
  if (x < -745.2) return 0.0;
  // x = k·ln2 + r, |r| ≤ ln2/2, with ln2 split so that k·LN2_HI is exact.
  constexpr double inv_ln2 = 1.4426950408889634;
  constexpr double ln2_hi = 6.93147180369123816490e-01;  // 32 significant bits
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  const double k = round_even(x * inv_ln2);
  const double r = (x - k * ln2_hi) - k * ln2_lo;
  // e^r by its Taylor series to r^13/13!: below 1e-17 relative for |r| ≤ 0.35.
  double p = 1.0 / 6227020800.0;  // 1/13!
  for (double d : {479001600.0, 39916800.0, 3628800.0, 362880.0, 40320.0, 5040.0, 720.0, 120.0, 24.0, 6.0, 2.0,
                   1.0, 1.0})  // 12!, 11!, ..., 1!, 0!
    p = p * r + 1.0 / d;
  const int ki = static_cast<int>(k);
  // Split the scaling in two so subnormal results and k = 1024 stay exact.
  if (ki < -1000) return scale2(scale2(p, ki + 1000), -1000);
  if (ki > 1000) return scale2(scale2(p, ki - 1000), 1000);
  return scale2(p, ki);
}

namespace {

// 2^(j/64), j = 0..63, computed at compile time (constants in the binary,
// so every machine has the same bits): the Taylor series of e^(j·ln2/64).
constexpr std::array<double, 64> make_exp2_table() {
  std::array<double, 64> t{};
  constexpr double ln2 = 0.69314718055994530942;
  for (int j = 0; j < 64; ++j) {
    const double r = j * (ln2 / 64.0);
    double term = 1.0, sum = 1.0;
    for (int n = 1; n < 30; ++n) {
      term = term * r / n;
      sum += term;
    }
    t[static_cast<std::size_t>(j)] = sum;
  }
  return t;
}
}  // namespace

alignas(64) constinit const std::array<double, 64> expf_parts::exp2_table = make_exp2_table();

float expf(float xf) noexcept {
  const double x = xf;
  if (x != x) return xf;
  if (x > expf_parts::upper) return std::numeric_limits<float>::infinity();
  if (x < expf_parts::lower) return 0.0f;
  // x = (64k + j)·ln2/64 + r, |r| ≤ ln2/128: e^x = 2^k · 2^(j/64) · e^r.
  // Every step below is repeated lane by lane in kernels_impl.hpp's vexpf.
  constexpr double scale = expf_parts::scale;
  constexpr double ln2_64_hi = expf_parts::ln2_64_hi;
  constexpr double ln2_64_lo = expf_parts::ln2_64_lo;
  const double kd = round_even(x * scale);
  const double r = (x - kd * ln2_64_hi) - kd * ln2_64_lo;
  // e^r to r^5/5!: below 4e-17 relative for |r| ≤ 0.0055.
  const double p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0)))));
  const auto n = static_cast<int>(kd);
  const int j = n & 63;
  const int k = (n - j) / 64;
  return static_cast<float>(scale2(expf_parts::exp2_table[static_cast<std::size_t>(j)] * p, k));
}

double log(double x) noexcept {
  if (x != x || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  std::uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  int e = static_cast<int>((bits >> 52) & 0x7ff);
  if (e == 0) {  // subnormal: normalize
    x *= 18014398509481984.0;  // 2^54
    std::memcpy(&bits, &x, sizeof bits);
    e = static_cast<int>((bits >> 52) & 0x7ff) - 54;
  }
  // x = m · 2^(e-1023), m in [sqrt(1/2), sqrt(2)).
  bits = (bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
  double m;
  std::memcpy(&m, &bits, sizeof m);
  int k = e - 1023;
  if (m > 1.4142135623730951) {
    m *= 0.5;
    ++k;
  }
  // log m = 2·atanh(s), s = (m − 1)/(m + 1), |s| ≤ 0.1716: the odd series to
  // s^27 is below 1e-19 relative.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double p = 1.0 / 27.0;
  for (int n = 25; n >= 1; n -= 2) p = p * s2 + 1.0 / n;
  constexpr double ln2_hi = 6.93147180369123816490e-01;
  constexpr double ln2_lo = 1.90821492927058770002e-10;
  const double kd = k;
  return (kd * ln2_hi + 2.0 * s * p) + kd * ln2_lo;
}

void sincos(double x, double& s, double& c) noexcept {
  // x = q·(π/2) + r, |r| ≤ π/4, with π/2 in three parts (fdlibm's): the first
  // two have 33 significant bits, so q·P1 and q·P2 are exact for |q| < 2^20.
  constexpr double two_over_pi = 6.36619772367581382433e-01;
  constexpr double p1 = 1.57079632673412561417e+00;
  constexpr double p2 = 6.07710050630396597660e-11;
  constexpr double p3 = 2.02226624871116645580e-21;
  const double q = round_even(x * two_over_pi);
  const double r = ((x - q * p1) - q * p2) - q * p3;
  const double r2 = r * r;
  // Taylor series in r², Horner with alternating signs: t_i = f_i − r²·t_{i+1}.
  // To r^19 (sin) and r^18 (cos): below 1e-17 relative for |r| ≤ π/4.
  constexpr double sin_f[] = {1.0 / 6.0,          1.0 / 120.0,           1.0 / 5040.0,
                              1.0 / 362880.0,     1.0 / 39916800.0,      1.0 / 6227020800.0,
                              1.0 / 1307674368000.0, 1.0 / 355687428096000.0, 1.0 / 121645100408832000.0};
  constexpr double cos_f[] = {1.0 / 2.0,        1.0 / 24.0,          1.0 / 720.0,
                              1.0 / 40320.0,    1.0 / 3628800.0,     1.0 / 479001600.0,
                              1.0 / 87178291200.0, 1.0 / 20922789888000.0, 1.0 / 6402373705728000.0};
  double ts = 0.0, tc = 0.0;
  for (int i = 8; i >= 0; --i) {
    ts = sin_f[i] - r2 * ts;
    tc = cos_f[i] - r2 * tc;
  }
  const double sin_r = r - r * r2 * ts;  // r − r³/3! + r⁵/5! − ...
  const double cos_r = 1.0 - r2 * tc;    // 1 − r²/2! + r⁴/4! − ...
  switch (static_cast<std::int64_t>(q) & 3) {
    case 0: s = sin_r; c = cos_r; break;
    case 1: s = cos_r; c = -sin_r; break;
    case 2: s = -sin_r; c = -cos_r; break;
    default: s = -cos_r; c = sin_r; break;
  }
}

}  // namespace exa::engine::det
