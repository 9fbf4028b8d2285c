// Progress on stderr and Ctrl-C, through the moesim binary as a user runs it (README, CLI):
// progress lines appear on a plain (non-terminal) stderr once a run has lasted
// MOESIM_PROGRESS_AFTER_S (2 s by default, 0 here so that they appear deterministically), never
// with --quiet, never on stdout; SIGINT stops simulate / compare / sweep with exit 130, a summary
// of what was completed, and no output file.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const std::string kSource = MOESIM_SOURCE_DIR;
const std::string kBinary = MOESIM_BINARY;
const std::string kQuickstart = kSource + "/scenarios/quickstart.yaml";

struct Output {
  int exit_code = -1;
  std::string out, err;
};

// Runs moesim with `args` and the environment plus `env` ("K=V"; "K=" unsets K), stdout and
// stderr on separate pipes (so neither is a terminal). `on_err` sees stderr as it grows and may
// signal the child; it is called until it returns true.
Output run(const std::vector<std::string>& args, const std::vector<std::string>& env,
           const std::function<bool(pid_t, const std::string&)>& on_err = nullptr) {
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    for (const auto& kv : env) {
      const auto eq = kv.find('=');
      const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (v.empty())
        unsetenv(k.c_str());
      else
        setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> argv;
    std::string bin = kBinary;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  Output o;
  bool watching = static_cast<bool>(on_err);
  std::array<pollfd, 2> fds{pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (open_fds > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);  // a hung child must not hang the test
      break;
    }
    if (poll(fds.data(), fds.size(), 200) < 0) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      std::array<char, 4096> buf{};
      const ssize_t n = read(fds[i].fd, buf.data(), buf.size());
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      (i == 0 ? o.out : o.err).append(buf.data(), static_cast<std::size_t>(n));
    }
    if (watching && on_err(pid, o.err)) watching = false;
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

// Progress lines appear at once and at every unit and poll.
const std::vector<std::string> kEager = {"MOESIM_PROGRESS_AFTER_S=0", "MOESIM_PROGRESS_EVERY_S=0"};

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() /
               fmt::format("moesim_progress_{}_{}",
                           ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                           static_cast<long>(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

// Sends SIGINT once stderr shows `marker`; true once sent.
std::function<bool(pid_t, const std::string&)> interrupt_after(const std::string& marker) {
  return [marker](pid_t pid, const std::string& err) {
    if (err.find(marker) == std::string::npos) return false;
    kill(pid, SIGINT);
    return true;
  };
}

TEST(ProgressCli, PlainLinesOnANonTerminalStderr) {
  auto r = run({"simulate", kQuickstart, "--engine", "flow", "--iterations", "3", "--strategy",
                "baseline", "--strategy", "tutel"},
               kEager);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Plain lines, never a carriage return (not a terminal).
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << r.err;
  bool first = false, second = false, eta = false;
  for (const auto& l : lines_of(r.err)) {
    EXPECT_EQ(l.rfind("moesim: ", 0), 0u) << l;
    EXPECT_NE(l.find(" elapsed"), std::string::npos) << l;
    EXPECT_NE(l.find("events/s"), std::string::npos) << l;
    first |= l.find("moesim: baseline iteration 1/3 (all: 0/6 done)") == 0;
    second |= l.find("moesim: tutel iteration ") == 0;
    // After a finished iteration there is an ETA; before, it says it has none, or extrapolates
    // from the op instances done ("ETA ~").
    if (l.find("(all: 0/6 done)") != std::string::npos) {
      const bool ops = l.find(", ops ") != std::string::npos;
      EXPECT_NE(l.find(ops ? "ETA ~" : "ETA unknown"), std::string::npos) << l;
    }
    eta |= l.find("(all: 4/6 done)") != std::string::npos &&
           l.find(", ETA ") != std::string::npos && l.find("ETA unknown") == std::string::npos;
  }
  EXPECT_TRUE(first) << r.err;
  EXPECT_TRUE(second) << r.err;
  EXPECT_TRUE(eta) << r.err;
  // Within an iteration: the simulated time reached and the op instances done.
  EXPECT_NE(r.err.find(", sim "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", ops "), std::string::npos) << r.err;
  // stdout carries the results only.
  EXPECT_EQ(r.out.find("events/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("baseline"), std::string::npos) << r.out;
}

TEST(ProgressCli, CollectiveModeCountsSizes) {
  auto r = run(
      {"simulate", kQuickstart, "--collective", "all_to_all", "--size", "1MiB", "--size", "4MiB"},
      kEager);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("moesim: all_to_all size 1/2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("moesim: all_to_all size 2/2"), std::string::npos) << r.err;
}

TEST(ProgressCli, QuietPrintsNothingOnStderr) {
  for (const std::string cmd : {"simulate", "compare"}) {
    auto r = run({cmd, kQuickstart, "--iterations", "2", "--quiet"}, kEager);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
    EXPECT_EQ(r.err, "") << cmd;
    EXPECT_NE(r.out, "") << cmd;
  }
  // compare without --quiet: its per-strategy lines and the progress lines.
  auto r = run({"compare", kQuickstart, "--iterations", "2"}, kEager);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("moesim: baseline on "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" iteration 1/2"), std::string::npos) << r.err;
}

TEST(ProgressCli, ShortRunsStaySilentByDefault) {
  // The default threshold (2 s) is far above a quickstart run on the analytical engine.
  auto r = run({"simulate", kQuickstart, "--engine", "analytical", "--iterations", "2"},
               {"MOESIM_PROGRESS_AFTER_S=", "MOESIM_PROGRESS_EVERY_S="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

// A run far longer than the test (a million iterations), interrupted after its first progress
// line: exit 130, what was done on stderr, none of the requested files.
void expect_interrupted_simulate(const std::string& engine) {
  fs::path d = temp_dir();
  const fs::path json = d / "out.json", csv = d / "out.csv", trace = d / "trace.json";
  auto r =
      run({"simulate", kQuickstart, "--engine", engine, "--iterations", "1000000", "--json",
           json.string(), "--csv", csv.string(), "--trace", trace.string()},
          {"MOESIM_PROGRESS_AFTER_S=0", "MOESIM_PROGRESS_EVERY_S=0.2"}, interrupt_after("ETA"));
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("moesim: interrupted after "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("baseline "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/1000000 iterations"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no output files written"), std::string::npos) << r.err;
  // Nothing written, not even a temporary.
  EXPECT_TRUE(fs::is_empty(d)) << fs::directory_iterator(d)->path();
  // The results table is never printed (only the header line before the run).
  EXPECT_EQ(r.out.find("step(ms)"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(ProgressCli, CtrlCStopsSimulateFlowWithoutOutputFiles) { expect_interrupted_simulate("flow"); }

TEST(ProgressCli, CtrlCStopsSimulateAnalytical) { expect_interrupted_simulate("analytical"); }

#ifdef MOESIM_HAVE_SIMGRID
TEST(ProgressCli, CtrlCStopsSimulateSimgrid) { expect_interrupted_simulate("simgrid"); }
#endif

TEST(ProgressCli, CtrlCStopsCompare) {
  fs::path d = temp_dir();
  const fs::path json = d / "out.json";
  auto r =
      run({"compare", kQuickstart, "--iterations", "1000000", "--json", json.string()},
          {"MOESIM_PROGRESS_AFTER_S=0", "MOESIM_PROGRESS_EVERY_S=0.2"}, interrupt_after("ETA"));
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("moesim: interrupted after "), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_empty(d));
  fs::remove_all(d);
}

TEST(ProgressCli, CtrlCStopsSweepKeepingWholeCsvRows) {
  fs::path d = temp_dir();
  {
    std::ofstream f(d / "s.yaml");
    f << "base: " << kQuickstart << "\n"
      << "axes:\n  model.hidden_dim: {from: 1024, to: 409600, step: 1024}\n"
      << "strategies: [baseline]\n";
  }
  const fs::path csv = d / "out.csv", json = d / "out.json";
  auto r = run({"sweep", (d / "s.yaml").string(), "--jobs", "1", "--engine", "flow", "--csv",
                csv.string(), "--json", json.string()},
               {}, interrupt_after("points"));
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_NE(r.err.find("moesim sweep: interrupted after "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(the same command resumes from there)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(json));
  // The CSV holds whole rows only: every line after the header has the header's field count.
  std::ifstream is(csv);
  std::vector<std::string> rows;
  for (std::string l; std::getline(is, l);)
    if (!l.empty() && l[0] != '#') rows.push_back(l);
  ASSERT_FALSE(rows.empty());
  const auto fields = std::count(rows[0].begin(), rows[0].end(), ',');
  for (const auto& l : rows) EXPECT_EQ(std::count(l.begin(), l.end(), ','), fields) << l;
  fs::remove_all(d);
}

}  // namespace
