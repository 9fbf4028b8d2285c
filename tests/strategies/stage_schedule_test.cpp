// Pipeline stages and micro-batches (strategies/stage_schedule.hpp): the 1F1B order worked out by
// hand, the stitched plan's structure (ranks, sends, gradient all-reduces once), the step time of
// equal stages against the textbook (m + pp - 1) x (F + B), the loader's rules and the memory of
// a stage.
#include "strategies/stage_schedule.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/memory.hpp"
#include "strategies/runner.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

struct Cfg {
  int nodes = 2, gpn = 2;
  int layers = 2, pp = 2, micro_batches = 3;
  int ep = 2;
  std::string mode = "training";
  std::string nic = "200Gb/s";
  std::string model_extra;
  int seq = 256, model_dim = 256, hidden = 512;
  std::string parallel_extra;  // more `parallelism:` keys, e.g. ", zero: 1"
};

Scenario make_scenario(const Cfg& c) {
  return parse_scenario_string(
      fmt::format(R"(
name: stage-test
cluster:
  gpu: a100-sxm-80gb
  nodes: {}
  gpus_per_node: {}
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
  inter_node: {{kind: switch, nic_bandwidth: {}, nics_per_node: {}, latency: 2us}}
model:
  mode: {}
  layers: {}
  batch_per_gpu: 2
  seq_len: {}
  model_dim: {}
  hidden_dim: {}
  experts_per_gpu: 1
  top_k: 1
  capacity_factor: 1.0
  micro_batches: {}
  dtype: fp16
{}parallelism: {{pp: {}, ep: {}, dp: auto{}}}
strategies:
  - {{name: baseline}}
)",
                  c.nodes, c.gpn, c.nic, c.gpn, c.mode, c.layers, c.seq, c.model_dim, c.hidden,
                  c.micro_batches, c.model_extra, c.pp, c.ep, c.parallel_extra),
      "stage.yaml");
}

// Uniform routing with every slot filled, over the GPUs of one stage.
workload::IterationWorkload make_work(const Scenario& stage) {
  return testing::uniform_work(stage,
                               stage.tokens_per_gpu() * stage.model.top_k / stage.num_experts());
}

struct Built {
  Scenario sc;
  std::unique_ptr<topology::Topology> topo;
  BuiltPlan bp;
};

Built build(const Cfg& c) {
  Built b{make_scenario(c), nullptr, BuiltPlan{Plan(0), PlanIndex{}}};
  b.topo = topology::build_topology(b.sc.cluster);
  b.bp = build_step_plan(b.sc, *b.topo, make_work(b.sc.stage_scenario()), Decision{});
  return b;
}

RunResult run_analytical(const Built& b, sim::NetworkKind kind = sim::NetworkKind::kAnalytical) {
  sim::EngineConfig cfg;
  cfg.network = kind;
  cfg.precision = b.sc.model.dtype;
  return sim::run_plan(b.bp.plan, *b.topo, cfg);
}

std::string order(const std::vector<StageAction>& seq) {
  std::string out;
  for (const auto& a : seq) out += fmt::format("{}{} ", a.backward ? 'B' : 'F', a.micro_batch);
  return out;
}

