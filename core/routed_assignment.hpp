// The rule that turns a plan's routed counts into (token, choice) -> expert / destination
// (ExpertRouting, core/plan.hpp), for one source position of an EP group:
//  1. source a's entries in expert order: expert 0's counts[a][0] entries, then expert 1's, ...
//     (expert e's entries cut into pieces per destination as ExpertRouting describes);
//  2. entry i of that list is token i % S, choice i / S. An expert's run is at most S long
//     (checked), so a token's choices are on distinct experts; list entries past the row's total
//     do not exist: those (token, choice) entries are dropped;
//  3. the entries of a (source, destination) pair, in list order, are cut into the plan's chunks
//     as the plan builder cuts the pair's count: chunk j takes n / r (+1 for j < n % r)
//     consecutive entries.
// The real backend's routed data path (exec/routed_path.hpp) moves tokens by it, the check's
// reference recomputes the layer by it, and the plan builder counts a per-node (deepep) dispatch's
// distinct destinations by it for the plans it builds for the real backend (assignment_dedup), so
// that what exec moves is what the plan says. Here in core because both strategies/ and exec/ use
// it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/plan.hpp"

namespace moesim {

/// `count` consecutive entries of a source's expert-ordered list: tokens for expert `expert`
/// that go to group position `dst`.
struct RoutedPiece {
  int expert = 0;
  int dst = 0;
  std::uint32_t count = 0;
  bool operator==(const RoutedPiece&) const = default;
};
/// Source position `src`'s list cut into pieces, in list order (ExpertRouting's rule).
std::vector<RoutedPiece> routed_pieces(const ExpertRouting& r, int src);

/// Chunk j's share of a pair's n tokens: n / chunks, +1 for j < n % chunks (the plan builder's).
std::uint32_t chunk_share(std::uint32_t n, int chunks, int j);

/// What source position `src` (S tokens, top-k) sends.
struct RoutedAssignment {
  std::vector<int> expert;                          // per entry t * k + c; -1: dropped
  std::vector<std::vector<std::vector<int>>> send;  // [chunk][dst]: entries in send order
  long long dropped = 0;
};
/// The rule above. Throws InputError when a (source, expert) count exceeds the S tokens or a
/// row exceeds S * k entries (no routing of real tokens can produce them).
RoutedAssignment assign_routed(const ExpertRouting& r, int src, int tokens, int top_k, int chunks);

/// The distinct EP positions of each of the S tokens of an assignment, ascending (experts on
/// position e / experts_per_gpu; the routing must have neither replicas nor a spread split).
std::vector<std::vector<int>> token_positions(const ExpertRouting& r, const RoutedAssignment& a,
                                              int tokens, int top_k);

/// The per-node dispatch's distinct token counts (NodeDedup) of a whole EP group under the rule
/// above: every source position's assignment (one chunk), each token counted once per position
/// and once per node holding one of its experts. The group is node-aligned with `nodes` nodes
/// (position q on node q / (size / nodes)). `unit`: bytes per token.
std::shared_ptr<NodeDedup> assignment_dedup(const ExpertRouting& r, int tokens, int top_k,
                                            int nodes, Bytes unit);

}  // namespace moesim
