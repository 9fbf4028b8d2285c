// schedules_bench: Parm's configuration grid x 4 schedules (parm_baseline, parm_s1, parm_s2,
// parm_auto) on the analytical engine, the same as scenarios/sweeps/parm-grid.yaml: P in
// {8, 16, 32} RTX 2080 Ti (4 per node, 100 Gb/s InfiniBand), N_MP, N_ESP in {1, 2, 4} (not both
// 1), B in {2, 4, 8}, L in {512, 1024, 2048}, M = H = v * N_ESP with v in {1024, 2048, 4096}
// (Parm's H / N_ESP and M / N_ESP), f in {1.2, 2.4}, top-2. Prints: wall time of the grid, how
// often auto picks the faster of S1 / S2 as simulated, S1 / S2 / auto speedups over the baseline
// (min, median, max), and the wall time of one 32-GPU case on the flow engine (median of 5).
// Then Lina on its testbed (scenarios/lina-a100-4x4.yaml shape, 2 MoE blocks, flow): step time,
// backward vs forward all-to-all time, chosen pipeline degree and expert pack, and the
// pipelining efficiency per schedule.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/runner.hpp"
#include "strategies/schedules/lina.hpp"
#include "topology/topology.hpp"

using namespace moesim;

namespace {

std::string yaml_of(int nodes, int mp, int esp, int B, int L, int v, double f,
                    const std::string& network) {
  return fmt::format(
      R"(name: parm-grid
cluster:
  gpu: rtx-2080-ti
  nodes: {}
  gpus_per_node: 4
  intra_node: {{kind: pcie, bandwidth: 16GB/s, latency: 2us}}
  inter_node: {{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}}
model:
  mode: training
  layers: 1
  moe_every: 1
  batch_per_gpu: {}
  seq_len: {}
  model_dim: {}
  hidden_dim: {}
  experts_per_gpu: 1
  top_k: 2
  capacity_factor: {}
  dtype: fp16
parallelism: {{ep: auto, esp: {}, mp: {}, dp: 1}}
workload:
  routing: {{distribution: uniform, seed: 1}}
  capacity: {{kind: fixed}}
  iterations: 1
engine: {{network: {}}}
strategies:
  - {{name: base, schedule: parm_baseline}}
  - {{name: s1, schedule: parm_s1}}
  - {{name: s2, schedule: parm_s2}}
  - {{name: auto, schedule: parm_auto}}
)",
      nodes, B, L, v * esp, v * esp, f, esp, mp, network);
}

sim::EngineConfig config_of(const Scenario& sc, bool flow) {
  sim::EngineConfig cfg;
  cfg.network = flow ? sim::NetworkKind::kFlow : sim::NetworkKind::kAnalytical;
  cfg.net = strategies::scenario_network_params(sc);
  cfg.compute.launch_overhead = sc.engine.launch_overhead;
  cfg.compute.interference = strategies::scenario_interference(sc);
  cfg.compute.max_gemm_efficiency = strategies::scenario_gemm_ceiling(sc);
  cfg.precision = sc.model.dtype;
  return cfg;
}

std::vector<double> run4(const Scenario& sc, const topology::Topology& topo, bool flow) {
  const sim::EngineConfig cfg = config_of(sc, flow);
  strategies::Backend backend = [&](const Plan& p) { return sim::run_plan(p, topo, cfg); };
  std::vector<double> t;
  for (const auto& spec : sc.strategies)
    t.push_back(strategies::run_stack(sc, spec, topo, backend, 1).iterations.at(0).step_time_s);
  return t;
}

double pct(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1) + 0.5)];
}

}  // namespace