TEST(OneFOneB, OrdersWorkedByHand) {
  // pp 4, m 6: stage s warms up with 3 - s forwards, then alternates, then drains.
  EXPECT_EQ(order(one_f_one_b(4, 0, 6, true)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  EXPECT_EQ(order(one_f_one_b(4, 1, 6, true)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5 ");
  EXPECT_EQ(order(one_f_one_b(4, 3, 6, true)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  // Fewer micro-batches than stages: the warm-up is cut at m.
  EXPECT_EQ(order(one_f_one_b(4, 0, 2, true)), "F0 F1 B0 B1 ");
  // One stage: gradient accumulation, F B F B.
  EXPECT_EQ(order(one_f_one_b(1, 0, 3, true)), "F0 B0 F1 B1 F2 B2 ");
  EXPECT_EQ(order(one_f_one_b(3, 1, 3, false)), "F0 F1 F2 ");
}

TEST(StageBlocks, SplitsEvenlyWithTheExtraBlocksFirst) {
  Cfg c;
  c.nodes = 16;
  c.gpn = 1;
  c.ep = 1;
  c.layers = 61;
  c.pp = 16;
  const Scenario sc = make_scenario(c);
  int next = 0;
  for (int s = 0; s < 16; ++s) {
    const auto [first, end] = sc.stage_blocks(s);
    EXPECT_EQ(first, next);
    EXPECT_EQ(end - first, s < 13 ? 4 : 3) << "stage " << s;  // 61 = 13 x 4 + 3 x 3
    next = end;
  }
  EXPECT_EQ(next, 61);
  EXPECT_EQ(sc.stage_gpus(), 1);
  const Scenario stage = sc.stage_scenario();
  EXPECT_EQ(stage.num_gpus(), 1);
  EXPECT_EQ(stage.parallelism.pp, 1);
}

TEST(StageLoader, RefusesStagesThatAreNotWholeNodesOrHaveNoBlock) {
  Cfg c;
  c.nodes = 3;
  c.pp = 2;
  try {
    make_scenario(c);
    FAIL() << "pp 2 on 3 nodes was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pp values that fit (up to model.layers): 1"),
              std::string::npos)
        << e.what();
  }
  c = Cfg{};
  c.nodes = 4;
  c.layers = 2;
  c.pp = 4;
  c.ep = 2;
  EXPECT_THROW(make_scenario(c), InputError);  // 4 stages, 2 blocks
  // The degrees describe one stage: ep 4 on a 2 x 2 cluster with pp 2 is more than its 2 GPUs.
  c = Cfg{};
  c.ep = 4;
  try {
    make_scenario(c);
    FAIL() << "ep 4 on a 2-GPU stage was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("P / pp = 2"), std::string::npos) << e.what();
  }
}

TEST(StageStitch, EveryStageOnItsGpusSendsBetweenNeighboursAndSyncsGradientsOnce) {
  Cfg c;  // 2 nodes x 2 GPUs, pp 2 (a stage is one node, ep 2), 2 blocks, 3 micro-batches
  const Built b = build(c);
  const Plan& plan = b.bp.plan;
  EXPECT_NO_THROW(plan.validate());
  // The one-stage plan of stage 0, to count against.
  const Scenario stage = b.sc.stage_scenario();
  const StagePlan s0 =
      build_stage_plan(stage, *b.topo, make_work(stage), Decision{}, StagePart{0, 1, true, false});
  const int grads = static_cast<int>(s0.built.index.gradient_sync.size());
  ASSERT_GT(grads, 0);  // the dense DP group is the stage's 2 GPUs
  int act = 0, grad = 0, synced = 0;
  for (const Op& op : plan.ops()) {
    if (op.label.find("pp.act") != std::string::npos ||
        op.label.find("pp.grad") != std::string::npos) {
      const auto& spec = op.collective();
      const bool forward = op.label.find("pp.act") != std::string::npos;
      (forward ? act : grad)++;
      ASSERT_EQ(spec.type, CollectiveType::kAllToAllv);
      // Each rank's whole activation, S x M x 2 bytes, one way only.
      const double bytes = 2.0 * 256 * 256 * 2;
      EXPECT_DOUBLE_EQ(spec.matrix->at(forward ? 0 : 1, forward ? 1 : 0).value(), bytes);
      EXPECT_DOUBLE_EQ(spec.matrix->total().value(), bytes);
      for (const auto& g : plan.grouping(spec.grouping).groups) EXPECT_EQ(g[1], g[0] + 2);
      continue;
    }
    // Every other op lies inside one stage.
    const int stage_of_first = op.ranks.at(0) / 2;
    for (int i = 0; i < op.ranks.size(); ++i) EXPECT_EQ(op.ranks.at(i) / 2, stage_of_first);
    if (op.role.kind == OpRoleKind::kDenseGradSync || op.role.kind == OpRoleKind::kExpertGradSync) {
      ++synced;
      EXPECT_EQ(op.label.rfind("mb2.", 0), 0u) << op.label;  // the last micro-batch's backward
    }
  }
  EXPECT_EQ(act, 3);   // (pp - 1) x m
  EXPECT_EQ(grad, 3);  // (pp - 1) x m
  EXPECT_EQ(synced, 2 * grads);
  EXPECT_EQ(static_cast<int>(b.bp.index.gradient_sync.size()), 2 * grads);
  EXPECT_EQ(b.bp.index.moe_layers.size(), 2u * 3u);  // 2 MoE layers x 3 micro-batches
}

// The 1F1B step worked out from F, B (a stage's forward and backward compute) and C (one send)
// by the schedule's own rules: an action starts when the stage's previous action ended and its
// input arrived; a send starts when its pass ended and the previous send over the same boundary
// and direction arrived, and takes C.
double one_f_one_b_makespan(int pp, int m, double F, double B, double C) {
  std::vector<std::vector<double>> end_f(pp, std::vector<double>(m, -1)), end_b = end_f;
  std::vector<std::vector<double>> act_in = end_f, grad_in = end_f;  // arrival at stage s
  std::vector<double> act_free(pp, 0), grad_free(pp, 0);             // per boundary
  std::vector<double> stage_free(pp, 0);
  std::vector<std::size_t> next(pp, 0);
  std::vector<std::vector<StageAction>> seq;
  // The orders themselves are checked by hand in OneFOneB.OrdersWorkedByHand.
  for (int s = 0; s < pp; ++s) seq.push_back(one_f_one_b(pp, s, m, true));
  for (bool more = true; more;) {
    more = false;
    for (int s = 0; s < pp; ++s) {
      while (next[s] < seq[s].size()) {
        const StageAction a = seq[s][next[s]];
        const int i = a.micro_batch;
        const double in =
            a.backward ? (s == pp - 1 ? 0 : grad_in[s][i]) : (s == 0 ? 0 : act_in[s][i]);
        if (in < 0) break;
        const double end = std::max(stage_free[s], in) + (a.backward ? B : F);
        stage_free[s] = end;
        if (!a.backward) {
          end_f[s][i] = end;
          if (s + 1 < pp) act_in[s + 1][i] = act_free[s] = std::max(end, act_free[s]) + C;
        } else {
          end_b[s][i] = end;
          if (s > 0) grad_in[s - 1][i] = grad_free[s - 1] = std::max(end, grad_free[s - 1]) + C;
        }
        ++next[s];
      }
      more = more || next[s] < seq[s].size();
    }
  }
  double makespan = 0;
  for (int s = 0; s < pp; ++s) makespan = std::max(makespan, stage_free[s]);
  return makespan;
}

// Equal stages of pure compute (ep 1: no all-to-all; one GPU per stage: no gradient all-reduce):
// the engine's step (analytical and flow) is the schedule worked out above, and with no send
// cost the textbook (m + pp - 1) x (F + B).
TEST(StageTiming, EqualStagesFollowTheOneFOneBScheduleExactly) {
  EXPECT_DOUBLE_EQ(one_f_one_b_makespan(4, 8, 1.0, 2.0, 0.0), (8 + 4 - 1) * 3.0);
  EXPECT_DOUBLE_EQ(one_f_one_b_makespan(2, 1, 1.0, 2.0, 0.5), 2 * 3.0 + 2 * 0.5);
  for (const auto kind : {sim::NetworkKind::kAnalytical, sim::NetworkKind::kFlow})
    for (const auto& [pp, m] :
         {std::pair{2, 1}, std::pair{2, 4}, std::pair{4, 8}, std::pair{4, 2}}) {
      Cfg c;
      c.nodes = pp;
      c.gpn = 1;
      c.ep = 1;
      c.layers = pp;
      c.pp = pp;
      c.micro_batches = m;
      c.seq = 4096;
      c.model_dim = 4096;
      c.hidden = 16384;
      const Built b = build(c);
      const RunResult r = run_analytical(b, kind);
      // F and B of each stage: its forward and backward compute, per micro-batch.
      std::vector<double> fwd(static_cast<std::size_t>(pp), 0.0), bwd = fwd;
      std::vector<double> sends, optimizer;
      for (const Op& op : b.bp.plan.ops()) {
        const double d = r.op_last_end(op.id) - r.op_first_start(op.id);
        if (op.kind == OpKind::kCollective)
          sends.push_back(d);
        else if (op.compute().cls == ComputeClass::kOptimizer)
          optimizer.push_back(d);  // once per stage, after its last backward
        else
          (op.label.find(".bwd.") != std::string::npos ? bwd : fwd)[op.ranks.at(0)] += d / m;
      }
      ASSERT_EQ(optimizer.size(), static_cast<std::size_t>(pp));
      for (double d : optimizer) EXPECT_NEAR(d, optimizer[0], 1e-15);
      ASSERT_EQ(sends.size(), 2u * (pp - 1) * m);
      for (double d : sends) EXPECT_NEAR(d, sends[0], 1e-12);
      for (int s = 1; s < pp; ++s) {
        EXPECT_NEAR(fwd[s], fwd[0], 1e-12);
        EXPECT_NEAR(bwd[s], bwd[0], 1e-12);
      }
      EXPECT_GT(sends[0], 0.01 * fwd[0]);  // the sends matter: the check below sees them
      // Stage 0 finishes last under 1F1B; its optimizer step ends the step.
      EXPECT_NEAR(r.makespan_s,
                  one_f_one_b_makespan(pp, m, fwd[0], bwd[0], sends[0]) + optimizer[0], 1e-9)
          << sim::network_kind_name(kind) << " pp " << pp << " m " << m;
    }
}

TEST(StageTiming, MicroBatchesFillThePipeline) {
  // Per micro-batch, the step time falls with m (the bubble is amortised) and stays above the
  // bubble-free m x (F + B) / pp... measured on the 2 x 2 cluster with all-to-alls and DP.
  double prev_per_mb = 0;
  for (int m : {1, 2, 4, 8}) {
    Cfg c;
    c.micro_batches = m;
    const Built b = build(c);
    const double per_mb = run_analytical(b).makespan_s / m;
    if (m > 1) {
      EXPECT_LT(per_mb, prev_per_mb) << "m " << m;
    }
    prev_per_mb = per_mb;
  }
}

TEST(StageMemory, AStageHoldsItsBlocksAndItsMicroBatchesInFlight) {
  Cfg one;
  one.pp = 1;
  one.nodes = 1;
  one.gpn = 2;
  one.micro_batches = 1;
  Cfg two;  // the same 2 blocks on 2 stages of 2 GPUs
  two.micro_batches = 4;
  const Scenario a = make_scenario(one), b = make_scenario(two);
  const MemoryEstimate ea = estimate_memory(a, Decision{}, 512);
  const MemoryEstimate eb = estimate_memory(b, Decision{}, 512);
  // One block of two per stage: half the parameters, gradients and optimizer state.
  EXPECT_DOUBLE_EQ(eb.dense_params, ea.dense_params / 2);
  EXPECT_DOUBLE_EQ(eb.expert_params, ea.expert_params / 2);
  EXPECT_DOUBLE_EQ(eb.optimizer_bytes, ea.optimizer_bytes / 2);
  // Stage 0 holds min(pp, m) = 2 micro-batches of its one block: as much as 2 blocks of one.
  EXPECT_DOUBLE_EQ(eb.activations_bytes, ea.activations_bytes);
  two.micro_batches = 1;  // one micro-batch: one block's activations
  EXPECT_DOUBLE_EQ(estimate_memory(make_scenario(two), Decision{}, 512).activations_bytes,
                   ea.activations_bytes / 2);
}

// ZeRO-1: the optimizer state of dense parameters over the stage's P / pp / mp ranks, of experts
// over their dp replicas; nothing else changes. 4 nodes x 2 GPUs, pp 2: stages of 4 GPUs, ep 2,
// dp 2 (dense replicas: 4).
TEST(StageMemory, ZeroOneShardsTheOptimizerStateOverEachParametersReplicas) {
  Cfg c;
  c.nodes = 4;
  c.gpn = 2;
  c.pp = 2;
  c.ep = 2;
  const MemoryEstimate plain = estimate_memory(make_scenario(c), Decision{}, 512);
  c.parallel_extra = ", zero: 1";
  const Scenario sc = make_scenario(c);
  ASSERT_EQ(sc.parallelism.dp, 2);
  ASSERT_EQ(sc.parallelism.zero, 1);
  const MemoryEstimate z = estimate_memory(sc, Decision{}, 512);
  EXPECT_DOUBLE_EQ(z.optimizer_bytes,
                   (plain.dense_params / 4 + plain.expert_params / 2) * 12);  // fp16: 12 B
  EXPECT_DOUBLE_EQ(z.weights_bytes, plain.weights_bytes);
  EXPECT_DOUBLE_EQ(z.gradients_bytes, plain.gradients_bytes);
  EXPECT_DOUBLE_EQ(z.activations_bytes, plain.activations_bytes);
  c.parallel_extra = ", zero: 2";
  EXPECT_THROW(make_scenario(c), InputError);  // stages 0 and 1 only
}

TEST(StageRunner, RunStackSamplesOneStageAndRunsTheWholeStep) {
  Cfg c;
  c.micro_batches = 4;
  const Scenario sc = make_scenario(c);
  auto topo = topology::build_topology(sc.cluster);
  sim::EngineConfig cfg;
  cfg.network = sim::NetworkKind::kAnalytical;
  cfg.precision = sc.model.dtype;
  const StackRun run = run_stack(
      sc, sc.strategies[0], *topo, [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); }, 1);
  ASSERT_EQ(run.iterations.size(), 1u);
  EXPECT_EQ(run.last_plan.plan.num_ranks(), 4);
  EXPECT_EQ(run.last_plan.index.moe_layers.size(), 2u * 4u);
  EXPECT_GT(run.iterations[0].step_time_s, 0);
  EXPECT_DOUBLE_EQ(
      run.iterations[0].memory.total_bytes(),
      estimate_memory(sc, run.iterations[0].decision, run.iterations[0].memory.capacity)
          .total_bytes());
}

}  // namespace
}  // namespace moesim::strategies
