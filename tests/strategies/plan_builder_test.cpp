// Tests of the MoE step plan builder (strategies/plan_builder): groups under the rank map, op
// structure and sizes worked out by hand from docs/model.md, and timing properties checked by
// running the plan on the engine (sim::run_plan) on small built topologies.
#include "strategies/plan_builder.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/compute_model.hpp"
#include "sim/engine.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/runner.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

// A scenario in code: every number a test varies, with small defaults.
struct Cfg {
  int nodes = 1, gpn = 2;
  std::string mode = "training";
  int layers = 1, moe_every = 1;
  int batch = 2, seq = 256, model_dim = 256, hidden = 512;
  int experts_per_gpu = 1, top_k = 2;
  double capacity_factor = 1.0;
  int ep = 2, esp = 1, mp = 1;
  std::string dp = "auto";
  std::string layout = "disjoint";
  std::string model_extra;  // more `model:` lines, e.g. "  dense_hidden_dim: 768\n"
  // One gradient all-reduce per block: the hand-worked expectations below are per block.
  std::string grad_bucket = "block";
};

Scenario make_scenario(const Cfg& c) {
  std::string yaml =
      fmt::format(R"(
name: plan-builder-test
cluster:
  gpu: a100-sxm-80gb
  nodes: {}
  gpus_per_node: {}
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
  inter_node: {{kind: switch, nic_bandwidth: 200Gb/s, nics_per_node: {}, latency: 2us}}
model:
  mode: {}
  layers: {}
  moe_every: {}
  batch_per_gpu: {}
  seq_len: {}
  model_dim: {}
  hidden_dim: {}
  experts_per_gpu: {}
  top_k: {}
  capacity_factor: {}
  dtype: fp16
{}parallelism: {{ep: {}, esp: {}, mp: {}, dp: {}, layout: {}, grad_bucket: {}}}
strategies:
  - {{name: baseline}}
)",
                  c.nodes, c.gpn, c.gpn, c.mode, c.layers, c.moe_every, c.batch, c.seq, c.model_dim,
                  c.hidden, c.experts_per_gpu, c.top_k, c.capacity_factor, c.model_extra, c.ep,
                  c.esp, c.mp, c.dp, c.layout, c.grad_bucket);
  return parse_scenario_string(yaml, "test.yaml");
}

using testing::uniform_work;

// dC = k * f * S / E rounded up (docs/strategy-specs.md §1), as the workload computes it.
std::int64_t capacity_of(const Scenario& sc) {
  return static_cast<std::int64_t>(std::ceil(sc.model.top_k * sc.model.capacity_factor *
                                             static_cast<double>(sc.tokens_per_gpu()) /
                                             sc.num_experts()));
}

struct Built {
  Scenario sc;
  std::unique_ptr<topology::Topology> topo;
  BuiltPlan bp;
};

Built build(const Cfg& c, Decision d = {}, std::int64_t capacity = -1) {
  Built b{make_scenario(c), nullptr, BuiltPlan{Plan(0), PlanIndex{}}};
  b.topo = topology::build_topology(b.sc.cluster);
  auto work = uniform_work(b.sc, capacity >= 0 ? capacity : capacity_of(b.sc));
  b.bp = build_step_plan(b.sc, *b.topo, work, d);
  return b;
}

int count_labels(const Plan& plan, const std::string& needle) {
  int n = 0;
  for (const auto& op : plan.ops())
    if (op.label.find(needle) != std::string::npos) ++n;
  return n;
}

const Op& find_op(const Plan& plan, const std::string& label) {
  for (const auto& op : plan.ops())
    if (op.label == label) return op;
  ADD_FAILURE() << "no op " << label;
  static Op none;
  return none;
}

sim::EngineConfig engine_config(const Scenario& sc, sim::NetworkKind kind) {
  sim::EngineConfig cfg;
  cfg.network = kind;
  cfg.net = strategies::scenario_network_params(sc);
  cfg.compute.launch_overhead = sc.engine.launch_overhead;
  cfg.compute.interference = strategies::scenario_interference(sc);
  cfg.precision = sc.model.dtype;
  return cfg;
}

// Time of MoE layer 0's forward: first op start to last op end.
double forward_moe_time(const BuiltPlan& bp, const RunResult& r) {
  double lo = 1e300, hi = 0;
  for (OpId id : bp.index.moe_layers.at(0).forward) {
    lo = std::min(lo, r.op_first_start(id));
    hi = std::max(hi, r.op_last_end(id));
  }
  return hi - lo;
}

// ---------------------------------------------------------------------------------------------
// Groups.

