// The MoE workload (docs/strategy-specs.md §1): per iteration and per MoE layer, how many tokens
// every GPU routes to every expert after capacity drops, sampled from the scenario's routing
// distribution (uniform, zipf, dirichlet, or a trace file) with a seed owned by the run. The
// simulator needs counts, not token values; the real backend computes the same quantities from
// actual gates.
//
// Capacity (GShard/Tutel local dispatch): each source GPU holds an (E, dC, M) dispatch buffer,
// dC = ceil(k * f * S / E) rounded up to a multiple of the pipeline degree; within an expert,
// first choices get slots before second choices; a choice beyond dC is dropped at the source.
// f = 0: dC = max over (GPU, expert) of the demanded count (dropless; all GPUs agree on it, as
// Tutel's dynamic capacity does with an all-reduce of the max); f < 0: the same, capped at the
// value for f = -f.
//
// docs/workload.md documents the sampling method, its one approximation and the trace format.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario.hpp"

namespace moesim::workload {

/// One MoE layer of one iteration. Rows are source GPUs (0..P-1) of the EP group(s) in global
/// rank order, columns global experts (0..E-1).
struct LayerDispatch {
  int num_gpus = 0;     // P (rows)
  int num_experts = 0;  // E (columns)
  int top_k = 0;
  double capacity_factor = 0;  // f in force this iteration (after workload.capacity)
  std::int64_t capacity = 0;   // dC: slots per (source GPU, expert); the padded buffer size
  /// kept[i * E + e]: tokens GPU i sends to expert e after drops (<= capacity).
  std::vector<std::uint32_t> kept;
  /// demanded[i * E + e]: choices before drops (first + later choices). Empty when the
  /// generator does not keep it (WorkloadGenerator::set_keep_demanded(false), as the runner
  /// does: a second P x E matrix is 64-128 MiB per layer at 4,096 GPUs and only trace export and
  /// tests read it); demanded_at() then answers from kept when nothing was dropped.
  std::vector<std::uint32_t> demanded;
  std::int64_t max_demanded = 0;  // largest demanded count of any (GPU, expert) pair
  std::int64_t dropped = 0;       // sum(demanded - kept)
  /// dropped_by_choice[j]: (j+1)-th choices dropped (size top_k; sums to `dropped`). Trace rows
  /// without a choice column count as first choices.
  std::vector<std::int64_t> dropped_by_choice;
  /// Distinct destinations of the tokens, for a per-node (DeepEP-style) dispatch, which sends a
  /// token once to every GPU and once to every node holding any of its chosen experts. Sampled
  /// only when a strategy of the scenario uses `a2a: deepep` (empty otherwise); choices before
  /// drops (that dispatch is dropless). W = distinct_positions (the EP group size), N =
  /// distinct_nodes (the nodes of an EP group); row i holds W + N entries:
  /// distinct[i * (W + N) + q]: tokens of GPU i with a choice on EP position q (q < W);
  /// distinct[i * (W + N) + W + b]: tokens of GPU i with a choice on the group's node b.
  int distinct_positions = 0;
  int distinct_nodes = 0;
  std::vector<std::uint32_t> distinct;

  std::uint32_t at(int gpu, int expert) const {
    return kept[static_cast<std::size_t>(gpu) * num_experts + expert];
  }
  std::uint32_t demanded_at(int gpu, int expert) const;
  /// Tokens expert e receives in total (column sum of kept).
  std::int64_t expert_load(int expert) const;
  /// Largest expert load / mean expert load (1 = balanced; 0 when nothing is kept).
  double imbalance() const;
  /// Tokens GPU i sends in total after drops (row sum of kept).
  std::int64_t gpu_sent(int gpu) const;
};

/// Which GPU holds expert e: experts are placed round-robin in blocks, expert e on EP-group
/// position e / experts_per_gpu (experts_per_gpu >= 1), or spread over `shards` GPUs
/// e * shards .. e * shards + shards - 1 when sharded.
struct ExpertPlacement {
  int experts_per_gpu = 1;  // >= 1, or 1 when sharded
  int shards = 1;           // GPUs one expert spans (>= 1)
  int owner(int expert) const { return expert / experts_per_gpu * shards; }

