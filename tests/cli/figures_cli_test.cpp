// The figures people compare (docs/figures.md) as `moesim simulate` and `moesim sweep` print and
// write them: tokens/s/GPU, model TFLOP/s/GPU, MFU and the compute-class breakdown, checked
// against the model FLOPs worked out by hand and the step time read back from the JSON.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.hpp"

namespace {

namespace fs = std::filesystem;
using namespace moesim::cli_test;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() /
               fmt::format("moesim_figures_{}_{}",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                           static_cast<long>(getpid()));
  fs::create_directories(d);
  return d;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  for (auto& l : split(text, '\n'))
    if (!l.empty()) out.push_back(l);
  return out;
}

// Whitespace-separated cells of strategy `name`'s row in simulate's table.
std::vector<std::string> table_row(const std::string& out, const std::string& name) {
  const auto at = out.find("\n" + name + " ");
  if (at == std::string::npos) return {};
  std::istringstream is(out.substr(at + 1, out.find('\n', at + 1) - at - 1));
  std::vector<std::string> cells;
  for (std::string c; is >> c;) cells.push_back(c);
  return cells;
}

// The quickstart: 16 A100s (fp16 peak 312 TFLOP/s), one MoE block of M 1,024, H 4,096, top-2,
// MHA of 8 heads x 128 (the loader's default), L 1,024, B 4, gelu, no vocabulary. Per token
// forward: projections 8 M^2 = 8,388,608, causal core 2 x 512 x 1,024 x 2 = 2,097,152, experts
// 2 x 2 x 1,024 x 4,096 x 2 = 33,554,432; 44,040,192 in all, x 3 for training.
constexpr double kQuickstartFlopsPerToken = 3 * 44040192.0;
constexpr double kQuickstartTokensPerStep = 4 * 1024 * 16;
constexpr double kA100Fp16Peak = 312e12;

