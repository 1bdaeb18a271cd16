#include "metrics/prometheus.hpp"

#include <charconv>
#include <cmath>

#include "common/assert.hpp"

namespace exa::metrics {

namespace {

std::string escape(std::string_view text, bool quotes) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// Appends `{a="x",b="y"}` (plus `le` when given), or nothing when there are no labels.
void append_labels(std::string& out, const family_snapshot& fam, const series_snapshot& s,
                   std::string_view le = {}) {
  EXA_ASSERT(s.label_values.size() == fam.label_names.size());
  if (fam.label_names.empty() && le.empty()) return;
  out += '{';
  for (std::size_t i = 0; i < fam.label_names.size(); ++i) {
    if (i > 0) out += ',';
    out += fam.label_names[i];
    out += "=\"";
    out += escape_label_value(s.label_values[i]);
    out += '"';
  }
  if (!le.empty()) {
    if (!fam.label_names.empty()) out += ',';
    out += "le=\"";
    out += le;
    out += '"';
  }
  out += '}';
}

void append_sample(std::string& out, std::string_view name, std::string_view suffix,
                   const family_snapshot& fam, const series_snapshot& s, double value,
                   std::string_view le = {}) {
  out += name;
  out += suffix;
  append_labels(out, fam, s, le);
  out += ' ';
  out += format_sample_value(value);
  out += '\n';
}

void append_histogram(std::string& out, const family_snapshot& fam, const series_snapshot& s) {
  EXA_ASSERT(s.bucket_counts.size() == fam.bounds.size() + 1);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < fam.bounds.size(); ++i) {
    cumulative += s.bucket_counts[i];
    append_sample(out, fam.name, "_bucket", fam, s, static_cast<double>(cumulative),
                  format_sample_value(fam.bounds[i]));
  }
  cumulative += s.bucket_counts.back();
  append_sample(out, fam.name, "_bucket", fam, s, static_cast<double>(cumulative), "+Inf");
  append_sample(out, fam.name, "_sum", fam, s, s.sum);
  append_sample(out, fam.name, "_count", fam, s, static_cast<double>(cumulative));
}

}  // namespace

std::string escape_label_value(std::string_view value) { return escape(value, true); }

std::string escape_help(std::string_view help) { return escape(help, false); }

std::string format_sample_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  EXA_ASSERT(result.ec == std::errc{});
  return std::string(buffer, result.ptr);
}

std::string render_prometheus(const registry_snapshot& snapshot) {
  std::string out;
  for (const auto& fam : snapshot.families) {
    // Like the reference client: a family without series is not exposed.
    if (fam.series.empty()) continue;
    out += "# HELP ";
    out += fam.name;
    out += ' ';
    out += escape_help(fam.help);
    out += "\n# TYPE ";
    out += fam.name;
    out += ' ';
    out += to_string(fam.type);
    out += '\n';
    for (const auto& s : fam.series) {
      if (fam.type == metric_type::histogram) {
        append_histogram(out, fam, s);
      } else {
        append_sample(out, fam.name, "", fam, s, s.value);
      }
    }
  }
  return out;
}

}  // namespace exa::metrics
