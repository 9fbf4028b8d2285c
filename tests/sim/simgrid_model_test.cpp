// Tests of the SimGrid network model against hand-computed answers (exact to 1e-9 relative) and,
// when the flow model is built, against the flow model on small random topologies.
//
// SimGrid allows one engine per process, so every test body runs in a forked child (a death test
// that must exit with 0). gtest_discover_tests already runs each test in its own process; the fork
// keeps the binary correct when it is run directly with all tests in one process.
#include "sim/simgrid_model.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <queue>
#include <random>
#include <vector>

#include "core/error.hpp"
#include "sim/flow_model.hpp"
#include "topology/topology.hpp"

namespace moesim::sim {
namespace {

using moesim::InterKind;
using moesim::IntraKind;
using topology::LinkId;
using topology::VertexId;
using topology::VertexKind;

/// A hand-made topology: vertices and full-duplex cables, fewest-hop routes (BFS from the
/// destination, ties broken by the lowest link id), so tests know every route.
class GraphTopology : public topology::Topology {
 public:
  GraphTopology(int nodes, int gpus_per_node) : Topology(make_spec(nodes, gpus_per_node)) {
    for (int g = 0; g < nodes * gpus_per_node; ++g) {
      gpu_vertex_.push_back(add_vertex(VertexKind::kGpu, g / gpus_per_node, g));
    }
  }
  VertexId add_vertex(VertexKind kind, int node = -1, int index = -1) {
    vertices_.push_back({kind, node, index, 0, "v" + std::to_string(vertices_.size())});
    return static_cast<VertexId>(vertices_.size() - 1);
  }
  /// Adds links a->b (id 2c) and b->a (id 2c+1).
  void add_cable(VertexId a, VertexId b, double bandwidth, double latency) {
    links_.push_back({a, b, BytesPerSecond(bandwidth), Seconds(latency), 0});
    links_.push_back({b, a, BytesPerSecond(bandwidth), Seconds(latency), 0});
    next_.clear();
  }
  void route(int src, int dst, std::vector<LinkId>& out) const override {
    if (next_.empty()) build_next_hops();
    VertexId v = gpu_vertex_[src];
    const VertexId target = gpu_vertex_[dst];
    while (v != target) {
      const LinkId l = next_[target][v];
      MOESIM_ASSERT(l != kNone, "test topology: no route");
      out.push_back(l);
      v = links_[l].dst;
    }
  }

