#include "model/bpe.hpp"

#include <array>
#include <queue>

#include <fmt/format.h>

namespace exa::model {

namespace {

// byte -> GPT-2 code point: '!'..'~', '¡'..'¬' and '®'..'ÿ' map to
// themselves; the remaining 68 bytes, in byte order, to U+0100, U+0101, ...
constexpr std::array<std::uint16_t, 256> make_byte_to_cpt() {
  std::array<std::uint16_t, 256> t{};
  std::uint16_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = self ? static_cast<std::uint16_t>(b) : next++;
  }
  return t;
}
constexpr auto byte_to_cpt = make_byte_to_cpt();
constexpr std::uint16_t max_mapped_cpt = 256 + 68;

// Every mapped code point is below U+0800: one or two UTF-8 bytes.
struct mapped_byte {
  char bytes[2];
  std::uint8_t len;
};
constexpr std::array<mapped_byte, 256> make_byte_utf8() {
  std::array<mapped_byte, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const std::uint16_t c = byte_to_cpt[b];
    if (c < 0x80) {
      t[b] = {{static_cast<char>(c), 0}, 1};
    } else {
      t[b] = {{static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))}, 2};
    }
  }
  return t;
}
constexpr auto byte_utf8 = make_byte_utf8();

constexpr std::array<std::int16_t, max_mapped_cpt> make_cpt_to_byte() {
  std::array<std::int16_t, max_mapped_cpt> t{};
  for (auto& v : t) v = -1;
  for (int b = 0; b < 256; ++b) t[byte_to_cpt[b]] = static_cast<std::int16_t>(b);
  return t;
}
constexpr auto cpt_to_byte = make_cpt_to_byte();

// A candidate merge in the work queue; `size` (mapped bytes of both symbols
// when queued) tells a stale entry from a live one, as llama.cpp's text check
// does: a symbol only grows by swallowing its right neighbour.
struct bigram {
  std::int32_t rank;
  std::int32_t left;
  std::int32_t right;
  std::size_t size;
  token_id merged;  // the token of left+right, -1 when that text is no token
};
struct bigram_after {
  bool operator()(const bigram& l, const bigram& r) const noexcept {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

struct symbol {
  std::size_t start;  // offset in the mapped word
  std::size_t len;    // mapped bytes; 0 once merged into its left neighbour
  std::int32_t prev;
  std::int32_t next;
  token_id id;        // the token of its text, -1 when that text is no token
};

std::uint64_t id_pair(token_id l, token_id r) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 32) | static_cast<std::uint32_t>(r);
}

}  // namespace

std::string gpt2_byte_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out.append(byte_utf8[b].bytes, byte_utf8[b].len);
  return out;
}

std::optional<std::string> gpt2_byte_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    std::uint32_t cp = 0;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < text.size() &&
               (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // three- and four-byte characters are never mapped bytes
    }
    if (cp >= max_mapped_cpt || cpt_to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(cpt_to_byte[cp]);
  }
  return out;
}

expected<bpe> bpe::create(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
                          bool ignore_merges) {
  bpe b;
  b.ignore_merges_ = ignore_merges;
  b.token_ids_.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::string text = tokens[i].empty() ? fmt::format("[EMPTY_{}]", i) : tokens[i];
    auto [it, fresh] = b.token_ids_.emplace(std::move(text), static_cast<token_id>(i));
    if (!fresh) {
      return make_error(errc::corrupt_data, fmt::format("duplicate token in vocabulary: '{}' has ids {} and {}",
                                                        it->first, it->second, i));
    }
  }
  b.merge_ranks_.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    // llama.cpp splits at the first space after position 0; a merge without
    // one becomes the pair ("", ""), which no pair of symbols ever forms.
    if (merges[i].find(' ', 1) == std::string::npos) continue;
    b.merge_ranks_.emplace(merges[i], static_cast<std::int32_t>(i));  // the first listing wins
  }
  // The same merges by token ids, for pairs whose both sides are tokens (all
  // of them in real vocabularies): no string is built to look them up. The
  // first listing wins here too, since emplace keeps it.
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const std::string_view m = merges[i];
    const std::size_t sp = m.find(' ', 1);
    if (sp == std::string_view::npos) continue;
    const auto l = b.find_token(m.substr(0, sp));
    const auto r = b.find_token(m.substr(sp + 1));
    if (!l || !r) continue;
    const auto merged = b.find_token(std::string(m.substr(0, sp)) + std::string(m.substr(sp + 1)));
    b.merge_ids_.emplace(id_pair(*l, *r), merge_result{static_cast<std::int32_t>(i), merged.value_or(-1)});
  }
  for (int c = 0; c < 256; ++c) {
    b.byte_ids_[c] = b.find_token(std::string_view(byte_utf8[c].bytes, byte_utf8[c].len)).value_or(-1);
  }
  return b;
}

