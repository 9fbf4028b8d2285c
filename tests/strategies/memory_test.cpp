// The per-GPU memory estimate (strategies/memory.hpp, docs/model.md "Memory"): every part
// hand-computed on a tiny model, and how it moves with batch, hidden size, packing and sharding.
#include "strategies/memory.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/runner.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

// 2 GPUs, ep 2; 2 blocks, the second MoE (1 MoE + 1 dense); S = B L = 1 x 4, M 8, H 16,
// 2 experts (1 per GPU), top-1, f 1: dC = ceil(1 x 1 x 4 / 2) = 2.
Scenario tiny(const std::string& mode = "training", int batch = 1, int hidden = 16,
              int experts_per_gpu = 1, const std::string& extra_strategy = "") {
  return parse_scenario_string(fmt::format(R"(name: mem
cluster:
  gpu: a100-sxm-40gb
  nodes: 1
  gpus_per_node: 2
  intra_node: {{kind: nvswitch}}
  inter_node: {{kind: none}}
model:
  mode: {}
  layers: 2
  moe_every: 2
  batch_per_gpu: {}
  seq_len: 4
  model_dim: 8
  hidden_dim: {}
  experts_per_gpu: {}
  top_k: 1
  capacity_factor: 1.0
  dtype: fp16
strategies:
  - {{name: base}}
{}
)",
                                           mode, batch, hidden, experts_per_gpu, extra_strategy),
                               "mem.yaml");
}

// The tiny model's attention: 128 does not divide M = 8, so one head of width 8 (h d = M, the
// 4 M^2 of MHA). Every activation below is in bytes (fp16: b = 2; S M = 32 elements = 64 B).
TEST(MemoryEstimate, TinyTrainingEveryPartByHand) {
  const Scenario sc = tiny();
  ASSERT_EQ(nominal_capacity(sc), 2);
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  // Dense: attention 4 M^2 x 2 blocks = 512, norm weights 2 M x 2 blocks = 32, dense FFN (gelu,
  // 4 M) 2 M x 32 = 512, gate M E = 16 -> 1,072.
  EXPECT_DOUBLE_EQ(m.dense_params, 1072);
  // Experts: 1 MoE layer x 1 local expert x 2 M H = 256.
  EXPECT_DOUBLE_EQ(m.expert_params, 256);
  // fp16 weights and (main_grads defaulting to fp16) gradients 2 bytes, Adam 12 bytes (master
  // copy + two moments) per parameter (1,328 parameters).
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2656);
  EXPECT_DOUBLE_EQ(m.gradients_bytes, 2656);
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, 15936);
  // Activations. Attention per block: norm input 64 + norm output 64 + Q, K, V 3 x 64 + O 64 +
  // fp32 logsumexp S h x 4 = 16 -> 400, x 2 blocks = 800. Dense FFN: norm input 64 + fc1 input
  // 64 + fc1 output S 4M x 2 = 256 + activation output 256 = 640. MoE (R = E dC = 4 rows): norm
  // input 64 + gate input 64 + probabilities S E x 2 = 16 + rows R M x 2 = 64 + fc1 output
  // R H x 2 = 128 + activation output 128 + expert outputs R M x 2 = 64 -> 528. 1,968 in all.
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1968);
  // Buffers: dispatch and combine send buffers, R M x (2 + 2) bytes.
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128);
  EXPECT_DOUBLE_EQ(m.total_bytes(), 2656 + 2656 + 15936 + 1968 + 128);
  EXPECT_EQ(m.capacity, 2);
  EXPECT_EQ(m.stage, 0);
  EXPECT_EQ(m.in_flight, 1);
}

