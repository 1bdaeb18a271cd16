#include "model/special_tokens.hpp"

#include <algorithm>
#include <cctype>
#include <set>
#include <span>
#include <unordered_map>

namespace exa::model {

namespace {

using text_list = std::span<const std::string_view>;

// The texts llama.cpp (llama-vocab.cpp, load()) recognises when a file names
// no such token itself. "\xEF\xBD\x9C" is U+FF5C, DeepSeek's full-width bar.
constexpr std::string_view eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<end_of_utterance>"};
constexpr std::string_view eom_texts[] = {"<|eom_id|>"};
constexpr std::string_view fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                     "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
                                     "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"};
constexpr std::string_view fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                     "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>", "<SUF>",
                                     "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"};
constexpr std::string_view fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                     "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
                                     "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};
constexpr std::string_view fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr std::string_view fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"};
constexpr std::string_view fim_sep_texts[] = {"<|file_sep|>"};
constexpr std::string_view eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["};
constexpr std::string_view always_rendered_texts[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"};

bool in(text_list list, std::string_view s) noexcept {
  return std::find(list.begin(), list.end(), s) != list.end();
}

struct detect_rule {
  std::optional<token_id> special_token_ids::*member;
  text_list texts;
};

// Fills the ids the file left unset from the texts llama.cpp knows; each
// token found this way becomes a control token. When several tokens qualify
// (a vocabulary with both <|im_end|> and <|endoftext|>), llama.cpp takes the
// first its text-to-id hash map yields; we build the same map the same way
// (std::unordered_map<std::string, id>, inserted in id order) so that, with
// the same standard library (libstdc++, as llama.cpp's Linux builds use), the
// iteration order and so the choice are the same.
void detect_by_text(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs,
                    special_token_ids& ids) {
  const detect_rule rules[] = {
      {&special_token_ids::eot, eot_texts},         {&special_token_ids::eom, eom_texts},
      {&special_token_ids::fim_pre, fim_pre_texts}, {&special_token_ids::fim_suf, fim_suf_texts},
      {&special_token_ids::fim_mid, fim_mid_texts}, {&special_token_ids::fim_pad, fim_pad_texts},
      {&special_token_ids::fim_rep, fim_rep_texts}, {&special_token_ids::fim_sep, fim_sep_texts},
  };
  std::unordered_map<std::string, token_id> text_to_id;
  for (std::size_t id = 0; id < texts.size(); ++id) {
    if (!texts[id].empty()) text_to_id[texts[id]] = static_cast<token_id>(id);
  }
  for (const auto& [text, id] : text_to_id) {
    for (const detect_rule& rule : rules) {
      if (ids.*rule.member || !in(rule.texts, text)) continue;
      ids.*rule.member = id;
      attrs[static_cast<std::size_t>(id)] |= attr_control;
    }
  }
}

void mark_unused_controls(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs) {
  for (std::size_t id = 0; id < texts.size(); ++id) {
    if ((attrs[id] & attr_control) && texts[id].find("unused") != std::string::npos) attrs[id] |= attr_unused;
  }
}

std::set<token_id> end_of_generation(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs,
                                     const special_token_ids& ids) {
  std::set<token_id> eog;
  for (const auto& id : {ids.fim_pad, ids.fim_rep, ids.fim_sep}) {
    if (id) eog.insert(*id);
  }
  for (std::size_t id = 0; id < texts.size(); ++id) {
    if (in(eog_texts, texts[id])) {
      eog.insert(static_cast<token_id>(id));
      attrs[id] |= attr_control;
    }
  }
  for (std::size_t id = 0; id < texts.size(); ++id) {
    if (in(always_rendered_texts, texts[id])) attrs[id] = attr_user_defined;
  }
  for (const auto& id : {ids.eos, ids.eot, ids.eom}) {
    if (id) eog.insert(*id);
  }
  return eog;
}

// llama.cpp's two exceptions: with gpt-oss/solar-open's <|return|>/<|call|>
// (or <|calls|>/<|flush|>) markers, <|end|> ends a message, not generation;
// with Gemma 4's <|tool_response>, </s> is plain text.
void apply_eog_exceptions(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs,
                          std::set<token_id>& eog) {
  bool has_return = false, has_call = false, has_flush = false, has_tool_response = false;
  std::optional<token_id> end_id, s_id;
  for (token_id id : eog) {
    const std::string& t = texts[static_cast<std::size_t>(id)];
    if (t == "<|return|>") has_return = true;
    else if (t == "<|call|>" || t == "<|calls|>") has_call = true;
    else if (t == "<|flush|>") has_flush = true;
    else if (t == "<|end|>") end_id = id;
    if (t == "<|tool_response>") has_tool_response = true;
    else if (t == "</s>") s_id = id;
  }
  if (end_id && ((has_return && has_call) || (has_call && has_flush))) {
    eog.erase(*end_id);
    attrs[static_cast<std::size_t>(*end_id)] = attr_user_defined;
  }
  if (s_id && has_tool_response) {
    eog.erase(*s_id);
    attrs[static_cast<std::size_t>(*s_id)] = attr_normal;
  }
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Phi-3's specials swallow the whitespace after them (llama.cpp keys this on
// the model name; the tokenizer.json of those models says rstrip).
void apply_name_rules(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs,
                      const std::vector<token_id>& specials, std::string_view model_name) {
  const std::string name = lower(model_name);
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  for (token_id id : specials) attrs[static_cast<std::size_t>(id)] |= attr_rstrip;
  for (std::size_t id = 0; id < texts.size(); ++id) {
    if (texts[id] == "</s>") attrs[id] |= attr_rstrip;
    if (texts[id] == "<unk>" || texts[id] == "<s>" || texts[id] == "<|endoftext|>") attrs[id] &= ~attr_rstrip;
  }
}

}  // namespace

std::uint32_t attr_of(token_kind kind) noexcept {
  switch (kind) {
    case token_kind::normal: return attr_normal;
    case token_kind::unknown: return attr_unknown;
    case token_kind::control: return attr_control;
    case token_kind::user_defined: return attr_user_defined;
    case token_kind::unused: return attr_unused;
    case token_kind::byte: return attr_byte;
  }
  return attr_undefined;
}

special_tokens resolve_special_tokens(const std::vector<std::string>& texts, std::vector<std::uint32_t>& attrs,
                                      special_token_ids ids, std::string_view model_name) {
  special_tokens out;
  detect_by_text(texts, attrs, ids);
  mark_unused_controls(texts, attrs);
  std::set<token_id> eog = end_of_generation(texts, attrs, ids);
  apply_eog_exceptions(texts, attrs, eog);
  for (std::size_t id = 0; id < texts.size(); ++id) {
    if (attrs[id] & (attr_control | attr_user_defined | attr_unknown)) {
      out.partition_order.push_back(static_cast<token_id>(id));
    }
  }
  // std::sort, not stable_sort: the same algorithm on the same input order as
  // llama.cpp, so specials of equal length are tried in the same order.
  std::sort(out.partition_order.begin(), out.partition_order.end(), [&](token_id a, token_id b) {
    return texts[static_cast<std::size_t>(a)].size() > texts[static_cast<std::size_t>(b)].size();
  });
  apply_name_rules(texts, attrs, out.partition_order, model_name);
  out.ids = ids;
  out.eog.assign(eog.begin(), eog.end());
  return out;
}

namespace {

bool c_isspace(char c) noexcept { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// Splits one raw piece at every occurrence of `special`.
void split_piece(std::string_view piece, token_id id, std::string_view special, std::uint32_t attr,
                 std::vector<text_fragment>& out) {
  std::size_t pos = 0;
  while (pos < piece.size()) {
    const std::size_t match = piece.find(special, pos);
    if (match == std::string_view::npos) break;
    std::size_t left_len = match - pos;
    if (attr & attr_lstrip) {
      while (left_len > 0 && c_isspace(piece[pos + left_len - 1])) --left_len;
    }
    if (left_len > 0) out.push_back({-1, piece.substr(pos, left_len)});
    out.push_back({id, special});
    pos = match + special.size();
    if (attr & attr_rstrip) {
      while (pos < piece.size() && c_isspace(piece[pos])) ++pos;
    }
  }
  if (pos < piece.size()) out.push_back({-1, piece.substr(pos)});
}

}  // namespace

std::vector<text_fragment> partition_special(std::string_view text, const std::vector<token_id>& order,
                                             const std::vector<std::string>& texts,
                                             const std::vector<std::uint32_t>& attrs, bool parse_special) {
  std::vector<text_fragment> fragments;
  if (text.empty()) return fragments;
  fragments.push_back({-1, text});
  std::vector<text_fragment> next;
  for (token_id id : order) {
    const std::uint32_t attr = attrs[static_cast<std::size_t>(id)];
    // User-defined tokens are always cut out, as Hugging Face does.
    if (!parse_special && (attr & (attr_control | attr_unknown))) continue;
    const std::string& special = texts[static_cast<std::size_t>(id)];
    if (special.empty()) continue;
    next.clear();
    next.reserve(fragments.size() + 2);
    for (const text_fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
      } else {
        split_piece(f.text, id, special, attr, next);
      }
    }
    fragments.swap(next);
  }
  return fragments;
}

}  // namespace exa::model