TEST(MakeGroups, RankMapOnSixteenRanks) {
  // ep 2 x esp 2 x mp 2 x dp 2: rank = ((d*2 + e)*2 + s)*2 + t.
  Cfg c;
  c.nodes = 2;
  c.gpn = 8;
  c.ep = 2;
  c.esp = 2;
  c.mp = 2;
  Scenario sc = make_scenario(c);
  ASSERT_EQ(sc.parallelism.dp, 2);
  Groups g = make_groups(sc);
  ASSERT_EQ(g.ep.groups.size(), 8u);
  EXPECT_EQ(g.ep.groups[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(g.ep.groups[1], (std::vector<int>{1, 5}));  // (d0, s0, t1)
  EXPECT_EQ(g.ep.groups[2], (std::vector<int>{2, 6}));  // (d0, s1, t0)
  EXPECT_EQ(g.esp.groups[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(g.mp.groups[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(g.mp.groups[7], (std::vector<int>{14, 15}));
  EXPECT_EQ(g.dp.groups[0], (std::vector<int>{0, 8}));
  EXPECT_EQ(g.ep_esp.groups[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(g.ep_esp.groups[1], (std::vector<int>{1, 3, 5, 7}));
  ASSERT_EQ(g.dense_dp.groups.size(), 2u);
  EXPECT_EQ(g.dense_dp.groups[0], (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  // Not sharded: one-GPU shard groups.
  EXPECT_EQ(g.shard.group_size(), 1);
  // Every grouping partitions the 16 ranks.
  for (const Grouping* gr : {&g.ep, &g.esp, &g.mp, &g.dp, &g.ep_esp, &g.dense_dp, &g.shard}) {
    std::vector<int> all;
    for (const auto& grp : gr->groups) all.insert(all.end(), grp.begin(), grp.end());
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), 16u) << gr->name;
    for (int i = 0; i < 16; ++i) EXPECT_EQ(all[i], i) << gr->name;
  }
}

TEST(MakeGroups, OverlappedLayoutOnSixteenRanks) {
  // ep 4 x esp 2 x dp 2 with mp 4 on the same GPUs: rank = (d*4 + e)*2 + s, MP blocks of 4.
  Cfg c;
  c.nodes = 2;
  c.gpn = 8;
  c.ep = 4;
  c.esp = 2;
  c.mp = 4;
  c.layout = "overlapped";
  Scenario sc = make_scenario(c);
  ASSERT_EQ(sc.parallelism.dp, 2);
  Groups g = make_groups(sc);
  ASSERT_EQ(g.ep.groups.size(), 4u);
  EXPECT_EQ(g.ep.groups[0], (std::vector<int>{0, 2, 4, 6}));     // (d0, s0)
  EXPECT_EQ(g.ep.groups[1], (std::vector<int>{1, 3, 5, 7}));     // (d0, s1)
  EXPECT_EQ(g.ep.groups[2], (std::vector<int>{8, 10, 12, 14}));  // (d1, s0)
  ASSERT_EQ(g.esp.groups.size(), 8u);
  EXPECT_EQ(g.esp.groups[0], (std::vector<int>{0, 1}));
  ASSERT_EQ(g.mp.groups.size(), 4u);
  EXPECT_EQ(g.mp.groups[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g.mp.groups[3], (std::vector<int>{12, 13, 14, 15}));
  ASSERT_EQ(g.dp.groups.size(), 8u);
  EXPECT_EQ(g.dp.groups[0], (std::vector<int>{0, 8}));
  ASSERT_EQ(g.ep_esp.groups.size(), 2u);
  EXPECT_EQ(g.ep_esp.groups[1], (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  ASSERT_EQ(g.dense_dp.groups.size(), 4u);
  EXPECT_EQ(g.dense_dp.groups[1], (std::vector<int>{1, 5, 9, 13}));
  for (const Grouping* gr : {&g.ep, &g.esp, &g.mp, &g.dp, &g.ep_esp, &g.dense_dp, &g.shard}) {
    std::vector<int> all;
    for (const auto& grp : gr->groups) all.insert(all.end(), grp.begin(), grp.end());
    std::sort(all.begin(), all.end());
    ASSERT_EQ(all.size(), 16u) << gr->name;
    for (int i = 0; i < 16; ++i) EXPECT_EQ(all[i], i) << gr->name;
  }
  // The rank map's inverse agrees with the groups.
  const ParallelismSpec& p = sc.parallelism;
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(p.rank_of(r / 8, p.ep_index(r), p.esp_index(r), 0), r);
    EXPECT_EQ(g.mp.groups[r / 4][p.mp_index(r)], r);
  }
}

TEST(MakeGroups, ShardGroupsAreConsecutiveEpPositions) {
  Cfg c;
  c.nodes = 2;
  c.gpn = 4;
  c.ep = 8;
  c.experts_per_gpu = -4;  // 2 experts over 4 GPUs each
  Scenario sc = make_scenario(c);
  Groups g = make_groups(sc);
  ASSERT_EQ(g.shard.groups.size(), 2u);
  EXPECT_EQ(g.shard.groups[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g.shard.groups[1], (std::vector<int>{4, 5, 6, 7}));
}

// ---------------------------------------------------------------------------------------------
// Structure and sizes.

TEST(PlanBuilder, ChunkCountsFollowThePipelineDegree) {
  for (int r : {1, 2, 3, 4}) {
    Decision d;
    d.pipeline_degree = r;
    Built b = build(Cfg{}, d);
    const auto& moe = b.bp.index.moe_layers.at(0);
    // Training: r forward + r backward of each.
    EXPECT_EQ(moe.dispatch.size(), 2u * r) << r;
    EXPECT_EQ(moe.combine.size(), 2u * r) << r;
    EXPECT_EQ(moe.expert.size(), 4u * r) << r;  // fc1 + fc2 per chunk, forward and backward
    EXPECT_EQ(count_labels(b.bp.plan, "fwd.dispatch.c"), r);
    EXPECT_EQ(count_labels(b.bp.plan, "fwd.combine.c"), r);
    EXPECT_EQ(count_labels(b.bp.plan, "fwd.gate"), 1);
    EXPECT_EQ(count_labels(b.bp.plan, "fwd.decode"), 1);
  }
}

TEST(PlanBuilder, DispatchBytesArePaddedBuffer) {
  // S = 512 tokens, E = 4 (2 per GPU), k = 2, f = 1: dC = 2*512/4 = 256; M = 256, fp16.
  Cfg c;
  c.experts_per_gpu = 2;
  Built b = build(c);
  const double expected = 4.0 * 256 * 256 * 2;  // E * dC * M * b
  const auto& moe = b.bp.index.moe_layers.at(0);
  for (OpId id : moe.dispatch) {
    const auto& spec = b.bp.plan.op(id).collective();
    EXPECT_EQ(spec.type, CollectiveType::kAllToAll);
    EXPECT_EQ(spec.algo, CollectiveAlgo::kLinear);
    EXPECT_DOUBLE_EQ(spec.bytes.value(), expected);
    EXPECT_EQ(b.bp.plan.grouping(spec.grouping).name, "ep");
  }
  for (OpId id : moe.combine)
    EXPECT_DOUBLE_EQ(b.bp.plan.op(id).collective().bytes.value(), expected);
  // Encode touches the buffer twice (read + write), decode k * S * M * b.
  EXPECT_DOUBLE_EQ(find_op(b.bp.plan, "L0.fwd.encode").compute().bytes.value(), 2 * expected);
  EXPECT_DOUBLE_EQ(find_op(b.bp.plan, "L0.fwd.decode").compute().bytes.value(),
                   2.0 * 512 * 256 * 2);
  const auto& gate = find_op(b.bp.plan, "L0.fwd.gate").compute();
  EXPECT_EQ(gate.cls, ComputeClass::kGate);
  EXPECT_EQ(gate.gemm->m, 512);
  EXPECT_EQ(gate.gemm->k, 256);
  EXPECT_EQ(gate.gemm->n, 4);
}

TEST(PlanBuilder, UnevenChunksConserveBytes) {
  // dC = 10 in 3 chunks: 4, 3, 3 slots.
  Decision d;
  d.pipeline_degree = 3;
  Built b = build(Cfg{}, d, /*capacity=*/10);
  const auto& moe = b.bp.index.moe_layers.at(0);
  const double slot = 2.0 * 256 * 2;  // E * M * b per slot
  std::vector<double> got;
  for (int j = 0; j < 3; ++j)
    got.push_back(b.bp.plan.op(moe.dispatch[j]).collective().bytes.value());
  EXPECT_EQ(got, (std::vector<double>{4 * slot, 3 * slot, 3 * slot}));
}

TEST(PlanBuilder, GemmShapesPlainVersusFlexible) {
  // W = 4 GPUs, dE = 2 (E = 8), S = 512, k = 2, f = 1: dC = 128; M = 256, H = 512.
  Cfg c;
  c.gpn = 4;
  c.ep = 4;
  c.experts_per_gpu = 2;
  Decision d;
  Built plain = build(c, d);
  const auto& p1 = find_op(plain.bp.plan, "L0.fwd.expert.fc1.c1").compute().gemm.value();
  const auto& p2 = find_op(plain.bp.plan, "L0.fwd.expert.fc2.c1").compute().gemm.value();
  EXPECT_EQ(p1.m, 128);
  EXPECT_EQ(p1.k, 256);
  EXPECT_EQ(p1.n, 512);
  EXPECT_EQ(p1.batch, 8);  // W * dE
  EXPECT_EQ(p2.m, 128);
  EXPECT_EQ(p2.k, 512);
  EXPECT_EQ(p2.n, 256);
  EXPECT_EQ(p2.batch, 8);
  d.layout = LayoutRole::kFlexible;
  Built flex = build(c, d);
  const auto& f1 = find_op(flex.bp.plan, "L0.fwd.expert.fc1.c1").compute();
  EXPECT_EQ(f1.gemm->m, 4 * 128);  // W * dC
  EXPECT_EQ(f1.gemm->k, 256);
  EXPECT_EQ(f1.gemm->n, 512);
  EXPECT_EQ(f1.gemm->batch, 2);  // dE
  const auto& f2 = find_op(flex.bp.plan, "L0.fwd.expert.fc2.c1").compute().gemm.value();
  EXPECT_EQ(f2.m, 4 * 128);
  EXPECT_EQ(f2.k, 512);
  EXPECT_EQ(f2.n, 256);
  // Same FLOPs either way: 2 * W*dC * dE * M * H.
  const double flops = 2.0 * 512 * 2 * 256 * 512;
  EXPECT_DOUBLE_EQ(f1.flops.value(), flops);
  EXPECT_DOUBLE_EQ(find_op(plain.bp.plan, "L0.fwd.expert.fc1.c1").compute().flops.value(), flops);
  // Backward GEMMs: 2x.
  EXPECT_DOUBLE_EQ(find_op(flex.bp.plan, "L0.bwd.expert.fc1.c1").compute().flops.value(),
                   2 * flops);
}

// model.dense_hidden_dim sets the dense FFN's width apart from the experts' H (fine-grained MoE):
// block 0's dense FFN is 768 wide (384 per MP rank), block 1's experts stay at H = 512.
TEST(PlanBuilder, DenseHiddenDimSetsTheDenseFfnApartFromTheExperts) {
  Cfg c;
  c.gpn = 4;
  c.layers = 2;
  c.moe_every = 2;
  c.mp = 2;
  Built base = build(c);
  c.model_extra = "  dense_hidden_dim: 768\n";
  Built b = build(c);
  const double S = 512, M = 256, Hd = 768, mp = 2;
  auto flops = [&](const Built& x, const std::string& l) {
    return find_op(x.bp.plan, l).compute().flops.value();
  };
  EXPECT_EQ(find_op(b.bp.plan, "L0.fwd.ffn.fc1").compute().gemm->n, 384);
  EXPECT_EQ(find_op(b.bp.plan, "L0.fwd.ffn.fc2").compute().gemm->k, 384);
  EXPECT_DOUBLE_EQ(flops(b, "L0.fwd.ffn.fc1") + flops(b, "L0.fwd.ffn.fc2"), 4 * S * M * Hd / mp);
  // Without the key the dense FFN is 4M = 1,024 wide (512 per MP rank).
  EXPECT_EQ(find_op(base.bp.plan, "L0.fwd.ffn.fc1").compute().gemm->n, 512);
  // The experts do not change.
  EXPECT_DOUBLE_EQ(flops(b, "L1.fwd.expert.fc1.c1"), flops(base, "L1.fwd.expert.fc1.c1"));
  // The dense block's gradient bucket: attention 4 M (M/mp) + dense FFN 2 M (Hd/mp), fp16.
  EXPECT_DOUBLE_EQ(find_op(b.bp.plan, "L0.grad.dense_allreduce").collective().bytes.value(),
                   (4 * M * M / mp + 2 * M * Hd / mp) * 2);
}

// parallelism.grad_bucket: the dense gradients of consecutive blocks (backward order) share an
// all-reduce once the bucket reaches its cap, launched after the block that filled it; the bytes
// are those of the per-block all-reduces, summed.
TEST(PlanBuilder, GradientBucketsGroupBlocksUpToTheirCap) {
  Cfg c;  // 1 node x 2 GPUs, ep 2: the dense gradients are all-reduced over both GPUs
  c.layers = 4;
  c.moe_every = 2;  // blocks 1 and 3 are MoE
  const Built per_block = build(c);
  auto bytes = [](const Built& b, const std::string& label) {
    return find_op(b.bp.plan, label).collective().bytes.value();
  };
  const double dense = bytes(per_block, "L0.grad.dense_allreduce");  // attention + dense FFN
  const double moe = bytes(per_block, "L1.grad.dense_allreduce");    // attention + gate
  EXPECT_DOUBLE_EQ(bytes(per_block, "L2.grad.dense_allreduce"), dense);
  EXPECT_DOUBLE_EQ(bytes(per_block, "L3.grad.dense_allreduce"), moe);
  // A cap of one dense + one MoE block: backward fills L3 + L2, then L1 + L0.
  c.grad_bucket = fmt::format("{}B", dense + moe);
  const Built two = build(c);
  const Op& upper = find_op(two.bp.plan, "L2-3.grad.dense_allreduce");
  const Op& lower = find_op(two.bp.plan, "L0-1.grad.dense_allreduce");
  EXPECT_DOUBLE_EQ(upper.collective().bytes.value(), dense + moe);
  EXPECT_DOUBLE_EQ(lower.collective().bytes.value(), dense + moe);
  // Each waits for what the per-block all-reduce of the block that filled it waits for.
  auto dep_label = [](const Built& b, const Op& op) {
    EXPECT_EQ(op.deps.size(), 1u) << op.label;
    return b.bp.plan.op(op.deps.at(0)).label;
  };
  EXPECT_EQ(dep_label(two, upper),
            dep_label(per_block, find_op(per_block.bp.plan, "L2.grad.dense_allreduce")));
  EXPECT_EQ(dep_label(two, lower),
            dep_label(per_block, find_op(per_block.bp.plan, "L0.grad.dense_allreduce")));
  // PyTorch's defaults: a first bucket of 1 MiB, then 25 MiB. Here a dense block holds
  // 12 M^2 x 2 B = 1.57 MB and an MoE block (4 M^2 + M E) x 2 B = 0.52 MB: L3 alone stays under
  // 1 MiB, L3 + L2 close the first bucket, L1 + L0 (2.1 MB < 25 MiB) wait for the end.
  ASSERT_DOUBLE_EQ(dense, 12.0 * 256 * 256 * 2);
  ASSERT_DOUBLE_EQ(moe, (4.0 * 256 * 256 + 256 * 2) * 2);
  c.grad_bucket = "pytorch";
  const Built torch = build(c);
  EXPECT_DOUBLE_EQ(bytes(torch, "L2-3.grad.dense_allreduce"), dense + moe);
  EXPECT_DOUBLE_EQ(bytes(torch, "L0-1.grad.dense_allreduce"), dense + moe);
  int buckets = 0;
  for (const Op& op : torch.bp.plan.ops())
    buckets += op.label.find("grad.dense_allreduce") != std::string::npos ? 1 : 0;
  EXPECT_EQ(buckets, 2);
}

// model.shared_experts = 2: one FFN of hidden 2 H = 1,024 beside the routed experts, on the
// compute stream right after the encode (so it runs while the first dispatch is on the wire), the
// decode waiting for it; backward at 2x the FLOPs; its 2 M (2 H) weights in the dense bucket.
TEST(PlanBuilder, SharedExpertsRunBesideTheDispatch) {
  Cfg c;  // 1 node x 2 GPUs, ep 2: S = 512, M = 256, H = 512
  c.model_extra = "  shared_experts: 2\n";
  Built b = build(c);
  Built base = build(Cfg{});
  const double S = 512, M = 256, Hs = 2 * 512;
  const Op& fc1 = find_op(b.bp.plan, "L0.fwd.shared.fc1");
  const Op& fc2 = find_op(b.bp.plan, "L0.fwd.shared.fc2");
  EXPECT_EQ(fc1.compute().gemm->n, 1024);
  EXPECT_DOUBLE_EQ(fc1.compute().flops.value() + fc2.compute().flops.value(), 4 * S * M * Hs);
  EXPECT_DOUBLE_EQ(find_op(b.bp.plan, "L0.bwd.shared.fc1").compute().flops.value(),
                   2 * fc1.compute().flops.value());
  const Op& enc = find_op(b.bp.plan, "L0.fwd.encode");
  const Op& disp = find_op(b.bp.plan, "L0.fwd.dispatch.c1");
  const Op& expert = find_op(b.bp.plan, "L0.fwd.expert.fc1.c1");
  EXPECT_EQ(fc1.stream, enc.stream);
  EXPECT_GT(fc1.id, enc.id);     // after the encode on the compute stream,
  EXPECT_LT(fc2.id, expert.id);  // before the first expert GEMM,
  EXPECT_TRUE(std::find(fc1.deps.begin(), fc1.deps.end(), disp.id) == fc1.deps.end());
  const Op& dec = find_op(b.bp.plan, "L0.fwd.decode");
  EXPECT_TRUE(std::find(dec.deps.begin(), dec.deps.end(), fc2.id) != dec.deps.end());
  // The dense bucket of the MoE block grows by the shared weights 2 M (2 H), fp16.
  EXPECT_DOUBLE_EQ(find_op(b.bp.plan, "L0.grad.dense_allreduce").collective().bytes.value() -
                       find_op(base.bp.plan, "L0.grad.dense_allreduce").collective().bytes.value(),
                   2 * M * Hs * 2);
  // On the engine the shared FFN overlaps the dispatch: it starts before the dispatch ends, and
  // the layer's forward grows by less than the shared FFN takes.
  const RunResult r =
      sim::run_plan(b.bp.plan, *b.topo, engine_config(b.sc, sim::NetworkKind::kFlow));
  const RunResult r0 =
      sim::run_plan(base.bp.plan, *base.topo, engine_config(base.sc, sim::NetworkKind::kFlow));
  EXPECT_LT(r.op_start(fc1.id, 0), r.op_end(disp.id, 0));
  const double shared_s = r.op_end(fc2.id, 0) - r.op_start(fc1.id, 0);
  const OpId dec0 = find_op(base.bp.plan, "L0.fwd.decode").id;
  EXPECT_GT(shared_s, 0);
  EXPECT_LT(r.op_end(dec.id, 0) - r0.op_end(dec0, 0), shared_s);
}

// first_dense_layers = 1 of 3 blocks: block 0 dense, blocks 1 and 2 MoE layers 0 and 1.
TEST(PlanBuilder, FirstDenseLayersComeBeforeTheMoeBlocks) {
  Cfg c;
  c.layers = 3;
  c.model_extra = "  first_dense_layers: 1\n";
  Built b = build(c);
  EXPECT_EQ(count_labels(b.bp.plan, "L0.fwd.ffn.fc1"), 1);
  EXPECT_EQ(count_labels(b.bp.plan, "L0.fwd.gate"), 0);
  EXPECT_EQ(count_labels(b.bp.plan, "L1.fwd.gate"), 1);
  EXPECT_EQ(count_labels(b.bp.plan, "L2.fwd.gate"), 1);
  EXPECT_EQ(count_labels(b.bp.plan, ".fwd.ffn.fc1"), 1);
  ASSERT_EQ(b.bp.index.moe_layers.size(), 2u);
}

// model.vocab_size = 1,000 over mp = 2: embedding first, LM head S x M . M x 500 and the loss
// last, their backward first; tied, the one V x M/mp gradient is all-reduced after the
// embedding's backward; untied, the LM head's right after its backward (the first gradient sync).
TEST(PlanBuilder, VocabularyAddsEmbeddingLmHeadAndTheirGradients) {
  Cfg c;
  c.nodes = 2;
  c.gpn = 4;
  c.mp = 2;  // ep 2 x dp 2: dense_dp = the 4 ranks of one MP index
  c.model_extra = "  vocab_size: 1000\n";
  Built tied = build(c);
  const double S = 512, M = 256, Vp = 500;
  const Op& head = find_op(tied.bp.plan, "lm_head.fwd");
  EXPECT_EQ(head.compute().gemm->n, 500);
  EXPECT_DOUBLE_EQ(head.compute().flops.value(), 2 * S * M * Vp);
  EXPECT_DOUBLE_EQ(find_op(tied.bp.plan, "lm_head.bwd").compute().flops.value(), 4 * S * M * Vp);
  EXPECT_EQ(tied.bp.plan.ops().front().label, "embed.fwd");
  EXPECT_EQ(count_labels(tied.bp.plan, "lm_head.grad.allreduce"), 0);
  const Op& g = find_op(tied.bp.plan, "embed.grad.allreduce");
  EXPECT_DOUBLE_EQ(g.collective().bytes.value(), 1000 * (M / 2) * 2);
  EXPECT_EQ(tied.bp.plan.grouping(g.collective().grouping).name, "dense_dp");
  EXPECT_EQ(tied.bp.index.gradient_sync.back(), g.id);  // the last gradient all-reduce

  c.model_extra = "  vocab_size: 1000\n  tie_embeddings: false\n";
  Built untied = build(c);
  const Op& lm = find_op(untied.bp.plan, "lm_head.grad.allreduce");
  EXPECT_EQ(untied.bp.index.gradient_sync.front(), lm.id);  // before every block's bucket
  EXPECT_EQ(lm.deps, std::vector<OpId>{find_op(untied.bp.plan, "lm_head.bwd").id});
  EXPECT_DOUBLE_EQ(lm.collective().bytes.value(), 1000 * (M / 2) * 2);
  EXPECT_EQ(count_labels(untied.bp.plan, "embed.grad.allreduce"), 1);
}

TEST(PlanBuilder, AttentionAndDenseFfnFlops) {
  // Two blocks, MoE every 2nd: block 0 dense FFN, block 1 MoE. mp = 2.
  Cfg c;
  c.gpn = 4;
  c.layers = 2;
  c.moe_every = 2;
  c.mp = 2;
  Built b = build(c);
  const double S = 512, L = 256, M = 256;
  auto flops = [&](const std::string& l) { return find_op(b.bp.plan, l).compute().flops.value(); };
  const double attn =
      flops("L0.fwd.attn.qkv") + flops("L0.fwd.attn.core") + flops("L0.fwd.attn.proj");
  // Megatron's projections 8 S M^2 and the causal half of the core's 4 S L M, / mp.
  EXPECT_DOUBLE_EQ(attn, (8 * S * M * M + 4 * S * L * M / 2) / 2);
  EXPECT_DOUBLE_EQ(flops("L0.fwd.ffn.fc1") + flops("L0.fwd.ffn.fc2"), 16 * S * M * M / 2);
  EXPECT_DOUBLE_EQ(flops("L0.bwd.ffn.fc1"), 2 * flops("L0.fwd.ffn.fc1"));
  EXPECT_EQ(count_labels(b.bp.plan, "L1.fwd.ffn"), 0);
  EXPECT_EQ(count_labels(b.bp.plan, "L1.fwd.gate"), 1);
  // MP all-reduces of S*M*b: forward attention + dense FFN of block 0, attention of block 1;
  // the same in backward.
  int mp_ars = 0;
  for (const auto& op : b.bp.plan.ops())
    if (op.label.find("mp_allreduce") != std::string::npos) {
      ++mp_ars;
      EXPECT_DOUBLE_EQ(op.collective().bytes.value(), S * M * 2);
      EXPECT_EQ(b.bp.plan.grouping(op.collective().grouping).name, "mp");
    }
  EXPECT_EQ(mp_ars, 6);
  ASSERT_EQ(b.bp.index.moe_layers.size(), 1u);
}

// fp8 GEMMs carry their quantization kernels' bytes (docs/model.md, "Precision"), one fp32
// scale per 128 elements: forward the input cast (b + 1 bytes per element), backward the output
// gradient cast twice and the kept fp8 input transposed (2 bytes). S = 512, M = 256, b = 2.
TEST(PlanBuilder, Fp8GemmsCarryTheirQuantizationBytes) {
  Cfg c;
  c.model_extra = "  precision: {gemm: fp8, dispatch: fp8, combine: fp16}\n";
  Built b = build(c);
  const double S = 512, M = 256, H = 512, cast = 2 + 1 + 1.0 / 32, transpose = 2 + 1.0 / 32;
  auto cast_of = [&](const std::string& l) {
    return find_op(b.bp.plan, l).compute().cast_bytes.value();
  };
  // attn.qkv: S x M -> 3M.
  EXPECT_DOUBLE_EQ(cast_of("L0.fwd.attn.qkv"), S * M * cast);
  EXPECT_DOUBLE_EQ(cast_of("L0.bwd.attn.qkv"), 2 * S * 3 * M * cast + S * M * transpose);
  // The routed fc1's tokens arrive in fp8 (fp8 dispatch): no forward cast; fc2's input is cast.
  const auto& fc1 = find_op(b.bp.plan, "L0.fwd.expert.fc1.c1").compute();
  const double rows = static_cast<double>(fc1.gemm->m * fc1.gemm->batch);
  EXPECT_EQ(cast_of("L0.fwd.expert.fc1.c1"), 0.0);
  EXPECT_DOUBLE_EQ(cast_of("L0.fwd.expert.fc2.c1"), rows * H * cast);
  EXPECT_DOUBLE_EQ(cast_of("L0.bwd.expert.fc1.c1"), 2 * rows * H * cast + rows * M * transpose);
  // The attention core and the gate stay 16-bit: nothing to cast.
  EXPECT_EQ(cast_of("L0.fwd.attn.core"), 0.0);
  EXPECT_EQ(cast_of("L0.fwd.gate"), 0.0);
  // Without fp8 no GEMM casts.
  Built plain = build(Cfg{});
  for (const auto& op : plain.bp.plan.ops()) {
    if (op.kind != OpKind::kCompute) continue;
    EXPECT_EQ(op.compute().cast_bytes.value(), 0.0) << op.label;
  }
}

TEST(PlanBuilder, ParallelModesForShardedExperts) {
  // 8 GPUs, 2 experts sharded over n = 4 GPUs; S = 512, k = 2, f = 1: dC = 512; M = 256, H = 512.
  Cfg c;
  c.nodes = 2;
  c.gpn = 4;
  c.ep = 8;
  c.experts_per_gpu = -4;
  c.layers = 1;
  const double M = 256, H = 512, b = 2, dC = 512, E = 2;
  std::map<int, Built> by_r;
  for (int r : {1, 2, 4}) {
    Decision d;
    d.parallel_degree = r;
    d.layout = LayoutRole::kFlexible;
    by_r.emplace(r, build(c, d));
  }
  auto dispatch_bytes = [&](int r) {
    const auto& b = by_r.at(r).bp;
    return b.plan.op(b.index.moe_layers[0].dispatch[0]).collective().bytes.value();
  };
  EXPECT_DOUBLE_EQ(dispatch_bytes(1), E * dC * M * b);
  EXPECT_DOUBLE_EQ(dispatch_bytes(4), 4 * dispatch_bytes(1));  // P2 = n x P1
  EXPECT_DOUBLE_EQ(dispatch_bytes(2), 2 * dispatch_bytes(1));
  // P1: all-gather of the whole expert within its 4 GPUs; reduce-scatter of its gradient.
  const Plan& p1 = by_r.at(1).bp.plan;
  const auto& ag = find_op(p1, "L0.fwd.param_allgather").collective();
  EXPECT_EQ(ag.type, CollectiveType::kAllGather);
  EXPECT_DOUBLE_EQ(ag.bytes.value(), 2 * M * H * b);
  EXPECT_EQ(p1.grouping(ag.grouping).group_size(), 4);
  EXPECT_EQ(p1.grouping(ag.grouping).groups[1], (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(find_op(p1, "L0.grad.expert_reduce_scatter").collective().type,
            CollectiveType::kReduceScatter);
  const auto& e1 = find_op(p1, "L0.fwd.expert.fc1.c1").compute().gemm.value();
  EXPECT_EQ(e1.m, 8 / 4 * 512);  // W/n sources' worth of tokens: dC/n from each of W
  EXPECT_EQ(e1.n, 512);
  EXPECT_EQ(count_labels(p1, "partial_sum"), 0);
  // r = 2: gather within groups of 2, half the expert.
  const Plan& p_r2 = by_r.at(2).bp.plan;
  const auto& ag2 = find_op(p_r2, "L0.fwd.param_allgather").collective();
  EXPECT_DOUBLE_EQ(ag2.bytes.value(), M * H * b);
  EXPECT_EQ(p_r2.grouping(ag2.grouping).groups[1], (std::vector<int>{2, 3}));
  EXPECT_EQ(find_op(p_r2, "L0.fwd.expert.fc1.c1").compute().gemm->n, 256);
  // P2: no parameter movement, hidden split 4 ways, every token, partial sums added locally.
  const Plan& p2 = by_r.at(4).bp.plan;
  EXPECT_EQ(count_labels(p2, "param_allgather"), 0);
  EXPECT_EQ(count_labels(p2, "expert_reduce_scatter"), 0);
  const auto& e2 = find_op(p2, "L0.fwd.expert.fc1.c1").compute();
  EXPECT_EQ(e2.gemm->n, 512 / 4);
  EXPECT_EQ(e2.gemm->m, 8 * 512);
  // Equal local computation in every mode.
  EXPECT_DOUBLE_EQ(e2.flops.value(), find_op(p1, "L0.fwd.expert.fc1.c1").compute().flops.value());
  EXPECT_EQ(count_labels(p2, "fwd.partial_sum"), 1);
}

TEST(PlanBuilder, EspBaselineGathersTokensAndSumsSlices) {
  // DeepSpeed-MoE baseline with esp = 2 (Parm §III), ep = 2, mp = 1, dp = 1 on 4 GPUs:
  // S = 512, E = 2, k = 2, f = 1: dC = 512; M = 256, H = 512.
  Cfg c;
  c.gpn = 4;
  c.ep = 2;
  c.esp = 2;
  Built b = build(c);
  const Plan& p = b.bp.plan;
  const auto& ag = find_op(p, "L0.fwd.esp_allgather").collective();
  EXPECT_EQ(ag.type, CollectiveType::kAllGather);
  EXPECT_DOUBLE_EQ(ag.bytes.value(), 2.0 * 512 * 256 * 2);  // S * esp * M * b
  EXPECT_EQ(p.grouping(ag.grouping).groups[0], (std::vector<int>{0, 1}));
  const double a2a = 2.0 * 2 * 512 * 256 * 2;  // esp * E * dC * M * b
  EXPECT_DOUBLE_EQ(find_op(p, "L0.fwd.dispatch.c1").collective().bytes.value(), a2a);
  EXPECT_EQ(p.grouping(find_op(p, "L0.fwd.dispatch.c1").collective().grouping).groups[0],
            (std::vector<int>{0, 2}));
  const auto& ar = find_op(p, "L0.fwd.esp_allreduce.c1").collective();
  EXPECT_EQ(ar.type, CollectiveType::kAllReduce);
  EXPECT_DOUBLE_EQ(ar.bytes.value(), a2a);
  // The gate sees the gathered tokens; the expert its H / esp slice of W * esp * dC tokens.
  EXPECT_EQ(find_op(p, "L0.fwd.gate").compute().gemm->m, 1024);
  b.bp.plan.validate();
  // Backward: each ESP rank kept its own rows of the decoded unit, so the output gradients are
  // all-gathered first (the bytes of the forward's gather), before the decode's backward; the
  // input gradients' split back is free (no reduce-scatter).
  const Op& bag = find_op(p, "L0.bwd.esp_allgather");
  EXPECT_EQ(bag.collective().type, CollectiveType::kAllGather);
  EXPECT_DOUBLE_EQ(bag.collective().bytes.value(), ag.bytes.value());
  EXPECT_EQ(find_op(p, "L0.bwd.decode").deps, (std::vector<OpId>{bag.id}));
  EXPECT_EQ(count_labels(p, "reduce_scatter"), 0);
  EXPECT_EQ(count_labels(p, "L0.bwd.esp_allreduce.c1"), 1);
  // Order on comm_out: the ESP all-reduce of a chunk precedes its combine.
  EXPECT_LT(find_op(p, "L0.fwd.esp_allreduce.c1").id, find_op(p, "L0.fwd.combine.c1").id);
  EXPECT_EQ(find_op(p, "L0.fwd.combine.c1").deps,
            (std::vector<OpId>{find_op(p, "L0.fwd.esp_allreduce.c1").id}));
  Decision flex;
  flex.layout = LayoutRole::kFlexible;
  Built f = build(c, flex);
  const auto& e = find_op(f.bp.plan, "L0.fwd.expert.fc1.c1").compute().gemm.value();
  EXPECT_EQ(e.m, 2 * 2 * 512);
  EXPECT_EQ(e.n, 256);
  EXPECT_EQ(e.batch, 1);
}

TEST(PlanBuilder, TrainingHasBackwardAndGradientSyncInferenceNone) {
  Cfg c;
  c.nodes = 2;
  c.gpn = 2;
  c.ep = 2;  // dp = 2: expert gradients all-reduced too; dense over all 4
  c.layers = 2;
  Built t = build(c);
  EXPECT_GT(count_labels(t.bp.plan, ".bwd."), 0);
  // Per block one dense bucket over dense_dp (4 ranks), per MoE block one expert all-reduce over
  // dp (2 ranks).
  ASSERT_EQ(t.bp.index.gradient_sync.size(), 4u);
  std::map<std::string, int> by_group;
  for (OpId id : t.bp.index.gradient_sync) {
    const Op& op = t.bp.plan.op(id);
    EXPECT_EQ(t.bp.plan.stream_names()[op.stream], "grad");
    EXPECT_EQ(op.collective().type, CollectiveType::kAllReduce);
    ++by_group[t.bp.plan.grouping(op.collective().grouping).name];
  }
  EXPECT_EQ(by_group["dense_dp"], 2);
  EXPECT_EQ(by_group["dp"], 2);
  // Dense bucket of an MoE block: attention 4*M*M + gate M*E parameters, fp16.
  EXPECT_DOUBLE_EQ(find_op(t.bp.plan, "L1.grad.dense_allreduce").collective().bytes.value(),
                   (4.0 * 256 * 256 + 256 * 2) * 2);
  // Expert bucket: dE * 2 * M * H * b.
  EXPECT_DOUBLE_EQ(find_op(t.bp.plan, "L1.grad.expert_allreduce").collective().bytes.value(),
                   2.0 * 256 * 512 * 2);
  for (const auto& moe : t.bp.index.moe_layers) EXPECT_FALSE(moe.backward.empty());

  c.mode = "inference";
  Built inf = build(c);
  EXPECT_EQ(count_labels(inf.bp.plan, ".bwd."), 0);
  EXPECT_TRUE(inf.bp.index.gradient_sync.empty());
  for (const auto& op : inf.bp.plan.ops())
    if (op.kind == OpKind::kCollective) {
      EXPECT_NE(op.collective().type, CollectiveType::kAllReduce) << op.label;
    }
  for (const auto& moe : inf.bp.index.moe_layers) {
    EXPECT_TRUE(moe.backward.empty());
    EXPECT_EQ(moe.dispatch.size(), 1u);
  }
}

TEST(PlanBuilder, IndexCoversEveryMoeOp) {
  Cfg c;
  c.layers = 4;
  c.moe_every = 2;
  Decision d;
  d.pipeline_degree = 2;
  Built b = build(c, d);
  ASSERT_EQ(b.bp.index.moe_layers.size(), 2u);
  for (const auto& moe : b.bp.index.moe_layers) {
    const int block = 2 * moe.layer + 1;
    const std::string prefix = fmt::format("L{}.", block);
    for (OpId id : moe.forward) EXPECT_EQ(b.bp.plan.op(id).label.rfind(prefix + "fwd.", 0), 0u);
    for (OpId id : moe.backward) EXPECT_EQ(b.bp.plan.op(id).label.rfind(prefix + "bwd.", 0), 0u);
    // forward = norm, gate, encode, 2 x (dispatch, fc1, act, fc2, combine), decode; backward
    // the mirror.
    EXPECT_EQ(moe.forward.size(), 14u);
    EXPECT_EQ(moe.backward.size(), 14u);
    for (OpId id : moe.dispatch)
      EXPECT_NE(b.bp.plan.op(id).label.find("dispatch"), std::string::npos);
  }
}

TEST(PlanBuilder, ValidatesAndRunsForManyConfigurations) {
  struct Case {
    Cfg c;
    Decision d;
  };
  std::vector<Case> cases;
  {
    Case k;  // quickstart-like
    k.c.nodes = 2;
    k.c.gpn = 4;
    k.c.ep = 8;
    k.d.pipeline_degree = 2;
    k.d.a2a = CollectiveAlgo::k2dh;
    cases.push_back(k);
  }
  {
    Case k;  // MP + EP + ESP + DP, two blocks
    k.c.nodes = 2;
    k.c.gpn = 8;
    k.c.ep = 2;
    k.c.esp = 2;
    k.c.mp = 2;
    k.c.layers = 2;
    k.d.pipeline_degree = 2;
    cases.push_back(k);
  }
  {
    Case k;  // sharded experts, intermediate r, inference
    k.c.nodes = 2;
    k.c.gpn = 4;
    k.c.ep = 8;
    k.c.experts_per_gpu = -4;
    k.c.mode = "inference";
    k.d.parallel_degree = 2;
    k.d.layout = LayoutRole::kFlexible;
    cases.push_back(k);
  }
  {
    Case k;  // sharded experts P1 with dp = 2, training
    k.c.nodes = 2;
    k.c.gpn = 4;
    k.c.ep = 4;
    k.c.experts_per_gpu = -2;
    k.d.pipeline_degree = 3;
    cases.push_back(k);
  }
  for (const auto& k : cases) {
    Built b = build(k.c, k.d);
    EXPECT_NO_THROW(b.bp.plan.validate()) << k.d.describe();
    for (auto kind : {sim::NetworkKind::kAnalytical, sim::NetworkKind::kFlow}) {
      RunResult r = sim::run_plan(b.bp.plan, *b.topo, engine_config(b.sc, kind));
      EXPECT_GT(r.makespan_s, 0) << k.d.describe();
      EXPECT_GT(r.breakdown.a2a_s, 0) << k.d.describe();
    }
  }
}

TEST(PlanBuilder, Deterministic) {
  Cfg c;
  c.nodes = 2;
  c.gpn = 4;
  c.ep = 4;
  c.layers = 2;
  Decision d;
  d.pipeline_degree = 2;
  Built a = build(c, d), b = build(c, d);
  ASSERT_EQ(a.bp.plan.ops().size(), b.bp.plan.ops().size());
  for (size_t i = 0; i < a.bp.plan.ops().size(); ++i) {
    const Op &x = a.bp.plan.ops()[i], &y = b.bp.plan.ops()[i];
    EXPECT_EQ(x.label, y.label);
    EXPECT_EQ(x.deps, y.deps);
    EXPECT_EQ(x.stream, y.stream);
    EXPECT_TRUE(x.ranks == y.ranks);
    EXPECT_EQ(x.spec.index(), y.spec.index());
  }
  EXPECT_EQ(a.bp.index.gradient_sync, b.bp.index.gradient_sync);
}

TEST(PlanBuilder, DescribeIsStable) {
  Decision d;
  EXPECT_EQ(d.describe(), "r=1 a2a=linear layout=plain parallel=1");
  d.pipeline_degree = 2;
  d.a2a = CollectiveAlgo::k2dh;
  d.layout = LayoutRole::kFlexible;
  EXPECT_EQ(d.describe(), "r=2 a2a=2dh layout=flexible parallel=1");
}

// ---------------------------------------------------------------------------------------------
// Errors.

TEST(PlanBuilder, RejectsDecisionsThatCannotApply) {
  Cfg c;
  Scenario sc = make_scenario(c);
  auto topo = topology::build_topology(sc.cluster);
  auto work = uniform_work(sc, 4);
  Decision d;
  d.pipeline_degree = 5;  // > dC = 4
  try {
    build_step_plan(sc, *topo, work, d);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline"), std::string::npos) << e.what();
  }
  d.pipeline_degree = 4;  // = dC: fine
  EXPECT_NO_THROW(build_step_plan(sc, *topo, work, d));
  d = Decision{};
  d.parallel_degree = 2;  // experts not sharded: n = 1
  EXPECT_THROW(build_step_plan(sc, *topo, work, d), InputError);

  // r must divide n = 4.
  Cfg s;
  s.nodes = 2;
  s.gpn = 4;
  s.ep = 8;
  s.experts_per_gpu = -4;
  Scenario ssc = make_scenario(s);
  auto stopo = topology::build_topology(ssc.cluster);
  auto swork = uniform_work(ssc, 16);
  d = Decision{};
  d.parallel_degree = 3;
  try {
    build_step_plan(ssc, *stopo, swork, d);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel"), std::string::npos) << e.what();
  }

  // 2DH on an EP group that is not node-aligned: 3 nodes x 2 GPUs, ep = 3: group {0, 1, 2}.
  Cfg n;
  n.nodes = 3;
  n.gpn = 2;
  n.ep = 3;
  Scenario nsc = make_scenario(n);
  auto ntopo = topology::build_topology(nsc.cluster);
  auto nwork = uniform_work(nsc, 8);
  d = Decision{};
  d.a2a = CollectiveAlgo::k2dh;
  try {
    build_step_plan(nsc, *ntopo, nwork, d);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("2dh"), std::string::npos) << e.what();
  }
  d.a2a = CollectiveAlgo::kLinear;
  EXPECT_NO_THROW(build_step_plan(nsc, *ntopo, nwork, d));

  // Workload of the wrong shape.
  auto bad = uniform_work(sc, 4);
  bad.layers.clear();
  EXPECT_THROW(build_step_plan(sc, *topo, bad, Decision{}), InputError);
}

// ---------------------------------------------------------------------------------------------
// Timing, on the engine.

struct ChunkTimes {
  std::vector<double> d, e, c;     // durations
  std::vector<double> td, te, tc;  // measured starts
};

// Durations and starts of the forward chunks of MoE layer 0 (rank 0), expert = fc1 + fc2.
ChunkTimes chunk_times(const BuiltPlan& bp, const RunResult& r) {
  const auto& moe = bp.index.moe_layers.at(0);
  ChunkTimes t;
  for (size_t j = 0; j < moe.dispatch.size(); ++j) {
    OpId d = moe.dispatch[j], c = moe.combine[j];
    if (bp.plan.op(d).label.find(".fwd.") == std::string::npos) break;
    OpId f1 = moe.expert[2 * j], f2 = moe.expert[2 * j + 1];
    t.td.push_back(r.op_start(d, 0));
    t.d.push_back(r.op_end(d, 0) - r.op_start(d, 0));
    t.te.push_back(r.op_start(f1, 0));
    t.e.push_back(r.op_end(f2, 0) - r.op_start(f1, 0));
    t.tc.push_back(r.op_start(c, 0));
    t.c.push_back(r.op_end(c, 0) - r.op_start(c, 0));
  }
  return t;
}

// docs/strategy-specs.md §3 recurrences from measured durations; returns the predicted starts.
ChunkTimes recurrence(const ChunkTimes& m) {
  ChunkTimes p = m;
  const size_t r = m.d.size();
  for (size_t j = 0; j < r; ++j) {
    p.td[j] = j == 0 ? m.td[0] : p.td[j - 1] + m.d[j - 1];
    p.te[j] = j == 0 ? p.td[0] + m.d[0] : std::max(p.te[j - 1] + m.e[j - 1], p.td[j] + m.d[j]);
    p.tc[j] = j == 0 ? p.te[0] + m.e[0] : std::max(p.te[j] + m.e[j], p.tc[j - 1] + m.c[j - 1]);
  }
  return p;
}

// The chunk recurrences' idealised machine: no fixed costs, compute beside communication at full
// speed (no interference) and the two all-to-all streams on links of their own (no NIC
// sharing), so chunk times add up as the hand-worked units.
sim::EngineConfig no_overhead_config(const Scenario& sc) {
  sim::EngineConfig cfg = engine_config(sc, sim::NetworkKind::kAnalytical);
  cfg.compute.launch_overhead = Seconds(0);
  cfg.compute.interference = 0;
  cfg.analytical_nic_sharing = false;
  cfg.net.message_overhead_s = 0;
  cfg.net.message_latency_s = 0;
  return cfg;
}

// 2 nodes x 1 GPU over 200 Gb/s: the a2a is slow relative to A100 compute, so compute ~ comm is
// reached with a large hidden size.
Cfg two_node_cfg(int hidden) {
  Cfg c;
  c.nodes = 2;
  c.gpn = 1;
  c.ep = 2;
  c.mode = "inference";
  c.batch = 4;
  c.seq = 1024;
  c.model_dim = 1024;
  c.hidden = hidden;
  c.top_k = 1;
  c.experts_per_gpu = 1;
  return c;
}

TEST(PlanBuilderTiming, ChunksFollowTheRecurrences) {
  // Compute-bound (large H) and communication-bound (small H), r = 2, 3, 4: measured chunk start
  // times equal the recurrence computed from the measured chunk durations.
  for (int hidden : {1024, 65536}) {
    for (int r : {2, 3, 4}) {
      Decision d;
      d.pipeline_degree = r;
      d.layout = LayoutRole::kFlexible;
      Built b = build(two_node_cfg(hidden), d);
      RunResult res = sim::run_plan(b.bp.plan, *b.topo, no_overhead_config(b.sc));
      ChunkTimes m = chunk_times(b.bp, res);
      ASSERT_EQ(m.d.size(), static_cast<size_t>(r));
      ChunkTimes p = recurrence(m);
      for (int j = 0; j < r; ++j) {
        const double tol = 1e-12 + 1e-9 * p.tc.back();
        EXPECT_NEAR(m.td[j], p.td[j], tol) << "H=" << hidden << " r=" << r << " j=" << j;
        EXPECT_NEAR(m.te[j], p.te[j], tol) << "H=" << hidden << " r=" << r << " j=" << j;
        EXPECT_NEAR(m.tc[j], p.tc[j], tol) << "H=" << hidden << " r=" << r << " j=" << j;
      }
    }
  }
}

TEST(PlanBuilderTiming, BalancedTwoChunksTakeFourUnitsNotSix) {
  // Pick H so that the expert time matches the all-to-all time (d = e = c), then r = 2 runs the
  // dispatch/expert/combine part in ~4 chunk units (2/3 of r = 1's 3 full units); a serialised
  // plan would take 6 chunk units (= r = 1).
  int hidden = 4096;
  double d1 = 0, e1 = 0;
  for (int iter = 0; iter < 3; ++iter) {
    Built b = build(two_node_cfg(hidden), Decision{});
    RunResult res = sim::run_plan(b.bp.plan, *b.topo, no_overhead_config(b.sc));
    ChunkTimes m = chunk_times(b.bp, res);
    d1 = m.d[0];
    e1 = m.e[0];
    hidden = std::max(64, static_cast<int>(std::lround(hidden * d1 / e1 / 64.0)) * 64);
  }
  Decision flex;
  flex.layout = LayoutRole::kFlexible;
  Built one = build(two_node_cfg(hidden), flex);
  ChunkTimes m1 =
      chunk_times(one.bp, sim::run_plan(one.bp.plan, *one.topo, no_overhead_config(one.sc)));
  ASSERT_NEAR(m1.e[0] / m1.d[0], 1.0, 0.1);
  const double unit1 = m1.tc[0] + m1.c[0] - m1.td[0];  // d + e + c
  flex.pipeline_degree = 2;
  Built two = build(two_node_cfg(hidden), flex);
  ChunkTimes m2 =
      chunk_times(two.bp, sim::run_plan(two.bp.plan, *two.topo, no_overhead_config(two.sc)));
  const double span2 = m2.tc[1] + m2.c[1] - m2.td[0];
  // 4 units of (d + e + c) / 6 each, within the 10% imbalance of d vs e.
  EXPECT_NEAR(span2 / unit1, 4.0 / 6.0, 0.05);
  EXPECT_LT(span2, 0.75 * unit1);
}

TEST(PlanBuilderTiming, PipeliningHelpsWhenBalancedAndManyChunksLoseToStartup) {
  // Default per-op costs (5 us launch, 1 us per message) on the flow model.
  Cfg c = two_node_cfg(8192);
  auto layer_time = [&](const Cfg& cfg, int r) {
    Decision d;
    d.pipeline_degree = r;
    d.layout = LayoutRole::kFlexible;
    Built b = build(cfg, d);
    RunResult res = sim::run_plan(b.bp.plan, *b.topo, engine_config(b.sc, sim::NetworkKind::kFlow));
    return forward_moe_time(b.bp, res);
  };
  const double t1 = layer_time(c, 1), t2 = layer_time(c, 2), t4 = layer_time(c, 4);
  EXPECT_LT(t2, 0.9 * t1);
  EXPECT_LT(t4, t2);
  // A tiny layer (S = 64 tokens, dC = 64): every op is dominated by its fixed cost, so 32 chunks
  // are slower than 1.
  Cfg small = c;
  small.batch = 1;
  small.seq = 64;
  small.model_dim = 256;
  small.hidden = 512;
  const double s1 = layer_time(small, 1), s32 = layer_time(small, 32);
  EXPECT_GT(s32, 2 * s1);
}

TEST(PlanBuilderTiming, FlexibleExpertTimeFlatAsGpusGrowPlainSlows) {
  // S = 4096 tokens per GPU, one expert per GPU, k = 2, f = 1: dC = 8192 / P, so plain GEMMs get
  // thinner (m = dC) while flexible ones keep m = P * dC = 8192.
  auto expert_time = [](int gpus, LayoutRole layout) {
    Cfg c;
    c.nodes = gpus / 8;
    c.gpn = 8;
    c.ep = gpus;
    c.mode = "inference";
    c.batch = 4;
    c.seq = 1024;
    c.model_dim = 1024;
    c.hidden = 4096;
    Decision d;
    d.layout = layout;
    Built b = build(c, d);
    sim::ComputeModel cm(b.topo->spec().gpu, Dtype::kFp16, sim::ComputeParams{});
    double t = 0;
    for (OpId id : b.bp.index.moe_layers[0].expert)
      t += cm.duration(b.bp.plan.op(id).compute()).value();
    return t;
  };
  std::vector<double> flex, plain;
  for (int p : {8, 64, 512}) {
    flex.push_back(expert_time(p, LayoutRole::kFlexible));
    plain.push_back(expert_time(p, LayoutRole::kPlain));
  }
  for (double f : flex) EXPECT_NEAR(f / flex[0], 1.0, 0.02);
  EXPECT_LT(plain[0], plain[1]);
  EXPECT_LT(plain[1], plain[2]);
  EXPECT_GT(plain[2], 3 * flex[2]);
}

// ---- op roles (what exec reads instead of labels) ------------------------------------------

// The label grammar exec parsed before ops carried roles (docs/model.md), kept here only to check
// the builder: an op labelled like a data step must carry exactly that role, and an op with a
// role must be labelled like it.
OpRole role_from_label(const std::string& label) {
  OpRole r;
  int block = -1, last = -1, consumed = 0, micro = -1;
  char pass[4] = {};
  // A gradient bucket of blocks lo..hi is "L{lo}-{hi}.grad.*", of one block "L{l}.grad.*".
  if ((std::sscanf(label.c_str(), "L%d-%d.grad.%n", &block, &last, &consumed) >= 2 ||
       std::sscanf(label.c_str(), "L%d.grad.%n", &block, &consumed) >= 1) &&
      consumed > 0) {
    const std::string what = label.substr(static_cast<std::size_t>(consumed));
    for (const auto& [name, kind] :
         {std::pair{std::string("dense_allreduce"), OpRoleKind::kDenseGradSync},
          std::pair{std::string("expert_allreduce"), OpRoleKind::kExpertGradSync},
          std::pair{std::string("expert_mp_allreduce"), OpRoleKind::kExpertMpGradSync},
          // sharded experts: the parameter gather's backward
          std::pair{std::string("expert_reduce_scatter"), OpRoleKind::kParamGather}}) {
      if (what == name || (what.rfind(name + ".m", 0) == 0 &&
                           std::sscanf(what.c_str() + name.size(), ".m%d", &micro) == 1))
        return OpRole{kind, true, block, what == name ? -1 : micro};
    }
    return r;
  }
  if (std::sscanf(label.c_str(), "L%d.%3[a-z].%n", &block, pass, &consumed) < 2 || consumed == 0)
    return r;
  const bool backward = std::string(pass) == "bwd";
  if (!backward && std::string(pass) != "fwd") return r;
  std::string what = label.substr(static_cast<std::size_t>(consumed));
  int chunk = -1;
  if (auto c = what.rfind(".c"); c != std::string::npos &&
                                 what.find_first_not_of("0123456789", c + 2) == std::string::npos &&
                                 c + 2 < what.size()) {
    chunk = std::stoi(what.substr(c + 2)) - 1;
    what = what.substr(0, c);
  }
  for (int k = 1; k <= static_cast<int>(OpRoleKind::kParmMpAllGather); ++k) {
    const OpRole cand{static_cast<OpRoleKind>(k), backward, block, chunk};
    if (role_label(cand) == label) return cand;
  }
  return r;
}

// Every stack of every bundled scenario of <= 16 GPUs (the ones `moesim exec` runs in CI), as
// built for execution: role and label agree on every op, and the roles cover every data path
// (plain, routed, sharded, Parm S1 / S2, Lina's gradient micro-ops).
TEST(OpRoles, EveryDataStepOfTheBundledPlansCarriesTheRoleItsLabelNames) {
  std::set<OpRoleKind> seen;
  int plans = 0;
  for (const auto& entry : std::filesystem::directory_iterator(
           std::filesystem::path(MOESIM_SOURCE_DIR) / "scenarios")) {
    if (entry.path().extension() != ".yaml") continue;
    const Scenario sc = load_scenario(entry.path().string());
    if (sc.num_gpus() > 16) continue;
    const auto topo = topology::build_topology(sc.cluster);
    for (const auto& spec : sc.strategies) {
      SCOPED_TRACE(entry.path().filename().string() + " / " + spec.name);
      const StackRun run = run_stack(sc, spec, *topo, testing::instant_backend, 1, nullptr, true);
      ++plans;
      for (const Op& op : run.last_plan.plan.ops()) {
        const OpRole want = role_from_label(op.label);
        EXPECT_EQ(static_cast<int>(op.role.kind), static_cast<int>(want.kind)) << op.label;
        if (op.role.kind == OpRoleKind::kNone) continue;
        seen.insert(op.role.kind);
        EXPECT_EQ(op.role.backward, want.backward) << op.label;
        EXPECT_EQ(op.role.block, want.block) << op.label;
        EXPECT_EQ(op.role.chunk, want.chunk) << op.label;
      }
    }
  }
  EXPECT_GE(plans, 20);
  for (OpRoleKind k :
       {OpRoleKind::kGate, OpRoleKind::kEncode, OpRoleKind::kDispatch, OpRoleKind::kFc1,
        OpRoleKind::kFc2, OpRoleKind::kCombine, OpRoleKind::kDecode, OpRoleKind::kParamGather,
        OpRoleKind::kPartialSum, OpRoleKind::kCombineSaa, OpRoleKind::kParmLocalDump,
        OpRoleKind::kParmMpAllGather, OpRoleKind::kDenseGradSync, OpRoleKind::kExpertGradSync,
        OpRoleKind::kExpertMpGradSync, OpRoleKind::kEspAllGather, OpRoleKind::kEspAllReduce})
    EXPECT_TRUE(seen.count(k)) << "no bundled plan has role " << static_cast<int>(k);
}

}  // namespace
}  // namespace moesim::strategies
