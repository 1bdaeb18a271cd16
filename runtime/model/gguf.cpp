#include "model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <new>

#include <fmt/format.h>

#include "common/assert.hpp"

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader copies little-endian fields as they are");

namespace exa::model {

namespace {

constexpr std::uint32_t gguf_magic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr std::uint64_t default_alignment = 32;
// Owned images (parse()) are aligned like a page-aligned mapping would be for
// any SIMD load, so tensor data behaves the same either way.
constexpr std::align_val_t owned_alignment{64};
// Smallest possible encodings, used to bound counts by the bytes left before
// anything is reserved: key length + type + a u8 value; name length + n_dims
// + one dim + type + offset.
constexpr std::uint64_t min_kv_bytes = 8 + 4 + 1;
constexpr std::uint64_t min_tensor_info_bytes = 8 + 4 + 8 + 4 + 8;

std::string_view value_type_name(gguf_value_type t) noexcept {
  switch (t) {
    case gguf_value_type::u8: return "u8";
    case gguf_value_type::i8: return "i8";
    case gguf_value_type::u16: return "u16";
    case gguf_value_type::i16: return "i16";
    case gguf_value_type::u32: return "u32";
    case gguf_value_type::i32: return "i32";
    case gguf_value_type::f32: return "f32";
    case gguf_value_type::boolean: return "bool";
    case gguf_value_type::string: return "string";
    case gguf_value_type::array: return "array";
    case gguf_value_type::u64: return "u64";
    case gguf_value_type::i64: return "i64";
    case gguf_value_type::f64: return "f64";
  }
  return "invalid";
}

bool valid_value_type(std::uint32_t t) noexcept {
  return t <= static_cast<std::uint32_t>(gguf_value_type::f64);
}

// Encoded size of a scalar; strings count only their length prefix.
std::uint64_t min_value_bytes(gguf_value_type t) noexcept {
  switch (t) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean: return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16: return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32: return 4;
    case gguf_value_type::string:
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64: return 8;
    case gguf_value_type::array: return 4 + 8;
  }
  return 1;
}

std::unexpected<error> corrupt(std::string message) {
  return make_error(errc::corrupt_data, std::move(message));
}

// Names the field being read, for error messages only: `format` is a fmt
// format string where {0} is `index` and {1} is `name`. It is formatted only
// when an error is reported, so a 100k-entry vocabulary formats nothing.
struct field {
  const char* format;
  std::uint64_t index = 0;
  std::string_view name = {};

  std::string str() const { return fmt::format(fmt::runtime(format), index, name); }
};

// A bounds-checked reader over the file image. Every read checks the bytes
// left first, so no field can make us read past the end.
class cursor {
 public:
  cursor(const std::byte* data, std::uint64_t size) : data_(data), size_(size) {}

  std::uint64_t pos() const noexcept { return pos_; }
  std::uint64_t left() const noexcept { return size_ - pos_; }

