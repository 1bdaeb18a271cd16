// The CUDA engine's host-side logic, on any machine: the weight upload plan,
// the q8_0 repacking, the graph policy, the stage pipeline of a step that may
// stop part way, the peak-bandwidth table, and what
// make_cuda_engine says where it cannot run. The kernels themselves are checked by cuda_gpu_test, which
// needs a GPU.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "gpu/cuda_engine.hpp"
#include "gpu/cuda_graph_policy.hpp"
#include "gpu/cuda_memory_pool.hpp"
#include "gpu/cuda_peak.hpp"
#include "gpu/cuda_stage_pipeline.hpp"
#include "gpu/cuda_weight_plan.hpp"
#include "model/quantize.hpp"

using namespace exa;
using model::tensor_type;

namespace {

model::model_spec spec_of(tensor_type type) {
  auto s = test::tiny_spec(type);
  s.name = "cuda-plan";
  return s;
}

}  // namespace

TEST_CASE("the CUDA weight plan places every tensor once, apart, and Q/K/V and gate/up each in one piece",
          "[gpu][cuda_plan]") {
  for (const tensor_type type : {tensor_type::f16, tensor_type::bf16, tensor_type::q8_0}) {
    CAPTURE(model::to_string(type));
    const auto m = test::make_model(spec_of(type));
    const auto plan = gpu::plan_weights(m->config(), m->weights());
    REQUIRE(plan.has_value());
    const auto all = m->weights().all();
    REQUIRE(plan->tensors.size() == all.size());
    for (const model::weight_view* w : all) REQUIRE(plan->find(*w) != nullptr);

    // Buffers (values and q8_0 scales) in ascending order, not overlapping,
    // each at least 16-byte aligned (the kernels' widest load).
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const gpu::planned_tensor& t : plan->tensors) {
      ranges.emplace_back(t.offset, t.bytes);
      if (t.scales_bytes > 0) ranges.emplace_back(t.scales_offset, t.scales_bytes);
    }
    std::sort(ranges.begin(), ranges.end());
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      CHECK(ranges[i].first % 16 == 0);
      if (i + 1 < ranges.size()) CHECK(ranges[i].first + ranges[i].second <= ranges[i + 1].first);
    }
    CHECK(ranges.back().first + ranges.back().second <= plan->total_bytes);

    const auto& l0 = m->weights().layers[0];
    // One piece each (one matmul), starting on the device alignment.
    CHECK(plan->contiguous({&l0.wq, &l0.wk, &l0.wv}));
    CHECK(plan->contiguous({&l0.w_gate, &l0.w_up}));
    CHECK(plan->find(l0.wq)->offset % gpu::device_alignment == 0);
    CHECK(plan->find(l0.w_gate)->offset % gpu::device_alignment == 0);
    CHECK_FALSE(plan->contiguous({&l0.wq, &l0.wv}));
    CHECK_FALSE(plan->contiguous({&l0.w_up, &l0.w_down}));  // other widths
    const gpu::planned_tensor* wq = plan->find(l0.wq);
    CHECK(wq->format == (type == tensor_type::f16    ? gpu::device_format::f16
                         : type == tensor_type::bf16 ? gpu::device_format::bf16
                                                     : gpu::device_format::q8_0));
    CHECK(wq->bytes == gpu::device_bytes(wq->format, l0.wq.rows, l0.wq.cols));
    CHECK(wq->scales_bytes == (type == tensor_type::q8_0 ? l0.wq.rows * (l0.wq.cols / 32) * 4 : 0));
    // Norms go up dequantized to f32.
    CHECK(plan->find(l0.attn_norm)->format == gpu::device_format::f32);
  }
}

TEST_CASE("the CUDA weight plan refuses what its kernels do not take, by name", "[gpu][cuda_plan]") {
  SECTION("K-quant matrices") {
    auto s = spec_of(tensor_type::q4_K);
    s.dim = 256;
    s.ff_dim = 512;
    const auto m = test::make_model(s);
    const auto plan = gpu::plan_weights(m->config(), m->weights());
    REQUIRE_FALSE(plan.has_value());
    CHECK(plan.error().code == errc::unsupported);
    CHECK_THAT(plan.error().message, Catch::Contains("q4_K") && Catch::Contains("tensor "));
  }
  SECTION("f32 matrices") {
    const auto m = test::make_model(spec_of(tensor_type::f32));
    const auto plan = gpu::plan_weights(m->config(), m->weights());
    REQUIRE_FALSE(plan.has_value());
    CHECK(plan.error().code == errc::unsupported);
    CHECK_THAT(plan.error().message, Catch::Contains("f32"));
  }
  SECTION("a head wider than the attention kernel takes") {
    auto s = spec_of(tensor_type::f16);
    s.dim = 512;
    s.n_heads = 1;
    s.n_kv_heads = 1;
    const auto m = test::make_model(s);
    const auto plan = gpu::plan_weights(m->config(), m->weights());
    REQUIRE_FALSE(plan.has_value());
    CHECK_THAT(plan.error().message, Catch::Contains("head width 512"));
  }
}

