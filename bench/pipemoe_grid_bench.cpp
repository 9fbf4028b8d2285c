// pipemoe_grid_bench: PipeMoE's evaluation grid (Shi et al., INFOCOM 2023, §V) on the analytical
// engine: P in {16, 32, 64} RTX 2080 Ti, 4 per node, one 100 Gb/s InfiniBand NIC per node;
// B in {2, 4, 8}, L in {512, 1024, 2048}, M and H in {1024, 2048, 4096, 8192}, dE in {1, 2}
// (864 configurations), one training MoE layer, x 4 strategy stacks:
//   baseline     a2a linear, pipeline 1
//   pipemoe      a2a linear, pipeline pipemoe
//   pipemoe_auto a2a auto,   pipeline pipemoe, layout flexible
//   tutel        a2a auto,   pipeline tutel_online (settles within its 8-strategy space)
// Prints, per P, the median and max speedup of each stack's last-iteration MoE layer time over
// the baseline, PipeMoE's chosen degrees, and the total wall and CPU time (target <= 5 s).
// The sampled token counts depend on (P, E, S = B L, k, seed, iteration) only, not on M, H or
// the stack, so all runs share one workload::SampleCache: 54 shapes are sampled instead of
// every point x stack (the results are the same; --no-cache 1 turns it off to compare).
//
// Usage: pipemoe_grid_bench [ITERATIONS] [--no-cache 1]
//   (ITERATIONS default 10: Tutel's search needs 9 to settle)
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/runner.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace {

using namespace moesim;

Scenario base_scenario(int gpus) {
  const std::string yaml = fmt::format(R"(name: pipemoe-grid-{0}
cluster:
  gpu: rtx-2080-ti
  nodes: {1}
  gpus_per_node: 4
  intra_node: {{kind: pcie, bandwidth: 16GB/s, latency: 2us, gpus_per_pcie_switch: 2}}
  inter_node: {{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}}
model:
  mode: training
  layers: 1
  batch_per_gpu: 4
  seq_len: 1024
  model_dim: 1024
  hidden_dim: 1024
  experts_per_gpu: 1
  top_k: 2
  capacity_factor: 1.0
  dtype: fp16
parallelism: {{ep: {0}, dp: 1}}
workload:
  routing: {{distribution: uniform, seed: 1}}
engine: {{network: analytical}}
strategies:
  - {{name: baseline, a2a: linear, pipeline: 1}}
  - {{name: pipemoe, a2a: linear, pipeline: pipemoe}}
  - {{name: pipemoe_auto, a2a: auto, pipeline: pipemoe, layout: flexible}}
  - {{name: tutel, a2a: auto, pipeline: tutel_online}}
)",
                                       gpus, gpus / 4);
  return parse_scenario_string(yaml, fmt::format("pipemoe-grid-{}.yaml", gpus));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Config {
  int b, l, m, h, de;
};

struct Outcome {
  std::map<std::string, double> speedup;  // stack -> baseline time / stack time
  int pipemoe_degree = 0;
  int iterations = 0;
};

// Runs the 4 stacks on one configuration.
Outcome run_config(Scenario sc, const topology::Topology& topo, const sim::EngineConfig& cfg,
                   const Config& c, int tutel_iterations, workload::SampleCache* cache) {
  sc.model.batch_per_gpu = c.b;
  sc.model.seq_len = c.l;
  sc.model.model_dim = c.m;
  sc.model.hidden_dim = c.h;
  sc.model.experts_per_gpu = c.de;
  sc.model.experts = c.de * sc.parallelism.ep;
  const strategies::Backend backend = [&](const Plan& p) { return sim::run_plan(p, topo, cfg); };
  Outcome out;
  double base = 0;
  for (const auto& spec : sc.strategies) {
    const auto run = strategies::run_stack(sc, spec, topo, backend,
                                           spec.name == "tutel" ? tutel_iterations : 1, cache);
    out.iterations += static_cast<int>(run.iterations.size());
    const double t = run.iterations.back().moe_layer_time_s;
    if (spec.name == "baseline") {
      base = t;
      continue;
    }
    out.speedup[spec.name] = base / t;
    if (spec.name == "pipemoe") out.pipemoe_degree = run.iterations.back().decision.pipeline_degree;
  }
  return out;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 10;
  bool use_cache = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-cache") && i + 1 < argc)
      use_cache = std::atoi(argv[++i]) == 0;
    else
      iterations = std::max(1, std::atoi(argv[i]));
  }
  // Largest entry: k * P * E * 4 bytes = 2 * 64 * 128 * 4 = 64 KiB; the whole grid's 540
  // (shape, iteration) entries fit in ~20 MiB.
  workload::SampleCache cache(std::size_t{64} << 20);
  // Configurations are independent: split them over the cores (each thread has its own
  // topology); results are gathered by index, so the output does not depend on the threads.
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  const auto t0 = std::chrono::steady_clock::now();
  int runs = 0;
  for (int gpus : {16, 32, 64}) {
    const Scenario sc = base_scenario(gpus);
    sim::EngineConfig cfg;
    cfg.network = sim::NetworkKind::kAnalytical;
    cfg.net = strategies::scenario_network_params(sc);
    cfg.compute.launch_overhead = sc.engine.launch_overhead;
    cfg.compute.max_gemm_efficiency = strategies::scenario_gemm_ceiling(sc);
    cfg.precision = sc.model.dtype;
    std::vector<Config> grid;
    for (int b : {2, 4, 8})
      for (int l : {512, 1024, 2048})
        for (int m : {1024, 2048, 4096, 8192})
          for (int h : {1024, 2048, 4096, 8192})
            for (int de : {1, 2}) grid.push_back({b, l, m, h, de});
    std::vector<Outcome> out(grid.size());
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const auto topo = topology::build_topology(sc.cluster);
        for (size_t i = t; i < grid.size(); i += threads)
          out[i] = run_config(sc, *topo, cfg, grid[i], iterations, use_cache ? &cache : nullptr);
      });
    for (auto& th : pool) th.join();
    std::map<std::string, std::vector<double>> speedup;
    std::map<int, int> degrees;
    for (const auto& o : out) {
      runs += o.iterations;
      for (const auto& [name, x] : o.speedup) speedup[name].push_back(x);
      ++degrees[o.pipemoe_degree];
    }
    fmt::print("P = {:2} ({} configurations):", gpus, grid.size());
    for (const auto& [name, v] : speedup)
      fmt::print("  {} median {:.2f}x max {:.2f}x;", name, median(v),
                 *std::max_element(v.begin(), v.end()));
    fmt::print("\n         pipemoe degrees:");
    for (const auto& [r, n] : degrees) fmt::print(" r={}:{}", r, n);
    fmt::print("\n");
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(
      "total: {} iterations simulated on {} threads, wall {:.2f} s, CPU {:.2f} s (target <= 5 s); "
      "sample cache {} hits, {} misses\n",
      runs, threads, wall, cpu_seconds(), cache.hits(), cache.misses());
  return 0;
}
