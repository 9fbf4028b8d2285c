// Every builder on tiny clusters whose counts, alpha/beta and tiers are worked out by hand.
// Conventions (core/cluster_spec.hpp): every link of a tier carries half the tier's latency;
// defaults from test_util.hpp: NVSwitch port 300 GB/s and 1 us, GPU PCIe 32 GB/s, NICs 25 GB/s
// and 2 us, so a GPU-NIC link costs 0.5 us and a NIC-switch link 1 us.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "core/error.hpp"
#include "test_util.hpp"

namespace moesim::topology {
namespace {

using namespace testing;  // NOLINT
using ::testing::HasSubstr;

const TierRow* find_tier(const std::vector<TierRow>& rows, int tier) {
  for (const auto& r : rows) {
    if (r.tier == tier) return &r;
  }
  return nullptr;
}

// Caches of derived quantities key on instance_id(): every topology object gets its own, even
// one built from the same spec at an address a freed one had.
TEST(Topology, EveryObjectHasItsOwnInstanceId) {
  const auto spec = make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch);
  std::uint64_t previous = 0;
  for (int i = 0; i < 3; ++i) {
    auto t = build_topology(spec);
    EXPECT_NE(t->instance_id(), 0u);
    EXPECT_NE(t->instance_id(), previous);
    previous = t->instance_id();
  }
  auto a = build_topology(spec), b = build_topology(spec);
  EXPECT_NE(a->instance_id(), b->instance_id());
}

TEST(NvswitchSwitch, TwoNodesOfTwoGpus) {
  auto t = build_topology(make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch));
  // Per node: 2 GPUs, 1 NVSwitch, 2 NICs; plus one fabric switch.
  EXPECT_EQ(t->vertices().size(), 11u);
  EXPECT_EQ(count_kind(*t, VertexKind::kNvswitch), 2);
  EXPECT_EQ(count_kind(*t, VertexKind::kNic), 4);
  EXPECT_EQ(count_kind(*t, VertexKind::kSwitch), 1);
  // Per node: 2 GPU-NVSwitch + 2 GPU-NIC cables; 4 NIC-switch cables; two links per cable.
  EXPECT_EQ(t->links().size(), 2u * 12);

  const PairCost intra = t->pair_cost(0, 1);
  EXPECT_DOUBLE_EQ(intra.alpha.value(), 1 * kUs);  // intra.latency
  EXPECT_DOUBLE_EQ(intra.bandwidth.value(), 300 * kGB);
  EXPECT_EQ(intra.hops, 2);
  EXPECT_EQ(intra.tier, 0);

  const PairCost inter = t->pair_cost(0, 3);
  EXPECT_DOUBLE_EQ(inter.alpha.value(), 2 * kUs + 2 * 0.5 * kUs);  // inter + 2 GPU-NIC links
  EXPECT_DOUBLE_EQ(inter.bandwidth.value(), 25 * kGB);             // min(32 PCIe, 25 NIC)
  EXPECT_EQ(inter.hops, 4);
  EXPECT_EQ(inter.tier, 1);
  EXPECT_DOUBLE_EQ(inter.beta(), 1.0 / (25 * kGB));
  EXPECT_EQ(t->gpus_per_nic(), 1);
  // Node 0 -> node 1: two NICs of 25 GB/s each way.
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 50 * kGB);
}

TEST(NvswitchSwitch, TierCountsTwoByEight) {
  auto t = build_topology(make_spec(2, 8, IntraKind::kNvswitch, InterKind::kSwitch));
  const auto rows = t->tier_table();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].tier, 0);
  EXPECT_EQ(rows[0].pairs, 2 * 8 * 7);
  EXPECT_EQ(rows[1].tier, 1);
  EXPECT_EQ(rows[1].pairs, 2 * 8 * 8);
  EXPECT_EQ(rows[0].min_hops, 2);
  EXPECT_EQ(rows[0].max_hops, 2);
  EXPECT_DOUBLE_EQ(rows[1].min_alpha.value(), 3 * kUs);
  EXPECT_DOUBLE_EQ(rows[1].max_alpha.value(), 3 * kUs);
  EXPECT_DOUBLE_EQ(rows[1].min_bandwidth.value(), 25 * kGB);
  EXPECT_DOUBLE_EQ(rows[1].max_bandwidth.value(), 25 * kGB);
}

