// Reading every value of a model file: a clean one has none that is not
// finite; a copy with one token's embedding made infinite is found at that
// tensor, row and column, whatever the weight type.

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>

#include "../common/poisoned_model.hpp"
#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/model_gen.hpp"
#include "model/quantize.hpp"
#include "model/value_scan.hpp"

using namespace exa;
using namespace exa::model;

TEST_CASE("scan_values finds the non-finite values of a file by tensor, row and column", "[model]") {
  const auto type = GENERATE(tensor_type::f32, tensor_type::f16, tensor_type::q8_0, tensor_type::q4_0);
  CAPTURE(to_string(type));
  auto spec = *preset_spec("tiny");
  spec.type = type;
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/scan-" + std::string(to_string(type)) + ".gguf";
  REQUIRE(generate_model(spec, path));

  auto clean = gguf_file::open(path);
  REQUIRE(clean);
  std::uint64_t calls = 0, last_done = 0, last_total = 0;
  const value_scan ok = scan_values(*clean, [&](std::uint64_t done, std::uint64_t total) {
    CHECK(done >= last_done);
    ++calls, last_done = done, last_total = total;
  });
  CHECK(ok.nonfinite() == 0);
  CHECK(ok.tensors == clean->tensors().size());
  CHECK(ok.skipped.empty());
  std::uint64_t values = 0, bytes = 0;
  for (const auto& t : clean->tensors()) values += t.elements(), bytes += t.size_bytes;
  CHECK(ok.values == values);
  CHECK(ok.bytes == bytes);
  CHECK(calls >= ok.tensors);  // after each tensor at least
  CHECK(last_done == last_total);
  CHECK(last_total == bytes);
  for (const auto& t : ok.read) {
    CAPTURE(t.name);
    CHECK(t.max_abs > 0.0f);  // random weights, norms of ones
  }

  const std::int32_t token = 77;
  auto bad = gguf_file::open(test::write_poisoned_copy(path, token));
  REQUIRE(bad);
  const value_scan found = scan_values(*bad);
  const tensor_values* embd = nullptr;
  for (const auto& t : found.read)
    if (t.name == "token_embd.weight") embd = &t;
  REQUIRE(embd != nullptr);
  // An infinite element alone (f32, f16); an infinite scale makes its whole
  // block of 32 so (q = 0 gives NaN, the rest infinities).
  const bool block = type == tensor_type::q8_0 || type == tensor_type::q4_0;
  CHECK(embd->nonfinite == (block ? 32u : 1u));
  CHECK(embd->nonfinite_blocks == 1);  // one value, or one block's scale
  CHECK(embd->block_values == (block ? 32u : 1u));
  CHECK(embd->first_row == static_cast<std::uint64_t>(token));
  CHECK(embd->first_col == 0);
  CHECK(found.nonfinite() == embd->nonfinite);  // no other tensor
  CHECK(embd->max_abs <= ok.read[static_cast<std::size_t>(embd - found.read.data())].max_abs);  // of fewer values
}

TEST_CASE("scan_values reads a long row in pieces and places its values by their own column", "[model]") {
  // One row of 2^17 + 32 values, longer than the scan's 2^16-value piece:
  // the infinities and the largest value sit in the second and third piece.
  std::vector<float> v(131104, 0.5f);
  v[70000] = std::numeric_limits<float>::infinity();
  v[131100] = -std::numeric_limits<float>::infinity();
  v[131101] = -9.0f;
  gguf_writer w;
  w.add_tensor("long", {v.size()}, tensor_type::f32, std::as_bytes(std::span<const float>(v)));
  std::vector<float> q(4096, 1.0f);
  q[4000] = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::byte> q8(row_bytes(tensor_type::q8_0, q.size()));
  convert_row(q, tensor_type::q8_0, q8.data());
  w.add_tensor("blocks", {2048, 2}, tensor_type::q8_0, std::move(q8));
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/scan-long.gguf";
  REQUIRE(w.write(path));
  auto f = gguf_file::open(path);
  REQUIRE(f);
  const value_scan s = scan_values(*f);
  REQUIRE(s.read.size() == 2);
  CHECK(s.read[0].nonfinite == 2);
  CHECK(s.read[0].nonfinite_blocks == 2);  // f32: a value is its own block
  CHECK(s.read[0].first_row == 0);
  CHECK(s.read[0].first_col == 70000);
  CHECK(s.read[0].max_abs == 9.0f);
  // A NaN in row 1 (values 2048-4095), block 60: its whole block of 32.
  CHECK(s.read[1].nonfinite == 32);
  CHECK(s.read[1].nonfinite_blocks == 1);
  CHECK(s.read[1].first_row == 1);
  CHECK(s.read[1].first_col == (4000 - 2048) / 32 * 32);
  CHECK(s.values == v.size() + q.size());
}

TEST_CASE("scan_values counts a K-quant's non-finite blocks: its f16 scale or min made infinite", "[model]") {
  // Two rows of 512 values (two 256-value blocks a row). q4_K's block starts
  // with its f16 scale d then its f16 min; q6_K's ends with its f16 scale.
  std::vector<float> x(1024);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(static_cast<int>(i % 37) - 18);
  constexpr std::uint16_t f16_inf = 0x7c00;
  gguf_writer w;
  struct poison {
    tensor_type type;
    std::size_t field;  // byte offset of the f16 field made infinite
  };
  for (const poison p : {poison{tensor_type::q4_K, 0}, poison{tensor_type::q4_K, 2}, poison{tensor_type::q6_K, 208}}) {
    std::vector<std::byte> q(row_bytes(p.type, x.size()));
    convert_row(x, p.type, q.data());
    // Blocks 1 and 3: the second block of each row.
    for (const std::size_t b : {1u, 3u}) std::memcpy(q.data() + b * block_bytes(p.type) + p.field, &f16_inf, 2);
    w.add_tensor(std::string(to_string(p.type)) + "@" + std::to_string(p.field), {512, 2}, p.type, std::move(q));
  }
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/scan-kquants.gguf";
  REQUIRE(w.write(path));
  auto f = gguf_file::open(path);
  REQUIRE(f);
  const value_scan s = scan_values(*f);
  REQUIRE(s.read.size() == 3);
  for (const auto& t : s.read) {
    CAPTURE(t.name);
    CHECK(t.block_values == 256);
    CHECK(t.block_min == t.name.starts_with("q4_K"));
    CHECK(t.nonfinite_blocks == 2);
    // Every value of both blocks: an infinite scale or min times an integer
    // (0 included: NaN) is not finite.
    CHECK(t.nonfinite == 2 * 256);
    CHECK(t.first_row == 0);
    CHECK(t.first_col == 256);
  }
}