// A dropless layer (Megatron-Core's grouped MLP, DeepSeek-V3) multiplies each row's probability
// into the activation instead of weighting the expert outputs in the combine: the R M x 2 = 64
// bytes of expert outputs give way to R = 4 fp32 probabilities (16 bytes), 1,968 - 48 = 1,920.
// Nothing else moves (dC is what the caller passes).
TEST(MemoryEstimate, DroplessKeepsTheRowsProbabilitiesNotTheExpertOutputs) {
  Scenario sc = tiny();
  sc.model.capacity_factor = 0;
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1968 - 64 + 16);
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2656);
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128);
  // moe recomputation drops the whole layer's tensors either way: 528 - 64 - 64 (the norm
  // output as the gate's input stays: the checkpoint's input) -> the same figure both ways.
  sc.model.recompute = {RecomputeGranularity::kSelective, {RecomputeModule::kMoe}};
  Scenario capped = sc;
  capped.model.capacity_factor = 1.0;
  EXPECT_DOUBLE_EQ(estimate_memory(sc, Decision{}, 2).activations_bytes,
                   estimate_memory(capped, Decision{}, 2).activations_bytes);
}

// dense_hidden_dim = 8 (instead of 4 M = 32) on the tiny model: the dense FFN's 2 M Hd = 128
// parameters replace 512, and its activations 64 + 64 + 2 x (S Hd x 2 = 64) = 256 bytes replace
// 640.
TEST(MemoryEstimate, DenseHiddenDimSizesTheDenseFfn) {
  const Scenario base = tiny();
  Scenario sc = base;
  sc.model.dense_hidden_dim = 8;
  const MemoryEstimate a = estimate_memory(base, Decision{}, 2);
  const MemoryEstimate b = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(b.dense_params, 1072 - 512 + 128);
  EXPECT_DOUBLE_EQ(b.expert_params, a.expert_params);
  EXPECT_DOUBLE_EQ(b.activations_bytes, 1968 - (640 - 256));
}

// shared_experts = 2 on the tiny model (H 16): one MoE block gains 2 M (2 H) = 512 dense
// parameters and S (2 H) x 2 bytes twice = 512 bytes (fc1's and the activation's outputs; their
// input is the gate's).
TEST(MemoryEstimate, SharedExpertsAreDenseParameters) {
  const Scenario base = tiny();
  Scenario sc = base;
  sc.model.shared_experts = 2;
  const MemoryEstimate a = estimate_memory(base, Decision{}, 2);
  const MemoryEstimate b = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(b.dense_params, a.dense_params + 512);
  EXPECT_DOUBLE_EQ(b.expert_params, a.expert_params);
  EXPECT_DOUBLE_EQ(b.activations_bytes, a.activations_bytes + 512);
}

// vocab_size = 10 on the tiny model (M 8, S 4): tied, V M = 80 more dense parameters plus the
// final norm's 8 (168 untied); activations gain the final norm's input and the LM head's input
// (2 S M x 2 = 128 bytes) and the logits (S V x 2 = 80 bytes).
TEST(MemoryEstimate, VocabularyAddsEmbeddingAndLogits) {
  const Scenario base = tiny();
  Scenario sc = base;
  sc.model.vocab_size = 10;
  const MemoryEstimate a = estimate_memory(base, Decision{}, 2);
  const MemoryEstimate b = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(b.dense_params, a.dense_params + 88);
  EXPECT_DOUBLE_EQ(b.activations_bytes, a.activations_bytes + 208);
  sc.model.tie_embeddings = false;
  EXPECT_DOUBLE_EQ(estimate_memory(sc, Decision{}, 2).dense_params, a.dense_params + 168);
}

TEST(MemoryEstimate, InferenceHoldsWeightsAndOneBlock) {
  const MemoryEstimate m = estimate_memory(tiny("inference"), Decision{}, 2);
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2656);
  EXPECT_DOUBLE_EQ(m.gradients_bytes, 0);
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, 0);
  // The larger block: attention 400 + dense FFN 640 = 1,040 bytes (MoE block: 400 + 528).
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1040);
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128);
}

