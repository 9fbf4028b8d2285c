// The topology a calibrated scenario is simulated on: the datasheet graph of build_topology with
// each tier's link bandwidths scaled so that an uncontended GPU pair of that tier moves data at
// the measured point-to-point rate (1 / beta of the calibration file's `point_to_point` entry).
//
// Why links and not a per-pair beta: the flow and simgrid models share link capacities between
// concurrent transfers, so a measured rate has to become capacities. Scaling every link of a class
// by one factor keeps the topology's relative shape (which links are the bottleneck, how much an
// oversubscribed leaf or a shared NIC slows a pair down under load): the calibration moves the
// whole tier, contention is still the model's.
//
// The rule (docs/calibration.md, "Calibrated link bandwidths"):
//  - Link classes: a link's class is its tier, except that a tier-0 link touching a NIC (GPU-NIC,
//    PCIe switch-NIC) is class 1: it only carries inter-node traffic, so it belongs with the NIC.
//  - Class t with a measured tier t: the representative pair is the one `moesim calibrate`
//    measured, rank 0 and the first rank r with pair_cost(0, r).tier == t. Its class-t links are
//    scaled by f_t = (1 / beta_t) / (smallest datasheet bandwidth among its class-t links), so the
//    route's bottleneck becomes exactly 1 / beta_t, provided the lower-class links on the route
//    (already scaled) are not slower; if they are, the pair keeps their rate (the file then says
//    that a wider tier is faster than a narrower one, which a graph cannot honour) and
//    calibrated_tier_factors reports it.
//  - Classes >= 2 without a measurement take the factor of the nearest lower measured class >= 1
//    (a 2-node calibration measures only NIC-leaf paths; a what-if on more nodes then slows the
//    spines by the same ratio instead of leaving them at datasheet speed). Class 0 or 1 without a
//    measurement keeps factor 1.
//  - NIC sharing: the per-GPU NIC share (nic_share_bandwidth, which pair_cost uses for inter-node
//    pairs) scales with the class-1 factor. The measured pair ran alone, so it is the NIC link's
//    bandwidth that becomes 1 / beta_1; with several GPUs per NIC the analytical pair_cost still
//    divides it among them (all GPUs of a NIC send at once in a collective), and the flow model
//    gives a lone pair the whole link.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/calibration.hpp"
#include "topology/topology.hpp"

namespace moesim::topology {

/// The scale factor per link class (index = class), and what could not be honoured.
struct TierFactors {
  std::vector<double> factor;  // per class, 1 where nothing applies
  std::vector<bool> measured;  // per class: the file had this tier and the topology a pair of it
  /// One line per measured tier whose representative pair is capped by a slower lower class
  /// ("tier 1: pair 0<->2 gets 20 GB/s (its class-0 links), not 1/beta = 25 GB/s").
  std::vector<std::string> notes;
};

/// The link class of directed link `l` (see the rule above).
int link_class(const Topology& topo, LinkId l);

/// Factors for `topo` under `cal`'s point_to_point entries.
TierFactors calibrated_tier_factors(const Topology& topo, const Calibration& cal);

/// `base` with its link bandwidths (and NIC shares, and the spec's intra.bandwidth /
/// inter.nic_bandwidth) scaled by calibrated_tier_factors; routes are base's. Returns base itself
/// when the calibration has no point_to_point entry. Pair costs are recomputed by walking routes
/// (the base builder's cached path summaries hold datasheet bandwidths).
std::unique_ptr<Topology> calibrated_topology(std::unique_ptr<Topology> base,
                                              const Calibration& cal);

}  // namespace moesim::topology
