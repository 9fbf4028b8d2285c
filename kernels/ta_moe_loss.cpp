#include "kernels/ta_moe_loss.hpp"

#include <string>

#include "kernels/errors.hpp"

namespace moesim::kernels {

std::vector<float> ta_moe_expert_weights(const double* share, int num_gpus, int experts_per_gpu) {
  if (num_gpus < 1 || experts_per_gpu < 1 || share == nullptr)
    throw ArgumentError("ta_moe_expert_weights: need num_gpus >= 1, experts_per_gpu >= 1");
  std::vector<double> inv(static_cast<std::size_t>(num_gpus));
  double sum = 0;
  for (int j = 0; j < num_gpus; ++j) {
    if (!(share[j] > 0))
      throw ArgumentError("ta_moe_expert_weights: target share " + std::to_string(share[j]) +
                          " of GPU " + std::to_string(j) + " must be > 0 (smooth with lambda > 0)");
    inv[j] = 1.0 / share[j];
    sum += inv[j];
  }
  std::vector<float> w;
  w.reserve(static_cast<std::size_t>(num_gpus) * experts_per_gpu);
  for (int j = 0; j < num_gpus; ++j)
    for (int x = 0; x < experts_per_gpu; ++x)
      w.push_back(static_cast<float>(inv[j] * num_gpus / sum));
  return w;
}

namespace cpu {

void ta_moe_loss(Context& ctx, const TaMoeLossArgs& a) {
  (void)ctx;
  if (a.num_tokens < 1 || a.num_experts < 1 || a.top_k < 1)
    throw ArgumentError("ta_moe_loss: num_tokens, num_experts and top_k must be >= 1");
  if (!a.probs || !a.expert || !a.expert_weight || !a.loss)
    throw ArgumentError("ta_moe_loss: probs, expert, expert_weight and loss are required");
  const int T = a.num_tokens, E = a.num_experts, k = a.top_k;
  // Double accumulation: the reference the CUDA twin is checked against.
  std::vector<double> m(static_cast<std::size_t>(E), 0.0);
  std::vector<std::int64_t> n(static_cast<std::size_t>(E), 0);
  for (int t = 0; t < T; ++t) {
    const float* row = a.probs + static_cast<std::size_t>(t) * E;
    for (int e = 0; e < E; ++e) m[e] += row[e];
    for (int c = 0; c < k; ++c) {
      const std::int32_t e = a.expert[static_cast<std::size_t>(t) * k + c];
      if (e < 0) continue;
      if (e >= E)
        throw ArgumentError("ta_moe_loss: expert index " + std::to_string(e) +
                            " >= E = " + std::to_string(E));
      ++n[e];
    }
  }
  const double inv_t = 1.0 / T, inv_tk = 1.0 / (static_cast<double>(T) * k);
  double loss = 0;
  std::vector<float> g(static_cast<std::size_t>(E));
  for (int e = 0; e < E; ++e) {
    const double me = m[e] * inv_t, ce = static_cast<double>(n[e]) * inv_tk;
    loss += static_cast<double>(a.expert_weight[e]) * ce * me;
    g[e] = static_cast<float>(a.scale * a.expert_weight[e] * ce * inv_t);
    if (a.mean_prob) a.mean_prob[e] = static_cast<float>(me);
    if (a.choice_share) a.choice_share[e] = static_cast<float>(ce);
  }
  *a.loss = static_cast<float>(a.scale * loss);
  if (a.grad_probs)
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) a.grad_probs[static_cast<std::size_t>(t) * E + e] = g[e];
}

}  // namespace cpu
}  // namespace moesim::kernels
