// Tree all_reduce: one binary tree over the group positions in heap order (parent of p is
// (p-1)/2, so position 0 is the root and depth is floor(log2(p+1))), not pipelined: the whole
// buffer is reduced level by level up to the root (each level: children send S to their parent,
// which adds them), then broadcast level by level down. 2*depth transfer phases of one message
// per edge: fewer latency terms than the ring (2*log2 W vs 2(W-1)) but every byte crosses each
// level, so it wins for small buffers on large groups. NCCL's pipelined double binary tree is not
// modelled (ours: the simple, exactly-specified variant).
#include <bit>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

int depth_of(int p) { return std::bit_width(static_cast<unsigned>(p + 1)) - 1; }

class TreeAllReduce final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllReduce; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kTree; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    return group_size(call) > 0 ? "" : "empty group";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const std::vector<int>& g = *call.group;
    const int w = group_size(call);
    const double size = call.spec->bytes.value();
    if (w < 2 || size <= 0) return {};
    const int depth = depth_of(w - 1);
    std::vector<Phase> phases;
    // Up: deepest level first. Positions of level d are [2^d - 1, 2^(d+1) - 1).
    for (int d = depth; d >= 1; --d) {
      Phase& up = phases.emplace_back();
      up.kind = Phase::Kind::kTransfers;
      up.label = "tree_reduce";
      up.src = up.dst = Buffer::kRecv;
      const int first = (1 << d) - 1, last = std::min(w, (1 << (d + 1)) - 1);
      int max_children = 0;
      for (int p = first; p < last; ++p) {
        up.transfers.push_back({g[p], g[(p - 1) / 2], size});
        if (call.with_layout) up.chunks.push_back({0.0, 0.0});
        // p is a right child (even) when its sibling p-1 also sends to the same parent.
        max_children = std::max(max_children, (p % 2 == 0) ? 2 : 1);
      }
      Phase& add = phases.emplace_back();
      add.kind = Phase::Kind::kReduce;
      add.label = "tree_reduce_sum";
      add.src = add.dst = Buffer::kRecv;
      add.local_bytes = Bytes(3 * size * max_children);
    }
    for (int d = 1; d <= depth; ++d) {
      Phase& down = phases.emplace_back();
      down.kind = Phase::Kind::kTransfers;
      down.label = "tree_bcast";
      down.src = down.dst = Buffer::kRecv;
      const int first = (1 << d) - 1, last = std::min(w, (1 << (d + 1)) - 1);
      for (int p = first; p < last; ++p) {
        down.transfers.push_back({g[(p - 1) / 2], g[p], size});
        if (call.with_layout) down.chunks.push_back({0.0, 0.0});
      }
    }
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (group_size(call) < 2 || call.spec->bytes.value() <= 0) return Seconds(0);
    return scaled_time(*this, call, ctx, kTagTreeAllReduce, 0);
  }
};

}  // namespace

const Algorithm& tree_all_reduce() {
  static const TreeAllReduce algo;
  return algo;
}

}  // namespace moesim::collectives::detail
