#include "chaos/sim_workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <deque>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include "common/assert.hpp"
#include "common/splitmix64.hpp"

namespace exa::chaos {

namespace {


// Separate streams for arrival times and lengths, so changing the lengths of
// a workload does not move its arrivals.
constexpr std::uint64_t arrival_stream = 0x73696d617272ull;  // "simarr"
constexpr std::uint64_t length_stream = 0x73696d6c656eull;   // "simlen"

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t stream) {
  return splitmix64_finalize(seed ^ splitmix64_finalize(stream));
}

// ---------------------------------------------------------------------------
// Trace parsing.

constexpr std::string_view trace_header = "TIMESTAMP,ContextTokens,GeneratedTokens";
constexpr std::array<std::string_view, 3> column_names = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};

struct trace_row {
  std::int64_t t_ns = 0;  // since 1970-01-01 00:00:00 (the trace has no zone; none is needed)
  std::uint32_t prompt_tokens = 0;
  std::uint32_t generated_tokens = 0;
};

/// Days from 1970-01-01 to a proleptic Gregorian date (Hinnant's
/// days_from_civil): exact for every date, no time-zone library involved.
constexpr std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2 ? 1 : 0;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}
static_assert(days_from_civil(1970, 1, 1) == 0);
static_assert(days_from_civil(2000, 3, 1) == 11017);

constexpr bool is_leap(std::int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

constexpr unsigned days_in_month(std::int64_t y, unsigned m) {
  constexpr std::array<unsigned, 12> days = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : days[m - 1];
}

/// The `n` decimal digits at `pos`, or nullopt.
std::optional<unsigned> digits(std::string_view s, std::size_t pos, std::size_t n) {
  if (pos + n > s.size()) return std::nullopt;
  unsigned v = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(s[i] - '0');
  }
  return v;
}

/// "YYYY-MM-DD HH:MM:SS" with an optional fraction of 1 to 9 digits, as
/// nanoseconds since 1970; nullopt if malformed or out of range.
std::optional<std::int64_t> parse_timestamp(std::string_view s) {
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || s[10] != ' ' || s[13] != ':' || s[16] != ':')
    return std::nullopt;
  const auto y = digits(s, 0, 4), mo = digits(s, 5, 2), d = digits(s, 8, 2);
  const auto h = digits(s, 11, 2), mi = digits(s, 14, 2), sec = digits(s, 17, 2);
  if (!y || !mo || !d || !h || !mi || !sec) return std::nullopt;
  if (*mo < 1 || *mo > 12 || *d < 1 || *d > days_in_month(*y, *mo) || *h > 23 || *mi > 59 || *sec > 59)
    return std::nullopt;
  std::int64_t frac_ns = 0;
  if (s.size() > 19) {
    const std::size_t n = s.size() - 20;
    if (s[19] != '.' || n < 1 || n > 9) return std::nullopt;
    const auto f = digits(s, 20, n);
    if (!f) return std::nullopt;
    frac_ns = *f;
    for (std::size_t i = n; i < 9; ++i) frac_ns *= 10;
  }
  const std::int64_t secs = days_from_civil(*y, *mo, *d) * 86400 + *h * 3600 + *mi * 60 + *sec;
  return secs * 1'000'000'000 + frac_ns;
}

std::optional<std::uint32_t> parse_tokens(std::string_view s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size() || s.empty() || v > max_trace_tokens) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

class trace_parser {
 public:
  explicit trace_parser(const std::string& path) : path_(path) {}

  expected<void> header(std::string_view line) {
    if (line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);  // a UTF-8 byte-order mark
    if (line != trace_header)
      return make_error(errc::corrupt_data, fmt::format("{}:1: the header must be {}", path_, trace_header));
    return {};
  }

