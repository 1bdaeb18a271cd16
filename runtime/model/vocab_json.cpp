#include "model/vocab_json.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_syntax.hpp"

namespace exa::model {

namespace {

using json = nlohmann::json;

constexpr std::size_t max_json_bytes = std::size_t{256} << 20;

std::unexpected<error> invalid(std::string message) {
  return make_error(errc::invalid_argument, std::move(message));
}

// Every key the format knows: a typo in a fixture should fail loudly rather
// than silently produce a file without the intended setting.
constexpr std::string_view known_keys[] = {
    "model", "pre", "tokens", "scores", "token_type", "merges", "bos_token_id", "eos_token_id",
    "eot_token_id", "eom_token_id", "unknown_token_id", "padding_token_id", "add_bos_token",
    "add_eos_token", "add_space_prefix", "chat_template",
    // Notes for readers of a fixture (where it came from); not written to GGUF.
    "learned_from", "generator", "comment",
};

expected<std::vector<std::string>> string_list(const json& j, std::string_view field) {
  if (!j.is_array()) return invalid(fmt::format("\"{}\" must be an array of strings", field));
  std::vector<std::string> out;
  out.reserve(j.size());
  for (std::size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) return invalid(fmt::format("\"{}\"[{}] must be a string", field, i));
    out.push_back(j[i].get<std::string>());
  }
  return out;
}

expected<void> read_lists(const json& j, vocab& v) {
  auto tokens = string_list(j.at("tokens"), "tokens");
  if (!tokens) return std::unexpected(tokens.error());
  v.tokens = std::move(*tokens);
  if (j.contains("merges")) {
    auto merges = string_list(j.at("merges"), "merges");
    if (!merges) return std::unexpected(merges.error());
    v.merges = std::move(*merges);
  }
  if (j.contains("scores")) {
    const json& s = j.at("scores");
    if (!s.is_array()) return invalid("\"scores\" must be an array of numbers");
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (!s[i].is_number()) return invalid(fmt::format("\"scores\"[{}] must be a number", i));
      v.scores.push_back(s[i].get<float>());
    }
  }
  if (j.contains("token_type")) {
    const json& t = j.at("token_type");
    if (!t.is_array()) return invalid("\"token_type\" must be an array of integers");
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (!t[i].is_number_integer() || t[i].get<std::int64_t>() < 1 || t[i].get<std::int64_t>() > 6) {
        return invalid(fmt::format("\"token_type\"[{}] must be an integer 1..6", i));
      }
      v.kinds.push_back(static_cast<token_kind>(t[i].get<std::int32_t>()));
    }
  }
  return {};
}

expected<void> read_scalars(const json& j, vocab& v) {
  const std::pair<std::string_view, std::optional<token_id>*> ids[] = {
      {"bos_token_id", &v.ids.bos}, {"eos_token_id", &v.ids.eos},
      {"eot_token_id", &v.ids.eot}, {"eom_token_id", &v.ids.eom},
      {"unknown_token_id", &v.ids.unk}, {"padding_token_id", &v.ids.pad},
  };
  for (const auto& [key, dst] : ids) {
    if (!j.contains(key)) continue;
    const json& x = j.at(key);
    if (!x.is_number_integer() || x.get<std::int64_t>() < 0 || x.get<std::int64_t>() > INT32_MAX) {
      return invalid(fmt::format("\"{}\" must be a non-negative integer", key));
    }
    *dst = x.get<token_id>();
  }
  const std::pair<std::string_view, std::optional<bool>*> flags[] = {
      {"add_bos_token", &v.add_bos}, {"add_eos_token", &v.add_eos},
      {"add_space_prefix", &v.add_space_prefix},
  };
  for (const auto& [key, dst] : flags) {
    if (!j.contains(key)) continue;
    if (!j.at(key).is_boolean()) return invalid(fmt::format("\"{}\" must be true or false", key));
    *dst = j.at(key).get<bool>();
  }
  const std::pair<std::string_view, std::string*> strings[] = {{"model", &v.model}, {"pre", &v.pre}};
  for (const auto& [key, dst] : strings) {
    if (!j.contains(key)) continue;
    if (!j.at(key).is_string()) return invalid(fmt::format("\"{}\" must be a string", key));
    *dst = j.at(key).get<std::string>();
  }
  if (j.contains("chat_template")) {
    if (!j.at("chat_template").is_string()) return invalid("\"chat_template\" must be a string");
    v.chat_template = j.at("chat_template").get<std::string>();
  }
  return {};
}

}  // namespace

expected<vocab> vocab_from_json(std::string_view json_text) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("vocabulary is not JSON: " + json_syntax_error(json_text));
  if (!j.is_object()) return invalid("vocabulary must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(known_keys), std::end(known_keys), key) == std::end(known_keys)) {
      return invalid(fmt::format("unknown vocabulary field \"{}\"", key));
    }
  }
  if (!j.contains("tokens")) return invalid("vocabulary needs \"tokens\"");
  vocab v;
  v.model = "llama";
  if (auto r = read_lists(j, v); !r) return std::unexpected(r.error());
  if (auto r = read_scalars(j, v); !r) return std::unexpected(r.error());
  if (auto r = v.validate(); !r) return std::unexpected(r.error());
  return v;
}

expected<vocab> vocab_from_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io_error, fmt::format("cannot open vocabulary file {}", path));
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = std::move(buf).str();
  if (text.size() > max_json_bytes) {
    return invalid(fmt::format("vocabulary file {} is larger than {} bytes", path, max_json_bytes));
  }
  auto v = vocab_from_json(text);
  if (!v) return make_error(v.error().code, fmt::format("{}: {}", path, v.error().message));
  return v;
}

}  // namespace exa::model
