// Lina's premise (docs/strategy-specs.md §6): on the flow engine the EP all-to-all and the DP
// gradient all-reduce share the NICs, so an all-to-all that overlaps an all-reduce is slower than
// alone.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/runner.hpp"
#include "strategies/schedules/lina.hpp"
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

// Lina's testbed shape: 4 nodes x 4 A100-40GB, 100 Gb/s InfiniBand; two MoE blocks, ep 8 (two
// nodes) x dp 2.
Scenario lina_scenario(const std::string& micro_op, const std::string& network = "flow",
                       const std::string& pack = "false") {
  const std::string yaml = fmt::format(
      R"(name: lina-test
cluster:
  gpu: a100-sxm-40gb
  nodes: 4
  gpus_per_node: 4
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
  inter_node: {{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}}
model:
  mode: training
  layers: 2
  moe_every: 1
  batch_per_gpu: 8
  seq_len: 512
  model_dim: 2048
  hidden_dim: 8192
  experts_per_gpu: 1
  top_k: 2
  capacity_factor: 1.0
  dtype: fp16
parallelism: {{ep: 8, esp: 1, mp: 1, dp: 2}}
workload:
  routing: {{distribution: uniform, seed: 1}}
  capacity: {{kind: fixed}}
  iterations: 1
engine: {{network: {}}}
strategies:
  - {{name: none}}
  - {{name: fair, schedule: fair, lina: {{micro_op: {}}}}}
  - {{name: lina, schedule: lina, lina: {{micro_op: {}, pack_experts: {}}}}}
  - {{name: between, schedule: between_a2a, lina: {{micro_op: {}}}}}
)",
      network, micro_op, micro_op, pack, micro_op);
  return parse_scenario_string(yaml, "lina-test.yaml");
}

struct LinaRun {
  Decision decision;
  double efficiency = 0;
  double step_s = 0;
  double fwd_a2a_s = 0;  // layer 0's forward all-to-alls (nothing to contend with)
  double bwd_a2a_s = 0;  // layer 0's backward all-to-alls (gradient all-reduces in flight)
  double last_grad_end_s = 0;
  int grad_ops = 0;
};

LinaRun run_schedule(const Scenario& sc, int strategy) {
  const auto topo = topology::build_topology(sc.cluster);
  const sim::EngineConfig cfg = testing::engine_config(sc);
  Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const StackRun run = run_stack(sc, sc.strategies[strategy], *topo, backend, 1);
  const auto& idx = run.last_plan.index;
  const RunResult& r = run.last_result;
  LinaRun out;
  out.step_s = r.makespan_s;
  out.decision = run.iterations.at(0).decision;
  out.efficiency = schedules::pipelining_efficiency(run.last_plan.plan, idx, r);
  const auto& layer = idx.moe_layers.at(0);
  for (const auto& rec : r.collectives) {
    const bool a2a =
        std::find(layer.dispatch.begin(), layer.dispatch.end(), rec.op) != layer.dispatch.end() ||
        std::find(layer.combine.begin(), layer.combine.end(), rec.op) != layer.combine.end();
    if (a2a)
      (rec.op >= layer.backward.front() ? out.bwd_a2a_s : out.fwd_a2a_s) += rec.end_s - rec.start_s;
    if (std::find(idx.gradient_sync.begin(), idx.gradient_sync.end(), rec.op) !=
        idx.gradient_sync.end())
      out.last_grad_end_s = std::max(out.last_grad_end_s, rec.end_s);
  }
  out.grad_ops = static_cast<int>(idx.gradient_sync.size());
  return out;
}

TEST(LinaSchedule, MicroOpsNeverMixGradients) {
  const Scenario sc = lina_scenario("30MB");
  const auto none = run_schedule(sc, 0);
  const auto lina = run_schedule(sc, 2);
  // Expert gradients 2 M H b = 64 MiB -> 3 micro-ops; dense (4 M^2 + M E) b = 32 MiB + 16 KiB
  // -> 2; two blocks: (3 + 2) x 2 = 10 micro-ops instead of 4 whole all-reduces.
  EXPECT_EQ(none.grad_ops, 4);
  EXPECT_EQ(lina.grad_ops, 10);
  EXPECT_EQ(schedules::lina_micro_op_count(64e6, Bytes(30e6)), 3);
  EXPECT_EQ(schedules::lina_micro_op_count(30e6, Bytes(30e6)), 1);
}

