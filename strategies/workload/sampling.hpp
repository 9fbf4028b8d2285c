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

/// Draws, for one GPU, the k distinct expert choices of each of its S tokens and counts them per
/// choice rank: counts[j * E + e] = tokens whose (j+1)-th choice is expert e.
class ChoiceSampler {
 public:
  enum class Method {
    kAuto,    // kTokens when S <= kTokenMethodMaxRatio * E, else kCounts
    kTokens,  // every token's k choices drawn (alias table, rejection of repeats): exact
    kCounts,  // one multinomial of S per choice rank (conditional binomials): approximate for j>0
  };
  /// Token-level sampling costs ~k*S draws of a few ns; count-level ~k*E binomials of ~0.1-1 us
  /// each (std::binomial_distribution sets up per call). Measured with workload_bench: the
  /// token method stays cheaper up to S/E of about 100-200 (docs/workload.md).
  static constexpr std::int64_t kTokenMethodMaxRatio = 128;

  /// popularity: p_e (sums to 1), or empty for uniform.
  ChoiceSampler(std::vector<double> popularity, int num_experts, int top_k,
                std::int64_t tokens_per_gpu, Method method = Method::kAuto);

  /// Overwrites counts (size top_k * E) with one GPU's per-choice counts; each rank sums to S.
  void sample(Xoshiro256& rng, std::span<std::uint32_t> counts) const;

  Method method() const { return method_; }
  /// Marginal probability of each expert for choice rank j as the count method draws it.
  std::span<const double> rank_weights(int j) const;

 private:
  std::uint32_t draw(Xoshiro256& rng) const {
    return uniform_ ? rng.below(num_experts_) : alias_.sample(rng);
  }
  std::uint32_t draw_excluding(Xoshiro256& rng, const std::uint32_t* chosen, int n) const;
  void sample_tokens(Xoshiro256& rng, std::span<std::uint32_t> counts) const;
  void sample_counts(Xoshiro256& rng, std::span<std::uint32_t> counts) const;

  std::uint32_t num_experts_;
  int top_k_;
  std::int64_t tokens_;
  bool uniform_;
  Method method_;
  std::vector<double> p_;  // popularity (filled with 1/E for uniform)
  AliasTable alias_;
  // Count method: q[j * E + e] (rank weights) and cond[j * E + e] = q_e / sum_{e' >= e} q_e'.
  std::vector<double> q_;
  std::vector<double> cond_;
};

}  // namespace moesim::workload::detail
