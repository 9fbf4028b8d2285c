// moesim's memory estimate against Megatron-LM's theoretical memory formulas
// (megatron/training/theoretical_memory_usage.py, re-derived here from its description):
//  - weights and optimizer: the parameters of the most loaded model shard (attention by head
//    layout or MLA, FFNs x 1.5 for SwiGLU, two RMSNorms per layer, MLA's latent norms, the final
//    norm, the embedding and an untied output layer) times 18 bytes (bf16 weights, fp32 main
//    gradients, fp32 master copy and Adam moments), or 6 + 12 / d with the distributed optimizer;
//  - activations (dense GPT, flash attention, selective recompute, no sequence parallelism): per
//    layer s b h (10 + 24 / t) bytes (Korthikanti et al. 2022, "Reducing Activation Recomputation
//    in Large Transformer Models", Table 2, the attention scores recomputed), the embedding's
//    token ids and dropout mask, the final norm's output and the logits, times 1.05 for
//    temporaries.
// Two adjustments, both stated where they are made: Megatron's formula holds every expert on
// every rank (it has no expert parallelism), so the experts are taken per EP rank here, their
// bytes with the expert data-parallel size; and the "10" holds two 1-byte dropout masks, absent
// from the dropout-free models moesim describes (dropout off: 8).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/scenario_loader.hpp"
#include "strategies/memory.hpp"

