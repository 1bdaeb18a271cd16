#include "model/gguf_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "common/assert.hpp"

static_assert(std::endian::native == std::endian::little,
              "the GGUF writer copies little-endian fields as they are");

namespace exa::model {

namespace {

constexpr std::uint32_t gguf_magic = 0x46554747;  // "GGUF"
constexpr std::uint32_t gguf_version = 3;
constexpr std::uint32_t default_alignment = 32;
constexpr std::string_view alignment_key = "general.alignment";

template <class T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

void put_string(std::vector<std::byte>& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

template <class T>
std::vector<std::byte> scalar_payload(T v) {
  std::vector<std::byte> out;
  put<T>(out, v);
  return out;
}

template <class T>
std::vector<std::byte> array_payload(gguf_value_type elem, const std::vector<T>& v) {
  std::vector<std::byte> out;
  out.reserve(4 + 8 + v.size() * sizeof(T));
  put<std::uint32_t>(out, static_cast<std::uint32_t>(elem));
  put<std::uint64_t>(out, v.size());
  for (const T& x : v) put<T>(out, x);
  return out;
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

std::uint64_t tensor_size(const std::vector<std::uint64_t>& shape, std::uint32_t type_id) {
  const ggml_type_traits* info = ggml_type_info(type_id);
  EXA_ASSERT_MSG(info != nullptr, "tensor type id unknown to ggml");
  EXA_ASSERT_MSG(!shape.empty() && shape.size() <= 4, "tensor must have 1..4 dimensions");
  EXA_ASSERT_MSG(shape[0] % info->block_elems == 0, "row is not a whole number of blocks");
  std::uint64_t size = shape[0] / info->block_elems * info->block_bytes;
  for (std::size_t i = 1; i < shape.size(); ++i) {
    EXA_ASSERT_MSG(shape[i] > 0, "tensor dimension is zero");
    size *= shape[i];
  }
  return size;
}

// write(2) until done; false (errno set) on failure.
bool write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

void gguf_writer::add_entry(std::string key, gguf_value_type type,
                            std::vector<std::byte> payload) {
  for (const entry& e : kv_) EXA_ASSERT_MSG(e.key != key, "metadata key added twice");
  if (key == alignment_key) {
    EXA_ASSERT_MSG(type == gguf_value_type::u32, "general.alignment must be u32");
    std::uint32_t a = 0;
    std::memcpy(&a, payload.data(), sizeof a);
    EXA_ASSERT_MSG(std::has_single_bit(a), "general.alignment must be a power of two");
  }
  kv_.push_back(entry{std::move(key), type, std::move(payload)});
}

void gguf_writer::add_u8(std::string key, std::uint8_t v) {
  add_entry(std::move(key), gguf_value_type::u8, scalar_payload(v));
}
void gguf_writer::add_i8(std::string key, std::int8_t v) {
  add_entry(std::move(key), gguf_value_type::i8, scalar_payload(v));
}
void gguf_writer::add_u16(std::string key, std::uint16_t v) {
  add_entry(std::move(key), gguf_value_type::u16, scalar_payload(v));
}
void gguf_writer::add_i16(std::string key, std::int16_t v) {
  add_entry(std::move(key), gguf_value_type::i16, scalar_payload(v));
}
void gguf_writer::add_u32(std::string key, std::uint32_t v) {
  add_entry(std::move(key), gguf_value_type::u32, scalar_payload(v));
}
void gguf_writer::add_i32(std::string key, std::int32_t v) {
  add_entry(std::move(key), gguf_value_type::i32, scalar_payload(v));
}
void gguf_writer::add_u64(std::string key, std::uint64_t v) {
  add_entry(std::move(key), gguf_value_type::u64, scalar_payload(v));
}
void gguf_writer::add_i64(std::string key, std::int64_t v) {
  add_entry(std::move(key), gguf_value_type::i64, scalar_payload(v));
}
void gguf_writer::add_f32(std::string key, float v) {
  add_entry(std::move(key), gguf_value_type::f32, scalar_payload(v));
}
void gguf_writer::add_f64(std::string key, double v) {
  add_entry(std::move(key), gguf_value_type::f64, scalar_payload(v));
}
void gguf_writer::add_bool(std::string key, bool v) {
  add_entry(std::move(key), gguf_value_type::boolean,
            scalar_payload(static_cast<std::uint8_t>(v ? 1 : 0)));
}
void gguf_writer::add_string(std::string key, std::string v) {
  std::vector<std::byte> payload;
  put_string(payload, v);
  add_entry(std::move(key), gguf_value_type::string, std::move(payload));
}

void gguf_writer::add_string_array(std::string key, std::vector<std::string> v) {
  std::vector<std::byte> payload;
  std::size_t bytes = 4 + 8;
  for (const std::string& s : v) bytes += 8 + s.size();
  payload.reserve(bytes);
  put<std::uint32_t>(payload, static_cast<std::uint32_t>(gguf_value_type::string));
  put<std::uint64_t>(payload, v.size());
  for (const std::string& s : v) put_string(payload, s);
  add_entry(std::move(key), gguf_value_type::array, std::move(payload));
}

void gguf_writer::add_f32_array(std::string key, std::vector<float> v) {
  add_entry(std::move(key), gguf_value_type::array, array_payload(gguf_value_type::f32, v));
}

void gguf_writer::add_i32_array(std::string key, std::vector<std::int32_t> v) {
  add_entry(std::move(key), gguf_value_type::array, array_payload(gguf_value_type::i32, v));
}

void gguf_writer::add_tensor_entry(tensor t) {
  for (const tensor& x : tensors_) EXA_ASSERT_MSG(x.name != t.name, "tensor added twice");
  t.size_bytes = tensor_size(t.shape, t.type_id);
  if (!t.fill) {
    EXA_ASSERT_MSG(t.bytes.size() == t.size_bytes, "tensor bytes do not match its shape and type");
  }
  tensors_.push_back(std::move(t));
}

void gguf_writer::add_tensor(std::string name, std::vector<std::uint64_t> shape, tensor_type type,
                             std::span<const std::byte> bytes) {
  add_tensor_raw(std::move(name), std::move(shape), static_cast<std::uint32_t>(type), bytes);
}

void gguf_writer::add_tensor(std::string name, std::vector<std::uint64_t> shape, tensor_type type,
                             std::vector<std::byte>&& bytes) {
  add_tensor_entry(tensor{std::move(name), std::move(shape), static_cast<std::uint32_t>(type), 0,
                          std::move(bytes), {}});
}

void gguf_writer::add_tensor_raw(std::string name, std::vector<std::uint64_t> shape,
                                 std::uint32_t type_id, std::span<const std::byte> bytes) {
  add_tensor_entry(tensor{std::move(name), std::move(shape), type_id, 0,
                          std::vector<std::byte>(bytes.begin(), bytes.end()), {}});
}

void gguf_writer::add_tensor_fill(std::string name, std::vector<std::uint64_t> shape,
                                  tensor_type type, tensor_fill fill) {
  EXA_ASSERT_MSG(static_cast<bool>(fill), "tensor fill function is empty");
  add_tensor_entry(tensor{std::move(name), std::move(shape), static_cast<std::uint32_t>(type), 0,
                          {}, std::move(fill)});
}

std::uint64_t gguf_writer::alignment() const {
  for (const entry& e : kv_) {
    if (e.key == alignment_key) {
      std::uint32_t a = 0;
      std::memcpy(&a, e.payload.data(), sizeof a);
      return a;
    }
  }
  return default_alignment;
}

// Everything before the data section, padded so the data starts aligned.
std::vector<std::byte> gguf_writer::serialize_header() const {
  const bool add_alignment = std::none_of(kv_.begin(), kv_.end(),
                                          [](const entry& e) { return e.key == alignment_key; });
  const std::uint64_t align = alignment();
  std::vector<std::byte> out;
  put<std::uint32_t>(out, gguf_magic);
  put<std::uint32_t>(out, gguf_version);
  put<std::uint64_t>(out, tensors_.size());
  put<std::uint64_t>(out, kv_.size() + (add_alignment ? 1 : 0));
  for (const entry& e : kv_) {
    put_string(out, e.key);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(e.type));
    out.insert(out.end(), e.payload.begin(), e.payload.end());
  }
  if (add_alignment) {
    put_string(out, alignment_key);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(gguf_value_type::u32));
    put<std::uint32_t>(out, default_alignment);
  }
  std::uint64_t offset = 0;
  for (const tensor& t : tensors_) {
    put_string(out, t.name);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(t.shape.size()));
    for (std::uint64_t d : t.shape) put<std::uint64_t>(out, d);
    put<std::uint32_t>(out, t.type_id);
    put<std::uint64_t>(out, offset);
    offset = align_up(offset + t.size_bytes, align);
  }
  out.resize(align_up(out.size(), align), std::byte{0});
  return out;
}

void gguf_writer::tensor_bytes(const tensor& t, std::span<std::byte> out) const {
  EXA_ASSERT(out.size() == t.size_bytes);
  if (t.fill) {
    t.fill(out);
  } else {
    std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  }
}

std::vector<std::byte> gguf_writer::serialize() const {
  const std::uint64_t align = alignment();
  std::vector<std::byte> out = serialize_header();
  for (const tensor& t : tensors_) {
    const std::size_t at = out.size();
    out.resize(align_up(at + t.size_bytes, align), std::byte{0});
    tensor_bytes(t, std::span<std::byte>(out.data() + at, t.size_bytes));
  }
  return out;
}

expected<void> gguf_writer::write(const std::string& path) const {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return make_error(errc::io_error, fmt::format("create '{}': {}", tmp, std::strerror(errno)));
  }
  auto fail = [&](std::string_view what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return make_error(errc::io_error, fmt::format("{} '{}': {}", what, tmp, std::strerror(e)));
  };
  const std::uint64_t align = alignment();
  if (!write_all(fd, serialize_header())) return fail("write");
  // One scratch buffer, sized for the largest tensor, holds each tensor's
  // bytes and padding in turn, so memory stays bounded by one tensor.
  std::vector<std::byte> scratch;
  for (const tensor& t : tensors_) {
    scratch.assign(align_up(t.size_bytes, align), std::byte{0});
    tensor_bytes(t, std::span<std::byte>(scratch.data(), t.size_bytes));
    if (!write_all(fd, scratch)) return fail("write");
  }
  // No fsync: rename makes the file appear whole or not at all, which is what
  // readers need; durability across power loss is not a goal for model files.
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return make_error(errc::io_error, fmt::format("close '{}': {}", tmp, std::strerror(e)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return make_error(errc::io_error,
                      fmt::format("rename '{}' to '{}': {}", tmp, path, std::strerror(e)));
  }
  return {};
}

}  // namespace exa::model