  expected<void> row(std::size_t line_no, std::string_view line) {
    std::array<std::string_view, 3> cols;
    std::size_t n = 0;
    for (std::size_t start = 0;; ++n) {
      const std::size_t comma = line.find(',', start);
      if (n < cols.size()) cols[n] = line.substr(start, comma - start);
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (n + 1 != cols.size())
      return make_error(errc::corrupt_data, fmt::format("{}:{}: expected 3 columns, got {}", path_, line_no, n + 1));
    const auto t = parse_timestamp(cols[0]);
    if (!t) return column_error(line_no, 0, fmt::format("\"{}\" is not a time YYYY-MM-DD HH:MM:SS.fffffff", cols[0]));
    if (!rows_.empty() && *t < rows_.back().t_ns)
      return column_error(line_no, 0, "earlier than the row before it: rows must be in time order");
    trace_row r{.t_ns = *t};
    for (std::size_t c = 1; c < 3; ++c) {
      const auto v = parse_tokens(cols[c]);
      if (!v)
        return column_error(line_no, c,
                            fmt::format("\"{}\" is not a token count between 0 and {}", cols[c], max_trace_tokens));
      // A zero-token row is a request all the same; it costs at least a step.
      (c == 1 ? r.prompt_tokens : r.generated_tokens) = std::max<std::uint32_t>(*v, 1);
    }
    if (rows_.size() >= max_workload_rows)
      return make_error(errc::invalid_argument,
                        fmt::format("{}:{}: more than {} rows", path_, line_no, max_workload_rows));
    rows_.push_back(r);
    return {};
  }

  std::vector<trace_row>& rows() { return rows_; }

 private:
  std::unexpected<error> column_error(std::size_t line_no, std::size_t col, const std::string& what) const {
    return make_error(errc::corrupt_data,
                      fmt::format("{}:{}: column {} ({}): {}", path_, line_no, col + 1, column_names[col], what));
  }

  const std::string& path_;
  std::vector<trace_row> rows_;
};

expected<std::string> read_trace_file(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(errc::io_error, fmt::format("cannot open trace file {}: {}", path, ec.message()));
  if (size > max_trace_bytes)
    return make_error(errc::invalid_argument,
                      fmt::format("trace file {} is {} bytes, more than the limit of {}", path, size, max_trace_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io_error, "cannot open trace file " + path);
  std::string text(static_cast<std::size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad() || static_cast<std::uintmax_t>(in.gcount()) != size)
    return make_error(errc::io_error, "cannot read trace file " + path);
  return text;
}

expected<std::vector<trace_row>> parse_trace(const std::string& path, std::string_view text) {
  trace_parser parser(path);
  bool header_seen = false;
  std::size_t line_no = 0;
  for (std::size_t start = 0; start < text.size();) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.empty()) continue;  // blank lines (a trailing newline) carry nothing
    auto ok = header_seen ? parser.row(line_no, line) : parser.header(line);
    if (!ok) return std::unexpected(ok.error());
    header_seen = true;
  }
  if (parser.rows().empty()) return make_error(errc::corrupt_data, fmt::format("{}: no rows", path));
  return std::move(parser.rows());
}

/// The trace as arrivals: offsets compressed by `rate_multiplier`, replayed
/// back to back until `duration_s`.
expected<std::vector<sim_request>> replay(const std::string& path, const std::vector<trace_row>& rows,
                                          double rate_multiplier, double duration_s) {
  EXA_ASSERT(!rows.empty());
  const std::int64_t t0 = rows.front().t_ns;
  const double n = static_cast<double>(rows.size());
  const double span_s = static_cast<double>(rows.back().t_ns - t0) / 1e9 / rate_multiplier;
  // One mean gap after the last row before the copy restarts; a trace with no
  // span (one row, or all at one instant) repeats once per trace second.
  const double period_s = span_s > 0 ? span_s * n / (n - 1) : 1.0 / rate_multiplier;
  const auto too_many = [&] {
    return make_error(errc::invalid_argument,
                      fmt::format("trace {} at rate_multiplier {} over {} s gives more than {} requests", path,
                                  rate_multiplier, duration_s, max_workload_rows));
  };
  // Whole copies alone already past the bound: refuse before generating them.
  if (std::floor(duration_s / period_s) * n > static_cast<double>(max_workload_rows)) return too_many();
  std::vector<sim_request> out;
  for (std::uint64_t copy = 0;; ++copy) {
    const double shift_s = static_cast<double>(copy) * period_s;
    if (!(shift_s < duration_s)) break;
    for (const trace_row& r : rows) {
      const double at_s = shift_s + static_cast<double>(r.t_ns - t0) / 1e9 / rate_multiplier;
      if (!(at_s < duration_s)) break;  // rows are in time order
      if (out.size() >= max_workload_rows) return too_many();
      out.push_back({.at_s = at_s, .prompt_tokens = r.prompt_tokens, .max_tokens = r.generated_tokens, .tenant = {}, .segments = {}});
    }
  }
  return out;
}

