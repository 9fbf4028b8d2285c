#include "strategies/memory.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "strategies/schedules/lina.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::strategies {

int optimizer_bytes_per_param(Dtype dtype) {
  // Adam's two fp32 moments; mixed precision adds the fp32 master copy of the weights.
  return dtype_bytes(dtype) < 4 ? 12 : 8;
}

namespace {

// What one pipeline stage holds (the whole model when pp = 1).
struct StageShare {
  int moe_layers = 0, dense_layers = 0;
  bool embedding = true, head = true;
  int in_flight = 1;  // micro-batches whose activations are kept at once (training)
};

MemoryEstimate estimate_share(const Scenario& sc, const Decision& decision, std::int64_t capacity,
                              const StageShare& part) {
  const auto& m = sc.model;
  const double M = m.model_dim, H = m.hidden_dim, E = m.experts;
  const double S = static_cast<double>(m.tokens_per_gpu());
  const double mp = sc.parallelism.mp, esp = sc.parallelism.esp;
  const double n = m.expert_shards(), rho = decision.parallel_degree;
  const double local = m.local_experts();
  const double b = sc.bytes_per_element();
  const int moe_layers = part.moe_layers;
  const int dense_layers = part.dense_layers;
  const int layers = moe_layers + dense_layers;
  const bool training = m.mode == Mode::kTraining;

  MemoryEstimate est;
  est.capacity = capacity;
  // Parameters (docs/model.md: attention 4 M^2 / mp, dense FFN 2 M Hd / mp with Hd =
  // dense_hidden() (8 M^2 / mp at the default 4 M), gate M E held by every rank of an MP index; an
  // expert's 2 M H split over esp hidden slices and n shards).
  const double Hd = static_cast<double>(m.dense_hidden());
  // Shared experts (N of width H, one FFN of hidden N H) are dense parameters of every MoE block.
  const double Hs = static_cast<double>(m.shared_experts) * H;
  // Vocabulary: the V x M embedding, and as much again for an untied LM head, split over mp. With
  // pipeline stages the embedding sits on the first stage and the head on the last, each a V x M
  // matrix even when tied (the last stage keeps its own copy, as Megatron does).
  const double V = m.vocab_size;
  const double vocab_copies = part.embedding && part.head
                                  ? (m.tie_embeddings ? 1 : 2)
                                  : (part.embedding ? 1 : 0) + (part.head ? 1 : 0);
  est.dense_params = layers * 4 * M * M / mp + dense_layers * 2 * M * Hd / mp +
                     moe_layers * (M * E + 2 * M * Hs / mp) + vocab_copies * V * M / mp;
  est.expert_params = moe_layers * local * 2 * M * H / (esp * n);
  const double params = est.dense_params + est.expert_params;
  est.weights_bytes = params * b;
  if (training) {
    est.gradients_bytes = params * b;
    // ZeRO-1: each rank keeps the optimizer state of 1 / (the parameter's replica count) of it:
    // dense parameters over the dense DP group (P / pp / mp ranks), experts over their dp
    // replicas.
    const double dense_shards =
        sc.parallelism.zero >= 1 ? static_cast<double>(sc.stage_gpus()) / mp : 1.0;
    const double expert_shards = sc.parallelism.zero >= 1 ? sc.parallelism.dp : 1.0;
    est.optimizer_bytes = (est.dense_params / dense_shards + est.expert_params / expert_shards) *
                          optimizer_bytes_per_param(m.dtype);
  }

  // Activations, in elements. Per block: the two layer-norm inputs (residual stream, 2 S M), the
  // attention's QKV input (S M), Q, K, V (3 S M / mp) and the projection input (S M / mp); the
  // L x L scores are not kept (memory-efficient attention recomputes them in backward).
  const double attention = 2 * S * M + S * M + 4 * S * M / mp;
  // Dense FFN (hidden Hd): fc1 input S M, fc1 output and fc2 input (the activation's input and
  // output) 2 x S Hd / mp.
  const double dense_ffn = S * M + 2 * S * Hd / mp;
  // MoE FFN: gate input S' M (S' = S esp, the ESP-gathered tokens), gate probabilities S' E, the
  // received expert input R M, fc1 output and fc2 input 2 R H_s, the combined outputs R M the
  // gate-weight gradient needs. R = E dC esp rho rows per GPU (the padded buffer), H_s = H /
  // (esp rho) rounded up.
  const double s_esp = S * esp;
  const double rows = E * static_cast<double>(capacity) * esp * rho;
  const double h_slice =
      static_cast<double>((m.hidden_dim + static_cast<std::int64_t>(esp * rho) - 1) /
                          static_cast<std::int64_t>(esp * rho));
  // Shared experts: their fc1 output and fc2 input, 2 S N H / mp (their input is the gate's).
  const double moe_ffn =
      s_esp * M + s_esp * E + 2 * rows * M + 2 * rows * h_slice + 2 * S * Hs / mp;
  // The LM head's input S M and its S V / mp logits (kept for the loss's backward).
  const double head = V > 0 && part.head ? S * M + S * V / mp : 0;
  if (training) {
    // Every micro-batch in flight keeps its own (1F1B: min(pp - s, m) on stage s).
    est.activations_bytes =
        part.in_flight *
        (layers * attention + dense_layers * dense_ffn + moe_layers * moe_ffn + head) * b;
  } else {
    // Inference keeps nothing for backward: the largest block in flight.
    double block = 0;
    if (dense_layers > 0) block = std::max(block, attention + dense_ffn);
    if (moe_layers > 0) block = std::max(block, attention + moe_ffn);
    block = std::max(block, head);
    est.activations_bytes = block * b;
  }

  // Buffers: the dispatch send buffer (the encode's padded output) and the combine send buffer
  // (the expert outputs), R M each, of the MoE layer in flight. Pipeline chunks are slices of
  // these buffers (as in Tutel), so r does not multiply them.
  if (moe_layers > 0) est.buffers_bytes = 2 * rows * M * b;
  // Sharded experts with n / rho > 1 (P1, intermediate rho): the all-gathered hidden slice
  // 2 M H / rho of every MoE layer is kept from forward to backward (no re-gather), plus one
  // layer's full-size gradient before its reduce-scatter; inference gathers one layer at a time.
  if (moe_layers > 0 && n / rho > 1) {
    const double gathered = 2 * M * H / rho;
    est.buffers_bytes += training ? (moe_layers + 1) * gathered * b : gathered * b;
  }
  return est;
}

}  // namespace

