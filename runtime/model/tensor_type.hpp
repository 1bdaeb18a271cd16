#pragma once
// ggml tensor element types as stored in GGUF files, and their block layouts.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace exa::model {

/// Numeric values are ggml's `ggml_type` ids: they are what GGUF files store.
enum class tensor_type : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q4_K = 12,
  q5_K = 13,
  q6_K = 14,
  bf16 = 30,
};

/// Elements per quantization block (1 for plain float types).
constexpr std::size_t q8_0_block_elems = 32;
constexpr std::size_t q4_0_block_elems = 32;

/// Q8_0: one fp16 scale then 32 signed bytes; value = d * q.
struct block_q8_0 {
  std::uint16_t d;  // fp16 bits
  std::int8_t qs[q8_0_block_elems];
};
static_assert(sizeof(block_q8_0) == 34);

/// Q4_0: one fp16 scale then 16 bytes of nibbles; element j is (qs[j] & 15) - 8
/// and element j + 16 is (qs[j] >> 4) - 8, each times d.
struct block_q4_0 {
  std::uint16_t d;  // fp16 bits
  std::uint8_t qs[q4_0_block_elems / 2];
};
static_assert(sizeof(block_q4_0) == 18);

/// Layout of any ggml type id a GGUF file may hold, including the many types
/// ExaServe does not run: the reader needs it to size and bounds-check every
/// tensor of a file, and error messages need the name.
struct ggml_type_traits {
  std::string_view name;        // ggml's name: "q4_K", "iq2_xs", "bf16", ...
  std::size_t block_elems = 0;  // elements per block
  std::size_t block_bytes = 0;  // bytes per block
};

/// Traits of ggml type `id`; nullptr for ids ggml does not define (or removed).
const ggml_type_traits* ggml_type_info(std::uint32_t id) noexcept;

/// Maps a raw id from a file to a type we can run; nullopt for any other id.
std::optional<tensor_type> tensor_type_from_id(std::uint32_t id) noexcept;

/// ggml's names: "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
/// "q4_K", "q5_K", "q6_K".
std::string_view to_string(tensor_type t) noexcept;

/// Parses the names above (case-insensitive); nullopt for anything else.
std::optional<tensor_type> tensor_type_from_string(std::string_view s) noexcept;

/// Elements per block: 1 for float types, 32 for q8_0/q4_0/q4_1/q5_0/q5_1,
/// 256 for K-quants.
std::size_t block_elems(tensor_type t) noexcept;

/// Whether a block subtracts an f16 min as well as scaling by its f16 scale:
/// q4_1, q5_1, q4_K and q5_K.
bool has_block_min(tensor_type t) noexcept;

/// Bytes per block: f32 4, f16/bf16 2, q8_0 34, q4_0 18, q4_1 20, q5_0 22,
/// q5_1 24, q4_K 144, q5_K 176, q6_K 210.
std::size_t block_bytes(tensor_type t) noexcept;

/// Bytes of a row of `n` elements; requires n % block_elems(t) == 0.
std::size_t row_bytes(tensor_type t, std::size_t n) noexcept;

}  // namespace exa::model
