// Sweeps: expansion (cartesian, zip, ranges) exact, key-path edits, the bad-axis error's line, CSV
// columns, resumability, thread-count independence; plots, the HTML report (rendered in headless
// Chromium when it is installed) and `moesim list` through the binary.
#include "apps/moesim/sweep.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "apps/moesim/html_report.hpp"
#include "apps/moesim/plot.hpp"
#include "apps/moesim/report.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::app {
namespace {

namespace fs = std::filesystem;
const std::string kSource = MOESIM_SOURCE_DIR;
const std::string kBinary = MOESIM_BINARY;
const std::string kQuickstart = kSource + "/scenarios/quickstart.yaml";

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() /
               fmt::format("moesim_sweep_{}_{}",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                           static_cast<long>(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream is(p);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream os(p);
  os << text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream ss(text);
  std::string line;
  while (std::getline(ss, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

// Occurrences of `needle` in `hay`.
std::size_t count_of(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

SweepSpec spec_from(const std::string& yaml) {
  return parse_sweep(parse_yaml_string(yaml, "/tmp/s.yaml"), "/tmp/s.yaml");
}

std::vector<std::vector<std::string>> values_of(const std::vector<SweepPoint>& pts) {
  std::vector<std::vector<std::string>> v;
  for (const auto& p : pts) v.push_back(p.values);
  return v;
}

struct RunOutput {
  int exit_code = -1;
  std::string out;
};

RunOutput run(const std::string& args, const std::string& env = "") {
  std::string cmd = fmt::format("{} '{}' {} 2>&1", env, kBinary, args);
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

// A small, fast sweep over the quickstart scenario on the analytical engine.
std::string small_sweep(const std::string& axes) {
  return fmt::format(
      "name: small\n"
      "base: {}\n"
      "set:\n"
      "  engine.network: analytical\n"
      "  workload.iterations: 2\n"
      "strategies: [baseline, tutel]\n"
      "axes:\n{}",
      kQuickstart, axes);
}

// ---------------------------------------------------------------------------------------------
// Expansion

// The closing line of the simulate table: the fastest stack, its speedup over the baseline row.
TEST(SimulateTable, VerdictNamesTheFastestAndItsSpeedup) {
  auto row = [](std::string name, double step_s) {
    RunSummary r;
    r.strategy = std::move(name);
    r.step_mean_s = step_s;
    return r;
  };
  std::vector<RunSummary> rows = {row("baseline", 4e-3), row("tutel", 3.2e-3), row("lina", 5e-3)};
  apply_speedups(rows, 0);
  EXPECT_EQ(verdict_line(rows),
            "fastest: tutel (3.200 ms per step, 1.25x over baseline at 4.000 ms)");
  // Ties within 0.05% are named together; no baseline row: no speedup.
  rows = {row("a", 2e-3), row("b", 2.0005e-3), row("c", 3e-3)};
  EXPECT_EQ(verdict_line(rows), "fastest: a, b (2.000 ms per step)");
  // The baseline itself can win.
  rows = {row("baseline", 1e-3), row("x", 2e-3)};
  apply_speedups(rows, 0);
  EXPECT_EQ(verdict_line(rows),
            "fastest: baseline (1.000 ms per step, 1.00x over baseline at 1.000 ms)");
  // One row is no comparison.
  rows = {row("baseline", 1e-3)};
  EXPECT_EQ(verdict_line(rows), "");
}

TEST(SweepExpand, CartesianLastAxisFastest) {
  auto spec = spec_from("base: b.yaml\naxes:\n  a.x: [1, 2]\n  b.y: [p, q, r]\n");
  EXPECT_EQ(spec.base_path, "/tmp/b.yaml");
  auto pts = expand_points(spec);
  std::vector<std::vector<std::string>> want = {{"1", "p"}, {"1", "q"}, {"1", "r"},
                                                {"2", "p"}, {"2", "q"}, {"2", "r"}};
  EXPECT_EQ(values_of(pts), want);
  for (size_t i = 0; i < pts.size(); ++i) EXPECT_EQ(pts[i].index, i);
}

TEST(SweepExpand, ZipPairsValues) {
  auto spec = spec_from("base: b.yaml\nmode: zip\naxes:\n  a: [1, 2, 3]\n  b: [x, y, z]\n");
  std::vector<std::vector<std::string>> want = {{"1", "x"}, {"2", "y"}, {"3", "z"}};
  EXPECT_EQ(values_of(expand_points(spec)), want);
}

TEST(SweepExpand, ZipOfUnequalLengthsNamesTheLine) {
  try {
    spec_from("base: b.yaml\nmode: zip\naxes:\n  a: [1, 2, 3]\n  b: [x, y]\n");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.location().line, 5);
    EXPECT_NE(std::string(e.what()).find("found 2 values, expected 3"), std::string::npos)
        << e.what();
  }
}

TEST(SweepExpand, Ranges) {
  auto spec = spec_from(
      "base: b.yaml\naxes:\n"
      "  n: {from: 2, to: 64, times: 2}\n"
      "  h: {from: 1024, to: 4096, step: 1024}\n"
      "  f: {from: 0.5, to: 1.5, step: 0.25}\n"
      "  bw: {from: 100Gb/s, to: 400Gb/s, times: 2}\n"
      "  down: {from: 4, to: 1, step: -1}\n"
      "  odd: {from: 1, to: 10, times: 3}\n");
  ASSERT_EQ(spec.axes.size(), 6u);
  EXPECT_EQ(spec.axes[0].values, (std::vector<std::string>{"2", "4", "8", "16", "32", "64"}));
  EXPECT_TRUE(spec.axes[0].geometric);
  EXPECT_EQ(spec.axes[1].values, (std::vector<std::string>{"1024", "2048", "3072", "4096"}));
  EXPECT_FALSE(spec.axes[1].geometric);
  EXPECT_EQ(spec.axes[2].values, (std::vector<std::string>{"0.5", "0.75", "1", "1.25", "1.5"}));
  EXPECT_EQ(spec.axes[3].values, (std::vector<std::string>{"100Gb/s", "200Gb/s", "400Gb/s"}));
  EXPECT_EQ(spec.axes[4].values, (std::vector<std::string>{"4", "3", "2", "1"}));
  EXPECT_EQ(spec.axes[5].values, (std::vector<std::string>{"1", "3", "9"}));  // 27 > 10
  EXPECT_EQ(expand_points(spec).size(), 6u * 4 * 5 * 3 * 4 * 3);
}

TEST(SweepExpand, BadRangesAreInputErrors) {
  EXPECT_THROW(spec_from("base: b\naxes:\n  a: {from: 1, to: 4}\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes:\n  a: {from: 1, to: 4, step: 1, times: 2}\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes:\n  a: {from: 1, to: 4, step: -1}\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes:\n  a: {from: 1, to: 4, step: 0}\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes:\n  a: {from: 1Gb/s, to: 4GB/s, times: 2}\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes:\n  a: []\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes:\n  a..b: [1]\n"), InputError);
  EXPECT_THROW(spec_from("base: b\naxes: {}\n"), InputError);
  EXPECT_THROW(spec_from("axes:\n  a: [1]\n"), InputError);           // no base
  EXPECT_THROW(spec_from("base: b\naxis:\n  a: [1]\n"), InputError);  // unknown key
}

TEST(SweepKeyPath, SetsNestedCreatesMapsAndIndexesLists) {
  YAML::Node root = YAML::Load("a: {b: 1}\nl: [{x: 1}, {x: 2}]\ns: 3\n");
  set_key_path(root, "a.b", YAML::Node("7"), {});
  set_key_path(root, "a.c.d", YAML::Node("8"), {});
  set_key_path(root, "l[1].x", YAML::Node("9"), {});
  EXPECT_EQ(root["a"]["b"].as<int>(), 7);
  EXPECT_EQ(root["a"]["c"]["d"].as<int>(), 8);
  EXPECT_EQ(root["l"][0]["x"].as<int>(), 1);
  EXPECT_EQ(root["l"][1]["x"].as<int>(), 9);
  EXPECT_EQ(root["s"].as<int>(), 3);
  EXPECT_THROW(set_key_path(root, "s.t", YAML::Node("1"), {}), InputError);
  EXPECT_THROW(set_key_path(root, "l[5].x", YAML::Node("1"), {}), InputError);
}

TEST(SweepValidate, BadAxisKeyNamesTheSweepLine) {
  fs::path d = temp_dir();
  fs::path f = d / "bad.yaml";
  write_file(f, small_sweep("  model.capacity_factor: [1.0]\n  model.hiden_dim: [1024]\n"));
  SweepSpec spec = load_sweep(f.string());
  try {
    validate_sweep(spec);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.location().file, f.string());
    EXPECT_EQ(e.location().line, 9);  // the model.hiden_dim line
    std::string what = e.what();
    EXPECT_NE(what.find("hiden_dim"), std::string::npos) << what;
    EXPECT_NE(what.find("hidden_dim"), std::string::npos) << what;  // did you mean
  }
  // A bad value type on a valid key is reported at the axis too.
  write_file(f, small_sweep("  cluster.nodes: [two]\n"));
  try {
    validate_sweep(load_sweep(f.string()));
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.location().line, 8);
  }
  // And an unknown strategy in the subset.
  write_file(f, fmt::format("base: {}\nstrategies: [baseline, nope]\naxes:\n  model.top_k: [1]\n",
                            kQuickstart));
  EXPECT_THROW(validate_sweep(load_sweep(f.string())), InputError);
}

// ---------------------------------------------------------------------------------------------
// Running, CSV, resume

TEST(SweepRun, CsvHasOneRowPerPointAndStrategyWithEveryAxis) {
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.capacity_factor: [1.0, 2.0]\n"
                                       "  model.top_k: [1, 2]\n"));
  SweepOptions o;
  o.jobs = 2;
  o.csv_path = (d / "out.csv").string();
  o.json_path = (d / "out.json").string();
  o.progress = false;
  SweepResult r = run_sweep(load_sweep((d / "s.yaml").string()), o);
  EXPECT_EQ(r.points_total, 4u);
  EXPECT_EQ(r.points_run, 4u);
  EXPECT_EQ(r.engine, "analytical");
  auto lines = lines_of(read_file(d / "out.csv"));
  ASSERT_EQ(lines.size(), 1u + 4 * 2);
  // The CSV is plain (pandas.read_csv reads it as it is); the setup's fingerprint sits beside it.
  const SweepFingerprint fp = sweep_fingerprint(load_sweep((d / "s.yaml").string()), "");
  const auto side = lines_of(read_file(d / "out.csv.fingerprint"));
  ASSERT_EQ(side.size(), 1u);
  EXPECT_EQ(side[0], fp.csv_comment());
  EXPECT_EQ(side[0].rfind("# moesim sweep fingerprint=" + fp.hash() + " version=", 0), 0u)
      << side[0];
  EXPECT_EQ(lines[0],
            "point,model.capacity_factor,model.top_k,scenario,strategy,topology,gpus,step_time_s,"
            "step_time_p50_s,step_time_p95_s,moe_layer_time_s,a2a_s,allreduce_s,compute_s,"
            "exposed_comm_s,speedup_vs_baseline,decisions,memory_bytes,gpu_memory_bytes,"
            "fits_memory,tokens_per_s_per_gpu,model_tflops_per_gpu,mfu,model_flops_per_token,"
            "gemm_s,attention_s,memory_bound_s,optimizer_s,recompute_s,wall_s");
  // Sorted by point, strategies in the subset's order; axis values verbatim.
  std::vector<std::string> want_prefix = {
      "0,1.0,1,quickstart,baseline,", "0,1.0,1,quickstart,tutel,",
      "1,1.0,2,quickstart,baseline,", "1,1.0,2,quickstart,tutel,",
      "2,2.0,1,quickstart,baseline,", "2,2.0,1,quickstart,tutel,",
      "3,2.0,2,quickstart,baseline,", "3,2.0,2,quickstart,tutel,"};
  for (size_t i = 0; i < want_prefix.size(); ++i)
    EXPECT_EQ(lines[i + 1].rfind(want_prefix[i], 0), 0u) << lines[i + 1];
  for (const auto& row : r.rows) {
    EXPECT_EQ(row.summary.gpus, 16);
    EXPECT_GT(row.summary.step_mean_s, 0);
    // The memory estimate and the quickstart GPU's 80 GiB; a small layer fits.
    EXPECT_GT(row.summary.memory_bytes, 0);
    EXPECT_DOUBLE_EQ(row.summary.gpu_memory_bytes, 80.0 * 1024 * 1024 * 1024);
    EXPECT_TRUE(row.summary.fits_memory());
    if (row.summary.strategy == "baseline") {
      EXPECT_DOUBLE_EQ(row.summary.speedup, 1.0);
    }
  }
  // The axis really reaches the scenario: doubling the capacity factor costs the baseline time.
  EXPECT_GT(r.rows[4].summary.step_mean_s, r.rows[0].summary.step_mean_s);
  auto j = nlohmann::json::parse(read_file(d / "out.json"));
  EXPECT_EQ(j["fingerprint"]["hash"], fp.hash());
  EXPECT_EQ(j["fingerprint"]["engine"], "analytical");
  EXPECT_EQ(j["fingerprint"]["base_scenario"], fp.base);
  ASSERT_EQ(j["points"].size(), 4u);
  // Axis values are numbers where the YAML value is one (pandas gets numeric columns).
  EXPECT_EQ(j["points"][3]["parameters"]["model.top_k"], 2);
  EXPECT_TRUE(j["points"][3]["parameters"]["model.top_k"].is_number_integer());
  EXPECT_TRUE(j["axes"][0]["values"][0].is_number()) << j["axes"][0];
  EXPECT_EQ(j["points"][3]["runs"].size(), 2u);
  EXPECT_EQ(j["points"][3]["runs"][1]["strategy"], "tutel");
  EXPECT_TRUE(j["points"][3]["runs"][1].contains("memory_bytes"));
  // The CSV's memory column is the row's estimate, rounded to whole bytes.
  EXPECT_NE(lines[1].find(fmt::format(",{:.0f},{:.0f},1,", r.rows[0].summary.memory_bytes,
                                      r.rows[0].summary.gpu_memory_bytes)),
            std::string::npos)
      << lines[1];
}

TEST(SweepRun, ResumesSkippingPointsAlreadyInTheCsv) {
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.capacity_factor: [1.0, 2.0, 3.0]\n"));
  SweepOptions o;
  o.jobs = 1;
  o.csv_path = (d / "out.csv").string();
  o.progress = false;
  auto spec = load_sweep((d / "s.yaml").string());
  SweepResult first = run_sweep(spec, o);
  EXPECT_EQ(first.points_run, 3u);
  std::string full = read_file(d / "out.csv");
  auto lines = lines_of(full);
  ASSERT_EQ(lines.size(), 7u);  // header, 3 points x 2 strategies

  // Interrupted run: point 2 is missing, point 1 lost its tutel row, and a line was cut short.
  write_file(d / "out.csv", lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n" + lines[3] + "\n" +
                                lines[5].substr(0, 20));
  SweepResult second = run_sweep(spec, o);
  EXPECT_EQ(second.points_skipped, 1u);
  EXPECT_EQ(second.points_run, 2u);
  auto again = lines_of(read_file(d / "out.csv"));
  ASSERT_EQ(again.size(), 7u);
  EXPECT_EQ(again[0], lines[0]);
  EXPECT_EQ(again[1], lines[1]);  // resumed rows are kept as written (wall_s included)
  EXPECT_EQ(again[2], lines[2]);
  for (size_t i = 3; i < 7; ++i) {
    // Re-run rows: the same results but for the wall-clock column.
    EXPECT_EQ(again[i].substr(0, again[i].rfind(',')), lines[i].substr(0, lines[i].rfind(',')));
  }
  // Everything done: nothing runs.
  SweepResult third = run_sweep(spec, o);
  EXPECT_EQ(third.points_skipped, 3u);
  EXPECT_EQ(third.points_run, 0u);
  EXPECT_EQ(third.rows.size(), 6u);

  // A CSV of another sweep is not appended to.
  write_file(d / "other.csv", "point,foo,scenario\n");
  write_file(d / "other.csv.fingerprint", read_file(d / "out.csv.fingerprint"));
  o.csv_path = (d / "other.csv").string();
  EXPECT_THROW(run_sweep(spec, o), InputError);
}

// A serving sweep over the request rate: one row of serving figures per point and strategy
// (the columns of `simulate --csv` on a serving scenario), throughput that grows with the rate,
// the curve's rows in the report, and a resume that reads the figures back.
TEST(SweepRun, ServingRateSweepWritesServingFiguresAndResumes) {
  fs::path d = temp_dir();
  write_file(d / "s.yaml", fmt::format("name: rate\n"
                                       "base: {}/scenarios/serving-mixtral-h100.yaml\n"
                                       "set:\n"
                                       "  engine.network: analytical\n"
                                       "  serving.requests.count: 200\n"
                                       "strategies: [grouped]\n"
                                       "axes:\n"
                                       "  serving.requests.requests_per_s: [2, 16, 64]\n",
                                       kSource));
  SweepOptions o;
  o.jobs = 2;
  o.csv_path = (d / "out.csv").string();
  o.json_path = (d / "out.json").string();
  o.progress = false;
  const auto spec = load_sweep((d / "s.yaml").string());
  const SweepResult r = run_sweep(spec, o);
  ASSERT_EQ(r.rows.size(), 3u);
  const auto lines = lines_of(read_file(d / "out.csv"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "point,serving.requests.requests_per_s,scenario,strategy,topology,gpus,requests,"
            "ttft_p50_s,ttft_p90_s,ttft_p99_s,tpot_p50_s,tpot_p90_s,tpot_p99_s,e2e_p50_s,"
            "input_tokens_per_s_per_node,output_tokens_per_s_per_node,"
            "output_tokens_per_s_per_user,goodput_requests_per_s,slo_attainment,kv_utilization,"
            "preemptions,wall_s");
  EXPECT_EQ(lines[1].rfind("0,2,serving-mixtral-h100,grouped,serving-mixtral-h100,16,200,", 0), 0u)
      << lines[1];
  for (std::size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(r.rows[i].serving.has_value());
    const ServingRowFigures& f = *r.rows[i].serving;
    EXPECT_DOUBLE_EQ(f.requests, 200);
    EXPECT_GT(f.tpot_p50_s, 0);
    EXPECT_LE(f.ttft_p50_s, f.ttft_p99_s);
    EXPECT_LE(f.slo_attainment, 1.0);
    // The axis reaches the deployment: eight and four times the rate, more tokens per node.
    if (i > 0) {
      EXPECT_GT(f.output_tokens_per_s_per_node,
                2 * r.rows[i - 1].serving->output_tokens_per_s_per_node);
    }
  }
  const auto j = nlohmann::json::parse(read_file(d / "out.json"));
  ASSERT_EQ(j["points"].size(), 3u);
  EXPECT_GT(j["points"][2]["runs"][0]["tpot_s"]["p50"].get<double>(), 0);
  // Resumed: nothing runs, and the figures come back from the CSV as written.
  const SweepResult again = run_sweep(spec, o);
  EXPECT_EQ(again.points_skipped, 3u);
  EXPECT_EQ(again.points_run, 0u);
  EXPECT_EQ(lines_of(read_file(d / "out.csv")), lines);
  ASSERT_TRUE(again.rows[2].serving.has_value());
  EXPECT_NEAR(again.rows[2].serving->output_tokens_per_s_per_node,
              r.rows[2].serving->output_tokens_per_s_per_node,
              1e-8 * r.rows[2].serving->output_tokens_per_s_per_node);
  // The command line prints the serving table and the report lists the curve's rows.
  const auto cli = run(
      fmt::format("sweep '{}' -q --report '{}'", (d / "s.yaml").string(), (d / "r.html").string()));
  ASSERT_EQ(cli.exit_code, 0) << cli.out;
  EXPECT_NE(cli.out.find("TPOT p50"), std::string::npos) << cli.out;
  const std::string html = read_file(d / "r.html");
  EXPECT_NE(html.find("output tokens/s/node"), std::string::npos);
  EXPECT_EQ(count_of(html, "<td>grouped</td>"), 3u);
  fs::remove_all(d);
}

TEST(SweepFingerprintTest, ValuesCountCommentsAndLayoutDoNot) {
  fs::path d = temp_dir();
  write_file(d / "b.yaml", read_file(kQuickstart));
  auto fp_of = [&](const std::string& set) {
    write_file(d / "s.yaml", fmt::format("base: b.yaml\nset:\n{}axes:\n  model.top_k: [1]\n", set));
    return sweep_fingerprint(load_sweep((d / "s.yaml").string()), "");
  };
  const SweepFingerprint a = fp_of("  workload.iterations: 2\n");
  EXPECT_EQ(a.base.size(), 16u);
  // A comment, flow style and quoting: the same tree.
  EXPECT_EQ(fp_of("  workload.iterations: '2'   # two\n").base, a.base);
  write_file(d / "b.yaml", "# a comment\n" + read_file(kQuickstart));
  EXPECT_EQ(fp_of("  workload.iterations: 2\n").base, a.base);
  // A value: another base; the axes, engine and version are untouched.
  const SweepFingerprint b = fp_of("  workload.iterations: 3\n");
  EXPECT_NE(b.base, a.base);
  EXPECT_EQ(b.axes, a.axes);
  EXPECT_EQ(b.engine, a.engine);
  EXPECT_EQ(b.differences(a).size(), 1u);
  EXPECT_EQ(b.differences(a)[0].rfind("the base scenario (", 0), 0u) << b.differences(a)[0];
  // The comment line round-trips.
  auto parsed = SweepFingerprint::parse(b.csv_comment());
  ASSERT_TRUE(parsed.has_value());
  EXPECT_TRUE(b.differences(*parsed).empty());
  EXPECT_EQ(parsed->hash(), b.hash());
  EXPECT_FALSE(SweepFingerprint::parse("point,model.top_k,scenario").has_value());
}

// A resumed sweep never reports figures of another setup. Reruns with a changed base
// value (through the sweep file's `set:`) or another engine exit 2 naming what differs; an
// unchanged rerun resumes; --restart recomputes.
TEST(SweepCli, ResumeRefusesRowsOfAnotherSetup) {
  fs::path d = temp_dir();
  // Quickstart's nodes are joined by 200 Gb/s NICs; 25 Gb/s makes its all-to-alls far slower.
  auto sweep_with = [&](const std::string& nic) {
    write_file(d / "s.yaml", fmt::format("name: nic\n"
                                         "base: {}\n"
                                         "set:\n"
                                         "  engine.network: analytical\n"
                                         "  workload.iterations: 2\n"
                                         "  cluster.inter_node.nic_bandwidth: {}\n"
                                         "strategies: [baseline]\n"
                                         "axes:\n"
                                         "  model.capacity_factor: [1.0, 2.0]\n",
                                         kQuickstart, nic));
  };
  const std::string cmd = fmt::format("sweep '{0}/s.yaml' --quiet --csv '{0}/o.csv'", d.string());
  sweep_with("200Gb/s");
  auto first = run(cmd);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  EXPECT_NE(first.out.find("(2 run, 0 resumed)"), std::string::npos) << first.out;
  const std::string fast = read_file(d / "o.csv");

  // Unchanged: every point resumes, the file is the same.
  auto same = run(cmd);
  ASSERT_EQ(same.exit_code, 0) << same.out;
  EXPECT_NE(same.out.find("(0 run, 2 resumed)"), std::string::npos) << same.out;
  EXPECT_EQ(read_file(d / "o.csv"), fast);

  // The base scenario changed (through `set:`): refused, the file untouched.
  sweep_with("25Gb/s");
  auto changed = run(cmd);
  EXPECT_EQ(changed.exit_code, 2) << changed.out;
  EXPECT_NE(changed.out.find(fmt::format("--csv {}/o.csv: the file holds rows of another setup; "
                                         "this run differs in the base scenario (",
                                         d.string())),
            std::string::npos)
      << changed.out;
  EXPECT_NE(changed.out.find("pass --restart"), std::string::npos) << changed.out;
  EXPECT_EQ(changed.out.find("the engine ("), std::string::npos) << changed.out;
  EXPECT_EQ(read_file(d / "o.csv"), fast);

  // Another engine: refused, naming the engines.
  sweep_with("200Gb/s");
  auto engine = run(cmd + " --engine flow");
  EXPECT_EQ(engine.exit_code, 2) << engine.out;
  EXPECT_NE(engine.out.find("this run differs in the engine (analytical in the file, flow now)"),
            std::string::npos)
      << engine.out;
  EXPECT_EQ(read_file(d / "o.csv"), fast);

  // --restart: every point runs again on the slow NICs; the new figures are slower.
  sweep_with("25Gb/s");
  auto restart = run(cmd + " --restart");
  ASSERT_EQ(restart.exit_code, 0) << restart.out;
  EXPECT_NE(restart.out.find("(2 run, 0 resumed)"), std::string::npos) << restart.out;
  auto step_times = [](const std::string& csv) {
    std::vector<double> t;
    auto lines = lines_of(csv);
    auto cols = split_csv_line(lines.at(0));
    auto col = std::find(cols.begin(), cols.end(), "step_time_s") - cols.begin();
    for (std::size_t i = 1; i < lines.size(); ++i)
      t.push_back(std::stod(split_csv_line(lines[i]).at(static_cast<std::size_t>(col))));
    return t;
  };
  auto before = step_times(fast), after = step_times(read_file(d / "o.csv"));
  ASSERT_EQ(before.size(), 2u);
  ASSERT_EQ(after.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) EXPECT_GT(after[i], before[i] * 1.5) << i;
  // And the restarted file resumes under its new setup.
  auto resumed = run(cmd);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("(0 run, 2 resumed)"), std::string::npos) << resumed.out;

  // A CSV without a fingerprint (neither beside it nor on its first line): refused too.
  auto lines = lines_of(fast);
  const std::string side = read_file(d / "o.csv.fingerprint");
  write_file(d / "o.csv", lines[0] + "\n" + lines[1] + "\n");
  fs::remove(d / "o.csv.fingerprint");
  auto old = run(cmd);
  EXPECT_EQ(old.exit_code, 2) << old.out;
  EXPECT_NE(old.out.find("the file has no sweep fingerprint (" +
                         (d / "o.csv.fingerprint").string() + " is missing"),
            std::string::npos)
      << old.out;
  // A CSV of an older moesim, its fingerprint on its first line: resumed.
  write_file(d / "o.csv", side + lines[0] + "\n" + lines[1] + "\n");
  auto legacy = run(cmd);
  ASSERT_EQ(legacy.exit_code, 0) << legacy.out;
  EXPECT_NE(legacy.out.find("(1 run, 1 resumed)"), std::string::npos) << legacy.out;
  EXPECT_EQ(lines_of(read_file(d / "o.csv")).size(), 3u);  // plain again: header, 2 rows
}

// sweep --set: the same rows as the edit written in the file's `set:` (and the same fingerprint,
// since the fingerprint hashes the edited base); a resume with another --set is refused; a --set on
// a key an axis varies is an error, not silently replaced at every point.
TEST(SweepCli, SetOnTheCommandLineIsLikeSetInTheFile) {
  fs::path d = temp_dir();
  const std::string axes = "  model.capacity_factor: [1.0, 2.0]\n";
  write_file(d / "plain.yaml", small_sweep(axes));
  std::string in_file = small_sweep(axes);
  in_file.replace(in_file.find("set:\n") + 5, 0, "  cluster.inter_node.nic_bandwidth: 25Gb/s\n");
  write_file(d / "in_file.yaml", in_file);
  auto f = run(fmt::format("sweep '{0}/in_file.yaml' --quiet --csv '{0}/f.csv'", d.string()));
  ASSERT_EQ(f.exit_code, 0) << f.out;
  const std::string cmd = fmt::format(
      "sweep '{0}/plain.yaml' --quiet --csv '{0}/c.csv' --set "
      "cluster.inter_node.nic_bandwidth=25Gb/s",
      d.string());
  auto c = run(cmd);
  ASSERT_EQ(c.exit_code, 0) << c.out;
  const auto fl = lines_of(read_file(d / "f.csv")), cl = lines_of(read_file(d / "c.csv"));
  ASSERT_EQ(fl.size(), 1u + 4u);  // header, 2 points x 2 strategies
  ASSERT_EQ(cl.size(), fl.size());
  EXPECT_EQ(read_file(d / "c.csv.fingerprint"), read_file(d / "f.csv.fingerprint"));
  // Every row but its last field (wall_s).
  for (std::size_t i = 1; i < fl.size(); ++i)
    EXPECT_EQ(cl[i].substr(0, cl[i].rfind(',')), fl[i].substr(0, fl[i].rfind(','))) << i;
  // The plain sweep is faster: 200 Gb/s NICs.
  auto p = run(fmt::format("sweep '{0}/plain.yaml' --quiet --csv '{0}/p.csv'", d.string()));
  ASSERT_EQ(p.exit_code, 0) << p.out;
  EXPECT_NE(read_file(d / "p.csv.fingerprint"), read_file(d / "c.csv.fingerprint"));

  // Resumed with the same --set: every point skipped; with another: refused, the file untouched.
  auto same = run(cmd);
  ASSERT_EQ(same.exit_code, 0) << same.out;
  EXPECT_NE(same.out.find("(0 run, 2 resumed)"), std::string::npos) << same.out;
  const std::string before = read_file(d / "c.csv");
  auto other =
      run(fmt::format("sweep '{0}/plain.yaml' --quiet --csv '{0}/c.csv' --set "
                      "cluster.inter_node.nic_bandwidth=50Gb/s",
                      d.string()));
  EXPECT_EQ(other.exit_code, 2) << other.out;
  EXPECT_NE(other.out.find("this run differs in the base scenario"), std::string::npos)
      << other.out;
  EXPECT_EQ(read_file(d / "c.csv"), before);

  // A key the axes vary, and a value the scenario rejects.
  auto axis = run(fmt::format("sweep '{}/plain.yaml' --set model.capacity_factor=4", d.string()));
  EXPECT_EQ(axis.exit_code, 2) << axis.out;
  EXPECT_NE(axis.out.find(fmt::format("--set: model.capacity_factor: the sweep varies "
                                      "'model.capacity_factor' (axis at {}/plain.yaml:8)",
                                      d.string())),
            std::string::npos)
      << axis.out;
  auto bad = run(fmt::format("sweep '{}/plain.yaml' --set model.top_k=abc", d.string()));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("model.top_k: found 'abc'"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("--set"), std::string::npos) << bad.out;
}

TEST(SweepRun, ResultsDoNotDependOnTheNumberOfJobs) {
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  cluster.nodes: [1, 2]\n"
                                       "  parallelism.ep: [auto]\n"
                                       "  model.hidden_dim: {from: 1024, to: 3072, step: 1024}\n"));
  auto spec = load_sweep((d / "s.yaml").string());
  SweepOptions o;
  o.progress = false;
  o.jobs = 1;
  SweepResult one = run_sweep(spec, o);
  o.jobs = 3;
  SweepResult three = run_sweep(spec, o);
  ASSERT_EQ(one.rows.size(), 12u);
  ASSERT_EQ(three.rows.size(), one.rows.size());
  for (size_t i = 0; i < one.rows.size(); ++i) {
    EXPECT_EQ(one.rows[i].point, three.rows[i].point);
    EXPECT_EQ(one.rows[i].summary.strategy, three.rows[i].summary.strategy);
    EXPECT_EQ(one.rows[i].summary.step_mean_s, three.rows[i].summary.step_mean_s);
  }
  EXPECT_EQ(one.rows[0].summary.gpus, 8);
  EXPECT_EQ(one.rows[11].summary.gpus, 16);
}

