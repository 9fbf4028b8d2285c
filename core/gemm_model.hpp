// The GEMM roofline shared by the simulator's compute model (sim/compute_model) and the
// strategies' predictive cost model (strategies/cost_model), so the two can never disagree, and
// the calibrated path (core/calibration, `moesim calibrate`) goes through the same function.
//
//   t = launch + max(flops / rate(m, n, k, batch), bytes / hbm_bandwidth)
//
// Without calibration: launch = launch_overhead, rate = peak * eff(m, n, k) with the smooth
// tile-utilisation model
//   eff(m, n, k) = max_gemm_efficiency * u(m, tile_mn) * u(n, tile_mn) * u(k, tile_k)
//   u(d, T)      = d / (d + T * exp(-d / T))
// (see sim/compute_model.hpp for why). With calibration each measured value replaces its part:
//   alpha_gemm replaces launch_overhead;
//   beta_gemm (seconds per FLOP of the fastest shapes) replaces 1 / (peak * max_gemm_efficiency);
//   a measured efficiency table replaces eff(): the nearest measured shape in log space over
//   (m, n, k, batch). With beta the table's efficiencies are read relative to the table's largest
//   one (flop time = flops * beta * eff_max / eff); without beta they are fractions of peak.
#pragma once

#include <optional>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/plan.hpp"
#include "core/units.hpp"

namespace moesim {

/// One measured GEMM shape and its efficiency (see the header comment for what it is relative
/// to).
struct GemmEfficiencyPoint {
  GemmShape shape;
  double efficiency = 0;
};

/// Measured GEMM parameters; every field is optional and empty means "use the model".
struct GemmCalibration {
  std::optional<Seconds> alpha_gemm;
  std::optional<double> beta_gemm_s_per_flop;
  std::vector<GemmEfficiencyPoint> efficiency_table;
  bool empty() const { return !alpha_gemm && !beta_gemm_s_per_flop && efficiency_table.empty(); }
};

/// The analytical model's knobs (defaults are those of sim::ComputeParams).
struct GemmModelParams {
  Seconds launch_overhead{5e-6};
  double max_gemm_efficiency = 0.8;  // large square GEMMs
  double tile_mn = 96;               // effective tile width in m and n
  double tile_k = 32;                // k-loop depth below which pipelining is poor
};

/// u(d, T): the useful fraction of a T-wide tile for a dimension of size d (d clamped to >= 1).
double gemm_tile_utilisation(double d, double tile);

/// Efficiency of a shape: the calibrated table's nearest point when the table is non-empty, else
/// the tile model. Dimensions are doubles so that per-rank scaled shapes stay smooth.
double gemm_efficiency(const GemmModelParams& params, const GemmCalibration& cal, double m,
                       double n, double k, double batch);

/// Inputs of one GEMM's time: its shape (for the efficiency), its FLOPs and HBM bytes (callers
/// scale them: skewed load, backward factor).
struct GemmWork {
  double m = 0, n = 0, k = 0, batch = 1;
  double flops = 0;
  double bytes = 0;
};

/// The roofline above. `peak` must be > 0 unless the calibration has beta; hbm <= 0 means memory
/// traffic is free.
Seconds gemm_time(const GemmModelParams& params, const GemmCalibration& cal, FlopsPerSecond peak,
                  BytesPerSecond hbm, const GemmWork& work);

/// Minimum HBM traffic of a GEMM (read A and B, write C once each) at `bytes_per_element`.
/// Batch items that share a weight matrix (`s.weights` distinct ones) re-read it from the L2
/// cache, of which `l2` holds a proportional share of the distinct weights (the rest come from
/// HBM again); l2 = 0 (unknown) or `weights` 0 read every item's weights from HBM.
double gemm_min_bytes(const GemmShape& s, double bytes_per_element, Bytes l2 = Bytes(0));

/// FlashAttention's fraction of the dense peak (docs/model.md, "Attention core"):
///   eff = max_efficiency * L / (L + seq_half) * d / (d + head_dim_half) [* backward_factor]
/// L the keys per query row, d the q/k head width. Defaults from FlashAttention-3 (Shah et al.
/// 2024, H100 SXM5, BF16): forward, causal, head dim 128 at 4k-16k tokens about 610-640 TFLOPS
/// (0.62-0.65 of the 989 dense peak), head dim 64 about 0.5, 512 tokens about 0.35-0.4; its
/// backward does 2.5x the forward's FLOPs at ~0.85 of its rate, i.e. 0.68x the forward's
/// efficiency on the model's 2x FLOPs. FlashAttention-2 on A100 reaches similar fractions
/// (50-73% forward).
struct AttentionModelParams {
  double max_efficiency = 0.87;
  double seq_half = 512;      // L at which the sequence factor is 1/2 (short rows: poor overlap)
  double head_dim_half = 32;  // d at which the head-width factor is 1/2
  double backward_factor = 0.68;
};
double attention_efficiency(const AttentionModelParams& p, double keys, double head_dim,
                            bool backward);

/// Peak rate of `gpu` for `dtype`, falling back to the closest related dtype (fp8 -> fp16 ->
/// bf16, bf16 <-> fp16, tf32 -> fp32): an A100 runs fp8 models in fp16. 0 when none is known.
FlopsPerSecond gemm_peak_for(const GpuSpec& gpu, Dtype dtype);

}  // namespace moesim
