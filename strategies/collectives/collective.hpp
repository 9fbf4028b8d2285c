// Collective algorithm definitions shared by the simulator and the real backend (DESIGN §7: one
// algorithm per file in this folder, registered in one table). An algorithm turns one collective
// on one group into an ordered list of phases: local copies (2DH stride copies, Parm's dump),
// transfers between group members, and local reductions. The simulator hands each phase's
// transfers to a network model; exec/ posts the same transfers as grouped NCCL or MPI
// send/recv with the same chunk layout. What is simulated is what runs.
//
// Every algorithm also states its analytical alpha-beta cost for the `analytical` network model,
// derived from the topology's per-pair alpha/beta (or overridden by calibration).
//
// ---------------------------------------------------------------------------------------------
// Buffer layout (what ChunkRef / LocalCopy offsets mean). Every rank has three byte buffers:
// kSend (the collective's input), kRecv (its output) and kScratch (algorithm temporary: S for
// 2dh all_to_all; for 2dh all_to_allv the largest of stride_copy_1's and stride_copy_2's
// local_bytes / 2, since a rank may hold more after the intra phase than it sends or receives).
// Offsets are bytes from the start of the named buffer; they may be fractional when a size is not a
// multiple of the group size (the simulator only needs bytes; exec/ works in elements and rounds).
// Positions below are group positions (index into the group).
//
//  all_to_all (S = spec.bytes per rank, W ranks, c = S/W): kSend holds W chunks, chunk d for
//    position d at d*c; kRecv slot s (offset s*c) receives the chunk from position s.
//    linear: one kTransfers phase kSend -> kRecv; the self chunk is a LocalCopy in that phase.
//    2dh (W = n nodes x m local, position p = a*m + j, a = node block, j = local index):
//      1. kCopy   stride_copy_1  kSend    -> kScratch  T(h=m, w=n)  (chunk d = b*m+k -> k*n+b)
//      2. kTrans  intra          kScratch -> kRecv     (a,j) sends slots [k*n, k*n+n) to (a,k),
//                                                       landing at its slots [j*n, j*n+n);
//                                                       own block [j*n, j*n+n) is a LocalCopy
//      3. kCopy   stride_copy_2  kRecv    -> kScratch  T(h=n, w=m)
//      4. kTrans  inter          kScratch -> kRecv     (a,k) sends slots [b*m, b*m+m) to (b,k),
//                                                       landing at its slots [a*m, a*m+m);
//                                                       own block [a*m, a*m+m) is a LocalCopy
//      After 4, kRecv is in standard order (slot = source position). See stride_copy_index().
//  all_to_allv (matrix M, bytes M[s][d]): kSend packed by destination (offset of d = sum of
//    M[p][d'] for d' < d), kRecv packed by source (offset of s = sum of M[s'][p] for s' < s);
//    zero entries send nothing. 2dh uses the same four phases with the blocks packed in the
//    permuted order (offsets are prefix sums of the permuted block sizes).
//  all_reduce / reduce_scatter / all_gather (ring family): the work is in place in kRecv (exec
//    first copies kSend there for all_reduce / reduce_scatter; all_gather has an explicit
//    self-copy phase). Chunk k (size c) of a ring of R ranks is at base + k*c (base 0, except
//    the inter-node rings of hierarchical all_reduce: base j*S/m on local index j). A repeated
//    ring phase lists the transfers of its step 0; at step t chunk index k becomes
//    (k - t) mod R, on sender and receiver alike (the chunk keeps its index when it moves).
//  send_recv: kSend [0, S) of position p goes to kRecv [0, S) of position p + peer_offset.
//  tree all_reduce: whole buffers (offset 0) in kRecv.
// ---------------------------------------------------------------------------------------------
//
// Analytical cost (one closed form, shared by every algorithm; see phase_shape() in
// common.cpp for the code). For a kTransfers phase, rank r's send side costs
//
//   T_send(r) = net.message_latency_s + N_r * net.message_overhead_s
//             + max over peer classes K in {same node, other node} of
//                 ( max_{d in K} alpha(r,d)  +  sum_{d in K} bytes(r,d) / bw(r,d) )
//
// (alpha, bw from Topology::pair_cost; bw already divided by NIC sharing). N_r is the number of
// messages r sends (per-message cost: many small messages are slower than few large ones). The
// sum inside a class is the injection limit: a rank's messages to the same class share its
// NVLink port (same node) or its NIC share (other nodes); the two classes use different links and
// overlap. The receive side T_recv(r) is the same over incoming messages. The phase takes
// max over r of max(T_send, T_recv), times `repeat`. For 2 GPUs on one link this is exactly
// alpha + bytes/bw (+ latency + overhead of one message). Self copies in a transfers phase run
// concurrently with the network (max of both). kCopy / kReduce phases take local_bytes /
// local_copy_bandwidth. The collective is the sum of its phases (no overlap between phases, no
// contention with other traffic). Fast paths evaluate only representative ranks and cache
// per-(topology, group) summaries, so a 1,024-GPU all-to-all evaluates in microseconds: uniform
// all-to-all takes the send side of up to 8 evenly spaced ranks (every rank for W <= 16; the
// receive side equals it on symmetric topologies), all_to_allv prices each rank's per-class
// bytes with the class's mean 1/bw; ring, tree, hierarchical and send_recv cache the exact
// per-rank lines of one lowering (their transfers are O(W)). All are tested equal to
// phases_time(lower()) on homogeneous topologies.
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

/// Which per-rank buffer an offset refers to (see the layout at the top of this file).
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

/// Total time of a lowered phase list under the analytical formula above, evaluated over every
/// transfer (O(transfers) pair_cost calls). The reference the fast analytical_time paths are
/// tested against; also usable for custom phase lists.
Seconds phases_time(const std::vector<Phase>& phases, const CostContext& ctx);

}  // namespace moesim::collectives
