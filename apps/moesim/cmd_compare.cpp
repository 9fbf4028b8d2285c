// `moesim compare SCENARIO.yaml [--topology TOPO.yaml]... [--strategy NAME]... [--engine E]
//                 [--set KEY=VALUE]... [--iterations N] [--json F] [--csv F] [--plot F]
//                 [--report F]`
// Runs the strategy stacks on several topologies: each --topology file replaces the scenario's
// `cluster:` section (the whole scenario is re-validated against it), and prints the matrix of
// step times and speedups over the baseline on the same topology. --set edits apply after the
// cluster is replaced, so `--set cluster.nic_bandwidth=...` tries one knob on every topology.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/html_report.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/plot.hpp"
#include "apps/moesim/progress.hpp"
#include "apps/moesim/report.hpp"
#include "apps/moesim/stacks.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/progress.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

struct CompareArgs {
  std::string scenario;
  std::vector<std::string> topologies;
  std::vector<std::string> strategies;
  std::vector<std::string> sets;  // --set KEY=VALUE
  std::string engine;
  std::string simgrid_mode;               // --simgrid-mode
  std::optional<std::string> iterations;  // absent: each scenario's workload.iterations
  std::string json_path, csv_path;
  std::string plot_path, report_path;  // --plot F.svg|F.png, --report F.html
  bool quiet = false;                  // --quiet: no progress on stderr
};

struct Variant {
  std::string topology_name;
  Scenario sc;
};

// The scenario with its cluster replaced by the one of `topo_path`. The topology file is checked
// on its own first, so its errors name its own lines.
Variant with_topology(const std::string& scenario_arg, const std::string& topo_arg,
                      const std::vector<std::string>& sets) {
  const std::string topo_path = resolve_input(topo_arg, InputKind::kTopology);
  ClusterSpec checked = load_cluster_file(topo_path);
  YAML::Node topo_root = load_yaml_file(topo_path);
  std::string scenario_path;
  YAML::Node root = load_input_yaml(scenario_arg, InputKind::kScenario, scenario_path);
  root["cluster"] = topo_root["cluster"] ? topo_root["cluster"] : topo_root;
  Variant v;
  if (topo_root["name"] && topo_root["name"].IsScalar())
    v.topology_name = topo_root["name"].as<std::string>();
  else
    v.topology_name = std::filesystem::path(topo_path).stem().string();
  try {
    v.sc = parse_scenario_with(root, scenario_path, sets);
  } catch (const InputError& e) {
    throw InputError(e.location(), e.key(),
                     fmt::format("{} (with the cluster of {})", e.message(), topo_path));
  }
  (void)checked;
  refuse_serving(v.sc, "compare");
  return v;
}

// Grouped bars, strategies x topologies: speedup vs the baseline when there is one, else the
// step time.
BarChart compare_chart(const std::string& title, const std::vector<Variant>& variants,
                       const std::vector<StrategySpec>& specs,
                       const std::vector<std::vector<StackOutcome>>& results) {
  BarChart c;
  bool speedups = baseline_index(specs) >= 0;
  c.title = title;
  c.ylabel = speedups ? "speedup vs baseline (x)" : "step time (ms)";
  c.reference_line = speedups ? 1.0 : 0.0;
  for (const auto& s : specs) c.series.push_back(s.name);
  for (size_t t = 0; t < variants.size(); ++t) {
    c.groups.push_back(variants[t].topology_name);
    std::vector<double> row;
    for (const auto& o : results[t])
      row.push_back(speedups ? o.summary.speedup : o.summary.step_mean_s * 1e3);
    c.values.push_back(std::move(row));
  }
  return c;
}

