#include "metrics/aggregate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace exa::metrics {

namespace {

using label_map = std::map<std::string, std::string>;

constexpr std::string_view overflow_value = "_overflow";

struct accum {
  double value = 0;
  bool has_value = false;
  std::vector<std::uint64_t> buckets;
  double sum = 0;
};

struct family_accum {
  family_snapshot meta;                // name, help, type, bounds; label_names filled at the end
  std::vector<std::string> label_order;  // first-seen order of the output labels
  std::map<label_map, accum> series;
  bool max_gauge = false;
};

void combine(family_accum& f, accum& into, const series_snapshot& s) {
  if (f.meta.type == metric_type::histogram) {
    if (into.buckets.empty()) into.buckets.assign(s.bucket_counts.size(), 0);
    for (std::size_t i = 0; i < s.bucket_counts.size() && i < into.buckets.size(); ++i)
      into.buckets[i] += s.bucket_counts[i];
    into.sum += s.sum;
    into.has_value = true;
    return;
  }
  if (f.max_gauge) {
    if (std::isnan(s.value)) return;
    into.value = into.has_value ? std::max(into.value, s.value) : s.value;
  } else {
    into.value += s.value;
  }
  into.has_value = true;
}

void combine(family_accum& f, accum& into, const accum& from) {
  series_snapshot s;
  s.value = from.value;
  s.bucket_counts = from.buckets;
  s.sum = from.sum;
  if (from.has_value || f.meta.type == metric_type::histogram) combine(f, into, s);
}

}  // namespace

bool default_max_gauge(std::string_view name) {
  return name.ends_with("_ratio") || name.ends_with("_utilization") || name.ends_with("_temperature_celsius") ||
         name.ends_with("_max");
}

registry_snapshot aggregate(std::span<const registry_snapshot> sources, const aggregation_rule& rule,
                            aggregation_report* report) {
  aggregation_report local;
  aggregation_report& r = report ? *report : local;
  r = {};
  std::map<std::string, family_accum> families;
  for (std::size_t si = 0; si < sources.size(); ++si) {
    for (const auto& f : sources[si].families) {
      auto [it, fresh] = families.try_emplace(f.name);
      auto& acc = it->second;
      if (fresh) {
        acc.meta.name = f.name;
        acc.meta.help = f.help;
        acc.meta.type = f.type;
        acc.meta.bounds = f.bounds;
        acc.max_gauge = f.type == metric_type::gauge && (rule.max_gauges.count(f.name) || default_max_gauge(f.name));
      } else if (acc.meta.type != f.type) {
        r.conflicts.push_back(fmt::format("{}: type {} here, {} before (source {})", f.name, to_string(f.type),
                                          to_string(acc.meta.type), si));
        continue;
      } else if (acc.meta.bounds != f.bounds) {
        r.conflicts.push_back(fmt::format("{}: histogram bounds differ (source {})", f.name, si));
        continue;
      }
      for (const auto& name : f.label_names)
        if (!rule.drop_labels.count(name) &&
            std::find(acc.label_order.begin(), acc.label_order.end(), name) == acc.label_order.end())
          acc.label_order.push_back(name);
      for (const auto& [name, _] : rule.add_labels)
        if (std::find(acc.label_order.begin(), acc.label_order.end(), name) == acc.label_order.end())
          acc.label_order.push_back(name);
      for (const auto& s : f.series) {
        if (s.label_values.size() != f.label_names.size()) continue;  // malformed snapshot: skip the series
        if (f.type == metric_type::histogram && s.bucket_counts.size() != f.bounds.size() + 1) continue;
        ++r.series_in;
        label_map labels;
        for (std::size_t i = 0; i < f.label_names.size(); ++i)
          if (!rule.drop_labels.count(f.label_names[i]) && !s.label_values[i].empty())
            labels[f.label_names[i]] = s.label_values[i];
        for (const auto& [name, value] : rule.add_labels) labels.try_emplace(name, value);
        combine(acc, acc.series[labels], s);
      }
    }
  }

  registry_snapshot out;
  for (auto& [name, acc] : families) {
    if (acc.series.empty()) continue;
    // The bound: the first series_max - 1 label sets (in order) stay, the
    // rest fold into the overflow series, which always has room.
    const std::size_t cap = std::max<std::size_t>(rule.series_max, 1);
    if (acc.series.size() > cap) {
      label_map overflow;
      for (const auto& n : acc.label_order) overflow[n] = std::string(overflow_value);
      // The level's own labels stay: the overflow of rack 3 still says rack 3.
      for (const auto& [name, value] : rule.add_labels) overflow[name] = value;
      accum folded_into = acc.series.count(overflow) ? acc.series[overflow] : accum{};
      acc.series.erase(overflow);
      std::size_t kept = 0, folded = 0;
      for (auto it = acc.series.begin(); it != acc.series.end();) {
        if (kept < cap - 1) {
          ++kept;
          ++it;
          continue;
        }
        combine(acc, folded_into, it->second);
        it = acc.series.erase(it);
        ++folded;
      }
      acc.series[overflow] = folded_into;
      r.folded += folded;
      r.folded_by_family[name] += folded;
    }
    family_snapshot f = std::move(acc.meta);
    f.label_names = acc.label_order;
    for (auto& [labels, a] : acc.series) {
      series_snapshot s;
      for (const auto& n : f.label_names) {
        const auto l = labels.find(n);
        s.label_values.push_back(l == labels.end() ? std::string() : l->second);
      }
      s.value = a.value;
      s.bucket_counts = std::move(a.buckets);
      if (f.type == metric_type::histogram && s.bucket_counts.empty()) s.bucket_counts.assign(f.bounds.size() + 1, 0);
      s.sum = a.sum;
      f.series.push_back(std::move(s));
    }
    std::sort(f.series.begin(), f.series.end(),
              [](const series_snapshot& a, const series_snapshot& b) { return a.label_values < b.label_values; });
    r.series_out += f.series.size();
    out.families.push_back(std::move(f));
  }
  return out;
}

