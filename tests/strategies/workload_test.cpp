// Workload generator (docs/strategy-specs.md §1): capacity modes and the slot rule by hand,
// sampling properties (totals, distinct choices, skew ordering, exact second-choice marginals), the
// binomial sampler against its pmf, the pair method's count moments against the exact ones and
// the token method's, determinism, dynamic capacity, re-rounding dC without sampling again,
// trace files, dispatch matrices.
#include "strategies/workload/workload.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "strategies/workload/random.hpp"
#include "strategies/workload/sampling.hpp"

namespace moesim::workload {
namespace {

Scenario make_scenario(int gpus, int experts, int top_k, int tokens, double f = 1.0,
                       RoutingDistribution dist = RoutingDistribution::kUniform, double skew = 0.0,
                       std::uint64_t seed = 1, int layers = 1) {
  Scenario s;
  s.name = "workload-test";
  s.source_file = "workload-test.yaml";
  s.cluster.nodes = 1;
  s.cluster.gpus_per_node = gpus;
  s.model.layers = layers;
  s.model.moe_every = 1;
  s.model.batch_per_gpu = 1;
  s.model.seq_len = tokens;
  s.model.experts = experts;
  s.model.experts_per_gpu = std::max(1, experts / gpus);
  s.model.top_k = top_k;
  s.model.capacity_factor = f;
  s.parallelism.ep = gpus;
  s.parallelism.dp = 1;
  s.workload.routing.distribution = dist;
  s.workload.routing.skew = skew;
  s.workload.routing.seed = seed;
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("moesim_workload_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

// Checks the invariants every LayerDispatch must satisfy.
void expect_consistent(const LayerDispatch& d, std::int64_t tokens) {
  std::int64_t dropped = 0;
  for (int i = 0; i < d.num_gpus; ++i) {
    std::int64_t demanded = 0;
    for (int e = 0; e < d.num_experts; ++e) {
      EXPECT_LE(d.at(i, e), d.demanded_at(i, e));
      EXPECT_LE(d.at(i, e), d.capacity);
      // Kept is exactly min(demanded, dC): drops happen only beyond capacity.
      EXPECT_EQ(d.at(i, e), std::min<std::int64_t>(d.demanded_at(i, e), d.capacity));
      demanded += d.demanded_at(i, e);
      dropped += d.demanded_at(i, e) - d.at(i, e);
    }
    if (tokens >= 0) {
      EXPECT_EQ(demanded, d.top_k * tokens) << "gpu " << i;
    }
  }
  EXPECT_EQ(d.dropped, dropped);
  EXPECT_EQ(
      std::accumulate(d.dropped_by_choice.begin(), d.dropped_by_choice.end(), std::int64_t{0}),
      dropped);
}

// ---------------------------------------------------------------------------------------------
// Capacity by hand.

TEST(CapacitySlots, FixedFactorIsCeilOfKfSOverE) {
  EXPECT_EQ(capacity_slots(1.0, 2, 16, 4, 0), 8);     // 2 * 1 * 16 / 4
  EXPECT_EQ(capacity_slots(1.25, 2, 16, 4, 0), 10);   // 10 exactly
  EXPECT_EQ(capacity_slots(1.3, 2, 16, 4, 0), 11);    // 10.4 -> 11
  EXPECT_EQ(capacity_slots(1.0, 2, 16, 4, 0, 3), 9);  // 8 rounded up to a multiple of 3
  EXPECT_EQ(capacity_slots(1.2, 2, 10, 24, 0), 1);    // 1.0000000000000002 in doubles
  EXPECT_EQ(capacity_slots(0.01, 1, 10, 100, 0), 1);  // any positive factor gives >= 1 slot
  EXPECT_EQ(capacity_slots(1.0, 2, 16384, 8192, 0), 4);
}

TEST(CapacitySlots, ZeroIsDroplessMaxDemand) {
  EXPECT_EQ(capacity_slots(0.0, 2, 16, 4, 7), 7);
  EXPECT_EQ(capacity_slots(0.0, 2, 16, 4, 7, 4), 8);
  EXPECT_EQ(capacity_slots(0.0, 2, 16, 4, 0), 0);
}

TEST(CapacitySlots, NegativeIsDroplessCappedAtMinusF) {
  // -1 caps at 2 * 1 * 16 / 4 = 8.
  EXPECT_EQ(capacity_slots(-1.0, 2, 16, 4, 5), 5);
  EXPECT_EQ(capacity_slots(-1.0, 2, 16, 4, 8), 8);
  EXPECT_EQ(capacity_slots(-1.0, 2, 16, 4, 11), 8);
  EXPECT_EQ(capacity_slots(-1.0, 2, 16, 4, 5, 4), 8);  // 5 -> 8, cap 8
  EXPECT_EQ(capacity_slots(-1.0, 2, 16, 4, 5, 3), 6);  // 5 -> 6, cap 9
  EXPECT_EQ(capacity_slots(-2.0, 2, 16, 4, 11), 11);   // cap 16
}

TEST(ApplyCapacity, FirstChoicesBeforeSecondChoices) {
  auto run = [](std::vector<std::uint32_t> counts, std::int64_t cap) {
    std::vector<std::uint32_t> kept(counts.size());
    const std::int64_t total = apply_capacity(counts, cap, kept);
    EXPECT_EQ(total, std::accumulate(kept.begin(), kept.end(), std::int64_t{0}));
    return kept;
  };
  EXPECT_EQ(run({5, 4}, 7), (std::vector<std::uint32_t>{5, 2}));
  EXPECT_EQ(run({9, 3}, 7), (std::vector<std::uint32_t>{7, 0}));
  EXPECT_EQ(run({2, 3, 4}, 6), (std::vector<std::uint32_t>{2, 3, 1}));
  EXPECT_EQ(run({2, 3, 4}, 100), (std::vector<std::uint32_t>{2, 3, 4}));
  EXPECT_EQ(run({2, 3, 4}, 0), (std::vector<std::uint32_t>{0, 0, 0}));
  EXPECT_EQ(run({0, 6}, 4), (std::vector<std::uint32_t>{0, 4}));
}

// ---------------------------------------------------------------------------------------------
// Sampling properties.

TEST(WorkloadGenerator, TotalsAndCapacityBothMethods) {
  // S = 60 <= 128 * E: token method; S = 1100 > 128 * E: pair method.
  for (const int tokens : {60, 1100}) {
    for (const double f : {1.0, 0.5, 2.0}) {
      WorkloadGenerator gen(make_scenario(4, 8, 2, tokens, f));
      const IterationWorkload w = gen.next(0);
      ASSERT_EQ(w.layers.size(), 1u);
      const LayerDispatch& d = w.layers[0];
      EXPECT_EQ(d.capacity, capacity_slots(f, 2, tokens, 8, 0)) << tokens << " " << f;
      expect_consistent(d, tokens);
    }
  }
}

TEST(WorkloadGenerator, CapacityFactorHalfDropsTokens) {
  // f = 0.5 gives half the slots the average demand needs: at least half the choices drop.
  WorkloadGenerator gen(make_scenario(4, 8, 2, 400, 0.5));
  const LayerDispatch d = gen.next(0).layers[0];
  EXPECT_EQ(d.capacity, 50);
  EXPECT_GE(d.dropped, 4 * 2 * 400 / 2);
  // Second choices are dropped before first choices wherever a pair overflows.
  EXPECT_GT(d.dropped_by_choice[1], d.dropped_by_choice[0]);
}

TEST(WorkloadGenerator, DroplessDropsNothingAndCapacityIsMaxDemand) {
  for (const auto dist : {RoutingDistribution::kUniform, RoutingDistribution::kZipf}) {
    WorkloadGenerator gen(make_scenario(4, 8, 2, 300, 0.0, dist, 1.5));
    const LayerDispatch d = gen.next(0).layers[0];
    EXPECT_EQ(d.dropped, 0);
    EXPECT_EQ(d.kept, d.demanded);
    EXPECT_EQ(d.capacity, *std::max_element(d.demanded.begin(), d.demanded.end()));
    expect_consistent(d, 300);
    // Rounded to the pipeline degree.
    const LayerDispatch d3 = gen.next(0, 3).layers[0];
    EXPECT_EQ(d3.capacity % 3, 0);
    EXPECT_LT(d3.capacity - d.capacity, 3);
    EXPECT_EQ(d3.dropped, 0);
  }
}

TEST(WorkloadGenerator, NegativeFactorCapsDropless) {
  // Heavy skew: dropless would need far more than the -1 cap (2 * 1 * 300 / 8 = 75).
  WorkloadGenerator gen(make_scenario(4, 8, 2, 300, -1.0, RoutingDistribution::kZipf, 2.0));
  const LayerDispatch d = gen.next(0).layers[0];
  EXPECT_EQ(d.capacity, 75);
  EXPECT_GT(d.dropped, 0);
  expect_consistent(d, 300);
  // A generous cap leaves the dropless capacity in force.
  WorkloadGenerator loose(make_scenario(4, 8, 2, 300, -100.0, RoutingDistribution::kZipf, 2.0));
  const LayerDispatch dl = loose.next(0).layers[0];
  EXPECT_EQ(dl.dropped, 0);
  EXPECT_EQ(dl.capacity, *std::max_element(dl.demanded.begin(), dl.demanded.end()));
  EXPECT_EQ(dl.demanded, d.demanded);  // same seed, same choices
}

TEST(WorkloadGenerator, CountsDoNotDependOnThreads) {
  // 64 GPUs x 50,000 tokens x k = 2 is enough work for the generator to split it 3 ways.
  const Scenario sc = make_scenario(64, 512, 2, 50000, 1.0, RoutingDistribution::kZipf, 0.8);
  WorkloadGenerator one(sc), three(sc);
  one.set_threads(1);
  three.set_threads(3);
  const LayerDispatch a = one.next(2).layers[0], b = three.next(2).layers[0];
  EXPECT_EQ(a.demanded, b.demanded);
  EXPECT_EQ(a.kept, b.kept);
  EXPECT_EQ(a.dropped_by_choice, b.dropped_by_choice);
  EXPECT_GT(a.dropped, 0);
  expect_consistent(b, 50000);
}

TEST(WorkloadGenerator, TokenMethodChoicesAreDistinct) {
  // k = E: every token picks every expert once, so each (GPU, expert) is demanded exactly S times.
  WorkloadGenerator gen(make_scenario(3, 3, 3, 20, 0.0, RoutingDistribution::kZipf, 3.0));
  const LayerDispatch d = gen.next(0).layers[0];
  for (std::uint32_t c : d.demanded) EXPECT_EQ(c, 20u);
  // Uniform k = 2 of 2 (the one-draw fast path): both experts, once each, for every token.
  WorkloadGenerator pair(make_scenario(2, 2, 2, 16, 0.0));
  const LayerDispatch both = pair.next(0).layers[0];
  for (std::uint32_t c : both.demanded) EXPECT_EQ(c, 16u);
  // k = 2 of 4 under heavy skew: a pair can never be demanded more than S times.
  WorkloadGenerator gen2(make_scenario(2, 4, 2, 32, 0.0, RoutingDistribution::kZipf, 4.0));
  const LayerDispatch d2 = gen2.next(0).layers[0];
  for (std::uint32_t c : d2.demanded) EXPECT_LE(c, 32u);
  expect_consistent(d2, 32);
}

TEST(ChoiceSampler, TokenMethodSecondChoiceMarginalIsExact) {
  // Second choice of a token drawn from p without replacement: P(second = e) =
  // p_e * sum_{f != e} p_f / (1 - p_f). The token method must match it (statistically).
  const std::vector<double> p = {0.5, 0.25, 0.15, 0.1};
  const int tokens = 200000;
  detail::ChoiceSampler sampler(p, 4, 2, tokens, detail::ChoiceSampler::Method::kTokens);
  detail::Xoshiro256 rng(42);
  std::vector<std::uint32_t> counts(8);
  sampler.sample(rng, counts);
  for (int e = 0; e < 4; ++e) {
    double rest = 0;
    for (int f = 0; f < 4; ++f)
      if (f != e) rest += p[f] / (1 - p[f]);
    const double first = tokens * p[e], second = tokens * p[e] * rest;
    EXPECT_NEAR(counts[e], first, 5 * std::sqrt(first)) << e;
    EXPECT_NEAR(counts[4 + e], second, 5 * std::sqrt(second)) << e;
  }
}

TEST(ChoiceSampler, NodeLimitOfOnePairsTheExpertsOfANode) {
  // 4 experts on 2 nodes ({0, 1}, {2, 3}), top-2, at most 1 node per token: the second choice is
  // always the other expert of the first choice's node, so the second-choice counts are the
  // first-choice counts with the partners swapped, exactly, whatever the popularity.
  for (const bool uniform : {true, false}) {
    const std::vector<double> p =
        uniform ? std::vector<double>{} : std::vector<double>{0.6, 0.05, 0.3, 0.05};
    detail::ChoiceSampler sampler(p, 4, 2, 1000, detail::ChoiceSampler::Method::kAuto,
                                  detail::NodeLimit{{0, 0, 1, 1}, 1});
    EXPECT_EQ(sampler.method(), detail::ChoiceSampler::Method::kTokens);
    detail::Xoshiro256 rng(7);
    std::vector<std::uint32_t> c(8);
    sampler.sample(rng, c);
    EXPECT_EQ(c[0] + c[1] + c[2] + c[3], 1000u);
    EXPECT_EQ(c[4 + 1], c[0]);
    EXPECT_EQ(c[4 + 0], c[1]);
    EXPECT_EQ(c[4 + 3], c[2]);
    EXPECT_EQ(c[4 + 2], c[3]);
    EXPECT_GT(c[0], 0u);
    EXPECT_GT(c[2], 0u);
  }
}

TEST(ChoiceSampler, NodeLimitBoundsEveryTokensNodes) {
  // 32 experts on 8 nodes, top-8: one token per draw, so its 8 counted experts are its choices.
  // With a limit of 2 (and 3) no token spans more nodes; without one most tokens span 5+ nodes
  // (the check can fail); the first choice's marginal is p either way (within 5 sigma).
  std::vector<std::uint32_t> node_of(32);
  for (std::uint32_t e = 0; e < 32; ++e) node_of[e] = e / 4;
  std::vector<double> p(32);
  for (int e = 0; e < 32; ++e) p[static_cast<std::size_t>(e)] = 1.0 / (e + 1);
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= total;
  for (const int limit : {0, 2, 3}) {
    detail::ChoiceSampler sampler(p, 32, 8, 1, detail::ChoiceSampler::Method::kAuto,
                                  limit ? detail::NodeLimit{node_of, limit} : detail::NodeLimit{});
    std::vector<std::uint32_t> c(8 * 32);
    std::vector<int> first(32, 0);
    int max_nodes = 0;
    const int trials = 20000;
    for (int t = 0; t < trials; ++t) {
      detail::Xoshiro256 rng(detail::substream_key(3, detail::Stream::kTokens, t));
      sampler.sample(rng, c);
      std::vector<int> per_expert(32, 0);
      for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 32; ++e) per_expert[e] += c[static_cast<std::size_t>(j * 32 + e)];
      std::vector<bool> node_used(8, false);
      for (int e = 0; e < 32; ++e) {
        ASSERT_LE(per_expert[e], 1) << "choices of a token are distinct";
        if (per_expert[e]) node_used[node_of[e]] = true;
        first[e] += static_cast<int>(c[static_cast<std::size_t>(e)]);
      }
      ASSERT_EQ(std::accumulate(per_expert.begin(), per_expert.end(), 0), 8);
      const int nodes = static_cast<int>(std::count(node_used.begin(), node_used.end(), true));
      if (limit) {
        ASSERT_LE(nodes, limit) << "trial " << t;
      }
      max_nodes = std::max(max_nodes, nodes);
    }
    if (limit == 0) {
      EXPECT_GE(max_nodes, 5);
    } else {
      EXPECT_EQ(max_nodes, limit);
    }
    for (int e = 0; e < 32; ++e) {
      const double want = trials * p[static_cast<std::size_t>(e)];
      EXPECT_NEAR(first[e], want, 5 * std::sqrt(want) + 1) << "limit " << limit << " expert " << e;
    }
  }
}

TEST(WorkloadGenerator, NodeLimitKeepsEachTokenOnOneNode) {
  // 2 nodes x 2 GPUs, one expert per GPU, top-2, node_limit 1: every token sends its two copies
  // to the two GPUs of one node, so each row sends as many tokens to GPU 0 as to GPU 1, and to
  // GPU 2 as to GPU 3, and 2 S in all. The same rows without the limit differ.
  Scenario sc = make_scenario(4, 4, 2, 500, 0.0);
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 2;
  EXPECT_EQ(expert_nodes(sc, 0), (std::vector<std::uint32_t>{0, 0, 1, 1}));
  sc.workload.routing.node_limit = 1;
  WorkloadGenerator gen(sc);
  const LayerDispatch d = gen.next(0).layers[0];
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(d.at(i, 0), d.at(i, 1)) << i;
    EXPECT_EQ(d.at(i, 2), d.at(i, 3)) << i;
    EXPECT_EQ(d.gpu_sent(i), 1000) << i;
  }
  sc.workload.routing.node_limit = 0;
  WorkloadGenerator free_gen(sc);
  const LayerDispatch f = free_gen.next(0).layers[0];
  int unequal = 0;
  for (int i = 0; i < 4; ++i) unequal += f.at(i, 0) != f.at(i, 1);
  EXPECT_GT(unequal, 0);
}

TEST(ChoiceSampler, DistinctDestinationsCountEachTokenOncePerGpuAndNode) {
  // 32 experts, 4 per EP position (8 positions), 2 positions per node (4 nodes), top-8, one token
  // per draw: the distinct counts are 1 exactly on the positions and nodes its choices touch.
  // With node_limit 2 a token touches at most 2 nodes; without one, some touch all 4.
  std::vector<std::uint32_t> pos_of(32), node_of(32);
  for (std::uint32_t e = 0; e < 32; ++e) pos_of[e] = e / 4, node_of[e] = e / 8;
  for (const int limit : {0, 2}) {
    detail::ChoiceSampler sampler({}, 32, 8, 1, detail::ChoiceSampler::Method::kAuto,
                                  limit ? detail::NodeLimit{node_of, limit} : detail::NodeLimit{},
                                  detail::DistinctDestinations{pos_of, node_of, 8, 4});
    EXPECT_EQ(sampler.method(), detail::ChoiceSampler::Method::kTokens);
    std::vector<std::uint32_t> c(8 * 32), distinct(8 + 4);
    int max_nodes = 0;
    for (int t = 0; t < 2000; ++t) {
      detail::Xoshiro256 rng(detail::substream_key(5, detail::Stream::kTokens, t));
      sampler.sample(rng, c, distinct);
      std::vector<std::uint32_t> want(12, 0);
      for (int j = 0; j < 8; ++j)
        for (std::uint32_t e = 0; e < 32; ++e)
          if (c[static_cast<std::size_t>(j * 32) + e]) want[pos_of[e]] = want[8 + node_of[e]] = 1;
      ASSERT_EQ(distinct, want) << "limit " << limit << " token " << t;
      max_nodes =
          std::max(max_nodes, static_cast<int>(std::accumulate(want.begin() + 8, want.end(), 0u)));
    }
    EXPECT_EQ(max_nodes, limit ? 2 : 4);
  }
}

TEST(WorkloadGenerator, DistinctTokensAreSampledForADeepepStrategy) {
  // 2 nodes x 2 GPUs, one expert per GPU, top-2, node_limit 1: every token's two experts are the
  // two GPUs of one node. So a row's distinct tokens per GPU equal its copies to that GPU, and
  // per node equal its copies to either GPU of the node; the nodes' counts sum to S.
  Scenario sc = make_scenario(4, 4, 2, 500, 0.0);
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 2;
  sc.workload.routing.node_limit = 1;
  EXPECT_TRUE(WorkloadGenerator(sc).next(0).layers[0].distinct.empty());
  StrategySpec deepep;
  deepep.name = "deepep";
  deepep.a2a = A2aRole::kDeepep;
  sc.strategies.push_back(deepep);
  WorkloadGenerator gen(sc);
  const LayerDispatch d = gen.next(0).layers[0];
  ASSERT_EQ(d.distinct_positions, 4);
  ASSERT_EQ(d.distinct_nodes, 2);
  ASSERT_EQ(d.distinct.size(), 4u * 6u);
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t* row = d.distinct.data() + static_cast<std::size_t>(i) * 6;
    for (int q = 0; q < 4; ++q) EXPECT_EQ(row[q], d.at(i, q)) << i << " " << q;
    EXPECT_EQ(row[4], d.at(i, 0)) << i;
    EXPECT_EQ(row[5], d.at(i, 2)) << i;
    EXPECT_EQ(row[4] + row[5], 500u) << i;
  }
  // A shared cache keeps the distinct counts with the counts: the second generator's hit gives
  // the same layer as sampling does.
  SampleCache cache;
  WorkloadGenerator first(sc), second(sc);
  first.set_cache(&cache);
  second.set_cache(&cache);
  EXPECT_EQ(first.next(0).layers[0].distinct, d.distinct);
  const LayerDispatch hit = second.next(0).layers[0];
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(hit.distinct, d.distinct);
  EXPECT_EQ(hit.kept, d.kept);
}

TEST(WorkloadGenerator, SkippingTheDistinctCountKeepsTheDraws) {
  // A stack that does not dispatch per node skips the distinct count, not the draws: with and
  // without a node limit (without one, the plain top-2 sampler would draw differently) the kept
  // counts are those of a generator that counts.
  for (const int limit : {0, 1}) {
    Scenario sc = make_scenario(4, 4, 2, 500, 0.0);
    sc.cluster.nodes = 2;
    sc.cluster.gpus_per_node = 2;
    sc.workload.routing.node_limit = limit;
    StrategySpec deepep;
    deepep.name = "deepep";
    deepep.a2a = A2aRole::kDeepep;
    sc.strategies.push_back(deepep);
    WorkloadGenerator counting(sc), skipping(sc);
    skipping.set_count_distinct(false);
    const LayerDispatch want = counting.next(0).layers[0];
    const LayerDispatch got = skipping.next(0).layers[0];
    EXPECT_FALSE(want.distinct.empty()) << limit;
    EXPECT_TRUE(got.distinct.empty()) << limit;
    EXPECT_EQ(got.kept, want.kept) << limit;
    EXPECT_EQ(got.max_demanded, want.max_demanded) << limit;
  }
}

TEST(WorkloadGenerator, ExpertNodesFollowTheEpGroupOfTheRow) {
  // 8 GPUs on 2 nodes of 4, ep 2 x mp 2 x dp 2 (disjoint: rank = (d*ep + e)*mp + t), 2 experts
  // per GPU: GPU 5 (d 1, e 0, t 1) has EP group {5, 7}, both on node 1; GPU 1's group {1, 3} is
  // on node 0; each numbers its one node 0. With gpus_per_node 2, GPU 5's group spans nodes 2 and
  // 3, numbered 0 and 1.
  Scenario sc = make_scenario(8, 4, 2, 16);
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 4;
  sc.model.experts_per_gpu = 2;
  sc.parallelism.ep = 2;
  sc.parallelism.mp = 2;
  sc.parallelism.dp = 2;
  EXPECT_EQ(expert_nodes(sc, 5), (std::vector<std::uint32_t>{0, 0, 0, 0}));
  sc.cluster.nodes = 4;
  sc.cluster.gpus_per_node = 2;
  EXPECT_EQ(expert_nodes(sc, 5), (std::vector<std::uint32_t>{0, 0, 1, 1}));
  EXPECT_EQ(expert_nodes(sc, 1), (std::vector<std::uint32_t>{0, 0, 1, 1}));
}

TEST(WorkloadGenerator, NodeLimitTooSmallForTopKIsAnInputError) {
  // 2 experts per node, top-4: one node cannot hold a token's 4 choices.
  Scenario sc = make_scenario(4, 4, 4, 16, 0.0);
  sc.cluster.nodes = 2;
  sc.cluster.gpus_per_node = 2;
  sc.workload.routing.node_limit = 1;
  try {
    WorkloadGenerator gen(sc);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than top_k = 4"), std::string::npos) << e.what();
  }
  sc.workload.routing.node_limit = 2;  // both nodes: the limit never binds
  EXPECT_NO_THROW(WorkloadGenerator{sc});
}

TEST(ChoiceSampler, CountMethodRankWeights) {
  // Uniform: the approximation is exact (every rank uniform).
  detail::ChoiceSampler uniform({}, 16, 2, 1000, detail::ChoiceSampler::Method::kCounts);
  for (double q : uniform.rank_weights(1)) EXPECT_DOUBLE_EQ(q, 1.0 / 16);
  // Skewed: rank 2 weights are p_e (1 - p_e), normalised; first-choice counts are a multinomial
  // of S with probabilities p, so each rank sums to S.
  const std::vector<double> p = {0.5, 0.25, 0.15, 0.1};
  detail::ChoiceSampler skewed(p, 4, 2, 100000, detail::ChoiceSampler::Method::kCounts);
  double norm = 0;
  for (double x : p) norm += x * (1 - x);
  for (int e = 0; e < 4; ++e)
    EXPECT_NEAR(skewed.rank_weights(1)[e], p[e] * (1 - p[e]) / norm, 1e-12);
  detail::Xoshiro256 rng(7);
  std::vector<std::uint32_t> counts(8);
  skewed.sample(rng, counts);
  EXPECT_EQ(std::accumulate(counts.begin(), counts.begin() + 4, 0u), 100000u);
  EXPECT_EQ(std::accumulate(counts.begin() + 4, counts.end(), 0u), 100000u);
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(counts[e], 100000 * p[e], 5 * std::sqrt(100000 * p[e]));
}

TEST(WorkloadGenerator, ZipfPopularityFollowsRanks) {
  WorkloadGenerator gen(make_scenario(2, 16, 2, 64, 0.0, RoutingDistribution::kZipf, 1.2));
  std::vector<double> p = gen.expert_popularity(0, 0);
  ASSERT_EQ(p.size(), 16u);
  EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
  const std::vector<double> unsorted = p;
  std::sort(p.rbegin(), p.rend());
  for (int r = 0; r < 16; ++r) EXPECT_NEAR(p[r] / p[0], std::pow(r + 1.0, -1.2), 1e-12);
  // The ranking is a seeded permutation: not simply expert 0 first for every seed.
  bool differs = false;
  for (std::uint64_t seed = 1; seed <= 5 && !differs; ++seed) {
    WorkloadGenerator other(
        make_scenario(2, 16, 2, 64, 0.0, RoutingDistribution::kZipf, 1.2, seed + 10));
    differs = other.expert_popularity(0, 0) != unsorted;
  }
  EXPECT_TRUE(differs);
  // Fixed per layer across iterations.
  EXPECT_EQ(gen.expert_popularity(3, 0), unsorted);
}

double mean_imbalance(RoutingDistribution dist, double skew_or_alpha, int seeds) {
  double sum = 0;
  for (int s = 1; s <= seeds; ++s) {
    Scenario sc = make_scenario(8, 32, 2, 512, 0.0, dist, 0.0, static_cast<std::uint64_t>(s));
    if (dist == RoutingDistribution::kZipf) sc.workload.routing.skew = skew_or_alpha;
    if (dist == RoutingDistribution::kDirichlet)
      sc.workload.routing.dirichlet_alpha = skew_or_alpha;
    WorkloadGenerator gen(sc);
    sum += gen.next(0).layers[0].imbalance();
  }
  return sum / seeds;
}

TEST(WorkloadGenerator, SkewRaisesImbalance) {
  const double uniform = mean_imbalance(RoutingDistribution::kUniform, 0, 6);
  const double zipf0 = mean_imbalance(RoutingDistribution::kZipf, 0.0, 6);
  // Expected load 8 * 2 * 512 / 32 = 256 per expert, max of 32 ~ +2.1 sigma: ~1.13 both.
  EXPECT_NEAR(zipf0, uniform, 0.05);
  EXPECT_LT(uniform, 1.3);
  double previous = zipf0;
  for (const double skew : {0.5, 1.0, 1.5, 2.0}) {
    const double x = mean_imbalance(RoutingDistribution::kZipf, skew, 6);
    EXPECT_GT(x, previous) << "skew " << skew;
    previous = x;
  }
  // Dirichlet: smaller alpha, more skewed popularity.
  const double dir_flat = mean_imbalance(RoutingDistribution::kDirichlet, 100.0, 6);
  const double dir_mid = mean_imbalance(RoutingDistribution::kDirichlet, 1.0, 6);
  const double dir_peaked = mean_imbalance(RoutingDistribution::kDirichlet, 0.1, 6);
  EXPECT_LT(dir_flat, dir_mid);
  EXPECT_LT(dir_mid, dir_peaked);
}

TEST(WorkloadGenerator, DirichletPopularityChangesPerIterationAndLayer) {
  Scenario sc = make_scenario(2, 16, 2, 64, 0.0, RoutingDistribution::kDirichlet, 0, 3, 2);
  sc.workload.routing.dirichlet_alpha = 0.05;  // tiny alpha: log-space draws must not underflow
  WorkloadGenerator gen(sc);
  const auto p00 = gen.expert_popularity(0, 0);
  EXPECT_NEAR(std::accumulate(p00.begin(), p00.end(), 0.0), 1.0, 1e-12);
  EXPECT_NE(p00, gen.expert_popularity(1, 0));
  EXPECT_NE(p00, gen.expert_popularity(0, 1));
  EXPECT_EQ(p00, gen.expert_popularity(0, 0));
  const IterationWorkload w = gen.next(0);
  ASSERT_EQ(w.layers.size(), 2u);
  for (const auto& d : w.layers) expect_consistent(d, 64);
}

TEST(WorkloadGenerator, Deterministic) {
  for (const auto dist : {RoutingDistribution::kUniform, RoutingDistribution::kZipf,
                          RoutingDistribution::kDirichlet}) {
    const Scenario a = make_scenario(4, 8, 2, 200, 1.0, dist, 1.0, 11, 2);
    WorkloadGenerator g1(a), g2(a);
    const IterationWorkload w1 = g1.next(0), w2 = g2.next(0);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(w1.layers[l].kept, w2.layers[l].kept);
      EXPECT_EQ(w1.layers[l].demanded, w2.layers[l].demanded);
    }
    EXPECT_NE(w1.layers[0].demanded, w1.layers[1].demanded);  // layers are independent draws
    EXPECT_NE(w1.layers[0].demanded, g1.next(1).layers[0].demanded);  // so are iterations
    // Another seed, other counts.
    WorkloadGenerator g3(make_scenario(4, 8, 2, 200, 1.0, dist, 1.0, 12, 2));
    EXPECT_NE(g3.next(0).layers[0].demanded, w1.layers[0].demanded);
    // Order independence: iteration 3 straight away equals iteration 3 after 0..2.
    WorkloadGenerator g4(a);
    const auto direct = g4.next(3).layers[1].demanded;
    WorkloadGenerator g5(a);
    for (int i = 0; i < 3; ++i) g5.next(i);
    EXPECT_EQ(g5.next(3).layers[1].demanded, direct);
  }
}

