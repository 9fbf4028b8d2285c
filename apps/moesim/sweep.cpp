#include "apps/moesim/sweep.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>

#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/serving_output.hpp"
#include "apps/moesim/stacks.hpp"
#include "core/scenario_loader.hpp"
#include "core/yaml_reader.hpp"
#include "sim/progress.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace fs = std::filesystem;

namespace {

// Upper bound on the points of one sweep: a typo in a range ({step: 0.0001}) should be an error,
// not an hour of work or an out-of-memory.
constexpr std::size_t kMaxPoints = 10'000'000;

struct Segment {
  std::string name;
  std::optional<std::size_t> index;
};

// "a.b[2].c" -> {a}, {b, 2}, {c}; nullopt when malformed.
std::optional<std::vector<Segment>> split_key_path(const std::string& key) {
  std::vector<Segment> out;
  std::size_t pos = 0;
  while (pos <= key.size()) {
    std::size_t dot = key.find('.', pos);
    std::string part = key.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    Segment seg;
    std::size_t br = part.find('[');
    seg.name = part.substr(0, br);
    if (br != std::string::npos) {
      if (part.back() != ']' || part.size() < br + 3) return std::nullopt;
      std::string digits = part.substr(br + 1, part.size() - br - 2);
      if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
      seg.index = std::stoul(digits);
    }
    if (seg.name.empty() || !std::all_of(seg.name.begin(), seg.name.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
        }))
      return std::nullopt;
    out.push_back(std::move(seg));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// Axis values are kept as text (the CSV writes them verbatim); structured values (lists, maps:
// a `tree:` or a strategy entry) are kept in YAML flow style and loaded back when applied.
YAML::Node value_node(const std::string& text) {
  if (!text.empty() && (text.front() == '[' || text.front() == '{')) return YAML::Load(text);
  return YAML::Node(text);
}

std::string node_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter em;
  em << YAML::Flow << n;
  return em.c_str();
}

// A range bound: its number and unit suffix ("100Gb/s" -> 100, "Gb/s").
struct Bound {
  double value = 0;
  std::string unit;
  bool integral = false;
};

std::optional<Bound> parse_bound(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  double v = std::strtod(begin, &end);
  if (end == begin || !std::isfinite(v)) return std::nullopt;
  Bound b;
  b.value = v;
  std::string rest(end);
  rest.erase(0, rest.find_first_not_of(' '));
  b.unit = rest;
  std::string num(begin, static_cast<const char*>(end));
  b.integral = num.find_first_of(".eE") == std::string::npos;
  return b;
}

std::string format_number(double v, bool integral, const std::string& unit) {
  if (integral) return fmt::format("{}{}", static_cast<long long>(std::llround(v)), unit);
  return fmt::format("{:.10g}{}", v, unit);
}

std::string join_values(const std::vector<std::string>& values) {
  std::string k;
  for (const auto& v : values) {
    k += v;
    k += '\x1f';
  }
  return k;
}

std::string describe_point(const SweepSpec& spec, const std::vector<std::string>& values) {
  std::string s;
  for (std::size_t a = 0; a < spec.axes.size(); ++a)
    s += fmt::format("{}{}={}", a ? ", " : "", spec.axes[a].key, values[a]);
  return s;
}

void apply_fixed_and(const SweepSpec& spec, YAML::Node tree) {
  for (std::size_t i = 0; i < spec.fixed.size(); ++i)
    set_key_path(tree, spec.fixed[i].first, YAML::Clone(spec.fixed[i].second),
                 spec.fixed_where[i].second);
}

bool key_within(const std::string& error_key, const std::string& axis_key) {
  if (error_key.rfind(axis_key, 0) != 0) return false;
  return error_key.size() == axis_key.size() || error_key[axis_key.size()] == '.' ||
         error_key[axis_key.size()] == '[';
}

std::string read_text(const std::string& path) {
  // Only regular files: a device such as /dev/zero would never end (the loaders refuse them too).
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  std::ifstream is(path);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Parsing

std::vector<std::string> expand_range(const YAML::Node& range, const std::string& file,
                                      const std::string& key) {
  yaml::Context ctx(file);
  yaml::MapReader m(ctx, range, key, {"from", "to", "times", "step"});
  m.require("from", "the first value");
  m.require("to", "the last value (inclusive)");
  if (m.has("times") == m.has("step"))
    m.fail_here("a range needs exactly one of 'times' (geometric) or 'step' (arithmetic)");
  auto bound = [&](std::string_view k) {
    std::string text = *m.get_string(k);
    auto b = parse_bound(text);
    if (!b) m.fail(k, fmt::format("found '{}', expected a number (optionally with a unit)", text));
    return *b;
  };
  Bound from = bound("from"), to = bound("to");
  if (to.unit != from.unit)
    m.fail("to",
           fmt::format("found unit '{}', expected the unit of 'from' ('{}')", to.unit, from.unit));
  std::vector<std::string> out;
  auto push = [&](double v, bool integral) {
    if (out.size() >= kMaxPoints) m.fail_here(fmt::format("range has over {} values", kMaxPoints));
    out.push_back(format_number(v, integral, from.unit));
  };
  if (m.has("step")) {
    Bound step = bound("step");
    if (!step.unit.empty() && step.unit != from.unit)
      m.fail("step", fmt::format("found unit '{}', expected the unit of 'from' ('{}') or none",
                                 step.unit, from.unit));
    double dir = to.value - from.value;
    if (step.value == 0 || (dir != 0 && (dir > 0) != (step.value > 0)))
      m.fail("step", fmt::format("found {}, expected a non-zero step towards 'to' ({} -> {})",
                                 step.value, from.value, to.value));
    bool integral = from.integral && to.integral && step.integral;
    // i * step rather than repeated addition, and a relative slack so 0.1 steps reach `to`.
    double slack = 1e-9 * std::fabs(step.value);
    for (std::size_t i = 0;; ++i) {
      double v = from.value + static_cast<double>(i) * step.value;
      if (step.value > 0 ? v > to.value + slack : v < to.value - slack) break;
      push(v, integral);
    }
  } else {
    Bound times = bound("times");
    if (!times.unit.empty()) m.fail("times", "found a unit, expected a plain factor");
    if (from.value <= 0 || to.value <= 0)
      m.fail_here("a geometric range ('times') needs 'from' and 'to' > 0");
    if (times.value <= 0 || times.value == 1 || (to.value > from.value) != (times.value > 1))
      if (to.value != from.value)
        m.fail("times", fmt::format("found {}, expected a factor that goes from {} towards {}",
                                    times.value, from.value, to.value));
    bool integral = from.integral && to.integral && times.integral;
    for (std::size_t i = 0;; ++i) {
      double v = from.value * std::pow(times.value, static_cast<double>(i));
      bool up = times.value > 1;
      if (up ? v > to.value * (1 + 1e-9) : v < to.value * (1 - 1e-9)) break;
      push(v, integral);
      if (to.value == from.value) break;
    }
  }
  return out;
}

SweepSpec parse_sweep(const YAML::Node& root, const std::string& file) {
  yaml::Context ctx(file);
  yaml::MapReader m(ctx, root, "",
                    {"name", "description", "base", "mode", "axes", "set", "strategies"});
  SweepSpec spec;
  spec.file = file;
  spec.name = m.get_string("name").value_or(fs::path(file).stem().string());
  spec.description = m.get_string("description").value_or("");
  m.require("base", "the base scenario file, relative to the sweep file");
  std::string base = *m.get_string("base");
  fs::path bp(base);
  if (bp.is_relative()) bp = fs::path(file).parent_path() / bp;
  // A bare name (no folder, no extension) beside no such file: a bundled scenario or preset.
  std::error_code ec;
  if (!fs::exists(bp, ec) && base.find_first_of("/.") == std::string::npos)
    bp = resolve_input(base, InputKind::kScenario);
  spec.base_path = bp.lexically_normal().string();
  if (auto mode = m.get_choice("mode", {"cartesian", "zip"}))
    spec.mode = *mode == 0 ? SweepMode::kCartesian : SweepMode::kZip;

  m.require("axes", "a map from scenario key paths to value lists or ranges");
  YAML::Node axes = m.get("axes");
  if (!axes.IsMap() || axes.size() == 0)
    m.fail("axes", fmt::format("found {}, expected a non-empty map from key paths to values",
                               yaml::describe(axes)));
  std::set<std::string> seen;
  for (auto it = axes.begin(); it != axes.end(); ++it) {
    const YAML::detail::iterator_value kv = *it;
    const YAML::Node k = kv.first;
    const YAML::Node v = kv.second;
    SweepAxis axis;
    axis.key = k.IsScalar() ? k.Scalar() : "";
    axis.where = ctx.at(k);
    std::string path = "axes." + axis.key;
    if (!split_key_path(axis.key))
      ctx.fail(k, path,
               fmt::format("found '{}', expected a key path like model.capacity_factor or "
                           "strategies[1].pipeline",
                           axis.key));
    if (!seen.insert(axis.key).second)
      ctx.fail(k, path, fmt::format("duplicate axis '{}'", axis.key));
    if (v.IsSequence()) {
      if (v.size() == 0) ctx.fail(v, path, "found an empty list, expected at least one value");
      for (std::size_t i = 0; i < v.size(); ++i) axis.values.push_back(node_text(v[i]));
    } else if (v.IsMap()) {
      axis.values = expand_range(v, file, path);
      axis.geometric = v["times"].IsDefined();
      if (axis.values.empty()) ctx.fail(v, path, "the range is empty");
    } else {
      ctx.fail(v, path,
               fmt::format("found {}, expected a list of values or a range {{from, to, times}} "
                           "/ {{from, to, step}}",
                           yaml::describe(v)));
    }
    spec.axes.push_back(std::move(axis));
  }
  if (spec.mode == SweepMode::kZip) {
    for (const auto& a : spec.axes)
      if (a.values.size() != spec.axes.front().values.size())
        throw InputError(
            a.where, "axes." + a.key,
            fmt::format("mode zip: found {} values, expected {} like axis '{}'", a.values.size(),
                        spec.axes.front().values.size(), spec.axes.front().key));
  }

  if (m.has("set")) {
    YAML::Node set = m.get("set");
    if (!set.IsMap())
      m.fail("set",
             fmt::format("found {}, expected a map from key paths to values", yaml::describe(set)));
    for (auto it = set.begin(); it != set.end(); ++it) {
      const YAML::detail::iterator_value kv = *it;
      const YAML::Node k = kv.first;
      std::string key = k.IsScalar() ? k.Scalar() : "";
      if (!split_key_path(key))
        ctx.fail(k, "set." + key, fmt::format("found '{}', expected a key path", key));
      spec.fixed.emplace_back(key, YAML::Clone(kv.second));
      spec.fixed_where.emplace_back("set." + key, ctx.at(k));
    }
  }
  if (m.has("strategies")) {
    YAML::Node list = ctx.require_list(m.get("strategies"), "strategies");
    spec.strategies_where = m.location("strategies");
    for (std::size_t i = 0; i < list.size(); ++i)
      spec.strategies.push_back(ctx.to_string(list[i], fmt::format("strategies[{}]", i)));
  }
  return spec;
}

SweepSpec load_sweep(const std::string& arg) {
  std::string path;
  YAML::Node tree = load_input_yaml(arg, InputKind::kSweep, path);
  return parse_sweep(tree, path);
}

std::vector<SweepPoint> expand_points(const SweepSpec& spec) {
  std::vector<SweepPoint> out;
  if (spec.axes.empty()) return out;
  if (spec.mode == SweepMode::kZip) {
    std::size_t n = spec.axes.front().values.size();
    for (std::size_t i = 0; i < n; ++i) {
      SweepPoint p;
      p.index = i;
      for (const auto& a : spec.axes) p.values.push_back(a.values[i]);
      out.push_back(std::move(p));
    }
    return out;
  }
  std::size_t total = 1;
  for (const auto& a : spec.axes) {
    if (total > kMaxPoints / a.values.size())
      throw InputError(a.where, "axes." + a.key,
                       fmt::format("the cartesian product has over {} points", kMaxPoints));
    total *= a.values.size();
  }
  out.reserve(total);
  for (std::size_t i = 0; i < total; ++i) {
    SweepPoint p;
    p.index = i;
    p.values.resize(spec.axes.size());
    std::size_t rest = i;
    for (std::size_t a = spec.axes.size(); a-- > 0;) {
      p.values[a] = spec.axes[a].values[rest % spec.axes[a].values.size()];
      rest /= spec.axes[a].values.size();
    }
    out.push_back(std::move(p));
  }
  return out;
}

void set_key_path(YAML::Node root, const std::string& key, const YAML::Node& value,
                  const SourceLocation& where) {
  auto segments = split_key_path(key);
  if (!segments) throw InputError(where, key, "malformed key path");
  // Node::reset rebinds; plain assignment between Nodes would overwrite the tree instead.
  YAML::Node cur;
  cur.reset(root);
  std::string walked;
  for (std::size_t i = 0; i < segments->size(); ++i) {
    const Segment& s = (*segments)[i];
    bool last = i + 1 == segments->size();
    walked += (walked.empty() ? "" : ".") + s.name;
    if (!cur.IsMap() && !cur.IsNull())
      throw InputError(
          where, key,
          fmt::format("'{}' is {} in the base scenario, not a map", walked, yaml::describe(cur)));
    if (!s.index) {
      if (last) {
        cur[s.name] = value;
        return;
      }
      YAML::Node next = cur[s.name];
      if (!next.IsDefined() || next.IsNull()) {
        cur[s.name] = YAML::Node(YAML::NodeType::Map);
        next.reset(cur[s.name]);
      }
      cur.reset(next);
      continue;
    }
    YAML::Node list = cur[s.name];
    if (!list.IsSequence() || *s.index >= list.size())
      throw InputError(where, key,
                       fmt::format("'{}' has no item [{}] in the base scenario ({})", walked,
                                   *s.index, yaml::describe(list)));
    walked += fmt::format("[{}]", *s.index);
    if (last) {
      list[*s.index] = value;
      return;
    }
    YAML::Node item = list[*s.index];
    cur.reset(item);
  }
}

Scenario point_scenario(const SweepSpec& spec, const YAML::Node& base_tree,
                        const SweepPoint& point) {
  YAML::Node tree = YAML::Clone(base_tree);
  apply_fixed_and(spec, tree);
  for (std::size_t a = 0; a < spec.axes.size(); ++a)
    set_key_path(tree, spec.axes[a].key, value_node(point.values[a]), spec.axes[a].where);
  try {
    return parse_scenario(tree, spec.base_path);
  } catch (const InputError& e) {
    throw InputError(SourceLocation{spec.file, 0, 0}, e.key(),
                     fmt::format("point {} ({}): {}", point.index,
                                 describe_point(spec, point.values), e.what()));
  }
}

void add_command_line_sets(SweepSpec& spec, const std::vector<std::string>& sets) {
  const SourceLocation where{"--set", 0, 0};
  for (const std::string& text : sets) {
    auto [key, value] = parse_set_edit(text);
    for (const auto& axis : spec.axes)
      if (key_within(key, axis.key) || key_within(axis.key, key))
        throw InputError(where, key,
                         fmt::format("the sweep varies '{}' (axis at {}:{}), which would replace "
                                     "this value at every point; drop the --set or the axis",
                                     axis.key, axis.where.file, axis.where.line));
    spec.fixed.emplace_back(key, value);
    spec.fixed_where.emplace_back(key, where);
  }
}

Scenario base_scenario(const SweepSpec& spec) {
  YAML::Node base = load_yaml_file(spec.base_path);
  Scenario plain = parse_scenario(base, spec.base_path);
  if (spec.fixed.empty()) return plain;
  YAML::Node tree = YAML::Clone(base);
  apply_fixed_and(spec, tree);
  try {
    return parse_scenario(tree, spec.base_path);
  } catch (const InputError&) {
    return plain;  // `set:` needs the axes to be complete; validate_sweep reports what it can
  }
}

void validate_sweep(const SweepSpec& spec) {
  YAML::Node base = load_yaml_file(spec.base_path);
  parse_scenario(base, spec.base_path);
  Scenario sc = base_scenario(spec);  // `set:` may replace the strategies
  for (const auto& n : spec.strategies) {
    if (!sc.find_strategy(n)) {
      std::string known;
      for (const auto& k : sc.strategies) known += (known.empty() ? "" : ", ") + k.name;
      throw InputError(
          spec.strategies_where, "strategies",
          fmt::format("found '{}', expected one of the base scenario's strategies: {}", n, known));
    }
  }
  // `set:` as a whole (its entries often go together: nodes with parallelism.ep). An error about
  // one of its keys is reported at that entry; other errors may be fixed by the axes.
  if (!spec.fixed.empty()) {
    YAML::Node tree = YAML::Clone(base);
    apply_fixed_and(spec, tree);
    try {
      parse_scenario(tree, spec.base_path);
    } catch (const InputError& e) {
      for (std::size_t i = 0; i < spec.fixed.size(); ++i) {
        const std::string& key = spec.fixed[i].first;
        if (key_within(e.key(), key) || key_within(key, e.key()))
          throw InputError(spec.fixed_where[i].second, spec.fixed_where[i].first, e.message());
      }
    }
  }
  // Each axis alone on the base (with `set:`): an error about the axis's own key (unknown key,
  // wrong type, bad unit) is reported at the axis line. Errors about other keys may be fixed by
  // other axes (nodes and parallelism.ep together), so they wait for the points themselves.
  for (const auto& axis : spec.axes) {
    YAML::Node tree = YAML::Clone(base);
    apply_fixed_and(spec, tree);
    set_key_path(tree, axis.key, value_node(axis.values.front()), axis.where);
    try {
      parse_scenario(tree, spec.base_path);
    } catch (const InputError& e) {
      if (key_within(e.key(), axis.key) || key_within(axis.key, e.key()))
        throw InputError(
            axis.where, "axes." + axis.key,
            fmt::format("axis '{}' = {}: {}", axis.key, axis.values.front(), e.message()));
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Fingerprint

namespace {

// FNV-1a, 64 bits: stable across builds and platforms (std::hash is not), and a change detector
// is all it needs to be.
std::uint64_t fnv1a(std::string_view text, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::string hex16(std::uint64_t h) { return fmt::format("{:016x}", h); }

// A YAML tree as JSON with sorted keys and scalars as their text: two files that differ only in
// comments, layout, key order or quoting give the same text; any value change gives another.
nlohmann::json canonical(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json j = nlohmann::json::object();  // std::map: keys sorted
      for (const auto& kv : n) j[kv.first.Scalar()] = canonical(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& item : n) j.push_back(canonical(item));
      return j;
    }
    case YAML::NodeType::Scalar:
      return n.Scalar();
    default:
      return nullptr;
  }
}

}  // namespace

std::string SweepFingerprint::hash() const {
  return hex16(fnv1a(fmt::format("{}\n{}\n{}\n{}", version, engine, base, axes)));
}

std::string sweep_fingerprint_path(const std::string& csv_path) {
  return csv_path + ".fingerprint";
}

std::string SweepFingerprint::csv_comment() const {
  return fmt::format("# moesim sweep fingerprint={} version={} engine={} base={} axes={}", hash(),
                     version, engine, base, axes);
}

std::optional<SweepFingerprint> SweepFingerprint::parse(const std::string& line) {
  const std::string prefix = "# moesim sweep ";
  if (line.rfind(prefix, 0) != 0) return std::nullopt;
  std::map<std::string, std::string> kv;
  std::istringstream ss(line.substr(prefix.size()));
  std::string field;
  while (ss >> field) {
    auto eq = field.find('=');
    if (eq == std::string::npos) return std::nullopt;
    kv[field.substr(0, eq)] = field.substr(eq + 1);
  }
  for (const char* k : {"version", "engine", "base", "axes"})
    if (!kv.count(k)) return std::nullopt;
  return SweepFingerprint{kv["version"], kv["engine"], kv["base"], kv["axes"]};
}

nlohmann::ordered_json SweepFingerprint::json() const {
  return {{"hash", hash()},
          {"version", version},
          {"engine", engine},
          {"base_scenario", base},
          {"axes", axes}};
}

std::vector<std::string> SweepFingerprint::differences(const SweepFingerprint& file) const {
  std::vector<std::string> out;
  if (base != file.base)
    out.push_back(fmt::format(
        "the base scenario (a value in it, in the sweep's `set:` or in a file it references "
        "changed: base={} in the file, {} now)",
        file.base, base));
  if (axes != file.axes)
    out.push_back(
        fmt::format("the axes (their key paths: axes={} in the file, {} now)", file.axes, axes));
  if (engine != file.engine)
    out.push_back(fmt::format("the engine ({} in the file, {} now)", file.engine, engine));
  if (version != file.version)
    out.push_back(
        fmt::format("the moesim version ({} in the file, {} now)", file.version, version));
  return out;
}

SweepFingerprint sweep_fingerprint(const SweepSpec& spec, const std::string& engine_override) {
  SweepFingerprint fp;
  fp.version = MOESIM_VERSION;
  const Scenario sc = base_scenario(spec);
  fp.engine = std::string(sim::network_kind_name(engine_config_from(sc, engine_override).network));
  YAML::Node tree = YAML::Clone(load_yaml_file(spec.base_path));
  apply_fixed_and(spec, tree);
  std::uint64_t h = fnv1a(canonical(tree).dump());
  // Referenced files count by content: a re-measured calibration changes every figure.
  for (const std::string& path : {sc.cluster.calibration_path, sc.workload.routing.trace_path}) {
    if (path.empty()) continue;
    h = fnv1a(path + "\n" + read_text(path) + "\n", h);
  }
  fp.base = hex16(h);
  std::string keys;
  for (const auto& a : spec.axes) keys += a.key + "\n";
  fp.axes = hex16(fnv1a(keys));
  return fp;
}

// ------------------------------------------------------------------------------------------------
// CSV

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(std::move(cur));
  return out;
}

const std::vector<std::pair<std::string, double ServingRowFigures::*>>&
ServingRowFigures::fields() {
  using F = ServingRowFigures;
  static const std::vector<std::pair<std::string, double F::*>> f = {
      {"requests", &F::requests},
      {"ttft_p50_s", &F::ttft_p50_s},
      {"ttft_p90_s", &F::ttft_p90_s},
      {"ttft_p99_s", &F::ttft_p99_s},
      {"tpot_p50_s", &F::tpot_p50_s},
      {"tpot_p90_s", &F::tpot_p90_s},
      {"tpot_p99_s", &F::tpot_p99_s},
      {"e2e_p50_s", &F::e2e_p50_s},
      {"input_tokens_per_s_per_node", &F::input_tokens_per_s_per_node},
      {"output_tokens_per_s_per_node", &F::output_tokens_per_s_per_node},
      {"output_tokens_per_s_per_user", &F::output_tokens_per_s_per_user},
      {"goodput_requests_per_s", &F::goodput_requests_per_s},
      {"slo_attainment", &F::slo_attainment},
      {"kv_utilization", &F::kv_utilization},
      {"preemptions", &F::preemptions}};
  return f;
}

ServingRowFigures serving_row_figures(const serving::ServingReport& r) {
  const auto& m = r.metrics;
  ServingRowFigures f;
  f.requests = static_cast<double>(r.requests.count);
  f.ttft_p50_s = m.ttft_s.p50;
  f.ttft_p90_s = m.ttft_s.p90;
  f.ttft_p99_s = m.ttft_s.p99;
  f.tpot_p50_s = m.tpot_s.p50;
  f.tpot_p90_s = m.tpot_s.p90;
  f.tpot_p99_s = m.tpot_s.p99;
  f.e2e_p50_s = m.e2e_s.p50;
  f.input_tokens_per_s_per_node = r.input_tokens_per_s_per_node;
  f.output_tokens_per_s_per_node = r.output_tokens_per_s_per_node;
  f.output_tokens_per_s_per_user = r.output_tokens_per_s_per_user;
  f.goodput_requests_per_s = m.goodput_requests_per_s;
  f.slo_attainment = m.slo_attainment;
  f.kv_utilization = r.overall.kv_utilization;
  f.preemptions = static_cast<double>(r.overall.preemptions);
  return f;
}

namespace {

// A serving sweep's result columns: who and where, the serving figures, the wall time last.
const std::vector<std::string>& serving_result_columns() {
  static const std::vector<std::string> cols = [] {
    std::vector<std::string> c = {"scenario", "strategy", "topology", "gpus"};
    for (const auto& [name, field] : ServingRowFigures::fields()) c.push_back(name);
    c.push_back("wall_s");
    return c;
  }();
  return cols;
}

const std::vector<std::string>& result_columns(bool serving = false) {
  if (serving) return serving_result_columns();
  static const std::vector<std::string> cols = {"scenario",
                                                "strategy",
                                                "topology",
                                                "gpus",
                                                "step_time_s",
                                                "step_time_p50_s",
                                                "step_time_p95_s",
                                                "moe_layer_time_s",
                                                "a2a_s",
                                                "allreduce_s",
                                                "compute_s",
                                                "exposed_comm_s",
                                                "speedup_vs_baseline",
                                                "decisions",
                                                "memory_bytes",
                                                "gpu_memory_bytes",
                                                "fits_memory",
                                                "tokens_per_s_per_gpu",
                                                "model_tflops_per_gpu",
                                                "mfu",
                                                "model_flops_per_token",
                                                "gemm_s",
                                                "attention_s",
                                                "memory_bound_s",
                                                "optimizer_s",
                                                "recompute_s",
                                                "wall_s"};  // wall-clock last: tests strip it
  return cols;
}

std::string csv_line(const SweepRow& r) {
  std::string s = std::to_string(r.point);
  for (const auto& v : r.values) {
    s += ',';
    s += csv_field(v);
  }
  const RunSummary& m = r.summary;
  if (r.serving) {
    s += fmt::format(",{},{},{},{}", csv_field(r.scenario), csv_field(m.strategy),
                     csv_field(m.topology), m.gpus);
    for (const auto& [name, field] : ServingRowFigures::fields())
      s += fmt::format(",{:.9g}", (*r.serving).*field);
    return s + fmt::format(",{:.6f}\n", m.wall_s);
  }
  // Model TFLOP/s and MFU are empty where there are none (inference; MFU without a peak).
  s += fmt::format(
      ",{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{},{},{:.0f},{:.0f},{},"
      "{:.9g},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.6f}\n",
      csv_field(r.scenario), csv_field(m.strategy), csv_field(m.topology), m.gpus, m.step_mean_s,
      m.step_p50_s, m.step_p95_s, m.moe_layer_mean_s, m.a2a_mean_s, m.allreduce_mean_s,
      m.compute_mean_s, m.exposed_comm_mean_s,
      m.speedup > 0 ? fmt::format("{:.9g}", m.speedup) : "", csv_field(m.decisions), m.memory_bytes,
      m.gpu_memory_bytes, m.fits_memory() ? 1 : 0, m.tokens_per_s_per_gpu,
      m.has_model_flops ? fmt::format("{:.9g}", m.model_tflops_per_gpu) : "",
      m.has_model_flops && m.mfu > 0 ? fmt::format("{:.9g}", m.mfu) : "", m.model_flops_per_token,
      m.gemm_mean_s, m.attention_mean_s, m.memory_bound_mean_s, m.optimizer_mean_s,
      m.recompute_mean_s, m.wall_s);
  return s;
}

// A row of an existing CSV, or nullopt when it is malformed (a line cut short by an interrupted
// run): those are dropped and their points run again.
std::optional<SweepRow> parse_row(const std::vector<std::string>& f, std::size_t num_axes,
                                  bool serving) {
  if (f.size() != 1 + num_axes + result_columns(serving).size()) return std::nullopt;
  try {
    SweepRow r;
    std::size_t i = 0;
    r.point = std::stoul(f[i++]);
    for (std::size_t a = 0; a < num_axes; ++a) r.values.push_back(f[i++]);
    r.scenario = f[i++];
    RunSummary& m = r.summary;
    m.strategy = f[i++];
    m.topology = f[i++];
    m.gpus = std::stoi(f[i++]);
    if (serving) {
      ServingRowFigures& s = r.serving.emplace();
      for (const auto& [name, field] : ServingRowFigures::fields()) s.*field = std::stod(f[i++]);
      m.wall_s = std::stod(f[i++]);
      return r;
    }
    for (double* d :
         {&m.step_mean_s, &m.step_p50_s, &m.step_p95_s, &m.moe_layer_mean_s, &m.a2a_mean_s,
          &m.allreduce_mean_s, &m.compute_mean_s, &m.exposed_comm_mean_s})
      *d = std::stod(f[i++]);
    m.speedup = f[i].empty() ? 0 : std::stod(f[i]);
    ++i;
    m.decisions = f[i++];
    m.memory_bytes = std::stod(f[i++]);
    m.gpu_memory_bytes = std::stod(f[i++]);
    ++i;  // fits_memory: derived from the two
    m.tokens_per_s_per_gpu = std::stod(f[i++]);
    m.has_model_flops = !f[i].empty();
    m.model_tflops_per_gpu = m.has_model_flops ? std::stod(f[i]) : 0;
    ++i;
    m.mfu = f[i].empty() ? 0 : std::stod(f[i]);
    ++i;
    for (double* d : {&m.model_flops_per_token, &m.gemm_mean_s, &m.attention_mean_s,
                      &m.memory_bound_mean_s, &m.optimizer_mean_s, &m.recompute_mean_s})
      *d = std::stod(f[i++]);
    m.wall_s = std::stod(f[i++]);
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// Rows of an existing output CSV written by this setup (fingerprint) with the same columns. An
// InputError names what differs when the fingerprint does not match (its rows would be figures of
// another setup under this run's labels), when the file has none (written by an older moesim: it
// cannot be checked), or when its header differs (appending would mix two tables).
std::vector<SweepRow> read_existing(const std::string& path, const std::vector<std::string>& cols,
                                    std::size_t num_axes, bool serving,
                                    const SweepFingerprint& fp) {
  std::vector<SweepRow> rows;
  std::ifstream is(path);
  if (!is) return rows;
  std::string line;
  if (!std::getline(is, line)) return rows;
  const std::string start_over =
      "Delete the file (or choose another --csv) to start over, or pass --restart to discard its "
      "rows and run every point again";
  // The fingerprint sits beside the CSV (PATH.fingerprint); files of older versions carry it as a
  // comment on their first line instead.
  std::optional<SweepFingerprint> file_fp;
  std::ifstream side(sweep_fingerprint_path(path));
  if (std::string side_line; side && std::getline(side, side_line)) {
    file_fp = SweepFingerprint::parse(side_line);
  } else if ((file_fp = SweepFingerprint::parse(line))) {
    if (!std::getline(is, line)) return rows;
  }
  if (!file_fp)
    throw InputError(fmt::format(
        "--csv {}: the file has no sweep fingerprint ({} is missing or unreadable; written by an "
        "older moesim, or not by `moesim sweep`), so its rows cannot be checked against this "
        "run's base scenario, axes, engine and version. {}",
        path, sweep_fingerprint_path(path), start_over));
  if (auto diff = fp.differences(*file_fp); !diff.empty())
    throw InputError(fmt::format(
        "--csv {}: the file holds rows of another setup; this run differs in {}. Resuming would "
        "report its figures under this run's labels. {}",
        path, fmt::join(diff, "; and in "), start_over));
  if (split_csv_line(line) != cols)
    throw InputError(fmt::format(
        "--csv {}: the file exists with other columns (another sweep?): found '{}', expected "
        "'{}'. Choose another file or remove it to start over",
        path, line, fmt::join(cols, ",")));
  while (std::getline(is, line)) {
    if (line.empty()) continue;
    if (auto r = parse_row(split_csv_line(line), num_axes, serving)) rows.push_back(std::move(*r));
  }
  return rows;
}

std::string fmt_seconds(double s) {
  if (s < 60) return fmt::format("{:.1f} s", s);
  if (s < 3600)
    return fmt::format("{}m{:02d}s", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  return fmt::format("{}h{:02d}m", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

}  // namespace

std::vector<std::string> sweep_csv_columns(const SweepSpec& spec, bool serving) {
  std::vector<std::string> cols = {"point"};
  for (const auto& a : spec.axes) cols.push_back(a.key);
  for (const auto& c : result_columns(serving)) cols.push_back(c);
  return cols;
}

// ------------------------------------------------------------------------------------------------
// Running

namespace {

// Rows of one point as a message to rank 0: every field, doubles exact (JSON numbers round-trip).
std::string rows_message(int rank, const std::vector<SweepRow>& rows) {
  nlohmann::ordered_json j;
  j["rank"] = rank;
  auto& arr = j["rows"] = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    const RunSummary& m = r.summary;
    nlohmann::ordered_json rj;
    rj["point"] = r.point;
    rj["values"] = r.values;
    rj["scenario"] = r.scenario;
    rj["strategy"] = m.strategy;
    rj["topology"] = m.topology;
    rj["gpus"] = m.gpus;
    rj["times"] = {m.step_mean_s, m.step_p50_s,       m.step_p95_s,     m.moe_layer_mean_s,
                   m.a2a_mean_s,  m.allreduce_mean_s, m.compute_mean_s, m.exposed_comm_mean_s,
                   m.speedup,     m.wall_s,           m.memory_bytes,   m.gpu_memory_bytes};
    rj["figures"] = {m.tokens_per_step,
                     m.model_flops_per_token,
                     m.tokens_per_s_per_gpu,
                     m.model_tflops_per_gpu,
                     m.mfu,
                     m.gemm_mean_s,
                     m.attention_mean_s,
                     m.memory_bound_mean_s,
                     m.optimizer_mean_s,
                     m.recompute_mean_s};
    rj["has_model_flops"] = m.has_model_flops;
    rj["decisions"] = m.decisions;
    if (r.serving) {
      auto& sv = rj["serving"] = nlohmann::ordered_json::array();
      for (const auto& [name, field] : ServingRowFigures::fields())
        sv.push_back((*r.serving).*field);
    }
    rj["run"] = r.run;
    arr.push_back(std::move(rj));
  }
  return j.dump();
}

std::vector<SweepRow> parse_rows_message(const nlohmann::ordered_json& j) {
  std::vector<SweepRow> rows;
  for (const auto& rj : j.at("rows")) {
    SweepRow r;
    r.point = rj.at("point").get<std::size_t>();
    r.values = rj.at("values").get<std::vector<std::string>>();
    r.scenario = rj.at("scenario").get<std::string>();
    RunSummary& m = r.summary;
    m.strategy = rj.at("strategy").get<std::string>();
    m.topology = rj.at("topology").get<std::string>();
    m.gpus = rj.at("gpus").get<int>();
    const auto& t = rj.at("times");
    std::size_t i = 0;
    for (double* d : {&m.step_mean_s, &m.step_p50_s, &m.step_p95_s, &m.moe_layer_mean_s,
                      &m.a2a_mean_s, &m.allreduce_mean_s, &m.compute_mean_s, &m.exposed_comm_mean_s,
                      &m.speedup, &m.wall_s, &m.memory_bytes, &m.gpu_memory_bytes}) {
      const auto& v = t.at(i++);
      *d = v.is_number() ? v.get<double>() : 0.0;  // JSON has no NaN: dump() wrote null
    }
    const auto& fig = rj.at("figures");
    i = 0;
    for (double* d : {&m.tokens_per_step, &m.model_flops_per_token, &m.tokens_per_s_per_gpu,
                      &m.model_tflops_per_gpu, &m.mfu, &m.gemm_mean_s, &m.attention_mean_s,
                      &m.memory_bound_mean_s, &m.optimizer_mean_s, &m.recompute_mean_s}) {
      const auto& v = fig.at(i++);
      *d = v.is_number() ? v.get<double>() : 0.0;
    }
    m.has_model_flops = rj.at("has_model_flops").get<bool>();
    m.decisions = rj.at("decisions").get<std::string>();
    if (rj.contains("serving")) {
      ServingRowFigures& s = r.serving.emplace();
      i = 0;
      for (const auto& [name, field] : ServingRowFigures::fields()) {
        const auto& v = rj.at("serving").at(i++);
        s.*field = v.is_number() ? v.get<double>() : 0.0;
      }
    }
    r.run = rj.at("run");
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

double weighted_eta_s(const std::vector<EtaPoint>& points, std::size_t workers) {
  // Fit of log(time per run) = a + b log(GPUs) over the finished points, b pulled towards the
  // prior: kPriorWeight is as much as two points a factor e apart in GPUs.
  constexpr double kPriorWeight = 2.0;
  double n = 0, mx = 0, my = 0;
  for (const auto& p : points)
    if (p.wall_s > 0) {
      n += 1;
      mx += std::log(p.gpus);
      my += std::log(p.wall_s / p.runs);
    }
  if (n == 0) return 0;
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0;
  for (const auto& p : points)
    if (p.wall_s > 0) {
      const double dx = std::log(p.gpus) - mx;
      sxx += dx * dx;
      sxy += dx * (std::log(p.wall_s / p.runs) - my);
    }
  const double b =
      std::clamp((sxy + kPriorWeight * kEtaPriorExponent) / (sxx + kPriorWeight), 0.5, 3.0);
  double done_cost = 0, done_s = 0, left = 0, largest = 0;
  std::size_t left_points = 0;
  for (const auto& p : points) {
    const double c = p.runs * std::pow(p.gpus, b);
    if (p.wall_s > 0) {
      done_cost += c;
      done_s += p.wall_s;
    } else if (p.wall_s < 0) {
      left += c;
      largest = std::max(largest, c);
      ++left_points;
    }
  }
  const double w = static_cast<double>(std::min(left_points, workers));
  return w > 0 ? done_s / done_cost * std::max(left / w, largest) : 0.0;
}

namespace {

// ---- run_sweep's parts ----------------------------------------------------------------------

// The points left to run and what rank 0 knows about them: the resume (rows of the CSV that
// complete a point), the run order, the predicted cost of each point (the ETA's weights and the
// ranks' split).
struct SweepWork {
  std::vector<std::size_t> todo;         // point indices, in run order
  std::vector<double> cost;              // predicted cost of todo[k]
  bool weigh = false;                    // flow / SimGrid: points weighted by runs x GPUs^b
  std::vector<double> runs_of, gpus_of;  // per todo[k], when weighed
  std::vector<SweepRow> foreign;         // rows of the CSV that are not points of this sweep (kept)
};

// Rank 0: reads the CSV (unless --restart), keeps the rows of complete points in `result`, and
// lists the rest.
SweepWork find_work(const SweepSpec& spec, const SweepOptions& opts,
                    const std::vector<SweepPoint>& points, const std::vector<std::string>& cols,
                    const std::vector<std::string>& strategy_names,
                    const SweepFingerprint& fingerprint, const Scenario& base_sc,
                    const std::string& base_text, SweepResult& result) {
  SweepWork w;
  const std::size_t num_axes = spec.axes.size();
  // Resume: a point is done when the CSV holds a row for each of its strategies.
  std::map<std::string, std::size_t> point_of;
  for (const auto& p : points) point_of.emplace(join_values(p.values), p.index);
  std::vector<bool> done(points.size(), false);
  std::error_code ec;
  if (opts.restart && opts.progress && !opts.csv_path.empty() && fs::exists(opts.csv_path, ec))
    std::fprintf(stderr, "moesim sweep: --restart: the rows in %s are discarded\n",
                 opts.csv_path.c_str());
  if (!opts.csv_path.empty() && !opts.restart) {
    std::map<std::size_t, std::vector<SweepRow>> by_point;
    for (auto& r :
         read_existing(opts.csv_path, cols, num_axes, base_sc.serving.has_value(), fingerprint)) {
      auto it = point_of.find(join_values(r.values));
      if (it == point_of.end()) {
        w.foreign.push_back(std::move(r));
        continue;
      }
      r.point = it->second;
      by_point[it->second].push_back(std::move(r));
    }
    for (auto& [idx, rows] : by_point) {
      std::set<std::string> have;
      for (const auto& r : rows) have.insert(r.summary.strategy);
      bool complete = std::all_of(strategy_names.begin(), strategy_names.end(),
                                  [&](const std::string& n) { return have.count(n) > 0; });
      if (!complete) continue;
      done[idx] = true;
      ++result.points_skipped;
      for (auto& r : rows)
        if (std::find(strategy_names.begin(), strategy_names.end(), r.summary.strategy) !=
            strategy_names.end())
          result.rows.push_back(std::move(r));
    }
  }
  for (const auto& p : points)
    if (!done[p.index]) w.todo.push_back(p.index);
  // Points run in a fixed shuffled order: costs often grow along an axis (nodes, sizes), and a
  // random order makes the running mean an unbiased estimate of the rest, so the ETA is honest
  // early on. The CSV is sorted by point at the end.
  std::shuffle(w.todo.begin(), w.todo.end(), std::mt19937_64(0x5eed));
  w.cost.assign(w.todo.size(), 1.0);
  // Points of a flow or SimGrid sweep differ in cost by orders of magnitude (the simulation
  // time grows faster than the GPU count), so the mean time per point says little about the
  // rest until the expensive ones are sampled. Their cost is predicted as runs x GPUs^b
  // (runs = iterations x strategies; b = 2 here, fitted on the finished points for the ETA).
  // Analytical points cost about the same, and their sweeps are too large to parse every point
  // up front.
  w.weigh = engine_config_from(base_sc, opts.engine).network != sim::NetworkKind::kAnalytical;
  if (w.weigh) {
    const YAML::Node base_tree = YAML::Load(base_text);
    w.runs_of.resize(w.todo.size());
    w.gpus_of.resize(w.todo.size());
    for (std::size_t k = 0; k < w.todo.size(); ++k) {
      Scenario sc = point_scenario(spec, base_tree, points[w.todo[k]]);
      w.runs_of[k] = static_cast<double>(sc.workload.iterations) *
                     static_cast<double>(select_strategies(sc, spec.strategies).size());
      w.gpus_of[k] = static_cast<double>(std::max(1, sc.num_gpus()));
      w.cost[k] = w.runs_of[k] * std::pow(w.gpus_of[k], kEtaPriorExponent);
    }
  }
  return w;
}

// This rank's share: each point to the rank with the least predicted cost so far (with equal
// costs: round robin), the same greedy split on every rank.
std::vector<std::size_t> share_of_rank(const SweepWork& w, int ranks, int rank) {
  std::vector<std::size_t> mine;
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  for (std::size_t k = 0; k < w.todo.size(); ++k) {
    auto r = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += w.cost[k];
    if (static_cast<int>(r) == rank) mine.push_back(w.todo[k]);
  }
  return mine;
}

// A serving point: every strategy's serving run (docs/serving.md), one row each.
std::vector<SweepRow> run_serving_point(const Scenario& sc, const std::vector<StrategySpec>& specs,
                                        const topology::Topology& topo,
                                        const sim::EngineConfig& cfg, const SweepPoint& p,
                                        const std::string& topo_name, bool with_json) {
  std::vector<SweepRow> rows;
  for (const auto& spec : specs) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto reports = run_serving_stacks(sc, {spec}, topo, cfg);
    const serving::ServingReport& rep = reports.at(0);
    SweepRow r;
    r.point = p.index;
    r.values = p.values;
    r.scenario = sc.name;
    r.summary.strategy = spec.name;
    r.summary.topology = topo_name;
    r.summary.gpus = topo.num_gpus();
    r.summary.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.serving = serving_row_figures(rep);
    if (with_json) r.run = serving_json(sc, cfg, reports).at("serving").at(0);
    rows.push_back(std::move(r));
  }
  return rows;
}

// One point: its scenario, topology and stacks, run; the rows it adds. `engine` receives the
// engine's name.
std::vector<SweepRow> run_point(const SweepSpec& spec, const SweepOptions& opts,
                                const YAML::Node& base_tree, const SweepPoint& p,
                                workload::SampleCache& sample_cache, std::string& engine) {
  Scenario sc = point_scenario(spec, base_tree, p);
  auto topo = simulation_topology(sc);
  sim::EngineConfig cfg = engine_config_from(sc, opts.engine);
  engine = std::string(sim::network_kind_name(cfg.network));
  auto specs = select_strategies(sc, spec.strategies);
  std::string topo_name = sc.cluster.name.empty() ? sc.name : sc.cluster.name;
  if (sc.serving)
    return run_serving_point(sc, specs, *topo, cfg, p, topo_name, !opts.json_path.empty());
  auto outcomes =
      run_stacks(sc, specs, *topo, cfg, sc.workload.iterations, topo_name, false, &sample_cache);
  std::vector<SweepRow> rows;
  for (auto& o : outcomes) {
    SweepRow r;
    r.point = p.index;
    r.values = p.values;
    r.scenario = sc.name;
    r.summary = o.summary;
    if (!opts.json_path.empty()) {
      r.run = run_json(sc, o.run, o.summary);
      if (cfg.network == sim::NetworkKind::kFlow)
        r.run["flow_event_tolerance"] = cfg.flow_event_tolerance;
      r.run["interference"] = cfg.compute.interference;
      r.run["peer_cache"] = cfg.net.peer_cache;
      r.run["peer_miss_overhead_s"] = cfg.net.peer_miss_overhead_s;
    }
    rows.push_back(std::move(r));
  }
  return rows;
}

// Rank 0's record of the run: the CSV rows appended as points finish, the progress line, the ETA
// (and its log). Not thread-safe: callers hold run_sweep's mutex.
class SweepProgress {
 public:
  SweepProgress(const SweepOptions& opts, const SweepWork& work, std::size_t workers_total)
      : opts_(opts), work_(work), workers_total_(workers_total) {
    for (std::size_t k = 0; k < work.todo.size(); ++k) k_of_[work.todo[k]] = k;
    if (work.weigh)
      for (std::size_t k = 0; k < work.todo.size(); ++k)
        eta_points_.push_back({work.gpus_of[k], work.runs_of[k]});
    if (!opts.eta_log_path.empty()) {
      eta_log_.open(opts.eta_log_path);
      if (!eta_log_) throw RuntimeError(fmt::format("cannot write {}", opts.eta_log_path));
      eta_log_ << "# elapsed_s points_done points_total eta_s\n";
    }
  }

  /// Appends to the CSV from now on (rank 0 with a CSV path).
  void append_to(const std::string& csv_path) {
    csv_.open(csv_path, std::ios::app);
    if (!csv_) throw RuntimeError(fmt::format("cannot append to {}", csv_path));
  }
  /// Closes the CSV (before it is rewritten sorted).
  void close_csv() {
    if (csv_.is_open()) csv_.close();
  }

  std::size_t completed() const { return completed_; }
  double elapsed_s() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

  /// One point's rows arrived (from a local worker or rank `from`): into the CSV and `result`.
  void point_done(int from, std::vector<SweepRow>& rows, SweepResult& result) {
    if (csv_.is_open()) {
      for (const auto& r : rows) csv_ << csv_line(r);
      csv_.flush();
    }
    if (work_.weigh && !rows.empty()) {
      double wall = 0;
      for (const auto& r : rows) wall += r.summary.wall_s;
      eta_points_[k_of_.at(rows.front().point)].wall_s = std::max(0.0, wall);
      if (wall > 0) ++fitted_points_;
    }
    for (auto& r : rows) result.rows.push_back(std::move(r));
    ++completed_;
    ++result.points_run;
    ++result.points_per_rank.at(static_cast<std::size_t>(from));
    if (eta_log_.is_open()) {
      const double elapsed = elapsed_s();
      eta_log_ << fmt::format("{:.3f} {} {} {:.3f}\n", elapsed, completed_, work_.todo.size(),
                              eta_s(elapsed));
      eta_log_.flush();
    }
    print(false);
  }

  /// The progress line: at most every 0.2 s on a terminal, 5 s in a log; `final` prints the
  /// last one.
  void print(bool final) {
    if (!opts_.progress) return;
    auto now = std::chrono::steady_clock::now();
    double since = std::chrono::duration<double>(now - last_print_).count();
    if (!final && since < (tty_ ? 0.2 : 5.0)) return;
    if (final && !tty_ && printed_ == completed_) return;  // the last line is already there
    printed_ = completed_;
    last_print_ = now;
    const double elapsed = elapsed_s();
    const std::size_t total = work_.todo.size();
    std::string eta = completed_ > 0 ? fmt_seconds(eta_s(elapsed)) : "?";
    std::fprintf(
        stderr, "%smoesim sweep: %zu/%zu points (%.0f%%), %s elapsed, ETA %s%s", tty_ ? "\r" : "",
        completed_, total,
        total == 0 ? 100.0 : 100.0 * static_cast<double>(completed_) / static_cast<double>(total),
        fmt_seconds(elapsed).c_str(), eta.c_str(), tty_ && !final ? "   " : "\n");
    std::fflush(stderr);
  }

 private:
  // Remaining time. Analytical points cost about the same: the mean time per point so far times
  // the points left. Flow and SimGrid points are weighted by a cost model fitted on the finished
  // ones (weighted_eta_s).
  double eta_s(double elapsed) const {
    if (completed_ == 0) return 0.0;
    if (!work_.weigh || fitted_points_ == 0)
      return elapsed / static_cast<double>(completed_) *
             static_cast<double>(work_.todo.size() - completed_);
    return weighted_eta_s(eta_points_, workers_total_);
  }

  const SweepOptions& opts_;
  const SweepWork& work_;
  const std::size_t workers_total_;
  std::map<std::size_t, std::size_t> k_of_;  // point index -> position in todo
  std::vector<EtaPoint> eta_points_;         // by position in todo (weighted sweeps only)
  std::size_t fitted_points_ = 0;
  std::size_t completed_ = 0;
  std::size_t printed_ = static_cast<std::size_t>(-1);
  const bool tty_ = isatty(fileno(stderr)) != 0;
  std::chrono::steady_clock::time_point last_print_ =
      std::chrono::steady_clock::now() - std::chrono::hours(1);
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::ofstream csv_, eta_log_;
};

// Ctrl-C: every worker's run stopped at its next poll. The CSV keeps the finished points' rows
// (whole lines, flushed as they came): the resume contract, so the same command goes on from
// there. The sorted rewrite, JSON, plot and report need every point: not written.
void report_interrupted(const SweepOptions& opts, const SweepProgress& progress,
                        std::size_t points_todo) {
  std::fprintf(stderr, "moesim sweep: interrupted after %s: %zu of %zu points done%s\n",
               fmt_seconds(progress.elapsed_s()).c_str(), progress.completed(), points_todo,
               opts.csv_path.empty()
                   ? "; no output files written"
                   : fmt::format("; their rows are in {} (the same command resumes from "
                                 "there); no other output files written",
                                 opts.csv_path)
                         .c_str());
  std::fflush(stderr);
}

// An axis value (YAML text) as JSON: numbers, booleans and JSON-compatible lists as themselves,
// so that a notebook gets numbers; anything else (2dh, a flow map) as its text.
nlohmann::ordered_json axis_value_json(const std::string& text) {
  nlohmann::ordered_json v =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded() || v.is_null() || v.is_string() || v.is_object()) return text;
  return v;
}

// The sweep's JSON file: the spec, the fingerprint and every point's runs (rows resumed from the
// CSV carry the summary it kept).
void write_sweep_json(const SweepSpec& spec, const SweepResult& result,
                      const SweepFingerprint& fingerprint, const std::string& path) {
  const std::size_t num_axes = spec.axes.size();
  nlohmann::ordered_json j;
  j["moesim_version"] = MOESIM_VERSION;
  j["sweep"] = spec.name;
  j["base"] = spec.base_path;
  j["engine"] = result.engine;
  j["fingerprint"] = fingerprint.json();
  j["mode"] = spec.mode == SweepMode::kZip ? "zip" : "cartesian";
  auto& axes = j["axes"] = nlohmann::ordered_json::array();
  for (const auto& a : spec.axes) {
    auto values = nlohmann::ordered_json::array();
    for (const auto& v : a.values) values.push_back(axis_value_json(v));
    axes.push_back({{"key", a.key}, {"values", std::move(values)}});
  }
  j["points_total"] = result.points_total;
  j["points_skipped"] = result.points_skipped;
  auto& pts = j["points"] = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < result.rows.size();) {
    const std::size_t idx = result.rows[i].point;
    nlohmann::ordered_json pj;
    pj["index"] = idx;
    auto& params = pj["parameters"] = nlohmann::ordered_json::object();
    for (std::size_t a = 0; a < num_axes; ++a)
      params[spec.axes[a].key] = axis_value_json(result.rows[i].values[a]);
    auto& runs = pj["runs"] = nlohmann::ordered_json::array();
    for (; i < result.rows.size() && result.rows[i].point == idx; ++i) {
      const SweepRow& r = result.rows[i];
      if (!r.run.is_null()) {
        runs.push_back(r.run);
        continue;
      }
      // Resumed from the CSV: the summary it kept (no per-iteration records).
      const RunSummary& s = r.summary;
      nlohmann::ordered_json rj;
      if (r.serving) {
        rj["strategy"] = s.strategy;
        for (const auto& [name, field] : ServingRowFigures::fields())
          rj[name] = (*r.serving).*field;
        rj["resumed"] = true;
        runs.push_back(std::move(rj));
        continue;
      }
      rj["strategy"] = s.strategy;
      rj["topology"] = s.topology;
      rj["gpus"] = s.gpus;
      rj["step_time_s"] = s.step_mean_s;
      rj["step_time_p50_s"] = s.step_p50_s;
      rj["step_time_p95_s"] = s.step_p95_s;
      rj["moe_layer_time_s"] = s.moe_layer_mean_s;
      rj["breakdown"] = breakdown_json(s);
      rj["decisions"] = s.decisions;
      rj["speedup_vs_baseline"] = s.speedup > 0 ? nlohmann::ordered_json(s.speedup) : nullptr;
      rj["memory_bytes"] = s.memory_bytes;
      rj["memory"] = {{"memory_bytes", s.memory_bytes},
                      {"gpu_memory_bytes", s.gpu_memory_bytes},
                      {"fits", s.fits_memory()}};
      add_figures_json(rj, s);
      rj.erase("tokens_per_step");  // the CSV does not keep it
      rj["resumed"] = true;
      runs.push_back(std::move(rj));
    }
    pts.push_back(std::move(pj));
  }
  write_file_atomic(path, [&](std::ostream& os) { os << j.dump(1) << "\n"; });
}

}  // namespace

// ---- run_sweep's parts (2) -------------------------------------------------------------------

namespace {

// The points left (todo) and their predicted costs: rank 0 finds them (find_work) and broadcasts
// them; the other ranks wait for them before doing anything that can fail, so an input error is
// reported once, by rank 0, which ends the job (rank 0 alone reads the CSV, which may not even
// exist on the other machines).
void broadcast_work(SweepTransport* tp, bool root, SweepWork& work) {
  if (!tp) return;
  if (root) {
    nlohmann::json j;
    j["todo"] = work.todo;
    j["cost"] = work.cost;
    std::string text = j.dump();
    tp->broadcast(text);
    return;
  }
  std::string text;
  tp->broadcast(text);
  auto j = nlohmann::json::parse(text);
  work.todo = j.at("todo").get<std::vector<std::size_t>>();
  work.cost = j.at("cost").get<std::vector<double>>();
}

// This rank's worker threads and, with several ranks, the main thread's traffic with them: the
// state they share and what each of them runs. Every member function but run() runs on one
// thread among several; the mutex guards `result`, `progress` and the outbox.
class SweepWorkers {
 public:
  SweepWorkers(const SweepSpec& spec, const SweepOptions& opts,
               const std::vector<SweepPoint>& points, const std::vector<std::size_t>& mine,
               SweepTransport* tp, int rank, int ranks, int jobs, SweepProgress& progress,
               SweepResult& result)
      : spec_(spec),
        opts_(opts),
        points_(points),
        mine_(mine),
        tp_(tp),
        rank_(rank),
        ranks_(ranks),
        jobs_(jobs),
        progress_(progress),
        result_(result),
        active_(jobs) {}

  /// Runs this rank's points on `jobs` threads. Alone, the calling thread is one of them; with
  /// several ranks it talks to the other ranks instead (every MPI call stays on it). Returns the
  /// first error of any thread (null when none).
  std::exception_ptr run(const std::string& base_text) {
    std::vector<std::thread> pool;
    if (!tp_) {
      for (int j = 1; j < jobs_; ++j) pool.emplace_back([&] { work(base_text); });
      if (jobs_ > 0) work(base_text);
    } else {
      for (int j = 0; j < jobs_; ++j) pool.emplace_back([&] { work(base_text); });
      try {
        if (rank_ == 0) {
          serve_ranks();
        } else {
          forward_to_root();
        }
      } catch (...) {
        fail();
      }
    }
    for (auto& t : pool) t.join();
    return error_;
  }

  std::mutex& mutex() { return mu_; }

 private:
  // One worker: takes the next of this rank's points until none is left or a thread failed.
  // Each worker owns its YAML trees, scenario, topology and stacks: nothing is shared between
  // points but the read-only spec and the sample cache.
  void work(const std::string& base_text) {
    try {
      const YAML::Node base_tree = YAML::Load(base_text);
      while (!stop_.load()) {
        // Points too small to reach a poll of the event loops still stop here on Ctrl-C.
        sim::throw_if_interrupted();
        std::size_t k = next_.fetch_add(1);
        if (k >= mine_.size()) break;
        std::string engine;
        std::vector<SweepRow> rows =
            run_point(spec_, opts_, base_tree, points_[mine_[k]], sample_cache_, engine);
        std::string message = rank_ == 0 ? std::string() : rows_message(rank_, rows);
        std::lock_guard<std::mutex> lock(mu_);
        if (result_.engine.empty()) result_.engine = engine;
        if (rank_ == 0) {
          progress_.point_done(0, rows, result_);
        } else {
          outbox_.push_back(std::move(message));
          for (auto& r : rows) result_.rows.push_back(std::move(r));
          ++result_.points_run;
          ++result_.points_per_rank.at(static_cast<std::size_t>(rank_));
          outbox_cv_.notify_one();
        }
      }
    } catch (...) {
      fail();
    }
    std::lock_guard<std::mutex> lock(mu_);
    active_.fetch_sub(1);
    outbox_cv_.notify_one();
  }

  // Rank 0's main thread: the other ranks' rows into the progress record, until every rank said
  // it is done and this rank's workers are (or a thread failed).
  void serve_ranks() {
    int finished_ranks = 0;
    while (true) {
      while (auto text = tp_->try_receive()) {
        auto j = nlohmann::ordered_json::parse(*text);
        if (j.contains("done")) {
          ++finished_ranks;
          continue;
        }
        auto rows = parse_rows_message(j);
        const int from = j.at("rank").get<int>();
        if (from <= 0 || from >= ranks_)
          throw RuntimeError(fmt::format("sweep: a message from rank {} of {}", from, ranks_));
        std::lock_guard<std::mutex> lock(mu_);
        progress_.point_done(from, rows, result_);
      }
      if (stop_.load()) break;
      if (active_.load() == 0 && finished_ranks == ranks_ - 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // Another rank's main thread: its workers' rows to rank 0 as they come, then "done".
  void forward_to_root() {
    while (true) {
      std::vector<std::string> batch;
      bool workers_left = true;
      {
        std::unique_lock<std::mutex> lock(mu_);
        outbox_cv_.wait_for(lock, std::chrono::milliseconds(100),
                            [&] { return !outbox_.empty() || active_.load() == 0; });
        batch.swap(outbox_);
        workers_left = active_.load() > 0;
      }
      for (const auto& m : batch) tp_->send_to_root(m);
      if (!workers_left) break;
    }
    if (!stop_.load()) tp_->send_to_root("{\"done\":true}");
  }

  // Keeps the first error (inside a catch block) and stops every thread at its next point.
  void fail() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::current_exception();
    stop_.store(true);
  }

  const SweepSpec& spec_;
  const SweepOptions& opts_;
  const std::vector<SweepPoint>& points_;
  const std::vector<std::size_t>& mine_;
  SweepTransport* const tp_;
  const int rank_, ranks_, jobs_;
  SweepProgress& progress_;
  SweepResult& result_;
  std::mutex mu_;
  std::condition_variable outbox_cv_;
  std::vector<std::string> outbox_;  // ranks > 0: messages for rank 0, sent by the main thread
  std::atomic<std::size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> active_;
  std::exception_ptr error_;
  // Points that differ only in what the sampled counts do not depend on (model_dim, hidden_dim,
  // capacity, the network, the stack) share the counts of one iteration and layer: sampling them
  // once is exact (strategies/workload/workload.hpp, SampleCache) and is most of an analytical
  // point's cost. Thread-safe; bounded by its byte budget.
  workload::SampleCache sample_cache_;
};

// Rank 0, every point run: the rows in point order (strategies in the scenario's order), the
// sorted CSV rewrite and the JSON file.
void finish_on_root(const SweepSpec& spec, const SweepOptions& opts, const Scenario& base_sc,
                    const std::vector<std::string>& strategy_names,
                    const SweepFingerprint& fingerprint, SweepProgress& progress,
                    const std::function<void(const std::vector<SweepRow>&)>& write_all,
                    SweepResult& result) {
  std::map<std::string, std::size_t> order;
  for (std::size_t i = 0; i < strategy_names.size(); ++i) order[strategy_names[i]] = i;
  std::stable_sort(result.rows.begin(), result.rows.end(),
                   [&](const SweepRow& a, const SweepRow& b) {
                     if (a.point != b.point) return a.point < b.point;
                     return order[a.summary.strategy] < order[b.summary.strategy];
                   });
  if (!opts.csv_path.empty()) {
    progress.close_csv();
    write_all(result.rows);
  }
  if (result.engine.empty())
    result.engine =
        std::string(sim::network_kind_name(engine_config_from(base_sc, opts.engine).network));
  if (!opts.json_path.empty()) write_sweep_json(spec, result, fingerprint, opts.json_path);
}

}  // namespace

SweepResult run_sweep(const SweepSpec& spec, const SweepOptions& opts) {
  auto t0 = std::chrono::steady_clock::now();
  SweepTransport* const tp =
      opts.transport != nullptr && opts.transport->size() > 1 ? opts.transport : nullptr;
  const int rank = tp ? tp->rank() : 0;
  const int ranks = tp ? tp->size() : 1;
  const bool root = rank == 0;

  SweepResult result;
  result.points_per_rank.assign(static_cast<std::size_t>(ranks), 0);
  const std::vector<SweepPoint> points = expand_points(spec);
  result.points_total = points.size();
  std::vector<std::string> strategy_names;
  SweepWork work;

  if (!root) broadcast_work(tp, root, work);  // waits for rank 0's list (see broadcast_work)
  if (root) validate_sweep(spec);
  const std::string base_text = read_text(spec.base_path);
  const Scenario base_sc = base_scenario(spec);
  const auto cols = sweep_csv_columns(spec, base_sc.serving.has_value());
  for (const auto& s : select_strategies(base_sc, spec.strategies))
    strategy_names.push_back(s.name);
  SweepFingerprint fingerprint;
  if (root) {
    fingerprint = sweep_fingerprint(spec, opts.engine);
    work = find_work(spec, opts, points, cols, strategy_names, fingerprint, base_sc, base_text,
                     result);
    broadcast_work(tp, root, work);
  }
  const std::vector<std::size_t> mine = share_of_rank(work, ranks, rank);

  auto write_all = [&](const std::vector<SweepRow>& rows) {
    // The fingerprint first: a CSV is never left beside another setup's fingerprint.
    write_file_atomic(sweep_fingerprint_path(opts.csv_path),
                      [&](std::ostream& os) { os << fingerprint.csv_comment() << "\n"; });
    write_file_atomic(opts.csv_path, [&](std::ostream& os) {
      for (std::size_t c = 0; c < cols.size(); ++c) os << (c ? "," : "") << csv_field(cols[c]);
      os << "\n";
      for (const auto& r : rows) os << csv_line(r);
      for (const auto& r : work.foreign) os << csv_line(r);
    });
  };

  int jobs = opts.jobs > 0 ? opts.jobs
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Workers of all ranks (for the ETA; other ranks are assumed to run as many as this one).
  const std::size_t workers_total =
      static_cast<std::size_t>(jobs) * static_cast<std::size_t>(ranks);
  jobs = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(jobs), mine.size()));

  SweepOptions rank_opts = opts;  // the progress record's: only rank 0 logs the ETA
  if (!root) rank_opts.eta_log_path.clear();
  SweepProgress progress(rank_opts, work, workers_total);
  if (root && !opts.csv_path.empty()) {
    write_all(result.rows);  // drops cut-short lines before appending
    progress.append_to(opts.csv_path);
  }
  if (root && opts.progress && result.points_skipped > 0)
    std::fprintf(stderr, "moesim sweep: %zu of %zu points already in %s, skipped\n",
                 result.points_skipped, points.size(), opts.csv_path.c_str());

  SweepWorkers workers(spec, opts, points, mine, tp, rank, ranks, jobs, progress, result);
  const std::exception_ptr error = workers.run(base_text);
  if (root && !work.todo.empty()) {
    std::lock_guard<std::mutex> lock(workers.mutex());
    progress.print(true);
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const sim::Interrupted&) {
      if (root) report_interrupted(opts, progress, work.todo.size());
      throw;
    }
  }
  if (root)  // (the other ranks' rows reached rank 0, which writes everything)
    finish_on_root(spec, opts, base_sc, strategy_names, fingerprint, progress, write_all, result);
  result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace moesim::app