std::uint32_t jittered(splitmix64_stream& rng, std::uint32_t base) {
  const double v = std::round(static_cast<double>(base) * (0.75 + 0.5 * rng.uniform()));
  return static_cast<std::uint32_t>(std::max(1.0, v));
}

}  // namespace

expected<std::vector<sim_request>> load_azure_trace(const std::string& path, double rate_multiplier,
                                                    double duration_s) {
  if (!(rate_multiplier > 0) || !std::isfinite(rate_multiplier))
    return make_error(errc::invalid_argument, fmt::format("rate_multiplier: must be positive (got {})", rate_multiplier));
  if (!(duration_s > 0) || !std::isfinite(duration_s))
    return make_error(errc::invalid_argument, fmt::format("duration_s: must be positive (got {})", duration_s));
  auto text = read_trace_file(path);
  if (!text) return std::unexpected(text.error());
  auto rows = parse_trace(path, *text);
  if (!rows) return std::unexpected(rows.error());
  return replay(path, *rows, rate_multiplier, duration_s);
}

std::vector<sim_request> synthetic_workload(const sim_workload_spec& w, double duration_s, std::uint64_t seed) {
  std::vector<sim_request> out;
  if (!(w.rate_per_s > 0) || !(duration_s > 0) || !std::isfinite(duration_s)) return out;
  const bool bursty = w.kind == sim_workload_kind::bursty && w.burst_factor > 1 && w.burst_period_s > 0;
  const double b = bursty ? w.burst_factor : 1.0;
  // Thinning (Lewis and Shedler): candidates at the peak rate, each kept with
  // probability rate(t) / peak, form a Poisson process of rate rate(t).
  const double peak = w.rate_per_s * b;
  const double burst_share = 1.0 / (b + 1);
  const auto rate_at = [&](double t) {
    const double phase = std::fmod(t, w.burst_period_s) / w.burst_period_s;
    return phase < burst_share ? peak : w.rate_per_s / b;
  };
  splitmix64_stream arrivals(derive_seed(seed, arrival_stream));
  splitmix64_stream lengths(derive_seed(seed, length_stream));
  double t = 0;
  while (out.size() < max_workload_rows) {
    t += arrivals.exponential(peak);
    if (!(t < duration_s)) break;
    if (bursty && arrivals.uniform() * peak >= rate_at(t)) continue;
    const std::uint32_t prompt = jittered(lengths, w.prompt_tokens);
    out.push_back({.at_s = t, .prompt_tokens = prompt, .max_tokens = jittered(lengths, w.max_tokens), .tenant = {}, .segments = {}});
  }
  return out;
}

double diurnal_factor(const sim_workload_spec& w, double t_s) {
  if (!(w.diurnal_period_s > 0)) return 1;
  const double pi = 3.14159265358979323846;
  const double day = 0.5 - 0.5 * std::cos(2 * pi * std::fmod(t_s, w.diurnal_period_s) / w.diurnal_period_s);
  return w.diurnal_trough + (1 - w.diurnal_trough) * day;
}

namespace {

// Keeps each arrival with the diurnal curve's probability at its time (its
// own seeded stream: the kept arrivals do not depend on anything else).
std::vector<sim_request> diurnal(const sim_workload_spec& w, std::vector<sim_request> in, std::uint64_t seed) {
  if (!(w.diurnal_period_s > 0)) return in;
  splitmix64_stream keep(derive_seed(seed, 77));
  std::vector<sim_request> out;
  out.reserve(in.size());
  for (auto& r : in)
    if (keep.uniform() < diurnal_factor(w, r.at_s)) out.push_back(std::move(r));
  return out;
}

expected<std::vector<sim_request>> make_flat_workload(const scenario& s, std::uint64_t seed) {
  if (s.workload.kind == sim_workload_kind::trace)
    return load_azure_trace(s.workload.trace, s.workload.rate_multiplier, s.duration_s);
  const double start = std::min(s.workload.start_s, s.duration_s);
  const auto shifted = [start](std::vector<sim_request> v) {
    for (auto& r : v) r.at_s += start;
    return v;
  };
  if (s.workload.tenants.empty()) return shifted(synthetic_workload(s.workload, s.duration_s - start, seed));
  // One stream per tenant, each with its own seed (a tenant's arrivals do
  // not change when another's rate does), merged in time order.
  std::vector<sim_request> out;
  for (std::size_t i = 0; i < s.workload.tenants.size(); ++i) {
    sim_workload_spec one = s.workload;
    one.rate_per_s = s.workload.tenants[i].rate_per_s;
    auto stream = shifted(synthetic_workload(one, s.duration_s - start, derive_seed(seed, 1000 + i)));
    for (auto& r : stream) r.tenant = s.workload.tenants[i].name;
    out.insert(out.end(), stream.begin(), stream.end());
  }
  std::stable_sort(out.begin(), out.end(), [](const sim_request& a, const sim_request& b) { return a.at_s < b.at_s; });
  if (out.size() > max_workload_rows) out.resize(max_workload_rows);
  return out;
}

}  // namespace

