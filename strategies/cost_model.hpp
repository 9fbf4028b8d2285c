// Predictive cost model the adaptive strategies decide with (docs/strategy-specs.md §3-§4):
// alpha-beta lines of the expert-parallel all-to-all and of the expert GEMMs, derived from the
// topology and the GPU model without running anything.
//
//  - All-to-all: t_a2a(n) = alpha_a + beta_a * n, n = bytes each rank sends. Fitted through two
//    points of the collective library's closed form (collectives::select_algorithm(...)
//    .analytical_time, the same formula the `analytical` engine charges) for the EP group of rank
//    0, per algorithm (linear, 2dh). The closed form is affine in n for one algorithm up to the
//    switch between the intra- and inter-node class maxima, so a two-point fit over the range
//    of interest is exact or very close.
//  - GEMM: the roofline of core/gemm_model.hpp, the same function sim/compute_model charges:
//      t = launch_overhead + max(flops / (peak * eff(m, n, k)), bytes / hbm_bandwidth)
//      eff(m, n, k) = max_gemm_efficiency * u(m, tile_mn) * u(n, tile_mn) * u(k, tile_k)
//      u(d, T) = d / (d + T * exp(-d / T)),  bytes = (m*k + k*n + m*n) * batch * bytes/element.
//    The expert line t_e(x) = alpha_e + beta_e * x (x = tokens * M * H) is fitted through the
//    times of the expert's two GEMMs at two chunk sizes, so small chunks' lost tile efficiency
//    and weight re-reads land in alpha_e, as PipeMoE's profiled fit would.
// Calibration (`cluster.calibration`, core/calibration.hpp) replaces, where the file has them:
//  - the GEMM roofline's alpha, beta and efficiency table (through core/gemm_model, as the
//    simulator's compute model does);
//  - the all-to-all line: a measured (all_to_all, algo, |EP group|) entry gives
//    t_a2a(n) = alpha + beta * n exactly; otherwise the closed form above, with the per-message
//    latency the calibration implies (calibrated_message_latency, as the engines use).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/calibration.hpp"
#include "core/gemm_model.hpp"
#include "core/plan.hpp"
#include "core/scenario.hpp"
#include "core/units.hpp"
#include "strategies/collectives/collective.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::strategies {

/// t(x) = alpha_s + beta_s * x; x in the unit of the fit (bytes for all-to-all, M*H*tokens for
/// the expert).
struct AlphaBeta {
  double alpha_s = 0;
  double beta_s = 0;
  double time(double x) const { return alpha_s + beta_s * x; }
  /// The line through (x1, t1) and (x2, t2), x1 != x2, always exact at (x2, t2): beta clamped at
  /// >= 0 (a cost never falls with size); if alpha would be negative, the line through the origin
  /// and (x2, t2) instead.
  static AlphaBeta through(double x1, double t1, double x2, double t2);
};

/// The GEMM roofline's knobs (core/gemm_model.hpp; defaults of sim::ComputeParams).
/// launch_overhead is replaced by the scenario's engine.launch_overhead (what the engine charges).
using GemmModelParams = ::moesim::GemmModelParams;

/// The shape-dependent quantities of one MoE layer under a decision, per GPU.
struct MoeLayerShape {
  std::int64_t capacity = 0;  // dC, slots per (source GPU, expert)
  Bytes dispatch_bytes{0};    // n_d: bytes one GPU sends in the dispatch all-to-all (padded)
  double expert_work = 0;     // n_e: tokens * M * H_local computed per GPU (one expert pass)
};

class CostModel {
 public:
  /// Reads the cluster (topology), the model shape and engine parameters from the scenario.
  /// The topology must outlive the model.
  CostModel(const Scenario& sc, const topology::Topology& topo, GemmModelParams gemm = {});

  const Scenario& scenario() const { return sc_; }
  const topology::Topology& topology() const { return topo_; }
  /// The scenario's calibration (cluster.calibration), or nullptr.
  const Calibration* calibration() const { return cal_.get(); }
  /// Compute slow-down beside communication, as the engines apply it (scenario_interference).
  double interference() const { return interference_; }

  /// Ranks of the EP group of rank 0 under the plan builder's rank map (MP fastest).
  const std::vector<int>& ep_group() const { return ep_group_; }

  /// Whether `algo` (kLinear / k2dh) can run on the EP group (2DH needs node-aligned groups).
  bool a2a_applicable(CollectiveAlgo algo) const;
  /// Closed-form time of one EP all-to-all of `bytes_per_rank` (the analytical engine's value).
  Seconds a2a_time(CollectiveAlgo algo, Bytes bytes_per_rank) const;
  /// alpha-beta line of the EP all-to-all fitted through sizes lo and hi (bytes per rank).
  AlphaBeta a2a_fit(CollectiveAlgo algo, Bytes lo, Bytes hi) const;

