// parallelism.layout: folded (Megatron-Core's MoE parallel folding, docs/model.md "Rank layout"):
// the loader's degrees and refusals, the groups, and the sequence- / context-parallel collectives
// of one block on 4 GPUs worked out by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "strategies/memory.hpp"
#include "strategies/plan_builder.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

// One MoE block on 4 GPUs of one node: S = 2 x 256 = 512 tokens per GPU, M = 256 (two 128-wide
// heads), H = 512, fp16, 4 experts top-2.
std::string yaml_with(const std::string& parallelism, const std::string& model_extra = "") {
  return fmt::format(R"(
name: folded-test
cluster:
  gpu: a100-sxm-80gb
  nodes: 1
  gpus_per_node: 4
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
  inter_node: {{kind: switch, nic_bandwidth: 200Gb/s, nics_per_node: 4, latency: 2us}}
model:
  mode: training
  layers: 1
  batch_per_gpu: 2
  seq_len: 256
  model_dim: 256
  hidden_dim: 512
  experts: 4
  top_k: 2
  capacity_factor: 1.0
  dtype: fp16
{}parallelism: {}
strategies:
  - {{name: baseline}}
)",
                     model_extra, parallelism);
}

std::string error_of(const std::string& yaml) {
  try {
    parse_scenario_string(yaml, "folded.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError for:\n" << yaml;
  return "";
}

struct Built {
  Scenario sc;
  std::unique_ptr<topology::Topology> topo;
  BuiltPlan bp;
};

Built build(const std::string& parallelism) {
  Built b{parse_scenario_string(yaml_with(parallelism), "folded.yaml"), nullptr,
          BuiltPlan{Plan(0), PlanIndex{}}};
  b.topo = topology::build_topology(b.sc.cluster);
  // dC = k * f * S / E = 2 * 512 / 4 = 256 slots per (GPU, expert).
  b.bp = build_step_plan(b.sc, *b.topo, testing::uniform_work(b.sc, 256), Decision{});
  return b;
}

const Op* find(const Plan& plan, const std::string& label) {
  for (const auto& op : plan.ops())
    if (op.label == label) return &op;
  return nullptr;
}

int count(const Plan& plan, const std::string& needle) {
  int n = 0;
  for (const auto& op : plan.ops())
    if (op.label.find(needle) != std::string::npos) ++n;
  return n;
}

// The op that `label` waits for on rank 0, by label.
std::string dep_of(const Plan& plan, const std::string& label) {
  const Op* op = find(plan, label);
  if (op == nullptr || op->deps.empty()) return "";
  return plan.op(op->deps.front()).label;
}

TEST(FoldedLayout, LoaderResolvesBothSides) {
  const Scenario sc = parse_scenario_string(yaml_with("{layout: folded, tp: 2, ep: 4}"), "f.yaml");
  const ParallelismSpec& p = sc.parallelism;
  EXPECT_TRUE(p.folded());
  EXPECT_EQ(p.mp, 2);  // tp
  EXPECT_EQ(p.cp, 1);
  EXPECT_EQ(p.adp, 2);  // attention dp = 4 / (tp * cp)
  EXPECT_TRUE(p.sp);    // default with tp > 1
  EXPECT_EQ(p.esp, 1);  // etp
  EXPECT_EQ(p.ep, 4);
  EXPECT_EQ(p.dp, 1);  // edp = 4 / (etp * ep)
  EXPECT_EQ(p.product(), 4);
  // mp is tp's other name; ep auto takes what etp * edp leave.
  const Scenario alias =
      parse_scenario_string(yaml_with("{layout: folded, mp: 2, cp: 2, edp: 2}"), "f.yaml");
  EXPECT_EQ(alias.parallelism.mp, 2);
  EXPECT_EQ(alias.parallelism.cp, 2);
  EXPECT_EQ(alias.parallelism.adp, 1);
  EXPECT_EQ(alias.parallelism.ep, 2);
  EXPECT_EQ(alias.parallelism.dp, 2);
  EXPECT_FALSE(
      parse_scenario_string(yaml_with("{layout: folded, ep: 4}"), "f.yaml").parallelism.sp);
}

TEST(FoldedLayout, LoaderRefusesWhatDoesNotFold) {
  auto has = [](const std::string& what, const std::string& needle) {
    EXPECT_NE(what.find(needle), std::string::npos) << what;
  };
  // Attention side: tp * cp * dp != P.
  std::string e = error_of(yaml_with("{layout: folded, tp: 2, dp: 1, ep: 4}"));
  has(e, "parallelism.dp");
  has(e, "tp*cp*dp = 2*1*1 = 2, expected P = 4");
  // Expert side: etp * ep * edp != P.
  e = error_of(yaml_with("{layout: folded, tp: 2, ep: 2, edp: 1}"));
  has(e, "parallelism.edp");
  has(e, "etp*ep*edp = 1*2*1 = 2");
  // tp must divide the heads (two heads of 128).
  e = error_of(yaml_with("{layout: folded, tp: 4, ep: 4}",
                         "  attention: {heads: 2, kv_heads: 2, head_dim: 128}\n"));
  has(e, "model.attention.heads");
  // cp must divide seq_len; etp the expert FFN width; ep the experts.
  e = error_of(yaml_with("{layout: folded, cp: 3, dp: auto}"));
  has(e, "parallelism.cp");
  has(e, "model.seq_len = 256");
  e = error_of(yaml_with("{layout: folded, etp: 3}"));
  has(e, "parallelism.etp");
  has(e, "model.hidden_dim = 512");
  e = error_of(
      yaml_with("{layout: folded, ep: 4}")
          .replace(yaml_with("{layout: folded, ep: 4}").find("experts: 4"), 10, "experts: 6"));
  has(e, "parallelism.ep");
  has(e, "model.experts = 6");
  // Megatron's MoE with tensor parallelism requires sequence parallelism.
  e = error_of(yaml_with("{layout: folded, tp: 2, sp: false, ep: 4}"));
  has(e, "parallelism.sp");
  // The folded degrees outside layout folded, and esp inside it.
  e = error_of(yaml_with("{ep: 4, cp: 1}"));
  has(e, "parallelism.cp");
  has(e, "layout: folded");
  e = error_of(yaml_with("{layout: folded, esp: 2}"));
  has(e, "parallelism.esp");
  has(e, "etp");
}

TEST(FoldedLayout, GroupsOfBothSides) {
  // tp 2, cp 2 (attention rank (a*cp + c)*tp + t), ep 2 x edp 2 (rank d*ep + e) on 4 GPUs.
  const Scenario sc =
      parse_scenario_string(yaml_with("{layout: folded, tp: 2, cp: 2, ep: 2}"), "f.yaml");
  const Groups g = make_groups(sc);
  EXPECT_EQ(g.mp.groups, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(g.cp.groups, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(g.dense_dp.groups, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));  // DP x CP
  EXPECT_EQ(g.ep.groups, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(g.dp.groups, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));  // edp
  // The rank map's CP index agrees with the groups.
  for (const auto& grp : g.cp.groups)
    for (int c = 0; c < static_cast<int>(grp.size()); ++c)
      EXPECT_EQ(sc.parallelism.cp_index(grp[c]), c);
}

// DONE-WHEN: the TP / SP collectives of one block on 4 GPUs, tp 2 with sequence parallelism,
// ep 4 folded. Every GPU holds S = 512 tokens; a TP pair {0,1} / {2,3} holds 1,024.
//  forward:  attn.norm (S rows) -> sp_allgather over mp, output S*tp*M*b = 1024*256*2 =
//            524,288 B per rank -> attn.qkv on 1,024 rows -> ... -> attn.proj on 1,024 rows ->
//            sp_reduce_scatter over mp, input 524,288 B -> the MoE layer on the rank's 512 tokens:
//            dispatch E * dC * M * b = 4 * 256 * 256 * 2 = 524,288 B per rank over ep {0,1,2,3}
//            (the S = 512 tokens, 1/tp of its TP group's 1,024; dC = 2 * 512 / 4).
//  backward: sp_allgather (before attn.proj's backward) and sp_reduce_scatter (after attn.qkv's
//            backward), same bytes; no TP all-reduce anywhere; the dense gradient all-reduce
//            over DP {0,2} / {1,3}.
TEST(FoldedLayout, SequenceParallelCollectivesOfOneBlockOnFourGpus) {
  const Built b = build("{layout: folded, tp: 2, ep: 4}");
  const Plan& plan = b.bp.plan;
  const double tp_bytes = 1024.0 * 256 * 2;
  for (const char* dir : {"fwd", "bwd"})
    for (const char* what : {"sp_allgather", "sp_reduce_scatter"}) {
      const std::string label = fmt::format("L0.{}.attn.{}", dir, what);
      const Op* op = find(plan, label);
      ASSERT_NE(op, nullptr) << label;
      EXPECT_EQ(op->collective().type, std::string(what) == "sp_allgather"
                                           ? CollectiveType::kAllGather
                                           : CollectiveType::kReduceScatter);
      EXPECT_DOUBLE_EQ(op->collective().bytes.value(), tp_bytes) << label;
      const Grouping& g = plan.grouping(op->collective().grouping);
      EXPECT_EQ(g.name, "mp");
      EXPECT_EQ(g.groups, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
    }
  EXPECT_EQ(count(plan, "sp_allgather"), 2);
  EXPECT_EQ(count(plan, "sp_reduce_scatter"), 2);
  EXPECT_EQ(count(plan, "mp_allreduce"), 0);
  // Their places: gather between the norm and QKV, scatter after the projection (forward); the
  // mirror in backward.
  EXPECT_EQ(dep_of(plan, "L0.fwd.attn.sp_allgather"), "L0.fwd.attn.norm");
  EXPECT_EQ(dep_of(plan, "L0.fwd.attn.qkv"), "L0.fwd.attn.sp_allgather");
  EXPECT_EQ(dep_of(plan, "L0.fwd.attn.sp_reduce_scatter"), "L0.fwd.attn.proj");
  EXPECT_EQ(dep_of(plan, "L0.bwd.attn.proj"), "L0.bwd.attn.sp_allgather");
  EXPECT_EQ(dep_of(plan, "L0.bwd.attn.sp_reduce_scatter"), "L0.bwd.attn.qkv");
  EXPECT_EQ(dep_of(plan, "L0.bwd.attn.norm"), "L0.bwd.attn.sp_reduce_scatter");
  // The norm on the rank's 512 tokens (4 * S * M * b), the GEMMs on the gathered 1,024 rows with
  // half the heads: qkv 1024 x 256 -> 3 * 256 / 2.
  EXPECT_DOUBLE_EQ(find(plan, "L0.fwd.attn.norm")->compute().bytes.value(), 4.0 * 512 * 256 * 2);
  const GemmShape qkv = *find(plan, "L0.fwd.attn.qkv")->compute().gemm;
  EXPECT_EQ(qkv.m, 1024);
  EXPECT_EQ(qkv.n, 384);
  EXPECT_EQ(qkv.k, 256);
  // The core: 1,024 queries (4 sequences) x 256 keys, one head per rank, causal half.
  EXPECT_DOUBLE_EQ(find(plan, "L0.fwd.attn.core")->compute().flops.value(),
                   2.0 * 1024 * 256 * 1 * (128 + 128) * 0.5);
  // The MoE layer starts from the rank's own 512 tokens: the gate on 512 rows, the dispatch
  // 524,288 B per rank over the 4-GPU EP group.
  EXPECT_DOUBLE_EQ(find(plan, "L0.fwd.gate")->compute().flops.value(), 2.0 * 512 * 256 * 4);
  const Op* dispatch = find(plan, "L0.fwd.dispatch.c1");
  ASSERT_NE(dispatch, nullptr);
  EXPECT_DOUBLE_EQ(dispatch->collective().bytes.value(), 4.0 * 256 * 256 * 2);
  EXPECT_EQ(plan.grouping(dispatch->collective().grouping).groups,
            (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  const Op* grad = find(plan, "L0.grad.dense_allreduce");
  ASSERT_NE(grad, nullptr);
  EXPECT_EQ(plan.grouping(grad->collective().grouping).groups,
            (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(count(plan, "expert_allreduce"), 0);  // edp = 1
}

// CP 2 (tp 1): each rank's queries are half of every sequence; the K and V of both halves are
// all-gathered over {0,1} / {2,3}: cp * rows * 2 * kv_heads * head_dim * b = 2 * 512 * 2 * 2 *
// 128 * 2 = 1,048,576 B per rank; backward gathers them again and reduce-scatters dK, dV.
TEST(FoldedLayout, ContextParallelKvExchangeOnFourGpus) {
  const Built b = build("{layout: folded, cp: 2, ep: 4}");
  const Plan& plan = b.bp.plan;
  const double kv_bytes = 2.0 * 512 * 2 * 2 * 128 * 2;
  for (const char* label : {"L0.fwd.attn.cp_kv_allgather", "L0.bwd.attn.cp_kv_allgather",
                            "L0.bwd.attn.cp_kv_reduce_scatter"}) {
    const Op* op = find(plan, label);
    ASSERT_NE(op, nullptr) << label;
    EXPECT_DOUBLE_EQ(op->collective().bytes.value(), kv_bytes) << label;
    EXPECT_EQ(plan.grouping(op->collective().grouping).groups,
              (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  }
  EXPECT_EQ(dep_of(plan, "L0.fwd.attn.core"), "L0.fwd.attn.cp_kv_allgather");
  // 512 queries per rank (2 x 256 split in halves: 4 chunks of 128) against 256 keys.
  const ComputeSpec& core = find(plan, "L0.fwd.attn.core")->compute();
  EXPECT_EQ(core.gemm->m, 128);
  EXPECT_EQ(core.gemm->n, 256);
  EXPECT_EQ(core.gemm->batch, 4 * 2);  // 4 chunks x 2 heads
  EXPECT_DOUBLE_EQ(core.flops.value(), 2.0 * 512 * 256 * 2 * (128 + 128) * 0.5);
  EXPECT_EQ(count(plan, "sp_"), 0);  // tp 1: no sequence-parallel collectives
}

// Memory of the same block, tp 2 / ep 4 folded with ZeRO-1 (Megatron's accounting), by hand:
//  dense: attention (4 M^2) / tp = 131,072, two norms 512, gate M E = 1,024: 132,608 params;
//  experts: E / ep = 1 expert of 2 M H = 262,144 params (etp 1), replicated over edp = 1;
//  weights and fp16 gradients (132,608 + 262,144) x 2 = 789,504 B each;
//  optimizer (12 B per param, fp16): dense over the DP x CP group of P / tp = 2 ranks, experts
//  over edp = 1: (66,304 + 262,144) x 12 = 3,941,376 B;
//  activations (S = 512, the gathered R = 1,024 rows, dC = 256): attention S M b + S M b (norm in
//  and out) + R (h + 2 kv) d / tp b (QKV) + R h d_v / tp b (O) + R h / tp 4 (logsumexp) =
//  262,144 + 262,144 + 786,432 + 262,144 + 4,096 = 1,576,960; MoE S M b + S M b (gate input) +
//  S E b + 3 x 1,024 expert rows x M / H (permuted input, fc1 output, expert output) + the
//  activation's output = 262,144 + 262,144 + 4,096 + 524,288 + 1,048,576 + 524,288 + 1,048,576
//  = 3,674,112; in all 5,251,072 B; buffers 1,024 rows x M x (2 + 2) = 1,048,576 B.
TEST(FoldedLayout, MemoryShardsEachSideByItsOwnDegrees) {
  const Scenario sc =
      parse_scenario_string(yaml_with("{layout: folded, tp: 2, ep: 4, zero: 1}"), "f.yaml");
  const MemoryEstimate est = estimate_memory(sc, Decision{}, 256);
  EXPECT_DOUBLE_EQ(est.dense_params, 132608);
  EXPECT_DOUBLE_EQ(est.expert_params, 262144);
  EXPECT_DOUBLE_EQ(est.weights_bytes, 789504);
  EXPECT_DOUBLE_EQ(est.gradients_bytes, 789504);
  EXPECT_DOUBLE_EQ(est.optimizer_bytes, 3941376);
  EXPECT_DOUBLE_EQ(est.activations_bytes, 1576960 + 3674112);
  EXPECT_DOUBLE_EQ(est.buffers_bytes, 1048576);
  // The disjoint layout with the same tp (ep 2 x mp 2) replicates the experts over mp: two local
  // experts per GPU, and ZeRO-1 shards their optimizer state over those 2 replicas.
  const Scenario dis = parse_scenario_string(yaml_with("{ep: 2, mp: 2, zero: 1}"), "f.yaml");
  const MemoryEstimate d = estimate_memory(dis, Decision{}, 256);
  EXPECT_DOUBLE_EQ(d.expert_params, 2 * 262144);
  EXPECT_DOUBLE_EQ(d.optimizer_bytes, (132608.0 / 2 + 2 * 262144.0 / 2) * 12);
  // Folded etp 2 x ep 2: two local experts, each split in two over ETP: 262,144 params; the
  // attention side (tp 1) holds its 4 M^2 whole.
  const Scenario etp =
      parse_scenario_string(yaml_with("{layout: folded, etp: 2, ep: 2, zero: 1}"), "f.yaml");
  const MemoryEstimate e = estimate_memory(etp, Decision{}, 256);
  EXPECT_DOUBLE_EQ(e.expert_params, 262144);
  EXPECT_DOUBLE_EQ(e.dense_params, 262144 + 512 + 1024);
  // ZeRO-1: dense over the 4 DP ranks, experts over edp = 1.
  EXPECT_DOUBLE_EQ(e.optimizer_bytes, ((262144.0 + 512 + 1024) / 4 + 262144) * 12);
}

// ETP 2 x EP 2 on 4 GPUs (expert rank e*2 + s): EP groups {0,2} / {1,3}, ETP {0,1} / {2,3};
// E = 4, two local experts per EP position, dC = 256. Each rank dispatches its own E dC M b =
// 4 * 256 * 256 * 2 = 524,288 B; the ETP all-gather's output and the reduce-scatter's input are
// etp x that, 1,048,576 B; fc1 runs on the 2 (sources) x 256 x 2 (etp) = 1,024 rows of each of 2
// local experts at H / etp = 256: 2 * 1024 * 2 * 256 * 256 FLOPs.
TEST(FoldedLayout, ExpertTensorParallelCollectivesOnFourGpus) {
  const Built b = build("{layout: folded, etp: 2, ep: 2}");
  const Plan& plan = b.bp.plan;
  const auto groups = [&](const Op& op) { return plan.grouping(op.collective().grouping).groups; };
  const Op* disp = find(plan, "L0.fwd.dispatch.c1");
  ASSERT_NE(disp, nullptr);
  EXPECT_DOUBLE_EQ(disp->collective().bytes.value(), 524288);
  EXPECT_EQ(groups(*disp), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  for (const char* label : {"L0.fwd.etp_allgather.c1", "L0.fwd.etp_reduce_scatter.c1",
                            "L0.bwd.etp_allgather.c1", "L0.bwd.etp_reduce_scatter.c1"}) {
    const Op* op = find(plan, label);
    ASSERT_NE(op, nullptr) << label;
    EXPECT_DOUBLE_EQ(op->collective().bytes.value(), 1048576) << label;
    EXPECT_EQ(groups(*op), (std::vector<std::vector<int>>{{0, 1}, {2, 3}})) << label;
  }
  EXPECT_EQ(dep_of(plan, "L0.fwd.etp_allgather.c1"), "L0.fwd.encode");
  EXPECT_EQ(dep_of(plan, "L0.fwd.combine.c1"), "L0.fwd.etp_reduce_scatter.c1");
  EXPECT_DOUBLE_EQ(find(plan, "L0.fwd.expert.fc1.c1")->compute().flops.value(),
                   2.0 * 1024 * 2 * 256 * 256);
  // DeepSpeed-MoE's ESP ops (tokens gathered before the gate) do not appear; the gate sees 512.
  EXPECT_EQ(count(plan, "esp_"), 0);
  EXPECT_DOUBLE_EQ(find(plan, "L0.fwd.gate")->compute().flops.value(), 2.0 * 512 * 256 * 4);
}

TEST(FoldedLayout, RefusesParmSchedulesAndRoutedDispatchWithEtp) {
  const Scenario sc = parse_scenario_string(yaml_with("{layout: folded, etp: 2, ep: 2}"), "f.yaml");
  auto topo = topology::build_topology(sc.cluster);
  Decision routed;
  routed.variable_dispatch = true;
  try {
    build_step_plan(sc, *topo, testing::uniform_work(sc, 256), routed);
    ADD_FAILURE() << "a routed dispatch with etp 2 built a plan";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallelism.etp"), std::string::npos) << e.what();
  }
  const Scenario tp = parse_scenario_string(yaml_with("{layout: folded, tp: 2, ep: 4}"), "f.yaml");
  Decision parm;
  parm.schedule = ScheduleRole::kParmS2;
  try {
    build_step_plan(tp, *topo, testing::uniform_work(tp, 256), parm);
    ADD_FAILURE() << "parm_s2 built a folded plan";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layout folded"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moesim::strategies
