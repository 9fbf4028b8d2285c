// The calibration file (core/calibration) and the shared GEMM roofline (core/gemm_model):
// exact fits on synthetic lines, loader errors with file:line:key, write -> load round trip,
// and the calibrated GEMM time against a hand computation.
#include "core/calibration.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/gemm_model.hpp"
#include "core/scenario_loader.hpp"

namespace moesim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string error_of(const std::string& text) {
  try {
    parse_calibration(text, "cal.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(CalibrationFit, RecoversAlphaBetaExactlyFromALine) {
  // t = 3 us + 0.25 ns/B * x at sizes 1 KiB .. 1 MiB (x4 steps, as the sweeps use).
  std::vector<double> x, y;
  for (double s = 1024; s <= 1 << 20; s *= 4) {
    x.push_back(s);
    y.push_back(3e-6 + 0.25e-9 * s);
  }
  const LinearFit f = fit_alpha_beta(x, y);
  EXPECT_NEAR(f.alpha.value(), 3e-6, 1e-18);
  EXPECT_NEAR(f.beta, 0.25e-9, 1e-24);
  EXPECT_NEAR(f.time(4096), 3e-6 + 0.25e-9 * 4096, 1e-18);
}

TEST(CalibrationFit, LeastSquaresOnNoisyPointsAndNoNegativeIntercept) {
  // Points (0, 1), (1, 3), (2, 2), (3, 4): mean x 1.5, mean y 2.5,
  // Sxy = (-1.5)(-1.5) + (-0.5)(0.5) + (0.5)(-0.5) + (1.5)(1.5) = 4, Sxx = 5, so beta = 0.8 and
  // alpha = 2.5 - 0.8 * 1.5 = 1.3.
  const LinearFit f = fit_alpha_beta({0, 1, 2, 3}, {1, 3, 2, 4});
  EXPECT_DOUBLE_EQ(f.beta, 0.8);
  EXPECT_DOUBLE_EQ(f.alpha.value(), 1.3);
  // A line with a negative intercept (t = -1 + 2x) becomes the fit through the origin:
  // beta = sum(x*y) / sum(x^2) = (1*1 + 2*3 + 3*5) / (1 + 4 + 9) = 22 / 14.
  const LinearFit g = fit_alpha_beta({1, 2, 3}, {1, 3, 5});
  EXPECT_EQ(g.alpha.value(), 0.0);
  EXPECT_DOUBLE_EQ(g.beta, 22.0 / 14.0);
}

const char* kGood = R"(# comment
format: moesim-calibration/1
gpu: a100-sxm-80gb
device: host-cpu
backend: mpi
dtype: fp32
ranks: 4
nodes: 2
gpus_per_node: 2
gemm:
  alpha: 2us
  beta: 0.001ns/FLOP
  efficiency:
    - {m: 8, n: 128, k: 64, efficiency: 0.25}
    - {m: 128, n: 128, k: 64, batch: 2, efficiency: 1}
point_to_point:
  - {tier: 0, alpha: 11us, beta: 0.01ns/B}
  - {tier: 1, alpha: 20us, beta: 0.08ns/B}
collectives:
  - {collective: all_to_all, algo: linear, ranks: 4, alpha: 40us, beta: 0.5ns/B}
  - {collective: all_reduce, algo: ring, ranks: 4, alpha: 30us, beta: 1ns/B}
interference: 0.125
)";

TEST(CalibrationLoader, ReadsEveryField) {
  const Calibration c = parse_calibration(kGood, "cal.yaml");
  EXPECT_EQ(c.gpu, "a100-sxm-80gb");
  EXPECT_EQ(c.device, "host-cpu");
  EXPECT_EQ(c.backend, "mpi");
  EXPECT_EQ(c.ranks, 4);
  EXPECT_EQ(c.nodes, 2);
  EXPECT_EQ(c.gpus_per_node, 2);
  EXPECT_DOUBLE_EQ(c.gemm.alpha_gemm->value(), 2e-6);
  EXPECT_DOUBLE_EQ(*c.gemm.beta_gemm_s_per_flop, 1e-12);
  ASSERT_EQ(c.gemm.efficiency_table.size(), 2u);
  EXPECT_EQ(c.gemm.efficiency_table[1].shape.batch, 2);
  EXPECT_EQ(c.gemm.efficiency_table[0].shape.m, 8);
  ASSERT_NE(c.tier(1), nullptr);
  EXPECT_DOUBLE_EQ(c.tier(1)->fit.alpha.value(), 20e-6);
  EXPECT_DOUBLE_EQ(c.tier(1)->fit.beta, 0.08e-9);
  const auto* a2a = c.collective(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, 4);
  ASSERT_NE(a2a, nullptr);
  EXPECT_DOUBLE_EQ(a2a->fit.time(1e6), 40e-6 + 0.5e-9 * 1e6);
  EXPECT_EQ(c.collective(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, 8), nullptr);
  EXPECT_DOUBLE_EQ(*c.interference, 0.125);
}

TEST(CalibrationLoader, UnknownKeyNamesFileLineAndKey) {
  std::string text = kGood;
  text.replace(text.find("interference:"), 13, "interferense:");
  EXPECT_THAT(error_of(text), AllOf(StartsWith("cal.yaml:22:"), HasSubstr("interferense"),
                                    HasSubstr("did you mean 'interference'")));
}

TEST(CalibrationLoader, BareNumbersWithoutUnitAreRefused) {
  std::string text = kGood;
  text.replace(text.find("alpha: 2us"), 10, "alpha: 2");
  EXPECT_THAT(error_of(text),
              AllOf(StartsWith("cal.yaml:11:"), HasSubstr("gemm.alpha"), HasSubstr("bare number")));
  text = kGood;
  text.replace(text.find("beta: 0.5ns/B"), 13, "beta: 0.5");
  EXPECT_THAT(error_of(text), AllOf(StartsWith("cal.yaml:20:"), HasSubstr("collectives[0].beta"),
                                    HasSubstr("time per B")));
}

TEST(CalibrationLoader, OtherErrors) {
  EXPECT_THAT(error_of("gpu: x\n"), HasSubstr("missing required key 'format'"));
  std::string text = kGood;
  text.replace(text.find("efficiency: 0.25"), 16, "efficiency: 1.5");
  EXPECT_THAT(error_of(text), AllOf(StartsWith("cal.yaml:14:"), HasSubstr("(0, 1]")));
  text = kGood;
  text.replace(text.find("algo: linear"), 12, "algo: lineer");
  EXPECT_THAT(error_of(text),
              AllOf(StartsWith("cal.yaml:20:"), HasSubstr("did you mean 'linear'")));
}

// Calibration values are bounded like scenario values, so predictions stay
// finite (a beta of 1e308s/B made every transfer infinite).
TEST(CalibrationLoader, ValuesAreBounded) {
  std::string text = kGood;
  text.replace(text.find("beta: 0.5ns/B"), 13, "beta: 1e308s/B");
  EXPECT_THAT(error_of(text),
              AllOf(StartsWith("cal.yaml:20:"),
                    HasSubstr("collectives[0].beta: found '1e308s/B', expected a time per B such "
                              "as '0.05ns/B' of at most 1s/B")));
  text = kGood;
  text.replace(text.find("{m: 8,"), 6, "{m: 2147483648,");
  EXPECT_THAT(error_of(text),
              AllOf(StartsWith("cal.yaml:14:"),
                    HasSubstr("gemm.efficiency[0].m: found 2147483648, expected an integer in [1, "
                              "2^31-1]")));
}

TEST(CalibrationLoader, MissingFileIsReportedAtTheScenarioKey) {
  const SourceLocation key{"scenario.yaml", 7, 16};
  try {
    load_calibration("/nonexistent/calib.yaml", key);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(StartsWith("scenario.yaml:7:16:"), HasSubstr("cluster.calibration"),
                                HasSubstr("does not exist")));
  }
}

