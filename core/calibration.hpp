// The calibration file (docs/calibration.md): what `moesim calibrate` measured on a cluster, read
// when a scenario names it in `cluster.calibration`. Pure data + parsing/writing here; which
// engine uses which value is decided in one place (apps/moesim/engine_setup.cpp for the
// simulator's EngineConfig, strategies/cost_model.cpp for the strategies' cost model).
//
// Format (every time with a unit; every inverse bandwidth as a time per byte or per FLOP):
//
//   format: moesim-calibration/1
//   gpu: a100-sxm-80gb          # the scenario's GPU the file was measured for
//   device: host-cpu            # what ran the kernels: host-cpu or the CUDA device name
//   backend: mpi                # communicator: mpi | nccl
//   dtype: fp32
//   ranks: 4
//   nodes: 2
//   gpus_per_node: 2
//   gemm:
//     alpha: 12.5us             # fixed cost per GEMM call
//     beta: 0.0213ns/FLOP       # time per FLOP of the fastest (large) shapes
//     efficiency:               # measured shapes; 1 = the fastest measured shape
//       - {m: 64, n: 512, k: 256, batch: 1, efficiency: 0.61}
//   point_to_point:             # per tier, as `moesim topo` numbers them
//     - {tier: 0, alpha: 3.1us, beta: 0.12ns/B}
//   collectives:                # x = the collective's size in bytes (CollectiveSpec::bytes)
//     - {collective: all_to_all, algo: linear, ranks: 4, alpha: 40us, beta: 0.9ns/B}
//   interference: 0.07          # compute slowdown while communication runs (>= 0)
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/gemm_model.hpp"
#include "core/plan.hpp"
#include "core/units.hpp"

namespace moesim {

/// t(x) = alpha + beta * x.
struct LinearFit {
  Seconds alpha{0};
  double beta = 0;  // seconds per unit of x
  double time(double x) const { return alpha.value() + beta * x; }
};

/// Least-squares line through (x[i], y[i]) (at least two distinct x). beta is clamped at >= 0 (a
/// cost never falls with size); when the intercept comes out negative (noise on tiny times), the
/// least-squares line through the origin is returned instead (alpha = 0). Exact on points that
/// lie on a line with alpha, beta >= 0.
LinearFit fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& y);

/// Point-to-point alpha/beta between two GPUs of one tier (topology::PairCost::tier).
struct TierCalibration {
  int tier = 0;
  LinearFit fit;  // x = bytes of one message
  SourceLocation where;
};

/// Measured alpha/beta of one collective algorithm over a group of `ranks` GPUs.
struct CollectiveCalibration {
  CollectiveType type = CollectiveType::kAllToAll;
  CollectiveAlgo algo = CollectiveAlgo::kLinear;
  int ranks = 0;
  LinearFit fit;  // x = CollectiveSpec::bytes
  SourceLocation where;
};

struct Calibration {
  std::string gpu;
  std::string device;
  std::string backend;
  std::string dtype;
  int ranks = 0;
  int nodes = 0;
  int gpus_per_node = 0;
  GemmCalibration gemm;
  std::vector<TierCalibration> point_to_point;
  std::vector<CollectiveCalibration> collectives;
  std::optional<double> interference;
  /// Free text written as comment lines at the top (why interference is 0, the measured
  /// tables); not read back.
  std::vector<std::string> comments;
  std::string file;  // where it was read from ("" when built in memory)

  const TierCalibration* tier(int t) const;
  /// The entry for (type, algo) over a group of `ranks`; nullptr when not measured.
  const CollectiveCalibration* collective(CollectiveType type, CollectiveAlgo algo,
                                          int ranks) const;
};

/// Parses calibration YAML text; errors are InputErrors at file:line:col naming the key.
Calibration parse_calibration(const std::string& text, const std::string& file);
/// Reads a calibration file. A missing or unreadable file is an InputError at `referenced_from`
/// (the scenario's `cluster.calibration` key) when given, else at the file.
Calibration load_calibration(const std::string& path,
                             const std::optional<SourceLocation>& referenced_from = {});
/// The same file, parsed once per (path, modification time, size) and process (sweeps and
/// strategies ask again and again; a file rewritten in place is read again).
std::shared_ptr<const Calibration> load_calibration_cached(
    const std::string& path, const std::optional<SourceLocation>& referenced_from = {});

/// The YAML text of `cal` (what `moesim calibrate` writes): round-trips through
/// parse_calibration to the same values (numbers printed with 17 significant digits).
std::string calibration_yaml(const Calibration& cal);

/// "12.5us"-style text for a time with 17 significant digits (exact round trip).
std::string exact_seconds(double s);

}  // namespace moesim
