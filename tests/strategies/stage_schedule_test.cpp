// Pipeline stages and micro-batches (strategies/stage_schedule.hpp): the 1F1B order worked out by
// hand, the stitched plan's structure (ranks, sends, gradient all-reduces once), the step time of
// equal stages against the textbook (m + pp - 1) x (F + B), the loader's rules and the memory of
// a stage.
#include "strategies/stage_schedule.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
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

// The schedules' closed forms take every forward and backward at one duration: stage sends and
// the stage's own collectives do not queue for the NICs (EngineConfig::analytical_nic_sharing).
RunResult run_analytical(const Built& b, sim::NetworkKind kind = sim::NetworkKind::kAnalytical) {
  sim::EngineConfig cfg;
  cfg.network = kind;
  cfg.analytical_nic_sharing = false;
  cfg.precision = b.sc.model.dtype;
  return sim::run_plan(b.bp.plan, *b.topo, cfg);
}

std::string order(const std::vector<StageAction>& seq) {
  std::string out;
  for (const auto& a : seq) out += fmt::format("{}{} ", a.backward ? 'B' : 'F', a.micro_batch);
  return out;
}

// With the chunk: "F3.1" is micro-batch 3's forward of the stage's chunk 1; "&" joins an
// overlapped pair (DualPipe's F&B).
std::string chunk_order(const std::vector<StageAction>& seq) {
  std::string out;
  for (const auto& a : seq)
    out += fmt::format("{}{}.{}{}", a.backward ? 'B' : 'F', a.micro_batch, a.chunk,
                       a.overlap_next ? '&' : ' ');
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

// Megatron's interleaved order, pp 4, vp 2, m 8: virtual micro-batch k runs chunk (k mod 8) / 4
// of micro-batch (k / 8) 4 + k mod 4; stage s warms up with (3 - s) 2 + 4 forwards.
TEST(InterleavedOneFOneB, OrdersWorkedByHand) {
  EXPECT_EQ(chunk_order(interleaved_one_f_one_b(4, 2, 0, 8)),
            "F0.0 F1.0 F2.0 F3.0 F0.1 F1.1 F2.1 F3.1 F4.0 F5.0 F6.0 B0.1 F7.0 B1.1 F4.1 B2.1 "
            "F5.1 B3.1 F6.1 B0.0 F7.1 B1.0 B2.0 B3.0 B4.1 B5.1 B6.1 B7.1 B4.0 B5.0 B6.0 B7.0 ");
  EXPECT_EQ(chunk_order(interleaved_one_f_one_b(4, 2, 3, 8)),
            "F0.0 F1.0 F2.0 F3.0 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 F3.1 B3.1 F4.0 B0.0 F5.0 B1.0 "
            "F6.0 B2.0 F7.0 B3.0 F4.1 B4.1 F5.1 B5.1 F6.1 B6.1 F7.1 B7.1 B4.0 B5.0 B6.0 B7.0 ");
  // m == pp: every forward first (Megatron's all-warm-up case).
  EXPECT_EQ(chunk_order(interleaved_one_f_one_b(2, 2, 1, 2)),
            "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0 ");
  // Chunks in flight at the peak: warm-up + 1 = (pp - s - 1) 2 + (vp - 1) pp + 1.
  EXPECT_EQ(peak_in_flight(interleaved_one_f_one_b(4, 2, 0, 8)), 11);
  EXPECT_EQ(peak_in_flight(interleaved_one_f_one_b(4, 2, 3, 8)), 5);
}

// DualPipe, pp 4, m 8 (4 micro-batches from each end: 0-3 enter at stage 0 and run chunk 0,
// 4-7 at stage 3 and run chunk 1), the reference's steps 1-7 with W inside B. Stage 0: step 1
// F0 F1, step 2 F2 F4, step 3 B4 F5, step 4 F3&B5 F6&B0, step 5 B6 F7&B1, step 6 B7 B2, step 7 B3.
TEST(DualPipe, OrdersWorkedByHand) {
  EXPECT_EQ(chunk_order(dualpipe(4, 0, 8)),
            "F0.0 F1.0 F2.0 F4.1 B4.1 F5.1 F3.0&B5.1 F6.1&B0.0 B6.1 F7.1&B1.0 B7.1 B2.0 B3.0 ");
  // A middle stage keeps its first main-step pair apart (as the reference does).
  EXPECT_EQ(chunk_order(dualpipe(4, 1, 8)),
            "F0.0 F4.1 F1.0 F5.1 F2.0 B4.1 F6.1&B0.0 F3.0&B5.1 F7.1&B1.0 B6.1 B2.0 B7.1 B3.0 ");
  // The last stage mirrors the first with the directions swapped.
  EXPECT_EQ(chunk_order(dualpipe(4, 3, 8)),
            "F4.1 F5.1 F6.1 F0.0 B0.0 F1.0 F7.1&B1.0 F2.0&B4.1 B2.0 F3.0&B5.1 B3.0 B6.1 B7.1 ");
  // DeepSeek-V3's Table 2: pp + 1 micro-batches of activations in flight (1F1B: pp).
  for (int s = 0; s < 4; ++s) EXPECT_EQ(peak_in_flight(dualpipe(4, s, 8)), 5) << "stage " << s;
  EXPECT_EQ(peak_in_flight(one_f_one_b(4, 0, 8, true)), 4);
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

// Each schedule's refusals name the key that can fix them and what would fit.
TEST(StageLoader, RefusesSchedulesTheLayoutCannotRun) {
  auto error = [](Cfg c) {
    try {
      make_scenario(c);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  };
  Cfg c;
  c.nodes = 4;
  c.gpn = 1;
  c.ep = 1;
  c.pp = 4;
  c.layers = 12;
  c.micro_batches = 8;
  c.layers = 8;
  c.parallel_extra = ", vp: 2";
  EXPECT_EQ(make_scenario(c).parallelism.schedule, PipelineSchedule::kInterleaved);  // implied
  c.parallel_extra = ", vp: 2, schedule: 1f1b";
  EXPECT_TRUE(has(error(c), "parallelism.vp")) << error(c);
  c.parallel_extra = ", vp: 2";
  c.layers = 12;  // 3 blocks per stage: vp 2 does not split them
  EXPECT_TRUE(has(error(c),
                  "expected a divisor of the 3 blocks per stage (model.layers / pp = "
                  "12 / 4): 1, 3"))
      << error(c);
  c.layers = 10;  // 3, 3, 2, 2 blocks: only vp 1
  EXPECT_TRUE(has(error(c), "only vp = 1 fits")) << error(c);
  c.layers = 8;
  c.micro_batches = 6;
  EXPECT_TRUE(has(error(c), "model.micro_batches")) << error(c);
  EXPECT_TRUE(has(error(c), "expected a multiple of pp")) << error(c);
  c.micro_batches = 8;
  c.parallel_extra = ", schedule: interleaved";  // vp 1
  EXPECT_TRUE(has(error(c), "expected parallelism.vp >= 2")) << error(c);
  c.parallel_extra = ", schedule: dualpipe";
  EXPECT_EQ(make_scenario(c).parallelism.schedule, PipelineSchedule::kDualPipe);
  c.micro_batches = 6;  // fewer than 2 pp
  EXPECT_TRUE(has(error(c), "expected an even number >= 2 * pp = 8")) << error(c);
  c.micro_batches = 8;
  c.mode = "inference";
  EXPECT_TRUE(has(error(c), "expected model.mode training")) << error(c);
  c.mode = "training";
  c.nodes = 3;  // pp 3: odd
  c.pp = 3;
  c.layers = 6;
  EXPECT_TRUE(has(error(c), "parallelism.schedule")) << error(c);
  EXPECT_TRUE(has(error(c), "expected an even pp")) << error(c);
}

// DualPipe holds two stages per rank (2x the parameters) and pp + 1 stage-micro-batches of
// activations; interleaving keeps Megatron's (1 + (pp - 1) / (pp vp)) pp of them on stage 0.
TEST(StageMemory, SchedulesChangeParametersAndActivationsInFlight) {
  Cfg c;
  c.nodes = 4;
  c.gpn = 1;
  c.ep = 1;
  c.pp = 4;
  c.layers = 8;
  c.micro_batches = 8;
  const MemoryEstimate plain = estimate_memory(make_scenario(c), Decision{}, 512);
  EXPECT_EQ(plain.in_flight, 4);
  c.parallel_extra = ", schedule: dualpipe";
  const MemoryEstimate dual = estimate_memory(make_scenario(c), Decision{}, 512);
  EXPECT_DOUBLE_EQ(dual.dense_params, 2 * plain.dense_params);
  EXPECT_DOUBLE_EQ(dual.optimizer_bytes, 2 * plain.optimizer_bytes);
  EXPECT_EQ(dual.in_flight, 5);
  EXPECT_EQ(dual.chunks, 2);
  // 5 chunks of one stage each (a rank's share is two stages).
  EXPECT_DOUBLE_EQ(dual.activations_bytes, plain.activations_bytes * 5 / 4);
  c.parallel_extra = ", vp: 2";
  const MemoryEstimate inter = estimate_memory(make_scenario(c), Decision{}, 512);
  EXPECT_DOUBLE_EQ(inter.dense_params, plain.dense_params);
  EXPECT_EQ(inter.in_flight, 11);  // (4 - 1) 2 + (2 - 1) 4 + 1 chunks of half a stage
  EXPECT_DOUBLE_EQ(inter.activations_bytes, plain.activations_bytes * (1 + 3.0 / 8));
}

// DualPipe's plan: every stage runs both of its stages' passes; sends go both ways on every
// boundary for both directions; each copy of a stage syncs its gradients once.
TEST(StageStitch, DualPipeRunsBothDirectionsAndSyncsEachCopyOnce) {
  Cfg c;
  c.nodes = 4;
  c.gpn = 2;
  c.pp = 2;
  c.ep = 2;
  c.micro_batches = 4;
  c.parallel_extra = ", schedule: dualpipe";
  const Built b = build(c);
  EXPECT_NO_THROW(b.bp.plan.validate());
  int act_up = 0, act_down = 0, synced = 0, rev_streams = 0;
  for (const Op& op : b.bp.plan.ops()) {
    if (op.label.find("pp.act.s0_s1") != std::string::npos) ++act_up;
    if (op.label.find("pp.act.s1_s0") != std::string::npos) ++act_down;
    if (op.role.kind == OpRoleKind::kDenseGradSync || op.role.kind == OpRoleKind::kExpertGradSync)
      ++synced;
    if (b.bp.plan.stream_names()[op.stream].find(".rev") != std::string::npos) {
      ++rev_streams;
      EXPECT_NE(op.kind, OpKind::kCompute) << op.label;  // the compute stream is shared
    }
  }
  // Stage 0 runs F0 F2 F1 B2 F3&B0 B3 B1 (pp 2, m 4; stage 0 is a middle stage, so its first
  // main-step pair is apart): F3's and B0's compute ops interleave on GPU 0 (at each all-to-all).
  int first_f3 = -1, last_f3 = -1, first_b0 = -1;
  for (const Op& op : b.bp.plan.ops()) {
    if (op.kind != OpKind::kCompute || op.ranks.at(0) != 0) continue;
    const bool f3 = op.label.rfind("mb3.", 0) == 0 && op.label.find(".fwd.") != std::string::npos;
    const bool b0 = op.label.rfind("mb0.", 0) == 0 && op.label.find(".bwd.") != std::string::npos;
    if (f3 && first_f3 < 0) first_f3 = op.id;
    if (f3) last_f3 = op.id;
    if (b0 && first_b0 < 0) first_b0 = op.id;
  }
  ASSERT_GE(first_f3, 0);
  ASSERT_GE(first_b0, 0);
  EXPECT_LT(first_f3, first_b0);  // the forward leads
  EXPECT_LT(first_b0, last_f3);   // the backward starts before the forward's last op
  EXPECT_EQ(chunk_order(dualpipe(2, 0, 4)), "F0.0 F2.1 F1.0 B2.1 F3.1&B0.0 B3.1 B1.0 ");
  EXPECT_EQ(act_up, 2);    // micro-batches 0, 1 enter at stage 0
  EXPECT_EQ(act_down, 2);  // 2, 3 at stage 1
  EXPECT_GT(rev_streams, 0);
  EXPECT_EQ(static_cast<std::size_t>(synced), b.bp.index.gradient_sync.size());
  c.parallel_extra.clear();  // 1F1B: one copy of each stage
  const Built one = build(c);
  ASSERT_GT(one.bp.index.gradient_sync.size(), 0u);
  EXPECT_EQ(b.bp.index.gradient_sync.size(), 2 * one.bp.index.gradient_sync.size());
  EXPECT_EQ(b.bp.index.moe_layers.size(), 2u * 4u);  // 2 MoE layers x 4 micro-batches
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

// Any schedule's step worked out the same way from its orders (stage_order; checked by hand
// above): F, B the forward and backward of one model piece, C one send, O a piece's optimizer
// step, which runs on the compute stream right after the piece's last backward on that stage. An
// overlapped pair runs its forward, then its backward (pure compute shares one stream).
double schedule_makespan(const Scenario& sc, double F, double B, double C, double O) {
  const int pp = sc.parallelism.pp, m = sc.model.micro_batches, pieces = model_pieces(sc);
  auto rank_of = [&](int k, int i) {
    if (sc.parallelism.schedule == PipelineSchedule::kDualPipe) return i < m / 2 ? k : pp - 1 - k;
    return k % pp;
  };
  std::vector<std::vector<double>> act_in(pieces, std::vector<double>(m, -1)), grad_in = act_in;
  std::vector<std::vector<char>> fwd_done(pieces, std::vector<char>(m, 0));
  std::vector<std::vector<int>> last(pieces, std::vector<int>(pp, -1));
  for (int i = 0; i < m; ++i)
    for (int k = 0; k < pieces; ++k) last[k][rank_of(k, i)] = i;
  std::map<std::tuple<bool, int, int>, double> fifo;  // per (gradient?, from, to): free at
  std::vector<double> stage_free(pp, 0);
  std::vector<std::size_t> next(pp, 0);
  std::vector<std::vector<StageAction>> seq;
  for (int s = 0; s < pp; ++s) seq.push_back(stage_order(sc, s));
  auto input = [&](int s, StageAction a) {  // arrival time, -1 when not yet sent
    const int k = piece_of(sc, s, a.chunk), i = a.micro_batch;
    if (!a.backward) return k == 0 ? 0.0 : act_in[k][i];
    return k == pieces - 1 ? (fwd_done[k][i] ? 0.0 : -1.0) : grad_in[k][i];
  };
  auto run = [&](int s, StageAction a) {
    const int k = piece_of(sc, s, a.chunk), i = a.micro_batch;
    const double end = std::max(stage_free[s], input(s, a)) + (a.backward ? B : F);
    stage_free[s] = end + (a.backward && last[k][s] == i ? O : 0.0);
    const int to_piece = a.backward ? k - 1 : k + 1;
    if (!a.backward) fwd_done[k][i] = 1;
    if (to_piece < 0 || to_piece >= pieces) return;
    double& free = fifo[{a.backward, s, rank_of(to_piece, i)}];
    free = std::max(end, free) + C;
    (a.backward ? grad_in : act_in)[to_piece][i] = free;
  };
  for (bool more = true; more;) {
    more = false;
    for (int s = 0; s < pp; ++s) {
      while (next[s] < seq[s].size()) {
        const StageAction a = seq[s][next[s]];
        if (input(s, a) < 0) break;
        if (a.overlap_next) {
          const StageAction b = seq[s][next[s] + 1];
          if (input(s, b) < 0) break;
          run(s, a);
          run(s, b);
          next[s] += 2;
        } else {
          run(s, a);
          ++next[s];
        }
      }
      more = more || next[s] < seq[s].size();
    }
  }
  return *std::max_element(stage_free.begin(), stage_free.end());
}

Scenario schedule_scenario(const std::string& schedule, int pp, int m, int layers) {
  Cfg c;
  c.nodes = pp;
  c.gpn = 1;
  c.ep = 1;
  c.layers = layers;
  c.pp = pp;
  c.micro_batches = m;
  c.parallel_extra = ", schedule: " + schedule + (schedule == "interleaved" ? ", vp: 2" : "");
  return make_scenario(c);
}

// The published bubbles at pp 4, m 8 with a stage's F = 1 ms, B = 2 ms (ideal: m (F + B) = 24):
// 1F1B (pp - 1)(F + B) = 9; interleaved with vp 2 (pieces of F / 2, B / 2) (pp - 1)(F + B) / vp =
// 4.5; DualPipe's orders give 3 ms, inside DeepSeek-V3's Table 2 figure (pp / 2 - 1)(F&B + B - 3W)
// = 5 ms at W = 0 (no weight-gradient split) and F&B = F + B (nothing to overlap in pure
// compute): the table bounds the bubble of the busiest stage from the figure's cells.
TEST(ScheduleTiming, PublishedBubblesAtFourStagesAndEightMicroBatches) {
  EXPECT_DOUBLE_EQ(schedule_makespan(schedule_scenario("1f1b", 4, 8, 4), 1, 2, 0, 0), 24 + 9);
  EXPECT_DOUBLE_EQ(schedule_makespan(schedule_scenario("interleaved", 4, 8, 8), 0.5, 1, 0, 0),
                   24 + 4.5);
  EXPECT_DOUBLE_EQ(schedule_makespan(schedule_scenario("dualpipe", 4, 8, 4), 1, 2, 0, 0), 24 + 3);
  // 1F1B's reference agrees with the one above.
  EXPECT_DOUBLE_EQ(schedule_makespan(schedule_scenario("1f1b", 4, 8, 4), 1, 2, 0.25, 0),
                   one_f_one_b_makespan(4, 8, 1, 2, 0.25));
}

// The engine's step of pure-compute stages under each schedule is the schedule worked out above
// from the measured F, B, send and optimizer times (analytical and flow).
TEST(ScheduleTiming, EngineFollowsEverySchedulesOrder) {
  for (const auto kind : {sim::NetworkKind::kAnalytical, sim::NetworkKind::kFlow})
    for (const auto& [schedule, layers] :
         {std::pair<std::string, int>{"1f1b", 4}, {"interleaved", 8}, {"dualpipe", 4}}) {
      Cfg c;
      c.nodes = 4;
      c.gpn = 1;
      c.ep = 1;
      c.layers = layers;
      c.pp = 4;
      c.micro_batches = 8;
      c.seq = 4096;
      c.model_dim = 4096;
      c.hidden = 16384;
      c.parallel_extra = ", schedule: " + schedule + (schedule == "interleaved" ? ", vp: 2" : "");
      const Built b = build(c);
      const RunResult r = run_analytical(b, kind);
      const int pieces = model_pieces(b.sc);
      std::vector<double> fwd, bwd, sends, optimizer;
      for (const Op& op : b.bp.plan.ops()) {
        const double d = r.op_last_end(op.id) - r.op_first_start(op.id);
        if (op.kind == OpKind::kCollective)
          sends.push_back(d);
        else if (op.compute().cls == ComputeClass::kOptimizer)
          optimizer.push_back(d);
        else
          (op.label.find(".bwd.") != std::string::npos ? bwd : fwd).push_back(d);
      }
      // One optimizer step per copy of a piece (DualPipe: two copies of each stage).
      const int copies = schedule == "dualpipe" ? 2 * pieces : pieces;
      ASSERT_EQ(static_cast<int>(optimizer.size()), copies) << schedule;
      ASSERT_EQ(sends.size(), 2u * (pieces - 1) * 8) << schedule;
      for (double d : optimizer) EXPECT_NEAR(d, optimizer[0], 1e-15);
      const double F = std::accumulate(fwd.begin(), fwd.end(), 0.0) / (pieces * 8);
      const double B = std::accumulate(bwd.begin(), bwd.end(), 0.0) / (pieces * 8);
      const auto [lo, hi] = std::minmax_element(sends.begin(), sends.end());
      if (kind == sim::NetworkKind::kFlow && schedule != "1f1b") {
        // Flow: sends share links (DualPipe: one direction's activations and the other's
        // gradients cross a boundary the same way at once; interleaved: the wrap from the last
        // stage to the first meets a gradient arriving there), so they take between the lone and
        // the shared time; the step lies between the schedules worked out with each (max-plus is
        // monotone).
        EXPECT_GT(*hi, *lo * 1.5);
        EXPECT_GE(r.makespan_s, schedule_makespan(b.sc, F, B, *lo, optimizer[0]) - 1e-9);
        EXPECT_LE(r.makespan_s, schedule_makespan(b.sc, F, B, *hi, optimizer[0]) + 1e-9);
        continue;
      }
      EXPECT_NEAR(*hi, *lo, 1e-12) << sim::network_kind_name(kind) << " " << schedule;
      EXPECT_NEAR(r.makespan_s, schedule_makespan(b.sc, F, B, *lo, optimizer[0]), 1e-9)
          << sim::network_kind_name(kind) << " " << schedule;
    }
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
