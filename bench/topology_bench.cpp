// topology_bench: build + tier table + bisection of three 4,096-GPU clusters and three of about
// 32,768 GPUs (a 3-level fat tree, a rail-optimised fabric, 456 GB200 NVL72 racks), and the cost
// of route() on the hot path. Each cluster runs in a forked child so that its peak RSS is its own.
//
//   build-*/bench/topology_bench [--repeats N]
//
// Targets: <= 2 s and <= 1 GiB per 4,096-GPU cluster, <= 10 s and <= 2 GiB per 32k-GPU one
// (build + tier table + bisection).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/cluster_spec.hpp"
#include "topology/topology.hpp"

namespace {

using moesim::ClusterSpec;
using moesim::topology::Topology;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

/// 512 nodes x 8 A100 on NVSwitch 300 GB/s, 8 x 200 Gb/s NICs per node.
ClusterSpec base_spec() {
  ClusterSpec s;
  s.gpu.name = "a100-sxm-80gb";
  s.nodes = 512;
  s.gpus_per_node = 8;
  s.intra.kind = moesim::IntraKind::kNvswitch;
  s.intra.bandwidth = moesim::BytesPerSecond(300e9);
  s.intra.latency = moesim::Seconds(1e-6);
  s.inter.nic_bandwidth = moesim::BytesPerSecond(200e9 / 8);
  s.inter.nics_per_node = 8;
  s.inter.latency = moesim::Seconds(2e-6);
  s.inter.switch_radix = 64;
  return s;
}

void run_cluster(const char* label, const ClusterSpec& spec, int repeats, bool routes) {
  std::vector<double> build_s, tiers_s, bisect_s, total_s;
  std::unique_ptr<Topology> topo;
  std::size_t num_tiers = 0;
  double bisection = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = Clock::now();
    topo = moesim::topology::build_topology(spec);
    build_s.push_back(seconds_since(t0));
    auto t1 = Clock::now();
    num_tiers = topo->tier_table().size();
    tiers_s.push_back(seconds_since(t1));
    auto t2 = Clock::now();
    bisection = topo->bisection_bandwidth().value();
    bisect_s.push_back(seconds_since(t2));
    total_s.push_back(seconds_since(t0));
  }
  int switches = 0;
  for (const auto& v : topo->vertices())
    switches += v.kind == moesim::topology::VertexKind::kSwitch;
  std::printf(
      "%-10s gpus=%d vertices=%zu switches=%d links=%zu tiers=%zu bisection=%.1f GB/s\n"
      "           median of %d: build %.3f s  tier_table %.3f s  bisection %.3f s  total %.3f s"
      "  peak RSS %.0f MiB\n",
      label, topo->num_gpus(), topo->vertices().size(), switches, topo->links().size(), num_tiers,
      bisection / 1e9, repeats, median(build_s), median(tiers_s), median(bisect_s), median(total_s),
      peak_rss_mib());
  if (!routes) return;
  // 1e6 random (src, dst) pairs, generated up front so only route() is timed.
  constexpr int kCalls = 1000000;
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> pick(0, topo->num_gpus() - 1);
  std::vector<std::pair<int, int>> pairs(kCalls);
  for (auto& p : pairs) {
    do {
      p = {pick(rng), pick(rng)};
    } while (p.first == p.second);
  }
  std::vector<double> route_s;
  std::size_t links = 0;
  std::vector<moesim::topology::LinkId> out;
  out.reserve(64);
  for (int r = 0; r < repeats; ++r) {
    links = 0;
    auto t0 = Clock::now();
    for (const auto& [s, d] : pairs) {
      out.clear();
      topo->route(s, d, out);
      links += out.size();
    }
    route_s.push_back(seconds_since(t0));
  }
  std::printf(
      "           1e6 random route() calls: median %.3f s (%.0f ns/call, %.2f links/route)\n",
      median(route_s), median(route_s) * 1e9 / kCalls, static_cast<double>(links) / kCalls);
}

/// Runs fn in a child process so its peak RSS is measured alone.
void isolated(const std::function<void()>& fn) {
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    fn();
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "benchmark child failed\n");
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 3;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::max(1, std::atoi(argv[i + 1]));
  }
  isolated([&] {
    ClusterSpec s = base_spec();
    s.inter.kind = moesim::InterKind::kFatTree;  // radix 64 -> 3 levels for 4,096 NICs
    run_cluster("fat_tree", s, repeats, true);
  });
  isolated([&] {
    ClusterSpec s = base_spec();
    s.inter.kind = moesim::InterKind::kDragonfly;
    s.inter.groups = 16;  // 32 nodes per group; auto routers: 256 NICs / 16 terminals = 16
    run_cluster("dragonfly", s, repeats, true);
  });
  isolated([&] {
    ClusterSpec s = base_spec();
    s.inter.kind = moesim::InterKind::kRailOptimized;
    run_cluster("rail", s, repeats, false);
  });
  // About 32k GPUs: 4,096 nodes of 8 on a 3-level fat tree and on rails; 456 NVL72 racks (one
  // 72-GPU NVLink domain each, one 800 Gb/s NIC per GPU) on a radix-64 fat tree.
  isolated([&] {
    ClusterSpec s = base_spec();
    s.nodes = 4096;
    s.inter.kind = moesim::InterKind::kFatTree;
    run_cluster("fat_tree32k", s, repeats, true);
  });
  isolated([&] {
    ClusterSpec s = base_spec();
    s.nodes = 4096;
    s.inter.kind = moesim::InterKind::kRailOptimized;
    run_cluster("rail32k", s, repeats, false);
  });
  isolated([&] {
    ClusterSpec s = base_spec();
    s.gpu.name = "gb200";
    s.nodes = 456;
    s.gpus_per_node = 72;
    s.intra.bandwidth = moesim::BytesPerSecond(900e9);
    s.inter.nic_bandwidth = moesim::BytesPerSecond(800e9 / 8);
    s.inter.nics_per_node = 72;
    s.inter.kind = moesim::InterKind::kFatTree;
    run_cluster("nvl72x456", s, repeats, false);
  });
  return 0;
}