TEST_CASE("a tied output head is planned once, as a matrix", "[gpu][cuda_plan]") {
  auto s = spec_of(tensor_type::q8_0);
  s.tie_embeddings = true;
  const auto m = test::make_model(s);
  REQUIRE(m->weights().tied_output);
  const auto plan = gpu::plan_weights(m->config(), m->weights());
  REQUIRE(plan.has_value());
  CHECK(plan->find(m->weights().token_embd)->format == gpu::device_format::q8_0);
  CHECK(plan->tensors.size() == m->weights().all().size());
}

TEST_CASE("q8_0 repacking keeps every quant and scale", "[gpu][cuda_plan]") {
  constexpr std::size_t rows = 3, cols = 96;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x(rows * cols);
  for (float& v : x) v = dist(rng);
  std::vector<model::block_q8_0> blocks(rows * cols / 32);
  for (std::size_t r = 0; r < rows; ++r) model::quantize_row_q8_0(x.data() + r * cols, blocks.data() + r * cols / 32, cols);

  std::vector<std::int8_t> quants(rows * cols);
  std::vector<float> scales(rows * cols / 32);
  gpu::repack_q8_0(reinterpret_cast<const std::byte*>(blocks.data()), rows, cols, quants.data(), scales.data());
  std::vector<float> want(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    model::dequantize_row_q8_0(blocks.data() + r * cols / 32, want.data(), cols);
    for (std::size_t i = 0; i < cols; ++i) {
      // The kernels compute exactly this product: bitwise the CPU's dequantized value.
      const float got = static_cast<float>(quants[r * cols + i]) * scales[r * cols / 32 + i / 32];
      REQUIRE(std::memcmp(&got, &want[i], sizeof got) == 0);
    }
  }
}

TEST_CASE("a step shape is recorded as a graph the second time in a row, then replayed", "[gpu][cuda_graphs]") {
  using action = gpu::graph_decision::action;
  gpu::graph_policy p(2);
  const gpu::graph_key a{8, 8}, b{1, 1}, c{3, 3};
  CHECK(p.next(a).what == action::run_eagerly);
  CHECK(p.next(a).what == action::capture);
  CHECK(p.next(a).what == action::replay);
  // A one-off shape (a prefill chunk) is never recorded.
  CHECK(p.next(b).what == action::run_eagerly);
  CHECK(p.next(a).what == action::replay);
  CHECK(p.next(c).what == action::run_eagerly);
  CHECK(p.size() == 1);

  SECTION("the least recently used graph goes first when the cache is full") {
    CHECK(p.next(b).what == action::run_eagerly);
    CHECK(p.next(b).what == action::capture);  // kept: b, a
    CHECK(p.next(a).what == action::replay);   // a is now the most recent
    CHECK(p.next(c).what == action::run_eagerly);
    const auto d = p.next(c);
    CHECK(d.what == action::capture);
    REQUIRE(d.evict.has_value());
    CHECK(*d.evict == b);
    CHECK(p.contains(a));
    CHECK_FALSE(p.contains(b));
    CHECK(p.size() == 2);
  }
  SECTION("a failed capture is forgotten and recorded again later") {
    p.forget(a);
    CHECK_FALSE(p.contains(a));
    CHECK(p.next(a).what == action::run_eagerly);
    CHECK(p.next(a).what == action::capture);
  }
  SECTION("capacity 0 runs everything eagerly") {
    gpu::graph_policy off(0);
    for (int i = 0; i < 4; ++i) CHECK(off.next(a).what == action::run_eagerly);
  }
}