// ---- counter_continuity ------------------------------------------------------------

namespace {

std::vector<std::string> key_labels(const family_snapshot& f, const series_snapshot& s) {
  std::vector<std::string> k;
  for (std::size_t i = 0; i < f.label_names.size() && i < s.label_values.size(); ++i) {
    if (s.label_values[i].empty()) continue;
    k.push_back(f.label_names[i]);
    k.push_back(s.label_values[i]);
  }
  return k;
}

bool went_down(const std::vector<std::uint64_t>& now, const std::vector<std::uint64_t>& before) {
  std::uint64_t a = 0, b = 0;
  for (const auto c : now) a += c;
  for (const auto c : before) b += c;
  return a < b;
}

}  // namespace

registry_snapshot counter_continuity::next(const registry_snapshot& scrape) {
  registry_snapshot out = scrape;
  std::set<key> seen;
  for (auto& f : out.families) {
    if (f.type == metric_type::gauge) continue;
    for (auto& s : f.series) {
      key k{f.name, key_labels(f, s)};
      seen.insert(k);
      auto [it, fresh] = carried_.try_emplace(k);
      auto& st = it->second;
      if (f.type == metric_type::histogram) {
        if (st.carry_buckets.size() != s.bucket_counts.size()) {
          // First sight, or the bounds changed: start over from this scrape.
          st.carry_buckets.assign(s.bucket_counts.size(), 0);
          st.carry_sum = 0;
          st.last_buckets.clear();
        } else if (!fresh && went_down(s.bucket_counts, st.last_buckets)) {
          for (std::size_t i = 0; i < st.carry_buckets.size(); ++i) st.carry_buckets[i] += st.last_buckets[i];
          st.carry_sum += st.last_sum;
        }
        st.last_buckets = s.bucket_counts;
        st.last_sum = s.sum;
        for (std::size_t i = 0; i < s.bucket_counts.size(); ++i) s.bucket_counts[i] += st.carry_buckets[i];
        s.sum += st.carry_sum;
      } else {
        if (!fresh && s.value < st.last_value) st.carry_value += st.last_value;
        st.last_value = s.value;
        s.value += st.carry_value;
      }
    }
  }
  // Counter series the source no longer exposes keep their last value.
  for (const auto& f : last_.families) {
    if (f.type == metric_type::gauge) continue;
    auto target = std::find_if(out.families.begin(), out.families.end(),
                               [&](const family_snapshot& o) { return o.name == f.name; });
    if (target != out.families.end() && (target->type != f.type || target->label_names != f.label_names ||
                                          target->bounds != f.bounds))
      continue;  // redefined: the old series cannot be expressed in the new shape
    for (const auto& s : f.series) {
      key k{f.name, key_labels(f, s)};
      if (seen.count(k)) continue;
      if (target == out.families.end()) {
        family_snapshot copy = f;
        copy.series.clear();
        out.families.push_back(std::move(copy));
        target = std::prev(out.families.end());
      }
      target->series.push_back(s);
      seen.insert(k);
      // A series that comes back later starts a new run: its raw value
      // counts on top of what it had reached.
      auto& st = carried_[k];
      st.carry_value = s.value;
      st.last_value = 0;
      st.carry_buckets = s.bucket_counts;
      st.carry_sum = s.sum;
      st.last_buckets.assign(s.bucket_counts.size(), 0);
      st.last_sum = 0;
    }
  }
  std::sort(out.families.begin(), out.families.end(),
            [](const family_snapshot& a, const family_snapshot& b) { return a.name < b.name; });
  for (auto& f : out.families)
    std::sort(f.series.begin(), f.series.end(),
              [](const series_snapshot& a, const series_snapshot& b) { return a.label_values < b.label_values; });
  last_ = out;
  return out;
}

