// `moesim exec` (docs/design.md §4.2, §5): real execution under mpirun.
//   mpirun -np P moesim exec SCENARIO.yaml [--strategy NAME]... [--iterations N] [--seed S]
//                            [--json F] [--check] [--backend mpi|nccl]
//                            [--predict [--engine analytical|flow|simgrid]]
// Every rank loads the scenario, builds the same plans through the same strategy stacks as
// `simulate`, and runs them on the real backend (executor.hpp); rank 0 prints the table and
// writes the same JSON as simulate (engine = the backend). --check compares every MoE layer's
// output with the single-process reference and fails (exit 1) on any mismatch. --predict also
// simulates every plan that ran (rank 0, the scenario's engine or --engine, with the scenario's
// calibration if any, apps/moesim/engine_setup) and prints measured vs predicted per op class and
// per step, with the % error; the JSON gets a `predict` object.
//
// Exit codes: 2 for invalid input (also: mpirun size != the scenario's GPU count), 1 for runtime
// failures. A failure that may have hit only some ranks (timeout, MPI error) aborts the whole job
// with MPI_Abort, since a collective MPI_Finalize would wait for the failed ranks forever.
#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/report.hpp"
#include "apps/moesim/stacks.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/layer_program.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/parm_path.hpp"
#ifdef MOESIM_HAVE_NCCL
#include "exec/nccl_communicator.hpp"
#endif
#include "sim/engine.hpp"
#include "strategies/runner.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

struct ExecArgs {
  std::string scenario;
  std::vector<std::string> sets;  // --set KEY=VALUE
  std::vector<std::string> strategies;
  std::optional<std::string> iterations;  // absent: the scenario's workload.iterations
  std::optional<std::string> seed;        // absent: the scenario's workload.routing.seed
  std::optional<std::string> warmup;      // absent: 1 on the GPU path, 0 on the host path
  std::string json_path;
  bool check = false;
  std::string backend = "mpi";
  bool predict = false;
  std::string engine;  // --engine for --predict ("" = the scenario's)
};

// --- --predict: simulated vs measured per op class and per step ----------------------------------

// The last class holds the compute ops the host path times as empty ops (not run), so the other
// rows compare only what really ran.
constexpr int kNumClasses = 7;
constexpr int kNotRun = 6;
constexpr std::array<const char*, kNumClasses> kClassNames = {
    "gemm", "gate", "encode/decode", "all_to_all", "allreduce", "other", "not run (host)"};

int op_class(const Op& op) {
  if (op.kind == OpKind::kCompute) {
    switch (op.compute().cls) {
      case ComputeClass::kGemm:
        return 0;
      case ComputeClass::kGate:
        return 1;
      case ComputeClass::kEncode:
      case ComputeClass::kDecode:
        return 2;
      default:
        return 5;
    }
  }
  if (op.kind == OpKind::kCollective) {
    switch (op.collective().type) {
      case CollectiveType::kAllToAll:
      case CollectiveType::kAllToAllv:
        return 3;
      case CollectiveType::kAllReduce:
        return 4;
      default:
        return 5;
    }
  }
  return 5;
}

// Per class: the sum over ops of the op's mean duration over its ranks (busy time of that class
// on an average rank, concurrent ops counted twice).
// `host`: on the host path only the MoE forward's compute ops run for real (with the data path),
// and the layers' backward ones (`backward`: the layer program's backward steps); every other
// compute op is an empty op there and goes to kNotRun.
std::array<double, kNumClasses> class_times(const Plan& plan, const RunResult& r, bool host,
                                            bool data_path, bool backward) {
  std::array<double, kNumClasses> t{};
  for (const Op& op : plan.ops()) {
    const int n = op.ranks.size();
    if (n == 0) continue;
    double sum = 0;
    for (int p = 0; p < n; ++p) sum += r.op_end(op.id, p) - r.op_start(op.id, p);
    int c = op_class(op);
    if (host && op.kind == OpKind::kCompute &&
        !(data_path &&
          (exec::moe_op_ref(op).kind != OpRoleKind::kNone || exec::is_parm_data_op(op))) &&
        !(backward && exec::is_backward_step(op)))
      c = kNotRun;
    t[c] += sum / n;
  }
  return t;
}

