// In-process entry points that answer with the CLI's JSON documents: `simulate`, `sweep` and `tune`
// on a scenario given as YAML text (JSON is YAML, so a Python dict dumped as JSON is one), for the
// Python module (apps/python) and anything else that links the library. The CLI commands write the
// same documents (`simulate --json` is simulate_json), so a notebook and a shell get one answer.
//
// Every function throws InputError for bad input (naming the pseudo file, key and what was
// expected), as the commands do before exiting 2.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/moesim/report.hpp"
#include "apps/moesim/stacks.hpp"
#include "core/scenario.hpp"
#include "sim/engine.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::app {

/// The document `moesim simulate --json` writes for `outcomes` of `sc` run with `cfg` on `topo`.
nlohmann::ordered_json simulate_json(const Scenario& sc, const sim::EngineConfig& cfg,
                                     const topology::Topology& topo,
                                     const std::vector<StackOutcome>& outcomes);

/// One flat record of a run's summary (one row of a DataFrame): the strategy, its step time and
/// percentiles, the all-to-all / all-reduce / compute / exposed breakdown, speedup, throughput,
/// MFU, memory and whether it fits, the decisions.
nlohmann::ordered_json summary_record(const RunSummary& s);

/// A YAML text as JSON: scalars that read as integers, reals or booleans become numbers and
/// booleans, `~` / null become null, quoted scalars stay strings. For editing a scenario as a dict.
nlohmann::ordered_json yaml_text_to_json(const std::string& text, const std::string& pseudo_file);

struct SimulateRequest {
  std::string text;  // the scenario, YAML (or JSON) text
  std::string path;  // where it is read from: names it in errors, anchors relative paths
  std::vector<std::string> sets;        // --set KEY=VALUE edits
  std::string engine;                   // "" = the scenario's
  std::optional<int> iterations;        // absent = workload.iterations
  std::optional<std::uint64_t> seed;    // absent = workload.routing.seed
  std::vector<std::string> strategies;  // names to run; empty = all
};

/// `moesim simulate`'s run: the simulate_json document, plus "records": one summary_record per
/// strategy; for a scenario with `serving:`, serving_json's document (its "serving" list).
nlohmann::ordered_json simulate_text(const SimulateRequest& req);

/// `moesim sweep` on a sweep file given as text (`base:` resolved against `path`'s directory):
/// {"name", "engine", "points", "wall_s", "records": [{point, <axis key>: value, ..., <summary
/// record>}]}. `jobs` 0 = one thread per core.
nlohmann::ordered_json sweep_text(const std::string& text, const std::string& path,
                                  const std::vector<std::string>& sets, const std::string& engine,
                                  int jobs);

struct TuneRequest {
  std::string text, path;
  std::vector<std::string> sets;
  double budget_s = 60;
  std::string engine = "auto";  // the re-run engine, as `tune --engine`
  int top = 10;
  int jobs = 0;
  bool keep_layout = false, keep_pipeline = false, keep_memory = false, include_routing = false;
};

/// `moesim tune`: the document `tune --json` writes, plus "emit": the best candidate's scenario
/// file text (as `--emit` writes it; null when nothing ran).
nlohmann::ordered_json tune_text(const TuneRequest& req);

}  // namespace moesim::app
