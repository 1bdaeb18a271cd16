#pragma once
// exp, log, sin, cos and pow computed with our own code from IEEE +, −, ×, ÷
// only, so they give the same bits on every x86-64 CPU. glibc's libm picks
// among implementations by CPU (FMA and non-FMA variants of expf, powf,
// sinf, ...), which may round differently; the engine's logits and sampling
// must not depend on which one a node happens to get. Accuracy: within about
// one ulp of double for the double functions (so the float ones are nearly
// always correctly rounded), on the ranges the engine uses.

#include <array>

namespace exa::engine::det {

double exp(double x) noexcept;  // overflow → +inf, underflow → 0, NaN → NaN
double log(double x) noexcept;  // x > 0 (0 → −inf, x < 0 or NaN → NaN)
/// sin and cos of x with |x| ≤ 2^20 (beyond it, reduction loses accuracy:
/// RoPE angles stay below the context length).
void sincos(double x, double& s, double& c) noexcept;

/// e^x rounded to float: a table of 2^(j/64) and a short polynomial in
/// double (about 3× cheaper than exp; the engine calls it for every SiLU and
/// attention weight).
float expf(float x) noexcept;

/// expf's constants and table, for the vector versions in the kernel variants
/// (kernels_impl.hpp), which must take the same steps lane by lane.
namespace expf_parts {
inline constexpr double upper = 88.8;   // above: +inf
inline constexpr double lower = -104.0;  // below: 0
inline constexpr double scale = 92.33248261689366;  // 64 / ln2
inline constexpr double ln2_64_hi = 0.01083042469326756;  // ln2/64 to 32 significant bits
inline constexpr double ln2_64_lo = 2.9815858269852933e-12;   // the rest
inline constexpr double shifter = 6755399441055744.0;  // 1.5 · 2^52: round to even by adding and subtracting
/// 2^(j/64), j = 0..63 (det_math.cpp). A variable, not a function, so the
/// vector kernels' loops read it without a call (a call in the loop made
/// them spill every register around it).
alignas(64) extern const std::array<double, 64> exp2_table;
inline const double* table() noexcept { return exp2_table.data(); }
}  // namespace expf_parts
/// x^y for x > 0.
inline double pow(double x, double y) noexcept { return exp(y * log(x)); }

}  // namespace exa::engine::det
