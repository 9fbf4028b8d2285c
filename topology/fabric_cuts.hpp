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
};

/// O(vertices + links) per tier; call once per topology (the collective library caches it).
FabricCuts compute_fabric_cuts(const Topology& topo);

/// Accumulates the bytes of a set of GPU-to-GPU transfers over the cuts of one topology and
/// returns the cut bound in seconds. Transfers inside one class of a tier do not count there.
class CutMeter {
 public:
  explicit CutMeter(const FabricCuts& cuts);
  void add(int src_gpu, int dst_gpu, double bytes);
  /// max over tiers and classes of max(out / egress, in / ingress); 0 when nothing crossed.
  double seconds() const;
  void clear();

 private:
  const FabricCuts& cuts_;
  std::vector<std::vector<double>> out_, in_;  // per tier, per class
};

}  // namespace moesim::topology
