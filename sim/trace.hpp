// Chrome trace (chrome://tracing, Perfetto) of a run: one process per rank, one thread per
// stream, one complete event ("ph": "X") per op instance, times in microseconds.
//
// Sampling: a 4,096-rank trace would be unreadable and huge, so at most `max_ranks` ranks are
// written. When the run has more, the sample is (trace_sample_ranks): the first node's ranks and
// the last node's ranks (each up to a third of the budget; node size from
// RunResult::gpus_per_node, 1 when unknown), then ranks evenly spaced over the rest. This shows
// intra-node behaviour at both ends of the fabric and a spread in between. The sample is listed
// in the trace's "otherData".
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/run_result.hpp"

namespace moesim::sim {

/// The ranks a trace of `num_ranks` shows, ascending, at most max(1, max_ranks) of them.
std::vector<int> trace_sample_ranks(int num_ranks, int gpus_per_node, int max_ranks);

/// Writes the trace as one JSON object {"traceEvents": [...], "displayTimeUnit": "ns",
/// "otherData": {...}}. `result` must come from running `plan`.
void write_chrome_trace(const Plan& plan, const RunResult& result, std::ostream& os,
                        int max_ranks = 64);

/// One run of a several-run trace: a name (the strategy) and the run's plan and result.
struct TraceRun {
  std::string name;
  const Plan* plan = nullptr;
  const RunResult* result = nullptr;
};

/// Several runs (`simulate --trace` with several strategies) in one trace, so that they open side
/// by side in one Perfetto window: each run's sampled ranks are processes named "NAME: rank R
/// (node N)", with pids offset run by run (run k's rank r is pid r + the rank counts of runs
/// before k) and sorted run by run. Every run starts at time 0. "otherData" has one entry per run
/// in "runs" (name, pid_offset, num_ranks, makespan_s, sampled_ranks). One run is written exactly
/// as the overload above writes it.
void write_chrome_trace(const std::vector<TraceRun>& runs, std::ostream& os, int max_ranks = 64);

}  // namespace moesim::sim
