// The bundled scenario library (scenarios/*.yaml) must always load, and must keep covering every
// intra-node and inter-node kind the schema offers.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/scenario_loader.hpp"

namespace moesim {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> bundled_scenarios() {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(fs::path(MOESIM_SOURCE_DIR) / "scenarios"))
    if (entry.path().extension() == ".yaml") out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ScenarioLibrary, EveryBundledScenarioLoads) {
  std::vector<std::string> files = bundled_scenarios();
  ASSERT_GE(files.size(), 10u);
  std::set<std::string> names;
  for (const auto& f : files) {
    SCOPED_TRACE(f);
    Scenario s;
    ASSERT_NO_THROW(s = load_scenario(f));
    EXPECT_EQ(s.name, fs::path(f).stem().string()) << "scenario name should match its file";
    EXPECT_FALSE(s.description.empty());
    EXPECT_TRUE(names.insert(s.name).second);
    EXPECT_EQ(static_cast<long long>(s.parallelism.ep) * s.parallelism.esp * s.parallelism.mp *
                  s.parallelism.dp,
              s.num_gpus());
    EXPECT_FALSE(s.strategies.empty());
  }
}

TEST(ScenarioLibrary, CoversEveryIntraAndInterKind) {
  std::set<IntraKind> intra;
  std::set<InterKind> inter;
  for (const auto& f : bundled_scenarios()) {
    Scenario s = load_scenario(f);
    if (s.cluster.gpus_per_node > 1 && s.cluster.inter.kind != InterKind::kCustom)
      intra.insert(s.cluster.intra.kind);
    inter.insert(s.cluster.inter.kind);
  }
  for (IntraKind k : {IntraKind::kNvswitch, IntraKind::kNvlinkRing, IntraKind::kPcie})
    EXPECT_TRUE(intra.count(k)) << "no bundled scenario uses intra_node.kind "
                                << intra_kind_name(k);
  for (InterKind k :
       {InterKind::kNone, InterKind::kSwitch, InterKind::kFatTree, InterKind::kRailOptimized,
        InterKind::kDragonfly, InterKind::kTree, InterKind::kCustom})
    EXPECT_TRUE(inter.count(k)) << "no bundled scenario uses inter_node.kind "
                                << inter_kind_name(k);
}

// The testbeds the issues name, with the figures the papers give.
TEST(ScenarioLibrary, TestbedFigures) {
  const std::string dir = std::string(MOESIM_SOURCE_DIR) + "/scenarios/";
  Scenario q = load_scenario(dir + "quickstart.yaml");
  EXPECT_EQ(q.num_gpus(), 16);
  EXPECT_EQ(q.cluster.gpu.name, "a100-sxm-80gb");
  EXPECT_DOUBLE_EQ(q.cluster.intra.bandwidth.value(), 300e9);
  EXPECT_EQ(q.cluster.inter.nics_per_node, 8);
  EXPECT_DOUBLE_EQ(q.cluster.inter.nic_bandwidth.value(), 25e9);
  ASSERT_NE(q.find_strategy("baseline"), nullptr);
  const StrategySpec* tutel = q.find_strategy("tutel");
  ASSERT_NE(tutel, nullptr);
  EXPECT_EQ(tutel->a2a, A2aRole::kAuto);
  EXPECT_EQ(tutel->pipeline, PipelineRole::kTutelOnline);
  EXPECT_EQ(tutel->parallel, ParallelRole::kTutelRouter);
  const StrategySpec* pipemoe = q.find_strategy("pipemoe");
  ASSERT_NE(pipemoe, nullptr);
  EXPECT_EQ(pipemoe->a2a, A2aRole::kLinear);
  EXPECT_EQ(pipemoe->pipeline, PipelineRole::kPipeMoe);

  Scenario ndv4 = load_scenario(dir + "ndv4-a100-2048.yaml");
  EXPECT_EQ(ndv4.num_gpus(), 2048);
  EXPECT_EQ(ndv4.cluster.inter.kind, InterKind::kFatTree);
  EXPECT_DOUBLE_EQ(ndv4.cluster.inter.oversubscription, 1.0);

  Scenario rtx = load_scenario(dir + "rtx2080ti-16x4.yaml");
  EXPECT_EQ(rtx.cluster.nodes, 16);
  EXPECT_EQ(rtx.cluster.gpus_per_node, 4);
  EXPECT_EQ(rtx.cluster.intra.kind, IntraKind::kPcie);
  EXPECT_DOUBLE_EQ(rtx.cluster.intra.bandwidth.value(), 16e9);
  EXPECT_DOUBLE_EQ(rtx.cluster.inter.nic_bandwidth.value(), 10e9);  // EDR's payload rate
  EXPECT_EQ(rtx.engine.peer_cache, 15);

  Scenario r4090 = load_scenario(dir + "rtx4090-8-pcie4.yaml");
  EXPECT_EQ(r4090.num_gpus(), 8);
  EXPECT_EQ(r4090.cluster.intra.sockets, 2);
  EXPECT_EQ(r4090.cluster.inter.kind, InterKind::kNone);

  Scenario a40 = load_scenario(dir + "a100-40gb-4x4.yaml");
  EXPECT_EQ(a40.cluster.gpu.name, "a100-sxm-40gb");
  EXPECT_EQ(a40.num_gpus(), 16);
  EXPECT_EQ(a40.cluster.inter.nics_per_node, 1);

  EXPECT_EQ(load_scenario(dir + "fat-tree-a100-4096.yaml").num_gpus(), 4096);
  EXPECT_EQ(load_scenario(dir + "dragonfly-h200-4096.yaml").num_gpus(), 4096);

  Scenario tree = load_scenario(dir + "tamoe-tree.yaml");
  ASSERT_EQ(tree.cluster.inter.tree.children.size(), 2u);
  EXPECT_EQ(tree.cluster.inter.tree.children[0].children.size(), 2u);
  EXPECT_EQ(tree.cluster.inter.tree.children[1].children.size(), 1u);
}

}  // namespace
}  // namespace moesim
