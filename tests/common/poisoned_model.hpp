#pragma once
// A model file as an overflowing conversion would leave it: one token's
// embedding infinite. Shared by the engine and serving tests.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "model/gguf.hpp"

namespace exa::test {

/// Writes a copy of the GGUF file at `path` (one our writer made) whose
/// token_embd row `token` is infinite: its first element (f32, f16) or its
/// first block's f16 scale (q8_0, q4_0, q4_K). Returns the copy's path. The
/// token's hidden state is then NaN or infinite, and so is every later
/// position's, through attention.
inline std::string write_poisoned_copy(const std::string& path, std::int32_t token) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE_FALSE(raw.empty());
  std::vector<std::byte> bytes(raw.size());
  std::memcpy(bytes.data(), raw.data(), raw.size());
  auto f = model::gguf_file::parse(bytes);
  REQUIRE(f.has_value());
  const model::gguf_tensor* t = f->find_tensor("token_embd.weight");
  REQUIRE(t != nullptr);
  REQUIRE(t->shape.size() == 2);
  REQUIRE(t->type.has_value());
  REQUIRE(token >= 0);
  REQUIRE(static_cast<std::uint64_t>(token) < t->shape[1]);
  // Our writer pads every tensor to the alignment, so the data section is
  // the file's last bytes; the comparison below checks the arithmetic.
  std::uint64_t data_bytes = 0;
  for (const auto& u : f->tensors())
    data_bytes = std::max(data_bytes, (u.offset + u.size_bytes + f->alignment() - 1) / f->alignment() * f->alignment());
  const std::size_t row_bytes = static_cast<std::size_t>(t->size_bytes / t->shape[1]);
  const std::size_t row_at = static_cast<std::size_t>(token) * row_bytes;
  const std::size_t at = static_cast<std::size_t>(bytes.size() - data_bytes + t->offset) + row_at;
  REQUIRE(std::memcmp(bytes.data() + at, t->data + row_at, row_bytes) == 0);
  switch (*t->type) {
    case model::tensor_type::f32: {
      const float inf = std::numeric_limits<float>::infinity();
      std::memcpy(bytes.data() + at, &inf, sizeof inf);
      break;
    }
    case model::tensor_type::f16:
    case model::tensor_type::q8_0:
    case model::tensor_type::q4_0:
    case model::tensor_type::q4_K: {
      const std::uint16_t inf16 = 0x7c00;  // f16's infinity: the element, or the block's leading scale d
      std::memcpy(bytes.data() + at, &inf16, sizeof inf16);
      break;
    }
    default: FAIL("write_poisoned_copy: token_embd is " << model::to_string(*t->type) << ", not handled");
  }
  // Written whole under this process's own name, then renamed into place:
  // ctest runs test cases as processes side by side, and another may have
  // the copy mapped (a rename leaves its mapping as it was).
  const std::string out_path = path + ".poisoned-" + std::to_string(token) + ".gguf";
  const std::string tmp_path = out_path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.close();
    REQUIRE(out.good());
  }
  REQUIRE(std::rename(tmp_path.c_str(), out_path.c_str()) == 0);
  return out_path;
}

}  // namespace exa::test
