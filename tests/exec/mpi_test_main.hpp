// The shared main of the mpirun-launched GoogleTest binaries of exec/ (mpi_test_main.cpp): MPI
// is initialised once for the whole binary (MpiSession), progress prints from rank 0 only
// (failures still print on the rank where they happen) and any rank failing fails the job. Also
// the one helper they share: build one step's plan for a decision and run it.
#pragma once

#include <vector>

#include "core/plan.hpp"
#include "core/run_result.hpp"
#include "core/scenario.hpp"
#include "exec/executor.hpp"
#include "exec/mpi_communicator.hpp"
#include "strategies/decision.hpp"

namespace moesim::exec {
/// The binary's MPI session, set before any test runs.
extern MpiSession* g_session;

/// What one executed step left behind.
struct ExecOutcome {
  RunResult result;
  std::vector<std::vector<float>> outputs;  // Executor::last_outputs
  std::vector<long long> dropped;           // Executor::last_dropped
  std::vector<LayerCheck> checks;           // Executor::checks (options.check)
  std::vector<std::vector<float>> grads;    // Executor::last_gradients (backward path)
  std::vector<GradCheck> grad_checks;       // Executor::grad_checks (options.check)
  Plan plan;
};

/// Builds iteration 0's plan of `sc` for `decision` (workload sampled at its pipeline degree)
/// and runs it once on a fresh Executor over `comm` (every rank must call it).
ExecOutcome run_step(const Scenario& sc, Communicator& comm, const strategies::Decision& decision,
                     bool check);
}  // namespace moesim::exec
