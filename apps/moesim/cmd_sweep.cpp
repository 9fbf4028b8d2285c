// `moesim sweep SWEEP.yaml [--jobs N] [--csv F] [--json F] [--engine E] [--set KEY=VALUE]...
//               [--plot F] [--report F] [--restart]`
// Runs a sweep (docs/design.md §6): every point of the axes over the base scenario, the strategy
// stacks at each (a serving base: each strategy's serving run), one CSV row per point x strategy.
// Prints a summary of the best strategy per point at the end (first rows only; the CSV has
// everything). Under `mpirun -np N` the points are spread over the N ranks (each with --jobs
// threads) and gathered on rank 0, which writes the outputs.
// --set edits the base scenario after the file's `set:`, and is part of the resume fingerprint.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/html_report.hpp"
#include "apps/moesim/mpi_launch.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/plot.hpp"
#include "apps/moesim/progress.hpp"
#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::app {

namespace {

namespace fs = std::filesystem;

struct SweepArgs {
  std::string sweep;
  std::optional<std::string> jobs;  // absent or 0: one per core
  std::string csv_path, json_path, engine, plot_path, report_path, eta_log_path;
  std::vector<std::string> sets;  // --set KEY=VALUE, after the sweep file's `set:`
  bool quiet = false;
  bool restart = false;
};

// Numeric value of an axis value ("4", "1.5", "100Gb/s" -> 100), or nullopt.
std::optional<double> numeric(const std::string& v) {
  const char* b = v.c_str();
  char* e = nullptr;
  double x = std::strtod(b, &e);
  if (e == b || !std::isfinite(x)) return std::nullopt;
  return x;
}

// Lines along the first axis: step time, one line per strategy, one panel (facet) per
// combination of the other axes, so no panel holds more lines than strategies. When the other
// axes have more combinations than a figure can show (LineChart::kMaxPanels), the panels follow
// the second axis and the axes after it keep their first value (the title says so); the CSV has
// every point.
// A serving sweep draws the throughput / latency curve instead: each point's output tokens/s per
// node against its median TPOT, one line per strategy through the first axis's values.
LineChart sweep_chart(const SweepSpec& spec, const SweepResult& res) {
  LineChart c;
  const SweepAxis& x = spec.axes.front();
  const bool serving = !res.rows.empty() && res.rows.front().serving.has_value();
  c.xlabel = serving ? "output tokens/s per node" : x.key;
  c.ylabel = serving ? "TPOT p50 (ms)" : "step time (ms)";
  c.log_x = x.geometric && !serving;
  bool numeric_x = true;
  for (const auto& v : x.values) numeric_x = numeric_x && numeric(v).has_value();
  numeric_x = numeric_x || serving;
  if (!numeric_x) c.x_labels = x.values;
  std::map<std::string, std::size_t> x_index;
  for (std::size_t i = 0; i < x.values.size(); ++i) x_index.emplace(x.values[i], i);

  const bool cartesian = spec.mode == SweepMode::kCartesian;
  std::size_t combos = 1;
  if (cartesian)
    for (std::size_t a = 1; a < spec.axes.size(); ++a) combos *= spec.axes[a].values.size();
  // Axes from `fixed_from` on are held at their first value.
  const std::size_t fixed_from = combos > LineChart::kMaxPanels ? 2 : spec.axes.size();
  c.title = serving ? fmt::format("{}: TPOT against throughput along {}", spec.name, x.key)
                    : fmt::format("{}: step time along {}", spec.name, x.key);
  if (cartesian && fixed_from < spec.axes.size()) {
    std::string fixed;
    for (std::size_t a = fixed_from; a < spec.axes.size(); ++a)
      fixed += fmt::format("{}{}={}", fixed.empty() ? "" : ", ", spec.axes[a].key,
                           spec.axes[a].values.front());
    c.title += " (" + fixed + ")";
  }
  std::map<std::string, std::size_t> panel_of;
  for (const auto& r : res.rows) {
    std::string panel;
    if (cartesian) {
      bool shown = true;
      for (std::size_t a = fixed_from; a < spec.axes.size(); ++a)
        shown = shown && r.values[a] == spec.axes[a].values.front();
      if (!shown) continue;
      for (std::size_t a = 1; a < fixed_from; ++a)
        panel += fmt::format("{}{}={}", panel.empty() ? "" : ", ", spec.axes[a].key, r.values[a]);
    }
    auto [pit, padded] = panel_of.emplace(panel, c.panels.size());
    if (padded) c.panels.push_back({panel, {}});
    auto& series = c.panels[pit->second].series;
    auto it = std::find_if(series.begin(), series.end(),
                           [&](const auto& se) { return se.name == r.summary.strategy; });
    if (it == series.end()) it = series.insert(series.end(), {r.summary.strategy, {}, {}});
    if (r.serving) {
      it->x.push_back(r.serving->output_tokens_per_s_per_node);
      it->y.push_back(r.serving->tpot_p50_s * 1e3);
      continue;
    }
    it->x.push_back(numeric_x ? *numeric(r.values[0]) : static_cast<double>(x_index[r.values[0]]));
    it->y.push_back(r.summary.step_mean_s * 1e3);
  }
  return c;
}

void run_sweep_command(const SweepArgs& a, SweepTransport* transport) {
  const bool root = transport == nullptr || transport->rank() == 0;
  // Rank 0 alone writes (the other ranks' machines may not even have its directories).
  if (root)
    check_output_paths({{"--csv", a.csv_path},
                        {"--json", a.json_path},
                        {"--plot", a.plot_path},
                        {"--report", a.report_path},
                        {"--eta-log", a.eta_log_path}});
  if (!a.plot_path.empty()) check_plot_path(a.plot_path, "--plot");
  if (!a.plot_path.empty()) require_gnuplot();
  const int jobs = static_cast<int>(parse_int_flag("--jobs", a.jobs, 0, 4096).value_or(0));
  SweepSpec spec = load_sweep(a.sweep);
  add_command_line_sets(spec, a.sets);
  SweepOptions opts;
  opts.jobs = jobs;
  opts.engine = a.engine;
  opts.csv_path = a.csv_path;
  opts.json_path = a.json_path;
  opts.progress = !a.quiet && root;
  opts.eta_log_path = a.eta_log_path;
  opts.restart = a.restart;
  opts.transport = transport;
  SweepResult res = run_sweep(spec, opts);
  if (!root) return;  // rank 0 prints and writes everything

  // The first rows in the terminal; the files have the rest.
  std::string ranks_note;
  if (res.points_per_rank.size() > 1)
    ranks_note = fmt::format(" on {} ranks ({})", res.points_per_rank.size(),
                             fmt::join(res.points_per_rank, " + "));
  fmt::print("# {}: {} point(s) x strategies, engine {}, {:.1f} s ({} run{}, {} resumed)\n",
             spec.name, res.points_total, res.engine, res.wall_s, res.points_run, ranks_note,
             res.points_skipped);
  // PipeMoE dropped the configurations that did not fit its GPUs; say how many would not here.
  const auto over = std::count_if(res.rows.begin(), res.rows.end(),
                                  [](const SweepRow& r) { return !r.summary.fits_memory(); });
  if (over > 0)
    std::fprintf(stderr,
                 "moesim: warning: %zu of %zu rows do not fit in GPU memory (memory_bytes > "
                 "gpu_memory_bytes; column fits_memory = 0)\n",
                 static_cast<std::size_t>(over), res.rows.size());
  std::string head = fmt::format("{:>6}", "point");
  for (const auto& ax : spec.axes) head += fmt::format(" {:>18}", ax.key);
  const bool serving = !res.rows.empty() && res.rows.front().serving.has_value();
  if (serving)
    fmt::print("{} {:<16} {:>10} {:>10} {:>12} {:>9}\n", head, "strategy", "TTFT p50", "TPOT p50",
               "out tok/s/nd", "tok/s/usr");
  else
    fmt::print("{} {:<16} {:>10} {:>8}\n", head, "strategy", "step(ms)", "speedup");
  const std::size_t shown = 40;
  for (std::size_t i = 0; i < res.rows.size() && i < shown; ++i) {
    const auto& r = res.rows[i];
    std::string line = fmt::format("{:>6}", r.point);
    for (const auto& v : r.values) line += fmt::format(" {:>18}", v);
    if (r.serving)
      fmt::print("{} {:<16} {:>8.1f}ms {:>8.2f}ms {:>12.0f} {:>9.1f}\n", line, r.summary.strategy,
                 r.serving->ttft_p50_s * 1e3, r.serving->tpot_p50_s * 1e3,
                 r.serving->output_tokens_per_s_per_node, r.serving->output_tokens_per_s_per_user);
    else
      fmt::print("{} {:<16} {:>10.3f} {:>8}\n", line, r.summary.strategy,
                 r.summary.step_mean_s * 1e3,
                 r.summary.speedup > 0 ? fmt::format("{:.2f}x", r.summary.speedup) : "-");
  }
  if (res.rows.size() > shown)
    fmt::print("... {} more row(s){}\n", res.rows.size() - shown,
               a.csv_path.empty() ? " (write them all with --csv F)" : " in " + a.csv_path);

  std::string plot_for_report = a.plot_path;
  std::string plot_note;
  if (!a.plot_path.empty()) render_line_chart(sweep_chart(spec, res), a.plot_path);
  if (!a.report_path.empty()) {
    // Without --plot the report still gets a plot when gnuplot is there: an SVG next to it.
    if (plot_for_report.empty()) {
      if (find_gnuplot().empty()) {
        plot_note = "No plot: gnuplot was not found (apt-get install gnuplot-nox).";
      } else {
        fs::path p(a.report_path);
        p.replace_extension(".plot.svg");
        plot_for_report = p.string();
        render_line_chart(sweep_chart(spec, res), plot_for_report);
      }
    }
    Scenario base = base_scenario(spec);
    SweepReport rep;
    rep.spec = &spec;
    rep.result = &res;
    rep.base = &base;
    rep.plot_path = plot_for_report;
    rep.plot_note = plot_note;
    write_sweep_report(a.report_path, rep);
  }
}

}  // namespace

