#include "apps/moesim/overrides.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>

#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "core/yaml_reader.hpp"

namespace moesim::app {

namespace fs = std::filesystem;

void add_set_option(CLI::App* cmd, std::vector<std::string>* sets) {
  cmd->add_option("--set", *sets,
                  "Override a scenario key before validation: KEY=VALUE, KEY a key path "
                  "(model.seq_len, strategies[0].a2a), VALUE YAML (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
}

std::pair<std::string, YAML::Node> parse_set_edit(const std::string& s) {
  const SourceLocation where{"--set", 0, 0};
  const auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw InputError(where, s, "expected KEY=VALUE, e.g. --set model.seq_len=16");
  const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
  YAML::Node value;
  try {
    check_yaml_expansion(text, "--set " + key);  // an alias bomb in a value, too
    value = YAML::Load(text);  // "16" and "fp32" stay scalars; "[1, 2]" / "{...}" structures
  } catch (const YAML::Exception& e) {
    throw InputError(where, key, fmt::format("value '{}' is not YAML: {}", text, e.msg));
  }
  if (!value.IsDefined() || value.IsNull())
    throw InputError(where, key, "empty value; expected KEY=VALUE with a non-empty VALUE");
  return {key, value};
}

RunScenario load_run_scenario(const std::string& path, const std::vector<std::string>& sets,
                              const std::optional<std::string>& iterations,
                              const std::optional<std::string>& seed) {
  const auto iterations_flag = parse_int_flag("--iterations", iterations, 1, kMaxIterationsFlag);
  const auto seed_flag =
      parse_int_flag("--seed", seed, 0, std::numeric_limits<std::int64_t>::max());
  RunScenario r{load_scenario_with(path, sets), 0};
  if (seed_flag) r.scenario.workload.routing.seed = static_cast<std::uint64_t>(*seed_flag);
  r.iterations =
      iterations_flag ? static_cast<int>(*iterations_flag) : r.scenario.workload.iterations;
  return r;
}

namespace {

constexpr std::string_view kStdin = "<stdin>";

// The folders a bare name is looked up in, in order.
std::vector<fs::path> bundle_folders(InputKind kind) {
  const fs::path root = fs::path(MOESIM_SOURCE_DIR) / "scenarios";
  switch (kind) {
    case InputKind::kScenario:
      return {root / "models", root};
    case InputKind::kSweep:
      return {root / "sweeps"};
    case InputKind::kTopology:
      return {root / "topologies"};
  }
  return {};
}

const char* bundle_what(InputKind kind) {
  switch (kind) {
    case InputKind::kScenario:
      return "bundled scenario or model preset";
    case InputKind::kSweep:
      return "bundled sweep";
    case InputKind::kTopology:
      return "bundled topology";
  }
  return "bundled file";
}

// stdin, read whole the first time (a command may load its scenario more than once).
const std::string& stdin_text() {
  static const std::string text = [] {
    std::string out;
    char buf[65536];
    while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
      out.append(buf, static_cast<std::size_t>(std::cin.gcount()));
      if (out.size() > kMaxYamlFileBytes)
        throw InputError(SourceLocation{std::string(kStdin), 0, 0}, "",
                         fmt::format("found more than {} bytes, expected a YAML document of at "
                                     "most 64 MiB",
                                     kMaxYamlFileBytes));
    }
    return out;
  }();
  return text;
}

}  // namespace

std::string resolve_input(const std::string& arg, InputKind kind) {
  std::error_code ec;
  if (arg == "-" || arg.empty() || fs::exists(arg, ec)) return arg;
  // A bare name: no folder, no extension.
  const bool bare = arg.find('/') == std::string::npos && arg.find('.') == std::string::npos;
  if (!bare) return arg;
  std::vector<std::string> names;
  for (const fs::path& dir : bundle_folders(kind)) {
    const fs::path candidate = dir / (arg + ".yaml");
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  }
  std::vector<std::string_view> views(names.begin(), names.end());
  std::string hint = yaml::did_you_mean(arg, views);
  // A name cut short ("dgx-a100" for "dgx-a100-2x8") is too far for the edit distance.
  for (const std::string& n : names)
    if (hint.empty() && n.rfind(arg, 0) == 0) hint = fmt::format(" (did you mean '{}'?)", n);
  throw InputError(SourceLocation{arg, 0, 0}, "",
                   fmt::format("no such file, and no {} of that name{}; `moesim list` shows them",
                               bundle_what(kind), hint));
}

YAML::Node load_input_yaml(const std::string& arg, InputKind kind, std::string& path) {
  path = resolve_input(arg, kind);
  if (path != "-") return load_yaml_file(path);
  path = std::string(kStdin);
  return parse_yaml_string(stdin_text(), path);
}

Scenario load_scenario_with(const std::string& arg, const std::vector<std::string>& sets) {
  std::string path;
  YAML::Node tree = load_input_yaml(arg, InputKind::kScenario, path);
  if (sets.empty()) return parse_scenario(tree, path);
  return parse_scenario_with(tree, path, sets);
}

namespace {

void apply_sets(YAML::Node tree, const std::vector<std::string>& sets) {
  const SourceLocation where{"--set", 0, 0};
  for (const std::string& s : sets) {
    auto [key, value] = parse_set_edit(s);
    set_key_path(tree, key, value, where);
  }
}

}  // namespace

YAML::Node edited_tree(const YAML::Node& tree, const std::vector<std::string>& sets) {
  YAML::Node t = YAML::Clone(tree);
  apply_sets(t, sets);
  return t;
}

Scenario parse_scenario_with(YAML::Node tree, const std::string& path,
                             const std::vector<std::string>& sets) {
  const SourceLocation where{"--set", 0, 0};
  apply_sets(tree, sets);
  try {
    return parse_scenario(tree, path);
  } catch (const InputError& e) {
    for (const std::string& s : sets) {
      const std::string key = s.substr(0, s.find('='));
      if (!e.key().empty() && e.key().rfind(key, 0) == 0)
        throw InputError(where, e.key(), e.message() + fmt::format(" (from --set {})", s));
    }
    throw;
  }
}

std::int64_t parse_int_flag(const std::string& flag, const std::string& text, std::int64_t min,
                            std::int64_t max) {
  const std::string expected = yaml::int_range_text(min, max);
  std::string_view t = text;
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || ptr != t.data() + t.size())
    throw InputError(fmt::format("{}: found '{}', expected {}", flag, text, expected));
  if (v < min || v > max)
    throw InputError(fmt::format("{}: found {}, expected {}", flag, v, expected));
  return v;
}

