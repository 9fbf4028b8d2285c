// Model FLOPs: the figure training frameworks divide by the step time to print "model TFLOP/s per
// GPU" and MFU. It follows Megatron-LM's definition (num_floating_point_operations in
// megatron/training/training.py): the FLOPs the model needs, not what the plan runs, so padding,
// dropped tokens, duplicated MP work, recomputation, the gate and the memory-bound kernels do not
// count, and two stacks of one scenario share one figure. docs/figures.md has the formula.
#pragma once

#include <cstdint>

#include "core/scenario.hpp"

namespace moesim::strategies {

/// Forward FLOPs of one token through the whole model, by part (a GEMM of m x k by k x n is
/// 2 m k n). Each part sums all the blocks that have it.
struct ModelFlops {
  double attention_projections = 0;  // Q, K, V (or MLA's down / up projections) and the output
  double attention_core = 0;         // QK^T and softmax x V; half of L x L when causal
  double dense_ffn = 0;              // the FFN of the blocks without an MoE FFN
  double routed_experts = 0;         // top_k experts of width H per MoE block
  double shared_experts = 0;         // shared_experts x H per MoE block
  double logits = 0;                 // the LM head, 2 M V (0 without a vocabulary)

  double attention() const { return attention_projections + attention_core; }
  double forward() const {
    return attention() + dense_ffn + routed_experts + shared_experts + logits;
  }
  /// Forward and backward: Megatron counts every GEMM three times (forward, data gradient,
  /// weight gradient), recomputation excluded.
  double training() const { return 3 * forward(); }
};

/// The per-token FLOPs of `model` at its seq_len (the attention core depends on it).
ModelFlops model_flops(const ModelSpec& model);

/// Model FLOPs of one token in the scenario's mode: training() for training, forward() for
/// inference.
double model_flops_per_token(const Scenario& sc);

/// Distinct tokens one step processes on the whole cluster: B x L x micro_batches per MP group,
/// times P / (pp x mp) groups. The mp ranks of a group share their tokens in both layouts
/// (Megatron's tensor parallelism; the overlapped layout's MP blocks too, docs/model.md).
std::int64_t tokens_per_step(const Scenario& sc);

/// What people compare for one step of `step_time_s` on the scenario's P GPUs, each of dense peak
/// `peak_flops_per_s` for model.dtype (0: unknown, mfu 0). Training only has model FLOP/s and MFU
/// (Megatron's definition); inference reports tokens/s/GPU and leaves them at 0 (has_model_flops
/// false).
struct StepFigures {
  double tokens_per_step = 0;
  double model_flops_per_token = 0;  // as model_flops_per_token(sc)
  double tokens_per_s_per_gpu = 0;
  bool has_model_flops = false;          // training
  double model_flops_per_s_per_gpu = 0;  // tokens/s/GPU x training FLOPs per token
  double mfu = 0;                        // model FLOP/s per GPU / peak (0 when the peak is 0)
};

StepFigures step_figures(const Scenario& sc, double step_time_s, double peak_flops_per_s);
/// The same from the parts (what StackRun keeps): `gpus` = P.
StepFigures step_figures(double tokens_per_step, double model_flops_per_token, bool training,
                         int gpus, double step_time_s, double peak_flops_per_s);

}  // namespace moesim::strategies
