// `moesim tune`: searches the strategy stacks (routing x a2a x layout x pipeline x parallel x
// schedule) and the parallel layouts (pp with its schedule and micro-batches, ep / esp / mp / dp,
// disjoint or overlapped, ZeRO and recomputation) of a scenario's model on its cluster, and ranks
// what it finds (docs/tune.md).
//
// The model stays the scenario's: the expert count E, the global batch (sequences per step: the
// dense data-parallel replicas P / pp / mp times batch_per_gpu times micro_batches) and every
// model dimension. A layout changes parallelism, model.experts_per_gpu (E / ep, or -ep / E for
// sharded experts), model.batch_per_gpu and model.micro_batches (the same global batch over its
// replicas) and model.recompute. Every candidate is the scenario's YAML tree with --set-style
// edits, parsed by the same loader, so the emitted file (`--emit`) is exactly what was simulated.
//
// Search: (1) every layout whose memory estimate fits the GPU runs the baseline stack (and
// parm_auto where mp or esp > 1) on the screening engine (analytical), those whose bubble and
// recomputation cost least first; (2) the best layouts, in that order, get a stack search:
// exhaustive when the whole role space fits the remaining budget, else coordinate descent (one
// role at a time, every value, from the baseline, until no role improves); (3) the best distinct
// candidates are re-run on the re-run engine (flow) and ranked by it. Deterministic for a seed
// when the search completes within the budget (the result says).
#pragma once

#include <yaml-cpp/yaml.h>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "apps/moesim/report.hpp"
#include "core/scenario.hpp"

