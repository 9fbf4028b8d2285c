// Properties every route must have, on a small instance of every builder: a connected chain of
// directed links from the source GPU to the destination GPU, shortest, deterministic, never
// through another GPU (except on NVLink rings) or a NIC inside a node; pair_cost must describe
// exactly the links route() returns; ECMP must spread pairs over equal-cost spines; d-mod-k
// (the fat_tree / rail_optimized default) must pick the up-port by destination index.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "test_util.hpp"

namespace moesim::topology {
namespace {

using namespace testing;  // NOLINT

struct Case {
  const char* name;
  ClusterSpec spec;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"nvswitch_switch", make_spec(3, 4, IntraKind::kNvswitch, InterKind::kSwitch)});
  auto ring = make_spec(3, 6, IntraKind::kNvlinkRing, InterKind::kSwitch);
  ring.inter.nics_per_node = 2;
  out.push_back({"ring_switch", ring});
  auto pcie = make_spec(3, 8, IntraKind::kPcie, InterKind::kSwitch);
  pcie.intra.bandwidth = 16_GBps;
  pcie.intra.sockets = 2;
  pcie.inter.nics_per_node = 3;  // uneven sharing: 3, 3, 2 GPUs per NIC
  out.push_back({"pcie_switch", pcie});
  auto fat2 = make_spec(8, 2, IntraKind::kNvswitch, InterKind::kFatTree);
  fat2.inter.switch_radix = 8;
  fat2.inter.oversubscription = 2;
  out.push_back({"fat_tree_2", fat2});
  auto fat3 = make_spec(8, 2, IntraKind::kNvswitch, InterKind::kFatTree);
  fat3.inter.switch_radix = 4;
  out.push_back({"fat_tree_3", fat3});
  // The routing modes other than the default d-mod-k.
  fat3.inter.ecmp = EcmpMode::kHash;
  out.push_back({"fat_tree_3_hash", fat3});
  fat3.inter.ecmp = EcmpMode::kSpray;
  out.push_back({"fat_tree_3_spray", fat3});
  auto rail = make_spec(5, 4, IntraKind::kNvswitch, InterKind::kRailOptimized);
  rail.inter.switch_radix = 6;  // 3 nodes per rail leaf: 2 leaves per rail
  out.push_back({"rail", rail});
  rail.inter.ecmp = EcmpMode::kHash;
  out.push_back({"rail_hash", rail});
  rail.inter.ecmp = EcmpMode::kSpray;
  out.push_back({"rail_spray", rail});
  auto fly = make_spec(9, 2, IntraKind::kNvswitch, InterKind::kDragonfly);
  fly.inter.groups = 3;
  fly.inter.routers_per_group = 3;
  out.push_back({"dragonfly", fly});
  auto tree = make_spec(5, 2, IntraKind::kNvswitch, InterKind::kTree);
  const TreeSpec leaf1{true, 1, {}}, leaf2{true, 2, {}};
  tree.inter.tree = TreeSpec{false, 0, {TreeSpec{false, 0, {leaf2, leaf1}}, leaf2}};
  out.push_back({"tree_unbalanced", tree});
  return out;
}

TEST(Routing, LinksComeInFullDuplexPairs) {
  for (const auto& c : cases()) {
    auto t = build_topology(c.spec);
    const auto& links = t->links();
    ASSERT_EQ(links.size() % 2, 0u) << c.name;
    for (std::size_t l = 0; l < links.size(); l += 2) {
      EXPECT_EQ(links[l].src, links[l + 1].dst) << c.name;
      EXPECT_EQ(links[l].dst, links[l + 1].src) << c.name;
      EXPECT_EQ(links[l].bandwidth, links[l + 1].bandwidth) << c.name;
      EXPECT_GT(links[l].bandwidth.value(), 0) << c.name;
    }
  }
}

