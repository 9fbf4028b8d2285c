// Fabric cuts: the capacity each part of the fabric has towards the rest, tier by tier. The
// analytical collective costs (strategies/collectives) read them to charge a collective the
// bottleneck of an oversubscribed fabric, which per-pair alpha/beta cannot see: every pair's
// route has full bandwidth on its own, but the uplinks of a leaf carry all of its nodes' traffic
// that leaves it.
//
// For tier t >= 1, the classes of tier t are the connected parts of the topology when only links
// of tier < t are kept (tier 1: a node with its NICs; tier 2: a leaf, dragonfly router or rail
// group with its nodes; tier 3: a pod or dragonfly group). Every byte from a GPU of class c to a
// GPU outside c crosses a link of tier >= t that leaves c, so
//     time >= max over tiers t, classes c of  max(bytes leaving c / egress_c,
//                                                 bytes entering c / ingress_c)
// is a lower bound of any routing (it is the max-min fluid model's answer when the cut is the
// only bottleneck and routing spreads perfectly). Classes nest: a class of tier t+1 is a union
// of classes of tier t, and whole nodes always stay in one class.
//
// What it does not see: imbalance inside a cut (d-mod-k or hash collisions on single uplinks,
// one global link per dragonfly group pair), which only the flow engine models; and on
// rail-optimised fabrics the spine that carries cross-rail traffic (every node joins every rail
// leaf, so tier-2 classes span the cluster and give no cut).
#pragma once

#include <vector>

#include "topology/topology.hpp"

namespace moesim::topology {

struct CutTier {
  int tier = 0;                 // links of this tier and above leave a class
  int classes = 0;              // number of classes holding GPUs
  std::vector<int> gpu_class;   // per GPU: its class in [0, classes)
  std::vector<double> egress;   // per class: bytes/s of the links leaving it
  std::vector<double> ingress;  // per class: bytes/s of the links entering it
  std::vector<int> gpus;        // per class: GPUs in it
};

struct FabricCuts {
  /// Tiers whose classes split the GPUs into >= 2 parts, finest (lowest tier) first; a tier whose
  /// partition equals the one below it is dropped.
  std::vector<CutTier> tiers;
  /// Per GPU: bytes/s of the first link of its route to a GPU of another node (0 on one node).
  /// The network models charge each message's endpoint overhead as overhead x this many bytes
  /// on its route (sim/flow_model.hpp), so those bytes cross the cuts too.
  std::vector<double> injection;
};

/// O(vertices + links) per tier; call once per topology (the collective library caches it).
FabricCuts compute_fabric_cuts(const Topology& topo);

/// Accumulates a set of GPU-to-GPU messages over the cuts of one topology and returns the cut
/// bound. Messages inside one class of a tier do not count there. Each crossing message carries
/// its bytes plus overhead_s x injection[src] bytes (the per-message endpoint cost as the network
/// models charge it).
class CutMeter {
 public:
  explicit CutMeter(const FabricCuts& cuts);
  void add(int src_gpu, int dst_gpu, double bytes);
  /// max over tiers, classes and directions of (bytes + overhead_s x overhead bytes) / capacity;
  /// 0 when nothing crossed.
  double seconds(double overhead_s) const;
  /// The same bound as lines t(overhead_s) = per_byte + overhead_s x per_overhead, one per class
  /// and direction that something crossed (callers scale bytes themselves).
  struct Line {
    double per_byte = 0;      // seconds: crossing bytes / capacity
    double per_overhead = 0;  // seconds per second of overhead: sum of injection / capacity
  };
  std::vector<Line> lines() const;
  void clear();

 private:
  const FabricCuts& cuts_;
  std::vector<std::vector<double>> out_, in_;          // per tier, per class: bytes
  std::vector<std::vector<double>> out_inj_, in_inj_;  // per tier, per class: sum of injection
};

}  // namespace moesim::topology
