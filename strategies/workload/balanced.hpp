// Force-balanced routing (`workload.routing.distribution: balanced`, docs/workload.md): every
// expert gets the same number of choices (+-1), as Megatron-Core's forced load balancing
// benchmarks the experts. Internal header of the workload generator.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "strategies/workload/sampling.hpp"

namespace moesim::workload::detail {

/// The cyclic expert sequence the tokens of one EP group walk in MoE layer `layer` of iteration
/// `iteration`. Without a node limit (node_of empty or limit 0): a seeded permutation of the
/// experts. With one: the group's nodes (labels 0..nodes-1, in label order) cut into blocks of
/// `limit` consecutive nodes, each block listed round robin over its nodes (node a's first
/// expert, node b's first, ..., node a's second, ...), every node's experts in a seeded order;
/// so a window of top_k consecutive entries inside a block touches at most `limit` nodes and
/// takes about top_k / limit experts from each.
std::vector<std::uint32_t> balanced_order(int num_experts, std::span<const std::uint32_t> node_of,
                                          int limit, std::uint64_t seed, int iteration, int layer);

/// The most nodes any token's experts touch in `order` (node_of[e]: expert e's node). Tokens
/// start at multiples of top_k in the endless repetition of `order` (BalancedSampler), so only
/// windows starting at multiples of gcd(top_k, E) occur.
int balanced_max_nodes(std::span<const std::uint32_t> order, std::span<const std::uint32_t> node_of,
                       int top_k);

/// One GPU's tokens under balanced routing. The GPUs of an EP group walk one endless repetition
/// of `order`: EP position q's tokens take the slots [q*S*k, (q+1)*S*k), token t of it the k
/// slots from q*S*k + t*k. A run of consecutive slots covers every expert floor or ceil times
/// (length / E), so each GPU's row and the group's column sums are within 1 of their means, and
/// the k slots of a token are k distinct experts (k <= E).
class BalancedSampler {
 public:
  BalancedSampler(std::vector<std::uint32_t> order, int top_k, std::int64_t tokens_per_gpu,
                  DistinctDestinations distinct = {});

  /// Overwrites counts (size top_k * E) with the per-choice counts of the GPU at EP position
  /// `ep_position`; with distinct destinations, `distinct` (size positions + nodes) with the
  /// tokens that have a choice on each position, then on each node.
  void sample(std::uint64_t ep_position, std::span<std::uint32_t> counts,
              std::span<std::uint32_t> distinct = {}) const;

 private:
  std::vector<std::uint32_t> order_;
  int top_k_;
  std::int64_t tokens_;
  DistinctDestinations distinct_;
};

}  // namespace moesim::workload::detail
