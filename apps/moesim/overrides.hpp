// `--set KEY=VALUE`: edit a scenario's YAML tree before it is validated, on every command that
// reads a scenario (validate, topo, simulate, compare, exec, calibrate). KEY is a key path as in
// sweeps (`model.seq_len`, `strategies[1].a2a`), VALUE is YAML (`16`, `fp32`, `100Gb/s`,
// `[1, 2]`, `{name: x}`). The edited scenario goes through the same validation as a file, so a bad
// value gets the same error (file and key path; the line is the original key's when the key
// existed, none for a key --set created). Typical use: run a bundled scenario's plan structure
// at reduced tensor sizes (the host execution path in CI), or try one knob without a copy.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/scenario.hpp"

namespace moesim::app {

/// Adds the repeatable `--set KEY=VALUE` option to `cmd`, storing the raw texts in `sets`.
void add_set_option(CLI::App* cmd, std::vector<std::string>* sets);

/// load_scenario(path) with the `--set` edits applied in order (a later one wins). InputError
/// (exit 2) for a malformed edit, a path through a non-map, or an invalid resulting scenario.
Scenario load_scenario_with(const std::string& path, const std::vector<std::string>& sets);

}  // namespace moesim::app