// ---------------------------------------------------------------------------------------------
// Dynamic capacity.

TEST(CapacityFactor, FixedAndTrace) {
  Scenario sc = make_scenario(2, 4, 2, 8, 1.5);
  WorkloadGenerator fixed(sc);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(fixed.capacity_factor(i), 1.5);
  sc.workload.capacity.kind = CapacityKind::kTrace;
  sc.workload.capacity.factors = {1.0, 2.5, 0.0, -3.0};
  WorkloadGenerator trace(sc);
  for (int i = 0; i < 10; ++i)
    EXPECT_EQ(trace.capacity_factor(i), sc.workload.capacity.factors[i % 4]);
  // The factor reaches the layer: iteration 1 (f = 2.5): 2 * 2.5 * 8 / 4 = 10 slots.
  const IterationWorkload w = trace.next(1);
  EXPECT_EQ(w.capacity_factor, 2.5);
  EXPECT_EQ(w.layers[0].capacity, 10);
  EXPECT_EQ(w.layers[0].capacity_factor, 2.5);
}

TEST(CapacityFactor, RandomWalkStaysInBoundsAndMovesByStep) {
  Scenario sc = make_scenario(2, 4, 2, 8, 9.0);  // start 9 clamps to max
  sc.workload.capacity.kind = CapacityKind::kRandomWalk;
  sc.workload.capacity.min = 1.0;
  sc.workload.capacity.max = 4.0;
  sc.workload.capacity.step = 0.5;
  WorkloadGenerator gen(sc);
  EXPECT_EQ(gen.capacity_factor(0), 4.0);
  std::vector<double> walk;
  for (int i = 0; i < 400; ++i) walk.push_back(gen.capacity_factor(i));
  bool reached_min = false;
  for (int i = 0; i < 400; ++i) {
    EXPECT_GE(walk[i], 1.0);
    EXPECT_LE(walk[i], 4.0);
    reached_min |= walk[i] == 1.0;
    if (i > 0) {
      const double delta = std::abs(walk[i] - walk[i - 1]);
      // +-step, or 0 when clamped at a bound.
      EXPECT_TRUE(delta == 0.5 || (delta == 0.0 && (walk[i] == 1.0 || walk[i] == 4.0))) << i;
    }
  }
  EXPECT_TRUE(reached_min);  // 400 steps of a 6-position walk visit both ends
  // Deterministic and order independent.
  WorkloadGenerator again(sc);
  EXPECT_EQ(again.capacity_factor(250), walk[250]);
  EXPECT_EQ(again.capacity_factor(3), walk[3]);
}

