// The progress / interruption hook of the event loops (sim/progress.hpp): what an observer sees
// during a run, and that a requested interrupt stops run_plan with Interrupted on every engine.
#include "sim/progress.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/moesim/engine_setup.hpp"
#include "core/plan.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "topology/topology.hpp"

namespace moesim::sim {
namespace {

struct Recorder : ProgressObserver {
  std::vector<ProgressSample> samples;
  void poll(const ProgressSample& s) override { samples.push_back(s); }
};

struct Cluster16 {
  Scenario sc = load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/quickstart.yaml");
  std::unique_ptr<topology::Topology> topo = app::simulation_topology(sc);
  // 16 GPUs: a linear all-to-all and, on another stream, 64 compute ops per GPU (1,040 op
  // instances; enough engine events for several polls on every engine).
  Plan plan = make_plan(topo->num_gpus());
  static Plan make_plan(int gpus) {
    Plan p = world_collective_plan(gpus, CollectiveType::kAllToAll, CollectiveAlgo::kLinear,
                                   Bytes(64 << 20), nullptr);
    const StreamId st = p.stream("compute");
    for (int i = 0; i < 64; ++i) {
      ComputeSpec c;
      c.flops = Flops(1e9);
      p.add_compute(RankSet::all(gpus), st, c, {}, "gemm");
    }
    return p;
  }
  EngineConfig config(const std::string& engine) { return app::engine_config_from(sc, engine); }
};

TEST(Progress, ObserverSeesSimTimeEventsAndOpsOfTheRun) {
  Cluster16 s;
  Recorder rec;
  RunResult r;
  {
    const ProgressScope scope(&rec);
    r = run_plan(s.plan, *s.topo, s.config("flow"));
  }
  ASSERT_FALSE(rec.samples.empty());
  for (std::size_t i = 0; i < rec.samples.size(); ++i) {
    const ProgressSample& p = rec.samples[i];
    EXPECT_GE(p.sim_time_s, 0);
    EXPECT_LE(p.sim_time_s, r.makespan_s * (1 + 1e-12));
    // Every op instance (one per op and rank) is counted.
    EXPECT_EQ(p.ops_total, 65 * s.topo->num_gpus());
    EXPECT_GE(p.ops_done, 0);
    EXPECT_LE(p.ops_done, p.ops_total);
    // Polls also come from inside long events (routing flows, rate solves): never fewer events.
    if (i > 0) {
      EXPECT_GE(p.events, rec.samples[i - 1].events);
    }
  }
  EXPECT_GT(rec.samples.back().sim_time_s, 0);
  EXPECT_GT(rec.samples.back().events, rec.samples.front().events);
  EXPECT_GT(rec.samples.back().ops_done, 0);

  // Outside the scope nobody is polled; the run is the same with or without an observer.
  const std::size_t seen = rec.samples.size();
  RunResult again = run_plan(s.plan, *s.topo, s.config("flow"));
  EXPECT_EQ(rec.samples.size(), seen);
  EXPECT_EQ(again.makespan_s, r.makespan_s);
}

TEST(Progress, RequestedInterruptStopsEveryEngine) {
  Cluster16 s;
  std::vector<std::string> engines = {"flow", "analytical"};
  // Not simgrid: it polls from the same engine loop, and SimGrid allows one engine per process
  // (the CLI test interrupts a SimGrid run).
  for (const auto& engine : engines) {
    const Plan& plan = s.plan;
    request_interrupt();
    EXPECT_TRUE(interrupt_requested());
    EXPECT_THROW(run_plan(plan, *s.topo, s.config(engine)), Interrupted) << engine;
    clear_interrupt();
    EXPECT_FALSE(interrupt_requested());
    // The next run goes through (the hook holds no state from the abandoned one).
    EXPECT_NO_THROW(run_plan(plan, *s.topo, s.config(engine))) << engine;
  }
}

}  // namespace
}  // namespace moesim::sim
