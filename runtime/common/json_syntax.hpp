#pragma once
// Where a JSON text stops being JSON, in words a client can act on. nlohmann
// reports a syntax error only through an exception or a SAX handler; business
// logic does not catch, so parse without exceptions and, on failure, run this.
// Header-only: nlohmann/json is a header-only Debian package.

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace exa {

/// The parser's message for the first syntax error in `text` ("syntax error
/// while parsing object key - ... at line 1, column 9"), without nlohmann's
/// "[json.exception.parse_error.101] " prefix; empty if `text` is valid JSON.
inline std::string json_syntax_error(std::string_view text) {
  using json = nlohmann::json;
  struct capture final : nlohmann::json_sax<json> {
    std::string message;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
      std::string_view what = ex.what();
      if (auto pos = what.find("] "); pos != std::string_view::npos) what.remove_prefix(pos + 2);
      message = std::string(what);
      return false;
    }
  } c;
  json::sax_parse(text, &c, json::input_format_t::json, /*strict=*/true);
  return c.message;
}

}  // namespace exa
