// `moesim sweep SWEEP.yaml [--jobs N] [--csv F] [--json F] [--engine E] [--plot F] [--report F]`
// Runs a sweep (DESIGN §6): every point of the axes over the base scenario, the strategy stacks at
// each, one CSV row per point x strategy. Prints a summary of the best strategy per point at the
// end (first rows only; the CSV has everything).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <map>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/html_report.hpp"
#include "apps/moesim/plot.hpp"
#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::app {

namespace {

namespace fs = std::filesystem;

struct SweepArgs {
  std::string sweep;
  int jobs = 0;
  std::string csv_path, json_path, engine, plot_path, report_path;
  bool quiet = false;
};

// Numeric value of an axis value ("4", "1.5", "100Gb/s" -> 100), or nullopt.
std::optional<double> numeric(const std::string& v) {
  const char* b = v.c_str();
  char* e = nullptr;
  double x = std::strtod(b, &e);
  if (e == b || !std::isfinite(x)) return std::nullopt;
  return x;
}

// Lines along the first axis: step time per strategy. Other axes split the lines; when they have
// too many combinations to read, only the combination where they all take their first value is
// drawn (the title says so).
LineChart sweep_chart(const SweepSpec& spec, const SweepResult& res) {
  LineChart c;
  const SweepAxis& x = spec.axes.front();
  c.xlabel = x.key;
  c.ylabel = "step time (ms)";
  c.log_x = x.geometric;
  bool numeric_x = true;
  for (const auto& v : x.values) numeric_x = numeric_x && numeric(v).has_value();
  if (!numeric_x) c.x_labels = x.values;
  std::map<std::string, std::size_t> x_index;
  for (std::size_t i = 0; i < x.values.size(); ++i) x_index.emplace(x.values[i], i);

  auto others = [&](const SweepRow& r) {
    std::string s;
    if (spec.mode == SweepMode::kZip) return s;
    for (std::size_t a = 1; a < spec.axes.size(); ++a)
      s += fmt::format("{}{}={}", s.empty() ? "" : " ", spec.axes[a].key, r.values[a]);
    return s;
  };
  std::size_t combos = 1;
  if (spec.mode == SweepMode::kCartesian)
    for (std::size_t a = 1; a < spec.axes.size(); ++a) combos *= spec.axes[a].values.size();
  bool restrict = combos > 4;
  c.title = fmt::format("{}: step time along {}", spec.name, x.key);
  if (restrict) {
    std::string fixed;
    for (std::size_t a = 1; a < spec.axes.size(); ++a)
      fixed += fmt::format("{}{}={}", fixed.empty() ? "" : ", ", spec.axes[a].key,
                           spec.axes[a].values.front());
    c.title += " (" + fixed + ")";
  }
  std::map<std::string, std::size_t> series_of;
  for (const auto& r : res.rows) {
    if (restrict) {
      bool first = true;
      for (std::size_t a = 1; a < spec.axes.size(); ++a)
        first = first && r.values[a] == spec.axes[a].values.front();
      if (!first) continue;
    }
    std::string o = restrict ? "" : others(r);
    std::string name = o.empty() ? r.summary.strategy : r.summary.strategy + " " + o;
    auto [it, added] = series_of.emplace(name, c.series.size());
    if (added) c.series.push_back({name, {}, {}});
    auto& s = c.series[it->second];
    s.x.push_back(numeric_x ? *numeric(r.values[0]) : static_cast<double>(x_index[r.values[0]]));
    s.y.push_back(r.summary.step_mean_s * 1e3);
  }
  return c;
}

void run_sweep_command(const SweepArgs& a) {
  if (!a.plot_path.empty()) check_plot_path(a.plot_path, "--plot");
  if (!a.plot_path.empty()) require_gnuplot();
  if (a.jobs < 0) throw InputError("--jobs: expected an integer >= 0 (0 = one per core)");
  SweepSpec spec = load_sweep(a.sweep);
  SweepOptions opts;
  opts.jobs = a.jobs;
  opts.engine = a.engine;
  opts.csv_path = a.csv_path;
  opts.json_path = a.json_path;
  opts.progress = !a.quiet;
  SweepResult res = run_sweep(spec, opts);

  // The first rows in the terminal; the files have the rest.
  fmt::print("# {}: {} point(s) x strategies, engine {}, {:.1f} s ({} run, {} resumed)\n",
             spec.name, res.points_total, res.engine, res.wall_s, res.points_run,
             res.points_skipped);
  std::string head = fmt::format("{:>6}", "point");
  for (const auto& ax : spec.axes) head += fmt::format(" {:>18}", ax.key);
  fmt::print("{} {:<16} {:>10} {:>8}\n", head, "strategy", "step(ms)", "speedup");
  const std::size_t shown = 40;
  for (std::size_t i = 0; i < res.rows.size() && i < shown; ++i) {
    const auto& r = res.rows[i];
    std::string line = fmt::format("{:>6}", r.point);
    for (const auto& v : r.values) line += fmt::format(" {:>18}", v);
    fmt::print("{} {:<16} {:>10.3f} {:>8}\n", line, r.summary.strategy, r.summary.step_mean_s * 1e3,
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
  cmd->add_option("--jobs,-j", a->jobs, "Points run in parallel (default: one per core)");
  cmd->add_option("--csv", a->csv_path,
                  "One row per point and strategy; points already in the file are skipped");
  cmd->add_option("--json", a->json_path, "Write every point's runs as JSON");
  cmd->add_option("--engine", a->engine, "Network model: analytical, flow or simgrid");
  cmd->add_option("--plot", a->plot_path, "Lines along the first axis (F.svg or F.png, gnuplot)");
  cmd->add_option("--report", a->report_path, "Self-contained HTML report");
  cmd->add_flag("--quiet,-q", a->quiet, "No progress line on stderr");
  cmd->callback([a] { run_sweep_command(*a); });
}

}  // namespace moesim::app