void register_sweep(CLI::App& app) {
  auto* cmd = app.add_subcommand("sweep", "Run a parameter sweep over a base scenario");
  auto a = std::make_shared<SweepArgs>();
  cmd->add_option("sweep", a->sweep, "Sweep YAML (base scenario, axes, strategies)")->required();
  cmd->add_option("--jobs,-j", a->jobs,
                  "Points run in parallel, in [0, 4096] (default or 0: one per core)");
  cmd->add_option("--csv", a->csv_path,
                  "One row per point and strategy; points already in the file are skipped when it "
                  "was written by the same setup (base scenario, axes, engine, version)");
  cmd->add_option("--json", a->json_path, "Write every point's runs as JSON");
  cmd->add_option("--engine", a->engine, "Network model: analytical, flow or simgrid");
  add_set_option(cmd, &a->sets);
  cmd->add_option("--plot", a->plot_path, "Lines along the first axis (F.svg or F.png, gnuplot)");
  cmd->add_option("--report", a->report_path, "Self-contained HTML report");
  cmd->add_flag("--quiet,-q", a->quiet, "No progress line on stderr");
  cmd->add_flag("--restart", a->restart,
                "Discard the rows already in the --csv file and run every point again");
  // Hidden: how good the ETA is (one line per finished point: elapsed, done, total, ETA).
  cmd->add_option("--eta-log", a->eta_log_path, "")->group("");
  cmd->callback([a] {
    run_spread("a sweep", [&](SweepTransport* transport) { run_sweep_command(*a, transport); });
  });
}

}  // namespace moesim::app
