// GGUF reader and writer: round trips of every value and tensor type, one
// test per kind of corruption (each with its own message), and a seeded
// mutation sweep that must never crash.

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/half.hpp"
#include "model/quantize.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;

namespace {

std::string tmp_path(const std::string& name) {
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  return std::string(EXA_TEST_TMPDIR) + "/" + name;
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  std::memcpy(out.data(), c.data(), c.size());
  return out;
}

// Hand-written GGUF bytes, for files the writer refuses to produce.
struct gguf_bytes {
  std::vector<std::byte> b;

  template <class T>
  gguf_bytes& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  gguf_bytes& u8(std::uint8_t v) { return put(v); }
  gguf_bytes& u32(std::uint32_t v) { return put(v); }
  gguf_bytes& u64(std::uint64_t v) { return put(v); }
  gguf_bytes& str(std::string_view s) {
    u64(s.size());
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    return *this;
  }
  gguf_bytes& header(std::uint64_t n_tensors, std::uint64_t n_kv, std::uint32_t version = 3) {
    return u32(0x46554747).u32(version).u64(n_tensors).u64(n_kv);
  }
  gguf_bytes& kv_u32(std::string_view key, std::uint32_t v) { return str(key).u32(4).u32(v); }
  gguf_bytes& tensor(std::string_view name, std::vector<std::uint64_t> dims, std::uint32_t type,
                     std::uint64_t offset) {
    str(name).u32(static_cast<std::uint32_t>(dims.size()));
    for (auto d : dims) u64(d);
    return u32(type).u64(offset);
  }
  gguf_bytes& pad(std::size_t align = 32) {
    while (b.size() % align != 0) b.push_back(std::byte{0});
    return *this;
  }
  gguf_bytes& zeros(std::size_t n) {
    b.insert(b.end(), n, std::byte{0});
    return *this;
  }
};

error expect_error(std::span<const std::byte> bytes) {
  auto r = gguf_file::parse(bytes);
  REQUIRE_FALSE(r.has_value());
  return r.error();
}

void expect_corrupt(const gguf_bytes& g, const std::string& needle) {
  const error e = expect_error(g.b);
  INFO(e.message);
  CHECK(e.code == errc::corrupt_data);
  CHECK_THAT(e.message, Contains(needle));
}

// A small valid file whose last tensor ends exactly at end of file (32 bytes
// of f32), so any truncation at all must be detected.
std::vector<std::byte> small_valid_file() {
  gguf_writer w;
  w.add_string("general.architecture", "llama");
  w.add_bool("flag", true);
  w.add_i32_array("ints", {1, -2, 3});
  w.add_string_array("strs", {"a", "", "ccc"});
  std::vector<float> a(16, 0.5f);
  std::vector<float> b(8, -1.0f);
  w.add_tensor("a", {8, 2}, tensor_type::f32, bytes_of(a));
  w.add_tensor("b", {8}, tensor_type::f32, bytes_of(b));
  return w.serialize();
}

}  // namespace