// ---------------------------------------------------------------------------------------------
// Trace files.

TEST(RoutingTrace, RoundTripAndWrapAround) {
  const Scenario sc = make_scenario(3, 6, 2, 40, 0.0, RoutingDistribution::kZipf, 1.0, 5, 2);
  WorkloadGenerator gen(sc);
  std::vector<IterationWorkload> its = {gen.next(0), gen.next(1)};
  const std::string path = temp_path("roundtrip.csv");
  {
    std::ofstream out(path);
    write_routing_trace(out, its);
  }
  Scenario replay = sc;
  replay.workload.routing.distribution = RoutingDistribution::kTrace;
  replay.workload.routing.trace_path = path;
  WorkloadGenerator from_trace(replay);
  for (int i = 0; i < 5; ++i) {  // iterations 2, 3, 4 wrap to 0, 1, 0
    const IterationWorkload w = from_trace.next(i);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(w.layers[l].demanded, its[i % 2].layers[l].demanded) << i << " " << l;
      EXPECT_EQ(w.layers[l].kept, its[i % 2].layers[l].kept);
      EXPECT_EQ(w.layers[l].capacity, its[i % 2].layers[l].capacity);
    }
  }
  // Under a fixed capacity the kept totals match too (kept = min(demanded, dC) per pair).
  replay.model.capacity_factor = 0.5;
  WorkloadGenerator capped(replay);
  const LayerDispatch d = capped.next(1).layers[1];
  EXPECT_EQ(d.capacity, 7);  // ceil(2 * 0.5 * 40 / 6)
  expect_consistent(d, 40);
  std::filesystem::remove(path);
}