TEST(Routing, RoutesAreChainsAndPairCostDescribesThem) {
  for (const auto& c : cases()) {
    auto t = build_topology(c.spec);
    const bool ring = c.spec.intra.kind == IntraKind::kNvlinkRing;
    const auto& links = t->links();
    const auto& vertices = t->vertices();
    std::int64_t pairs = 0;
    for (int s = 0; s < t->num_gpus(); ++s) {
      for (int d = 0; d < t->num_gpus(); ++d) {
        if (s == d) continue;
        ++pairs;
        const auto path = route_of(*t, s, d);
        ASSERT_FALSE(path.empty()) << c.name;
        EXPECT_EQ(path, route_of(*t, s, d)) << c.name << " deterministic";
        VertexId at = t->gpu_vertex(s);
        double alpha = 0, bw = 1e300;
        int tier = 0;
        for (std::size_t h = 0; h < path.size(); ++h) {
          const Link& l = links[path[h]];
          ASSERT_EQ(l.src, at) << c.name << " " << s << "->" << d << " hop " << h;
          at = l.dst;
          alpha += l.latency.value();
          bw = std::min(bw, l.bandwidth.value());
          tier = std::max(tier, l.tier);
          if (h + 1 < path.size()) {
            const Vertex& v = vertices[at];
            if (!ring) {
              EXPECT_NE(v.kind, VertexKind::kGpu) << c.name << " GPU transit";
            }
            if (t->node_of(s) == t->node_of(d)) {
              EXPECT_NE(v.kind, VertexKind::kNic) << c.name << " NIC inside a node";
              EXPECT_NE(v.kind, VertexKind::kSwitch) << c.name << " fabric inside a node";
            }
          }
        }
        EXPECT_EQ(at, t->gpu_vertex(d)) << c.name;
        const PairCost pc = t->pair_cost(s, d);
        const bool inter = t->node_of(s) != t->node_of(d);
        if (inter) {
          bw = std::min({bw, t->nic_share_bandwidth(s).value(), t->nic_share_bandwidth(d).value()});
        }
        EXPECT_EQ(pc.hops, static_cast<int>(path.size())) << c.name;
        EXPECT_NEAR(pc.alpha.value(), alpha, 1e-15) << c.name;
        EXPECT_DOUBLE_EQ(pc.bandwidth.value(), bw) << c.name << " " << s << "->" << d;
        EXPECT_EQ(pc.tier, inter ? std::max(tier, 1) : 0) << c.name;
        // The opposite direction never shares a directed link with this one.
        const auto back = route_of(*t, d, s);
        for (LinkId l : back) {
          EXPECT_EQ(std::find(path.begin(), path.end(), l), path.end()) << c.name;
        }
      }
    }
    std::int64_t counted = 0;
    for (const auto& row : t->tier_table()) counted += row.pairs;
    EXPECT_EQ(counted, pairs) << c.name;
  }
}

