// The memory ledger: per-replica estimates (weights, KV, activations,
// overhead), the per-device ledger's admit/release bookkeeping and refusals,
// device presets, and how many replicas fit a device and a node.

#include <catch2/catch.hpp>

#include "cluster/hardware.hpp"
#include "cluster/ledger.hpp"
#include "cluster/model_shape.hpp"

using namespace exa;
using namespace exa::cluster;
using Catch::Matchers::Contains;

namespace {

model_shape preset(const char* name, precision p = precision::fp16) {
  auto s = model_shape_preset(name, p);
  REQUIRE(s.has_value());
  return *s;
}

device_spec device(const char* name) {
  auto d = device_preset(name);
  REQUIRE(d.has_value());
  return *d;
}

memory_breakdown gib(std::uint64_t weights_gib) {
  memory_breakdown m;
  m.weights_bytes = weights_gib * gib_bytes;
  return m;
}

}  // namespace

TEST_CASE("estimate: Llama-2-70B fp16 at TP 1 and 2", "[ledger]") {
  const model_shape m = preset("llama-2-70b");
  replica_config c;
  c.kv_tokens = 4096;
  c.max_batch_tokens = 2048;
  c.max_batch_sequences = 1;
  c.replica_overhead_bytes = 256 * mib_bytes;
  auto one = estimate(m, c);
  REQUIRE(one.has_value());
  CHECK(one->weights_bytes == 137'955'934'208ull);
  CHECK(one->kv_bytes == 4096ull * 327'680);
  // 2048 × (4 × 8192 + 2 × 28672) × 4 + 1 × 32000 × 4
  CHECK(one->activations_bytes == 738'325'504ull);
  CHECK(one->overhead_bytes == 256 * mib_bytes);
  CHECK(one->total_bytes() == 137'955'934'208ull + 4096ull * 327'680 + 738'325'504ull + 256 * mib_bytes);

  c.tensor_parallel = 2;
  auto two = estimate(m, c);
  REQUIRE(two.has_value());
  CHECK(two->weights_bytes == 137'955'934'208ull / 2);
  CHECK(two->kv_bytes == 4096ull * 327'680 / 2);
  CHECK(two->activations_bytes == one->activations_bytes);  // not sharded: a deliberate over-reserve
  CHECK(two->overhead_bytes == one->overhead_bytes);
}

TEST_CASE("estimate: KV shards by KV heads, whole heads per shard", "[ledger]") {
  const model_shape m = preset("llama-2-70b");  // 8 KV heads
  replica_config c;
  c.kv_tokens = 1000;
  c.tensor_parallel = 8;
  CHECK(estimate(m, c)->kv_bytes == 1000ull * 327'680 / 8);
  // tiny: 4 query heads, 2 KV heads, head dim 16, 2 layers. At TP 4 each
  // shard still keeps one whole KV head: half the per-token bytes, not a quarter.
  const model_shape t = preset("tiny");
  REQUIRE(t.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2);
  c.tensor_parallel = 4;
  CHECK(estimate(t, c)->kv_bytes == 1000ull * 2 * 2 * 1 * 16 * 2);
}

TEST_CASE("estimate: the batch sizes the activation reserve", "[ledger]") {
  const model_shape m = preset("llama-3-8b");
  replica_config c;
  c.max_batch_tokens = 512;
  c.max_batch_sequences = 16;
  // 512 × (4 × 4096 + 2 × 14336) × 4 + 16 × 128256 × 4
  CHECK(estimate(m, c)->activations_bytes == 512ull * 45056 * 4 + 16ull * 128256 * 4);
}

TEST_CASE("estimate refuses bad configurations, naming them", "[ledger]") {
  const model_shape m = preset("llama-2-70b");
  replica_config c;
  c.tensor_parallel = 3;
  CHECK_THAT(estimate(m, c).error().message, Contains("tensor_parallel = 3"));
  c.tensor_parallel = 8;
  CHECK_THAT(estimate(preset("tiny"), c).error().message, Contains("does not divide the 4 attention heads"));
  c = replica_config{};
  c.max_batch_tokens = 0;
  CHECK_THAT(estimate(m, c).error().message, Contains("max_batch_tokens"));
  c = replica_config{};
  c.max_batch_sequences = 4;
  c.max_batch_tokens = 2;
  CHECK_THAT(estimate(m, c).error().message, Contains("max_batch_sequences"));
  c = replica_config{};
  c.kv_tokens = max_kv_tokens + 1;
  CHECK(estimate(m, c).error().code == errc::invalid_argument);
  model_shape broken = m;
  broken.n_kv_heads = 7;
  CHECK_THAT(estimate(broken, replica_config{}).error().message, Contains("n_kv_heads"));
}

TEST_CASE("estimate: a draft model adds its weights, KV and activations, unsharded", "[ledger][speculative]") {
  const model_shape target = preset("llama-3-8b");
  const model_shape draft = preset("tiny");
  replica_config c;
  c.kv_tokens = 4096;
  c.max_batch_tokens = 256;
  const auto alone = estimate(target, c);
  REQUIRE(alone);
  replica_config draft_alone = c;
  const auto d = estimate(draft, draft_alone);
  REQUIRE(d);
  c.draft = draft;
  const auto both = estimate(target, c);
  REQUIRE(both);
  CHECK(both->weights_bytes == alone->weights_bytes + d->weights_bytes);
  CHECK(both->kv_bytes == alone->kv_bytes + 4096 * draft.kv_bytes_per_token());
  CHECK(both->activations_bytes == alone->activations_bytes + d->activations_bytes);
  CHECK(both->overhead_bytes == alone->overhead_bytes);
  // At TP 2 the target shards; each shard keeps the whole draft.
  c.tensor_parallel = 2;
  const auto tp2 = estimate(target, c);
  REQUIRE(tp2);
  CHECK(tp2->weights_bytes == (target.weight_bytes + 1) / 2 + d->weights_bytes);
  // A draft whose shape is broken is named.
  model_shape broken = draft;
  broken.n_kv_heads = 3;
  c.draft = broken;
  CHECK_THAT(estimate(target, c).error().message, Contains("draft model: "));
  // A replica that fits alone may not with its draft.
  device_ledger l(alone->total_bytes());
  CHECK(l.can_admit(*alone));
  CHECK_FALSE(l.can_admit(*both));
}

TEST_CASE("device ledger admits, refuses and releases", "[ledger]") {
  device_ledger l(80 * gib_bytes);
  CHECK(l.free_bytes() == 80 * gib_bytes);
  REQUIRE(l.admit(1, gib(70)).has_value());
  CHECK(l.used_bytes() == 70 * gib_bytes);
  CHECK(l.free_bytes() == 10 * gib_bytes);

  memory_breakdown big;
  big.weights_bytes = 12 * gib_bytes;
  big.kv_bytes = 2 * gib_bytes + 214 * mib_bytes;  // 14.21 GiB in all
  CHECK_FALSE(l.can_admit(big));
  auto r = l.admit(2, big);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::out_of_memory);
  CHECK_THAT(r.error().message, Contains("needs 14.21 GiB") && Contains("10.00 GiB free of 80.00 GiB"));
  CHECK(l.used_bytes() == 70 * gib_bytes);  // a refusal changes nothing
  CHECK_FALSE(l.holds(2));

  REQUIRE(l.release(1).has_value());
  CHECK(l.used_bytes() == 0);
  CHECK(l.replica_count() == 0);
  REQUIRE(l.admit(2, big).has_value());
  CHECK(l.used_bytes() == big.total_bytes());
}

TEST_CASE("device ledger: exact fits, the reserve, and one byte more", "[ledger]") {
  device_ledger l(10 * gib_bytes, 512 * mib_bytes);
  CHECK(l.used_bytes() == 512 * mib_bytes);
  memory_breakdown exact;
  exact.kv_bytes = l.free_bytes();
  memory_breakdown over = exact;
  over.kv_bytes += 1;
  CHECK_FALSE(l.can_admit(over));
  CHECK(l.admit(7, over).error().code == errc::out_of_memory);
  REQUIRE(l.admit(7, exact).has_value());
  CHECK(l.free_bytes() == 0);
  REQUIRE(l.release(7).has_value());
  CHECK(l.used_bytes() == 512 * mib_bytes);  // back to the reserve, never below
}

TEST_CASE("device ledger: double admit and double release are errors", "[ledger]") {
  device_ledger l(80 * gib_bytes);
  REQUIRE(l.admit(5, gib(10)).has_value());
  auto again = l.admit(5, gib(1));
  REQUIRE_FALSE(again.has_value());
  CHECK(again.error().code == errc::invalid_argument);
  CHECK(l.used_bytes() == 10 * gib_bytes);
  REQUIRE(l.release(5).has_value());
  auto twice = l.release(5);
  REQUIRE_FALSE(twice.has_value());
  CHECK(twice.error().code == errc::not_found);
  CHECK(l.release(99).error().code == errc::not_found);
  CHECK(l.used_bytes() == 0);
}

TEST_CASE("device presets carry the datasheet figures", "[ledger][hardware]") {
  const device_spec a100 = device("a100-80gb");
  CHECK(a100.memory_bytes == 80 * gib_bytes);
  CHECK(a100.memory_bandwidth_bytes_per_s == Approx(2.039e12));
  CHECK(a100.fp16_flops_per_s == Approx(312e12));
  CHECK(a100.nvlink_bytes_per_s == Approx(600e9));
  const device_spec h100 = device("H100-80GB");  // case-insensitive
  CHECK(h100.memory_bytes == 81559 * mib_bytes);
  CHECK(h100.memory_bandwidth_bytes_per_s == Approx(3.35e12));
  CHECK(h100.int8_ops_per_s == Approx(1979e12));
  const device_spec h200 = device("h200-141gb");
  CHECK(h200.memory_bytes == 143771 * mib_bytes);
  CHECK(h200.memory_bandwidth_bytes_per_s == Approx(4.8e12));
  CHECK(h200.nvlink_bytes_per_s == Approx(900e9));
  CHECK(h200.device_reserved_bytes == gpu_device_reserved_bytes);
  CHECK(device_preset("h100-80gb", 40 * gib_bytes)->memory_bytes == 40 * gib_bytes);
}

TEST_CASE("device presets: cpu needs memory and unknown names list the valid ones", "[ledger][hardware]") {
  CHECK(device_preset("cpu").error().code == errc::invalid_argument);
  auto cpu = device_preset("cpu", 64 * gib_bytes);
  REQUIRE(cpu.has_value());
  CHECK(cpu->kind == device_kind::cpu);
  CHECK(cpu->memory_bytes == 64 * gib_bytes);
  CHECK(cpu->device_reserved_bytes == 0);
  CHECK(cpu->replica_overhead_bytes == 0);
  auto bad = device_preset("tpu-v5");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == errc::not_found);
  CHECK_THAT(bad.error().message, Contains("a100-80gb, h100-80gb, h200-141gb, cpu"));
  CHECK(device_preset("h100-80gb", 0).error().code == errc::invalid_argument);
}

TEST_CASE("smallest tensor parallelism that fits", "[ledger]") {
  replica_config c;
  c.kv_tokens = 4096;
  c.replica_overhead_bytes = gpu_replica_overhead_bytes;
  // 70B fp16: ~130 GiB does not fit an H100 (79.2 GiB usable) but fits an H200.
  CHECK(min_tensor_parallel(preset("llama-2-70b"), c, device("h100-80gb"), 8).value() == 2u);
  CHECK(min_tensor_parallel(preset("llama-2-70b"), c, device("h200-141gb"), 8).value() == 1u);
  // fp32: ~259 GiB needs four H100s, and nothing fits when a node has two.
  CHECK(min_tensor_parallel(preset("llama-2-70b", precision::fp32), c, device("h100-80gb"), 8).value() == 4u);
  CHECK_FALSE(min_tensor_parallel(preset("llama-2-70b", precision::fp32), c, device("h100-80gb"), 2)->has_value());
  CHECK(min_tensor_parallel(preset("llama-3-8b", precision::int4), c, device("a100-80gb"), 8).value() == 1u);
}

TEST_CASE("replicas per device and per node", "[ledger]") {
  const device_spec h100 = device("h100-80gb");
  const std::uint64_t usable = h100.memory_bytes - h100.device_reserved_bytes;
  memory_breakdown m;
  m.weights_bytes = usable / 3;
  CHECK(shards_per_device(m, h100) == 3);
  m.weights_bytes += 1;
  CHECK(shards_per_device(m, h100) == 2);
  m.weights_bytes = usable + 1;
  CHECK(shards_per_device(m, h100) == 0);
  CHECK(replicas_per_node(2, 8, 1) == 16);
  CHECK(replicas_per_node(1, 8, 2) == 4);
  CHECK(replicas_per_node(3, 8, 2) == 12);
  CHECK(replicas_per_node(3, 6, 4) == 4);  // 18 shards, groups of 4 on distinct devices
  CHECK(replicas_per_node(5, 4, 8) == 0);  // the node is too small for a group
}

TEST_CASE("format_bytes picks a readable unit", "[ledger]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(256 * mib_bytes) == "256.00 MiB");
  CHECK(format_bytes(80 * gib_bytes) == "80.00 GiB");
}
