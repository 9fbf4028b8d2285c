// moesim: MoE cluster simulator and real-execution driver. docs/design.md §5 is the CLI contract.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "apps/moesim/commands.hpp"
#include "core/error.hpp"
#include "sim/progress.hpp"

namespace moesim::app {

std::string default_scenario_path() {
  // Prefer the scenarios installed next to the source tree this binary was built from.
  return std::string(MOESIM_SOURCE_DIR) + "/scenarios/quickstart.yaml";
}

}  // namespace moesim::app

int main(int argc, char** argv) {
  CLI::App app{
      "moesim: what will this Mixture-of-Experts model cost on that cluster, which "
      "strategy wins, and by how much?"};
  app.set_version_flag("--version", std::string("moesim ") + MOESIM_VERSION);
  app.require_subcommand(1);
  moesim::app::register_validate(app);
  moesim::app::register_topo(app);
  moesim::app::register_simulate(app);
  moesim::app::register_compare(app);
  moesim::app::register_route_train(app);
#ifdef MOESIM_HAVE_EXEC
  moesim::app::register_exec(app);
  moesim::app::register_calibrate(app);
#endif
  moesim::app::register_sweep(app);
  moesim::app::register_tune(app);
  moesim::app::register_list(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints usage errors itself; bad command lines are invalid input (exit 2).
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const moesim::sim::Interrupted&) {
    // Ctrl-C: the command already said what it completed; 128 + SIGINT, as the shell reports.
    return 130;
  } catch (const moesim::InputError& e) {
    std::fprintf(stderr, "moesim: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moesim: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
