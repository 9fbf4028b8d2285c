// Collective algorithms shared by the simulator and the real backend (docs/design.md §7: one
// algorithm per file in this folder, registered in one table). An algorithm lowers one collective
// on one group into ordered phases (local copies, transfers between group members, local
// reductions) with their chunk layout; the simulator hands each phase's transfers to a network
// model and exec/ posts the same transfers as NCCL or MPI send/recv, so what is simulated is what
// runs. Every algorithm also states its closed-form alpha-beta time for the `analytical` model.
//
// Defines Phase, ChunkRef, LocalCopy, CollectiveCall, CostContext, the Algorithm interface and
// its registry. Buffer layout of every algorithm, the analytical cost formula and its fast paths:
// docs/collectives.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/plan.hpp"
#include "core/units.hpp"
#include "strategies/collectives/transfer.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::collectives {

/// Which per-rank buffer an offset refers to (layout per algorithm: docs/collectives.md).
enum class Buffer : std::uint8_t { kSend, kRecv, kScratch };

/// Where a transfer's bytes come from and go to, in units of the algorithm's chunk layout, so the
/// real backend can post the same send/recv (offsets in bytes into the phase's src buffer on the
/// sender and dst buffer on the receiver).
struct ChunkRef {
  double send_offset = 0;
  double recv_offset = 0;
};

/// A local copy on one rank (global rank), from the phase's src buffer to its dst buffer.
struct LocalCopy {
  std::int32_t rank = 0;
  double src_offset = 0;
  double dst_offset = 0;
  double bytes = 0;
};

/// One step of an algorithm. Copies and reductions are local to each rank (their bytes are per
/// rank: the engine charges them against HBM bandwidth); transfers go through the network.
struct Phase {
  enum class Kind { kTransfers, kCopy, kReduce };
  Kind kind = Kind::kTransfers;
  std::string_view label;  // "intra", "inter", "stride_copy_1", "ring_step"
  /// SAA (Parm S2): one of the n + 1 steps whose transfers are two sets (the all-to-all slice,
  /// then the all-gather part) that a data backend runs in order; what exec reads, not the label.
  bool saa_step = false;
  std::vector<Transfer> transfers;  // global ranks; kTransfers only
  std::vector<ChunkRef> chunks;     // parallel to transfers; may be empty in sim-only use
  /// HBM bytes read + written per rank (the largest over ranks when they differ): a copy of b
  /// bytes is 2b, reducing b incoming bytes into an accumulator is 3b. kCopy / kReduce: the
  /// phase's whole cost. kTransfers: the self copies of `copies`, which run concurrently with
  /// the transfers (an engine may overlap them or ignore them; the analytical model takes the
  /// max of both).
  Bytes local_bytes{0};
  /// Ring algorithms repeat an identical step (W-1 times); the engine may run `repeat` copies in
  /// sequence instead of storing W-1 phases.
  int repeat = 1;
  /// Buffers the phase reads from and writes to (transfers: sender's src, receiver's dst).
  Buffer src = Buffer::kSend;
  Buffer dst = Buffer::kRecv;
  /// kCopy stride permutations: every rank applies T(stride_h, stride_w) to stride_h*stride_w
  /// chunks of chunk_bytes (see stride_copy_index). 0 when the copy is not a stride copy.
  int stride_h = 0, stride_w = 0;
  double chunk_bytes = 0;
  /// Explicit per-rank copies (self chunks of all-to-all phases, all_gather's own chunk, the
  /// variable-size blocks of 2DH all_to_allv stride copies). Filled only with layout.
  std::vector<LocalCopy> copies;
};

/// Per-collective inputs: the op's spec and one group (global ranks in group order).
struct CollectiveCall {
  const CollectiveSpec* spec = nullptr;
  const std::vector<int>* group = nullptr;
  int group_index = 0;  // which group of the op's grouping (selects per_group matrices)
  /// Fill Phase::chunks and Phase::copies (needed by exec/). The simulator may turn this off:
  /// a 4,096-rank linear all-to-all then stores 16.8 M transfers without 16.8 M ChunkRefs.
  bool with_layout = true;
  const ByteMatrix* matrix() const;  // all_to_allv matrix for this group, or nullptr
};

/// Analytical-model parameters: what the cost formulas read. Derived from the topology (per-tier
/// alpha/beta) unless a calibration overrides them.
struct CostContext {
  const topology::Topology* topo = nullptr;
  NetworkParams net;
  /// HBM-bound copies and reductions (bytes read + written per second). 0 = use the topology's
  /// GPU hbm_bandwidth; if that is 0 too, local work is free.
  BytesPerSecond local_copy_bandwidth{0};
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual CollectiveType type() const = 0;
  virtual CollectiveAlgo algo() const = 0;
  /// False when the algorithm cannot run this call (2DH and hierarchical across groups that are
  /// not node-aligned, ...). `auto` skips those.
  virtual bool applicable(const CollectiveCall& call, const topology::Topology& topo) const {
    return inapplicable_reason(call, topo).empty();
  }
  /// Why the algorithm cannot run this call ("" when it can); used in InputError messages.
  virtual std::string inapplicable_reason(const CollectiveCall& call,
                                          const topology::Topology& topo) const = 0;
  /// The phases, in order. Deterministic.
  virtual std::vector<Phase> lower(const CollectiveCall& call,
                                   const topology::Topology& topo) const = 0;
  /// Closed-form alpha-beta time of the whole collective (no contention with other traffic).
  virtual Seconds analytical_time(const CollectiveCall& call, const CostContext& ctx) const = 0;
};

/// The registry: every (type, algo) pair defined in this folder.
const Algorithm* find_algorithm(CollectiveType type, CollectiveAlgo algo);
std::vector<const Algorithm*> algorithms_for(CollectiveType type);
/// Resolves kAuto by predicted analytical time among applicable algorithms; otherwise returns the
/// named one, throwing InputError if it is unknown or not applicable.
const Algorithm& select_algorithm(const CollectiveCall& call, const CostContext& ctx);

/// nccl-tests bus-bandwidth factor for a collective of W ranks: algbw * factor = busbw.
/// all_reduce 2(W-1)/W; all_gather, reduce_scatter, all_to_all(v) (W-1)/W; send_recv 1.
double busbw_factor(CollectiveType type, int group_size);

/// The 2DH stride copy T(h, w) on h*w equal chunks: input slice i = a*h + j (j < h, a < w) goes
/// to output slot j*w + a. Phase 1 of 2DH uses (h = m, w = n), phase 3 (h = n, w = m). The
/// inverse of T(h, w) is T(w, h).
constexpr int stride_copy_index(int i, int h, int w) { return (i % h) * w + i / h; }

/// Total time of a lowered phase list under the analytical formula (docs/collectives.md), over
/// every transfer (O(transfers) pair_cost calls). The reference the fast analytical_time paths are
/// tested against; also usable for custom phase lists.
Seconds phases_time(const std::vector<Phase>& phases, const CostContext& ctx);

}  // namespace moesim::collectives