TEST(RoutingTrace, ChoiceColumnDropsSecondChoicesFirst) {
  // Hand-built: S = 7, E = 2, k = 2, f = 1: dC = 2 * 7 / 2 = 7.
  const std::string path = temp_path("choices.csv");
  write_file(path,
             "# hand-built routing trace\n"
             "iteration,layer,gpu,expert,choice,count\n"
             "0,0,0,0,0,5\n"
             "0,0,0,0,1,4\n"
             "0,0,0,1,0,9\n"
             "0,0,0,1,1,3\n"
             "\n"
             "0,0,1,1,1,6\n");
  Scenario sc = make_scenario(2, 2, 2, 7, 1.0);
  sc.workload.routing.distribution = RoutingDistribution::kTrace;
  sc.workload.routing.trace_path = path;
  WorkloadGenerator gen(sc);
  const LayerDispatch d = gen.next(0).layers[0];
  EXPECT_EQ(d.capacity, 7);
  EXPECT_EQ(d.demanded, (std::vector<std::uint32_t>{9, 12, 0, 6}));
  EXPECT_EQ(d.kept, (std::vector<std::uint32_t>{7, 7, 0, 6}));
  // (0,0): first 5 kept, second 2 of 4 kept; (0,1): first 7 of 9, no second.
  EXPECT_EQ(d.dropped_by_choice, (std::vector<std::int64_t>{2, 2 + 3}));
  EXPECT_EQ(d.dropped, 7);
  std::filesystem::remove(path);
}