  /// The placement of `model` (experts_per_gpu = -x means x shards of one expert).
  static ExpertPlacement of(const ModelSpec& model) {
    return ExpertPlacement{model.local_experts(), model.expert_shards()};
  }
};

/// Node-limited routing (workload.routing.node_limit): the node of the GPU holding each expert
/// (size E), as the EP group of GPU `gpu` places them (ExpertPlacement::owner; a sharded expert
/// counts on its first shard's node), numbered 0, 1, ... in order of first appearance, so EP
/// groups laid out alike get the same vector. Nodes are cluster.gpus_per_node consecutive ranks.
std::vector<std::uint32_t> expert_nodes(const Scenario& scenario, int gpu);

/// Whether the scenario's sampler counts each token's distinct destinations
/// (LayerDispatch::distinct): some strategy uses `a2a: deepep`, the routing is sampled (not a
/// trace or the correlated generator) and experts are whole. One answer for the whole scenario,
/// so all its strategies draw the same counts.
bool samples_distinct_destinations(const Scenario& scenario);

struct IterationWorkload {
  int index = 0;
  double capacity_factor = 0;
  int capacity_multiple = 1;          // dC of every layer is a multiple of this
  std::vector<LayerDispatch> layers;  // one per MoE layer
};

// ---------------------------------------------------------------------------------------------
// Capacity (pure functions; the generator applies them, tests check them by hand).

/// dC for capacity factor f (docs/strategy-specs.md §1), rounded up to a multiple of `multiple` (>=
/// 1): f > 0: ceil(k * f * S / E); f = 0: max_demanded (the largest demanded count of any (GPU,
/// expert) pair: dropless); f < 0: min(max_demanded, the value for -f), both rounded up.
std::int64_t capacity_slots(double f, int top_k, std::int64_t tokens_per_gpu, int num_experts,
                            std::int64_t max_demanded, int multiple = 1);

/// Slot assignment of one (source GPU, expert) pair, all first choices before any second choice:
/// kept[j] = min(counts[j], capacity - (kept[0] + ... + kept[j-1])). Returns the total kept
/// (= min(sum counts, capacity)). `kept_by_choice` has the size of `counts_by_choice`.
std::int64_t apply_capacity(std::span<const std::uint32_t> counts_by_choice, std::int64_t capacity,
                            std::span<std::uint32_t> kept_by_choice);

// ---------------------------------------------------------------------------------------------
// Per-pair dispatch / combine matrices for the plan (core/plan.hpp ByteMatrix).

/// Tokens the dispatch all-to-all of one EP group moves: entry (a, b) = tokens the GPU at group
/// position a sends to the GPU at group position b, the sum of kept[group_ranks[a]][e] over the
/// experts e that position b owns (ExpertPlacement::owner; a sharded expert's tokens go to its
/// first shard, the plan's parallel mode repeats them). `padded`: every (source, expert) pair
/// sends its full dC slots, as GShard/Tutel's fixed-size buffers do. unit = bytes_per_token
/// (M * bytes per element). The combine all-to-all is the transpose (combine_matrix).
ByteMatrix dispatch_matrix(const LayerDispatch& layer, std::span<const int> group_ranks,
                           const ExpertPlacement& placement, Bytes bytes_per_token,
                           bool padded = false);
/// The distinct tokens of one EP group for a per-node (deepep) dispatch (LayerDispatch::distinct
/// of the group's rows), chunk j of r: each count c split as c / r, the first c % r chunks one
/// more, as the plan splits the routed matrix. InputError when the layer has no distinct counts
/// for groups of this size.
std::shared_ptr<NodeDedup> node_dedup(const LayerDispatch& layer, std::span<const int> group_ranks,
                                      Bytes bytes_per_token, std::uint32_t chunk = 0,
                                      std::uint32_t chunks = 1);
/// The transpose of dispatch_matrix: expert outputs returning to the tokens' GPUs.
ByteMatrix combine_matrix(const LayerDispatch& layer, std::span<const int> group_ranks,
                          const ExpertPlacement& placement, Bytes bytes_per_token,
                          bool padded = false);

// ---------------------------------------------------------------------------------------------
// Routing trace files (docs/workload.md): CSV with a header naming the columns iteration, layer,
// gpu (or src), expert, count (or tokens) and optionally choice; '#' comments and blank lines
// are skipped; absent (gpu, expert) pairs are 0; iteration i of a run replays trace iteration
// i mod T (T = largest iteration + 1).

struct TraceEntry {
  int gpu = 0;
  int expert = 0;
  int choice = 0;  // 0 = first choice
  std::uint32_t count = 0;
};

struct RoutingTrace {
  int num_iterations = 0;  // T
  int num_layers = 0;
  /// entries[t * num_layers + l]: the non-zero counts of trace iteration t, MoE layer l.
  std::vector<std::vector<TraceEntry>> entries;
};

/// Reads and validates a trace against the scenario's shape (P GPUs, E experts, MoE layers,
/// top_k). Throws InputError naming file:line (and the column) on any malformed or
/// out-of-range row, and on duplicate rows.
RoutingTrace read_routing_trace(const std::string& path, int num_gpus, int num_experts,
                                int num_layers, int top_k);
/// Writes the demanded counts of `iterations` (all layers) in the trace format, choice column
/// omitted (so totals, not the first/second split, survive the round trip).
void write_routing_trace(std::ostream& out, const std::vector<IterationWorkload>& iterations);

// ---------------------------------------------------------------------------------------------

/// Per-choice counts of sampled layers, shared between generators (and threads). The counts of
/// (iteration, layer) depend only on the routing spec (distribution, skew, alpha, seed) and the
/// shape (P, E, k, S), not on the capacity factor, the pipeline degree or anything else a
/// strategy or a sweep axis like M or H changes; so generators of scenarios that agree on those
/// can share one sampling. PipeMoE's grid (bench/pipemoe_grid_bench) samples 54 shapes instead
/// of 864 points x 4 stacks. Entries cost k * P * E * 4 bytes; the oldest are dropped beyond
/// max_bytes. Thread-safe; two generators missing the same entry at once both sample it (the
/// same counts) and the first insert wins.
class SampleCache {
 public:
  explicit SampleCache(std::size_t max_bytes = std::size_t{256} << 20);
  ~SampleCache();
  SampleCache(const SampleCache&) = delete;
  SampleCache& operator=(const SampleCache&) = delete;

