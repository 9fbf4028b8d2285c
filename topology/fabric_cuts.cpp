#include "topology/fabric_cuts.hpp"

#include <algorithm>
#include <numeric>

namespace moesim::topology {
namespace {

struct DisjointSets {
  std::vector<VertexId> parent;
  explicit DisjointSets(size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  VertexId find(VertexId v) {
    while (parent[v] != v) v = parent[v] = parent[parent[v]];  // path halving
    return v;
  }
  void join(VertexId a, VertexId b) {
    a = find(a), b = find(b);
    if (a != b) parent[std::max(a, b)] = std::min(a, b);
  }
};

}  // namespace

FabricCuts compute_fabric_cuts(const Topology& topo) {
  FabricCuts cuts;
  const auto& links = topo.links();
  const size_t nv = topo.vertices().size();
  const int p = topo.num_gpus();
  int max_tier = 0;
  for (const Link& l : links) max_tier = std::max(max_tier, l.tier);
  int previous_classes = 1;  // tier 0 (everything joined) would be one class
  std::vector<int> class_of_root(nv);
  for (int t = max_tier; t >= 1; --t) {
    // Coarsest first, so that "same partition as the tier below" can be checked on the way down:
    // computed top-down, then reversed. A tier's partition equals the next finer one's exactly
    // when their class counts match (partitions nest).
    DisjointSets sets(nv);
    for (const Link& l : links)
      if (l.tier < t) sets.join(l.src, l.dst);
    CutTier ct;
    ct.tier = t;
    ct.gpu_class.resize(static_cast<size_t>(p));
    std::fill(class_of_root.begin(), class_of_root.end(), -1);
    for (int g = 0; g < p; ++g) {
      const VertexId root = sets.find(topo.gpu_vertex(g));
      if (class_of_root[root] < 0) class_of_root[root] = ct.classes++;
      ct.gpu_class[g] = class_of_root[root];
    }
    if (ct.classes < 2) continue;
    ct.egress.assign(static_cast<size_t>(ct.classes), 0.0);
    ct.ingress.assign(static_cast<size_t>(ct.classes), 0.0);
    ct.gpus.assign(static_cast<size_t>(ct.classes), 0);
    for (int g = 0; g < p; ++g) ++ct.gpus[ct.gpu_class[g]];
    for (const Link& l : links) {
      const VertexId a = sets.find(l.src), b = sets.find(l.dst);
      if (a == b) continue;
      // Switch-only parts (a spine, a core group) hold no GPU and are not classes.
      if (class_of_root[a] >= 0) ct.egress[class_of_root[a]] += l.bandwidth.value();
      if (class_of_root[b] >= 0) ct.ingress[class_of_root[b]] += l.bandwidth.value();
    }
    if (ct.classes == previous_classes && !cuts.tiers.empty()) {
      // Same partition as the coarser tier just kept: the links leaving a class are the same
      // set, so keep the finer-tier record only (its tier number names where the cut starts).
      cuts.tiers.back() = std::move(ct);
      continue;
    }
    previous_classes = ct.classes;
    cuts.tiers.push_back(std::move(ct));
  }
  std::reverse(cuts.tiers.begin(), cuts.tiers.end());
  cuts.injection.assign(static_cast<size_t>(p), 0.0);
  const int m = topo.gpus_per_node();
  if (topo.num_nodes() > 1) {
    std::vector<LinkId> route;
    for (int g = 0; g < p; ++g) {
      route.clear();
      topo.route(g, (g + m) % p, route);  // the same local index on the next node
      if (!route.empty()) cuts.injection[g] = links[route.front()].bandwidth.value();
    }
  }
  return cuts;
}

CutMeter::CutMeter(const FabricCuts& cuts) : cuts_(cuts) {
  for (const CutTier& t : cuts.tiers) {
    out_.emplace_back(static_cast<size_t>(t.classes), 0.0);
    in_.emplace_back(static_cast<size_t>(t.classes), 0.0);
  }
  out_inj_ = out_;
  in_inj_ = in_;
}

void CutMeter::add(int src_gpu, int dst_gpu, double bytes) {
  const double inj = cuts_.injection.empty() ? 0.0 : cuts_.injection[src_gpu];
  for (size_t i = 0; i < cuts_.tiers.size(); ++i) {
    const CutTier& t = cuts_.tiers[i];
    const int a = t.gpu_class[src_gpu], b = t.gpu_class[dst_gpu];
    if (a == b) return;  // classes nest: inside one class here, inside one at every coarser tier
    out_[i][a] += bytes;
    in_[i][b] += bytes;
    out_inj_[i][a] += inj;
    in_inj_[i][b] += inj;
  }
}

std::vector<CutMeter::Line> CutMeter::lines() const {
  std::vector<Line> out;
  for (size_t i = 0; i < cuts_.tiers.size(); ++i) {
    const CutTier& t = cuts_.tiers[i];
    for (int c = 0; c < t.classes; ++c) {
      // A class without links out cannot send at all; routing refuses such pairs earlier.
      if ((out_[i][c] > 0 || out_inj_[i][c] > 0) && t.egress[c] > 0)
        out.push_back({out_[i][c] / t.egress[c], out_inj_[i][c] / t.egress[c]});
      if ((in_[i][c] > 0 || in_inj_[i][c] > 0) && t.ingress[c] > 0)
        out.push_back({in_[i][c] / t.ingress[c], in_inj_[i][c] / t.ingress[c]});
    }
  }
  // Keep the upper envelope only: drop lines dominated in both terms by another.
  std::sort(out.begin(), out.end(), [](const Line& x, const Line& y) {
    return x.per_byte != y.per_byte ? x.per_byte > y.per_byte : x.per_overhead > y.per_overhead;
  });
  std::vector<Line> kept;
  double best_overhead = -1;
  for (const Line& l : out) {
    if (l.per_overhead > best_overhead) {
      kept.push_back(l);
      best_overhead = l.per_overhead;
    }
  }
  return kept;
}

double CutMeter::seconds(double overhead_s) const {
  double worst = 0;
  for (const Line& l : lines()) worst = std::max(worst, l.per_byte + overhead_s * l.per_overhead);
  return worst;
}

void CutMeter::clear() {
  for (auto* vv : {&out_, &in_, &out_inj_, &in_inj_})
    for (auto& v : *vv) std::fill(v.begin(), v.end(), 0.0);
}

}  // namespace moesim::topology
