// Scenarios for the strategy tests, written as YAML so they go through the real loader.
#pragma once

#include <fmt/format.h>

#include <string>

#include "core/plan.hpp"
#include "core/run_result.hpp"
#include "core/scenario.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::strategies::testing {

struct ClusterShape {
  std::string gpu = "rtx-2080-ti";
  int nodes = 2;
  int gpus_per_node = 4;
  std::string intra = "{kind: nvswitch, bandwidth: 100GB/s, latency: 1us}";
  std::string nic = "100Gb/s";
  int nics_per_node = 1;
};

struct ModelShape {
  std::string mode = "training";
  int batch = 4, seq = 512, model_dim = 1024, hidden_dim = 1024;
  int experts_per_gpu = 1;
  int top_k = 2;
  double f = 1.0;
  std::string capacity = "{kind: fixed}";
};

/// One iteration's workload built by hand (uniform routing, nothing dropped): every MoE layer has
/// dC = `capacity` slots per (GPU, expert) of sc's GPUs, all of them filled.
inline workload::IterationWorkload uniform_work(const Scenario& sc, std::int64_t capacity) {
  workload::IterationWorkload w;
  w.capacity_factor = sc.model.capacity_factor;
  for (int i = 0; i < sc.model.num_moe_layers(); ++i) {
    workload::LayerDispatch ld;
    ld.num_gpus = sc.num_gpus();
    ld.num_experts = sc.num_experts();
    ld.top_k = sc.model.top_k;
    ld.capacity_factor = sc.model.capacity_factor;
    ld.capacity = capacity;
    ld.kept.assign(static_cast<size_t>(ld.num_gpus) * ld.num_experts,
                   static_cast<std::uint32_t>(capacity));
    ld.demanded = ld.kept;
    w.layers.push_back(std::move(ld));
  }
  return w;
}

inline Scenario make_scenario(const ClusterShape& c, const ModelShape& m,
                              const std::string& strategies, const std::string& network = "flow") {
  const std::string yaml = fmt::format(
      R"(name: strategy-test
cluster:
  gpu: {}
  nodes: {}
  gpus_per_node: {}
  intra_node: {}
  inter_node: {{kind: switch, nic_bandwidth: {}, nics_per_node: {}, latency: 2us}}
model:
  mode: {}
  layers: 1
  moe_every: 1
  batch_per_gpu: {}
  seq_len: {}
  model_dim: {}
  hidden_dim: {}
  experts_per_gpu: {}
  top_k: {}
  capacity_factor: {}
  dtype: fp16
parallelism: {{ep: {}, esp: 1, mp: 1, dp: auto}}
workload:
  routing: {{distribution: uniform, seed: 3}}
  capacity: {}
  iterations: 4
engine: {{network: {}}}
strategies:
{}
)",
      c.gpu, c.nodes, c.gpus_per_node, c.intra, c.nic, c.nics_per_node, m.mode, m.batch, m.seq,
      m.model_dim, m.hidden_dim, m.experts_per_gpu, m.top_k, m.f, c.nodes * c.gpus_per_node,
      m.capacity, network, strategies);
  return parse_scenario_string(yaml, "strategy-test.yaml");
}

/// The engine configuration the CLI derives from a scenario (apps/moesim/engine_setup.cpp).
inline sim::EngineConfig engine_config(const Scenario& sc) {
  sim::EngineConfig cfg;
  cfg.network = sc.engine.network == NetworkModelKind::kAnalytical ? sim::NetworkKind::kAnalytical
                                                                   : sim::NetworkKind::kFlow;
  cfg.net = strategies::scenario_network_params(sc);
  cfg.compute.launch_overhead = sc.engine.launch_overhead;
  cfg.compute.interference = strategies::scenario_interference(sc);
  cfg.precision = sc.model.dtype;
  return cfg;
}

/// A backend that runs nothing: every op takes 1 ms from t = 0 (for tests of decisions and plan
/// structure, where no timing matters).
inline RunResult instant_backend(const Plan& p) {
  RunResult r;
  init_run_result(p, r);
  for (size_t i = 0; i < r.start_s.size(); ++i) r.start_s[i] = 0, r.end_s[i] = 1e-3;
  summarize_run(p, r);
  return r;
}

}  // namespace moesim::strategies::testing
