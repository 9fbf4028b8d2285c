// Summaries of strategy runs for the CLI: the table, the JSON of docs/design.md §5 and the CSV,
// shared by `simulate` and `compare` so both print the same numbers the same way.
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/scenario.hpp"
#include "strategies/runner.hpp"

namespace moesim::app {

struct RunSummary {
  std::string strategy;
  std::string topology;
  int gpus = 0;
  double step_mean_s = 0, step_p50_s = 0, step_p95_s = 0;
  double moe_layer_mean_s = 0;
  double a2a_mean_s = 0, allreduce_mean_s = 0, compute_mean_s = 0, exposed_comm_mean_s = 0;
  // compute_mean_s by class group (core::Breakdown, docs/figures.md), means over iterations.
  double gemm_mean_s = 0, attention_mean_s = 0, memory_bound_mean_s = 0, optimizer_mean_s = 0,
         recompute_mean_s = 0;
  // The figures frameworks print (strategies/model_flops.hpp) at the mean step time. Model FLOP/s
  // and MFU are training figures: has_model_flops is false for inference (tokens/s/GPU only).
  double tokens_per_step = 0;
  double model_flops_per_token = 0;  // training: forward + backward; inference: forward
  double tokens_per_s_per_gpu = 0;
  bool has_model_flops = false;
  double model_tflops_per_gpu = 0;  // model TFLOP/s per GPU
  double mfu = 0;                   // model FLOP/s per GPU / the GPU's dense peak for model.dtype
  std::string decisions;            // the last iteration's decision, described
  double speedup = 0;               // baseline step mean / this step mean (0 = no baseline)
  bool is_baseline = false;         // the row speedups are relative to (apply_speedups)
  double wall_s = 0;
  // Inference expert placement (docs/strategy-specs.md §7), when the scenario uses it: one batch =
  // one iteration, so the batch latency median / p95 are step_p50_s / step_p95_s.
  bool inference = false;
  double speedup_p50 = 0, speedup_p95 = 0;  // baseline p50 (p95) / this p50 (p95); 0 = none
  double load_imbalance = 0;                // mean over placements of max / mean GPU tokens
  double moved_weight_bytes = 0;            // expert weights moved per batch, mean
  // Lina only (-1 otherwise): over its (batch, MoE layer, EP group) placements, the share whose
  // estimated top-k popular experts were the actual ones, the mean total-variation distance
  // 0.5 * sum_e |estimated_e - actual_e| of the popularity estimate, and the share re-planned by
  // phase 2.
  double topk_accuracy = -1, popularity_error = -1, phase2_rate = -1;
  // Per-GPU memory estimate (strategies/memory.hpp) of the iteration that needs the most, and the
  // GPU's memory; memory_bytes() > gpu_memory_bytes means the configuration does not fit.
  // (A sweep resumed from its CSV restores memory_bytes and gpu_memory_bytes, not the parts.)
  strategies::MemoryEstimate memory;
  double memory_bytes = 0;  // memory.total_bytes()
  double gpu_memory_bytes = 0;
  bool fits_memory() const { return gpu_memory_bytes <= 0 || memory_bytes <= gpu_memory_bytes; }
};

/// Mean, median and 95th percentile (nearest rank) of the step times, and means of the rest.
RunSummary summarize(const strategies::StackRun& run, const std::string& topology, int gpus,
                     double wall_s);

/// Index of the baseline among specs: the one named "baseline", else the first whose roles are
/// all baseline, else -1 (no speedups then).
int baseline_index(const std::vector<StrategySpec>& specs);

/// Fills RunSummary::speedup against `baseline` (a no-op when baseline < 0).
void apply_speedups(std::vector<RunSummary>& rows, int baseline);

void print_table(const std::vector<RunSummary>& rows);
/// The table's figure cells: tokens/s/GPU, model TFLOP/s/GPU, MFU ("-" where there is none:
/// inference has no model FLOP/s, an unknown peak no MFU).
std::string tokens_text(const RunSummary& r);
std::string tflops_text(const RunSummary& r);
std::string mfu_text(const RunSummary& r);
/// "fastest: NAME (T ms per step, X.XXx over baseline at T0 ms)", or "" with < 2 timed rows.
std::string verdict_line(const std::vector<RunSummary>& rows);

/// One entry of the "runs" array of docs/design.md §5.
nlohmann::ordered_json run_json(const Scenario& sc, const strategies::StackRun& run,
                                const RunSummary& s);

/// The "breakdown" object of a run: compute_s, a2a_s, allreduce_s, exposed_comm_s, then the
/// compute classes gemm_s, attention_s, memory_bound_s, optimizer_s, recompute_s.
nlohmann::ordered_json breakdown_json(const RunSummary& s);

/// Adds tokens_per_step, tokens_per_s_per_gpu, model_flops_per_token, model_tflops_per_gpu and
/// mfu (null where there is none: inference, or an unknown peak for mfu) to a run's object.
void add_figures_json(nlohmann::ordered_json& j, const RunSummary& s);

/// The "memory" object of a run: memory_bytes, each part, gpu_memory_bytes and fits.
nlohmann::ordered_json memory_json(const strategies::MemoryEstimate& m, double gpu_memory_bytes);

/// "weights 1.2 GiB, gradients ..., total 9.8 GiB of 40.0 GiB" (one line, for the CLI).
std::string describe_memory(const strategies::MemoryEstimate& m, double gpu_memory_bytes);

/// Values no real cluster has (a link below 1 Mb/s, a hop above 1 s), each "KEY: why": the run
/// would complete with an absurd step time; validate and simulate warn before running.
std::vector<std::string> implausible_values(const Scenario& sc);
void warn_implausible(const Scenario& sc);

/// One warning on stderr when rows' estimates exceed the GPU's memory: which strategies, the
/// largest estimate, and the single keys of `sc` (the scenario the rows ran) that make it fit
/// (strategies::fit_advice).
void warn_memory(const Scenario& sc, const std::vector<RunSummary>& rows,
                 const std::string& gpu_name);

/// CSV header and one row per (strategy, iteration).
void write_csv_header(std::ostream& os);
void write_csv_rows(std::ostream& os, const Scenario& sc, const strategies::StackRun& run,
                    const std::string& topology);

/// JSON object of a Decision: pipeline_degree, a2a, parallel, layout, schedule.
nlohmann::ordered_json decision_json(const Scenario& sc, const strategies::Decision& d);

}  // namespace moesim::app
