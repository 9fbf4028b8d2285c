// The strategy stack's modules other than PipeMoE and Tutel's online search: the cost model,
// a2a selection, parallel modes and the Tutel router, stack composition, and the runner.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "core/run_result.hpp"
#include "sim/compute_model.hpp"
#include "sim/engine.hpp"
#include "strategies/a2a_select.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/parallel/tutel_router.hpp"
#include "strategies/runner.hpp"
#include "strategies/strategy.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

using testing::ClusterShape;
using testing::make_scenario;
using testing::ModelShape;

const char* kBaseline = "  - {name: baseline}";

// ---------------------------------------------------------------------------------------------
// Cost model.

TEST(CostModel, AllToAllLineOnTwoGpusIsThePairAlphaBeta) {
  // 2 nodes x 1 GPU: the linear all-to-all of S bytes per rank sends one message of S/2 to the
  // peer; the closed form is message overhead + pair alpha + (S/2) / pair bandwidth, where the
  // overhead is charged as the network models charge it: overhead x injection bandwidth bytes
  // through the NIC (the node cut), i.e. overhead x max(1, injection / NIC bandwidth).
  ClusterShape c;
  c.nodes = 2;
  c.gpus_per_node = 1;
  const Scenario sc = make_scenario(c, ModelShape{}, kBaseline);
  const auto topo = topology::build_topology(sc.cluster);
  const CostModel cost(sc, *topo);
  const topology::PairCost pair = topo->pair_cost(0, 1);
  const AlphaBeta ab = cost.a2a_fit(CollectiveAlgo::kLinear, Bytes(1 << 20), Bytes(64 << 20));
  std::vector<topology::LinkId> route;
  topo->route(0, 1, route);
  const double injection = topo->links()[route.front()].bandwidth.value();
  const double nic = topo->spec().inter.nic_bandwidth.value();  // the achieved rate
  const double alpha = sc.engine.message_overhead.value() * std::max(1.0, injection / nic) +
                       sc.engine.message_latency.value() + pair.alpha.value();
  EXPECT_NEAR(ab.alpha_s, alpha, 1e-12);
  EXPECT_NEAR(ab.beta_s, 0.5 / pair.bandwidth.value(), 1e-9 / pair.bandwidth.value());
  // The line reproduces the closed form at any other size.
  EXPECT_NEAR(ab.time(8e6), cost.a2a_time(CollectiveAlgo::kLinear, Bytes(8e6)).value(), 1e-12);
}

TEST(CostModel, GemmTimeMirrorsTheSimulatorComputeModel) {
  const Scenario sc = make_scenario(ClusterShape{}, ModelShape{}, kBaseline);
  const auto topo = topology::build_topology(sc.cluster);
  const CostModel cost(sc, *topo);
  sim::ComputeParams params;
  params.launch_overhead = sc.engine.launch_overhead;
  const sim::ComputeModel cm(topo->gpu(), sc.model.dtype, params);
  for (GemmShape g : {GemmShape{4096, 4096, 4096, 1}, GemmShape{8, 2048, 2048, 2048},
                      GemmShape{300, 1024, 4096, 2}, GemmShape{1, 64, 64, 1}}) {
    ComputeSpec spec;
    spec.cls = ComputeClass::kGemm;
    spec.gemm = g;
    spec.flops = Flops(g.flops());
    EXPECT_NEAR(cost.gemm_time(g).value(), cm.duration(spec).value(),
                1e-12 + 1e-9 * cm.duration(spec).value())
        << g.m << "x" << g.n << "x" << g.k << " batch " << g.batch;
  }
}

TEST(CostModel, LayerShapeCountsPaddedDispatchAndRepeatedTokens) {
  ModelShape m;  // S = 2048, E = 8, k = 2, f = 1: dC = 512
  const Scenario sc = make_scenario(ClusterShape{}, m, kBaseline);
  const auto topo = topology::build_topology(sc.cluster);
  const CostModel cost(sc, *topo);
  EXPECT_EQ(cost.capacity_for(1.0), 512);
  EXPECT_EQ(cost.capacity_for(1.0, 3), 513);
  const MoeLayerShape s = cost.layer_shape(512, 1);
  EXPECT_DOUBLE_EQ(s.dispatch_bytes.value(), 8.0 * 512 * 1024 * 2);
  EXPECT_DOUBLE_EQ(s.expert_work, 8.0 * 512 * 1024 * 1024);
  // Sharded over 4 GPUs: E = 2, repeating tokens r = 4 times multiplies the dispatch by 4.
  m.experts_per_gpu = -4;
  const Scenario sh = make_scenario(ClusterShape{}, m, kBaseline);
  const CostModel cs(sh, *topo);
  EXPECT_DOUBLE_EQ(cs.layer_shape(100, 4).dispatch_bytes.value(),
                   4 * cs.layer_shape(100, 1).dispatch_bytes.value());
  EXPECT_DOUBLE_EQ(cs.layer_shape(100, 4).expert_work, cs.layer_shape(100, 1).expert_work);
}

