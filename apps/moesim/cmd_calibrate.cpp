// `moesim calibrate` (docs/calibration.md): measure this machine under mpirun and write the
// calibration YAML that `cluster.calibration` loads.
//   mpirun -np P moesim calibrate [SCENARIO.yaml] [--out CALIB.yaml] [--quick] [--backend mpi|nccl]
// The scenario gives the rank map (nodes x GPUs per node: which pairs are intra- or inter-node)
// and the expert shapes; without one, all ranks are taken as one node of the quickstart GPU.
// Rank 0 prints the tables (GEMM, then nccl-tests-style collective lines) and writes the file
// atomically (temporary + rename). Exit codes as exec: 2 invalid input, 1 runtime failure
// (MPI_Abort, since only some ranks may have failed); a sweep with #wrong > 0 writes nothing
// and exits 1.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "core/calibration.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "exec/calibrate.hpp"
#include "exec/moe_data.hpp"
#include "exec/mpi_communicator.hpp"
#ifdef MOESIM_HAVE_NCCL
#include "exec/nccl_communicator.hpp"
#endif
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

struct CalibrateArgs {
  std::string scenario;
  std::vector<std::string> sets;  // --set KEY=VALUE
  std::string out;
  bool quick = false;
  std::string backend = "mpi";
  std::optional<std::string> repeats;  // absent: 3 with --quick, 7 otherwise
};