TEST(Routing, TierTableMatchesEveryPairCost) {
  // tier_table() summarises classes of alike nodes; it must agree with pair_cost on every pair.
  auto many = cases();
  auto big_fat = make_spec(24, 4, IntraKind::kNvswitch, InterKind::kFatTree);
  big_fat.inter.switch_radix = 8;  // 4 NIC ports per leaf: one node per leaf, 3 levels
  many.push_back({"fat_tree_24", big_fat});
  auto shared = make_spec(12, 4, IntraKind::kNvlinkRing, InterKind::kRailOptimized);
  shared.inter.nics_per_node = 2;
  shared.inter.switch_radix = 10;
  many.push_back({"rail_shared_nics", shared});
  for (const auto& c : many) {
    auto t = build_topology(c.spec);
    std::map<int, TierRow> expect;
    for (int s = 0; s < t->num_gpus(); ++s) {
      for (int d = 0; d < t->num_gpus(); ++d) {
        if (s == d) continue;
        const PairCost pc = t->pair_cost(s, d);
        auto [it, fresh] = expect.try_emplace(pc.tier);
        TierRow& r = it->second;
        if (fresh) {
          r = TierRow{pc.tier, 0, pc.hops, pc.hops, pc.alpha, pc.alpha, pc.bandwidth, pc.bandwidth};
        }
        ++r.pairs;
        r.min_hops = std::min(r.min_hops, pc.hops);
        r.max_hops = std::max(r.max_hops, pc.hops);
        r.min_alpha = std::min(r.min_alpha, pc.alpha);
        r.max_alpha = std::max(r.max_alpha, pc.alpha);
        r.min_bandwidth = std::min(r.min_bandwidth, pc.bandwidth);
        r.max_bandwidth = std::max(r.max_bandwidth, pc.bandwidth);
      }
    }
    const auto rows = t->tier_table();
    ASSERT_EQ(rows.size(), expect.size()) << c.name;
    for (const auto& row : rows) {
      const TierRow& e = expect.at(row.tier);
      EXPECT_EQ(row.pairs, e.pairs) << c.name << " tier " << row.tier;
      EXPECT_EQ(row.min_hops, e.min_hops) << c.name;
      EXPECT_EQ(row.max_hops, e.max_hops) << c.name;
      EXPECT_DOUBLE_EQ(row.min_alpha.value(), e.min_alpha.value()) << c.name;
      EXPECT_DOUBLE_EQ(row.max_alpha.value(), e.max_alpha.value()) << c.name;
      EXPECT_DOUBLE_EQ(row.min_bandwidth.value(), e.min_bandwidth.value()) << c.name;
      EXPECT_DOUBLE_EQ(row.max_bandwidth.value(), e.max_bandwidth.value()) << c.name;
    }
  }
}

