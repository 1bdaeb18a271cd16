// attn_probe: attention's dot products over one sequence's KV rows, per head
// and row, on the best kernel variant this CPU runs (engine/kernels_impl.hpp
// dot_f16_rows): the rows in whole blocks of 16 (on AVX-512 the transposed
// path: lanes as rows, no horizontal sums) against the same rows 15 at a time
// (the per-row path with its shuffled sums), for each count of query heads a
// call takes (a KV head's group, times the tokens of a prompt run). It prints
// nanoseconds per (head, row) for both and their ratio: where the transposed
// path pays for its transpose. On AVX2 (8 rows at a time) the 15-row calls
// take their first 8 rows transposed too wherever that path runs, so there
// the ratio understates it; compare two builds instead. Last, the same rows
// as the CPU forward pass now keeps K (kv_pages::k_block: each block of 16
// transposed, the 4 KV heads' parts one after another) scored a block a call
// by dot_f16_kt, and its ratio to the 16-row calls. Run by hand
// (docs/PERFORMANCE.md, "Attention: a prompt's tokens together, and dot
// products without horizontal sums", and "K stored transposed").
//
//   build/bin/attn_probe [head_dim]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "probe_args.hpp"
#include "engine/isa.hpp"
#include "engine/kernel_table.hpp"
#include "model/half.hpp"

namespace {

// Seconds per call of fn, the best of 5 runs of `reps` calls.
template <class Fn>
double best(Fn&& fn, int reps) {
  double b = 1e30;
  for (int run = 0; run < 5; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace exa;
  const char* usage = "usage: attn_probe [head_dim 1-256]";
  if (exa::bench::wants_help(argc, argv)) return std::puts(usage), 0;
  const std::size_t hd = exa::bench::count_arg(argc, argv, 1, 64, 1, 256, "attn_probe: head_dim", usage);
  const std::size_t kv_dim = 4 * hd;  // 4 KV heads: a head's part of a row is hd of kv_dim
  const std::size_t rows = 240;       // 15 blocks of 16, 16 calls of 15
  const engine::isa v = engine::active_isa();  // EXA_ENGINE_ISA may pick another
  const auto& k = engine::kernels_for(v);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::uint16_t> kv(rows * kv_dim);
  for (auto& x : kv) x = model::float_to_f16(u(rng));
  // The same rows in blocks of 16, each block's K transposed: element e of
  // row r at [e · 16 + r], KV head 0's part first (the one scored).
  std::vector<std::uint16_t> kt(rows * kv_dim);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t e = 0; e < kv_dim; ++e) kt[r / 16 * 16 * kv_dim + e * 16 + r % 16] = kv[r * kv_dim + e];
  std::printf("kernels: %s, head_dim %zu, %zu rows kv_dim apart\n", std::string(engine::to_string(v)).c_str(), hd, rows);
  std::printf("%6s %16s %16s %8s %16s %8s\n", "heads", "by 16 ns/dot", "by 15 ns/dot", "ratio", "K^T ns/dot",
              "ratio");
  for (const std::size_t heads : {1, 2, 3, 4, 6, 8, 12, 15, 16}) {
    std::vector<float> q(heads * hd), out(heads * rows);
    for (auto& x : q) x = u(rng);
    volatile float sink = 0;
    const int reps = 2000;
    const double by16 = best(
        [&] {
          k.dot_f16_rows(q.data(), hd, heads, kv.data(), kv_dim, rows, hd, out.data(), rows);
          sink = sink + out[0];
        },
        reps);
    const double by15 = best(
        [&] {
          for (std::size_t r = 0; r < rows; r += 15)
            k.dot_f16_rows(q.data(), hd, heads, kv.data() + r * kv_dim, kv_dim, 15, hd, out.data() + r, rows);
          sink = sink + out[0];
        },
        reps);
    const double by_kt = best(
        [&] {
          for (std::size_t r = 0; r < rows; r += 16)
            k.dot_f16_kt(q.data(), hd, heads, kt.data() + r * kv_dim, 16, 16, hd, out.data() + r, rows);
          sink = sink + out[0];
        },
        reps);
    const double per = 1e9 / double(heads * rows);
    std::printf("%6zu %16.2f %16.2f %8.2f %16.2f %8.2f\n", heads, by16 * per, by15 * per, by15 / by16, by_kt * per,
                by16 / by_kt);
  }
  return 0;
}
