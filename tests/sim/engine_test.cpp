// Tests of the discrete-event engine (sim/engine), the compute model (sim/compute_model), the
// analytical path (sim/analytical_model), run results (core/run_result) and the Chrome trace
// writer (sim/trace). Times are worked out by hand on tiny topologies with a fake network model
// whose batches take latency + max(bytes) / bandwidth, so every expectation below is exact.
#include "sim/engine.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/run_result.hpp"
#include "sim/analytical_model.hpp"
#include "sim/compute_model.hpp"
#include "sim/trace.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/gpu_catalog.hpp"
#include "topology/topology.hpp"

namespace moesim::sim {
namespace {

constexpr double kPeak = 100e12;  // FLOP/s, fp16
constexpr double kHbm = 1e12;     // B/s
constexpr double kLaunch = 5e-6;  // s
constexpr double kLinkBw = 100e9;
constexpr double kLinkLat = 1e-6;

GpuSpec test_gpu() {
  GpuSpec g;
  g.name = "test-gpu";
  g.peak[Dtype::kFp16] = FlopsPerSecond(kPeak);
  g.peak[Dtype::kFp32] = FlopsPerSecond(kPeak / 4);
  g.hbm_bandwidth = BytesPerSecond(kHbm);
  g.memory = Bytes(80e9);
  return g;
}

// A star: every GPU has one full-duplex link to a central switch. Nodes of `gpn` GPUs (the
// nodes only matter for algorithms that look at them, e.g. 2DH).
class StarTopology : public topology::Topology {
 public:
  StarTopology(int nodes, int gpn) : Topology(make_spec(nodes, gpn)) {
    const int p = nodes * gpn;
    for (int g = 0; g < p; ++g) {
      vertices_.push_back({topology::VertexKind::kGpu, g / gpn, g, 0, "gpu" + std::to_string(g)});
      gpu_vertex_.push_back(static_cast<topology::VertexId>(g));
    }
    vertices_.push_back({topology::VertexKind::kSwitch, -1, 0, 1, "switch"});
    const auto sw = static_cast<topology::VertexId>(p);
    for (int g = 0; g < p; ++g) {
      auto v = static_cast<topology::VertexId>(g);
      links_.push_back({v, sw, BytesPerSecond(kLinkBw), Seconds(kLinkLat / 2), 0});
      links_.push_back({sw, v, BytesPerSecond(kLinkBw), Seconds(kLinkLat / 2), 0});
    }
  }
  void route(int src, int dst, std::vector<topology::LinkId>& out) const override {
    out.push_back(static_cast<topology::LinkId>(2 * src));
    out.push_back(static_cast<topology::LinkId>(2 * dst + 1));
  }

 private:
  static ClusterSpec make_spec(int nodes, int gpn) {
    ClusterSpec s;
    s.gpu = test_gpu();
    s.nodes = nodes;
    s.gpus_per_node = gpn;
    s.intra.bandwidth = BytesPerSecond(kLinkBw);
    s.intra.latency = Seconds(kLinkLat);
    return s;
  }
};

// Fake network: a batch takes latency + max over transfers of bytes / bandwidth; no contention.
// Records every batch for inspection.
class FakeNetwork : public NetworkModel {
 public:
  explicit FakeNetwork(double bw, double latency = 0) : bw_(bw), latency_(latency) {}
  std::string_view name() const override { return "fake"; }
  BatchId start_batch(double now, const std::vector<Transfer>& transfers, int priority) override {
    double t = 0, bytes = 0;
    for (const auto& x : transfers) t = std::max(t, x.bytes / bw_), bytes += x.bytes;
    if (!transfers.empty()) t += latency_;
    BatchId id = static_cast<BatchId>(batches.size());
    batches.push_back({now, now + t, bytes, static_cast<int>(transfers.size()), priority});
    pending_.insert({now + t, id});
    return id;
  }
  double next_completion_time() override {
    return pending_.empty() ? kNever : pending_.begin()->first;
  }
  std::vector<BatchCompletion> advance_to(double t) override {
    std::vector<BatchCompletion> out;
    while (!pending_.empty() && pending_.begin()->first <= t) {
      out.push_back({pending_.begin()->second, pending_.begin()->first});
      pending_.erase(pending_.begin());
    }
    return out;
  }
  struct Batch {
    double start, end, bytes;
    int transfers, priority;
  };
  std::vector<Batch> batches;

