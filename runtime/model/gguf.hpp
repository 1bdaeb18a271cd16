#pragma once
// GGUF v3 reader: maps a file read-only and exposes its metadata and tensor
// directory. Every count, length, offset, shape and type is validated against
// the file size and fixed limits before use, so a truncated, corrupt or hostile
// file yields an error naming the problem (and the key or tensor) -- never a
// crash, a hang or a huge allocation.
//
// Layout (all little-endian): magic "GGUF", u32 version (2 or 3), u64 tensor
// count, u64 metadata count, metadata key/values, tensor infos, padding to
// `general.alignment` (default 32), tensor data.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/error.hpp"
#include "model/tensor_type.hpp"

namespace exa::model {

/// GGUF metadata value type ids as stored in files.
enum class gguf_value_type : std::uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
  string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};

/// An array value. Elements are stored by kind: integers (any width, any
/// signedness) widen to int64 (u64 values above INT64_MAX are rejected as
/// corrupt), floats to double, strings as strings. `elem_type` keeps the type
/// the file declared. Nested arrays are rejected (no standard key uses them).
struct gguf_array {
  gguf_value_type elem_type = gguf_value_type::u8;
  std::vector<std::int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  std::size_t size() const noexcept;
};

/// One metadata value: scalars widened as in arrays, plus bool, string, array.
struct gguf_value {
  gguf_value_type type = gguf_value_type::u8;
  std::variant<std::int64_t, double, bool, std::string, gguf_array> v;
};

struct gguf_kv {
  std::string key;
  gguf_value value;
};

/// One entry of the tensor directory. `shape` is ggml's `ne`: shape[0] is the
/// innermost, contiguous dimension (a weight of shape {in, out} is `out` rows of
/// `in` elements). `type_id` is the raw ggml type id; `type` is set only when
/// ExaServe can run that type.
struct gguf_tensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::uint32_t type_id = 0;
  std::optional<tensor_type> type;
  std::uint64_t offset = 0;      // relative to the start of the data section
  std::uint64_t size_bytes = 0;  // computed from shape and type
  const std::byte* data = nullptr;  // into the mapping; valid while the file lives

  std::uint64_t elements() const noexcept;
};

/// Limits that bound what a file may make us allocate or loop over.
struct gguf_limits {
  std::uint64_t max_tensors = 1u << 20;
  std::uint64_t max_kv = 1u << 20;
  std::uint64_t max_string_bytes = 1u << 24;     // one key or string value
  std::uint64_t max_array_elems = 1u << 24;      // one array value
  std::uint32_t max_dims = 4;
  std::uint64_t max_dim = std::uint64_t{1} << 40;
};

class gguf_file {
 public:
  /// Maps and parses `path`. Errors: io_error (open/map failed), corrupt_data
  /// (anything structurally wrong, message names the key/tensor and offset).
  static expected<gguf_file> open(const std::string& path, const gguf_limits& limits = {});

  /// Parses an in-memory image (tests, fuzzing). The bytes are copied.
  static expected<gguf_file> parse(std::span<const std::byte> bytes,
                                   const gguf_limits& limits = {});

  gguf_file(gguf_file&&) noexcept;
  gguf_file& operator=(gguf_file&&) noexcept;
  ~gguf_file();

  std::uint32_t version() const noexcept;
  std::uint64_t alignment() const noexcept;
  std::uint64_t file_size() const noexcept;
  const std::vector<gguf_kv>& metadata() const noexcept;
  const std::vector<gguf_tensor>& tensors() const noexcept;

  const gguf_value* find(std::string_view key) const noexcept;
  const gguf_tensor* find_tensor(std::string_view name) const noexcept;

  /// Typed lookups: not_found when absent, invalid_argument naming the key and
  /// both types when the stored type does not convert (integers convert to any
  /// integer type they fit; floats accept integers).
  expected<std::int64_t> get_int(std::string_view key) const;
  expected<double> get_float(std::string_view key) const;
  expected<bool> get_bool(std::string_view key) const;
  expected<std::string> get_string(std::string_view key) const;
  expected<const gguf_array*> get_array(std::string_view key) const;

 private:
  struct impl;
  explicit gguf_file(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace exa::model
