// Batch invariance, asserted bitwise: a sequence's logits do not depend on
// what else is in the batch, on how its prompt was split into prefill chunks,
// on the thread count, or on being recomputed later from prompt + generated
// tokens. This is what lets a request resume on another replica exactly.

#include <catch2/catch.hpp>

#include <cstring>

#include "engine/llama_forward.hpp"
#include "engine/matmul.hpp"
#include "fixtures.hpp"
#include "model/kquants.hpp"
#include "model/quantize.hpp"

using namespace exa;

namespace {

// Runs sequences through one llama_forward, in steps given as
// (sequence index, number of tokens) chunks; returns the logits of every
// position of every sequence.
class harness {
 public:
  harness(std::shared_ptr<const model::llama_model> m, std::size_t threads)
      : m_(std::move(m)),
        pool_(test::make_pool(*m_, 1024)),
        cache_(*pool_, {m_->config().n_layers, m_->config().kv_dim(), 16}),
        threads_(threads),
        fwd_(m_->config(), m_->weights(), cache_, threads_) {}

  // seqs[i] are the tokens; each step lists (seq, n) chunks run together.
  std::vector<std::vector<std::vector<float>>> run(
      const std::vector<std::vector<std::int32_t>>& seqs,
      const std::vector<std::vector<std::pair<std::size_t, std::uint32_t>>>& steps) {
    const std::size_t vocab = m_->config().vocab_size;
    std::vector<std::vector<std::vector<float>>> out(seqs.size());
    std::vector<std::uint32_t> done(seqs.size(), 0);
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      cache_.release(100 + s);
      REQUIRE(cache_.reserve(100 + s, static_cast<std::uint32_t>(seqs[s].size())));
    }
    for (const auto& step : steps) {
      engine::forward_batch batch;
      std::vector<std::size_t> owner;
      for (const auto& [s, n] : step) {
        const auto index = static_cast<std::uint32_t>(batch.tables.size());
        batch.tables.push_back(&cache_.table(100 + s));
        for (std::uint32_t p = done[s]; p < done[s] + n; ++p) {
          batch.tokens.push_back({seqs[s][p], p, index, true});
          owner.push_back(s);
        }
        done[s] += n;
      }
      std::vector<float> logits;
      fwd_.run(batch, logits);
      for (std::size_t i = 0; i < owner.size(); ++i)
        out[owner[i]].emplace_back(logits.begin() + i * vocab, logits.begin() + (i + 1) * vocab);
    }
    return out;
  }

 private:
  std::shared_ptr<const model::llama_model> m_;
  std::unique_ptr<gpu::cpu_memory_pool> pool_;
  engine::kv_cache cache_;
  engine::thread_pool threads_;
  engine::llama_forward fwd_;
};

// The tiny preset, widened for K-quants (rows of whole 256-element
// super-blocks) and given llama.cpp's Q4_K_M mix, so q4_K and q6_K tensors
// both run.
model::model_spec spec_for(model::tensor_type type) {
  auto spec = test::tiny_spec(type);
  if (model::block_elems(type) == model::qk_k) {
    spec.dim = 256;
    spec.ff_dim = 512;
    spec.mix = model::quant_mix::k_m;
  }
  return spec;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("logits are bitwise batch- and chunk-invariant", "[engine][invariance]") {
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::f16, model::tensor_type::q8_0,
                             model::tensor_type::q4_0, model::tensor_type::q4_K, model::tensor_type::q5_0,
                             model::tensor_type::q5_1);
  // On every kernel variant this CPU runs (isa.hpp), not only the fastest.
  const auto variant = GENERATE(from_range(test::runnable_isas()));
  CAPTURE(model::to_string(type), engine::to_string(variant));
  test::isa_scope scope(variant);
  auto spec = spec_for(type);
  spec.n_layers = 2;
  auto m = test::make_model(spec);
  const std::uint32_t vocab = m->config().vocab_size;
  const auto a = test::test_prompt(37, vocab, 1);
  const auto b = test::test_prompt(21, vocab, 2);
  const auto c = test::test_prompt(50, vocab, 3);

  harness h1(m, 1);
  const auto alone = h1.run({a}, {{{0, 37}}})[0];
  REQUIRE(alone.size() == 37);

  SECTION("prefill split into uneven chunks") {
    const auto chunked = h1.run({a}, {{{0, 1}}, {{0, 3}}, {{0, 7}}, {{0, 16}}, {{0, 10}}})[0];
    for (std::size_t p = 0; p < 37; ++p) CHECK(bitwise_equal(chunked[p], alone[p]));
  }
  SECTION("one token at a time (decode)") {
    std::vector<std::vector<std::pair<std::size_t, std::uint32_t>>> steps(37, {{0, 1}});
    const auto decoded = h1.run({a}, steps)[0];
    for (std::size_t p = 0; p < 37; ++p) CHECK(bitwise_equal(decoded[p], alone[p]));
  }
  SECTION("mixed into batches with other sequences at other positions") {
    const auto mixed = h1.run({c, a, b}, {{{0, 13}, {2, 5}},
                                          {{1, 4}, {0, 1}, {2, 1}},
                                          {{2, 15}, {1, 20}, {0, 30}},
                                          {{1, 13}, {0, 6}}});
    REQUIRE(mixed[1].size() == 37);
    for (std::size_t p = 0; p < 37; ++p) CHECK(bitwise_equal(mixed[1][p], alone[p]));
  }
  SECTION("independent of the thread count") {
    harness h3(m, 3);
    const auto threaded = h3.run({b, a}, {{{0, 21}, {1, 37}}})[1];
    for (std::size_t p = 0; p < 37; ++p) CHECK(bitwise_equal(threaded[p], alone[p]));
  }
  SECTION("the check can fail: another sequence's logits differ") {
    const auto other = h1.run({b}, {{{0, 21}}})[0];
    CHECK_FALSE(bitwise_equal(other[20], alone[20]));
  }
}

