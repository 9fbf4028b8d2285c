// TA-MoE target dispatch pattern (docs/strategy-specs.md §8): how many tokens every GPU of an EP
// group should send to every other GPU so that the slowest pair of the all-to-all finishes first.
//
// Model: pair (i, j) moving x_ij tokens of `bytes_per_token` takes alpha_ij + beta_ij * x_ij * b
// seconds (alpha, beta from Topology::pair_cost: latency sum, bottleneck bandwidth with NIC sharing
// counted). The target minimises T = max over pairs with x_ij > 0 of that time subject to
//   sum_j x_ij = supply (every sender sends all its k*S routing choices) and
//   sum_i x_ij = supply (every receiver's experts get the same load).
//
// Solvers:
//  - exact: bisection on T; for a T the pair capacities are u_ij = floor((T - alpha_ij) /
//    (beta_ij * b)) tokens and feasibility is a bipartite transportation problem, decided by a
//    Boost.Graph push-relabel max-flow that must saturate every supply. Integer capacities, so the
//    flow (the target) is integral: rows and columns sum to the supply exactly.
//  - tier symmetry: when every GPU sees the same multiset of pair costs as sender and as receiver
//    (homogeneous switches, symmetric trees, full fat trees), the optimum gives every pair of one
//    cost class the same volume: a water-filling over a handful of classes, O(P^2) pair_cost calls
//    and nothing more (4,096 GPUs in seconds). With zero latencies the class volumes are
//    proportional to bandwidth: tier shares follow tier bandwidth.
//
// The local pair (i, i) never leaves the GPU; pricing it at HBM bandwidth would send every token
// to the local expert (expert isolation, the degenerate optimum). It is priced as the GPU's
// nearest peer instead (lowest alpha, highest bandwidth among j != i): the local expert belongs to
// the lowest tier, so a homogeneous switch gets the uniform target.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moesim::topology {
class Topology;
}

namespace moesim::routing {

/// One class of pairs with the same cost (alpha, beta) and tier.
struct PairClass {
  double alpha_s = 0;       // seconds
  double beta_s_per_b = 0;  // seconds per byte (> 0)
  int tier = 0;             // Topology tier (0 for the local pair)
};

/// alpha / beta of every ordered pair of a group (row = sender, group positions 0..W-1), stored
/// as a class id per pair (4 bytes per pair: 64 MiB at 4,096 GPUs) and a short class table.
struct PairCostMatrix {
  int size = 0;  // W
  std::vector<PairClass> classes;
  std::vector<std::uint32_t> cls;  // W*W class ids, row-major
  const PairClass& at(int i, int j) const {
    return classes[cls[static_cast<std::size_t>(i) * size + j]];
  }
  double alpha(int i, int j) const { return at(i, j).alpha_s; }
  double beta(int i, int j) const { return at(i, j).beta_s_per_b; }
};

/// Pair costs of the GPUs `ranks` (global ranks, group order) on `topo`, local pairs priced as the
/// nearest peer (see above). O(W^2) pair_cost calls; classes merge pairs whose alpha agree to
/// 0.1 ps and bandwidths to 1 B/s (so summation order along a route does not split a class).
PairCostMatrix pair_costs(const topology::Topology& topo, std::span<const int> ranks);
/// From explicit matrices (tests, custom models): alpha_s and beta_s_per_b are W*W; local pairs
/// are taken as given. Tiers: `tier` (W*W) or all 0 when empty.
PairCostMatrix pair_costs(int size, std::span<const double> alpha_s,
                          std::span<const double> beta_s_per_b, std::span<const int> tier = {});

/// kSymmetric: water-filling over cost classes (one GPU type); kTypedMaxFlow: max-flow over GPU
/// types (equitable partition, see solve_target); kMaxFlow: max-flow over every GPU pair.
enum class TargetMethod { kSymmetric, kTypedMaxFlow, kMaxFlow };
std::string_view target_method_name(TargetMethod m);

struct TargetOptions {
  /// Use the symmetric / typed fast paths when the costs allow them (exact either way).
  bool allow_symmetric = true;
  /// The typed max-flow is used when it has at most this many blocks (else per-GPU max-flow).
  std::size_t max_blocks = std::size_t{1} << 22;
  /// Bisection stops when hi - lo <= rel_tolerance * hi (the result is the feasible hi).
  double rel_tolerance = 1e-7;
  int max_iterations = 100;
};

/// The solver's answer: x* in tokens, and the smoothed shares c-hat.
struct TargetPattern {
  int size = 0;             // W
  std::int64_t supply = 0;  // tokens per sender and per receiver (k * S)
  double bytes_per_token = 0;
  double lambda = 0;
  TargetMethod method = TargetMethod::kMaxFlow;
  int iterations = 0;      // max-flow solves (kMaxFlow); 0 for kSymmetric
  double time_s = 0;       // T of x*: max over used pairs of alpha + beta * x * b
  double even_time_s = 0;  // the same for even dispatch x = supply / W
  /// kMaxFlow: x*[i*W + j], integral tokens. Otherwise empty, and every pair of one block (row
  /// type, column type, cost class) carries block_tokens[(row_type * col_types + col_type) *
  /// classes + class] (real-valued; integral block totals). Rows and columns sum to `supply`.
  std::vector<double> tokens;
  std::vector<double> block_tokens;
  std::vector<std::uint32_t> cls;       // the cost matrix's class ids (W*W), block methods only
  std::vector<std::uint32_t> row_type;  // W (empty: all 0)
  std::vector<std::uint32_t> col_type;  // W (empty: all 0)
  int row_types = 1, col_types = 1, classes = 0;

