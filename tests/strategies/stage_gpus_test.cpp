// Pipeline stages by GPUs (docs/model.md, "Pipeline stages"): several stages in one node, the
// stage scenario as one node with its share of the NICs, the loader's rule and message, and the
// boundary sends priced at NVLink inside a node and at the NIC across nodes (analytical engine:
// latency + bytes / bandwidth, worked out by hand), with every other op inside one stage.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/runner.hpp"
#include "strategies/stage_schedule.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

// seq 256 x batch 2 tokens per GPU, M 256, fp16: a boundary send is 2 * 256 * 256 * 2 bytes.
constexpr double kSendBytes = 2.0 * 256 * 256 * 2;

Scenario make(int nodes, int gpn, int pp, int ep, int layers = 4, int nics = 0,
              int micro_batches = 1) {
  const std::string inter = nodes > 1 || nics > 0
                                ? fmt::format(
                                      "  inter_node: {{kind: switch, nic_bandwidth: 200Gb/s, "
                                      "nic_efficiency: 1, nics_per_node: {}, "
                                      "latency: 2us}}\n",
                                      nics > 0 ? nics : gpn)
                                : "";
  return parse_scenario_string(fmt::format(R"(
name: stage-gpus
cluster:
  gpu: a100-sxm-80gb
  nodes: {}
  gpus_per_node: {}
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, efficiency: 1, latency: 1us}}
{}model:
  mode: training
  layers: {}
  batch_per_gpu: 2
  seq_len: 256
  model_dim: 256
  hidden_dim: 512
  experts_per_gpu: 1
  top_k: 2
  capacity_factor: 1.0
  micro_batches: {}
  dtype: fp16
parallelism: {{pp: {}, ep: {}, dp: auto}}
workload: {{routing: {{distribution: balanced}}}}
strategies:
  - {{name: baseline}}
)",
                                           nodes, gpn, inter, layers, micro_batches, pp, ep),
                               "stage-gpus.yaml");
}

TEST(StageGpus, StagesThatDivideANodeGetAOneNodeStageScenario) {
  // 1 node x 8 GPUs, pp 2: stages of 4 GPUs, ep 4; the stage is one node of 4 GPUs.
  const Scenario one = make(1, 8, 2, 4, 4, 8);
  EXPECT_EQ(one.stage_gpus(), 4);
  const Scenario st = one.stage_scenario();
  EXPECT_EQ(st.cluster.nodes, 1);
  EXPECT_EQ(st.cluster.gpus_per_node, 4);
  EXPECT_EQ(st.num_gpus(), 4);
  EXPECT_EQ(st.parallelism.pp, 1);
  // 8 NICs for 8 GPUs: the stage keeps 4, each GPU its own NIC.
  EXPECT_EQ(st.cluster.inter.nics_per_node, 4);
  EXPECT_DOUBLE_EQ(st.cluster.inter.nic_bandwidth.value(), 25e9);
  // One NIC for 8 GPUs: a stage of 4 has half of it, one NIC of half the bandwidth.
  const Scenario shared = make(1, 8, 2, 4, 4, 1).stage_scenario();
  EXPECT_EQ(shared.cluster.inter.nics_per_node, 1);
  EXPECT_DOUBLE_EQ(shared.cluster.inter.nic_bandwidth.value(), 12.5e9);
  // Whole nodes keep the node as it is: 2 nodes x 4, pp 2.
  const Scenario whole = make(2, 4, 2, 4).stage_scenario();
  EXPECT_EQ(whole.cluster.nodes, 1);
  EXPECT_EQ(whole.cluster.gpus_per_node, 4);
  EXPECT_EQ(whole.cluster.inter.nics_per_node, 4);
}