TEST(RoutingTrace, ScenarioFileWithTrace) {
  // The loader resolves the trace path against the scenario file; the fixture's header uses the
  // src/tokens aliases and routes 4 tokens from GPU 0 to expert 0 (2 GPUs, 4 experts, S = 16).
  const Scenario sc =
      load_scenario(std::string(MOESIM_SOURCE_DIR) + "/tests/data/scenarios/with-calibration.yaml");
  WorkloadGenerator gen(sc);
  const IterationWorkload w = gen.next(5);  // wraps to trace iteration 0
  ASSERT_EQ(w.layers.size(), 1u);
  const LayerDispatch& d = w.layers[0];
  EXPECT_EQ(d.num_gpus, 2);
  EXPECT_EQ(d.num_experts, 4);
  EXPECT_EQ(d.at(0, 0), 4u);
  EXPECT_EQ(std::accumulate(d.kept.begin(), d.kept.end(), 0u), 4u);
  EXPECT_TRUE(gen.expert_popularity(0, 0).empty());
}

TEST(RoutingTrace, AliasColumnsAndAnyColumnOrder) {
  const std::string path = temp_path("alias.csv");
  write_file(path, "src, expert ,tokens,layer,iteration\r\n1,0,3,0,0\r\n");
  const RoutingTrace t = read_routing_trace(path, 2, 2, 1, 2);
  ASSERT_EQ(t.num_iterations, 1);
  ASSERT_EQ(t.entries[0].size(), 1u);
  EXPECT_EQ(t.entries[0][0].gpu, 1);
  EXPECT_EQ(t.entries[0][0].expert, 0);
  EXPECT_EQ(t.entries[0][0].count, 3u);
  std::filesystem::remove(path);
}

TEST(RoutingTrace, MalformedTracesNameFileLineAndColumn) {
  struct Case {
    std::string text;
    int line;
    int column;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"iteration,layer,gpu,expert,count\n0,0,0,0,x\n", 2, 9, "non-negative integer"},
      {"iteration,layer,gpu,expert,count\n0,0,0,0,-3\n", 2, 9, "non-negative integer"},
      {"# c\niteration,layer,gpu,expert,count\n0,0,0,4,1\n", 3, 7, "experts (E)"},
      {"iteration,layer,gpu,expert,count\n0,0,2,0,1\n", 2, 5, "GPUs (P)"},
      {"iteration,layer,gpu,expert,count\n0,1,0,0,1\n", 2, 3, "MoE layers"},
      {"iteration,layer,gpu,expert,count,choice\n0,0,0,0,1,2\n", 2, 11, "top_k"},
      {"iteration,layer,gpu,expert,count\n0,0,0,0\n", 2, 1, "found 4 fields, expected 5"},
      {"iteration,layer,gpu,expert,count\n0,0,1,1,1\n\n0,0,1,1,2\n", 4, 1, "first on line 2"},
      {"iteration,layer,gpu,expert,cnt\n", 1, 28, "column 'cnt'"},
      {"iteration,layer,gpu,count\n0,0,0,1\n", 1, 1, "no 'expert' column"},
      {"# only a comment\n", 0, 0, "no header"},
      {"iteration,layer,gpu,expert,count\n", 0, 0, "no data rows"},
  };
  const std::string path = temp_path("bad.csv");
  for (const Case& c : cases) {
    write_file(path, c.text);
    try {
      read_routing_trace(path, 2, 4, 1, 2);
      ADD_FAILURE() << "no error for:\n" << c.text;
    } catch (const InputError& e) {
      EXPECT_EQ(e.location().file, path);
      EXPECT_EQ(e.location().line, c.line) << e.what();
      EXPECT_EQ(e.location().column, c.column) << e.what();
      EXPECT_EQ(e.key(), "workload.routing.trace");
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
      if (c.line > 0) {
        EXPECT_NE(std::string(e.what()).find(path + ":" + std::to_string(c.line)),
                  std::string::npos)
            << e.what();
      }
    }
  }
  std::filesystem::remove(path);
  EXPECT_THROW(read_routing_trace(path, 2, 4, 1, 2), InputError);  // missing file
  // Through the generator: the scenario's shape is what the trace is checked against.
  write_file(path, "iteration,layer,gpu,expert,count\n0,0,0,7,1\n");
  Scenario sc = make_scenario(2, 4, 2, 8);
  sc.workload.routing.distribution = RoutingDistribution::kTrace;
  sc.workload.routing.trace_path = path;
  EXPECT_THROW(WorkloadGenerator{sc}, InputError);
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------------------------
// Dispatch / combine matrices.