namespace moesim::app {

class SweepTransport;

inline constexpr int kAutoFlowGpus = 1024;

struct TuneOptions {
  double budget_s = 60;  // wall-clock budget of the whole search
  std::string screen_engine = "analytical";
  // == screen_engine: no re-run; "auto": flow up to kAutoFlowGpus GPUs, else none (with a note).
  std::string rerun_engine = "flow";
  int top = 10;                   // candidates re-run and printed
  std::optional<int> iterations;  // absent: the scenario's workload.iterations
  bool search_layouts = true;     // false: only the scenario's own layout
  bool search_pipeline = true;    // pp, schedules and micro-batches besides the scenario's
  bool search_memory = true;      // ZeRO 0 and 1, and recomputation where nothing else fits
  // Stacks whose routing role changes which experts tokens reach (ta_moe, faster_moe_hir): what
  // the model learns changes, so they join the search only when asked.
  bool include_routing = false;
  bool progress = true;    // a line on stderr per phase / layout
  std::string state_path;  // --state: runs kept and reused across searches
  int jobs = 0;            // threads (per rank); 0: one per hardware thread
  // Under mpirun: the ranks. Rank 0 runs the search and prints; every other rank runs its share
  // of each group of runs (tune() returns an empty result there). Null: this process alone.
  SweepTransport* transport = nullptr;
};

/// One parallel layout: the degrees, the pipeline schedule and micro-batching, the memory
/// settings (ZeRO stage, recomputation), and the scenario edits that give it.
struct TuneLayout {
  ParallelismSpec par;  // pp, schedule, vp, zero, ep, esp, mp, dp, layout
  int batch_per_gpu = 0;
  int micro_batches = 1;
  int experts_per_gpu = 0;
  RecomputeSpec recompute;
  std::vector<std::string> edits;  // "KEY=VALUE" (--set syntax)
  // The layout's estimate with the baseline stack: before screening, with the nominal dC of
  // nominal_capacity (no routing sample; a lower bound for dropless routing); once screened, the
  // sampled estimate the run records (planned_memory).
  double memory_bytes = 0;
  bool memory_sampled = false;
  bool is_scenario = false;  // the scenario's own layout
  // The layout screen: its best probe's step time (NaN: not screened, +inf: nothing ran), and
  // the stack search it got ("" = none).
  double screen_s = std::numeric_limits<double>::quiet_NaN();
  std::string search;
  // "ep=16 esp=1 mp=2 dp=1 overlapped B=8", then what differs from one stage, one micro-batch,
  // ZeRO 0 and no recomputation: " pp=4 1f1b m=8 zero=1 rc=selective".
  std::string describe() const;
};

/// One evaluated (layout, stack).
struct TuneRow {
  int layout = 0;          // index into TuneResult::layouts
  std::string stack_yaml;  // the strategies entry, "{name: tuned, routing: ta_moe, a2a: 2dh}"
  std::string roles;       // describe_roles of the stack ("baseline" when none)
  RunSummary screen;       // on the screening engine
  std::optional<RunSummary> rerun;
  double time_s() const { return rerun ? rerun->step_mean_s : screen.step_mean_s; }
  /// Whether the stack's routing role changes which experts tokens reach (ta_moe, ...).
  bool changes_routing() const { return roles.find("routing=") != std::string::npos; }
};

struct TuneResult {
  std::string scenario;  // source file
  int gpus = 0;
  std::string screen_engine, rerun_engine;
  std::vector<TuneLayout> layouts;  // every layout of the space (fitting or not)
  int layouts_fit = 0;              // whose estimate without sampling fits the GPU
  int over_memory_sampled = 0;      // of those, screened ones whose sampled estimate did not
  int layouts_searched = 0;         // that got a stack search
  int stacks_in_space = 0;          // (layout, stack) combinations of the whole space
  int evaluated = 0;                // (layout, stack) runs on the screening engine
  int probes = 0;                   // 1-iteration layout probes (scenarios of several iterations)
  int resumed = 0;                  // runs taken from the --state file instead of run
  int inapplicable = 0;             // stacks a layout refused (InputError from the strategy)
  int over_memory = 0;              // runs whose memory estimate exceeds the GPU (not ranked)
  int workers = 1;                  // threads of all ranks that ran the search
  std::vector<int> runs_per_rank;   // runs spread over workers, by the rank that ran them
  std::string search;               // "exhaustive" / "coordinate descent" (of the best layout)
  bool complete = true;             // false: the budget cut the search short
  double screen_wall_s = 0, rerun_wall_s = 0, time_to_best_s = 0;
  RunSummary baseline_screen;  // the scenario's own layout and baseline stack
  std::optional<RunSummary> baseline_rerun;
  std::vector<TuneRow> ranked;     // the best, re-run when re-running, best first
  std::vector<std::string> notes;  // what was skipped and why
};

/// Which dimensions tune_layouts varies besides ep / esp / mp / dp and the layout kind.
struct TuneSpace {
  bool pipeline = true;  // pp, schedule (1f1b, interleaved, dualpipe) and micro-batches
  bool zero = true;      // ZeRO 0 and 1 (training)
};

/// Every parallel layout of the scenario's GPUs for its model (docs/tune.md): pp among the stage
/// counts the loader accepts (whole nodes or a divisor of a node per stage, at most one stage per
/// block), with 1f1b, interleaved (vp the smallest of 2..8 dividing the blocks per stage) and
/// dualpipe where they apply; per stage, mp and esp dividing the GPUs per node (at most 8,
/// dividing model_dim / hidden_dim), disjoint and (mp > 1) overlapped, every ep dividing the rest
/// with E / ep or ep / E whole (sharded experts only with esp = 1); the global batch (sequences
/// per step) kept, split into B sequences x m micro-batches per replica (B a power of two or the
/// whole share, m >= pp; up to three splits, fewest micro-batches first at pp = 1, most at
/// pp > 1); ZeRO 0 and 1. Recomputation stays the scenario's (Search picks more where nothing
/// else fits). Inference: pp, micro-batches and ZeRO as written, mp = esp = 1.
std::vector<TuneLayout> tune_layouts(const Scenario& sc, const TuneSpace& space = {});

/// The scenario edits that give layout `l` (its fields set): parallelism, batch, micro-batches,
/// experts per GPU and recomputation.
void set_layout_edits(TuneLayout& l);

/// Runs the search on the scenario `tree` (read from `path`, with `sets` applied first).
/// InputError for a scenario that does not validate.
TuneResult tune(const YAML::Node& tree, const std::string& path,
                const std::vector<std::string>& sets, const TuneOptions& opts);

/// The scenario file of row `row`: the scenario's YAML with the row's layout and
/// `strategies: [{name: baseline}, <the tuned stack>]`, relative paths made absolute, and a
/// header comment saying where it came from.
std::string tuned_scenario_yaml(const YAML::Node& tree, const std::string& path,
                                const std::vector<std::string>& sets, const TuneResult& result,
                                const TuneRow& row);

void print_tune(const TuneResult& result);
std::string tune_json(const TuneResult& result);
std::string tune_csv(const TuneResult& result);

}  // namespace moesim::app
