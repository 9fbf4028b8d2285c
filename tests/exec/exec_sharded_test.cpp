// The host data path of sharded experts (exec/sharded_path.hpp), run under `mpirun -np 4
// --oversubscribe` (CTest does). tests/data/exec/sharded-4.yaml: one expert sharded over the 4
// GPUs (n = 4), so rho = 1 (P1), 2 and 4 (P2); a variant with 2 experts over 2 GPUs each (n = 2,
// top-2). Every rho must pass --check against the unsharded reference and give the same outputs
// as every other rho to fp32 tolerance (P1 and P2 are the same layer, so identical to dtype
// tolerance); P1 and P2 sum the hidden units in a different order, so they are not bitwise equal.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/sharded_path.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/workload/workload.hpp"
#include "tests/exec/mpi_test_main.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
namespace {

Scenario sharded4() {
  return load_scenario(std::string(MOESIM_SOURCE_DIR) + "/tests/data/exec/sharded-4.yaml");
}

// The same cluster with 2 experts, each over 2 GPUs, top-2 (the loader's E = ep / n filled by
// hand, as load_scenario would for experts_per_gpu: -2).
Scenario sharded_2x2() {
  Scenario sc = sharded4();
  sc.model.experts_per_gpu = -2;
  sc.model.experts = 2;
  sc.model.top_k = 2;  // dC = 2 * 0.75 * 32 / 2 = 24
  return sc;
}

struct Config {
  int rho = 1;
  int pipeline = 1;
  CollectiveAlgo a2a = CollectiveAlgo::kLinear;
  LayoutRole layout = LayoutRole::kPlain;
};

std::string name_of(const Config& c) {
  return fmt::format("rho={} r={} {} {}", c.rho, c.pipeline, collective_algo_name(c.a2a),
                     c.layout == LayoutRole::kFlexible ? "flexible" : "plain");
}

strategies::BuiltPlan plan_for(const Scenario& sc, const topology::Topology& topo,
                               const Config& c) {
  workload::WorkloadGenerator gen(sc);
  strategies::Decision d;
  d.pipeline_degree = c.pipeline;
  d.a2a = c.a2a;
  d.layout = c.layout;
  d.parallel_degree = c.rho;
  return strategies::build_step_plan(sc, topo, gen.next(0, c.pipeline), d);
}

struct Outcome {
  std::vector<std::vector<float>> outputs;
  std::vector<long long> dropped;
  std::vector<LayerCheck> checks;
};

Outcome run_once(const Scenario& sc, const Config& c, bool check = true) {
  auto topo = topology::build_topology(sc.cluster);
  MpiCommunicator comm;
  ExecOptions opt;
  opt.check = check;
  Executor ex(sc, *topo, *g_session, comm, opt);
  ex.run(plan_for(sc, *topo, c).plan);
  EXPECT_EQ(ex.has_data_path(), !ex.last_outputs().empty());
  return Outcome{ex.last_outputs(), ex.last_dropped(), ex.checks()};
}

// Largest |a - b| / (1 + |b|) over two runs' outputs (same shape).
double max_rel_diff(const Outcome& a, const Outcome& b) {
  double worst = 0;
  EXPECT_EQ(a.outputs.size(), b.outputs.size());
  for (size_t l = 0; l < std::min(a.outputs.size(), b.outputs.size()); ++l) {
    EXPECT_EQ(a.outputs[l].size(), b.outputs[l].size());
    for (size_t i = 0; i < std::min(a.outputs[l].size(), b.outputs[l].size()); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(a.outputs[l][i]) - b.outputs[l][i]) /
                                  (1.0 + std::fabs(b.outputs[l][i])));
  }
  return worst;
}

TEST(ExecSharded, RunsOnFourRanks) { ASSERT_EQ(g_session->size(), 4) << "run under mpirun -np 4"; }

// What the data path reads from the plan, exactly: rho from the fc1 GEMM's hidden width, the
// chunk capacities from its FLOPs, this rank's slice and gather-group position.
TEST(ExecSharded, LayerPlanFromThePlan) {
  Scenario sc = sharded4();
  auto topo = topology::build_topology(sc.cluster);
  const MoeShape shape{32, 16, 32, 1, 1};
  for (int rho : {1, 2, 4}) {
    const auto built = plan_for(sc, *topo, Config{rho, 2});
    std::vector<ShardedLayerPlan> layers;
    ASSERT_EQ(plan_sharded_layers(built.plan, 3, shape, 4, 4, &layers), "") << "rho " << rho;
    ASSERT_EQ(layers.size(), 1u);
    const ShardedLayerPlan& L = layers[0];
    EXPECT_EQ(L.rho, rho);
    EXPECT_EQ(L.ep, 4);
    EXPECT_EQ(L.ep_pos, 3);
    EXPECT_EQ(L.caps, (std::vector<int>{12, 12}));  // dC = 24 in two chunks
    EXPECT_EQ(L.offset, (std::vector<int>{0, 12}));
    EXPECT_EQ(L.capacity, 24);
    EXPECT_EQ(L.expert_id(), 0);
    EXPECT_EQ(L.gather(), 4 / rho);
    // Rank 3 = shard 3: hidden slice 3 / (4 / rho) of rho, member 3 % (4 / rho) of its group.
    EXPECT_EQ(L.slice(), 3 / (4 / rho));
    EXPECT_EQ(L.member(), 3 % (4 / rho));
  }
}