  std::int64_t hits() const;
  std::int64_t misses() const;

  /// What the counts of one layer depend on.
  struct Key {
    int num_gpus = 0, num_experts = 0, top_k = 0;
    std::int64_t tokens = 0;
    int distribution = 0;
    double skew = 0, alpha = 0;
    std::uint64_t seed = 0;
    int iteration = 0, layer = 0;
    // Node limit, and the rows' expert-to-node partitions (distinct vectors in row order, and
    // each row's index into them): two layouts with one limit sample differently.
    int node_limit = 0;
    // Distinct destinations (a2a: deepep): the EP group size and experts per GPU they count on
    // (0, 0: not counted). The entry then holds each row's distinct counts after the counts.
    int distinct_positions = 0, distinct_experts_per_gpu = 0;
    std::shared_ptr<const std::vector<std::vector<std::uint32_t>>> partitions;
    std::shared_ptr<const std::vector<std::uint32_t>> row_partition;
    bool operator<(const Key& o) const;
  };
  using Counts = std::shared_ptr<const std::vector<std::uint32_t>>;
  /// The counts (counts[(gpu * k + j) * E + e], then with distinct destinations
  /// LayerDispatch::distinct), or null (a miss).
  Counts find(const Key& key);
  void insert(const Key& key, Counts counts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Deterministic: every draw comes from a substream keyed by (workload.routing.seed, iteration,
/// layer, GPU), so the counts of iteration i do not depend on which iterations were sampled
/// before it or in which order.
class WorkloadGenerator {
 public:
  /// Throws InputError for unusable inputs (trace file unreadable or of the wrong shape; the
  /// message names the file and line).
  explicit WorkloadGenerator(const Scenario& scenario);
  ~WorkloadGenerator();
  WorkloadGenerator(WorkloadGenerator&&) noexcept;
  WorkloadGenerator& operator=(WorkloadGenerator&&) noexcept;

  /// Capacity factor in force at iteration i (workload.capacity: fixed, trace, random_walk).
  double capacity_factor(int iteration);
  /// Samples iteration i (any order; i >= 0). `capacity_multiple` rounds dC up to a multiple
  /// (the pipeline degree, so chunks split evenly).
  IterationWorkload next(int iteration, int capacity_multiple = 1);
  /// One MoE layer of iteration i with capacity factor f (next() uses capacity_factor(i)).
  LayerDispatch sample_layer(int iteration, int layer, double f, int capacity_multiple = 1);

  /// Turns `w`, sampled by next(i, 1), into exactly what next(i, capacity_multiple) returns,
  /// without sampling again, when that is possible: when no layer dropped anything (a larger dC
  /// drops nothing either, so only dC is re-rounded; always true for f = 0, dropless). Returns
  /// false and leaves `w` as it was otherwise (some choice was dropped: the rounded-up dC would
  /// keep more, which needs the per-choice counts; call next(i, capacity_multiple)).
  bool round_capacity(IterationWorkload& w, int capacity_multiple) const;

  /// Shares sampled counts with other generators through `cache` (nullptr, the default: none).
  /// The counts do not depend on it. Routing traces are not cached (nothing is sampled).
  void set_cache(SampleCache* cache);

  /// Whether sampled layers keep `demanded` (default true). The simulation needs only `kept`,
  /// max_demanded and the drop counts; false saves one P x E matrix per layer.
  void set_keep_demanded(bool keep);

  /// Whether sampled layers fill LayerDispatch::distinct when the scenario samples it (default
  /// true). Only an a2a: deepep plan reads it; false skips the count, not the draws, so every
  /// other count is the same. Ignored with a cache, whose entries serve every stack.
  void set_count_distinct(bool count);

  /// Threads that sample the GPUs' rows (0, the default: std::thread::hardware_concurrency()).
  /// The counts do not depend on it (every GPU has its own substream).
  void set_threads(int threads);

  /// Expert popularity p_e of MoE layer `layer` at iteration i (the distribution the tokens'
  /// choices are drawn from; uniform 1/E; empty for trace).
  std::vector<double> expert_popularity(int iteration, int layer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim::workload
