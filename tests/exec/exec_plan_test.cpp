// CPU-only tests of exec/ pieces that need no MPI rank: the GPU path's issue order (Lina's
// priorities), the MoE layer plan read from a plan, and the --check tolerances per dtype (the
// device data path's arithmetic replayed with the CPU twins in fp16 / bf16 against the reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario_loader.hpp"
#include "exec/calibrate.hpp"
#include "exec/executor.hpp"
#include "exec/layer_program.hpp"
#include "exec/moe_data.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::exec {
namespace {

using kernels::DType;

Op compute_op(int priority, std::vector<OpId> deps, StreamId stream = 0) {
  Op op;
  op.kind = OpKind::kCompute;
  op.ranks = RankSet::all(1);
  op.stream = stream;
  op.deps = std::move(deps);
  op.priority = priority;
  op.spec = ComputeSpec{};
  return op;
}

TEST(PriorityIssueOrder, PlainPlanKeepsIdOrder) {
  Plan plan(1);
  plan.stream("compute");
  plan.add(compute_op(0, {}));
  plan.add(compute_op(0, {0}));
  plan.add(compute_op(0, {}));
  plan.add(compute_op(0, {1, 2}));
  EXPECT_EQ(priority_issue_order(plan), (std::vector<OpId>{0, 1, 2, 3}));
}

// Lina: gradient micro-ops (priority -1) wait behind a ready all-to-all (priority 1) even when
// their ids are lower; deps still come first.
TEST(PriorityIssueOrder, HigherPriorityFirstAmongReadyOpsDepsRespected) {
  Plan plan(1);
  plan.stream("compute");
  plan.add(compute_op(0, {}));    // 0
  plan.add(compute_op(-1, {0}));  // 1: micro-op m0
  plan.add(compute_op(-1, {0}));  // 2: micro-op m1
  plan.add(compute_op(1, {0}));   // 3: all-to-all
  plan.add(compute_op(1, {3}));   // 4: next all-to-all
  plan.add(compute_op(5, {1}));   // 5: high priority but behind micro-op 1
  EXPECT_EQ(priority_issue_order(plan), (std::vector<OpId>{0, 3, 4, 1, 5, 2}));
}

// exec reads an op's role, never its label: an op labelled like a MoE step but without a role
// is nothing to the data paths, and a forward role is not a backward one.
TEST(MoeRoles, ReadFromTheRoleAndLayerOfBlock) {
  Op op;
  op.role = OpRole{OpRoleKind::kFc2, false, 3, 1};
  MoeOpRef r = moe_op_ref(op);
  EXPECT_EQ(r.kind, OpRoleKind::kFc2);
  EXPECT_EQ(r.block, 3);
  EXPECT_EQ(r.chunk, 1);
  EXPECT_FALSE(is_backward_step(op));
  op.role = OpRole{OpRoleKind::kGate, true, 0, -1};
  EXPECT_EQ(moe_op_ref(op).kind, OpRoleKind::kNone);
  EXPECT_TRUE(is_backward_step(op));
  op.role = OpRole{OpRoleKind::kCombineSaa, false, 0, 0};  // Parm's step: not the plain path's
  EXPECT_EQ(moe_op_ref(op).kind, OpRoleKind::kNone);
  Op labelled;
  labelled.label = "L1.fwd.dispatch.c3";
  EXPECT_EQ(moe_op_ref(labelled).kind, OpRoleKind::kNone);
  EXPECT_EQ(role_label(OpRole{OpRoleKind::kDispatch, false, 1, 2}), "L1.fwd.dispatch.c3");
  EXPECT_EQ(role_label(OpRole{OpRoleKind::kParmLocalDump, true, 4, -1}), "L4.bwd.parm.local_dump");
  ModelSpec every2;
  every2.layers = 4;
  every2.moe_every = 2;
  EXPECT_EQ(every2.moe_layer_of_block(3), 1);  // blocks 1, 3 hold MoE layers 0, 1
  EXPECT_EQ(every2.moe_layer_of_block(2), -1);
  ModelSpec every1;
  EXPECT_EQ(every1.moe_layer_of_block(0), 0);
  // DeepSeek-V3's shape: the first 3 blocks dense, then every block MoE.
  ModelSpec ds;
  ds.layers = 61;
  ds.first_dense_layers = 3;
  EXPECT_EQ(ds.num_moe_layers(), 58);
  EXPECT_EQ(ds.moe_layer_of_block(2), -1);
  EXPECT_EQ(ds.moe_layer_of_block(3), 0);
  EXPECT_EQ(ds.moe_layer_of_block(60), 57);
  // ... and with moe_every 2 after them: blocks 4, 6, 8 are MoE layers 0, 1, 2.
  ds.moe_every = 2;
  EXPECT_EQ(ds.num_moe_layers(), 29);
  EXPECT_EQ(ds.moe_layer_of_block(3), -1);
  EXPECT_EQ(ds.moe_layer_of_block(4), 0);
  EXPECT_EQ(ds.moe_layer_of_block(8), 2);
}

TEST(MoeLabels, LayerPlanFromFc1Shapes) {
  // E = W * dE = 6: chunk capacity = m * batch / E.
  Plan plan(2);
  const StreamId s = plan.stream("compute");
  auto fc1 = [&](int chunk, std::int64_t m, std::int64_t batch) {
    ComputeSpec cs;
    cs.cls = ComputeClass::kGemm;
    cs.gemm = GemmShape{m, 8, 4, batch};
    plan.add_compute(RankSet::all(2), s, cs, {},
                     OpTag(OpRole{OpRoleKind::kFc1, false, 0, chunk - 1}));
  };
  fc1(1, 5, 6);                                     // 30 / 6 = 5
  fc1(2, 3, 6);                                     // 3
  const auto layers = plan_moe_layers(plan, 1, 6);  // rank 1, E = 6 (no dispatch: W = 1)
  ASSERT_EQ(layers.size(), 1u);
  EXPECT_EQ(layers[0].caps, (std::vector<int>{5, 3}));
  EXPECT_EQ(layers[0].offset, (std::vector<int>{0, 5}));
  EXPECT_EQ(layers[0].capacity, 8);
  EXPECT_FALSE(layers[0].has_a2a);
  EXPECT_EQ(layers[0].ep, 1);
  EXPECT_EQ(layers[0].local_experts, 6);
}

// --check decides on the gate's own logits (GateLogits): one token, M = 1, x = 1, gate weights
// (1, 1 + 2^-23, 0). The reference's logits put expert 1 first by 2^-23; a kernel whose GEMM gave
// (1, 1, 0) ties them and picks expert 0 (lower index), which is right within rounding: the
// reference follows it, with no logit counted wrong. A kernel logit off by 0.1 is counted wrong.
TEST(MoeData, ReferenceDecidesOnTheKernelsLogitsAndChecksThem) {
  MoeShape s{1, 1, 2, 3, 1};
  const std::vector<float> x = {1.0f};
  const std::vector<float> wg = {1.0f, 1.0f + 0x1p-23f, 0.0f};
  const ReferenceRouting own = reference_routing(s, x, wg, 4);
  EXPECT_EQ(own.expert, std::vector<int>{1});
  const std::vector<float> tied = {1.0f, 1.0f, 0.0f};
  const ReferenceRouting follow = reference_routing(s, x, wg, 4, {tied.data(), 1e-6});
  EXPECT_EQ(follow.expert, std::vector<int>{0});
  EXPECT_EQ(follow.logits_wrong, 0);
  // Probabilities stay the reference's: expert 0's softmax weight over (1, 1 + 2^-23, 0).
  const double e1 = std::exp(0x1p-23), sum = 1 + e1 + std::exp(-1.0);
  EXPECT_NEAR(follow.prob[0], 1 / sum, 1e-7);
  const std::vector<float> off = {1.0f, 1.1f, 0.0f};
  const ReferenceRouting bad = reference_routing(s, x, wg, 4, {off.data(), 1e-6});
  EXPECT_EQ(bad.logits_wrong, 1);
  // The node-limited gate decides on them too: 4 experts in 2 groups, k = 2 from 1 group.
  MoeShape n{1, 1, 2, 4, 2};
  n.experts_per_group = 2;
  n.group_limit = 1;
  const std::vector<float> wg4 = {3.0f, 0.0f, 2.0f, 1.5f};  // groups' sums 3 and 3.5: group 1
  EXPECT_EQ(reference_routing(n, x, wg4, 4).expert, (std::vector<int>{2, 3}));
  const std::vector<float> k4 = {3.0f, 0.5f, 2.0f, 1.5f};  // 3.5 and 3.5: the lower group
  EXPECT_EQ(reference_routing(n, x, wg4, 4, {k4.data(), 1.0}).expert, (std::vector<int>{0, 1}));
}

TEST(MoeData, HiddenSlicesAreColumnAndRowBlocksWhosePartialOutputsSumToTheExpert) {
  const MoeShape s{4, 3, 8, 2, 1};  // M = 3, H = 8
  const auto w1 = make_w1(s, 5, 0, 1), w2 = make_w2(s, 5, 0, 1);
  const std::vector<float> x = {0.5f, -1.0f, 0.25f};
  auto ffn = [&](const std::vector<float>& a, const std::vector<float>& b, int h) {
    std::vector<double> y(3, 0.0);
    for (int j = 0; j < h; ++j) {
      double acc = 0;
      for (int m = 0; m < 3; ++m) acc += x[m] * a[m * h + j];
      acc = std::max(acc, 0.0);
      for (int m = 0; m < 3; ++m) y[m] += acc * b[j * 3 + m];
    }
    return y;
  };
  const auto full = ffn(w1, w2, 8);
  std::vector<double> sum(3, 0.0);
  for (int part = 0; part < 4; ++part) {
    const auto a = make_w1_slice(s, 5, 0, 1, part, 4), b = make_w2_slice(s, 5, 0, 1, part, 4);
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    EXPECT_EQ(a[0], w1[part * 2]);          // W1 row 0, columns 2 part, 2 part + 1
    EXPECT_EQ(a[3], w1[8 + part * 2 + 1]);  // row 1
    EXPECT_EQ(b[5], w2[(part * 2 + 1) * 3 + 2]);
    const auto y = ffn(a, b, 2);
    for (int m = 0; m < 3; ++m) sum[m] += y[m];
  }
  for (int m = 0; m < 3; ++m) EXPECT_NEAR(sum[m], full[m], 1e-12);
}

TEST(ExchangeSizes, WholeElementsPerChunkSaaSlicesAndMatrixSums) {
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.bytes = Bytes(10);
  ExchangeSizes sz = exchange_sizes(spec, nullptr, 4, 0);
  EXPECT_EQ(sz.send, 16u);  // 4 chunks of one 4-byte element
  EXPECT_EQ(sz.recv, 16u);
  spec.algo = CollectiveAlgo::kSaa;
  spec.sub_group = 2;
  sz = exchange_sizes(spec, nullptr, 4, 3);
  EXPECT_EQ(sz.send, 4u * 4 * 840);  // slices of every chunk in whole elements
  EXPECT_EQ(sz.recv, 2u * 4 * 4 * 840);
  ByteMatrix m;
  m.size = 2;
  m.unit = Bytes(8);
  m.counts = {1, 2, 3, 4};  // row = source
  spec = CollectiveSpec{};
  spec.type = CollectiveType::kAllToAllv;
  sz = exchange_sizes(spec, &m, 2, 1);
  EXPECT_EQ(sz.send, 8u * (3 + 4));
  EXPECT_EQ(sz.recv, 8u * (2 + 4));
}

// The device data path's arithmetic for one rank with every expert local (gate in fp32 on fp32
// tokens; tokens, weights, hidden and outputs in `d`; fp32 accumulation), with the CPU twins.
std::vector<float> layer_in_dtype(const MoeShape& s, DType d, std::uint64_t seed, int capacity,
                                  long long* dropped) {
  kernels::cpu::Context ctx;
  const int S = s.tokens, M = s.model_dim, H = s.hidden_dim, E = s.experts, k = s.top_k;
  const auto x = make_tokens(s, seed, 0, 0, 0);
  const auto gw = make_gate_weights(s, seed, 0);
  std::vector<float> logits(static_cast<size_t>(S) * E), weight(static_cast<size_t>(S) * k);
  std::vector<std::int32_t> expert(weight.size()), slot(weight.size()),
      slot_entry(static_cast<size_t>(E) * capacity), count(E);
  kernels::GateParams gp;
  gp.num_tokens = S;
  gp.model_dim = M;
  gp.num_experts = E;
  gp.top_k = k;
  gp.capacity = capacity;
  kernels::cpu::gate(ctx, DType::kF32, gp, x.data(), gw.data(), logits.data(),
                     {expert.data(), slot.data(), weight.data(), slot_entry.data(), count.data()});
  const std::size_t es = kernels::dtype_size(d);
  auto to_d = [&](const std::vector<float>& v) {
    std::vector<std::byte> out(v.size() * es);
    kernels::convert(DType::kF32, v.data(), d, out.data(), v.size());
    return out;
  };
  const auto xd = to_d(x);
  std::vector<std::byte> w1(static_cast<size_t>(E) * M * H * es), w2(w1.size());
  for (int e = 0; e < E; ++e) {
    const auto a = to_d(make_w1(s, seed, 0, e)), b = to_d(make_w2(s, seed, 0, e));
    std::copy(a.begin(), a.end(), w1.begin() + static_cast<long>(e) * M * H * es);
    std::copy(b.begin(), b.end(), w2.begin() + static_cast<long>(e) * H * M * es);
  }
  kernels::Routing r{
      S, k, E, capacity, expert.data(), slot.data(), weight.data(), slot_entry.data()};
  const std::size_t rows = static_cast<std::size_t>(E) * capacity;
  std::vector<std::byte> disp(rows * M * es), hid(rows * H * es), out(rows * M * es),
      y(static_cast<size_t>(S) * M * es);
  kernels::cpu::encode(ctx, d, r, M, xd.data(), disp.data());
  // As the GPU path: per expert a (strided-batched) GEMM, ReLU in place, second GEMM.
  kernels::cpu::gemm_strided_batched(
      ctx, d, capacity, H, M, disp.data(), static_cast<long long>(capacity) * M, w1.data(),
      static_cast<long long>(M) * H, hid.data(), static_cast<long long>(capacity) * H, E);
  kernels::cpu::activation(ctx, d, kernels::Activation::kRelu, hid.data(), rows * H);
  kernels::cpu::gemm_strided_batched(
      ctx, d, capacity, M, H, hid.data(), static_cast<long long>(capacity) * H, w2.data(),
      static_cast<long long>(H) * M, out.data(), static_cast<long long>(capacity) * M, E);
  kernels::cpu::decode(ctx, d, r, M, out.data(), y.data());
  std::vector<float> yf(static_cast<size_t>(S) * M);
  kernels::convert(d, y.data(), DType::kF32, yf.data(), yf.size());
  *dropped = 0;
  for (auto sl : slot) *dropped += sl < 0 ? 1 : 0;
  return yf;
}

TEST(CheckTolerance, EveryDtypeWithinItsToleranceOfTheReference) {
  const MoeShape s{96, 64, 128, 4, 2};
  const int capacity = 40;  // 192 choices over 4 x 40 slots: some drop
  const std::uint64_t seed = 5;
  std::vector<std::vector<float>> w1, w2;
  for (int e = 0; e < s.experts; ++e) {
    w1.push_back(make_w1(s, seed, 0, e));
    w2.push_back(make_w2(s, seed, 0, e));
  }
  long long ref_drops = 0;
  const auto ref = reference_layer(s, make_tokens(s, seed, 0, 0, 0), make_gate_weights(s, seed, 0),
                                   w1, w2, capacity, &ref_drops);
  EXPECT_GT(ref_drops, 0);
  double prev_err = -1;
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(kernels::dtype_name(d));
    long long drops = 0;
    const auto y = layer_in_dtype(s, d, seed, capacity, &drops);
    EXPECT_EQ(drops, ref_drops);  // fp32 gate: the same routing in every dtype
    const double tol = check_tolerance(d);
    double max_rel = 0;
    for (size_t i = 0; i < y.size(); ++i)
      max_rel = std::max(max_rel, std::fabs(y[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
    EXPECT_LE(max_rel, tol);
    RecordProperty(std::string("max_rel_error_") + kernels::dtype_name(d), std::to_string(max_rel));
    // The tolerance is not vacuous: the rounding uses at least 1% of it (fp16 / bf16),
    // and the error grows as the dtype gets coarser.
    if (d != DType::kF32) {
      EXPECT_GE(max_rel, tol / 100);
    }
    EXPECT_GT(max_rel, prev_err);
    prev_err = max_rel;
  }
  EXPECT_EQ(check_tolerance(DType::kF32), 1e-4);
}

}  // namespace
}  // namespace moesim::exec

namespace moesim::exec {
namespace {

bool has_shape(const std::vector<GemmShape>& g, std::int64_t m, std::int64_t n, std::int64_t k) {
  return std::any_of(g.begin(), g.end(),
                     [&](const GemmShape& s) { return s.m == m && s.n == n && s.k == k; });
}

// `moesim calibrate`'s GEMM grid: the host path's small shapes, the GPU's up to where tensor
// cores saturate, both with the scenario's own (M, H) where it fits and no shape twice.
TEST(CalibrateGrid, GpuGridReachesSaturatingShapesAndHoldsTheScenarios) {
  Scenario sc = load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-gpu-1.yaml");
  ASSERT_EQ(sc.model.model_dim, 512);
  ASSERT_EQ(sc.model.hidden_dim, 2048);
  const auto host_quick = gemm_grid(sc, true, false);
  const auto gpu_quick = gemm_grid(sc, true, true);
  const auto gpu_full = gemm_grid(sc, false, true);
  // Host quick: M x H in {64 x 128, 128 x 256} x m in {8, 32, 128}; (512, 2048) is over its bound.
  EXPECT_EQ(host_quick.size(), 6u);
  EXPECT_FALSE(has_shape(host_quick, 8, 2048, 512));
  // GPU quick: (1024, 4096) and the scenario's (512, 2048) x m in {16, 256, 2048}, its fc2
  // (m x 2048 -> 512) at the same m, and both as the batched expert GEMM (ep 1 x 8 local
  // experts; 8 x 2,048 rows fit).
  EXPECT_EQ(gpu_quick.size(), 15u);
  EXPECT_TRUE(has_shape(gpu_quick, 2048, 4096, 1024));
  EXPECT_TRUE(has_shape(gpu_quick, 256, 2048, 512));
  EXPECT_TRUE(has_shape(gpu_quick, 256, 512, 2048));
  EXPECT_EQ(std::count_if(gpu_quick.begin(), gpu_quick.end(),
                          [](const GemmShape& g) { return g.batch == 8; }),
            6);
  // GPU full: (512, 2048) is in the grid already, so the scenario's fc1 adds nothing to the 3 x 6
  // batch-1 shapes; its fc2 adds 6, and the batched fc1 / fc2 with m x 8 <= 64 Ki rows (m = 16 ..
  // 4,096) 2 x 5.
  EXPECT_EQ(gpu_full.size(), 34u);
  EXPECT_TRUE(has_shape(gpu_full, 16384, 16384, 4096));
  for (const auto& g : host_quick) EXPECT_EQ(g.batch, 1);
  // A wide model's own shape joins only where its operands fit in 4 GiB (fp32): M 16,384 x
  // H 32,768 at m = 16 (2.1 GB) and 4,096 (3.0 GB) does, at m = 16,384 (5.4 GB) it does not.
  Scenario wide = sc;
  wide.model.model_dim = 16384;
  wide.model.hidden_dim = 32768;
  const auto gpu_wide = gemm_grid(wide, false, true);
  EXPECT_TRUE(has_shape(gpu_wide, 16, 32768, 16384));
  EXPECT_TRUE(has_shape(gpu_wide, 4096, 32768, 16384));
  EXPECT_FALSE(has_shape(gpu_wide, 16384, 32768, 16384));
  for (const auto& g : {host_quick, gpu_quick, gpu_full})
    for (size_t i = 0; i < g.size(); ++i)
      for (size_t j = i + 1; j < g.size(); ++j)
        EXPECT_FALSE(g[i].m == g[j].m && g[i].n == g[j].n && g[i].k == g[j].k &&
                     g[i].batch == g[j].batch);
}

}  // namespace
}  // namespace moesim::exec
