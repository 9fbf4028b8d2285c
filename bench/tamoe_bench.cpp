// tamoe_bench: TA-MoE target solver figures:
//  - the target pattern of a 4,096-GPU fat tree (scenarios/fat-tree-a100-4096.yaml; pair costs +
//    solve; target <= 10 s);
//  - the exact per-GPU max-flow on an asymmetric 256-GPU tree (32 nodes x 8 on [[8,8],[8,4],[4]],
//    the symmetric fast path off; target <= 2 s).
// Each case runs --repeats times (default 3) and prints every wall time and the median.
//   tamoe_bench [--repeats N] [--scenario FILE]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/scenario_loader.hpp"
#include "strategies/routing/target.hpp"
#include "topology/topology.hpp"

using namespace moesim;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_case(const std::string& label, const Scenario& sc, bool allow_symmetric, int repeats) {
  const auto topo = topology::build_topology(sc.cluster);
  // EP group 0 under the plan builder's rank map: (d, s, t) = 0, rank = e * esp * mp.
  std::vector<int> ranks;
  for (int e = 0; e < sc.parallelism.ep; ++e)
    ranks.push_back(e * sc.parallelism.esp * sc.parallelism.mp);
  const std::int64_t supply = sc.model.tokens_per_gpu() * sc.model.top_k;
  const double b = static_cast<double>(sc.model.model_dim) * sc.bytes_per_element();
  routing::TargetOptions opt;
  opt.allow_symmetric = allow_symmetric;
  std::vector<double> costs_s, solve_s, total_s;
  routing::TargetPattern t;
  std::size_t classes = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const routing::PairCostMatrix costs = routing::pair_costs(*topo, ranks);
    const auto t1 = std::chrono::steady_clock::now();
    t = routing::solve_target(costs, supply, b, 0.1, opt);
    const auto t2 = std::chrono::steady_clock::now();
    classes = costs.classes.size();
    costs_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    solve_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    total_s.push_back(std::chrono::duration<double>(t2 - t0).count());
  }
  fmt::print("{}\n  {} GPUs, {} cost classes, method {}, {} max-flow solves\n", label, ranks.size(),
             classes, routing::target_method_name(t.method), t.iterations);
  fmt::print("  predicted all-to-all: even {:.3f} ms, target {:.3f} ms ({:.2f}x)\n",
             1e3 * t.even_time_s, 1e3 * t.time_s, t.time_s > 0 ? t.even_time_s / t.time_s : 0);
  auto list = [](const std::vector<double>& v) {
    std::string s;
    for (double x : v) s += fmt::format("{}{:.3f}", s.empty() ? "" : " ", x);
    return s;
  };
  fmt::print("  pair costs [s]: {}  median {:.3f}\n", list(costs_s), median(costs_s));
  fmt::print("  solve      [s]: {}  median {:.3f}\n", list(solve_s), median(solve_s));
  fmt::print("  total      [s]: {}  median {:.3f}\n", list(total_s), median(total_s));
}

const char* kAsym256 = R"(name: tamoe-asym-256
cluster:
  gpu: a100-sxm-80gb
  nodes: 32
  gpus_per_node: 8
  intra_node: {kind: nvswitch, bandwidth: 300GB/s, latency: 1us}
  inter_node:
    kind: tree
    nic_bandwidth: 200Gb/s
    nics_per_node: 8
    latency: 2us
    tree: [[8, 8], [8, 4], [4]]
    tree_level_bandwidth: [800Gb/s, 800Gb/s]
model: {mode: training, layers: 1, moe_every: 1, batch_per_gpu: 8, seq_len: 1024, model_dim: 2048,
        hidden_dim: 2048, experts_per_gpu: 1, top_k: 2, capacity_factor: 1.0, dtype: fp16}
parallelism: {ep: 256, esp: 1, mp: 1, dp: auto}
strategies:
  - {name: ta_moe, routing: ta_moe}
)";

}  // namespace

int main(int argc, char** argv) {
  int repeats = 3;
  std::string scenario = std::string(MOESIM_SOURCE_DIR) + "/scenarios/fat-tree-a100-4096.yaml";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc)
      repeats = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--scenario") && i + 1 < argc)
      scenario = argv[++i];
    else {
      fmt::print(stderr, "usage: tamoe_bench [--repeats N] [--scenario FILE]\n");
      return 2;
    }
  }
  run_case("asymmetric 256-GPU tree, exact per-GPU max-flow (target <= 2 s)",
           parse_scenario_string(kAsym256, "tamoe-asym-256.yaml"), false, repeats);
  run_case(fmt::format("{} (target <= 10 s)", scenario), load_scenario(scenario), true, repeats);
  return 0;
}
