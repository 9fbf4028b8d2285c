#include "core/yaml_reader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace moesim::yaml {

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (an empty value)";
  if (node.IsSequence()) return fmt::format("a list of {} item(s)", node.size());
  if (node.IsMap()) return "a map";
  // Scalars: quote, keep to one short line (the CLI prints errors on one line).
  std::string text;
  for (char c : node.Scalar()) {
    if (c == '\n') {
      text += "\\n";
    } else if (c == '\r' || c == '\t') {
      text += ' ';
    } else {
      text += c;
    }
  }
  if (text.size() > 48) text = text.substr(0, 45) + "...";
  return "'" + text + "'";
}

namespace {
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, word.size() / 3) + 1;
  for (auto c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = std::string(c);
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string_view>& candidates) {
  std::string m = closest_match(word, candidates);
  return m.empty() ? std::string() : fmt::format(" (did you mean '{}'?)", m);
}

std::string join_alternatives(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += (i + 1 == items.size()) ? " or " : ", ";
    out += items[i];
  }
  return out;
}

SourceLocation Context::at(const YAML::Node& node) const {
  SourceLocation loc{file_, 0, 0};
  if (node.IsDefined()) {
    YAML::Mark m = node.Mark();
    if (m.line >= 0) {
      loc.line = m.line + 1;
      loc.column = m.column + 1;
    }
  }
  return loc;
}

void Context::fail(const YAML::Node& node, const std::string& path,
                   const std::string& message) const {
  throw InputError(at(node), path, message);
}

void Context::fail(const SourceLocation& loc, const std::string& path,
                   const std::string& message) const {
  throw InputError(loc, path, message);
}

SourceLocation Context::location_of(const std::string& path) const {
  if (auto it = locations_.find(path); it != locations_.end()) return it->second;
  return SourceLocation{file_, 0, 0};
}

namespace {
// Scalars only: lists, maps and empty values where a scalar belongs are type errors.
const std::string& scalar_or_fail(const Context& ctx, const YAML::Node& node,
                                  const std::string& path, std::string_view expected) {
  if (!node.IsDefined() || !node.IsScalar())
    ctx.fail(node, path, fmt::format("found {}, expected {}", describe(node), expected));
  return node.Scalar();
}
}  // namespace

std::string Context::to_string(const YAML::Node& node, const std::string& path) const {
  return scalar_or_fail(*this, node, path, "a text value");
}

namespace {
std::string bound_text(std::int64_t v) {
  // The type limits read better as powers of two than as 19-digit numbers.
  if (v == std::numeric_limits<std::int64_t>::max()) return "2^63-1";
  if (v == std::numeric_limits<std::int64_t>::min()) return "-2^63";
  if (v == std::numeric_limits<int>::max()) return "2^31-1";
  if (v == -std::numeric_limits<int>::max()) return "-(2^31-1)";
  if (v == std::numeric_limits<int>::min()) return "-2^31";
  return fmt::format("{}", v);
}
}  // namespace

std::string int_range_text(std::int64_t min, std::int64_t max) {
  // Every accepted range is stated in full, upper bound included: a value past a technical limit
  // is an error the user must be able to anticipate from the message.
  return fmt::format("an integer in [{}, {}]", bound_text(min), bound_text(max));
}

std::int64_t Context::to_int(const YAML::Node& node, const std::string& path, std::int64_t min,
                             std::int64_t max) const {
  const std::string expected = int_range_text(min, max);
  const std::string& s = scalar_or_fail(*this, node, path, expected);
  std::string_view text = s;
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
    fail(node, path, fmt::format("found {}, expected {}", describe(node), expected));
  if (v < min || v > max) fail(node, path, fmt::format("found {}, expected {}", v, expected));
  return v;
}

double Context::to_number(const YAML::Node& node, const std::string& path) const {
  const std::string& s = scalar_or_fail(*this, node, path, "a number");
  std::string_view text = s;
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(v)) {
    // "300GB/s" where a plain number belongs: say so rather than "not a number".
    fail(node, path, fmt::format("found {}, expected a plain number (no unit)", describe(node)));
  }
  return v;
}

bool Context::to_bool(const YAML::Node& node, const std::string& path) const {
  const std::string& s = scalar_or_fail(*this, node, path, "true or false");
  static const std::vector<std::string_view> kTrue = {"true", "True", "TRUE", "yes", "Yes", "on"};
  static const std::vector<std::string_view> kFalse = {"false", "False", "FALSE",
                                                       "no",    "No",    "off"};
  if (std::find(kTrue.begin(), kTrue.end(), s) != kTrue.end()) return true;
  if (std::find(kFalse.begin(), kFalse.end(), s) != kFalse.end()) return false;
  fail(node, path, fmt::format("found {}, expected true or false", describe(node)));
}

double Context::to_quantity(const YAML::Node& node, const std::string& path, UnitKind kind) const {
  const std::string& s = scalar_or_fail(*this, node, path, std::string(unit_kind_name(kind)));
  ParsedQuantity q = parse_quantity(s, kind);
  if (!q.value) fail(node, path, q.error);
  // Far above any real hardware, far below where products of sizes and rates leave the doubles'
  // exact or finite range (1e308Gb/s is infinite in bytes per second).
  const double max = max_quantity(kind);
  if (!(*q.value <= max))
    fail(node, path,
         fmt::format("found '{}', expected {} of at most {}", s, unit_kind_name(kind),
                     max_quantity_text(kind)));
  return *q.value;
}

