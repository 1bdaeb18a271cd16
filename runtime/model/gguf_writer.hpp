#pragma once
// GGUF v3 writer: collects metadata and tensors, then writes a file that the
// reader (and llama.cpp / gguf-py) accept. Tensor data is appended aligned to
// `general.alignment` (32).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "model/gguf.hpp"

namespace exa::model {

class gguf_writer {
 public:
  /// Fills a tensor's bytes (exactly its size) when the file is written.
  using tensor_fill = std::function<void(std::span<std::byte> out)>;

  // Adding a key twice is a caller bug (asserted). `general.alignment` is added
  // as u32 32 unless the caller adds it (then it must be a power of two).
  void add_u8(std::string key, std::uint8_t v);
  void add_i8(std::string key, std::int8_t v);
  void add_u16(std::string key, std::uint16_t v);
  void add_i16(std::string key, std::int16_t v);
  void add_u32(std::string key, std::uint32_t v);
  void add_i32(std::string key, std::int32_t v);
  void add_u64(std::string key, std::uint64_t v);
  void add_i64(std::string key, std::int64_t v);
  void add_f32(std::string key, float v);
  void add_f64(std::string key, double v);
  void add_bool(std::string key, bool v);
  void add_string(std::string key, std::string v);
  void add_string_array(std::string key, std::vector<std::string> v);
  void add_f32_array(std::string key, std::vector<float> v);
  void add_i32_array(std::string key, std::vector<std::int32_t> v);

  /// Adds a tensor whose bytes are already in `type`'s layout. `shape` is ggml's
  /// ne (innermost first). The bytes are copied. A size that does not match the
  /// shape, or a duplicate name, is a caller bug (asserted).
  void add_tensor(std::string name, std::vector<std::uint64_t> shape, tensor_type type,
                  std::span<const std::byte> bytes);
  /// As above, taking ownership of the bytes instead of copying them.
  void add_tensor(std::string name, std::vector<std::uint64_t> shape, tensor_type type,
                  std::vector<std::byte>&& bytes);
  /// As above for any ggml type id (`ggml_type_info` must know it), so tests
  /// can write tensors of types the engine does not run.
  void add_tensor_raw(std::string name, std::vector<std::uint64_t> shape, std::uint32_t type_id,
                      std::span<const std::byte> bytes);
  /// Adds a tensor whose bytes `fill` produces during serialize()/write(), so
  /// a generator never holds more than one tensor in memory.
  void add_tensor_fill(std::string name, std::vector<std::uint64_t> shape, tensor_type type,
                       tensor_fill fill);

  /// Serializes everything into one buffer.
  std::vector<std::byte> serialize() const;

  /// Writes to `path` atomically (a temporary file renamed into place).
  /// Errors: io_error naming the path and the OS error.
  expected<void> write(const std::string& path) const;

 private:
  struct entry {
    std::string key;
    gguf_value_type type;
    std::vector<std::byte> payload;  // encoded value, without key and type
  };
  struct tensor {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::uint32_t type_id = 0;
    std::uint64_t size_bytes = 0;
    std::vector<std::byte> bytes;  // empty when `fill` produces them
    tensor_fill fill;
  };

  void add_entry(std::string key, gguf_value_type type, std::vector<std::byte> payload);
  void add_tensor_entry(tensor t);
  std::uint64_t alignment() const;
  std::vector<std::byte> serialize_header() const;
  void tensor_bytes(const tensor& t, std::span<std::byte> out) const;

  std::vector<entry> kv_;
  std::vector<tensor> tensors_;
};

}  // namespace exa::model
