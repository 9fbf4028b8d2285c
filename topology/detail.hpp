// Internal to moesim_topology: the Boost.Graph store, graph construction helpers, path summaries
// and the ECMP hash shared by the builders (structured.cpp, custom.cpp) and topology.cpp.
#pragma once

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "topology/topology.hpp"

namespace moesim::topology::detail {

/// The graph store: one Boost vertex per Vertex (same ids), one edge per directed Link carrying
/// its LinkId. Bidirectional so that BFS can run backwards from a destination.
using Graph =
    boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, boost::no_property,
                          boost::property<boost::edge_index_t, LinkId>>;

Graph make_graph(std::size_t num_vertices, const std::vector<Link>& links);

inline LinkId link_id(const Graph& g, Graph::edge_descriptor e) {
  return boost::get(boost::edge_index, g, e);
}

/// Appends vertices and full-duplex cables (directed links 2c: a->b and 2c+1: b->a).
class GraphBuilder {
 public:
  GraphBuilder(std::vector<Vertex>& vertices, std::vector<Link>& links)
      : vertices_(vertices), links_(links) {}
  VertexId add_vertex(VertexKind kind, int node, int index, int level, std::string name);
  /// Returns the id of the a->b link; b->a is that id + 1.
  LinkId add_cable(VertexId a, VertexId b, BytesPerSecond bandwidth, Seconds latency, int tier);

 private:
  std::vector<Vertex>& vertices_;
  std::vector<Link>& links_;
};

/// alpha/beta summary of a path: what pair_cost reports, accumulated link by link.
struct PathSummary {
  double alpha_s = 0;
  double bandwidth = std::numeric_limits<double>::infinity();
  int hops = 0;
  int tier = 0;

  void add(const Link& l) {
    alpha_s += l.latency.value();
    bandwidth = std::min(bandwidth, l.bandwidth.value());
    ++hops;
    tier = std::max(tier, l.tier);
  }
  void add(const PathSummary& o) {
    alpha_s += o.alpha_s;
    bandwidth = std::min(bandwidth, o.bandwidth);
    hops += o.hops;
    tier = std::max(tier, o.tier);
  }
  bool operator==(const PathSummary&) const = default;
};

/// Deterministic ECMP choice among n equal-cost candidates for the pair (src, dst) at step `hop`.
/// A splitmix64 finaliser, so neighbouring pairs and hops spread evenly over the candidates.
inline std::uint32_t ecmp_pick(int src, int dst, int hop, std::uint32_t n) {
  if (n <= 1) return 0;
  std::uint64_t x = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(src)) << 32) |
                    static_cast<std::uint32_t>(dst);
  x ^= static_cast<std::uint64_t>(hop + 1) * 0x9E3779B97F4A7C15ULL;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  // Lemire's multiply-shift range reduction: unbiased enough and much cheaper than a modulo.
  return static_cast<std::uint32_t>(((x & 0xFFFFFFFFULL) * n) >> 32);
}

/// Accumulates PairCosts into per-tier rows.
class TierAccumulator {
 public:
  void add(const PairCost& c, std::int64_t count = 1) {
    if (count <= 0) return;
    if (static_cast<std::size_t>(c.tier) >= rows_.size()) rows_.resize(c.tier + 1);
    TierRow& r = rows_[c.tier];
    if (r.pairs == 0) {
      r.tier = c.tier;
      r.min_hops = r.max_hops = c.hops;
      r.min_alpha = r.max_alpha = c.alpha;
      r.min_bandwidth = r.max_bandwidth = c.bandwidth;
    } else {
      r.min_hops = std::min(r.min_hops, c.hops);
      r.max_hops = std::max(r.max_hops, c.hops);
      r.min_alpha = std::min(r.min_alpha, c.alpha);
      r.max_alpha = std::max(r.max_alpha, c.alpha);
      r.min_bandwidth = std::min(r.min_bandwidth, c.bandwidth);
      r.max_bandwidth = std::max(r.max_bandwidth, c.bandwidth);
    }
    r.pairs += count;
  }
  std::vector<TierRow> rows() const {
    std::vector<TierRow> out;
    for (const auto& r : rows_) {
      if (r.pairs > 0) out.push_back(r);
    }
    return out;
  }

 private:
  std::vector<TierRow> rows_;
};

/// Builders (structured.cpp: every built-in intra x inter kind; custom.cpp: cluster.custom).
/// The spec's GPU is already resolved and its defaults applied.
std::unique_ptr<Topology> build_structured(const ClusterSpec& spec);
std::unique_ptr<Topology> build_custom(const ClusterSpec& spec);

}  // namespace moesim::topology::detail
