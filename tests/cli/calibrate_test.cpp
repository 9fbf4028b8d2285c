// Calibration end to end: a scenario's calibration file reaching the engines (apps/moesim/
// engine_setup) and the strategies' cost model with hand-computed effects, then `moesim calibrate`
// under mpirun -np 4 writing a file a scenario loads (#wrong 0), and `moesim exec --predict`.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "apps/moesim/engine_setup.hpp"
#include "core/calibration.hpp"
#include "core/scenario_loader.hpp"
#include "sim/compute_model.hpp"
#include "sim/engine.hpp"
#include "strategies/cost_model.hpp"
#include "topology/topology.hpp"

namespace moesim {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() /
               fmt::format("moesim_calib_{}_{}",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                           static_cast<long>(getpid()));
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream os(p);
  os << text;
}

std::string read(const fs::path& p) {
  std::ifstream is(p);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

// Two GPUs on one NVSwitch at 100 GB/s and 1 us, no per-message costs: a linear all-to-all of
// S bytes per rank sends S/2 to the peer, so the analytical formula (strategies/collectives/
// collective.hpp) gives latency + alpha + (S/2) / bw.
const char* kScenario = R"(name: cal-2gpu
cluster:
  gpu: a100-sxm-80gb
  gpus_per_node: 2
  intra_node: {kind: nvswitch, bandwidth: 100GB/s, efficiency: 1, latency: 1us}
  calibration: cal.yaml
model: {batch_per_gpu: 1, seq_len: 16, model_dim: 8, hidden_dim: 8, experts: 2, dtype: fp16}
engine: {network: analytical, message_latency: 0us, message_overhead: 0us}
strategies: [{name: baseline}]
)";

const char* kCalibration = R"(format: moesim-calibration/1
gemm:
  alpha: 2us
  beta: 1e-12s/FLOP
  efficiency:
    - {m: 64, n: 128, k: 256, efficiency: 0.5}
    - {m: 1024, n: 1024, k: 1024, efficiency: 1}
point_to_point:
  - {tier: 0, alpha: 11us, beta: 1e-11s/B}
collectives:
  - {collective: all_to_all, algo: linear, ranks: 2, alpha: 40us, beta: 1e-9s/B}
interference: 0.25
)";

double a2a_time(const Scenario& sc, const topology::Topology& topo, double bytes) {
  Plan plan(2);
  const StreamId s = plan.stream("comm");
  const GroupingId g = plan.add_grouping(Grouping{"world", {{0, 1}}});
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.algo = CollectiveAlgo::kLinear;
  spec.grouping = g;
  spec.bytes = Bytes(bytes);
  plan.add_collective(s, spec, {}, "a2a");
  const RunResult r = sim::run_plan(plan, topo, app::engine_config_from(sc, "analytical"));
  return r.collectives.at(0).duration_s();
}

TEST(CalibrationEffect, AnalyticalEngineAllToAllGainsTheCalibratedLatencyThenTheMeasuredLine) {
  const fs::path d = temp_dir();
  write(d / "s.yaml", kScenario);
  write(d / "cal.yaml", "format: moesim-calibration/1\n");
  const Scenario plain = load_scenario((d / "s.yaml").string());
  auto topo = topology::build_topology(plain.cluster);
  // No tier-0 entry: latency 0 + alpha 1 us + 500,000 B / 100 GB/s = 6 us.
  EXPECT_NEAR(a2a_time(plain, *topo, 1e6), 6e-6, 1e-12);

  const fs::path d2 = d / "calibrated";
  fs::create_directories(d2);
  write(d2 / "s.yaml", kScenario);
  write(d2 / "cal.yaml", kCalibration);
  const Scenario sc = load_scenario((d2 / "s.yaml").string());
  // The measured (all_to_all, linear, 2 ranks) line replaces the closed form on the analytical
  // engine (sim::analytical_collective_time): 40 us + 1 ns/B * 1 MB = 1,040 us.
  EXPECT_NEAR(a2a_time(sc, *topo, 1e6), 1040e-6, 1e-12);
  // Without the line, the closed form with the measured tier-0 alpha 11 us - the topology's
  // 1 us = 10 us per message on top: 16 us.
  write(d2 / "cal_no_line.yaml",
        std::string(kCalibration).substr(0, std::string(kCalibration).find("collectives:")));
  Scenario no_line = sc;
  no_line.cluster.calibration_path = (d2 / "cal_no_line.yaml").string();
  EXPECT_NEAR(a2a_time(no_line, *topo, 1e6), 16e-6, 1e-12);
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  EXPECT_DOUBLE_EQ(cfg.net.message_latency_s, 10e-6);
  EXPECT_DOUBLE_EQ(cfg.compute.interference, 0.25);
  fs::remove_all(d);
}

