// The plan-routed data path's assignment rule (exec/routed_path.hpp) on hand-made routings: exact
// (token, choice) -> expert / destination / chunk results, per-destination counts equal to the
// plan's matrix row (inference::token_matrix for replicated placements), distinct experts per
// token, and the receive runs a destination derives for itself; and the plans the strategy stacks
// build for the mpirun tests' scenarios, checked rank by rank against the rule.
#include "exec/routed_path.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/moe_data.hpp"
#include "strategies/inference/placement.hpp"
#include "strategies/runner.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
namespace {

using Entries = std::vector<int>;

// Every token's kept choices are on distinct experts.
void expect_distinct_choices(const RoutedAssignment& a, int tokens, int k) {
  for (int t = 0; t < tokens; ++t) {
    std::set<int> seen;
    for (int c = 0; c < k; ++c) {
      const int e = a.expert[static_cast<size_t>(t) * k + c];
      if (e < 0) continue;
      EXPECT_TRUE(seen.insert(e).second) << "token " << t << " has expert " << e << " twice";
    }
  }
}

TEST(RoutedAssign, TwoByTwoBlockPlacementExact) {
  // W = 2, E = 2, one expert per GPU; S = 3 tokens, k = 2; source 0 routes 3 to expert 0, 2 to
  // expert 1: list e0 e0 e0 e1 e1 = tokens 0 1 2 0 1 (choices 0 0 0 1 1); token 2's second
  // choice has no token in the plan: dropped.
  ExpertRouting r;
  r.size = 2;
  r.experts = 2;
  r.experts_per_gpu = 1;
  r.counts = {3, 2, 1, 3};
  const RoutedAssignment a = assign_routed(r, 0, 3, 2, 1);
  EXPECT_EQ(a.expert, (std::vector<int>{0, 1, 0, 1, 0, -1}));
  EXPECT_EQ(a.dropped, 1);
  ASSERT_EQ(a.send.size(), 1u);
  EXPECT_EQ(a.send[0][0], (Entries{0, 2, 4}));
  EXPECT_EQ(a.send[0][1], (Entries{1, 3}));
  // Row 1: e0 once (token 0 choice 0), e1 three times (tokens 1 2 0): token 0 gets e0 and e1.
  const RoutedAssignment b = assign_routed(r, 1, 3, 2, 1);
  EXPECT_EQ(b.expert, (std::vector<int>{0, 1, 1, -1, 1, -1}));
  EXPECT_EQ(b.dropped, 2);
  expect_distinct_choices(a, 3, 2);
  expect_distinct_choices(b, 3, 2);
  // Destination 1 receives source 0's 2 rows then source 1's 3 rows, all for expert 1.
  EXPECT_EQ(routed_receives(r, 1, 1)[0], (std::vector<RoutedRun>{{0, 1, 2}, {1, 1, 3}}));
}

// The per-node (deepep) counts of the rule, by hand: 2 nodes x 2 GPUs, one expert per GPU, S = 3,
// k = 2. Source 0 (counts 2 1 2 1): list e0 e0 e1 e2 e2 e3 = tokens 0 1 2 0 1 2, so tokens 0 and
// 1 choose {e0, e2} and token 2 {e1, e3}: per GPU 2 1 2 1, per node 3 3 (each token on both).
// Source 1 (e1: 2): tokens 0 and 1 on GPU 1 only: per GPU 0 2 0 0, per node 2 0. Source 2 routes
// nothing. Source 3 (e1: 3, e3: 3): every token on GPUs 1 and 3: 0 3 0 3, per node 3 3.
TEST(RoutedAssign, AssignmentDedupCountsEachTokenOncePerGpuAndNode) {
  ExpertRouting r;
  r.size = 4;
  r.experts = 4;
  r.experts_per_gpu = 1;
  r.counts = {2, 1, 2, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 3};
  const auto d = assignment_dedup(r, 3, 2, 2, Bytes(64));
  EXPECT_EQ(d->size, 4);
  EXPECT_EQ(d->nodes, 2);
  EXPECT_EQ(d->unit, Bytes(64));
  EXPECT_EQ(d->gpu_tokens,
            (std::vector<std::uint32_t>{2, 1, 2, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 3}));
  EXPECT_EQ(d->node_tokens, (std::vector<std::uint32_t>{3, 3, 2, 0, 0, 0, 3, 3}));
  // Two experts per GPU (positions e / 2) on 1 node: source 0's tokens 0 and 1 ({e0, e2}) and
  // token 2 ({e1, e3}) each reach both positions once.
  ExpertRouting r2 = r;
  r2.size = 2;
  r2.experts_per_gpu = 2;
  r2.counts = {2, 1, 2, 1, 0, 0, 0, 0};
  const auto d2 = assignment_dedup(r2, 3, 2, 1, Bytes(1));
  EXPECT_EQ(d2->gpu_tokens, (std::vector<std::uint32_t>{3, 3, 0, 0}));
  EXPECT_EQ(d2->node_tokens, (std::vector<std::uint32_t>{3, 0}));
}

TEST(RoutedAssign, ThreeByThreeReplicasAndChunksExact) {
  // W = 3, E = 3; expert 1 replicated on positions 1 and 2. S = 4, k = 2, r = 2 chunks.
  ExpertRouting r;
  r.size = 3;
  r.experts = 3;
  r.replicas = {{0}, {1, 2}, {2}};
  r.counts = {1, 1, 0,   // source 0
              2, 3, 3,   // source 1
              0, 2, 1};  // source 2
  // Source 1: e0 x2 -> 0; e1's 3 split from replica 1 mod 2 = position 2 first: 2 -> 2, 1 -> 1;
  // e2 x3 -> 2. List i = 0..7 is token i % 4, choice i / 4 (entry t * 2 + c).
  const RoutedAssignment a = assign_routed(r, 1, 4, 2, 2);
  EXPECT_EQ(a.expert, (std::vector<int>{0, 1, 0, 2, 1, 2, 1, 2}));
  EXPECT_EQ(a.dropped, 0);
  expect_distinct_choices(a, 4, 2);
  // Pairs in list order, cut n / 2 (+1 for the first n % 2 chunks).
  EXPECT_EQ(a.send[0][0], (Entries{0}));
  EXPECT_EQ(a.send[1][0], (Entries{2}));
  EXPECT_EQ(a.send[0][1], (Entries{1}));
  EXPECT_EQ(a.send[1][1], (Entries{}));
  EXPECT_EQ(a.send[0][2], (Entries{4, 6, 3}));
  EXPECT_EQ(a.send[1][2], (Entries{5, 7}));
  // Per-destination counts equal the plan's row: the inference placement's token_matrix.
  inference::Placement pl = inference::Placement::from_gpu_experts({{0}, {1}, {1, 2}}, 3);
  const ByteMatrix m = inference::token_matrix(pl, r.counts, Bytes(1));
  for (int src = 0; src < 3; ++src) {
    const RoutedAssignment s = assign_routed(r, src, 4, 2, 2);
    for (int d = 0; d < 3; ++d)
      EXPECT_EQ(static_cast<double>(s.send[0][d].size() + s.send[1][d].size()),
                m.at(src, d).value())
          << src << " -> " << d;
  }
  // Position 2 receives (by source, list order): chunk 0 = source 1's first 3 of (e1 x2, e2 x3)
  // and source 2's first of (e1, e2); chunk 1 = the rest.
  const auto recv = routed_receives(r, 2, 2);
  EXPECT_EQ(recv[0], (std::vector<RoutedRun>{{1, 1, 2}, {1, 2, 1}, {2, 1, 1}}));
  EXPECT_EQ(recv[1], (std::vector<RoutedRun>{{1, 2, 2}, {2, 2, 1}}));
}

TEST(RoutedAssign, SpreadDealsTheRowInExpertOrder) {
  // Ideal placement: source 0's 3 tokens (e0, e2, e2) dealt 2 to position 0, 1 to position 1.
  ExpertRouting r;
  r.size = 2;
  r.experts = 3;
  r.spread = true;
  r.counts = {1, 0, 2, 0, 3, 0};
  EXPECT_EQ(routed_pieces(r, 0), (std::vector<RoutedPiece>{{0, 0, 1}, {2, 0, 1}, {2, 1, 1}}));
  const RoutedAssignment a = assign_routed(r, 0, 3, 1, 1);
  EXPECT_EQ(a.expert, (std::vector<int>{0, 2, 2}));
  EXPECT_EQ(a.send[0][0], (Entries{0, 1}));
  EXPECT_EQ(a.send[0][1], (Entries{2}));
  // Source 1 starts at position 1 + 0 = 1: 2 tokens there, 1 at position 0.
  const RoutedAssignment b = assign_routed(r, 1, 3, 1, 1);
  EXPECT_EQ(b.send[0][1].size(), 2u);
  EXPECT_EQ(b.send[0][0].size(), 1u);
}

TEST(RoutedAssign, RejectsCountsNoTokensCanProduce) {
  ExpertRouting r;
  r.size = 1;
  r.experts = 2;
  r.counts = {4, 0};  // 4 tokens to one expert from a GPU with 3 tokens
  EXPECT_THROW(assign_routed(r, 0, 3, 2, 1), InputError);
  r.counts = {3, 3};  // 6 choices from 2 tokens x top-2 = 4
  EXPECT_THROW(assign_routed(r, 0, 2, 2, 1), InputError);
}

TEST(RoutedReference, MatchesTheCapacityReferenceForTheGatesOwnRouting) {
  // With the seeded gate's own top-k as the routing and no drops, the routed reference is the
  // plain reference (same softmax probabilities and experts).
  const MoeShape s{8, 16, 32, 4, 2};
  const std::vector<float> x = make_tokens(s, 11, 0, 0, 0);
  const ReferenceRouting rr = reference_routing(s, x, make_gate_weights(s, 11, 0), 1 << 20);
  ASSERT_EQ(rr.dropped, 0);
  long long dropped = -1;
  const auto plain = reference_layer_seeded(s, x, 11, 0, 1 << 20, &dropped);
  EXPECT_EQ(reference_layer_seeded_routed(s, x, 11, 0, rr.expert), plain);
  // Dropping an entry removes exactly its weighted expert output.
  std::vector<int> minus = rr.expert;
  minus[0] = -1;
  const auto part = reference_layer_seeded_routed(s, x, 11, 0, minus);
  EXPECT_NE(part, plain);
  for (size_t i = static_cast<size_t>(s.model_dim); i < part.size(); ++i)
    EXPECT_EQ(part[i], plain[i]);
}

// The plan builder's contract with the routed data path, on the mpirun tests' scenarios: every
// strategy and iteration whose dispatch is an all_to_allv carries an ExpertRouting, and for every
// rank the assignment rule reproduces every chunk's matrix row and column
// (prepare_routed_layer throws InternalError otherwise), with every token's choices distinct.
void expect_plans_routable(const std::string& file, int min_routed_layers) {
  const Scenario sc = load_scenario(std::string(MOESIM_SOURCE_DIR) + "/tests/data/exec/" + file);
  auto topo = topology::build_topology(sc.cluster);
  const auto& md = sc.model;
  const MoeShape shape{static_cast<int>(md.tokens_per_gpu()), md.model_dim, md.hidden_dim,
                       md.experts, md.top_k};
  int routed = 0;
  for (const StrategySpec& spec : sc.strategies) {
    strategies::Backend backend = [&](const Plan& plan) {
      for (int rank = 0; rank < plan.num_ranks(); ++rank)
        for (const MoeLayerPlan& L : plan_moe_layers(plan, rank, md.experts)) {
          if (!L.routed) continue;
          ++routed;
          std::unique_ptr<RoutedLayer> R;
          EXPECT_NO_THROW(R = prepare_routed_layer(plan, L.block, L.moe, rank, shape))
              << spec.name << " rank " << rank << " layer " << L.moe;
          if (R) expect_distinct_choices(R->sent, shape.tokens, shape.top_k);
        }
      RunResult r;  // zero op times: the stacks only need a well-formed result
      init_run_result(plan, r);
      std::fill(r.start_s.begin(), r.start_s.end(), 0.0);
      std::fill(r.end_s.begin(), r.end_s.end(), 1e-3);
      summarize_run(plan, r);
      return r;
    };
    strategies::run_stack(sc, spec, *topo, backend, sc.workload.iterations, nullptr,
                          /*for_execution=*/true);
  }
  EXPECT_GE(routed, min_routed_layers);
}

TEST(RoutedPlans, TrainingRoutingStrategiesAreRoutable) {
  // 4 routed strategies x 3 iterations x 2 layers x 4 ranks.
  expect_plans_routable("routed-train-4.yaml", 4 * 3 * 2 * 4);
}

TEST(RoutedPlans, InferencePlacementsAreRoutable) {
  // 3 placements x 4 batches x 2 MoE layers x 8 ranks.
  expect_plans_routable("lina-inference-8.yaml", 3 * 4 * 2 * 8);
}

}  // namespace
}  // namespace moesim::exec
