// Issue-level properties of single collectives on a built topology, run through the whole engine
// (lowering by the shared algorithm definitions, then the flow network model).
#include <gtest/gtest.h>

#include "core/plan.hpp"
#include "sim/engine.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/nic_catalog.hpp"
#include "topology/topology.hpp"

namespace moesim {
namespace {

// 8 nodes x 8 A100 on NVSwitch, 8 x 200 Gb/s NICs per node, non-blocking fat tree: 64 GPUs.
ClusterSpec fat_tree_64() {
  ClusterSpec c;
  c.gpu.name = "a100-sxm-80gb";
  c.nodes = 8;
  c.gpus_per_node = 8;
  c.intra.kind = IntraKind::kNvswitch;
  c.intra.bandwidth = BytesPerSecond(300e9);
  c.intra.latency = Seconds(1e-6);
  c.inter.kind = InterKind::kFatTree;
  c.inter.nic_bandwidth = BytesPerSecond(25e9);
  c.inter.nics_per_node = 8;
  c.inter.latency = Seconds(2e-6);
  c.inter.switch_radix = 16;  // forces two levels at 64 NICs
  return c;
}

double all_to_all_time(const topology::Topology& topo, Bytes size, const sim::EngineConfig& cfg) {
  Plan plan(topo.num_gpus());
  StreamId comm = plan.stream("comm");
  Grouping world{"world", {{}}};
  for (int r = 0; r < topo.num_gpus(); ++r) world.groups[0].push_back(r);
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.algo = CollectiveAlgo::kLinear;
  spec.grouping = plan.add_grouping(std::move(world));
  spec.bytes = size;
  plan.add_collective(comm, spec, {}, "a2a");
  RunResult r = sim::run_plan(plan, topo, cfg);
  return r.collectives.at(0).duration_s();
}

// The per-message endpoint cost at work: a linear all-to-all of 1 MiB per GPU (16 KiB messages)
// gets a much lower bus bandwidth than one of 256 MiB (4 MiB messages), as NCCL does.
TEST(CollectiveBusBw, SmallMessagesGetMuchLowerBusBandwidthOnA64GpuFatTree) {
  auto topo = topology::build_topology(fat_tree_64());
  sim::EngineConfig cfg;
  cfg.network = sim::NetworkKind::kFlow;
  cfg.net.message_overhead_s = 1e-6;  // the scenario default (engine.message_overhead)
  const double factor = collectives::busbw_factor(CollectiveType::kAllToAll, 64);
  ASSERT_DOUBLE_EQ(factor, 63.0 / 64.0);
  const Bytes small(1 << 20), large(256.0 * (1 << 20));
  double busbw_small = small.value() / all_to_all_time(*topo, small, cfg) * factor;
  double busbw_large = large.value() / all_to_all_time(*topo, large, cfg) * factor;
  // Large messages are bounded by the NICs: 7/8 of the data leaves the node at 25 GB/s per GPU,
  // so busbw <= 25e9 * 8/7 * 63/64 = 28.1 GB/s. Hash ECMP collisions on the leaf-spine links
  // (several flows of one leaf hashed onto the same spine) keep it visibly below that bound.
  EXPECT_LE(busbw_large, 25e9 * 8.0 / 7.0 * factor * 1.0001);
  EXPECT_GE(busbw_large, 0.6 * 25e9 * 8.0 / 7.0 * factor);
  EXPECT_LT(busbw_small, 0.5 * busbw_large) << busbw_small / 1e9 << " vs " << busbw_large / 1e9;

  // Without the per-message cost the gap shrinks to what latency alone explains.
  sim::EngineConfig no_overhead = cfg;
  no_overhead.net.message_overhead_s = 0;
  double busbw_small_free = small.value() / all_to_all_time(*topo, small, no_overhead) * factor;
  EXPECT_GT(busbw_small_free, busbw_small);
}

// Small messages priced as measured: with each NIC model's default per-peer state (its queue-pair
// cache, topology::nic_peer_state) a linear all-to-all's time per peer, at the same bytes per
// peer, stays flat while the peers fit the cache and grows once they do not (PipeMoE Fig. 6(b):
// alpha 45x for 4x the GPUs).
TEST(CollectiveBusBw, AllToAllTimePerPeerGrowsWithThePeerCountOnEveryNicModel) {
  for (const std::string& name : topology::nic_names()) {
    std::vector<double> per_peer;
    for (int nodes : {2, 4, 16}) {
      ClusterSpec c = fat_tree_64();
      c.nodes = nodes;
      c.inter.nic = name;
      c.inter.switch_radix = 64;
      const topology::PeerState peers = topology::nic_peer_state(c);
      ASSERT_GT(peers.peer_cache, 0) << name;
      ASSERT_GT(peers.peer_miss_overhead.value(), 0) << name;
      auto topo = topology::build_topology(c);
      sim::EngineConfig cfg;
      cfg.network = sim::NetworkKind::kFlow;
      cfg.net.message_overhead_s = 1e-6;
      cfg.net.peer_cache = peers.peer_cache;
      cfg.net.peer_miss_overhead_s = peers.peer_miss_overhead.value();
      const int n = topo->num_gpus();
      per_peer.push_back(all_to_all_time(*topo, Bytes(4096.0 * n), cfg) / (n - 1));
    }
    // 15 and 31 peers fit the cache (60 per NIC, one GPU per NIC); 127 do not.
    EXPECT_GE(per_peer[1], per_peer[0] * 0.999) << name;
    EXPECT_GT(per_peer[2], per_peer[1] * 1.5)
        << name << ": " << per_peer[2] * 1e6 << " vs " << per_peer[1] * 1e6 << " us per peer";
  }
}

// Time is monotone in size on every engine.
TEST(CollectiveBusBw, TimeIsMonotoneInSizeOnAnalyticalAndFlow) {
  auto topo = topology::build_topology(fat_tree_64());
  for (auto kind : {sim::NetworkKind::kAnalytical, sim::NetworkKind::kFlow}) {
    sim::EngineConfig cfg;
    cfg.network = kind;
    double prev = 0;
    for (double mib : {0.25, 1.0, 4.0, 16.0, 64.0}) {
      double t = all_to_all_time(*topo, Bytes(mib * (1 << 20)), cfg);
      EXPECT_GT(t, prev) << sim::network_kind_name(kind) << " at " << mib << " MiB";
      prev = t;
    }
  }
}

}  // namespace
}  // namespace moesim