 private:
  double bw_, latency_;
  std::set<std::pair<double, BatchId>> pending_;
};

EngineConfig test_config() {
  EngineConfig c;
  c.compute.launch_overhead = Seconds(kLaunch);
  c.precision = Dtype::kFp16;
  return c;
}

// A non-GEMM compute op of `flops`: kLaunch + flops / (kPeak * other_efficiency).
ComputeSpec flops_op(double flops) {
  ComputeSpec s;
  s.cls = ComputeClass::kElementwise;
  s.flops = Flops(flops);
  return s;
}
constexpr double kOtherEff = 0.5;
double flops_time(double flops) { return kLaunch + flops / (kPeak * kOtherEff); }

constexpr double kEps = 1e-12;

// ---- compute model --------------------------------------------------------------------------

TEST(ComputeModelTest, RooflineComputeAndMemoryBound) {
  ComputeModel m(test_gpu(), Dtype::kFp16, test_config().compute);
  EXPECT_NEAR(m.duration(flops_op(1e9)).value(), kLaunch + 1e9 / (kPeak * 0.5), kEps);
  ComputeSpec mem = flops_op(1e6);
  mem.bytes = Bytes(1e9);  // 1 ms of HBM traffic dominates 20 ns of math
  EXPECT_NEAR(m.duration(mem).value(), kLaunch + 1e-3, kEps);
  // rank_scale multiplies FLOPs and bytes.
  EXPECT_NEAR(m.duration(mem, 2.0).value(), kLaunch + 2e-3, kEps);
  EXPECT_NEAR(m.copy_duration(Bytes(1e6)).value(), kLaunch + 2e6 / kHbm, kEps);
  EXPECT_NEAR(m.memory_time(Bytes(3e6)).value(), 3e6 / kHbm, kEps);
}

TEST(ComputeModelTest, Fp8GemmAddsItsQuantizationTraffic) {
  // An fp8 GEMM at the fp8 peak (2x fp16) and its 0.56 ceiling, plus its casts at HBM speed.
  GpuSpec g = test_gpu();
  g.peak[Dtype::kFp8] = FlopsPerSecond(2 * kPeak);
  ComputeModel m(g, Dtype::kFp16, test_config().compute);
  ComputeSpec s;
  s.cls = ComputeClass::kGemm;
  s.gemm = GemmShape{4096, 4096, 4096, 1};
  s.flops = Flops(s.gemm->flops());
  s.fp8 = true;
  const double alone = m.duration(s).value();
  const double eff =
      0.56 * std::pow(gemm_tile_utilisation(4096, 96), 2) * gemm_tile_utilisation(4096, 32);
  EXPECT_NEAR(alone, kLaunch + s.gemm->flops() / (2 * kPeak * eff), 1e-12);
  s.cast_bytes = Bytes(3e6);  // 3 us at 1 TB/s
  EXPECT_NEAR(m.duration(s).value(), alone + 3e-6, 1e-12);
  // rank_scale scales the casts with the rows.
  ComputeSpec no_casts = s;
  no_casts.cast_bytes = Bytes(0);
  EXPECT_NEAR(m.duration(s, 2.0).value() - m.duration(no_casts, 2.0).value(), 6e-6, 1e-12);
}

TEST(ComputeModelTest, GemmEfficiencyIsMonotoneInEveryDimension) {
  ComputeModel m(test_gpu(), Dtype::kFp16, {});
  double prev = 0;
  for (double d = 1; d <= 65536; d *= 2) {
    double e = m.gemm_efficiency(d, d, d);
    if (d < 1024) {
      EXPECT_GT(e, prev) << "square " << d;
    } else {
      EXPECT_GE(e, prev) << "square " << d;
    }
    prev = e;
    // Non-decreasing everywhere; strictly increasing while the dimension is tile-sized (beyond
    // a few tiles the efficiency saturates to its maximum in double precision).
    for (double x : {1.0, 8.0, 64.0, 1024.0}) {
      EXPECT_LE(m.gemm_efficiency(d, x, 512), m.gemm_efficiency(d * 2, x, 512));
      EXPECT_LE(m.gemm_efficiency(x, d, 512), m.gemm_efficiency(x, d * 2, 512));
      EXPECT_LE(m.gemm_efficiency(512, x, d), m.gemm_efficiency(512, x, d * 2));
      if (d < 512) {
        EXPECT_LT(m.gemm_efficiency(d, x, 512), m.gemm_efficiency(d * 2, x, 512));
        EXPECT_LT(m.gemm_efficiency(x, d, 512), m.gemm_efficiency(x, d * 2, 512));
      }
      if (d < 128) {
        EXPECT_LT(m.gemm_efficiency(512, x, d), m.gemm_efficiency(512, x, d * 2));
      }
    }
  }
  // Large square GEMMs reach ~80% of peak; small dimensions are much worse.
  EXPECT_NEAR(m.gemm_efficiency(4096, 4096, 4096), 0.8, 0.01);
  EXPECT_GT(m.gemm_efficiency(128, 4096, 4096), 0.5);
  EXPECT_LT(m.gemm_efficiency(16, 4096, 4096), 0.2);
}

TEST(ComputeModelTest, PlainLayoutBatchedGemmIsMuchSlowerThanOneLargeGemm) {
  // Tutel §3.1 at 2,048 GPUs: W = 2,048 matrices of 8 tokens vs one GEMM of 16,384 tokens.
  ComputeModel m(test_gpu(), Dtype::kFp16, {});
  ComputeSpec flexible, plain;
  flexible.cls = plain.cls = ComputeClass::kGemm;
  flexible.gemm = GemmShape{16384, 2048, 2048, 1};
  plain.gemm = GemmShape{8, 2048, 2048, 2048};
  ASSERT_DOUBLE_EQ(flexible.gemm->flops(), plain.gemm->flops());
  flexible.flops = plain.flops = Flops(flexible.gemm->flops());
  double ratio = m.duration(plain).value() / m.duration(flexible).value();
  EXPECT_GT(ratio, 8.0);
  EXPECT_LT(ratio, 16.0);
}

TEST(ComputeModelTest, PlainLayoutOnA100IsTutelsElevenTimesSlower) {
  // V6's 2,048-GPU layer on an A100: 16,384 tokens per GPU, M = H = 2,048, 2 experts per GPU,
  // top-2, f = 1, so 8 slots per source. Plain: 2,048 sources x 2 experts = 4,096 GEMMs of 8 rows
  // over 2 weight matrices (16 MiB, in the 40 MiB L2); flexible: 2 GEMMs of 16,384 rows. Tutel
  // (section 3.1) measured the plain layout's expert compute 11.3x slower at 2,048 GPUs.
  const GpuSpec* a100 = topology::find_gpu("a100-sxm-80gb");
  ASSERT_NE(a100, nullptr);
  ASSERT_DOUBLE_EQ(a100->l2_cache.value(), 40.0 * 1024 * 1024);
  ComputeModel m(*a100, Dtype::kFp16, {});
  ComputeSpec flexible, plain;
  flexible.cls = plain.cls = ComputeClass::kGemm;
  flexible.gemm = GemmShape{16384, 2048, 2048, 2};
  plain.gemm = GemmShape{8, 2048, 2048, 4096, 2};
  ASSERT_DOUBLE_EQ(flexible.gemm->flops(), plain.gemm->flops());
  flexible.flops = plain.flops = Flops(flexible.gemm->flops());
  const double ratio = m.duration(plain).value() / m.duration(flexible).value();
  EXPECT_GT(ratio, 8.0);
  EXPECT_LT(ratio, 16.0);
  // Without the shared weights every source re-reads 8 MiB from HBM: memory-bound, ~3x Tutel's.
  ComputeSpec unshared = plain;
  unshared.gemm->weights = 0;
  EXPECT_GT(m.duration(unshared).value() / m.duration(flexible).value(), 1.2 * ratio);
}

TEST(ComputeModelTest, CalibrationOverridesTheModel) {
  ComputeParams p;
  p.calibration.alpha_gemm = Seconds(1e-6);
  p.calibration.efficiency_table = {{{1024, 1024, 1024, 1}, 0.5}, {{64, 1024, 1024, 1}, 0.1}};
  ComputeModel m(test_gpu(), Dtype::kFp16, p);
  EXPECT_DOUBLE_EQ(m.gemm_efficiency(1000, 1000, 1000), 0.5);
  EXPECT_DOUBLE_EQ(m.gemm_efficiency(60, 1024, 1024), 0.1);
  ComputeSpec s;
  s.cls = ComputeClass::kGemm;
  s.gemm = GemmShape{1024, 1024, 1024, 1};
  s.bytes = Bytes(1);  // negligible
  EXPECT_NEAR(m.duration(s).value(), 1e-6 + s.gemm->flops() / (kPeak * 0.5), kEps);
}

TEST(ComputeModelTest, RejectsBadInput) {
  GpuSpec no_peak = test_gpu();
  no_peak.peak.clear();
  EXPECT_THROW(ComputeModel(no_peak, Dtype::kFp16, {}), InputError);
  ComputeParams p;
  p.max_gemm_efficiency = 1.5;
  EXPECT_THROW(ComputeModel(test_gpu(), Dtype::kFp16, p), InputError);
  // bf16 falls back to the fp16 rate on a GPU that only lists fp16.
  ComputeModel bf(test_gpu(), Dtype::kBf16, {});
  EXPECT_DOUBLE_EQ(bf.peak().value(), kPeak);
}

// ---- engine: compute ops ----------------------------------------------------------------------

TEST(EngineTest, TwoComputeOpsOnOneStreamSerialise) {
  StarTopology topo(1, 2);
  Plan plan(1);
  auto s = plan.stream("compute");
  OpId a = plan.add_compute(RankSet::all(1), s, flops_op(1e9), {}, "a");
  OpId b = plan.add_compute(RankSet::all(1), s, flops_op(1e9), {}, "b");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  const double t = flops_time(1e9);
  EXPECT_NEAR(r.op_start(a, 0), 0, kEps);
  EXPECT_NEAR(r.op_end(a, 0), t, kEps);
  EXPECT_NEAR(r.op_start(b, 0), t, kEps);
  EXPECT_NEAR(r.makespan_s, 2 * t, kEps);
  EXPECT_NEAR(r.breakdown.compute_s, 2 * t, kEps);
}

TEST(EngineTest, ComputeOpsOnTwoStreamsOverlap) {
  StarTopology topo(1, 2);
  Plan plan(1);
  auto s0 = plan.stream("compute");
  auto s1 = plan.stream("compute2");
  plan.add_compute(RankSet::all(1), s0, flops_op(1e9), {}, "a");
  OpId b = plan.add_compute(RankSet::all(1), s1, flops_op(1e9), {}, "b");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  EXPECT_NEAR(r.op_start(b, 0), 0, kEps);
  EXPECT_NEAR(r.makespan_s, flops_time(1e9), kEps);
  // Busy time is a union of intervals: two fully overlapping ops count once.
  EXPECT_NEAR(r.breakdown.compute_s, flops_time(1e9), kEps);
}

TEST(EngineTest, DepsAcrossStreamsArePerRank) {
  StarTopology topo(1, 2);
  Plan plan(2);
  auto s0 = plan.stream("compute");
  auto s1 = plan.stream("comm");
  ComputeSpec skewed = flops_op(1e9);
  skewed.rank_scale = std::make_shared<std::vector<float>>(std::vector<float>{1.0f, 3.0f});
  OpId a = plan.add_compute(RankSet::all(2), s0, skewed, {}, "a");
  OpId b = plan.add_compute(RankSet::all(2), s1, flops_op(1e9), {a}, "b");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  const double t1 = flops_time(1e9), t3 = flops_time(3e9);
  // b on rank 0 waits only for a on rank 0, not for the slower rank 1.
  EXPECT_NEAR(r.op_start(b, 0), t1, kEps);
  EXPECT_NEAR(r.op_start(b, 1), t3, kEps);
  EXPECT_NEAR(r.makespan_s, t3 + t1, kEps);
  EXPECT_NEAR(r.op_first_start(b), t1, kEps);
  EXPECT_NEAR(r.op_last_end(b), t3 + t1, kEps);
}

TEST(EngineTest, CopyOpCostsLaunchPlusReadAndWrite) {
  StarTopology topo(1, 2);
  Plan plan(2);
  auto s = plan.stream("copy");
  OpId c = plan.add_copy(RankSet::all(2), s, CopySpec{Bytes(4e6)}, {}, "copy");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  EXPECT_NEAR(r.op_end(c, 1), kLaunch + 8e6 / kHbm, kEps);
  EXPECT_NEAR(r.breakdown.copy_s, kLaunch + 8e6 / kHbm, kEps);
}

// ---- engine: collectives ----------------------------------------------------------------------

CollectiveSpec a2a(Bytes bytes, GroupingId g, CollectiveAlgo algo = CollectiveAlgo::kLinear) {
  CollectiveSpec c;
  c.type = CollectiveType::kAllToAll;
  c.algo = algo;
  c.grouping = g;
  c.bytes = bytes;
  return c;
}

GroupingId world(Plan& plan) {
  Grouping g;
  g.name = "world";
  g.groups.push_back({});
  for (int r = 0; r < plan.num_ranks(); ++r) g.groups[0].push_back(r);
  return plan.add_grouping(std::move(g));
}

TEST(EngineTest, CollectiveWaitsForAllGroupMembers) {
  StarTopology topo(1, 2);
  Plan plan(2);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  ComputeSpec skewed = flops_op(1e9);
  skewed.rank_scale = std::make_shared<std::vector<float>>(std::vector<float>{1.0f, 2.0f});
  OpId a = plan.add_compute(RankSet::all(2), sc, skewed, {}, "expert");
  const double S = 8e6, bw = 10e9, lat = 3e-6;
  OpId c = plan.add_collective(sm, a2a(Bytes(S), world(plan)), {a}, "combine");
  FakeNetwork net(bw, lat);
  RunResult r = run_plan(plan, topo, test_config(), net);
  const double ready = flops_time(2e9);  // the slower rank
  // Linear all-to-all on 2 ranks: one batch, each rank sends S/2 to the other.
  ASSERT_EQ(net.batches.size(), 1u);
  EXPECT_NEAR(net.batches[0].start, ready, kEps);
  EXPECT_NEAR(net.batches[0].bytes, S, 1e-6);
  for (int p = 0; p < 2; ++p) {
    EXPECT_NEAR(r.op_start(c, p), ready, kEps);
    EXPECT_NEAR(r.op_end(c, p), ready + lat + S / 2 / bw, kEps);
  }
  const CollectiveRecord* rec = r.collective(c);
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->algo, CollectiveAlgo::kLinear);
  EXPECT_EQ(rec->num_groups, 1);
  EXPECT_DOUBLE_EQ(rec->size_bytes, S);
  EXPECT_NEAR(rec->wire_bytes, S, 1e-6);
  EXPECT_NEAR(rec->duration_s(), lat + S / 2 / bw, kEps);
  EXPECT_EQ(r.backend, "fake");
}

TEST(EngineTest, PhasesRunInSequenceAndCopiesCostLocalBytesOverHbm) {
  // 2DH on 2 nodes x 2 GPUs: copy, intra transfers, copy, inter transfers. The engine's time
  // must be the sum of the phases, each costed independently here from the algorithm's lowering.
  StarTopology topo(2, 2);
  Plan plan(4);
  auto sm = plan.stream("comm");
  const double S = 64e6, bw = 10e9, lat = 2e-6;
  GroupingId g = world(plan);
  OpId c = plan.add_collective(sm, a2a(Bytes(S), g, CollectiveAlgo::k2dh), {}, "a2a");
  FakeNetwork net(bw, lat);
  RunResult r = run_plan(plan, topo, test_config(), net);

  collectives::CollectiveCall call{&plan.op(c).collective(), &plan.grouping(g).groups[0], 0, false};
  const auto* algo = collectives::find_algorithm(CollectiveType::kAllToAll, CollectiveAlgo::k2dh);
  ASSERT_NE(algo, nullptr);
  double expected = 0;
  int copy_phases = 0;
  for (const auto& ph : algo->lower(call, topo)) {
    double local = ph.local_bytes.value() / kHbm, net_t = 0;
    if (ph.kind == collectives::Phase::Kind::kTransfers && !ph.transfers.empty()) {
      for (const auto& t : ph.transfers) net_t = std::max(net_t, t.bytes / bw);
      net_t += lat;
    } else {
      ++copy_phases;
    }
    expected += std::max(1, ph.repeat) * std::max(local, net_t);
  }
  EXPECT_GE(copy_phases, 2);
  EXPECT_GT(expected, 0);
  EXPECT_NEAR(r.op_end(c, 0), expected, 1e-9);
  EXPECT_EQ(r.collective(c)->algo, CollectiveAlgo::k2dh);
}

TEST(EngineTest, AnalyticalPathTakesSelectAlgorithmsTime) {
  StarTopology topo(2, 2);
  Plan plan(4);
  auto sm = plan.stream("comm");
  GroupingId g = world(plan);
  OpId c = plan.add_collective(sm, a2a(Bytes(32e6), g, CollectiveAlgo::kAuto), {}, "a2a");
  CollectiveSpec ar;
  ar.type = CollectiveType::kAllReduce;
  ar.grouping = g;
  ar.bytes = Bytes(16e6);
  OpId d = plan.add_collective(sm, ar, {c}, "allreduce");
  EngineConfig cfg = test_config();
  cfg.network = NetworkKind::kAnalytical;
  RunResult r = run_plan(plan, topo, cfg);

  auto ctx = make_cost_context(topo, cfg.net, BytesPerSecond(kHbm));
  double t = 0;
  for (OpId id : {c, d}) {
    collectives::CollectiveCall call{&plan.op(id).collective(), &plan.grouping(g).groups[0], 0,
                                     false};
    const auto& algo = collectives::select_algorithm(call, ctx);
    double dt = algo.analytical_time(call, ctx).value();
    EXPECT_GT(dt, 0);
    EXPECT_NEAR(r.op_start(id, 2), t, 1e-12);
    t += dt;
    EXPECT_NEAR(r.op_end(id, 2), t, 1e-12);
    EXPECT_EQ(r.collective(id)->algo, algo.algo());
    EXPECT_EQ(r.collective(id)->wire_bytes, 0);
  }
  EXPECT_EQ(r.backend, "analytical");
  EXPECT_NEAR(r.makespan_s, t, 1e-12);
  EXPECT_NEAR(r.breakdown.a2a_s + r.breakdown.allreduce_s, t, 1e-12);
  EXPECT_NEAR(r.breakdown.comm_s, t, 1e-12);
  EXPECT_NEAR(r.breakdown.exposed_comm_s, t, 1e-12);
}

TEST(EngineTest, AnalyticalCollectivesAcrossNodesShareTheNics) {
  // 2 nodes x 2 GPUs. Two all-to-alls over all 4 GPUs on two streams, ready at 0: the second
  // takes the NICs when the first ends (starts at t, ends at 2t). Two all-reduces inside node
  // 0 and node 1 on a third stream do not queue: they run at 0, each as if alone.
  StarTopology topo(2, 2);
  Plan plan(4);
  const GroupingId g = world(plan);
  Grouping nodes;
  nodes.name = "node";
  nodes.groups = {{0, 1}, {2, 3}};
  const GroupingId gn = plan.add_grouping(std::move(nodes));
  const OpId d = plan.add_collective(plan.stream("comm"), a2a(Bytes(32e6), g), {}, "dispatch");
  const OpId c = plan.add_collective(plan.stream("comm_out"), a2a(Bytes(32e6), g), {}, "combine");
  CollectiveSpec ar;
  ar.type = CollectiveType::kAllReduce;
  ar.grouping = gn;
  ar.bytes = Bytes(16e6);
  const OpId n = plan.add_collective(plan.stream("grad"), ar, {}, "node_allreduce");
  EngineConfig cfg = test_config();
  cfg.network = NetworkKind::kAnalytical;
  const RunResult r = run_plan(plan, topo, cfg);
  const double t = r.op_end(d, 0);
  EXPECT_GT(t, 0);
  for (int pos = 0; pos < 4; ++pos) {
    EXPECT_NEAR(r.op_start(d, pos), 0, 1e-12);
    EXPECT_NEAR(r.op_start(c, pos), t, 1e-12);  // the wait is not the collective's time
    EXPECT_NEAR(r.op_end(c, pos), 2 * t, 1e-12);
    EXPECT_NEAR(r.op_start(n, pos), 0, 1e-12);
  }
  const double node_t = r.op_end(n, 0);
  EXPECT_GT(node_t, 0);
  EXPECT_NEAR(r.op_end(n, 3), node_t, 1e-12);
  // Without sharing, each as if alone: both all-to-alls in [0, t].
  cfg.analytical_nic_sharing = false;
  const RunResult alone = run_plan(plan, topo, cfg);
  EXPECT_NEAR(alone.op_start(c, 0), 0, 1e-12);
  EXPECT_NEAR(alone.op_end(c, 0), t, 1e-12);
  EXPECT_NEAR(alone.makespan_s, std::max(t, node_t), 1e-12);
}

TEST(EngineTest, MakespanAndBreakdownSums) {
  // rank r: compute A (t) on "compute", then a2a (L) on "comm" after A, and compute B (2t) on
  // "compute" after A: the a2a overlaps B entirely when L < 2t.
  StarTopology topo(1, 2);
  Plan plan(2);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  OpId a = plan.add_compute(RankSet::all(2), sc, flops_op(1e9), {}, "A");
  const double S = 2e6, bw = 1e9;  // L = 1 ms
  OpId c = plan.add_collective(sm, a2a(Bytes(S), world(plan)), {a}, "a2a");
  OpId b = plan.add_compute(RankSet::all(2), sc, flops_op(1e11), {a}, "B");
  OpId d = plan.add_compute(RankSet::all(2), sc, flops_op(1e9), {b, c}, "D");
  FakeNetwork net(bw);
  RunResult r = run_plan(plan, topo, test_config(), net);
  const double ta = flops_time(1e9), tb = flops_time(1e11), L = S / 2 / bw;
  ASSERT_LT(L, tb);
  EXPECT_NEAR(r.op_end(c, 0), ta + L, kEps);
  EXPECT_NEAR(r.op_start(d, 1), ta + tb, kEps);
  EXPECT_NEAR(r.makespan_s, 2 * ta + tb, kEps);
  const Breakdown& bd = r.breakdown;
  EXPECT_NEAR(bd.compute_s, 2 * ta + tb, kEps);
  EXPECT_NEAR(bd.comm_s, L, kEps);
  EXPECT_NEAR(bd.a2a_s, L, kEps);
  EXPECT_NEAR(bd.overlap_s, L, kEps);
  EXPECT_NEAR(bd.exposed_comm_s, 0, kEps);
  EXPECT_NEAR(bd.exposed_comm_s + bd.overlap_s, bd.comm_s, kEps);

  // Make the a2a longer than B: the excess is exposed.
  FakeNetwork slow(bw / 1000);
  RunResult r2 = run_plan(plan, topo, test_config(), slow);
  const double L2 = S / 2 / (bw / 1000);
  EXPECT_NEAR(r2.breakdown.overlap_s, tb, 1e-9);
  EXPECT_NEAR(r2.breakdown.exposed_comm_s, L2 - tb, 1e-9);
  EXPECT_NEAR(r2.makespan_s, ta + L2 + ta, 1e-9);
  EXPECT_LE(r2.breakdown.compute_s + r2.breakdown.exposed_comm_s, r2.makespan_s + 1e-12);
}

TEST(EngineTest, InterferenceSlowsOverlappedComputeByExactlyOnePlusX) {
  StarTopology topo(1, 2);
  Plan plan(2);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  const double S = 20e6, bw = 1e9;  // L = 10 ms of communication from t = 0
  OpId c = plan.add_collective(sm, a2a(Bytes(S), world(plan)), {}, "a2a");
  OpId a = plan.add_compute(RankSet::all(2), sc, flops_op(1e12), {}, "A");  // ~20 ms
  EngineConfig cfg = test_config();
  const double x = 0.5;
  cfg.compute.interference = x;
  FakeNetwork net(bw);
  RunResult r = run_plan(plan, topo, cfg, net);
  const double L = S / 2 / bw, t = flops_time(1e12);
  ASSERT_LT(L, t);
  EXPECT_NEAR(r.op_end(c, 0), L, kEps);
  // During [0, L] A progresses L / (1 + x); the rest runs at full speed.
  EXPECT_NEAR(r.op_end(a, 0), L + (t - L / (1 + x)), 1e-12);

  // Communication covering the whole op: exactly (1 + x) times longer.
  FakeNetwork slow(bw / 100);
  RunResult r2 = run_plan(plan, topo, cfg, slow);
  EXPECT_NEAR(r2.op_end(a, 1), t * (1 + x), 1e-12);

  // No interference by default.
  FakeNetwork plain(bw);
  RunResult r3 = run_plan(plan, topo, test_config(), plain);
  EXPECT_NEAR(r3.op_end(a, 0), t, kEps);
}

TEST(EngineTest, GroupsReadyTogetherShareBatchesWithoutChangingTimes) {
  // 4 ranks, 2 groups {0,1} {2,3}; both ready at 0.
  StarTopology topo(2, 2);
  Plan plan(4);
  auto sm = plan.stream("comm");
  Grouping g;
  g.name = "ep";
  g.groups = {{0, 1}, {2, 3}};
  GroupingId gid = plan.add_grouping(g);
  OpId c = plan.add_collective(sm, a2a(Bytes(4e6), gid), {}, "a2a");
  FakeNetwork merged(1e9, 1e-6);
  RunResult r1 = run_plan(plan, topo, test_config(), merged);
  EngineConfig cfg = test_config();
  cfg.merge_ready_groups = false;
  FakeNetwork separate(1e9, 1e-6);
  RunResult r2 = run_plan(plan, topo, cfg, separate);
  EXPECT_EQ(merged.batches.size(), 1u);
  EXPECT_EQ(merged.batches[0].transfers, 4);
  EXPECT_EQ(separate.batches.size(), 2u);
  for (int p = 0; p < 4; ++p) EXPECT_NEAR(r1.op_end(c, p), r2.op_end(c, p), kEps);
  EXPECT_EQ(r1.collective(c)->num_groups, 2);
  EXPECT_NEAR(r1.collective(c)->wire_bytes, 8e6, 1e-6);
}

TEST(EngineTest, PartitionedCollectiveRunsChunksBackToBack) {
  StarTopology topo(1, 2);
  Plan plan(2);
  auto sm = plan.stream("comm");
  const double S = 8e6, bw = 1e9, lat = 1e-5;
  OpId c = plan.add_collective(sm, a2a(Bytes(S), world(plan)), {}, "a2a");
  plan.mutable_ops()[c].partition_size = Bytes(S / 4);
  plan.mutable_ops()[c].priority = 7;
  FakeNetwork net(bw, lat);
  RunResult r = run_plan(plan, topo, test_config(), net);
  ASSERT_EQ(net.batches.size(), 4u);
  for (const auto& b : net.batches) EXPECT_EQ(b.priority, 7);
  EXPECT_NEAR(r.op_end(c, 0), 4 * lat + S / 2 / bw, 1e-12);
  EXPECT_NEAR(r.collective(c)->wire_bytes, S, 1e-6);
}

// Lina's gate: `a` feeds both a yielding op `y` (priority -1, lower id, so visited first) and a
// priority op `b` on another stream. `b` reserves the rank when it becomes ready, in the same
// instant as `y`, so `y` waits until `b` has finished: start(y) = 2t, not t.
TEST(EngineTest, YieldingOpReadyWithAPriorityOpWaitsForIt) {
  StarTopology topo(1, 2);
  Plan plan(1);
  auto compute = plan.stream("compute");
  auto grad = plan.stream("grad");
  OpId a = plan.add_compute(RankSet::all(1), compute, flops_op(1e9), {}, "a");
  OpId y = plan.add_compute(RankSet::all(1), grad, flops_op(1e9), {a}, "y");
  OpId b = plan.add_compute(RankSet::all(1), compute, flops_op(1e9), {a}, "b");
  plan.mutable_ops()[y].priority = -1;
  plan.mutable_ops()[b].priority = 1;
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  const double t = flops_time(1e9);
  EXPECT_NEAR(r.op_start(b, 0), t, kEps);
  EXPECT_NEAR(r.op_start(y, 0), 2 * t, kEps);
  EXPECT_NEAR(r.makespan_s, 3 * t, kEps);
  // Without the priority op the yielding one starts as soon as `a` is done.
  plan.mutable_ops()[b].priority = 0;
  RunResult free = run_plan(plan, topo, test_config(), net);
  EXPECT_NEAR(free.op_start(y, 0), t, kEps);
  EXPECT_NEAR(free.makespan_s, 2 * t, kEps);
}

TEST(EngineTest, ManyRanksAndGroupsFinish) {
  // 64 ranks in 8 EP groups of 8, two layers of compute + a2a + compute; every op must finish,
  // and the result must not depend on merging.
  StarTopology topo(8, 8);
  Plan plan(64);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  Grouping g;
  g.name = "ep";
  for (int i = 0; i < 8; ++i) {
    g.groups.push_back({});
    for (int j = 0; j < 8; ++j) g.groups.back().push_back(i * 8 + j);
  }
  GroupingId gid = plan.add_grouping(g);
  std::vector<float> scale(64);
  for (int i = 0; i < 64; ++i) scale[i] = 1.0f + static_cast<float>(i % 5);
  ComputeSpec skewed = flops_op(1e9);
  skewed.rank_scale = std::make_shared<std::vector<float>>(scale);
  OpId prev = -1;
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<OpId> deps;
    if (prev >= 0) deps.push_back(prev);
    OpId gate = plan.add_compute(RankSet::all(64), sc, skewed, deps, "gate");
    OpId d = plan.add_collective(sm, a2a(Bytes(1e6), gid), {gate}, "dispatch");
    OpId e = plan.add_compute(RankSet::all(64), sc, flops_op(1e9), {d}, "expert");
    prev = plan.add_collective(sm, a2a(Bytes(1e6), gid), {e}, "combine");
  }
  FakeNetwork n1(1e9);
  const auto t0 = std::chrono::steady_clock::now();
  RunResult r1 = run_plan(plan, topo, test_config(), n1);
  const double outer_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EngineConfig cfg = test_config();
  cfg.merge_ready_groups = false;
  FakeNetwork n2(1e9);
  RunResult r2 = run_plan(plan, topo, cfg, n2);
  EXPECT_NEAR(r1.makespan_s, r2.makespan_s, 1e-12);
  for (size_t i = 0; i < r1.end_s.size(); ++i) {
    ASSERT_FALSE(std::isnan(r1.end_s[i]));
    EXPECT_NEAR(r1.end_s[i], r2.end_s[i], 1e-12);
  }
  EXPECT_EQ(r1.collectives.size(), 4u);
  EXPECT_GT(r1.num_events, 0);
  // The run's own wall clock lies inside the caller's.
  EXPECT_GT(r1.wall_s, 0);
  EXPECT_LE(r1.wall_s, outer_s);
  EXPECT_GT(r1.peak_rss_bytes, 0);
}

