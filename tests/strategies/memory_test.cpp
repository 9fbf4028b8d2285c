// The per-GPU memory estimate (strategies/memory.hpp, docs/model.md "Memory"): every part
// hand-computed on a tiny model, and how it moves with batch, hidden size, packing and sharding.
#include "strategies/memory.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

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

TEST(MemoryEstimate, TinyTrainingEveryPartByHand) {
  const Scenario sc = tiny();
  ASSERT_EQ(nominal_capacity(sc), 2);
  const MemoryEstimate m = estimate_memory(sc, Decision{}, 2);
  // Dense: attention 4 M^2 x 2 blocks = 512, dense FFN 8 M^2 = 512, gate M E = 16 -> 1,040.
  EXPECT_DOUBLE_EQ(m.dense_params, 1040);
  // Experts: 1 MoE layer x 1 local expert x 2 M H = 256.
  EXPECT_DOUBLE_EQ(m.expert_params, 256);
  // fp16: weights and gradients 2 bytes, Adam 12 bytes per parameter (1,296 parameters).
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2592);
  EXPECT_DOUBLE_EQ(m.gradients_bytes, 2592);
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, 15552);
  // Activations (elements, S M = 32): attention 2 SM + SM + 4 SM = 224 per block, x 2 = 448;
  // dense FFN SM + 8 SM = 288; MoE: gate input SM 32 + probabilities S E 8, R = E dC = 4 rows:
  // 2 R M = 64, 2 R H = 128 -> 232. 968 elements x 2 bytes.
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1936);
  // Buffers: dispatch and combine send buffers, 2 R M x 2 bytes.
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128);
  EXPECT_DOUBLE_EQ(m.total_bytes(), 2592 + 2592 + 15552 + 1936 + 128);
  EXPECT_EQ(m.capacity, 2);
}

// dense_hidden_dim = 8 (instead of 4 M = 32) on the tiny model: the dense FFN's 2 M Hd = 128
// parameters replace 8 M^2 = 512, and its activations S M + 2 S Hd = 96 replace 288 elements.
TEST(MemoryEstimate, DenseHiddenDimSizesTheDenseFfn) {
  const Scenario base = tiny();
  Scenario sc = base;
  sc.model.dense_hidden_dim = 8;
  const MemoryEstimate a = estimate_memory(base, Decision{}, 2);
  const MemoryEstimate b = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(b.dense_params, 1040 - 512 + 128);
  EXPECT_DOUBLE_EQ(b.expert_params, a.expert_params);
  EXPECT_DOUBLE_EQ(b.activations_bytes, 1936 - (288 - 96) * 2);
}

// shared_experts = 2 on the tiny model (H 16): one MoE block gains 2 M (2 H) = 512 dense
// parameters and 2 S (2 H) = 256 activation elements (fc1 output, fc2 input).
TEST(MemoryEstimate, SharedExpertsAreDenseParameters) {
  const Scenario base = tiny();
  Scenario sc = base;
  sc.model.shared_experts = 2;
  const MemoryEstimate a = estimate_memory(base, Decision{}, 2);
  const MemoryEstimate b = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(b.dense_params, a.dense_params + 512);
  EXPECT_DOUBLE_EQ(b.expert_params, a.expert_params);
  EXPECT_DOUBLE_EQ(b.activations_bytes, a.activations_bytes + 256 * 2);
}

// vocab_size = 10 on the tiny model (M 8, S 4): tied, V M = 80 more dense parameters (160
// untied); activations gain the LM head's input S M = 32 and logits S V = 40 elements.
TEST(MemoryEstimate, VocabularyAddsEmbeddingAndLogits) {
  const Scenario base = tiny();
  Scenario sc = base;
  sc.model.vocab_size = 10;
  const MemoryEstimate a = estimate_memory(base, Decision{}, 2);
  const MemoryEstimate b = estimate_memory(sc, Decision{}, 2);
  EXPECT_DOUBLE_EQ(b.dense_params, a.dense_params + 80);
  EXPECT_DOUBLE_EQ(b.activations_bytes, a.activations_bytes + 72 * 2);
  sc.model.tie_embeddings = false;
  EXPECT_DOUBLE_EQ(estimate_memory(sc, Decision{}, 2).dense_params, a.dense_params + 160);
}

TEST(MemoryEstimate, InferenceHoldsWeightsAndOneBlock) {
  const MemoryEstimate m = estimate_memory(tiny("inference"), Decision{}, 2);
  EXPECT_DOUBLE_EQ(m.weights_bytes, 2592);
  EXPECT_DOUBLE_EQ(m.gradients_bytes, 0);
  EXPECT_DOUBLE_EQ(m.optimizer_bytes, 0);
  // The larger block: attention 224 + dense FFN 288 = 512 elements (MoE block: 224 + 232).
  EXPECT_DOUBLE_EQ(m.activations_bytes, 1024);
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128);
}

TEST(MemoryEstimate, Fp32AdamIsSixteenBytesWithoutMasterCopy) {
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kFp16), 12);
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kBf16), 12);
  EXPECT_EQ(optimizer_bytes_per_param(Dtype::kFp32), 8);
}

TEST(MemoryEstimate, LinaPackingDoublesExpertState) {
  const Scenario sc = tiny();
  Decision packed;
  packed.expert_pack = 2;
  const MemoryEstimate one = estimate_memory(sc, Decision{}, 2);
  const MemoryEstimate two = estimate_memory(sc, packed, 2);
  // 2 experts per GPU: 512 expert parameters; dense and activations unchanged (E, dC the same).
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
  EXPECT_DOUBLE_EQ(m.expert_params, 128);  // 2 M H / n
  EXPECT_DOUBLE_EQ(m.dense_params, 512 + 512 + 8);
  // R = E dC = 4 rows: send buffers 2 R M b = 128; the gathered 2 M H = 256 parameters of the
  // MoE layer kept for backward plus one gathered gradient: 2 x 256 x 2 bytes = 1,024.
  EXPECT_DOUBLE_EQ(m.buffers_bytes, 128 + 1024);
  Decision p2;
  p2.parallel_degree = 2;  // tokens repeated twice, hidden slices of H / 2: nothing gathered
  const MemoryEstimate q = estimate_memory(sc, p2, 4);
  EXPECT_DOUBLE_EQ(q.buffers_bytes, 2 * 8 * 8 * 2);  // R = E dC rho = 8 rows
  // MoE activations: SM 32 + SE 4 + 2 R M 128 + 2 R H/2 128 = 292 (P1: 32 + 4 + 64 + 128 = 228).
  EXPECT_DOUBLE_EQ(q.activations_bytes - m.activations_bytes, (292 - 228) * 2);
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
  EXPECT_DOUBLE_EQ(run.iterations[0].memory.total_bytes(), 22800);
  EXPECT_DOUBLE_EQ(run.gpu_memory_bytes, 40.0 * 1024 * 1024 * 1024);
  // first_decision: the same stack's iteration-0 decision without running it.
  EXPECT_EQ(first_decision(sc, sc.strategies[0], *topo, 2).expert_pack, 1);
}

}  // namespace
}  // namespace moesim::strategies
