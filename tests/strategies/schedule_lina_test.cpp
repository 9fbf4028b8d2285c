// Lina's premise (STRATEGIES §6): on the flow engine the EP all-to-all and the DP gradient
// all-reduce share the NICs, so an all-to-all that overlaps an all-reduce is slower than alone.
#include <gtest/gtest.h>

#include "sim/engine.hpp"
#include "strategies/plan_builder.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

// 2 nodes x 2 GPUs, one 100 Gb/s NIC per node: EP groups {0,2}, {1,3} cross the NIC, and so do
// the DP-style all-reduce groups of the same ranks.
double a2a_time(bool with_allreduce, sim::NetworkKind kind) {
  testing::ClusterShape c;
  c.nodes = 2;
  c.gpus_per_node = 2;
  testing::ModelShape m;
  const Scenario sc = testing::make_scenario(c, m, "  - {name: base}");
  const auto topo = topology::build_topology(sc.cluster);
  Plan plan(4);
  const StreamId comm = plan.stream("comm");
  const StreamId grad = plan.stream("grad");
  Grouping g;
  g.name = "cross";
  g.groups = {{0, 2}, {1, 3}};
  const GroupingId gid = plan.add_grouping(g);
  CollectiveSpec ar;
  ar.type = CollectiveType::kAllReduce;
  ar.algo = CollectiveAlgo::kRing;
  ar.grouping = gid;
  ar.bytes = Bytes(64e6);
  if (with_allreduce) plan.add_collective(grad, ar, {}, "grad.allreduce");
  CollectiveSpec a2a;
  a2a.type = CollectiveType::kAllToAll;
  a2a.algo = CollectiveAlgo::kLinear;
  a2a.grouping = gid;
  a2a.bytes = Bytes(32e6);
  const OpId id = plan.add_collective(comm, a2a, {}, "a2a");
  sim::EngineConfig cfg = testing::engine_config(sc);
  cfg.network = kind;
  const RunResult r = sim::run_plan(plan, *topo, cfg);
  for (const auto& rec : r.collectives)
    if (rec.op == id) return rec.end_s - rec.start_s;
  ADD_FAILURE() << "a2a not recorded";
  return 0;
}

TEST(LinaContention, FlowAllToAllOverlappingAllReduceIsSlowerThanAlone) {
  const double alone = a2a_time(false, sim::NetworkKind::kFlow);
  const double overlapped = a2a_time(true, sim::NetworkKind::kFlow);
  EXPECT_GT(alone, 0);
  // Max-min sharing of the NIC: both flows get half while they overlap; the all-reduce (64 MB
  // ring over 2 ranks: 32 MB each way) outlasts the all-to-all (16 MB each way), so the
  // all-to-all runs at half rate throughout: about 2x.
  EXPECT_GT(overlapped, 1.8 * alone);
  EXPECT_LT(overlapped, 2.2 * alone);
}

TEST(LinaContention, AnalyticalSeesNoContention) {
  EXPECT_DOUBLE_EQ(a2a_time(false, sim::NetworkKind::kAnalytical),
                   a2a_time(true, sim::NetworkKind::kAnalytical));
}

}  // namespace
}  // namespace moesim::strategies