TEST(SweepRun, SetEntriesApplyTogetherAndMayReplaceTheStrategies) {
  fs::path d = temp_dir();
  // cluster.nodes: 1 alone contradicts the base's ep = 16; with parallelism.ep it is fine.
  write_file(
      d / "s.yaml",
      fmt::format("base: {}\n"
                  "set:\n"
                  "  cluster.nodes: 1\n"
                  "  parallelism.ep: 8\n"
                  "  engine.network: analytical\n"
                  "  workload.iterations: 1\n"
                  "  strategies: [{{name: base1, pipeline: 1}}, {{name: two, pipeline: 2}}]\n"
                  "strategies: [two]\n"
                  "axes:\n"
                  "  model.top_k: [1, 2]\n",
                  kQuickstart));
  SweepOptions o;
  o.progress = false;
  SweepResult r = run_sweep(load_sweep((d / "s.yaml").string()), o);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].summary.strategy, "two");
  EXPECT_EQ(r.rows[0].summary.gpus, 8);
  EXPECT_EQ(r.rows[0].summary.decisions.rfind("r=2 ", 0), 0u) << r.rows[0].summary.decisions;
  EXPECT_EQ(r.rows[0].summary.speedup, 0);  // no baseline among the selected strategies
}

TEST(SweepCsv, QuotingRoundTrips) {
  std::vector<std::string> fields = {"plain", "a,b", "say \"hi\"", ""};
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) line += ',';
    line += csv_field(fields[i]);
  }
  EXPECT_EQ(line, "plain,\"a,b\",\"say \"\"hi\"\"\",");
  EXPECT_EQ(split_csv_line(line), fields);
}