// MLA on the tiny model: 2 heads, q_lora 4, kv_lora 4, nope 2, rope 2, v 2. Parameters per block:
// down-projections M q_lora = 32 and M (kv_lora + rope) = 48, up-projections q_lora h (nope +
// rope) = 32 and kv_lora h (nope + v) = 32, out projection h v M = 32 -> 176 (MHA: 256); norms
// 2 M + q_lora + kv_lora = 24 (MHA: 16). Activations per block: norm input 64 + output 64, the
// latents' norms S (4 + 4) x (2 + 2) = 128, Q and K S h (nope + rope) x 2 = 64 each, V S h v x 2
// = 32, O 32, logsumexp S h x 4 = 32 -> 480 (MHA: 400). mla_up_proj drops Q, K, V (160).
TEST(MemoryEstimate, MlaHeadsByHand) {
  const Scenario base = tiny();
  Scenario sc = base;
  auto& a = sc.model.attention;
  a.kind = AttentionKind::kMla;
  a.heads = a.kv_heads = 2;
  a.head_dim = 0;
  a.q_lora_rank = 4;
  a.kv_lora_rank = 4;
  a.qk_nope_head_dim = 2;
  a.qk_rope_head_dim = 2;
  a.v_head_dim = 2;
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(m.dense_params, 1072 + 2 * ((176 + 24) - (256 + 16)));
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1968 + 2 * (480 - 400));
  sc.model.recompute.granularity = RecomputeGranularity::kSelective;
  sc.model.recompute.modules = {RecomputeModule::kMlaUpProj};
  EXPECT_DOUBLE_EQ(estimate_memory(sc, Decision{}, 2).activations_bytes,
                   1968 + 2 * (480 - 400 - 160));
  // q_lora_rank 0: queries straight from M, M h (nope + rope) = 64 split parameters instead of
  // 32 + 32, no q latent norm (4 fewer norm weights, S q_lora x 4 = 64 fewer bytes).
  sc.model.recompute = RecomputeSpec{};
  a.q_lora_rank = 0;
  const MemoryEstimate q = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(q.dense_params, m.dense_params - 2 * 4);
  EXPECT_DOUBLE_EQ(q.activations_bytes, m.activations_bytes - 2 * 64);
}

// Mp 2 splits the head projections, MLA's down-projections stay whole on every rank.
TEST(MemoryEstimate, MlaDownProjectionsAreNotSplitOverMp) {
  Scenario sc = tiny();
  auto& a = sc.model.attention;
  a.kind = AttentionKind::kMla;
  a.heads = a.kv_heads = 2;
  a.q_lora_rank = a.kv_lora_rank = 4;
  a.qk_nope_head_dim = a.qk_rope_head_dim = a.v_head_dim = 2;
  const double one = estimate_memory(sc, Decision{}, 2).dense_params;
  sc.parallelism.mp = 2;
  sc.parallelism.ep = 1;
  sc.model.experts = 1;
  const double two = estimate_memory(sc, Decision{}, 2).dense_params;
  // Per block: the 96 split parameters halve (48 less), the 80 down-projection ones do not; the
  // dense FFN's 512 halve; the gate loses M (E 2 -> 1).
  EXPECT_DOUBLE_EQ(one - two, 2 * 48 + 256 + 8);
}

// SwiGLU on the tiny model: experts 3 M H = 384 (gelu: 256), the dense FFN 3 M 4M = 768 (512);
// fc1's outputs are twice as wide: dense S 2 x 32 x 2 = 512 bytes (256), experts R 2 H x 2 = 256
// (128).
TEST(MemoryEstimate, SwigluWidensFc1) {
  Scenario sc = tiny();
  sc.model.activation = FfnActivation::kSwiglu;
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(m.expert_params, 384);
  EXPECT_DOUBLE_EQ(m.dense_params, 1072 - 512 + 768);
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1968 + 256 + 128);
}

// fp8 GEMMs keep their inputs at 1 byte: the QKV input (norm output) 64 -> 32 but the out
// projection keeps its own 1-byte copy of O (+32): attention unchanged; dense FFN: fc1 input
// 64 -> 32, fc2 input 256 -> 128; MoE: rows 64 -> 32, fc2 input 128 -> 64 (the gate stays at
// dtype). 1,968 - 160 - 96 = 1,712.
TEST(MemoryEstimate, Fp8GemmsCacheTheirInputsAtOneByte) {
  Scenario sc = tiny();
  sc.model.precision.gemm = Dtype::kFp8;
  EXPECT_DOUBLE_EQ(estimate_memory(sc, Decision{}, 2).activations_bytes, 1712);
  // fp8 dispatch and combine: 1 byte plus DeepEP's fp32 scale per 128 elements.
  sc.model.precision.dispatch = sc.model.precision.combine = Dtype::kFp8;
  EXPECT_DOUBLE_EQ(estimate_memory(sc, Decision{}, 2).buffers_bytes, 2 * 32 * (1 + 4.0 / 128));
}