 private:
  static constexpr LinkId kNone = ~LinkId{0};
  static ClusterSpec make_spec(int nodes, int gpus_per_node) {
    ClusterSpec s;
    s.nodes = nodes;
    s.gpus_per_node = gpus_per_node;
    return s;
  }
  void build_next_hops() const {
    const std::size_t nv = vertices_.size();
    next_.assign(nv, std::vector<LinkId>(nv, kNone));
    for (VertexId t = 0; t < nv; ++t) {
      // BFS backwards from t over incoming links.
      std::vector<int> dist(nv, -1);
      std::queue<VertexId> q;
      dist[t] = 0;
      q.push(t);
      while (!q.empty()) {
        const VertexId v = q.front();
        q.pop();
        for (LinkId l = 0; l < links_.size(); ++l) {
          if (links_[l].dst != v) continue;
          const VertexId u = links_[l].src;
          if (dist[u] < 0) {
            dist[u] = dist[v] + 1;
            next_[t][u] = l;
            q.push(u);
          }
        }
      }
    }
  }
  mutable std::vector<std::vector<LinkId>> next_;  // next_[dst vertex][vertex] = link to take
};

/// Child side of isolated(): runs the body, copies failures to stderr (the parent sees only the
/// exit code and stderr) and exits.
[[noreturn]] void run_child(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    fprintf(stderr, "exception: %s\n", e.what());
    std::_Exit(3);
  }
  const auto* result = ::testing::UnitTest::GetInstance()->current_test_info()->result();
  for (int i = 0; i < result->total_part_count(); ++i) {
    const auto& part = result->GetTestPartResult(i);
    if (part.failed()) {
      fprintf(stderr, "%s:%d: %s\n", part.file_name() ? part.file_name() : "?", part.line_number(),
              part.message());
    }
  }
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

/// Runs `body` in a forked child; the test fails if the child fails an expectation, throws or
/// crashes.
void isolated(const std::function<void()>& body) {
  EXPECT_EXIT(run_child(body), ::testing::ExitedWithCode(0), "");
}

/// Drives a model the way the engine does until every batch completed; returns the completion
/// time of each batch (batches start at time 0 unless `starts` says otherwise).

std::vector<double> run_all_from(NetworkModel& m, const std::vector<std::vector<Transfer>>& batches,
                                 std::vector<double> starts, double origin) {
  if (starts.empty()) starts.assign(batches.size(), origin);
  std::vector<std::size_t> order(batches.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return starts[a] < starts[b]; });
  std::vector<double> done(batches.size(), -1);
  std::vector<BatchId> id_to_index;
  std::size_t next = 0;
  double now = origin;
  while (true) {
    while (next < order.size() && starts[order[next]] <= now) {
      const BatchId id = m.start_batch(now, batches[order[next]]);
      if (static_cast<std::size_t>(id) >= id_to_index.size()) id_to_index.resize(id + 1);
      id_to_index[id] = static_cast<BatchId>(order[next]);
      ++next;
    }
    double t = m.next_completion_time();
    const double own = next < order.size() ? starts[order[next]] : NetworkModel::kNever;
    t = std::min(t, own);
    if (t == NetworkModel::kNever) break;
    EXPECT_GE(t, now);
    for (const BatchCompletion& c : m.advance_to(t)) {
      EXPECT_EQ(c.time_s, t);
      done[id_to_index[c.id]] = c.time_s;
    }
    now = t;
  }
  return done;
}

std::vector<double> run_all(NetworkModel& m, const std::vector<std::vector<Transfer>>& batches,
                            std::vector<double> starts = {}) {
  return run_all_from(m, batches, std::move(starts), 0.0);
}

constexpr double kRel = 1e-9;
#define EXPECT_TIME(actual, expected) EXPECT_NEAR(actual, expected, kRel*(expected))

// Two GPUs, one cable: 1 GB/s per direction, 1 us per link.
struct TwoGpus {
  GraphTopology topo{1, 2};
  TwoGpus() { topo.add_cable(topo.gpu_vertex(0), topo.gpu_vertex(1), 1e9, 1e-6); }
};

class SimgridModes : public ::testing::TestWithParam<SimgridMode> {};

TEST_P(SimgridModes, OneFlowOneLinkIsLatencyPlusWorkOverBandwidth) {
  isolated([] {
    TwoGpus t;
    NetworkParams params{2e-6, 1e-6};  // message latency 2 us, overhead 1 us
    SimgridModel m(t.topo, params, {GetParam()});
    const auto done = run_all(m, {{{0, 1, 1e6}}});
    // L = 1 us (link) + 2 us; W = 1e6 + 1e-6 * 1e9 = 1,001,000 bytes at 1e9 B/s.
    EXPECT_TIME(done[0], 3e-6 + 1.001e-3);
  });
}

TEST_P(SimgridModes, OppositeDirectionsDoNotShare) {
  isolated([] {
    TwoGpus t;
    SimgridModel m(t.topo, {}, {GetParam()});
    const auto done = run_all(m, {{{0, 1, 1e6}, {1, 0, 1e6}}});
    EXPECT_TIME(done[0], 1e-6 + 1e-3);
  });
}

TEST_P(SimgridModes, TwoBatchesShareOneLinkMaxMin) {
  isolated([] {
    TwoGpus t;
    SimgridModel m(t.topo, {}, {GetParam()});
    // Each gets 0.5 GB/s until the small one ends after 2 MB went through; the large one then
    // has 2 MB left at full rate. Same in ptask mode: one flow per task.
    const auto done = run_all(m, {{{0, 1, 1e6}}, {{0, 1, 3e6}}});
    EXPECT_TIME(done[0], 1e-6 + 2e-3);
    EXPECT_TIME(done[1], 1e-6 + 4e-3);
  });
}

TEST_P(SimgridModes, NoTcpWindowBoundOnLongFatLinks) {
  isolated([] {
    // 100 GB/s with 10 ms latency: with SimGrid's default TCP-gamma (4 MiB window) the rate would
    // be bounded by gamma / (2 L) = 0.2 GB/s.
    GraphTopology topo(1, 2);
    topo.add_cable(topo.gpu_vertex(0), topo.gpu_vertex(1), 1e11, 1e-2);
    SimgridModel m(topo, {}, {GetParam()});
    const auto done = run_all(m, {{{0, 1, 1e9}}});
    EXPECT_TIME(done[0], 1e-2 + 1e-2);
  });
}

TEST_P(SimgridModes, EmptyAndZeroByteBatches) {
  isolated([] {
    TwoGpus t;
    SimgridModel m(t.topo, {1e-6, 1e-3}, {GetParam()});
    const BatchId empty = m.start_batch(0.5, {});
    EXPECT_EQ(m.next_completion_time(), 0.5);
    auto c = m.advance_to(0.5);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].id, empty);
    EXPECT_EQ(c[0].time_s, 0.5);
    // Zero bytes (and a local transfer): the latency only, no per-message overhead.
    const BatchId zero = m.start_batch(0.5, {{0, 1, 0.0}, {1, 1, 5e6}});
    EXPECT_TIME(m.next_completion_time(), 0.5 + 2e-6);
    c = m.advance_to(m.next_completion_time());
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].id, zero);
    EXPECT_EQ(m.next_completion_time(), NetworkModel::kNever);
  });
}