TEST_CASE("make_cuda_engine explains why it cannot run here instead of failing later", "[gpu][cuda_engine]") {
  const auto m = test::make_model(spec_of(tensor_type::f16));
  gpu::cuda_engine_options o;
  o.own_kv_blocks = 8;
  const auto devices = gpu::cuda_device_count();
  auto e = gpu::make_cuda_engine(m, 0, o);
#if defined(EXASERVE_HAVE_CUDA)
  if (devices) {
    // A GPU machine: the engine starts (cuda_gpu_test checks what it computes).
    REQUIRE(e.has_value());
    CHECK(gpu::cuda_counters(**e).has_value());
    return;
  }
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code == errc::unavailable);
  CHECK(e.error().message == devices.error().message);  // the CUDA runtime's reason, as is
#else
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code == errc::unavailable);
  CHECK_THAT(e.error().message, Catch::Contains("built without CUDA"));
#endif
  CHECK_FALSE(e.error().message.empty());
}

TEST_CASE("make_cuda_engine names an unsupported model or option before looking for a device", "[gpu][cuda_engine]") {
#if defined(EXASERVE_HAVE_CUDA)
  auto s = spec_of(tensor_type::q4_K);
  s.dim = 256;
  s.ff_dim = 512;
  gpu::cuda_engine_options o;
  o.own_kv_blocks = 8;
  auto e = gpu::make_cuda_engine(test::make_model(s), 0, o);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code == errc::unsupported);
  CHECK_THAT(e.error().message, Catch::Contains("q4_K"));

  gpu::cuda_engine_options with_draft = o;
  with_draft.engine.draft = test::make_model(spec_of(tensor_type::f16));
  e = gpu::make_cuda_engine(test::make_model(spec_of(tensor_type::f16)), 0, with_draft);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code == errc::unsupported);
  CHECK_THAT(e.error().message, Catch::Contains("speculative"));
#else
  SUCCEED("without CUDA every request is unavailable (previous test)");
#endif
}

TEST_CASE("a CUDA device's peak bandwidth comes from the datasheet when its name is known", "[gpu][cuda_engine]") {
  CHECK(gpu::datasheet_bandwidth("NVIDIA H200") == 4.8e12);
  CHECK(gpu::datasheet_bandwidth("NVIDIA GH200 480GB") == 4.0e12);  // not the H200's
  CHECK(gpu::datasheet_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12);
  CHECK(gpu::datasheet_bandwidth("NVIDIA H100 PCIe") == 2.0e12);
  CHECK(gpu::datasheet_bandwidth("NVIDIA A100-SXM4-80GB") == 2.039e12);
  CHECK(gpu::datasheet_bandwidth("NVIDIA A100-SXM4-40GB") == 1.555e12);
  CHECK(gpu::datasheet_bandwidth("Some Future GPU") == 0);
  const auto peak = gpu::cuda_peak_bandwidth(0);
  if (!gpu::cuda_device_count()) {
    REQUIRE_FALSE(peak.has_value());
    CHECK(peak.error().code == errc::unavailable);
  }
}

// ---- the stage pipeline of a stoppable step (cuda_stage_pipeline.hpp) ---------------

namespace {

// A fake stream: stages finish only when waited for; the log says what the
// host did, in order ("L3" launched stage 3, "W1" waited for stage 1, "?"
// asked), and each question records how many launched stages were unfinished.
struct fake_stream {
  std::vector<std::string> log;
  std::vector<std::uint32_t> in_flight_when_asked;
  std::uint32_t launched = 0, finished = 0;  // stages [first, launched) launched, [first, finished) finished
  std::uint32_t yes_at_question = 0;         // answer yes to this question (1-based); 0: never
  std::uint32_t questions = 0;