  /// Roofline time of one (batched) GEMM; see the header comment. `flops_factor` scales the
  /// FLOPs (2 for backward GEMMs, as the plan builder emits them).
  Seconds gemm_time(const GemmShape& shape, double flops_factor = 1.0) const;
  /// Shape of the expert's first (fc1, M -> H) or second (fc2) GEMM on one GPU for a chunk of
  /// `chunk_capacity` slots, under `layout` and token repeat factor r (sharded experts), exactly
  /// as the plan builder emits it.
  GemmShape expert_gemm_shape(double chunk_capacity, LayoutRole layout, int parallel_degree,
                              bool second) const;
  /// Both expert GEMMs of one chunk.
  Seconds expert_time(double chunk_capacity, LayoutRole layout, int parallel_degree,
                      double flops_factor = 1.0) const;
  /// alpha-beta line of the expert (two GEMMs) in units of expert work x = tokens * M * H_local,
  /// fitted through the chunks of capacity dC / r_hi and dC / r_lo.
  AlphaBeta expert_fit(std::int64_t capacity, LayoutRole layout, int parallel_degree, int r_lo,
                       int r_hi, double flops_factor = 1.0) const;

  /// dC for capacity factor f > 0 (docs/strategy-specs.md §1, rounded to `multiple`); for f <= 0
  /// (dropless) the caller must know the demanded maximum, so this returns the f = 1 value.
  std::int64_t capacity_for(double f, int multiple = 1) const;
  /// n_d, n_e for capacity dC and parallel degree r (tokens repeated r times for sharded experts).
  MoeLayerShape layer_shape(std::int64_t capacity, int parallel_degree) const;
  /// Parameter bytes of one whole expert (two M x H matrices).
  Bytes expert_parameter_bytes() const;

 private:
  const Scenario& sc_;
  const topology::Topology& topo_;
  GemmModelParams gemm_;
  std::shared_ptr<const Calibration> cal_;
  GemmCalibration gemm_cal_;
  collectives::NetworkParams net_;  // scenario_network_params without the calibration's lines
  double interference_ = 0;
  std::vector<int> ep_group_;
  FlopsPerSecond peak_{0};
  BytesPerSecond hbm_{0};
  Bytes l2_{0};
  mutable std::mutex mu_;
  mutable std::map<std::pair<int, double>, double> a2a_memo_;  // (algo, bytes) -> seconds
};

/// Peak rate of `gpu` for `dtype`, falling back to the closest related dtype (fp8 -> fp16 ->
/// bf16, tf32 -> fp32) as sim::ComputeModel does; 0 when none is known (core/gemm_model).
inline FlopsPerSecond peak_for(const GpuSpec& gpu, Dtype dtype) {
  return gemm_peak_for(gpu, dtype);
}

/// The scenario's calibration file (cluster.calibration), parsed once per process; nullptr when
/// the scenario names none. InputError at the calibration key when it is missing or invalid.
std::shared_ptr<const Calibration> scenario_calibration(const Scenario& sc);

/// The per-message latency a calibration implies for the engines' NetworkParams: the measured
/// point-to-point alpha of tier 0 (inside a node) minus the latency the scenario's topology
/// already charges for that tier (cluster.intra_node.latency), clamped at >= 0; `fallback` (the
/// scenario's engine.message_latency) when the file has no tier-0 entry.
double calibrated_message_latency(const Calibration* cal, const ClusterSpec& cluster,
                                  double fallback);

/// A scenario's per-message network parameters, its calibration applied: what every engine
/// charges (sim::EngineConfig::net, apps/moesim/engine_setup) and what `auto` algorithm selection
/// reads, in the simulator and in exec alike, so both backends choose the same algorithm for the
/// same collective.
collectives::NetworkParams scenario_network_params(const Scenario& sc);

/// The compute slow-down beside communication every engine applies (sim::ComputeParams::
/// interference) and the strategies' predictions assume: the calibration's measured value, else
/// engine.interference, else the GPU's (topology::default_interference).
double scenario_interference(const Scenario& sc);

/// The ceiling of a large 16-bit GEMM as a fraction of peak (sim::ComputeParams::
/// max_gemm_efficiency) every engine and the strategies' predictions use: the GPU's measured one
/// (topology::default_gemm_ceiling). A calibration's beta_gemm replaces it where present.
double scenario_gemm_ceiling(const Scenario& sc);

/// The selection context of a run on `topo`: scenario_network_params, and the GPU's HBM bandwidth
/// for local copies (0: the topology's GPU, as the simulator's compute model uses).
collectives::CostContext scenario_cost_context(const Scenario& sc, const topology::Topology& topo);

}  // namespace moesim::strategies
