// The "plan-routed" MoE data path (docs/design.md §4.2) for layers whose dispatch is a routed
// all_to_allv (Decision::variable_dispatch: routing strategies, dropless capacity, inference
// placement). The plan builder moves the WORKLOAD MODEL's per-pair token counts, so the host data
// path takes the routing DECISION from the plan (the bytes moved are exactly the plan's matrix,
// and measured times stay comparable with the simulation of the same plan, which `exec
// --predict` relies on) and computes everything else for real: the gate GEMM + softmax give each
// chosen expert its probability, tokens are packed, moved by the plan's all_to_allv (shared
// lowering, per chunk), the experts' FFNs run on what arrived with the right expert's weights,
// outputs are moved back by the plan's combine all_to_allv and summed per token.
//
// The rule that turns the plan's counts into (token, choice) -> expert / destination
// (assign_routed, core/routed_assignment.hpp) is one function used by the executor and by the
// check's reference (reference_layer_routed), from the plan's ExpertRouting (core/plan.hpp) for
// this rank's row. Entries the plan left without a token are dropped (the plan's matrix holds
// only the kept tokens, so the check's drop count is S * k - row total on both sides). Send
// buffers are packed by destination, receive buffers by source (all_to_allv's layout); the
// combine moves the expert outputs back in the transposed layout.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/plan.hpp"
#include "core/routed_assignment.hpp"
#include "exec/communicator.hpp"
#include "exec/layer_program.hpp"
#include "exec/moe_data.hpp"

namespace moesim::topology {
class Topology;
}
namespace moesim::exec {

class HostLayerBuffers;

/// A run of received rows: `rows` consecutive rows from `src` for expert `expert`.
struct RoutedRun {
  int src = 0;
  int expert = 0;
  int rows = 0;
  bool operator==(const RoutedRun&) const = default;
};
/// What position `dst` receives, per chunk, in receive order (by source, then list order).
std::vector<std::vector<RoutedRun>> routed_receives(const ExpertRouting& r, int dst, int chunks);

/// Reference output (S x M) of the rank at group position `src` for a plan-routed layer: the
/// assignment of assign_routed, the seeded gate's softmax probabilities and experts
/// (reference_layer_seeded_routed). `dropped`: the entries the plan left without a token.
std::vector<float> reference_layer_routed(const MoeShape& s, const std::vector<float>& tokens,
                                          std::uint64_t seed, int layer, const ExpertRouting& r,
                                          int src, long long* dropped);

/// One plan-routed MoE layer on this rank: what the plan's routing assigns (the buffers and the
/// program are the layer program's, exec/layer_program.hpp).
struct RoutedLayer {
  int block = -1, moe = 0;
  std::shared_ptr<const ExpertRouting> routing;
  const CollectiveSpec* dispatch = nullptr;  // chunk 0's dispatch
  int group_index = 0;                       // this rank's EP group in its grouping
  int pos = 0, group_size = 0, chunks = 0;
  RoutedAssignment sent;
  std::vector<std::vector<RoutedRun>> received;  // per chunk
  std::vector<int> experts;  // experts this rank computes (ascending): its own, or with replicas
                             // the ones it receives
  long long dropped() const { return sent.dropped; }
};

/// True when `plan` routes MoE layer `block`'s dispatch as an all_to_allv.
bool is_routed_layer(const Plan& plan, int block);

/// The routed layer of `block` on `rank`: the ExpertRouting of its dispatch, this rank's
/// assignment and receives, checked against every chunk's matrix (InternalError on a
/// disagreement), and the experts it receives (fill_routed_layer loads their weights). Throws
/// InputError when the plan
/// has no ExpertRouting for the dispatch (the data path cannot know which expert a token is for).
std::unique_ptr<RoutedLayer> prepare_routed_layer(const Plan& plan, int block, int moe, int rank,
                                                  const MoeShape& s);

/// The layer program's record of a routed layer (LayerRouting::kPlan): its slices are
/// `experts`, chunk j sends the rows of sent.send[j] (destination-major, list order) and receives
/// the runs of received[j].
LayerLayout routed_layout(const RoutedLayer& L, const MoeShape& s);
/// What every plan-routed layout shares (routed_layout, deepep_layout): the layer, its routing
/// kind, the EP group and position, `slices` expert slices of the full hidden width.
LayerLayout routed_layout_base(const RoutedLayer& L, LayerRouting routing, int slices,
                               const MoeShape& s);
/// The routed layer's tables and weights in its buffers (allocated for routed_layout): entry t*k+c
/// gets pseudo-expert 0 and, as its slot, its row in the send buffer (-1: dropped), kRoutedExpert
/// its real expert; kSlotEntry the inverse; kW1 / kW2 the weights of `experts`.
void fill_routed_layer(const RoutedLayer& L, const MoeShape& s, std::uint64_t seed,
                       HostLayerBuffers& buffers);

}  // namespace moesim::exec
