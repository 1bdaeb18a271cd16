#pragma once
// Turning token bytes into valid UTF-8 text. A byte-level model can emit any
// byte sequence, and a multi-byte character often spans several tokens; the
// stream below passes complete characters through as they form, holds an
// incomplete one until its remaining bytes arrive, and replaces invalid bytes
// with U+FFFD (one per maximal invalid subpart, as the Unicode standard
// recommends). Front doors need this: JSON strings must be valid UTF-8.

#include <string>
#include <string_view>

namespace exa::model {

class utf8_stream {
 public:
  /// Appends bytes; returns the text that is now complete.
  std::string push(std::string_view bytes);
  /// Ends the stream: an incomplete trailing sequence becomes U+FFFD.
  std::string flush();
  /// Bytes held back waiting for the rest of a character.
  std::size_t pending() const noexcept { return pending_.size(); }

 private:
  std::string pending_;
};

/// True when `s` is entirely valid UTF-8.
bool is_valid_utf8(std::string_view s) noexcept;

/// Converts a whole byte string (push + flush).
std::string sanitize_utf8(std::string_view bytes);

}  // namespace exa::model