TEST(NvswitchSwitch, SingleNodeBisectionIsHalfTheNvswitchPorts) {
  auto t = build_topology(make_spec(1, 8, IntraKind::kNvswitch, InterKind::kNone));
  EXPECT_EQ(count_kind(*t, VertexKind::kNic), 0);
  EXPECT_EQ(t->gpus_per_nic(), 0);
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 4 * 300 * kGB);
}

TEST(NicSharing, FourGpusOnOneNicGetAQuarter) {
  auto spec = make_spec(2, 4, IntraKind::kNvswitch, InterKind::kSwitch);
  spec.inter.nics_per_node = 1;
  auto t = build_topology(spec);
  EXPECT_EQ(t->gpus_per_nic(), 4);
  EXPECT_EQ(count_kind(*t, VertexKind::kNic), 2);
  EXPECT_DOUBLE_EQ(t->nic_share_bandwidth(5).value(), 25 * kGB / 4);
  for (int src = 0; src < 4; ++src) {
    const PairCost c = t->pair_cost(src, 4 + (src + 1) % 4);
    EXPECT_DOUBLE_EQ(c.bandwidth.value(), 25 * kGB / 4);
    EXPECT_EQ(c.tier, 1);
  }
  // All four GPUs leave through the same NIC-switch link.
  const LinkId nic_link = route_of(*t, 0, 4)[1];
  for (int src = 1; src < 4; ++src) EXPECT_EQ(route_of(*t, src, 4)[1], nic_link);
  // Two NICs per node for four GPUs: GPUs 0,1 on NIC 0 and 2,3 on NIC 1 (floor(i*2/4)).
  spec.inter.nics_per_node = 2;
  t = build_topology(spec);
  EXPECT_EQ(t->gpus_per_nic(), 2);
  EXPECT_EQ(route_of(*t, 0, 4)[1], route_of(*t, 1, 4)[1]);
  EXPECT_NE(route_of(*t, 0, 4)[1], route_of(*t, 2, 4)[1]);
}

TEST(NvlinkRing, FourGpuRing) {
  auto spec = make_spec(1, 4, IntraKind::kNvlinkRing, InterKind::kNone);
  spec.intra.bandwidth = 50_GBps;
  auto t = build_topology(spec);
  EXPECT_EQ(t->vertices().size(), 4u);
  EXPECT_EQ(t->links().size(), 2u * 4);
  const PairCost near = t->pair_cost(0, 1);
  EXPECT_EQ(near.hops, 1);
  EXPECT_DOUBLE_EQ(near.alpha.value(), 1 * kUs);  // a direct link carries the whole latency
  EXPECT_DOUBLE_EQ(near.bandwidth.value(), 50 * kGB);
  const PairCost far = t->pair_cost(0, 2);
  EXPECT_EQ(far.hops, 2);
  EXPECT_DOUBLE_EQ(far.alpha.value(), 2 * kUs);
  EXPECT_EQ(t->pair_cost(3, 0).hops, 1);  // wraps around
  // Cutting the ring {0,1} | {2,3} cuts two cables.
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 2 * 50 * kGB);
}

TEST(NvlinkRing, TwoGpusHaveOneCable) {
  auto t = build_topology(make_spec(1, 2, IntraKind::kNvlinkRing, InterKind::kNone));
  EXPECT_EQ(t->links().size(), 2u);
}

TEST(NvlinkRing, OppositeGpusUseBothDirectionsAcrossPairs) {
  auto t = build_topology(make_spec(8, 4, IntraKind::kNvlinkRing, InterKind::kSwitch));
  // Clockwise and counter-clockwise first hops both occur (ECMP over the two halves).
  std::set<int> directions;
  for (int n = 0; n < 8; ++n) {
    for (int i = 0; i < 4; ++i) {
      const auto p = route_of(*t, n * 4 + i, n * 4 + (i + 2) % 4);
      ASSERT_EQ(p.size(), 2u);
      EXPECT_EQ(p, route_of(*t, n * 4 + i, n * 4 + (i + 2) % 4));  // deterministic
      const Vertex& next = t->vertices()[t->links()[p[0]].dst];
      directions.insert((next.index - (n * 4 + i) + 4) % 4);
    }
  }
  EXPECT_EQ(directions, (std::set<int>{1, 3}));
  const auto rows = t->tier_table();
  ASSERT_EQ(rows[0].tier, 0);
  EXPECT_EQ(rows[0].pairs, 8 * 4 * 3);
  EXPECT_EQ(rows[0].min_hops, 1);
  EXPECT_EQ(rows[0].max_hops, 2);
}

