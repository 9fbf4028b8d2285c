// Sampling the tokens' expert choices of one GPU (internal header; docs/workload.md explains the
// two methods and when each is used).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "strategies/workload/random.hpp"

namespace moesim::workload::detail {

/// Zipf popularity of MoE layer `layer`: the expert at popularity rank r (0-based) gets weight
/// 1 / (r + 1)^skew; the ranking is a permutation of the experts drawn from the layer's substream
/// (the same every iteration: the gate of a layer keeps its favourites). Normalised.
std::vector<double> zipf_popularity(int num_experts, double skew, std::uint64_t seed, int layer);

/// p ~ Dirichlet(alpha, ..., alpha) for (iteration, layer), drawn as normalised Gamma(alpha)
/// variates computed in log space (for alpha < 1 as Gamma(alpha + 1) * U^(1/alpha)), so tiny
/// alphas give very skewed but never all-zero vectors.
std::vector<double> dirichlet_popularity(int num_experts, double alpha, std::uint64_t seed,
                                         int iteration, int layer);

/// Node-limited routing (workload.routing.node_limit, docs/workload.md): node_of[e] is the node
/// (0..nodes-1) of expert e; a token's choices lie on at most `limit` nodes. Empty: no limit.
struct NodeLimit {
  std::vector<std::uint32_t> node_of;
  int limit = 0;
};

/// Distinct destinations of each token (a per-node, DeepEP-style dispatch sends a token once per
/// GPU and once per node that hold any of its experts): pos_of[e] is the EP-group position of
/// expert e (0..positions-1), node_of[e] its node (0..nodes-1). Empty: not counted.
struct DistinctDestinations {
  std::vector<std::uint32_t> pos_of;
  std::vector<std::uint32_t> node_of;
  std::uint32_t positions = 0;
  std::uint32_t nodes = 0;
};

/// Draws, for one GPU, the k distinct expert choices of each of its S tokens and counts them per
/// choice rank: counts[j * E + e] = tokens whose (j+1)-th choice is expert e.
class ChoiceSampler {
 public:
  enum class Method {
    kAuto,    // kPairs when k <= 2 and S > kPairsMinRatio * E; otherwise kTokens when
              // S <= kTokenMethodMaxRatio * E, else kCounts
    kTokens,  // every token's k choices drawn (alias table, rejection of repeats): exact
    kCounts,  // one multinomial of S per choice rank (conditional binomials): approximate for j>0
    kPairs,   // k <= 2: per-expert counts from ~4E binomials, exact (docs/workload.md)
  };
  /// Token-level sampling costs ~k*S draws of a few ns; count-level ~k*E binomials. Measured
  /// with workload_bench when the binomials were std::binomial_distribution (~0.1-1 us): the
  /// token method stayed cheaper up to S/E of about 100-200 (docs/workload.md). Only k >= 3
  /// uses this switch now.
  static constexpr std::int64_t kTokenMethodMaxRatio = 128;
  /// kPairs costs ~4E binomials of ~40-50 ns (detail::binomial) against ~k*S draws of ~1-2 ns
  /// (uniform) or ~2-4 ns (alias table) for the token method; workload_bench's thread CPU times
  /// put the crossover near S/E = 90 (uniform) and 50 (zipf). The switch stays where the count
  /// method's was, so the token range samples exactly as before and only the approximate count
  /// method is replaced (docs/workload.md).
  static constexpr std::int64_t kPairsMinRatio = 128;

  /// popularity: p_e (sums to 1), or empty for uniform. A node limit (non-empty node_of, limit
  /// below the number of nodes) needs each token's choice set, so it samples by the token method
  /// whatever `method` asks; every `limit` nodes must hold at least top_k experts.
  /// Counting distinct destinations (non-empty `distinct`) also needs each token's choice set,
  /// so it samples by the token method too.
  ChoiceSampler(std::vector<double> popularity, int num_experts, int top_k,
                std::int64_t tokens_per_gpu, Method method = Method::kAuto,
                NodeLimit node_limit = {}, DistinctDestinations distinct = {});

