// flow_bench: the `flow` network model at 4,096 GPUs (512 nodes x 8 A100, NVSwitch 300 GB/s per
// GPU, 8 x 200 Gb/s NICs per node, non-blocking fat tree).
//   linear all-to-all, 128 MiB per GPU: 16.8 M transfers in one batch (targets: <= 20 s wall,
//     <= 4 GiB peak RSS);
//   2DH of the same size as its two phases (intra-node, then inter-node between GPUs of the same
//     local index): target <= 5 s.
// Prints wall time (median of --repeat runs), peak RSS, simulated time against the analytical
// bottleneck bound (bytes crossing a NIC / NIC bandwidth), and where the wall time goes.
//
// Usage: flow_bench [--repeat N] [--nodes N] [--case all|a2a|2dh|skew] [--topology synthetic|built]
//                   [--tolerance REL]   (FlowModelOptions::event_tolerance; default a scenario's,
//                                       engine.flow.event_tolerance 3e-3; 1e-9 is exact)
//                   [--ecmp dmodk|hash|spray] (with --topology built: cluster.inter_node.ecmp,
//                   default dmodk as in the library)
//                   [--radix R]        (with --topology built: switch ports, default 64)
//                   [--overhead S]     (NetworkParams::message_overhead_s, default 0; the CLI's
//                                       engine.message_overhead default is 1e-6)
//   --topology built uses topology::build_topology (fat_tree) instead of the synthetic fat tree
//   defined here (same figures; the library picks its own fat-tree shape and ECMP routes).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/scenario.hpp"
#include "core/units.hpp"
#include "sim/flow_model.hpp"
#include "topology/topology.hpp"

namespace {

using moesim::BytesPerSecond;
using moesim::Seconds;
using moesim::sim::FlowModel;
using moesim::sim::NetworkModel;
using moesim::sim::Transfer;
using moesim::topology::LinkId;
using moesim::topology::VertexId;
using moesim::topology::VertexKind;

constexpr double kNvswitchBw = 300e9;   // per GPU per direction
constexpr double kPcieBw = 32e9;        // GPU <-> NIC (PCIe Gen4 x16)
constexpr double kNicBw = 200e9 / 8;    // 200 Gb/s
constexpr double kIntraLatency = 1e-6;  // GPU-NVSwitch-GPU
constexpr double kInterLatency = 2e-6;  // NIC-leaf-NIC

// Non-blocking two-level fat tree: one NIC per GPU; leaves of 32 NICs with 32 uplinks, one to
// each of 32 spines (radix 128). Routes: GPU-NVSwitch-GPU inside a node, else GPU-NIC-leaf
// [-spine-leaf]-NIC-GPU with the spine picked by destination NIC (D-mod-k, balanced for
// all-to-all). Link ids are grouped per kind, each direction a separate link.
class SyntheticFatTree : public moesim::topology::Topology {
 public:
  static moesim::ClusterSpec make_spec(int nodes) {
    moesim::ClusterSpec spec;
    spec.nodes = nodes;
    spec.gpus_per_node = 8;
    spec.intra.bandwidth = BytesPerSecond(kNvswitchBw);
    spec.intra.latency = Seconds(kIntraLatency);
    spec.inter.kind = moesim::InterKind::kFatTree;
    spec.inter.nic_bandwidth = BytesPerSecond(kNicBw);
    spec.inter.nics_per_node = 8;
    spec.inter.latency = Seconds(kInterLatency);
    return spec;
  }