TEST_CASE("matmul output does not depend on batch size, tile or row split", "[engine][invariance]") {
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::bf16, model::tensor_type::q8_0,
                             model::tensor_type::q4_0, model::tensor_type::q4_K, model::tensor_type::q6_K,
                             model::tensor_type::q4_1, model::tensor_type::q5_0, model::tensor_type::q5_1);
  const auto variant = GENERATE(from_range(test::runnable_isas()));
  CAPTURE(model::to_string(type), engine::to_string(variant));
  test::isa_scope scope(variant);
  auto spec = spec_for(type);
  spec.mix = model::quant_mix::uniform;
  auto m = test::make_model(spec);
  const auto& w = m->weights().layers[0].w_gate;  // 192 rows x 64 cols (512 x 256 for K-quants)
  const std::size_t k = w.cols, rows = w.rows;
  std::vector<float> x(33 * k);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919 % 1000) / 500.0 - 1.0);

  engine::activations acts;
  std::vector<float> single(rows);
  std::vector<float> batched(33 * rows);
  acts.convert(w.type, x.data() + 17 * k, k, 1, k, nullptr);
  engine::matmul_rows(w, acts, single.data(), rows, 0, rows);
  // 33 tokens: tiles of 4 plus a tail of 1; split rows unevenly.
  acts.convert(w.type, x.data(), k, 33, k, nullptr);
  engine::matmul_rows(w, acts, batched.data(), rows, 0, 37);
  engine::matmul_rows(w, acts, batched.data(), rows, 37, rows);
  CHECK(std::memcmp(single.data(), batched.data() + 17 * rows, rows * sizeof(float)) == 0);
  for (std::size_t n = 1; n <= 6; ++n) {
    std::vector<float> part(n * rows);
    acts.convert(w.type, x.data() + 15 * k, k, n, k, nullptr);
    engine::matmul_rows(w, acts, part.data(), rows, 0, rows);
    CHECK(std::memcmp(part.data() + (2 < n ? 2 : 0) * rows,
                      batched.data() + (15 + (2 < n ? 2 : 0)) * rows, rows * sizeof(float)) == 0);
  }
}

TEST_CASE("several matrices in one hand-out of rows give each one's own product", "[engine][invariance]") {
  // matmul_many (a layer's Q, K and V in one parallel_for) against one
  // matmul_rows per matrix, bitwise, on 1 and 2 threads, for a batch of
  // decodes (2 chunks a thread) and a prefill (16).
  const auto type = GENERATE(model::tensor_type::f32, model::tensor_type::q8_0);
  const std::size_t threads = GENERATE(1, 2);
  const std::size_t n_tok = GENERATE(1, 32, 70);
  CAPTURE(model::to_string(type), threads, n_tok);
  auto spec = spec_for(type);
  spec.mix = model::quant_mix::uniform;
  auto m = test::make_model(spec);
  const auto& l = m->weights().layers[0];
  const model::weight_view* ws[] = {&l.wq, &l.wk, &l.wv};
  const std::size_t k = l.wq.cols;
  std::vector<float> x(n_tok * k);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 6151 % 1000) / 500.0 - 1.0);
  engine::activations acts;
  acts.convert(type, x.data(), k, n_tok, k, nullptr);
  engine::thread_pool pool(threads);
  std::vector<std::vector<float>> want(3), got(3);
  std::vector<engine::matmul_target> targets;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(acts.serves(ws[i]->type, ws[i]->cols));
    want[i].assign(n_tok * ws[i]->rows, 0.0f);
    got[i].assign(n_tok * ws[i]->rows, -1.0f);
    engine::matmul_rows(*ws[i], acts, want[i].data(), ws[i]->rows, 0, ws[i]->rows);
    targets.push_back({ws[i], got[i].data(), ws[i]->rows});
  }
  engine::matmul_many(targets, acts, pool);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i, ws[i]->rows);
    CHECK(std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("fast activation quantization equals ggml's reference bit for bit", "[engine][quantize]") {
  const auto variant = GENERATE(from_range(test::runnable_isas()));
  test::isa_scope scope(variant);
  std::vector<float> x(4096);
  std::uint64_t state = 99;
  for (int round = 0; round < 50; ++round) {
    for (auto& v : x) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(state >> 11) * 0x1.0p-53;
      v = static_cast<float>((u - 0.5) * (round % 5 == 0 ? 1e-3 : round % 5 == 1 ? 7.0 : 300.0));
    }
    if (round == 3) std::fill(x.begin(), x.begin() + 64, 0.0f);       // all-zero blocks
    if (round == 4) {  // amax 127 makes the scale exactly 1: exact .5 ties
      x[0] = 127.0f;
      for (std::size_t i = 1; i < 32; ++i) x[i] = static_cast<float>(i) - 16.5f;
    }
    std::vector<model::block_q8_0> ref(x.size() / 32), fast(x.size() / 32);
    model::quantize_row_q8_0(x.data(), ref.data(), x.size());
    engine::quantize_row_q8_0_fast(x.data(), fast.data(), x.size());
    REQUIRE(std::memcmp(ref.data(), fast.data(), ref.size() * sizeof(model::block_q8_0)) == 0);
  }
}