TEST_CASE("gguf writer and reader round-trip every value and tensor type", "[model]") {
  gguf_writer w;
  w.add_u8("v.u8", 200);
  w.add_i8("v.i8", -100);
  w.add_u16("v.u16", 60000);
  w.add_i16("v.i16", -30000);
  w.add_u32("v.u32", 4000000000u);
  w.add_i32("v.i32", -2000000000);
  w.add_u64("v.u64", std::uint64_t{1} << 40);
  w.add_i64("v.i64", -(std::int64_t{1} << 40));
  w.add_f32("v.f32", 1.5f);
  w.add_f64("v.f64", 3.25);
  w.add_bool("v.bool", true);
  w.add_bool("v.false", false);
  w.add_string("v.str", "h\xC3\xA9llo");
  w.add_i32_array("v.ints", {1, -2, 2147483647});
  w.add_f32_array("v.floats", {0.25f, -8.0f});
  w.add_string_array("v.strs", {"x", "", "zz"});

  std::vector<float> f32s(24);
  for (std::size_t i = 0; i < f32s.size(); ++i) f32s[i] = static_cast<float>(i) * 0.5f - 3.0f;
  std::vector<std::uint16_t> f16s(8), bf16s(6);
  for (std::size_t i = 0; i < f16s.size(); ++i) f16s[i] = float_to_f16(static_cast<float>(i));
  for (std::size_t i = 0; i < bf16s.size(); ++i) bf16s[i] = float_to_bf16(-static_cast<float>(i));
  std::vector<float> src(96);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = std::sin(static_cast<float>(i));
  std::vector<block_q8_0> q8(2);
  quantize_row_q8_0(src.data(), q8.data(), 64);
  std::vector<block_q4_0> q4(3);
  quantize_row_q4_0(src.data(), q4.data(), 96);
  w.add_tensor("t.f32", {8, 3}, tensor_type::f32, bytes_of(f32s));
  w.add_tensor("t.f16", {4, 2}, tensor_type::f16, bytes_of(f16s));
  w.add_tensor("t.bf16", {6}, tensor_type::bf16, bytes_of(bf16s));
  w.add_tensor("t.q8_0", {64, 1, 1}, tensor_type::q8_0, bytes_of(q8));
  w.add_tensor("t.q4_0", {32, 3}, tensor_type::q4_0, bytes_of(q4));

  const std::string path = tmp_path("roundtrip.gguf");
  REQUIRE(w.write(path).has_value());
  // The streaming write and the in-memory serialization are the same bytes.
  REQUIRE(read_file(path) == w.serialize());
  CHECK_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));

  auto opened = gguf_file::open(path);
  REQUIRE(opened.has_value());
  const gguf_file& f = *opened;
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.file_size() == std::filesystem::file_size(path));
  CHECK(f.get_int("v.u8").value() == 200);
  CHECK(f.get_int("v.i8").value() == -100);
  CHECK(f.get_int("v.u16").value() == 60000);
  CHECK(f.get_int("v.i16").value() == -30000);
  CHECK(f.get_int("v.u32").value() == 4000000000);
  CHECK(f.get_int("v.i32").value() == -2000000000);
  CHECK(f.get_int("v.u64").value() == std::int64_t{1} << 40);
  CHECK(f.get_int("v.i64").value() == -(std::int64_t{1} << 40));
  CHECK(f.get_float("v.f32").value() == 1.5);
  CHECK(f.get_float("v.f64").value() == 3.25);
  CHECK(f.get_float("v.u8").value() == 200.0);  // floats accept integers
  CHECK(f.get_bool("v.bool").value());
  CHECK_FALSE(f.get_bool("v.false").value());
  CHECK(f.get_string("v.str").value() == "h\xC3\xA9llo");
  CHECK(f.find("v.u32")->type == gguf_value_type::u32);
  CHECK(f.get_int("general.alignment").value() == 32);  // added automatically

  const gguf_array* ints = f.get_array("v.ints").value();
  CHECK(ints->elem_type == gguf_value_type::i32);
  CHECK(ints->ints == std::vector<std::int64_t>{1, -2, 2147483647});
  const gguf_array* floats = f.get_array("v.floats").value();
  CHECK(floats->floats == std::vector<double>{0.25, -8.0});
  const gguf_array* strs = f.get_array("v.strs").value();
  CHECK(strs->strings == std::vector<std::string>{"x", "", "zz"});
  CHECK(strs->size() == 3);

  struct expect_t {
    const char* name;
    std::vector<std::uint64_t> shape;
    tensor_type type;
    std::span<const std::byte> bytes;
  };
  const expect_t expected_tensors[] = {
      {"t.f32", {8, 3}, tensor_type::f32, bytes_of(f32s)},
      {"t.f16", {4, 2}, tensor_type::f16, bytes_of(f16s)},
      {"t.bf16", {6}, tensor_type::bf16, bytes_of(bf16s)},
      {"t.q8_0", {64, 1, 1}, tensor_type::q8_0, bytes_of(q8)},
      {"t.q4_0", {32, 3}, tensor_type::q4_0, bytes_of(q4)},
  };
  REQUIRE(f.tensors().size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    const expect_t& e = expected_tensors[i];
    INFO(e.name);
    const gguf_tensor* t = f.find_tensor(e.name);
    REQUIRE(t != nullptr);
    CHECK(&f.tensors()[i] == t);  // insertion order
    CHECK(t->shape == e.shape);
    CHECK(t->type == e.type);
    CHECK(t->type_id == static_cast<std::uint32_t>(e.type));
    CHECK(t->offset % 32 == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(t->data) % 32 == 0);
    REQUIRE(t->size_bytes == e.bytes.size());
    CHECK(std::memcmp(t->data, e.bytes.data(), e.bytes.size()) == 0);
  }
  CHECK(f.find_tensor("t.f32")->elements() == 24);

  // The same image parsed from memory gives the same directory.
  const std::vector<std::byte> image = w.serialize();
  auto parsed = gguf_file::parse(image);
  REQUIRE(parsed.has_value());
  CHECK(parsed->metadata().size() == f.metadata().size());
  CHECK(std::memcmp(parsed->find_tensor("t.q4_0")->data, bytes_of(q4).data(), sizeof(block_q4_0) * 3) == 0);
}