// ---------------------------------------------------------------------------------------------
// The ETA of weighted (flow, SimGrid) sweeps

TEST(SweepEta, FitsTheGpuExponentAndSharesTheWorkLeft) {
  // Finished: 2 GPUs in 4 s and 4 GPUs in 16 s, one run each: slope exactly 2 (the prior too),
  // so cost = 1 s x GPUs^2. Left: 8 GPUs (64 s) and 2 GPUs (4 s).
  std::vector<EtaPoint> pts = {{2, 1, 4.0}, {4, 1, 16.0}, {8, 1}, {2, 1}};
  EXPECT_NEAR(weighted_eta_s(pts, 1), 68.0, 1e-9);
  EXPECT_NEAR(weighted_eta_s(pts, 2), 64.0, 1e-9);  // the 8-GPU point alone takes 64 s
  EXPECT_NEAR(weighted_eta_s(pts, 8), 64.0, 1e-9);
  // A finished point without a time (wall 0) is neither done work nor work left.
  pts.push_back({16, 1, 0.0});
  EXPECT_NEAR(weighted_eta_s(pts, 1), 68.0, 1e-9);
  // Nothing finished with a time: no estimate.
  EXPECT_EQ(weighted_eta_s({{2, 1}, {4, 1}}, 1), 0.0);
}