TEST(EngineTest, RejectsPlansLargerThanTheTopology) {
  StarTopology topo(1, 2);
  Plan plan(4);
  auto s = plan.stream("compute");
  plan.add_compute(RankSet::all(4), s, flops_op(1), {}, "a");
  FakeNetwork net(1e9);
  EXPECT_THROW(run_plan(plan, topo, test_config(), net), InputError);
}

TEST(EngineTest, NetworkKindNames) {
  for (auto k : {NetworkKind::kAnalytical, NetworkKind::kFlow, NetworkKind::kSimgrid})
    EXPECT_EQ(parse_network_kind(network_kind_name(k)), k);
  EXPECT_FALSE(parse_network_kind("fluid").has_value());
}

// ---- end to end on a built topology with the real network models -------------------------------

ClusterSpec two_node_cluster() {
  ClusterSpec s;
  s.gpu.name = "a100-sxm-80gb";
  s.nodes = 2;
  s.gpus_per_node = 4;
  s.intra.kind = IntraKind::kNvswitch;
  s.intra.bandwidth = BytesPerSecond(300e9);
  s.inter.kind = InterKind::kSwitch;
  s.inter.nic_bandwidth = BytesPerSecond(25e9);
  s.inter.nics_per_node = 4;
  return s;
}

// One MoE layer: gate, dispatch a2a (EP = world), expert, combine a2a; a DP allreduce of the
// gate's gradients on a second stream, overlapping the expert compute.
Plan moe_layer_plan(int p) {
  Plan plan(p);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  auto sa = plan.stream("comm2");
  GroupingId g = world(plan);
  OpId gate = plan.add_compute(RankSet::all(p), sc, flops_op(1e10), {}, "gate");
  OpId d = plan.add_collective(sm, a2a(Bytes(64e6), g, CollectiveAlgo::kAuto), {gate}, "dispatch");
  ComputeSpec expert;
  expert.cls = ComputeClass::kGemm;
  expert.gemm = GemmShape{8192, 4096, 4096, 1};
  OpId e = plan.add_compute(RankSet::all(p), sc, expert, {d}, "expert");
  CollectiveSpec ar;
  ar.type = CollectiveType::kAllReduce;
  ar.grouping = g;
  ar.bytes = Bytes(32e6);
  plan.add_collective(sa, ar, {gate}, "allreduce");
  plan.add_collective(sm, a2a(Bytes(64e6), g, CollectiveAlgo::kAuto), {e}, "combine");
  return plan;
}