  double tokens_at(int i, int j) const {
    const std::size_t p = static_cast<std::size_t>(i) * size + j;
    if (!tokens.empty()) return tokens[p];
    const std::size_t r = row_type.empty() ? 0 : row_type[i];
    const std::size_t q = col_type.empty() ? 0 : col_type[j];
    return block_tokens[(r * col_types + q) * classes + cls[p]];
  }
  /// c-hat_ij = (1 - lambda) * x*_ij / supply + lambda / W (rows sum to 1).
  double share_at(int i, int j) const {
    const double x = supply > 0 ? tokens_at(i, j) / static_cast<double>(supply) : 1.0 / size;
    return (1.0 - lambda) * x + lambda / size;
  }
};

/// Solves the min-max target for `costs`, every GPU sending and receiving `supply` tokens of
/// `bytes_per_token` bytes, then smooths it with `lambda` in [0, 1]. Throws InputError for
/// supply < 0, bytes_per_token <= 0, lambda outside [0, 1] or an empty group.
TargetPattern solve_target(const PairCostMatrix& costs, std::int64_t supply, double bytes_per_token,
                           double lambda, const TargetOptions& opt = {});

/// True when every row and every column holds the same multiset of cost classes (so the
/// symmetric fast path is exact).
bool is_tier_symmetric(const PairCostMatrix& costs);

/// Predicted all-to-all time of per-pair token counts tokens(i, j): max over pairs with
/// tokens > 0 of alpha + beta * tokens * b.
template <class TokensFn>
double predicted_time_s(const PairCostMatrix& costs, TokensFn&& tokens, double bytes_per_token) {
  double t = 0;
  for (int i = 0; i < costs.size; ++i)
    for (int j = 0; j < costs.size; ++j) {
      const double x = tokens(i, j);
      if (x <= 0) continue;
      const PairClass& c = costs.at(i, j);
      const double pair = c.alpha_s + c.beta_s_per_b * x * bytes_per_token;
      if (pair > t) t = pair;
    }
  return t;
}

/// Per tier: the mean over senders of the share of their tokens going to peers of that tier (the
/// local pair counts in tier 0), even dispatch vs the pattern's x* and c-hat.
struct TierShare {
  int tier = 0;
  double peers = 0;     // peers per sender in this tier (mean over senders, the local one included)
  double even = 0;      // share under even dispatch
  double target = 0;    // share under x*
  double smoothed = 0;  // share under c-hat
};
std::vector<TierShare> tier_shares(const PairCostMatrix& costs, const TargetPattern& pattern);

}  // namespace moesim::routing
