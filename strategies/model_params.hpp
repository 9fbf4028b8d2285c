// Parameter count of a model (docs/model.md, "Parameters"), by part, as model cards state it:
// what checks an imported or hand-written `model:` against the published total ("671B",
// "46.7B"). Uses the weights strategies/memory.cpp holds (attention by head layout, SwiGLU /
// GELU FFNs, RMSNorm vectors, the gates, embeddings), counted once for the whole model, with no
// parallel split. Biases, attention sinks, QK-norms and vision encoders are not modelled and not
// counted.
#pragma once

#include "core/scenario.hpp"

namespace moesim::strategies {

struct ModelParams {
  double embedding = 0;       // V M, the input embedding
  double lm_head = 0;         // V M when untied (tied: the embedding, counted once)
  double attention = 0;       // every block's projections (MHA / GQA / MLA)
  double norms = 0;           // every block's RMSNorm weights (MLA's latent norms too), final norm
  double dense_ffn = 0;       // the dense blocks' FFNs
  double gates = 0;           // M E per MoE block
  double routed_experts = 0;  // E experts of width H per MoE block
  double shared_experts = 0;  // N shared experts of width H per MoE block
  // The model card's total: all of the above. Multi-token-prediction modules are not in it (cards
  // state totals without them: DeepSeek-V3's 671B leaves its 11.6B MTP module out).
  double total = 0;
  // Parameters one token uses: total less the routed experts it is not sent to (top_k of E per
  // MoE block), embedding and LM head included, as Mixtral's (12.9B), Qwen's and OLMoE's cards
  // count them. DeepSeek's and gpt-oss's cards leave the input embedding out (a lookup, no
  // GEMM): active_without_embedding() (DeepSeek-V3: 36.6B of the 37B quoted).
  double active = 0;
  // MTP modules (model.mtp_layers): each one block like the last (MoE when it is), the 2M -> M
  // projection and its two input norms; the embedding and the LM head are shared.
  double mtp = 0;

  double active_without_embedding() const { return active - embedding; }
};

ModelParams model_params(const ModelSpec& m);

/// Parameters of one block's attention on one MP rank (docs/model.md, "Memory"): the
/// projections that produce heads split over mp as Megatron splits them; MLA's down-projections
/// to the latents are not (every TP rank holds them whole).
double attention_params(const ModelSpec& m, double mp = 1);
/// One block's norm weights, counted as RMSNorm's (one M-vector each, replicated over mp): the
/// attention's and the FFN's input norms, and MLA's norms of its q and kv latents.
double norm_params(const ModelSpec& m);

/// Bytes of one token's KV cache in one attention layer on one of `mp` tensor-parallel ranks
/// (docs/serving.md, "KV cache"): MLA caches the kv_lora latent and the rope key (every rank
/// whole); MHA / GQA 2 x kv_heads x head_dim, the KV heads split over mp (replicated when there
/// are fewer than mp).
double kv_cache_bytes_per_token(const ModelSpec& m, Dtype kv, int mp = 1);

}  // namespace moesim::strategies