TEST(SweepEta, TheFittedExponentIsPulledTowardsThePrior) {
  // 1 GPU in 1 s and 100 GPUs in 100 s: slope 1 over sxx = 2 (ln 100 / 2)^2 = 10.604, pulled
  // towards 2 with weight 2: b = (10.604 + 4) / (10.604 + 2) = 1.158682. t0 = 101 s / (1 + 100^b);
  // a 10-GPU point of 1 run costs t0 10^b = 6.975 s, one of 3 runs three times that.
  std::vector<EtaPoint> pts = {{1, 1, 1.0}, {100, 1, 100.0}, {10, 1}, {10, 3}};
  EXPECT_NEAR(weighted_eta_s(pts, 1), 27.900547, 1e-5);
  EXPECT_NEAR(weighted_eta_s(pts, 2), 3 * 6.975137, 1e-5);  // the 3-run point is the tail
}

// ---------------------------------------------------------------------------------------------
// Through the binary: plots, reports, list

TEST(SweepCli, PlotReportAndProgress) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot not installed";
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.capacity_factor: [1.0, 1.5, 2.0]\n"));
  auto r =
      run(fmt::format("sweep '{0}/s.yaml' --jobs 2 --csv '{0}/o.csv' --plot '{0}/p.svg' "
                      "--report '{0}/r.html'",
                      d.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("moesim sweep: 3/3 points (100%)"), std::string::npos) << r.out;
  std::string svg = read_file(d / "p.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("baseline"), std::string::npos);
  EXPECT_NE(svg.find("tutel"), std::string::npos);
  EXPECT_TRUE(fs::exists(d / "p.gp"));
  EXPECT_TRUE(fs::exists(d / "p.dat"));
  EXPECT_NE(read_file(d / "p.gp").find("p.dat"), std::string::npos);
  std::string html = read_file(d / "r.html");
  EXPECT_NE(html.find("<table id=\"comparison\">"), std::string::npos);
  EXPECT_NE(html.find("<svg"), std::string::npos);  // the plot inline
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);  // self-contained
}

