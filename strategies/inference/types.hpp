// What the inference expert placement (docs/strategy-specs.md §7, strategies/inference/) hands to
// the plan builder and to the run's records. Plain data, so decision.hpp and runner.hpp can carry
// it without depending on the generator or the estimator.
#pragma once

#include <memory>
#include <vector>

#include "core/plan.hpp"

namespace moesim::strategies {

/// One MoE layer of one batch, per EP group (index = group index of the "ep" grouping).
struct InferenceLayerPlan {
  /// Tokens group position a sends to position b in the dispatch (unit: M * bytes per element);
  /// the combine is the transpose. Expert compute of a GPU scales with its column sum.
  std::vector<std::shared_ptr<const ByteMatrix>> tokens;
  /// The expert split behind `tokens` (per group; core/plan.hpp ExpertRouting), which the plan
  /// attaches to its dispatch for the real backend's data path.
  std::vector<std::shared_ptr<const ExpertRouting>> routing;
  /// Phase 1: expert weights fetched for this layer's placement (unit: one expert's weights),
  /// started once the previous MoE layer's gate ran, on the param stream, so it overlaps the
  /// layers in between; the expert FFN waits for it. Empty: nothing moves.
  std::vector<std::shared_ptr<const ByteMatrix>> prefetch;
  /// Lina checks its estimate after the gate: an all-reduce of the E actual counts over the EP
  /// group, blocking the dispatch.
  bool sync_counts = false;
  /// Phase 2: weights moved to the re-planned placement after the gate, blocking the dispatch.
  /// Empty: phase 2 did not fire.
  std::vector<std::shared_ptr<const ByteMatrix>> replan;
};

struct InferencePlan {
  std::vector<InferenceLayerPlan> layers;  // one per MoE layer
};

/// Per batch (one iteration), summed over its (MoE layer, EP group) placements.
struct InferenceRecord {
  int placements = 0;             // (MoE layer, EP group) pairs placed this batch
  int estimated = 0;              // of which placed from an estimate (lina)
  int topk_matches = 0;           // estimated top-k popular experts == actual top-k (as sets)
  double popularity_error = 0;    // sum over estimated placements of 0.5 * sum_e |est_e - act_e|
  int phase2 = 0;                 // placements re-planned after the gate (lina phase 2)
  double load_imbalance_sum = 0;  // sum over placements of max GPU tokens / mean GPU tokens
  double moved_weight_bytes = 0;  // expert weights moved (phase 1 + phase 2), all groups
};

}  // namespace moesim::strategies
