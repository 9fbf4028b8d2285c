// `moesim sweep SWEEP.yaml [--jobs N] [--csv F] [--json F] [--engine E] [--set KEY=VALUE]...
//               [--plot F] [--report F] [--restart]`
// Runs a sweep (DESIGN §6): every point of the axes over the base scenario, the strategy stacks at
// each, one CSV row per point x strategy. Prints a summary of the best strategy per point at the
// end (first rows only; the CSV has everything). Under `mpirun -np N` the points are spread over
// the N ranks (each with --jobs threads) and gathered on rank 0, which writes the outputs. --set
// edits the base scenario after the file's `set:`, and is part of the resume fingerprint.
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
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/plot.hpp"
#include "apps/moesim/progress.hpp"
#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"

#ifdef MOESIM_HAVE_EXEC
#include <mpi.h>

#include "exec/mpi_communicator.hpp"
#endif

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

// The number of processes mpirun started this one among, or 1 when it was started without a
// launcher: MPI is only initialised under one, so a plain `moesim sweep` never needs it.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

#ifdef MOESIM_HAVE_EXEC
// Sweep messages over MPI_COMM_WORLD. Every call comes from the thread that initialised MPI
// (run_sweep keeps MPI on its main thread), so MPI_THREAD_FUNNELED is enough.
class MpiSweepTransport : public SweepTransport {
 public:
  explicit MpiSweepTransport(const exec::MpiSession& s) : rank_(s.rank()), size_(s.size()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool synced() const { return synced_; }

  void broadcast(std::string& text) override {
    unsigned long long n = text.size();
    MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
    text.resize(n);
    MPI_CHECK(MPI_Bcast(text.data(), checked(n), MPI_CHAR, 0, MPI_COMM_WORLD));
    synced_ = true;
  }
  void send_to_root(const std::string& text) override {
    MPI_CHECK(MPI_Send(text.data(), checked(text.size()), MPI_CHAR, 0, kTag, MPI_COMM_WORLD));
  }
  std::optional<std::string> try_receive() override {
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kTag, MPI_COMM_WORLD, &flag, &st));
    if (!flag) return std::nullopt;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(static_cast<std::size_t>(n), '\0');
    MPI_CHECK(
        MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    return text;
  }

 private:
  static constexpr int kTag = 8;
  static int checked(std::size_t n) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw RuntimeError(fmt::format("sweep message of {} bytes exceeds MPI's int count", n));
    return static_cast<int>(n);
  }
  int rank_, size_;
  bool synced_ = false;
};
#endif

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

  const bool cartesian = spec.mode == SweepMode::kCartesian;
  std::size_t combos = 1;
  if (cartesian)
    for (std::size_t a = 1; a < spec.axes.size(); ++a) combos *= spec.axes[a].values.size();
  // Axes from `fixed_from` on are held at their first value.
  const std::size_t fixed_from = combos > LineChart::kMaxPanels ? 2 : spec.axes.size();
  c.title = fmt::format("{}: step time along {}", spec.name, x.key);
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
    const int world = launcher_world_size();
    if (world <= 1) {
      // Ctrl-C stops the points in flight; run_sweep says what was kept; exit 130 (main.cpp).
      // Under mpirun, mpirun owns SIGINT (it ends every rank).
      const InterruptHandler on_ctrl_c;
      run_sweep_command(*a, nullptr);
      return;
    }
#ifdef MOESIM_HAVE_EXEC
    // Under mpirun: points are spread over the ranks and gathered on rank 0. Any failure ends
    // the whole job (MPI_Abort): a rank left waiting for the others would hang.
    int code = 0;
    {
      exec::MpiSession session(nullptr, nullptr);
      MpiSweepTransport transport(session);
      try {
        run_sweep_command(*a, &transport);
      } catch (const std::exception& e) {
        code = dynamic_cast<const InputError*>(&e) != nullptr ? 2 : 1;
        if (session.rank() != 0 && !transport.synced()) {
          // Before rank 0's list of points: rank 0 meets the same input and reports it (and
          // aborts this rank); if it gets past, the error is this rank's own.
          std::string ignored;
          transport.broadcast(ignored);
        }
        if (session.rank() == 0)
          std::fprintf(stderr, "moesim: error: %s\n", e.what());
        else
          std::fprintf(stderr, "moesim: error: rank %d: %s\n", session.rank(), e.what());
        std::fflush(stderr);
        std::fflush(stdout);
        exec::MpiSession::abort_all(code);
      }
    }  // MPI_Finalize
    std::fflush(stdout);
#else
    throw InputError(fmt::format(
        "this moesim was built without MPI, so it cannot share a sweep among the {} processes "
        "mpirun started (each would run all of it): run it without mpirun, or rebuild with "
        "libopenmpi-dev installed",
        world));
#endif
  });
}

}  // namespace moesim::app