TEST(EngineEndToEndTest, EveryNetworkModelRunsAMoeLayer) {
  auto topo = topology::build_topology(two_node_cluster());
  Plan plan = moe_layer_plan(8);
  std::map<NetworkKind, RunResult> runs;
  std::vector<NetworkKind> kinds = {NetworkKind::kAnalytical, NetworkKind::kFlow};
#ifdef MOESIM_HAVE_SIMGRID
  kinds.push_back(NetworkKind::kSimgrid);
#endif
  for (NetworkKind k : kinds) {
    EngineConfig cfg = test_config();
    cfg.network = k;
    RunResult r = run_plan(plan, *topo, cfg);
    EXPECT_EQ(r.backend, network_kind_name(k));
    EXPECT_GT(r.makespan_s, 0);
    EXPECT_NEAR(r.breakdown.exposed_comm_s + r.breakdown.overlap_s, r.breakdown.comm_s, 1e-12);
    EXPECT_GT(r.breakdown.a2a_s, 0);
    EXPECT_GT(r.breakdown.allreduce_s, 0);
    ASSERT_EQ(r.collectives.size(), 3u);
    for (const auto& c : r.collectives) EXPECT_NE(c.algo, CollectiveAlgo::kAuto);
    if (k != NetworkKind::kAnalytical) {
      EXPECT_GT(r.collectives[0].wire_bytes, 0);
      ASSERT_FALSE(r.link_tiers.empty()) << network_kind_name(k);
      for (const auto& t : r.link_tiers) {
        EXPECT_GE(t.max_utilisation, t.mean_utilisation);
        EXPECT_LE(t.max_utilisation, 1.0 + 1e-9);
      }
    }
    runs.emplace(k, std::move(r));
  }
  // The models see the same traffic; contention (the allreduce shares NICs with the a2a) makes
  // the packet-level and fluid models slower than the contention-free analytical one, not faster
  // by much, and they agree with each other.
  const double ana = runs.at(NetworkKind::kAnalytical).makespan_s;
  const double flow = runs.at(NetworkKind::kFlow).makespan_s;
  EXPECT_GT(flow, 0.7 * ana);
  EXPECT_LT(flow, 3.0 * ana);
#ifdef MOESIM_HAVE_SIMGRID
  const double sg = runs.at(NetworkKind::kSimgrid).makespan_s;
  EXPECT_NEAR(sg / flow, 1.0, 0.25);
#endif
}