  explicit SyntheticFatTree(int nodes) : Topology(make_spec(nodes)) {
    const int p = num_gpus();
    leaves_ = (p + kLeafDown - 1) / kLeafDown;
    auto vertex = [&](VertexKind kind, int node, int index, int level) {
      vertices_.push_back({kind, node, index, level, ""});
      return static_cast<VertexId>(vertices_.size() - 1);
    };
    std::vector<VertexId> gpu(p), nic(p), nvs(nodes), leaf(leaves_), spine(kSpines);
    for (int n = 0; n < nodes; ++n) nvs[n] = vertex(VertexKind::kNvswitch, n, 0, 0);
    for (int g = 0; g < p; ++g) gpu[g] = vertex(VertexKind::kGpu, g / 8, g, 0);
    for (int g = 0; g < p; ++g) nic[g] = vertex(VertexKind::kNic, g / 8, g % 8, 0);
    for (int l = 0; l < leaves_; ++l) leaf[l] = vertex(VertexKind::kSwitch, -1, l, 1);
    for (int s = 0; s < kSpines; ++s) spine[s] = vertex(VertexKind::kSwitch, -1, s, 2);
    gpu_vertex_ = gpu;
    gpus_per_nic_ = 1;
    auto cable = [&](VertexId a, VertexId b, double bw, double lat, int tier) {
      links_.push_back({a, b, BytesPerSecond(bw), Seconds(lat), tier});
      links_.push_back({b, a, BytesPerSecond(bw), Seconds(lat), tier});
      return static_cast<LinkId>(links_.size() - 2);  // a->b; b->a is +1
    };
    nvs_base_ = static_cast<LinkId>(links_.size());
    for (int g = 0; g < p; ++g) cable(gpu[g], nvs[g / 8], kNvswitchBw, kIntraLatency / 2, 0);
    pcie_base_ = static_cast<LinkId>(links_.size());
    for (int g = 0; g < p; ++g) cable(gpu[g], nic[g], kPcieBw, 0.0, 0);
    nic_base_ = static_cast<LinkId>(links_.size());
    for (int g = 0; g < p; ++g) cable(nic[g], leaf[g / kLeafDown], kNicBw, kInterLatency / 2, 1);
    trunk_base_ = static_cast<LinkId>(links_.size());
    for (int l = 0; l < leaves_; ++l) {
      for (int s = 0; s < kSpines; ++s) cable(leaf[l], spine[s], kNicBw, kInterLatency / 2, 2);
    }
  }

  void route(int src, int dst, std::vector<LinkId>& out) const override {
    if (src / 8 == dst / 8) {
      out.push_back(nvs_base_ + 2 * src);
      out.push_back(nvs_base_ + 2 * dst + 1);
      return;
    }
    out.push_back(pcie_base_ + 2 * src);
    out.push_back(nic_base_ + 2 * src);
    const int ls = src / kLeafDown, ld = dst / kLeafDown;
    if (ls != ld) {
      const int s = dst % kSpines;
      out.push_back(trunk_base_ + 2 * (ls * kSpines + s));
      out.push_back(trunk_base_ + 2 * (ld * kSpines + s) + 1);
    }
    out.push_back(nic_base_ + 2 * dst + 1);
    out.push_back(pcie_base_ + 2 * dst + 1);
  }

 private:
  static constexpr int kLeafDown = 32;
  static constexpr int kSpines = 32;
  int leaves_ = 0;
  LinkId nvs_base_ = 0, pcie_base_ = 0, nic_base_ = 0, trunk_base_ = 0;
};

double peak_rss_gib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is KiB on Linux
}

// User + system CPU seconds of this process (the machine may be shared: wall time alone misleads).
double cpu_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs phases one after another (each starts when the previous completes); returns sim time.
double run_phases(FlowModel& model, const std::vector<std::vector<Transfer>>& phases) {
  double now = 0;
  for (const auto& phase : phases) {
    model.start_batch(now, phase);
    const double t = model.next_completion_time();
    const auto done = model.advance_to(t);
    if (done.size() != 1) {
      std::fprintf(stderr, "unexpected completions\n");
      std::exit(1);
    }
    now = t;
  }
  return now;
}

struct CaseResult {
  double sim_s = 0;
  moesim::sim::FlowModelStats stats;
};

void print_stats(const moesim::sim::FlowModelStats& s) {
  std::printf(
      "    flows %lld (transfers %lld), events %lld, solves %lld (partial %lld, re-rated %lld "
      "flows), levels %lld (scan %lld), checkpoints %lld\n"
      "    wall: build %.2f s, advance %.2f s, solve %.2f s, checkpoint %.2f s\n",
      static_cast<long long>(s.flows), static_cast<long long>(s.transfers),
      static_cast<long long>(s.events), static_cast<long long>(s.solves),
      static_cast<long long>(s.partial_solves), static_cast<long long>(s.resolved_flows),
      static_cast<long long>(s.levels), static_cast<long long>(s.scan_levels),
      static_cast<long long>(s.checkpoints), s.build_s, s.advance_s, s.solve_s, s.checkpoint_s);
}