TEST_P(SimgridModes, BatchStartedWhileAnotherIsMoving) {
  isolated([] {
    GraphTopology topo(1, 2);
    topo.add_cable(topo.gpu_vertex(0), topo.gpu_vertex(1), 1e9, 0.0);
    SimgridModel m(topo, {}, {GetParam()});
    // A: 2 MB at t=0, alone until 1 ms (1 MB left). B: 0.5 MB at 1 ms; both at 0.5 GB/s, B ends
    // at 2 ms, A has 0.5 MB left and ends at 2.5 ms.
    const auto done = run_all(m, {{{0, 1, 2e6}}, {{0, 1, 0.5e6}}}, {0.0, 1e-3});
    EXPECT_TIME(done[0], 2.5e-3);
    EXPECT_TIME(done[1], 2e-3);
    const auto bytes = m.link_bytes();
    ASSERT_EQ(bytes.size(), 2u);
    EXPECT_EQ(bytes[0], 2.5e6);
    EXPECT_EQ(bytes[1], 0.0);
  });
}

TEST_P(SimgridModes, LatencyPhaseTakesNoBandwidth) {
  isolated([] {
    // gpu0 - gpu1 - gpu2 in a line (GPU vertices forward traffic here, which is all a route is).
    // Flow 0->1 (L = 1 ms) and flow 0->2 (L = 2 ms) share link 0->1. Wait-then-transfer: 0->1
    // moves alone from 1 to 2 ms and ends; 0->2 moves from 2 ms for 2 ms. Nodes of one GPU each,
    // so ptask mode puts each flow in its own task.
    GraphTopology topo(3, 1);
    topo.add_cable(topo.gpu_vertex(0), topo.gpu_vertex(1), 1e9, 1e-3);
    topo.add_cable(topo.gpu_vertex(1), topo.gpu_vertex(2), 1e9, 1e-3);
    SimgridModel m(topo, {}, {GetParam()});
    const auto done = run_all(m, {{{0, 1, 1e6}}, {{0, 2, 2e6}}});
    EXPECT_TIME(done[0], 2e-3);
    EXPECT_TIME(done[1], 4e-3);
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, SimgridModes,
                         ::testing::Values(SimgridMode::kPerFlow, SimgridMode::kPtask),
                         [](const auto& info) {
                           return std::string(simgrid_mode_name(info.param));
                         });

// Where the two modes differ: flows of one batch in the same node pair form one parallel task in
// ptask mode and progress at one common rate. Four GPUs (two nodes of two) on one switch, 1 GB/s
// per link and direction, no latency.
TEST(SimgridModel, SkewWithinOneNodePairPerFlow) {
  isolated([] {
    GraphTopology topo(2, 2);
    const VertexId sw = topo.add_vertex(VertexKind::kSwitch);
    for (int g = 0; g < 4; ++g) topo.add_cable(topo.gpu_vertex(g), sw, 1e9, 0.0);
    SimgridModel m(topo, {}, {SimgridMode::kPerFlow});
    // gpu0->gpu2 1 MB and gpu0->gpu3 3 MB share gpu0's uplink; a second batch gpu1->gpu2 (2 MB)
    // shares gpu2's downlink with the first flow.
    const auto done = run_all(m, {{{0, 2, 1e6}, {0, 3, 3e6}}, {{1, 2, 2e6}}});
    // Per flow: 0->2 and 0->3 each 0.5 GB/s on gpu0's uplink; 1->2 gets the other 0.5 GB/s of
    // gpu2's downlink. 0->2 ends at 2 ms; then 0->3 (2 MB left) and 1->2 (1 MB left) run at 1 GB/s:
    // 1->2 ends at 3 ms, 0->3 at 4 ms.
    EXPECT_TIME(done[0], 4e-3);
    EXPECT_TIME(done[1], 3e-3);
  });
}

TEST(SimgridModel, SkewWithinOneNodePairPtask) {
  isolated([] {
    GraphTopology topo(2, 2);
    const VertexId sw = topo.add_vertex(VertexKind::kSwitch);
    for (int g = 0; g < 4; ++g) topo.add_cable(topo.gpu_vertex(g), sw, 1e9, 0.0);
    SimgridModel m(topo, {}, {SimgridMode::kPtask});
    const auto done = run_all(m, {{{0, 2, 1e6}, {0, 3, 3e6}}, {{1, 2, 2e6}}});
    // Task A = {0->2: 1 MB, 0->3: 3 MB} (node 0 -> node 1) moves 4 MB over gpu0's uplink per unit
    // of progress, so that link bounds A at 1/4 per ms: 0->2 runs at 0.25 GB/s instead of 0.5.
    // Task B = {1->2: 2 MB} gets the rest of gpu2's downlink, 0.75 GB/s (SimGrid's ptask solver,
    // fair-bottleneck, fixes A at its bottleneck first), and ends at 2/0.75 ms; A ends at 4 ms.
    // Per flow, B ended at 3 ms: the per-task common rate slowed the small flow 0->2, which in
    // turn left more of gpu2's downlink to B.
    EXPECT_TIME(done[0], 4e-3);
    EXPECT_TIME(done[1], 2e-3 / 0.75);
  });
}

TEST(SimgridModel, AutoModePicksByGpuCount) {
  isolated([] {
    TwoGpus t;
    SimgridModel m(t.topo, {}, {SimgridMode::kAuto, 2});
    EXPECT_EQ(m.mode(), SimgridMode::kPerFlow);
  });
  isolated([] {
    TwoGpus t;
    SimgridModel m(t.topo, {}, {SimgridMode::kAuto, 1});
    EXPECT_EQ(m.mode(), SimgridMode::kPtask);
  });
}

// SimGrid 3.32 allows one engine per process: the first model builds it and its platform, later
// models on the same topology and mode run on it from time zero (a strategy stack's iterations,
// the strategies of one `moesim simulate`); anything else is refused with a message.
TEST(SimgridModel, LaterModelsReuseThePlatform) {
  isolated([] {
    TwoGpus t;
    EXPECT_FALSE(SimgridModel::engine_created());
    {
      SimgridModel m(t.topo, {});
      EXPECT_TRUE(SimgridModel::engine_created());
      m.start_batch(0, {{0, 1, 1e6}});  // destroyed while a flow is in flight: cancelled
    }
    {
      SimgridModel m(t.topo, {});
      EXPECT_EQ(m.now(), 0);
      // As on a fresh engine: the cancelled flow takes no bandwidth, time starts at zero.
      const auto done = run_all(m, {{{0, 1, 1e6}}});
      EXPECT_TIME(done[0], 1e-6 + 1e-3);
      // One model at a time: completions go to the running one.
      EXPECT_THROW(SimgridModel(t.topo, {}), RuntimeError);
    }
    {
      SimgridModel m(t.topo, {});
      const auto done = run_all(m, {{{0, 1, 2e6}}, {{1, 0, 1e6}}});
      EXPECT_TIME(done[0], 1e-6 + 2e-3);
      EXPECT_TIME(done[1], 1e-6 + 1e-3);
    }
    EXPECT_THROW(SimgridModel(t.topo, {}, {SimgridMode::kPtask}), RuntimeError);  // other mode
    TwoGpus other;
    try {
      SimgridModel m(other.topo, {});
      ADD_FAILURE() << "a second topology was accepted";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("one topology and mode at a time"), std::string::npos)
          << e.what();
    }
  });
}

TEST(SimgridModel, ParseMode) {
  EXPECT_EQ(parse_simgrid_mode("per_flow"), SimgridMode::kPerFlow);
  EXPECT_EQ(parse_simgrid_mode("ptask"), SimgridMode::kPtask);
  EXPECT_EQ(parse_simgrid_mode("auto"), SimgridMode::kAuto);
  EXPECT_THROW(parse_simgrid_mode("fast"), InputError);
  EXPECT_EQ(simgrid_mode_name(SimgridMode::kPtask), "ptask");
}

// ---- Agreement with the flow model ------------------------------------------------------------

/// Random cluster: `nodes` nodes of `gpn` GPUs around a node switch, node switches attached to 1-2
/// of `fabric` fabric switches (a chain plus random extra cables). Bandwidths and latencies vary
/// per cable, so routes have different bottlenecks and latencies.
std::unique_ptr<GraphTopology> random_topology(std::mt19937_64& rng, int nodes, int gpn,
                                               int fabric) {
  auto t = std::make_unique<GraphTopology>(nodes, gpn);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<VertexId> fab;
  for (int f = 0; f < fabric; ++f) fab.push_back(t->add_vertex(VertexKind::kSwitch));
  for (int f = 1; f < fabric; ++f) t->add_cable(fab[f - 1], fab[f], 20e9 + 80e9 * u(rng), 1e-6);
  if (fabric > 2 && u(rng) < 0.5) t->add_cable(fab[0], fab[fabric - 1], 30e9, 2e-6);
  for (int n = 0; n < nodes; ++n) {
    const VertexId sw = t->add_vertex(VertexKind::kNvswitch, n);
    for (int l = 0; l < gpn; ++l) {
      t->add_cable(t->gpu_vertex(n * gpn + l), sw, 50e9 + 250e9 * u(rng), 0.2e-6 + 0.8e-6 * u(rng));
    }
    const int first = static_cast<int>(u(rng) * fabric);
    t->add_cable(sw, fab[first], 10e9 + 40e9 * u(rng), 1e-6 + 2e-6 * u(rng));
    if (fabric > 1 && u(rng) < 0.3) t->add_cable(sw, fab[(first + 1) % fabric], 12.5e9, 2e-6);
  }
  return t;
}

enum class Pattern { kUniform, kRandomSizes, kHotSpot, kZipf };

/// One batch of traffic over `p` GPUs; `scale` bytes sets the size.
std::vector<Transfer> traffic(std::mt19937_64& rng, int p, Pattern pattern, double scale) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<Transfer> out;
  const int hot = static_cast<int>(u(rng) * p);
  for (int s = 0; s < p; ++s) {
    for (int d = 0; d < p; ++d) {
      if (s == d) continue;
      double bytes = 0;
      switch (pattern) {
        case Pattern::kUniform:
          bytes = scale;
          break;
        case Pattern::kRandomSizes:  // heavy-tailed, some pairs silent
          bytes = u(rng) < 0.2 ? 0.0 : scale * std::pow(u(rng), 3.0) * 4;
          break;
        case Pattern::kHotSpot:  // everyone floods one GPU, light background elsewhere
          bytes = d == hot ? 4 * scale : (u(rng) < 0.3 ? scale / 8 : 0.0);
          break;
        case Pattern::kZipf:  // expert popularity: destination rank r gets ~ 1 / (r + 1)^1.2
          bytes = scale * 2 / std::pow(1.0 + ((d - hot + p) % p), 1.2);
          break;
      }
      if (bytes > 0 || u(rng) < 0.05) out.push_back({s, d, std::round(bytes)});
    }
  }
  return out;
}