TEST(DispatchMatrix, SumsKeptOverOwnedExpertsAndTransposesForCombine) {
  LayerDispatch d;
  d.num_gpus = 4;
  d.num_experts = 4;
  d.top_k = 2;
  d.capacity = 5;
  // kept[i][e]
  d.kept = {1, 2, 3, 4,  //
            5, 0, 1, 0,  //
            2, 2, 2, 2,  //
            0, 0, 0, 5};
  d.demanded = d.kept;
  const ExpertPlacement two_per_gpu{2, 1};  // experts 0,1 -> position 0; 2,3 -> position 1
  const std::vector<int> group = {1, 3};    // an EP group of ranks 1 and 3
  const ByteMatrix m = dispatch_matrix(d, group, two_per_gpu, Bytes(64));
  EXPECT_EQ(m.size, 2);
  EXPECT_EQ(m.unit, Bytes(64));
  EXPECT_EQ(m.counts, (std::vector<std::uint32_t>{5, 1, 0, 5}));
  EXPECT_EQ(m.at(0, 1), Bytes(64));
  const ByteMatrix c = combine_matrix(d, group, two_per_gpu, Bytes(64));
  EXPECT_EQ(c.counts, (std::vector<std::uint32_t>{5, 0, 1, 5}));
  const ByteMatrix padded = dispatch_matrix(d, group, two_per_gpu, Bytes(64), true);
  EXPECT_EQ(padded.counts, (std::vector<std::uint32_t>{10, 10, 10, 10}));
  // Sharded experts (2 experts over 4 GPUs, 2 shards each): tokens go to the first shard.
  LayerDispatch s = d;
  s.num_experts = 2;
  s.kept = {1, 2, 3, 4, 5, 6, 7, 8};
  const ByteMatrix sm =
      dispatch_matrix(s, std::vector<int>{0, 1, 2, 3}, ExpertPlacement{1, 2}, Bytes(2));
  EXPECT_EQ(sm.counts,
            (std::vector<std::uint32_t>{1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0}));
  EXPECT_EQ(ExpertPlacement::of(make_scenario(4, 8, 2, 8).model).experts_per_gpu, 2);
}

TEST(DispatchMatrix, ConservesKeptTokensOfSampledLayer) {
  WorkloadGenerator gen(make_scenario(8, 16, 2, 64, 1.0));
  const LayerDispatch d = gen.next(0).layers[0];
  std::vector<int> group(8);
  std::iota(group.begin(), group.end(), 0);
  const ByteMatrix m = dispatch_matrix(d, group, ExpertPlacement{2, 1}, Bytes(1));
  std::int64_t kept = 0;
  for (std::uint32_t x : d.kept) kept += x;
  EXPECT_EQ(m.total(), Bytes(static_cast<double>(kept)));
  for (int a = 0; a < 8; ++a) EXPECT_EQ(m.row_sum(a), Bytes(static_cast<double>(d.gpu_sent(a))));
  for (int b = 0; b < 8; ++b)
    EXPECT_EQ(m.col_sum(b),
              Bytes(static_cast<double>(d.expert_load(2 * b) + d.expert_load(2 * b + 1))));
}

TEST(WorkloadGenerator, RejectsBadInputs) {
  EXPECT_THROW(WorkloadGenerator{make_scenario(2, 4, 5, 8)}, InputError);  // k > E
  WorkloadGenerator gen(make_scenario(2, 4, 2, 8));
  EXPECT_THROW(gen.next(-1), InputError);
  EXPECT_THROW(gen.next(0, 0), InputError);
  EXPECT_THROW(gen.sample_layer(0, 1, 1.0), InputError);
}

// ---------------------------------------------------------------------------------------------
// detail::binomial and the pair method (exact per-expert counts for k <= 2).

// log of the Binomial(n, p) pmf at k, from std::lgamma (single-threaded test: no data race).
double log_binomial_pmf(std::int64_t n, double p, std::int64_t k) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) +
         static_cast<double>(k) * std::log(p) + static_cast<double>(n - k) * std::log1p(-p);
}

TEST(Binomial, EdgeCases) {
  detail::Xoshiro256 rng(3);
  EXPECT_EQ(detail::binomial(rng, 0, 0.5), 0);
  EXPECT_EQ(detail::binomial(rng, 17, 0.0), 0);
  EXPECT_EQ(detail::binomial(rng, 17, 1.0), 17);
  EXPECT_EQ(detail::binomial(rng, -3, 0.5), 0);
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t x = detail::binomial(rng, 1'000'000'000, 1e-9 * (i % 7));  // inversion
    EXPECT_GE(x, 0);
    EXPECT_LE(x, 100);
  }
}

