#include "strategies/pipeline/pipemoe.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "strategies/a2a_select.hpp"

namespace moesim::strategies {

double pipemoe_pass_time(const PipeMoePass& p, int r, PipeMoeRegime* regime) {
  MOESIM_ASSERT(r >= 1, "pipeline degree must be >= 1");
  const double aa = p.a2a.alpha_s, ba = p.a2a.beta_s;
  const double ae = p.expert.alpha_s, be = p.expert.beta_s;
  auto set = [&](PipeMoeRegime g) {
    if (regime != nullptr) *regime = g;
  };
  if (r == 1) {
    set(PipeMoeRegime::kT1);
    return 2.0 * (aa + ba * p.n_d) + ae + be * p.n_e;
  }
  const double a = aa + ba * p.n_d / r;  // one all-to-all chunk
  const double e = ae + be * p.n_e / r;  // one expert chunk, alone on the GPU
  const double slow = 1.0 + p.interference;
  if (a >= e * slow) {
    // Communication-bound chunks: the comm stream never idles, 2r all-to-all chunks in a row.
    set(PipeMoeRegime::kT2);
    return 2.0 * r * aa + 2.0 * ba * p.n_d;
  }
  // The other chunks' dispatches and combines run beside the expert chunks for this long; the
  // experts progress 1 / slow as fast meanwhile.
  const double beside = 2.0 * (r - 1) * a;
  if (beside / slow < r * e) {
    // Compute-bound and the experts hide the other chunks' communication: first dispatch, r
    // expert chunks (stretched while communication runs beside them), last combine.
    set(PipeMoeRegime::kT3);
    return 2.0 * aa + be * p.n_e + 2.0 * ba * p.n_d / r + ae * r + beside * p.interference / slow;
  }
  set(PipeMoeRegime::kT4);
  return 2.0 * r * aa + 2.0 * ba * p.n_d;
}

PipeMoeChoice pipemoe_optimal_degree(
    const std::function<std::vector<PipeMoePass>(int r)>& passes_at, int r_max) {
  r_max = std::max(r_max, 1);
  PipeMoeChoice best;
  best.predicted_s = std::numeric_limits<double>::infinity();
  for (int r = 1; r <= r_max; ++r) {
    const std::vector<PipeMoePass> passes = passes_at(r);
    MOESIM_ASSERT(!passes.empty(), "pipemoe needs at least one pass");
    double t = 0;
    PipeMoeRegime first = PipeMoeRegime::kT1;
    for (size_t i = 0; i < passes.size(); ++i) {
      PipeMoeRegime g;
      t += pipemoe_pass_time(passes[i], r, &g);
      if (i == 0) first = g;
    }
    // Strictly smaller: on ties the smaller degree wins (fewer ops to launch).
    if (t < best.predicted_s) best = PipeMoeChoice{r, t, first};
  }
  return best;
}

PipeMoeChoice pipemoe_optimal_degree(const std::vector<PipeMoePass>& passes, int r_max) {
  return pipemoe_optimal_degree([&](int) { return passes; }, r_max);
}

std::vector<PipeMoePass> pipemoe_passes(const CostModel& cost, std::int64_t capacity,
                                        const Decision& decision, int r) {
  r = std::max(r, 1);
  const std::int64_t cap = (std::max<std::int64_t>(capacity, 1) + r - 1) / r * r;
  const int rep = decision.parallel_degree;
  const MoeLayerShape shape = cost.layer_shape(cap, rep);
  const double n_d = shape.dispatch_bytes.value();
  // Secant lines through the chunks of r and r + 1: exact at r (see the header).
  PipeMoePass fwd;
  fwd.a2a = cost.a2a_fit(decision.a2a, Bytes(n_d / (r + 1)), Bytes(n_d / r));
  fwd.expert = cost.expert_fit(cap, decision.layout, rep, r, r + 1);
  fwd.n_d = n_d;
  fwd.n_e = shape.expert_work;
  fwd.interference = cost.interference();
  std::vector<PipeMoePass> passes{fwd};
  if (cost.scenario().model.mode == Mode::kTraining) {
    // Backward mirrors forward with 2x the expert FLOPs (input and weight gradients).
    PipeMoePass bwd = fwd;
    bwd.expert = cost.expert_fit(cap, decision.layout, rep, r, r + 1, 2.0);
    passes.push_back(bwd);
  }
  return passes;
}

void PipeMoeStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  const int r_max = static_cast<int>(std::min<std::int64_t>(kMaxDegree, ctx.capacity));
  const std::vector<CollectiveAlgo> algos = a2a_candidates(ctx, decision);
  PipeMoeChoice best;
  best.predicted_s = std::numeric_limits<double>::infinity();
  CollectiveAlgo best_algo = algos.front();
  for (CollectiveAlgo algo : algos) {
    Decision d = decision;
    d.a2a = algo;
    PipeMoeChoice c = pipemoe_optimal_degree(
        [&](int r) { return pipemoe_passes(ctx.cost, ctx.capacity, d, r); }, r_max);
    if (c.predicted_s < best.predicted_s) best = c, best_algo = algo;
  }
  last_ = best;
  decision.pipeline_degree = best.degree;
  decision.a2a = best_algo;
}

}  // namespace moesim::strategies
