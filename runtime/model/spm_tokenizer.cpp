#include "model/spm_tokenizer.hpp"

#include <queue>

#include <fmt/format.h>

namespace exa::model {

namespace {

// A symbol: a slice of the text, linked to its neighbours. A symbol merged
// into its left neighbour keeps n == 0.
struct symbol {
  int prev;
  int next;
  std::size_t offset;
  std::size_t n;
};

struct bigram {
  int left;
  int right;
  float score;
  std::size_t size;  // bytes of the joined text when queued
};

// The queue's order: the highest score first, then the leftmost pair.
struct bigram_less {
  bool operator()(const bigram& l, const bigram& r) const noexcept {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

// llama.cpp's unicode_len_utf8: the length a lead byte announces (1 for
// continuation and ASCII bytes), without validating what follows.
std::size_t utf8_len(char c) noexcept {
  static constexpr std::size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[static_cast<unsigned char>(c) >> 4];
}

std::string byte_token_text(unsigned b) { return fmt::format("<0x{:02X}>", b); }

// One call's working state, as llama.cpp's session holds it.
class session {
 public:
  session(const spm_tokenizer& tok, const std::vector<float>& scores, std::string_view text)
      : tok_(tok), scores_(scores), text_(text) {}

  expected<void> run(std::vector<token_id>& out, std::optional<token_id> unk) {
    split_characters();
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) try_add_bigram(i - 1, i);
    while (!queue_.empty()) {
      const bigram b = queue_.top();
      queue_.pop();
      symbol& left = symbols_[static_cast<std::size_t>(b.left)];
      symbol& right = symbols_[static_cast<std::size_t>(b.right)];
      // Skip pairs one of whose symbols changed since they were queued.
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[static_cast<std::size_t>(right.next)].prev = b.left;
      try_add_bigram(left.prev, b.left);
      try_add_bigram(b.left, left.next);
    }
    if (symbols_.empty()) return {};
    for (int i = 0; i != -1; i = symbols_[static_cast<std::size_t>(i)].next) {
      if (auto r = emit(i, out, unk); !r) return r;
    }
    return {};
  }

 private:
  void split_characters() {
    symbols_.reserve(text_.size());
    std::size_t offs = 0;
    int index = 0;
    while (offs < text_.size()) {
      const std::size_t n = std::min(utf8_len(text_[offs]), text_.size() - offs);
      symbols_.push_back({index - 1, offs + n == text_.size() ? -1 : index + 1, offs, n});
      offs += n;
      ++index;
    }
  }

  std::string_view text_of(const symbol& s) const { return text_.substr(s.offset, s.n); }

  void try_add_bigram(int left, int right) {
    if (left == -1 || right == -1) return;
    const symbol& l = symbols_[static_cast<std::size_t>(left)];
    const symbol& r = symbols_[static_cast<std::size_t>(right)];
    const std::string_view joined = text_.substr(l.offset, l.n + r.n);
    const auto id = tok_.find(joined);
    if (!id) return;
    const auto idx = static_cast<std::size_t>(*id);
    queue_.push({left, right, idx < scores_.size() ? scores_[idx] : 0.0f, joined.size()});
  }

  // llama.cpp also records, for every queued pair, how to split its text
  // again, and splits a final symbol whose text is not a token along it. That
  // never happens: a merged symbol's text is a token (pairs are queued only
  // then), and an unmerged one is a single character, which no pair's text
  // equals (a pair starting with the same lead byte is longer). So a final
  // symbol is its token or, being one character, its bytes.
  expected<void> emit(int index, std::vector<token_id>& out, std::optional<token_id> unk) const {
    const std::string_view text = text_of(symbols_[static_cast<std::size_t>(index)]);
    if (auto id = tok_.find(text)) {
      out.push_back(*id);
      return {};
    }
    for (char c : text) {
      if (auto b = tok_.byte_token(static_cast<unsigned char>(c))) {
        out.push_back(*b);
      } else if (unk) {
        out.push_back(*unk);
      } else {
        return make_error(errc::invalid_argument,
                          fmt::format("byte 0x{:02X} has no token and the vocabulary has no unknown token",
                                      static_cast<unsigned char>(c)));
      }
    }
    return {};
  }

  const spm_tokenizer& tok_;
  const std::vector<float>& scores_;
  std::string_view text_;
  std::vector<symbol> symbols_;
  std::priority_queue<bigram, std::vector<bigram>, bigram_less> queue_;
};

}  // namespace

spm_tokenizer::spm_tokenizer(const std::vector<std::string>& texts, const std::vector<float>& scores,
                             std::optional<token_id> unk)
    : scores_(scores), unk_(unk) {
  ids_.reserve(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    // A repeated text maps to its last id, as llama.cpp's map assignment does.
    if (!texts[i].empty()) ids_.insert_or_assign(texts[i], static_cast<token_id>(i));
  }
  for (unsigned b = 0; b < 256; ++b) {
    byte_tokens_[b] = -1;
    if (auto id = find(byte_token_text(b))) {
      byte_tokens_[b] = *id;
    } else if (auto raw = find(std::string(1, static_cast<char>(b)))) {
      byte_tokens_[b] = *raw;
    }
  }
}

std::optional<token_id> spm_tokenizer::find(std::string_view text) const {
  const auto it = ids_.find(text);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<token_id> spm_tokenizer::byte_token(unsigned char b) const noexcept {
  if (byte_tokens_[b] < 0) return std::nullopt;
  return byte_tokens_[b];
}

expected<void> spm_tokenizer::encode(std::string_view text, std::vector<token_id>& out) const {
  session s(*this, scores_, text);
  return s.run(out, unk_);
}

}  // namespace exa::model
