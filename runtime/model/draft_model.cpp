#include "model/draft_model.hpp"

#include <charconv>
#include <span>
#include <string_view>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"

namespace exa::model {
namespace {

// The block index of a "blk.N.*" tensor name; -1 for other tensors.
long block_of(std::string_view name) {
  if (!name.starts_with("blk.")) return -1;
  name.remove_prefix(4);
  long n = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  return ec == std::errc{} && end != name.data() + name.size() && *end == '.' ? n : -1;
}

expected<void> copy_array(gguf_writer& w, const std::string& key, const gguf_array& a) {
  switch (a.elem_type) {
    case gguf_value_type::string:
      w.add_string_array(key, a.strings);
      return {};
    case gguf_value_type::f32:
    case gguf_value_type::f64: {
      w.add_f32_array(key, std::vector<float>(a.floats.begin(), a.floats.end()));
      return {};
    }
    case gguf_value_type::i32: {
      w.add_i32_array(key, std::vector<std::int32_t>(a.ints.begin(), a.ints.end()));
      return {};
    }
    default:
      return make_error(errc::unsupported, "cannot copy metadata array '" + key + "' of element type " +
                                               std::to_string(static_cast<std::uint32_t>(a.elem_type)));
  }
}

expected<void> copy_value(gguf_writer& w, const std::string& key, const gguf_value& v) {
  const auto i = [&] { return std::get<std::int64_t>(v.v); };
  switch (v.type) {
    case gguf_value_type::u8: w.add_u8(key, static_cast<std::uint8_t>(i())); break;
    case gguf_value_type::i8: w.add_i8(key, static_cast<std::int8_t>(i())); break;
    case gguf_value_type::u16: w.add_u16(key, static_cast<std::uint16_t>(i())); break;
    case gguf_value_type::i16: w.add_i16(key, static_cast<std::int16_t>(i())); break;
    case gguf_value_type::u32: w.add_u32(key, static_cast<std::uint32_t>(i())); break;
    case gguf_value_type::i32: w.add_i32(key, static_cast<std::int32_t>(i())); break;
    case gguf_value_type::u64: w.add_u64(key, static_cast<std::uint64_t>(i())); break;
    case gguf_value_type::i64: w.add_i64(key, i()); break;
    case gguf_value_type::f32: w.add_f32(key, static_cast<float>(std::get<double>(v.v))); break;
    case gguf_value_type::f64: w.add_f64(key, std::get<double>(v.v)); break;
    case gguf_value_type::boolean: w.add_bool(key, std::get<bool>(v.v)); break;
    case gguf_value_type::string: w.add_string(key, std::get<std::string>(v.v)); break;
    case gguf_value_type::array: return copy_array(w, key, std::get<gguf_array>(v.v));
  }
  return {};
}

}  // namespace

expected<void> derive_draft(const std::string& target_path, std::uint32_t layers, const std::string& out_path) {
  auto file = gguf_file::open(target_path);
  if (!file) return std::unexpected(file.error());
  auto arch = file->get_string("general.architecture");
  if (!arch) return std::unexpected(arch.error());
  const std::string count_key = *arch + ".block_count";
  auto blocks = file->get_int(count_key);
  if (!blocks) return std::unexpected(blocks.error());
  if (layers == 0 || layers >= *blocks)
    return make_error(errc::invalid_argument, "a draft of " + target_path + " needs 1 to " +
                                                  std::to_string(*blocks - 1) + " layers (it has " +
                                                  std::to_string(*blocks) + "), got " + std::to_string(layers));
  gguf_writer w;
  for (const gguf_kv& kv : file->metadata()) {
    if (kv.key == count_key) {
      w.add_u32(count_key, layers);
    } else if (kv.key == "general.name" && kv.value.type == gguf_value_type::string) {
      w.add_string(kv.key, std::get<std::string>(kv.value.v) + "-draft-L" + std::to_string(layers));
    } else if (auto ok = copy_value(w, kv.key, kv.value); !ok) {
      return ok;
    }
  }
  for (const gguf_tensor& t : file->tensors()) {
    const long b = block_of(t.name);
    if (b >= static_cast<long>(layers)) continue;
    const std::span<const std::byte> bytes(t.data, t.size_bytes);
    w.add_tensor_raw(t.name, t.shape, t.type_id, bytes);
  }
  return w.write(out_path);
}

}  // namespace exa::model