TEST(LinaSchedule, PrioritisedAllToAllStaysNearAloneFairDoesNot) {
  // 1 MB micro-ops: the one micro-op that may still run when an all-to-all arrives (no
  // preemption) is short (the size sweep below shows larger ones cost more).
  const Scenario sc = lina_scenario("1MB");
  const LinaRun fair = run_schedule(sc, 1);
  const LinaRun lina = run_schedule(sc, 2);
  const LinaRun between = run_schedule(sc, 3);
  ASSERT_GT(fair.fwd_a2a_s, 0);
  // Fair sharing: the backward all-to-all shares the NIC with the all-reduce.
  EXPECT_GT(fair.bwd_a2a_s, 1.1 * fair.fwd_a2a_s) << fair.bwd_a2a_s << " vs " << fair.fwd_a2a_s;
  // Lina: within 10% of the all-to-all alone (forward twin: same bytes, no all-reduce).
  EXPECT_LT(lina.bwd_a2a_s, 1.1 * lina.fwd_a2a_s) << lina.bwd_a2a_s << " vs " << lina.fwd_a2a_s;
  // (Lina also cuts the all-to-all into micro-ops pipelined with the FFN, so compare each
  // schedule's backward all-to-all with its own forward twin.)
  EXPECT_LT(lina.bwd_a2a_s / lina.fwd_a2a_s, fair.bwd_a2a_s / fair.fwd_a2a_s);
  EXPECT_LT(between.bwd_a2a_s, fair.bwd_a2a_s);
  // Every gradient all-reduce completes inside the step (before the optimizer step).
  for (const LinaRun* r : {&fair, &lina, &between}) {
    EXPECT_GT(r->last_grad_end_s, 0);
    EXPECT_LE(r->last_grad_end_s, r->step_s);
  }
  std::printf(
      "a2a fwd/bwd: fair %.3f/%.3f ms lina %.3f/%.3f ms between %.3f/%.3f ms; step fair "
      "%.3f lina %.3f between %.3f ms\n",
      fair.fwd_a2a_s * 1e3, fair.bwd_a2a_s * 1e3, lina.fwd_a2a_s * 1e3, lina.bwd_a2a_s * 1e3,
      between.fwd_a2a_s * 1e3, between.bwd_a2a_s * 1e3, fair.step_s * 1e3, lina.step_s * 1e3,
      between.step_s * 1e3);
}

TEST(LinaSchedule, MicroOpSizeSweepShowsTradeOff) {
  // Tiny micro-ops pay per-op latency on the all-reduce; huge ones block the all-to-all.
  for (const char* size : {"64KB", "1MB", "4MB", "64MB"}) {
    const LinaRun r = run_schedule(lina_scenario(size), 2);
    std::printf("micro_op %s: step %.3f ms, bwd a2a %.3f ms (alone %.3f), last grad %.3f ms\n",
                size, r.step_s * 1e3, r.bwd_a2a_s * 1e3, r.fwd_a2a_s * 1e3,
                r.last_grad_end_s * 1e3);
  }
  const LinaRun tiny = run_schedule(lina_scenario("64KB"), 2);
  const LinaRun small = run_schedule(lina_scenario("1MB"), 2);
  const LinaRun huge = run_schedule(lina_scenario("64MB"), 2);
  // Huge micro-ops block the all-to-all (relative to the same all-to-alls alone).
  EXPECT_LT(small.bwd_a2a_s / small.fwd_a2a_s, huge.bwd_a2a_s / huge.fwd_a2a_s);
  EXPECT_GT(tiny.step_s, small.step_s);  // tiny ones pay per-op overhead
}

TEST(LinaSchedule, AllToAllMicroOpsAndExpertPacking) {
  const Scenario sc = lina_scenario("4MB", "flow", "true");
  const auto topo = topology::build_topology(sc.cluster);
  // Dispatch bytes E dC M b = 8 x 1024 x 2048 x 2 = 32 MiB -> 9 micro-ops of <= 4 MB.
  const std::int64_t cap = 1024;
  const auto c1 = schedules::lina_choose(sc, *topo, cap, Bytes(4e6), LayoutRole::kPlain, 1, 1);
  EXPECT_EQ(c1.pipeline_degree, 9);
  EXPECT_EQ(c1.expert_pack, 1);
  EXPECT_GT(c1.a2a_micro_s, c1.ffn_micro_s);  // the premise for packing on this cluster
  // The scenario's default cap, lina.max_pack = 2 (Lina §7.2).
  EXPECT_EQ(sc.strategies[2].lina.max_pack, 2);
  const auto c2 = schedules::lina_choose(sc, *topo, cap, Bytes(4e6), LayoutRole::kPlain, 2, 1);
  EXPECT_EQ(c2.expert_pack, 2);
  const auto packed = schedules::packed_scenario(sc, 2);
  EXPECT_EQ(packed.parallelism.ep, 4);
  EXPECT_EQ(packed.parallelism.dp, 4);
  EXPECT_EQ(packed.model.experts_per_gpu, 2);
  EXPECT_EQ(packed.num_experts(), sc.num_experts());
  // End to end: packing raises the pipelining efficiency (compute busy during all-to-all).
  const LinaRun plain = run_schedule(lina_scenario("4MB", "flow", "false"), 2);
  const LinaRun pack = run_schedule(sc, 2);
  EXPECT_EQ(plain.decision.expert_pack, 1);
  EXPECT_EQ(pack.decision.expert_pack, c2.expert_pack);
  EXPECT_GT(pack.efficiency, plain.efficiency);
  std::printf("pipelining efficiency: no packing %.3f, packing x%d %.3f; step %.3f vs %.3f ms\n",
              plain.efficiency, pack.decision.expert_pack, pack.efficiency, plain.step_s * 1e3,
              pack.step_s * 1e3);
}