TEST(Binomial, MatchesThePmf) {
  // Both methods (inversion below n p = 10, BTRS above) and the p > 1/2 reflection: a chi-square
  // test of 200,000 draws against the exact pmf (cells with expectation < 5 pooled into the
  // tails), plus mean and variance within 5 standard errors. Fixed seeds: deterministic.
  struct Case {
    std::int64_t n;
    double p;
  };
  for (const Case c : {Case{5, 0.3}, Case{40, 0.2}, Case{20, 0.5}, Case{100, 0.1}, Case{1000, 0.37},
                       Case{300, 0.9}, Case{1'000'000, 0.5}, Case{50'000, 0.0004}}) {
    const int draws = 200'000;
    detail::Xoshiro256 rng(static_cast<std::uint64_t>(c.n * 1000 + 7));
    std::vector<std::int64_t> seen;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < draws; ++i) {
      const std::int64_t x = detail::binomial(rng, c.n, c.p);
      ASSERT_GE(x, 0);
      ASSERT_LE(x, c.n);
      seen.push_back(x);
      sum += static_cast<double>(x);
      sum2 += static_cast<double>(x) * static_cast<double>(x);
    }
    const double mean = c.n * c.p, var = c.n * c.p * (1 - c.p);
    const double sample_mean = sum / draws;
    const double sample_var = sum2 / draws - sample_mean * sample_mean;
    EXPECT_NEAR(sample_mean, mean, 5 * std::sqrt(var / draws)) << c.n << " " << c.p;
    // Var of the sample variance ~ 2 var^2 / draws for near-normal counts (plus kurtosis terms
    // that are small here); 6 standard errors.
    EXPECT_NEAR(sample_var, var, 6 * var * std::sqrt(2.0 / draws) + 1e-9) << c.n << " " << c.p;
    // Chi-square over the central range mean +- 6 sd, tails pooled.
    const auto lo = static_cast<std::int64_t>(std::max(0.0, std::floor(mean - 6 * std::sqrt(var))));
    const auto hi = static_cast<std::int64_t>(
        std::min(static_cast<double>(c.n), std::ceil(mean + 6 * std::sqrt(var))));
    std::vector<double> expected, observed;
    double exp_acc = 0, obs_acc = 0, mass = 0;
    std::vector<std::int64_t> hist(static_cast<std::size_t>(hi - lo + 1), 0);
    std::int64_t outside = 0;
    for (const std::int64_t x : seen) {
      if (x < lo || x > hi)
        ++outside;
      else
        ++hist[static_cast<std::size_t>(x - lo)];
    }
    for (std::int64_t k = lo; k <= hi; ++k) {
      const double e = draws * std::exp(log_binomial_pmf(c.n, c.p, k));
      mass += e / draws;
      exp_acc += e;
      obs_acc += static_cast<double>(hist[static_cast<std::size_t>(k - lo)]);
      if (exp_acc >= 5) {
        expected.push_back(exp_acc);
        observed.push_back(obs_acc);
        exp_acc = obs_acc = 0;
      }
    }
    if (!expected.empty()) {
      expected.back() += exp_acc + draws * std::max(0.0, 1 - mass);
      observed.back() += obs_acc + static_cast<double>(outside);
    }
    double chi2 = 0;
    for (std::size_t i = 0; i < expected.size(); ++i)
      chi2 += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    const double df = static_cast<double>(expected.size()) - 1;
    ASSERT_GE(df, 1) << c.n << " " << c.p;
    EXPECT_LT(chi2, df + 5 * std::sqrt(2 * df)) << c.n << " " << c.p << " df " << df;
  }
}

// Exact per-GPU moments of the per-choice counts for k = 2 (tokens i.i.d.): with s_e the
// second-choice marginal and P(first = e, second = f) = p_e p_f / (1 - p_e), the count vector
// (c1, c2) of S tokens has mean S (p, s) and covariance S times the one-token covariance.
struct PairMoments {
  std::vector<double> mean;  // 2E
  std::vector<double> cov;   // 2E x 2E
};

PairMoments exact_pair_moments(const std::vector<double>& p, double tokens) {
  const std::size_t E = p.size();
  std::vector<double> joint(E * E, 0.0), s(E, 0.0);
  for (std::size_t e = 0; e < E; ++e)
    for (std::size_t f = 0; f < E; ++f)
      if (e != f) s[f] += joint[e * E + f] = p[e] * p[f] / (1 - p[e]);
  PairMoments m;
  m.mean.resize(2 * E);
  m.cov.assign(4 * E * E, 0.0);
  for (std::size_t e = 0; e < E; ++e) {
    m.mean[e] = tokens * p[e];
    m.mean[E + e] = tokens * s[e];
  }
  // One token's indicators: I_x for x < E (first = x), I_{E+y} (second = y).
  auto second_moment = [&](std::size_t x, std::size_t y) {
    if (x < E && y < E) return x == y ? p[x] : 0.0;
    if (x >= E && y >= E) return x == y ? s[x - E] : 0.0;
    return x < E ? joint[x * E + (y - E)] : joint[y * E + (x - E)];
  };
  for (std::size_t x = 0; x < 2 * E; ++x)
    for (std::size_t y = 0; y < 2 * E; ++y)
      m.cov[x * 2 * E + y] =
          tokens * (second_moment(x, y) - m.mean[x] / tokens * m.mean[y] / tokens);
  return m;
}

TEST(ChoiceSampler, PairMethodMatchesTokenMethodMoments) {
  // Over 20,000 seeds (GPUs), the pair method and the exact token method must both reproduce the
  // exact mean of every count and the full covariance matrix of (c1, c2), including the negative
  // covariance of c1[e] and c2[e] that the old count method missed (it drew ranks
  // independently). Tolerance: 5 standard errors of each estimate (+ a small absolute floor).
  const std::vector<std::vector<double>> cases = {
      {0.25, 0.25, 0.25, 0.25},           // uniform (the sampler's exact-ratio branch)
      {0.5, 0.25, 0.15, 0.1},             // skewed
      {0.05, 0.3, 0.05, 0.2, 0.1, 0.3}};  // unsorted weights
  const int tokens = 40, seeds = 20'000;
  using Method = detail::ChoiceSampler::Method;
  for (const auto& p : cases) {
    const std::size_t E = p.size();
    const bool uniform = std::all_of(p.begin(), p.end(), [&](double x) { return x == p[0]; });
    const PairMoments exact = exact_pair_moments(p, tokens);
    for (const Method method : {Method::kTokens, Method::kPairs}) {
      const detail::ChoiceSampler sampler(uniform ? std::vector<double>{} : p, static_cast<int>(E),
                                          2, tokens, method);
      ASSERT_EQ(sampler.method(), method);
      std::vector<double> sum(2 * E, 0.0), sum2(4 * E * E, 0.0);
      std::vector<std::uint32_t> counts(2 * E);
      for (int seed = 0; seed < seeds; ++seed) {
        detail::Xoshiro256 rng(static_cast<std::uint64_t>(seed) * 7919 + 1);
        sampler.sample(rng, counts);
        ASSERT_EQ(std::accumulate(counts.begin(), counts.begin() + E, 0u), 40u);
        ASSERT_EQ(std::accumulate(counts.begin() + E, counts.end(), 0u), 40u);
        for (std::size_t e = 0; e < E; ++e) ASSERT_LE(counts[e] + counts[E + e], 40u);
        for (std::size_t x = 0; x < 2 * E; ++x) {
          sum[x] += counts[x];
          for (std::size_t y = 0; y < 2 * E; ++y)
            sum2[x * 2 * E + y] += static_cast<double>(counts[x]) * counts[y];
        }
      }
      for (std::size_t x = 0; x < 2 * E; ++x) {
        const double mean = sum[x] / seeds;
        const double var_x = exact.cov[x * 2 * E + x];
        EXPECT_NEAR(mean, exact.mean[x], 5 * std::sqrt(var_x / seeds) + 1e-9)
            << "method " << static_cast<int>(method) << " count " << x;
        for (std::size_t y = 0; y < 2 * E; ++y) {
          const double cov = sum2[x * 2 * E + y] / seeds - mean * (sum[y] / seeds);
          const double var_y = exact.cov[y * 2 * E + y];
          const double c = exact.cov[x * 2 * E + y];
          const double se = std::sqrt((var_x * var_y + c * c) / seeds);
          EXPECT_NEAR(cov, c, 5 * se + 1e-3)
              << "method " << static_cast<int>(method) << " cov " << x << "," << y;
        }
      }
    }
  }
}

TEST(ChoiceSampler, PairMethodZeroWeightsAndTopOne) {
  // Only experts 1 and 3 have weight: a token's second choice is the other one, exactly.
  const detail::ChoiceSampler two({0.0, 0.6, 0.0, 0.4}, 4, 2, 1000,
                                  detail::ChoiceSampler::Method::kPairs);
  std::vector<std::uint32_t> counts(8);
  for (std::uint64_t seed = 1; seed <= 50; ++seed) {
    detail::Xoshiro256 rng(seed);
    two.sample(rng, counts);
    EXPECT_EQ(counts[0] + counts[2] + counts[4] + counts[6], 0u);
    EXPECT_EQ(counts[1] + counts[3], 1000u);
    EXPECT_EQ(counts[5], counts[3]);
    EXPECT_EQ(counts[7], counts[1]);
  }
  // k = 1: a plain multinomial of S; each count is Binomial(S, p_e).
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  const detail::ChoiceSampler one(p, 4, 1, 500, detail::ChoiceSampler::Method::kPairs);
  std::vector<double> sum(4, 0.0);
  std::vector<std::uint32_t> c(4);
  const int seeds = 4000;
  for (int seed = 0; seed < seeds; ++seed) {
    detail::Xoshiro256 rng(static_cast<std::uint64_t>(seed) + 11);
    one.sample(rng, c);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0u), 500u);
    for (int e = 0; e < 4; ++e) sum[e] += c[e];
  }
  for (int e = 0; e < 4; ++e)
    EXPECT_NEAR(sum[e] / seeds, 500 * p[e], 5 * std::sqrt(500 * p[e] * (1 - p[e]) / seeds));
  // Auto picks the pair method above kPairsMinRatio * E for k <= 2 only.
  using Method = detail::ChoiceSampler::Method;
  const auto ratio = detail::ChoiceSampler::kPairsMinRatio;
  EXPECT_EQ(detail::ChoiceSampler({}, 8, 2, 8 * ratio + 1).method(), Method::kPairs);
  EXPECT_EQ(detail::ChoiceSampler({}, 8, 2, 8 * ratio).method(), Method::kTokens);
  EXPECT_EQ(detail::ChoiceSampler({}, 8, 1, 8 * ratio + 1).method(), Method::kPairs);
  EXPECT_EQ(detail::ChoiceSampler({}, 8, 3, 8 * ratio).method(), Method::kTokens);
  EXPECT_EQ(detail::ChoiceSampler({}, 8, 3, 8 * 128 + 1).method(), Method::kCounts);
  EXPECT_EQ(detail::ChoiceSampler({1.0, 0, 0, 0}, 4, 2, 4000).method(), Method::kCounts);
}

