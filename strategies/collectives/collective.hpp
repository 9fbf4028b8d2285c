// Collective algorithm definitions shared by the simulator and the real backend (DESIGN §7: one
// algorithm per file in this folder, registered in one table). An algorithm turns one collective
// on one group into an ordered list of phases: local copies (2DH stride copies, Parm's dump),
// transfers between group members, and local reductions. The simulator hands each phase's
// transfers to a network model; exec/ posts the same transfers as grouped NCCL or MPI
// send/recv with the same chunk layout. What is simulated is what runs.
//
// Every algorithm also states its analytical alpha-beta cost for the `analytical` network model,
// derived from the topology's per-pair alpha/beta (or overridden by calibration).
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "core/plan.hpp"
#include "core/units.hpp"
#include "sim/network_model.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::collectives {

/// Where a transfer's bytes come from and go to, in units of the algorithm's chunk layout, so the
/// real backend can post the same send/recv (offsets in bytes into the rank's send / receive
/// staging buffers).
struct ChunkRef {
  double send_offset = 0;
  double recv_offset = 0;
};

/// One step of an algorithm. Copies and reductions are local to each rank (their bytes are per
/// rank: the engine charges them against HBM bandwidth); transfers go through the network.
struct Phase {
  enum class Kind { kTransfers, kCopy, kReduce };
  Kind kind = Kind::kTransfers;
  std::string_view label;                   // "intra", "inter", "stride_copy_1", "ring_step"
  std::vector<sim::Transfer> transfers;     // global ranks; kTransfers only
  std::vector<ChunkRef> chunks;             // parallel to transfers; may be empty in sim-only use
  Bytes local_bytes{0};                     // kCopy / kReduce: bytes read+written per rank
  /// Ring algorithms repeat an identical step (W-1 times); the engine may run `repeat` copies in
  /// sequence instead of storing W-1 phases.
  int repeat = 1;
};

/// Per-collective inputs: the op's spec and one group (global ranks in group order).
struct CollectiveCall {
  const CollectiveSpec* spec = nullptr;
  const std::vector<int>* group = nullptr;
  int group_index = 0;  // which group of the op's grouping (selects per_group matrices)
  const ByteMatrix* matrix() const;  // all_to_allv matrix for this group, or nullptr
};

/// Analytical-model parameters: what the cost formulas read. Derived from the topology (per-tier
/// alpha/beta) unless a calibration overrides them.
struct CostContext {
  const topology::Topology* topo = nullptr;
  sim::NetworkParams net;
  BytesPerSecond local_copy_bandwidth{0};  // HBM-bound copies and reductions
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual CollectiveType type() const = 0;
  virtual CollectiveAlgo algo() const = 0;
  /// False when the algorithm cannot run this call (2DH across groups that are not node-aligned,
  /// tree for non-power-of-two, ...). `auto` skips those.
  virtual bool applicable(const CollectiveCall& call, const topology::Topology& topo) const = 0;
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
/// all_reduce 2(W-1)/W; all_gather, reduce_scatter, all_to_all (W-1)/W; send_recv 1.
double busbw_factor(CollectiveType type, int group_size);

}  // namespace moesim::collectives