TEST(LinaSchedule, ExpertPackingStopsAtMaxPack) {
  // Lina's V1 layout (16 experts, one per GPU, ep 16 x dp 1) on 16 single-GPU nodes, so every
  // packed EP group still crosses the 100 Gb/s NICs (on 4-GPU nodes ep 4 is one node and its
  // NVSwitch all-to-all ends the packing at 4). E = 16, dC = k f S / E = 2 x 4096 / 16 = 512 slots,
  // dispatch bytes E dC M b = 16 x 512 x 2048 x 2 = 32 MiB -> 9 micro-ops of <= 4 MB.
  Scenario sc = lina_scenario("4MB", "flow", "true");
  sc.cluster.nodes = 16;
  sc.cluster.gpus_per_node = 1;
  sc.parallelism.ep = 16;
  sc.parallelism.dp = 1;
  sc.model.experts = 16;
  sc.model.hidden_dim = 1024;  // a small FFN: shorter than the all-to-all micro-op up to p = 8
  const auto topo = topology::build_topology(sc.cluster);
  const std::int64_t cap = 512;
  // No cap (16 exceeds every reachable pack): packing goes to 8, where ep / 8 = 2 EP ranks
  // remain (the floor), the FFN micro-op still shorter than the all-to-all one at p = 4.
  const auto uncapped =
      schedules::lina_choose(sc, *topo, cap, Bytes(4e6), LayoutRole::kPlain, 16, 1);
  EXPECT_EQ(uncapped.pipeline_degree, 9);
  EXPECT_EQ(uncapped.expert_pack, 8);
  const auto at4 = schedules::lina_choose(sc, *topo, cap, Bytes(4e6), LayoutRole::kPlain, 4, 1);
  EXPECT_EQ(at4.expert_pack, 4);
  EXPECT_LT(at4.ffn_micro_s, at4.a2a_micro_s) << "the premise: only the ep floor stops at 8";
  // Lina's cap (the default): 2 experts per GPU.
  const auto capped = schedules::lina_choose(sc, *topo, cap, Bytes(4e6), LayoutRole::kPlain, 2, 1);
  EXPECT_EQ(capped.expert_pack, 2);
  EXPECT_LT(capped.ffn_micro_s, capped.a2a_micro_s);  // the cap, not the FFN, stopped it
  // max_pack 1 disables packing (as pack_experts: false does).
  const auto off = schedules::lina_choose(sc, *topo, cap, Bytes(4e6), LayoutRole::kPlain, 1, 1);
  EXPECT_EQ(off.expert_pack, 1);
  EXPECT_EQ(off.pipeline_degree, 9);
  // Through the strategy module: the scenario's default max_pack (2) reaches the decision.
  const auto run = run_schedule(sc, 2);
  EXPECT_EQ(run.decision.expert_pack, 2);
  EXPECT_EQ(run.decision.describe(), "r=9 a2a=linear layout=plain parallel=1 schedule=lina pack=2");
  sc.strategies[2].lina.max_pack = 1;
  EXPECT_EQ(run_schedule(sc, 2).decision.expert_pack, 1);
}

TEST(LinaSchedule, ShardedExpertsRunUnpacked) {
  // Experts sharded over 2 GPUs each (experts_per_gpu -2): Lina never packs them, and choosing
  // the micro-op count measures the unpacked layout (pack 1 is the scenario itself).
  Scenario sc = lina_scenario("4MB", "flow", "true");
  sc.cluster.nodes = 16;
  sc.cluster.gpus_per_node = 1;
  sc.parallelism.ep = 16;
  sc.parallelism.dp = 1;
  sc.model.experts_per_gpu = -2;
  sc.model.experts = 8;
  const auto topo = topology::build_topology(sc.cluster);
  const auto c = schedules::lina_choose(sc, *topo, 512, Bytes(4e6), LayoutRole::kPlain, 2, 1);
  EXPECT_EQ(c.expert_pack, 1);
  EXPECT_GE(c.pipeline_degree, 1);
  const Scenario same = schedules::packed_scenario(sc, 1);
  EXPECT_EQ(same.parallelism.ep, 16);
  EXPECT_EQ(same.model.experts_per_gpu, -2);
}

}  // namespace
}  // namespace moesim::strategies