  template <class T>
  expected<T> read(const field& what, std::string_view prefix = {}) {
    if (left() < sizeof(T)) {
      return corrupt(fmt::format("truncated {}{} at offset {}: needs {} bytes, {} left", prefix,
                                 what.str(), pos_, sizeof(T), left()));
    }
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  expected<std::string> read_string(const gguf_limits& limits, const field& what) {
    const std::uint64_t start = pos_;
    auto len = read<std::uint64_t>(what, "length of ");
    if (!len) return std::unexpected(len.error());
    if (*len > limits.max_string_bytes) {
      return corrupt(fmt::format("string length {} at offset {} exceeds the limit of {} bytes ({})",
                                 *len, start, limits.max_string_bytes, what.str()));
    }
    if (*len > left()) {
      return corrupt(fmt::format("string length {} at offset {} exceeds the {} bytes left in the file ({})",
                                 *len, start, left(), what.str()));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(*len));
    pos_ += *len;
    return s;
  }

 private:
  const std::byte* data_;
  std::uint64_t size_;
  std::uint64_t pos_ = 0;
};

// One decoded scalar, before it lands in a gguf_value or an array.
using scalar = std::variant<std::int64_t, double, bool, std::string>;

template <class T>
expected<scalar> read_int(cursor& c, const field& what) {
  auto v = c.read<T>(what);
  if (!v) return std::unexpected(v.error());
  return scalar{static_cast<std::int64_t>(*v)};
}

expected<scalar> read_u64(cursor& c, const field& what) {
  const std::uint64_t at = c.pos();
  auto v = c.read<std::uint64_t>(what);
  if (!v) return std::unexpected(v.error());
  if (*v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return corrupt(fmt::format("u64 value {} at offset {} ({}) exceeds INT64_MAX", *v, at, what.str()));
  }
  return scalar{static_cast<std::int64_t>(*v)};
}

expected<scalar> read_bool(cursor& c, const field& what) {
  const std::uint64_t at = c.pos();
  auto v = c.read<std::uint8_t>(what);
  if (!v) return std::unexpected(v.error());
  if (*v > 1) {
    return corrupt(fmt::format("invalid bool byte 0x{:02x} at offset {} ({})", *v, at, what.str()));
  }
  return scalar{*v == 1};
}

expected<scalar> read_scalar(cursor& c, gguf_value_type t, const gguf_limits& limits,
                             const field& what) {
  switch (t) {
    case gguf_value_type::u8: return read_int<std::uint8_t>(c, what);
    case gguf_value_type::i8: return read_int<std::int8_t>(c, what);
    case gguf_value_type::u16: return read_int<std::uint16_t>(c, what);
    case gguf_value_type::i16: return read_int<std::int16_t>(c, what);
    case gguf_value_type::u32: return read_int<std::uint32_t>(c, what);
    case gguf_value_type::i32: return read_int<std::int32_t>(c, what);
    case gguf_value_type::i64: return read_int<std::int64_t>(c, what);
    case gguf_value_type::u64: return read_u64(c, what);
    case gguf_value_type::boolean: return read_bool(c, what);
    case gguf_value_type::f32: {
      auto v = c.read<float>(what);
      if (!v) return std::unexpected(v.error());
      return scalar{static_cast<double>(*v)};
    }
    case gguf_value_type::f64: {
      auto v = c.read<double>(what);
      if (!v) return std::unexpected(v.error());
      return scalar{*v};
    }
    case gguf_value_type::string: {
      auto v = c.read_string(limits, what);
      if (!v) return std::unexpected(v.error());
      return scalar{std::move(*v)};
    }
    case gguf_value_type::array: break;
  }
  EXA_ASSERT_MSG(false, "read_scalar called for a non-scalar type");
  return corrupt("unreachable");
}

// Reads a value type id and checks it is one GGUF defines.
expected<gguf_value_type> read_value_type(cursor& c, const field& what,
                                          std::string_view key) {
  const std::uint64_t at = c.pos();
  auto t = c.read<std::uint32_t>(what);
  if (!t) return std::unexpected(t.error());
  if (!valid_value_type(*t)) {
    return corrupt(fmt::format("unknown value type {} for key '{}' at offset {}", *t, key, at));
  }
  return static_cast<gguf_value_type>(*t);
}

void append_element(gguf_array& a, scalar&& s) {
  if (auto* i = std::get_if<std::int64_t>(&s)) {
    a.ints.push_back(*i);
  } else if (auto* d = std::get_if<double>(&s)) {
    a.floats.push_back(*d);
  } else if (auto* b = std::get_if<bool>(&s)) {
    a.ints.push_back(*b ? 1 : 0);  // bool arrays are stored as 0/1 integers
  } else {
    a.strings.push_back(std::move(std::get<std::string>(s)));
  }
}

void reserve_elements(gguf_array& a, std::uint64_t count) {
  const auto n = static_cast<std::size_t>(count);
  switch (a.elem_type) {
    case gguf_value_type::string: a.strings.reserve(n); break;
    case gguf_value_type::f32:
    case gguf_value_type::f64: a.floats.reserve(n); break;
    default: a.ints.reserve(n); break;
  }
}

expected<gguf_array> read_array(cursor& c, const std::string& key, const gguf_limits& limits) {
  const std::uint64_t at = c.pos();
  auto elem = read_value_type(c, field{"array element type of key '{1}'", 0, key}, key);
  if (!elem) return std::unexpected(elem.error());
  if (*elem == gguf_value_type::array) {
    return corrupt(fmt::format("nested array in key '{}' at offset {}", key, at));
  }
  const std::uint64_t count_at = c.pos();
  auto count = c.read<std::uint64_t>(field{"array count of key '{1}'", 0, key});
  if (!count) return std::unexpected(count.error());
  if (*count > limits.max_array_elems) {
    return corrupt(fmt::format("array count {} of key '{}' at offset {} exceeds the limit of {}",
                               *count, key, count_at, limits.max_array_elems));
  }
  if (*count > c.left() / min_value_bytes(*elem)) {
    return corrupt(fmt::format(
        "array count {} of key '{}' at offset {} exceeds what the {} bytes left in the file can hold",
        *count, key, count_at, c.left()));
  }
  gguf_array a;
  a.elem_type = *elem;
  reserve_elements(a, *count);
  for (std::uint64_t i = 0; i < *count; ++i) {
    auto s = read_scalar(c, *elem, limits, field{"element {0} of array '{1}'", i, key});
    if (!s) return std::unexpected(s.error());
    append_element(a, std::move(*s));
  }
  return a;
}

expected<gguf_value> read_value(cursor& c, const std::string& key, const gguf_limits& limits) {
  auto type = read_value_type(c, field{"value type of key '{1}'", 0, key}, key);
  if (!type) return std::unexpected(type.error());
  gguf_value v;
  v.type = *type;
  if (*type == gguf_value_type::array) {
    auto a = read_array(c, key, limits);
    if (!a) return std::unexpected(a.error());
    v.v = std::move(*a);
    return v;
  }
  auto s = read_scalar(c, *type, limits, field{"value of key '{1}'", 0, key});
  if (!s) return std::unexpected(s.error());
  std::visit([&v](auto&& x) { v.v = std::move(x); }, std::move(*s));
  return v;
}

struct aligned_delete {
  void operator()(std::byte* p) const noexcept { ::operator delete[](p, owned_alignment); }
};

std::uint64_t checked_align_up(std::uint64_t x, std::uint64_t a, bool& overflow) noexcept {
  std::uint64_t r = 0;
  overflow = __builtin_add_overflow(x, a - 1, &r);
  return r & ~(a - 1);
}

}  // namespace

std::size_t gguf_array::size() const noexcept {
  return ints.size() + floats.size() + strings.size();
}

std::uint64_t gguf_tensor::elements() const noexcept {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;  // the reader checked this cannot overflow
  return n;
}

struct gguf_file::impl {
  // Exactly one of these holds the bytes: a read-only mapping or an owned copy.
  void* map_base = nullptr;
  std::size_t map_size = 0;
  std::unique_ptr<std::byte[], aligned_delete> owned;