struct PredictStep {
  double measured_s = 0, predicted_s = 0;
  std::array<double, kNumClasses> measured{}, predicted{};
};

double error_pct(double measured, double predicted) {
  return measured > 0 ? 100.0 * (predicted - measured) / measured : 0.0;
}

std::string error_text(double measured, double predicted) {
  if (measured <= 0) return predicted > 0 ? "n/a" : "-";
  return fmt::format("{:+.1f}", error_pct(measured, predicted));
}

void print_predict(const std::string& strategy, const std::vector<PredictStep>& steps, bool host) {
  fmt::print("\n# predict: {} (measured vs simulated, per step; busy time of an average rank)\n",
             strategy);
  fmt::print("{:<16} {:>14} {:>14} {:>9}\n", "op class", "measured_us", "predicted_us", "err%");
  const double n = static_cast<double>(std::max<size_t>(steps.size(), 1));
  for (int c = 0; c < kNumClasses; ++c) {
    if (c == kNotRun && !host) continue;
    double m = 0, p = 0;
    for (const auto& s : steps) m += s.measured[c], p += s.predicted[c];
    fmt::print("{:<16} {:>14.2f} {:>14.2f} {:>9}\n", kClassNames[c], m / n * 1e6, p / n * 1e6,
               error_text(m, p));
  }
  for (size_t i = 0; i < steps.size(); ++i)
    fmt::print("{:<16} {:>14.2f} {:>14.2f} {:>9}\n", fmt::format("step {}", i),
               steps[i].measured_s * 1e6, steps[i].predicted_s * 1e6,
               error_text(steps[i].measured_s, steps[i].predicted_s));
}

nlohmann::ordered_json predict_json(const std::string& strategy,
                                    const std::vector<PredictStep>& steps, bool host) {
  nlohmann::ordered_json j;
  j["strategy"] = strategy;
  auto& cl = j["classes"] = nlohmann::ordered_json::object();
  const double n = static_cast<double>(std::max<size_t>(steps.size(), 1));
  for (int c = 0; c < kNumClasses; ++c) {
    if (c == kNotRun && !host) continue;
    double m = 0, p = 0;
    for (const auto& s : steps) m += s.measured[c], p += s.predicted[c];
    cl[c == kNotRun ? "not_run_host" : kClassNames[c]] = {
        {"measured_s", m / n}, {"predicted_s", p / n}, {"error_pct", error_pct(m, p)}};
  }
  auto& st = j["steps"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < steps.size(); ++i)
    st.push_back({{"iteration", i},
                  {"measured_s", steps[i].measured_s},
                  {"predicted_s", steps[i].predicted_s},
                  {"error_pct", error_pct(steps[i].measured_s, steps[i].predicted_s)}});
  return j;
}

// Fault injection for the fault tests (never set in normal runs): MOESIM_EXEC_FAULT=die:R[:S]
// makes rank R exit abruptly (no MPI_Finalize) when its S-th step (plan run, default 1) starts;
// hang:R[:S] makes it stop responding there (sleep) instead, as a stuck GPU or a deadlocked peer
// would, so the others must time out (MOESIM_EXEC_TIMEOUT_S) and abort the job.
struct FaultInjection {
  enum Kind { kNone, kDie, kHang } kind = kNone;
  int at_step = 0;
};
FaultInjection fault_from_env(int rank) {
  FaultInjection f;
  const char* v = std::getenv("MOESIM_EXEC_FAULT");
  if (!v || !*v) return f;
  char mode[8] = {};
  int r = -1, st = 1;
  const int n = std::sscanf(v, "%7[a-z]:%d:%d", mode, &r, &st);
  const std::string m = mode;
  if (n < 2 || (m != "die" && m != "hang") || r < 0 || st < 1)
    throw InputError(fmt::format(
        "MOESIM_EXEC_FAULT: found '{}', expected die:RANK[:STEP] or hang:RANK[:STEP] (STEP >= 1)",
        v));
  if (r == rank) {
    f.kind = m == "die" ? FaultInjection::kDie : FaultInjection::kHang;
    f.at_step = st;
  }
  return f;
}

