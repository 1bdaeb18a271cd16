#include "metrics/exposition.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <variant>

namespace exa::metrics {

namespace {

using label_map = std::map<std::string, std::string>;

bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

std::optional<double> parse_value(std::string_view t) {
  if (t == "+Inf" || t == "Inf") return std::numeric_limits<double>::infinity();
  if (t == "-Inf") return -std::numeric_limits<double>::infinity();
  if (t == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  double v = 0;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (r.ec != std::errc{} || r.ptr != t.data() + t.size()) return std::nullopt;
  return v;
}

struct sample {
  std::string name;
  label_map labels;
  double value = 0;
};

/// One sample line; an error message (without the line number) otherwise.
std::variant<sample, std::string> parse_sample(std::string_view line) {
  sample s;
  std::size_t i = 0;
  while (i < line.size() && name_char(line[i], i == 0)) ++i;
  if (i == 0) return std::string("expected a metric name");
  s.name = std::string(line.substr(0, i));
  if (i < line.size() && line[i] == '{') {
    ++i;
    std::set<std::string> seen;
    for (;;) {
      while (i < line.size() && line[i] == ' ') ++i;
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      const std::size_t start = i;
      while (i < line.size() && name_char(line[i], i == start) && line[i] != ':') ++i;
      if (i == start) return fmt::format("expected a label name at column {}", i + 1);
      std::string label(line.substr(start, i - start));
      if (i >= line.size() || line[i] != '=') return fmt::format("expected '=' after label '{}'", label);
      ++i;
      if (i >= line.size() || line[i] != '"') return fmt::format("expected '\"' to open the value of label '{}'", label);
      ++i;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (i >= line.size()) break;
          const char e = line[i++];
          if (e == 'n') value += '\n';
          else if (e == '\\' || e == '"') value += e;
          else return fmt::format("bad escape '\\{}' in the value of label '{}'", e, label);
        } else {
          value += c;
        }
      }
      if (!closed) return fmt::format("unterminated value of label '{}'", label);
      if (seen.count(label)) return fmt::format("label '{}' given twice", label);
      seen.insert(label);
      // An empty value is no label (Prometheus' rule): {a="x"} and
      // {a="x",b=""} are one series.
      if (!value.empty()) s.labels.emplace(label, std::move(value));
      while (i < line.size() && line[i] == ' ') ++i;
      if (i < line.size() && line[i] == ',') {
        ++i;
        continue;
      }
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      return fmt::format("expected ',' or '}}' after label '{}'", label);
    }
  }
  if (i >= line.size() || (line[i] != ' ' && line[i] != '\t')) return std::string("expected a space before the value");
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  std::size_t end = i;
  while (end < line.size() && line[end] != ' ' && line[end] != '\t') ++end;
  const auto value = parse_value(line.substr(i, end - i));
  if (!value) return fmt::format("'{}' is not a number", line.substr(i, end - i));
  s.value = *value;
  while (end < line.size() && (line[end] == ' ' || line[end] == '\t')) ++end;
  if (end < line.size()) {
    // A timestamp (integer milliseconds) may follow; nothing else may.
    std::int64_t ts = 0;
    const auto rest = line.substr(end);
    const auto r = std::from_chars(rest.data(), rest.data() + rest.size(), ts);
    if (r.ec != std::errc{} || r.ptr != rest.data() + rest.size())
      return fmt::format("unexpected '{}' after the value", rest);
  }
  return s;
}

struct histogram_series {
  std::map<double, double> cumulative;  // finite le -> count
  std::optional<double> inf, sum, count;
};

struct family_builder {
  std::string help;
  std::optional<metric_type> type;
  bool declared_untyped = false;
  std::vector<std::string> label_names;  // union, first-seen order
  std::map<label_map, double> values;    // counter, gauge
  std::map<label_map, histogram_series> histograms;
  std::size_t first_line = 0;

