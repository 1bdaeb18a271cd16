// The continuous-batching policy on its own: decode before prefill, chunked
// prefill within the token budget, bounded running set, and preemption of the
// newest sequence when the KV cache runs out.

#include <catch2/catch.hpp>

#include "engine/batch_scheduler.hpp"
#include "gpu/cpu_memory_pool.hpp"

using namespace exa;

namespace {

struct sched_rig {
  std::unique_ptr<gpu::cpu_memory_pool> pool;
  engine::kv_cache cache;
  engine::batch_scheduler sched;

  sched_rig(std::uint32_t blocks, engine::scheduler_config cfg)
      : pool(std::move(*gpu::cpu_memory_pool::create(engine::kv_layout{1, 8, 4}.block_bytes(), blocks))),
        cache(*pool, {1, 8, 4}),
        sched(cfg, cache) {}

  void add(engine::seq_id id, std::uint32_t prompt, std::uint32_t max_tokens = 100) {
    auto s = std::make_unique<engine::sequence>();
    s->request.id = id;
    s->request.max_tokens = max_tokens;
    s->tokens.assign(prompt, 1);
    s->prompt_len = prompt;
    sched.enqueue(std::move(s));
  }

  // Plans a step and applies it as the engine would (a token per finished chunk).
  std::vector<std::pair<engine::seq_id, std::uint32_t>> step(std::uint32_t* preempted = nullptr) {
    std::uint32_t p = 0;
    auto plan = sched.plan(p);
    if (preempted) *preempted = p;
    std::vector<std::pair<engine::seq_id, std::uint32_t>> out;
    for (auto& c : plan) {
      REQUIRE(cache.reserved_tokens(c.seq->request.id) >= c.seq->computed + c.n_tokens);
      out.emplace_back(c.seq->request.id, c.n_tokens);
      c.seq->computed += c.n_tokens;
      if (c.seq->computed == c.seq->tokens.size()) c.seq->tokens.push_back(2);
    }
    return out;
  }
};

std::uint32_t tokens_of(const std::vector<std::pair<engine::seq_id, std::uint32_t>>& plan) {
  std::uint32_t n = 0;
  for (auto& [id, k] : plan) n += k;
  return n;
}

}  // namespace

TEST_CASE("prefill is chunked and decode goes first", "[scheduler]") {
  sched_rig r(256, {/*max_batch_tokens=*/10, /*max_running=*/8, /*max_waiting=*/100, /*prefill_chunk=*/6});
  r.add(1, 3);
  r.add(2, 3);
  auto s1 = r.step();
  CHECK(s1 == decltype(s1){{1, 3}, {2, 3}});
  r.add(3, 40);  // a long prompt arrives
  for (int i = 0; i < 5; ++i) {
    auto s = r.step();
    CAPTURE(i);
    REQUIRE(s.size() == 3);
    CHECK(s[0] == std::pair<engine::seq_id, std::uint32_t>{1, 1});  // decoding never stalls
    CHECK(s[1] == std::pair<engine::seq_id, std::uint32_t>{2, 1});
    CHECK(s[2].first == 3);
    CHECK(s[2].second == 6);  // at most one chunk per step
    CHECK(tokens_of(s) <= 10);
  }
}

TEST_CASE("the running set is bounded", "[scheduler]") {
  sched_rig r(256, {100, 2, 100, 50});
  for (engine::seq_id i = 1; i <= 5; ++i) r.add(i, 2);
  r.step();
  CHECK(r.sched.running() == 2);
  CHECK(r.sched.waiting() == 3);
}

TEST_CASE("out of KV blocks, the newest sequence is preempted", "[scheduler]") {
  // 7 blocks of 4 tokens: sequences of 7, 7 and 3 tokens are admitted (5
  // blocks), and two decode steps later they want 8 blocks between them.
  sched_rig r(7, {100, 8, 100, 100});
  r.add(1, 7);
  r.add(2, 7);
  r.add(3, 3);
  r.step();
  CHECK(r.sched.running() == 3);
  r.step();  // 1 and 2 fill their 8th position, 3 its 4th: no new blocks
  std::uint32_t preempted = 0;
  auto s = r.step(&preempted);  // each needs one more block; two are free
  CHECK(preempted >= 1);
  bool has1 = false;
  for (auto& [id, n] : s) has1 |= id == 1;
  CHECK(has1);  // the oldest always progresses
  auto* seq3 = r.sched.find(3);
  REQUIRE(seq3 != nullptr);
  CHECK_FALSE(seq3->is_running);  // the newest went back to waiting
  CHECK(seq3->computed == 0);
  CHECK_FALSE(r.cache.has(3));
  // Removing frees everything; nothing is leaked.
  for (engine::seq_id i = 1; i <= 3; ++i) r.sched.remove(i);
  CHECK(r.cache.free_blocks() == 7);
}
