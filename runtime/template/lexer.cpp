#include "template/lexer.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>


namespace exa::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string normalize_newlines(std::string_view src) {
  // jinja2 turns \r\n and \r into \n before lexing.
  std::string out;
  out.reserve(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
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

class lexer {
 public:
  lexer(std::string src, std::size_t tokens_max) : src_(std::move(src)), tokens_max_(tokens_max) {}

  expected<std::vector<token>> run() {
    std::size_t pos = 0;
    bool strip_next = false;     // the previous tag ended with '-'
    bool line_starting = true;   // the previous tag's match ended at a line start
    while (pos <= src_.size()) {
      const std::size_t start = find_tag(pos);
      std::string text = src_.substr(pos, (start == std::string::npos ? src_.size() : start) - pos);
      const int text_line = line_at(pos);
      if (strip_next) text.erase(0, first_non_space(text));
      if (start == std::string::npos) {
        emit_text(std::move(text), text_line);
        break;
      }
      const char kind = src_[start + 1];
      const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (mod == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (mod != '+' && kind != '{') {
        lstrip_line(text, line_starting);
      }
      emit_text(std::move(text), text_line);
      std::size_t body = start + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      expected<std::size_t> end = kind == '#' ? skip_comment(start, body) : lex_tag(kind, start, body);
      if (!end) return std::unexpected(end.error());
      // What follows the tag: '-' strips all whitespace; block and comment
      // tags otherwise drop one newline (trim_blocks) unless marked '+'.
      const char end_mod = end_modifier_;
      pos = *end;
      if (end_mod == '-') {
        while (pos < src_.size() && is_space(src_[pos])) ++pos;
        strip_next = false;
        line_starting = pos > 0 && src_[pos - 1] == '\n';
      } else {
        if (kind != '{' && end_mod != '+' && pos < src_.size() && src_[pos] == '\n') ++pos;
        strip_next = false;
        line_starting = pos > 0 && src_[pos - 1] == '\n';
      }
      if (tokens_.size() > tokens_max_) return fail(line_at(pos), "template has more than " + std::to_string(tokens_max_) + " tokens");
    }
    tokens_.push_back(token{token::kind::eof, "", 0, 0, line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::unexpected<error> fail(int line, const std::string& what) const {
    return make_error(errc::invalid_argument, "chat template line " + std::to_string(line) + ": " + what);
  }

  int line_at(std::size_t pos) {
    // Tokens are produced in source order, so count forward incrementally.
    pos = std::min(pos, src_.size());
    if (pos < line_pos_) { line_pos_ = 0; line_ = 1; }
    for (; line_pos_ < pos; ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_;
    return line_;
  }

  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  static std::size_t first_non_space(const std::string& s) {
    std::size_t i = 0;
    while (i < s.size() && is_space(s[i])) ++i;
    return i;
  }

  /// lstrip_blocks: drop spaces/tabs between the last line start and a tag.
  static void lstrip_line(std::string& text, bool line_starting) {
    const std::size_t nl = text.rfind('\n');
    const std::size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return;
    for (std::size_t i = l_pos; i < text.size(); ++i)
      if (text[i] != ' ' && text[i] != '\t') return;
    text.resize(l_pos);
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back(token{token::kind::text, std::move(text), 0, 0, line});
  }

  expected<std::size_t> skip_comment(std::size_t start, std::size_t body) {
    const std::size_t close = src_.find("#}", body);
    if (close == std::string::npos) return fail(line_at(start), "unclosed comment");
    end_modifier_ = (close > body && (src_[close - 1] == '-' || src_[close - 1] == '+')) ? src_[close - 1] : '\0';
    return close + 2;
  }

  /// Lexes the expression tokens of a {{ }} or {% %} tag; returns the
  /// position after its closing delimiter.
  expected<std::size_t> lex_tag(char kind, std::size_t start, std::size_t pos) {
    const bool is_var = kind == '{';
    tokens_.push_back(token{is_var ? token::kind::var_begin : token::kind::block_begin, "", 0, 0, line_at(start)});
    const char close = is_var ? '}' : '%';
    int depth = 0;  // brackets open: a '}}' inside them is two braces, as in jinja2
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) return fail(line_at(start), std::string("unclosed tag '") + (is_var ? "{{" : "{%") + "'");
      if (depth == 0) {
        for (char m : {'-', '+', '\0'}) {
          if (m == '+' && is_var) continue;
          const std::size_t at = pos + (m ? 1 : 0);
          if ((m == 0 || src_[pos] == m) && src_.compare(at, 2, std::string{close, '}'}) == 0) {
            end_modifier_ = m;
            tokens_.push_back(token{is_var ? token::kind::var_end : token::kind::block_end, "", 0, 0, line_at(pos)});
            return at + 2;
          }
        }
      }
      auto next = lex_one(pos, depth);
      if (!next) return std::unexpected(next.error());
      pos = *next;
    }
  }

  expected<std::size_t> lex_one(std::size_t pos, int& depth) {
    const int line = line_at(pos);
    const char c = src_[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t e = pos;
      while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
      tokens_.push_back(token{token::kind::name, src_.substr(pos, e - pos), 0, 0, line});
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(pos, line);
    if (c == '\'' || c == '"') return lex_string(pos, line);
    static constexpr std::string_view two[] = {"//", "**", "==", "!=", "<=", ">="};
    for (auto op : two)
      if (src_.compare(pos, 2, op) == 0) {
        tokens_.push_back(token{token::kind::op, std::string(op), 0, 0, line});
        return pos + 2;
      }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) != std::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      tokens_.push_back(token{token::kind::op, std::string(1, c), 0, 0, line});
      return pos + 1;
    }
    return fail(line, std::string("unexpected character '") + c + "' in a tag");
  }

  std::size_t digits(std::size_t pos) const {
    // Digits with single underscores between them, as Python allows.
    while (pos < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos])) ||
                                 (src_[pos] == '_' && pos + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[pos + 1])))))
      ++pos;
    return pos;
  }

  expected<std::size_t> lex_number(std::size_t pos, int line) {
    std::size_t e = digits(pos);
    bool is_float = false;
    // jinja2 reads no float right after a '.', so `a.0.1` is two subscripts.
    const bool after_dot = pos > 0 && src_[pos - 1] == '.';
    if (!after_dot && e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      std::size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        e = digits(x);
        is_float = true;
      }
    }
    std::string text;
    for (std::size_t i = pos; i < e; ++i)
      if (src_[i] != '_') text += src_[i];
    token t{is_float ? token::kind::floating : token::kind::integer, text, 0, 0, line};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return fail(line, "integer literal " + text + " is out of range");
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  /// A quoted string with Python's escapes (\n \t \\ \' \" \xNN \uNNNN
  /// \UNNNNNNNN \ooo, a backslash-newline joins lines, others stay as written).
  expected<std::size_t> lex_string(std::size_t pos, int line) {
    const char q = src_[pos];
    std::string out;
    std::size_t i = pos + 1;
    for (; i < src_.size() && src_[i] != q; ++i) {
      if (src_[i] != '\\') {
        out += src_[i];
        continue;
      }
      if (++i >= src_.size()) break;
      const char e = src_[i];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n >= src_.size()) return fail(line, "truncated \\" + std::string(1, e) + " escape");
          std::uint32_t cp = 0;
          for (std::size_t k = 1; k <= n; ++k) {
            const char h = src_[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) return fail(line, "bad \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return fail(line, "escape names no valid character");
          append_utf8(out, cp);
          i += n;
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            std::uint32_t cp = 0;
            std::size_t k = 0;
            for (; k < 3 && i + k < src_.size() && src_[i + k] >= '0' && src_[i + k] <= '7'; ++k) cp = cp * 8 + (src_[i + k] - '0');
            append_utf8(out, cp);
            i += k - 1;
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    if (i >= src_.size()) return fail(line, "unclosed string literal");
    tokens_.push_back(token{token::kind::string, std::move(out), 0, 0, line});
    return i + 1;
  }

  std::string src_;
  std::size_t tokens_max_;
  std::vector<token> tokens_;
  char end_modifier_ = '\0';
  std::size_t line_pos_ = 0;
  int line_ = 1;
};

}  // namespace

expected<std::vector<token>> tokenize(std::string_view source, std::size_t tokens_max) {
  return lexer(normalize_newlines(source), tokens_max).run();
}

}  // namespace exa::jinja
