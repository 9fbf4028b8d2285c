// collectives_bench: how fast the collective library's analytical model is (docs/design.md §4.1:
// the `analytical` engine and `auto` selection must sweep thousands of configurations). Target:
// >= 100,000 analytical evaluations per second of a 1,024-GPU all-to-all.
//
// Cluster: N nodes x 8 A100 on NVSwitch (300 GB/s per GPU), 8 x 200 Gb/s NICs per node,
// non-blocking fat tree, built with topology::build_topology. For 1,024 and 4,096 GPUs it prints
// the first (cold: builds and caches the per-group summary) evaluation time, then evaluations per
// second (median of --repeat runs of --evals evaluations, sizes varying 1 KiB..1 GiB) of linear,
// 2DH, and auto all-to-all and of ring all_reduce, and the time to lower a linear all-to-all
// without layout (16.8 M transfers at 4,096 GPUs).
//
// Usage: collectives_bench [--repeat N] [--evals N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "core/cluster_spec.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"

namespace {

using moesim::Bytes;
using moesim::BytesPerSecond;
using moesim::CollectiveAlgo;
using moesim::CollectiveSpec;
using moesim::CollectiveType;
using moesim::Seconds;
namespace col = moesim::collectives;
using Clock = std::chrono::steady_clock;

moesim::ClusterSpec make_spec(int nodes) {
  moesim::ClusterSpec spec;
  spec.gpu.name = "a100-sxm-80gb";
  spec.nodes = nodes;
  spec.gpus_per_node = 8;
  spec.intra.kind = moesim::IntraKind::kNvswitch;
  spec.intra.bandwidth = BytesPerSecond(300e9);
  spec.intra.latency = Seconds(1e-6);
  spec.inter.kind = moesim::InterKind::kFatTree;
  spec.inter.nic_bandwidth = BytesPerSecond(200e9 / 8);
  spec.inter.nics_per_node = 8;
  spec.inter.latency = Seconds(2e-6);
  spec.inter.oversubscription = 1.0;
  spec.inter.switch_radix = 64;
  return spec;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 3;
  int evals = 200000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--repeat") == 0) repeat = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--evals") == 0) evals = std::atoi(argv[i + 1]);
  }
  std::printf("%-6s %-22s %14s %16s\n", "gpus", "what", "cold (ms)", "evals/s (median)");
  for (int nodes : {128, 512}) {
    const auto topo = moesim::topology::build_topology(make_spec(nodes));
    const int w = topo->num_gpus();
    std::vector<int> group(w);
    std::iota(group.begin(), group.end(), 0);
    col::CostContext ctx;
    ctx.topo = topo.get();
    ctx.net.message_latency_s = 1e-6;
    ctx.net.message_overhead_s = 2e-6;

    struct Case {
      const char* name;
      CollectiveType type;
      CollectiveAlgo algo;
    };
    for (const Case& c :
         {Case{"all_to_all linear", CollectiveType::kAllToAll, CollectiveAlgo::kLinear},
          Case{"all_to_all 2dh", CollectiveType::kAllToAll, CollectiveAlgo::k2dh},
          Case{"all_to_all auto(select)", CollectiveType::kAllToAll, CollectiveAlgo::kAuto},
          Case{"all_reduce ring", CollectiveType::kAllReduce, CollectiveAlgo::kRing}}) {
      CollectiveSpec spec;
      spec.type = c.type;
      spec.algo = c.algo;
      spec.bytes = Bytes(128.0 * (1 << 20));
      col::CollectiveCall call;
      call.spec = &spec;
      call.group = &group;
      auto eval = [&]() {
        const col::Algorithm& a = c.algo == CollectiveAlgo::kAuto
                                      ? col::select_algorithm(call, ctx)
                                      : *col::find_algorithm(c.type, c.algo);
        return a.analytical_time(call, ctx).value();
      };
      auto t0 = Clock::now();
      double sink = eval();
      const double cold_ms = seconds_since(t0) * 1e3;
      std::vector<double> rates;
      for (int r = 0; r < repeat; ++r) {
        t0 = Clock::now();
        for (int i = 0; i < evals; ++i) {
          spec.bytes = Bytes(1024.0 * (1 << (i % 21)));  // 1 KiB .. 1 GiB
          sink += eval();
        }
        rates.push_back(evals / seconds_since(t0));
      }
      std::printf("%-6d %-22s %14.3f %16.0f   (checksum %.3g)\n", w, c.name, cold_ms, median(rates),
                  sink);
    }
    // Lowering cost (what the flow engine pays per collective), without layout.
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAll;
    spec.algo = CollectiveAlgo::kLinear;
    spec.bytes = Bytes(128.0 * (1 << 20));
    col::CollectiveCall call;
    call.spec = &spec;
    call.group = &group;
    call.with_layout = false;
    std::vector<double> times;
    size_t transfers = 0;
    for (int r = 0; r < repeat; ++r) {
      const auto t0 = Clock::now();
      const auto phases = col::find_algorithm(spec.type, spec.algo)->lower(call, *topo);
      times.push_back(seconds_since(t0));
      transfers = phases[0].transfers.size();
    }
    std::printf("%-6d %-22s %14.1f   (%zu transfers, median of %d)\n", w, "lower linear a2a (ms)",
                median(times) * 1e3, transfers, repeat);
  }
  return 0;
}