void run_compare(const CompareArgs& a, ProgressReporter& progress) {
  check_output_paths({{"--json", a.json_path},
                      {"--csv", a.csv_path},
                      {"--plot", a.plot_path},
                      {"--report", a.report_path}});
  if (!a.plot_path.empty()) {
    check_plot_path(a.plot_path, "--plot");
    require_gnuplot();  // before the runs, not after
  }
  std::string path = a.scenario.empty() ? default_scenario_path() : a.scenario;
  std::vector<Variant> variants;
  if (a.topologies.empty()) {
    Variant v;
    v.sc = load_scenario_with(path, a.sets);
    refuse_serving(v.sc, "compare");
    v.topology_name = v.sc.cluster.name.empty() ? v.sc.name : v.sc.cluster.name;
    variants.push_back(std::move(v));
  } else {
    for (const auto& t : a.topologies) variants.push_back(with_topology(path, t, a.sets));
  }
  const Scenario& base = variants.front().sc;
  auto specs = select_strategies(base, a.strategies);
  const auto iterations_flag = parse_int_flag("--iterations", a.iterations, 1, kMaxIterationsFlag);

  int total_units = 0;
  for (const auto& v : variants)
    total_units +=
        static_cast<int>(specs.size()) *
        (iterations_flag ? static_cast<int>(*iterations_flag) : v.sc.workload.iterations);
  progress.set_total_units(total_units);

  // results[t][s]
  std::vector<std::vector<StackOutcome>> results;
  std::string engine_name;
  std::optional<double> flow_tolerance;  // the flow engine's event_tolerance (JSON), when flow
  for (const auto& v : variants) {
    auto topo = simulation_topology(v.sc);
    sim::EngineConfig cfg = engine_config_from(v.sc, a.engine, a.simgrid_mode);
    announce_simgrid_mode(cfg, topo->num_gpus());
    engine_name = std::string(sim::network_kind_name(cfg.network));
    if (cfg.network == sim::NetworkKind::kFlow) flow_tolerance = cfg.flow_event_tolerance;
    const int iterations =
        iterations_flag ? static_cast<int>(*iterations_flag) : v.sc.workload.iterations;
    results.push_back(run_stacks(v.sc, specs, *topo, cfg, iterations, v.topology_name, !a.quiet,
                                 nullptr, &progress));
    progress.finish();  // before the warnings below
    std::vector<RunSummary> rows;
    for (const auto& o : results.back()) rows.push_back(o.summary);
    warn_memory(v.sc, rows, fmt::format("{} on {}", topo->gpu().name, v.topology_name));
  }
  sim::throw_if_interrupted();  // Ctrl-C after the last poll: still no output files

  fmt::print("# {}: step time (ms) and speedup vs baseline, engine {}\n", base.name, engine_name);
  fmt::print("{:<16}", "strategy");
  for (const auto& v : variants) fmt::print(" {:>24}", v.topology_name);
  fmt::print("\n");
  for (size_t s = 0; s < specs.size(); ++s) {
    fmt::print("{:<16}", specs[s].name);
    for (size_t t = 0; t < variants.size(); ++t) {
      const auto& sum = results[t][s].summary;
      std::string cell = fmt::format("{:.3f}", sum.step_mean_s * 1e3);
      if (sum.speedup > 0) cell += fmt::format(" ({:.2f}x)", sum.speedup);
      fmt::print(" {:>24}", cell);
    }
    fmt::print("\n");
  }

  if (!a.json_path.empty()) {
    nlohmann::ordered_json j;
    j["moesim_version"] = MOESIM_VERSION;
    j["scenario"] = base.name;
    j["engine"] = engine_name;
    if (flow_tolerance) j["flow_event_tolerance"] = *flow_tolerance;
    auto& runs = j["runs"] = nlohmann::ordered_json::array();
    for (size_t t = 0; t < variants.size(); ++t)
      for (const auto& o : results[t]) runs.push_back(run_json(variants[t].sc, o.run, o.summary));
    write_file_atomic(a.json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
  }
  if (!a.plot_path.empty() || !a.report_path.empty()) {
    std::string title = fmt::format("{}: {} engine", base.name, engine_name);
    std::string plot = a.plot_path, note;
    if (!a.plot_path.empty()) {
      render_bar_chart(compare_chart(title, variants, specs, results), a.plot_path);
    } else if (find_gnuplot().empty()) {
      note = "No plot: gnuplot was not found (apt-get install gnuplot-nox).";
    } else {
      // The report gets its plot next to it when --plot is not given.
      std::filesystem::path p(a.report_path);
      p.replace_extension(".plot.svg");
      plot = p.string();
      render_bar_chart(compare_chart(title, variants, specs, results), plot);
    }
    if (!a.report_path.empty()) {
      CompareReport rep;
      rep.engine = engine_name;
      rep.plot_path = plot;
      rep.plot_note = note;
      for (const auto& s : specs) rep.strategies.push_back(s.name);
      for (size_t t = 0; t < variants.size(); ++t) {
        rep.topology_names.push_back(variants[t].topology_name);
        rep.scenarios.push_back(&variants[t].sc);
        std::vector<ReportRun> runs;
        for (const auto& o : results[t]) runs.push_back({&o.run, o.summary});
        rep.runs.push_back(std::move(runs));
      }
      write_compare_report(a.report_path, rep);
    }
  }
  if (!a.csv_path.empty()) {
    write_file_atomic(a.csv_path, [&](std::ostream& os) {
      write_csv_header(os);
      for (size_t t = 0; t < variants.size(); ++t)
        for (const auto& o : results[t])
          write_csv_rows(os, variants[t].sc, o.run, variants[t].topology_name);
    });
  }
}

}  // namespace

void register_compare(CLI::App& app) {
  auto* cmd = app.add_subcommand("compare", "Run the strategy stacks on several topologies");
  auto a = std::make_shared<CompareArgs>();
  cmd->add_option("scenario", a->scenario, "Scenario YAML (default: scenarios/quickstart.yaml)");
  cmd->add_option("--topology", a->topologies,
                  "Topology YAML whose cluster replaces the scenario's (repeatable)");
  cmd->add_option("--strategy", a->strategies, "Run only this strategy (repeatable)");
  cmd->add_option("--engine", a->engine, "Network model: analytical, flow or simgrid");
  cmd->add_option("--simgrid-mode", a->simgrid_mode,
                  "With --engine simgrid: per_flow, ptask or auto (default: engine.simgrid.mode)");
  cmd->add_option("--iterations", a->iterations,
                  "Iterations, in [1, 1000000] (default: workload.iterations)");
  add_set_option(cmd, &a->sets);
  cmd->add_option("--json", a->json_path, "Write results as JSON to this file");
  cmd->add_option("--csv", a->csv_path, "Write one row per topology, strategy and iteration");
  cmd->add_option("--plot", a->plot_path,
                  "Grouped bars of the speedups (F.svg or F.png, rendered by gnuplot)");
  cmd->add_option("--report", a->report_path, "Self-contained HTML report");
  cmd->add_flag("--quiet,-q", a->quiet,
                "No progress on stderr (the per-strategy lines, and the progress line of runs "
                "longer than 2 s)");
  cmd->callback([a] {
    run_interruptible(a->quiet, [&](ProgressReporter& progress) { run_compare(*a, progress); });
  });
}

}  // namespace moesim::app