// ---------------------------------------------------------------------------------------------
// a2a: auto.

Decision decide(const Scenario& sc, const topology::Topology& topo, int spec_index, double f = 0) {
  const CostModel cost(sc, topo);
  const StrategySpec& spec = sc.strategies.at(spec_index);
  if (f <= 0) f = sc.model.capacity_factor;
  const StrategyContext ctx{sc, spec, topo, cost, 0, f, cost.capacity_for(f), nullptr};
  Decision d;
  make_stack(spec)->decide(ctx, d);
  return d;
}

TEST(A2aSelect, TwoDhWinsAtLargeScaleWithSmallMessagesLinearAtSmallScaleWithLargeOnes) {
  // 32 nodes x 8 GPUs, 256 tokens per GPU of M = 512: 4 KiB per peer, per-message costs rule.
  ClusterShape big;
  big.gpu = "a100-sxm-80gb";
  big.nodes = 32;
  big.gpus_per_node = 8;
  big.intra = "{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}";
  big.nic = "200Gb/s";
  big.nics_per_node = 8;
  ModelShape small_msgs;
  small_msgs.batch = 1;
  small_msgs.seq = 256;
  small_msgs.model_dim = 512;
  const Scenario sc_big = make_scenario(big, small_msgs, "  - {name: t, a2a: auto}");
  const auto topo_big = topology::build_topology(sc_big.cluster);
  EXPECT_EQ(decide(sc_big, *topo_big, 0).a2a, CollectiveAlgo::k2dh);
  // 2 nodes x 4 GPUs, 16K tokens of M = 4096 per GPU: 32 MiB per peer, bandwidth rules and
  // 2DH's stride copies and second phase only cost.
  ClusterShape small = big;
  small.nodes = 2;
  small.gpus_per_node = 4;
  small.nics_per_node = 4;
  ModelShape large_msgs;
  large_msgs.batch = 8;
  large_msgs.seq = 2048;
  large_msgs.model_dim = 4096;
  const Scenario sc_small = make_scenario(small, large_msgs, "  - {name: t, a2a: auto}");
  const auto topo_small = topology::build_topology(sc_small.cluster);
  EXPECT_EQ(decide(sc_small, *topo_small, 0).a2a, CollectiveAlgo::kLinear);
  // auto picked the algorithm the closed forms rank first, in both cases.
  const CostModel cb(sc_big, *topo_big), cs(sc_small, *topo_small);
  const Bytes nb = cb.layer_shape(cb.capacity_for(1.0), 1).dispatch_bytes;
  const Bytes ns = cs.layer_shape(cs.capacity_for(1.0), 1).dispatch_bytes;
  EXPECT_LT(cb.a2a_time(CollectiveAlgo::k2dh, nb), cb.a2a_time(CollectiveAlgo::kLinear, nb));
  EXPECT_GT(cs.a2a_time(CollectiveAlgo::k2dh, ns), cs.a2a_time(CollectiveAlgo::kLinear, ns));
}

