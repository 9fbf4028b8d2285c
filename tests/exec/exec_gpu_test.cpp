// The executor's GPU path (exec/cuda_executor.hpp) on one GPU, run by CTest under
// `mpirun -np 1` and labelled `gpu`: every test skips (GTEST_SKIP) without a CUDA device, so the
// suite passes on CPU-only machines and does the real checks under scripts/gpu-check.sh.
//  * scenarios/exec-gpu-1.yaml (fp16, EP = 1) at pipeline degrees 1, 2, 4: --check finds no wrong
//    value and the drop counts match the reference; the outputs of r = 1, 2, 4 agree within the
//    fp16 tolerance (chunking changes GEMM shapes, not the maths);
//  * the same scenario in fp32: the GPU path's outputs equal the host path's within 1e-4;
//  * the RunResult from CUDA events: finite, start <= end, ops of one stream do not overlap.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/scenario_loader.hpp"
#include "exec/calibrate.hpp"
#include "exec/executor.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/nccl_communicator.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/workload/workload.hpp"
#include "tests/exec/mpi_test_main.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
namespace {

Scenario gpu1() {
  return load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-gpu-1.yaml");
}

class ExecGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

using Outcome = ExecOutcome;

Outcome run_once(const Scenario& sc, Communicator& comm, int r, bool check) {
  strategies::Decision d;
  d.pipeline_degree = r;
  return run_step(sc, comm, d, check);
}

TEST_F(ExecGpu, Fp16CheckPassesAtEveryPipelineDegree) {
  Scenario sc = gpu1();
  NcclCommunicator comm(*g_session);
  std::vector<std::vector<float>> first;
  for (int r : {1, 2, 4}) {
    SCOPED_TRACE("r=" + std::to_string(r));
    Outcome o = run_once(sc, comm, r, true);
    ASSERT_EQ(o.checks.size(), 2u);
    for (const auto& c : o.checks) {
      EXPECT_EQ(c.wrong, 0) << "max abs error " << c.max_abs_error;
      EXPECT_EQ(c.dropped, c.expected_dropped);
      EXPECT_GT(c.dropped, 0);  // capacity factor 1.0 drops some choices
    }
    if (first.empty()) {
      first = o.outputs;
      continue;
    }
    ASSERT_EQ(o.outputs.size(), first.size());
    for (size_t l = 0; l < first.size(); ++l)
      for (size_t i = 0; i < first[l].size(); ++i)
        ASSERT_LE(std::fabs(o.outputs[l][i] - first[l][i]),
                  2 * check_tolerance(kernels::DType::kF16) * (1 + std::fabs(first[l][i])));
  }
}

TEST_F(ExecGpu, Fp32OutputsMatchTheHostPath) {
  Scenario sc = gpu1();
  sc.model.dtype = Dtype::kFp32;
  // The host path runs single-threaded CPU GEMMs: a quarter of the tokens and hidden size.
  sc.model.seq_len /= 4;
  sc.model.hidden_dim /= 4;
  NcclCommunicator nccl(*g_session);
  MpiCommunicator mpi;
  Outcome dev = run_once(sc, nccl, 2, false), host = run_once(sc, mpi, 2, false);
  ASSERT_EQ(dev.outputs.size(), host.outputs.size());
  for (size_t l = 0; l < dev.outputs.size(); ++l) {
    ASSERT_EQ(dev.outputs[l].size(), host.outputs[l].size());
    double worst = 0;
    for (size_t i = 0; i < dev.outputs[l].size(); ++i)
      worst = std::max(worst, std::fabs(double(dev.outputs[l][i]) - host.outputs[l][i]) /
                                  (1 + std::fabs(double(host.outputs[l][i]))));
    EXPECT_LE(worst, 1e-4) << "layer " << l;
  }
  EXPECT_EQ(dev.result.backend, "nccl");
  EXPECT_EQ(host.result.backend, "mpi");
}

// Dropless capacity on one GPU (every choice kept; routed all_to_allv layers where the plan makes
// them): the layer program on the device against the host path's, fp32, and --check on the GPU.
TEST_F(ExecGpu, Fp32DroplessLayersMatchTheHostPathAndPassTheCheck) {
  Scenario sc = gpu1();
  sc.model.dtype = Dtype::kFp32;
  sc.model.capacity_factor = 0;  // dropless
  sc.model.seq_len /= 4;
  sc.model.hidden_dim /= 4;
  NcclCommunicator nccl(*g_session);
  MpiCommunicator mpi;
  Outcome dev = run_once(sc, nccl, 1, true), host = run_once(sc, mpi, 1, false);
  ASSERT_EQ(dev.checks.size(), 2u);
  for (const auto& c : dev.checks) {
    EXPECT_GT(c.compared, 0);
    EXPECT_EQ(c.wrong, 0) << "max abs error " << c.max_abs_error;
    EXPECT_EQ(c.dropped, 0);
  }
  ASSERT_EQ(dev.outputs.size(), host.outputs.size());
  for (size_t l = 0; l < dev.outputs.size(); ++l) {
    ASSERT_EQ(dev.outputs[l].size(), host.outputs[l].size());
    for (size_t i = 0; i < dev.outputs[l].size(); ++i)
      ASSERT_LE(std::fabs(dev.outputs[l][i] - host.outputs[l][i]),
                1e-4 * (1 + std::fabs(host.outputs[l][i])))
          << "layer " << l << " element " << i;
  }
}

TEST_F(ExecGpu, EventTimesAreOrderedPerStream) {
  Scenario sc = gpu1();
  NcclCommunicator comm(*g_session);
  Outcome o = run_once(sc, comm, 4, false);
  const RunResult& r = o.result;
  EXPECT_GT(r.makespan_s, 0.0);
  std::map<StreamId, double> last_end;
  for (const Op& op : o.plan.ops()) {  // plain plan: issue order = id order
    const double s = r.start_s[r.entry(op.id, 0)], e = r.end_s[r.entry(op.id, 0)];
    ASSERT_TRUE(std::isfinite(s) && std::isfinite(e));
    EXPECT_LE(0.0, s);
    EXPECT_LE(s, e) << op.label;
    if (last_end.count(op.stream)) {
      EXPECT_GE(s, last_end[op.stream]) << op.label;
    }
    last_end[op.stream] = e;
  }
  // The expert GEMMs take time on the device: the fc1 ops are not empty.
  double fc1 = 0;
  for (const Op& op : o.plan.ops())
    if (op.label.find("fwd.expert.fc1") != std::string::npos)
      fc1 += r.end_s[r.entry(op.id, 0)] - r.start_s[r.entry(op.id, 0)];
  EXPECT_GT(fc1, 0.0);
}

// `moesim calibrate --backend nccl` times cuBLAS on the GPU: a 4,096^3 fp16 GEMM (137 GFLOP)
// runs between 100 TFLOP/s (no CPU comes near it, so it did run on the tensor cores) and the
// H100 / H200 dense fp16 peak of 990 TFLOP/s (a time shorter than that would be a timer that
// does not wait for the kernel).
TEST_F(ExecGpu, CalibrateGemmTimerTimesCublasOnTheGpu) {
  NcclCommunicator comm(*g_session);
  const GemmTimer timer = device_gemm_timer(kernels::DType::kF16, comm.device());
  timer(4096, 4096, 4096, 1);  // warm-up: cuBLAS's first call
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) t.push_back(timer(4096, 4096, 4096, 1));
  std::sort(t.begin(), t.end());
  const double flops = 2.0 * 4096.0 * 4096.0 * 4096.0;
  const double tflops = flops / t[2] * 1e-12;
  EXPECT_GT(tflops, 100.0);
  EXPECT_LT(tflops, 990.0);
  // A tiny GEMM is launch-bound: far from the large one's rate, still positive.
  const double small = timer(16, 256, 64, 1);
  EXPECT_GT(small, 0.0);
  EXPECT_LT(2.0 * 16 * 256 * 64 / small * 1e-12, tflops);
  // Eight small GEMMs in one strided-batched call cost far less than eight calls.
  timer(16, 256, 64, 8);
  EXPECT_LT(timer(16, 256, 64, 8), 4.0 * small);
  EXPECT_FALSE(device_name(comm.device()).empty());
}

}  // namespace
}  // namespace moesim::exec
