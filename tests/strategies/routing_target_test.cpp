// TA-MoE target solver (strategies/routing/target.hpp): uniform on homogeneous fabrics, tier
// shares proportional to bandwidth on symmetric trees, exact margins and optimality of the
// max-flow solver on asymmetric costs, agreement of the two solvers.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/routing/target.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::routing {
namespace {

// W x W matrices from a per-pair function.
PairCostMatrix make_costs(int W, auto&& alpha, auto&& bw, auto&& tier) {
  std::vector<double> a, b;
  std::vector<int> t;
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j) {
      a.push_back(alpha(i, j));
      b.push_back(1.0 / bw(i, j));
      t.push_back(tier(i, j));
    }
  return pair_costs(W, a, b, t);
}

// 2 nodes x 2 GPUs, no latency: 100 B/s inside a node (the local pair too), 10 B/s across.
PairCostMatrix two_by_two(double alpha_inter = 0) {
  auto node = [](int g) { return g / 2; };
  return make_costs(
      4, [&](int i, int j) { return node(i) == node(j) ? 0.0 : alpha_inter; },
      [&](int i, int j) { return node(i) == node(j) ? 100.0 : 10.0; },
      [&](int i, int j) { return node(i) == node(j) ? 0 : 1; });
}

void expect_margins(const TargetPattern& p) {
  for (int i = 0; i < p.size; ++i) {
    double row = 0, col = 0, share = 0;
    for (int j = 0; j < p.size; ++j) {
      row += p.tokens_at(i, j);
      col += p.tokens_at(j, i);
      share += p.share_at(i, j);
      EXPECT_GE(p.tokens_at(i, j), 0);
    }
    EXPECT_NEAR(row, static_cast<double>(p.supply), 1e-6 * p.supply) << "row " << i;
    EXPECT_NEAR(col, static_cast<double>(p.supply), 1e-6 * p.supply) << "column " << i;
    EXPECT_NEAR(share, 1.0, 1e-12);
  }
}

TEST(TaMoeTarget, HomogeneousSwitchIsUniformWithBothSolvers) {
  const PairCostMatrix c = make_costs(
      8, [](int, int) { return 1e-6; }, [](int, int) { return 50.0; }, [](int, int) { return 1; });
  EXPECT_TRUE(is_tier_symmetric(c));
  for (bool sym : {true, false}) {
    TargetOptions opt;
    opt.allow_symmetric = sym;
    const TargetPattern p = solve_target(c, 800, 2.0, 0.0, opt);
    EXPECT_EQ(p.method, sym ? TargetMethod::kSymmetric : TargetMethod::kMaxFlow);
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) EXPECT_DOUBLE_EQ(p.tokens_at(i, j), 100.0);
    // 100 tokens x 2 B at 50 B/s + 1 us, the same as even dispatch.
    EXPECT_NEAR(p.time_s, 1e-6 + 4.0, 1e-9);
    EXPECT_NEAR(p.even_time_s, p.time_s, 1e-9);
  }
}

TEST(TaMoeTarget, TwoLevelTreeSharesFollowTierBandwidth) {
  // Per-pair volume proportional to bandwidth: 100:100:10:10 of 2200 tokens.
  const PairCostMatrix c = two_by_two();
  ASSERT_TRUE(is_tier_symmetric(c));
  const TargetPattern p = solve_target(c, 2200, 1.0, 0.0);
  EXPECT_EQ(p.method, TargetMethod::kSymmetric);
  EXPECT_NEAR(p.tokens_at(0, 0), 1000, 1e-9);
  EXPECT_NEAR(p.tokens_at(0, 1), 1000, 1e-9);
  EXPECT_NEAR(p.tokens_at(0, 2), 100, 1e-9);
  EXPECT_NEAR(p.time_s, 10.0, 1e-9);       // every pair finishes at 10 s
  EXPECT_NEAR(p.even_time_s, 55.0, 1e-9);  // 550 tokens at 10 B/s
  const auto tiers = tier_shares(c, p);
  ASSERT_EQ(tiers.size(), 2u);
  EXPECT_NEAR(tiers[0].target, 200.0 / 220.0, 0.01 * 200.0 / 220.0);
  EXPECT_NEAR(tiers[1].target, 20.0 / 220.0, 0.01 * 20.0 / 220.0);
  EXPECT_DOUBLE_EQ(tiers[0].even, 0.5);
  EXPECT_DOUBLE_EQ(tiers[1].peers, 2.0);
  // The exact max-flow solver agrees (integral, within 1% on the tier shares).
  TargetOptions exact;
  exact.allow_symmetric = false;
  const TargetPattern q = solve_target(c, 2200, 1.0, 0.0, exact);
  expect_margins(q);
  EXPECT_NEAR(q.time_s, 10.0, 1e-6);
  const auto qt = tier_shares(c, q);
  EXPECT_NEAR(qt[1].target, 20.0 / 220.0, 0.01 * 20.0 / 220.0);
}

TEST(TaMoeTarget, SmoothingMixesInUniform) {
  const TargetPattern p = solve_target(two_by_two(), 2200, 1.0, 0.1);
  EXPECT_NEAR(p.share_at(0, 2), 0.9 * 100.0 / 2200.0 + 0.1 / 4, 1e-12);
  EXPECT_NEAR(p.share_at(0, 0), 0.9 * 1000.0 / 2200.0 + 0.1 / 4, 1e-12);
  EXPECT_THROW(solve_target(two_by_two(), 2200, 1.0, 1.5), InputError);
  EXPECT_THROW(solve_target(two_by_two(), -1, 1.0, 0.1), InputError);
}

