#include "tests/exec/mpi_test_main.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <utility>

#include "strategies/plan_builder.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
MpiSession* g_session = nullptr;

ExecOutcome run_step(const Scenario& sc, Communicator& comm, const strategies::Decision& decision,
                     bool check) {
  auto topo = topology::build_topology(sc.cluster);
  ExecOptions opt;
  opt.check = check;
  Executor ex(sc, *topo, *g_session, comm, opt);
  workload::WorkloadGenerator gen(sc);
  auto built =
      strategies::build_step_plan(sc, *topo, gen.next(0, decision.pipeline_degree), decision);
  ExecOutcome o;
  o.result = ex.run(built.plan);
  o.outputs = ex.last_outputs();
  o.dropped = ex.last_dropped();
  o.checks = ex.checks();
  o.grads = ex.last_gradients();
  o.grad_checks = ex.grad_checks();
  o.plan = std::move(built.plan);
  return o;
}
}  // namespace moesim::exec

int main(int argc, char** argv) {
  moesim::exec::MpiSession session(&argc, &argv);
  moesim::exec::g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  if (session.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