TEST(CalibrationEffect, CostModelAndComputeModelUseTheMeasuredLines) {
  const fs::path d = temp_dir();
  write(d / "s.yaml", kScenario);
  write(d / "cal.yaml", kCalibration);
  const Scenario sc = load_scenario((d / "s.yaml").string());
  auto topo = topology::build_topology(sc.cluster);
  const strategies::CostModel cost(sc, *topo);
  // The measured (all_to_all, linear, 2 ranks) line: 40 us + 1 ns/B * 1 MB = 1,040 us.
  EXPECT_DOUBLE_EQ(cost.a2a_time(CollectiveAlgo::kLinear, Bytes(1e6)).value(), 40e-6 + 1e-3);
  // GEMM 64 x 128 x 256 (a measured shape at efficiency 0.5 of the best): 2 us + 2 * 64 * 128 *
  // 256 FLOP * 1 ps / 0.5 = 2 + 8.388608 us (the fp16 traffic, 114,688 B at ~2 TB/s, is far
  // below).
  const GemmShape g{64, 128, 256, 1};
  EXPECT_DOUBLE_EQ(cost.gemm_time(g).value(), 2e-6 + 4194304e-12 / 0.5);
  // The simulator's compute model charges the same (same function, same calibration).
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  const sim::ComputeModel cm(topo->gpu(), sc.model.dtype, cfg.compute);
  ComputeSpec spec;
  spec.cls = ComputeClass::kGemm;
  spec.gemm = g;
  EXPECT_DOUBLE_EQ(cm.duration(spec).value(), cost.gemm_time(g).value());
  fs::remove_all(d);
}

TEST(CalibrationEffect, FileRemovedAfterLoadingIsAnErrorAtTheCalibrationKey) {
  const fs::path d = temp_dir();
  write(d / "s.yaml", kScenario);
  write(d / "cal.yaml", kCalibration);
  const Scenario sc = load_scenario((d / "s.yaml").string());
  fs::remove(d / "cal.yaml");
  // Another path than the tests above (the loader caches per path).
  Scenario moved = sc;
  moved.cluster.calibration_path = (d / "gone.yaml").string();
  try {
    app::engine_config_from(moved, "");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("s.yaml:6:"), HasSubstr("cluster.calibration"),
                                HasSubstr("does not exist")));
  }
  fs::remove_all(d);
}

#ifdef MOESIM_MPIEXEC
struct RunOutput {
  int exit_code = -1;
  std::string out;
};

RunOutput run(const std::string& cmd) {
  RunOutput r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string mpirun(int np) {
  return fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 MOESIM_EXEC_TIMEOUT_S=60 '{}' -np "
      "{} --oversubscribe '{}'",
      MOESIM_MPIEXEC, np, MOESIM_BINARY);
}

