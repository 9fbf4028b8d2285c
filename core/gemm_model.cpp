#include "core/gemm_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"

namespace moesim {

namespace {

double log_distance(const GemmShape& a, double m, double n, double k, double batch) {
  auto d = [](double x, double y) {
    double l = std::log(std::max(x, 1.0)) - std::log(std::max(y, 1.0));
    return l * l;
  };
  return d(static_cast<double>(a.m), m) + d(static_cast<double>(a.n), n) +
         d(static_cast<double>(a.k), k) + d(static_cast<double>(a.batch), batch);
}

}  // namespace

double gemm_tile_utilisation(double d, double tile) {
  d = std::max(d, 1.0);
  return d / (d + tile * std::exp(-d / tile));
}

double gemm_efficiency(const GemmModelParams& params, const GemmCalibration& cal, double m,
                       double n, double k, double batch) {
  const auto& table = cal.efficiency_table;
  if (!table.empty()) {
    const GemmEfficiencyPoint* best = nullptr;
    double best_d = std::numeric_limits<double>::infinity();
    for (const auto& p : table) {
      const double d = log_distance(p.shape, m, n, k, batch);
      if (d < best_d) best_d = d, best = &p;
    }
    return best->efficiency;
  }
  return params.max_gemm_efficiency * gemm_tile_utilisation(m, params.tile_mn) *
         gemm_tile_utilisation(n, params.tile_mn) * gemm_tile_utilisation(k, params.tile_k);
}

Seconds gemm_time(const GemmModelParams& params, const GemmCalibration& cal, FlopsPerSecond peak,
                  BytesPerSecond hbm, const GemmWork& w) {
  double flop_time = 0;
  if (w.flops > 0) {
    const double eff = gemm_efficiency(params, cal, w.m, w.n, w.k, w.batch);
    if (cal.beta_gemm_s_per_flop) {
      // beta is the time per FLOP of the fastest shapes: a shape's efficiency is read relative
      // to the efficiency those reach (the table's largest, or the model's maximum).
      double ref = params.max_gemm_efficiency;
      if (!cal.efficiency_table.empty()) {
        ref = 0;
        for (const auto& p : cal.efficiency_table) ref = std::max(ref, p.efficiency);
      }
      flop_time = w.flops * *cal.beta_gemm_s_per_flop * (ref / eff);
    } else {
      MOESIM_ASSERT(peak.value() > 0, "GEMM time without a peak rate");
      flop_time = w.flops / (peak.value() * eff);
    }
  }
  const double mem_time = hbm.value() > 0 ? w.bytes / hbm.value() : 0.0;
  const double launch = cal.alpha_gemm ? cal.alpha_gemm->value() : params.launch_overhead.value();
  return Seconds(launch + std::max(flop_time, mem_time));
}

double gemm_min_bytes(const GemmShape& g, double bytes_per_element, Bytes l2) {
  const double m = static_cast<double>(g.m), n = static_cast<double>(g.n),
               k = static_cast<double>(g.k), batch = static_cast<double>(g.batch);
  const double distinct = g.weights > 0 ? std::min(static_cast<double>(g.weights), batch) : batch;
  const double weight = k * n * bytes_per_element;
  // The cache keeps l2 / (distinct weights) of them between the items that re-read them: all
  // when they fit, a proportional share when they do not (no LRU cliff: the items run in waves).
  const double kept = l2.value() > 0 ? std::min(1.0, l2.value() / (distinct * weight)) : 0.0;
  return (m * k + m * n) * batch * bytes_per_element + distinct * weight +
         (batch - distinct) * weight * (1.0 - kept);
}

double attention_efficiency(const AttentionModelParams& p, double keys, double head_dim,
                            bool backward) {
  keys = std::max(keys, 1.0);
  head_dim = std::max(head_dim, 1.0);
  const double e =
      p.max_efficiency * keys / (keys + p.seq_half) * head_dim / (head_dim + p.head_dim_half);
  return backward ? e * p.backward_factor : e;
}

FlopsPerSecond gemm_peak_for(const GpuSpec& gpu, Dtype dtype) {
  std::vector<Dtype> order{dtype};
  switch (dtype) {
    case Dtype::kFp8:
      order.insert(order.end(), {Dtype::kFp16, Dtype::kBf16});
      break;
    case Dtype::kBf16:
      order.push_back(Dtype::kFp16);
      break;
    case Dtype::kFp16:
      order.push_back(Dtype::kBf16);
      break;
    case Dtype::kTf32:
      order.push_back(Dtype::kFp32);
      break;
    case Dtype::kFp32:
      break;
  }
  for (Dtype d : order) {
    auto it = gpu.peak.find(d);
    if (it != gpu.peak.end() && it->second.value() > 0) return it->second;
  }
  return FlopsPerSecond(0);
}

}  // namespace moesim
