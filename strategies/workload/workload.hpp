// The MoE workload (STRATEGIES §1): per iteration and per MoE layer, how many tokens every GPU
// routes to every expert after capacity drops, sampled from the scenario's routing distribution
// (uniform, zipf, dirichlet, or a trace file) with a seed owned by the run. The simulator needs
// counts, not token values; the real backend computes the same quantities from actual gates.
//
// Capacity (GShard/Tutel local dispatch): each source GPU holds an (E, dC, M) dispatch buffer,
// dC = ceil(k * f * S / E) rounded up to a multiple of the pipeline degree; within an expert,
// first choices get slots before second choices; a choice beyond dC is dropped at the source.
// f = 0: dC = max over (GPU, expert) of the demanded count (dropless; all GPUs agree on it, as
// Tutel's dynamic capacity does with an all-reduce of the max); f < 0: the same, capped at the
// value for f = -f.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/scenario.hpp"

namespace moesim::workload {

/// One MoE layer of one iteration. Rows are source GPUs (0..P-1) of the EP group(s) in global
/// rank order, columns global experts (0..E-1).
struct LayerDispatch {
  int num_gpus = 0;      // P (rows)
  int num_experts = 0;   // E (columns)
  int top_k = 0;
  double capacity_factor = 0;   // f in force this iteration (after workload.capacity)
  std::int64_t capacity = 0;    // dC: slots per (source GPU, expert); the padded buffer size
  /// kept[i * E + e]: tokens GPU i sends to expert e after drops (<= capacity).
  std::vector<std::uint32_t> kept;
  /// demanded[i * E + e]: choices before drops (first + later choices).
  std::vector<std::uint32_t> demanded;
  std::int64_t dropped = 0;  // sum(demanded - kept)

  std::uint32_t at(int gpu, int expert) const {
    return kept[static_cast<std::size_t>(gpu) * num_experts + expert];
  }
  /// Tokens expert e receives in total (column sum of kept).
  std::int64_t expert_load(int expert) const;
  /// Largest expert load / mean expert load (1 = balanced).
  double imbalance() const;
};

/// Which GPU holds expert e: experts are placed round-robin in blocks, expert e on EP-group
/// position e / experts_per_gpu (experts_per_gpu >= 1), or spread over `shards` GPUs
/// e * shards .. e * shards + shards - 1 when sharded.
struct ExpertPlacement {
  int experts_per_gpu = 1;  // >= 1, or 1 when sharded
  int shards = 1;           // GPUs one expert spans (>= 1)
  int owner(int expert) const { return expert / experts_per_gpu * shards; }
};

struct IterationWorkload {
  int index = 0;
  double capacity_factor = 0;
  std::vector<LayerDispatch> layers;  // one per MoE layer
};

/// Deterministic: the same scenario, seed and call sequence give the same counts.
class WorkloadGenerator {
 public:
  /// Throws InputError for unusable inputs (trace file unreadable or of the wrong shape; the
  /// message names the file and line).
  explicit WorkloadGenerator(const Scenario& scenario);
  ~WorkloadGenerator();

  /// Capacity factor in force at iteration i (workload.capacity: fixed, trace, random_walk).
  double capacity_factor(int iteration);
  /// Samples iteration i (call with i = 0, 1, 2, ... in order). `capacity_multiple` rounds dC up
  /// to a multiple (the pipeline degree, so chunks split evenly).
  IterationWorkload next(int iteration, int capacity_multiple = 1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim::workload
