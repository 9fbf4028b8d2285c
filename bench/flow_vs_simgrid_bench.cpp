// flow_vs_simgrid_bench: the same linear all-to-all run by the `flow` model and by the `simgrid`
// reference in one invocation; prints both wall times, both simulated times, the speedup of flow
// over simgrid (target >= 50x) and their relative difference (target within 1%).
//
// Default case (the issue's): 1,024 GPUs = 128 nodes x 8 A100, NVSwitch 300 GB/s per GPU, 8 x
// 200 Gb/s NICs per node, non-blocking fat tree (topology::build_topology), 128 MiB per GPU (each
// GPU sends 128 MiB / 1,024 to every other GPU: one batch of 1,047,552 transfers).
//
// SimGrid allows one engine per process, so simgrid runs once per invocation; run the binary
// several times for medians. flow runs --repeat times (median reported).
//
// Usage: flow_vs_simgrid_bench [--nodes N] [--size-mib S] [--mode auto|ptask|per_flow]
//                              [--topology fat_tree|switch] [--repeat N] [--skew]
//   --skew replaces the uniform all-to-all by a Zipf-like one (destination popularity
//   ~ 1 / (rank + 1)^1.2, same total bytes), where ptask and per-flow sharing differ.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/units.hpp"
#include "sim/flow_model.hpp"
#include "sim/simgrid_model.hpp"
#include "topology/topology.hpp"

namespace {

using moesim::sim::NetworkModel;
using moesim::sim::Transfer;

struct Options {
  int nodes = 128;
  double size_mib = 128;
  std::string mode = "auto";
  std::string topology = "fat_tree";
  int repeat = 3;
  bool skew = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--nodes")) {
      o.nodes = std::atoi(next());
    } else if (!std::strcmp(argv[i], "--size-mib")) {
      o.size_mib = std::atof(next());
    } else if (!std::strcmp(argv[i], "--mode")) {
      o.mode = next();
    } else if (!std::strcmp(argv[i], "--topology")) {
      o.topology = next();
    } else if (!std::strcmp(argv[i], "--repeat")) {
      o.repeat = std::max(1, std::atoi(next()));
    } else if (!std::strcmp(argv[i], "--skew")) {
      o.skew = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--nodes N] [--size-mib S] [--mode auto|ptask|per_flow] "
                   "[--topology fat_tree|switch] [--repeat N] [--skew]\n",
                   argv[0]);
      std::exit(2);
    }
  }
  return o;
}

moesim::ClusterSpec make_spec(const Options& o) {
  moesim::ClusterSpec s;
  s.gpu.name = "a100-sxm-80gb";
  s.gpu.from_catalog = true;
  s.nodes = o.nodes;
  s.gpus_per_node = 8;
  s.intra.kind = moesim::IntraKind::kNvswitch;
  s.intra.bandwidth = moesim::BytesPerSecond(300e9);
  s.intra.latency = moesim::Seconds(1e-6);
  s.inter.kind = o.topology == "switch" ? moesim::InterKind::kSwitch : moesim::InterKind::kFatTree;
  s.inter.nic_bandwidth = moesim::BytesPerSecond(200e9 / 8);
  s.inter.nics_per_node = 8;
  s.inter.latency = moesim::Seconds(2e-6);
  s.inter.oversubscription = 1.0;
  return s;
}

std::vector<Transfer> all_to_all(int p, double bytes_per_gpu, bool skew) {
  std::vector<Transfer> out;
  out.reserve(static_cast<std::size_t>(p) * (p - 1));
  std::vector<double> weight(p, 1.0);
  if (skew) {
    double sum = 0;
    for (int r = 0; r < p; ++r) sum += weight[r] = 1.0 / std::pow(1.0 + r, 1.2);
    for (double& w : weight) w *= p / sum;  // same total bytes as the uniform case
  }
  for (int s = 0; s < p; ++s) {
    for (int d = 0; d < p; ++d) {
      if (s == d) continue;
      // Skewed: destination (d - s) mod p has rank r, so every GPU sends its hottest traffic to a
      // different GPU and the receive side is as skewed as the send side.
      const int r = skew ? (d - s + p) % p : 0;
      out.push_back({s, d, std::round(bytes_per_gpu / p * weight[r])});
    }
  }
  return out;
}

/// Runs one batch to completion; returns the simulated completion time.
double run_batch(NetworkModel& m, const std::vector<Transfer>& batch) {
  m.start_batch(0.0, batch);
  double done = -1;
  int steps = 0;
  while (done < 0) {
    const double t = m.next_completion_time();
    if (t == NetworkModel::kNever) break;
    for (const auto& c : m.advance_to(t)) done = c.time_s;
    ++steps;
  }
  return done;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows up when piped
  const Options o = parse(argc, argv);
  const auto spec = make_spec(o);
  auto t0 = std::chrono::steady_clock::now();
  const auto topo = moesim::topology::build_topology(spec);
  const double build_s = seconds_since(t0);
  const int p = topo->num_gpus();
  const double bytes_per_gpu = o.size_mib * 1024 * 1024;
  const auto batch = all_to_all(p, bytes_per_gpu, o.skew);
  const moesim::sim::NetworkParams params{};  // pure bandwidth/latency: no per-message cost
  std::printf(
      "case: %s linear all-to-all, %d GPUs (%d nodes x 8), %s, %.0f MiB per GPU, %zu "
      "transfers; topology built in %.3f s\n",
      o.skew ? "skewed (Zipf 1.2)" : "uniform", p, o.nodes, o.topology.c_str(), o.size_mib,
      batch.size(), build_s);

  std::vector<double> flow_wall;
  double flow_time = 0;
  for (int r = 0; r < o.repeat; ++r) {
    t0 = std::chrono::steady_clock::now();
    moesim::sim::FlowModel flow(*topo, params);
    flow_time = run_batch(flow, batch);
    flow_wall.push_back(seconds_since(t0));
  }
  std::sort(flow_wall.begin(), flow_wall.end());
  const double flow_median = flow_wall[flow_wall.size() / 2];

  std::printf("flow    : wall %.3f s (median of %d: min %.3f max %.3f), simulated %.6f ms\n",
              flow_median, o.repeat, flow_wall.front(), flow_wall.back(), flow_time * 1e3);
  t0 = std::chrono::steady_clock::now();
  moesim::sim::SimgridModel sg(*topo, params, {moesim::sim::parse_simgrid_mode(o.mode)});
  const double sg_setup_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  const double sg_time = run_batch(sg, batch);
  const double sg_run_s = seconds_since(t1);
  const double sg_wall = sg_setup_s + sg_run_s;

  const double nic_bound = bytes_per_gpu * (p - 8) / p / (200e9 / 8);
  std::printf(
      "simgrid : wall %.3f s (platform %.3f s + run %.3f s, mode %s, %lld activities), "
      "simulated %.6f ms\n",
      sg_wall, sg_setup_s, sg_run_s, std::string(moesim::sim::simgrid_mode_name(sg.mode())).c_str(),
      static_cast<long long>(sg.num_activities_started()), sg_time * 1e3);
  std::printf("NIC bound (uniform case): %.6f ms\n", nic_bound * 1e3);
  std::printf("speedup flow vs simgrid: %.1fx (target >= 50x)\n", sg_wall / flow_median);
  std::printf("relative difference |simgrid - flow| / flow: %.4f%% (target <= 1%%)\n",
              100.0 * std::abs(sg_time - flow_time) / flow_time);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flow_vs_simgrid_bench: %s\n", e.what());
  return 1;
}