TEST(Pcie, TwoSocketsFourGpus) {
  auto spec = make_spec(1, 4, IntraKind::kPcie, InterKind::kNone);
  spec.intra.bandwidth = 16_GBps;
  spec.intra.gpus_per_pcie_switch = 2;
  spec.intra.sockets = 2;
  auto t = build_topology(spec);
  EXPECT_EQ(count_kind(*t, VertexKind::kPcieSwitch), 2);
  EXPECT_EQ(count_kind(*t, VertexKind::kHostBridge), 2);
  EXPECT_EQ(t->vertices().size(), 8u);
  EXPECT_EQ(t->links().size(), 2u * 7);  // 4 GPU-switch, 2 switch-socket, 1 socket-socket
  const PairCost same_switch = t->pair_cost(0, 1);
  EXPECT_EQ(same_switch.hops, 2);
  EXPECT_DOUBLE_EQ(same_switch.alpha.value(), 1 * kUs);
  const PairCost cross = t->pair_cost(1, 2);  // gpu-pcie-socket-socket-pcie-gpu
  EXPECT_EQ(cross.hops, 5);
  EXPECT_DOUBLE_EQ(cross.alpha.value(), 2.5 * kUs);
  EXPECT_DOUBLE_EQ(cross.bandwidth.value(), 16 * kGB);
  // GPUs 0,1 share their switch's single uplink.
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 16 * kGB);
}

TEST(Pcie, NicHangsOffThePcieSwitch) {
  auto spec = make_spec(2, 4, IntraKind::kPcie, InterKind::kSwitch);
  spec.intra.bandwidth = 16_GBps;
  spec.intra.gpus_per_pcie_switch = 2;
  spec.inter.nics_per_node = 1;
  auto t = build_topology(spec);
  // The NIC sits under PCIe switch 0, so GPU 2 reaches it through the socket:
  // gpu2-pcie1-socket-pcie0-nic, then nic-switch-nic, then nic-pcie0-socket-pcie1-gpu6.
  const PairCost c = t->pair_cost(2, 6);
  EXPECT_EQ(c.hops, 10);
  EXPECT_DOUBLE_EQ(c.alpha.value(), 8 * 0.5 * kUs + 2 * kUs);
  EXPECT_DOUBLE_EQ(c.bandwidth.value(), 25 * kGB / 4);  // one NIC for four GPUs
  const PairCost d = t->pair_cost(0, 4);                // gpu0-pcie0-nic ... nic-pcie0-gpu4
  EXPECT_EQ(d.hops, 6);
}

