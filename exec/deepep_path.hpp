// The data path of an `a2a: deepep` MoE layer (DeepEP's normal dispatch; docs/strategies.md
// "deepep") on the real backend: the plan-routed assignment (core/routed_assignment.hpp, as the
// routed path uses it) moved as DeepEP moves it. A token crosses to every other node holding
// one of its experts once, to the GPU on its own rail there; that forwarder sends it on once
// to every GPU of its node holding one of its experts (and keeps it if it holds one itself); the
// expert GPU computes each of the token's experts it holds on that one row and sums their
// outputs with the gate's weights; the outputs come back the same way, summed on the forwarder
// (one row per token and node) and on the token's GPU.
//
// The bytes moved are the plan's: the collective is the shared deepep lowering with layout (its
// two sets as two phases, exec does not pipeline them), whose per-node and per-GPU token counts
// the plan builder computed from this same assignment for plans it builds for the real backend
// (assignment_dedup), and prepare_deepep_layer checks every block against them. The expert GPU
// recomputes the gate's probabilities from the rows it received (DeepEP sends them alongside;
// recomputing them keeps the bytes exactly the plan's, for one fp32 gate GEMM of the received
// rows). One pipeline chunk (the plan builder refuses others for the real backend). The GPU path
// runs the same program on its kernels (gather_rows, sum_rows: one thread per element of a
// summed row, terms in table order, so no atomics and the CPU twin's sums).
//
// Row orders (every rank derives every table from the plan alone):
//  kSend (source s = (a, j)):  per node b != a ascending, s's tokens with an expert on b, in
//                              token order (kSendIdx: the token);
//  kFwdIn (forwarder (b, j)):  per source node a != b ascending, that source's rows for b;
//  kFwdOut (forwarder):        per target (b, k), k ascending, per source node a ascending
//                              (a = b: its own tokens), the tokens with an expert on (b, k);
//  kTokIn (target (b, k)):     per forwarder (b, j), j ascending, that forwarder's block for k;
//  kIn (entries):              per expert of the target ascending, its (row, choice) entries
//                              in row order.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/plan.hpp"
#include "exec/layer_program.hpp"
#include "exec/moe_data.hpp"
#include "exec/routed_path.hpp"

namespace moesim::exec {

class HostLayerBuffers;

/// One deepep layer's tables on one rank (the routing and assignment are its RoutedLayer's).
struct DeepepLayer {
  LayerLayout::DeepepRows rows;
  std::vector<int> send_idx, fwd_own_idx, fwd_in_idx;     // per kSend / kFwdOut row
  std::vector<int> tok_expert;                            // per kTokIn row, k slots (-1: none)
  std::vector<int> entry_row;                             // per kIn row
  std::vector<int> entry_weight;                          // per kIn row: its kTokWeight element
  std::vector<int> tok_sum, own_sum, node_sum, back_sum;  // CSR row sums (LayerBuf::k*Sum)
  std::vector<int> experts;                               // the experts it owns (slices)
  std::vector<std::pair<int, int>> runs;                  // (entries, slice) per expert
};

/// True when routed layer `R`'s dispatch runs the deepep algorithm.
bool is_deepep_layer(const RoutedLayer& R);

/// The tables of routed layer `R` (prepare_routed_layer) for its deepep dispatch: every block of
/// them checked against the plan's per-node and per-GPU token counts (InternalError on a
/// disagreement), InputError when the dispatch has more than one chunk or no token counts.
std::unique_ptr<DeepepLayer> prepare_deepep_layer(const RoutedLayer& R, const MoeShape& s);

/// The layer program's record of it (LayerRouting::kDeepep).
LayerLayout deepep_layout(const RoutedLayer& R, const DeepepLayer& D, const MoeShape& s);

/// Its tables and its experts' weights into buffers allocated for deepep_layout (`backward`: the
/// layout's backward tables too, LayerLayout::backward).
void fill_deepep_layer(const RoutedLayer& R, const DeepepLayer& D, const MoeShape& s,
                       std::uint64_t seed, HostLayerBuffers& buffers, bool backward);

}  // namespace moesim::exec
