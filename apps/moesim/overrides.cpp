#include "apps/moesim/overrides.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::app {

void add_set_option(CLI::App* cmd, std::vector<std::string>* sets) {
  cmd->add_option("--set", *sets,
                  "Override a scenario key before validation: KEY=VALUE, KEY a key path "
                  "(model.seq_len, strategies[0].a2a), VALUE YAML (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
}

Scenario load_scenario_with(const std::string& path, const std::vector<std::string>& sets) {
  if (sets.empty()) return load_scenario(path);
  YAML::Node tree = load_yaml_file(path);
  const SourceLocation where{"--set", 0, 0};
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError(where, s, "expected KEY=VALUE, e.g. --set model.seq_len=16");
    const std::string key = s.substr(0, eq), text = s.substr(eq + 1);
    YAML::Node value;
    check_yaml_expansion(text, "--set " + key);  // an alias bomb in a value, too
    try {
      value = YAML::Load(text);  // "16" and "fp32" stay scalars; "[1, 2]" / "{...}" structures
    } catch (const YAML::Exception& e) {
      throw InputError(where, key, fmt::format("value '{}' is not YAML: {}", text, e.msg));
    }
    if (!value.IsDefined() || value.IsNull())
      throw InputError(where, key, "empty value; expected KEY=VALUE with a non-empty VALUE");
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

}  // namespace moesim::app
