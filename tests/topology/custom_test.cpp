// cluster.custom: explicit vertices and links.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "test_util.hpp"

namespace moesim::topology {
namespace {

using namespace testing;  // NOLINT
using ::testing::HasSubstr;

/// 2 nodes x 1 GPU: gpu0 - nic0 - {sw0, sw1} - nic1 - gpu1. Links 32 GB/s 1 us on the GPU side,
/// 25 GB/s 2 us on the fabric side.
ClusterSpec custom_spec() {
  ClusterSpec s = make_spec(2, 1, IntraKind::kNvswitch, InterKind::kCustom);
  CustomTopologySpec c;
  c.vertices = {{"gpu0", "gpu", 0, {}}, {"gpu1", "gpu", 1, {}},    {"nic0", "nic", 0, {}},
                {"nic1", "nic", 1, {}}, {"sw0", "switch", -1, {}}, {"sw1", "switch", -1, {}}};
  c.links = {{"gpu0", "nic0", 32_GBps, 1_us, {}}, {"gpu1", "nic1", 32_GBps, 1_us, {}},
             {"nic0", "sw0", 25_GBps, 2_us, {}},  {"nic1", "sw0", 25_GBps, 2_us, {}},
             {"nic0", "sw1", 25_GBps, 2_us, {}},  {"nic1", "sw1", 25_GBps, 2_us, {}}};
  s.custom = c;
  return s;
}

TEST(Custom, BuildsTheGivenGraph) {
  auto t = build_topology(custom_spec());
  EXPECT_EQ(t->vertices().size(), 6u);
  EXPECT_EQ(t->links().size(), 12u);
  EXPECT_EQ(t->vertices()[t->gpu_vertex(1)].name, "gpu1");
  const PairCost c = t->pair_cost(0, 1);
  EXPECT_EQ(c.hops, 4);
  EXPECT_DOUBLE_EQ(c.alpha.value(), 6 * kUs);  // custom link latencies are taken as given
  EXPECT_DOUBLE_EQ(c.bandwidth.value(), 25 * kGB);
  EXPECT_EQ(c.tier, 1);
  EXPECT_EQ(t->gpus_per_nic(), 1);
  const auto rows = t->tier_table();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].tier, 1);
  EXPECT_EQ(rows[0].pairs, 2);
  // Both switches are equal-cost; the route takes one, the same each time.
  const auto sw = switches_on(*t, route_of(*t, 0, 1));
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(route_of(*t, 0, 1), route_of(*t, 0, 1));
  // Two 25 GB/s fabric links leave nic0, but the 32 GB/s gpu0-nic0 link binds.
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 32 * kGB);
}

TEST(Custom, GpusAreImplicit) {
  // The scenarios/custom-2x2.yaml shape: GPUs not listed, both GPUs of a node and its NIC under
  // one PCIe switch, NICs on one switch.
  ClusterSpec s = make_spec(2, 2, IntraKind::kNvswitch, InterKind::kCustom);
  CustomTopologySpec c;
  c.vertices = {{"node0.pcie", "pcie_switch", 0, {}},
                {"node1.pcie", "pcie_switch", 1, {}},
                {"node0.nic", "nic", 0, {}},
                {"node1.nic", "nic", 1, {}},
                {"tor", "switch", -1, {}}};
  c.links = {{"gpu0", "node0.pcie", 32_GBps, 1_us, {}},
             {"gpu1", "node0.pcie", 32_GBps, 1_us, {}},
             {"gpu2", "node1.pcie", 32_GBps, 1_us, {}},
             {"gpu3", "node1.pcie", 32_GBps, 1_us, {}},
             {"node0.nic", "node0.pcie", 32_GBps, 500_ns, {}},
             {"node1.nic", "node1.pcie", 32_GBps, 500_ns, {}},
             {"node0.nic", "tor", 100_Gbps, 1_us, {}},
             {"node1.nic", "tor", 100_Gbps, 1_us, {}}};
  s.custom = c;
  auto t = build_topology(s);
  EXPECT_EQ(t->vertices().size(), 4u + 5);
  EXPECT_EQ(t->vertices()[t->gpu_vertex(3)].name, "gpu3");
  EXPECT_EQ(t->vertices()[t->gpu_vertex(3)].node, 1);
  const PairCost intra = t->pair_cost(0, 1);
  EXPECT_EQ(intra.hops, 2);
  EXPECT_DOUBLE_EQ(intra.alpha.value(), 2 * kUs);
  EXPECT_EQ(intra.tier, 0);
  const PairCost inter = t->pair_cost(1, 2);  // gpu1-pcie-nic-tor-nic-pcie-gpu2
  EXPECT_EQ(inter.hops, 6);
  EXPECT_DOUBLE_EQ(inter.alpha.value(), 1 * kUs + 0.5 * kUs + 2 * kUs + 0.5 * kUs + 1 * kUs);
  EXPECT_DOUBLE_EQ(inter.bandwidth.value(), 12.5 * kGB / 2);  // 100 Gb/s NIC, 2 GPUs on it
  EXPECT_EQ(inter.tier, 1);
}