TEST(A2aSelect, AutoFallsBackToLinearWhere2dhCannotRunAnd2dhIsAnError) {
  ClusterShape c;
  c.nodes = 3;
  c.gpus_per_node = 2;
  Scenario sc = make_scenario(c, ModelShape{}, "  - {name: a, a2a: auto}\n  - {name: b, a2a: 2dh}");
  const auto topo = topology::build_topology(sc.cluster);
  EXPECT_TRUE(CostModel(sc, *topo).a2a_applicable(CollectiveAlgo::k2dh));
  // ep = 3, dp = 2: the EP group {0, 1, 2} spans one and a half nodes.
  sc.parallelism.ep = 3;
  sc.parallelism.dp = 2;
  sc.model.experts = 3;
  const CostModel cost(sc, *topo);
  EXPECT_FALSE(cost.a2a_applicable(CollectiveAlgo::k2dh));
  EXPECT_EQ(decide(sc, *topo, 0).a2a, CollectiveAlgo::kLinear);
  try {
    decide(sc, *topo, 1);
    FAIL() << "2dh on a group that is not node-aligned";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "strategies[1].a2a");
    EXPECT_GT(e.location().line, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// parallel.

TEST(TutelRouter, RuleComparesRepeatedTokensWithParameters) {
  EXPECT_EQ(tutel_router_degree(1, Bytes(1), Bytes(1e9)), 1);  // unsharded: nothing to switch
  // n = 4: P2 iff 6 * dispatch < params.
  EXPECT_EQ(tutel_router_degree(4, Bytes(100), Bytes(601)), 4);
  EXPECT_EQ(tutel_router_degree(4, Bytes(100), Bytes(600)), 1);
}

Scenario sharded(double f, int batch, int seq, int hidden, const std::string& strategies) {
  ModelShape m;
  m.experts_per_gpu = -4;  // 2 experts over 8 GPUs, n = 4
  m.f = f;
  m.batch = batch;
  m.seq = seq;
  m.hidden_dim = hidden;
  return make_scenario(ClusterShape{}, m, strategies);
}

TEST(TutelRouter, P2ForFewTokensOrLargeHiddenP1ForManyTokens) {
  const std::string router = "  - {name: t, parallel: tutel_router}";
  // S = 512, k = 2, M = 1024, E = 2: dispatch = k f S M b; params = 2 M H b. P2 iff
  // 6 k f S < 2 H, i.e. 3 * 2 * f * 512 < H.
  auto degree = [&](double f, int batch, int hidden) {
    const Scenario sc = sharded(f, batch, 512, hidden, router);
    const auto topo = topology::build_topology(sc.cluster);
    return decide(sc, *topo, 0).parallel_degree;
  };
  EXPECT_EQ(degree(1.0, 1, 8192), 4);   // 3072 < 8192: P2
  EXPECT_EQ(degree(4.0, 1, 8192), 1);   // 12288 >= 8192: P1 (large f)
  EXPECT_EQ(degree(1.0, 8, 8192), 1);   // 8x the tokens: P1
  EXPECT_EQ(degree(1.0, 1, 2048), 1);   // small hidden: P1
  EXPECT_EQ(degree(1.0, 1, 16384), 4);  // large hidden: P2
}

using testing::instant_backend;

TEST(TutelRouter, FlipsAsTheCapacityFactorChangesDuringARun) {
  const Scenario sc = sharded(1.0, 1, 512, 8192, "  - {name: t, parallel: tutel_router}");
  Scenario moving = sc;
  moving.workload.capacity.kind = CapacityKind::kTrace;
  moving.workload.capacity.factors = {1.0, 4.0, 2.0, 3.0, 0.5};
  const auto topo = topology::build_topology(moving.cluster);
  const StackRun run = run_stack(moving, moving.strategies[0], *topo, instant_backend, 5);
  std::vector<int> degrees;
  for (const auto& it : run.iterations) degrees.push_back(it.decision.parallel_degree);
  // P2 iff 3072 f < 8192, i.e. f < 2.67.
  EXPECT_EQ(degrees, (std::vector<int>{4, 1, 4, 1, 4}));
}

TEST(Parallel, FixedModesAndUnshardedExperts) {
  const Scenario sc = sharded(1.0, 1, 512, 1024,
                              "  - {name: a, parallel: p1}\n  - {name: b, parallel: p2}\n"
                              "  - {name: c, parallel: 2}\n  - {name: d, parallel: 1}");
  const auto topo = topology::build_topology(sc.cluster);
  EXPECT_EQ(decide(sc, *topo, 0).parallel_degree, 1);
  EXPECT_EQ(decide(sc, *topo, 1).parallel_degree, 4);
  EXPECT_EQ(decide(sc, *topo, 2).parallel_degree, 2);
  // The loader rejects `parallel: 3` for n = 4; the module checks too (specs built in code).
  Scenario bad = sc;
  bad.strategies[3].parallel = ParallelRole::kDegree;
  bad.strategies[3].parallel_degree = 3;
  try {
    decide(bad, *topo, 3);
    FAIL() << "r = 3 does not divide n = 4";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "strategies[3].parallel");
    EXPECT_GT(e.location().line, 0);
  }
  // Unsharded experts: p2 and tutel_router both run r = 1.
  const Scenario plain = make_scenario(ClusterShape{}, ModelShape{},
                                       "  - {name: b, parallel: p2}\n"
                                       "  - {name: t, parallel: tutel_router}");
  EXPECT_EQ(decide(plain, *topo, 0).parallel_degree, 1);
  EXPECT_EQ(decide(plain, *topo, 1).parallel_degree, 1);
}

// ---------------------------------------------------------------------------------------------
// Stack composition and the runner.

TEST(Stack, ComposesOneModulePerRole) {
  const Scenario sc =
      make_scenario(ClusterShape{}, ModelShape{},
                    "  - {name: a, pipeline: 3, a2a: 2dh, layout: flexible}\n"
                    "  - {name: b, pipeline: tutel_online, a2a: linear, parallel: tutel_router}");
  const auto topo = topology::build_topology(sc.cluster);
  const Decision a = decide(sc, *topo, 0);
  EXPECT_EQ(a.describe(), "r=3 a2a=2dh layout=flexible parallel=1");
  std::vector<std::string> names;
  const auto stack = make_stack(sc.strategies[1]);
  for (const auto& m : stack->modules()) names.emplace_back(m->name());
  // tutel_online decides the algorithm itself: no a2a module after it.
  EXPECT_EQ(names,
            (std::vector<std::string>{"layout", "tutel_router", "tutel_online", "schedule"}));
}

TEST(Runner, RecordsEveryIterationFromTheBackendResult) {
  ModelShape m;
  m.f = 1.0;
  const Scenario sc = make_scenario(
      ClusterShape{}, m, "  - {name: base}\n  - {name: piped, pipeline: 2}", "analytical");
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  auto backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const StackRun base = run_stack(sc, sc.strategies[0], *topo, backend, 3);
  ASSERT_EQ(base.iterations.size(), 3u);
  EXPECT_EQ(base.strategy, "base");
  for (int i = 0; i < 3; ++i) {
    const IterationRecord& r = base.iterations[i];
    EXPECT_EQ(r.index, i);
    EXPECT_DOUBLE_EQ(r.capacity_factor, 1.0);
    EXPECT_GT(r.step_time_s, 0);
    EXPECT_GT(r.moe_layer_time_s, 0);
    EXPECT_LE(r.moe_layer_time_s, r.step_time_s);
    // One layer, training: forward dispatch + combine and their backward twins, one chunk each.
    EXPECT_GT(r.a2a_s, 0);
    EXPECT_LT(r.a2a_s, r.moe_layer_time_s);
    EXPECT_GT(r.compute_s, 0);
  }
  EXPECT_DOUBLE_EQ(base.last_result.makespan_s, base.iterations.back().step_time_s);
  EXPECT_EQ(base.last_plan.index.moe_layers.size(), 1u);
  // Same scenario, same seed: the same times, and every stack sees the same routing.
  const StackRun again = run_stack(sc, sc.strategies[0], *topo, backend, 3);
  const StackRun piped = run_stack(sc, sc.strategies[1], *topo, backend, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(again.iterations[i].step_time_s, base.iterations[i].step_time_s);
    EXPECT_EQ(piped.iterations[i].decision.pipeline_degree, 2);
    EXPECT_EQ(piped.iterations[i].dropped_tokens, base.iterations[i].dropped_tokens);
  }
  // The a2a time is the sum of the dispatch and combine collectives' durations.
  double a2a = 0;
  for (const auto& l : base.last_plan.index.moe_layers)
    for (const auto* ids : {&l.dispatch, &l.combine})
      for (OpId id : *ids)
        a2a += base.last_result.op_last_end(id) - base.last_result.op_first_start(id);
  EXPECT_DOUBLE_EQ(base.iterations.back().a2a_s, a2a);
}

TEST(Runner, DroplessCapacityAndDroppedTokens) {
  ModelShape m;
  m.f = 0;  // dropless: dC = the largest demanded count
  const Scenario dropless =
      make_scenario(ClusterShape{}, m, "  - {name: p, pipeline: pipemoe}", "analytical");
  const auto topo = topology::build_topology(dropless.cluster);
  const StackRun run = run_stack(dropless, dropless.strategies[0], *topo, instant_backend, 2);
  for (const auto& it : run.iterations) {
    EXPECT_EQ(it.dropped_tokens, 0);
    EXPECT_GE(it.decision.pipeline_degree, 1);
  }
  // A small fixed factor under skewed routing drops tokens, and the record counts them.
  Scenario skewed = make_scenario(ClusterShape{}, ModelShape{}, kBaseline, "analytical");
  skewed.workload.routing.distribution = RoutingDistribution::kZipf;
  skewed.workload.routing.skew = 1.2;
  const StackRun s = run_stack(skewed, skewed.strategies[0], *topo, instant_backend, 1);
  EXPECT_GT(s.iterations[0].dropped_tokens, 0);
}

}  // namespace
}  // namespace moesim::strategies
