// Self-contained HTML reports (`--report F.html` on simulate, compare, sweep and tune): scenario
// and topology summary, the comparison table, the plot inline (SVG embedded, PNG as a data URI),
// and the decisions per iteration. No external CSS, scripts or images: the file can be mailed
// around.
#pragma once

#include <string>
#include <vector>

#include "apps/moesim/report.hpp"
#include "apps/moesim/sweep.hpp"
#include "apps/moesim/tune.hpp"
#include "core/scenario.hpp"
#include "strategies/runner.hpp"

namespace moesim::app {

/// One strategy on one topology, as `compare` ran it.
struct ReportRun {
  const strategies::StackRun* run = nullptr;
  RunSummary summary;
};

/// `compare --report` (one column per topology) and `simulate --report` (one topology).
struct CompareReport {
  std::string command = "compare";  // or "simulate": the title and the cluster row
  std::string engine;
  std::vector<std::string> topology_names;
  std::vector<const Scenario*> scenarios;  // one per topology (the base's cluster replaced)
  std::vector<std::string> strategies;
  std::vector<std::vector<ReportRun>> runs;  // [topology][strategy]
  std::string plot_path;                     // image to embed; "" = none
  std::string plot_note;                     // shown instead of the plot when there is none
  std::vector<std::string> trace_paths;      // Chrome traces to link (relative to the report)
};

void write_compare_report(const std::string& path, const CompareReport& report);

struct SweepReport {
  const SweepSpec* spec = nullptr;
  const SweepResult* result = nullptr;
  const Scenario* base = nullptr;
  std::string plot_path;
  std::string plot_note;
  std::size_t max_rows = 5000;  // the table is cut there (the CSV has every row)
};

void write_sweep_report(const std::string& path, const SweepReport& report);

/// `moesim tune --report F.html`: the search (space, workers, budget), the scenario and cluster,
/// the ranked candidates as bars against the reference and as a table with why each wins, and
/// every layout with its memory estimate and screen time.
struct TuneReport {
  const TuneResult* result = nullptr;
  const Scenario* scenario = nullptr;  // after --set: the model and cluster searched
};

void write_tune_report(const std::string& path, const TuneReport& report);

/// &, <, >, " and ' escaped.
std::string html_escape(const std::string& s);

/// The image inline: an SVG's markup (without its XML prolog), a PNG as <img src="data:...">.
std::string inline_image(const std::string& path);

}  // namespace moesim::app