std::size_t Context::to_choice(const YAML::Node& node, const std::string& path,
                               const std::vector<std::string_view>& names) const {
  std::string expected = "one of " + join_alternatives(names);
  const std::string& s = scalar_or_fail(*this, node, path, expected);
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return i;
  fail(node, path,
       fmt::format("found {}, expected {}{}", describe(node), expected, did_you_mean(s, names)));
}

YAML::Node Context::require_list(const YAML::Node& node, const std::string& path) {
  if (!node.IsDefined() || !node.IsSequence())
    fail(node, path, fmt::format("found {}, expected a list", describe(node)));
  for (std::size_t i = 0; i < node.size(); ++i) record(fmt::format("{}[{}]", path, i), at(node[i]));
  return node;
}

MapReader::MapReader(Context& ctx, const YAML::Node& node, std::string path,
                     std::vector<std::string_view> known, std::optional<SourceLocation> where)
    : ctx_(&ctx), node_(node), path_(std::move(path)) {
  where_ = where ? *where : ctx.at(node);
  std::string what = path_.empty() ? "the document" : "'" + path_ + "'";
  if (!node.IsDefined() || !node.IsMap()) {
    ctx.fail(where_.line > 0 ? where_ : ctx.at(node), path_,
             fmt::format("found {}, expected a map with keys {}", describe(node),
                         join_alternatives(known)));
  }
  // Copies, not `it->first` references: GCC 12 flags yaml-cpp's iterator proxies as dangling.
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::detail::iterator_value kv = *it;
    const YAML::Node k = kv.first;
    const YAML::Node value = kv.second;
    if (!k.IsScalar())
      ctx.fail(k, path_, fmt::format("found {} as a key, expected a key name", describe(k)));
    const std::string& name = k.Scalar();
    std::string key_path = path_of(name);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      ctx.fail(k, key_path,
               fmt::format("unknown key '{}' in {}{}; expected one of {}", name, what,
                           did_you_mean(name, known), join_alternatives(known)));
    }
    if (entries_.count(name))
      ctx.fail(k, key_path, fmt::format("duplicate key '{}' in {}", name, what));
    entries_.emplace(name, Entry{k, value});
    order_.push_back(name);
    ctx.record(key_path, ctx.at(k));
  }
}

std::string MapReader::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

YAML::Node MapReader::get(std::string_view key) const {
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) return YAML::Node(YAML::NodeType::Undefined);
  return it->second.value;
}

SourceLocation MapReader::location(std::string_view key) const {
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) return where_;
  // Empty values and nodes built in memory have no useful mark: use the key's.
  SourceLocation v = ctx_->at(it->second.value);
  if (v.line > 0 && !it->second.value.IsNull()) return v;
  SourceLocation k = ctx_->at(it->second.key);
  return k.line > 0 ? k : where_;
}

SourceLocation MapReader::key_location(std::string_view key) const {
  auto it = entries_.find(std::string(key));
  if (it == entries_.end()) return where_;
  SourceLocation k = ctx_->at(it->second.key);
  return k.line > 0 ? k : where_;
}

void MapReader::fail(std::string_view key, const std::string& message) const {
  ctx_->fail(location(key), path_of(key), message);
}

void MapReader::fail_here(const std::string& message) const { ctx_->fail(where_, path_, message); }

void MapReader::require(std::string_view key, std::string_view what) const {
  if (has(key)) return;
  std::string in = path_.empty() ? "at the top level" : "in '" + path_ + "'";
  ctx_->fail(where_, path_of(key),
             fmt::format("missing required key '{}' {} (expected {})", key, in, what));
}

// The typed getters below re-anchor conversion errors at location(key): an empty value has no
// useful mark of its own, its key has.

std::optional<std::string> MapReader::get_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  YAML::Node v = get(key);
  if (!v.IsScalar()) fail(key, fmt::format("found {}, expected a text value", describe(v)));
  return v.Scalar();
}

std::optional<std::int64_t> MapReader::get_int(std::string_view key, std::int64_t min,
                                               std::int64_t max) const {
  if (!has(key)) return std::nullopt;
  try {
    return ctx_->to_int(get(key), path_of(key), min, max);
  } catch (const InputError& e) {
    fail(key, e.message());
  }
}

std::optional<double> MapReader::get_number(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  try {
    return ctx_->to_number(get(key), path_of(key));
  } catch (const InputError& e) {
    fail(key, e.message());
  }
}

std::optional<bool> MapReader::get_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  try {
    return ctx_->to_bool(get(key), path_of(key));
  } catch (const InputError& e) {
    fail(key, e.message());
  }
}

std::optional<double> MapReader::get_quantity(std::string_view key, UnitKind kind) const {
  if (!has(key)) return std::nullopt;
  try {
    return ctx_->to_quantity(get(key), path_of(key), kind);
  } catch (const InputError& e) {
    fail(key, e.message());
  }
}

std::optional<std::size_t> MapReader::get_choice(std::string_view key,
                                                 const std::vector<std::string_view>& names) const {
  if (!has(key)) return std::nullopt;
  try {
    return ctx_->to_choice(get(key), path_of(key), names);
  } catch (const InputError& e) {
    fail(key, e.message());
  }
}

MapReader MapReader::get_map(std::string_view key, std::vector<std::string_view> known) const {
  auto it = entries_.find(std::string(key));
  MOESIM_ASSERT(it != entries_.end(), "get_map on an absent key");
  SourceLocation k = ctx_->at(it->second.key);
  return MapReader(*ctx_, it->second.value, path_of(key), std::move(known),
                   k.line > 0 ? std::optional<SourceLocation>(k) : std::nullopt);
}

}  // namespace moesim::yaml