// Every rho (with pipelining, 2DH and the flexible layout too) passes the check and agrees with
// P1 to fp32 tolerance; the drops are exactly the capacity rule's (8 of 32 tokens per GPU).
TEST(ExecSharded, EveryParallelDegreeMatchesTheReferenceAndP1) {
  Scenario sc = sharded4();
  const Outcome p1 = run_once(sc, Config{1});
  ASSERT_EQ(p1.outputs.size(), 1u);
  ASSERT_EQ(p1.checks.size(), 1u);
  EXPECT_EQ(p1.checks[0].wrong, 0);
  EXPECT_EQ(p1.checks[0].compared, 4LL * 32 * 16);
  EXPECT_EQ(p1.checks[0].dropped, 4 * 8);  // one expert, top-1, dC = 24 of 32 tokens
  EXPECT_EQ(p1.checks[0].expected_dropped, 4 * 8);
  double norm = 0;
  for (float v : p1.outputs[0]) norm += std::fabs(v);
  EXPECT_GT(norm, 0.0);
  for (const Config& c :
       {Config{2}, Config{4}, Config{1, 2, CollectiveAlgo::k2dh, LayoutRole::kFlexible},
        Config{2, 2, CollectiveAlgo::k2dh},
        Config{4, 3, CollectiveAlgo::kLinear, LayoutRole::kFlexible}}) {
    const Outcome o = run_once(sc, c);
    ASSERT_EQ(o.checks.size(), 1u) << name_of(c);
    EXPECT_EQ(o.checks[0].wrong, 0) << name_of(c);
    EXPECT_EQ(o.checks[0].dropped, o.checks[0].expected_dropped) << name_of(c);
    EXPECT_EQ(o.dropped, p1.dropped) << name_of(c);
    EXPECT_LE(max_rel_diff(o, p1), 1e-5) << name_of(c);
  }
}

// Two experts over two GPUs each, top-2: P1 and P2 (rho = 2) against the reference and each other.
TEST(ExecSharded, TwoExpertsOverTwoGpusP1AndP2Agree) {
  Scenario sc = sharded_2x2();
  const Outcome p1 = run_once(sc, Config{1});
  const Outcome p2 = run_once(sc, Config{2});
  for (const Outcome* o : {&p1, &p2}) {
    ASSERT_EQ(o->checks.size(), 1u);
    EXPECT_EQ(o->checks[0].wrong, 0);
    EXPECT_EQ(o->checks[0].dropped, o->checks[0].expected_dropped);
  }
  EXPECT_EQ(p1.dropped, p2.dropped);
  EXPECT_LE(max_rel_diff(p2, p1), 1e-5);
  EXPECT_GT(max_rel_diff(p2, Outcome{{std::vector<float>(p1.outputs[0].size(), 0.0f)}, {}, {}}),
            0.0);  // not all zeros
}

// dC = 6 slots (f = 0.1875): each source cannot give the 4 GPUs of P1 equal whole-token shares,
// which the plan's equal-size all_to_all assumes, so --check is refused by name; rho = 2 (6 / 2)
// and P2 (no split) still run and pass. Without --check P1 runs on scratch buffers (no outputs).
TEST(ExecSharded, ChunksThatDoNotSplitOverTheGatherGroupRefuseCheck) {
  Scenario sc = sharded4();
  sc.model.capacity_factor = 0.1875;
  try {
    run_once(sc, Config{1});
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of n / rho = 4"), std::string::npos)
        << e.what();
  }
  for (int rho : {2, 4}) {
    const Outcome o = run_once(sc, Config{rho});
    ASSERT_EQ(o.checks.size(), 1u);
    EXPECT_EQ(o.checks[0].wrong, 0) << "rho " << rho;
  }
  const Outcome scratch = run_once(sc, Config{1}, /*check=*/false);
  EXPECT_TRUE(scratch.outputs.empty());
}

}  // namespace
}  // namespace moesim::exec