TEST(TaMoeTarget, LatencyKeepsSmallVolumesOffSlowPairs) {
  // Inter-node latency 20 s > what the intra-node pairs need: nothing crosses nodes.
  const TargetPattern p = solve_target(two_by_two(20.0), 2200, 1.0, 0.0);
  EXPECT_NEAR(p.tokens_at(0, 2), 0, 1e-9);
  EXPECT_NEAR(p.tokens_at(0, 1), 1100, 1e-9);
  EXPECT_NEAR(p.time_s, 11.0, 1e-9);
}

TEST(TaMoeTarget, AsymmetricMaxFlowHasExactMarginsAndIsOptimal) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> bw(5.0, 100.0), lat(0.0, 0.5);
  const int W = 12;
  std::vector<double> a(W * W), b(W * W);
  for (auto& x : a) x = lat(rng);
  for (auto& x : b) x = 1.0 / bw(rng);
  const PairCostMatrix c = pair_costs(W, a, b);
  EXPECT_FALSE(is_tier_symmetric(c));
  const std::int64_t supply = 1000;
  const TargetPattern p = solve_target(c, supply, 1.0, 0.0);
  EXPECT_EQ(p.method, TargetMethod::kMaxFlow);
  expect_margins(p);
  for (double x : p.tokens) EXPECT_DOUBLE_EQ(x, std::floor(x));  // integral
  EXPECT_LT(p.time_s, p.even_time_s);
  // Optimality: no integral plan finishes before time_s; at 0.999 * time_s the capacities no
  // longer carry every supply (checked by the solver's own feasibility test through a re-solve
  // with the bound: the solver's answer is the smallest feasible bound up to its tolerance).
  TargetOptions tight;
  tight.rel_tolerance = 1e-12;
  const TargetPattern q = solve_target(c, supply, 1.0, 0.0, tight);
  EXPECT_NEAR(q.time_s, p.time_s, 1e-6 * p.time_s);
  // A lower bound every feasible plan obeys: each sender i must place its supply within its
  // capacities at T, so sum_j (T - a_ij) / b_ij >= supply for T = time_s.
  for (int i = 0; i < W; ++i) {
    double cap = 0;
    for (int j = 0; j < W; ++j) cap += std::max(0.0, (p.time_s - c.alpha(i, j)) / c.beta(i, j));
    EXPECT_GE(cap, supply - 1e-6);
  }
}

TEST(TaMoeTarget, TypedMaxFlowOnAnUnevenTreeMatchesThePerGpuMaxFlow) {
  // 3 nodes x 2 GPUs: nodes 0 and 1 under one leaf (20 B/s between them), node 2 alone behind
  // the root (5 B/s); 100 B/s inside a node. Rows differ (node 2 has no leaf peer): not
  // symmetric, but three GPU types make it exact with a tiny flow network.
  auto node = [](int g) { return g / 2; };
  auto bw = [&](int i, int j) {
    if (node(i) == node(j)) return 100.0;
    return node(i) < 2 && node(j) < 2 ? 20.0 : 5.0;
  };
  const PairCostMatrix c = make_costs(
      6, [](int, int) { return 0.0; }, bw,
      [&](int i, int j) { return node(i) == node(j) ? 0 : (bw(i, j) == 20.0 ? 1 : 2); });
  EXPECT_FALSE(is_tier_symmetric(c));
  const TargetPattern typed = solve_target(c, 6000, 1.0, 0.0);
  EXPECT_EQ(typed.method, TargetMethod::kTypedMaxFlow);
  EXPECT_EQ(typed.row_types, 2);  // GPUs of nodes 0-1, GPUs of node 2
  expect_margins(typed);
  TargetOptions exact;
  exact.allow_symmetric = false;
  const TargetPattern full = solve_target(c, 6000, 1.0, 0.0, exact);
  EXPECT_EQ(full.method, TargetMethod::kMaxFlow);
  expect_margins(full);
  EXPECT_NEAR(typed.time_s, full.time_s, 1e-4 * full.time_s);
  EXPECT_LT(typed.time_s, typed.even_time_s);
}

TEST(TaMoeTarget, TopologyPairCostsOnTwoNodesPriceTheLocalPairAsTheNearestPeer) {
  const Scenario sc = strategies::testing::make_scenario({}, {}, "  - {name: even}");
  const auto topo = topology::build_topology(sc.cluster);
  std::vector<int> ranks(8);
  std::iota(ranks.begin(), ranks.end(), 0);
  const PairCostMatrix c = pair_costs(*topo, ranks);
  EXPECT_DOUBLE_EQ(c.beta(0, 0), c.beta(0, 1));
  EXPECT_DOUBLE_EQ(c.alpha(0, 0), c.alpha(0, 1));
  EXPECT_DOUBLE_EQ(c.beta(0, 4), topo->pair_cost(0, 4).beta());
  EXPECT_TRUE(is_tier_symmetric(c));
  const TargetPattern p = solve_target(c, 4096, 2048.0, 0.1);
  expect_margins(p);
  EXPECT_GT(p.tokens_at(0, 1), p.tokens_at(0, 4));
  EXPECT_LT(p.time_s, p.even_time_s);
}

}  // namespace
}  // namespace moesim::routing