TEST(CalibrationLoader, WriteThenLoadGivesTheSameValues) {
  Calibration c = parse_calibration(kGood, "cal.yaml");
  // Values that have no short decimal form must survive too.
  c.gemm.alpha_gemm = Seconds(1.0 / 3.0 * 1e-5);
  c.collectives[0].fit.beta = std::sqrt(2.0) * 1e-10;
  c.interference = 0.1 + 0.2;
  c.comments = {"a comment", ""};
  const std::string text = calibration_yaml(c);
  const Calibration d = parse_calibration(text, "round.yaml");
  EXPECT_EQ(d.gpu, c.gpu);
  EXPECT_EQ(d.device, c.device);
  EXPECT_EQ(d.ranks, c.ranks);
  EXPECT_EQ(d.gemm.alpha_gemm->value(), c.gemm.alpha_gemm->value());
  EXPECT_EQ(*d.gemm.beta_gemm_s_per_flop, *c.gemm.beta_gemm_s_per_flop);
  ASSERT_EQ(d.gemm.efficiency_table.size(), c.gemm.efficiency_table.size());
  for (size_t i = 0; i < d.gemm.efficiency_table.size(); ++i) {
    EXPECT_EQ(d.gemm.efficiency_table[i].efficiency, c.gemm.efficiency_table[i].efficiency);
    EXPECT_EQ(d.gemm.efficiency_table[i].shape.m, c.gemm.efficiency_table[i].shape.m);
    EXPECT_EQ(d.gemm.efficiency_table[i].shape.batch, c.gemm.efficiency_table[i].shape.batch);
  }
  ASSERT_EQ(d.point_to_point.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(d.point_to_point[i].tier, c.point_to_point[i].tier);
    EXPECT_EQ(d.point_to_point[i].fit.alpha.value(), c.point_to_point[i].fit.alpha.value());
    EXPECT_EQ(d.point_to_point[i].fit.beta, c.point_to_point[i].fit.beta);
  }
  ASSERT_EQ(d.collectives.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(d.collectives[i].type, c.collectives[i].type);
    EXPECT_EQ(d.collectives[i].algo, c.collectives[i].algo);
    EXPECT_EQ(d.collectives[i].ranks, c.collectives[i].ranks);
    EXPECT_EQ(d.collectives[i].fit.alpha.value(), c.collectives[i].fit.alpha.value());
    EXPECT_EQ(d.collectives[i].fit.beta, c.collectives[i].fit.beta);
  }
  EXPECT_EQ(*d.interference, *c.interference);
  // Writing the loaded file again gives the same text (comments aside: they are not read).
  Calibration e = d;
  e.comments = c.comments;
  EXPECT_EQ(calibration_yaml(e), text);
}