void print_run(const exec::CalibrationRun& run) {
  const Calibration& cal = run.calibration;
  fmt::print("\n# GEMM sweep ({}; fit t = alpha + beta * flops on the shapes marked *)\n",
             cal.device);
  fmt::print("{:>6} {:>6} {:>6} {:>6} {:>12} {:>10} {:>12} {:>8} {:>6}\n", "m", "n", "k", "batch",
             "time_us", "GFLOP/s", "model_us", "err%", "eff");
  for (size_t i = 0; i < run.gemm.size(); ++i) {
    const auto& p = run.gemm[i];
    fmt::print("{:>6} {:>6} {:>6} {:>6} {:>12.3f} {:>10.3f} {:>12.3f} {:>8.2f} {:>6.3f}{}\n",
               p.shape.m, p.shape.n, p.shape.k, p.shape.batch, p.time_s * 1e6,
               p.shape.flops() / p.time_s * 1e-9, p.predicted_s * 1e6,
               100.0 * (p.predicted_s - p.time_s) / p.time_s,
               cal.gemm.efficiency_table[i].efficiency, p.in_fit ? " *" : "");
  }
  fmt::print("# least squares on *: alpha {:.4g} us, beta {:.4g} ns/FLOP ({:.4g} GFLOP/s)\n",
             run.fit.alpha.value() * 1e6, run.fit.beta * 1e9,
             run.fit.beta > 0 ? 1e-9 / run.fit.beta : 0.0);
  fmt::print(
      "# written: alpha_gemm {:.4g} us (<= half the fastest GEMM), beta_gemm {:.4g} ns/FLOP "
      "({:.4g} GFLOP/s, the fastest shape), eff = beta * flops / (t - alpha)\n",
      cal.gemm.alpha_gemm->value() * 1e6, *cal.gemm.beta_gemm_s_per_flop * 1e9,
      1e-9 / *cal.gemm.beta_gemm_s_per_flop);
  for (const auto& l : run.lines) {
    fmt::print("\n# {} over {} ranks ({})\n", l.name, l.ranks, cal.backend);
    fmt::print("{:>12} {:>10} {:>6} {:>12} {:>10} {:>10} {:>7}\n", "size(B)", "count", "type",
               "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    for (const auto& r : l.rows)
      fmt::print("{:>12} {:>10} {:>6} {:>12.2f} {:>10.4f} {:>10.4f} {:>7}\n", r.size_bytes, r.count,
                 "float", r.time_s * 1e6, r.algbw_Bps * 1e-9, r.busbw_Bps * 1e-9, r.wrong);
    fmt::print("# fit: alpha {:.4g} us, beta {:.4g} ns/B ({:.4g} GB/s)\n",
               l.fit.alpha.value() * 1e6, l.fit.beta * 1e9,
               l.fit.beta > 0 ? 1e-9 / l.fit.beta : 0.0);
  }
  fmt::print("\n# interference {:.4g} (GEMM alone {:.4g} us, during all_to_all {:.4g} us)\n",
             cal.interference.value_or(0), run.gemm_alone_s * 1e6, run.gemm_concurrent_s * 1e6);
  fmt::print("# #wrong over all lines: {}\n", run.wrong);
}

int run_calibrate(const CalibrateArgs& a, exec::MpiSession& session) {
  const bool root = session.rank() == 0;
  check_output_path_on_root(session, a.out, "--out");
  Scenario sc;
  if (a.scenario.empty()) {
    // No scenario: every rank on one node of the quickstart's GPU (intra-node pairs only).
    sc = load_scenario(default_scenario_path());
    sc.name = "default";
    sc.cluster.nodes = 1;
    sc.cluster.gpus_per_node = session.size();
    sc.cluster.inter = InterNodeSpec{};
    sc.cluster.calibration_path.clear();
  } else {
    sc = load_scenario_with(a.scenario, a.sets);
    if (session.size() != sc.num_gpus())
      throw InputError(fmt::format(
          "{}: the scenario has {} GPUs ({} nodes x {} GPUs per node) but mpirun started {} "
          "rank(s); run `mpirun -np {} moesim calibrate {}`",
          a.scenario, sc.num_gpus(), sc.cluster.nodes, sc.cluster.gpus_per_node, session.size(),
          sc.num_gpus(), a.scenario));
  }
  const int repeats = static_cast<int>(parse_int_flag("--repeats", a.repeats, 1, 1000).value_or(0));
  std::unique_ptr<exec::Communicator> comm = make_communicator(a.backend, session);
  std::string device = "host-cpu";
  auto topo = topology::build_topology(sc.cluster);
  exec::CalibrateOptions opt;
  opt.quick = a.quick;
  opt.repeats = repeats;  // 0: CalibrateOptions' own default
  // The host path times the CPU kernels in fp32 (what it runs); the GPU path times cuBLAS on the
  // rank's GPU in the scenario's dtype, the GEMMs `exec --backend nccl` runs.
  exec::GemmTimer timer = exec::host_gemm_timer();
#ifdef MOESIM_HAVE_NCCL
  if (const auto* nccl = dynamic_cast<const exec::NcclCommunicator*>(comm.get())) {
    const kernels::DType kdt = exec::kernel_dtype(sc.model.dtype);  // as the executor runs it
    timer = exec::device_gemm_timer(kdt, nccl->device());
    device = exec::device_name(nccl->device());
    opt.gemm_dtype = kernels::dtype_name(kdt);
    opt.gemm_on_gpu = true;
  }
#endif
  if (root)
    fmt::print("# moesim calibrate: {} ranks ({} x {}), backend {}, GEMMs on {} ({}){}\n",
               session.size(), sc.cluster.nodes, sc.cluster.gpus_per_node, comm->name(), device,
               opt.gemm_dtype, a.quick ? ", quick" : "");
  const exec::CalibrationRun run =
      exec::run_calibration(sc, *topo, session, *comm, timer, device, opt);
  if (!root) return run.wrong > 0 ? 1 : 0;
  print_run(run);
  if (run.wrong > 0) {
    std::fprintf(stderr,
                 "moesim: error: %lld received values differ from the fill rule; no "
                 "calibration written\n",
                 run.wrong);
    return 1;
  }
  const std::string text = calibration_yaml(run.calibration);
  if (a.out.empty()) {
    fmt::print("\n{}", text);
  } else {
    // Read back before renaming into place: what is written is what a scenario will load.
    parse_calibration(text, a.out);
    write_file_atomic(a.out, [&](std::ostream& os) { os << text; });
    fmt::print("# wrote {}\n", a.out);
  }
  return 0;
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Measure GEMMs, collectives and interference under mpirun; write the calibration YAML");
  auto a = std::make_shared<CalibrateArgs>();
  cmd->add_option("scenario", a->scenario,
                  "Scenario YAML giving the rank map and expert shapes (default: all ranks on "
                  "one node)");
  add_set_option(cmd, &a->sets);
  cmd->add_option("--out", a->out, "Write the calibration YAML here (rank 0; default: stdout)");
  cmd->add_flag("--quick", a->quick, "Small grid and sizes up to 64 KiB (CI)");
  cmd->add_option("--repeats", a->repeats,
                  "Repeats per point, in [1, 1000] (default 3 quick, 7 otherwise)");
  cmd->add_option("--backend", a->backend, "mpi (host path) or nccl");
  cmd->callback(
      [a] { run_mpi_command([a](exec::MpiSession& s) { return run_calibrate(*a, s); }); });
}

}  // namespace moesim::app