TEST(MemoryEstimate, FullRecomputeKeepsBlockInputsAndOneBlock) {
  Scenario sc = tiny();
  sc.model.recompute.granularity = RecomputeGranularity::kFull;
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  // The 2 blocks' inputs S M x 2 = 64 each, plus the larger block's own activations during its
  // backward: attention 400 + dense FFN 640.
  EXPECT_DOUBLE_EQ(m.activations_bytes, 2 * 64 + 1040);
  EXPECT_EQ(m.recompute, RecomputeGranularity::kFull);
}

TEST(MemoryEstimate, SelectiveRecomputeDropsEachModulesTensors) {
  const auto with = [](std::vector<RecomputeModule> mods) {
    Scenario sc = tiny();
    sc.model.recompute.granularity = RecomputeGranularity::kSelective;
    sc.model.recompute.modules = std::move(mods);
    return estimate_memory(sc, Decision{}, 2).activations_bytes;
  };
  // core_attn: the logsumexp (16 per block; O stays, it is the out projection's input).
  EXPECT_DOUBLE_EQ(with({RecomputeModule::kCoreAttn}), 1968 - 2 * 16);
  // layernorm: the norm outputs (QKV 64 x 2 blocks, fc1 64, gate 64).
  EXPECT_DOUBLE_EQ(with({RecomputeModule::kLayernorm}), 1968 - 128 - 64 - 64);
  // moe_act: the expert activation's output (fc2's input, 128).
  EXPECT_DOUBLE_EQ(with({RecomputeModule::kMoeAct}), 1968 - 128);
  // mlp: the dense FFN's fc1 and activation outputs (256 + 256; its input stays).
  EXPECT_DOUBLE_EQ(with({RecomputeModule::kMlp}), 1968 - 512);
  // moe: everything of the MoE layer but its norm's input and output (528 -> 128).
  EXPECT_DOUBLE_EQ(with({RecomputeModule::kMoe}), 1968 - 400);
  // Modules add up where they do not overlap.
  EXPECT_DOUBLE_EQ(with({RecomputeModule::kCoreAttn, RecomputeModule::kMoeAct}), 1968 - 32 - 128);
}

// Megatron's bytes per parameter: bf16 weights with fp32 main gradients, 2 + 4 + 12 = 18; with
// the distributed optimizer (zero 1) over d replicas, 6 + 12 / d.
TEST(MemoryEstimate, MegatronBytesPerParameter) {
  Scenario sc = tiny();
  sc.model.dtype = Dtype::kBf16;
  sc.model.precision.main_grads = Dtype::kFp32;
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(m.weights_bytes + m.gradients_bytes + m.optimizer_bytes, 1328 * 18.0);
  // Zero 1 on 2 GPUs (ep 2, mp 1, dp 1): dense over 2 replicas, experts over 1.
  sc.parallelism.zero = 1;
  ASSERT_EQ(dense_replicas(sc), 2);
  ASSERT_EQ(expert_replicas(sc), 1);
  const MemoryEstimate z = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(z.weights_bytes + z.gradients_bytes + z.optimizer_bytes,
                   1072 * (6 + 12.0 / 2) + 256 * (6 + 12.0 / 1));
}