// The analytical bottleneck bound of phases run one after another: per phase, the most loaded
// NIC (bytes leaving or entering a node through it / NIC bandwidth) or NVSwitch port, plus the
// phase's longest route latency.
double bottleneck_bound(const moesim::topology::Topology& topo,
                        const std::vector<std::vector<Transfer>>& phases) {
  double total = 0;
  const int p = topo.num_gpus();
  for (const auto& phase : phases) {
    std::vector<double> nic_out(p), nic_in(p), nvs_out(p), nvs_in(p);
    bool inter = false;
    for (const Transfer& t : phase) {
      if (t.src == t.dst) continue;
      if (topo.node_of(t.src) == topo.node_of(t.dst)) {
        nvs_out[t.src] += t.bytes;
        nvs_in[t.dst] += t.bytes;
      } else {
        inter = true;
        nic_out[t.src] += t.bytes;
        nic_in[t.dst] += t.bytes;
      }
    }
    double worst = 0;
    for (int g = 0; g < p; ++g) {
      worst = std::max({worst, nic_out[g] / kNicBw, nic_in[g] / kNicBw, nvs_out[g] / kNvswitchBw,
                        nvs_in[g] / kNvswitchBw});
    }
    total += worst + (inter ? 2 * kInterLatency : kIntraLatency);
  }
  return total;
}

