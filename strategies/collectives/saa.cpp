// SAA, Parm's simultaneous all-to-all and all-gather (docs/strategy-specs.md §5), as an all_to_all
// algorithm.
//
// The group has W positions p = q * m + t (spec.sub_group = m): t is the index in the
// all-gather (the MP group: the block q of m consecutive positions). The all-to-all (Parm's
// EP&ESP all-to-all) runs over A peers: the W / m positions of the same t (a = q is the
// all-to-all index; the MP ranks have GPUs of their own), or, with spec.saa_a2a_spans_group, over
// all A = W positions (a = p; the overlapped layout, where the MP ranks are the EP x ESP GPUs).
// spec.bytes = S is what each rank sends in the all-to-all (c = S / A to each of the A peers,
// itself included); the output is the all-to-all result all-gathered over the MP group: m * S
// bytes per rank, slot t' * A + a' (offset (t' * A + a') * c of kRecv) holding the chunk that
// all-to-all index a' sent to the MP member t' in the all-to-all. With m = 1 it is a sliced
// linear all-to-all. `auto` never picks it (registry.cpp): it only runs where a plan asks for it.
//
// Steps (why they overlap): the all-to-all is cut into n slices (piece k of every chunk, c / n
// bytes). In step k (0 <= k <= n) every rank sends slice k to its A - 1 all-to-all peers (mostly
// inter-node) and, at the same time, forwards slice k - 1, which it finished receiving in step
// k - 1 (A pieces, its own included), to its m - 1 MP peers (intra-node). The two kinds of
// transfers use different links, so each step costs about the max of the two and the whole
// collective about max(all-to-all, all-gather) plus one step, instead of their sum.
//
// Real backend (two streams): in every kTransfers phase the first transfers (W * (A - 1) while
// all-to-all slices remain, in position order) are the all-to-all part and the rest the
// all-gather part; exec posts the first on `comm` and the rest on `comm2`, both as grouped
// send/recv, and joins them at the end of the step. Offsets follow the slot layout above: piece k
// of the chunk for peer a' is at kSend a' * c + k * c / n and lands at kRecv (t * A + a) * c +
// k * c / n on the peer (t: the peer's MP index, a: the sender's all-to-all index); a forwarded
// slice is the A pieces at (t * A + a') * c + k * c / n for every a' (ChunkRef names the first;
// exec posts the A strided pieces as one grouped send).
#include <algorithm>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives::detail {
namespace {

constexpr int kTagSaa = 101;  // private cache tag (common.hpp's tags are < 100)

// Slices the all-to-all is cut into: A (one per peer, Parm's step count), at least 2 so there is
// something to overlap, at most 8 so per-message costs stay small.
int num_slices(int A) { return std::clamp(A, 2, 8); }

class SimultaneousAllToAll final : public Algorithm {
 public:
  CollectiveType type() const override { return CollectiveType::kAllToAll; }
  CollectiveAlgo algo() const override { return CollectiveAlgo::kSaa; }

  std::string inapplicable_reason(const CollectiveCall& call,
                                  const topology::Topology&) const override {
    const int w = group_size(call);
    const int m = call.spec->sub_group;
    if (w < 1) return "empty group";
    if (m < 1 || w % m != 0)
      return "saa needs sub_group m >= 1 dividing the group size (positions a * m + t), found m "
             "= " +
             std::to_string(m) + " for " + std::to_string(w) + " ranks";
    return "";
  }

  std::vector<Phase> lower(const CollectiveCall& call, const topology::Topology&) const override {
    const std::vector<int>& g = *call.group;
    const int w = group_size(call);
    const int m = call.spec->sub_group;
    const double size = call.spec->bytes.value();
    if (w < 1 || size <= 0 || m < 1 || w % m != 0) return {};
    const bool spans = call.spec->saa_a2a_spans_group;
    const int A = spans ? w : w / m;
    const int n = num_slices(A);
    const double c = size / A;  // chunk for one peer
    const double q = c / n;     // its piece in one slice
    // All-to-all index of position p and the position of all-to-all index a with MP index t.
    auto index = [=](int p) { return spans ? p : p / m; };
    auto member = [=](int a, int t) { return spans ? a : a * m + t; };
    std::vector<Phase> phases;
    // The own chunk never leaves the GPU: one local copy into slot t * A + a.
    Phase& self = phases.emplace_back();
    self.kind = Phase::Kind::kCopy;
    self.label = "saa_self";
    self.src = Buffer::kSend;
    self.dst = Buffer::kRecv;
    self.local_bytes = Bytes(2 * c);
    if (call.with_layout)
      for (int p = 0; p < w; ++p) {
        const int a = index(p), t = p % m;
        self.copies.push_back({g[p], a * c, (t * A + a) * c, c});
      }
    for (int k = 0; k <= n; ++k) {
      Phase& ph = phases.emplace_back();
      ph.kind = Phase::Kind::kTransfers;
      ph.label = "saa_step";
      ph.saa_step = true;
      ph.src = Buffer::kSend;  // all-to-all part; the all-gather part reads kRecv (see top)
      ph.dst = Buffer::kRecv;
      if (k < n)  // slice k of the all-to-all: piece k of every chunk, to every other peer
        for (int p = 0; p < w; ++p) {
          const int a = index(p), t = p % m;
          for (int i = 1; i < A; ++i) {
            const int to = (a + i) % A, dst = member(to, t);
            ph.transfers.push_back({g[p], g[dst], q});
            if (call.with_layout)
              ph.chunks.push_back({to * c + k * q, ((dst % m) * A + a) * c + k * q});
          }
        }
      if (k >= 1)  // forward slice k - 1 (A pieces of q, own piece included) to the MP peers
        for (int p = 0; p < w; ++p) {
          const int block = p / m, t = p % m;
          for (int u = 1; u < m; ++u) {
            const double off = t * A * c + (k - 1) * q;
            ph.transfers.push_back({g[p], g[block * m + (t + u) % m], A * q});
            if (call.with_layout) ph.chunks.push_back({off, off});
          }
        }
    }
    return phases;
  }

  Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const override {
    if (!inapplicable_reason(call, *ctx.topo).empty() || call.spec->bytes.value() <= 0)
      return Seconds(0);
    // The cache key tells the two all-to-all spans apart (same group, same m).
    const int m = call.spec->sub_group;
    return scaled_time(*this, call, ctx, kTagSaa, call.spec->saa_a2a_spans_group ? -m : m);
  }
};

}  // namespace

const Algorithm& saa_all_to_all() {
  static const SimultaneousAllToAll algo;
  return algo;
}

}  // namespace moesim::collectives::detail