TEST_CASE("gguf typed getters report missing keys and type mismatches", "[model]") {
  gguf_writer w;
  w.add_string("s", "text");
  w.add_u32("n", 7);
  const auto image = w.serialize();
  auto f = gguf_file::parse(image);
  REQUIRE(f.has_value());
  auto missing = f->get_int("nope");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == errc::not_found);
  CHECK_THAT(missing.error().message, Contains("nope"));
  auto wrong = f->get_int("s");
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code == errc::invalid_argument);
  CHECK_THAT(wrong.error().message, Contains("'s'") && Contains("string"));
  CHECK_FALSE(f->get_string("n").has_value());
  CHECK_FALSE(f->get_array("n").has_value());
  CHECK_FALSE(f->get_bool("n").has_value());
  CHECK(f->find("s") != nullptr);
  CHECK(f->find_tensor("s") == nullptr);
}

TEST_CASE("gguf accepts version 2 and a file without tensors", "[model]") {
  gguf_bytes g;
  g.header(0, 1, 2).kv_u32("k", 5);
  auto f = gguf_file::parse(g.b);
  REQUIRE(f.has_value());
  CHECK(f->version() == 2);
  CHECK(f->get_int("k").value() == 5);
  CHECK(f->tensors().empty());
}

TEST_CASE("gguf open reports io errors and empty files", "[model]") {
  auto missing = gguf_file::open(tmp_path("does-not-exist.gguf"));
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == errc::io_error);
  CHECK_THAT(missing.error().message, Contains("does-not-exist.gguf"));

  auto dir = gguf_file::open(EXA_TEST_TMPDIR);
  REQUIRE_FALSE(dir.has_value());
  CHECK(dir.error().code == errc::io_error);

  const std::string empty = tmp_path("empty.gguf");
  { std::ofstream out(empty, std::ios::binary | std::ios::trunc); }
  auto e = gguf_file::open(empty);
  REQUIRE_FALSE(e.has_value());
  CHECK(e.error().code == errc::corrupt_data);
  CHECK_THAT(e.error().message, Contains("empty"));
  CHECK_THAT(expect_error({}).message, Contains("empty"));
}

TEST_CASE("gguf rejects every truncation of a valid file", "[model]") {
  const std::vector<std::byte> full = small_valid_file();
  REQUIRE(gguf_file::parse(full).has_value());
  for (std::size_t len = 1; len < full.size(); ++len) {
    INFO("truncated to " << len << " of " << full.size() << " bytes");
    const error e = expect_error(std::span<const std::byte>(full.data(), len));
    CHECK(e.code == errc::corrupt_data);
    if (len < 24) CHECK_THAT(e.message, Contains("truncated header"));
  }
}

TEST_CASE("gguf rejects a wrong magic, showing its bytes", "[model]") {
  auto bytes = small_valid_file();
  bytes[3] = std::byte{'X'};
  const error e = expect_error(bytes);
  CHECK(e.code == errc::corrupt_data);
  CHECK_THAT(e.message, Contains("wrong magic 47 47 55 58"));
}

TEST_CASE("gguf rejects unsupported versions", "[model]") {
  for (std::uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    gguf_bytes g;
    g.header(0, 0, v);
    expect_corrupt(g, "unsupported GGUF version " + std::to_string(v));
  }
}

TEST_CASE("gguf rejects hostile counts before allocating", "[model]") {
  gguf_bytes huge_tensors;
  huge_tensors.header(std::uint64_t{1} << 60, 0);
  expect_corrupt(huge_tensors, "tensor count 1152921504606846976 at offset 8 exceeds the limit");
  gguf_bytes huge_kv;
  huge_kv.header(0, std::uint64_t{1} << 62);
  expect_corrupt(huge_kv, "metadata count 4611686018427387904 at offset 16 exceeds the limit");
  // Within the limits, but more than the remaining bytes could hold.
  gguf_bytes unfit;
  unfit.header(1000, 0).zeros(64);
  expect_corrupt(unfit, "cannot fit in the 64 bytes left");
}

