// The host data path of n-sharded experts (model.experts_per_gpu = -n; Tutel §3.2,
// docs/strategy-specs.md §4): P1 (ρ = 1), P2 (ρ = n) and every intermediate ρ | n, on real seeded
// data, moving exactly the buffers the plan's ops describe (strategies/plan_builder.cpp,
// docs/model.md):
//
//  - EP position p = x·n + s holds the 1/n hidden slice s of expert x (make_w1_slice /
//    make_w2_slice(x, s, n)); hidden slice q of ρ is held by the gather group of g = n/ρ
//    consecutive shard positions [q·g, q·g + g) (grouping shard_gather{g}).
//  - param_allgather (g > 1, stream param): the g slices of the group are all-gathered through the
//    communicator into slice q of ρ (P1: the whole expert).
//  - gate, encode: as the unsharded path; encode writes ρ copies of the padded (E, C, M) buffer,
//    one per hidden slice (the plan's (1 + ρ)·E·C·M bytes).
//  - dispatch.c_j: all_to_all over the EP group of ρ·E·c_j·M elements per rank: destination
//    p = x·n + q·g + i receives slots [i·c_j/g, (i+1)·c_j/g) of the chunk's copy q of expert x, so
//    each of the g members of a slice group computes on a different 1/g of the tokens and every
//    slice sees every token (Tutel's flexible layout: (W·c_j/g, M) rows per GPU, the plan's
//    T_j = (W/n)·c_j·ρ).
//  - expert.fc1.c_j / fc2.c_j: relu(x W1_q) W2_q on those rows: partial outputs over slice q.
//  - combine.c_j: the all_to_all back; source copy q of expert x gets its slots back.
//  - partial_sum (ρ > 1): the ρ partial outputs summed, then decode as usual.
// Since ReLU acts per hidden unit, the sum over slices of relu(x W1_q) W2_q is the unsharded
// expert's output, so every ρ must give the output of reference_layer_seeded (up to fp32
// rounding: the summation order differs).
//
// Needs H divisible by n and every chunk capacity c_j divisible by g (each source sends the same
// number of whole tokens to every member, which is what the plan's equal-size all_to_all
// assumes); begin() says why otherwise, and the executor then refuses --check or runs the layer's
// ops with scratch buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario.hpp"
#include "exec/communicator.hpp"
#include "exec/grad_check.hpp"
#include "exec/host_layer.hpp"
#include "exec/moe_data.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::exec {

/// One sharded MoE layer of a plan as rank `rank` runs it.
struct ShardedLayerPlan {
  int moe = 0;     // MoE layer number
  int block = -1;  // the plan's block (roles' block)
  bool on_rank =
      true;        // this rank's pipeline stage runs the layer (otherwise nothing below is set)
  int shards = 1;  // n
  int rho = 1;     // ρ: token repeat factor = number of hidden slices (plan's parallel degree)
  int ep = 1;      // W, EP group size
  int ep_pos = 0;  // this rank's EP position
  std::vector<int> caps, offset;                        // chunk capacities c_j and their first slot
  int capacity = 0;                                     // C = sum of c_j
  int gather() const { return shards / rho; }           // g = n / ρ
  int expert_id() const { return ep_pos / shards; }     // x
  int shard_pos() const { return ep_pos % shards; }     // s
  int slice() const { return shard_pos() / gather(); }  // q, hidden slice of ρ
  int member() const { return shard_pos() % gather(); }  // i, position in the gather group
};

/// Reads the sharded MoE layers of `plan` for `rank` (ρ from the fc1 GEMM's hidden width H/ρ,
/// c_j from its exact FLOPs 2·(W/n)·c_j·ρ·M·H/ρ, W and the position from the dispatch grouping).
/// Returns "" or why the sharded data path cannot run this plan.
/// `bytes_per_element` is the scenario's: the plan counts bytes of its dtype, the data path moves
/// fp32, so element counts are compared.
std::string plan_sharded_layers(const Plan& plan, int rank, const MoeShape& shape, int shards,
                                int bytes_per_element, std::vector<ShardedLayerPlan>* out);

class ShardedPath {
 public:
  ShardedPath(const Scenario& sc, const topology::Topology& topo, Communicator& comm,
              const MoeShape& shape);
  ~ShardedPath();
  ShardedPath(const ShardedPath&) = delete;
  ShardedPath& operator=(const ShardedPath&) = delete;

  /// Prepares the layers of `plan` for one run (iteration `iteration`'s tokens). Returns "" when
  /// the data path runs them; otherwise the reason, and run_op() then handles nothing.
  std::string begin(const Plan& plan, int iteration);
  /// Runs `op` when it is a forward MoE op of the data path (true); false: the caller runs it
  /// (scratch buffers). collective_algo[op.id] receives the algorithm of the collectives run.
  bool run_op(const Plan& plan, const Op& op, std::vector<std::int64_t>& collective_algo);

  /// After a run: per MoE layer, this rank's output (S x M), its dropped choices, the layer plan.
  std::vector<std::vector<float>> outputs() const;
  std::vector<long long> dropped() const;
  const std::vector<ShardedLayerPlan>& layers() const;
  bool active() const;
  /// The prepared layers for another backend (the GPU path), empty when inactive.
  std::vector<ProgramLayerRef> program_layers();
  /// Layer li's buffers (its gate's logits, outputs), or null off this rank's stage / inactive.
  const HostLayerBuffers* buffers(int li) const;
  /// Layer li's gradients after a run whose backward the program ran (this rank's 1/n shard of
  /// its expert), or nothing.
  std::optional<LayerGradients> gradients(int li) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim::exec