  const std::byte* data = nullptr;
  std::uint64_t size = 0;
  std::uint32_t version = 0;
  std::uint64_t alignment = default_alignment;
  std::vector<gguf_kv> kv;
  std::vector<gguf_tensor> tensors;
  std::map<std::string, std::size_t, std::less<>> kv_index;
  std::map<std::string, std::size_t, std::less<>> tensor_index;

  impl() = default;
  impl(const impl&) = delete;
  impl& operator=(const impl&) = delete;
  ~impl() {
    if (map_base != nullptr) ::munmap(map_base, map_size);
  }

  expected<void> parse(const gguf_limits& limits);
  expected<void> parse_header(cursor& c, const gguf_limits& limits, std::uint64_t& n_tensors,
                              std::uint64_t& n_kv);
  expected<void> parse_kv(cursor& c, std::uint64_t n_kv, const gguf_limits& limits);
  expected<void> read_alignment();
  expected<void> parse_tensor_info(cursor& c, std::uint64_t index, const gguf_limits& limits);
  expected<void> place_tensors(std::uint64_t data_start);
};

expected<void> gguf_file::impl::parse_header(cursor& c, const gguf_limits& limits,
                                             std::uint64_t& n_tensors, std::uint64_t& n_kv) {
  auto magic = c.read<std::uint32_t>(field{"header (magic)"});
  if (!magic) return std::unexpected(magic.error());
  if (*magic != gguf_magic) {
    const std::uint32_t m = *magic;
    return corrupt(fmt::format("wrong magic {:02x} {:02x} {:02x} {:02x} at offset 0; expected "
                               "47 47 55 46 (\"GGUF\")",
                               m & 0xff, (m >> 8) & 0xff, (m >> 16) & 0xff, m >> 24));
  }
  auto ver = c.read<std::uint32_t>(field{"header (version)"});
  if (!ver) return std::unexpected(ver.error());
  if (*ver != 2 && *ver != 3) {
    return corrupt(fmt::format("unsupported GGUF version {} at offset 4; supported: 2, 3", *ver));
  }
  version = *ver;
  auto nt = c.read<std::uint64_t>(field{"header (tensor count)"});
  if (!nt) return std::unexpected(nt.error());
  auto nk = c.read<std::uint64_t>(field{"header (metadata count)"});
  if (!nk) return std::unexpected(nk.error());
  if (*nt > limits.max_tensors) {
    return corrupt(fmt::format("tensor count {} at offset 8 exceeds the limit of {}", *nt,
                               limits.max_tensors));
  }
  if (*nk > limits.max_kv) {
    return corrupt(fmt::format("metadata count {} at offset 16 exceeds the limit of {}", *nk,
                               limits.max_kv));
  }
  // Both counts are at most 2^20-ish here, so these products cannot overflow.
  if (*nt * min_tensor_info_bytes + *nk * min_kv_bytes > c.left()) {
    return corrupt(fmt::format(
        "tensor count {} and metadata count {} cannot fit in the {} bytes left after the header",
        *nt, *nk, c.left()));
  }
  n_tensors = *nt;
  n_kv = *nk;
  return {};
}

expected<void> gguf_file::impl::parse_kv(cursor& c, std::uint64_t n_kv,
                                         const gguf_limits& limits) {
  kv.reserve(static_cast<std::size_t>(n_kv));
  for (std::uint64_t i = 0; i < n_kv; ++i) {
    const std::uint64_t at = c.pos();
    auto key = c.read_string(limits, field{"key of metadata entry {0}", i});
    if (!key) return std::unexpected(key.error());
    if (kv_index.contains(*key)) {
      return corrupt(fmt::format("duplicate key '{}' at offset {}", *key, at));
    }
    auto value = read_value(c, *key, limits);
    if (!value) return std::unexpected(value.error());
    kv_index.emplace(*key, kv.size());
    kv.push_back(gguf_kv{std::move(*key), std::move(*value)});
  }
  return {};
}

expected<void> gguf_file::impl::read_alignment() {
  auto it = kv_index.find(std::string_view{"general.alignment"});
  if (it == kv_index.end()) return {};
  const gguf_value& v = kv[it->second].value;
  if (v.type != gguf_value_type::u32) {
    return corrupt(fmt::format("general.alignment has type {}, expected u32",
                               value_type_name(v.type)));
  }
  const auto a = static_cast<std::uint64_t>(std::get<std::int64_t>(v.v));
  if (!std::has_single_bit(a)) {
    return corrupt(fmt::format("general.alignment {} is not a nonzero power of two", a));
  }
  alignment = a;
  return {};
}

expected<void> gguf_file::impl::parse_tensor_info(cursor& c, std::uint64_t index,
                                                  const gguf_limits& limits) {
  const std::uint64_t at = c.pos();
  auto name = c.read_string(limits, field{"name of tensor {0}", index});
  if (!name) return std::unexpected(name.error());
  if (tensor_index.contains(*name)) {
    return corrupt(fmt::format("duplicate tensor name '{}' at offset {}", *name, at));
  }
  const field what{"tensor info '{1}'", 0, *name};
  const std::uint64_t dims_at = c.pos();
  auto n_dims = c.read<std::uint32_t>(what);
  if (!n_dims) return std::unexpected(n_dims.error());
  if (*n_dims == 0 || *n_dims > limits.max_dims) {
    return corrupt(fmt::format("tensor '{}' has n_dims {} at offset {}; expected 1..{}", *name,
                               *n_dims, dims_at, limits.max_dims));
  }
  gguf_tensor t;
  t.shape.reserve(*n_dims);
  std::uint64_t elems = 1;
  for (std::uint32_t d = 0; d < *n_dims; ++d) {
    const std::uint64_t dim_at = c.pos();
    auto dim = c.read<std::uint64_t>(what);
    if (!dim) return std::unexpected(dim.error());
    if (*dim == 0 || *dim > limits.max_dim) {
      return corrupt(fmt::format("tensor '{}' dimension {} is {} at offset {}; expected 1..{}",
                                 *name, d, *dim, dim_at, limits.max_dim));
    }
    if (__builtin_mul_overflow(elems, *dim, &elems)) {
      return corrupt(fmt::format("tensor '{}' element count overflows 64 bits", *name));
    }
    t.shape.push_back(*dim);
  }
  auto type_id = c.read<std::uint32_t>(what);
  if (!type_id) return std::unexpected(type_id.error());
  const ggml_type_traits* info = ggml_type_info(*type_id);
  if (info == nullptr) {
    return corrupt(fmt::format("tensor '{}' has unknown type id {}", *name, *type_id));
  }
  if (t.shape[0] % info->block_elems != 0) {
    return corrupt(fmt::format(
        "tensor '{}' innermost dimension {} is not a multiple of the {} block size {}", *name,
        t.shape[0], info->name, info->block_elems));
  }
  if (__builtin_mul_overflow(elems / info->block_elems, info->block_bytes, &t.size_bytes)) {
    return corrupt(fmt::format("tensor '{}' size in bytes overflows 64 bits", *name));
  }
  auto offset = c.read<std::uint64_t>(what);
  if (!offset) return std::unexpected(offset.error());
  t.type_id = *type_id;
  t.type = tensor_type_from_id(*type_id);
  t.offset = *offset;
  tensor_index.emplace(*name, tensors.size());
  t.name = std::move(*name);
  tensors.push_back(std::move(t));
  return {};
}

expected<void> gguf_file::impl::place_tensors(std::uint64_t data_start) {
  for (gguf_tensor& t : tensors) {
    if (t.offset % alignment != 0) {
      return corrupt(fmt::format("tensor '{}' offset {} is not a multiple of the alignment {}",
                                 t.name, t.offset, alignment));
    }
    std::uint64_t begin = 0;
    std::uint64_t end = 0;
    if (__builtin_add_overflow(data_start, t.offset, &begin) ||
        __builtin_add_overflow(begin, t.size_bytes, &end)) {
      return corrupt(fmt::format("tensor '{}' data offset {} + {} bytes overflows 64 bits",
                                 t.name, t.offset, t.size_bytes));
    }
    if (end > size) {
      return corrupt(fmt::format("tensor '{}' data [{}, {}) extends past end of file (size {})",
                                 t.name, begin, end, size));
    }
    t.data = data + begin;
  }
  // Sorted by offset, a tensor can only overlap the one that follows it.
  std::vector<const gguf_tensor*> order;
  order.reserve(tensors.size());
  for (const gguf_tensor& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const gguf_tensor* a, const gguf_tensor* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    const gguf_tensor& a = *order[i - 1];
    const gguf_tensor& b = *order[i];
    if (a.offset + a.size_bytes > b.offset) {
      return corrupt(fmt::format("tensors '{}' and '{}' overlap: [{}, {}) and [{}, {})", a.name,
                                 b.name, a.offset, a.offset + a.size_bytes, b.offset,
                                 b.offset + b.size_bytes));
    }
  }
  return {};
}

expected<void> gguf_file::impl::parse(const gguf_limits& limits) {
  if (size == 0) return corrupt("file is empty");
  cursor c(data, size);
  std::uint64_t n_tensors = 0;
  std::uint64_t n_kv = 0;
  if (auto r = parse_header(c, limits, n_tensors, n_kv); !r) return r;
  if (auto r = parse_kv(c, n_kv, limits); !r) return r;
  if (auto r = read_alignment(); !r) return r;
  // The header check bounds n_tensors by the bytes left, so this is small.
  tensors.reserve(static_cast<std::size_t>(n_tensors));
  for (std::uint64_t i = 0; i < n_tensors; ++i) {
    if (auto r = parse_tensor_info(c, i, limits); !r) return r;
  }
  bool overflow = false;
  const std::uint64_t data_start = checked_align_up(c.pos(), alignment, overflow);
  if (overflow) {
    return corrupt(fmt::format("data section start overflows with alignment {}", alignment));
  }
  return place_tensors(data_start);
}

gguf_file::gguf_file(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
gguf_file::gguf_file(gguf_file&&) noexcept = default;
gguf_file& gguf_file::operator=(gguf_file&&) noexcept = default;
gguf_file::~gguf_file() = default;

expected<gguf_file> gguf_file::open(const std::string& path, const gguf_limits& limits) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(errc::io_error, fmt::format("open '{}': {}", path, std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return make_error(errc::io_error, fmt::format("fstat '{}': {}", path, std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(errc::io_error, fmt::format("'{}' is not a regular file", path));
  }
  auto p = std::make_unique<impl>();
  p->size = static_cast<std::uint64_t>(st.st_size);
  if (p->size == 0) {
    ::close(fd);
    return corrupt(fmt::format("'{}': file is empty", path));
  }
  void* base = ::mmap(nullptr, static_cast<std::size_t>(p->size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (base == MAP_FAILED) {
    return make_error(errc::io_error, fmt::format("mmap '{}': {}", path, std::strerror(e)));
  }
  p->map_base = base;
  p->map_size = static_cast<std::size_t>(p->size);
  p->data = static_cast<const std::byte*>(base);
  if (auto r = p->parse(limits); !r) {
    return corrupt(fmt::format("'{}': {}", path, r.error().message));
  }
  return gguf_file(std::move(p));
}

expected<gguf_file> gguf_file::parse(std::span<const std::byte> bytes, const gguf_limits& limits) {
  auto p = std::make_unique<impl>();
  p->owned.reset(new (owned_alignment) std::byte[bytes.size() == 0 ? 1 : bytes.size()]);
  if (!bytes.empty()) std::memcpy(p->owned.get(), bytes.data(), bytes.size());
  p->data = p->owned.get();
  p->size = bytes.size();
  if (auto r = p->parse(limits); !r) return std::unexpected(r.error());
  return gguf_file(std::move(p));
}

std::uint32_t gguf_file::version() const noexcept { return impl_->version; }
std::uint64_t gguf_file::alignment() const noexcept { return impl_->alignment; }
std::uint64_t gguf_file::file_size() const noexcept { return impl_->size; }
const std::vector<gguf_kv>& gguf_file::metadata() const noexcept { return impl_->kv; }
const std::vector<gguf_tensor>& gguf_file::tensors() const noexcept { return impl_->tensors; }

const gguf_value* gguf_file::find(std::string_view key) const noexcept {
  auto it = impl_->kv_index.find(key);
  return it == impl_->kv_index.end() ? nullptr : &impl_->kv[it->second].value;
}

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const noexcept {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

namespace {

std::unexpected<error> wrong_type(std::string_view key, gguf_value_type have,
                                  std::string_view want) {
  return make_error(errc::invalid_argument,
                    fmt::format("key '{}' has type {}, expected {}", key,
                                value_type_name(have), want));
}

std::unexpected<error> missing_key(std::string_view key) {
  return make_error(errc::not_found, fmt::format("missing key '{}'", key));
}

}  // namespace

expected<std::int64_t> gguf_file::get_int(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* i = std::get_if<std::int64_t>(&v->v)) return *i;
  return wrong_type(key, v->type, "an integer");
}

expected<double> gguf_file::get_float(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* d = std::get_if<double>(&v->v)) return *d;
  if (const auto* i = std::get_if<std::int64_t>(&v->v)) return static_cast<double>(*i);
  return wrong_type(key, v->type, "a number");
}

expected<bool> gguf_file::get_bool(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* b = std::get_if<bool>(&v->v)) return *b;
  return wrong_type(key, v->type, "bool");
}

expected<std::string> gguf_file::get_string(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* s = std::get_if<std::string>(&v->v)) return *s;
  return wrong_type(key, v->type, "string");
}

expected<const gguf_array*> gguf_file::get_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* a = std::get_if<gguf_array>(&v->v)) return a;
  return wrong_type(key, v->type, "array");
}

}  // namespace exa::model