std::optional<token_id> bpe::find_token(std::string_view text) const {
  const auto it = token_ids_.find(text);
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::int32_t> bpe::merge_rank(std::string_view left, std::string_view right) const {
  std::string key;
  key.reserve(left.size() + 1 + right.size());
  key.append(left).append(1, ' ').append(right);
  // Only keys whose first space is the separator exist (see create()).
  if (key.find(' ', 1) != left.size()) return std::nullopt;
  const auto it = merge_ranks_.find(key);
  if (it == merge_ranks_.end()) return std::nullopt;
  return it->second;
}

const std::vector<std::int32_t>* bpe_piece_cache::find(std::string_view piece) const {
  const auto it = map_.find(piece);
  return it == map_.end() ? nullptr : &it->second;
}

void bpe_piece_cache::insert(std::string_view piece, const std::int32_t* ids, std::size_t n) {
  if (piece.size() > max_piece_bytes) return;
  if (map_.size() >= max_entries) map_.clear();
  map_.emplace(std::string(piece), std::vector<std::int32_t>(ids, ids + n));
}

void bpe::encode_piece(std::string_view piece, std::vector<token_id>& out, bpe_piece_cache* cache) const {
  if (piece.empty()) return;
  if (cache == nullptr) return merge_piece(piece, out);
  if (const auto* ids = cache->find(piece)) {
    out.insert(out.end(), ids->begin(), ids->end());
    return;
  }
  const std::size_t first = out.size();
  merge_piece(piece, out);
  cache->insert(piece, out.data() + first, out.size() - first);
}

void bpe::merge_piece(std::string_view piece, std::vector<token_id>& out) const {
  const std::string word = gpt2_byte_encode(piece);
  if (ignore_merges_) {
    if (auto id = find_token(word)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<symbol> syms;
  syms.reserve(piece.size());
  std::size_t off = 0;
  for (std::size_t i = 0; i < piece.size(); ++i) {
    const auto c = static_cast<unsigned char>(piece[i]);
    syms.push_back({off, byte_utf8[c].len, static_cast<std::int32_t>(i) - 1,
                    i + 1 == piece.size() ? -1 : static_cast<std::int32_t>(i) + 1, byte_ids_[c]});
    off += byte_utf8[c].len;
  }
  const std::string_view w = word;
  const auto text_of = [&](std::int32_t i) { return w.substr(syms[i].start, syms[i].len); };

  std::priority_queue<bigram, std::vector<bigram>, bigram_after> queue;
  std::string key;  // reused: "left right"
  const auto try_add = [&](std::int32_t l, std::int32_t r) {
    if (l < 0 || r < 0) return;
    const std::size_t size = syms[l].len + syms[r].len;
    if (syms[l].id >= 0 && syms[r].id >= 0) {
      const auto it = merge_ids_.find(id_pair(syms[l].id, syms[r].id));
      if (it != merge_ids_.end()) queue.push({it->second.rank, l, r, size, it->second.merged});
      return;
    }
    // A side that is no token (its merge made no token): look up by text.
    key.assign(text_of(l)).append(1, ' ').append(text_of(r));
    const auto it = merge_ranks_.find(std::string_view(key));
    if (it == merge_ranks_.end()) return;
    const auto merged = find_token(w.substr(syms[l].start, size));
    queue.push({it->second, l, r, size, merged.value_or(-1)});
  };
  for (std::int32_t i = 1; i < static_cast<std::int32_t>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const bigram bg = queue.top();
    queue.pop();
    symbol& left = syms[bg.left];
    symbol& right = syms[bg.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != bg.size) continue;
    left.len += right.len;
    left.id = bg.merged;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = bg.left;
    try_add(left.prev, bg.left);
    try_add(bg.left, left.next);
  }

  for (std::int32_t i = 0; i != -1; i = syms[i].next) {
    if (syms[i].id >= 0) {
      out.push_back(syms[i].id);
      continue;
    }
    const std::string_view text = text_of(i);
    // llama.cpp's fallback: each byte of the mapped text as a one-byte token.
    for (char c : text) {
      if (auto id = find_token(std::string_view(&c, 1))) out.push_back(*id);
    }
  }
}

}  // namespace exa::model
