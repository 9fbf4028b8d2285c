#include "strategies/model_flops.hpp"

namespace moesim::strategies {

namespace {

// Forward FLOPs of one token through one block's attention (projections, core).
void attention_flops(const ModelSpec& m, double& projections, double& core) {
  const AttentionSpec& a = m.attention;
  const double M = m.model_dim, n = a.heads, L = m.seq_len;
  // A causal mask leaves half of the L x L scores (FlashAttention skips the masked blocks).
  const double keys = a.causal ? L / 2 : L;
  if (a.is_mla()) {
    const double nope = a.qk_nope_head_dim, rope = a.qk_rope_head_dim, v = a.v_head_dim;
    // Queries: M -> q_lora latent -> n heads of nope + rope (or M -> heads directly). The "+ 1"
    // is the latent's norm, which Megatron counts as one multiply-add per latent element.
    const double q =
        a.q_lora_rank > 0 ? a.q_lora_rank * (M + n * (nope + rope) + 1) : M * n * (nope + rope);
    // Keys/values: M -> kv_lora latent (+ its norm) -> n heads of nope keys and v values; the
    // rotary key part comes from M directly, shared by the heads.
    const double kv = a.kv_lora_rank * (M + n * (nope + v) + 1) + M * rope;
    const double out = n * v * M;
    projections = 2 * (q + kv + out);
    core = 2 * keys * n * (nope + rope) + 2 * keys * n * v;
    return;
  }
  const double q = n * a.head_dim, kv = static_cast<double>(a.kv_heads) * a.head_dim;
  projections = 2 * M * (q + 2 * kv) + 2 * q * M;
  core = 2 * keys * q * 2;  // QK^T and softmax x V, both over the query width
}

}  // namespace

ModelFlops model_flops(const ModelSpec& m) {
  ModelFlops f;
  const double M = m.model_dim;
  // One FFN of hidden h costs 2 M h per weight matrix: fc1 and fc2 for gelu, gate, up and down
  // for SwiGLU (Megatron's 3/2 on the 4 M h of a gelu FFN).
  const double matrices = m.swiglu() ? 3 : 2;
  double proj = 0, core = 0;
  attention_flops(m, proj, core);
  // The MTP modules (training) count as Megatron counts them: a block each, their 2M -> M
  // projection with the attention projections, and a pass through the LM head each.
  const int blocks = m.num_blocks(), mtp = m.mtp_blocks();
  const int moe_blocks = m.experts > 0 ? m.num_moe_layers() : 0;
  const int dense_blocks = blocks - moe_blocks;
  f.attention_projections = proj * blocks + mtp * 2 * (2 * M) * M;
  f.attention_core = core * blocks;
  f.dense_ffn = dense_blocks * 2 * M * static_cast<double>(m.dense_hidden()) * matrices;
  f.routed_experts = moe_blocks * 2 * M * static_cast<double>(m.hidden_dim) * m.top_k * matrices;
  f.shared_experts =
      moe_blocks * 2 * M * static_cast<double>(m.hidden_dim) * m.shared_experts * matrices;
  f.logits = (1 + mtp) * 2 * M * static_cast<double>(m.vocab_size);
  return f;
}

double model_flops_per_token(const Scenario& sc) {
  const ModelFlops f = model_flops(sc.model);
  return sc.model.mode == Mode::kTraining ? f.training() : f.forward();
}

std::int64_t tokens_per_step(const Scenario& sc) {
  // Folded (sequence parallel): every GPU holds S tokens of its own; else an MP group shares S.
  const std::int64_t groups =
      sc.num_gpus() / sc.parallelism.pp / (sc.parallelism.folded() ? 1 : sc.parallelism.mp);
  return sc.model.tokens_per_gpu() * sc.model.micro_batches * groups;
}

StepFigures step_figures(double tokens_per_step, double model_flops_per_token, bool training,
                         int gpus, double step_time_s, double peak_flops_per_s) {
  StepFigures s;
  s.tokens_per_step = tokens_per_step;
  s.model_flops_per_token = model_flops_per_token;
  s.has_model_flops = training;
  if (step_time_s <= 0 || gpus <= 0) return s;
  s.tokens_per_s_per_gpu = tokens_per_step / step_time_s / gpus;
  if (!training) return s;
  s.model_flops_per_s_per_gpu = s.tokens_per_s_per_gpu * model_flops_per_token;
  if (peak_flops_per_s > 0) s.mfu = s.model_flops_per_s_per_gpu / peak_flops_per_s;
  return s;
}

StepFigures step_figures(const Scenario& sc, double step_time_s, double peak_flops_per_s) {
  return step_figures(static_cast<double>(tokens_per_step(sc)), model_flops_per_token(sc),
                      sc.model.mode == Mode::kTraining, sc.num_gpus(), step_time_s,
                      peak_flops_per_s);
}

}  // namespace moesim::strategies