TEST_CASE("gguf rejects hostile string lengths", "[model]") {
  gguf_bytes key;
  key.header(0, 1).u64(std::uint64_t{1} << 62).zeros(16);
  expect_corrupt(key, "string length 4611686018427387904 at offset 24 exceeds the limit");
  gguf_bytes past_eof;
  past_eof.header(0, 1).u64(100).zeros(16);
  expect_corrupt(past_eof, "string length 100 at offset 24 exceeds the 16 bytes left");
  gguf_bytes value;
  value.header(0, 1).str("k").u32(8).u64(std::uint64_t{1} << 62);
  expect_corrupt(value, "string length 4611686018427387904 at offset 37 exceeds");
}

TEST_CASE("gguf rejects hostile array counts and nested arrays", "[model]") {
  gguf_bytes huge;
  huge.header(0, 1).str("arr").u32(9).u32(4).u64(std::uint64_t{1} << 40).zeros(8);
  expect_corrupt(huge, "array count 1099511627776 of key 'arr'");
  gguf_bytes unfit;
  unfit.header(0, 1).str("arr").u32(9).u32(4).u64(1000).zeros(8);
  expect_corrupt(unfit, "array count 1000 of key 'arr' at offset 43 exceeds what the 8 bytes");
  gguf_bytes nested;
  nested.header(0, 1).str("arr").u32(9).u32(9).u64(1).u32(4).u64(0);
  expect_corrupt(nested, "nested array in key 'arr'");
}

TEST_CASE("gguf rejects bad values", "[model]") {
  gguf_bytes type;
  type.header(0, 1).str("k").u32(13).u32(0);
  expect_corrupt(type, "unknown value type 13 for key 'k'");
  gguf_bytes elem_type;
  elem_type.header(0, 1).str("k").u32(9).u32(77).u64(0);
  expect_corrupt(elem_type, "unknown value type 77 for key 'k'");
  gguf_bytes boolean;
  boolean.header(0, 1).str("flag").u32(7).u8(2);
  expect_corrupt(boolean, "invalid bool byte 0x02");
  gguf_bytes bool_elem;
  bool_elem.header(0, 1).str("flags").u32(9).u32(7).u64(2).u8(1).u8(9);
  expect_corrupt(bool_elem, "invalid bool byte 0x09");
  gguf_bytes big_u64;
  big_u64.header(0, 1).str("k").u32(10).u64(~std::uint64_t{0});
  expect_corrupt(big_u64, "exceeds INT64_MAX");
  gguf_bytes truncated;
  truncated.header(0, 1).str("k").u32(4).u8(1);
  expect_corrupt(truncated, "truncated value of key 'k' at offset 37");
}

TEST_CASE("gguf rejects duplicate keys and tensors", "[model]") {
  gguf_bytes key;
  key.header(0, 2).kv_u32("dup", 1).kv_u32("dup", 2);
  expect_corrupt(key, "duplicate key 'dup'");
  gguf_bytes tensor;
  tensor.header(2, 0).tensor("w", {8}, 0, 0).tensor("w", {8}, 0, 32).pad().zeros(64);
  expect_corrupt(tensor, "duplicate tensor name 'w'");
}

TEST_CASE("gguf rejects bad alignment metadata", "[model]") {
  gguf_bytes odd;
  odd.header(0, 1).kv_u32("general.alignment", 24);
  expect_corrupt(odd, "general.alignment 24 is not a nonzero power of two");
  gguf_bytes zero;
  zero.header(0, 1).kv_u32("general.alignment", 0);
  expect_corrupt(zero, "general.alignment 0 is not");
  gguf_bytes type;
  type.header(0, 1).str("general.alignment").u32(0).u8(32);
  expect_corrupt(type, "general.alignment has type u8");
}

