#pragma once
// Python's str semantics over UTF-8 text: strings index, slice, count and
// strip by code point, and whitespace is str.isspace()'s. Case mapping is
// ASCII-only (a documented difference: Python maps all of Unicode).
// Bytes that are not valid UTF-8 survive a round trip unchanged.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace exa::jinja::pystr {

std::vector<std::uint32_t> decode(std::string_view s);
std::string encode(const std::vector<std::uint32_t>& cps, std::size_t from = 0, std::size_t to = SIZE_MAX);
std::size_t length(std::string_view s);

bool is_space(std::uint32_t cp);
/// str.strip/lstrip/rstrip: `chars` nullopt strips whitespace.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
/// str.split(sep=None, maxsplit=-1).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, std::int64_t maxsplit);
/// str.splitlines() (no keepends).
std::vector<std::string> splitlines(std::string_view s);
/// str.replace(old, new, count=-1).
std::string replace(std::string_view s, std::string_view from, std::string_view to, std::int64_t count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
/// str.capitalize(): first character upper, the rest lower.
std::string capitalize(std::string_view s);
/// str.title(): each run of letters starts upper-case, continues lower-case.
std::string title(std::string_view s);
/// Code-point index of the first `sub` at or after code point 0, or -1.
std::int64_t find(std::string_view s, std::string_view sub);
/// Non-overlapping occurrences (str.count).
std::int64_t count(std::string_view s, std::string_view sub);

}  // namespace exa::jinja::pystr