TEST(FatTree, TwoLevelsSmallRadix) {
  // Radix 4, no oversubscription: leaves have 2 NIC ports and 2 uplinks; 4 NICs -> 2 leaves,
  // 2 spines, each uplink 2 * 25 / 2 = 25 GB/s.
  auto spec = make_spec(4, 1, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 4;
  auto t = build_topology(spec);
  EXPECT_EQ(count_kind(*t, VertexKind::kSwitch), 4);
  EXPECT_EQ(t->vertices().size(), 4u * 3 + 4);
  EXPECT_EQ(t->links().size(), 2u * (4 * 2 + 4 + 4));
  const PairCost leaf = t->pair_cost(0, 1);
  EXPECT_EQ(leaf.tier, 1);
  EXPECT_EQ(leaf.hops, 4);
  EXPECT_DOUBLE_EQ(leaf.alpha.value(), 3 * kUs);
  const PairCost spine = t->pair_cost(0, 2);
  EXPECT_EQ(spine.tier, 2);
  EXPECT_EQ(spine.hops, 6);
  EXPECT_DOUBLE_EQ(spine.alpha.value(), 2 * 2 * kUs + 2 * 0.5 * kUs);
  EXPECT_DOUBLE_EQ(spine.bandwidth.value(), 25 * kGB);
  const auto rows = t->tier_table();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(find_tier(rows, 1)->pairs, 4);
  EXPECT_EQ(find_tier(rows, 2)->pairs, 8);
}

TEST(FatTree, ThreeLevelsWhenTwoDoNotFit) {
  // Radix 4: 2 leaves per pod, 16 NICs -> 8 leaves > radix, so 3 levels: 4 pods x 2 aggregation
  // switches, 2 core groups of 2 cores.
  auto spec = make_spec(16, 1, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 4;
  auto t = build_topology(spec);
  int by_level[4] = {0, 0, 0, 0};
  for (const auto& v : t->vertices()) {
    if (v.kind == VertexKind::kSwitch) ++by_level[v.level];
  }
  EXPECT_EQ(by_level[1], 8);
  EXPECT_EQ(by_level[2], 8);
  EXPECT_EQ(by_level[3], 4);
  EXPECT_EQ(t->pair_cost(0, 1).tier, 1);
  EXPECT_EQ(t->pair_cost(0, 2).tier, 2);
  const PairCost core = t->pair_cost(0, 4);
  EXPECT_EQ(core.tier, 3);
  EXPECT_EQ(core.hops, 8);
  EXPECT_DOUBLE_EQ(core.alpha.value(), 1 * kUs + 6 * 1 * kUs);
  const auto rows = t->tier_table();
  EXPECT_EQ(find_tier(rows, 1)->pairs, 16);   // 8 leaves x 2 ordered pairs
  EXPECT_EQ(find_tier(rows, 2)->pairs, 32);   // each GPU: 2 in the other leaf of its pod
  EXPECT_EQ(find_tier(rows, 3)->pairs, 192);  // the rest of 16 * 15
  EXPECT_EQ(find_tier(rows, 3)->max_hops, 8);
  // Non-blocking: any half of the NICs can send at full rate.
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 8 * 25 * kGB);

  spec.inter.levels = 2;
  spec.locations["cluster.inter_node.levels"] = SourceLocation{"ft.yaml", 9, 5};
  try {
    build_topology(spec);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "cluster.inter_node.levels");
    EXPECT_EQ(e.location().file, "ft.yaml");  // the loader's location of the key
    EXPECT_EQ(e.location().line, 9);
    EXPECT_THAT(e.message(), HasSubstr("holds at most 8 NICs"));
  }
}

TEST(FatTree, WholeNodesPerLeaf) {
  // Radix 8 gives 4 NIC ports per leaf; with 3 NICs per node only 3 are cabled, so each node sits
  // on its own leaf with 3 uplinks of 25 GB/s (3 spines), never split over two leaves.
  auto spec = make_spec(4, 3, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 8;
  auto t = build_topology(spec);
  int leaves = 0, spines = 0;
  for (const auto& v : t->vertices()) {
    if (v.kind == VertexKind::kSwitch) (v.level == 1 ? leaves : spines)++;
  }
  EXPECT_EQ(leaves, 4);
  EXPECT_EQ(spines, 3);
  const auto rows = t->tier_table();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(find_tier(rows, 0)->pairs, 4 * 3 * 2);
  EXPECT_EQ(find_tier(rows, 2)->pairs, 4 * 3 * 9);
  EXPECT_DOUBLE_EQ(find_tier(rows, 2)->min_bandwidth.value(), 25 * kGB);
}

TEST(FatTree, OversubscriptionCutsBisection) {
  // 12 single-GPU nodes, radix 8. Oversubscription 3: leaves have 6 NIC ports and 2 uplinks of
  // 6 * 25 / (3 * 2) = 25 GB/s, so half the cluster (one leaf) sends 50 GB/s.
  auto spec = make_spec(12, 1, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 8;
  spec.inter.oversubscription = 3;
  auto t = build_topology(spec);
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 50 * kGB);
  // Without oversubscription (4 ports + 4 uplinks per leaf) all 6 NICs of a half send.
  spec.inter.oversubscription = 1;
  t = build_topology(spec);
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 6 * 25 * kGB);
}

