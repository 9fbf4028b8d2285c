// PipeMoE's optimal pipeline degree (docs/strategy-specs.md §3; Shi et al., "PipeMoE: Accelerating
// Mixture-of-Experts through Adaptive Pipelining", INFOCOM 2023, §III-IV).
//
// With t_a2a(n) = alpha_a + beta_a * n and the expert (two GEMMs) t_e(x) = alpha_e + beta_e * x,
// r chunks of the dispatch bytes n_d and expert work n_e give per-chunk times
// a(r) = alpha_a + beta_a * n_d / r and e(r) = alpha_e + beta_e * n_e / r, and the layer time
//   T1       = 2 a(1) + e(1)                                   (r = 1)
//   T2(r)    = 2 r alpha_a + 2 beta_a n_d                      (a(r) >= e(r): comm-bound chunks)
//   T3(r)    = 2 alpha_a + beta_e n_e + 2 beta_a n_d / r + alpha_e r
//                                         (a(r) < e(r) and 2 (r-1) a(r) < r e(r): compute hides)
//   T4(r)    = 2 r alpha_a + 2 beta_a n_d   (a(r) < e(r), 2 (r-1) a(r) >= r e(r))
// (dispatch and combine chunks share one communication stream). r is an integer: every
// r in [1, r_max] is evaluated exactly with its regime's closed form (ours: no numeric solver) and
// the smallest predicted time wins, the smaller r on ties. A training step has a forward and a
// backward pass with one r for both: the prediction is the sum of the passes' closed forms.
//
// Where the lines come from (ours): GEMM time is not affine in size (tile efficiency drops as
// chunks shrink), so one global line mispredicts either small or large r. The strategy therefore
// evaluates candidate r with lines fitted locally, through the chunk sizes of r and r + 1 (the
// secant at r), from the cost model (strategies/cost_model.hpp), and with dC rounded up to a
// multiple of r as the workload does. With exact lines this changes nothing; with the roofline it
// makes a(r) and e(r) exact at every candidate.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "strategies/cost_model.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies {

/// One pipelined pass (forward, or backward) of the MoE layer.
struct PipeMoePass {
  AlphaBeta a2a;     // per all-to-all (dispatch or combine), x in bytes per rank
  AlphaBeta expert;  // per expert pass, x in expert work
  double n_d = 0;    // bytes per rank of the whole dispatch (= combine)
  double n_e = 0;    // expert work of the whole pass
  /// Compute slow-down beside communication (engine.interference): an expert chunk that runs
  /// while a chunk of the all-to-all does takes (1 + interference) x longer.
  double interference = 0;
};

enum class PipeMoeRegime { kT1, kT2, kT3, kT4 };

/// Predicted time of one pass at degree r (>= 1) and the regime whose closed form applies.
double pipemoe_pass_time(const PipeMoePass& pass, int r, PipeMoeRegime* regime = nullptr);

struct PipeMoeChoice {
  int degree = 1;
  double predicted_s = 0;
  PipeMoeRegime regime = PipeMoeRegime::kT1;  // of the first pass at `degree`
};

/// The integer optimum over r in [1, r_max] of the summed passes (r_max >= 1).
PipeMoeChoice pipemoe_optimal_degree(const std::vector<PipeMoePass>& passes, int r_max);
/// The same with passes that depend on the candidate r (locally fitted lines).
PipeMoeChoice pipemoe_optimal_degree(
    const std::function<std::vector<PipeMoePass>(int r)>& passes_at, int r_max);

/// The PipeMoE passes (forward; and backward in training, 2x expert FLOPs) of the scenario's MoE
/// layer under `decision` (layout, parallel degree, a2a algorithm) at capacity dC rounded up to a
/// multiple of r, with lines fitted through the chunk sizes of r and r + 1.
std::vector<PipeMoePass> pipemoe_passes(const CostModel& cost, std::int64_t capacity,
                                        const Decision& decision, int r);

/// pipeline: pipemoe. Re-decides every iteration (the capacity factor may move). With a2a: auto
/// it also picks the algorithm: the (r, algo) pair of least predicted time.
class PipeMoeStrategy final : public Strategy {
 public:
  static constexpr int kMaxDegree = 64;
  std::string_view name() const override { return "pipemoe"; }
  void decide(const StrategyContext& ctx, Decision& decision) override;
  /// The choice made by the last decide() (for logs and tests).
  const PipeMoeChoice& last_choice() const { return last_; }

 private:
  PipeMoeChoice last_;
};

}  // namespace moesim::strategies
