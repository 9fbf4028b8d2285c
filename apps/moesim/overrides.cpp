#include "apps/moesim/overrides.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cmath>

#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "core/yaml_reader.hpp"

namespace moesim::app {

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

Scenario load_scenario_with(const std::string& path, const std::vector<std::string>& sets) {
  if (sets.empty()) return load_scenario(path);
  return parse_scenario_with(load_yaml_file(path), path, sets);
}

Scenario parse_scenario_with(YAML::Node tree, const std::string& path,
                             const std::vector<std::string>& sets) {
  const SourceLocation where{"--set", 0, 0};
  for (const std::string& s : sets) {
    auto [key, value] = parse_set_edit(s);
    set_key_path(tree, key, value, where);
  }
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

}  // namespace moesim::app