struct Workload {
  std::vector<std::vector<Transfer>> batches;
  std::vector<double> starts;
};

Workload random_workload(std::mt19937_64& rng, int p) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Workload w;
  const int n = 2 + static_cast<int>(u(rng) * 3);
  for (int b = 0; b < n; ++b) {
    const auto pattern = static_cast<Pattern>(static_cast<int>(u(rng) * 4) % 4);
    w.batches.push_back(traffic(rng, p, pattern, 1e5 + 4e6 * u(rng)));
    // Overlapping starts: later batches land while earlier ones are moving.
    w.starts.push_back(b == 0 ? 0.0 : 2e-4 * u(rng));
  }
  return w;
}

/// Largest |simgrid - flow| over the batches, relative to the flow model's batch duration.
double max_relative_difference(const Workload& w, const std::vector<double>& flow,
                               const std::vector<double>& simgrid) {
  double worst = 0;
  for (std::size_t b = 0; b < flow.size(); ++b) {
    EXPECT_GE(flow[b], w.starts[b]);
    EXPECT_GE(simgrid[b], w.starts[b]);
    const double duration = std::max(flow[b] - w.starts[b], 1e-12);
    worst = std::max(worst, std::abs(simgrid[b] - flow[b]) / duration);
  }
  return worst;
}

