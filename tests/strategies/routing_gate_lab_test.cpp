// Gate-training lab (strategies/routing/gate_lab.hpp): honest SGD with the topology loss lowers
// the off-node share of routing choices by >= 20% relative to the balance loss, at the same task
// accuracy (within 1 point); deterministic for a seed; bad configs are rejected.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "strategies/routing/gate_lab.hpp"
#include "strategies/routing/target.hpp"

namespace moesim::routing {
namespace {

// 2 nodes x 4 GPUs, one expert per GPU, top-2; target from 100 B/s inside a node, 10 B/s across.
GateLabConfig two_nodes(int epochs) {
  const int P = 8;
  std::vector<double> a(P * P, 0.0), b(P * P);
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j) b[i * P + j] = 1.0 / (i / 4 == j / 4 ? 100.0 : 10.0);
  const TargetPattern t = solve_target(pair_costs(P, a, b), 1000, 1.0, 0.1);
  GateLabConfig c;
  c.num_gpus = P;
  for (int g = 0; g < P; ++g) c.node_of.push_back(g / 4);
  c.experts_per_gpu = 1;
  c.top_k = 2;
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j) c.target_share.push_back(t.share_at(i, j));
  c.tokens_per_gpu = 512;
  c.eval_tokens_per_gpu = 512;
  c.epochs = epochs;
  c.seed = 4;
  return c;
}

TEST(GateLab, TopologyLossCutsOffNodeChoicesAtTheSameAccuracy) {
  const GateLabConfig c = two_nodes(30);
  const std::vector<GateLabRun> runs = run_gate_lab(c);
  ASSERT_EQ(runs.size(), 2u);
  ASSERT_EQ(runs[0].epochs.size(), 31u);
  const GateLabEpoch& without = runs[0].epochs.back();
  const GateLabEpoch& with = runs[1].epochs.back();
  // Training worked: far above chance (1/8) in both runs.
  EXPECT_GT(without.accuracy, 0.9);
  EXPECT_GE(1.0 - with.offnode_share / without.offnode_share, 0.2)
      << "off-node " << without.offnode_share << " -> " << with.offnode_share;
  EXPECT_NEAR(with.accuracy, without.accuracy, 0.01);
  // The topology run also keeps experts usable: no expert above twice the mean load.
  EXPECT_LT(with.balance, 2.0);
  // Both start from the same gate.
  EXPECT_EQ(runs[0].epochs[0].offnode_share, runs[1].epochs[0].offnode_share);
}

TEST(GateLab, DeterministicForASeedAndRejectsBadConfigs) {
  const GateLabConfig c = two_nodes(2);
  const GateLabRun a = train_gate(c, true), b = train_gate(c, true);
  ASSERT_EQ(a.epochs.size(), b.epochs.size());
  for (std::size_t i = 0; i < a.epochs.size(); ++i) {
    EXPECT_EQ(a.epochs[i].offnode_share, b.epochs[i].offnode_share);
    EXPECT_EQ(a.epochs[i].task_loss, b.epochs[i].task_loss);
  }
  GateLabConfig bad = c;
  bad.node_of.pop_back();
  EXPECT_THROW(train_gate(bad, false), InputError);
  bad = c;
  bad.top_k = 9;
  EXPECT_THROW(train_gate(bad, false), InputError);
}

}  // namespace
}  // namespace moesim::routing