  gpu::stage_hooks hooks(std::uint32_t first) {
    launched = finished = first;
    return {[this](std::uint32_t s) {
              CHECK(s == launched);  // in order, each once
              log.push_back("L" + std::to_string(s));
              launched = s + 1;
            },
            [this](std::uint32_t s) {
              CHECK(s < launched);
              log.push_back("W" + std::to_string(s));
              finished = std::max(finished, s + 1);
            },
            [this] {
              log.push_back("?");
              in_flight_when_asked.push_back(launched - finished);
              return ++questions == yes_at_question;
            }};
  }
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t j = std::min(s.find(' ', i), s.size());
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("a stoppable GPU step asks before every stage after its first, with at most one stage running",
          "[gpu][cuda_stages]") {
  fake_stream f;
  CHECK(gpu::run_stages(0, 5, 2, f.hooks(0)) == 5);
  CHECK(f.log == split("L0 ? L1 W0 ? L2 W1 ? L3 W2 ? L4"));
  // When asked, the stage before is the only one unfinished (the first
  // question comes before anything was waited for).
  CHECK(f.in_flight_when_asked == std::vector<std::uint32_t>{1, 1, 1, 1});
}

TEST_CASE("a stoppable GPU step stops before the stage it was asked at, and goes on from there", "[gpu][cuda_stages]") {
  fake_stream f;
  f.yes_at_question = 3;  // asked before stages 1, 2, 3: yes before 3
  CHECK(gpu::run_stages(0, 8, 2, f.hooks(0)) == 3);
  CHECK(f.log == split("L0 ? L1 W0 ? L2 W1 ?"));
  // Resumed at stage 3: not asked before it; the first wait is for its own
  // stage, two launches on.
  fake_stream g;
  g.yes_at_question = 2;
  CHECK(gpu::run_stages(3, 8, 2, g.hooks(3)) == 5);
  CHECK(g.log == split("L3 ? L4 W3 ?"));
  fake_stream h;
  CHECK(gpu::run_stages(5, 8, 2, h.hooks(5)) == 8);
  CHECK(h.log == split("L5 ? L6 W5 ? L7"));
  // Nothing left: nothing launched, nothing asked.
  fake_stream none;
  CHECK(gpu::run_stages(8, 8, 2, none.hooks(8)) == 8);
  CHECK(none.log.empty());
}

TEST_CASE("a GPU stage pipeline of depth 1 waits for every stage before asking", "[gpu][cuda_stages]") {
  fake_stream f;
  f.yes_at_question = 2;
  CHECK(gpu::run_stages(0, 4, 1, f.hooks(0)) == 2);
  CHECK(f.log == split("L0 W0 ? L1 W1 ?"));
  CHECK(f.in_flight_when_asked == std::vector<std::uint32_t>{0, 0});
}

TEST_CASE("a GPU step runs stage by stage when it has prompt work or its reads outlast its launches",
          "[gpu][cuda_stages]") {
  // 2 GB of weights, 128 KiB of K and V per position, 4 TB/s, 30 µs to
  // launch a stage; 64 stages: a decode step is stoppable once its reads take
  // 64 · 30 µs = 1.92 ms.
  const gpu::stage_cost_model m{2e9, 131072, 4e12, 30e-6};
  const std::vector<engine::block_id> table{0};
  const auto decode = [&](std::uint32_t sequences, std::uint32_t pos) {
    engine::forward_batch b;
    for (std::uint32_t s = 0; s < sequences; ++s) {
      b.tables.push_back(&table);
      b.tokens.push_back({1, pos, s, true});
    }
    return b;
  };
  CHECK_FALSE(gpu::stoppable_step(engine::forward_batch{}, 64, m));  // empty
  // One sequence at position 99: 2e9 + 100 · 131072 bytes, 0.503 ms.
  CHECK(gpu::step_read_s(decode(1, 99), m) == Approx((2e9 + 100 * 131072.0) / 4e12));
  CHECK_FALSE(gpu::stoppable_step(decode(1, 99), 64, m));
  // 8 sequences at position 4095: 2e9 + 8 · 4096 · 131072 bytes, 1.57 ms: still whole.
  CHECK_FALSE(gpu::stoppable_step(decode(8, 4095), 64, m));
  // 16 of them: 2.65 ms, stoppable; with half the stages, 4 of them (1.04 ms) are too.
  CHECK(gpu::stoppable_step(decode(16, 4095), 64, m));
  CHECK_FALSE(gpu::stoppable_step(decode(4, 4095), 64, m));
  CHECK(gpu::stoppable_step(decode(4, 4095), 32, m));
  // By default the engine's launch estimate is the one the simulator models.
  CHECK(gpu::stage_cost_model{}.launch_s_per_stage == engine::fair::cuda_stage_launch_s);
  // Bandwidth unknown: decode steps stay whole.
  gpu::stage_cost_model unknown = m;
  unknown.read_bytes_per_s = 0;
  CHECK_FALSE(gpu::stoppable_step(decode(32, 4095), 64, unknown));
  // A prompt chunk (a sequence with two tokens here) always may stop, also
  // in a short step.
  engine::forward_batch chunk = decode(3, 4);
  chunk.tokens.push_back({2, 5, 2, true});
  CHECK(gpu::stoppable_step(chunk, 64, unknown));
  // Fewer than two stages: no boundary to stop at.
  CHECK_FALSE(gpu::stoppable_step(chunk, 1, m));
}
