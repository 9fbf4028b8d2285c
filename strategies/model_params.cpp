#include "strategies/model_params.hpp"

#include <algorithm>
#include <cstdint>

namespace moesim::strategies {
double attention_params(const ModelSpec& m, double mp) {
  const auto& a = m.attention;
  const double M = m.model_dim, h = a.heads;
  if (!a.is_mla()) {
    const double d = a.head_dim, kv = a.kv_heads;
    return (M * h * d + 2 * M * kv * d + h * d * M) / mp;
  }
  const double qk = a.qk_head_dim(), v = a.v_head_dim, rope = a.qk_rope_head_dim;
  const double q_lora = a.q_lora_rank, kv_lora = a.kv_lora_rank;
  // Down-projections to the latents (and the shared RoPE key), replicated over mp; the per-head
  // up-projections and the output projection, split.
  const double down = (q_lora > 0 ? M * q_lora : 0) + M * (kv_lora + rope);
  const double up = (q_lora > 0 ? q_lora * h * qk : M * h * qk) +
                    kv_lora * h * (a.qk_nope_head_dim + v) + h * v * M;
  return down + up / mp;
}

double norm_params(const ModelSpec& m) {
  const auto& a = m.attention;
  return 2.0 * m.model_dim + (a.is_mla() ? a.q_lora_rank + a.kv_lora_rank : 0.0);
}

ModelParams model_params(const ModelSpec& m) {
  const double M = m.model_dim, E = m.experts, V = m.vocab_size;
  const double expert = static_cast<double>(m.ffn_params(m.hidden_dim));
  const double shared =
      static_cast<double>(m.ffn_params(static_cast<std::int64_t>(m.shared_experts) * m.hidden_dim));
  const double block = attention_params(m) + norm_params(m);
  int moe = 0;
  for (int l = 0; l < m.layers; ++l) moe += m.is_moe_block(l) ? 1 : 0;
  const int dense = m.layers - moe;

  ModelParams p;
  p.embedding = V * M;
  p.lm_head = m.tie_embeddings ? 0 : V * M;
  p.attention = m.layers * attention_params(m);
  p.norms = m.layers * norm_params(m) + (V > 0 ? M : 0);  // the final norm sits with the head
  p.dense_ffn = dense * static_cast<double>(m.ffn_params(m.dense_hidden()));
  p.gates = moe * M * E;
  p.routed_experts = moe * E * expert;
  p.shared_experts = moe * shared;
  p.total = p.embedding + p.lm_head + p.attention + p.norms + p.dense_ffn + p.gates +
            p.routed_experts + p.shared_experts;
  p.active = p.total - (E > 0 ? p.routed_experts * (1.0 - m.top_k / E) : 0.0);
  // MTP blocks follow the last block's kind (ModelSpec::is_moe_block); counted whatever the
  // mode, as they are in the checkpoint.
  const bool mtp_moe = m.layers > 0 && m.is_moe_block(m.layers - 1);
  const double mtp_ffn =
      mtp_moe ? M * E + E * expert + shared : static_cast<double>(m.ffn_params(m.dense_hidden()));
  p.mtp = m.mtp_layers * (block + mtp_ffn + 2 * M * M + 2 * M);
  return p;
}

double kv_cache_bytes_per_token(const ModelSpec& m, Dtype kv, int mp) {
  const AttentionSpec& a = m.attention;
  const double bytes = dtype_bytes(kv);
  if (a.is_mla()) return static_cast<double>(a.kv_lora_rank + a.qk_rope_head_dim) * bytes;
  const int heads_per_rank = std::max(1, (a.kv_heads + mp - 1) / std::max(1, mp));
  return 2.0 * heads_per_rank * a.head_dim * bytes;
}

}  // namespace moesim::strategies
