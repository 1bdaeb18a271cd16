// UTF-8 repair of token byte streams.

#include <catch2/catch.hpp>

#include "model/utf8.hpp"

using exa::model::is_valid_utf8;
using exa::model::sanitize_utf8;
using exa::model::utf8_stream;

TEST_CASE("valid text passes through unchanged", "[utf8]") {
  const std::string text = "plain ascii, h\xC3\xA9llo, \xE2\x9C\x93, \xF0\x9F\x98\x80";
  CHECK(sanitize_utf8(text) == text);
  CHECK(is_valid_utf8(text));
}

TEST_CASE("a character split across pushes is held until complete", "[utf8]") {
  utf8_stream s;
  CHECK(s.push("a\xF0\x9F") == "a");
  CHECK(s.pending() == 2);
  CHECK(s.push("\x98") == "");
  CHECK(s.push("\x80z") == "\xF0\x9F\x98\x80z");
  CHECK(s.pending() == 0);
}

TEST_CASE("invalid bytes become U+FFFD per maximal subpart", "[utf8]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(sanitize_utf8("\x80") == r);                     // lone continuation
  CHECK(sanitize_utf8("\xC0\xAF") == r + r);             // overlong lead, then continuation
  CHECK(sanitize_utf8("\xE2\x9C" "A") == r + "A");       // truncated 3-byte, then ASCII
  CHECK(sanitize_utf8("\xED\xA0\x80") == r + r + r);     // surrogate: second byte out of range
  CHECK(sanitize_utf8("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF
  CHECK(sanitize_utf8("ok\xFF") == "ok" + r);
  CHECK(sanitize_utf8("\xE2\x9C") == r);                 // incomplete at the end of the stream
  CHECK_FALSE(is_valid_utf8("\xE2\x9C"));
  CHECK_FALSE(is_valid_utf8("\xC3"));
}

TEST_CASE("any byte soup comes out valid", "[utf8]") {
  std::uint64_t x = 7;
  for (int round = 0; round < 200; ++round) {
    std::string bytes;
    utf8_stream s;
    std::string out;
    for (int i = 0; i < 64; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      bytes.push_back(static_cast<char>(x >> 56));
      if (i % 3 == 2) {
        out += s.push(bytes);
        bytes.clear();
      }
    }
    out += s.push(bytes);
    out += s.flush();
    CHECK(is_valid_utf8(out));
  }
}
