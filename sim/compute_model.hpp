// Compute model: how long a kernel takes on one GPU (docs/design.md §4.1). A roofline over the
// GPU's dense peak for the run's dtype and its HBM bandwidth, plus a fixed launch overhead:
//
//   t = launch_overhead + max(flops / (peak * efficiency), bytes / hbm_bandwidth)
//
// GEMM efficiency depends on the shape, because that is what separates Tutel's flexible layout
// (one GEMM with a large token dimension) from the plain layout (W small matrices, Tutel §3.1:
// 11.3x slower expert compute at 2,048 GPUs). The default shape model (gemm_efficiency below) is
// a smooth tile-utilisation model:
//
//   eff(m, n, k) = max_gemm_efficiency * u(m, tile_mn) * u(n, tile_mn) * u(k, tile_k)
//   u(d, T)      = d / (d + T * exp(-d / T))
//
// u is the fraction of a T-wide tile that does useful work: ~d/T when d << T (a 128-wide tile
// holding 8 tokens does 1/16 of its work; the kernel is then really bandwidth-bound on the
// weights, which is the same loss), rising smoothly to 1 for d >> T (padding of the last tile
// is amortised). It is monotone in every dimension. With the defaults (tile_mn = 96, tile_k = 32,
// max 0.8) a large square GEMM (4096^3) reaches 80% of peak, m = 128 about 67%, m = 64 about
// 45%, and the plain layout at 2,048 GPUs (batch = 2,048 matrices of m = 8 tokens, M = H = 2,048)
// about 6.6%, i.e. ~12x slower than the flexible layout's single large GEMM: Tutel's ~11x.
// `batch` does not change efficiency by itself: a batched GEMM of W matrices runs W x the tiles,
// and what it loses is the per-matrix tile padding that the small m already captures. Its HBM
// traffic counts each distinct weight matrix once while the shared weights fit in the GPU's L2
// (gemm_min_bytes): the W sources of one expert re-read its weights from the cache, not HBM.
//
// Calibration (`moesim calibrate`, exec/) can replace the model piecewise: a measured efficiency
// table for GEMM shapes, a measured fixed cost per GEMM (alpha_gemm) and a measured time per FLOP
// for large GEMMs (beta_gemm). Defaults: no calibration, the model above.
//
// Interference: while communication runs on the same GPU (NCCL and DeepEP kernels occupy SMs),
// compute runs at 1 / (1 + interference) of its speed; by default the SMs those kernels leave
// (topology::default_interference). The engine applies this factor over the overlapped part of
// each compute op; this class only holds the parameter.
#pragma once

#include <optional>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/gemm_model.hpp"
#include "core/plan.hpp"
#include "core/units.hpp"

namespace moesim::sim {

/// The calibration hooks are core's (core/gemm_model.hpp), shared with strategies/cost_model:
/// alpha_gemm replaces launch_overhead for GEMMs; beta_gemm (seconds per FLOP of a large GEMM)
/// replaces 1 / (peak * max_gemm_efficiency), shape efficiency then applied relative to the
/// large-GEMM efficiency; a measured efficiency table replaces the tile model (nearest measured
/// point in log space over (m, n, k, batch): no extrapolation beyond measured points).
using GemmEfficiencyPoint = ::moesim::GemmEfficiencyPoint;
using ComputeCalibration = ::moesim::GemmCalibration;

struct ComputeParams {
  Seconds launch_overhead{5e-6};  // per kernel (engine.launch_overhead)
  /// Compute slows by factor (1 + interference) while communication runs on the same GPU.
  double interference = 0;
  /// Large 16-bit GEMMs; the apps set the GPU's measured ceiling (topology::default_gemm_ceiling).
  double max_gemm_efficiency = 0.8;
  /// Large fp8 GEMMs (model.precision.gemm: fp8, fine-grained scaling), of the fp8 dense peak.
  /// DeepSeek's published training profile of DeepSeek-V3 (deepseek-ai/profile-data, train.json:
  /// one DualPipe forward + backward chunk pair of 4 MoE layers, EP 64, 4,096 tokens, H800) runs
  /// its fp8 GEMMs, about 59 TFLOP, in 63.2 ms on the 112 SMs its all-to-all leaves: 0.56 of the
  /// 1,979 TFLOPS peak per SM. Per-block scaling and the fp32 accumulation promotions cost the
  /// rest; DeepGEMM's later microbenchmarks reach 0.62-0.78 on favourable shapes (a calibration
  /// measures a stack's own).
  double max_gemm_efficiency_fp8 = 0.56;
  AttentionModelParams attention;
  double tile_mn = 96;  // effective tile width in m and n (mix of 64/128/256 tiles)
  double tile_k = 32;   // k-loop depth below which pipelining is poor
  /// Fraction of peak reached by non-GEMM kernels (gate, encode, elementwise) on their FLOPs;
  /// they are normally bandwidth-bound anyway.
  double other_efficiency = 0.5;
  ComputeCalibration calibration;

  /// The shared roofline's parameters (core/gemm_model.hpp).
  GemmModelParams gemm_params() const {
    return GemmModelParams{launch_overhead, max_gemm_efficiency, tile_mn, tile_k};
  }
};

class ComputeModel {
 public:
  /// Throws InputError when the GPU has no peak for `dtype` or no HBM bandwidth, or when
  /// parameters are out of range (efficiencies in (0, 1], tiles > 0, interference >= 0).
  ComputeModel(const GpuSpec& gpu, Dtype dtype, ComputeParams params);

  /// Fraction of peak for a GEMM shape, in (0, max_gemm_efficiency] (or the calibrated table).
  /// Dimensions are doubles so that per-rank scaled shapes (skewed load) stay smooth.
  double gemm_efficiency(double m, double n, double k, double batch = 1) const;
  double gemm_efficiency(const GemmShape& s) const {
    return gemm_efficiency(static_cast<double>(s.m), static_cast<double>(s.n),
                           static_cast<double>(s.k), static_cast<double>(s.batch));
  }

  /// Duration of a compute op on a rank whose load is `scale` x the op's spec (rank_scale; the
  /// GEMM's m dimension, the FLOPs and the bytes scale together). Without interference.
  Seconds duration(const ComputeSpec& spec, double scale = 1.0) const;
  /// Time to read and write `traffic` bytes of HBM (collective copies and reductions): no launch
  /// overhead, the copy kernels are part of the collective.
  Seconds memory_time(Bytes traffic) const { return traffic / hbm_; }
  /// A standalone Copy op of `bytes` (read once, written once): launch + 2 * bytes / HBM.
  Seconds copy_duration(Bytes bytes) const;

  FlopsPerSecond peak() const { return peak_; }
  /// The fp8 GEMM peak (falls back to the 16-bit one on GPUs without fp8; the loader's
  /// check_precision refuses fp8 GEMMs there).
  FlopsPerSecond fp8_peak() const { return fp8_peak_; }
  BytesPerSecond hbm_bandwidth() const { return hbm_; }
  Dtype dtype() const { return dtype_; }
  const ComputeParams& params() const { return params_; }

 private:
  ComputeParams params_;
  Dtype dtype_;
  FlopsPerSecond peak_{0};
  FlopsPerSecond fp8_peak_{0};
  BytesPerSecond hbm_{0};
  Bytes l2_{0};
};

}  // namespace moesim::sim