TEST(Custom, EcmpUsesBothParallelSwitches) {
  // 2 nodes x 4 GPUs sharing one NIC per node: 16 inter-node pairs over two switches.
  ClusterSpec s = make_spec(2, 4, IntraKind::kNvswitch, InterKind::kCustom);
  CustomTopologySpec c;
  for (int g = 0; g < 8; ++g) c.vertices.push_back({"gpu" + std::to_string(g), "gpu", -1, {}});
  c.vertices.push_back({"nvs0", "nvswitch", 0, {}});
  c.vertices.push_back({"nvs1", "nvswitch", 1, {}});
  c.vertices.push_back({"nic0", "nic", 0, {}});
  c.vertices.push_back({"nic1", "nic", 1, {}});
  c.vertices.push_back({"sw0", "switch", -1, {}});
  c.vertices.push_back({"sw1", "switch", -1, {}});
  for (int g = 0; g < 8; ++g) {
    c.links.push_back({"gpu" + std::to_string(g), g < 4 ? "nvs0" : "nvs1", 300_GBps, 1_us, {}});
  }
  c.links.push_back({"nvs0", "nic0", 32_GBps, 1_us, {}});
  c.links.push_back({"nvs1", "nic1", 32_GBps, 1_us, {}});
  for (const char* nic : {"nic0", "nic1"}) {
    for (const char* sw : {"sw0", "sw1"}) c.links.push_back({nic, sw, 25_GBps, 2_us, {}});
  }
  s.custom = c;
  auto t = build_topology(s);
  EXPECT_EQ(t->gpus_per_nic(), 4);
  std::set<VertexId> used;
  for (int a = 0; a < 4; ++a) {
    for (int b = 4; b < 8; ++b) {
      const auto sw = switches_on(*t, route_of(*t, a, b));
      ASSERT_EQ(sw.size(), 1u);
      used.insert(sw[0]);
      // NIC share: 25 GB/s / 4 GPUs.
      EXPECT_DOUBLE_EQ(t->pair_cost(a, b).bandwidth.value(), 25 * kGB / 4);
    }
  }
  EXPECT_EQ(used.size(), 2u);
  // Intra-node pairs go through the NVSwitch, not out to the fabric.
  const PairCost intra = t->pair_cost(0, 1);
  EXPECT_EQ(intra.hops, 2);
  EXPECT_EQ(intra.tier, 0);
}

TEST(Custom, ErrorsNameTheProblem) {
  {
    auto s = custom_spec();
    s.custom->links[0].b = "nic9";
    s.custom->links[0].where = SourceLocation{"c.yaml", 12, 5};
    try {
      build_topology(s);
      FAIL();
    } catch (const InputError& e) {
      EXPECT_EQ(e.location().line, 12);
      EXPECT_EQ(e.key(), "cluster.custom.links[0]");
      EXPECT_THAT(e.message(), HasSubstr("unknown vertex 'nic9'"));
    }
  }
  {
    auto s = custom_spec();
    s.custom->vertices[1].name = "gpu7";
    EXPECT_THROW(build_topology(s), InputError);
  }
  {
    auto s = custom_spec();
    s.custom->vertices[4].kind = "router";
    try {
      build_topology(s);
      FAIL();
    } catch (const InputError& e) {
      EXPECT_THAT(e.message(), HasSubstr("found 'router', expected gpu, nic"));
    }
  }
  {
    auto s = custom_spec();
    s.custom->links.erase(s.custom->links.begin() + 2, s.custom->links.end());  // no fabric
    try {
      build_topology(s);
      FAIL();
    } catch (const InputError& e) {
      EXPECT_THAT(e.message(), HasSubstr("cannot reach"));
    }
  }
  {
    auto s = custom_spec();
    s.custom->vertices.push_back({"sw0", "switch", -1, {}});
    EXPECT_THROW(build_topology(s), InputError);
  }
  {
    auto s = custom_spec();
    s.custom->vertices.push_back({"gpu1", "gpu", -1, {}});  // listed twice
    EXPECT_THROW(build_topology(s), InputError);
  }
  {
    auto s = custom_spec();
    s.custom->vertices[1].node = 0;  // gpu1 is on node 1
    EXPECT_THROW(build_topology(s), InputError);
  }
}

}  // namespace
}  // namespace moesim::topology