// ZeRO-1 shards the optimizer state over each parameter's replicas. 8 GPUs, mp 2. Disjoint,
// ep 2 dp 2: every MP rank has an EP group of its own, so an expert sits on dp x mp = 4 GPUs;
// dense parameters (split over mp) on P / mp = 4. Overlapped, ep 4 dp 2: the MP ranks are EP
// ranks holding different experts: 2 replicas per expert; dense still 4.
TEST(MemoryEstimate, ZeroOneShardsOverTheReplicasOfEachLayout) {
  const auto make = [](const std::string& parallelism) {
    return parse_scenario_string(fmt::format(R"(name: z
cluster:
  gpu: a100-sxm-40gb
  nodes: 1
  gpus_per_node: 8
  intra_node: {{kind: nvswitch}}
  inter_node: {{kind: none}}
model:
  mode: training
  layers: 2
  moe_every: 2
  batch_per_gpu: 1
  seq_len: 4
  model_dim: 8
  hidden_dim: 16
  experts_per_gpu: 1
  top_k: 1
  dtype: fp16
parallelism: {}
strategies:
  - {{name: base}}
)",
                                             parallelism),
                                 "z.yaml");
  };
  const Scenario disjoint = make("{ep: 2, mp: 2, dp: 2, zero: 1}");
  EXPECT_EQ(dense_replicas(disjoint), 4);
  EXPECT_EQ(expert_replicas(disjoint), 4);
  const MemoryEstimate d = estimate_memory(disjoint, Decision{}, 2);
  EXPECT_DOUBLE_EQ(d.optimizer_bytes, (d.dense_params / 4 + d.expert_params / 4) * 12);
  const Scenario overlapped = make("{ep: 4, mp: 2, dp: 2, zero: 1, layout: overlapped}");
  EXPECT_EQ(dense_replicas(overlapped), 4);
  EXPECT_EQ(expert_replicas(overlapped), 2);
  const MemoryEstimate o = estimate_memory(overlapped, Decision{}, 2);
  EXPECT_DOUBLE_EQ(o.optimizer_bytes, (o.dense_params / 4 + o.expert_params / 2) * 12);
}

TEST(MemoryEstimate, InFlightMicroBatchesFollow1F1B) {
  Scenario sc = tiny();
  sc.parallelism.pp = 4;
  sc.model.micro_batches = 2;
  EXPECT_EQ(in_flight_micro_batches(sc, 0), 2);
  EXPECT_EQ(in_flight_micro_batches(sc, 2), 2);
  EXPECT_EQ(in_flight_micro_batches(sc, 3), 1);
  sc.model.mode = Mode::kInference;
  EXPECT_EQ(in_flight_micro_batches(sc, 0), 1);
}

// The tiny model's 23,344 bytes against GPUs a little smaller: zero 1 gives 16,912 (dense state
// over 2 replicas: (1,072 / 2 + 256) x 12 = 9,504), selective recomputation of the light modules
// 22,416 (activations 1,040), full 22,544 (activations 1,168), bf16 Adam moments 18,032 (1,328
// x 4 bytes fewer); no fp8 on an A100, no deeper pipeline on one node.
TEST(MemoryEstimate, FitAdviceNamesTheSingleKeysThatFit) {
  const Scenario sc = tiny();
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  ASSERT_DOUBLE_EQ(m.total_bytes(), 23344);
  EXPECT_EQ(fit_advice(sc, m, 23344), "");
  const std::string a = fit_advice(sc, m, 22500);
  EXPECT_EQ(a.rfind("does not fit 0.0 GiB; fits with parallelism.zero: 1 (0.0 GiB) or "
                    "model.recompute: {granularity: selective, modules: [core_attn, layernorm, "
                    "mlp, moe_act]} (0.0 GiB)",
                    0),
            0u)
      << a;
  EXPECT_EQ(a.find("full"), std::string::npos) << a;
  EXPECT_NE(a.find(" or model.precision.moments: bf16 (0.0 GiB)"), std::string::npos) << a;
  EXPECT_NE(fit_advice(sc, m, 22600).find("{granularity: full}"), std::string::npos);
  EXPECT_EQ(fit_advice(sc, m, 1000),
            "does not fit 0.0 GiB; no single change fits (tried parallelism.zero: 1, "
            "model.recompute: {granularity: selective, modules: [core_attn, layernorm, mlp, "
            "moe_act]}, model.recompute: {granularity: full}, model.precision.moments: bf16)");
  Scenario h100 = sc;  // fp8 is offered where the GPU has it
  h100.cluster.gpu.peak[Dtype::kFp8] = FlopsPerSecond(1e15);
  EXPECT_NE(fit_advice(h100, m, 1000).find("model.precision.gemm: fp8"), std::string::npos);
}