TEST(StageGpus, LoaderRefusesStagesThatSplitNodesUnevenlyAndListsThePpThatFit) {
  // 2 nodes x 6 GPUs (P 12), layers 12: pp 1 (12), 2 (6), 4 (3), 6 (2), 12 (1) fit; pp 3 gives
  // stages of 4 GPUs, neither whole nodes nor a divisor of 6.
  try {
    make(2, 6, 3, 4, 12);
    FAIL() << "pp 3 on 2 x 6 GPUs was accepted";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("parallelism.pp"), std::string::npos) << what;
    EXPECT_NE(what.find("P = 12 GPUs"), std::string::npos) << what;
    EXPECT_NE(what.find("cluster.gpus_per_node 6"), std::string::npos) << what;
    EXPECT_NE(what.find("pp values that fit (up to model.layers): 1, 2, 4, 6, 12"),
              std::string::npos)
        << what;
  }
  EXPECT_NO_THROW(make(2, 6, 4, 3, 12));  // 3 GPUs per stage, 2 stages per node
  EXPECT_NO_THROW(make(2, 6, 6, 2, 12));  // 2 GPUs per stage, 3 stages per node
}

struct Sends {
  std::vector<double> inside_node_s, across_nodes_s;
  int other_ops = 0;
};

// Runs a one-micro-batch step on the analytical engine; sorts the boundary sends by whether they
// cross nodes and checks that every other op stays inside one stage.
Sends run_sends(const Scenario& sc) {
  auto topo = topology::build_topology(sc.cluster);
  const Scenario stage = sc.stage_scenario();
  const auto work = testing::uniform_work(
      stage, stage.tokens_per_gpu() * stage.model.top_k / stage.num_experts());
  const BuiltPlan bp = build_step_plan(sc, *topo, work, Decision{});
  bp.plan.validate();
  sim::EngineConfig cfg;
  cfg.network = sim::NetworkKind::kAnalytical;
  cfg.precision = sc.model.dtype;
  const RunResult r = sim::run_plan(bp.plan, *topo, cfg);
  const int sg = sc.stage_gpus(), gpn = sc.cluster.gpus_per_node;
  Sends out;
  for (const Op& op : bp.plan.ops()) {
    const double d = r.op_last_end(op.id) - r.op_first_start(op.id);
    if (op.label.rfind("pp.", 0) == 0) {
      const auto& g = bp.plan.grouping(op.collective().grouping).groups.front();
      EXPECT_EQ(g[1], g[0] + sg) << op.label;
      (g[0] / gpn == g[1] / gpn ? out.inside_node_s : out.across_nodes_s).push_back(d);
      continue;
    }
    ++out.other_ops;
    const int s = op.ranks.at(0) / sg;
    for (int i = 0; i < op.ranks.size(); ++i) EXPECT_EQ(op.ranks.at(i) / sg, s) << op.label;
  }
  return out;
}

TEST(StageGpus, TwoStagesInOneNodeSendOverNvlink) {
  // 1 node x 8 GPUs, pp 2, ep 4: the send from rank r to r + 4 goes GPU-NVSwitch-GPU, latency
  // 1 us, 300 GB/s: 1e-6 + 262,144 / 300e9 = 1.873813 us, forward and backward.
  const Sends s = run_sends(make(1, 8, 2, 4));
  ASSERT_EQ(s.inside_node_s.size(), 2u);
  EXPECT_TRUE(s.across_nodes_s.empty());
  EXPECT_GT(s.other_ops, 0);
  for (const double t : s.inside_node_s) EXPECT_NEAR(t, 1e-6 + kSendBytes / 300e9, 1e-12);
}

