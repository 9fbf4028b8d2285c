// Calibration inside the engines (docs/calibration.md, "Which engine uses what"): the per-tier
// point-to-point betas scale the topology's link bandwidths (topology/calibrated.hpp), so the
// analytical and flow engines move a pair's bytes at the measured rate; a measured per-collective
// line replaces the analytical engine's closed form (sim::analytical_collective_time). Scenarios
// and calibration files are written to a temporary directory and loaded as a user's would be, and
// go through apps/moesim/engine_setup (simulation_topology, engine_config_from) like every
// command. Every expectation is worked out by hand.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/moesim/engine_setup.hpp"
#include "core/calibration.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/cost_model.hpp"
#include "topology/calibrated.hpp"
#include "topology/topology.hpp"

namespace moesim {
namespace {

namespace fs = std::filesystem;

class CalibratedEngines : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("moesim_calib2_{}_{}",
                       ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                       static_cast<long>(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the scenario (cluster text + a fixed tail) and its calibration file `cal_name`, loads
  // the scenario. Calibration files are cached per path and process, so a test that loads two
  // calibrations names them differently.
  Scenario load(const std::string& cluster, const std::string& calibration,
                const std::string& cal_name = "cal.yaml") {
    write(cal_name, calibration);
    write("s.yaml",
          "name: calib2\ncluster:\n" + cluster + "  calibration: " + cal_name + "\n" + kTail);
    return load_scenario((dir_ / "s.yaml").string());
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream os(dir_ / name);
    os << text;
  }

  // No per-message costs of the scenario's own: what is left is the calibration's.
  static constexpr const char* kTail =
      "model: {batch_per_gpu: 1, seq_len: 16, model_dim: 8, hidden_dim: 8, experts: 2, dtype: "
      "fp16}\n"
      "engine: {network: analytical, message_latency: 0us, message_overhead: 0us}\n"
      "strategies: [{name: baseline}]\n";
  fs::path dir_;
};

// One collective over `group` on a plan of the topology's size; its duration.
double collective_time(const Scenario& sc, const topology::Topology& topo, const char* engine,
                       CollectiveType type, CollectiveAlgo algo, std::vector<int> group,
                       double bytes) {
  Plan plan(topo.num_gpus());
  const StreamId s = plan.stream("comm");
  CollectiveSpec spec;
  spec.type = type;
  spec.algo = algo;
  spec.grouping = plan.add_grouping(Grouping{"g", {std::move(group)}});
  spec.bytes = Bytes(bytes);
  plan.add_collective(s, spec, {}, "c");
  const RunResult r = sim::run_plan(plan, topo, app::engine_config_from(sc, engine));
  return r.collectives.at(0).duration_s();
}

// Two GPUs on one NVSwitch, datasheet 250 GB/s (beta 4 ps/B) and 1 us between them.
constexpr const char* kTwoGpus =
    "  gpu: a100-sxm-80gb\n"
    "  gpus_per_node: 2\n"
    "  intra_node: {kind: nvswitch, bandwidth: 250GB/s, efficiency: 1, latency: 1us}\n";

// Measured: alpha 5 us, beta 8 ps/B = 2x the datasheet's (125 GB/s).
constexpr const char* kTier0 =
    "format: moesim-calibration/1\n"
    "point_to_point:\n"
    "  - {tier: 0, alpha: 5us, beta: 8e-12s/B}\n";

TEST_F(CalibratedEngines, SendRecvOfATier0PairTakesAlphaPlusBytesTimesBetaOnAnalyticalAndFlow) {
  const Scenario sc = load(kTwoGpus, kTier0);
  const auto topo = app::simulation_topology(sc);
  // The pair's bottleneck (both NVSwitch port links, class 0) scaled by 125 / 250 = 0.5.
  EXPECT_NEAR(topo->pair_cost(0, 1).bandwidth.value(), 125e9, 1e-3);
  EXPECT_NEAR(topo->spec().intra.bandwidth.value(), 125e9, 1e-3);
  // Per-message latency = 5 us - the topology's 1 us = 4 us; the route's latency 1 us; so one
  // message of N bytes takes 4 + 1 + N * 8 ps = alpha + N * beta: 5 us + 8 us at N = 1 MB.
  for (const char* engine : {"analytical", "flow"}) {
    for (double n : {1e6, 64e6}) {
      const double t = collective_time(sc, *topo, engine, CollectiveType::kSendRecv,
                                       CollectiveAlgo::kAuto, {0, 1}, n);
      EXPECT_NEAR(t, 5e-6 + n * 8e-12, 1e-15) << engine << " N = " << n;
    }
  }
  // The datasheet topology (what build_topology gives) takes half the bandwidth time.
  const auto plain = topology::build_topology(sc.cluster);
  EXPECT_NEAR(collective_time(sc, *plain, "flow", CollectiveType::kSendRecv, CollectiveAlgo::kAuto,
                              {0, 1}, 1e6),
              5e-6 + 1e6 * 4e-12, 1e-15);
}

TEST_F(CalibratedEngines, MeasuredAllToAllLineReplacesTheAnalyticalClosedFormForItsGroupSize) {
  const std::string line =
      std::string(kTier0) +
      "collectives:\n"
      "  - {collective: all_to_all, algo: linear, ranks: 2, alpha: 30us, beta: 2e-9s/B}\n";
  const Scenario sc = load(kTwoGpus, line);
  const auto topo = app::simulation_topology(sc);
  // The line: 30 us + 2 ns/B * S (S = bytes per rank), exactly, for linear and for auto (which
  // resolves to linear on one node).
  for (CollectiveAlgo algo : {CollectiveAlgo::kLinear, CollectiveAlgo::kAuto}) {
    const double t =
        collective_time(sc, *topo, "analytical", CollectiveType::kAllToAll, algo, {0, 1}, 1e6);
    EXPECT_DOUBLE_EQ(t, 30e-6 + 1e6 * 2e-9);
  }
  // The flow engine lowers the collective: S/2 to the peer at the calibrated 125 GB/s, 4 us
  // per-message latency + 1 us route latency: 5 us + 500,000 B * 8 ps = 9 us.
  EXPECT_NEAR(collective_time(sc, *topo, "flow", CollectiveType::kAllToAll, CollectiveAlgo::kLinear,
                              {0, 1}, 1e6),
              9e-6, 1e-15);
  // Without the line the analytical engine gives the same closed form as flow here.
  const Scenario no_line = load(kTwoGpus, kTier0, "cal_no_line.yaml");
  EXPECT_NEAR(collective_time(no_line, *app::simulation_topology(no_line), "analytical",
                              CollectiveType::kAllToAll, CollectiveAlgo::kLinear, {0, 1}, 1e6),
              9e-6, 1e-15);
}

TEST_F(CalibratedEngines, GroupOfAnotherSizeKeepsTheClosedFormOnTheCalibratedTopology) {
  const std::string line =
      std::string(kTier0) +
      "collectives:\n"
      "  - {collective: all_to_all, algo: linear, ranks: 2, alpha: 30us, beta: 2e-9s/B}\n";
  const Scenario sc = load(
      "  gpu: a100-sxm-80gb\n"
      "  gpus_per_node: 4\n"
      "  intra_node: {kind: nvswitch, bandwidth: 250GB/s, efficiency: 1, latency: 1us}\n",
      line);
  const auto topo = app::simulation_topology(sc);
  // 4 ranks, no line for 4: each rank sends 3 messages of S/4 through its one NVSwitch port at
  // 125 GB/s: 4 us latency + 1 us alpha + 3 * 250,000 B * 8 ps = 11 us at S = 1 MB.
  EXPECT_NEAR(collective_time(sc, *topo, "analytical", CollectiveType::kAllToAll,
                              CollectiveAlgo::kLinear, {0, 1, 2, 3}, 1e6),
              11e-6, 1e-15);
  // A 2-rank group inside it matches the line.
  EXPECT_DOUBLE_EQ(collective_time(sc, *topo, "analytical", CollectiveType::kAllToAll,
                                   CollectiveAlgo::kLinear, {1, 3}, 1e6),
                   30e-6 + 2e-3);
}

// 2 nodes x 2 GPUs (exec-host-4's cluster): NVSwitch 300 GB/s inside, one 25 GB/s NIC per GPU
// (2 per node) on one switch; the GPU-NIC link is the A100's PCIe (tier 0 but NIC-side: class 1).
constexpr const char* kTwoNodes =
    "  gpu: a100-sxm-80gb\n"
    "  nodes: 2\n"
    "  gpus_per_node: 2\n"
    "  intra_node: {kind: nvswitch, bandwidth: 300GB/s, efficiency: 1, latency: 1us}\n"
    "  inter_node: {kind: switch, nic_bandwidth: 200Gb/s, nic_efficiency: 1, nics_per_node: 2, "
    "latency: 2us}\n";

TEST_F(CalibratedEngines, EachTierGetsItsOwnMeasuredRateAndNicLinksFollowTier1) {
  const Scenario sc = load(kTwoNodes,
                           "format: moesim-calibration/1\n"
                           "point_to_point:\n"
                           "  - {tier: 0, alpha: 3us, beta: 1e-10s/B}\n"    // 10 GB/s
                           "  - {tier: 1, alpha: 9us, beta: 2e-10s/B}\n");  // 5 GB/s
  const auto plain = topology::build_topology(sc.cluster);
  const auto topo = app::simulation_topology(sc);
  ASSERT_EQ(topo->tier(0, 1), 0);
  ASSERT_EQ(topo->tier(0, 2), 1);
  const double pcie = plain->gpu().pcie_bandwidth.value();
  ASSERT_GT(pcie, 25e9);  // the NIC is the datasheet bottleneck of an inter-node pair
  EXPECT_NEAR(topo->pair_cost(0, 1).bandwidth.value(), 10e9, 1e-3);
  EXPECT_NEAR(topo->pair_cost(0, 2).bandwidth.value(), 5e9, 1e-3);
  // Class factors: 10 / 300 for NVSwitch links, 5 / 25 for GPU-NIC and NIC-switch links.
  const auto tf = topology::calibrated_tier_factors(*plain, *strategies::scenario_calibration(sc));
  ASSERT_EQ(tf.factor.size(), 2u);
  EXPECT_DOUBLE_EQ(tf.factor[0], 10e9 / 300e9);
  EXPECT_DOUBLE_EQ(tf.factor[1], 5e9 / 25e9);
  EXPECT_TRUE(tf.notes.empty());
  for (topology::LinkId l = 0; l < topo->links().size(); ++l) {
    const double want =
        plain->links()[l].bandwidth.value() * tf.factor[topology::link_class(*plain, l)];
    EXPECT_DOUBLE_EQ(topo->links()[l].bandwidth.value(), want) << "link " << l;
  }
  // Flow: one message 0 -> 2 of N bytes = (3 us - 1 us) per-message latency + the route's
  // latency + N / 5 GB/s.
  const double route_alpha = topo->pair_cost(0, 2).alpha.value();
  EXPECT_NEAR(collective_time(sc, *topo, "flow", CollectiveType::kSendRecv, CollectiveAlgo::kAuto,
                              {0, 2}, 1e6),
              2e-6 + route_alpha + 1e6 * 2e-10, 1e-15);
}

TEST_F(CalibratedEngines, ATier1FasterThanTheScaledTier0LinksIsCappedAndReported) {
  // PCIe-attached GPUs: the NIC hangs off the PCIe switch, so the inter-node route crosses the
  // class-0 GPU-PCIe switch link, which tier 0's 1 GB/s slows below tier 1's 5 GB/s.
  const Scenario sc = load(
      "  gpu: a100-sxm-80gb\n"
      "  nodes: 2\n"
      "  gpus_per_node: 2\n"
      "  intra_node: {kind: pcie, bandwidth: 32GB/s, efficiency: 1, latency: 1us, "
      "gpus_per_pcie_switch: 2}\n"
      "  inter_node: {kind: switch, nic_bandwidth: 200Gb/s, nic_efficiency: 1, nics_per_node: 1, "
      "latency: 2us}\n",
      "format: moesim-calibration/1\n"
      "point_to_point:\n"
      "  - {tier: 0, alpha: 3us, beta: 1e-9s/B}\n"
      "  - {tier: 1, alpha: 9us, beta: 2e-10s/B}\n");
  const auto plain = topology::build_topology(sc.cluster);
  const auto tf = topology::calibrated_tier_factors(*plain, *strategies::scenario_calibration(sc));
  ASSERT_EQ(tf.notes.size(), 1u);
  EXPECT_NE(tf.notes[0].find("tier 1"), std::string::npos) << tf.notes[0];
  const auto topo = app::simulation_topology(sc);
  EXPECT_NEAR(topo->pair_cost(0, 1).bandwidth.value(), 1e9, 1e-3);
  // Capped at the slower class-0 link (and the NIC share of the 2 GPUs on the one NIC).
  EXPECT_LE(topo->pair_cost(0, 2).bandwidth.value(), 1e9 * (1 + 1e-12));
}

TEST_F(CalibratedEngines, UnmeasuredSpineTierFollowsTheMeasuredNicTier) {
  // 8 nodes x 2 GPUs, radix-8 fat tree: two levels (NIC-leaf tier 1, leaf-spine tier 2); the
  // calibration measured only tiers 0 and 1 (as a 2-node run does).
  const Scenario sc = load(
      "  gpu: a100-sxm-80gb\n"
      "  nodes: 8\n"
      "  gpus_per_node: 2\n"
      "  intra_node: {kind: nvswitch, bandwidth: 300GB/s, efficiency: 1, latency: 1us}\n"
      "  inter_node: {kind: fat_tree, nic_bandwidth: 200Gb/s, nic_efficiency: 1, nics_per_node: 2, "
      "latency: 2us, "
      "switch_radix: 8}\n",
      "format: moesim-calibration/1\n"
      "point_to_point:\n"
      "  - {tier: 0, alpha: 3us, beta: 1e-10s/B}\n"
      "  - {tier: 1, alpha: 9us, beta: 2e-10s/B}\n");
  const auto plain = topology::build_topology(sc.cluster);
  const auto tf = topology::calibrated_tier_factors(*plain, *strategies::scenario_calibration(sc));
  ASSERT_GE(tf.factor.size(), 3u);
  EXPECT_DOUBLE_EQ(tf.factor[1], 5e9 / 25e9);
  EXPECT_DOUBLE_EQ(tf.factor[2], tf.factor[1]);
  EXPECT_FALSE(tf.measured[2]);
  const auto topo = app::simulation_topology(sc);
  EXPECT_NEAR(topo->pair_cost(0, 2).bandwidth.value(), 5e9, 1e-3);  // same leaf
  // A pair across the spines: a non-blocking fabric scaled uniformly keeps the NIC bottleneck.
  EXPECT_NEAR(topo->pair_cost(0, 15).bandwidth.value(), 5e9, 1e-3);
  EXPECT_EQ(topo->tier(0, 15), 2);
}

}  // namespace
}  // namespace moesim
