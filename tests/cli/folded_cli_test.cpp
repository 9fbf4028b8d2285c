// parallelism.layout: folded through the binary: --set knows the folded degrees, bad ones exit 2
// naming the key, and the commands that cannot run a folded layout (tune) refuse it.
#include <gtest/gtest.h>

#include <string>

#include "cli_run.hpp"

namespace {

using namespace moesim::cli_test;

const std::string kQuickstart = "'" + kSource + "/scenarios/quickstart.yaml'";

TEST(FoldedCli, SetWritesTheFoldedDegrees) {
  auto r = run("validate " + kQuickstart +
               " --set 'parallelism={layout: folded, tp: 2, cp: 2, ep: 16}'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("layout=folded: attention tp=2 cp=2 dp=4 (sequence parallel on), experts "
                       "etp=1 ep=16 edp=1"),
            std::string::npos)
      << r.out;
  r = run("simulate " + kQuickstart +
          " -q --strategy baseline --iterations 1 --engine analytical --set "
          "parallelism.layout=folded --set parallelism.mp=2 --set parallelism.dp=auto");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // The file's mp: 1 with a --set tp: the two names of one degree, refused.
  r = run("validate " + kQuickstart + " --set parallelism.layout=folded --set parallelism.tp=2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("found both mp and tp"), std::string::npos) << r.out;
}

TEST(FoldedCli, BadFoldedDegreesExitTwoNamingTheKey) {
  auto r = run("validate " + kQuickstart +
               " --set 'parallelism={layout: folded, tp: 2, dp: 4, ep: 16}'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("parallelism.dp: tp*cp*dp = 2*1*4 = 8, expected P = 16"), std::string::npos)
      << r.out;
  r = run("validate " + kQuickstart + " --set parallelism.cp=2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("parallelism.cp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expected layout: folded"), std::string::npos) << r.out;
  r = run("validate " + kQuickstart + " --set 'parallelism={layout: folded, etp: 3}'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("model.hidden_dim = 4096"), std::string::npos) << r.out;
}

TEST(FoldedCli, TuneRefusesAFoldedScenario) {
  auto r = run("tune " + kQuickstart + " --set 'parallelism={layout: folded, tp: 2, ep: 16}'");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("parallelism.layout: found folded, expected disjoint or overlapped"),
            std::string::npos)
      << r.out;
}

}  // namespace
