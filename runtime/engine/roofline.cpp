#include "engine/roofline.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>

#include "engine/aligned_vector.hpp"
#include "engine/kernel_table.hpp"
#include "engine/thread_pool.hpp"

namespace exa::engine {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Multiply-adds per second of `op` on all threads: each runs chunks of
// `rounds` until `probe_s` has passed since the start; the count is what
// they did over the time the last one took.
double compute_peak(thread_pool& pool, const kernel_table& k, peak_op op, int repeat, double probe_s) {
  // Rounds for about 2 ms on one thread, from a short first try.
  std::uint64_t rounds = 1 << 12;
  for (;;) {
    const auto t0 = clock_type::now();
    k.peak(op, rounds);
    const double s = seconds_since(t0);
    if (s >= 2e-4 || rounds >= (std::uint64_t{1} << 32)) {
      rounds = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(static_cast<double>(rounds) * 2e-3 / std::max(s, 1e-9)));
      break;
    }
    rounds *= 4;
  }
  const std::size_t threads = pool.size();
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    std::atomic<std::uint64_t> macs{0};
    const auto t0 = clock_type::now();
    pool.parallel_for(threads, 1, [&](std::size_t, std::size_t) {
      std::uint64_t done = 0;
      while (seconds_since(t0) < probe_s) done += k.peak(op, rounds);
      macs.fetch_add(done, std::memory_order_relaxed);
    }, 1);
    best = std::max(best, static_cast<double>(macs.load()) / seconds_since(t0));
  }
  return best;
}

double read_peak(thread_pool& pool, const kernel_table& k, int repeat) {
  constexpr std::size_t bytes = std::size_t{256} << 20;  // far past the caches
  constexpr std::size_t chunk = std::size_t{1} << 20;
  const aligned_vector<std::byte> buf(bytes);  // zero-filled: the pages exist before the first timed read
  std::atomic<std::uint64_t> sink{0};
  double best = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = clock_type::now();
    pool.parallel_for(bytes / chunk, 1, [&](std::size_t b, std::size_t e) {
      sink.fetch_add(k.read_sum(buf.data() + b * chunk, (e - b) * chunk), std::memory_order_relaxed);
    });
    best = std::max(best, static_cast<double>(bytes) / seconds_since(t0));
  }
  return best;
}

// fn(w) for every matrix a token's decode multiplies: each layer's seven,
// then the output head.
template <class Fn>
std::uint64_t sum_matrices(const model::llama_weights& w, Fn fn) {
  std::uint64_t n = fn(w.output);
  for (const auto& l : w.layers)
    for (const model::weight_view* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) n += fn(*m);
  return n;
}

}  // namespace

machine_peaks measure_peaks(thread_pool& pool, const kernel_table& kernels, int repeat, double probe_s) {
  repeat = std::max(repeat, 1);
  machine_peaks p;
  p.int8_macs_per_s = compute_peak(pool, kernels, peak_op::int8_dot, repeat, probe_s);
  p.f32_macs_per_s = compute_peak(pool, kernels, peak_op::f32_fma, repeat, probe_s);
  p.read_bytes_per_s = read_peak(pool, kernels, repeat);
  return p;
}

std::uint64_t matmul_macs_per_token(const model::llama_weights& w) {
  return sum_matrices(w, [](const model::weight_view& m) { return m.rows * m.cols; });
}

std::uint64_t matmul_weight_bytes(const model::llama_weights& w) {
  return sum_matrices(w, [](const model::weight_view& m) { return m.bytes(); });
}

bool matmul_is_int8(const model::llama_weights& w) {
  if (w.layers.empty()) return false;
  const auto t = w.layers.front().w_up.type;
  return t != model::tensor_type::f32 && t != model::tensor_type::f16 && t != model::tensor_type::bf16;
}

double roofline_tok_s(std::uint64_t macs_per_token, std::uint64_t weight_bytes, double macs_per_s,
                      double read_bytes_per_s, std::uint32_t batch) {
  if (macs_per_s <= 0 || read_bytes_per_s <= 0 || macs_per_token == 0 || weight_bytes == 0 || batch == 0) return 0;
  const double compute = macs_per_s / static_cast<double>(macs_per_token);
  const double memory = static_cast<double>(batch) * read_bytes_per_s / static_cast<double>(weight_bytes);
  return std::min(compute, memory);
}

}  // namespace exa::engine