TEST(CalibrateCli, QuickRunUnderMpirunWritesAFileAScenarioLoads) {
  const fs::path d = temp_dir();
  const std::string scenario = std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-host-4.yaml";
  const fs::path out = d / "calib.yaml";
  const RunOutput r =
      run(fmt::format("{} calibrate '{}' --quick --out '{}'", mpirun(4), scenario, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("all_to_all linear"));
  EXPECT_THAT(r.out, HasSubstr("all_to_all 2dh"));  // 2 nodes x 2: 2DH applies
  EXPECT_THAT(r.out, HasSubstr("#wrong over all lines: 0"));
  const Calibration cal = load_calibration(out.string());
  EXPECT_EQ(cal.ranks, 4);
  EXPECT_EQ(cal.backend, "mpi");
  EXPECT_TRUE(cal.gemm.alpha_gemm.has_value());
  EXPECT_GT(*cal.gemm.beta_gemm_s_per_flop, 0);
  EXPECT_FALSE(cal.gemm.efficiency_table.empty());
  ASSERT_NE(cal.tier(0), nullptr);  // 0 <-> 1 inside a node
  ASSERT_NE(cal.tier(1), nullptr);  // 0 <-> 2 across the switch
  EXPECT_NE(cal.collective(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, 4), nullptr);
  EXPECT_NE(cal.collective(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 4), nullptr);
  ASSERT_TRUE(cal.interference.has_value());
  EXPECT_GE(*cal.interference, 0);

  // A scenario pointing at it loads and simulates, and `exec --predict` uses it.
  std::string text = read(scenario);
  text.replace(text.find("  intra_node:"), 0, "  calibration: calib.yaml\n");
  write(d / "s.yaml", text);
  const fs::path json = d / "exec.json";
  const RunOutput e =
      run(fmt::format("{} exec '{}' --predict --iterations 1 --strategy baseline "
                      "--json '{}'",
                      mpirun(4), (d / "s.yaml").string(), json.string()));
  ASSERT_EQ(e.exit_code, 0) << e.out;
  EXPECT_THAT(e.out, AllOf(HasSubstr("# predict: baseline"), HasSubstr("all_to_all"),
                           HasSubstr("step 0"), HasSubstr("calib.yaml"),
                           HasSubstr("# compared: measured = this run's ops on this machine (the "
                                     "host path: CPU code through MPI)"),
                           HasSubstr("with the calibration's measured rates")));
  EXPECT_THAT(e.out, Not(HasSubstr("to predict this machine rather than the datasheet")));
  // Without the calibration it says how to get one.
  const RunOutput plain =
      run(fmt::format("{} exec '{}' --predict --iterations 1 --strategy "
                      "baseline",
                      mpirun(4), scenario));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_THAT(plain.out, AllOf(HasSubstr("from its datasheet figures"),
                               HasSubstr("to predict this machine rather than the datasheet: "
                                         "mpirun -np 4 moesim calibrate")));
  const auto j = nlohmann::json::parse(read(json));
  ASSERT_TRUE(j.contains("predict"));
  EXPECT_EQ(j["predict"]["engine"], "flow");
  ASSERT_EQ(j["predict"]["strategies"].size(), 1u);
  const auto& st = j["predict"]["strategies"][0];
  EXPECT_EQ(st["strategy"], "baseline");
  ASSERT_EQ(st["steps"].size(), 1u);
  EXPECT_GT(st["steps"][0]["measured_s"].get<double>(), 0);
  EXPECT_GT(st["steps"][0]["predicted_s"].get<double>(), 0);
  EXPECT_GT(st["classes"]["all_to_all"]["predicted_s"].get<double>(), 0);
  fs::remove_all(d);
}

// Rank 0 checks the output path before the scenario's GPU count is compared with the ranks, and
// every rank leaves through exit 2 together (none waits for the others forever).
TEST(CalibrateCli, UnwritableOutputExitsTwoOnEveryRankBeforeTheRun) {
  const fs::path d = temp_dir();
  const std::string m = (d / "missing-subdir").string();
  const std::string q = std::string(MOESIM_SOURCE_DIR) + "/scenarios/quickstart.yaml";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fmt::format("{} exec '{}' --json '{}/e.json'", mpirun(2), q, m), "--json"},
      {fmt::format("{} calibrate --quick --out '{}/c.yaml'", mpirun(2), m), "--out"}};
  for (const auto& [cmd, flag] : cases) {
    const RunOutput r = run(cmd);
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr(fmt::format("moesim: error: {} {}/", flag, m))) << cmd;
    EXPECT_THAT(r.out, HasSubstr(fmt::format("the directory '{}' does not exist", m))) << cmd;
    EXPECT_FALSE(fs::exists(m)) << cmd;
  }
  fs::remove_all(d);
}

// Pipeline stages on the real backend: refused as invalid input naming the key where no data
// path runs them (the GPU path), on every rank, before the rank count is compared. (The host
// path runs every data path in stages: exec_check_pipeline_stages[_routed|_sharded|_parm].)
TEST(CalibrateCli, ExecRefusesPipelineStagesWhereNoDataPathRunsThem) {
  const std::string q = std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-host-4.yaml";
  const std::string edit = "--set parallelism.pp=2 --set parallelism.ep=2 --backend nccl";
  const RunOutput r = run(fmt::format("{} exec '{}' {}", mpirun(2), q, edit));
  EXPECT_EQ(r.exit_code, 2) << edit << "\n" << r.out;
  EXPECT_THAT(r.out, HasSubstr("parallelism.pp: found 2 pipeline stages, expected 1")) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--backend nccl")) << r.out;
}

// a2a: deepep runs on the host path (exec/deepep_path.hpp) with one pipeline chunk: a strategy
// that pipelines it is refused as invalid input, naming the setting to change.
TEST(CalibrateCli, ExecRefusesAPipelinedDeepepDispatch) {
  const std::string q = std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-host-4.yaml";
  const RunOutput r =
      run(fmt::format("{} exec '{}' --iterations 1 --set model.capacity_factor=0 --set "
                      "'strategies=[{{name: d, a2a: deepep, pipeline: 2}}]'",
                      mpirun(4), q));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("a2a deepep on the real backend runs with pipeline degree 1 "
                               "(found 2)"))
      << r.out;
}

TEST(CalibrateCli, WrongRankCountIsInvalidInput) {
  const RunOutput r = run(fmt::format("{} calibrate '{}/scenarios/exec-host-4.yaml' --quick",
                                      mpirun(2), MOESIM_SOURCE_DIR));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("has 4 GPUs"));
}
#endif

}  // namespace
}  // namespace moesim