  void note_labels(const label_map& labels) {
    for (const auto& [name, _] : labels)
      if (std::find(label_names.begin(), label_names.end(), name) == label_names.end()) label_names.push_back(name);
  }
};

std::optional<metric_type> type_from(std::string_view t, bool& untyped) {
  untyped = false;
  if (t == "counter") return metric_type::counter;
  if (t == "gauge") return metric_type::gauge;
  if (t == "histogram") return metric_type::histogram;
  if (t == "untyped" || t == "unknown") {
    untyped = true;
    return metric_type::gauge;
  }
  return std::nullopt;
}

std::vector<std::string> values_for(const std::vector<std::string>& names, const label_map& labels) {
  std::vector<std::string> out;
  out.reserve(names.size());
  for (const auto& n : names) {
    const auto it = labels.find(n);
    out.push_back(it == labels.end() ? std::string() : it->second);
  }
  return out;
}

expected<std::uint64_t> as_count(double v, const std::string& family) {
  if (!(v >= 0) || v > 9.0e15 || std::floor(v) != v)
    return make_error(errc::invalid_argument,
                      fmt::format("histogram {}: bucket count {} is not a whole non-negative number", family, v));
  return static_cast<std::uint64_t>(v);
}

expected<family_snapshot> finish_histogram(const std::string& name, family_builder& b) {
  family_snapshot f;
  f.name = name;
  f.help = b.help;
  f.type = metric_type::histogram;
  f.label_names = b.label_names;
  bool first = true;
  for (auto& [labels, h] : b.histograms) {
    std::vector<double> bounds;
    for (const auto& [le, _] : h.cumulative) bounds.push_back(le);
    if (first) {
      f.bounds = bounds;
      first = false;
    } else if (bounds != f.bounds) {
      return make_error(errc::invalid_argument,
                        fmt::format("histogram {}: its series have different bucket bounds", name));
    }
    if (!h.inf)
      return make_error(errc::invalid_argument, fmt::format("histogram {}: a series has no le=\"+Inf\" bucket", name));
    series_snapshot s;
    s.label_values = values_for(b.label_names, labels);
    std::uint64_t previous = 0;
    auto add = [&](double cumulative) -> expected<void> {
      auto c = as_count(cumulative, name);
      if (!c) return std::unexpected(c.error());
      if (*c < previous)
        return make_error(errc::invalid_argument,
                          fmt::format("histogram {}: cumulative bucket counts decrease ({} after {})", name, *c,
                                      previous));
      s.bucket_counts.push_back(*c - previous);
      previous = *c;
      return {};
    };
    for (const auto& [le, c] : h.cumulative)
      if (auto r = add(c); !r) return std::unexpected(r.error());
    if (auto r = add(*h.inf); !r) return std::unexpected(r.error());
    if (h.count && *h.count != *h.inf)
      return make_error(errc::invalid_argument,
                        fmt::format("histogram {}: _count {} differs from the +Inf bucket {}", name, *h.count, *h.inf));
    s.sum = h.sum.value_or(0);
    f.series.push_back(std::move(s));
  }
  return f;
}

}  // namespace

