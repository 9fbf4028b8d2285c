// Per-GPU memory estimate of one training or inference step (docs/model.md, "Memory"), laid out
// as Megatron-LM / TransformerEngine lay it out: what a GPU holds under the scenario's layout
// (pp / ep / esp / mp / dp, experts per GPU, expert shards), precision, recomputation and the
// strategy's decision (Lina's expert packing, the parallel degree of sharded experts), so users
// can drop configurations that do not fit (PipeMoE dropped those above an RTX 2080 Ti's 11 GB).
// One place: `validate`, `simulate`, `compare`, `sweep`, `tune` and the runner all call it.
//
// All figures are bytes per GPU of the fullest pipeline stage (every rank of a stage holds the
// same: the padded plan gives every rank the same shapes). The parts:
//  - weights:     parameters held (attention by head layout, FFNs by activation, the gate, norm
//                 weights, embeddings), at model.dtype;
//  - gradients:   one per parameter at model.precision.main_grads (training);
//  - optimizer:   Adam (training): an fp32 master copy when model.dtype is narrower than fp32, plus
//                 two fp32 moments; parallelism.zero 1 shards it over each parameter's replicas;
//  - activations: tensors kept for backward (training: every block of the stage, per
//                 micro-batch in flight, less what model.recompute recomputes; GEMM inputs at
//                 1 byte under fp8 GEMMs), or one block in flight (inference);
//  - buffers:     the all-to-all send buffers of the MoE layer in flight, and for sharded experts
//                 under P1 / intermediate degrees the gathered expert parameters.
#pragma once

#include <cstdint>
#include <string>

#include "core/scenario.hpp"
#include "strategies/decision.hpp"

namespace moesim::strategies {

struct MemoryEstimate {
  double dense_params = 0;   // dense (attention, norms, dense FFN, gate, embeddings) per GPU
  double expert_params = 0;  // expert parameters held per GPU (all MoE layers of the stage)
  double weights_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;
  double activations_bytes = 0;
  double buffers_bytes = 0;
  std::int64_t capacity = 0;  // dC (slots per GPU and expert) the estimate assumed
  // Where the figures come from: the fullest pipeline stage, the micro-batches whose activations
  // it keeps, the recomputation in force and the decision's degrees (for fit_advice).
  int stage = 0;
  int in_flight = 1;  // micro-batch chunks (1 / chunks of the stage's blocks each)
  int chunks = 1;     // model chunks per stage (schedule interleaved: vp; dualpipe: 2)
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  int expert_pack = 1;
  int parallel_degree = 1;

  double total_bytes() const {
    return weights_bytes + gradients_bytes + optimizer_bytes + activations_bytes + buffers_bytes;
  }
};

/// Optimizer bytes per parameter (training, Adam) before any ZeRO sharding: the two moments at
/// `moments` (8 at fp32), plus 4 for the fp32 master weights when dtype is narrower than 4 bytes.
int optimizer_bytes_per_param(Dtype dtype, Dtype moments = Dtype::kFp32);

/// Ranks holding a replica of one dense parameter (the dense data-parallel group, P / pp / mp)
/// and of one expert parameter (its dp replicas, times mp in the disjoint layout, where every MP
/// rank has an EP x ESP group of its own): what ZeRO-1 shards the optimizer state over.
int dense_replicas(const Scenario& sc);
int expert_replicas(const Scenario& sc);

/// Micro-batch chunks whose activations pipeline stage `stage` keeps at its peak, from the
/// schedule's order (stage_schedule.hpp, peak_in_flight): 1F1B's min(pp - stage, m), Megatron's
/// interleaved (pp - s - 1) 2 + (vp - 1) pp + 1 chunks of 1 / vp of the stage, DualPipe's pp + 1
/// chunks (of one stage of the two a rank holds) on its first and last ranks; 1 in inference.
int in_flight_micro_batches(const Scenario& sc, int stage);

/// The estimate for `sc` under `decision` (expert_pack, parallel_degree) when every MoE layer
/// has dC = `capacity` slots per (GPU, expert) (a layer's own dC when they differ: pass the
/// largest, an upper bound). Pure; formulas in docs/model.md, "Memory".
MemoryEstimate estimate_memory(const Scenario& sc, const Decision& decision, std::int64_t capacity);

/// The selective recomputation fit_advice and `tune` propose: every light module the model has
/// (core_attn, layernorm, mla_up_proj, mlp, moe_act, shared_experts), as DeepSeek-V3 and
/// Megatron's MoE recipes combine them; `moe` is left out, as it re-runs the layer's all-to-alls.
std::vector<RecomputeModule> light_modules(const ModelSpec& m);

/// Where `est` (an estimate_memory of `sc`) exceeds `gpu_memory_bytes`: "does not fit 80.0 GiB;
/// fits with KEY (x GiB) or KEY (y GiB)", each KEY one single change of the scenario that makes
/// the same estimate fit (parallelism.zero: 1; model.recompute selective / full; the smallest
/// larger parallelism.pp that divides the nodes, unless a pipeline_layout fixes pp;
/// model.precision.gemm: fp8 on GPUs with fp8), or
/// "...; no single change of ... fits". Empty when it fits (or the GPU's memory is unknown).
std::string fit_advice(const Scenario& sc, const MemoryEstimate& est, double gpu_memory_bytes);

/// dC without sampling a workload: ceil(k f S / E) rounded up to `multiple`, at the largest
/// capacity factor the workload reaches (model.capacity_factor, the largest trace factor, or
/// random_walk's max); a dropless f < 0 counts as its cap -f, an uncapped dropless f = 0 as 1
/// (its sampled dC depends on the routing: strategies::planned_memory samples it).
std::int64_t nominal_capacity(const Scenario& sc, int multiple = 1);

}  // namespace moesim::strategies