registry_snapshot counter_continuity::pass_through(const registry_snapshot& scrape) {
  carried_.clear();
  last_ = scrape;
  return scrape;
}

registry_snapshot counter_continuity::counters_only() const {
  registry_snapshot out;
  for (const auto& f : last_.families)
    if (f.type != metric_type::gauge) out.families.push_back(f);
  return out;
}

// ---- scrape_aggregator ---------------------------------------------------------------

scrape_aggregator::scrape_aggregator(std::string name, std::vector<std::string> targets, aggregation_rule rule,
                                     parse_limits limits)
    : name_(std::move(name)), rule_(std::move(rule)), limits_(limits) {
  for (auto& t : targets) {
    target_state state;
    state.url = std::move(t);
    targets_.push_back(std::move(state));
  }
  continuity_.resize(targets_.size());
  latest_.resize(targets_.size());
}

std::pair<std::size_t, std::size_t> scrape_aggregator::set_targets(const std::vector<std::string>& urls) {
  std::map<std::string, std::size_t> now;
  for (std::size_t i = 0; i < targets_.size(); ++i) now[targets_[i].url] = i;
  std::vector<target_state> targets;
  std::vector<counter_continuity> continuity;
  std::vector<registry_snapshot> latest;
  std::set<std::string> kept;
  std::size_t added = 0;
  for (const auto& url : urls) {
    if (!kept.insert(url).second) continue;  // listed twice
    if (const auto it = now.find(url); it != now.end()) {
      targets.push_back(std::move(targets_[it->second]));
      continuity.push_back(std::move(continuity_[it->second]));
      latest.push_back(std::move(latest_[it->second]));
    } else if (auto d = departed_.find(url); d != departed_.end()) {
      targets.push_back(std::move(d->second.state));
      continuity.push_back(std::move(d->second.continuity));
      latest.push_back(std::move(d->second.frozen));
      departed_.erase(d);
      ++added;
    } else {
      target_state t;
      t.url = url;
      targets.push_back(std::move(t));
      continuity.emplace_back();
      latest.emplace_back();
      ++added;
    }
  }
  std::size_t removed = 0;
  for (const auto& [url, i] : now) {
    if (kept.count(url)) continue;
    departed d;
    d.frozen = continuity_[i].counters_only();
    d.state = std::move(targets_[i]);
    d.state.up = false;
    d.continuity = std::move(continuity_[i]);
    d.order = ++departures_;
    departed_[url] = std::move(d);
    ++removed;
  }
  while (departed_.size() > departed_max) {
    auto oldest = std::min_element(departed_.begin(), departed_.end(),
                                   [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    departed_.erase(oldest);
  }
  targets_ = std::move(targets);
  continuity_ = std::move(continuity);
  latest_ = std::move(latest);
  return {added, removed};
}

void scrape_aggregator::on_scrape(std::size_t index, const expected<std::string>& body, std::int64_t now_ms) {
  if (index >= targets_.size()) return;
  auto& t = targets_[index];
  expected<registry_snapshot> parsed =
      body ? parse_prometheus(*body, limits_) : expected<registry_snapshot>(std::unexpected(body.error()));
  if (!parsed) {
    t.up = false;
    ++t.errors;
    t.last_error = parsed.error().message;
    latest_[index] = continuity_[index].counters_only();
    return;
  }
  t.up = true;
  t.last_error.clear();
  t.last_success_ms = now_ms;
  t.series = 0;
  t.aggregator = false;
  for (const auto& f : parsed->families) {
    t.series += f.series.size();
    if (f.name == "exaserve_aggregator_target_up") t.aggregator = true;
  }
  latest_[index] = t.aggregator ? continuity_[index].pass_through(*parsed) : continuity_[index].next(*parsed);
}

namespace {

struct own_families_t {
  gauge_family* up;
  counter_family* errors;
  gauge_family* series;
  gauge_family* folded;
  gauge_family* conflicts;
};

own_families_t register_own(registry& own) {
  own_families_t f;
  f.up = *own.register_gauge("exaserve_aggregator_target_up", "1 when the aggregator's last scrape of the target succeeded.",
                             {"aggregator", "target"});
  f.errors = *own.register_counter("exaserve_aggregator_scrape_errors_total",
                                   "Failed scrapes of a target (unreachable, timed out, unparsable).",
                                   {"aggregator", "target"});
  f.series = *own.register_gauge("exaserve_aggregator_series", "Series this aggregator exposes.", {"aggregator"});
  f.folded = *own.register_gauge("exaserve_aggregator_series_folded",
                                 "Series folded into a family's _overflow series by the series bound.",
                                 {"aggregator", "family"});
  f.conflicts = *own.register_gauge("exaserve_aggregator_conflicts",
                                    "Families left out of a target because they disagree with another's.",
                                    {"aggregator"});
  return f;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> scrape_aggregator::own_families() {
  registry own;
  register_own(own);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : own.snapshot().families) out.emplace_back(f.name, std::string(to_string(f.type)));
  return out;
}

registry_snapshot scrape_aggregator::result(aggregation_report* report) const {
  aggregation_report local;
  aggregation_report& r = report ? *report : local;
  std::vector<registry_snapshot> sources = latest_;
  for (const auto& [url, d] : departed_) sources.push_back(d.frozen);
  auto out = aggregate(sources, rule_, &r);
  registry own;
  const auto [up, errors, series, folded, conflicts] = register_own(own);
  for (const auto& t : targets_) {
    (*up->with({name_, t.url}))->set(t.up ? 1 : 0);
    (*errors->with({name_, t.url}))->inc(t.errors);
  }
  (*series->with({name_}))->set(static_cast<double>(r.series_out));
  for (const auto& [family, n] : r.folded_by_family) (*folded->with({name_, family}))->set(static_cast<double>(n));
  (*conflicts->with({name_}))->set(static_cast<double>(r.conflicts.size()));
  // The aggregator's own families go beside the aggregate; where a target
  // exports them too (a rack aggregator below a global one), they merge by
  // their labels like any family.
  aggregation_rule beside;
  beside.series_max = rule_.series_max;
  beside.max_gauges = rule_.max_gauges;
  const registry_snapshot both[] = {std::move(out), own.snapshot()};
  return aggregate(both, beside);
}

}  // namespace exa::metrics