namespace moesim::strategies {
namespace {

// The arguments of Megatron's formulas.
struct MegatronArgs {
  double hidden = 0, heads = 0, query_groups = 0, kv_channels = 0;
  double ffn_hidden = 0, moe_ffn_hidden = 0, shared_ffn_hidden = 0;
  double experts = 0;  // experts held per rank (see above)
  int layers = 0, moe_layers = 0;
  double vocab = 0;
  bool untied = true, swiglu = true;
  bool mla = false;
  double q_lora = 0, kv_lora = 0, qk_head = 0, qk_rope = 0, v_head = 0;
  int tp = 1, pp = 1;
  double seq = 0, micro_batch = 1;
};

// Parameters of the most loaded shard (the first stage: its layers and the embedding, over tp).
double megatron_shard_params(const MegatronArgs& a, bool experts_only = false) {
  const double h = a.hidden, norm = 1;  // RMSNorm: a weight, no bias
  const double glu = a.swiglu ? 1.5 : 1.0;
  double attn = 0;
  if (a.mla) {
    const double q = a.q_lora > 0 ? a.q_lora * (h + a.heads * (a.qk_head + a.qk_rope) + norm)
                                  : h * a.heads * (a.qk_head + a.qk_rope);
    attn = q + a.kv_lora * (h + a.heads * (a.qk_head + a.v_head) + norm) + h * a.qk_rope +
           a.heads * a.v_head * h;
  } else {
    const double q_ratio = a.kv_channels * a.heads / h;
    attn = 2 * h * h * (1 + a.query_groups / a.heads) * q_ratio;
  }
  const double expert_term = 2 * h * a.moe_ffn_hidden * a.experts * glu;
  if (experts_only) return expert_term * a.moe_layers / a.pp / a.tp;
  const double dense_layer = 2 * h * (a.ffn_hidden * glu + norm) + attn;
  const double moe_layer = 2 * h * (a.shared_ffn_hidden * glu + norm) + attn + expert_term;
  const double block = dense_layer * (a.layers - a.moe_layers) + moe_layer * a.moe_layers +
                       norm * h;  // the final norm
  const double embedding = h * a.vocab;
  double shard = (block / a.pp + embedding) / a.tp;
  if (a.untied && a.pp == 1) shard += embedding / a.tp;
  return shard;
}

double megatron_bytes_per_param(bool distributed_optimizer, double dp) {
  return distributed_optimizer ? 6 + 12 / dp : 18;
}

// Activation bytes of the first stage: dense GPT (ffn 4h), flash attention, selective
// recompute, no sequence parallelism; `dropout`: Megatron's two 1-byte masks per layer and the
// embedding's.
double megatron_activations(const MegatronArgs& a, bool dropout, bool allowance = true) {
  const double sbh = a.seq * a.micro_batch * a.hidden;
  const double t = a.tp;
  double bytes = sbh * ((dropout ? 10 : 8) + 24 / t) * a.layers;
  bytes += 8 * a.seq * a.micro_batch * a.pp;  // token ids (int64)
  if (dropout) bytes += sbh * a.pp;           // the embedding's dropout mask
  if (a.pp == 1) bytes += (a.seq * a.micro_batch * a.vocab / t + sbh) * 2;  // logits, final norm
  return allowance ? bytes * 1.05 : bytes;
}

Scenario preset(const std::string& name) {
  Scenario sc = load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/models/" + name);
  // Compared on one pipeline stage: Megatron's shard averages the layers over the stages, moesim
  // holds whole blocks on each; with pp = 1 both hold the whole model.
  sc.parallelism.pp = 1;
  sc.parallelism.dp = sc.num_gpus() / sc.parallelism.ep;
  sc.model.micro_batches = 1;
  // What Megatron trains with: bf16 weights, fp32 main gradients.
  sc.model.dtype = Dtype::kBf16;
  sc.model.precision.main_grads = Dtype::kFp32;
  sc.model.activation = FfnActivation::kSwiglu;
  return sc;
}

// Megatron's weights + gradients + optimizer for `sc`, and the relative difference to moesim's.
struct Side {
  double megatron = 0, moesim = 0;
  double rel() const { return std::abs(moesim - megatron) / megatron; }
};

Side weights_side_by_side(const Scenario& sc, const MegatronArgs& a) {
  const bool dist = sc.parallelism.zero >= 1;
  const double experts = megatron_shard_params(a, true);
  const double dense = megatron_shard_params(a) - experts;
  Side s;
  s.megatron = dense * megatron_bytes_per_param(dist, dense_replicas(sc)) +
               experts * megatron_bytes_per_param(dist, expert_replicas(sc));
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 1);
  s.moesim = m.weights_bytes + m.gradients_bytes + m.optimizer_bytes;
  return s;
}

void report(const std::string& what, const Side& s) {
  std::printf("%-34s megatron %10.3f GiB  moesim %10.3f GiB  (%+.2f%%)\n", what.c_str(),
              s.megatron / (1 << 30), s.moesim / (1 << 30),
              100 * (s.moesim - s.megatron) / s.megatron);
}

// Mixtral 8x7B: 32 query heads over 8 KV groups of 128, SwiGLU experts of 14,336, EP 8 (one
// expert per GPU), no ZeRO (18 bytes per parameter).
TEST(MegatronMemory, MixtralWeightsGradientsOptimizer) {
  Scenario sc = preset("mixtral-8x7b.yaml");
  sc.model.attention = AttentionSpec{AttentionKind::kMha, 32, 8, 128};
  sc.model.hidden_dim = 14336;
  MegatronArgs a;
  a.hidden = 4096, a.heads = 32, a.query_groups = 8, a.kv_channels = 128;
  a.moe_ffn_hidden = 14336, a.experts = 8.0 / sc.parallelism.ep;
  a.layers = a.moe_layers = 32, a.vocab = 32000;
  const Side s = weights_side_by_side(sc, a);
  report("mixtral-8x7b (EP 8, 18 B/param)", s);
  EXPECT_LT(s.rel(), 0.05);
  sc.parallelism.zero = 1;  // the distributed optimizer: 64 dense / 8 expert replicas
  const Side z = weights_side_by_side(sc, a);
  report("mixtral-8x7b (distributed optim.)", z);
  EXPECT_LT(z.rel(), 0.05);
}

// Qwen3-235B-A22B: 64 query heads over 4 KV groups of 128 (a query width of 8,192 > M), SwiGLU
// experts of 1,536, EP 64 (2 experts per GPU).
TEST(MegatronMemory, Qwen3WeightsGradientsOptimizer) {
  Scenario sc = preset("qwen3-235b-a22b.yaml");
  sc.model.attention = AttentionSpec{AttentionKind::kMha, 64, 4, 128};
  sc.model.hidden_dim = 1536;
  MegatronArgs a;
  a.hidden = 4096, a.heads = 64, a.query_groups = 4, a.kv_channels = 128;
  a.moe_ffn_hidden = 1536, a.experts = 128.0 / sc.parallelism.ep;
  a.layers = a.moe_layers = 94, a.vocab = 151936;
  const Side s = weights_side_by_side(sc, a);
  report("qwen3-235b-a22b (EP 64, 18 B/param)", s);
  EXPECT_LT(s.rel(), 0.05);
}

// DeepSeek-V3: MLA (128 heads, q_lora 1,536, kv_lora 512, nope 128, rope 64, v 128), 3 dense
// blocks of 18,432, 58 MoE blocks of 256 experts of 2,048 plus one shared, EP 64 and the
// distributed optimizer as published (ZeRO-1: 2,048 dense / 32 expert replicas at pp = 1).
TEST(MegatronMemory, DeepSeekV3WeightsGradientsOptimizer) {
  Scenario sc = preset("deepseek-v3.yaml");
  AttentionSpec& at = sc.model.attention;
  at = AttentionSpec{};
  at.kind = AttentionKind::kMla;
  at.heads = at.kv_heads = 128;
  at.q_lora_rank = 1536, at.kv_lora_rank = 512;
  at.qk_nope_head_dim = 128, at.qk_rope_head_dim = 64, at.v_head_dim = 128;
  sc.model.hidden_dim = 2048;
  sc.model.dense_hidden_dim = 18432;
  // Megatron's formula counts fp32 Adam moments; the preset keeps DeepSeek-V3's bf16 ones.
  sc.model.precision.moments = Dtype::kFp32;
  ASSERT_EQ(sc.parallelism.zero, 1);
  MegatronArgs a;
  a.hidden = 7168, a.heads = 128, a.mla = true;
  a.q_lora = 1536, a.kv_lora = 512, a.qk_head = 128, a.qk_rope = 64, a.v_head = 128;
  a.ffn_hidden = 18432, a.moe_ffn_hidden = 2048, a.shared_ffn_hidden = 2048;
  a.experts = 256.0 / sc.parallelism.ep;
  a.layers = 61, a.moe_layers = 58, a.vocab = 129280;
  const Side s = weights_side_by_side(sc, a);
  report("deepseek-v3 (EP 64, distributed optim.)", s);
  EXPECT_LT(s.rel(), 0.05);
}

// Activations of a dense GPT (M 4,096, 32 heads of 128, 4M FFN with GeLU, 32 layers, V 50,304,
// sequence 4,096, one sample per micro-batch, bf16) with core-attention recomputation, at t = 1
// and t = 2. moesim keeps per layer the two norms' inputs and outputs (8 s b h), Q, K, V, the
// core's output and the FFN's two 4h-wide tensors (24 s b h / t), the 4-byte logsumexp, and the
// final norm's input, the head's input and the logits: Megatron's dropout-free formula without
// its 1.05 allowance to 0.5% (moesim also keeps the final norm's input), and within 5% of it with
// the allowance.
TEST(MegatronMemory, DenseGptActivationsWithSelectiveRecompute) {
  for (int t : {1, 2}) {
    Scenario sc = parse_scenario_string(fmt::format(R"(name: gpt
cluster:
  gpu: h100-sxm
  nodes: 1
  gpus_per_node: 8
  intra_node: {{kind: nvswitch}}
  inter_node: {{kind: none}}
model:
  mode: training
  layers: 32
  first_dense_layers: 31
  moe_every: 1
  batch_per_gpu: 1
  seq_len: 4096
  model_dim: 4096
  hidden_dim: 16384
  experts_per_gpu: 1
  vocab_size: 50304
  tie_embeddings: true
  dtype: bf16
  recompute: {{granularity: selective, modules: [core_attn]}}
parallelism: {{mp: {}, dp: 1}}
strategies:
  - {{name: base}}
)",
                                                    t),
                                        "gpt.yaml");
    sc.model.first_dense_layers = sc.model.layers;  // dense only: no MoE block
    ASSERT_EQ(sc.model.num_moe_layers(), 0);
    MegatronArgs a;
    a.hidden = 4096, a.heads = 32, a.kv_channels = 128, a.query_groups = 32;
    a.ffn_hidden = 16384, a.layers = 32, a.vocab = 50304, a.tp = t, a.seq = 4096;
    a.untied = false, a.swiglu = false;
    const MemoryEstimate m = estimate_memory(sc, Decision{}, 1);
    const Side raw{megatron_activations(a, false, false), m.activations_bytes};
    const Side with{megatron_activations(a, false), m.activations_bytes};
    const Side dropout{megatron_activations(a, true), m.activations_bytes};
    report(fmt::format("GPT activations t={} (no 1.05)", t), raw);
    report(fmt::format("GPT activations t={}", t), with);
    report(fmt::format("GPT activations t={} (dropout)", t), dropout);
    EXPECT_LT(raw.rel(), 0.005) << "t " << t;
    EXPECT_LT(with.rel(), 0.05) << "t " << t;
  }
}

}  // namespace
}  // namespace moesim::strategies
