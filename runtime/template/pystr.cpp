#include "template/pystr.hpp"

#include <algorithm>
#include <cctype>

namespace exa::jinja::pystr {

namespace {
// Invalid bytes decode to U+DC80..U+DCFF (Python's surrogateescape) so
// encode() writes them back as the same byte.
constexpr std::uint32_t escape_base = 0xDC00;

bool is_ascii_alpha(std::uint32_t c) { return c < 0x80 && std::isalpha(static_cast<int>(c)); }
std::uint32_t to_upper(std::uint32_t c) { return (c >= 'a' && c <= 'z') ? c - 32 : c; }
std::uint32_t to_lower(std::uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }
}  // namespace

std::vector<std::uint32_t> decode(std::string_view s) {
  std::vector<std::uint32_t> out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    std::uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    bool ok = n != 0 && i + n <= s.size();
    for (std::size_t k = 1; ok && k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      ok = (c >> 6) == 2;
      cp = (cp << 6) | (c & 0x3F);
    }
    static constexpr std::uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (ok && (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back(escape_base + b);
      ++i;
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

std::string encode(const std::vector<std::uint32_t>& cps, std::size_t from, std::size_t to) {
  std::string out;
  to = std::min(to, cps.size());
  for (std::size_t i = from; i < to; ++i) {
    const std::uint32_t cp = cps[i];
    if (cp >= escape_base + 0x80 && cp <= escape_base + 0xFF) out += static_cast<char>(cp - escape_base);
    else if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

std::size_t length(std::string_view s) { return decode(s).size(); }

bool is_space(std::uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const auto cps = decode(s);
  const auto set = chars ? decode(*chars) : std::vector<std::uint32_t>{};
  auto strippable = [&](std::uint32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  std::size_t b = 0, e = cps.size();
  if (left) while (b < e && strippable(cps[b])) ++b;
  if (right) while (e > b && strippable(cps[e - 1])) --e;
  return encode(cps, b, e);
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    std::size_t pos = 0;
    while (maxsplit < 0 || static_cast<std::int64_t>(out.size()) < maxsplit) {
      const std::size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  const auto cps = decode(s);
  std::size_t i = 0;
  while (true) {
    while (i < cps.size() && is_space(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) >= maxsplit) {
      std::size_t e = cps.size();
      while (e > i && is_space(cps[e - 1])) --e;
      out.push_back(encode(cps, i, e));
      break;
    }
    std::size_t j = i;
    while (j < cps.size() && !is_space(cps[j])) ++j;
    out.push_back(encode(cps, i, j));
    i = j;
  }
  return out;
}

std::vector<std::string> splitlines(std::string_view s) {
  const auto cps = decode(s);
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    const std::uint32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    out.push_back(encode(cps, start, i));
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < cps.size()) out.push_back(encode(cps, start, cps.size()));
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to, std::int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` before every character and at the end
    const auto cps = decode(s);
    std::int64_t n = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || n < count) { out += to; ++n; }
      if (i < cps.size()) out += encode(cps, i, i + 1);
    }
    return out;
  }
  std::size_t pos = 0;
  std::int64_t n = 0;
  while (count < 0 || n < count) {
    const std::size_t at = s.find(from, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(to);
    pos = at + from.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(to_upper(static_cast<unsigned char>(c)));
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(to_lower(static_cast<unsigned char>(c)));
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = static_cast<char>(to_upper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (auto& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (is_ascii_alpha(u)) {
      c = static_cast<char>(prev_cased ? to_lower(u) : to_upper(u));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

std::int64_t find(std::string_view s, std::string_view sub) {
  const std::size_t at = s.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<std::int64_t>(length(s.substr(0, at)));
}

std::int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<std::int64_t>(length(s)) + 1;
  std::int64_t n = 0;
  for (std::size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

}  // namespace exa::jinja::pystr