TEST(RailOptimized, SameRailStaysOnTheRailSwitch) {
  auto spec = make_spec(2, 2, IntraKind::kNvswitch, InterKind::kRailOptimized);
  spec.inter.switch_radix = 8;  // 4 NIC ports, 4 uplinks -> 4 spines
  auto t = build_topology(spec);
  EXPECT_EQ(count_kind(*t, VertexKind::kSwitch), 2 + 4);
  EXPECT_EQ(t->links().size(), 2u * (2 * 4 + 4 + 2 * 4));
  const PairCost rail = t->pair_cost(0, 2);  // local GPU 0 -> local GPU 0: rail 0
  EXPECT_EQ(rail.tier, 1);
  EXPECT_EQ(rail.hops, 4);
  EXPECT_DOUBLE_EQ(rail.alpha.value(), 3 * kUs);
  const PairCost cross = t->pair_cost(0, 3);  // rail 0 -> spine -> rail 1
  EXPECT_EQ(cross.tier, 2);
  EXPECT_EQ(cross.hops, 6);
  EXPECT_DOUBLE_EQ(cross.alpha.value(), 5 * kUs);
  const auto sw = switches_on(*t, route_of(*t, 0, 2));
  ASSERT_EQ(sw.size(), 1u);
  EXPECT_EQ(t->vertices()[sw[0]].name, "rail0");
}

TEST(Dragonfly, LocalAndGlobalHops) {
  // 4 single-GPU nodes in 2 groups of 2 routers: one node per router. Group 0 reaches group 1
  // over the global link g0.r0 - g1.r0.
  auto spec = make_spec(4, 1, IntraKind::kNvswitch, InterKind::kDragonfly);
  spec.inter.groups = 2;
  spec.inter.routers_per_group = 2;
  spec.inter.global_bandwidth = 10_GBps;
  auto t = build_topology(spec);
  EXPECT_EQ(count_kind(*t, VertexKind::kSwitch), 4);
  EXPECT_EQ(t->vertices().size(), 4u * 3 + 4);
  EXPECT_EQ(t->links().size(), 2u * (4 * 2 + 4 + 2 + 1));
  const PairCost local = t->pair_cost(0, 1);  // r0 - r1 in group 0
  EXPECT_EQ(local.tier, 2);
  EXPECT_EQ(local.hops, 5);
  EXPECT_DOUBLE_EQ(local.alpha.value(), 4 * kUs);
  EXPECT_DOUBLE_EQ(local.bandwidth.value(), 25 * kGB);
  const PairCost direct = t->pair_cost(0, 2);  // g0.r0 - g1.r0
  EXPECT_EQ(direct.tier, 3);
  EXPECT_EQ(direct.hops, 5);
  EXPECT_DOUBLE_EQ(direct.bandwidth.value(), 10 * kGB);
  const PairCost far = t->pair_cost(1, 3);  // g0.r1 - g0.r0 - g1.r0 - g1.r1
  EXPECT_EQ(far.tier, 3);
  EXPECT_EQ(far.hops, 7);
  EXPECT_DOUBLE_EQ(far.alpha.value(), 1 * kUs + 5 * kUs);
  const auto rows = t->tier_table();
  EXPECT_EQ(find_tier(rows, 2)->pairs, 4);
  EXPECT_EQ(find_tier(rows, 3)->pairs, 8);
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 10 * kGB);
}

TEST(Dragonfly, AutoGroupsAndRouters) {
  auto spec = make_spec(16, 2, IntraKind::kNvswitch, InterKind::kDragonfly);
  auto t = build_topology(spec);  // 4 groups (sqrt 16); radix 64 -> 16 terminals per router
  int routers = count_kind(*t, VertexKind::kSwitch);
  EXPECT_EQ(routers, 4 * 1);  // 4 nodes x 2 NICs = 8 terminals fit one router
  spec.inter.groups = 17;
  EXPECT_THROW(build_topology(spec), InputError);
}

