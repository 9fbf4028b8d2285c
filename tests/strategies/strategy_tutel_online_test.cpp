// Tutel's online search of (pipeline degree, all-to-all algorithm) (docs/strategy-specs.md §3): the
// search logic exactly, against tables of times; through the runner with a fake backend that
// answers from a table; and end to end on the flow engine.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "core/run_result.hpp"
#include "sim/engine.hpp"
#include "strategies/pipeline/tutel_online.hpp"
#include "strategies/runner.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

constexpr CollectiveAlgo kLin = CollectiveAlgo::kLinear;
constexpr CollectiveAlgo k2dh = CollectiveAlgo::k2dh;

// Time of each strategy at f = 1; the best is (4, 2dh).
double table_time(const TutelChoice& c, double f) {
  static const std::map<std::pair<int, CollectiveAlgo>, double> t{
      {{1, kLin}, 10}, {{1, k2dh}, 9}, {{2, kLin}, 8}, {{2, k2dh}, 7},
      {{4, kLin}, 6},  {{4, k2dh}, 5}, {{8, kLin}, 7}, {{8, k2dh}, 6.5}};
  return t.at({c.degree, c.algo}) * f;
}

TEST(TutelOnlineSearch, TriesTheWholeSpaceThenSettlesOnTheBest) {
  TutelOnlineSearch s(TutelOnlineSearch::default_space(true), 0.5);
  ASSERT_EQ(s.space().size(), 8u);
  std::vector<TutelChoice> tried;
  for (int i = 0; i < 8; ++i) {
    const TutelChoice c = s.choose(1.0);
    tried.push_back(c);
    s.record(1.0, c, table_time(c, 1.0));
  }
  // Every strategy exactly once, in space order.
  EXPECT_EQ(tried, s.space());
  EXPECT_EQ(s.tried_at(1.0), 8);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.choose(1.0), (TutelChoice{4, k2dh}));
}

TEST(TutelOnlineSearch, NearbyFactorsShareTheirBucketFarOnesSearchAgain) {
  TutelOnlineSearch s(TutelOnlineSearch::default_space(true), 0.5);
  for (int i = 0; i < 8; ++i) {
    const TutelChoice c = s.choose(1.0);
    s.record(1.0, c, table_time(c, 1.0));
  }
  // f = 1.3 is in 1.0's bucket [1.0, 1.5): the bucket has tried everything, so its best is used
  // at once, without a search at 1.3.
  EXPECT_EQ(s.choose(1.3), (TutelChoice{4, k2dh}));
  EXPECT_EQ(s.buckets(), (std::vector<std::vector<double>>{{1.0, 1.3}}));
  // f = 3 opens a new bucket: untried strategies are tried again, in space order.
  EXPECT_EQ(s.choose(3.0), (TutelChoice{1, kLin}));
  s.record(3.0, {1, kLin}, 30);
  EXPECT_EQ(s.choose(3.0), (TutelChoice{1, k2dh}));
  EXPECT_EQ(s.buckets(), (std::vector<std::vector<double>>{{1.0, 1.3}, {3.0}}));
}

TEST(TutelOnlineSearch, BucketTimesAreNormalisedByTheLowestFactor) {
  // Space of two; f = 1 tried A (10), f = 1.4 tried B (13 -> 13 / 1.4 = 9.29 at f = 1): B wins.
  const std::vector<TutelChoice> space{{1, kLin}, {2, kLin}};
  TutelOnlineSearch s(space, 0.5);
  EXPECT_EQ(s.choose(1.0), space[0]);
  s.record(1.0, space[0], 10);
  EXPECT_EQ(s.choose(1.4), space[1]);  // the bucket has not tried B yet
  s.record(1.4, space[1], 13);
  EXPECT_EQ(s.choose(1.2), space[1]);
  // Un-normalised, A would have won (10 < 13).
  TutelOnlineSearch u(space, 0.5);
  u.choose(1.0);
  u.record(1.0, space[0], 10);
  u.choose(1.4);
  u.record(1.4, space[1], 14.5);  // 14.5 / 1.4 = 10.36 > 10
  EXPECT_EQ(u.choose(1.2), space[0]);
}

// --- through the runner, with a fake backend answering from the table ---------------------