TEST(StageGpus, StagesSharingNodesSendOverNvlinkInsideAndTheNicAcross) {
  // 2 nodes x 4 GPUs, pp 4: stages of 2 GPUs, two per node. Boundaries 0-1 and 2-3 stay in a
  // node (NVLink, as above); boundary 1-2 goes GPU-NIC-switch-NIC-GPU: 200 Gb/s = 25 GB/s and the
  // route's latency (the switch's 2 us plus the GPU-NIC hops, read from the topology's pair
  // cost, which is what the analytical engine's alpha is).
  const Scenario sc = make(2, 4, 4, 2);
  auto topo = topology::build_topology(sc.cluster);
  const auto cross = topo->pair_cost(2, 4);
  EXPECT_EQ(cross.tier, 1);
  EXPECT_DOUBLE_EQ(cross.bandwidth.value(), 25e9);
  EXPECT_GE(cross.alpha.value(), 2e-6);
  EXPECT_EQ(topo->pair_cost(0, 2).tier, 0);
  const Sends s = run_sends(sc);
  ASSERT_EQ(s.inside_node_s.size(), 4u);  // boundaries 0-1 and 2-3, forward and backward
  ASSERT_EQ(s.across_nodes_s.size(), 2u);
  for (const double t : s.inside_node_s) EXPECT_NEAR(t, 1e-6 + kSendBytes / 300e9, 1e-12);
  for (const double t : s.across_nodes_s)
    EXPECT_NEAR(t, cross.alpha.value() + kSendBytes / 25e9, 1e-12);
}

TEST(StageGpus, RunStackRunsSeveralStagesPerNodeOnEveryEngine) {
  // The runner's path (stage scenario decides and samples, the whole step runs) on analytical and
  // flow: both finish with the same number of MoE layers and step times within 5%.
  const Scenario sc = make(1, 8, 4, 2, 4, 0, 3);
  auto topo = topology::build_topology(sc.cluster);
  std::vector<double> step_s;
  for (const auto kind : {sim::NetworkKind::kAnalytical, sim::NetworkKind::kFlow}) {
    sim::EngineConfig cfg;
    cfg.network = kind;
    cfg.precision = sc.model.dtype;
    const StackRun run = run_stack(
        sc, sc.strategies[0], *topo, [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); },
        1);
    ASSERT_EQ(run.iterations.size(), 1u);
    EXPECT_EQ(run.last_plan.plan.num_ranks(), 8);
    EXPECT_EQ(run.last_plan.index.moe_layers.size(), 4u * 3u);
    step_s.push_back(run.iterations[0].step_time_s);
  }
  EXPECT_NEAR(step_s[1], step_s[0], 0.05 * step_s[0]);
}

TEST(StageGpus, AllToAllTimeIsPerRankNotSummedOverStages) {
  // 4 stages of 2 GPUs, one MoE block each, balanced routing: every stage's dispatch and combine
  // are alike, and a rank runs only its own stage's. The record's all-to-all time is one stage's
  // four all-to-alls (forward and backward dispatch and combine), a quarter of the sum over the
  // stages.
  const Scenario sc = make(1, 8, 4, 2, 4);
  auto topo = topology::build_topology(sc.cluster);
  sim::EngineConfig cfg;
  cfg.network = sim::NetworkKind::kAnalytical;
  cfg.precision = sc.model.dtype;
  const StackRun run = run_stack(
      sc, sc.strategies[0], *topo, [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); }, 1);
  const auto& layers = run.last_plan.index.moe_layers;
  ASSERT_EQ(layers.size(), 4u);
  const RunResult& r = run.last_result;
  auto spans = [&](const PlanIndex::MoeLayerOps& l) {
    double t = 0;
    for (const auto* ops : {&l.dispatch, &l.combine})
      for (OpId id : *ops) t += r.op_last_end(id) - r.op_first_start(id);
    return t;
  };
  double all = 0;
  for (const auto& l : layers) {
    EXPECT_NEAR(spans(l), spans(layers[0]), 1e-12 * spans(layers[0]));
    all += spans(l);
  }
  ASSERT_GT(all, 0);
  EXPECT_NEAR(run.iterations[0].a2a_s, all / 4, 1e-12 * all);
  EXPECT_LT(run.iterations[0].a2a_s, run.iterations[0].step_time_s);
}

}  // namespace
}  // namespace moesim::strategies
