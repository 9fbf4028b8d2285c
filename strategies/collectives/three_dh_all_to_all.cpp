// 3DH (three-level hierarchical) all-to-all: 2DH's exchange along grid dimensions with the
// inter-node level split in two, so that each level stays under one switch tier. A node-aligned
// group of g leaf groups x l nodes x m ranks, position p = (x * l + a) * m + j (x: the leaf group,
// a: the node inside it, j: the local index), where the nodes of one leaf group reach each other
// through one leaf (or rail) switch (tier 1) and nodes of different groups only through the spines
// (tier >= 2). Three exchanges, each preceded by the stride copy T(dim, W / dim) that gathers its
// blocks (as in two_dh_all_to_all.cpp):
//   1. intra: the node's m ranks (NVLink), blocks of W / m chunks;
//   2. leaf:  the l ranks of the same local index in the leaf group (one leaf hop), W / l chunks;
//   3. inter: the g ranks of the same local index and node index in the other leaf groups (the
//      spines), W / g chunks.
// After the third exchange kRecv is in standard order (slot = source position): each level's
// copy moves the destination digit it exchanges to the front, and each exchange replaces it with
// the source's digit of that level, so the digits end as (x_src, a_src, j_src).
// Each rank sends (m - 1) + (l - 1) + (g - 1) messages instead of 2DH's (m - 1) + (l g - 1), at
// the price of a third full-buffer copy and the leaf level's bytes: it wins when the per-message
// cost dominates (small S / W at thousands of GPUs).
#include <fmt/format.h>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

// The leaf groups of a node-aligned group: l consecutive nodes (in group order) per group.
struct LeafGrid {
  NodeGrid grid;
  int l = 0;  // nodes per leaf group
  int g = 0;  // leaf groups
};
struct LeafGridInfo {
  std::optional<LeafGrid> leaf;
  std::string why;
};

std::shared_ptr<const LeafGridInfo> leaf_grid_info(const std::vector<int>& group,
                                                   const topology::Topology& topo) {
  return cached<LeafGridInfo>(topo, kTagLeafGrid, 0, group, [&] {
    LeafGridInfo info;
    const auto node = grid_info(group, topo);
    if (!node->grid) {
      info.why = node->why;
      return info;
    }
    const int m = node->grid->m, n = node->grid->n;
    // Whether nodes a and b (group order) sit under one leaf: their first ranks one leaf hop
    // apart (tier 1; rail fabrics: the same rail switch, as every level-2 peer shares j).
    const auto same_leaf = [&](int a, int b) {
      return topo.tier(group[static_cast<size_t>(a * m)], group[static_cast<size_t>(b * m)]) <= 1;
    };
    int l = 1;
    while (l < n && same_leaf(0, l)) ++l;
    if (l == n) {
      info.why = fmt::format("its {} nodes share one leaf switch (use 2dh)", n);
      return info;
    }
    if (l == 1) {
      info.why = "its first two nodes are under different leaf switches (no leaf level)";
      return info;
    }
    if (n % l != 0) {
      info.why = fmt::format("its {} nodes do not split into leaf groups of {}", n, l);
      return info;
    }
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b)
        if (same_leaf(a, b) != (a / l == b / l)) {
          info.why = fmt::format(
              "nodes {} and {} of the group break the leaf groups of {} consecutive nodes", a, b,
              l);
          return info;
        }
    info.leaf = LeafGrid{*node->grid, l, n / l};
    return info;
  });
}

class ThreeDhAllToAll final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAll; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::k3dh; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology& topo) const override {
    const auto info = leaf_grid_info(*call.group, topo);
    return info->leaf ? ""
                      : "3dh all_to_all needs a node-aligned group spanning several leaf "
                        "switches with several nodes under each: " +
                            info->why;
  }

  std::vector<Phase> lower(const CollectiveCall& call,
                           const topology::Topology& topo) const override {
    const auto info = leaf_grid_info(*call.group, topo);
    if (!info->leaf)
      throw InputError(fmt::format("collective: {}", inapplicable_reason(call, topo)));
    const std::vector<int>& grp = *call.group;
    const int m = info->leaf->grid.m, l = info->leaf->l, g = info->leaf->g;
    const int w = m * l * g;
    const double size = call.spec->bytes.value();
    if (size <= 0) return {};
    static constexpr std::string_view kCopyLabel[3] = {"stride_copy_1", "stride_copy_2",
                                                       "stride_copy_3"};
    static constexpr std::string_view kLevelLabel[3] = {"intra", "leaf", "inter"};
    const int dims[3] = {m, l, g}, strides[3] = {1, m, m * l};
    std::vector<Phase> phases;
    for (int level = 0; level < 3; ++level) {
      if (dims[level] == 1) continue;  // one rank per node: the intra level has nothing to do
      Phase copy;
      copy.kind = Phase::Kind::kCopy;
      copy.label = kCopyLabel[level];
      copy.src = phases.empty() ? Buffer::kSend : Buffer::kRecv;
      copy.dst = Buffer::kScratch;
      Phase x;
      x.kind = Phase::Kind::kTransfers;
      x.label = kLevelLabel[level];
      x.src = Buffer::kScratch;
      x.dst = Buffer::kRecv;
      fill_level_exchange(copy, x, grp, dims[level], strides[level], size / w, call.with_layout);
      phases.push_back(std::move(copy));
      phases.push_back(std::move(x));
    }
    return phases;
  }

  // The lowering scales with S: its cost lines (cut bounds included) are computed once per group
  // from one lowering and evaluated in O(lines) (scaled_time).
  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagThreeDhA2a, 0);
  }
};

}  // namespace

const Algorithm& three_dh_all_to_all() {
  static const ThreeDhAllToAll algo;
  return algo;
}

}  // namespace moesim::collectives::detail
