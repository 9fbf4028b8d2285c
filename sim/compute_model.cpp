#include "sim/compute_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace moesim::sim {

ComputeModel::ComputeModel(const GpuSpec& gpu, Dtype dtype, ComputeParams params)
    : params_(std::move(params)), dtype_(dtype) {
  const FlopsPerSecond peak = gemm_peak_for(gpu, dtype);
  if (peak.value() <= 0)
    throw InputError(gpu.where, "cluster.gpu",
                     fmt::format("GPU '{}' has no peak compute rate for {} (nor a related dtype)",
                                 gpu.name, dtype_name(dtype)));
  peak_ = peak;
  fp8_peak_ = gemm_peak_for(gpu, Dtype::kFp8);
  hbm_ = gpu.hbm_bandwidth;
  l2_ = gpu.l2_cache;
  if (hbm_.value() <= 0)
    throw InputError(gpu.where, "cluster.gpu",
                     fmt::format("GPU '{}' has no HBM bandwidth", gpu.name));
  auto in_unit = [](double x) { return x > 0 && x <= 1; };
  if (!in_unit(params_.max_gemm_efficiency) || !in_unit(params_.other_efficiency) ||
      !in_unit(params_.max_gemm_efficiency_fp8))
    throw InputError("engine: compute efficiencies must be in (0, 1]");
  if (params_.tile_mn <= 0 || params_.tile_k <= 0)
    throw InputError("engine: GEMM tile sizes must be positive");
  if (params_.interference < 0) throw InputError("engine: interference must be >= 0");
  if (params_.launch_overhead.value() < 0) throw InputError("engine: launch_overhead must be >= 0");
  for (const auto& p : params_.calibration.efficiency_table)
    if (!in_unit(p.efficiency))
      throw InputError(
          fmt::format("calibration: GEMM efficiency {} for {}x{}x{} (batch {}) is "
                      "not in (0, 1]",
                      p.efficiency, p.shape.m, p.shape.n, p.shape.k, p.shape.batch));
  if (params_.calibration.beta_gemm_s_per_flop && *params_.calibration.beta_gemm_s_per_flop <= 0)
    throw InputError("calibration: beta_gemm must be positive");
}

double ComputeModel::gemm_efficiency(double m, double n, double k, double batch) const {
  return ::moesim::gemm_efficiency(params_.gemm_params(), params_.calibration, m, n, k, batch);
}

Seconds ComputeModel::duration(const ComputeSpec& spec, double scale) const {
  MOESIM_ASSERT(scale >= 0, "negative rank_scale");
  const bool gemm = spec.gemm.has_value();
  double flops = spec.flops.value();
  if (flops <= 0 && gemm) flops = spec.gemm->flops();
  flops *= scale;
  double bytes = spec.bytes.value();
  if (bytes <= 0 && gemm) bytes = gemm_min_bytes(*spec.gemm, dtype_bytes(dtype_), l2_);
  bytes *= scale;

  if (spec.cls == ComputeClass::kAttention && gemm) {
    // The fused attention core: its own efficiency curve (FlashAttention), not a GEMM's tiles.
    const auto& g = *spec.gemm;
    const double eff = attention_efficiency(params_.attention, static_cast<double>(g.n),
                                            static_cast<double>(g.k), spec.backward);
    // A serving iteration's core also reads the KV cache (spec.bytes; training's core reads
    // nothing beyond its GEMM-like operands): whichever of the two is longer bounds it.
    const double kv_s = std::max(0.0, spec.bytes.value()) * scale / hbm_.value();
    return Seconds(params_.launch_overhead.value() + std::max(flops / (peak_.value() * eff), kv_s));
  }
  if (gemm) {
    const auto& g = *spec.gemm;
    GemmWork w;
    // Skewed load changes the token dimension (m), not the weights (n, k).
    w.m = static_cast<double>(g.m) * scale;
    w.n = static_cast<double>(g.n);
    w.k = static_cast<double>(g.k);
    w.batch = static_cast<double>(g.batch);
    w.flops = flops;
    w.bytes = bytes;
    if (spec.fp8) {
      // fp8 GEMMs: the fp8 peak at the fp8 ceiling; a calibration measured the 16-bit GEMMs, so
      // it does not apply to them.
      GemmModelParams p8 = params_.gemm_params();
      p8.max_gemm_efficiency = params_.max_gemm_efficiency_fp8;
      if (spec.bytes.value() <= 0) w.bytes = gemm_min_bytes(g, 1, l2_) * scale;  // fp8 operands
      return gemm_time(p8, GemmCalibration{}, fp8_peak_, hbm_, w) +
             Seconds(spec.cast_bytes.value() * scale / hbm_.value());
    }
    return gemm_time(params_.gemm_params(), params_.calibration, peak_, hbm_, w);
  }
  const double flop_time = flops > 0 ? flops / (peak_.value() * params_.other_efficiency) : 0.0;
  return Seconds(params_.launch_overhead.value() + std::max(flop_time, bytes / hbm_.value()));
}

Seconds ComputeModel::copy_duration(Bytes bytes) const {
  return params_.launch_overhead + Bytes(2.0 * bytes.value()) / hbm_;
}

}  // namespace moesim::sim