// What `moesim exec` refuses before starting: the layouts the exec data paths cannot lay out.
void refuse_unsupported_layout(const Scenario& sc, const std::string& backend) {
  // Pipeline stages on the real backend: the host path runs every data path's MoE layers stage
  // by stage (each rank its stage's layers; --check on each). The GPU path has no stage logic
  // yet.
  // The exec data paths lay a layer out for a rank's one stage; interleaved and DualPipe place
  // several model pieces on a rank, which they have not learnt (the simulator runs both).
  if (sc.parallelism.schedule != PipelineSchedule::kOneFOneB)
    throw InputError(
        sc.location_of(sc.parallelism.vp > 1 ? "parallelism.vp" : "parallelism.schedule"),
        "parallelism.schedule",
        fmt::format("found schedule {}, expected 1f1b for `moesim exec` (one model "
                    "piece per rank); `moesim simulate` runs every schedule",
                    name_of(sc.parallelism.schedule)));
  if (sc.parallelism.pp > 1) {
    std::string why;
    if (backend == "nccl")
      why = "--backend nccl: the GPU path runs one pipeline stage (use --backend mpi)";
    if (!why.empty())
      throw InputError(
          sc.location_of("parallelism.pp"), "parallelism.pp",
          fmt::format("found {} pipeline stages, expected 1 for `moesim exec` with {}; "
                      "`moesim simulate` runs every layout in stages",
                      sc.parallelism.pp, why));
  }
  // layout folded: the data paths run the expert side (ep x edp, etp 1); the attention side's
  // tensor, sequence and context parallelism have no data path, so they are refused up front.
  if (const ParallelismSpec& p = sc.parallelism;
      p.folded() && (p.mp > 1 || p.cp > 1 || p.esp > 1)) {
    const std::string key = p.mp > 1   ? (sc.written("parallelism.mp") ? "mp" : "tp")
                            : p.cp > 1 ? "cp"
                                       : "etp";
    const int found = p.mp > 1 ? p.mp : p.cp > 1 ? p.cp : p.esp;
    throw InputError(sc.location_of("parallelism." + key), "parallelism." + key,
                     fmt::format("found {} with layout folded, expected 1 for `moesim exec` (it "
                                 "runs the folded expert layout, ep x edp; tensor / sequence / "
                                 "context parallel attention and etp are `moesim simulate` only)",
                                 found));
  }
}

// The --check totals over every checked MoE layer run, forward outputs and backward gradients.
struct CheckTotals {
  std::size_t layers = 0, grad_layers = 0;
  long long compared = 0, wrong = 0, drop_mismatch = 0;
  double max_err = 0;
  long long grad_compared = 0, grad_wrong = 0;
  double grad_max_err = 0;
};

CheckTotals tally_checks(const exec::Executor& executor) {
  CheckTotals t;
  t.layers = executor.checks().size();
  for (const auto& c : executor.checks()) {
    t.compared += c.compared;
    t.wrong += c.wrong;
    t.max_err = std::max(t.max_err, c.max_abs_error);
    if (c.dropped != c.expected_dropped) ++t.drop_mismatch;
  }
  // Gradients of the layers whose backward the layer program ran (exec/grad_check.hpp).
  t.grad_layers = executor.grad_checks().size();
  for (const auto& c : executor.grad_checks()) {
    t.grad_compared += c.compared;
    t.grad_wrong += c.wrong;
    t.grad_max_err = std::max(t.grad_max_err, c.max_abs_error);
  }
  return t;
}

void print_checks(const CheckTotals& t) {
  fmt::print(
      "# check: {} MoE layer run(s), {} output values compared, #wrong {}, "
      "max abs error {:.3g}, drop-count mismatches {}\n",
      t.layers, t.compared, t.wrong, t.max_err, t.drop_mismatch);
  fmt::print(
      "# check: backward of {} MoE layer run(s), {} gradients compared (dX, dWgate, dW1, "
      "dW2), #wrong {}, max abs error {:.3g}{}\n",
      t.grad_layers, t.grad_compared, t.grad_wrong, t.grad_max_err,
      t.grad_compared == 0 ? " (no backward on real data: an inference plan has none)" : "");
}

