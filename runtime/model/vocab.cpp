#include "model/vocab.hpp"

#include <unordered_set>

#include <fmt/format.h>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"

namespace exa::model {

namespace {

struct flag_key {
  const char* key;
  std::optional<bool> vocab::*member;
};

constexpr flag_key flag_keys[] = {
    {"tokenizer.ggml.add_bos_token", &vocab::add_bos},
    {"tokenizer.ggml.add_eos_token", &vocab::add_eos},
    {"tokenizer.ggml.add_space_prefix", &vocab::add_space_prefix},
};

std::unexpected<error> invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

// An optional array key; nullptr when absent.
expected<const gguf_array*> optional_array(const gguf_file& f, std::string_view key) {
  if (f.find(key) == nullptr) return nullptr;
  return f.get_array(key);
}

expected<std::optional<std::string>> optional_string(const gguf_file& f, std::string_view key) {
  if (f.find(key) == nullptr) return std::nullopt;
  auto s = f.get_string(key);
  if (!s) return std::unexpected(s.error());
  return std::optional<std::string>(std::move(*s));
}

token_kind kind_from_int(std::int64_t v) noexcept {
  // 0 is llama.cpp's "undefined"; anything unknown is shown as plain text.
  if (v >= 1 && v <= 6) return static_cast<token_kind>(v);
  return token_kind::normal;
}

expected<void> read_arrays(const gguf_file& file, vocab& v) {
  auto tokens = optional_array(file, "tokenizer.ggml.tokens");
  if (!tokens) return std::unexpected(tokens.error());
  if (*tokens != nullptr) {
    if ((*tokens)->elem_type != gguf_value_type::string) {
      return invalid("tokenizer.ggml.tokens must be an array of strings");
    }
    v.tokens = (*tokens)->strings;
  }
  auto scores = optional_array(file, "tokenizer.ggml.scores");
  if (!scores) return std::unexpected(scores.error());
  if (*scores != nullptr) {
    // llama.cpp accepts f32 or i32 scores.
    const auto& a = **scores;
    if (a.floats.size() == a.size()) {
      for (double x : a.floats) v.scores.push_back(static_cast<float>(x));
    } else if (a.ints.size() == a.size()) {
      for (std::int64_t x : a.ints) v.scores.push_back(static_cast<float>(x));
    } else {
      return invalid("tokenizer.ggml.scores must be an array of numbers");
    }
  }
  auto types = optional_array(file, "tokenizer.ggml.token_type");
  if (!types) return std::unexpected(types.error());
  if (*types != nullptr) {
    const auto& ints = (*types)->ints;
    if (ints.size() != (*types)->size()) {
      return invalid("tokenizer.ggml.token_type must be an array of integers");
    }
    for (std::int64_t x : ints) v.kinds.push_back(kind_from_int(x));
  }
  auto merges = optional_array(file, "tokenizer.ggml.merges");
  if (!merges) return std::unexpected(merges.error());
  if (*merges != nullptr) {
    if ((*merges)->elem_type != gguf_value_type::string) {
      return invalid("tokenizer.ggml.merges must be an array of strings");
    }
    v.merges = (*merges)->strings;
  }
  return {};
}

expected<void> read_scalars(const gguf_file& file, vocab& v) {
  for (const special_id_key& k : special_id_keys) {
    if (file.find(k.key) == nullptr) continue;
    auto id = file.get_int(k.key);
    if (!id) return std::unexpected(id.error());
    if (*id < 0 || *id > INT32_MAX) return invalid(fmt::format("{} = {} is not a token id", k.key, *id));
    v.ids.*k.member = static_cast<token_id>(*id);
  }
  for (const flag_key& k : flag_keys) {
    if (file.find(k.key) == nullptr) continue;
    auto b = file.get_bool(k.key);
    if (!b) return std::unexpected(b.error());
    v.*k.member = *b;
  }
  return {};
}

}  // namespace

expected<vocab> vocab::from_gguf(const gguf_file& file) {
  vocab v;
  auto model = optional_string(file, "tokenizer.ggml.model");
  if (!model) return std::unexpected(model.error());
  if (*model) v.model = std::move(**model);
  auto pre = optional_string(file, "tokenizer.ggml.pre");
  if (!pre) return std::unexpected(pre.error());
  if (*pre) v.pre = std::move(**pre);
  auto tmpl = optional_string(file, "tokenizer.chat_template");
  if (!tmpl) return std::unexpected(tmpl.error());
  v.chat_template = std::move(*tmpl);
  if (auto r = read_arrays(file, v); !r) return std::unexpected(r.error());
  if (auto r = read_scalars(file, v); !r) return std::unexpected(r.error());
  return v;
}

expected<void> vocab::validate() const {
  if (model.empty() || model.size() > 64) return invalid("tokenizer model name must be 1..64 bytes");
  if (tokens.empty() || tokens.size() > vocab_max_tokens) {
    return invalid(fmt::format("vocabulary must hold 1..{} tokens, has {}", vocab_max_tokens, tokens.size()));
  }
  if (!scores.empty() && scores.size() != tokens.size()) {
    return invalid(fmt::format("{} scores for {} tokens", scores.size(), tokens.size()));
  }
  if (!kinds.empty() && kinds.size() != tokens.size()) {
    return invalid(fmt::format("{} token types for {} tokens", kinds.size(), tokens.size()));
  }
  if (merges.size() > vocab_max_merges) return invalid(fmt::format("more than {} merges", vocab_max_merges));
  if (chat_template && chat_template->size() > vocab_max_template_bytes) {
    return invalid(fmt::format("chat template is longer than {} bytes", vocab_max_template_bytes));
  }
  // llama.cpp maps text to id and asserts the map is as large as the list:
  // an empty or repeated token would break it (or be renamed), so refuse it.
  std::unordered_set<std::string_view> seen;
  seen.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].empty() || tokens[i].size() > vocab_max_token_bytes) {
      return invalid(fmt::format("token {} must be 1..{} bytes", i, vocab_max_token_bytes));
    }
    if (!seen.insert(tokens[i]).second) return invalid(fmt::format("token {} '{}' appears twice", i, tokens[i]));
  }
  for (const special_id_key& k : special_id_keys) {
    const auto& id = ids.*k.member;
    if (id && (*id < 0 || static_cast<std::size_t>(*id) >= tokens.size())) {
      return invalid(fmt::format("{} = {} is out of range for {} tokens", k.key, *id, tokens.size()));
    }
  }
  return {};
}

void vocab::write_gguf(gguf_writer& w) const {
  w.add_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  if (!scores.empty()) w.add_f32_array("tokenizer.ggml.scores", scores);
  if (!kinds.empty()) {
    std::vector<std::int32_t> k;
    k.reserve(kinds.size());
    for (token_kind x : kinds) k.push_back(static_cast<std::int32_t>(x));
    w.add_i32_array("tokenizer.ggml.token_type", std::move(k));
  }
  if (!merges.empty()) w.add_string_array("tokenizer.ggml.merges", merges);
  for (const special_id_key& k : special_id_keys) {
    if (const auto& id = ids.*k.member) w.add_u32(k.key, static_cast<std::uint32_t>(*id));
  }
  for (const flag_key& k : flag_keys) {
    if (const auto& b = this->*k.member) w.add_bool(k.key, *b);
  }
  if (chat_template) w.add_string("tokenizer.chat_template", *chat_template);
}

}  // namespace exa::model