TEST(MemoryEstimate, Fp32AdamIsSixteenBytesWithoutMasterCopy) {
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kFp16), 12);
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kBf16), 12);
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kFp32), 8);
  // bf16 moments (DeepSeek-V3; Megatron's --exp-avg-dtype / --exp-avg-sq-dtype bf16): 2 + 2
  // bytes of moments plus the fp32 master copy.
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kBf16, Dtype::kBf16), 8);
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kFp32, Dtype::kBf16), 4);
}

// precision.moments: bf16 halves the moments in the estimate (1,328 parameters x (4 + 4) bytes
// instead of x 12) and in the optimizer step's traffic (the plan's optimizer.step reads and
// writes both moments: 4 x 2 bytes instead of 4 x 4 per parameter).
TEST(MemoryEstimate, Bf16MomentsShrinkTheOptimizerStateAndStep) {
  Scenario sc = tiny();
  const MemoryEstimate fp32 = estimate_memory(sc, Decision{}, 2);
  sc.model.precision.moments = Dtype::kBf16;
  const MemoryEstimate bf16 = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(fp32.optimizer_bytes, 1328 * 12.0);
  EXPECT_DOUBLE_EQ(bf16.optimizer_bytes, 1328 * 8.0);
  EXPECT_DOUBLE_EQ(bf16.weights_bytes + bf16.gradients_bytes + bf16.activations_bytes,
                   fp32.weights_bytes + fp32.gradients_bytes + fp32.activations_bytes);
  // The step's optimizer.step per parameter: gradient 2 + moments read and written + master
  // copy read and written 8 + weight written 2: 28 bytes at fp32 moments, 20 at bf16, over the
  // plan's 1,296 parameters (its gradient buckets: the 1,328 less the 32 norm weights).
  const auto step_bytes = [](const Scenario& s) {
    const auto topo = topology::build_topology(s.cluster);
    const BuiltPlan bp = build_step_plan(s, *topo, testing::uniform_work(s, 2), Decision{});
    for (const auto& op : bp.plan.ops())
      if (op.label == "optimizer.step") return op.compute().bytes.value();
    ADD_FAILURE() << "no optimizer.step";
    return 0.0;
  };
  Scenario plain = tiny();
  EXPECT_DOUBLE_EQ(step_bytes(plain), 1296 * 28.0);
  EXPECT_DOUBLE_EQ(step_bytes(sc), 1296 * 20.0);
}

TEST(MemoryEstimate, LinaPackingDoublesExpertState) {
  const Scenario sc = tiny();
  Decision packed;
  packed.expert_pack = 2;
  const MemoryEstimate one = estimate_memory(sc, Decision{}, 2);
  const MemoryEstimate two = estimate_memory(sc, packed, 2);
  // 2 experts per GPU: 512 expert parameters; dense and activations unchanged (E, dC the same);
  // 256 more parameters at 2 + 2 + 12 bytes.
  EXPECT_DOUBLE_EQ(two.expert_params, 512);
  EXPECT_DOUBLE_EQ(two.dense_params, one.dense_params);
  EXPECT_DOUBLE_EQ(two.activations_bytes, one.activations_bytes);
  EXPECT_DOUBLE_EQ(two.total_bytes() - one.total_bytes(), 256 * 16.0);
}

TEST(MemoryEstimate, ShardedExpertsP1KeepsGatheredParameters) {
  // experts_per_gpu -2: one expert over both GPUs (E = 1, dC = ceil(4 / 1) = 4).
  const Scenario sc = tiny("training", 1, 16, -2);
  Decision p1;  // parallel_degree 1 = P1
  const MemoryEstimate m = estimate_memory(sc, p1, 4);
  EXPECT_DOUBLE_EQ(m.expert_params, 128);                // 2 M H / n
  EXPECT_DOUBLE_EQ(m.dense_params, 512 + 32 + 512 + 8);  // attention, norms, dense FFN, gate
  // R = E dC = 4 rows: send buffers 2 R M b = 128; the gathered 2 M H = 256 parameters of the
  // MoE layer kept for backward plus one gathered gradient: 2 x 256 x 2 bytes = 1,024.
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128 + 1024);
  Decision p2;
  p2.parallel_degree = 2;  // tokens repeated twice, hidden slices of H / 2: nothing gathered
  const MemoryEstimate q = estimate_memory(sc, p2, 4);
  EXPECT_DOUBLE_EQ(q.buffers_bytes, 2 * 8 * 8 * 2);  // R = E dC rho = 8 rows
  // MoE rows, fc1 and activation outputs, expert outputs in elements: R M + 2 R H/2 + R M = 256
  // (P1: R = 4, H: 32 + 128 + 32 = 192), x 2 bytes.
  EXPECT_DOUBLE_EQ(q.activations_bytes - m.activations_bytes, (256 - 192) * 2);
}