MemoryEstimate estimate_memory(const Scenario& scenario, const Decision& decision,
                               std::int64_t capacity) {
  MOESIM_ASSERT(capacity >= 0, "capacity must be >= 0");
  MOESIM_ASSERT(decision.expert_pack >= 1 && decision.parallel_degree >= 1,
                "decision degrees must be >= 1");
  // Lina's expert packing: the same job on fewer, fuller EP ranks (what the plan builder builds).
  const Scenario sc = decision.expert_pack > 1
                          ? schedules::packed_scenario(scenario, decision.expert_pack)
                          : scenario;
  const auto& m = sc.model;
  const int pp = sc.parallelism.pp;
  MemoryEstimate worst;
  // With pipeline stages every stage holds its own blocks; the estimate is the fullest stage's.
  for (int stage = 0; stage < pp; ++stage) {
    const auto [begin, end] = sc.stage_blocks(stage);
    StageShare part;
    for (int l = begin; l < end; ++l) ++(m.is_moe_block(l) ? part.moe_layers : part.dense_layers);
    part.embedding = stage == 0;
    part.head = stage == pp - 1;
    // 1F1B: stage s holds the activations of min(pp - s, m) micro-batches at its peak.
    part.in_flight = std::min(pp - stage, m.micro_batches);
    const MemoryEstimate est = estimate_share(sc, decision, capacity, part);
    if (stage == 0 || est.total_bytes() > worst.total_bytes()) worst = est;
  }
  return worst;
}

std::int64_t nominal_capacity(const Scenario& sc, int multiple) {
  const auto& m = sc.model;
  // The largest factor the workload reaches (an upper bound of every iteration's dC); dropless
  // factors count as their cap -f, or 1 when uncapped.
  auto as_bound = [](double f) { return f > 0 ? f : f < 0 ? -f : 1.0; };
  double f = as_bound(m.capacity_factor);
  const auto& cap = sc.workload.capacity;
  if (cap.kind == CapacityKind::kTrace) {
    f = 0;
    for (double x : cap.factors) f = std::max(f, as_bound(x));
  } else if (cap.kind == CapacityKind::kRandomWalk) {
    f = cap.max;
  }
  return workload::capacity_slots(f, m.top_k, m.tokens_per_gpu(), m.experts, 0,
                                  std::max(multiple, 1));
}

}  // namespace moesim::strategies