nlohmann::ordered_json check_json(const CheckTotals& t) {
  nlohmann::ordered_json c;
  c["layers_checked"] = t.layers;
  c["compared"] = t.compared;
  c["wrong"] = t.wrong;
  c["drop_count_mismatches"] = t.drop_mismatch;
  c["gradients_compared"] = t.grad_compared;
  c["gradients_wrong"] = t.grad_wrong;
  return c;
}

// The --predict report: each strategy's measured steps beside the simulator's prediction.
void print_predictions(const Scenario& sc, const std::string& path,
                       const sim::EngineConfig& engine_cfg, bool host,
                       const std::vector<strategies::StackRun>& runs,
                       const std::vector<std::vector<PredictStep>>& predicted) {
  const bool calibrated = !sc.cluster.calibration_path.empty();
  fmt::print("\n# predict: engine {}, calibration {}\n", sim::network_kind_name(engine_cfg.network),
             calibrated ? sc.cluster.calibration_path : "none (datasheet defaults)");
  // What the two columns are: this run's clock against the model of the scenario's hardware. On
  // the host path without a calibration they measure different machines, hence -60% to -99%.
  fmt::print(
      "# compared: measured = this run's ops on this machine ({}); predicted = the {} engine's "
      "time for the same plan on the scenario's cluster ({} x {}, {})\n",
      host ? "the host path: CPU code through MPI" : "the GPUs through NCCL",
      sim::network_kind_name(engine_cfg.network), sc.num_gpus(), sc.cluster.gpu.name,
      calibrated ? "with the calibration's measured rates" : "from its datasheet figures");
  if (!calibrated)
    fmt::print(
        "# to predict this machine rather than the datasheet: mpirun -np {} moesim calibrate "
        "'{}' --out cal.yaml, then --set cluster.calibration=cal.yaml (docs/calibration.md)\n",
        sc.num_gpus(), path);
  if (host)
    fmt::print(
        "# host path: only the MoE forward's compute (gate, encode, expert GEMMs, decode), "
        "the plain MoE layers' backward compute and the collectives run for real; the other "
        "compute ops are empty ops there, shown apart "
        "as 'not run (host)' (their prediction is what a GPU would take; the step rows "
        "include it)\n");
  for (size_t i = 0; i < runs.size(); ++i) print_predict(runs[i].strategy, predicted[i], host);
}