  /// Overwrites counts (size top_k * E) with one GPU's per-choice counts; each rank sums to S.
  /// With distinct destinations, `distinct` (size positions + nodes) is overwritten with the
  /// tokens that have at least one choice on each position, then on each node; an empty
  /// `distinct` skips that count (the draws and `counts` are the same).
  void sample(Xoshiro256& rng, std::span<std::uint32_t> counts,
              std::span<std::uint32_t> distinct = {}) const;
  bool counts_distinct() const { return !distinct_.pos_of.empty(); }

  Method method() const { return method_; }
  /// Marginal probability of each expert for choice rank j as the count method draws it.
  std::span<const double> rank_weights(int j) const;

 private:
  std::uint32_t draw(Xoshiro256& rng) const {
    return uniform_ ? rng.below(num_experts_) : alias_.sample(rng);
  }
  std::uint32_t draw_excluding(Xoshiro256& rng, const std::uint32_t* chosen, int n) const;
  // draw_excluding after its 64 rejected attempts: the exact scan.
  std::uint32_t draw_excluding_scan(Xoshiro256& rng, const std::uint32_t* chosen, int n) const;
  // A draw from p conditioned on not being chosen and lying on one of the token's `num_nodes`
  // nodes (the limit reached).
  std::uint32_t draw_on_nodes(Xoshiro256& rng, const std::uint32_t* chosen, int n,
                              const std::uint32_t* nodes, int num_nodes) const;
  // draw_on_nodes after its attempts by node mass: the exact scan of the token's nodes.
  std::uint32_t draw_on_nodes_scan(Xoshiro256& rng, const std::uint32_t* chosen, int n,
                                   const std::uint32_t* nodes, int num_nodes) const;
  void sample_tokens_node_limited(Xoshiro256& rng, std::span<std::uint32_t> counts,
                                  std::uint32_t* distinct) const;
  // The same draws for uniform p on equal nodes (DeepSeek-V3's case), inlined, with the token's
  // choices as flags instead of searches.
  void sample_tokens_node_limited_uniform(Xoshiro256& rng, std::span<std::uint32_t> counts,
                                          std::uint32_t* distinct) const;
  // Every token's choices drawn in order (draw, then draw_excluding), distinct counted (unless
  // null).
  void sample_tokens_distinct(Xoshiro256& rng, std::span<std::uint32_t> counts,
                              std::uint32_t* distinct) const;
  // Adds one token's distinct positions and nodes (its k choices `chosen`); `seen` (positions +
  // nodes flags) is all clear before and after.
  void count_distinct(const std::uint32_t* chosen, std::uint32_t* distinct,
                      std::uint8_t* seen) const;
  void sample_tokens(Xoshiro256& rng, std::span<std::uint32_t> counts) const;
  void sample_counts(Xoshiro256& rng, std::span<std::uint32_t> counts) const;
  void sample_pairs(Xoshiro256& rng, std::span<std::uint32_t> counts) const;
  void build_pairs_tables();

  std::uint32_t num_experts_;
  int top_k_;
  std::int64_t tokens_;
  bool uniform_;
  Method method_;
  std::vector<double> p_;  // popularity (filled with 1/E for uniform)
  // Node limit (empty node_of_: none): experts of each node, node_experts_[node_begin_[n] ..
  // node_begin_[n + 1]) in index order.
  std::vector<std::uint32_t> node_of_;
  int node_limit_ = 0;
  std::vector<std::uint32_t> node_begin_;
  std::vector<std::uint32_t> node_experts_;
  std::uint32_t node_size_ = 0;         // experts per node when all nodes hold alike, else 0
  std::vector<double> node_mass_;       // sum of p over each node's experts
  std::vector<AliasTable> node_alias_;  // p within each node with mass (empty when uniform)
  AliasTable alias_;
  DistinctDestinations distinct_;
  // Count method: q[j * E + e] (rank weights) and cond[j * E + e] = q_e / sum_{e' >= e} q_e'.
  std::vector<double> q_;
  std::vector<double> cond_;
  // Pair method (docs/workload.md), P the prefix and T the suffix sums of p:
  // first_cond_[e] = p_e / T_e (first choices, and the ascending chain of second choices above
  // their first), lo_prob_[f] = P_f / (P_f + T_{f+1}) (a token with first choice f picks its
  // second below f), down_cond_[e] = p_e / P_{e+1} (the descending chain below the first).
  std::vector<double> first_cond_;
  std::vector<double> lo_prob_;
  std::vector<double> down_cond_;
};

}  // namespace moesim::workload::detail
