// `moesim exec` (DESIGN §4.2, §5): real execution under mpirun.
//   mpirun -np P moesim exec SCENARIO.yaml [--strategy NAME]... [--iterations N] [--seed S]
//                            [--json F] [--check] [--backend mpi|nccl]
// Every rank loads the scenario, builds the same plans through the same strategy stacks as
// `simulate`, and runs them on the real backend (executor.hpp); rank 0 prints the table and
// writes the same JSON as simulate (engine = the backend). --check compares every MoE layer's
// output with the single-process reference and fails (exit 1) on any mismatch.
//
// Exit codes: 2 for invalid input (also: mpirun size != the scenario's GPU count), 1 for runtime
// failures. A failure that may have hit only some ranks (timeout, MPI error) aborts the whole job
// with MPI_Abort, since a collective MPI_Finalize would wait for the failed ranks forever.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/report.hpp"
#include "apps/moesim/stacks.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/mpi_communicator.hpp"
#ifdef MOESIM_HAVE_NCCL
#include "exec/nccl_communicator.hpp"
#endif
#include "strategies/runner.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

struct ExecArgs {
  std::string scenario;
  std::vector<std::string> strategies;
  int iterations = 0;
  long long seed = -1;
  std::string json_path;
  bool check = false;
  std::string backend = "mpi";
};

// Returns the process exit code (0, or 1 on a --check mismatch). Throws InputError for bad input.
int run_exec(const ExecArgs& a, exec::MpiSession& session) {
  const bool root = session.rank() == 0;
  std::string path = a.scenario.empty() ? default_scenario_path() : a.scenario;
  Scenario sc = load_scenario(path);
  if (a.iterations < 0) throw InputError("--iterations: expected an integer >= 1");
  if (a.seed >= 0) sc.workload.routing.seed = static_cast<std::uint64_t>(a.seed);
  const int iterations = a.iterations > 0 ? a.iterations : sc.workload.iterations;
  if (session.size() != sc.num_gpus())
    throw InputError(fmt::format(
        "{}: the scenario has {} GPUs ({} nodes x {} GPUs per node) but mpirun started {} "
        "rank(s); run `mpirun -np {} moesim exec {}`",
        path, sc.num_gpus(), sc.cluster.nodes, sc.cluster.gpus_per_node, session.size(),
        sc.num_gpus(), path));
  std::unique_ptr<exec::Communicator> comm;
  if (a.backend == "mpi") {
    comm = std::make_unique<exec::MpiCommunicator>();
  } else if (a.backend == "nccl") {
#ifdef MOESIM_HAVE_NCCL
    comm = std::make_unique<exec::NcclCommunicator>(session);
#else
    throw InputError(
        "--backend nccl: this build has no NCCL (needs MOESIM_WITH_CUDA and NCCL); use --backend "
        "mpi (the host path)");
#endif
  } else {
    throw InputError(fmt::format("--backend: found '{}', expected mpi or nccl", a.backend));
  }
  auto topo = topology::build_topology(sc.cluster);
  const std::string topo_name = sc.cluster.name.empty() ? sc.name : sc.cluster.name;
  auto specs = select_strategies(sc, a.strategies);

  exec::ExecOptions opt;
  opt.check = a.check;
  exec::Executor executor(sc, *topo, session, *comm, opt);
  if (root)
    fmt::print("# {}: {} ranks, backend {}, {} iteration(s), seed {}{}\n", sc.name, session.size(),
               comm->name(), iterations, sc.workload.routing.seed,
               a.check ? ", checking outputs" : "");
  std::vector<strategies::StackRun> runs;
  std::vector<RunSummary> rows;
  for (const auto& spec : specs) {
    const auto t0 = std::chrono::steady_clock::now();
    runs.push_back(strategies::run_stack(sc, spec, *topo, executor.backend(), iterations));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rows.push_back(summarize(runs.back(), topo_name, sc.num_gpus(), wall));
  }
  apply_speedups(rows, baseline_index(specs));

  const auto& checks = executor.checks();
  long long wrong = executor.total_wrong(), compared = 0, drop_mismatch = 0;
  for (const auto& c : checks) {
    compared += c.compared;
    if (c.dropped != c.expected_dropped) ++drop_mismatch;
  }
  if (root) {
    print_table(rows);
    if (a.check) {
      double max_err = 0;
      for (const auto& c : checks) max_err = std::max(max_err, c.max_abs_error);
      fmt::print(
          "# check: {} MoE layer run(s), {} output values compared, #wrong {}, "
          "max abs error {:.3g}, drop-count mismatches {}\n",
          checks.size(), compared, wrong, max_err, drop_mismatch);
    }
    if (!a.json_path.empty()) {
      nlohmann::ordered_json j;
      j["moesim_version"] = MOESIM_VERSION;
      j["scenario"] = sc.name;
      j["engine"] = std::string(comm->name());
      j["seed"] = sc.workload.routing.seed;
      auto& jr = j["runs"] = nlohmann::ordered_json::array();
      double wall = 0;
      for (size_t i = 0; i < runs.size(); ++i) {
        jr.push_back(run_json(sc, runs[i], rows[i]));
        wall += rows[i].wall_s;
      }
      j["wall_s"] = wall;
      if (a.check) {
        nlohmann::ordered_json c;
        c["layers_checked"] = checks.size();
        c["compared"] = compared;
        c["wrong"] = wrong;
        c["drop_count_mismatches"] = drop_mismatch;
        j["check"] = c;
      }
      write_file_atomic(a.json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
    }
  }
  if (a.check && (wrong > 0 || drop_mismatch > 0)) {
    if (root)
      std::fprintf(stderr,
                   "moesim: error: --check failed: #wrong %lld, drop-count mismatches %lld\n",
                   wrong, drop_mismatch);
    return 1;
  }
  return 0;
}

}  // namespace

void register_exec(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "exec",
      "Run a scenario for real under mpirun (MPI host path or NCCL), same JSON as simulate");
  auto a = std::make_shared<ExecArgs>();
  cmd->add_option("scenario", a->scenario, "Scenario YAML (default: scenarios/quickstart.yaml)");
  cmd->add_option("--strategy", a->strategies, "Run only this strategy (repeatable)");
  cmd->add_option("--iterations", a->iterations, "Iterations (default: workload.iterations)");
  cmd->add_option("--seed", a->seed, "Routing and data seed (default: workload.routing.seed)");
  cmd->add_option("--json", a->json_path, "Write results as JSON to this file (rank 0)");
  cmd->add_flag("--check", a->check,
                "Compare every MoE layer with a single-process reference; exit 1 on mismatch");
  cmd->add_option("--backend", a->backend, "mpi (host path) or nccl");
  cmd->callback([a] {
    int code = 0;
    {
      exec::MpiSession session(nullptr, nullptr);
      try {
        code = run_exec(*a, session);
      } catch (const InputError& e) {
        // Input errors are found identically by every rank (same files, same flags): report once
        // and leave through MPI_Finalize.
        if (session.rank() == 0) std::fprintf(stderr, "moesim: error: %s\n", e.what());
        code = 2;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "moesim: error: rank %d: %s\n", session.rank(), e.what());
        std::fflush(stderr);
        exec::MpiSession::abort_all(1);
      }
    }  // MPI_Finalize
    std::fflush(stdout);
    if (code != 0) std::exit(code);
  });
}

}  // namespace moesim::app
