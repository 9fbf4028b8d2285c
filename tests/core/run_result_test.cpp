// summarize_run's compute-class breakdown (core/run_result.hpp) on a hand-built plan with hand-set
// times: each group is the mean over ranks of the union of its ops' intervals.
#include "core/run_result.hpp"

#include <gtest/gtest.h>

namespace moesim {
namespace {

TEST(RunResultBreakdown, ComputeClassesByHand) {
  Plan plan(2);
  const StreamId main = plan.stream("compute");
  const StreamId side = plan.stream("side");
  auto spec = [](ComputeClass c, bool recompute = false) {
    ComputeSpec s;
    s.cls = c;
    s.recompute = recompute;
    return s;
  };
  struct Timed {
    OpId id;
    double start, end;
  };
  std::vector<Timed> t;
  const RankSet both = RankSet::all(2);
  t.push_back({plan.add_compute(both, main, spec(ComputeClass::kGemm), {}, "gemm"), 0, 1});
  t.push_back({plan.add_compute(both, main, spec(ComputeClass::kAttention), {}, "attn"), 1, 3});
  t.push_back({plan.add_compute(both, main, spec(ComputeClass::kNorm, true), {}, "norm"), 3, 4});
  t.push_back({plan.add_compute(both, main, spec(ComputeClass::kOptimizer), {}, "opt"), 4, 4.5});
  t.push_back({plan.add_compute(both, main, spec(ComputeClass::kGate), {}, "gate"), 4.5, 5});
  const OpId encode =
      plan.add_compute(RankSet::list({0}), main, spec(ComputeClass::kEncode), {}, "encode");
  // Rank 1: a GEMM on a second stream over [0.5, 1.5], overlapping the GEMM and the attention.
  const OpId side_gemm =
      plan.add_compute(RankSet::list({1}), side, spec(ComputeClass::kGemm), {}, "side");
  RunResult r;
  init_run_result(plan, r);
  for (const Timed& x : t)
    for (int p = 0; p < 2; ++p) {
      r.start_s[r.entry(x.id, p)] = x.start;
      r.end_s[r.entry(x.id, p)] = x.end;
    }
  r.start_s[r.entry(encode, 0)] = 5;
  r.end_s[r.entry(encode, 0)] = 6;
  r.start_s[r.entry(side_gemm, 0)] = 0.5;
  r.end_s[r.entry(side_gemm, 0)] = 1.5;
  summarize_run(plan, r);
  const Breakdown& b = r.breakdown;
  // Rank 0: gemm 1 + gate 0.5; rank 1: [0, 1.5] + gate 0.5 (the overlap counted once).
  EXPECT_DOUBLE_EQ(b.gemm_s, (1.5 + 2.0) / 2);
  EXPECT_DOUBLE_EQ(b.attention_s, 2);
  EXPECT_DOUBLE_EQ(b.memory_bound_s, (2.0 + 1.0) / 2);  // norm on both, the encode on rank 0
  EXPECT_DOUBLE_EQ(b.optimizer_s, 0.5);
  EXPECT_DOUBLE_EQ(b.recompute_s, 1);  // the norm, also in memory_bound_s
  EXPECT_DOUBLE_EQ(b.compute_s, (6.0 + 5.0) / 2);
  EXPECT_DOUBLE_EQ(b.comm_s, 0);
  EXPECT_DOUBLE_EQ(r.makespan_s, 6);
  // One stream: the groups add up to compute_s (rank 0); with rank 1's second stream the
  // GEMM / attention overlap [1, 1.5] counts in both.
  EXPECT_DOUBLE_EQ(b.gemm_s + b.attention_s + b.memory_bound_s + b.optimizer_s,
                   b.compute_s + 0.5 / 2);
}

}  // namespace
}  // namespace moesim