std::optional<std::int64_t> parse_int_flag(const std::string& flag,
                                           const std::optional<std::string>& text, std::int64_t min,
                                           std::int64_t max) {
  if (!text) return std::nullopt;
  return parse_int_flag(flag, *text, min, max);
}

double parse_number_flag(const std::string& flag, const std::string& text, double min, double max,
                         bool min_open) {
  const std::string expected = fmt::format("a number in {}{}, {}]", min_open ? "(" : "[", min, max);
  std::string_view t = text;
  if (!t.empty() && t.front() == '+') t.remove_prefix(1);
  double v = 0;
  const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || ptr != t.data() + t.size() || !std::isfinite(v))
    throw InputError(fmt::format("{}: found '{}', expected {}", flag, text, expected));
  if (v < min || v > max || (min_open && v == min))
    throw InputError(fmt::format("{}: found {}, expected {}", flag, v, expected));
  return v;
}

double parse_quantity_flag(const std::string& flag, const std::string& text, UnitKind kind) {
  const ParsedQuantity q = parse_quantity(text, kind);
  if (!q.value) throw InputError(flag + ": " + q.error);
  if (!(*q.value > 0 && *q.value <= max_quantity(kind)))
    throw InputError(fmt::format("{}: found '{}', expected {} greater than 0 and at most {}", flag,
                                 text, unit_kind_name(kind), max_quantity_text(kind)));
  return *q.value;
}

void refuse_serving(const Scenario& sc, std::string_view command) {
  if (!sc.serving) return;
  throw InputError(sc.location_of("serving"), "serving",
                   fmt::format("{} works on a scenario's training or batch step, not a serving "
                               "deployment: run `moesim simulate` on it, `moesim sweep` over its "
                               "request rates, or `moesim tune` for the pools that meet its SLO",
                               command));
}

}  // namespace moesim::app