TEST(EngineEndToEndTest, EngineCollectiveTimeIsTheSumOfItsPhasesOnTheFlowModel) {
  // A single collective alone on the network: the engine's time must equal running its phases
  // one after another on a fresh model (copies at HBM speed).
  auto topo = topology::build_topology(two_node_cluster());
  Plan plan(8);
  auto sm = plan.stream("comm");
  GroupingId g = world(plan);
  OpId c = plan.add_collective(sm, a2a(Bytes(32e6), g, CollectiveAlgo::k2dh), {}, "a2a");
  EngineConfig cfg = test_config();
  cfg.network = NetworkKind::kFlow;
  RunResult r = run_plan(plan, *topo, cfg);

  auto net = make_network_model(NetworkKind::kFlow, *topo, cfg.net);
  collectives::CollectiveCall call{&plan.op(c).collective(), &plan.grouping(g).groups[0], 0, false};
  const auto* algo = collectives::find_algorithm(CollectiveType::kAllToAll, CollectiveAlgo::k2dh);
  const double hbm = topo->gpu().hbm_bandwidth.value();
  double t = 0;
  for (const auto& ph : algo->lower(call, *topo)) {
    for (int rep = 0; rep < std::max(1, ph.repeat); ++rep) {
      double end = t + ph.local_bytes.value() / hbm;
      if (ph.kind == collectives::Phase::Kind::kTransfers && !ph.transfers.empty()) {
        net->start_batch(t, ph.transfers);
        double done = net->next_completion_time();
        net->advance_to(done);
        end = std::max(end, done);
      }
      t = end;
    }
  }
  EXPECT_NEAR(r.op_end(c, 0), t, 1e-12);
  EXPECT_NEAR(r.collective(c)->duration_s(), t, 1e-12);
}

