// Loading and validating scenario YAML (docs/design.md §6; every key is documented in
// scenarios/README.md). All invalid input is reported as one InputError whose one-line message
// names file:line:col, the key path, what was found and what is expected.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/cluster_spec.hpp"
#include "core/scenario.hpp"

namespace moesim {

/// Reads and validates a scenario file. Relative paths inside it (calibration, traces) are
/// resolved against the file's directory.
Scenario load_scenario(const std::string& path);

/// Validates an already-parsed YAML tree (sweeps edit the base scenario's tree, then call this).
/// `file` names the source in messages and anchors relative paths. Nodes created in memory carry
/// no line: their errors name the file and key path only.
Scenario parse_scenario(const YAML::Node& root, const std::string& file);

/// Same, from YAML text; `pseudo_file` plays the role of the file name (tests, stdin).
Scenario parse_scenario_string(std::string_view yaml, const std::string& pseudo_file);

/// A topology file for `compare --topology`: top-level `cluster:`, optionally with `name:` and
/// `description:`. The cluster's name is `name:`, else the file stem. A full scenario file is
/// accepted as well (validated in full; its cluster is returned, named after the scenario).
ClusterSpec load_cluster_file(const std::string& path);

/// Reads a YAML file into a tree: InputError for a missing/unreadable file or a syntax error
/// (with the parser's line and column). Shared with the sweep loader.
YAML::Node load_yaml_file(const std::string& path);

/// Parses YAML text, turning syntax errors into InputError at `pseudo_file`:line:col.
/// Refuses (InputError naming file:line:col and the key) a YAML text that expands, through
/// anchors and aliases, to more than kMaxYamlNodes nodes or nests deeper than kMaxYamlDepth
/// collections (alias bombs), before any node is built. parse_yaml_string calls it.
inline constexpr std::int64_t kMaxYamlNodes = 1'000'000;
/// Largest YAML file load_yaml_file reads (scenarios, sweeps, topologies, calibrations); only
/// regular files are read at all.
inline constexpr std::uintmax_t kMaxYamlFileBytes = std::uintmax_t{64} << 20;
inline constexpr int kMaxYamlDepth = 64;
void check_yaml_expansion(std::string_view yaml, const std::string& pseudo_file);

YAML::Node parse_yaml_string(std::string_view yaml, const std::string& pseudo_file);

}  // namespace moesim
