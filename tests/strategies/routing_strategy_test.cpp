// Routing strategies (strategies/routing/routing.hpp): ta_moe moves the counts towards the
// target and keeps rows and expert loads, faster_moe_hir caps the off-node share, and on a
// 2 nodes x 2 GPUs cluster with a slow inter-node link the routed all-to-all is faster.
#include <gtest/gtest.h>

#include <numeric>

#include "sim/engine.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/routing/routing.hpp"
#include "strategies/runner.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::routing {
namespace {

using strategies::testing::ClusterShape;
using strategies::testing::make_scenario;
using strategies::testing::ModelShape;

ClusterShape slow_two_by_two() {
  ClusterShape c;
  c.gpu = "a100-sxm-80gb";
  c.nodes = 2;
  c.gpus_per_node = 2;
  c.intra = "{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}";
  c.nic = "10Gb/s";
  return c;
}

workload::LayerDispatch uniform_layer(int P, int E, std::uint32_t per_pair, int k = 2) {
  workload::LayerDispatch l;
  l.num_gpus = P;
  l.num_experts = E;
  l.top_k = k;
  l.capacity = per_pair;
  l.kept.assign(static_cast<std::size_t>(P) * E, per_pair);
  l.demanded = l.kept;
  return l;
}

TEST(TaMoeRouting, ConvergedRoutingFollowsTheTargetAndKeepsRowsAndExpertLoads) {
  const Scenario sc = make_scenario(slow_two_by_two(), {}, "  - {name: even}");
  const auto topo = topology::build_topology(sc.cluster);
  const std::vector<int> ranks{0, 1, 2, 3};
  const TargetPattern t = solve_target(pair_costs(*topo, ranks), 4000, 2048.0, 0.1);
  workload::LayerDispatch l = uniform_layer(4, 8, 500);  // 2 experts per GPU, 4000 per row
  const workload::ExpertPlacement place{2, 1};
  route_towards_target(l, ranks, place, t, 1.0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(l.gpu_sent(i), 4000);
    for (int b = 0; b < 4; ++b) {
      const double got = l.at(i, 2 * b) + l.at(i, 2 * b + 1);
      EXPECT_NEAR(got, t.share_at(i, b) * 4000, 1.0) << i << "->" << b;
      // Experts of one GPU share its volume as they shared the sampled one (equally here).
      EXPECT_LE(std::abs(static_cast<int>(l.at(i, 2 * b)) - static_cast<int>(l.at(i, 2 * b + 1))),
                1);
    }
  }
  // Column sums per GPU stay balanced (symmetric target): within rounding of 4000.
  for (int b = 0; b < 4; ++b)
    EXPECT_NEAR(static_cast<double>(l.expert_load(2 * b) + l.expert_load(2 * b + 1)), 4000, 4);
  EXPECT_LT(offnode_share(l, place, ranks, *topo), 0.5);
  EXPECT_EQ(l.kept, l.demanded);
}

TEST(TaMoeRouting, AdherenceZeroKeepsTheSampledCountsAndHalfwayIsBetween) {
  const Scenario sc = make_scenario(slow_two_by_two(), {}, "  - {name: even}");
  const auto topo = topology::build_topology(sc.cluster);
  const std::vector<int> ranks{0, 1, 2, 3};
  const TargetPattern t = solve_target(pair_costs(*topo, ranks), 400, 2048.0, 0.1);
  workload::LayerDispatch l = uniform_layer(4, 4, 100);
  l.kept[1] = 37;  // an uneven sampled row
  const auto before = l.kept;
  route_towards_target(l, ranks, workload::ExpertPlacement{1, 1}, t, 0.0);
  EXPECT_EQ(l.kept, before);
  workload::LayerDispatch half = uniform_layer(4, 4, 100);
  route_towards_target(half, ranks, workload::ExpertPlacement{1, 1}, t, 0.5);
  const double want = 0.5 * 100 + 0.5 * t.share_at(0, 2) * 400;
  EXPECT_NEAR(half.at(0, 2), want, 1.0);
}

TEST(FasterMoeHir, CapsTheFirstChoiceOffNodeShare) {
  const Scenario sc = make_scenario(slow_two_by_two(), {}, "  - {name: even}");
  const auto topo = topology::build_topology(sc.cluster);
  const std::vector<int> ranks{0, 1, 2, 3};
  // Row 0 sends 100 to each GPU: off-node share 0.5. k = 2, cap 0.25: first-choice off-node
  // tokens 100 of 200 first choices, allowed 50 -> 50 move, split evenly over GPUs 0 and 1.
  workload::LayerDispatch l = uniform_layer(4, 4, 100, 2);
  cap_offnode_share(l, ranks, workload::ExpertPlacement{1, 1}, *topo, 0.25);
  EXPECT_EQ(l.at(0, 0), 125u);
  EXPECT_EQ(l.at(0, 1), 125u);
  EXPECT_EQ(l.at(0, 2), 75u);
  EXPECT_EQ(l.at(0, 3), 75u);
  EXPECT_EQ(l.at(3, 2), 125u);
  EXPECT_EQ(l.at(3, 0), 75u);
  // A cap above the current share changes nothing.
  workload::LayerDispatch same = uniform_layer(4, 4, 100, 2);
  cap_offnode_share(same, ranks, workload::ExpertPlacement{1, 1}, *topo, 0.5);
  EXPECT_EQ(same.kept, uniform_layer(4, 4, 100, 2).kept);
}

TEST(TaMoeRouting, TargetDispatchBeatsEvenOnTheFlowEngineAndTaMoeBeatsHir) {
  ModelShape m;
  m.batch = 4;
  m.seq = 512;
  m.model_dim = 1024;
  m.hidden_dim = 1024;
  m.experts_per_gpu = 1;
  const Scenario sc = make_scenario(
      slow_two_by_two(), m,
      "  - {name: even_v, routing: ta_moe, ta_moe: {lambda: 0.1, adherence: 0.0}}\n"
      "  - {name: ta_moe, routing: ta_moe, ta_moe: {lambda: 0.1, adherence: 1.0}}\n"
      "  - {name: hir, routing: faster_moe_hir, faster_moe_hir: {max_offnode_share: 0.25}}\n");
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = strategies::testing::engine_config(sc);
  auto backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  double a2a[3];
  for (int s = 0; s < 3; ++s) {
    const strategies::StackRun run = strategies::run_stack(sc, sc.strategies[s], *topo, backend, 2);
    ASSERT_EQ(run.iterations.size(), 2u);
    EXPECT_TRUE(run.iterations[0].decision.variable_dispatch);
    a2a[s] = run.iterations[1].a2a_s;
    // The plan moves the routed counts: dispatch is an all_to_allv.
    const auto& ops = run.last_plan.plan.ops();
    const OpId d = run.last_plan.index.moe_layers.at(0).dispatch.at(0);
    EXPECT_EQ(ops[d].collective().type, CollectiveType::kAllToAllv);
  }
  EXPECT_LT(a2a[1], 0.85 * a2a[0]) << "target " << a2a[1] << " even " << a2a[0];
  EXPECT_LE(a2a[1], a2a[2] * (1 + 1e-9)) << "ta_moe " << a2a[1] << " hir " << a2a[2];
  EXPECT_LT(a2a[2], a2a[0]);
}

}  // namespace
}  // namespace moesim::routing