// ---- analytical batch model -------------------------------------------------------------------

TEST(AnalyticalModelTest, BatchCostsAlphaBetaPerEndpoint) {
  StarTopology topo(1, 4);
  NetworkParams np;
  np.message_latency_s = 1e-6;
  np.message_overhead_s = 2e-6;
  AnalyticalModel m(topo, np);
  // One message over gpu0 -> switch -> gpu1: alpha = kLinkLat, bw = kLinkBw.
  EXPECT_NEAR(m.batch_time({{0, 1, 1e6}}), 1e-6 + kLinkLat + 2e-6 + 1e6 / kLinkBw, kEps);
  // gpu0 sends two messages back to back; the latency is paid once.
  EXPECT_NEAR(m.batch_time({{0, 1, 1e6}, {0, 2, 3e6}}), 1e-6 + kLinkLat + 2 * 2e-6 + 4e6 / kLinkBw,
              kEps);
  // Receiver side: two messages into gpu3.
  EXPECT_NEAR(m.batch_time({{0, 3, 1e6}, {1, 3, 1e6}}), 1e-6 + kLinkLat + 2 * 2e-6 + 2e6 / kLinkBw,
              kEps);
  EXPECT_EQ(m.batch_time({}), 0);
  BatchId b = m.start_batch(1.0, {{0, 1, 1e6}});
  EXPECT_NEAR(m.next_completion_time(), 1.0 + m.batch_time({{0, 1, 1e6}}), kEps);
  auto done = m.advance_to(m.next_completion_time());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].id, b);
  EXPECT_EQ(m.next_completion_time(), NetworkModel::kNever);
}