// The cache keys on the file's modification time and size: a file rewritten in place is read
// again, an unchanged one is not (the same object comes back).
TEST(CalibrationLoader, CacheRereadsAFileRewrittenInPlace) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / fmt::format("moesim-cal-{}.yaml", ::getpid());
  Calibration c = parse_calibration(kGood, "cal.yaml");
  c.interference = 0.25;
  { std::ofstream(p) << calibration_yaml(c); }
  const auto first = load_calibration_cached(p.string());
  EXPECT_EQ(load_calibration_cached(p.string()).get(), first.get());
  EXPECT_EQ(*first->interference, 0.25);
  c.interference = 0.5;
  { std::ofstream(p) << calibration_yaml(c); }
  // Same size, possibly the same clock tick: move the time on explicitly.
  fs::last_write_time(p, fs::last_write_time(p) + std::chrono::seconds(2));
  const auto second = load_calibration_cached(p.string());
  EXPECT_NE(second.get(), first.get());
  EXPECT_EQ(*second->interference, 0.5);
  EXPECT_EQ(*first->interference, 0.25);  // holders of the old one keep it
  fs::remove(p);
}

TEST(CalibrationLoader, BundledExampleLoads) {
  const Calibration c = load_calibration(std::string(MOESIM_SOURCE_DIR) +
                                         "/scenarios/calibration/a100-2x8-example.yaml");
  EXPECT_EQ(c.ranks, 16);
  EXPECT_NE(c.collective(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 16), nullptr);
  EXPECT_DOUBLE_EQ(c.tier(1)->fit.beta, 4.4e-11);
}

// The H200 GEMM calibration measured in session 17 (one GPU: GEMMs only, 18 fc1 shapes and 5
// batched ones of 8 experts).
TEST(CalibrationLoader, BundledH200MeasurementLoads) {
  const Calibration c = load_calibration(std::string(MOESIM_SOURCE_DIR) +
                                         "/scenarios/calibration/h200-sxm-gemm-measured.yaml");
  EXPECT_EQ(c.gpu, "h200-sxm");
  EXPECT_EQ(c.device, "NVIDIA H200");
  EXPECT_EQ(c.dtype, "fp16");
  EXPECT_EQ(c.ranks, 1);
  ASSERT_EQ(c.gemm.efficiency_table.size(), 23u);
  EXPECT_EQ(std::count_if(c.gemm.efficiency_table.begin(), c.gemm.efficiency_table.end(),
                          [](const GemmEfficiencyPoint& p) { return p.shape.batch == 8; }),
            5);
  ASSERT_TRUE(c.gemm.beta_gemm_s_per_flop.has_value());
  EXPECT_NEAR(1.0 / *c.gemm.beta_gemm_s_per_flop, 885.7e12, 0.1e12);  // 886 TFLOP/s
  EXPECT_TRUE(c.collectives.empty());
  EXPECT_EQ(*c.interference, 0.0);
}

