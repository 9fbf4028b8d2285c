// dC padding (capacity_multiple, docs/model.md "Capacity"): plans never move a fraction of a token.
// Sharded experts split each pipeline chunk of c = dC / r slots over the n / rho GPUs of a slice
// group, Parm S1 / S2 over the mp ranks; run_stack rounds dC up so that both divide c. Every
// expected capacity below is computed by hand from ceil(k f S / E) and the multiple.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/runner.hpp"
#include "strategies/schedules/parm.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

// 2 nodes x 4 GPUs, one MoE layer, top-1, f = 1, S = batch * seq tokens per GPU.
// experts_per_gpu -4: n = 4 shards, E = 8 / 4 = 2 experts.  mp > 1: Parm layout with
// experts_per_gpu 2, ep = 8 / mp, E = 2 * ep.
Scenario tiny(int experts_per_gpu, int mp, int batch, int seq, const std::string& strategies) {
  const int ep = 8 / mp;
  const std::string yaml = fmt::format(
      R"(name: rounding-test
cluster:
  gpu: a100-sxm-40gb
  nodes: 2
  gpus_per_node: 4
  intra_node: {{kind: nvswitch, bandwidth: 100GB/s, latency: 1us}}
  inter_node: {{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}}
model:
  mode: training
  layers: 1
  moe_every: 1
  batch_per_gpu: {}
  seq_len: {}
  model_dim: 16
  hidden_dim: 32
  experts_per_gpu: {}
  top_k: 1
  capacity_factor: 1.0
  dtype: fp16
parallelism: {{ep: {}, esp: 1, mp: {}, dp: 1}}
workload:
  routing: {{distribution: uniform, seed: 3}}
  capacity: {{kind: fixed}}
  iterations: 1
engine: {{network: analytical}}
strategies:
{}
)",
      batch, seq, experts_per_gpu, ep, mp, strategies);
  return parse_scenario_string(yaml, "rounding-test.yaml");
}

// Slots per (source, expert) of every forward dispatch chunk, from the all_to_all bytes:
// bytes = copies * E * c_j * M * b (copies = rho for sharded experts, esp = 1 for Parm's fused
// dispatch, whose c_j is already the per-MP-rank share dC_j / mp).
std::vector<double> forward_chunk_slots(const Scenario& sc, const StrategySpec& spec, int copies) {
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const StackRun run = run_stack(sc, spec, *topo, backend, 1);
  const Plan& plan = run.last_plan.plan;
  std::vector<double> slots;
  const double per_slot =
      static_cast<double>(copies) * sc.num_experts() * sc.model.model_dim * sc.bytes_per_element();
  for (const Op& op : plan.ops())
    if (op.kind == OpKind::kCollective && op.label.rfind("L0.fwd.dispatch.", 0) == 0)
      slots.push_back(op.collective().bytes.value() / per_slot);
  return slots;
}

TEST(CapacityMultiple, ShardedIsDegreeTimesSliceGroup) {
  const Scenario sc = tiny(-4, 1, 1, 10, "  - {name: p1, parallel: p1}");
  Decision d;
  const int want[3][4] = {// rho = 1 (P1), 2, 4 (P2); degree r = 1, 2, 3
                          {0, 4, 8, 12},
                          {0, 2, 4, 6},
                          {0, 1, 2, 3}};
  const int rhos[3] = {1, 2, 4};
  for (int i = 0; i < 3; ++i)
    for (int r = 1; r <= 3; ++r) {
      d.parallel_degree = rhos[i];
      d.pipeline_degree = r;
      EXPECT_EQ(capacity_multiple(sc, d), want[i][r]) << "rho " << rhos[i] << " r " << r;
    }
  d.parallel_degree = 3;  // does not divide n = 4: left to the builder's InputError
  d.pipeline_degree = 2;
  EXPECT_EQ(capacity_multiple(sc, d), 2);
}

TEST(CapacityMultiple, UnshardedAndParm) {
  const Scenario plain = tiny(1, 1, 1, 10, "  - {name: a, pipeline: 3}");
  Decision d;
  d.pipeline_degree = 3;
  EXPECT_EQ(capacity_multiple(plain, d), 3);  // what dC was always rounded to
  const Scenario parm = tiny(2, 2, 1, 20, "  - {name: s1, schedule: parm_s1}");
  for (ScheduleRole s : {ScheduleRole::kParmS1, ScheduleRole::kParmS2, ScheduleRole::kParmAuto}) {
    d.schedule = s;
    EXPECT_EQ(capacity_multiple(parm, d), 6);  // r = 3 x mp = 2
  }
  d.schedule = ScheduleRole::kParmBaseline;  // duplicates the expert over MP: no split
  EXPECT_EQ(capacity_multiple(parm, d), 3);
  d.schedule = ScheduleRole::kNone;
  EXPECT_EQ(capacity_multiple(parm, d), 3);
}

