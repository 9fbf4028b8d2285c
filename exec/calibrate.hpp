// `moesim calibrate` (docs/calibration.md): measures on the machine it runs on,
// under mpirun with one rank per GPU, what the simulator otherwise takes from datasheets, and
// returns it as a core/calibration Calibration:
//  - GEMM: time of the expert FFN's GEMM (m tokens x M -> H) over a grid of shapes on every rank
//    at once (as in a real step), median of repeats per rank then median over ranks; least
//    squares t = alpha + beta * flops over the larger half of the shapes (by FLOPs); per shape
//    an efficiency = fitted flop time / measured flop time, clamped to (0, 1], so the compute
//    model reproduces each measured shape (core/gemm_model.hpp).
//  - Collectives over the group of all ranks: all_to_all (linear; 2dh when the group spans
//    whole nodes), all_reduce, all_gather, reduce_scatter, and point-to-point between a pair
//    of ranks per tier (first rank of each tier as seen from rank 0 under the scenario's rank
//    map), sizes 1 KiB .. max x4, nccl-tests columns. The all-to-alls run the registry's
//    lowering through the exec phase runner, the others the communicator's group collectives,
//    exactly as exec/executor.cpp runs a plan's collectives. Every received buffer is checked
//    against the fill rule (#wrong). Time of one size = median over repeats of the slowest
//    rank's time (barrier before each repeat).
//  - Interference: a GEMM alone vs while the main thread runs linear all-to-alls (the GEMM on
//    a second thread, so MPI stays on the main thread as MPI_THREAD_FUNNELED requires).
//
// Kernels: the host path times kernels::cpu::gemm (one thread per rank, as the executor runs
// them). The GEMM timer is an interface so the GPU path can time cuBLAS through the same sweep.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/calibration.hpp"
#include "core/scenario.hpp"
#include "exec/communicator.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::exec {

class MpiSession;

struct CalibrateOptions {
  bool quick = false;         // CI sizes: small GEMM grid, sizes up to 64 KiB, 3 repeats
  std::size_t max_bytes = 0;  // largest collective size; 0 = 64 KiB quick, 16 MiB otherwise
  int repeats = 0;            // per point; 0 = 3 quick, 7 otherwise
  std::uint64_t seed = 1;     // fill rule seed
  // What the GemmTimer runs: its element type (recorded as the calibration's dtype), and whether
  // it is a GPU, whose grid reaches the shapes where tensor cores saturate (m up to 16,384,
  // M x H up to 4,096 x 16,384) rather than the host path's small ones.
  std::string gemm_dtype = "fp32";
  bool gemm_on_gpu = false;
};

/// Seconds of `batch` GEMMs C_i (m x n) = A_i (m x k) * B_i (k x n) on this rank's device (one
/// strided-batched call on the GPU, as the executor runs the experts' GEMMs).
using GemmTimer = std::function<double(int m, int n, int k, int batch)>;
/// The host path's timer: kernels::cpu::gemm on preallocated buffers, one thread.
GemmTimer host_gemm_timer();
#ifdef MOESIM_HAVE_NCCL
/// The GPU path's timer (exec/gpu_gemm_timer.cpp): one cuBLAS GEMM in `dtype` on `device`, timed
/// by CUDA events on a non-blocking stream of its own. Callable from any thread.
GemmTimer device_gemm_timer(kernels::DType dtype, int device);
/// The CUDA device's name ("NVIDIA H200"), for the calibration's `device`.
std::string device_name(int device);
#endif

/// The GEMM shapes the sweep times for `sc` (fc1 of the expert FFN: m tokens x M -> H): a fixed
/// grid (host or GPU sized, quick or full) plus the scenario's own (M, H) where the grid's bound
/// allows. On the GPU also the scenario's batched shape: the plan's expert GEMM is one call over
/// batch = ep x local experts (core/plan.hpp GemmShape, strategies/cost_model.cpp), whose time at
/// small m is one launch, not batch of them.
std::vector<GemmShape> gemm_grid(const Scenario& sc, bool quick, bool gpu);

/// One measured GEMM shape (median over repeats and ranks).
struct GemmPoint {
  GemmShape shape;
  double time_s = 0;
  double predicted_s = 0;  // the calibrated compute model's time for the shape
  bool in_fit = false;     // one of the larger shapes beta was fitted on
};

/// One nccl-tests row.
struct SweepRow {
  std::size_t size_bytes = 0;
  std::size_t count = 0;  // float elements
  double time_s = 0;
  double algbw_Bps = 0;
  double busbw_Bps = 0;
  long long wrong = 0;
};

/// One measured line: a collective algorithm over all ranks, or point-to-point in one tier.
struct SweepLine {
  std::string name;  // "all_to_all linear", "p2p tier 1 (0<->2)"
  CollectiveType type = CollectiveType::kAllToAll;
  CollectiveAlgo algo = CollectiveAlgo::kLinear;
  int tier = -1;  // point-to-point lines only
  int ranks = 0;
  std::vector<SweepRow> rows;
  LinearFit fit;
};

struct CalibrationRun {
  Calibration calibration;
  std::vector<GemmPoint> gemm;
  LinearFit fit;  // least squares over the larger shapes (alpha, beta before the adjustments)
  std::vector<SweepLine> lines;
  double gemm_alone_s = 0, gemm_concurrent_s = 0;
  long long wrong = 0;  // over every line
};

/// Runs every sweep (a collective call: every rank calls it with the same arguments). The
/// result is identical on every rank. `backend_name` is the communicator's (mpi / nccl),
/// `device` what runs the GEMMs ("host-cpu" or the CUDA device name).
CalibrationRun run_calibration(const Scenario& sc, const topology::Topology& topo,
                               MpiSession& session, Communicator& comm, const GemmTimer& gemm,
                               const std::string& device, const CalibrateOptions& opt);

/// The fill rule of the collective checks (nccl-tests style, seeded): element i of rank r's
/// input is a small integer in [-8, 8], so any sum over ranks is exact in fp32.
float fill_value(std::uint64_t seed, int rank, std::size_t i);

}  // namespace moesim::exec