class FlowAgreement : public ::testing::TestWithParam<int> {};

// Per-flow SimGrid and the flow model implement the same semantics: every batch of every random
// workload (uniform, heavy-tailed, hot-spot and Zipf traffic, overlapping batches) completes at
// the same time within 1% of its duration.
TEST_P(FlowAgreement, PerFlowMatchesFlowModelOnRandomTopologies) {
  isolated([] {
    std::mt19937_64 rng(1000 + GetParam());
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const int nodes = 2 + static_cast<int>(u(rng) * 3);
    const int gpn = 1 + static_cast<int>(u(rng) * 4);
    auto topo = random_topology(rng, nodes, gpn, 1 + static_cast<int>(u(rng) * 3));
    NetworkParams params{3e-6 * u(rng), 1e-6 * u(rng)};
    if (GetParam() % 2 == 1) {
      // Odd seeds: per-peer state misses (engine.peer_cache), from a separate stream so the even
      // seeds' topologies and workloads stay as they were.
      std::mt19937_64 peer_rng(77 + GetParam());
      params.peer_cache = 1 + static_cast<int>(peer_rng() % 3);
      params.peer_miss_overhead_s = 4e-6 * u(peer_rng);
    }
    const int p = nodes * gpn;
    // Several workloads on one SimGrid engine: each starts after the previous one drained, at a
    // later time origin.
    FlowModel flow(*topo, params);
    SimgridModel sg(*topo, params, {SimgridMode::kPerFlow});
    double origin = 0;
    for (int rep = 0; rep < 3; ++rep) {
      Workload w = random_workload(rng, p);
      for (double& s : w.starts) s += origin;
      const auto f = run_all_from(flow, w.batches, w.starts, origin);
      const auto g = run_all_from(sg, w.batches, w.starts, origin);
      const double diff = max_relative_difference(w, f, g);
      EXPECT_LT(diff, 0.01) << "workload " << rep << " on " << p << " GPUs";
      origin = *std::max_element(f.begin(), f.end()) + 1e-3;
    }
    // Both count W over every link of every finished flow.
    const auto fb = flow.link_bytes();
    const auto gb = sg.link_bytes();
    ASSERT_EQ(fb.size(), gb.size());
    for (std::size_t l = 0; l < fb.size(); ++l) EXPECT_NEAR(gb[l], fb[l], 1e-6 * fb[l] + 1.0);
  });
}