// S = 10, E = 2: ceil(1 * 1 * 10 / 2) = 5 slots. Rounded to r alone (before) r = 2 gave 6 = 2 x 3
// and 3 slots over n / rho = 4 (P1) or 2 GPUs: 3/4 or 3/2 of a token each.
TEST(CapacityRounding, ShardedChunksSplitIntoWholeTokens) {
  struct Case {
    std::string parallel;
    int rho, r;
    double chunk;  // c_j = dC / r after padding
  };
  const Case cases[] = {
      {"p1", 1, 2, 4},  // multiple 8: dC 5 -> 8, c = 4, 4 / 4 = 1 slot per GPU of the group
      {"2", 2, 2, 4},   // multiple 4: dC 5 -> 8, c = 4, 2 * 4 / 4 = 2 slots per GPU
      {"p1", 1, 3, 4},  // multiple 12: dC 5 -> 12, c = 4, 1 slot per GPU
      {"2", 2, 3, 2},   // multiple 6: dC 5 -> 6, c = 2, 2 * 2 / 4 = 1 slot per GPU
      {"p2", 4, 3, 2},  // multiple 3: dC 5 -> 6 (as before: r alone), c = 2, no split
  };
  for (const Case& c : cases) {
    const Scenario sc = tiny(
        -4, 1, 1, 10, fmt::format("  - {{name: x, parallel: {}, pipeline: {}}}", c.parallel, c.r));
    const std::vector<double> slots = forward_chunk_slots(sc, sc.strategies[0], c.rho);
    ASSERT_EQ(slots.size(), static_cast<size_t>(c.r)) << c.parallel << " r " << c.r;
    for (double s : slots) {
      EXPECT_DOUBLE_EQ(s, c.chunk) << c.parallel << " r " << c.r;
      const double share = c.rho * s / 4;  // per GPU of the n / rho slice group
      EXPECT_DOUBLE_EQ(share, static_cast<double>(static_cast<long long>(share)));
    }
  }
}

// mp = 2, ep = 4, E = 8, S = 20: dC = ceil(20 / 8) = 3 (odd). S1 / S2 split every chunk over the
// two MP ranks: dC -> 4 (r = 1, 2 slots per rank) or 6 (r = 3, chunks of 2, 1 slot per rank).
// The baseline does not split: dC stays 3.
TEST(CapacityRounding, ParmSplitsIntoWholeTokens) {
  const Scenario sc = tiny(2, 2, 1, 20,
                           "  - {name: s1, schedule: parm_s1}\n"
                           "  - {name: s2, schedule: parm_s2}\n"
                           "  - {name: s1r3, schedule: parm_s1, pipeline: 3}\n"
                           "  - {name: s2r3, schedule: parm_s2, pipeline: 3}\n"
                           "  - {name: base, schedule: parm_baseline}");
  ASSERT_EQ(sc.num_experts(), 8);
  const std::vector<double> want_sm[4] = {{2}, {2}, {1, 1, 1}, {1, 1, 1}};
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(forward_chunk_slots(sc, sc.strategies[i], 1), want_sm[i]) << sc.strategies[i].name;
  // The baseline's padded all_to_all carries the unsplit dC = 3 slots per (source, expert).
  EXPECT_EQ(forward_chunk_slots(sc, sc.strategies[4], 1), std::vector<double>{3});
}

// S = 21 tokens per GPU over mp = 2: S1 would gate 10.5 tokens per rank. parm_s1 is refused
// naming model.batch_per_gpu; parm_auto takes S2.
TEST(CapacityRounding, ParmS1NeedsMpToDivideTokens) {
  const Scenario sc = tiny(2, 2, 1, 21,
                           "  - {name: s1, schedule: parm_s1}\n"
                           "  - {name: auto, schedule: parm_auto}");
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  try {
    (void)run_stack(sc, sc.strategies[0], *topo, backend, 1);
    ADD_FAILURE() << "parm_s1 with mp not dividing S was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.batch_per_gpu"), std::string::npos) << e.what();
  }
  const StackRun run = run_stack(sc, sc.strategies[1], *topo, backend, 1);
  int saa = 0;  // S2's combine is the SAA collective
  for (const Op& op : run.last_plan.plan.ops())
    saa += op.label.find("combine_saa") != std::string::npos ? 1 : 0;
  EXPECT_GT(saa, 0);
  EXPECT_EQ(schedules::parm_choose(sc, *topo, 4).choice, ScheduleRole::kParmS2);
}

}  // namespace
}  // namespace moesim::strategies
