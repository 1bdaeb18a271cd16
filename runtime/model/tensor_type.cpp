#include "model/tensor_type.hpp"

#include <array>

#include "common/assert.hpp"

namespace exa::model {

namespace {

// Indexed by ggml type id. Ids 4, 5 (q4_2, q4_3), 31..33 and 36..38 (the
// removed interleaved q4_0/iq4_nl variants) are gone from ggml: a file using
// them is corrupt, so their entries stay empty (block_elems == 0).
constexpr std::size_t type_id_count = 40;

constexpr std::array<ggml_type_traits, type_id_count> make_type_table() {
  std::array<ggml_type_traits, type_id_count> t{};
  t[0] = {"f32", 1, 4};
  t[1] = {"f16", 1, 2};
  t[2] = {"q4_0", 32, 18};
  t[3] = {"q4_1", 32, 20};
  t[6] = {"q5_0", 32, 22};
  t[7] = {"q5_1", 32, 24};
  t[8] = {"q8_0", 32, 34};
  t[9] = {"q8_1", 32, 36};
  t[10] = {"q2_K", 256, 84};
  t[11] = {"q3_K", 256, 110};
  t[12] = {"q4_K", 256, 144};
  t[13] = {"q5_K", 256, 176};
  t[14] = {"q6_K", 256, 210};
  t[15] = {"q8_K", 256, 292};
  t[16] = {"iq2_xxs", 256, 66};
  t[17] = {"iq2_xs", 256, 74};
  t[18] = {"iq3_xxs", 256, 98};
  t[19] = {"iq1_s", 256, 50};
  t[20] = {"iq4_nl", 32, 18};
  t[21] = {"iq3_s", 256, 110};
  t[22] = {"iq2_s", 256, 82};
  t[23] = {"iq4_xs", 256, 136};
  t[24] = {"i8", 1, 1};
  t[25] = {"i16", 1, 2};
  t[26] = {"i32", 1, 4};
  t[27] = {"i64", 1, 8};
  t[28] = {"f64", 1, 8};
  t[29] = {"iq1_m", 256, 56};
  t[30] = {"bf16", 1, 2};
  t[34] = {"tq1_0", 256, 54};
  t[35] = {"tq2_0", 256, 66};
  t[39] = {"mxfp4", 32, 17};
  return t;
}

constexpr auto type_table = make_type_table();

constexpr std::array<tensor_type, 11> runnable_types = {
    tensor_type::f32,  tensor_type::f16,  tensor_type::bf16, tensor_type::q8_0,
    tensor_type::q4_0, tensor_type::q4_1, tensor_type::q5_0, tensor_type::q5_1,
    tensor_type::q4_K, tensor_type::q5_K, tensor_type::q6_K};

char ascii_lower(char c) noexcept { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

const ggml_type_traits& runnable_traits(tensor_type t) noexcept {
  const ggml_type_traits* info = ggml_type_info(static_cast<std::uint32_t>(t));
  EXA_ASSERT_MSG(info != nullptr, "tensor_type value outside the enum");
  return *info;
}

}  // namespace

const ggml_type_traits* ggml_type_info(std::uint32_t id) noexcept {
  if (id >= type_table.size() || type_table[id].block_elems == 0) return nullptr;
  return &type_table[id];
}

std::optional<tensor_type> tensor_type_from_id(std::uint32_t id) noexcept {
  for (tensor_type t : runnable_types) {
    if (static_cast<std::uint32_t>(t) == id) return t;
  }
  return std::nullopt;
}

std::string_view to_string(tensor_type t) noexcept {
  const ggml_type_traits* info = ggml_type_info(static_cast<std::uint32_t>(t));
  return info != nullptr ? info->name : std::string_view{"invalid"};
}

std::optional<tensor_type> tensor_type_from_string(std::string_view s) noexcept {
  for (tensor_type t : runnable_types) {
    if (iequals(s, to_string(t))) return t;
  }
  return std::nullopt;
}

std::size_t block_elems(tensor_type t) noexcept { return runnable_traits(t).block_elems; }

bool has_block_min(tensor_type t) noexcept {
  return t == tensor_type::q4_1 || t == tensor_type::q5_1 || t == tensor_type::q4_K || t == tensor_type::q5_K;
}

std::size_t block_bytes(tensor_type t) noexcept { return runnable_traits(t).block_bytes; }

std::size_t row_bytes(tensor_type t, std::size_t n) noexcept {
  const ggml_type_traits& info = runnable_traits(t);
  EXA_ASSERT_MSG(n % info.block_elems == 0, "row length is not a whole number of blocks");
  return n / info.block_elems * info.block_bytes;
}

}  // namespace exa::model
