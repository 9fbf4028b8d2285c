// exec_overhead_bench: the executor's cost per op (target: <= 5 us per empty op on the
// GPU path). A plan of N empty compute ops (no flops, no GEMM shape: the executor runs nothing but
// its own bookkeeping, and on the GPU path an event pair) is run through Executor::run, in two
// layouts:
//   one stream   op i depends on op i - 1, all on "compute";
//   two streams  op i depends on op i - 1 and alternates between "compute" and "comm", so every
//                dep crosses streams (on the GPU path: a cudaStreamWaitEvent per op).
// Reported per layout: host wall time of run() / N (issue + timing gather + RunResult, the
// executor's overhead per op) and the measured makespan / N (host clock on the host path, CUDA
// events on the GPU path), medians of --reps runs after one warm-up run.
//
//   mpirun -np 1 exec_overhead_bench [--ops 10000] [--reps 5] [--backend mpi|nccl]
// Runs on one rank (scenarios/exec-gpu-1.yaml's single GPU); --backend nccl needs a CUDA build
// with NCCL and a device.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/mpi_communicator.hpp"
#ifdef MOESIM_HAVE_NCCL
#include "exec/nccl_communicator.hpp"
#endif
#include "kernels/moe_kernels.hpp"
#include "topology/topology.hpp"

namespace {

using namespace moesim;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Plan empty_plan(int n, bool two_streams) {
  Plan plan(1);
  const StreamId a = plan.stream("compute"), b = plan.stream("comm");
  for (int i = 0; i < n; ++i) {
    ComputeSpec cs;
    cs.cls = ComputeClass::kOther;
    std::vector<OpId> deps;
    if (i > 0) deps.push_back(i - 1);
    plan.add_compute(RankSet::all(1), two_streams && i % 2 ? b : a, cs, deps,
                     fmt::format("empty.{}", i));
  }
  return plan;
}

}  // namespace

int main(int argc, char** argv) {
  int ops = 10000, reps = 5;
  std::string backend = "mpi";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      fmt::print(stderr, "exec_overhead_bench: {} needs a value\n", a);
      return 2;
    }
    if (a == "--ops")
      ops = std::max(1, std::atoi(argv[++i]));
    else if (a == "--reps")
      reps = std::max(3, std::atoi(argv[++i]));
    else if (a == "--backend")
      backend = argv[++i];
    else {
      fmt::print(stderr, "exec_overhead_bench: unknown option {}\n", a);
      return 2;
    }
  }
  exec::MpiSession session(&argc, &argv);
  if (session.size() != 1) {
    if (session.rank() == 0) fmt::print(stderr, "exec_overhead_bench: run on one rank\n");
    return 2;
  }
  try {
    Scenario sc = load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-gpu-1.yaml");
    auto topo = topology::build_topology(sc.cluster);
    std::unique_ptr<exec::Communicator> comm;
    if (backend == "mpi") {
      comm = std::make_unique<exec::MpiCommunicator>();
    } else if (backend == "nccl") {
#ifdef MOESIM_HAVE_NCCL
      if (kernels::cuda_device_count() == 0) {
        fmt::print("exec_overhead_bench: --backend nccl: no CUDA device, nothing to measure\n");
        return 0;
      }
      comm = std::make_unique<exec::NcclCommunicator>(session);
#else
      fmt::print(stderr, "exec_overhead_bench: this build has no NCCL\n");
      return 2;
#endif
    } else {
      fmt::print(stderr, "exec_overhead_bench: --backend: expected mpi or nccl\n");
      return 2;
    }
    exec::Executor ex(sc, *topo, session, *comm);
    fmt::print("# exec_overhead_bench: {} empty ops, backend {} ({}), medians of {} runs\n", ops,
               comm->name(), ex.on_device() ? "GPU path" : "host path", reps);
    for (bool two : {false, true}) {
      const Plan plan = empty_plan(ops, two);
      ex.run(plan);  // warm-up: streams, events, communicators
      std::vector<double> wall, span;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const RunResult res = ex.run(plan);
        wall.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        span.push_back(res.makespan_s);
      }
      fmt::print("{:<12} per op: run() wall {:8.3f} us   measured makespan {:8.3f} us\n",
                 two ? "two streams" : "one stream", median(wall) / ops * 1e6,
                 median(span) / ops * 1e6);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "exec_overhead_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