TEST_CASE("gguf rejects bad tensor shapes and types", "[model]") {
  gguf_bytes no_dims;
  no_dims.header(1, 0).str("w").u32(0).u32(0).u64(0).pad().zeros(32);
  expect_corrupt(no_dims, "tensor 'w' has n_dims 0");
  gguf_bytes many_dims;
  many_dims.header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(32);
  expect_corrupt(many_dims, "tensor 'w' has n_dims 5");
  gguf_bytes zero_dim;
  zero_dim.header(1, 0).tensor("w", {8, 0}, 0, 0).pad().zeros(32);
  expect_corrupt(zero_dim, "tensor 'w' dimension 1 is 0");
  gguf_bytes absurd;
  absurd.header(1, 0).tensor("w", {std::uint64_t{1} << 50}, 0, 0).pad().zeros(32);
  expect_corrupt(absurd, "tensor 'w' dimension 0 is 1125899906842624");
  gguf_bytes overflow;
  overflow.header(1, 0).tensor("w", {std::uint64_t{1} << 40, std::uint64_t{1} << 40}, 0, 0).pad().zeros(32);
  expect_corrupt(overflow, "tensor 'w' element count overflows");
  gguf_bytes bytes_overflow;  // 2^62 elements of 4 bytes each
  bytes_overflow.header(1, 0).tensor("w", {std::uint64_t{1} << 31, std::uint64_t{1} << 31}, 0, 0).pad().zeros(32);
  expect_corrupt(bytes_overflow, "tensor 'w' size in bytes overflows");
  gguf_bytes type;
  type.header(1, 0).tensor("w", {8}, 77, 0).pad().zeros(32);
  expect_corrupt(type, "tensor 'w' has unknown type id 77");
  gguf_bytes removed_type;  // q4_2 (id 4) no longer exists in ggml
  removed_type.header(1, 0).tensor("w", {32}, 4, 0).pad().zeros(32);
  expect_corrupt(removed_type, "tensor 'w' has unknown type id 4");
  gguf_bytes block;
  block.header(1, 0).tensor("w", {33}, 8, 0).pad().zeros(64);
  expect_corrupt(block, "tensor 'w' innermost dimension 33 is not a multiple of the q8_0 block size 32");
}

TEST_CASE("gguf rejects bad tensor placement", "[model]") {
  gguf_bytes misaligned;
  misaligned.header(1, 0).tensor("w", {4}, 0, 4).pad().zeros(64);
  expect_corrupt(misaligned, "tensor 'w' offset 4 is not a multiple of the alignment 32");
  gguf_bytes past_eof;
  past_eof.header(1, 0).tensor("w", {8}, 0, 1024).pad().zeros(32);
  // Header 24 + info (9 name + 4 n_dims + 8 dim + 4 type + 8 offset) = 57, padded to 64.
  const std::size_t start = 64;
  expect_corrupt(past_eof, "tensor 'w' data [" + std::to_string(start + 1024) + ", " +
                               std::to_string(start + 1056) + ") extends past end of file (size " +
                               std::to_string(start + 32) + ")");
  gguf_bytes huge_offset;
  huge_offset.header(1, 0).tensor("w", {8}, 0, ~std::uint64_t{31}).pad().zeros(32);
  expect_corrupt(huge_offset, "tensor 'w' data offset");
  gguf_bytes overlap;
  overlap.header(3, 0).tensor("a", {8}, 0, 0).tensor("b", {16}, 0, 32).tensor("c", {8}, 0, 64).pad().zeros(96);
  expect_corrupt(overlap, "tensors 'b' and 'c' overlap");
  // Honours general.alignment: offset 32 is misaligned at 64.
  gguf_bytes aligned64;
  aligned64.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, 0, 32).pad(64).zeros(64);
  expect_corrupt(aligned64, "offset 32 is not a multiple of the alignment 64");
}

TEST_CASE("gguf mutation sweep never crashes", "[model]") {
  const std::vector<std::byte> base = small_valid_file();
  const std::uint64_t seed = 20240601;
  std::mt19937_64 rng(seed);
  int parsed = 0;
  int rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<std::byte> bytes = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() & 0xff);
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    INFO("seed " << seed << " iteration " << iter);
    auto f = gguf_file::parse(bytes);
    if (!f) {
      CHECK(f.error().code == errc::corrupt_data);
      CHECK_FALSE(f.error().message.empty());
      ++rejected;
      continue;
    }
    ++parsed;
    // Whatever survived is consistent: every tensor lies inside the file.
    for (const gguf_tensor& t : f->tensors()) {
      CHECK(t.size_bytes <= f->file_size());
      CHECK(t.offset + t.size_bytes <= f->file_size());
      volatile std::byte sink{};
      for (std::uint64_t i = 0; i < t.size_bytes; ++i) sink = t.data[i];
      (void)sink;
    }
  }
  // Both outcomes must occur, or the sweep did not exercise the parser.
  CHECK(parsed > 0);
  CHECK(rejected > 0);
}
