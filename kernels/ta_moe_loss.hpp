// TA-MoE topology-aware auxiliary loss and its gradient w.r.t. the gate probabilities
// (docs/strategy-specs.md §8). Two twins with the same signature shape as moe_kernels.hpp:
//   moesim::kernels::cpu::ta_moe_loss(cpu::Context&, args)    host pointers
//   moesim::kernels::cuda::ta_moe_loss(cuda::Context&, args)  device pointers, on ctx.stream()
//
// On one GPU with T local tokens, E experts and k choices per token:
//   m_e = (1/T) sum_t probs[t, e]                 mean gate probability of expert e
//   c_e = #{(t, c) : expert[t*k + c] == e} / (T k)  share of the local routing choices sent to e
//   l_topo = scale * sum_e w_e * c_e * m_e
//   d l_topo / d probs[t, e] = scale * w_e * c_e / T   (c_e is a count: no gradient, as in GShard)
// w_e = w_{o(e)} is the weight of the GPU that owns expert e, w_j proportional to 1 / c-hat_ij
// (the sender's target share) and normalised to mean 1 over j (ta_moe_expert_weights): with a
// uniform target every w is 1 and, with scale = E, l_topo is GShard's balance loss
// E * sum_e c_e m_e.
// Choices with expert < 0 (dropped or padding) are not counted; T = num_tokens.
// This header is C++17 and includes no CUDA header (nvcc compiles the .cu with C++17).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/moe_kernels.hpp"

namespace moesim::kernels {

struct TaMoeLossArgs {
  int num_tokens = 0;                    // T (> 0)
  int num_experts = 0;                   // E (> 0)
  int top_k = 1;                         // k (>= 1)
  const float* probs = nullptr;          // T x E gate probabilities, row-major
  const std::int32_t* expert = nullptr;  // T x k chosen experts (entry t*k + c), -1 = none
  const float* expert_weight = nullptr;  // E: w_{o(e)}
  float scale = 1.0f;                    // E for the GShard normalisation
  float* loss = nullptr;                 // out: 1 float
  float* grad_probs = nullptr;           // out: T x E (may be null: loss only)
  /// Optional outputs (E floats each, may be null): m_e and c_e as defined above.
  float* mean_prob = nullptr;
  float* choice_share = nullptr;
};

/// Per-GPU weights w_j = (1 / share[j]) / mean_j(1 / share[j]) for a sender's target row
/// `share` (W entries, > 0), repeated for the experts_per_gpu experts of each GPU (W * dE
/// entries). Host-side helper used to fill TaMoeLossArgs::expert_weight.
std::vector<float> ta_moe_expert_weights(const double* share, int num_gpus, int experts_per_gpu);

namespace cpu {
/// Host twin. Throws ArgumentError (kernels/errors.hpp) for non-positive sizes or a null required
/// pointer, and for an expert index >= E.
void ta_moe_loss(Context& ctx, const TaMoeLossArgs& args);
}  // namespace cpu

namespace cuda {
/// CUDA twin (defined only when kCudaCompiled): device pointers, asynchronous on ctx.stream();
/// expert indices >= E are ignored. Reductions run in a fixed order (deterministic).
void ta_moe_loss(Context& ctx, const TaMoeLossArgs& args);
}  // namespace cuda

}  // namespace moesim::kernels
