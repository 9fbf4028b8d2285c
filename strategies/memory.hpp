// Per-GPU memory estimate of one training or inference step (docs/model.md, "Memory"): what a
// GPU holds under the scenario's layout (ep / esp / mp / dp, experts per GPU, expert shards) and
// the strategy's decision (Lina's expert packing, the parallel degree of sharded experts), so
// users can drop configurations that do not fit (PipeMoE dropped those above an RTX 2080 Ti's
// 11 GB). One place: `validate`, `simulate`, `compare`, `sweep` and the runner all call it.
//
// All figures are bytes per GPU (the largest rank's; every rank of a stage holds the same here:
// the padded plan gives every rank the same shapes; with pipeline stages, the fullest stage's). The
// parts:
//  - weights:     parameters held (dense and expert), in the model's dtype;
//  - gradients:   one per parameter, same dtype (training);
//  - optimizer:   Adam state per parameter (training): fp32 momentum and variance (8 bytes), plus
//                 an fp32 master copy (4 bytes) when the dtype is narrower than fp32, i.e. the
//                 ZeRO paper's 2 + 2 + 12 = 16 bytes per parameter for fp16 mixed precision; with
//                 parallelism.zero 1 sharded over each parameter's replicas (dense: P / pp / mp,
//                 experts: dp), else only what the layout shards (esp, expert shards, mp);
//  - activations: tensors kept for backward, every block (training; times the micro-batches in
//                 flight on a pipeline stage, min(pp - s, m) under 1F1B), or one block in flight
//                 (inference);
//  - buffers:     the all-to-all send buffers of the MoE layer in flight, and for sharded experts
//                 under P1 / intermediate degrees the gathered expert parameters (kept from
//                 forward to backward, as the plan does) and one layer's gathered gradient.
#pragma once

#include <cstdint>

#include "core/scenario.hpp"
#include "strategies/decision.hpp"

namespace moesim::strategies {

struct MemoryEstimate {
  double dense_params = 0;   // dense (attention, dense FFN, gate) parameters held per GPU
  double expert_params = 0;  // expert parameters held per GPU (all MoE layers)
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  double buffers_bytes = 0;
  std::int64_t capacity = 0;  // dC (slots per GPU and expert) the estimate assumed

  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + buffers_bytes;
  }
};

/// Optimizer bytes per parameter (training, Adam): 8 (fp32 momentum + variance), plus 4 for the
/// fp32 master weights when dtype is narrower than 4 bytes (fp16/bf16: 12; fp8: 12; fp32: 8).
int optimizer_bytes_per_param(Dtype dtype);

/// The estimate for `sc` under `decision` (expert_pack, parallel_degree) when every MoE layer
/// has dC = `capacity` slots per (GPU, expert) (a layer's own dC when they differ: pass the
/// largest, an upper bound). Pure; formulas in docs/model.md, "Memory".
MemoryEstimate estimate_memory(const Scenario& sc, const Decision& decision, std::int64_t capacity);

/// dC without sampling a workload, for `moesim validate`: ceil(k f S / E) rounded up to
/// `multiple`, at the largest capacity factor the workload reaches (model.capacity_factor, the
/// largest trace factor, or random_walk's max); a dropless f < 0 counts as its cap -f, an uncapped
/// dropless f = 0 as 1 (its sampled dC depends on the routing).
std::int64_t nominal_capacity(const Scenario& sc, int multiple = 1);

}  // namespace moesim::strategies
