// The host data path of MoE layers with expert-sharding parallelism (ESP) and Megatron tensor
// parallelism (MP): the plan builder's own ESP path (Parm's "baseline", DeepSpeed-MoE) and Parm's
// fused S1 / S2 schedules (strategies/schedules/parm.cpp, docs/strategy-specs.md §5,
// docs/schedules.md), on real seeded data with the CPU kernels, every collective moving the plan's
// element counts (fp32 on the host path) through the shared lowering or the communicator's group
// collectives.
//
// Rank (d, e, s, t) = ((d * ep + e) * esp + s) * mp + t (strategies::make_groups):
//  - MP: the mp ranks (d, e, s, *) hold the SAME S tokens (activations are replicated across an MP
//    group), generated with the key of the group's first rank (token_key_rank);
//  - ESP: expert x is split by hidden dim over the esp ranks of its ESP group: shard s holds
//    make_w1_slice / make_w2_slice(x, s, esp); each shard's partial output relu(x W1_s) W2_s sums
//    to the unsharded expert's output (ReLU acts per hidden unit).
// Schedules (labels "L{block}.fwd.{what}", docs/model.md):
//  baseline  esp_allgather of the tokens over ESP (the gate sees esp * S tokens, capacity esp *
//  dC),
//            dispatch all-to-all over EP, expert shard (duplicated over MP), esp_allreduce of the
//            partials, combine all-to-all, decode of the esp * S tokens, keep the own S rows.
//  S1        MP split before the gate (MP rank t gates rows [t S / mp, (t + 1) S / mp), capacity
//            dC / mp), local dump (esp copies of each EP destination's block), fused EP&ESP
//            all-to-all, expert shards, all-to-all back, local combine (sum of the esp partials),
//            decode of S / mp tokens, MP all-gather of the layer output.
//  S2        gate on all S tokens (capacity dC), MP split after the gate (MP rank t dispatches
//  slots
//            [t dC_j / mp, (t + 1) dC_j / mp) of every expert's chunk j), local dump, fused
//            all-to-all, expert shards, SAA (all-to-all back + MP all-gather in one collective),
//            local combine over every MP share's slots, decode of all S tokens.
// The capacity rule applies to the tokens one gate call sees (the "routing unit": esp * S tokens
// in the baseline, S / mp in S1, S in S2), as in DeepSpeed-MoE and Parm; the check's reference is
// the plain unsharded layer on that unit (reference_layer_seeded_rows), which is the plain layer
// on the rank's own tokens whenever nothing drops.
// Backward (training plans): the layer program's transposes on the same units. The baseline
// all-gathers the ESP group's dY (each rank decoded the whole unit), sums the esp shards' partial
// input gradients (esp_allreduce) and keeps its own rows of dX; S1 takes its MP share of dY and
// all-gathers dX over MP; S2's dispatch backward is SAA (every MP share's input gradients); the
// local dump / combine's backward duplicates / sums the esp partials; in the disjoint layout the
// MP copies' expert gradients are summed (expert_mp_allreduce). gradients() describes the units.
#pragma once

#include <cstdint>
#include <map>
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
#include "strategies/collectives/collective.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::exec {

/// Whether `plan`'s MoE layers run on the Parm data path: esp > 1 (the builder's ESP path) or a
/// fused Parm schedule (dispatch over the "ep_esp" grouping). Other plans use the plain path.
bool needs_parm_path(const Scenario& sc, const Plan& plan);

/// Whether `op` is a forward MoE op the Parm data path runs on real data (by its role: the plain
/// path's steps plus esp_allgather, esp_allreduce, combine_saa, parm.local_dump / local_combine /
/// join, parm.mp_allgather): on the host path these ops' measured times are real work.
bool is_parm_data_op(const Op& op);

enum class ParmSchedule { kBaseline, kS1, kS2 };
const char* parm_schedule_name(ParmSchedule s);

/// One step's MoE forward layers of a Parm-path plan on this rank (host buffers, fp32).
class ParmPath {
 public:
  /// Parses the plan's MoE layers; InputError when a layer cannot run on real data exactly (mp
  /// does not divide the tokens or a chunk's capacity, esp does not divide the hidden dim, a
  /// routed all_to_allv dispatch, sharded experts).
  ParmPath(const Scenario& sc, const topology::Topology& topo, Communicator& comm,
           const MoeShape& shape, const Plan& plan, int iteration);
  ~ParmPath();
  ParmPath(const ParmPath&) = delete;
  ParmPath& operator=(const ParmPath&) = delete;

  /// Runs `op` if it is a forward or backward MoE op of a parsed layer (true), else returns false
  /// (the executor runs it). `algo` receives the collective algorithm a collective op ran with.
  bool run_op(const Plan& plan, const Op& op, std::int64_t& algo);

  int num_layers() const;
  /// The parsed layers for another backend (the GPU path).
  std::vector<ProgramLayerRef> program_layers();
  int layer_number(int li) const;  // MoE layer number
  /// Whether this rank's pipeline stage runs layer li (output, dropped and reference only then).
  bool on_rank(int li) const;
  ParmSchedule schedule(int li) const;
  /// This rank's output (S x M) of layer li after run_op went over the whole plan.
  const std::vector<float>& output(int li) const;
  /// Choices dropped among the tokens this rank owns: rows [t S / mp, (t + 1) S / mp) of its MP
  /// group's S tokens, so every token of the step is counted on exactly one rank.
  long long dropped(int li) const;
  /// The reference of this rank's S output rows of layer li (plain unsharded layer on the
  /// schedule's routing unit) and, in `dropped`, the reference's drops among the owned tokens.
  /// tolerance > 0: decide on this rank's gate logits (GateLogits) and add the ones beyond the
  /// tolerance to *logits_wrong.
  std::vector<float> reference(int li, long long* dropped, double tolerance = 0,
                               long long* logits_wrong = nullptr) const;
  /// Layer li's gradients as the backward left them, with the routing units the reference
  /// differentiates (the baseline's gathered tokens, S1's MP shares, S2's share of the experts'
  /// slots); none where this rank ran no backward of it. `units` false: the buffers only (the
  /// units are the check's, generated from the seeds).
  std::optional<LayerGradients> gradients(int li, bool units = true) const;

 private:
  struct Layer;
  const std::vector<int>& my_group(const Grouping& g, int* index) const;
  std::map<int, std::vector<double>> parse_plan(const Plan& plan);
  void set_geometry(Layer& L, const std::vector<double>& sm);
  void build_layout(Layer& L) const;
  void load_inputs(Layer& L);

  const Scenario& sc_;
  const topology::Topology& topo_;
  collectives::CostContext cost_;  // the simulator's selection context (scenario_cost_context)
  Communicator& comm_;
  MoeShape shape_;
  int iteration_ = 0;
  int ep_ = 1, esp_ = 1, mp_ = 1;
  int e_ = 0, s_ = 0, t_ = 0;  // this rank's EP, ESP and MP index
  std::vector<std::unique_ptr<Layer>> layers_;
};

}  // namespace moesim::exec
