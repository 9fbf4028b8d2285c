// The moesim subcommands. Each registers itself on the CLI11 app and runs when selected; errors
// propagate as exceptions (InputError -> exit 2, anything else -> exit 1, see main.cpp).
#pragma once

#include <CLI/CLI.hpp>

namespace moesim::app {

/// Path of the bundled quickstart scenario, used when a command gets no scenario.
std::string default_scenario_path();

void register_validate(CLI::App& app);
void register_topo(CLI::App& app);
void register_simulate(CLI::App& app);
void register_compare(CLI::App& app);

}  // namespace moesim::app
