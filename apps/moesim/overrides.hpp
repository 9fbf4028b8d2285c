// `--set KEY=VALUE`: edit a scenario's YAML tree before it is validated, on every command that
// reads a scenario (validate, topo, simulate, compare, sweep, exec, calibrate). KEY is a key path
// as in sweeps (`model.seq_len`, `strategies[1].a2a`), VALUE is YAML (`16`, `fp32`, `100Gb/s`,
// `[1, 2]`, `{name: x}`). The edited scenario goes through the same validation as a file, so a bad
// value gets the same error (file and key path; the line is the original key's when the key
// existed, none for a key --set created). Typical use: run a bundled scenario's plan structure
// at reduced tensor sizes (the host execution path in CI), or try one knob without a copy.
#pragma once

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/scenario.hpp"
#include "core/units.hpp"

namespace moesim::app {

/// Adds the repeatable `--set KEY=VALUE` option to `cmd`, storing the raw texts in `sets`.
void add_set_option(CLI::App* cmd, std::vector<std::string>* sets);

/// One `--set KEY=VALUE` text: the key path and the value parsed as YAML. InputError (exit 2) for
/// a malformed edit or a value that is not YAML.
std::pair<std::string, YAML::Node> parse_set_edit(const std::string& text);

/// load_scenario(path) with the `--set` edits applied in order (a later one wins). InputError
/// (exit 2) for a malformed edit, a path through a non-map, or an invalid resulting scenario.
/// What an input argument names (docs/tutorial.md): an existing file; "-", the YAML read from
/// stdin (once per process; errors name "<stdin>", relative paths inside resolve from the working
/// directory); or a bundled file by name, without folder or extension: a scenario is looked up in
/// scenarios/models/ then scenarios/, a sweep in scenarios/sweeps/, a topology in
/// scenarios/topologies/. Anything else is returned as given, for the loader's "file not found";
/// a bare name that matches nothing is an InputError naming the closest bundled one.
enum class InputKind { kScenario, kSweep, kTopology };
std::string resolve_input(const std::string& arg, InputKind kind);
/// The YAML tree of an input argument (resolve_input, then the file or stdin); `path` receives
/// the name errors and relative paths use (the file's path, or "<stdin>").
YAML::Node load_input_yaml(const std::string& arg, InputKind kind, std::string& path);

/// The scenario an argument names (resolve_input), with the --set edits applied.
Scenario load_scenario_with(const std::string& arg, const std::vector<std::string>& sets);

/// A run's scenario: `path` with the --set edits and --seed applied, and the iterations to run
/// (--iterations, else workload.iterations). Both flags are checked before the file is read.
struct RunScenario {
  Scenario scenario;
  int iterations = 0;
};
RunScenario load_run_scenario(const std::string& path, const std::vector<std::string>& sets,
                              const std::optional<std::string>& iterations,
                              const std::optional<std::string>& seed);

/// InputError at `serving` when `sc` is a serving deployment (docs/serving.md) and `command`
/// (compare, exec, the training search of tune.hpp) works on its plain step: its figures would not
/// be the serving run's. `simulate`, `sweep` and `tune` (serving_tune.hpp) run serving scenarios.
void refuse_serving(const Scenario& sc, std::string_view command);

/// A copy of `tree` with the `--set` edits applied in order (not validated).
YAML::Node edited_tree(const YAML::Node& tree, const std::vector<std::string>& sets);

/// The same on a scenario tree already read (and perhaps edited, e.g. its cluster replaced by
/// `compare --topology`); `path` names the file in errors and resolves its relative paths.
Scenario parse_scenario_with(YAML::Node tree, const std::string& path,
                             const std::vector<std::string>& sets);

// Numeric command-line values are parsed here, strictly, by every subcommand: the whole text must
// be the number and lie in the stated range, or the command exits 2 with the YAML errors' wording
// ("--seed: found -5, expected an integer in [0, 2^63-1]"). A flag given explicitly is never
// replaced by a default; an absent flag (nullopt) is the caller's to default.

/// The most iterations --iterations accepts: workload.iterations' bound.
constexpr std::int64_t kMaxIterationsFlag = 1'000'000;

/// An integer in [min, max].
std::int64_t parse_int_flag(const std::string& flag, const std::string& text, std::int64_t min,
                            std::int64_t max);
std::optional<std::int64_t> parse_int_flag(const std::string& flag,
                                           const std::optional<std::string>& text, std::int64_t min,
                                           std::int64_t max);
/// A plain number in [min, max] ((min, max] when min_open).
double parse_number_flag(const std::string& flag, const std::string& text, double min, double max,
                         bool min_open = false);
/// A quantity of kind `kind` ("128MiB"), > 0 and at most max_quantity(kind).
double parse_quantity_flag(const std::string& flag, const std::string& text, UnitKind kind);

}  // namespace moesim::app