// Reads the decision back from the plan (chunks = forward dispatch ops, algorithm of the
// collective) and answers with every op spanning [0, table time].
Backend table_backend(const double* f_now) {
  return [f_now](const Plan& p) {
    int chunks = 0;
    CollectiveAlgo algo = kLin;
    for (const Op& op : p.ops())
      if (op.label.find(".fwd.dispatch.") != std::string::npos) {
        ++chunks;
        algo = op.collective().algo;
      }
    RunResult r;
    init_run_result(p, r);
    const double t = table_time({chunks, algo}, *f_now);
    std::fill(r.start_s.begin(), r.start_s.end(), 0.0);
    std::fill(r.end_s.begin(), r.end_s.end(), t);
    summarize_run(p, r);
    return r;
  };
}

TEST(TutelOnline, RunnerSettlesWithinTheSpaceAndAdaptsToANewBucket) {
  testing::ModelShape m;
  Scenario sc = testing::make_scenario(
      testing::ClusterShape{}, m,
      "  - {name: tutel, pipeline: tutel_online, a2a: auto, tutel_online: {bucket_width: 0.5}}");
  sc.workload.capacity.kind = CapacityKind::kTrace;
  // 10 iterations at f = 1, then 10 at f = 2 (a new bucket), then f = 1.2 (1.0's bucket).
  for (int i = 0; i < 10; ++i) sc.workload.capacity.factors.push_back(1.0);
  for (int i = 0; i < 10; ++i) sc.workload.capacity.factors.push_back(2.0);
  sc.workload.capacity.factors.push_back(1.2);
  const auto topo = topology::build_topology(sc.cluster);
  // The table backend scales its times by f of the iteration, read from the trace in call order.
  double f_now = 1.0;
  int call = 0;
  const Backend table = table_backend(&f_now);
  const Backend counted = [&](const Plan& p) {
    f_now = sc.workload.capacity.factors[call++];
    return table(p);
  };
  const StackRun run = run_stack(sc, sc.strategies[0], *topo, counted, 21);
  auto choice = [&](int i) {
    return TutelChoice{run.iterations[i].decision.pipeline_degree, run.iterations[i].decision.a2a};
  };
  const auto space = TutelOnlineSearch::default_space(true);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(choice(i), space[i]) << i;
  EXPECT_EQ(choice(8), (TutelChoice{4, k2dh}));
  EXPECT_EQ(choice(9), (TutelChoice{4, k2dh}));
  // Training: the layer time is the forward span plus the backward span, 5 each.
  EXPECT_DOUBLE_EQ(run.iterations[9].moe_layer_time_s, 10.0);
  for (int i = 10; i < 18; ++i) EXPECT_EQ(choice(i), space[i - 10]) << i;
  EXPECT_EQ(choice(18), (TutelChoice{4, k2dh}));
  EXPECT_EQ(choice(20), (TutelChoice{4, k2dh}));  // f = 1.2: straight to its bucket's best
}

// --- end to end on the flow engine ---------------------------------------------------------

TEST(TutelOnline, OnTheFlowEngineItRunsTheFastestStrategyItMeasured) {
  testing::ModelShape m;
  m.mode = "inference";
  m.batch = 4;
  m.seq = 512;
  m.model_dim = 1024;
  m.hidden_dim = 4096;
  const Scenario sc = testing::make_scenario(testing::ClusterShape{}, m,
                                             "  - {name: tutel, pipeline: tutel_online}");
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  const StackRun run = run_stack(
      sc, sc.strategies[0], *topo, [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); }, 10);
  double best = 1e300;
  int best_i = -1;
  for (int i = 0; i < 8; ++i)
    if (run.iterations[i].moe_layer_time_s < best)
      best = run.iterations[i].moe_layer_time_s, best_i = i;
  for (int i = 8; i < 10; ++i) {
    EXPECT_EQ(run.iterations[i].decision.pipeline_degree,
              run.iterations[best_i].decision.pipeline_degree);
    EXPECT_EQ(run.iterations[i].decision.a2a, run.iterations[best_i].decision.a2a);
    EXPECT_NEAR(run.iterations[i].moe_layer_time_s, best, 1e-9 * best);
  }
  // Pipelining pays on this compute ~ communication layer: the winner is not r = 1.
  EXPECT_GT(run.iterations[best_i].decision.pipeline_degree, 1);
}

}  // namespace
}  // namespace moesim::strategies
