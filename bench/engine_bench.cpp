// engine_bench: the discrete-event engine (sim::run_plan) on 4,096 GPUs (512 nodes x 8 A100,
// NVSwitch + 3-level fat tree). Each case runs in a forked child so its peak RSS is its own; the
// figures are medians over --repeats runs (default 3).
//
//   build-*/bench/engine_bench [--repeats N] [--case NAME] [--layers L]
//
// Cases: a training-step-like plan of L MoE layers (gate -> dispatch a2a -> expert GEMM ->
// combine a2a, then a DP allreduce of the layer's dense gradients on a second stream):
//   analytical_ep8   8 layers, EP groups of 8 (512 groups per collective), analytical network
//   analytical_ep64  8 layers, EP groups of 64 (64 groups; DP groups of 64), analytical network
//   flow_ep8         2 layers of the ep8 plan on the flow network (lowered phases, contention)
//   analytical_ep8_interf  analytical_ep8 with interference 0.2 (compute slows while comm runs)
//   flow_ep64        1 layer of the ep64 plan on the flow network
// Run time on the flow network is dominated by FlowModel (water-filling over the concurrent
// all-to-all and ring-allreduce flows). flow_ep64 did not finish in minutes while fat trees used
// hash ECMP (every uplink a slightly different load: about one event per flow); with the d-mod-k
// default it takes seconds.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/plan.hpp"
#include "sim/engine.hpp"
#include "topology/topology.hpp"

namespace {

using namespace moesim;

ClusterSpec cluster() {
  ClusterSpec s;
  s.gpu.name = "a100-sxm-80gb";
  s.nodes = 512;
  s.gpus_per_node = 8;
  s.intra.kind = IntraKind::kNvswitch;
  s.intra.bandwidth = BytesPerSecond(300e9);
  s.intra.latency = Seconds(1e-6);
  s.inter.kind = InterKind::kFatTree;
  s.inter.nic_bandwidth = BytesPerSecond(200e9 / 8);
  s.inter.nics_per_node = 8;
  s.inter.latency = Seconds(2e-6);
  s.inter.switch_radix = 64;
  return s;
}

Plan moe_plan(int p, int ep, int layers) {
  Plan plan(p);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  auto sa = plan.stream("comm2");
  Grouping epg{"ep", {}}, dpg{"dp", {}};
  for (int g = 0; g < p / ep; ++g) {
    epg.groups.push_back({});
    for (int i = 0; i < ep; ++i) epg.groups.back().push_back(g * ep + i);
  }
  for (int i = 0; i < ep; ++i) {
    dpg.groups.push_back({});
    for (int g = 0; g < p / ep; ++g) dpg.groups.back().push_back(g * ep + i);
  }
  GroupingId ge = plan.add_grouping(epg), gd = plan.add_grouping(dpg);
  // Tokens per GPU 16,384 x model dim 2,048 in fp16 = 64 MiB per all-to-all; skewed expert load.
  std::vector<float> scale(p);
  for (int r = 0; r < p; ++r) scale[r] = 0.75f + 0.5f * static_cast<float>((r * 37) % 11) / 10.0f;
  auto skew = std::make_shared<std::vector<float>>(scale);
  OpId prev = -1;
  for (int l = 0; l < layers; ++l) {
    std::string L = "L" + std::to_string(l);
    ComputeSpec gate;
    gate.cls = ComputeClass::kGate;
    gate.gemm = GemmShape{16384, 64, 2048, 1};
    std::vector<OpId> deps;
    if (prev >= 0) deps.push_back(prev);
    OpId g = plan.add_compute(RankSet::all(p), sc, gate, deps, L + ".gate");
    CollectiveSpec a2a;
    a2a.type = CollectiveType::kAllToAll;
    a2a.grouping = ge;
    a2a.bytes = Bytes(64.0 * 1024 * 1024);
    OpId d = plan.add_collective(sm, a2a, {g}, L + ".dispatch");
    ComputeSpec expert;
    expert.cls = ComputeClass::kGemm;
    expert.gemm = GemmShape{16384, 8192, 2048, 1};
    expert.rank_scale = skew;
    OpId e = plan.add_compute(RankSet::all(p), sc, expert, {d}, L + ".expert");
    prev = plan.add_collective(sm, a2a, {e}, L + ".combine");
    CollectiveSpec ar;
    ar.type = CollectiveType::kAllReduce;
    ar.grouping = gd;
    ar.bytes = Bytes(16.0 * 1024 * 1024);
    plan.add_collective(sa, ar, {g}, L + ".allreduce");
  }
  return plan;
}

struct Case {
  const char* name;
  sim::NetworkKind net;
  int ep, layers;
  double interference;
  bool by_default;
};

struct Figures {
  double wall_s, build_s, rss_mib, makespan_s, events;
};

Figures run_case(const Case& c) {
  auto t0 = std::chrono::steady_clock::now();
  auto topo = topology::build_topology(cluster());
  Plan plan = moe_plan(topo->num_gpus(), c.ep, c.layers);
  double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sim::EngineConfig cfg;
  cfg.network = c.net;
  cfg.compute.interference = c.interference;
  RunResult r = sim::run_plan(plan, *topo, cfg);
  return {r.wall_s, build_s, static_cast<double>(r.peak_rss_bytes) / (1024.0 * 1024.0),
          r.makespan_s, static_cast<double>(r.num_events)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line per case as it finishes
  int repeats = 3;
  int layers = 0;  // 0 = each case's own
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--case") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) layers = std::atoi(argv[++i]);
  }
  const Case cases[] = {
      {"analytical_ep8", sim::NetworkKind::kAnalytical, 8, 8, 0, true},
      {"analytical_ep64", sim::NetworkKind::kAnalytical, 64, 8, 0, true},
      {"flow_ep8", sim::NetworkKind::kFlow, 8, 2, 0, true},
      {"analytical_ep8_interf", sim::NetworkKind::kAnalytical, 8, 8, 0.2, true},
      {"flow_ep64", sim::NetworkKind::kFlow, 64, 1, 0, true},
  };
  std::printf("%-22s %10s %10s %10s %12s %12s  (4,096 GPUs, medians of %d)\n", "case", "run_s",
              "setup_s", "rss_MiB", "events", "step_ms", repeats);
  for (Case c : cases) {
    if (only.empty() ? !c.by_default : only != c.name) continue;
    if (layers > 0) c.layers = layers;
    std::vector<double> wall, build, rss, span, events;
    for (int k = 0; k < repeats; ++k) {
      int fds[2];
      if (pipe(fds) != 0) return 1;
      pid_t pid = fork();
      if (pid == 0) {
        close(fds[0]);
        Figures f{};
        try {
          f = run_case(c);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s: %s\n", c.name, e.what());
          _exit(1);
        }
        if (write(fds[1], &f, sizeof f) != sizeof f) _exit(1);
        _exit(0);
      }
      close(fds[1]);
      Figures f{};
      bool ok = read(fds[0], &f, sizeof f) == sizeof f;
      close(fds[0]);
      int status = 0;
      waitpid(pid, &status, 0);
      if (!ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::printf("%-22s failed\n", c.name);
        break;
      }
      wall.push_back(f.wall_s);
      build.push_back(f.build_s);
      rss.push_back(f.rss_mib);
      span.push_back(f.makespan_s);
      events.push_back(f.events);
    }
    if (wall.empty()) continue;
    std::printf("%-22s %10.3f %10.3f %10.0f %12.0f %12.4f\n", c.name, median(wall), median(build),
                median(rss), median(events), median(span) * 1e3);
  }
  return 0;
}
