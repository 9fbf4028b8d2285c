// The correlated multi-layer routing generator of inference (docs/strategy-specs.md §7; Lina §5):
// which experts every token of a batch picks at every MoE layer, seeded, with per-layer skew and
// path stickiness (workload.routing.distribution: correlated; documented in scenarios/README.md and
// docs/strategies.md).
//
// Model (ours; Lina measured the effect, not a generator):
//  - Layer l has Zipf marginals: the expert of popularity rank r gets weight 1 / (r + 1)^skew,
//    the ranking a permutation of its own (workload::detail::zipf_popularity, the same ranking the
//    `zipf` distribution uses), so every layer has different favourites.
//  - A token's path group at layer l >= 1 is its first choices at the previous min(memory, l)
//    MoE layers. Every group has a dominant next expert d_l(group), drawn once from layer l's
//    marginals by hashing (seed, l, group): nothing is stored, so any number of groups is free.
//  - Batches differ (different requests): batch b draws, per layer, its own popularity
//    q_{b,l} ~ Dirichlet(c * p_l) with c = 1 / batch_variation^2 - 1, so E[q] = p_l and
//    Var[q_e] = batch_variation^2 * p_e (1 - p_e); batch_variation 0 gives q = p_l.
//  - With probability `stickiness` the token's first choice at layer l is d_l(group); otherwise
//    it is drawn from q_{b,l}. Its other k - 1 choices are drawn from q_{b,l}, distinct from the
//    choices before. Layer 0 draws from q_{b,0}.
//  A batch's popularity at layer l thus has a part its paths predict (the sticky tokens) and a
//  part they cannot (q_{b,l}'s deviation from p_l): what Lina's phase 2 exists for.
//  So the share of tokens following their group's dominant expert is stickiness + (1 -
//  stickiness) * p_l(d), about stickiness + (1 - stickiness) * sum_e p_l(e)^2: the default 0.4
//  gives ~0.45-0.55 for 16 experts at skew 0.8-1.2, Lina's measured 42-55%.
//
// Determinism: the tokens of GPU g in batch i come from the substream (seed, stream, i, g), so
// a batch does not depend on which batches were drawn before; the profiling trace is another
// stream of the same generator (different batches, same model).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/scenario.hpp"
#include "strategies/workload/random.hpp"

namespace moesim::inference {

struct CorrelatedRoutingParams {
  int num_experts = 1;         // E (<= 65,536)
  int top_k = 1;               // k <= E
  int num_layers = 1;          // MoE layers
  double skew = 0;             // per-layer Zipf exponent (>= 0)
  double stickiness = 0.4;     // in [0, 1]
  int memory = 3;              // previous layers forming the path group (>= 1)
  double batch_variation = 0;  // per-batch popularity spread, in [0, 1)
  std::uint64_t seed = 1;

  /// From the scenario: correlated takes its keys; zipf and uniform are the same generator with
  /// stickiness 0 (independent layers; uniform with skew 0).
  static CorrelatedRoutingParams of(const Scenario& sc);
};

/// Expert choices of one batch's tokens at every MoE layer. Token t belongs to GPU t / S.
struct RoutingBatch {
  int num_layers = 0;
  int top_k = 0;
  std::int64_t num_tokens = 0;
  /// choices[l][t * top_k + j]: the (j+1)-th expert of token t at MoE layer l; j = 0, the first
  /// choice, is what forms paths.
  std::vector<std::vector<std::uint16_t>> choices;

  std::uint16_t first(int layer, std::int64_t token) const {
    return choices[static_cast<std::size_t>(layer)][static_cast<std::size_t>(token) * top_k];
  }
  std::span<const std::uint16_t> of(int layer, std::int64_t token) const {
    return {choices[static_cast<std::size_t>(layer)].data() + token * top_k,
            static_cast<std::size_t>(top_k)};
  }
};

enum class BatchStream : std::uint64_t { kServe = 101, kProfile = 102 };

class CorrelatedRouting {
 public:
  /// Throws InputError on out-of-range parameters.
  explicit CorrelatedRouting(CorrelatedRoutingParams params);

  const CorrelatedRoutingParams& params() const { return p_; }
  /// Marginals p_l(e) of MoE layer l (sum 1).
  const std::vector<double>& popularity(int layer) const { return pop_[layer]; }
  /// d_l(group): `group` = first choices at the previous layers, oldest first (the generator
  /// uses the last min(memory, layer) of them).
  int dominant(int layer, std::span<const std::uint16_t> group) const;

  /// q_{b,l}: the popularity batch `index` of `stream` draws its non-sticky choices from.
  std::vector<double> batch_popularity(BatchStream stream, int index, int layer) const;
  /// Batch `index` of `stream`: tokens_per_gpu tokens for each of num_gpus GPUs.
  RoutingBatch batch(BatchStream stream, int index, int num_gpus,
                     std::int64_t tokens_per_gpu) const;

 private:
  static int draw_other(workload::detail::Xoshiro256& rng,
                        const workload::detail::AliasTable& alias, const std::vector<double>& p,
                        const std::uint16_t* chosen, int n);

  CorrelatedRoutingParams p_;
  std::vector<std::vector<double>> pop_;  // per layer
  std::vector<std::vector<double>> cdf_;  // per layer, inclusive prefix sums
};

}  // namespace moesim::inference