expected<registry_snapshot> parse_prometheus(std::string_view text, const parse_limits& limits) {
  if (text.size() > limits.max_bytes)
    return make_error(errc::invalid_argument,
                      fmt::format("scrape of {} bytes is over the limit of {} bytes", text.size(), limits.max_bytes));
  std::map<std::string, family_builder> families;
  std::size_t samples = 0;
  std::size_t line_no = 0;
  auto fail = [&](const std::string& why) {
    return make_error(errc::invalid_argument, fmt::format("line {}: {}", line_no, why));
  };
  // The family a histogram part belongs to: name minus its suffix, when
  // that family is declared a histogram.
  auto histogram_part = [&](const std::string& name) -> std::pair<std::string, std::string_view> {
    for (const std::string_view suffix : {"_bucket", "_sum", "_count"}) {
      if (name.size() > suffix.size() && name.ends_with(suffix)) {
        const std::string base = name.substr(0, name.size() - suffix.size());
        const auto it = families.find(base);
        if (it != families.end() && it->second.type == metric_type::histogram) return {base, suffix};
      }
    }
    return {name, {}};
  };

  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    if (line.empty()) continue;
    if (line.front() == '#') {
      // "# HELP name text" / "# TYPE name type"; any other comment is skipped.
      std::string_view rest = line.substr(1);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      const bool help = rest.starts_with("HELP ");
      const bool type = rest.starts_with("TYPE ");
      if (!help && !type) continue;
      rest.remove_prefix(5);
      while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
      const std::size_t sp = rest.find(' ');
      const std::string name(rest.substr(0, sp));
      bool valid = !name.empty();
      for (std::size_t i = 0; i < name.size(); ++i) valid = valid && name_char(name[i], i == 0);
      if (!valid) return fail(fmt::format("'{}' is not a metric name", name));
      const std::string_view arg = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
      auto [it, fresh] = families.try_emplace(name);
      if (fresh) it->second.first_line = line_no;
      if (help) {
        std::string h;
        for (std::size_t i = 0; i < arg.size(); ++i) {
          if (arg[i] == '\\' && i + 1 < arg.size() && (arg[i + 1] == 'n' || arg[i + 1] == '\\')) {
            h += arg[i + 1] == 'n' ? '\n' : '\\';
            ++i;
          } else {
            h += arg[i];
          }
        }
        it->second.help = std::move(h);
      } else {
        bool untyped = false;
        const auto t = type_from(arg, untyped);
        if (!t) return fail(fmt::format("unknown type '{}' for {}", arg, name));
        if (!it->second.values.empty() || !it->second.histograms.empty())
          return fail(fmt::format("TYPE of {} comes after its samples", name));
        if (it->second.type && (*it->second.type != *t || it->second.declared_untyped != untyped))
          return fail(fmt::format("{} declared with two types", name));
        it->second.type = t;
        it->second.declared_untyped = untyped;
      }
      continue;
    }
    auto parsed = parse_sample(line);
    if (auto* why = std::get_if<std::string>(&parsed)) return fail(*why);
    auto& s = std::get<sample>(parsed);
    if (++samples > limits.max_series)
      return fail(fmt::format("more than {} samples in one scrape", limits.max_series));
    auto [family, suffix] = histogram_part(s.name);
    auto [it, fresh] = families.try_emplace(family);
    auto& b = it->second;
    if (fresh) b.first_line = line_no;
    if (!b.type) b.type = metric_type::gauge;  // a sample without TYPE is untyped
    if (b.type == metric_type::histogram) {
      if (suffix.empty()) return fail(fmt::format("histogram {} has a sample without _bucket, _sum or _count", family));
      std::optional<double> le;
      if (suffix == "_bucket") {
        const auto l = s.labels.find("le");
        if (l == s.labels.end()) return fail(fmt::format("{}_bucket without an le label", family));
        le = parse_value(l->second);
        if (!le || std::isnan(*le)) return fail(fmt::format("{}_bucket: le=\"{}\" is not a number", family, l->second));
        s.labels.erase(l);
      }
      b.note_labels(s.labels);
      auto& h = b.histograms[s.labels];
      if (suffix == "_sum") {
        if (h.sum) return fail(fmt::format("{}_sum given twice for one series", family));
        h.sum = s.value;
      } else if (suffix == "_count") {
        if (h.count) return fail(fmt::format("{}_count given twice for one series", family));
        h.count = s.value;
      } else if (std::isinf(*le) && *le > 0) {
        if (h.inf) return fail(fmt::format("{}_bucket le=\"+Inf\" given twice for one series", family));
        h.inf = s.value;
      } else if (!h.cumulative.emplace(*le, s.value).second) {
        return fail(fmt::format("{}_bucket le=\"{}\" given twice for one series", family, *le));
      }
      continue;
    }
    b.note_labels(s.labels);
    if (!b.values.emplace(s.labels, s.value).second) return fail(fmt::format("{}: a series given twice", family));
  }

  registry_snapshot out;
  for (auto& [name, b] : families) {
    if (b.values.empty() && b.histograms.empty()) continue;  // HELP/TYPE without samples
    if (*b.type == metric_type::histogram) {
      auto f = finish_histogram(name, b);
      if (!f) return std::unexpected(f.error());
      out.families.push_back(std::move(*f));
      continue;
    }
    family_snapshot f;
    f.name = name;
    f.help = b.help;
    f.type = *b.type;
    f.label_names = b.label_names;
    for (const auto& [labels, v] : b.values) {
      series_snapshot s;
      s.label_values = values_for(b.label_names, labels);
      s.value = v;
      f.series.push_back(std::move(s));
    }
    out.families.push_back(std::move(f));
  }
  for (auto& f : out.families)
    std::sort(f.series.begin(), f.series.end(),
              [](const series_snapshot& a, const series_snapshot& b) { return a.label_values < b.label_values; });
  return out;
}

}  // namespace exa::metrics
