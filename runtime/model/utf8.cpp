#include "model/utf8.hpp"

#include <cstdint>

namespace exa::model {
namespace {

constexpr std::string_view replacement = "\xEF\xBF\xBD";

// Length of the sequence a lead byte starts (0: not a lead byte) and the
// allowed range of its second byte.
struct lead_info {
  int length;
  std::uint8_t lo, hi;
};

lead_info classify(std::uint8_t b) noexcept {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b >= 0xE1 && b <= 0xEC) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no UTF-16 surrogates
  if (b >= 0xEE && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0, 0, 0};
}

// Number of bytes of s[i..] forming a valid (possibly incomplete) prefix of
// one character; `complete` tells whether it is a whole character.
std::size_t valid_prefix(std::string_view s, std::size_t i, bool& complete) noexcept {
  const lead_info info = classify(static_cast<std::uint8_t>(s[i]));
  complete = false;
  if (info.length == 0) return 0;
  if (info.length == 1) {
    complete = true;
    return 1;
  }
  std::size_t n = 1;
  for (; n < static_cast<std::size_t>(info.length) && i + n < s.size(); ++n) {
    const auto c = static_cast<std::uint8_t>(s[i + n]);
    const std::uint8_t lo = n == 1 ? info.lo : 0x80, hi = n == 1 ? info.hi : 0xBF;
    if (c < lo || c > hi) return n;  // invalid here: n bytes were a valid subpart
  }
  complete = n == static_cast<std::size_t>(info.length);
  return n;
}

}  // namespace

std::string utf8_stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  std::size_t i = 0;
  while (i < pending_.size()) {
    bool complete = false;
    const std::size_t n = valid_prefix(pending_, i, complete);
    if (complete) {
      out.append(pending_, i, n);
      i += n;
    } else if (n > 0 && i + n == pending_.size()) {
      break;  // a valid start waiting for more bytes
    } else {
      out += replacement;   // invalid: replace the maximal subpart (at least one byte)
      i += n == 0 ? 1 : n;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string utf8_stream::flush() {
  std::string out = pending_.empty() ? std::string() : std::string(replacement);
  pending_.clear();
  return out;
}

bool is_valid_utf8(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    bool complete = false;
    const std::size_t n = valid_prefix(s, i, complete);
    if (!complete) return false;
    i += n;
  }
  return true;
}

std::string sanitize_utf8(std::string_view bytes) {
  utf8_stream s;
  std::string out = s.push(bytes);
  out += s.flush();
  return out;
}

}  // namespace exa::model
