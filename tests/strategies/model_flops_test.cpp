// Model FLOPs (strategies/model_flops.hpp) against numbers worked out by hand from Megatron-LM's
// definition (docs/figures.md), and DeepSeek-V3 against Megatron-Bridge's published throughput.
#include "strategies/model_flops.hpp"

#include <gtest/gtest.h>

namespace moesim::strategies {
namespace {

// Two MoE blocks (M 16, H 32, top-2), MHA of 2 heads x 8, L 8, causal, gelu, no vocabulary.
ModelSpec tiny_mha() {
  ModelSpec m;
  m.layers = 2;
  m.seq_len = 8;
  m.batch_per_gpu = 1;
  m.model_dim = 16;
  m.hidden_dim = 32;
  m.experts = 4;
  m.top_k = 2;
  m.attention.heads = 2;
  m.attention.kv_heads = 2;
  m.attention.head_dim = 8;
  return m;
}

TEST(ModelFlops, TinyMhaByHand) {
  const ModelFlops f = model_flops(tiny_mha());
  // Per block: Q, K, V and the output 2*16*(16 + 2*16) + 2*16*16 = 2,048 (8 M^2); the causal core
  // 2 * (8/2 keys) * 16 * 2 = 256 (half of 4 L M); the two experts 2 * 2*16*32 * 2 = 4,096.
  EXPECT_DOUBLE_EQ(f.attention_projections, 2 * 2048.0);
  EXPECT_DOUBLE_EQ(f.attention_core, 2 * 256.0);
  EXPECT_DOUBLE_EQ(f.routed_experts, 2 * 4096.0);
  EXPECT_DOUBLE_EQ(f.dense_ffn, 0);
  EXPECT_DOUBLE_EQ(f.shared_experts, 0);
  EXPECT_DOUBLE_EQ(f.logits, 0);
  EXPECT_DOUBLE_EQ(f.forward(), 12800);
  EXPECT_DOUBLE_EQ(f.training(), 38400);  // forward + 2x backward
}

TEST(ModelFlops, GqaNonCausalDenseBlock) {
  ModelSpec m = tiny_mha();
  m.layers = 1;
  m.first_dense_layers = 1;  // the only block is dense: FFN of 4 M = 256
  m.model_dim = 64;
  m.seq_len = 32;
  m.attention.heads = 8;
  m.attention.kv_heads = 2;  // GQA: K and V 2 x 8 = 16 wide
  m.attention.head_dim = 8;
  m.attention.causal = false;
  const ModelFlops f = model_flops(m);
  // Q 64 wide, K and V 16 each: 2*64*(64 + 32) + 2*64*64 = 20,480.
  EXPECT_DOUBLE_EQ(f.attention_projections, 20480);
  // Not causal: every one of the 32 keys, QK^T and softmax x V over the 64-wide queries.
  EXPECT_DOUBLE_EQ(f.attention_core, 2 * 32 * 64 * 2.0);
  EXPECT_DOUBLE_EQ(f.dense_ffn, 2 * 64 * 256 * 2.0);
  EXPECT_DOUBLE_EQ(f.routed_experts, 0);
  EXPECT_DOUBLE_EQ(f.forward(), 20480 + 8192 + 65536);
  m.attention.causal = true;
  EXPECT_DOUBLE_EQ(model_flops(m).attention_core, 4096);
}

TEST(ModelFlops, MlaByHand) {
  ModelSpec m = tiny_mha();
  m.layers = 1;
  m.model_dim = 32;
  m.seq_len = 16;
  AttentionSpec& a = m.attention;
  a.kind = AttentionKind::kMla;
  a.heads = 4;
  a.kv_heads = 4;
  a.head_dim = 0;
  a.q_lora_rank = 8;
  a.kv_lora_rank = 4;
  a.qk_nope_head_dim = 4;
  a.qk_rope_head_dim = 2;
  a.v_head_dim = 4;
  // q: 8 * (32 + 4*6 + 1) = 456; kv: 4 * (32 + 4*(4 + 4) + 1) + 32*2 = 324; out 4*4*32 = 512.
  ModelFlops f = model_flops(m);
  EXPECT_DOUBLE_EQ(f.attention_projections, 2 * (456 + 324 + 512.0));
  // Causal: 8 keys; QK^T over 4 heads x 6, softmax x V over 4 heads x 4.
  EXPECT_DOUBLE_EQ(f.attention_core, 2 * 8 * 4 * 6 + 2 * 8 * 4 * 4.0);
  // Without the query latent, queries come from M directly: 32 * 4 * 6 = 768.
  a.q_lora_rank = 0;
  f = model_flops(m);
  EXPECT_DOUBLE_EQ(f.attention_projections, 2 * (768 + 324 + 512.0));
}

TEST(ModelFlops, SwigluSharedExpertsDenseFirstLayersAndLogits) {
  ModelSpec m;
  m.layers = 5;
  m.first_dense_layers = 1;
  m.moe_every = 2;  // MoE blocks 2 and 4; dense blocks 0, 1, 3
  m.seq_len = 4;
  m.batch_per_gpu = 1;
  m.model_dim = 16;
  m.hidden_dim = 8;
  m.dense_hidden_dim = 48;
  m.experts = 4;
  m.top_k = 2;
  m.shared_experts = 1;
  m.vocab_size = 100;
  m.activation = FfnActivation::kSwiglu;
  m.attention.heads = 1;  // the loader's default for M = 16: one head of 16
  m.attention.kv_heads = 1;
  m.attention.head_dim = 16;
  ASSERT_EQ(m.num_moe_layers(), 2);
  const ModelFlops f = model_flops(m);
  EXPECT_DOUBLE_EQ(f.attention_projections, 5 * 8 * 16 * 16.0);
  EXPECT_DOUBLE_EQ(f.attention_core, 5 * 2 * 2 * 16 * 2.0);
  // SwiGLU: three M x h matrices (Megatron's 3/2 on gelu's two).
  EXPECT_DOUBLE_EQ(f.dense_ffn, 3 * 2 * 16 * 48 * 3.0);
  EXPECT_DOUBLE_EQ(f.routed_experts, 2 * 2 * 16 * 8 * 2 * 3.0);
  EXPECT_DOUBLE_EQ(f.shared_experts, 2 * 2 * 16 * 8 * 1 * 3.0);
  EXPECT_DOUBLE_EQ(f.logits, 2 * 16 * 100.0);
  EXPECT_DOUBLE_EQ(f.forward(), 32512);
  EXPECT_DOUBLE_EQ(f.training(), 97536);
}

// One MTP module (model.mtp_layers 1) on the model above: a sixth block, MoE like block 4, its
// 2M -> M projection among the attention projections and a second pass through the LM head.
// Inference drops it.
TEST(ModelFlops, MtpModuleCountsABlockAProjectionAndAHeadPass) {
  ModelSpec m;
  m.layers = 5;
  m.first_dense_layers = 1;
  m.moe_every = 2;
  m.seq_len = 4;
  m.batch_per_gpu = 1;
  m.model_dim = 16;
  m.hidden_dim = 8;
  m.dense_hidden_dim = 48;
  m.experts = 4;
  m.top_k = 2;
  m.shared_experts = 1;
  m.vocab_size = 100;
  m.activation = FfnActivation::kSwiglu;
  m.attention.heads = 1;
  m.attention.kv_heads = 1;
  m.attention.head_dim = 16;
  m.mtp_layers = 1;
  ASSERT_EQ(m.num_blocks(), 6);
  ASSERT_EQ(m.num_moe_layers(), 3);
  ASSERT_TRUE(m.is_moe_block(5));
  ASSERT_EQ(m.moe_layer_of_block(5), 2);
  const ModelFlops f = model_flops(m);
  EXPECT_DOUBLE_EQ(f.attention_projections, 6 * 8 * 16 * 16.0 + 2 * 32 * 16.0);
  EXPECT_DOUBLE_EQ(f.attention_core, 6 * 2 * 2 * 16 * 2.0);
  EXPECT_DOUBLE_EQ(f.dense_ffn, 3 * 2 * 16 * 48 * 3.0);
  EXPECT_DOUBLE_EQ(f.routed_experts, 3 * 2 * 16 * 8 * 2 * 3.0);
  EXPECT_DOUBLE_EQ(f.shared_experts, 3 * 2 * 16 * 8 * 1 * 3.0);
  EXPECT_DOUBLE_EQ(f.logits, 2 * 2 * 16 * 100.0);
  EXPECT_DOUBLE_EQ(f.forward(), 41216);
  m.mode = Mode::kInference;
  EXPECT_EQ(m.num_moe_layers(), 2);
  EXPECT_DOUBLE_EQ(model_flops(m).forward(), 32512);
}

// DeepSeek-V3 without MTP at seq 4,096 (its published config): 61 blocks, the first 3 dense
// (18,432), 256 experts of 2,048, top-8, 1 shared; MLA of 128 heads, q_lora 1,536, kv_lora 512,
// nope 128, rope 64, v 128; vocabulary 129,280. Megatron-Bridge's performance summary reports
// 782 model TFLOP/s/GPU at 3,139 tokens/s/GPU for it: 2.4912e11 FLOPs per token.
TEST(ModelFlops, DeepSeekV3MatchesMegatronBridgesPublishedFigure) {
  ModelSpec m;
  m.layers = 61;
  m.first_dense_layers = 3;
  m.seq_len = 4096;
  m.batch_per_gpu = 1;
  m.model_dim = 7168;
  m.dense_hidden_dim = 18432;
  m.hidden_dim = 2048;
  m.experts = 256;
  m.top_k = 8;
  m.shared_experts = 1;
  m.vocab_size = 129280;
  m.activation = FfnActivation::kSwiglu;
  AttentionSpec& a = m.attention;
  a.kind = AttentionKind::kMla;
  a.heads = a.kv_heads = 128;
  a.q_lora_rank = 1536;
  a.kv_lora_rank = 512;
  a.qk_nope_head_dim = 128;
  a.qk_rope_head_dim = 64;
  a.v_head_dim = 128;
  const ModelFlops f = model_flops(m);
  // By hand (per token, forward, all 61 blocks): projections 61 x 2 x (48,760,320 + 20,906,496 +
  // 117,440,512), core 61 x 2 x 2,048 x 128 x (192 + 128), dense 3 x 6 x 7,168 x 18,432, routed
  // 58 x 6 x 7,168 x 2,048 x 8, shared 58 x 6 x 7,168 x 2,048, logits 2 x 7,168 x 129,280.
  EXPECT_DOUBLE_EQ(f.attention_projections, 22827094016.0);
  EXPECT_DOUBLE_EQ(f.attention_core, 10234101760.0);
  EXPECT_DOUBLE_EQ(f.dense_ffn, 2378170368.0);
  EXPECT_DOUBLE_EQ(f.routed_experts, 40869298176.0);
  EXPECT_DOUBLE_EQ(f.shared_experts, 5108662272.0);
  EXPECT_DOUBLE_EQ(f.logits, 1853358080.0);
  EXPECT_DOUBLE_EQ(f.training(), 249812054016.0);
  // 0.28% above the published ratio (782 and 3,139 are rounded to 0.06% and 0.02%).
  const double published = 782e12 / 3139;
  EXPECT_NEAR(f.training() / published, 1.0, 0.005);
}

TEST(ModelFlops, TokensPerStepAndFigures) {
  Scenario sc;
  sc.cluster.nodes = 4;
  sc.cluster.gpus_per_node = 8;  // P = 32
  sc.model = tiny_mha();
  sc.model.batch_per_gpu = 2;
  sc.model.micro_batches = 3;
  sc.parallelism.pp = 2;
  sc.parallelism.mp = 2;
  // 2 x 8 tokens x 3 micro-batches on each of 32 / (2 x 2) = 8 MP groups.
  EXPECT_EQ(tokens_per_step(sc), 384);
  sc.parallelism.layout = MpLayout::kOverlapped;  // the MP blocks share their tokens too
  EXPECT_EQ(tokens_per_step(sc), 384);

  StepFigures s = step_figures(sc, 0.5, 1e6);
  EXPECT_DOUBLE_EQ(s.tokens_per_step, 384);
  EXPECT_DOUBLE_EQ(s.tokens_per_s_per_gpu, 24);  // 384 / 0.5 s / 32
  EXPECT_TRUE(s.has_model_flops);
  EXPECT_DOUBLE_EQ(s.model_flops_per_token, 38400);
  EXPECT_DOUBLE_EQ(s.model_flops_per_s_per_gpu, 24 * 38400.0);
  EXPECT_DOUBLE_EQ(s.mfu, 24 * 38400.0 / 1e6);
  EXPECT_DOUBLE_EQ(step_figures(sc, 0.5, 0).mfu, 0);  // unknown peak

  sc.model.mode = Mode::kInference;  // a forward pass: tokens/s/GPU only
  s = step_figures(sc, 0.5, 1e6);
  EXPECT_DOUBLE_EQ(s.tokens_per_s_per_gpu, 24);
  EXPECT_FALSE(s.has_model_flops);
  EXPECT_DOUBLE_EQ(s.model_flops_per_token, 12800);
  EXPECT_DOUBLE_EQ(s.model_flops_per_s_per_gpu, 0);
  EXPECT_DOUBLE_EQ(s.mfu, 0);
}

}  // namespace
}  // namespace moesim::strategies
