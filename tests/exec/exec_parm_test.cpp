// The MP + EP + ESP data path (exec/parm_path.hpp) under `mpirun -np 8 --oversubscribe` (CTest
// does): tests/data/exec/parm-host-8.yaml, ep 2 x esp 2 x mp 2 on one node, S = 32 tokens, E = 4
// experts split over 2 ESP shards each. Every schedule must match the plain unsharded layer on its
// routing unit (drops included); with a capacity large enough that nothing drops, every schedule's
// output is the plain layer on the rank's own tokens, so they agree with each other.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>

#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/moe_data.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/parm_path.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/workload/workload.hpp"
#include "tests/exec/mpi_test_main.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
namespace {

Scenario parm8() {
  return load_scenario(std::string(MOESIM_SOURCE_DIR) + "/tests/data/exec/parm-host-8.yaml");
}

using Outcome = ExecOutcome;

Outcome run_once(const Scenario& sc, ScheduleRole schedule, int r = 1, bool check = true) {
  MpiCommunicator comm;
  strategies::Decision d;
  d.pipeline_degree = r;
  d.schedule = schedule;
  return run_step(sc, comm, d, check);
}

// This rank's MP peer (mp = 2: ranks 2i and 2i + 1 hold the same tokens).
std::vector<float> from_mp_peer(const std::vector<float>& mine) {
  std::vector<float> theirs(mine.size());
  const int peer = g_session->rank() ^ 1;
  MPI_Sendrecv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, peer, 7, theirs.data(),
               static_cast<int>(theirs.size()), MPI_FLOAT, peer, 7, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
  return theirs;
}

struct Case {
  const char* name;
  ScheduleRole schedule;
  int r;
};
const Case kCases[] = {{"baseline", ScheduleRole::kParmBaseline, 1},
                       {"s1", ScheduleRole::kParmS1, 1},
                       {"s2", ScheduleRole::kParmS2, 1},
                       {"auto", ScheduleRole::kParmAuto, 1},
                       {"baseline r=2", ScheduleRole::kParmBaseline, 2},
                       {"s1 r=2", ScheduleRole::kParmS1, 2},
                       {"s2 r=2", ScheduleRole::kParmS2, 2}};

TEST(ExecParm, RunsOnEightRanks) { ASSERT_EQ(g_session->size(), 8) << "run under mpirun -np 8"; }

TEST(ExecParm, TokenKeyIsTheFirstRankOfTheMpGroup) {
  ParallelismSpec p;
  p.ep = 2;
  p.esp = 2;
  p.mp = 2;
  EXPECT_EQ(token_key_rank(p, 0), 0);
  EXPECT_EQ(token_key_rank(p, 1), 0);
  EXPECT_EQ(token_key_rank(p, 6), 6);
  EXPECT_EQ(token_key_rank(p, 7), 6);
  p.mp = 1;
  EXPECT_EQ(token_key_rank(p, 7), 7);
}

// Capacity factor 1.0 (dC = 16): choices drop, and each schedule drops them where the capacity
// rule on its routing unit says (esp * S tokens in the baseline, S / mp in S1, S in S2).
TEST(ExecParm, EverySchedulePassesTheCheckWithDrops) {
  const Scenario sc = parm8();
  for (const Case& c : kCases) {
    const Outcome o = run_once(sc, c.schedule, c.r);
    ASSERT_EQ(o.checks.size(), 2u) << c.name;  // two MoE blocks
    long long drops = 0;
    for (const LayerCheck& chk : o.checks) {
      EXPECT_EQ(chk.wrong, 0) << c.name << " layer " << chk.layer;
      EXPECT_EQ(chk.compared, 8LL * 32 * 16) << c.name;
      EXPECT_EQ(chk.dropped, chk.expected_dropped) << c.name;
      EXPECT_LT(chk.max_abs_error, 1e-5) << c.name;
      drops += chk.dropped;
    }
    EXPECT_GT(drops, 0) << c.name << ": the capacity factor 1.0 should make choices drop";
    // The backward on real data: per layer dX 8 x 32 x 16, dWgate 8 x 16 x 4 and, on every rank,
    // dW1 + dW2 of its 2 experts' H / esp = 16 hidden units (2 x 2 x 16 x 16), all against the
    // reference of the schedule's routing units.
    ASSERT_EQ(o.grad_checks.size(), 2u) << c.name;
    for (const GradCheck& g : o.grad_checks) {
      EXPECT_EQ(g.wrong, 0) << c.name << " layer " << g.layer;
      EXPECT_EQ(g.compared, 8LL * 32 * 16 + 8LL * 16 * 4 + 8LL * 2 * 2 * 16 * 16) << c.name;
      EXPECT_LT(g.max_abs_error, 1e-4) << c.name;
    }
    // Not trivially zero, and the MP peers hold the same output (bitwise: same inputs, same ops).
    double norm = 0;
    for (float v : o.outputs[0]) norm += std::fabs(v);
    EXPECT_GT(norm, 0.0) << c.name;
    for (const auto& y : o.outputs) EXPECT_EQ(from_mp_peer(y), y) << c.name;
  }
}

// Other factorisations of the 8 ranks: esp = 1 (the baseline is the plain path with MP ranks
// sharing tokens; S1 / S2 have no local dump or combine), mp = 1 (S2 degenerates to S1), ep = 1
// (the baseline has no all-to-all), dp = 2 (two copies of every group). Overlapped layout (the MP
// ranks are the EP x ESP GPUs, Parm's and DeepSpeed-MoE's): ESP groups equal to the MP groups
// (esp = mp = 2), inside them (mp 4, esp 2), containing them (mp 2, esp 4), and two DP copies.
TEST(ExecParm, EveryScheduleOnOtherFactorisations) {
  struct Shape {
    int ep, esp, mp, dp;
    MpLayout layout = MpLayout::kDisjoint;
  };
  const MpLayout ov = MpLayout::kOverlapped;
  for (const Shape f : {Shape{4, 1, 2, 1}, Shape{4, 2, 1, 1}, Shape{1, 2, 2, 2}, Shape{2, 2, 1, 2},
                        Shape{4, 2, 2, 1, ov}, Shape{4, 2, 4, 1, ov}, Shape{2, 4, 2, 1, ov},
                        Shape{2, 2, 2, 2, ov}}) {
    Scenario sc = parm8();
    sc.parallelism.ep = f.ep;
    sc.parallelism.esp = f.esp;
    sc.parallelism.mp = f.mp;
    sc.parallelism.dp = f.dp;
    sc.parallelism.layout = f.layout;
    sc.model.experts = sc.model.experts_per_gpu * f.ep;
    const std::string name = "ep " + std::to_string(f.ep) + " esp " + std::to_string(f.esp) +
                             " mp " + std::to_string(f.mp) + " dp " + std::to_string(f.dp) + " " +
                             std::string(name_of(f.layout));
    for (const Case& c : kCases) {
      const Outcome o = run_once(sc, c.schedule, c.r);
      ASSERT_EQ(o.checks.size(), 2u) << name << " " << c.name;
      for (const LayerCheck& chk : o.checks) {
        EXPECT_EQ(chk.wrong, 0) << name << " " << c.name;
        EXPECT_EQ(chk.dropped, chk.expected_dropped) << name << " " << c.name;
      }
      ASSERT_EQ(o.grad_checks.size(), 2u) << name << " " << c.name;
      for (const GradCheck& g : o.grad_checks) {
        EXPECT_EQ(g.wrong, 0) << name << " " << c.name;
        EXPECT_GT(g.compared, 0) << name << " " << c.name;
      }
    }
  }
}

// Capacity factor 2.0 (dC = 32 = S): no unit drops anything, so every schedule computes the plain
// layer on the rank's own tokens and they agree with each other to fp32 rounding (the partial sums
// are added in different orders): outputs, dX and the experts' dW after their MP sum (dWgate is
// the gate's own unit: the ESP group's tokens, S1's MP share, S2's S tokens).
TEST(ExecParm, SchedulesAgreeWhenNothingDrops) {
  Scenario sc = parm8();
  sc.model.capacity_factor = 2.0;
  const Outcome base = run_once(sc, ScheduleRole::kParmBaseline);
  for (const LayerCheck& chk : base.checks) EXPECT_EQ(chk.dropped, 0);
  for (const Case& c : kCases) {
    const Outcome o = run_once(sc, c.schedule, c.r);
    ASSERT_EQ(o.outputs.size(), base.outputs.size()) << c.name;
    for (const LayerCheck& chk : o.checks) {
      EXPECT_EQ(chk.wrong, 0) << c.name;
      EXPECT_EQ(chk.dropped, 0) << c.name;
    }
    double max_diff = 0;
    for (std::size_t l = 0; l < o.outputs.size(); ++l) {
      ASSERT_EQ(o.outputs[l].size(), base.outputs[l].size()) << c.name;
      for (std::size_t i = 0; i < o.outputs[l].size(); ++i)
        max_diff = std::max(max_diff,
                            static_cast<double>(std::fabs(o.outputs[l][i] - base.outputs[l][i])));
    }
    EXPECT_LT(max_diff, 1e-5) << c.name;
    const std::size_t dx = 32 * 16, dgate = 16 * 4;
    double grad_diff = 0;
    ASSERT_EQ(o.grads.size(), base.grads.size()) << c.name;
    for (std::size_t l = 0; l < o.grads.size(); ++l) {
      ASSERT_EQ(o.grads[l].size(), dx + dgate + 2 * 2 * 16 * 16) << c.name;
      ASSERT_EQ(o.grads[l].size(), base.grads[l].size()) << c.name;
      for (std::size_t i = 0; i < o.grads[l].size(); ++i)
        if (i < dx || i >= dx + dgate)
          grad_diff =
              std::max(grad_diff, static_cast<double>(std::fabs(o.grads[l][i] - base.grads[l][i])));
    }
    EXPECT_LT(grad_diff, 1e-5) << c.name;
    double norm = 0;
    for (float v : o.grads[0]) norm += std::fabs(v);
    EXPECT_GT(norm, 0.0) << c.name;
  }
}

// The plan's collectives ran as the plan names them: S2's return all-to-all as SAA over the
// 8-rank ep_esp_mp grouping, S1's as a plain all-to-all plus the MP all-gather.
TEST(ExecParm, S2RunsSaaAndS1TheMpAllGather) {
  const Scenario sc = parm8();
  const Outcome s2 = run_once(sc, ScheduleRole::kParmS2);
  int saa = 0;
  for (const auto& c : s2.result.collectives)
    if (c.label.find("combine_saa") != std::string::npos) {
      EXPECT_EQ(c.algo, CollectiveAlgo::kSaa);
      ++saa;
    }
  EXPECT_EQ(saa, 2);  // one chunk per MoE block
  const Outcome s1 = run_once(sc, ScheduleRole::kParmS1);
  int gathers = 0;
  for (const auto& c : s1.result.collectives)
    gathers += c.label.find("mp_allgather") != std::string::npos;
  EXPECT_GE(gathers, 2);  // forward of each block (the backward has its own)
}

// dC = ceil(1.0625 * 2 * 32 / 4) = 17 slots: S1 / S2 would split 8.5 slots to each MP rank, which
// no real buffer can hold, so --check refuses instead of moving other byte counts than the plan
// (without --check the plan runs on scratch buffers); the baseline does not split the capacity.
TEST(ExecParm, UnevenMpSplitOfTheCapacityIsRefused) {
  Scenario sc = parm8();
  sc.model.capacity_factor = 1.0625;
  EXPECT_THROW(run_once(sc, ScheduleRole::kParmS1), InputError);
  EXPECT_THROW(run_once(sc, ScheduleRole::kParmS2), InputError);
  // Without --check the plan still runs, with scratch buffers (no outputs).
  const Outcome scratch = run_once(sc, ScheduleRole::kParmS1, 1, /*check=*/false);
  EXPECT_TRUE(scratch.outputs.empty());
  EXPECT_GT(scratch.result.makespan_s, 0.0);
  const Outcome base = run_once(sc, ScheduleRole::kParmBaseline);
  for (const LayerCheck& chk : base.checks) EXPECT_EQ(chk.wrong, 0);
}

}  // namespace
}  // namespace moesim::exec