TEST(SweepCli, CompareBarsAndReport) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot not installed";
  fs::path d = temp_dir();
  auto r = run(fmt::format(
      "compare '{0}' --engine analytical --iterations 2 --topology '{1}/a100-4x4-ib100.yaml' "
      "--topology '{1}/dgx-a100-2x8.yaml' --plot '{2}/c.png' --report '{2}/c.html'",
      kQuickstart, kSource + "/scenarios/topologies", d.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::string png = read_file(d / "c.png");
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  std::string gp = read_file(d / "c.gp");
  EXPECT_NE(gp.find("histogram"), std::string::npos);
  std::string dat = read_file(d / "c.dat");
  EXPECT_NE(dat.find("\"baseline\""), std::string::npos);
  EXPECT_EQ(lines_of(dat).size(), 3u);  // header + two topologies
  std::string html = read_file(d / "c.html");
  EXPECT_NE(html.find("data:image/png;base64,"), std::string::npos);
  EXPECT_NE(html.find("Decisions per iteration"), std::string::npos);
  EXPECT_NE(html.find("a100-4x4-ib100"), std::string::npos);
  // The scenario box does not name the file's own cluster as if the runs used it.
  EXPECT_NE(html.find("one per topology (below); the description is the scenario file&#39;s"),
            std::string::npos)
      << html.substr(0, 3000);
}

// `simulate --report`: the one-topology page of the same writer, with the scenario's cluster.
TEST(SweepCli, SimulateReport) {
  fs::path d = temp_dir();
  auto r = run(fmt::format("simulate '{}' --engine analytical --report '{}/s.html' -q", kQuickstart,
                           d.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string html = read_file(d / "s.html");
  EXPECT_NE(html.find("<title>moesim simulate: quickstart</title>"), std::string::npos);
  EXPECT_NE(html.find("2 nodes x 8 a100-sxm-80gb"), std::string::npos);
  for (const char* s : {"baseline", "tutel", "pipemoe", "ta_moe"})
    EXPECT_NE(html.find(fmt::format(">{}<", s)), std::string::npos) << s;
  EXPECT_NE(html.find("Decisions per iteration"), std::string::npos);
  auto bad =
      run(fmt::format("simulate '{}' --collective all_to_all --size 1MiB --report '{}/x.html'",
                      kQuickstart, d.string()));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_FALSE(fs::exists(d / "x.html"));
}

// The `plot ` commands of a gnuplot script, each with the `lc rgb '#......'` colours of its lines.
std::vector<std::vector<std::string>> plot_colours(const std::string& gp) {
  std::vector<std::vector<std::string>> plots;
  bool in_plot = false;
  for (const auto& line : lines_of(gp)) {
    if (line.rfind("plot ", 0) == 0) {
      plots.emplace_back();
      in_plot = true;
    } else if (!in_plot || line.rfind("     ", 0) != 0) {
      in_plot = false;
      continue;
    }
    const auto at = line.find("lc rgb '");
    if (at != std::string::npos) plots.back().push_back(line.substr(at + 8, 7));
  }
  return plots;
}

// At most 8 lines per panel, distinct colours in a panel, one colour per name across
// panels. 10 series in one panel become two panels of 8 and 2.
TEST(SweepPlot, PanelsHoldAtMostEightSeriesWithDistinctColours) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot not installed";
  fs::path d = temp_dir();
  LineChart c;
  c.title = "ten";
  c.xlabel = "x";
  c.ylabel = "y";
  LineChart::Panel p;
  for (int i = 0; i < 10; ++i) p.series.push_back({fmt::format("s{}", i), {1, 2}, {1.0 * i, 2.0}});
  c.panels.push_back(p);
  const LineChart f = facet_line_chart(c);
  ASSERT_EQ(f.panels.size(), 2u);
  EXPECT_EQ(f.panels[0].series.size(), 8u);
  EXPECT_EQ(f.panels[1].series.size(), 2u);
  EXPECT_EQ(f.panels[0].title, "(1/2)");
  EXPECT_EQ(f.panels[1].series[0].name, "s8");
  render_line_chart(c, (d / "ten.svg").string());
  const std::string gp = read_file(d / "ten.gp");
  EXPECT_NE(gp.find("set multiplot layout 1,2"), std::string::npos) << gp;
  const auto plots = plot_colours(gp);
  ASSERT_EQ(plots.size(), 2u) << gp;
  ASSERT_EQ(plots[0].size(), 8u) << gp;
  EXPECT_EQ(std::set<std::string>(plots[0].begin(), plots[0].end()).size(), 8u) << gp;
  ASSERT_EQ(plots[1].size(), 2u) << gp;
  EXPECT_NE(plots[1][0], plots[1][1]) << gp;
  // s8 reuses s0's colour with another dash pattern: told apart inside its panel anyway.
  EXPECT_NE(gp.find(fmt::format("lc rgb '{}' dt 2 title 's8'", plots[0][0])), std::string::npos)
      << gp;

  // More panels than a figure shows: the first kMaxPanels, and the title says so.
  LineChart many = c;
  many.panels.assign(20, LineChart::Panel{"", {{"a", {1}, {1}}}});
  const LineChart g = facet_line_chart(many);
  EXPECT_EQ(g.panels.size(), LineChart::kMaxPanels);
  EXPECT_EQ(g.note, "first 12 of 20 panels; the CSV has every point");
}

// A sweep's other axes become panels: 2 x 2 combinations, each panel with one line per strategy,
// each strategy in the same colour everywhere.
TEST(SweepCli, PlotFacetsTheOtherAxes) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot not installed";
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.capacity_factor: [1.0, 2.0]\n"
                                       "  model.top_k: [1, 2]\n"
                                       "  model.hidden_dim: [2048, 4096]\n"));
  auto r = run(fmt::format("sweep '{0}/s.yaml' --quiet --plot '{0}/p.svg'", d.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string gp = read_file(d / "p.gp");
  EXPECT_NE(gp.find("set multiplot layout 2,2"), std::string::npos) << gp;
  EXPECT_NE(gp.find("set title 'model.top_k=2, model.hidden_dim=2048'"), std::string::npos) << gp;
  const auto plots = plot_colours(gp);
  ASSERT_EQ(plots.size(), 4u) << gp;
  for (const auto& colours : plots) {
    ASSERT_EQ(colours.size(), 2u) << gp;  // baseline and tutel
    EXPECT_EQ(colours, plots[0]) << gp;
    EXPECT_NE(colours[0], colours[1]) << gp;
  }
  EXPECT_NE(read_file(d / "p.svg").find("<svg"), std::string::npos);
}

TEST(SweepCli, MissingGnuplotIsAClearErrorBeforeRunning) {
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.capacity_factor: [1.0]\n"));
  auto r = run(fmt::format("sweep '{0}/s.yaml' --csv '{0}/o.csv' --plot '{0}/p.svg'", d.string()),
               "MOESIM_GNUPLOT=/nonexistent/gnuplot");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("gnuplot"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("apt-get install gnuplot-nox"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d / "o.csv"));  // failed before running anything
  auto bad = run(fmt::format("sweep '{0}/s.yaml' --plot '{0}/p.pdf'", d.string()));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
}

TEST(SweepCli, BadAxisExitsTwoWithFileAndLine) {
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.hiden_dim: [1024]\n"));
  auto r = run(fmt::format("sweep '{}/s.yaml'", d.string()));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(fmt::format("{}/s.yaml:8:3:", d.string())), std::string::npos) << r.out;
}

