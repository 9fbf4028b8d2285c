// `moesim tune SCENARIO.yaml [--budget 60s] [--engine flow] [--top 10] [--jobs N] [--json F]
//              [--csv F] [--report F.html] [--emit best.yaml] [--keep-layout] [--keep-pipeline]
//              [--keep-memory] [--include-routing] [--iterations N]
//              [--set KEY=VALUE]...`:
// the best strategy stacks and parallel layouts for the scenario's model on its cluster; under
// `mpirun -np N` the runs are spread over the ranks (each with --jobs threads)
// (apps/moesim/tune.hpp, docs/tune.md).
#include <fmt/format.h>

#include <fstream>
#include <memory>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/html_report.hpp"
#include "apps/moesim/mpi_launch.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/serving_tune.hpp"
#include "apps/moesim/tune.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "core/units.hpp"

namespace moesim::app {

namespace {

struct TuneArgs {
  std::string scenario;
  std::vector<std::string> sets;
  std::string budget = "60s";
  std::string engine = "auto";
  std::optional<std::string> top, iterations, jobs, attainment;
  std::string json_path, csv_path, emit_path, state_path, report_path;
  bool keep_layout = false, keep_pipeline = false, keep_memory = false, include_routing = false;
  bool quiet = false;
};

// A serving deployment: the pool shapes that meet its SLO (apps/moesim/serving_tune.hpp). The
// training search's flags that do not apply are refused by name.
void run_serving_tune(const TuneArgs& a, const YAML::Node& tree, const std::string& path,
                      SweepTransport* transport) {
  const std::vector<std::pair<const char*, bool>> training_only = {
      {"--engine", a.engine != "auto"},   {"--iterations", a.iterations.has_value()},
      {"--keep-layout", a.keep_layout},   {"--keep-pipeline", a.keep_pipeline},
      {"--keep-memory", a.keep_memory},   {"--include-routing", a.include_routing},
      {"--state", !a.state_path.empty()}, {"--report", !a.report_path.empty()}};
  for (const auto& [flag, given] : training_only)
    if (given)
      throw InputError(fmt::format(
          "{}: not for a serving deployment (tune searches its pool shapes on the scenario's own "
          "engine; the flags it takes: --budget, --attainment, --top, --jobs, --json, --csv, "
          "--emit, --set)",
          flag));
  if (transport && transport->size() > 1)
    throw InputError("tune on a serving deployment runs in one process: run it without mpirun");
  ServingTuneOptions o;
  o.budget_s = parse_quantity_flag("--budget", a.budget, UnitKind::kSeconds);
  if (a.attainment)
    o.attainment = parse_number_flag("--attainment", *a.attainment, 0, 1, /*min_open=*/true);
  if (auto v = parse_int_flag("--top", a.top, 1, 1000)) o.top = static_cast<int>(*v);
  if (auto v = parse_int_flag("--jobs", a.jobs, 0, 4096)) o.jobs = static_cast<int>(*v);
  o.progress = !a.quiet;
  const ServingTuneResult r = tune_serving(tree, path, a.sets, o);
  print_serving_tune(r, o.top);
  if (!a.json_path.empty())
    write_file_atomic(a.json_path,
                      [&](std::ostream& os) { os << serving_tune_json(r).dump(1) << "\n"; });
  if (!a.csv_path.empty())
    write_file_atomic(a.csv_path, [&](std::ostream& os) { os << serving_tune_csv(r); });
  if (!a.emit_path.empty()) {
    if (!r.met()) {  // an outcome, not an error: the table says how close the search came
      fmt::print("# --emit: {} not written: no shape meets the SLO\n", a.emit_path);
      return;
    }
    write_file_atomic(a.emit_path, [&](std::ostream& os) {
      os << serving_tuned_yaml(tree, a.sets, r.ranked.front());
    });
    fmt::print("# wrote {}: `moesim simulate {}` serves the requests on the tuned pools\n",
               a.emit_path, a.emit_path);
  }
}

void run_tune(const TuneArgs& a, SweepTransport* transport) {
  check_output_paths({{"--json", a.json_path},
                      {"--csv", a.csv_path},
                      {"--emit", a.emit_path},
                      {"--report", a.report_path},
                      {"--state", a.state_path}});
  // Read once: a scenario on stdin ("-") can be read only once.
  std::string path;
  const YAML::Node tree = load_input_yaml(a.scenario.empty() ? default_scenario_path() : a.scenario,
                                          InputKind::kScenario, path);
  if (parse_scenario_with(YAML::Clone(tree), path, a.sets).serving)
    return run_serving_tune(a, tree, path, transport);
  if (a.attainment)
    throw InputError("--attainment: for a serving deployment only (a scenario with serving:)");
  TuneOptions o;
  o.budget_s = parse_quantity_flag("--budget", a.budget, UnitKind::kSeconds);
  if (a.engine != "auto" && a.engine != "analytical" && a.engine != "flow" && a.engine != "simgrid")
    throw InputError(fmt::format(
        "--engine: found '{}', expected auto, analytical, flow or simgrid (the engine the best "
        "candidates are re-run on; screening is analytical; analytical = no re-run)",
        a.engine));
  o.rerun_engine = a.engine;
  if (auto v = parse_int_flag("--top", a.top, 1, 1000)) o.top = static_cast<int>(*v);
  if (auto v = parse_int_flag("--iterations", a.iterations, 1, kMaxIterationsFlag))
    o.iterations = static_cast<int>(*v);
  o.search_layouts = !a.keep_layout;
  o.search_pipeline = !a.keep_pipeline;
  o.search_memory = !a.keep_memory;
  o.include_routing = a.include_routing;
  o.state_path = a.state_path;
  o.progress = !a.quiet;
  if (auto v = parse_int_flag("--jobs", a.jobs, 0, 4096)) o.jobs = static_cast<int>(*v);
  o.transport = transport;
  const bool root = !transport || transport->rank() == 0;
  const TuneResult r = tune(tree, path, a.sets, o);
  if (!root) return;  // rank 0 has the result and writes every output
  print_tune(r);
  if (!a.json_path.empty())
    write_file_atomic(a.json_path, [&](std::ostream& os) { os << tune_json(r) << "\n"; });
  if (!a.csv_path.empty())
    write_file_atomic(a.csv_path, [&](std::ostream& os) { os << tune_csv(r); });
  if (!a.report_path.empty()) {
    const Scenario sc = parse_scenario_with(YAML::Clone(tree), path, a.sets);
    write_tune_report(a.report_path, TuneReport{&r, &sc});
  }
  if (!a.emit_path.empty()) {
    if (r.ranked.empty())
      throw RuntimeError("--emit: no candidate ran (every layout over memory or inapplicable)");
    const std::string text = tuned_scenario_yaml(tree, path, a.sets, r, r.ranked.front());
    write_file_atomic(a.emit_path, [&](std::ostream& os) { os << text; });
    fmt::print("# wrote {}: `moesim simulate {}` runs the tuned stack beside the baseline\n",
               a.emit_path, a.emit_path);
  }
}

}  // namespace

void register_tune(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "tune", "Search strategy stacks and parallel layouts for a scenario's model and cluster");
  auto a = std::make_shared<TuneArgs>();
  cmd->add_option("scenario", a->scenario, "Scenario YAML (default: the bundled quickstart)");
  cmd->add_option("--budget", a->budget, "Wall-clock budget of the search (default 60s)");
  cmd->add_option("--engine", a->engine,
                  "Engine the best candidates are re-run on: auto (default: flow up to 1,024 GPUs, "
                  "else none), flow, simgrid, or analytical (screening only, no re-run)");
  cmd->add_option("--top", a->top, "Candidates re-run and listed, in [1, 1000] (default 10)");
  cmd->add_option("--iterations", a->iterations,
                  "Iterations per run (default: the scenario's workload.iterations)");
  cmd->add_option("--json", a->json_path, "Write the search and the ranked candidates as JSON");
  cmd->add_option("--csv", a->csv_path, "Write the ranked candidates as CSV");
  cmd->add_option("--report", a->report_path,
                  "Self-contained HTML report: the ranked candidates as bars and a table with "
                  "why each wins, every layout with its memory and screen time");
  cmd->add_option("--emit", a->emit_path,
                  "Write the best candidate as a scenario file (its layout, and strategies: "
                  "[baseline, tuned])");
  cmd->add_option("--state", a->state_path,
                  "Keep every run in this file and reuse the runs it already has: the same "
                  "command goes on where a search the budget cut short stopped (refused when the "
                  "file was written for another scenario, engine, iteration count or version)");
  cmd->add_flag("--keep-layout", a->keep_layout,
                "Search the strategy stacks on the scenario's own parallel layout only");
  cmd->add_flag("--keep-pipeline", a->keep_pipeline,
                "Keep the scenario's pipeline stages, schedule and micro-batches (search the "
                "layouts of one stage)");
  cmd->add_flag("--keep-memory", a->keep_memory,
                "Keep the scenario's ZeRO stage and recomputation");
  cmd->add_flag("--include-routing", a->include_routing,
                "Also search routing roles that change which experts tokens reach (ta_moe, "
                "faster_moe_hir): the model then learns something else; marked * in the table");
  cmd->add_option("--attainment", a->attainment,
                  "Serving deployments: the share of requests a shape must serve within the SLO, "
                  "in (0, 1] (default 0.9)");
  cmd->add_flag("--quiet,-q", a->quiet, "No progress lines on stderr");
  add_set_option(cmd, &a->sets);
  cmd->add_option("--jobs,-j", a->jobs,
                  "Runs in parallel (per rank under mpirun), in [0, 4096] (default or 0: one per "
                  "core); the result does not depend on it when the search completes");
  cmd->callback([a] {
    run_spread("a tune search", [&](SweepTransport* transport) { run_tune(*a, transport); });
  });
}

}  // namespace moesim::app
