// Expert placement for inference (docs/strategy-specs.md §7; Lina §5): which GPUs of an EP group
// hold which experts, how the tokens then flow, and what moving from one placement to another
// costs.
//
// popularity_placement (phase 1 from an estimate, phase 2 from the actual counts), on W GPUs
// with at most `max_per_gpu` experts each, load_e = popularity_e * W (in GPUs' worth of tokens):
//  1. every expert with load_e >= 1 gets r_e = ceil(load_e) dedicated GPUs (its replicas; every
//     source GPU splits its tokens for e evenly over them); (ours) ceil(load_e - 0.1), so that a
//     load just above a whole number of GPUs does not take one more, nearly idle, replica;
//  2. experts with 0 < load_e < 1 are packed first-fit-decreasing (by load, ties by id) into
//     bins of capacity 1 GPU and at most max_per_gpu experts; each bin is one GPU;
//  3. (ours) if the replicas and bins need more than W GPUs, one GPU at a time is freed, by
//     taking a replica from the expert whose per-replica load would stay smallest or by merging
//     the two lightest bins (if their experts fit on one GPU), whichever leaves the smaller load;
//     if neither can, the lightest bins are dissolved and their experts added, heaviest first, to
//     the least loaded GPU with room;
//  4. unestimated experts (load 0) go to GPUs still empty, then to the least loaded GPU with
//     room (they need a home: their actual tokens may come);
//  5. (ours) GPUs still empty take load off the most loaded GPU: a packed GPU gives up its
//     heaviest expert, a dedicated one gets its expert one more replica;
//  6. (ours) GPUs are assigned to the resulting sets so that each keeps as many of the experts it
//     held before as possible (greedy, in order of the sets), which limits the weights moved.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/plan.hpp"

namespace moesim::inference {

struct Placement {
  std::vector<std::vector<int>> gpu_experts;  // per group position: experts held, ascending
  std::vector<std::vector<int>> replicas;     // per expert: positions holding it, ascending

  int num_gpus() const { return static_cast<int>(gpu_experts.size()); }
  int num_experts() const { return static_cast<int>(replicas.size()); }
  /// Fills `replicas` from `gpu_experts` (and sorts both).
  static Placement from_gpu_experts(std::vector<std::vector<int>> gpu_experts, int num_experts);
};

/// Baseline: E / W experts per GPU, expert e on position e / (E / W) (E a multiple of W).
Placement uniform_placement(int num_gpus, int num_experts);

/// The rule above. `popularity` sums to 1 (or is all zero: then uniform shares); `previous` (may
/// be null) is the placement the GPUs hold now.
Placement popularity_placement(std::span<const double> popularity, int num_gpus, int max_per_gpu,
                               const Placement* previous);

/// Largest GPU load of `placement` under `popularity` (sum 1), in GPUs' worth (W * the share of
/// the tokens the busiest GPU gets; 1 = perfectly balanced): each expert's share split evenly
/// over its replicas.
double predicted_max_load(const Placement& placement, std::span<const double> popularity);

/// (ours) Re-placing moves weights; keep `current` unless `proposed` lowers the predicted max
/// load by more than `tolerance` (relative). Returns the placement to use.
const Placement& keep_unless_better(const Placement& current, const Placement& proposed,
                                    std::span<const double> popularity, double tolerance);

/// The k most popular experts (popularity descending, ties by lower id), as an ascending set.
std::vector<int> top_k_experts(std::span<const double> popularity, int k);

/// Lina's phase-2 trigger: the estimated top-k set differs from the actual one.
bool phase2_fires(std::span<const double> estimated, std::span<const double> actual, int k);

/// Tokens position a sends to position b: counts[a * E + e] (the tokens position a routes to
/// expert e) split over e's replicas, c / r each and the c % r left over one more each, starting
/// at replica a mod r (so the remainders spread over the replicas).
ByteMatrix token_matrix(const Placement& placement, std::span<const std::uint32_t> counts,
                        Bytes bytes_per_token);

/// Every GPU fetches each expert it holds in `to` but not in `from` from a GPU holding it in
/// `from` (the holder that has sent the fewest so far, ties by position): entry (a, b) = experts
/// position a sends to b.
ByteMatrix weight_moves(const Placement& from, const Placement& to, Bytes bytes_per_expert);

/// Tokens each position receives (column sums of token_matrix, in tokens).
std::vector<double> received_tokens(const ByteMatrix& tokens);

}  // namespace moesim::inference
