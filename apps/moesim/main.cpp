// moesim: MoE cluster simulator and real-execution driver. docs/design.md §5 is the CLI contract.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string_view>
#include <vector>

#include "apps/moesim/commands.hpp"
#include "core/error.hpp"
#include "core/yaml_reader.hpp"
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
  // A first word that names no command: say which one was meant (CLI11 would only say that a
  // subcommand is required).
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string_view> names;
    for (const CLI::App* c : app.get_subcommands({})) names.push_back(c->get_name());
    if (std::find(names.begin(), names.end(), std::string_view(argv[1])) == names.end()) {
      std::fprintf(stderr, "moesim: error: unknown command '%s'%s; expected one of %s\n", argv[1],
                   moesim::yaml::did_you_mean(argv[1], names).c_str(),
                   moesim::yaml::join_alternatives(names).c_str());
      return 2;
    }
  }
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
