// One memory estimate everywhere (docs/model.md, "Memory"): the figure `moesim validate` prints
// for a strategy is the memory_bytes `moesim simulate` writes for it, also for a dropless preset
// whose dC is sampled (validate once printed 153 GiB for Mixtral where simulate wrote 166 GiB:
// validate took the mean load as dC, simulate the sampled largest count), and a layout that
// does not fit names the single keys that would make it fit.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_run.hpp"

namespace {

namespace fs = std::filesystem;
using namespace moesim::cli_test;

// The "12.34 GiB" validate prints on strategy `name`'s memory line ("" when missing).
std::string validate_gib(const std::string& out, const std::string& name) {
  const std::string key = fmt::format("  memory/GPU   {:<16} ", name);
  const auto at = out.find(key);
  if (at == std::string::npos) return "";
  const auto begin = at + key.size();
  return out.substr(begin, out.find(" = ", begin) - begin);
}

TEST(MemoryCli, ValidatePrintsSimulatesMemoryBytesForADroplessPreset) {
  const fs::path json =
      fs::temp_directory_path() / fmt::format("moesim_memory_cli_{}.json", getpid());
  const std::string preset = kSource + "/scenarios/models/mixtral-8x7b.yaml";
  const auto v = run(fmt::format("validate '{}'", preset));
  ASSERT_EQ(v.exit_code, 0) << v.out;
  const auto s =
      run(fmt::format("simulate '{}' --strategy baseline --engine analytical -q --json '{}'",
                      preset, json.string()));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  const auto j = nlohmann::json::parse(read_file(json));
  fs::remove(json);
  const auto& mem = j["runs"][0]["memory"];
  const double bytes = j["runs"][0]["memory_bytes"].get<double>();
  EXPECT_EQ(validate_gib(v.out, "baseline"),
            fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024 * 1024)))
      << v.out;
  // The same dC, stage and in-flight micro-batches behind it.
  EXPECT_NE(v.out.find(fmt::format("dC = {} slots", mem["capacity"].get<long>())),
            std::string::npos)
      << v.out;
  EXPECT_EQ(mem["pipeline_stage"], 0);
  EXPECT_EQ(mem["in_flight_micro_batches"], 1);
  EXPECT_EQ(mem["recompute"], "none");
  // Over 80 GiB: both warn, with the same advice.
  const auto advice = [](const std::string& out) {
    const auto at = out.find("does not fit 80.0 GiB; ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  EXPECT_FALSE(advice(v.out).empty()) << v.out;
  EXPECT_EQ(advice(v.out), advice(s.out)) << s.out;
}

// A routed dispatch (deepep) keeps the rows its GPUs really receive, not the dropless buffer padded
// to the busiest (source, expert) pair: its dC lies between the mean ceil(S k / E) = 128 and the
// padded one, and validate prints the figure simulate writes for it too.
TEST(MemoryCli, RoutedDispatchKeepsTheRowsItReceives) {
  const fs::path json =
      fs::temp_directory_path() / fmt::format("moesim_memory_routed_{}.json", getpid());
  const std::string args = fmt::format(
      "'{}/scenarios/models/deepseek-v3.yaml' --set model.layers=5 --set cluster.nodes=8 --set "
      "parallelism.pp=2 --set parallelism.ep=32 --set model.micro_batches=2",
      kSource);
  const auto v = run("validate " + args);
  ASSERT_EQ(v.exit_code, 0) << v.out;
  const auto s = run(fmt::format(
      "simulate {} --strategy baseline --strategy deepep --engine analytical -q --json '{}'", args,
      json.string()));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  const auto j = nlohmann::json::parse(read_file(json));
  fs::remove(json);
  ASSERT_EQ(j["runs"].size(), 2u);
  const auto& base = j["runs"][0];
  const auto& routed = j["runs"][1];
  ASSERT_EQ(routed["strategy"], "deepep");
  const long padded = base["memory"]["capacity"].get<long>();
  const long rows = routed["memory"]["capacity"].get<long>();
  EXPECT_GE(rows, 4096L * 8 / 256);
  EXPECT_LT(rows, padded);
  EXPECT_LT(routed["memory_bytes"].get<double>(), base["memory_bytes"].get<double>());
  for (const auto* run : {&base, &routed})
    EXPECT_EQ(validate_gib(v.out, (*run)["strategy"].get<std::string>()),
              fmt::format("{:.2f} GiB", (*run)["memory_bytes"].get<double>() / 1073741824.0))
        << v.out;
}

// A layout that fits only with a change says which: Mixtral at 16 blocks is 85 GiB on an 80 GB
// H100; ZeRO-1 (the optimizer state over 64 dense / 8 expert replicas), recomputation or two
// pipeline stages each make it fit.
TEST(MemoryCli, AdviceNamesTheKeysThatMakeItFit) {
  const std::string preset = kSource + "/scenarios/models/mixtral-8x7b.yaml";
  const auto v = run(fmt::format("validate '{}' --set model.layers=20", preset));
  ASSERT_EQ(v.exit_code, 0) << v.out;
  for (const char* key : {"fits with parallelism.zero: 1 (",
                          "model.recompute: {granularity: full} (", "parallelism.pp: 2 ("})
    EXPECT_NE(v.out.find(key), std::string::npos) << key << "\n" << v.out;
}

// Pipeline schedules from the command line (docs/model.md, "Pipeline schedules"): --set reaches
// parallelism.vp and parallelism.schedule, validate prints the schedule and its activations in
// flight, and a layout a schedule cannot run exits 2 naming the key and what fits.
TEST(MemoryCli, PipelineSchedulesFromSet) {
  const std::string args = fmt::format(
      "validate '{}/scenarios/models/deepseek-v3.yaml' --set model.layers=16 --set "
      "cluster.nodes=8 --set parallelism.pp=4 --set parallelism.ep=16 --set "
      "model.micro_batches=8 --set model.mtp_layers=0",
      kSource);
  const auto plain = run(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_NE(plain.out.find("1F1B; bubble"), std::string::npos) << plain.out;
  // The fullest stage is stage 1 (stage 0's first blocks are dense): pp - 1 = 3 in flight.
  EXPECT_NE(plain.out.find("stage 1 with 3 micro-batch(es) in flight"), std::string::npos)
      << plain.out;
  const auto vp = run(args + " --set parallelism.vp=4");
  ASSERT_EQ(vp.exit_code, 0) << vp.out;
  EXPECT_NE(vp.out.find("interleaved, vp=4"), std::string::npos) << vp.out;
  // The fullest stage is the last (the LM head's chunk): (4 - 3 - 1) 2 + (4 - 1) 4 + 1 = 13
  // chunks of a quarter stage.
  EXPECT_NE(vp.out.find("stage 3 with 13 micro-batch chunk(s) of 1/4"), std::string::npos)
      << vp.out;
  const auto bad_vp = run(args + " --set parallelism.vp=3");
  EXPECT_EQ(bad_vp.exit_code, 2) << bad_vp.out;
  EXPECT_NE(bad_vp.out.find("parallelism.vp: found vp = 3, expected a divisor of the 4 blocks "
                            "per stage (model.layers / pp = 16 / 4): 1, 2, 4"),
            std::string::npos)
      << bad_vp.out;
  const auto dual = run(args + " --set parallelism.schedule=dualpipe");
  ASSERT_EQ(dual.exit_code, 0) << dual.out;
  EXPECT_NE(dual.out.find("DualPipe"), std::string::npos) << dual.out;
  EXPECT_NE(dual.out.find("with 5 micro-batch chunk(s) of 1/2"), std::string::npos) << dual.out;
  const auto bad_dual =
      run(args + " --set parallelism.schedule=dualpipe --set model.micro_batches=6");
  EXPECT_EQ(bad_dual.exit_code, 2) << bad_dual.out;
  EXPECT_NE(bad_dual.out.find("model.micro_batches: found 6"), std::string::npos) << bad_dual.out;
}

}  // namespace