TEST(SweepCli, ListShowsTheLibraryWithDescriptions) {
  auto r = run("list");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("quickstart.yaml"), std::string::npos);
  EXPECT_NE(r.out.find("One MoE layer (training) on 2 nodes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Sweeps"), std::string::npos);
  for (const auto& e : fs::directory_iterator(kSource + "/scenarios/sweeps"))
    EXPECT_NE(r.out.find(e.path().filename().string()), std::string::npos) << e.path();
  // Every bundled scenario, sweep and topology says what it is.
  EXPECT_EQ(r.out.find("(no description)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Topologies"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(kSource + "/scenarios/topologies"))
    EXPECT_NE(r.out.find(e.path().filename().string()), std::string::npos) << e.path();
  EXPECT_NE(r.out.find("Model presets"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(kSource + "/scenarios/models"))
    EXPECT_NE(r.out.find(e.path().filename().string()), std::string::npos) << e.path();
  EXPECT_NE(r.out.find("Hugging Face configs"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(kSource + "/scenarios/models/hf"))
    EXPECT_NE(r.out.find(e.path().filename().string()), std::string::npos) << e.path();
  EXPECT_NE(r.out.find("deepseek_v3: 61 blocks, M 7168, 256 experts of 2048, top-8"),
            std::string::npos)
      << r.out;
}

// Every field of a CSV line but the last (wall_s, the wall-clock time of the row).
std::string without_wall(const std::string& line) { return line.substr(0, line.rfind(',')); }

// `mpirun -np 2 moesim sweep` writes what a single process writes (CSV rows but for wall_s, the
// JSON byte for byte), both ranks run points, and a resumed run under mpirun skips the points in
// the CSV on every rank.
TEST(SweepCli, MpirunSpreadsPointsAndGathersTheSameOutput) {
#ifndef MOESIM_MPIEXEC
  GTEST_SKIP() << "moesim built without MPI";
#else
  fs::path d = temp_dir();
  write_file(d / "s.yaml", small_sweep("  model.capacity_factor: [1.0, 1.5, 2.0]\n"
                                       "  model.top_k: [1, 2]\n"));
  auto one = run(fmt::format(
      "sweep '{0}/s.yaml' --jobs 2 --csv '{0}/one.csv' --json '{0}/one.json'", d.string()));
  ASSERT_EQ(one.exit_code, 0) << one.out;
  // detect_leaks=0 only matters in the sanitizer build: OpenMPI leaves its MCA components'
  // allocations behind at MPI_Finalize, which LeakSanitizer would report as the ranks exit. The
  // sweep code's own leaks are covered by the single-process runs above and below.
  const std::string mpirun = fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 ASAN_OPTIONS=detect_leaks=0 "
      "{} -np 2 --oversubscribe",
      MOESIM_MPIEXEC);
  auto two =
      run(fmt::format("sweep '{0}/s.yaml' --jobs 1 --csv '{0}/two.csv' --json '{0}/two.json'",
                      d.string()),
          mpirun);
  ASSERT_EQ(two.exit_code, 0) << two.out;
  // Rank 0 alone prints: one summary, naming both ranks' shares (6 points split 3 + 3).
  EXPECT_EQ(count_of(two.out, "# small: 6 point(s)"), 1u) << two.out;
  EXPECT_NE(two.out.find("(6 run on 2 ranks (3 + 3), 0 resumed)"), std::string::npos) << two.out;
  auto a = lines_of(read_file(d / "one.csv"));
  auto b = lines_of(read_file(d / "two.csv"));
  ASSERT_EQ(a.size(), 1u + 6 * 2);  // header, rows
  ASSERT_EQ(b.size(), a.size());
  EXPECT_EQ(read_file(d / "one.csv.fingerprint"), read_file(d / "two.csv.fingerprint"));
  EXPECT_EQ(a[0], b[0]);
  for (std::size_t i = 1; i < a.size(); ++i) EXPECT_EQ(without_wall(a[i]), without_wall(b[i]));
  EXPECT_EQ(read_file(d / "one.json"), read_file(d / "two.json"));

  // Resume under mpirun: the first 2 points are in the CSV; the 4 others run, 2 per rank.
  write_file(d / "two.csv", a[0] + "\n" + a[1] + "\n" + a[2] + "\n" + a[3] + "\n" + a[4] + "\n");
  auto again =
      run(fmt::format("sweep '{0}/s.yaml' --jobs 1 --csv '{0}/two.csv'", d.string()), mpirun);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("(4 run on 2 ranks (2 + 2), 2 resumed)"), std::string::npos)
      << again.out;
  auto c = lines_of(read_file(d / "two.csv"));
  ASSERT_EQ(c.size(), a.size());
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(c[i], a[i]);  // resumed rows kept as written
  for (std::size_t i = 2; i < a.size(); ++i) EXPECT_EQ(without_wall(a[i]), without_wall(c[i]));

  // An input error is reported once (by rank 0) and ends the job with exit code 2.
  write_file(d / "bad.yaml", small_sweep("  model.hiden_dim: [1024]\n"));
  auto bad = run(fmt::format("sweep '{}/bad.yaml'", d.string()), mpirun);
  EXPECT_EQ(bad.exit_code, 2) << bad.out;  // MPI_Abort with the input-error code
  EXPECT_EQ(count_of(bad.out, "moesim: error:"), 1u) << bad.out;
  EXPECT_NE(bad.out.find("hiden_dim"), std::string::npos) << bad.out;
#endif
}