void bench_case(const std::string& name, int repeat,
                const std::function<std::vector<std::vector<Transfer>>()>& make,
                const moesim::topology::Topology& topo, moesim::sim::FlowModelOptions options,
                moesim::sim::NetworkParams params) {
  std::vector<double> walls, gens, cpus;
  CaseResult last;
  double bound_s = 0;
  for (int r = 0; r < repeat; ++r) {
    const double t0 = wall_now();
    const auto phases = make();
    const double t1 = wall_now();
    if (r == 0) bound_s = bottleneck_bound(topo, phases);
    const double t1b = wall_now();
    const double c1 = cpu_now();
    FlowModel model(topo, params, options);
    last.sim_s = run_phases(model, phases);
    const double t2 = wall_now();
    cpus.push_back(cpu_now() - c1);
    last.stats = model.stats();
    gens.push_back(t1 - t0);
    walls.push_back(t2 - t1b);
  }
  std::printf("%-26s sim %.6f s  bound %.6f s (%+.3f%%)  wall median %.2f s (gen %.2f s)  ",
              name.c_str(), last.sim_s, bound_s, 100.0 * (last.sim_s / bound_s - 1), median(walls),
              median(gens));
  std::printf("runs:");
  for (double w : walls) std::printf(" %.2f", w);
  std::printf("  cpu median %.2f s", median(cpus));
  std::printf("  peak RSS so far %.2f GiB\n", peak_rss_gib());
  print_stats(last.stats);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int repeat = 3, nodes = 512;
  std::string which = "all", topo_kind = "synthetic", ecmp = "dmodk";
  moesim::sim::FlowModelOptions options;
  // What a scenario runs with unless it sets engine.flow.event_tolerance.
  options.event_tolerance = moesim::EngineSpec{}.flow_event_tolerance;
  moesim::sim::NetworkParams params;
  int radix = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else if (a == "--nodes" && i + 1 < argc) {
      nodes = std::atoi(argv[++i]);
    } else if (a == "--case" && i + 1 < argc) {
      which = argv[++i];
    } else if (a == "--tolerance" && i + 1 < argc) {
      options.event_tolerance = std::atof(argv[++i]);
    } else if (a == "--ecmp" && i + 1 < argc) {
      ecmp = argv[++i];
    } else if (a == "--radix" && i + 1 < argc) {
      radix = std::atoi(argv[++i]);
    } else if (a == "--overhead" && i + 1 < argc) {
      params.message_overhead_s = std::atof(argv[++i]);
    } else if (a == "--topology" && i + 1 < argc) {
      topo_kind = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: flow_bench [--repeat N] [--nodes N] [--case all|a2a|2dh|skew]\n");
      return 2;
    }
  }
  std::unique_ptr<moesim::topology::Topology> topo_ptr;
  if (topo_kind == "built") {
    // The same cluster through the topology library's fat_tree builder (its own routing).
    moesim::ClusterSpec spec = SyntheticFatTree::make_spec(nodes);
    spec.gpu.name = "a100-sxm-80gb";
    spec.gpu.from_catalog = true;
    spec.inter.switch_radix = radix;
    if (ecmp == "dmodk") {
      spec.inter.ecmp = moesim::EcmpMode::kDmodk;
    } else if (ecmp == "hash") {
      spec.inter.ecmp = moesim::EcmpMode::kHash;
    } else if (ecmp == "spray") {
      spec.inter.ecmp = moesim::EcmpMode::kSpray;
    } else {
      std::fprintf(stderr, "flow_bench: --ecmp: found '%s', expected dmodk, hash or spray\n",
                   ecmp.c_str());
      return 2;
    }
    topo_ptr = moesim::topology::build_topology(spec);
  } else {
    topo_ptr = std::make_unique<SyntheticFatTree>(nodes);
  }
  const moesim::topology::Topology& topo = *topo_ptr;
  const int p = topo.num_gpus();
  const int gpn = topo.gpus_per_node();
  const double per_gpu = 128.0 * 1024 * 1024;
  const double chunk = per_gpu / p;
  std::printf(
      "flow_bench: %d GPUs (%d nodes x %d), %s topology%s, %zu directed links, 128 MiB per GPU, "
      "chunk %.0f B, repeat %d, event tolerance %g\n",
      p, nodes, gpn, topo_kind.c_str(),
      topo_kind == "built" ? (" (ecmp " + ecmp + ", radix " + std::to_string(radix) + ")").c_str()
                           : "",
      topo.links().size(), chunk, repeat, options.event_tolerance);

  if (which == "all" || which == "a2a") {
    bench_case(
        "linear all-to-all", repeat,
        [&] {
          std::vector<std::vector<Transfer>> phases(1);
          phases[0].reserve(static_cast<std::size_t>(p) * p);
          for (int s = 0; s < p; ++s) {
            for (int d = 0; d < p; ++d) phases[0].push_back({s, d, chunk});
          }
          return phases;
        },
        topo, options, params);
  }
  if (which == "all" || which == "2dh") {
    // Phase 1: GPU (n, i) sends to (n, j) the nodes * chunk bytes bound for local index j.
    // Phase 2: GPU (n, i) sends to (m, i) the gpn * chunk bytes bound for node m.
    const int m = nodes;
    bench_case(
        "2dh (intra + inter)", repeat,
        [&] {
          std::vector<std::vector<Transfer>> phases(2);
          for (int s = 0; s < p; ++s) {
            for (int j = 0; j < gpn; ++j) {
              phases[0].push_back({s, (s / gpn) * gpn + j, m * chunk});
            }
          }
          for (int s = 0; s < p; ++s) {
            for (int n = 0; n < m; ++n) {
              phases[1].push_back({s, n * gpn + s % gpn, gpn * chunk});
            }
          }
          return phases;
        },
        topo, options, params);
  }
  if (which == "all" || which == "skew") {
    // Skewed all-to-allv among the first 512 GPUs, every pair a different size: many distinct
    // finish times, hence many events. Not a target: a stress figure for per-event cost.
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> factor(0.25, 1.75);
    const int sub = std::min(p, 512);
    bench_case(
        "skewed a2av (" + std::to_string(sub) + " GPUs)", std::max(1, repeat / 3),
        [&] {
          std::vector<std::vector<Transfer>> phases(1);
          for (int s = 0; s < sub; ++s) {
            for (int d = 0; d < sub; ++d) phases[0].push_back({s, d, chunk * factor(rng)});
          }
          return phases;
        },
        topo, options, params);
  }
  std::printf("peak RSS %.2f GiB\n", peak_rss_gib());
  return 0;
}