TEST(Figures, SimulateJsonTableAndCsvAgreeWithTheModelFlops) {
  const fs::path d = temp_dir();
  const std::string scen = kSource + "/scenarios/quickstart.yaml";
  auto r =
      run(fmt::format("simulate '{}' --engine analytical --iterations 2 --json '{}' --csv "
                      "'{}' --quiet",
                      scen, (d / "o.json").string(), (d / "o.csv").string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("tok/s/GPU"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("TFLOP/s/GPU"));
  const auto j = nlohmann::json::parse(read_file(d / "o.json"));
  ASSERT_EQ(j["runs"].size(), 4u);
  for (const auto& run : j["runs"]) {
    const std::string name = run["strategy"];
    const double step = run["step_time_s"];
    ASSERT_GT(step, 0) << name;
    EXPECT_DOUBLE_EQ(run["tokens_per_step"].get<double>(), kQuickstartTokensPerStep);
    EXPECT_DOUBLE_EQ(run["model_flops_per_token"].get<double>(), kQuickstartFlopsPerToken);
    const double tokens = kQuickstartTokensPerStep / step / 16;
    EXPECT_NEAR(run["tokens_per_s_per_gpu"].get<double>(), tokens, 1e-9 * tokens) << name;
    const double tflops = tokens * kQuickstartFlopsPerToken / 1e12;
    EXPECT_NEAR(run["model_tflops_per_gpu"].get<double>(), tflops, 1e-9 * tflops) << name;
    EXPECT_NEAR(run["mfu"].get<double>(), tflops * 1e12 / kA100Fp16Peak, 1e-9) << name;
    EXPECT_LT(run["mfu"].get<double>(), 1) << name;

    // The compute classes: one compute stream, so they partition compute_s; nothing is flagged
    // recompute and no op is an optimizer step in these plans yet.
    const auto& b = run["breakdown"];
    const double compute = b["compute_s"], gemm = b["gemm_s"], attention = b["attention_s"],
                 memory = b["memory_bound_s"], optimizer = b["optimizer_s"],
                 recompute = b["recompute_s"];
    EXPECT_GT(gemm, 0) << name;
    EXPECT_GT(memory, 0) << name;  // encode, decode
    EXPECT_GE(attention, 0) << name;
    EXPECT_LE(gemm + attention + memory + optimizer, compute * (1 + 1e-9)) << name;
    EXPECT_NEAR(gemm + attention + memory + optimizer, compute, 1e-9 * compute) << name;
    EXPECT_LE(recompute, compute) << name;

    // The table rounds the same figures: tokens/s/GPU to the token, TFLOP/s to 0.1, MFU to 0.1%.
    const auto cells = table_row(r.out, name);
    ASSERT_GE(cells.size(), 11u) << r.out;
    EXPECT_NEAR(std::stod(cells[8]), tokens, 0.5) << r.out;
    EXPECT_NEAR(std::stod(cells[9]), tflops, 0.05) << r.out;
    EXPECT_EQ(cells[10], fmt::format("{:.1f}%", 100 * tflops * 1e12 / kA100Fp16Peak)) << r.out;
  }

  // CSV: one row per (strategy, iteration) with as many fields as the header, the new columns
  // last, each iteration's own figures.
  const auto lines = lines_of(read_file(d / "o.csv"));
  ASSERT_EQ(lines.size(), 1u + 4 * 2);
  const auto head = split(lines[0], ',');
  const std::vector<std::string> tail = {"memory_bytes",          "tokens_per_s_per_gpu",
                                         "model_tflops_per_gpu",  "mfu",
                                         "model_flops_per_token", "gemm_s",
                                         "attention_s",           "memory_bound_s",
                                         "optimizer_s",           "recompute_s"};
  ASSERT_GE(head.size(), tail.size());
  EXPECT_EQ(std::vector<std::string>(head.end() - static_cast<long>(tail.size()), head.end()),
            tail);
  auto col = [&](const std::string& name) {
    return static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
  };
  for (size_t i = 1; i < lines.size(); ++i) {
    const auto f = split(lines[i], ',');
    ASSERT_EQ(f.size(), head.size()) << lines[i];
    EXPECT_GT(std::stod(f[col("memory_bytes")]), 0) << lines[i];
    const double step = std::stod(f[col("step_time_s")]);
    const double tokens = kQuickstartTokensPerStep / step / 16;
    EXPECT_NEAR(std::stod(f[col("tokens_per_s_per_gpu")]), tokens, 1e-6 * tokens) << lines[i];
    EXPECT_NEAR(std::stod(f[col("model_tflops_per_gpu")]), tokens * kQuickstartFlopsPerToken / 1e12,
                1e-6 * tokens * kQuickstartFlopsPerToken / 1e12)
        << lines[i];
    EXPECT_DOUBLE_EQ(std::stod(f[col("model_flops_per_token")]), kQuickstartFlopsPerToken);
    EXPECT_LE(std::stod(f[col("gemm_s")]) + std::stod(f[col("attention_s")]) +
                  std::stod(f[col("memory_bound_s")]) + std::stod(f[col("optimizer_s")]),
              std::stod(f[col("compute_s")]) * (1 + 1e-6))
        << lines[i];
  }
  fs::remove_all(d);
}

// Inference (a batch's forward pass): tokens/s/GPU only; model TFLOP/s and MFU are training
// figures (null in the JSON, "-" in the table). lina-inference: 16 GPUs of B 8 x L 512.
TEST(Figures, InferenceHasTokensPerSecondOnly) {
  const fs::path d = temp_dir();
  auto r = run(fmt::format(
      "simulate '{}/scenarios/lina-inference.yaml' --engine analytical --iterations 1 --strategy "
      "baseline --json '{}' --quiet",
      kSource, (d / "o.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto j = nlohmann::json::parse(read_file(d / "o.json"));
  const auto& run0 = j["runs"][0];
  const double step = run0["step_time_s"];
  const double tokens = 8 * 512 * 16 / step / 16;
  EXPECT_NEAR(run0["tokens_per_s_per_gpu"].get<double>(), tokens, 1e-9 * tokens);
  EXPECT_TRUE(run0["model_tflops_per_gpu"].is_null());
  EXPECT_TRUE(run0["mfu"].is_null());
  // Forward only: 12 blocks of attention (8 M^2 + causal core 2 x 256 x 1,024 x 2), 6 dense FFNs
  // of 4 M (2 x 2 x 1,024 x 4,096) and 6 MoE FFNs of top-2 experts of 4,096.
  EXPECT_DOUBLE_EQ(run0["model_flops_per_token"].get<double>(),
                   12 * (8388608.0 + 1048576) + 6 * 16777216.0 + 6 * 33554432.0);
  const auto cells = table_row(r.out, "baseline");
  ASSERT_GE(cells.size(), 11u) << r.out;
  EXPECT_EQ(cells[9], "-") << r.out;
  EXPECT_EQ(cells[10], "-") << r.out;
  fs::remove_all(d);
}

// A sweep's CSV and JSON carry the same figures per point: tokens/s/GPU follows B.
TEST(Figures, SweepCsvAndJsonCarryTheFigures) {
  const fs::path d = temp_dir();
  {
    std::ofstream os(d / "s.yaml");
    os << fmt::format(
        "name: figures\nbase: {}/scenarios/quickstart.yaml\nset:\n  engine.network: analytical\n"
        "  workload.iterations: 1\nstrategies: [baseline]\naxes:\n  model.batch_per_gpu: [2, 4]\n",
        kSource);
  }
  auto r = run(fmt::format("sweep '{}' --csv '{}' --json '{}' --quiet", (d / "s.yaml").string(),
                           (d / "o.csv").string(), (d / "o.json").string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto lines = lines_of(read_file(d / "o.csv"));
  ASSERT_EQ(lines.size(), 1u + 2);  // header, two points
  const auto head = split(lines[0], ',');
  EXPECT_EQ(head.back(), "wall_s");  // wall-clock stays last
  auto col = [&](const std::string& name) {
    return static_cast<size_t>(std::find(head.begin(), head.end(), name) - head.begin());
  };
  const auto j = nlohmann::json::parse(read_file(d / "o.json"));
  for (int p = 0; p < 2; ++p) {
    const auto f = split(lines[1 + p], ',');
    ASSERT_EQ(f.size(), head.size()) << lines[1 + p];
    const double batch = p == 0 ? 2 : 4;
    const double step = std::stod(f[col("step_time_s")]);
    const double tokens = batch * 1024 * 16 / step / 16;
    EXPECT_NEAR(std::stod(f[col("tokens_per_s_per_gpu")]), tokens, 1e-6 * tokens);
    EXPECT_NEAR(std::stod(f[col("mfu")]), tokens * kQuickstartFlopsPerToken / kA100Fp16Peak, 1e-6);
    const auto& run0 = j["points"][p]["runs"][0];
    EXPECT_NEAR(run0["tokens_per_s_per_gpu"].get<double>(), tokens, 1e-6 * tokens);
    EXPECT_DOUBLE_EQ(run0["model_flops_per_token"].get<double>(), kQuickstartFlopsPerToken);
    EXPECT_TRUE(run0["breakdown"].contains("gemm_s"));
  }
  fs::remove_all(d);
}

}  // namespace