TEST(GemmModel, CalibratedTimeIsAlphaPlusBetaOverRelativeEfficiency) {
  GemmCalibration cal = parse_calibration(kGood, "cal.yaml").gemm;
  const GemmModelParams params;  // launch 5 us: replaced by alpha = 2 us
  // m = 8 is nearest to the 0.25 point; relative to the table's best (1.0):
  // flops = 2 * 8 * 128 * 64 = 131,072; t = 2 us + 131,072 * 1e-12 / 0.25 = 2.524288 us.
  GemmWork w{8, 128, 64, 1, 2.0 * 8 * 128 * 64, 0};
  EXPECT_DOUBLE_EQ(gemm_time(params, cal, FlopsPerSecond(0), BytesPerSecond(0), w).value(),
                   2e-6 + 131072 * 1e-12 / 0.25);
  // The memory roofline still applies: 1 MB at 1 GB/s = 1 ms dominates.
  w.bytes = 1e6;
  EXPECT_DOUBLE_EQ(gemm_time(params, cal, FlopsPerSecond(0), BytesPerSecond(1e9), w).value(),
                   2e-6 + 1e-3);
  // Without calibration: launch + flops / (peak * eff(tile model)).
  const GemmCalibration none;
  const double eff = 0.8 * gemm_tile_utilisation(8, 96) * gemm_tile_utilisation(128, 96) *
                     gemm_tile_utilisation(64, 32);
  w.bytes = 0;
  EXPECT_DOUBLE_EQ(gemm_time(params, none, FlopsPerSecond(1e12), BytesPerSecond(0), w).value(),
                   5e-6 + 131072 / (1e12 * eff));
}

TEST(GemmModel, SharedWeightsAreReadFromHbmOnceWhileTheyFitInL2) {
  // 4 items of 8 x 32 (A) times 32 x 16 (B) at 2 bytes, sharing 2 weight matrices:
  // A + C per item (8*32 + 8*16) * 2 B * 4 = 3,072 B; one weight 32*16*2 = 1,024 B.
  GemmShape g{8, 16, 32, 4, 2};
  const double per_item = 3072, weight = 1024;
  // No L2 known: every item reads its weights (the unbatched formula).
  EXPECT_DOUBLE_EQ(gemm_min_bytes(g, 2), per_item + 4 * weight);
  EXPECT_DOUBLE_EQ(gemm_min_bytes(g, 2), (8 * 32 + 32 * 16 + 8 * 16) * 4 * 2.0);
  // Both weights fit: each is read once.
  EXPECT_DOUBLE_EQ(gemm_min_bytes(g, 2, Bytes(4096)), per_item + 2 * weight);
  EXPECT_DOUBLE_EQ(gemm_min_bytes(g, 2, Bytes(2048)), per_item + 2 * weight);
  // Half of them fit: half of the 2 re-reads come from HBM again.
  EXPECT_DOUBLE_EQ(gemm_min_bytes(g, 2, Bytes(1024)), per_item + 2 * weight + 1 * weight);
  // One weight per item (weights 0, or as many as items): nothing to share.
  for (std::int64_t w : {0, 4, 9}) {
    g.weights = w;
    EXPECT_DOUBLE_EQ(gemm_min_bytes(g, 2, Bytes(1 << 20)), per_item + 4 * weight) << w;
  }
  // Never more than without a cache, never less than each weight once.
  g.weights = 1;
  double prev = gemm_min_bytes(g, 2);
  for (double l2 : {256.0, 512.0, 1024.0, 4096.0}) {
    const double b = gemm_min_bytes(g, 2, Bytes(l2));
    EXPECT_LE(b, prev) << l2;
    EXPECT_GE(b, per_item + weight) << l2;
    prev = b;
  }
}

}  // namespace
}  // namespace moesim
