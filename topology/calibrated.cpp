#include "topology/calibrated.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace moesim::topology {
namespace {

// Routes are the base topology's (the link ids are the same: links are copied in order); only
// capacities change. compute_pair_cost / compute_tier_table stay Topology's defaults, which walk
// route() over the scaled links_.
class CalibratedTopology final : public Topology {
 public:
  CalibratedTopology(std::unique_ptr<Topology> base, const TierFactors& tf)
      : Topology(base->spec()), base_(std::move(base)) {
    auto factor = [&](int cls) {
      return cls < static_cast<int>(tf.factor.size()) ? tf.factor[cls] : 1.0;
    };
    vertices_ = base_->vertices();
    links_ = base_->links();
    for (LinkId l = 0; l < links_.size(); ++l)
      links_[l].bandwidth =
          BytesPerSecond(links_[l].bandwidth.value() * factor(link_class(*base_, l)));
    const int p = base_->num_gpus();
    gpu_vertex_.reserve(p);
    nic_share_bandwidth_.reserve(p);
    for (int g = 0; g < p; ++g) {
      gpu_vertex_.push_back(base_->gpu_vertex(g));
      nic_share_bandwidth_.push_back(
          BytesPerSecond(base_->nic_share_bandwidth(g).value() * factor(1)));
    }
    gpus_per_nic_ = base_->gpus_per_nic();
    // Reports (`topo`, JSON) that print the spec's bandwidths show the calibrated ones.
    spec_.intra.bandwidth = BytesPerSecond(spec_.intra.bandwidth.value() * factor(0));
    spec_.inter.nic_bandwidth = BytesPerSecond(spec_.inter.nic_bandwidth.value() * factor(1));
  }

  void route(int src, int dst, std::vector<LinkId>& out) const override {
    base_->route(src, dst, out);
  }

 private:
  std::unique_ptr<Topology> base_;
};

}  // namespace

int link_class(const Topology& topo, LinkId l) {
  const Link& link = topo.links()[l];
  if (link.tier != 0) return link.tier;
  const auto& v = topo.vertices();
  const bool nic = v[link.src].kind == VertexKind::kNic || v[link.dst].kind == VertexKind::kNic;
  return nic ? 1 : 0;
}

TierFactors calibrated_tier_factors(const Topology& topo, const Calibration& cal) {
  int classes = 1;
  for (LinkId l = 0; l < topo.links().size(); ++l)
    classes = std::max(classes, link_class(topo, l) + 1);
  for (const TierCalibration& t : cal.point_to_point) classes = std::max(classes, t.tier + 1);
  TierFactors tf;
  tf.factor.assign(classes, 1.0);
  tf.measured.assign(classes, false);
  std::vector<LinkId> path;
  for (int t = 0; t < classes; ++t) {
    // Unmeasured fabric classes follow the nearest lower measured fabric class (set before the
    // measurement so a measured tier above sees its lower classes' final factors).
    if (t >= 2) tf.factor[t] = tf.factor[t - 1];
    const TierCalibration* tc = cal.tier(t);
    if (tc == nullptr || tc->fit.beta <= 0) continue;
    // The pair `moesim calibrate` measured: rank 0 and its first peer of this tier.
    int peer = -1;
    for (int r = 1; r < topo.num_gpus() && peer < 0; ++r)
      if (topo.tier(0, r) == t) peer = r;
    if (peer < 0) continue;  // no pair of this tier here: nothing to match
    path.clear();
    topo.route(0, peer, path);
    double own = std::numeric_limits<double>::infinity();
    double lower = std::numeric_limits<double>::infinity();
    for (LinkId l : path) {
      const int c = link_class(topo, l);
      const double bw = topo.links()[l].bandwidth.value();
      if (c == t) {
        own = std::min(own, bw);
      } else if (c < t) {
        lower = std::min(lower, bw * tf.factor[c]);
      }
    }
    if (own == std::numeric_limits<double>::infinity()) continue;  // no link of this class
    const double target = 1.0 / tc->fit.beta;
    tf.factor[t] = target / own;
    tf.measured[t] = true;
    if (lower < target)
      tf.notes.push_back(fmt::format(
          "tier {}: pair 0<->{} gets {:.4g} GB/s (its lower-tier links), not 1/beta = {:.4g} GB/s",
          t, peer, lower / 1e9, target / 1e9));
  }
  return tf;
}

std::unique_ptr<Topology> calibrated_topology(std::unique_ptr<Topology> base,
                                              const Calibration& cal) {
  if (cal.point_to_point.empty()) return base;
  const TierFactors tf = calibrated_tier_factors(*base, cal);
  return std::make_unique<CalibratedTopology>(std::move(base), tf);
}

}  // namespace moesim::topology