// ---------------------------------------------------------------------------------------------
// Sampling once per iteration (round_capacity) and dropping the demanded copy.

TEST(WorkloadGenerator, RoundCapacityEqualsSamplingAtTheMultiple) {
  struct Case {
    double f;
    bool exact;  // whether round_capacity can do it without sampling again
  };
  // f = 0: dropless, always. f = -100 and f = 4: a cap nothing reaches. f = 1, f = -1: drops.
  for (const Case c : {Case{0.0, true}, Case{-100.0, true}, Case{4.0, true}, Case{1.0, false},
                       Case{-1.0, false}}) {
    for (const auto dist : {RoutingDistribution::kUniform, RoutingDistribution::kZipf}) {
      WorkloadGenerator gen(make_scenario(4, 8, 2, 300, c.f, dist, 2.0, 1, 2));
      for (const int multiple : {1, 3, 4}) {
        IterationWorkload w = gen.next(2, 1);
        const IterationWorkload direct = gen.next(2, multiple);
        const bool done = gen.round_capacity(w, multiple);
        EXPECT_EQ(done, c.exact || multiple == 1) << c.f << " " << multiple;
        if (!done) {
          EXPECT_EQ(w.capacity_multiple, 1);
          continue;
        }
        EXPECT_EQ(w.capacity_multiple, multiple);
        ASSERT_EQ(w.layers.size(), direct.layers.size());
        for (std::size_t l = 0; l < w.layers.size(); ++l) {
          EXPECT_EQ(w.layers[l].capacity, direct.layers[l].capacity) << c.f << " " << multiple;
          EXPECT_EQ(w.layers[l].capacity % multiple, 0);
          EXPECT_EQ(w.layers[l].kept, direct.layers[l].kept);
          EXPECT_EQ(w.layers[l].demanded, direct.layers[l].demanded);
          EXPECT_EQ(w.layers[l].dropped_by_choice, direct.layers[l].dropped_by_choice);
          EXPECT_EQ(w.layers[l].max_demanded, direct.layers[l].max_demanded);
        }
      }
    }
  }
  // Only from multiple 1: from 4 to 3 the cap could shrink.
  WorkloadGenerator gen(make_scenario(4, 8, 2, 300, 0.0));
  IterationWorkload w4 = gen.next(0, 4);
  EXPECT_FALSE(gen.round_capacity(w4, 3));
  EXPECT_TRUE(gen.round_capacity(w4, 4));
  EXPECT_THROW(gen.round_capacity(w4, 0), InputError);
}

TEST(WorkloadGenerator, WithoutDemandedKeepsTheSameCounts) {
  for (const double f : {0.0, 1.0}) {
    const Scenario sc = make_scenario(4, 8, 2, 300, f, RoutingDistribution::kZipf, 1.0);
    WorkloadGenerator full(sc), lean(sc);
    lean.set_keep_demanded(false);
    const LayerDispatch a = full.next(1).layers[0], b = lean.next(1).layers[0];
    EXPECT_TRUE(b.demanded.empty());
    EXPECT_EQ(a.kept, b.kept);
    EXPECT_EQ(a.capacity, b.capacity);
    EXPECT_EQ(a.dropped_by_choice, b.dropped_by_choice);
    EXPECT_EQ(a.max_demanded, b.max_demanded);
    EXPECT_EQ(a.max_demanded, *std::max_element(a.demanded.begin(), a.demanded.end()));
    if (f == 0) {  // nothing dropped: demanded_at answers from kept
      EXPECT_EQ(b.dropped, 0);
      for (int i = 0; i < 4; ++i)
        for (int e = 0; e < 8; ++e) EXPECT_EQ(b.demanded_at(i, e), a.demanded_at(i, e));
    } else {
      EXPECT_GT(b.dropped, 0);
      EXPECT_THROW(b.demanded_at(0, 0), std::exception);  // not kept, and it differs from kept
    }
  }
}

TEST(SampleCache, SharedCountsAreTheSameCounts) {
  // Two generators of the same shape and routing share samples; the capacity factor and the
  // multiple (which differ between stacks) are applied to the cached counts per request.
  for (const int tokens : {60, 1100}) {  // token and pair methods
    SampleCache cache;
    Scenario a = make_scenario(4, 8, 2, tokens, 1.0, RoutingDistribution::kZipf, 1.0, 3, 2);
    Scenario b = a;
    b.model.capacity_factor = 0.0;  // another f: same counts
    b.model.model_dim = 4 * a.model.model_dim;
    WorkloadGenerator plain_a(a), plain_b(b), cached_a(a), cached_b(b);
    cached_a.set_cache(&cache);
    cached_b.set_cache(&cache);
    for (const int multiple : {1, 4}) {
      const IterationWorkload x = cached_a.next(1, multiple), y = plain_a.next(1, multiple);
      const IterationWorkload u = cached_b.next(1, multiple), v = plain_b.next(1, multiple);
      for (std::size_t l = 0; l < 2; ++l) {
        EXPECT_EQ(x.layers[l].kept, y.layers[l].kept);
        EXPECT_EQ(x.layers[l].demanded, y.layers[l].demanded);
        EXPECT_EQ(x.layers[l].dropped_by_choice, y.layers[l].dropped_by_choice);
        EXPECT_EQ(x.layers[l].capacity, y.layers[l].capacity);
        EXPECT_EQ(u.layers[l].kept, v.layers[l].kept);
        EXPECT_EQ(u.layers[l].capacity, v.layers[l].capacity);
        EXPECT_EQ(u.layers[l].demanded, x.layers[l].demanded);
      }
    }
    // 2 layers sampled once (iteration 1), then 2 x 4 - 2 lookups hit.
    EXPECT_EQ(cache.misses(), 2);
    EXPECT_EQ(cache.hits(), 6);
    // Another seed is another entry.
    Scenario c = a;
    c.workload.routing.seed = 4;
    WorkloadGenerator cached_c(c);
    cached_c.set_cache(&cache);
    EXPECT_NE(cached_c.next(1).layers[0].demanded, plain_a.next(1).layers[0].demanded);
    EXPECT_EQ(cache.misses(), 4);
  }
}

TEST(SampleCache, DropsTheOldestBeyondItsBudget) {
  // One entry (k * P * E * 4 = 2 * 4 * 8 * 4 = 256 bytes): a 600-byte cache keeps two.
  SampleCache cache(600);
  const Scenario sc = make_scenario(4, 8, 2, 60);
  WorkloadGenerator gen(sc);
  gen.set_cache(&cache);
  const auto first = gen.next(0).layers[0].kept;
  gen.next(1);
  gen.next(2);  // evicts iteration 0
  EXPECT_EQ(cache.misses(), 3);
  gen.next(2);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(gen.next(0).layers[0].kept, first);  // sampled again: the same counts
  EXPECT_EQ(cache.misses(), 4);
  // An entry larger than the whole budget is not kept.
  SampleCache tiny(100);
  WorkloadGenerator g2(sc);
  g2.set_cache(&tiny);
  g2.next(0);
  g2.next(0);
  EXPECT_EQ(tiny.hits(), 0);
  EXPECT_EQ(tiny.misses(), 2);
}

}  // namespace
}  // namespace moesim::workload