int main() {
  std::map<int, std::unique_ptr<topology::Topology>> topos;
  int configs = 0, skipped = 0, auto_right = 0, s1_faster = 0, s2_faster = 0;
  int s1_beats_base = 0, s2_beats_base = 0;
  std::vector<double> sp1, sp2, spa, t_s1_wins, t_s2_wins;
  const auto w0 = std::chrono::steady_clock::now();
  for (int nodes : {2, 4, 8})
    for (int mp : {1, 2, 4})
      for (int esp : {1, 2, 4}) {
        if (mp == 1 && esp == 1) continue;  // Parm schedules are rejected there
        const int P = nodes * 4;
        if (P / (mp * esp) < 2) {  // E = ep < top_k
          skipped += 3 * 3 * 3 * 2;
          continue;
        }
        for (int B : {2, 4, 8})
          for (int L : {512, 1024, 2048})
            for (int v : {1024, 2048, 4096})
              for (double f : {1.2, 2.4}) {
                const Scenario sc =
                    parse_scenario_string(yaml_of(nodes, mp, esp, B, L, v, f, "analytical"), "g");
                auto& topo = topos[nodes];
                if (!topo) topo = topology::build_topology(sc.cluster);
                const auto t = run4(sc, *topo, false);
                ++configs;
                const double best = std::min(t[1], t[2]);
                auto_right += t[3] <= best * (1 + 1e-9) ? 1 : 0;
                (t[1] <= t[2] ? s1_faster : s2_faster) += 1;
                // T = k f B L / E (Parm's per-expert token count), E = P / (mp esp) here.
                const double T = 2 * f * B * L / static_cast<double>(sc.num_experts());
                (t[1] <= t[2] ? t_s1_wins : t_s2_wins).push_back(T);
                if (t[2] < t[1] && t_s2_wins.size() <= 3)
                  fmt::print(
                      "  S2 wins: P {} mp {} esp {} B {} L {} v {} f {} (T {:.0f}): {:.3f} vs "
                      "{:.3f} ms\n",
                      P, mp, esp, B, L, v, f, T, t[2] * 1e3, t[1] * 1e3);
                s1_beats_base += t[1] < t[0] ? 1 : 0;
                s2_beats_base += t[2] < t[0] ? 1 : 0;
                sp1.push_back(t[0] / t[1]);
                sp2.push_back(t[0] / t[2]);
                spa.push_back(t[0] / t[3]);
              }
      }
  const double grid_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  fmt::print(
      "Parm grid on analytical: {} configurations x 4 schedules in {:.2f} s wall ({} skipped: "
      "E < top_k)\n",
      configs, grid_s, skipped);
  fmt::print("  auto picks the faster of S1/S2: {} / {} = {:.1f}%  (S1 faster in {}, S2 in {})\n",
             auto_right, configs, 100.0 * auto_right / configs, s1_faster, s2_faster);
  if (!t_s1_wins.empty() && !t_s2_wins.empty())
    fmt::print("  T = k f B L / E where S1 wins: median {:.0f}; where S2 wins: median {:.0f}\n",
               pct(t_s1_wins, 0.5), pct(t_s2_wins, 0.5));
  fmt::print("  S1 < baseline in {} / {}, S2 < baseline in {} / {}\n", s1_beats_base, configs,
             s2_beats_base, configs);
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>*>{"S1", &sp1},
                                {"S2", &sp2},
                                {"auto", &spa}})
    fmt::print(
        "  speedup over baseline {:>4}: min {:.3f}  p10 {:.3f}  median {:.3f}  p90 {:.3f}  "
        "max {:.3f}\n",
        name, pct(*v, 0), pct(*v, 0.1), pct(*v, 0.5), pct(*v, 0.9), pct(*v, 1));

  // One 32-GPU case on flow (mp 2, esp 2, B 4, L 1024, v 2048, f 1.2): 4 schedules, wall each.
  const Scenario sc = parse_scenario_string(yaml_of(8, 2, 2, 4, 1024, 2048, 1.2, "flow"), "f");
  const auto topo = topology::build_topology(sc.cluster);
  std::vector<std::vector<double>> walls(4);
  std::vector<double> sim_t;
  for (int rep = 0; rep < 5; ++rep) {
    const sim::EngineConfig cfg = config_of(sc, true);
    strategies::Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
    sim_t.clear();
    for (size_t i = 0; i < sc.strategies.size(); ++i) {
      const auto a = std::chrono::steady_clock::now();
      const auto run = strategies::run_stack(sc, sc.strategies[i], *topo, backend, 1);
      walls[i].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
      sim_t.push_back(run.iterations.at(0).step_time_s);
    }
  }
  const char* names[] = {"baseline", "s1", "s2", "auto"};
  fmt::print("32-GPU case on flow (mp 2, esp 2, B 4, L 1024, M = H = 4096, f 1.2):\n");
  for (int i = 0; i < 4; ++i)
    fmt::print("  {:>8}: step {:.3f} ms simulated, wall median {:.1f} ms (of 5)\n", names[i],
               sim_t[i] * 1e3, pct(walls[i], 0.5) * 1e3);

  const std::string lina_yaml = R"(name: lina-bench