TEST(MemoryEstimate, MonotoneInBatchAndHiddenDim) {
  double last = 0;
  for (int b : {1, 2, 4, 8}) {
    const Scenario sc = tiny("training", b);
    const double t = estimate_memory(sc, Decision{}, nominal_capacity(sc)).total_bytes();
    EXPECT_GT(t, last) << "batch " << b;
    last = t;
  }
  last = 0;
  for (int h : {16, 32, 64, 128}) {
    const double t = estimate_memory(tiny("training", 1, h), Decision{}, 2).total_bytes();
    EXPECT_GT(t, last) << "hidden " << h;
    last = t;
  }
}

TEST(MemoryEstimate, NominalCapacityTakesTheLargestFactor) {
  Scenario sc = tiny("training", 4);  // S = 16, E = 2, k = 1
  EXPECT_EQ(nominal_capacity(sc), 8);
  EXPECT_EQ(nominal_capacity(sc, 3), 9);
  sc.workload.capacity.kind = CapacityKind::kRandomWalk;
  sc.workload.capacity.max = 2.0;
  EXPECT_EQ(nominal_capacity(sc), 16);
  sc.workload.capacity.kind = CapacityKind::kFixed;
  sc.model.capacity_factor = -1.5;  // dropless, capped at 1.5
  EXPECT_EQ(nominal_capacity(sc), 12);
}

TEST(MemoryEstimate, RunnerRecordsTheEstimatePerIteration) {
  const Scenario sc = tiny("training", 1, 16, 1,
                           "  - {name: lina, schedule: lina, lina: {micro_op: 1MB, max_pack: 2}}");
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  const Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const StackRun run = run_stack(sc, sc.strategies[0], *topo, backend, 2);
  ASSERT_EQ(run.iterations.size(), 2u);
  EXPECT_DOUBLE_EQ(run.iterations[0].memory.total_bytes(), 23344);
  EXPECT_DOUBLE_EQ(run.gpu_memory_bytes, 40.0 * 1024 * 1024 * 1024);
  // first_decision: the same stack's iteration-0 decision without running it.
  EXPECT_EQ(first_decision(sc, sc.strategies[0], *topo, 2).expert_pack, 1);
  // planned_memory: what the run records, without running it.
  EXPECT_DOUBLE_EQ(planned_memory(sc, sc.strategies[0], *topo, 2).total_bytes(), 23344);
}

// Dropless under skew: the sampled dC is above the nominal (mean) one, and planned_memory takes
// the run's, so `validate` and `simulate` print one figure.
TEST(MemoryEstimate, PlannedMemoryIsTheRunsEstimateWhenDropless) {
  Scenario sc = tiny("training", 8);
  sc.model.capacity_factor = 0;
  sc.workload.routing.distribution = RoutingDistribution::kZipf;
  sc.workload.routing.skew = 1.0;
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  const Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const StackRun run = run_stack(sc, sc.strategies[0], *topo, backend, 3);
  double most = 0;
  for (const auto& r : run.iterations) most = std::max(most, r.memory.total_bytes());
  const MemoryEstimate planned = planned_memory(sc, sc.strategies[0], *topo, 3);
  EXPECT_DOUBLE_EQ(planned.total_bytes(), most);
  EXPECT_GT(planned.capacity, nominal_capacity(sc));
}

}  // namespace
}  // namespace moesim::strategies