// Returns the process exit code (0, or 1 on a --check mismatch). Throws InputError for bad input.
int run_exec(const ExecArgs& a, exec::MpiSession& session) {
  const bool root = session.rank() == 0;
  check_output_path_on_root(session, a.json_path, "--json");
  std::string path = a.scenario.empty() ? default_scenario_path() : a.scenario;
  auto [sc, iterations] = load_run_scenario(path, a.sets, a.iterations, a.seed);
  refuse_serving(sc, "exec");
  // Untimed runs of each strategy's first plan before its measured iterations (nccl-tests' -w):
  // the GPU path's first run pays CUDA's lazy module loading, cuBLAS's first-call set-up and the
  // executor's buffer allocations (a 266 ms first step against 1 ms after, on an H200), which
  // would otherwise be averaged into the step time and the speedups. The host path has no such
  // one-time cost worth a run, so it defaults to none.
  const int warmup = static_cast<int>(
      parse_int_flag("--warmup", a.warmup, 0, 1000).value_or(a.backend == "nccl" ? 1 : 0));
  refuse_unsupported_layout(sc, a.backend);
  if (session.size() != sc.num_gpus())
    throw InputError(fmt::format(
        "{}: the scenario has {} GPUs ({} nodes x {} GPUs per node) but mpirun started {} "
        "rank(s); run `mpirun -np {} moesim exec {}`",
        path, sc.num_gpus(), sc.cluster.nodes, sc.cluster.gpus_per_node, session.size(),
        sc.num_gpus(), path));
  std::unique_ptr<exec::Communicator> comm = make_communicator(a.backend, session);
  auto topo = topology::build_topology(sc.cluster);
  const std::string topo_name = sc.cluster.name.empty() ? sc.name : sc.cluster.name;
  auto specs = select_strategies(sc, a.strategies);

  exec::ExecOptions opt;
  opt.check = a.check;
  exec::Executor executor(sc, *topo, session, *comm, opt);
  // --predict: the simulator's view of the same plans (rank 0 only; the measured result alone
  // drives the strategies' decisions, so every rank still takes the same path).
  sim::EngineConfig engine_cfg;
  // The plans run on the datasheet topology (`auto` resolves as it did before); the prediction
  // simulates them on the calibrated one (per-tier link bandwidths, topology/calibrated.hpp).
  std::unique_ptr<topology::Topology> sim_topo;
  if (a.predict) {
    engine_cfg = engine_config_from(sc, a.engine);
    sim_topo = simulation_topology(sc);
  }
  std::vector<std::vector<PredictStep>> predicted(specs.size());
  size_t current = 0;
  const bool host = comm->name() == "mpi";
  const strategies::Backend measured = executor.backend();
  const FaultInjection fault = fault_from_env(session.rank());
  int step = 0;
  size_t warmed = std::numeric_limits<size_t>::max();  // the strategy whose warm-up ran
  const strategies::Backend backend = [&](const Plan& plan) {
    if (warmed != current) {
      warmed = current;
      for (int i = 0; i < warmup; ++i) measured(plan);  // results discarded
    }
    if (++step == fault.at_step) {
      // A rank dying mid-job without MPI_Finalize (a crashed process, a lost node), or one that
      // stops responding: what the other ranks do then (mpirun kills them, or they time out and
      // abort) is what the fault tests check.
      std::fprintf(stderr, "moesim: MOESIM_EXEC_FAULT: rank %d %s at step %d\n", session.rank(),
                   fault.kind == FaultInjection::kDie ? "exits abruptly" : "stops responding",
                   step);
      std::fflush(stderr);
      if (fault.kind == FaultInjection::kDie) std::_Exit(3);
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    RunResult m = measured(plan);
    if (a.predict && root) {
      const RunResult p = sim::run_plan(plan, *sim_topo, engine_cfg);
      PredictStep s;
      s.measured_s = m.makespan_s;
      s.predicted_s = p.makespan_s;
      s.measured =
          class_times(plan, m, host, executor.has_data_path(), executor.has_backward_path());
      s.predicted =
          class_times(plan, p, host, executor.has_data_path(), executor.has_backward_path());
      predicted[current].push_back(s);
    }
    return m;
  };
  if (root)
    fmt::print("# {}: {} ranks, backend {}, {} iteration(s) after {} warm-up run(s), seed {}{}\n",
               sc.name, session.size(), comm->name(), iterations, warmup, sc.workload.routing.seed,
               a.check ? ", checking outputs" : "");
  std::vector<strategies::StackRun> runs;
  std::vector<RunSummary> rows;
  for (const auto& spec : specs) {
    const auto t0 = std::chrono::steady_clock::now();
    current = runs.size();
    runs.push_back(strategies::run_stack(sc, spec, *topo, backend, iterations, nullptr,
                                         /*for_execution=*/true));
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rows.push_back(summarize(runs.back(), topo_name, sc.num_gpus(), wall));
  }
  apply_speedups(rows, baseline_index(specs));

  const CheckTotals totals = tally_checks(executor);
  if (root) {
    print_table(rows);
    if (a.check) print_checks(totals);
    if (a.predict) print_predictions(sc, path, engine_cfg, host, runs, predicted);
    if (!a.json_path.empty()) {
      nlohmann::ordered_json j;
      j["moesim_version"] = MOESIM_VERSION;
      j["scenario"] = sc.name;
      j["engine"] = std::string(comm->name());
      j["seed"] = sc.workload.routing.seed;
      j["warmup"] = warmup;
      auto& jr = j["runs"] = nlohmann::ordered_json::array();
      double wall = 0;
      for (size_t i = 0; i < runs.size(); ++i) {
        jr.push_back(run_json(sc, runs[i], rows[i]));
        wall += rows[i].wall_s;
      }
      j["wall_s"] = wall;
      if (a.predict) {
        nlohmann::ordered_json p;
        p["engine"] = std::string(sim::network_kind_name(engine_cfg.network));
        p["calibration"] = sc.cluster.calibration_path;
        auto& ps = p["strategies"] = nlohmann::ordered_json::array();
        for (size_t i = 0; i < specs.size(); ++i)
          ps.push_back(predict_json(runs[i].strategy, predicted[i], host));
        j["predict"] = p;
      }
      if (a.check) j["check"] = check_json(totals);
      write_file_atomic(a.json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
    }
  }
  if (a.check && (totals.wrong > 0 || totals.drop_mismatch > 0 || totals.grad_wrong > 0)) {
    if (root)
      std::fprintf(stderr,
                   "moesim: error: --check failed: #wrong %lld, drop-count mismatches %lld, "
                   "gradients #wrong %lld\n",
                   totals.wrong, totals.drop_mismatch, totals.grad_wrong);
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
  add_set_option(cmd, &a->sets);
  cmd->add_option("--strategy", a->strategies, "Run only this strategy (repeatable)");
  cmd->add_option("--iterations", a->iterations,
                  "Iterations, in [1, 1000000] (default: workload.iterations)");
  cmd->add_option("--seed", a->seed,
                  "Routing and data seed, in [0, 2^63-1] (default: workload.routing.seed)");
  cmd->add_option("--warmup", a->warmup,
                  "Untimed runs of each strategy's first plan before its iterations, in [0, 1000] "
                  "(default: 1 with --backend nccl, 0 with mpi)");
  cmd->add_option("--json", a->json_path, "Write results as JSON to this file (rank 0)");
  cmd->add_flag("--check", a->check,
                "Compare every MoE layer with a single-process reference; exit 1 on mismatch");
  cmd->add_option("--backend", a->backend, "mpi (host path) or nccl");
  cmd->add_flag("--predict", a->predict,
                "Also simulate every plan that ran; print measured vs predicted per op class and "
                "per step");
  cmd->add_option("--engine", a->engine,
                  "Engine for --predict: analytical, flow or simgrid (default: the scenario's)");
  cmd->callback([a] { run_mpi_command([a](exec::MpiSession& s) { return run_exec(*a, s); }); });
}

std::unique_ptr<exec::Communicator> make_communicator(const std::string& backend,
                                                      [[maybe_unused]] exec::MpiSession& session) {
  if (backend == "mpi") return std::make_unique<exec::MpiCommunicator>();
  if (backend == "nccl") {
#ifdef MOESIM_HAVE_NCCL
    return std::make_unique<exec::NcclCommunicator>(session);
#else
    throw InputError(
        "--backend nccl: this build has no NCCL (needs MOESIM_WITH_CUDA and NCCL); use --backend "
        "mpi (the host path)");
#endif
  }
  throw InputError(fmt::format("--backend: found '{}', expected mpi or nccl", backend));
}

void check_output_path_on_root(exec::MpiSession& session, const std::string& path,
                               const std::string& flag) {
  if (path.empty()) return;  // the same flags on every rank: all return here together
  std::string error;
  if (session.rank() == 0) {
    try {
      check_output_path(path, flag);
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  // Every rank learns rank 0's verdict, so that all of them leave through the InputError path
  // (MPI_Finalize) together; a rank that went on alone would wait for the others forever.
  if (session.all_reduce_max(error.empty() ? 0.0 : 1.0) > 0)
    throw InputError(error.empty() ? fmt::format("{} {}: rank 0 cannot write there", flag, path)
                                   : error);
}

void run_mpi_command(const std::function<int(exec::MpiSession&)>& body) {
  int code = 0;
  {
    exec::MpiSession session(nullptr, nullptr);
    try {
      code = body(session);
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
}

}  // namespace moesim::app
