// The binary with balanced routing and with pipeline stages by GPUs: deepep and the other a2a
// roles run balanced routing on every engine, and f = 1 gives deepep the same step as f = 0 (no
// drops); a scenario with two stages per node validates, tunes, simulates and runs on the exec
// host path under mpirun with its check passing, with an uneven parallelism.pipeline_layout too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "cli_run.hpp"

namespace {

using moesim::cli_test::kSource;
using moesim::cli_test::run;

// The line of strategy `name` in simulate's table, up to the decisions column.
std::string row(const std::string& out, const std::string& name) {
  const auto at = out.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
}

TEST(RouteStagesCli, BalancedRoutingRunsEveryA2aRoleIncludingDeepep) {
  const std::string scen = kSource + "/scenarios/exec-host-4.yaml";
  const std::string strategies =
      "--set 'strategies=[{name: linear, a2a: linear}, {name: twodh, a2a: 2dh, pipeline: 2}, "
      "{name: auto, a2a: auto}, {name: deepep, a2a: deepep}]'";
  std::vector<std::string> engines = {"analytical", "flow"};
#ifdef MOESIM_HAVE_SIMGRID
  engines.push_back("simgrid");
#endif
  for (const std::string& engine : engines) {
    std::string deepep_row[2];
    for (const int f : {0, 1}) {
      const auto r = run(fmt::format(
          "simulate '{}' --engine {} --iterations 1 --set workload.routing.distribution=balanced "
          "--set workload.routing.node_limit=1 --set model.capacity_factor={} {}",
          scen, engine, f, strategies));
      ASSERT_EQ(r.exit_code, 0) << engine << " f " << f << "\n" << r.out;
      for (const std::string name : {"linear", "twodh", "auto", "deepep"})
        EXPECT_NE(row(r.out, name), "") << name << "\n" << r.out;
      EXPECT_THAT(row(r.out, "deepep"), ::testing::HasSubstr("a2a=deepep"));
      deepep_row[f] = row(r.out, "deepep");
    }
    // Balanced routing drops nothing at f = 1: the same dispatch as the dropless one.
    EXPECT_EQ(deepep_row[0], deepep_row[1]) << engine;
  }
  // Below 1, a capacity could drop choices: deepep refuses it, naming the key.
  const auto bad =
      run(fmt::format("simulate '{}' --engine analytical --iterations 1 --set "
                      "workload.routing.distribution=balanced --set model.capacity_factor=0.5 {}",
                      scen, strategies));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, ::testing::HasSubstr("strategies[3].a2a"));
  EXPECT_THAT(bad.out, ::testing::HasSubstr("workload.routing.distribution: balanced"));
}

TEST(RouteStagesCli, TwoStagesPerNodeValidateTuneAndSimulate) {
  const std::string scen = kSource + "/tests/data/scenarios/stages-2x4-pp4.yaml";
  const auto v = run(fmt::format("validate '{}'", scen));
  ASSERT_EQ(v.exit_code, 0) << v.out;
  EXPECT_THAT(v.out, ::testing::HasSubstr("pp=4 stage(s) of 2 GPUs"));
  EXPECT_THAT(v.out, ::testing::HasSubstr("memory/GPU   baseline"));
  for (const std::string engine : {"analytical", "flow"}) {
    const auto s = run(fmt::format("simulate '{}' --engine {}", scen, engine));
    ASSERT_EQ(s.exit_code, 0) << engine << "\n" << s.out;
    EXPECT_NE(row(s.out, "baseline"), "") << s.out;
  }
  // The stage layouts of the scenario's four stages (its pp, micro-batches and memory settings
  // kept): a space the default budget completes even under the sanitizers, where the whole
  // pipeline and memory space (tune_test covers it) does not.
  const auto t =
      run(fmt::format("tune '{}' --engine analytical --keep-pipeline --keep-memory", scen));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("complete"));
  EXPECT_THAT(t.out, ::testing::HasSubstr("pp=4"));
}

// parallelism.pipeline_layout: validate prints the blocks per stage and per piece, simulate runs
// the uneven pieces, and a layout that does not fit exits 2 at the key.
TEST(RouteStagesCli, PipelineLayoutValidatesSimulatesAndRefusesWhatDoesNotFit) {
  const std::string scen = kSource + "/tests/data/scenarios/stages-2x4-pp4.yaml";
  const std::string good =
      "--set model.layers=6 --set 'parallelism={pp: 2, vp: 2, ep: 2, pipeline_layout: "
      "\"t*2|t|t|t*2\"}'";
  const auto v = run(fmt::format("validate '{}' {}", scen, good));
  ASSERT_EQ(v.exit_code, 0) << v.out;
  EXPECT_THAT(
      v.out, ::testing::HasSubstr("blocks per stage [3 3], per piece [2 1*2 2] (pipeline_layout)"));
  const auto s = run(fmt::format("simulate '{}' {} --engine analytical", scen, good));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_NE(row(s.out, "baseline"), "") << s.out;
  const auto bad = run(
      fmt::format("validate '{}' --set model.layers=6 --set 'parallelism={{pp: 2, vp: 2, ep: 2, "
                  "pipeline_layout: \"t*2|t|t|t*3\"}}'",
                  scen));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out,
              ::testing::HasSubstr("parallelism.pipeline_layout: found 7 blocks (t) in the "
                                   "pieces, expected model.layers = 6"));
}

#ifdef MOESIM_MPIEXEC
// The exec host path: each rank runs its stage's ops (two stages share a node's ranks) and the
// check compares every layer's outputs and gradients with the reference.
TEST(RouteStagesCli, TwoStagesPerNodeRunOnTheExecHostPath) {
  const std::string scen = kSource + "/tests/data/scenarios/stages-2x4-pp4.yaml";
  // detect_leaks=0: OpenMPI's components leave allocations behind at MPI_Finalize, which the
  // sanitizer job would report as this test's; exec's own leaks are covered by its unit tests.
  const std::string cmd = fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
      "MOESIM_EXEC_TIMEOUT_S=60 timeout "
      "300 '{}' -np 8 --oversubscribe '{}' exec '{}' --check 2>&1",
      MOESIM_MPIEXEC, moesim::cli_test::kBinary, scen);
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("4 MoE layer run(s)"));
  EXPECT_THAT(out, ::testing::HasSubstr("#wrong 0, max abs error"));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("drop-count mismatches 1")));
}

// exec runs 1F1B from the plan's ops, so uneven stages need nothing of their own: 3 blocks on
// stage 0 and 1 on stage 1 pass the check.
TEST(RouteStagesCli, UnevenPipelineLayoutRunsOnTheExecHostPath) {
  const std::string scen = kSource + "/tests/data/scenarios/stages-2x4-pp4.yaml";
  const std::string cmd = fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0 "
      "MOESIM_EXEC_TIMEOUT_S=60 timeout "
      "300 '{}' -np 8 --oversubscribe '{}' exec '{}' --check --set 'parallelism={{pp: 2, ep: 2, "
      "pipeline_layout: [3, 1]}}' 2>&1",
      MOESIM_MPIEXEC, moesim::cli_test::kBinary, scen);
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_THAT(out, ::testing::HasSubstr("4 MoE layer run(s)"));
  EXPECT_THAT(out, ::testing::HasSubstr("#wrong 0, max abs error"));
}
#endif

}  // namespace