TEST(Tree, NestedListStructureAndTiers) {
  // [[2,2],[2]]: root over switch X (leaves A, B) and switch Y (leaf C); 2 nodes per leaf.
  auto spec = make_spec(6, 1, IntraKind::kNvswitch, InterKind::kTree);
  TreeSpec leaf2{true, 2, {}};
  spec.inter.tree =
      TreeSpec{false, 0, {TreeSpec{false, 0, {leaf2, leaf2}}, TreeSpec{false, 0, {leaf2}}}};
  auto t = build_topology(spec);
  int by_level[4] = {0, 0, 0, 0};
  for (const auto& v : t->vertices()) {
    if (v.kind == VertexKind::kSwitch) ++by_level[v.level];
  }
  EXPECT_EQ(by_level[1], 3);
  EXPECT_EQ(by_level[2], 2);
  EXPECT_EQ(by_level[3], 1);
  EXPECT_EQ(t->links().size(), 2u * (6 * 2 + 6 + 3 + 2));
  const auto rows = t->tier_table();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(find_tier(rows, 1)->pairs, 6);   // same leaf
  EXPECT_EQ(find_tier(rows, 2)->pairs, 8);   // A <-> B under X
  EXPECT_EQ(find_tier(rows, 3)->pairs, 16);  // {A,B} <-> C through the root
  const PairCost top = t->pair_cost(0, 4);
  EXPECT_EQ(top.hops, 8);
  EXPECT_DOUBLE_EQ(top.alpha.value(), 1 * kUs + 6 * kUs);
  // Default uplinks carry all that is below (leaf 50, X 100, Y 50 GB/s): NICs bind.
  EXPECT_DOUBLE_EQ(top.bandwidth.value(), 25 * kGB);
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 3 * 25 * kGB);

  spec.inter.tree_level_bandwidth = {10_GBps, 20_GBps};  // leaf uplinks, then X/Y uplinks
  t = build_topology(spec);
  EXPECT_DOUBLE_EQ(t->pair_cost(0, 2).bandwidth.value(), 10 * kGB);
  EXPECT_DOUBLE_EQ(t->pair_cost(0, 4).bandwidth.value(), 10 * kGB);
  EXPECT_DOUBLE_EQ(t->pair_cost(0, 1).bandwidth.value(), 25 * kGB);
  // Node 2 -> 3 inside leaf B (25) plus {0,1} -> C's 10 GB/s uplink.
  EXPECT_DOUBLE_EQ(t->bisection_bandwidth().value(), 35 * kGB);

  spec.nodes = 7;
  EXPECT_THROW(build_topology(spec), InputError);
}

TEST(Validation, BadSpecsAreInputErrors) {
  EXPECT_THROW(build_topology(make_spec(2, 2, IntraKind::kNvswitch, InterKind::kNone)), InputError);
  auto spec = make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch);
  spec.inter.nic_bandwidth = BytesPerSecond(0);
  EXPECT_NO_THROW(build_topology(spec));  // the A100's catalog NIC (ConnectX-6) gives the rate
  spec.gpu.from_catalog = false;          // an inline GPU has no catalog NIC
  EXPECT_THROW(build_topology(spec), InputError);
  spec = make_spec(2, 2, IntraKind::kNvswitch, InterKind::kCustom);
  EXPECT_THROW(build_topology(spec), InputError);
  spec = make_spec(1, 2, IntraKind::kNvswitch, InterKind::kNone);
  spec.gpu.name = "rtx-4090";  // no NVLink: an NVSwitch node needs an explicit bandwidth
  spec.intra.bandwidth = BytesPerSecond(0);
  EXPECT_THROW(build_topology(spec), InputError);
  spec.intra.kind = IntraKind::kPcie;  // PCIe nodes default to the GPU's PCIe bandwidth
  EXPECT_DOUBLE_EQ(build_topology(spec)->pair_cost(0, 1).bandwidth.value(), 32 * kGB);
}

TEST(Dot, OneEdgePerCable) {
  auto t = build_topology(make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch));
  std::ostringstream os;
  write_dot(*t, os);
  const std::string dot = os.str();
  EXPECT_EQ(dot.rfind("graph moesim {", 0), 0u);
  std::size_t edges = 0;
  for (std::size_t p = dot.find(" -- "); p != std::string::npos; p = dot.find(" -- ", p + 1)) {
    ++edges;
  }
  EXPECT_EQ(edges, t->links().size() / 2);
  EXPECT_THAT(dot, HasSubstr("\"node1.nic0\" -- \"switch\""));
  EXPECT_THAT(dot, HasSubstr("\"gpu3\""));
}

}  // namespace
}  // namespace moesim::topology