INSTANTIATE_TEST_SUITE_P(Seeds, FlowAgreement, ::testing::Range(0, 8));

// On symmetric traffic the ptask form gives the flow model's answer too (every flow of a node pair
// has the same size and route bottleneck, so one common rate is what max-min gives them).
TEST(SimgridModel, PtaskMatchesFlowModelOnUniformAllToAll) {
  isolated([] {
    auto spec = ClusterSpec{};
    spec.gpu.name = "a100-sxm-80gb";
    spec.nodes = 4;
    spec.gpus_per_node = 4;
    spec.intra.kind = IntraKind::kNvswitch;
    spec.intra.bandwidth = BytesPerSecond(300e9);
    spec.intra.latency = Seconds(1e-6);
    spec.inter.kind = InterKind::kFatTree;
    spec.inter.nic_bandwidth = BytesPerSecond(25e9);
    spec.inter.nics_per_node = 4;
    spec.inter.latency = Seconds(2e-6);
    auto topo = topology::build_topology(spec);
    const NetworkParams params{1e-6, 0.5e-6};
    std::vector<Transfer> a2a;
    for (int s = 0; s < 16; ++s) {
      for (int d = 0; d < 16; ++d) a2a.push_back({s, d, 8.0 * 1024 * 1024 / 16});
    }
    FlowModel flow(*topo, params);
    SimgridModel sg(*topo, params, {SimgridMode::kPtask});
    const auto f = run_all(flow, {a2a});
    const auto g = run_all(sg, {a2a});
    EXPECT_NEAR(g[0], f[0], 0.01 * f[0]);
  });
}

}  // namespace
}  // namespace moesim::sim
