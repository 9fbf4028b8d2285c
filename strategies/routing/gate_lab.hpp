// Gate-training lab (docs/strategy-specs.md §8): does minimising task loss + lambda * l_topo
// really move a gate's dispatch pattern towards the TA-MoE target? A linear gate is trained by
// plain minibatch SGD on seeded synthetic tokens, twice: with GShard's balance loss (uniform
// weights: "without the topology loss") and with the topology-aware loss (weights from c-hat).
//
// Data: C clusters in R^D (centres N(0, separation^2 I), tokens = centre + N(0, I)); cluster c's
// teacher expert is c mod E; every GPU draws tokens from all clusters uniformly. The gate sees the
// token and a one-hot of the GPU it runs on (a per-device bias, the only way a gate shared by all
// GPUs can prefer different experts on different GPUs). Task loss: label-smoothed cross-entropy of
// the softmax gate to the teacher's expert; routing: top-k of the gate probabilities. Every step:
// each GPU takes a minibatch of its tokens, computes the task gradient and the auxiliary loss
// gradient (kernels::cpu::ta_moe_loss, over its local tokens and choices), chains both through the
// softmax; the shared (feature) rows take the mean of the GPUs' gradients (the data-parallel
// all-reduce), while each GPU's one-hot row, a per-GPU parameter only its own tokens touch, takes
// that GPU's gradient (as expert weights under expert parallelism are not all-reduced). Per
// epoch, on held-out tokens: accuracy (top-1 == teacher), balance (largest expert load / mean, over
// all choices), off-node share (choices whose expert lives on another node).
#pragma once

#include <cstdint>
#include <vector>

namespace moesim::routing {

struct GateLabConfig {
  int num_gpus = 8;          // P
  std::vector<int> node_of;  // P entries: node of every GPU
  int experts_per_gpu = 1;   // E = P * experts_per_gpu; expert e on GPU e / experts_per_gpu
  int top_k = 2;
  /// Target shares c-hat (P x P, rows sum to 1) for the topology loss weights.
  std::vector<double> target_share;
  /// D; 0 = default_feature_dim(E). A real gate's input (model_dim) is far wider than the
  /// number of experts; with D < E the 2E clusters crowd the feature space, the task itself
  /// stops being separable and no logit margin is left for the topology loss to spend.
  int feature_dim = 0;
  int clusters = 0;          // C (0: 2 * E)
  double separation = 3.0;   // cluster centre scale
  int tokens_per_gpu = 512;  // training tokens per GPU per epoch
  int eval_tokens_per_gpu = 512;
  int batch = 64;  // tokens per GPU per step
  int epochs = 30;
  double learning_rate = 0.5;
  double aux_weight = 1.0;  // weight of the auxiliary loss: task + aux_weight * aux
  /// Label smoothing eps of the task loss (target (1 - eps) * teacher + eps / E). Without it the
  /// non-teacher probabilities collapse to 0 and no auxiliary loss can reorder later choices;
  /// with it they settle near eps / E, where the auxiliary gradient decides their order.
  double label_smoothing = 0.2;
  std::uint64_t seed = 1;
};

struct GateLabEpoch {
  int epoch = 0;  // 1-based; 0 = before training
  double task_loss = 0, aux_loss = 0;
  double accuracy = 0;       // in [0, 1]
  double balance = 0;        // max expert load / mean (1 = balanced)
  double offnode_share = 0;  // in [0, 1]
};

struct GateLabRun {
  bool topology_loss = false;
  std::vector<GateLabEpoch> epochs;  // epoch 0 .. config.epochs
};

/// The default feature dimension for E experts: max(16, E) (see GateLabConfig::feature_dim).
int default_feature_dim(int experts);

/// Trains one gate; deterministic for a seed (both runs of run_gate_lab see the same data and
/// the same initial gate). Throws InputError for inconsistent configs.
GateLabRun train_gate(const GateLabConfig& config, bool topology_loss);

/// Both runs: [0] without (balance loss), [1] with the topology loss.
std::vector<GateLabRun> run_gate_lab(const GateLabConfig& config);

}  // namespace moesim::routing
