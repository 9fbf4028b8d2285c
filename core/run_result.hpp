// What one run of a Plan produced, whichever backend ran it (sim::run_plan in simulated time,
// exec::run on real GPUs): per-op per-rank start/end, one summary row per collective, the
// breakdown the reports print (compute, all-to-all, allreduce, exposed communication, overlap),
// link utilisation per tier, and the cost of the run itself (wall time, peak RSS).
//
// Layout: per-op per-rank times are flat arrays. Op i's entries start at op_offset[i] and there is
// one per rank of the op, in Op::ranks order (position p = op.ranks.at(p)). An op over all 4,096
// ranks therefore costs 4,096 entries; a per-rank op stored once with a RankSet is never copied.
//
// All times are seconds of simulated (or measured) time since the start of the run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/plan.hpp"

namespace moesim {

/// One row per collective op (all its groups together).
struct CollectiveRecord {
  OpId op = -1;
  std::string label;
  CollectiveType type = CollectiveType::kAllToAll;
  /// The algorithm that ran (kAuto resolved). When groups resolved auto differently, this is the
  /// algorithm of the first group to start and `mixed_algos` is true.
  CollectiveAlgo algo = CollectiveAlgo::kAuto;
  bool mixed_algos = false;
  /// The collective library (NCCL on the GPU path) ran its own algorithm for this collective
  /// (all_reduce, all_gather, reduce_scatter): `algo` is then kAuto, not moesim's choice, and
  /// outputs name it "nccl" (record_algo_name).
  bool library_algo = false;
  int num_groups = 0;
  double start_s = 0;  // earliest group start
  double end_s = 0;    // latest group end
  /// Logical size per rank, nccl-tests style: CollectiveSpec::bytes, or for all_to_allv the mean
  /// bytes a rank sends.
  double size_bytes = 0;
  /// Bytes handed to the network model over all groups and phases (0 on the analytical path,
  /// which never lowers the collective into transfers).
  double wire_bytes = 0;
  double duration_s() const { return end_s - start_s; }
};

/// Busy times, each the mean over ranks of the measure of a union of intervals, so concurrent
/// ops on one rank are not counted twice.
struct Breakdown {
  double compute_s = 0;    // compute ops (any stream)
  double copy_s = 0;       // copy ops (layout transforms outside collectives)
  double comm_s = 0;       // all collectives
  double a2a_s = 0;        // all_to_all + all_to_allv (the MoE dispatch and combine)
  double allreduce_s = 0;  // all_reduce
  double allgather_s = 0;  // all_gather
  double reduce_scatter_s = 0;
  double send_recv_s = 0;     // send_recv and pipeline stage sends (CollectiveSpec::stage_send)
  double exposed_comm_s = 0;  // communication while no compute op runs on the rank
  double overlap_s = 0;       // communication while a compute op runs: comm_s = exposed + overlap
  // compute_s by ComputeClass group (docs/figures.md). The four groups partition the compute ops:
  // on one compute stream (the plan builder's) they add up to compute_s; ops of two groups that
  // overlap on two streams would count in both.
  double gemm_s = 0;          // kGemm, kGate: the tensor-core work
  double attention_s = 0;     // kAttention: the attention core
  double memory_bound_s = 0;  // kEncode, kDecode, kElementwise, kNorm, kOther
  double optimizer_s = 0;     // kOptimizer
  double recompute_s = 0;     // ops with ComputeSpec::recompute, any class (also in their class)
};

/// Utilisation of the directed links of one tier (topology::Link::tier) over the makespan:
/// bytes carried / (bandwidth * makespan).
struct LinkTierUtilisation {
  int tier = 0;
  int num_links = 0;
  double bytes = 0;  // total over the tier's links
  double max_utilisation = 0;
  double mean_utilisation = 0;
};

/// The algorithm a record names in outputs: collective_algo_name(algo), or "nccl" where the
/// collective library chose its own (CollectiveRecord::library_algo).
std::string_view record_algo_name(const CollectiveRecord& rec);

struct RunResult {
  std::string backend;  // "analytical", "flow", "simgrid", "nccl", "mpi", ...
  int num_ranks = 0;
  int gpus_per_node = 0;  // 0 when unknown; used to pick trace samples by node

  double makespan_s = 0;  // step time: the last op end over all ranks

  std::vector<std::int64_t> op_offset;  // size num_ops + 1
  std::vector<double> start_s;          // size op_offset.back()
  std::vector<double> end_s;

  std::vector<CollectiveRecord> collectives;  // in op id order
  Breakdown breakdown;
  std::vector<LinkTierUtilisation> link_tiers;  // ascending tier; empty when not tracked

  double wall_s = 0;                // wall-clock time of the run itself
  std::int64_t peak_rss_bytes = 0;  // process peak resident set at the end of the run
  std::int64_t num_events = 0;      // discrete events processed (simulator only)

  int num_ops() const { return op_offset.empty() ? 0 : static_cast<int>(op_offset.size()) - 1; }
  std::int64_t entry(OpId op, int pos) const { return op_offset[op] + pos; }
  double op_start(OpId op, int pos) const { return start_s[entry(op, pos)]; }
  double op_end(OpId op, int pos) const { return end_s[entry(op, pos)]; }
  /// Earliest start / latest end of an op over its ranks.
  double op_first_start(OpId op) const;
  double op_last_end(OpId op) const;
  const CollectiveRecord* collective(OpId op) const;  // nullptr if op is not a collective
};

/// Sizes op_offset / start_s / end_s for plan (times set to NaN, "not run") and sets num_ranks.
void init_run_result(const Plan& plan, RunResult& result);
/// The part of init_run_result that sizes nothing large: num_ranks and op_offset (start_s and
/// end_s are left as they are, for the caller to fill with NaN).
void init_op_offsets(const Plan& plan, RunResult& result);

/// Fills makespan_s and breakdown from the per-op per-rank times. Every backend calls this after
/// recording times, so "exposed communication" means the same thing for sim and exec. Throws
/// InternalError if an op has no time on some rank (a backend bug).
void summarize_run(const Plan& plan, RunResult& result);

/// Peak resident set size of this process so far, in bytes (getrusage), 0 where unavailable.
std::int64_t process_peak_rss_bytes();

}  // namespace moesim