TEST(Routing, RoutesAreShortest) {
  // In a leaf-spine fabric, same-leaf pairs never climb to a spine, and other pairs take exactly
  // one spine.
  auto spec = make_spec(8, 2, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 8;
  auto t = build_topology(spec);
  for (int s = 0; s < t->num_gpus(); ++s) {
    for (int d = 0; d < t->num_gpus(); ++d) {
      if (t->node_of(s) == t->node_of(d)) continue;
      const auto sw = switches_on(*t, route_of(*t, s, d));
      // NICs 0..3 on leaf 0, 4..7 on leaf 1, ...: 2 nodes per leaf.
      const bool same_leaf = t->node_of(s) / 2 == t->node_of(d) / 2;
      EXPECT_EQ(sw.size(), same_leaf ? 1u : 3u) << s << "->" << d;
    }
  }
}

TEST(Routing, EcmpSpreadsPairsOverSpines) {
  // 2 nodes x 8 GPUs, radix 8: leaves with 4 NIC ports and 4 uplinks; node 0 on leaves 0-1,
  // node 1 on leaves 2-3. All 64 node0 -> node1 pairs cross a spine; the hash spreads them.
  auto spec = make_spec(2, 8, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 8;
  spec.inter.ecmp = EcmpMode::kHash;
  auto t = build_topology(spec);
  std::map<std::string, int> per_spine;
  for (int s = 0; s < 8; ++s) {
    for (int d = 8; d < 16; ++d) {
      const auto sw = switches_on(*t, route_of(*t, s, d));
      ASSERT_EQ(sw.size(), 3u);
      EXPECT_EQ(t->vertices()[sw[1]].level, 2);
      per_spine[t->vertices()[sw[1]].name]++;
    }
  }
  ASSERT_EQ(per_spine.size(), 4u);  // every spine carries some pairs
  for (const auto& [name, n] : per_spine) {
    EXPECT_GE(n, 6) << name;  // 16 expected each; no spine starved
    EXPECT_LE(n, 28) << name;
  }
}

/// Names of the fabric switches route(src, dst) passes through, in order.
std::vector<std::string> switch_names(const Topology& t, int src, int dst) {
  std::vector<std::string> out;
  for (VertexId v : switches_on(t, route_of(t, src, dst))) out.push_back(t.vertices()[v].name);
  return out;
}

using Names = std::vector<std::string>;

TEST(Routing, DmodkIsTheFatTreeDefault) {
  EXPECT_EQ(make_spec(2, 8, IntraKind::kNvswitch, InterKind::kFatTree).inter.ecmp,
            EcmpMode::kDmodk);
}

TEST(Routing, DmodkPicksTheSpineByDestinationIndexOnTwoLevels) {
  // 2 nodes x 8 GPUs, one NIC per GPU (NIC index = rank), radix 8: leaves of 4 NIC ports with 4
  // uplinks, spine j on uplink j. leaf = NIC / 4; the spine is the destination NIC mod 4,
  // whatever the source.
  auto spec = make_spec(2, 8, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 8;
  auto t = build_topology(spec);
  EXPECT_EQ(switch_names(*t, 0, 8), (Names{"leaf0", "spine0", "leaf2"}));
  EXPECT_EQ(switch_names(*t, 3, 13), (Names{"leaf0", "spine1", "leaf3"}));
  EXPECT_EQ(switch_names(*t, 5, 15), (Names{"leaf1", "spine3", "leaf3"}));
  EXPECT_EQ(switch_names(*t, 1, 10), (Names{"leaf0", "spine2", "leaf2"}));
  EXPECT_EQ(switch_names(*t, 9, 6), (Names{"leaf2", "spine2", "leaf1"}));
  EXPECT_EQ(switch_names(*t, 0, 3), Names{});  // same node: NVSwitch only
  // Every destination has exactly one spine: its down path is dedicated.
  for (int d = 8; d < 16; ++d) {
    for (int s = 0; s < 8; ++s) {
      EXPECT_EQ(switch_names(*t, s, d)[1], "spine" + std::to_string(d % 4)) << s << "->" << d;
    }
  }
}

TEST(Routing, DmodkPicksAggregationThenCoreOnThreeLevels) {
  // 4 nodes x 4 GPUs, 4 NICs per node, radix 4: leaves of 2 NIC ports and 2 uplinks (leaf =
  // NIC / 2), 2 leaves per pod (pod = node), aggregation j of a pod on leaf uplink j, 2 cores per
  // aggregation index (core j * 2 + c on aggregation uplink c). d-mod-k: j = NIC mod 2, then
  // c = (NIC / 2) mod 2.
  auto spec = make_spec(4, 4, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 4;
  auto t = build_topology(spec);
  // NIC 13: j = 1, c = 6 mod 2 = 0 -> core2.
  EXPECT_EQ(switch_names(*t, 0, 13), (Names{"leaf0", "pod0.agg1", "core2", "pod3.agg1", "leaf6"}));
  // NIC 6: j = 0, c = 3 mod 2 = 1 -> core1.
  EXPECT_EQ(switch_names(*t, 0, 6), (Names{"leaf0", "pod0.agg0", "core1", "pod1.agg0", "leaf3"}));
  // NIC 11: j = 1, c = 5 mod 2 = 1 -> core3; the same from any source outside pod 2.
  EXPECT_EQ(switch_names(*t, 15, 11), (Names{"leaf7", "pod3.agg1", "core3", "pod2.agg1", "leaf5"}));
  EXPECT_EQ(switch_names(*t, 4, 11), (Names{"leaf2", "pod1.agg1", "core3", "pod2.agg1", "leaf5"}));
  EXPECT_EQ(switch_names(*t, 1, 2), Names{});  // same node: NVSwitch only
  // Inside a pod only the aggregation level is chosen: NIC 2 -> 2 mod 2 = 0, NIC 3 -> 1.
  auto spec2 = spec;
  spec2.nodes = 8;
  spec2.gpus_per_node = 2;
  spec2.inter.nics_per_node = 2;  // pods of 2 nodes: node 0 (NICs 0-1) and node 1 (NICs 2-3)
  auto t2 = build_topology(spec2);
  EXPECT_EQ(switch_names(*t2, 0, 2), (Names{"leaf0", "pod0.agg0", "leaf1"}));
  EXPECT_EQ(switch_names(*t2, 0, 3), (Names{"leaf0", "pod0.agg1", "leaf1"}));
}

TEST(Routing, DmodkRailUsesThePortWithinTheRailLeaf) {
  // 8 nodes x 2 GPUs on 2 rails, radix 8: rail leaves of 4 nodes with 4 uplinks (rail k, nodes
  // 4x..4x+3 on leaf "rail<k>.<x>"). d-mod-k numbers NICs leaf by leaf, port by port, so a
  // destination's spine is its port on its rail leaf (node mod 4), not its global NIC index
  // (which would put a rail leaf's 4 destinations on 2 spines).
  auto spec = make_spec(8, 2, IntraKind::kNvswitch, InterKind::kRailOptimized);
  spec.inter.switch_radix = 8;
  auto t = build_topology(spec);
  for (int dn = 0; dn < 8; ++dn) {
    for (int k = 0; k < 2; ++k) {
      const int d = dn * 2 + k;
      const int s = ((dn + 4) % 8) * 2 + (1 - k);  // another rail, another leaf
      const Names got = switch_names(*t, s, d);
      ASSERT_EQ(got.size(), 3u) << s << "->" << d;
      EXPECT_EQ(got[1], "spine" + std::to_string(dn % 4)) << s << "->" << d;
      EXPECT_EQ(got[2], "rail" + std::to_string(k) + "." + std::to_string(dn / 4));
    }
  }
}

TEST(Routing, DmodkLinearAllToAllLoadsEveryUplinkEqually) {
  // 2 nodes x 8 GPUs, radix 16: two leaves of 8 NIC ports with 8 uplinks to 8 spines. A linear
  // all-to-all has 64 flows from leaf 0 to leaf 1 and 64 back; d-mod-k gives each destination its
  // own spine, so every leaf -> spine and spine -> leaf link carries exactly 8 flows (the 8
  // sources of the other leaf to its one destination). The hash does not.
  auto spec = make_spec(2, 8, IntraKind::kNvswitch, InterKind::kFatTree);
  spec.inter.switch_radix = 16;
  auto count_fabric_flows = [](const Topology& t) {
    std::map<LinkId, int> per_link;
    for (int s = 0; s < t.num_gpus(); ++s) {
      for (int d = 0; d < t.num_gpus(); ++d) {
        if (s == d) continue;
        for (LinkId l : route_of(t, s, d)) {
          const auto& link = t.links()[l];
          if (t.vertices()[link.src].kind == VertexKind::kSwitch &&
              t.vertices()[link.dst].kind == VertexKind::kSwitch) {
            ++per_link[l];
          }
        }
      }
    }
    return per_link;
  };
  auto t = build_topology(spec);
  ASSERT_EQ(count_kind(*t, VertexKind::kSwitch), 10);  // 2 leaves + 8 spines
  const auto dmodk = count_fabric_flows(*t);
  EXPECT_EQ(dmodk.size(), 32u);  // 2 leaves x 8 spines x 2 directions, all used
  for (const auto& [l, n] : dmodk) EXPECT_EQ(n, 8) << t->vertices()[t->links()[l].src].name;

  spec.inter.ecmp = EcmpMode::kHash;
  auto th = build_topology(spec);
  int hash_max = 0, hash_total = 0;
  for (const auto& [l, n] : count_fabric_flows(*th)) {
    hash_max = std::max(hash_max, n);
    hash_total += n;
  }
  EXPECT_EQ(hash_total, 2 * 2 * 64);  // each of the 128 flows crosses two fabric links
  EXPECT_GT(hash_max, 8);             // collisions: some uplink carries more than its share
}

}  // namespace
}  // namespace moesim::topology
