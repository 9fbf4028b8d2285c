#include "sim/compute_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace moesim::sim {

namespace {

// Fraction of a tile of width T doing useful work for a dimension of size d (see header).
double tile_utilisation(double d, double tile) {
  d = std::max(d, 1.0);
  return d / (d + tile * std::exp(-d / tile));
}

// A dtype the GPU lacks runs at the rate of its closest relative (an A100 has no fp8 units and
// runs fp8 models in fp16); only a GPU with none of them is an input error.
std::optional<FlopsPerSecond> find_peak(const GpuSpec& gpu, Dtype d) {
  auto it = gpu.peak.find(d);
  if (it != gpu.peak.end() && it->second.value() > 0) return it->second;
  std::vector<Dtype> fallbacks;
  switch (d) {
    case Dtype::kFp8:
      fallbacks = {Dtype::kFp16, Dtype::kBf16};
      break;
    case Dtype::kBf16:
      fallbacks = {Dtype::kFp16};
      break;
    case Dtype::kFp16:
      fallbacks = {Dtype::kBf16};
      break;
    case Dtype::kTf32:
      fallbacks = {Dtype::kFp32};
      break;
    case Dtype::kFp32:
      break;
  }
  for (Dtype f : fallbacks) {
    it = gpu.peak.find(f);
    if (it != gpu.peak.end() && it->second.value() > 0) return it->second;
  }
  return std::nullopt;
}

double log_distance(const GemmShape& a, double m, double n, double k, double batch) {
  auto d = [](double x, double y) {
    double l = std::log(std::max(x, 1.0)) - std::log(std::max(y, 1.0));
    return l * l;
  };
  return d(static_cast<double>(a.m), m) + d(static_cast<double>(a.n), n) +
         d(static_cast<double>(a.k), k) + d(static_cast<double>(a.batch), batch);
}

}  // namespace

ComputeModel::ComputeModel(const GpuSpec& gpu, Dtype dtype, ComputeParams params)
    : params_(std::move(params)), dtype_(dtype) {
  auto peak = find_peak(gpu, dtype);
  if (!peak)
    throw InputError(gpu.where, "cluster.gpu",
                     fmt::format("GPU '{}' has no peak compute rate for {} (nor a related dtype)",
                                 gpu.name, dtype_name(dtype)));
  peak_ = *peak;
  hbm_ = gpu.hbm_bandwidth;
  if (hbm_.value() <= 0)
    throw InputError(gpu.where, "cluster.gpu",
                     fmt::format("GPU '{}' has no HBM bandwidth", gpu.name));
  auto in_unit = [](double x) { return x > 0 && x <= 1; };
  if (!in_unit(params_.max_gemm_efficiency) || !in_unit(params_.other_efficiency))
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
  const auto& table = params_.calibration.efficiency_table;
  if (!table.empty()) {
    const GemmEfficiencyPoint* best = nullptr;
    double best_d = std::numeric_limits<double>::infinity();
    for (const auto& p : table) {
      double d = log_distance(p.shape, m, n, k, batch);
      if (d < best_d) best_d = d, best = &p;
    }
    return best->efficiency;
  }
  return params_.max_gemm_efficiency * tile_utilisation(m, params_.tile_mn) *
         tile_utilisation(n, params_.tile_mn) * tile_utilisation(k, params_.tile_k);
}

Seconds ComputeModel::duration(const ComputeSpec& spec, double scale) const {
  MOESIM_ASSERT(scale >= 0, "negative rank_scale");
  const bool gemm = spec.gemm.has_value();
  double flops = spec.flops.value();
  if (flops <= 0 && gemm) flops = spec.gemm->flops();
  flops *= scale;
  double bytes = spec.bytes.value();
  if (bytes <= 0 && gemm) {
    // Minimum traffic of a GEMM: read A and B, write C, once each.
    const auto& g = *spec.gemm;
    double m = static_cast<double>(g.m), n = static_cast<double>(g.n), k = static_cast<double>(g.k);
    bytes = (m * k + k * n + m * n) * static_cast<double>(g.batch) * dtype_bytes(dtype_);
  }
  bytes *= scale;

  double launch = params_.launch_overhead.value();
  double flop_time = 0;
  if (flops > 0) {
    if (gemm) {
      const auto& g = *spec.gemm;
      // Skewed load changes the token dimension (m), not the weights (n, k).
      double eff = gemm_efficiency(static_cast<double>(g.m) * scale, static_cast<double>(g.n),
                                   static_cast<double>(g.k), static_cast<double>(g.batch));
      const auto& cal = params_.calibration;
      if (cal.beta_gemm_s_per_flop) {
        double ref = params_.max_gemm_efficiency;
        if (!cal.efficiency_table.empty()) {
          ref = 0;
          for (const auto& p : cal.efficiency_table) ref = std::max(ref, p.efficiency);
        }
        flop_time = flops * *cal.beta_gemm_s_per_flop * (ref / eff);
      } else {
        flop_time = flops / (peak_.value() * eff);
      }
      if (cal.alpha_gemm) launch = cal.alpha_gemm->value();
    } else {
      flop_time = flops / (peak_.value() * params_.other_efficiency);
    }
  }
  return Seconds(launch + std::max(flop_time, bytes / hbm_.value()));
}

Seconds ComputeModel::copy_duration(Bytes bytes) const {
  return params_.launch_overhead + Bytes(2.0 * bytes.value()) / hbm_;
}

}  // namespace moesim::sim