expected<std::vector<sim_request>> make_workload(const scenario& s, std::uint64_t seed) {
  auto flat = make_flat_workload(s, seed);
  if (!flat) return flat;
  auto out = diurnal(s.workload, std::move(*flat), seed);
  if (s.workload.kind == sim_workload_kind::trace && s.workload.conversations.apps > 0)
    make_conversations(out, s.workload.conversations, seed);
  return out;
}

namespace {

std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Segment keys by kind, so a system prompt, a user turn and an answer never
// share ids by accident.
constexpr std::uint64_t system_key = 1ull << 62;
constexpr std::uint64_t user_key = 2ull << 62;
constexpr std::uint64_t answer_key = 3ull << 62;

struct open_conversation {
  std::uint64_t id = 0;
  std::vector<token_segment> history;  // the last prompt and its answer
  std::uint32_t length = 0;            // tokens of history
  std::uint32_t turns = 0;
};

}  // namespace

std::vector<std::int32_t> segment_prompt_ids(const std::vector<token_segment>& segments, std::uint32_t vocab) {
  EXA_ASSERT(vocab > 3);
  std::vector<std::int32_t> ids;
  for (const auto& s : segments) {
    const std::uint64_t base = mix64(s.key);
    for (std::uint32_t j = 0; j < s.tokens; ++j)
      ids.push_back(static_cast<std::int32_t>(3 + mix64(base + j) % (vocab - 3)));
  }
  return ids;
}

void make_conversations(std::vector<sim_request>& requests, const conversation_spec& spec, std::uint64_t seed) {
  EXA_ASSERT(spec.apps > 0 && spec.open_max > 0 && spec.turns_max > 0);
  splitmix64_stream rng(seed ^ 0xc0417e45a7105ULL);
  std::deque<open_conversation> open;  // oldest first
  std::uint64_t next_id = 0;
  std::vector<std::size_t> fits;
  for (auto& r : requests) {
    const std::uint32_t c = r.prompt_tokens;
    fits.clear();
    if (rng.uniform() < spec.continue_probability)
      for (std::size_t i = 0; i < open.size(); ++i)
        if (open[i].length < c) fits.push_back(i);
    if (!fits.empty()) {
      const std::size_t at = fits[rng.below(static_cast<std::uint32_t>(fits.size()))];
      open_conversation conv = std::move(open[at]);
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(at));
      r.segments = conv.history;
      r.segments.push_back({user_key | (mix64(conv.id * 1024 + conv.turns) >> 2), c - conv.length});
      conv.history = r.segments;
      conv.history.push_back({answer_key | (mix64(conv.id * 1024 + conv.turns) >> 2), r.max_tokens});
      conv.length = c + r.max_tokens;
      if (++conv.turns < spec.turns_max) open.push_back(std::move(conv));
    } else {
      open_conversation conv;
      conv.id = next_id++;
      const std::uint32_t app = rng.below(spec.apps);
      const std::uint32_t system = std::min(spec.system_prompt_tokens, c > 0 ? c - 1 : 0);
      if (system > 0) r.segments.push_back({system_key | app, system});
      r.segments.push_back({user_key | (mix64(conv.id * 1024) >> 2), c - system});
      conv.history = r.segments;
      conv.history.push_back({answer_key | (mix64(conv.id * 1024) >> 2), r.max_tokens});
      conv.length = c + r.max_tokens;
      conv.turns = 1;
      if (conv.turns < spec.turns_max) open.push_back(std::move(conv));
    }
    if (open.size() > spec.open_max) open.pop_front();
  }
}

}  // namespace exa::chaos
