// Runs the moesim binary and checks what a user sees: exit codes (0 / 1 / 2), error messages with
// file:line and key, and JSON outputs against expected files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;
const std::string kSource = MOESIM_SOURCE_DIR;
const std::string kBinary = MOESIM_BINARY;

struct RunOutput {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

RunOutput run(const std::string& args) {
  std::string cmd = fmt::format("'{}' {} 2>&1", kBinary, args);
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
  // The table names both tiers: 112 intra-node pairs over NVSwitch, 128 inter-node pairs.
  EXPECT_NE(r.out.find("bisection   200 GB/s"), std::string::npos) << r.out;
  auto want =
      nlohmann::json::parse(read_file(kSource + "/tests/cli/expected/topo_quickstart.json"));
  auto got = nlohmann::json::parse(read_file(out));
  expect_json_near(want, got, "$");
  fs::remove_all(dir);
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
  for (const auto& e : fs::directory_iterator(kSource + "/scenarios")) {
    if (e.path().extension() != ".yaml") continue;
    auto r = run(fmt::format("validate '{}'", e.path().string()));
    EXPECT_EQ(r.exit_code, 0) << e.path() << "\n" << r.out;
    EXPECT_NE(r.out.find(": valid"), std::string::npos) << r.out;
    ++seen;
  }
  EXPECT_GE(seen, 10);
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

TEST(Cli, UnwritableOutputExitsOneAndLeavesNothing) {
  fs::path dir = temp_dir();
  fs::path out = dir / "missing-subdir" / "topo.json";
  auto r =
      run(fmt::format("topo '{}/scenarios/quickstart.yaml' --json '{}'", kSource, out.string()));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir / "missing-subdir"));
  fs::remove_all(dir);
}

}  // namespace