TEST(AnalyticalModelTest, PeerCacheMissesCountPerSender) {
  StarTopology topo(1, 5);
  NetworkParams np;
  np.message_overhead_s = 1e-6;
  np.peer_cache = 2;
  np.peer_miss_overhead_s = 4e-6;
  AnalyticalModel m(topo, np);
  // gpu0 posts 4 messages: each costs 1 + 4 * (1 - 2/4) = 3 us of endpoint time.
  EXPECT_NEAR(m.batch_time({{0, 1, 1e6}, {0, 2, 1e6}, {0, 3, 1e6}, {0, 4, 1e6}}),
              kLinkLat + 4 * 3e-6 + 4e6 / kLinkBw, kEps);
  // Two senders with two messages each stay within the cache: 1 us per message.
  EXPECT_NEAR(m.batch_time({{0, 1, 1e6}, {0, 2, 1e6}, {3, 1, 1e6}, {3, 2, 1e6}}),
              kLinkLat + 2 * 1e-6 + 2e6 / kLinkBw, kEps);
}

TEST(AnalyticalModelTest, EngineWithAnalyticalBatchesMatchesHandComputation) {
  StarTopology topo(1, 2);
  Plan plan(2);
  auto sm = plan.stream("comm");
  const double S = 10e6;
  OpId c = plan.add_collective(sm, a2a(Bytes(S), world(plan)), {}, "a2a");
  EngineConfig cfg = test_config();
  auto net = make_network_model(NetworkKind::kAnalytical, topo, cfg.net);
  EXPECT_EQ(net->name(), "analytical");
  RunResult r = run_plan(plan, topo, cfg, *net);
  // Linear: each rank sends S/2 to the other; the self chunk's copy (2 * S/2 HBM bytes, 10 us)
  // runs alongside the 51 us transfer.
  EXPECT_NEAR(r.op_end(c, 0), kLinkLat + S / 2 / kLinkBw, 1e-12);
}

// ---- run result -------------------------------------------------------------------------------

TEST(RunResultTest, SummaryRejectsMissingTimes) {
  Plan plan(2);
  auto s = plan.stream("compute");
  plan.add_compute(RankSet::all(2), s, flops_op(1), {}, "a");
  RunResult r;
  init_run_result(plan, r);
  EXPECT_EQ(r.num_ops(), 1);
  EXPECT_EQ(r.start_s.size(), 2u);
  r.start_s[0] = 0;
  r.end_s[0] = 1;
  EXPECT_THROW(summarize_run(plan, r), InternalError);
  r.start_s[1] = 0.5;
  r.end_s[1] = 3;
  summarize_run(plan, r);
  EXPECT_DOUBLE_EQ(r.makespan_s, 3);
  EXPECT_DOUBLE_EQ(r.breakdown.compute_s, (1 + 2.5) / 2);
}

