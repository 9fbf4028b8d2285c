// Runs the moesim binary and checks what a user sees: exit codes (0 / 1 / 2), error messages with
// file:line and key, and JSON outputs against expected files.
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
const std::string kSource = MOESIM_SOURCE_DIR;
const std::string kBinary = MOESIM_BINARY;

struct RunOutput {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

// timeout_s > 0: killed after that long (exit code 124), so a hang fails instead of stalling.
RunOutput run(const std::string& args, int timeout_s = 0) {
  std::string cmd = fmt::format(
      "{}'{}' {} 2>&1", timeout_s > 0 ? fmt::format("timeout {} ", timeout_s) : "", kBinary, args);
  RunOutput r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Column `column` (0 = step(ms), 4 = a2a(ms)) of strategy `name`'s row in simulate's table; NaN
// when the row is missing.
double table_ms(const std::string& out, const std::string& name, int column) {
  const auto at = out.find("\n" + name + " ");
  if (at == std::string::npos) return std::numeric_limits<double>::quiet_NaN();
  std::istringstream is(out.substr(at + 1));
  std::string skip;
  is >> skip;  // the name
  for (int c = 0; c < column; ++c) is >> skip;
  double ms = std::numeric_limits<double>::quiet_NaN();
  is >> ms;
  return ms;
}

std::string read_file(const fs::path& p) {
  std::ifstream is(p);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() /
               fmt::format("moesim_cli_{}_{}",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                           static_cast<long>(getpid()));
  fs::create_directories(d);
  return d;
}

// Compares JSON values, numbers with a relative tolerance (printing of doubles may differ in the
// last digit between toolchains; the values are worked out by hand in the expected files).
void expect_json_near(const nlohmann::json& want, const nlohmann::json& got,
                      const std::string& at) {
  if (want.is_number() && got.is_number()) {
    double a = want.get<double>(), b = got.get<double>();
    EXPECT_LE(std::fabs(a - b), 1e-9 * std::max(std::fabs(a), 1e-30))
        << at << ": " << a << " vs " << b;
    return;
  }
  ASSERT_EQ(want.type(), got.type()) << at;
  if (want.is_object()) {
    ASSERT_EQ(want.size(), got.size()) << at << ": keys differ: " << got.dump();
    for (auto it = want.begin(); it != want.end(); ++it) {
      ASSERT_TRUE(got.contains(it.key())) << at << ": missing key " << it.key();
      expect_json_near(it.value(), got[it.key()], at + "." + it.key());
    }
  } else if (want.is_array()) {
    ASSERT_EQ(want.size(), got.size()) << at;
    for (size_t i = 0; i < want.size(); ++i)
      expect_json_near(want[i], got[i], fmt::format("{}[{}]", at, i));
  } else {
    EXPECT_EQ(want, got) << at;
  }
}

TEST(Cli, TopoQuickstartJsonMatchesExpected) {
  fs::path dir = temp_dir();
  fs::path out = dir / "topo.json";
  auto r =
      run(fmt::format("topo '{}/scenarios/quickstart.yaml' --json '{}'", kSource, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  // The table names both tiers: 112 intra-node pairs over NVSwitch, 128 inter-node pairs. Links
  // at the catalog's achievable fractions: NVLink 300 x 0.8, HDR 25 x 0.95 GB/s; 8 NICs cut.
  EXPECT_NE(r.out.find("bisection   190 GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("intra-node  nvswitch, 240 GB/s per GPU per direction (300 GB/s x 0.80, "
                       "catalog)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("at 23.8 GB/s (25 GB/s x 0.95, catalog)"), std::string::npos) << r.out;
  // The A100's NIC generation, and its queue-pair cache: 60 peers, one GPU per NIC.
  EXPECT_NE(r.out.find("nic         cx6: ConnectX-6 HDR InfiniBand, 200 Gb/s (catalog)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("60 peers' connection state kept hot per GPU, 2.4 us more per message"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("interference 0.227 beside communication (catalog: 20 of 108 SMs"),
            std::string::npos)
      << r.out;
  auto want =
      nlohmann::json::parse(read_file(kSource + "/tests/cli/expected/topo_quickstart.json"));
  auto got = nlohmann::json::parse(read_file(out));
  expect_json_near(want, got, "$");
  fs::remove_all(dir);
}

// Outputs never replace what is not a regular file: a symlink's target gets the file (the link
// stays a link), a FIFO gets the complete content written into it (and stays a FIFO).
TEST(Cli, OutputsFollowLinksAndWriteSpecialFilesInPlace) {
  const fs::path d = temp_dir();
  const std::string topo = "topo " + kSource + "/scenarios/quickstart.yaml --json ";
  fs::create_symlink("target.json", d / "link.json");  // dangling until written
  auto r = run(topo + "'" + (d / "link.json").string() + "'", 60);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(d / "link.json")));
  ASSERT_TRUE(fs::is_regular_file(d / "target.json"));
  const std::string expected = read_file(d / "target.json");
  EXPECT_TRUE(nlohmann::json::accept(expected)) << expected;

  const fs::path fifo = d / "pipe.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A non-blocking reader first, so the writer's open succeeds; the content (under the pipe's
  // 64 KiB) waits in the pipe. A replaced FIFO leaves it empty instead of hanging the test.
  const int rd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(rd, 0);
  r = run(topo + "'" + fifo.string() + "'", 60);
  std::string got;
  std::array<char, 4096> buf{};
  for (ssize_t n; (n = read(rd, buf.data(), buf.size())) > 0;)
    got.append(buf.data(), static_cast<std::size_t>(n));
  close(rd);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_EQ(got, expected);
  fs::remove_all(d);
}

// A --set value that is not YAML names --set and the key, exit 2 (it was yaml-cpp's bare message).
TEST(Cli, SetValueThatIsNotYamlNamesTheFlag) {
  const auto r =
      run("validate " + kSource + "/scenarios/quickstart.yaml --set 'model.seq_len=[1,2'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("moesim: error: --set: model.seq_len: value '[1,2' is not YAML"),
            std::string::npos)
      << r.out;
}

// A mistyped command names the closest one and every command, exit 2.
TEST(Cli, UnknownCommandSuggestsTheClosest) {
  const auto r = run("simulat scenarios/quickstart.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("unknown command 'simulat' (did you mean 'simulate'?); expected one of "
                       "validate, topo, simulate"),
            std::string::npos)
      << r.out;
  const auto far = run("frobnicate");
  EXPECT_EQ(far.exit_code, 2) << far.out;
  EXPECT_NE(far.out.find("unknown command 'frobnicate'; expected one of"), std::string::npos)
      << far.out;
}

TEST(Cli, TopoWritesDot) {
  fs::path dir = temp_dir();
  fs::path out = dir / "g.dot";
  auto r =
      run(fmt::format("topo '{}/scenarios/quickstart.yaml' --dot '{}'", kSource, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::string dot = read_file(out);
  EXPECT_EQ(dot.rfind("graph", 0) == 0 || dot.rfind("digraph", 0) == 0, true) << dot.substr(0, 80);
  fs::remove_all(dir);
}

TEST(Cli, EveryBundledScenarioValidates) {
  int seen = 0;
  for (const std::string dir : {"/scenarios", "/scenarios/models"})
    for (const auto& e : fs::directory_iterator(kSource + dir)) {
      if (e.path().extension() != ".yaml") continue;
      auto r = run(fmt::format("validate '{}'", e.path().string()));
      EXPECT_EQ(r.exit_code, 0) << e.path() << "\n" << r.out;
      EXPECT_NE(r.out.find(": valid"), std::string::npos) << r.out;
      ++seen;
    }
  EXPECT_GE(seen, 12);
}

// A serving scenario: simulate prints its pools and a row per strategy, writes JSON and CSV; the
// per-step outputs (--trace) are refused before anything runs, and bad serving input is exit 2
// with the key.
TEST(Cli, ServingScenarioSimulatesAndWritesItsFigures) {
  const fs::path dir = temp_dir();
  const std::string scen = kSource + "/scenarios/serving-mixtral-h100.yaml";
  auto r =
      run(fmt::format("simulate '{}' --engine analytical --set serving.requests.count=200 "
                      "--json '{}/s.json' --csv '{}/s.csv'",
                      scen, dir.string(), dir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("# serving.instance: 2 instance(s) x 1 node(s), 8 GPUs each, ep 8"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("TTFT p50"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(read_file(dir / "s.json"));
  ASSERT_EQ(j["serving"].size(), 2u);
  EXPECT_EQ(j["serving"][0]["strategy"], "grouped");
  EXPECT_EQ(j["serving"][0]["requests"]["count"], 200);
  EXPECT_GT(j["serving"][0]["tpot_s"]["p50"].get<double>(), 0);
  const std::string csv = read_file(dir / "s.csv");
  EXPECT_EQ(csv.rfind("scenario,strategy,disaggregated,requests,ttft_p50_s", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  r = run(fmt::format("simulate '{}' --trace '{}/t.json'", scen, dir.string()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--trace: not for a serving scenario"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "t.json"));
  r = run(fmt::format("simulate '{}' --set serving.instance.ep=3", scen));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("serving.instance.ep"), std::string::npos) << r.out;
  // Commands that work on a plain step refuse a serving deployment instead of answering for it.
  for (const std::string cmd : {"compare"}) {
    r = run(fmt::format("{} '{}'", cmd, scen));
    EXPECT_EQ(r.exit_code, 2) << cmd << r.out;
    EXPECT_NE(r.out.find(cmd + " works on a scenario's training or batch step, not a serving "
                               "deployment"),
              std::string::npos)
        << r.out;
  }
  fs::remove_all(dir);
}

// The model presets simulate on every engine. Reduced to a few blocks and a smaller
// cluster (the same EP group, fewer DP replicas) so that the three engines run in seconds; the
// full presets' figures are in scenarios/README.md.
// --chakra: a directory of per-rank traces per strategy after the run, or exit 2 before it when
// the directory holds something else (untouched). Without protobuf the flag says so (exit 2).
TEST(Cli, ChakraWritesATracePerRankOrRefusesAForeignDirectory) {
  const std::filesystem::path d =
      std::filesystem::temp_directory_path() / fmt::format("moesim-cli-chakra-{}", ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d / "theirs");
  std::ofstream(d / "theirs" / "keep.txt") << "x\n";
  const std::string scen = kSource + "/scenarios/exec-host-4.yaml";
  auto r = run(fmt::format("simulate '{}' --engine analytical --quiet --chakra '{}'", scen,
                           (d / "theirs").string()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--chakra"), std::string::npos) << r.out;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(d / "theirs"),
                          std::filesystem::directory_iterator()),
            1);
  r = run(fmt::format("simulate '{}' --engine analytical --quiet --strategy baseline --chakra '{}'",
                      scen, (d / "et").string()));
  if (r.out.find("without protobuf") != std::string::npos) {
    EXPECT_EQ(r.exit_code, 2);
  } else {
    ASSERT_EQ(r.exit_code, 0) << r.out;
    for (int rank = 0; rank < 4; ++rank)
      EXPECT_GT(std::filesystem::file_size(d / "et" / "baseline" / fmt::format("et.{}.et", rank)),
                0u);
    EXPECT_FALSE(std::filesystem::exists(d / "et" / "baseline" / "et.4.et"));
    EXPECT_TRUE(std::filesystem::exists(d / "et" / "moesim_chakra.json"));
  }
  std::filesystem::remove_all(d);
}

// Every strategy family on two pipeline stages with two micro-batches: Parm's fused schedules
// (whose backward lists a gradient all-reduce among the layer's ops), Lina's packing and priority,
// inference placement, sharded experts, TA-MoE routing.
TEST(Cli, EveryStrategyFamilyRunsOnPipelineStages) {
  for (const std::string name :
       {"a100-40gb-4x4", "parm-rtx2080ti-8x4", "lina-a100-4x4", "lina-inference",
        "nvlink-ring-sharded-2x4", "tamoe-tree", "quickstart"}) {
    auto r = run(fmt::format(
        "simulate '{}/scenarios/{}.yaml' --engine analytical --iterations 1 --quiet --set "
        "parallelism.pp=2 --set parallelism.ep=auto --set parallelism.dp=1 --set "
        "model.micro_batches=2 --set model.layers=4",
        kSource, name));
    EXPECT_EQ(r.exit_code, 0) << name << "\n" << r.out;
    EXPECT_NE(r.out.find("fastest:"), std::string::npos) << name << r.out;
  }
}

TEST(Cli, ModelPresetsSimulateOnEveryEngine) {
  const std::vector<std::pair<std::string, std::string>> presets = {
      {"mixtral-8x7b", "--set model.layers=2 --set cluster.nodes=2"},
      {"qwen3-235b-a22b", "--set model.layers=2 --set cluster.nodes=8"},
      // Two stages of 4 nodes (EP 32), 2 micro-batches: the 1F1B plan on every engine.
      {"deepseek-v3",
       "--set model.layers=5 --set cluster.nodes=8 --set parallelism.pp=2 --set "
       "parallelism.ep=32 --set model.micro_batches=2"}};
  std::vector<std::string> engines = {"analytical", "flow"};
#ifdef MOESIM_HAVE_SIMGRID
  engines.push_back("simgrid");
#endif
  for (const auto& [name, edits] : presets)
    for (const auto& engine : engines) {
      auto r = run(fmt::format("simulate '{}/scenarios/models/{}.yaml' --engine {} {} --quiet",
                               kSource, name, engine, edits));
      EXPECT_EQ(r.exit_code, 0) << name << " " << engine << "\n" << r.out;
      EXPECT_NE(r.out.find("fastest:"), std::string::npos) << name << " " << engine << r.out;
    }
}

#ifdef MOESIM_HAVE_SIMGRID
// SimGrid's ptask model can leave an activity a few bytes short, due sooner than the clock can
// resolve (clock + d == clock); moesim then asked SimGrid to run to the current time forever.
// This reduced DeepSeek-V3 (128 GPUs, 2 blocks, 1 micro-batch) stalled so in its backward at
// 82.7 ms: it must finish, and near the per-flow reference (one rate per ptask: not exact).
TEST(Cli, SimgridPtaskFinishesAnActivityDueWithinTheClocksRounding) {
  const std::string edits =
      "--strategy baseline --set model.micro_batches=1 --set parallelism.pp=1 --set "
      "cluster.nodes=16 --set model.layers=2 --set model.first_dense_layers=1 --quiet";
  std::map<std::string, double> step_ms;
  for (const std::string mode : {"ptask", "per_flow"}) {
    auto r = run(
        fmt::format(
            "simulate '{}/scenarios/models/deepseek-v3.yaml' --engine simgrid --simgrid-mode {} {}",
            kSource, mode, edits),
        /*timeout_s=*/120);
    ASSERT_EQ(r.exit_code, 0) << mode << "\n" << r.out;
    step_ms[mode] = table_ms(r.out, "baseline", 0);
    ASSERT_FALSE(std::isnan(step_ms[mode])) << r.out;
  }
  EXPECT_NEAR(step_ms["ptask"], step_ms["per_flow"], 0.02 * step_ms["per_flow"]);

  // The same after an earlier run in the process (the SimGrid clock then starts at base > 0,
  // and base + t can round below an event the model reported due by t): Qwen3 with 2 blocks,
  // 2dh after the baseline, stalled so. 2dh's step is the one it has alone.
  const std::string qwen = fmt::format(
      "simulate '{}/scenarios/models/qwen3-235b-a22b.yaml' --engine simgrid --simgrid-mode ptask "
      "--set model.layers=2 --quiet",
      kSource);
  std::map<std::string, double> twodh_ms;
  for (const std::string which : {"--strategy baseline --strategy 2dh", "--strategy 2dh"}) {
    auto r = run(qwen + " " + which, /*timeout_s=*/120);
    ASSERT_EQ(r.exit_code, 0) << which << "\n" << r.out;
    twodh_ms[which] = table_ms(r.out, "2dh", 0);
    ASSERT_FALSE(std::isnan(twodh_ms[which])) << r.out;
  }
  EXPECT_GT(twodh_ms["--strategy 2dh"], 0);
  EXPECT_EQ(twodh_ms["--strategy baseline --strategy 2dh"], twodh_ms["--strategy 2dh"]);
}
#endif

// a2a: deepep (DeepEP's per-node dispatch) on 2 nodes x 2 GPUs, 8 experts, top-2, node_limit 1:
// every token's two experts are on one node, so the routed all_to_allv sends it there twice and
// deepep once (then forwards it over NVLink when its experts are on the two GPUs of that node):
// the inter-node bytes halve. Both engines agree that deepep's all-to-all time is well below the
// routed one's. deepep refuses a capacity factor other than 0 (it is dropless), naming the key.
TEST(Cli, DeepepDispatchSendsATokenOncePerNode) {
  const std::string scen = kSource + "/scenarios/exec-host-4.yaml";
  const std::string edits =
      "--iterations 1 --set model.capacity_factor=0 --set workload.routing.node_limit=1 "
      "--set model.model_dim=4096 --set model.hidden_dim=8192 --set model.seq_len=2048 --set "
      "'strategies=[{name: routed, routing: faster_moe_hir, faster_moe_hir: {max_offnode_share: "
      "1.0}}, {name: deepep, a2a: deepep}]'";
  std::map<std::string, std::map<std::string, double>> a2a_ms;
  for (const std::string engine : {"analytical", "flow"}) {
    auto r = run(fmt::format("simulate '{}' --engine {} {}", scen, engine, edits));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    for (const std::string name : {"routed", "deepep"}) {
      a2a_ms[engine][name] = table_ms(r.out, name, 4);  // step, p50, p95, moe, a2a(ms)
      ASSERT_FALSE(std::isnan(a2a_ms[engine][name])) << r.out;
    }
    EXPECT_LT(a2a_ms[engine]["deepep"], 0.7 * a2a_ms[engine]["routed"]) << engine << r.out;
    EXPECT_GT(a2a_ms[engine]["deepep"], 0.4 * a2a_ms[engine]["routed"]) << engine << r.out;
  }
  EXPECT_NEAR(a2a_ms["flow"]["deepep"], a2a_ms["analytical"]["deepep"],
              0.1 * a2a_ms["flow"]["deepep"]);

  // The same dispatch as one collective (nccl-tests columns): at 64 MiB per GPU, deepep well
  // under linear's time.
  std::map<std::string, double> us;
  for (const std::string algo : {"linear", "deepep"}) {
    auto r =
        run(fmt::format("simulate '{}' --collective all_to_allv --size 64MiB --skew zipf:1.0 "
                        "--set workload.routing.node_limit=1 --algo {}",
                        scen, algo));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto at = r.out.find(" " + algo + " ");
    ASSERT_NE(at, std::string::npos) << r.out;
    us[algo] = std::stod(r.out.substr(at + algo.size() + 2));
  }
  EXPECT_LT(us["deepep"], 0.7 * us["linear"]);

  auto bad =
      run(fmt::format("simulate '{}' --engine analytical --iterations 1 --set "
                      "'strategies=[{{name: d, a2a: deepep}}]'",
                      scen));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_THAT(bad.out, ::testing::HasSubstr("strategies[0].a2a"));
  EXPECT_THAT(bad.out, ::testing::HasSubstr("expected model.capacity_factor: 0"));
}

// simulate shares one sample cache among a scenario's strategies (apps/moesim/stacks.hpp): each
// strategy's row must equal its row when it runs alone (its own sampling), with skewed routing,
// drops (f = 1) and pipelined strategies (dC rounded to r) among them, over 2 iterations.
TEST(Cli, StrategiesSharingSampledCountsMatchTheirRunsAlone) {
  const std::string scen = kSource + "/scenarios/exec-host-4.yaml";
  const std::string edits =
      "--engine analytical --iterations 2 --set workload.routing.distribution=zipf "
      "--set workload.routing.skew=1.2 --quiet";
  auto all = run(fmt::format("simulate '{}' {}", scen, edits));
  ASSERT_EQ(all.exit_code, 0) << all.out;
  int compared = 0;
  for (const std::string name : {"baseline", "2dh-r2", "pipemoe", "tutel"}) {
    auto alone = run(fmt::format("simulate '{}' {} --strategy {}", scen, edits, name));
    ASSERT_EQ(alone.exit_code, 0) << alone.out;
    // The row up to the speedup column (alone prints "-" there).
    auto row = [&](const std::string& out) {
      const auto at = out.find("\n" + name + " ");
      EXPECT_NE(at, std::string::npos) << out;
      const std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
      std::istringstream is(line);
      std::string cols, x;
      for (int c = 0; c < 7 && is >> x; ++c) cols += x + " ";
      return cols;
    };
    EXPECT_EQ(row(all.out), row(alone.out)) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 4);
}

// Every file in tests/cli/bad starts with "# expect: <text>": validate must exit 2 with one line
// naming the file and a line number, and containing <text>.
TEST(Cli, BadInputExitsTwoWithLocation) {
  int seen = 0;
  for (const auto& e : fs::directory_iterator(kSource + "/tests/cli/bad")) {
    std::ifstream is(e.path());
    std::string first;
    std::getline(is, first);
    ASSERT_EQ(first.rfind("# expect: ", 0), 0u) << e.path();
    std::string expect = first.substr(10);
    auto r = run(fmt::format("validate '{}'", e.path().string()));
    EXPECT_EQ(r.exit_code, 2) << e.path() << "\n" << r.out;
    std::string where = e.path().filename().string() + ":";
    size_t pos = r.out.find(where);
    ASSERT_NE(pos, std::string::npos) << r.out;
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(r.out[pos + where.size()]))) << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << "expected '" << expect << "' in " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
    ++seen;
  }
  EXPECT_GE(seen, 8);
}

TEST(Cli, MissingFileExitsTwo) {
  auto r = run("validate /nonexistent/scenario.yaml");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/scenario.yaml"), std::string::npos) << r.out;
}

TEST(Cli, BadCommandLineExitsTwo) {
  EXPECT_EQ(run("topo --no-such-flag").exit_code, 2);
  EXPECT_EQ(run("no-such-command").exit_code, 2);
}

// An output file that cannot be written fails before the run, not after it: exit 2, the
// flag and the path named, nothing run or printed before, nothing created.
TEST(Cli, UnwritableOutputExitsTwoBeforeTheRun) {
  const std::string q = kSource + "/scenarios/quickstart.yaml";
  auto r = run(fmt::format("simulate '{}' --json /nonexistent/dir/x.json", q));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(r.out,
            "moesim: error: --json /nonexistent/dir/x.json: cannot write the file there: the "
            "directory '/nonexistent/dir' does not exist (create it first)\n");

  fs::path dir = temp_dir();
  const std::string m = (dir / "missing-subdir").string();
  {
    std::ofstream sweep(dir / "s.yaml");
    sweep << "base: " << q << "\nset: {engine.network: analytical}\naxes:\n  model.top_k: [1]\n";
  }
  // Every command and flag that writes a file.
  std::vector<std::pair<std::string, std::string>> cases = {
      {fmt::format("topo '{}' --json '{}/t.json'", q, m), "--json"},
      {fmt::format("topo '{}' --dot '{}/t.dot'", q, m), "--dot"},
      {fmt::format("simulate '{}' --csv '{}/s.csv'", q, m), "--csv"},
      {fmt::format("simulate '{}' --trace '{}/t.json'", q, m), "--trace"},
      {fmt::format("simulate '{}' --collective all_to_all --size 1MiB --json '{}/c.json'", q, m),
       "--json"},
      {fmt::format("compare '{}' --json '{}/c.json'", q, m), "--json"},
      {fmt::format("compare '{}' --csv '{}/c.csv'", q, m), "--csv"},
      {fmt::format("compare '{}' --plot '{}/c.svg'", q, m), "--plot"},
      {fmt::format("compare '{}' --report '{}/c.html'", q, m), "--report"},
      {fmt::format("sweep '{}/s.yaml' --csv '{}/o.csv'", dir.string(), m), "--csv"},
      {fmt::format("sweep '{}/s.yaml' --json '{}/o.json'", dir.string(), m), "--json"},
      {fmt::format("sweep '{}/s.yaml' --report '{}/o.html'", dir.string(), m), "--report"},
      {fmt::format("route-train '{}' --json '{}/r.json'", q, m), "--json"}};
  // exec and calibrate (builds with MPI) are checked under mpirun in calibrate_test
  // (CalibrateCli.UnwritableOutputExitsTwoOnEveryRankBeforeTheRun): they initialise MPI, whose
  // leftovers at MPI_Finalize LeakSanitizer reports, so they stay out of the sanitizer job.
  for (const auto& [args, flag] : cases) {
    auto c = run(args);
    EXPECT_EQ(c.exit_code, 2) << args << "\n" << c.out;
    EXPECT_EQ(c.out.rfind(fmt::format("moesim: error: {} {}/", flag, m), 0), 0u) << args << "\n"
                                                                                 << c.out;
    EXPECT_NE(c.out.find(fmt::format("the directory '{}' does not exist", m)), std::string::npos)
        << c.out;
    EXPECT_FALSE(fs::exists(m)) << args;
  }
  // A directory where the file should go, and a file where the directory should be.
  auto d = run(fmt::format("simulate '{}' --json '{}'", q, dir.string()));
  EXPECT_EQ(d.exit_code, 2) << d.out;
  EXPECT_NE(d.out.find("it is a directory; expected a file name"), std::string::npos) << d.out;
  auto f = run(fmt::format("simulate '{}' --csv '{}/s.yaml/x.csv'", q, dir.string()));
  EXPECT_EQ(f.exit_code, 2) << f.out;
  EXPECT_NE(f.out.find(fmt::format("'{}/s.yaml' is not a directory", dir.string())),
            std::string::npos)
      << f.out;
  fs::remove_all(dir);
}

// `simulate --trace F` with several strategies writes one trace, F, with each strategy's
// ranks as processes named after it (it used to write F.<strategy>.json per strategy, silently).
TEST(Cli, TraceOfSeveralStrategiesIsOneFile) {
  fs::path dir = temp_dir();
  fs::path out = dir / "out.json";
  auto r = run(fmt::format(
      "simulate '{}/scenarios/quickstart.yaml' --engine analytical --iterations 1 --strategy "
      "baseline --strategy tutel --trace '{}'",
      kSource, out.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir / "out.baseline.json"));
  EXPECT_FALSE(fs::exists(dir / "out.tutel.json"));
  auto j = nlohmann::json::parse(read_file(out));
  std::set<std::string> names;
  std::map<std::string, std::set<int>> pids;
  for (const auto& e : j.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "process_name") {
      const std::string n = e.at("args").at("name");
      names.insert(n);
      pids[n.substr(0, n.find(':'))].insert(e.at("pid").get<int>());
    }
  // Quickstart: 16 ranks on 2 nodes of 8, every rank shown, per strategy.
  EXPECT_TRUE(names.count("baseline: rank 0 (node 0)")) << j.at("traceEvents").at(0);
  EXPECT_TRUE(names.count("tutel: rank 15 (node 1)"));
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_EQ(pids["baseline"].size(), 16u);
  EXPECT_EQ(pids["tutel"].size(), 16u);
  EXPECT_EQ(*pids["tutel"].begin(), 16);  // after baseline's 0..15
  ASSERT_EQ(j.at("otherData").at("runs").size(), 2u);
  EXPECT_EQ(j.at("otherData").at("runs").at(1).at("name"), "tutel");
  fs::remove_all(dir);
}

}  // namespace

namespace {

// Removes wall-clock fields, which are the only ones allowed to differ between two runs.
void strip_wall(nlohmann::json& j) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end();) {
      if (it.key() == "wall_s" || it.key() == "peak_rss_bytes")
        it = j.erase(it);
      else
        strip_wall(*it++);
    }
  } else if (j.is_array()) {
    for (auto& x : j) strip_wall(x);
  }
}

TEST(Cli, SimulateJsonFollowsTheSchemaAndIsDeterministic) {
  fs::path dir = temp_dir();
  std::string cmd =
      fmt::format("simulate '{}/scenarios/quickstart.yaml' --iterations 3 --json ", kSource);
  auto r1 = run(cmd + "'" + (dir / "a.json").string() + "'");
  ASSERT_EQ(r1.exit_code, 0) << r1.out;
  auto r2 = run(cmd + "'" + (dir / "b.json").string() + "'");
  ASSERT_EQ(r2.exit_code, 0) << r2.out;
  auto a = nlohmann::json::parse(read_file(dir / "a.json"));
  auto b = nlohmann::json::parse(read_file(dir / "b.json"));
  EXPECT_EQ(a["scenario"], "quickstart");
  EXPECT_EQ(a["engine"], "flow");
  ASSERT_EQ(a["runs"].size(), 4u);  // baseline, tutel, pipemoe, ta_moe
  for (const auto& run : a["runs"]) {
    for (const char* key : {"strategy", "topology", "gpus", "step_time_s", "moe_layer_time_s",
                            "iterations", "breakdown", "decisions", "speedup_vs_baseline"})
      EXPECT_TRUE(run.contains(key)) << key;
    EXPECT_EQ(run["gpus"], 16);
    EXPECT_EQ(run["iterations"].size(), 3u);
    EXPECT_GT(run["step_time_s"].get<double>(), 0);
    // The MoE layer is part of the step.
    EXPECT_LE(run["moe_layer_time_s"].get<double>(), run["step_time_s"].get<double>());
    for (const char* key : {"compute_s", "a2a_s", "allreduce_s", "exposed_comm_s"})
      EXPECT_TRUE(run["breakdown"].contains(key)) << key;
    for (const char* key : {"pipeline_degree", "a2a", "parallel"})
      EXPECT_TRUE(run["decisions"].contains(key)) << key;
  }
  EXPECT_EQ(a["runs"][0]["strategy"], "baseline");
  EXPECT_DOUBLE_EQ(a["runs"][0]["speedup_vs_baseline"].get<double>(), 1.0);
  // The compute slow-down beside communication it ran with: the A100's 20 of 108 SMs.
  EXPECT_DOUBLE_EQ(a["interference"].get<double>(), 20.0 / 88.0);
  // And the A100's NIC (ConnectX-6): 60 peers' queue pairs per GPU (one NIC each), 2.4 us a miss.
  EXPECT_EQ(a["peer_cache"].get<int>(), 60);
  EXPECT_DOUBLE_EQ(a["peer_miss_overhead_s"].get<double>(), 2.4e-6);
  EXPECT_DOUBLE_EQ(a["message_overhead_s"].get<double>(), 1e-6);
  // Same scenario and seed: identical JSON except wall-clock fields.
  strip_wall(a);
  strip_wall(b);
  EXPECT_EQ(a.dump(), b.dump());
  fs::remove_all(dir);
}

// The per-GPU memory estimate (docs/model.md, "Memory") in the JSON, and a warning on stderr when
// it exceeds the GPU's memory. lina-a100-4x4 baseline, by hand (S = 8192, M = 1024, H = 4096,
// E = 8, dC = 2 S / 8 = 2048, 12 blocks of which 6 MoE, fp16): parameters 12 x 4 M^2 + 6 x 8 M^2
// + 6 M E = 100,712,448 dense + 6 x 2 M H = 50,331,648 expert, x 16 bytes (2 + 2 + 12) =
// 2,416,705,536; activations (12 x 7 + 6 x 9 + 6 x 21) S M + 6 S E = 2,214,985,728 elements x 2 =
// 4,429,971,456 (R = E dC = 2 S rows: 2 R M = 4 S M, 2 R H = 16 S M); buffers 2 R M x 2 =
// 67,108,864. Total 6,913,785,856 bytes, of 40 GiB.
// --collective without --algo runs what NCCL runs, so a row compares with nccl-tests: its
// all-to-all is linear (one send / receive per peer) even where moesim's cost model would pick
// 2dh (quickstart: 2 nodes, where `--algo auto` takes 2dh at 256 KiB).
TEST(Cli, CollectiveDefaultsToWhatNcclRuns) {
  const fs::path dir = temp_dir();
  auto algo_of = [&](const std::string& args) {
    const fs::path f = dir / "c.json";
    fs::remove(f);
    auto r = run(fmt::format("simulate '{}/scenarios/quickstart.yaml' --size 256KiB {} --json '{}'",
                             kSource, args, f.string()));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return nlohmann::json::parse(read_file(f))["collective"]["algo"].get<std::string>();
  };
  EXPECT_EQ(algo_of("--collective all_to_all"), "linear");
  EXPECT_EQ(algo_of("--collective all_to_all --algo nccl"), "linear");
  EXPECT_EQ(algo_of("--collective all_to_allv --skew uniform"), "linear");
  EXPECT_EQ(algo_of("--collective all_to_all --algo auto"), "2dh");
  // A flow run records the event tolerance it ran at (the scenario default, 3e-3); others do not.
  auto collective_json = [&](const std::string& engine) {
    const fs::path f = dir / "e.json";
    fs::remove(f);
    auto r = run(fmt::format(
        "simulate '{}/scenarios/quickstart.yaml' --collective all_to_all --size 1MiB --engine {} "
        "--json '{}'",
        kSource, engine, f.string()));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return nlohmann::json::parse(read_file(f))["collective"];
  };
  EXPECT_EQ(collective_json("flow")["flow_event_tolerance"].get<double>(), 3e-3);
  EXPECT_FALSE(collective_json("analytical").contains("flow_event_tolerance"));
  auto bad =
      run(fmt::format("simulate '{}/scenarios/quickstart.yaml' --collective all_to_all "
                      "--size 1MiB --algo nvls",
                      kSource));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out, ::testing::HasSubstr("expected one of nccl, linear"));
}

// --collective all_to_allv: one dispatch of the routing model, --size the mean bytes each GPU
// sends. Uniform routing costs about what all_to_all of the same size does (sampling noise: the
// most loaded receiver gets a few % more); Zipf skew concentrates the bytes on the popular
// experts' GPUs, so the time grows with the skew, as the received max/mean does.
TEST(Cli, SkewedAllToAllvFollowsTheRoutingModel) {
  const fs::path dir = temp_dir();
  auto run_json = [&](const std::string& args) {
    const fs::path f = dir / "v.json";
    fs::remove(f);
    auto r =
        run(fmt::format("simulate '{}/scenarios/quickstart.yaml' --size 16MiB --algo linear "
                        "{} --json '{}'",
                        kSource, args, f.string()));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return nlohmann::json::parse(read_file(f))["collective"];
  };
  const auto a2a = run_json("--collective all_to_all");
  const auto uni = run_json("--collective all_to_allv --skew uniform");
  const auto z1 = run_json("--collective all_to_allv --skew zipf:1.0");
  const auto z2 = run_json("--collective all_to_allv --skew zipf:2");
  EXPECT_EQ(uni["type"], "all_to_allv");
  EXPECT_EQ(uni["routing"], "uniform");
  EXPECT_EQ(z1["routing"], "zipf:1");
  EXPECT_NEAR(uni["time_s"].get<double>(), a2a["time_s"].get<double>(),
              0.1 * a2a["time_s"].get<double>());
  EXPECT_GE(uni["time_s"].get<double>(), a2a["time_s"].get<double>() * 0.999);
  EXPECT_LT(uni["recv_max_over_mean"].get<double>(), 1.1);
  EXPECT_GT(z1["recv_max_over_mean"].get<double>(), 2.0);
  EXPECT_GT(z2["recv_max_over_mean"].get<double>(), z1["recv_max_over_mean"].get<double>());
  EXPECT_GT(z1["time_s"].get<double>(), 2 * uni["time_s"].get<double>());
  EXPECT_GT(z2["time_s"].get<double>(), z1["time_s"].get<double>());
  // algbw is the mean bytes per GPU over the time, as for all_to_all.
  EXPECT_NEAR(z1["algbw_GBps"].get<double>(), 16.0 * 1024 * 1024 / z1["time_s"].get<double>() / 1e9,
              1e-9);

  const std::string base =
      fmt::format("simulate '{}/scenarios/quickstart.yaml' --size 16MiB ", kSource);
  auto bad = run(base + "--collective all_to_allv --skew zipf:-1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out, ::testing::HasSubstr("--skew: found 'zipf:-1', expected uniform, zipf:S"));
  bad = run(base + "--collective all_to_allv --skew pareto");
  EXPECT_EQ(bad.exit_code, 2);
  bad = run(base + "--collective all_reduce --skew zipf:1");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out,
              ::testing::HasSubstr("--skew: only meaningful with --collective all_to_allv"));
  fs::remove_all(dir);
}

// engine.simgrid.mode and --simgrid-mode: the run says which mode it used (stderr and JSON), the
// flag overrides the YAML, auto resolves to per_flow on 16 GPUs, bad values exit 2.
TEST(Cli, SimgridModeIsChosenAndReported) {
#ifndef MOESIM_HAVE_SIMGRID
  GTEST_SKIP() << "built without SimGrid";
#else
  const fs::path dir = temp_dir();
  const std::string base = fmt::format(
      "simulate '{}/scenarios/quickstart.yaml' --engine simgrid --collective all_to_all --size "
      "1MiB ",
      kSource);
  auto mode_of = [&](const std::string& extra, std::string* out) {
    const fs::path f = dir / "c.json";
    fs::remove(f);
    auto r = run(base + extra + " --json '" + f.string() + "'");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    if (out) *out = r.out;
    return nlohmann::json::parse(read_file(f))["collective"]["simgrid_mode"].get<std::string>();
  };
  std::string out;
  EXPECT_EQ(mode_of("", &out), "per_flow");
  EXPECT_THAT(out, ::testing::HasSubstr("simgrid mode per_flow, auto: <= 64 GPUs"));
  EXPECT_EQ(mode_of("--simgrid-mode ptask", nullptr), "ptask");
  EXPECT_EQ(mode_of("--set engine.simgrid.mode=ptask", nullptr), "ptask");
  EXPECT_EQ(mode_of("--set engine.simgrid.mode=ptask --simgrid-mode per_flow", nullptr),
            "per_flow");
  auto bad = run(base + "--simgrid-mode fast");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out, ::testing::HasSubstr("--simgrid-mode: found 'fast', expected one of auto, "
                                            "per_flow, ptask"));
  bad = run(base + "--set engine.simgrid.mode=fast");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.out, ::testing::HasSubstr("engine.simgrid.mode"));
  fs::remove_all(dir);
#endif
}

TEST(Cli, SimulateReportsMemoryAndWarnsWhenItDoesNotFit) {
  fs::path dir = temp_dir();
  const std::string base = fmt::format(
      "simulate '{}/scenarios/lina-a100-4x4.yaml' --strategy baseline --engine analytical --json ",
      kSource);
  auto fits = run(base + "'" + (dir / "a.json").string() + "'");
  ASSERT_EQ(fits.exit_code, 0) << fits.out;
  EXPECT_EQ(fits.out.find("warning"), std::string::npos) << fits.out;
  auto a = nlohmann::json::parse(read_file(dir / "a.json"));
  const auto& run0 = a["runs"][0];
  EXPECT_DOUBLE_EQ(run0["memory_bytes"].get<double>(), 6917324800.0);
  const auto& m = run0["memory"];
  EXPECT_DOUBLE_EQ(m["weights_bytes"].get<double>(), 302137344.0);
  EXPECT_DOUBLE_EQ(m["gradients_bytes"].get<double>(), 302137344.0);
  EXPECT_DOUBLE_EQ(m["optimizer_bytes"].get<double>(), 1812824064.0);
  EXPECT_DOUBLE_EQ(m["activations_bytes"].get<double>(), 4433117184.0);
  EXPECT_DOUBLE_EQ(m["buffers_bytes"].get<double>(), 67108864.0);
  EXPECT_DOUBLE_EQ(m["gpu_memory_bytes"].get<double>(), 40.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(m["fits"], true);
  // 16x the batch (128): activations and buffers 16x, 74.4 GB in all > 42.9 GB (40 GiB): the
  // run completes, with a warning on stderr.
  auto over = run(base + "'" + (dir / "b.json").string() + "' --set model.batch_per_gpu=128");
  ASSERT_EQ(over.exit_code, 0) << over.out;
  EXPECT_NE(over.out.find("moesim: warning: strategy 'baseline' does not fit in memory"),
            std::string::npos)
      << over.out;
  auto b = nlohmann::json::parse(read_file(dir / "b.json"));
  EXPECT_EQ(b["runs"][0]["memory"]["fits"], false);
  // Every strategy of the scenario over memory: one warning, naming them all and the key that fits.
  auto all =
      run(fmt::format("simulate '{}/scenarios/lina-a100-4x4.yaml' --engine analytical --set "
                      "model.batch_per_gpu=128 -q",
                      kSource));
  ASSERT_EQ(all.exit_code, 0) << all.out;
  std::size_t warnings = 0;
  for (std::size_t at = all.out.find("moesim: warning:"); at != std::string::npos;
       at = all.out.find("moesim: warning:", at + 1))
    ++warnings;
  EXPECT_EQ(warnings, 1u) << all.out;
  EXPECT_THAT(all.out, ::testing::HasSubstr("strategies ('baseline', "));
  EXPECT_THAT(all.out, ::testing::HasSubstr("do not fit in memory; the largest, '"));
  EXPECT_THAT(all.out, ::testing::HasSubstr("fits with "));
  EXPECT_GT(b["runs"][0]["memory_bytes"].get<double>(), 40.0 * 1024 * 1024 * 1024);
  // validate prints the estimate and the same warning.
  auto v = run(fmt::format("validate '{}/scenarios/lina-a100-4x4.yaml'", kSource));
  ASSERT_EQ(v.exit_code, 0) << v.out;
  EXPECT_NE(v.out.find("memory/GPU   baseline         6.44 GiB = weights 0.28 GiB"),
            std::string::npos)
      << v.out;
  EXPECT_NE(v.out.find("[pack=2]"), std::string::npos) << v.out;
  auto vo = run(fmt::format(
      "validate '{}/scenarios/lina-a100-4x4.yaml' --set model.batch_per_gpu=128", kSource));
  ASSERT_EQ(vo.exit_code, 0) << vo.out;
  EXPECT_NE(vo.out.find("do not fit in memory; the largest, "), std::string::npos) << vo.out;
  fs::remove_all(dir);
}

// Values no real cluster has run, with a warning naming the key: a NIC of 1 b/s (a unit typo)
// gives a step of years, and validate and simulate say why before the number.
TEST(Cli, ImplausibleLinkValuesWarnWithTheirKey) {
  const std::string q = fmt::format("'{}/scenarios/quickstart.yaml'", kSource);
  for (const char* cmd : {"validate", "simulate"}) {
    auto r =
        run(fmt::format("{} {} --set cluster.inter_node.nic_bandwidth=0.000001b/s --set "
                        "cluster.intra_node.latency=2s{}",
                        cmd, q, std::string(cmd) == "simulate" ? " --engine analytical -q" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_THAT(r.out, ::testing::HasSubstr("moesim: warning: cluster.inter_node.nic_bandwidth: "
                                            "1e-06 b/s is below 1 Mb/s"));
    EXPECT_THAT(r.out,
                ::testing::HasSubstr(
                    "moesim: warning: cluster.intra_node.latency: 2 s per hop is above 1 s"));
  }
  auto ok = run(fmt::format("validate {}", q));
  ASSERT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(ok.out.find("moesim: warning"), std::string::npos) << ok.out;
}

TEST(Cli, SimulateSeedChangesTheWorkload) {
  fs::path dir = temp_dir();
  std::string base = fmt::format(
      "simulate '{}/scenarios/quickstart.yaml' --strategy baseline --iterations 2 --csv ", kSource);
  ASSERT_EQ(run(base + "'" + (dir / "s1.csv").string() + "' --seed 1").exit_code, 0);
  ASSERT_EQ(run(base + "'" + (dir / "s2.csv").string() + "' --seed 2").exit_code, 0);
  std::string s1 = read_file(dir / "s1.csv"), s2 = read_file(dir / "s2.csv");
  EXPECT_EQ(std::count(s1.begin(), s1.end(), '\n'), 3);  // header + 2 iterations
  EXPECT_NE(s1, s2);  // dropped token counts differ with the routing seed
  fs::remove_all(dir);
}

// --set edits the YAML tree before validation: the same result as editing the file by hand.
TEST(Cli, SetOverridesAKeyExactlyLikeEditingTheFile) {
  fs::path dir = temp_dir();
  std::string text = read_file(fs::path(kSource) / "scenarios/quickstart.yaml");
  const auto at = text.find("seq_len: 1024");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 13, "seq_len: 64");
  const fs::path edited = dir / "quickstart.yaml";
  { std::ofstream(edited) << text; }
  const std::string common = "--strategy baseline --strategy tutel --iterations 2 --engine flow";
  ASSERT_EQ(run(fmt::format("simulate '{}' {} --json '{}'", edited.string(), common,
                            (dir / "file.json").string()))
                .exit_code,
            0);
  ASSERT_EQ(run(fmt::format("simulate '{}/scenarios/quickstart.yaml' --set model.seq_len=64 {} "
                            "--json '{}'",
                            kSource, common, (dir / "set.json").string()))
                .exit_code,
            0);
  auto a = nlohmann::json::parse(read_file(dir / "file.json"));
  auto b = nlohmann::json::parse(read_file(dir / "set.json"));
  strip_wall(a);
  strip_wall(b);
  EXPECT_EQ(a, b);
  auto v =
      run(fmt::format("validate '{}/scenarios/quickstart.yaml' --set model.seq_len=64 --set "
                      "model.batch_per_gpu=2",
                      kSource));
  EXPECT_EQ(v.exit_code, 0) << v.out;
  EXPECT_NE(v.out.find("B=2 L=64 (S=128 tokens/GPU)"), std::string::npos) << v.out;
  fs::remove_all(dir);
}

// compare --set: the edit applies after --topology replaced the cluster, so one knob is tried on
// every topology, with the same figures as a topology file edited by hand.
TEST(Cli, CompareSetAppliesOnEveryTopologyLikeAnEditedFile) {
  fs::path dir = temp_dir();
  const std::string topos = kSource + "/scenarios/topologies/";
  std::string text = read_file(topos + "dgx-a100-2x8.yaml");
  const auto at = text.find("nic_bandwidth: 200Gb/s");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 22, "nic_bandwidth: 25Gb/s");
  { std::ofstream(dir / "dgx-a100-2x8.yaml") << text; }
  const std::string common = fmt::format(
      "compare '{}/scenarios/quickstart.yaml' --engine analytical --iterations 2", kSource);
  auto edited = run(fmt::format("{} --topology '{}' --json '{}'", common,
                                (dir / "dgx-a100-2x8.yaml").string(), (dir / "e.json").string()));
  ASSERT_EQ(edited.exit_code, 0) << edited.out;
  auto set = run(
      fmt::format("{} --topology '{}a100-4x4-ib100.yaml' --topology '{}dgx-a100-2x8.yaml' --set "
                  "cluster.inter_node.nic_bandwidth=25Gb/s --json '{}'",
                  common, topos, topos, (dir / "s.json").string()));
  ASSERT_EQ(set.exit_code, 0) << set.out;
  auto plain =
      run(fmt::format("{} --topology '{}a100-4x4-ib100.yaml' --topology "
                      "'{}dgx-a100-2x8.yaml' --json '{}'",
                      common, topos, topos, (dir / "p.json").string()));
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  auto e = nlohmann::json::parse(read_file(dir / "e.json"));
  auto s = nlohmann::json::parse(read_file(dir / "s.json"));
  auto p = nlohmann::json::parse(read_file(dir / "p.json"));
  strip_wall(e);
  strip_wall(s);
  const std::size_t per_topology = e["runs"].size();
  ASSERT_GT(per_topology, 0u);
  ASSERT_EQ(s["runs"].size(), 2 * per_topology);
  ASSERT_EQ(p["runs"].size(), 2 * per_topology);
  // The second topology's runs are those of the edited file.
  for (std::size_t i = 0; i < per_topology; ++i)
    EXPECT_EQ(s["runs"][per_topology + i], e["runs"][i]);
  // Both topologies slowed down: 25 Gb/s NICs instead of 100 and 200.
  for (std::size_t i = 0; i < 2 * per_topology; ++i)
    EXPECT_GT(s["runs"][i]["step_time_s"].get<double>(), p["runs"][i]["step_time_s"].get<double>())
        << i;
  // An edit the scenario rejects names the --set.
  auto bad = run(
      fmt::format("{} --topology '{}a100-4x4-ib100.yaml' --set model.seq_len=abc", common, topos));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("(from --set model.seq_len=abc)"), std::string::npos) << bad.out;
  fs::remove_all(dir);
}

TEST(Cli, SetErrorsExitTwoAndNameTheOverride) {
  const std::string q = fmt::format("validate '{}/scenarios/quickstart.yaml' ", kSource);
  auto r = run(q + "--set model.seq_len=abc");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(
      r.out.find("--set: model.seq_len: found 'abc', expected an integer in [1, 2^31-1] (from "
                 "--set model.seq_len=abc)"),
      std::string::npos)
      << r.out;
  r = run(q + "--set model.seq_len");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("expected KEY=VALUE"), std::string::npos) << r.out;
  r = run(q + "--set model.nope=1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("unknown key 'nope'"), std::string::npos) << r.out;
  r = run(q + "--set 'strategies[9].a2a=2dh'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("has no item [9]"), std::string::npos) << r.out;
}

// Validate reads what simulate reads before its first iteration (the routing
// trace's rows, the calibration file) and the loader bounds every value, so a scenario that
// validates does not fail at run time: both commands exit 2 with the same one-line message.
TEST(Cli, ValidateRejectsWhatSimulateRejects) {
  const std::string data = kSource + "/tests/data/scenarios/";
  const std::string bad = kSource + "/tests/cli/bad/";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {data + "bad-trace.yaml",
       data + "bad-trace-rows.csv:3:5: workload.routing.trace: found gpu = 9, expected less "
              "than 2 (the scenario's GPUs (P))"},
      {data + "bad-calibration.yaml",
       data + "bad-calibration-file.yaml:4:15: interference: found 200, expected a number in [0, "
              "100]"},
      {bad + "huge_bandwidth.yaml",
       bad + "huge_bandwidth.yaml:8:45: cluster.inter_node.nic_bandwidth: found '1e308Gb/s', "
             "expected a bandwidth (e.g. 300GB/s, 200Gb/s) of at most 1000TB/s"},
      {bad + "huge_capacity_factor.yaml",
       bad + "huge_capacity_factor.yaml:10:20: model.capacity_factor: found 1000000000000, "
             "expected a number in [-1024, 1024]"},
      {bad + "huge_seq_len.yaml",
       bad + "huge_seq_len.yaml:4:36: model.seq_len: found 2147483647, expected an integer in "
             "[1, 2^31/batch_per_gpu = 536870912] (S = batch_per_gpu x seq_len tokens per GPU "
             "is at most 2^31)"},
  };
  for (const auto& [file, message] : cases) {
    auto v = run(fmt::format("validate '{}'", file));
    EXPECT_EQ(v.exit_code, 2) << file << "\n" << v.out;
    EXPECT_EQ(v.out, "moesim: error: " + message + "\n");
    // simulate may print its header line first (stdout), but fails with the same error.
    auto r = run(fmt::format("simulate '{}' --iterations 1", file));
    EXPECT_EQ(r.exit_code, 2) << file << "\n" << r.out;
    EXPECT_NE(r.out.find("moesim: error: " + message + "\n"), std::string::npos) << r.out;
  }
}

// Numeric flags are parsed strictly, with the YAML errors' wording and the range
// stated; an explicit value is never replaced by a default (--seed -5 ran with seed 1,
// --iterations 0 with the scenario's 10, --size 1e30MiB ran).
TEST(Cli, NumericFlagsAreStrict) {
  const std::string q = "'" + kSource + "/scenarios/quickstart.yaml' ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"simulate " + q + "--seed -5", "--seed: found -5, expected an integer in [0, 2^63-1]"},
      {"simulate " + q + "--seed 1x", "--seed: found '1x', expected an integer in [0, 2^63-1]"},
      {"simulate " + q + "--seed 9223372036854775808",
       "--seed: found '9223372036854775808', expected an integer in [0, 2^63-1]"},
      {"simulate " + q + "--iterations 0",
       "--iterations: found 0, expected an integer in [1, 1000000]"},
      {"simulate " + q + "--iterations 2.5",
       "--iterations: found '2.5', expected an integer in [1, 1000000]"},
      {"simulate " + q + "--collective all_to_all --size 1e30MiB",
       "--size: found '1e30MiB', expected a size (e.g. 128MiB, 4KB) greater than 0 and at most "
       "1024TiB"},
      {"simulate " + q + "--collective all_to_all --size 0B",
       "--size: found '0B', expected a size (e.g. 128MiB, 4KB) greater than 0 and at most "
       "1024TiB"},
      {"simulate " + q + "--collective all_to_allv --size 1MiB --seed -5",
       "--seed: found -5, expected an integer in [0, 2^63-1]"},
      {"simulate " + q + "--collective all_to_all --size 1MiB --iterations 3",
       "--iterations: only meaningful without --collective (one collective runs once)"},
      {"simulate " + q + "--collective all_to_allv --size 1MiB --skew zipf:1e300",
       "--skew: found 'zipf:1e300', expected uniform, zipf:S (S in [0, 100], e.g. zipf:1.0) or "
       "dirichlet:A (A in (0, 1e6]), the ranges of workload.routing.skew and alpha"},
      {"compare " + q + "--iterations 0",
       "--iterations: found 0, expected an integer in [1, 1000000]"},
      {"sweep /nonexistent/sweep.yaml --jobs -1",
       "--jobs: found -1, expected an integer in [0, 4096]"},
      {"route-train " + q + "--epochs 0", "--epochs: found 0, expected an integer in [1, 100000]"},
      {"route-train " + q + "--lr 0", "--lr: found 0, expected a number in (0, 1000]"},
      {"route-train " + q + "--label-smoothing nan",
       "--label-smoothing: found 'nan', expected a number in [0, 1]"},
      {"route-train " + q + "--seed -1", "--seed: found -1, expected an integer in [0, 2^63-1]"},
  };
  for (const auto& [args, message] : cases) {
    auto r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out;
    EXPECT_EQ(r.out, "moesim: error: " + message + "\n") << args;
  }
}

TEST(Cli, SimulateUnknownStrategyExitsTwo) {
  auto r = run(fmt::format("simulate '{}/scenarios/quickstart.yaml' --strategy nope", kSource));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("baseline, tutel, pipemoe, ta_moe"), std::string::npos) << r.out;
}

TEST(Cli, SimulateCollectiveReportsNcclTestsBandwidths) {
  fs::path dir = temp_dir();
  auto r = run(fmt::format(
      "simulate '{}/scenarios/quickstart.yaml' --collective all_to_all --size 128MiB --algo "
      "linear --engine analytical --json '{}'",
      kSource, (dir / "c.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(read_file(dir / "c.json"));
  const auto& c = j["collective"];
  EXPECT_EQ(c["type"], "all_to_all");
  EXPECT_EQ(c["algo"], "linear");
  EXPECT_EQ(c["gpus"], 16);
  EXPECT_DOUBLE_EQ(c["size_bytes"].get<double>(), 134217728.0);
  double t = c["time_s"].get<double>();
  // Each GPU sends half of its 128 MiB off-node through its own 25 GB/s NIC: at least 2.68 ms.
  EXPECT_GT(t, 67108864.0 / 25e9);
  EXPECT_NEAR(c["algbw_GBps"].get<double>(), 134217728.0 / t / 1e9, 1e-9);
  EXPECT_NEAR(c["busbw_GBps"].get<double>(), c["algbw_GBps"].get<double>() * 15.0 / 16.0, 1e-9);
  EXPECT_TRUE(j.contains("wall_s"));
  fs::remove_all(dir);
}

TEST(Cli, CompareRunsStacksTimesTopologies) {
  fs::path dir = temp_dir();
  std::string topos;
  for (const char* t : {"dgx-a100-2x8", "a100-4x4-ib100", "a100-pcie-2x8-ib100"})
    topos += fmt::format(" --topology '{}/scenarios/topologies/{}.yaml'", kSource, t);
  auto r = run(fmt::format("compare '{}/scenarios/quickstart.yaml'{} --iterations 2 --json '{}'",
                           kSource, topos, (dir / "c.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(read_file(dir / "c.json"));
  ASSERT_EQ(j["runs"].size(), 12u);  // 4 strategies x 3 topologies, topology by topology
  const auto& dgx_base = j["runs"][0];
  const auto& ib_base = j["runs"][4];
  ASSERT_EQ(dgx_base["strategy"], "baseline");
  ASSERT_EQ(ib_base["strategy"], "baseline");
  EXPECT_EQ(ib_base["topology"], "a100-4x4-ib100");
  // The NVSwitch + 8 NIC nodes are faster than 4 GPUs sharing one 100 Gb/s NIC, for the baseline.
  EXPECT_LT(dgx_base["step_time_s"].get<double>(), ib_base["step_time_s"].get<double>());
  // TA-MoE's dispatch keeps tokens inside the node: it pays most where the NIC is scarcest (one
  // 100 Gb/s NIC per 4 GPUs against one 200 Gb/s NIC per GPU), and cuts the all-to-all there.
  const auto& dgx_ta = j["runs"][3];
  const auto& ib_ta = j["runs"][7];
  ASSERT_EQ(dgx_ta["strategy"], "ta_moe");
  ASSERT_EQ(ib_ta["strategy"], "ta_moe");
  EXPECT_GT(ib_ta["speedup_vs_baseline"].get<double>(),
            dgx_ta["speedup_vs_baseline"].get<double>());
  EXPECT_LT(ib_ta["breakdown"]["a2a_s"].get<double>(), ib_base["breakdown"]["a2a_s"].get<double>());
  fs::remove_all(dir);
}

// fp8 GEMMs on a GPU without fp8 tensor cores: exit 2 naming the key that asked for them (the
// precision map's, or model.dtype's when it set the GEMMs' precision) and the GPUs that have them.
TEST(Cli, Fp8GemmsOnAGpuWithoutFp8AreRefused) {
  const std::string base = fmt::format("validate '{}/scenarios/quickstart.yaml'", kSource);
  auto r = run(base + " --set model.precision.gemm=fp8");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr(
                         "model.precision.gemm: found fp8, but GPU 'a100-sxm-80gb' has no fp8 "
                         "tensor cores; expected bf16 or fp16 (fp8 GEMMs run on h100-sxm"));
  r = run(base + " --set model.dtype=fp8");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("model.dtype: found fp8, but GPU 'a100-sxm-80gb'"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("(or model.precision.gemm: bf16)"));
  // The same GEMMs on an H100 run, in fp8.
  r = run(base + " --set model.precision.gemm=fp8 --set cluster.gpu=h100-sxm");
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// Inputs by bundled name and from stdin (docs/tutorial.md): a model preset or scenario named
// without folder or extension, a sweep and a topology likewise, "-" for stdin; a name that
// matches nothing exits 2 naming the closest.
TEST(Cli, BundledNamesAndStdin) {
  auto r = run("validate mixtral-8x7b");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(kSource + "/scenarios/models/mixtral-8x7b.yaml: valid"), std::string::npos)
      << r.out;
  r = run("validate quickstart");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("/scenarios/quickstart.yaml: valid"), std::string::npos) << r.out;
  r = run("validate mixtral-8x7");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("mixtral-8x7: no such file, and no bundled scenario or model preset of "
                       "that name (did you mean 'mixtral-8x7b'?)"),
            std::string::npos)
      << r.out;
  // A path-like argument keeps the loader's message.
  r = run("validate ./mixtral-8x7b");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("file not found"), std::string::npos) << r.out;
  r = run(fmt::format("simulate - --engine analytical --quiet < '{}/scenarios/quickstart.yaml'",
                      kSource));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("fastest: "), std::string::npos) << r.out;
  r = run("validate - < /dev/null");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("<stdin>:1:1: "), std::string::npos) << r.out;
  r = run("compare quickstart --topology dgx-a100-2x8 --engine analytical --quiet");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  r = run("compare quickstart --topology dgx-a100 --quiet");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("no bundled topology of that name (did you mean 'dgx-a100-2x8'?)"),
            std::string::npos)
      << r.out;
}

// A Hugging Face config of every family the importer reads (scenarios/models/hf/) validates and
// simulates as a scenario's model (model.hf_config), on 16 GPUs with EP 8.
TEST(Cli, HfConfigOfEveryFamilySimulates) {
  const fs::path dir = fs::path(::testing::TempDir()) / "hf-cli";
  fs::create_directories(dir);
  int families = 0;
  for (const auto& e : fs::directory_iterator(kSource + "/scenarios/models/hf")) {
    if (e.path().extension() != ".json") continue;
    ++families;
    const fs::path yaml = dir / (e.path().stem().string() + ".yaml");
    std::ofstream(yaml) << fmt::format(R"(name: hf-{}
cluster:
  gpu: h100-sxm
  nodes: 2
  gpus_per_node: 8
  intra_node: {{kind: nvswitch, bandwidth: 450GB/s}}
  inter_node: {{kind: fat_tree, nic_bandwidth: 400Gb/s, nics_per_node: 8}}
model:
  hf_config: '{}'
  batch_per_gpu: 1
  seq_len: 1024
  dtype: bf16
parallelism: {{ep: 8, dp: auto, zero: 1}}
workload: {{iterations: 1}}
strategies: [{{name: baseline}}]
)",
                                       e.path().stem().string(), e.path().string());
    auto r = run(fmt::format("validate '{}'", yaml.string()));
    EXPECT_EQ(r.exit_code, 0) << yaml << "\n" << r.out;
    EXPECT_NE(r.out.find("hf_config    " + e.path().string() + " (read as "), std::string::npos)
        << r.out;
    r = run(fmt::format("simulate '{}' --engine analytical --quiet", yaml.string()));
    EXPECT_EQ(r.exit_code, 0) << yaml << "\n" << r.out;
    EXPECT_NE(r.out.find("\nbaseline "), std::string::npos) << r.out;
  }
  EXPECT_GE(families, 7);
}

}  // namespace