cluster:
  gpu: a100-sxm-40gb
  nodes: 4
  gpus_per_node: 4
  intra_node: {kind: nvswitch, bandwidth: 300GB/s, latency: 1us}
  inter_node: {kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}
model:
  mode: training
  layers: 2
  moe_every: 1
  batch_per_gpu: 8
  seq_len: 512
  model_dim: 2048
  hidden_dim: 8192
  experts_per_gpu: 1
  top_k: 2
  capacity_factor: 1.0
  dtype: fp16
parallelism: {ep: 8, esp: 1, mp: 1, dp: 2}
workload:
  routing: {distribution: uniform, seed: 1}
  capacity: {kind: fixed}
  iterations: 1
engine: {network: flow}
strategies:
  - {name: none}
  - {name: fair, schedule: fair, lina: {micro_op: 4MB}}
  - {name: between_a2a, schedule: between_a2a, lina: {micro_op: 4MB}}
  - {name: lina, schedule: lina, lina: {micro_op: 4MB, pack_experts: false}}
  - {name: lina_packed, schedule: lina, lina: {micro_op: 4MB, pack_experts: true}}
)";
  const Scenario lsc = parse_scenario_string(lina_yaml, "lina-bench.yaml");
  const auto ltopo = topology::build_topology(lsc.cluster);
  const sim::EngineConfig lcfg = config_of(lsc, true);
  strategies::Backend lback = [&](const Plan& p) { return sim::run_plan(p, *ltopo, lcfg); };
  fmt::print("Lina testbed (4x4 A100-40GB, 100Gb/s, ep 8 x dp 2, 2 MoE blocks, flow, 4 MB):\n");
  for (const auto& spec : lsc.strategies) {
    const auto a = std::chrono::steady_clock::now();
    const auto run = strategies::run_stack(lsc, spec, *ltopo, lback, 1);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    const auto& idx = run.last_plan.index;
    const auto& layer = idx.moe_layers.at(0);
    double fwd = 0, bwd = 0;
    for (const auto& rec : run.last_result.collectives) {
      const bool a2a =
          std::find(layer.dispatch.begin(), layer.dispatch.end(), rec.op) != layer.dispatch.end() ||
          std::find(layer.combine.begin(), layer.combine.end(), rec.op) != layer.combine.end();
      if (a2a) (rec.op >= layer.backward.front() ? bwd : fwd) += rec.end_s - rec.start_s;
    }
    const auto& d = run.iterations.at(0).decision;
    fmt::print(
        "  {:>12}: step {:8.3f} ms, layer-0 a2a bwd/fwd {:.3f}, r {:2d}, pack {}, "
        "pipelining efficiency {:.3f}, wall {:.0f} ms\n",
        spec.name, run.last_result.makespan_s * 1e3, bwd / fwd, d.pipeline_degree, d.expert_pack,
        strategies::schedules::pipelining_efficiency(run.last_plan.plan, idx, run.last_result),
        wall * 1e3);
  }
  return 0;
}