// Width and height from a PNG's IHDR chunk (bytes 16-23, big-endian), or {0, 0} when `png` is not
// a PNG.
std::pair<unsigned, unsigned> png_size(const std::string& png) {
  if (png.size() < 24 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0 ||
      png.compare(12, 4, "IHDR") != 0)
    return {0, 0};
  auto be32 = [&](std::size_t at) {
    unsigned v = 0;
    for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(png[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

// Renders the README's compare report (4 strategies x 3 topologies) in headless Chromium: the
// screenshot has the window's size and far more content than a blank page rendered the same way,
// and the DOM Chromium built holds the comparison table: a header and one row per strategy, one
// column per topology. Skips where Chromium is not installed (scripts/setup.sh installs it).
TEST(SweepCli, ReportRendersInHeadlessChromium) {
  const std::string chromium = "/usr/bin/chromium";
  if (access(chromium.c_str(), X_OK) != 0) GTEST_SKIP() << "no /usr/bin/chromium";
  fs::path d = temp_dir();
  const std::string topo = kSource + "/scenarios/topologies";
  auto r = run(fmt::format(
      "compare '{0}' --engine analytical --iterations 1 --topology '{1}/dgx-a100-2x8.yaml' "
      "--topology '{1}/a100-4x4-ib100.yaml' --topology '{1}/a100-pcie-2x8-ib100.yaml' "
      "--report '{2}/c.html'",
      kQuickstart, topo, d.string()));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  write_file(d / "blank.html", "<!DOCTYPE html><html><body></body></html>\n");
  // Flags that work as root in a container without a display or network; a fresh profile per
  // call, so nothing is shared with another run.
  int profile = 0;
  auto chrome = [&](const std::string& what, const std::string& page, const std::string& redirect) {
    std::string flags = fmt::format(
        "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
        "--disable-background-networking --disable-component-update --disable-sync "
        "--hide-scrollbars --window-size=1200,1400 --user-data-dir='{}'",
        (d / fmt::format("profile{}", profile++)).string());
    std::string cmd = fmt::format("timeout 60 {} {} {} 'file://{}' {}", chromium, flags, what,
                                  (d / page).string(), redirect);
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(chrome(fmt::format("--screenshot='{}'", (d / "blank.png").string()), "blank.html",
                   ">/dev/null 2>&1"),
            0);
  ASSERT_EQ(chrome(fmt::format("--screenshot='{}'", (d / "shot.png").string()), "c.html",
                   ">/dev/null 2>&1"),
            0);
  std::string blank = read_file(d / "blank.png");
  std::string png = read_file(d / "shot.png");
  EXPECT_EQ(png_size(blank), std::make_pair(1200u, 1400u));
  EXPECT_EQ(png_size(png), std::make_pair(1200u, 1400u));
  // A blank page compresses to a few kB; headings, tables and the text do not.
  EXPECT_GT(png.size(), 10 * blank.size()) << png.size() << " vs blank " << blank.size();

  ASSERT_EQ(
      chrome("--dump-dom", "c.html", fmt::format("> '{}' 2>/dev/null", (d / "dom.html").string())),
      0);
  std::string dom = read_file(d / "dom.html");
  auto at = dom.find("<table id=\"comparison\">");
  ASSERT_NE(at, std::string::npos) << dom.substr(0, 2000);
  std::string table = dom.substr(at, dom.find("</table>", at) - at);
  EXPECT_EQ(count_of(table, "<tr>"), 1u + 4);  // header + 4 strategies
  EXPECT_EQ(count_of(table, "<th"), 1u + 3);   // strategy + 3 topologies
  EXPECT_EQ(count_of(table, "<td"), 4u * (1 + 3));
  for (const char* name : {"baseline", "tutel", "pipemoe", "ta_moe"})
    EXPECT_EQ(count_of(table, fmt::format(">{}</td>", name)), 1u) << name;
  for (const char* t : {"dgx-a100-2x8", "a100-4x4-ib100", "a100-pcie-2x8-ib100"})
    EXPECT_EQ(count_of(table, fmt::format(">{}</th>", t)), 1u) << t;
  // Chromium parsed the page, not just echoed it: it inserted the implied <tbody>.
  EXPECT_NE(table.find("<tbody>"), std::string::npos);
}

}  // namespace
}  // namespace moesim::app