// A missing time is reported as the 256-rank-block pass found it: the lowest op among the first
// 256 ranks with a gap, even when a later op misses a lower rank or the ranks span many blocks.
TEST(RunResultTest, SummaryNamesTheFirstMissingTimeOfTheFirstRankBlock) {
  Plan plan(600);
  auto s = plan.stream("compute");
  plan.add_compute(RankSet::all(600), s, flops_op(1), {}, "a");
  plan.add_compute(RankSet::all(600), s, flops_op(1), {}, "b");
  RunResult r;
  init_run_result(plan, r);
  std::fill(r.start_s.begin(), r.start_s.end(), 0.0);
  std::fill(r.end_s.begin(), r.end_s.end(), 1.0);
  auto message = [&] {
    try {
      summarize_run(plan, r);
    } catch (const InternalError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  r.end_s[r.entry(0, 200)] = std::numeric_limits<double>::quiet_NaN();  // a, rank 200
  r.end_s[r.entry(1, 10)] = std::numeric_limits<double>::quiet_NaN();   // b, rank 10
  EXPECT_NE(message().find("op 0 'a' has no time on rank 200"), std::string::npos) << message();
  r.end_s[r.entry(0, 200)] = 1.0;
  r.end_s[r.entry(0, 300)] = std::numeric_limits<double>::quiet_NaN();  // a, rank 300
  EXPECT_NE(message().find("op 1 'b' has no time on rank 10"), std::string::npos) << message();
  r.end_s[r.entry(1, 10)] = 1.0;
  EXPECT_NE(message().find("op 0 'a' has no time on rank 300"), std::string::npos) << message();
}

// Large enough (4,096 ranks x 1,000 ops) for the summary to split its rank blocks over threads;
// the totals are exact binary fractions, so any lost, doubled or misplaced block shows.
TEST(RunResultTest, SummaryOfManyRanksIsExact) {
  const int P = 4096, n = 1000;
  Plan plan(P);
  auto s = plan.stream("compute");
  for (int i = 0; i < n; ++i) plan.add_compute(RankSet::all(P), s, flops_op(1), {}, "c");
  RunResult r;
  init_run_result(plan, r);
  // Op i runs [i, i + d_r) on rank r, d_r = 0.25 * (1 + r % 3): ranks of 0.25, 0.5, 0.75 s.
  for (int i = 0; i < n; ++i)
    for (int rank = 0; rank < P; ++rank) {
      r.start_s[r.entry(i, rank)] = i;
      r.end_s[r.entry(i, rank)] = i + 0.25 * (1 + rank % 3);
    }
  summarize_run(plan, r);
  // 1,366 ranks of 0.25, 1,365 of 0.5 and 1,365 of 0.75 s per op.
  const double per_op = (1366 * 0.25 + 1365 * 0.5 + 1365 * 0.75) / P;
  EXPECT_DOUBLE_EQ(r.breakdown.compute_s, n * per_op);
  EXPECT_DOUBLE_EQ(r.makespan_s, (n - 1) + 0.75);
  EXPECT_DOUBLE_EQ(r.breakdown.exposed_comm_s, 0.0);
  r.start_s[r.entry(n - 1, P - 1)] = std::numeric_limits<double>::quiet_NaN();
  r.start_s[r.entry(7, 3000)] = std::numeric_limits<double>::quiet_NaN();
  try {
    summarize_run(plan, r);
    ADD_FAILURE() << "a missing time passed";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("op 7 'c' has no time on rank 3000"), std::string::npos)
        << e.what();
  }
}

// ---- trace ------------------------------------------------------------------------------------

TEST(TraceTest, SampleCoversBothEndsAndIsBounded) {
  auto all = trace_sample_ranks(8, 4, 64);
  EXPECT_EQ(all.size(), 8u);
  auto s = trace_sample_ranks(4096, 8, 32);
  EXPECT_EQ(s.size(), 32u);
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(s[r], r);              // first node
  for (int r = 0; r < 8; ++r) EXPECT_EQ(s[24 + r], 4088 + r);  // last node
  EXPECT_EQ(trace_sample_ranks(100, 0, 1).size(), 1u);
}

TEST(TraceTest, ChromeTraceParsesWithOneProcessPerSampledRank) {
  StarTopology topo(2, 4);
  Plan plan(8);
  auto sc = plan.stream("compute");
  auto sm = plan.stream("comm");
  OpId a = plan.add_compute(RankSet::all(8), sc, flops_op(1e9), {}, "gate");
  plan.add_collective(sm, a2a(Bytes(1e6), world(plan)), {a}, "dispatch");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  for (int max_ranks : {64, 3}) {
    std::stringstream ss;
    write_chrome_trace(plan, r, ss, max_ranks);
    auto j = nlohmann::json::parse(ss.str());
    std::set<int> procs, with_events;
    int complete = 0;
    for (const auto& e : j.at("traceEvents")) {
      if (e.at("ph") == "M" && e.at("name") == "process_name") procs.insert(e.at("pid").get<int>());
      if (e.at("ph") == "X") {
        ++complete;
        with_events.insert(e.at("pid").get<int>());
        EXPECT_GE(e.at("dur").get<double>(), 0);
      }
    }
    auto sample = trace_sample_ranks(8, 4, max_ranks);
    EXPECT_EQ(procs, std::set<int>(sample.begin(), sample.end()));
    EXPECT_EQ(with_events, procs);
    EXPECT_EQ(complete, 2 * static_cast<int>(sample.size()));
    EXPECT_EQ(j.at("otherData").at("sampled_ranks").size(), sample.size());
  }
}

// A collective the library ran with its own algorithm (the GPU path's ncclAllReduce and kin) is
// named "nccl" in the trace, not by the algorithm moesim would have chosen.
TEST(TraceTest, LibraryAlgorithmIsNamedNccl) {
  StarTopology topo(2, 4);
  Plan plan(8);
  auto sm = plan.stream("comm");
  plan.add_collective(sm, a2a(Bytes(1e6), world(plan)), {}, "dispatch");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  auto algos = [&] {
    std::stringstream ss;
    write_chrome_trace(plan, r, ss, 64);
    const auto j = nlohmann::json::parse(ss.str());
    std::set<std::string> out;
    for (const auto& e : j.at("traceEvents"))
      if (e.at("ph") == "X") out.insert(e.at("args").at("algo").get<std::string>());
    return out;
  };
  ASSERT_EQ(r.collectives.size(), 1u);
  EXPECT_EQ(algos(), std::set<std::string>{std::string(record_algo_name(r.collectives[0]))});
  EXPECT_NE(record_algo_name(r.collectives[0]), "nccl");
  r.collectives[0].library_algo = true;
  r.collectives[0].algo = CollectiveAlgo::kAuto;
  EXPECT_EQ(algos(), std::set<std::string>{"nccl"});
}

// Two runs in one trace: each run's ranks are their own processes (pids offset by the ranks of the
// runs before), named after the run, sorted run by run; otherData lists the runs.
TEST(TraceTest, SeveralRunsShareOneTraceWithoutSharingPids) {
  StarTopology topo(2, 4);
  Plan plan(8);
  auto sc = plan.stream("compute");
  plan.add_compute(RankSet::all(8), sc, flops_op(1e9), {}, "gate");
  FakeNetwork net(1e9);
  RunResult r = run_plan(plan, topo, test_config(), net);
  std::stringstream ss;
  write_chrome_trace({{"one", &plan, &r}, {"two", &plan, &r}}, ss, 3);
  auto j = nlohmann::json::parse(ss.str());
  const auto sample = trace_sample_ranks(8, 4, 3);
  std::map<int, std::string> name_of;
  std::map<int, int> sort_of;
  std::set<int> with_events;
  for (const auto& e : j.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      name_of[e.at("pid").get<int>()] = e.at("args").at("name").get<std::string>();
    if (e.at("ph") == "M" && e.at("name") == "process_sort_index")
      sort_of[e.at("pid").get<int>()] = e.at("args").at("sort_index").get<int>();
    if (e.at("ph") == "X") with_events.insert(e.at("pid").get<int>());
  }
  ASSERT_EQ(name_of.size(), 2 * sample.size());
  for (std::size_t i = 0; i < sample.size(); ++i) {
    const int rank = sample[i];
    const std::string suffix =
        "rank " + std::to_string(rank) + " (node " + std::to_string(rank / 4) + ")";
    EXPECT_EQ(name_of[rank], "one: " + suffix);
    EXPECT_EQ(name_of[8 + rank], "two: " + suffix);
    EXPECT_EQ(sort_of[rank], static_cast<int>(i));
    EXPECT_EQ(sort_of[8 + rank], static_cast<int>(sample.size() + i));
  }
  EXPECT_EQ(with_events.size(), 2 * sample.size());
  const auto& runs = j.at("otherData").at("runs");
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[1].at("name"), "two");
  EXPECT_EQ(runs[1].at("pid_offset"), 8);
  EXPECT_EQ(runs[1].at("sampled_ranks").size(), sample.size());
}

}  // namespace
}  // namespace moesim::sim
