// Tests of the collective algorithm library: exact lowerings on tiny groups, data-movement
// correctness of every layout (labelled bytes pushed through the phases), byte conservation, the
// analytical formula (exact on one link, fast paths equal to the generic evaluation), selection.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "core/error.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/fabric_cuts.hpp"
#include "topology/topology.hpp"

namespace moesim::collectives {
namespace {

using topology::Link;
using topology::LinkId;
using topology::Vertex;
using topology::VertexKind;

// nodes x m GPUs. Each node: one NVSwitch (GPU <-> switch: intra_bw, intra_lat/2 each way).
// Each GPU has its own NIC (GPU <-> NIC: nic_bw, no latency), every NIC on one core switch
// (NIC <-> core: nic_bw, inter_lat/2). So an intra-node pair has alpha = intra_lat and
// bandwidth intra_bw; an inter-node pair alpha = inter_lat and bandwidth nic_bw.
class FakeCluster : public topology::Topology {
 public:
  struct Params {
    int nodes = 2, m = 2;
    double intra_bw = 100e9, intra_lat = 1e-6;
    double nic_bw = 25e9, inter_lat = 4e-6;
    double hbm_bw = 0;
  };
  static ClusterSpec make_spec(const Params& p) {
    ClusterSpec s;
    s.nodes = p.nodes;
    s.gpus_per_node = p.m;
    s.gpu.name = "fake";
    s.gpu.hbm_bandwidth = BytesPerSecond(p.hbm_bw);
    return s;
  }
  explicit FakeCluster(Params p) : Topology(make_spec(p)) {
    const int gpus = p.nodes * p.m;
    for (int g = 0; g < gpus; ++g) {
      gpu_vertex_.push_back(add_vertex({VertexKind::kGpu, g / p.m, g, 0, "gpu"}));
    }
    std::vector<topology::VertexId> sw, nic;
    for (int n = 0; n < p.nodes; ++n)
      sw.push_back(add_vertex({VertexKind::kNvswitch, n, n, 0, "sw"}));
    for (int g = 0; g < gpus; ++g)
      nic.push_back(add_vertex({VertexKind::kNic, g / p.m, 0, 0, "nic"}));
    const auto core = add_vertex({VertexKind::kSwitch, -1, 0, 1, "core"});
    for (int g = 0; g < gpus; ++g) {
      add_cable(gpu_vertex_[g], sw[g / p.m], p.intra_bw, p.intra_lat / 2, 0);  // cable 3g
      add_cable(gpu_vertex_[g], nic[g], p.nic_bw, 0, 0);                       // cable 3g+1
      add_cable(nic[g], core, p.nic_bw, p.inter_lat / 2, 1);                   // cable 3g+2
    }
    gpus_per_nic_ = 1;
  }
  void route(int src, int dst, std::vector<LinkId>& out) const override {
    auto up = [](int g, int k) { return static_cast<LinkId>(2 * (3 * g + k)); };
    if (node_of(src) == node_of(dst)) {
      out.push_back(up(src, 0));
      out.push_back(up(dst, 0) + 1);
    } else {
      out.push_back(up(src, 1));
      out.push_back(up(src, 2));
      out.push_back(up(dst, 2) + 1);
      out.push_back(up(dst, 1) + 1);
    }
  }

 private:
  topology::VertexId add_vertex(Vertex v) {
    vertices_.push_back(std::move(v));
    return static_cast<topology::VertexId>(vertices_.size() - 1);
  }
  void add_cable(topology::VertexId a, topology::VertexId b, double bw, double lat, int tier) {
    links_.push_back({a, b, BytesPerSecond(bw), Seconds(lat), tier});
    links_.push_back({b, a, BytesPerSecond(bw), Seconds(lat), tier});
  }
};

// Two GPUs joined by one cable: the textbook alpha-beta case.
class OneLink : public topology::Topology {
 public:
  OneLink(double bw, double lat) : Topology(spec()) {
    vertices_.push_back({VertexKind::kGpu, 0, 0, 0, "gpu0"});
    vertices_.push_back({VertexKind::kGpu, 0, 1, 0, "gpu1"});
    gpu_vertex_ = {0, 1};
    links_.push_back({0, 1, BytesPerSecond(bw), Seconds(lat), 0});
    links_.push_back({1, 0, BytesPerSecond(bw), Seconds(lat), 0});
  }
  void route(int src, int, std::vector<LinkId>& out) const override {
    out.push_back(src == 0 ? 0 : 1);
  }

 private:
  static ClusterSpec spec() {
    ClusterSpec s;
    s.nodes = 1;
    s.gpus_per_node = 2;
    return s;
  }
};

CollectiveCall make_call(const CollectiveSpec& spec, const std::vector<int>& group) {
  CollectiveCall c;
  c.spec = &spec;
  c.group = &group;
  return c;
}

std::vector<int> iota_group(int w, int first = 0) {
  std::vector<int> g(w);
  std::iota(g.begin(), g.end(), first);
  return g;
}

CollectiveSpec make_spec(CollectiveType type, CollectiveAlgo algo, double bytes) {
  CollectiveSpec s;
  s.type = type;
  s.algo = algo;
  s.bytes = Bytes(bytes);
  return s;
}

const Algorithm& algo_of(CollectiveType t, CollectiveAlgo a) {
  const Algorithm* p = find_algorithm(t, a);
  EXPECT_NE(p, nullptr);
  return *p;
}

std::shared_ptr<ByteMatrix> dense_matrix(int w, const std::vector<std::uint32_t>& counts) {
  auto m = std::make_shared<ByteMatrix>();
  m->size = w;
  m->dense = true;
  m->counts = counts;
  return m;
}

std::shared_ptr<ByteMatrix> to_sparse(const ByteMatrix& d) {
  auto m = std::make_shared<ByteMatrix>();
  m->size = d.size;
  m->unit = d.unit;
  m->dense = false;
  m->row_offsets.push_back(0);
  for (int s = 0; s < d.size; ++s) {
    for (int t = 0; t < d.size; ++t) {
      const auto v = d.counts[static_cast<size_t>(s) * d.size + t];
      if (v != 0) {
        m->cols.push_back(t);
        m->values.push_back(v);
      }
    }
    m->row_offsets.push_back(static_cast<std::int64_t>(m->cols.size()));
  }
  return m;
}

std::vector<std::uint32_t> random_counts(int w, std::uint32_t seed, int max_count,
                                         double zero_fraction) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> val(1, max_count);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<std::uint32_t> c(static_cast<size_t>(w) * w);
  for (auto& x : c) x = u(rng) < zero_fraction ? 0 : static_cast<std::uint32_t>(val(rng));
  return c;
}

size_t as_index(double v) {
  EXPECT_EQ(v, std::round(v)) << "offset not integral";
  return static_cast<size_t>(std::llround(v));
}

// ---- Byte-level executor: pushes labelled bytes through an all-to-all(v) lowering ------------
// Element e of rank p's send buffer, destined for position d, is labelled p * kLab + d (with
// packed layouts, the label says source and destination; the order within a block is checked
// through the element index).
using Label = std::int64_t;
struct Buffers {
  std::vector<Label> buf[3];
};

void run_a2a_phases(const std::vector<Phase>& phases, const std::vector<int>& group,
                    std::map<int, Buffers>& state) {
  for (const Phase& ph : phases) {
    const int s = static_cast<int>(ph.src), d = static_cast<int>(ph.dst);
    if (ph.kind == Phase::Kind::kCopy && ph.stride_h > 0) {
      const size_t c = as_index(ph.chunk_bytes);
      for (int r : group) {
        auto& in = state[r].buf[s];
        auto& out = state[r].buf[d];
        const int chunks = ph.stride_h * ph.stride_w;
        for (int i = 0; i < chunks; ++i) {
          const int o = stride_copy_index(i, ph.stride_h, ph.stride_w);
          for (size_t e = 0; e < c; ++e) out[o * c + e] = in[i * c + e];
        }
      }
    }
    std::map<int, Buffers> before = state;  // transfers of one phase read the pre-phase state
    for (const LocalCopy& lc : ph.copies) {
      for (size_t e = 0; e < as_index(lc.bytes); ++e) {
        state[lc.rank].buf[d][as_index(lc.dst_offset) + e] =
            before[lc.rank].buf[s][as_index(lc.src_offset) + e];
      }
    }
    ASSERT_EQ(ph.chunks.size(), ph.transfers.size());
    for (size_t i = 0; i < ph.transfers.size(); ++i) {
      const auto& t = ph.transfers[i];
      for (size_t e = 0; e < as_index(t.bytes); ++e) {
        state[t.dst].buf[d][as_index(ph.chunks[i].recv_offset) + e] =
            before[t.src].buf[s][as_index(ph.chunks[i].send_offset) + e];
      }
    }
  }
}

// Runs an all_to_allv lowering with matrix counts (unit 1 byte) and checks that every receive
// buffer ends packed by source, each block in the sender's order.
void check_a2av_data(const std::vector<Phase>& phases, const std::vector<int>& group,
                     const ByteMatrix& mat) {
  const int w = mat.size;
  const size_t cap = static_cast<size_t>(mat.total().value()) + 1;
  std::map<int, Buffers> state;
  constexpr Label kLab = 1 << 20;
  for (int p = 0; p < w; ++p) {
    Buffers& b = state[group[p]];
    for (auto& v : b.buf) v.assign(cap, -1);
    size_t e = 0;
    for (int d = 0; d < w; ++d)
      for (int i = 0; i < static_cast<int>(mat.at(p, d).value()); ++i)
        b.buf[0][e++] = (static_cast<Label>(p) * w + d) * kLab + i;
  }
  run_a2a_phases(phases, group, state);
  for (int q = 0; q < w; ++q) {
    const auto& recv = state[group[q]].buf[static_cast<int>(Buffer::kRecv)];
    size_t e = 0;
    for (int s = 0; s < w; ++s)
      for (int i = 0; i < static_cast<int>(mat.at(s, q).value()); ++i, ++e)
        ASSERT_EQ(recv[e], (static_cast<Label>(s) * w + q) * kLab + i)
            << "rank pos " << q << " element " << e;
  }
}

ByteMatrix uniform_matrix(int w, std::uint32_t chunk) {
  ByteMatrix m;
  m.size = w;
  m.counts.assign(static_cast<size_t>(w) * w, chunk);
  return m;
}

double transfer_bytes(const Phase& ph) {
  double s = 0;
  for (const auto& t : ph.transfers) s += t.bytes;
  return s * ph.repeat;
}
double copy_bytes(const Phase& ph) {
  double s = 0;
  for (const auto& c : ph.copies) s += c.bytes;
  return s;
}

// ---- Stride copy ------------------------------------------------------------------------------

TEST(StrideCopy, MatchesTheSpecAndIsInvertedByTheTransposedCopy) {
  // T(h=2, w=3): slice i = a*2 + j goes to j*3 + a.
  const std::vector<int> expect = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(stride_copy_index(i, 2, 3), expect[i]);
  for (int h : {1, 2, 3, 4, 8}) {
    for (int w : {1, 2, 5, 8}) {
      std::set<int> seen;
      for (int i = 0; i < h * w; ++i) {
        const int o = stride_copy_index(i, h, w);
        seen.insert(o);
        EXPECT_EQ(stride_copy_index(o, w, h), i);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), h * w);
    }
  }
}

// ---- 2DH --------------------------------------------------------------------------------------

TEST(TwoDh, TwoNodesTwoGpusExactTransfers) {
  FakeCluster topo({});
  const auto group = iota_group(4);
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 4000);
  const CollectiveCall call = make_call(spec, group);
  const auto phases = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh).lower(call, topo);
  ASSERT_EQ(phases.size(), 4u);
  EXPECT_EQ(phases[0].kind, Phase::Kind::kCopy);
  EXPECT_EQ(phases[0].label, "stride_copy_1");
  EXPECT_EQ(phases[0].stride_h, 2);
  EXPECT_EQ(phases[0].stride_w, 2);
  EXPECT_EQ(phases[0].local_bytes, Bytes(8000));
  EXPECT_EQ(phases[2].label, "stride_copy_2");
  // chunk = 1000; intra: each GPU sends n*chunk = 2000 to its node peer; inter: m*chunk = 2000
  // to the same-local-index GPU on the other node.
  auto as_tuples = [](const Phase& ph) {
    std::vector<std::tuple<int, int, double>> v;
    for (const auto& t : ph.transfers) v.emplace_back(t.src, t.dst, t.bytes);
    return v;
  };
  using T = std::tuple<int, int, double>;
  EXPECT_EQ(phases[1].label, "intra");
  EXPECT_THAT(as_tuples(phases[1]),
              ::testing::ElementsAre(T{0, 1, 2000}, T{1, 0, 2000}, T{2, 3, 2000}, T{3, 2, 2000}));
  EXPECT_EQ(phases[3].label, "inter");
  EXPECT_THAT(as_tuples(phases[3]),
              ::testing::ElementsAre(T{0, 2, 2000}, T{1, 3, 2000}, T{2, 0, 2000}, T{3, 1, 2000}));
  // GPU 0 (a=0, j=0) sends scratch slots [k*n, k*n+n) = [2, 4) to local 1, landing at its
  // slots [0, 2); in the inter phase slots [b*m, b*m+m) = [2, 4) land at slots [0, 2).
  EXPECT_EQ(phases[1].chunks[0].send_offset, 2000);
  EXPECT_EQ(phases[1].chunks[0].recv_offset, 0);
  EXPECT_EQ(phases[3].chunks[0].send_offset, 2000);
  EXPECT_EQ(phases[3].chunks[0].recv_offset, 0);
  EXPECT_EQ(phases[3].chunks[2].send_offset, 0);     // GPU 2 (a=1) sends its slots [0, 2)
  EXPECT_EQ(phases[3].chunks[2].recv_offset, 2000);  // to GPU 0's slots [2, 4)
  EXPECT_EQ(phases[1].local_bytes, Bytes(4000));     // self block of n chunks, read + write
}

TEST(TwoDh, LabelledChunksEndInStandardOrder) {
  for (auto [nodes, m] : {std::pair{2, 2}, {3, 4}, {4, 2}, {2, 3}}) {
    FakeCluster topo({.nodes = nodes, .m = m});
    const int w = nodes * m;
    const auto group = iota_group(w);
    const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 3.0 * w);
    const CollectiveCall call = make_call(spec, group);
    const auto phases = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh).lower(call, topo);
    check_a2av_data(phases, group, uniform_matrix(w, 3));
  }
}

TEST(TwoDh, WorksOnAGroupThatIsASliceOfEveryNode) {
  // 3 nodes x 4 GPUs; the group takes local GPUs 1 and 3 of nodes 2, 0, 1 (in that order).
  FakeCluster topo({.nodes = 3, .m = 4});
  const std::vector<int> group = {9, 11, 1, 3, 5, 7};
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 12);
  const CollectiveCall call = make_call(spec, group);
  const auto& algo = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh);
  ASSERT_TRUE(algo.applicable(call, topo));
  check_a2av_data(algo.lower(call, topo), group, uniform_matrix(6, 2));
}

TEST(TwoDh, DegeneratesToLinearWithOneGpuPerNodeOrOneNode) {
  for (auto [nodes, m] : {std::pair{1, 4}, {4, 1}}) {
    FakeCluster topo({.nodes = nodes, .m = m});
    const auto group = iota_group(4);
    const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 4000);
    const CollectiveCall call = make_call(spec, group);
    const auto phases = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh).lower(call, topo);
    ASSERT_EQ(phases.size(), 1u);
    EXPECT_EQ(phases[0].label, "linear");
    EXPECT_EQ(phases[0].transfers.size(), 12u);
  }
}

TEST(TwoDh, NotApplicableGroupsAreRejectedWithAReason) {
  FakeCluster topo({.nodes = 2, .m = 2});
  auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 4096);
  const CostContext ctx{&topo, {}, BytesPerSecond(1e12)};
  const std::vector<std::vector<int>> bad = {
      {0, 2, 1, 3},  // interleaved nodes
      {0, 1, 2},     // 3 ranks, blocks of 2
      {0, 1, 3, 2},  // local order differs between nodes
  };
  for (const auto& group : bad) {
    const CollectiveCall call = make_call(spec, group);
    EXPECT_FALSE(algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh).applicable(call, topo));
    try {
      select_algorithm(call, ctx);
      ADD_FAILURE() << "expected InputError";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("2dh"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("node-aligned"));
    }
    // auto skips it and falls back to linear.
    auto auto_spec = spec;
    auto_spec.algo = CollectiveAlgo::kAuto;
    const CollectiveCall auto_call = make_call(auto_spec, group);
    EXPECT_EQ(select_algorithm(auto_call, ctx).algo(), CollectiveAlgo::kLinear);
  }
}

// ---- all_to_all(v) data and conservation --------------------------------------------------------

// ---- 3DH -----------------------------------------------------------------------------------

// A built fabric: `nodes` x `m` GPUs, fat tree (one NIC per GPU, leaves of `radix` ports, so
// radix / (2 m) nodes per leaf) or rail-optimized (rail switches of `radix` ports).
std::unique_ptr<topology::Topology> leaf_fabric(int nodes, int m, int radix, bool rails = false) {
  ClusterSpec cs;
  cs.gpu.name = "h100-sxm";
  cs.gpu.hbm_bandwidth = BytesPerSecond(3e12);
  cs.nodes = nodes;
  cs.gpus_per_node = m;
  cs.intra.kind = IntraKind::kNvswitch;
  cs.intra.bandwidth = BytesPerSecond(450e9);
  cs.inter.kind = rails ? InterKind::kRailOptimized : InterKind::kFatTree;
  cs.inter.nic_bandwidth = BytesPerSecond(50e9);
  cs.inter.nics_per_node = m;
  cs.inter.switch_radix = radix;
  return topology::build_topology(cs);
}

TEST(ThreeDh, LabelledChunksEndInStandardOrderWithOneMessagePerPeerAndLevel) {
  // (nodes, m, radix): leaf groups of radix / (2 m) nodes; rail switches of radix / 2 nodes.
  struct Case {
    int nodes, m, radix;
    bool rails;
    int l;  // nodes per leaf group
  };
  for (const Case c : {Case{4, 2, 8, false, 2}, Case{8, 2, 8, false, 2}, Case{6, 1, 6, false, 3},
                       Case{8, 4, 8, true, 4}}) {
    const auto topo = leaf_fabric(c.nodes, c.m, c.radix, c.rails);
    const int w = c.nodes * c.m, g = c.nodes / c.l;
    ASSERT_EQ(topo->tier(0, c.m), 1) << "nodes 0 and 1 share a leaf";
    ASSERT_GE(topo->tier(0, c.l * c.m), 2) << "node l is under another leaf";
    const auto group = iota_group(w);
    const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k3dh, 3.0 * w);
    const CollectiveCall call = make_call(spec, group);
    const Algorithm& algo = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k3dh);
    ASSERT_EQ(algo.inapplicable_reason(call, *topo), "");
    const auto phases = algo.lower(call, *topo);
    // A copy and an exchange per level (no intra level with one GPU per node).
    ASSERT_EQ(phases.size(), c.m > 1 ? 6u : 4u);
    check_a2av_data(phases, group, uniform_matrix(w, 3));
    // Messages per rank: m - 1 inside the node, l - 1 under the leaf, g - 1 across leaves; the
    // leaf level never leaves its leaf and the last level never stays under one.
    std::vector<int> sent(static_cast<size_t>(w), 0);
    for (const Phase& ph : phases) {
      for (const Transfer& t : ph.transfers) {
        ++sent[static_cast<size_t>(t.src)];
        if (ph.label == "leaf") {
          EXPECT_EQ(topo->tier(t.src, t.dst), 1);
        }
        if (ph.label == "inter") {
          EXPECT_GE(topo->tier(t.src, t.dst), 2);
        }
        if (ph.label == "intra") {
          EXPECT_EQ(topo->tier(t.src, t.dst), 0);
        }
      }
    }
    for (int r = 0; r < w; ++r)
      EXPECT_EQ(sent[static_cast<size_t>(r)], (c.m - 1) + (c.l - 1) + (g - 1));
  }
}

TEST(ThreeDh, NotApplicableWithoutSeveralLeavesOfSeveralNodes) {
  const Algorithm& algo = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k3dh);
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k3dh, 1 << 20);
  // One leaf for all 4 nodes; one node per leaf; 6 nodes in leaf groups of 4.
  const auto one_leaf = leaf_fabric(4, 2, 16);
  EXPECT_THAT(algo.inapplicable_reason(make_call(spec, iota_group(8)), *one_leaf),
              ::testing::HasSubstr("share one leaf switch (use 2dh)"));
  const auto per_node = leaf_fabric(4, 2, 4);
  EXPECT_THAT(algo.inapplicable_reason(make_call(spec, iota_group(8)), *per_node),
              ::testing::HasSubstr("under different leaf switches"));
  const auto uneven = leaf_fabric(6, 1, 8);
  EXPECT_THAT(algo.inapplicable_reason(make_call(spec, iota_group(6)), *uneven),
              ::testing::HasSubstr("do not split into leaf groups of 4"));
  EXPECT_THROW(algo.lower(make_call(spec, iota_group(6)), *uneven), InputError);
}

TEST(ThreeDh, AutoPicksItForSmallMessagesAcrossLeavesAndNotForLargeOnes) {
  // 64 nodes x 8 GPUs on rails of 32 nodes (2 leaf groups): 7 + 31 + 1 messages per rank
  // instead of 2DH's 7 + 63 and linear's 511; at 256 MiB its third copy and leaf bytes cost more.
  const auto topo = leaf_fabric(64, 8, 64, /*rails=*/true);
  const CostContext ctx{topo.get(), {1e-6, 1e-6}, BytesPerSecond(0)};
  const auto group = iota_group(512);
  auto time_of = [&](CollectiveAlgo a, double bytes) {
    const auto spec = make_spec(CollectiveType::kAllToAll, a, bytes);
    return find_algorithm(CollectiveType::kAllToAll, a)
        ->analytical_time(make_call(spec, group), ctx)
        .value();
  };
  const double mib = 1 << 20;
  EXPECT_LT(time_of(CollectiveAlgo::k3dh, mib), time_of(CollectiveAlgo::k2dh, mib));
  EXPECT_LT(time_of(CollectiveAlgo::k2dh, mib), time_of(CollectiveAlgo::kLinear, mib));
  EXPECT_GT(time_of(CollectiveAlgo::k3dh, 256 * mib), time_of(CollectiveAlgo::kLinear, 256 * mib));
  auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kAuto, mib);
  EXPECT_EQ(select_algorithm(make_call(spec, group), ctx).algo(), CollectiveAlgo::k3dh);
  spec.bytes = Bytes(256 * mib);
  EXPECT_NE(select_algorithm(make_call(spec, group), ctx).algo(), CollectiveAlgo::k3dh);
  // The closed form is the lowering's own cost (scaled lines), at both sizes.
  for (double bytes : {mib, 256 * mib}) {
    const auto s3 = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k3dh, bytes);
    const auto& algo = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k3dh);
    const double generic = phases_time(algo.lower(make_call(s3, group), *topo), ctx).value();
    EXPECT_NEAR(time_of(CollectiveAlgo::k3dh, bytes), generic, 1e-9 * generic);
  }
}

TEST(LinearAllToAll, LowersToOnePhaseWithSelfCopyAndMovesDataCorrectly) {
  FakeCluster topo({.nodes = 2, .m = 3});
  const auto group = iota_group(6);
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, 12);
  const CollectiveCall call = make_call(spec, group);
  const auto phases = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::kLinear).lower(call, topo);
  ASSERT_EQ(phases.size(), 1u);
  EXPECT_EQ(phases[0].transfers.size(), 30u);
  for (const auto& t : phases[0].transfers) {
    EXPECT_NE(t.src, t.dst);
    EXPECT_EQ(t.bytes, 2.0);
  }
  EXPECT_EQ(phases[0].copies.size(), 6u);
  EXPECT_EQ(phases[0].local_bytes, Bytes(4));
  check_a2av_data(phases, group, uniform_matrix(6, 2));
}

TEST(AllToAllv, DenseAndSparseGiveTheSameLoweringAndCorrectData) {
  FakeCluster topo({.nodes = 2, .m = 3});
  const auto group = iota_group(6, 0);
  const auto dense = dense_matrix(6, random_counts(6, 7, 5, 0.3));
  const auto sparse = to_sparse(*dense);
  for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
    auto spec = make_spec(CollectiveType::kAllToAllv, a, 0);
    spec.matrix = dense;
    const CollectiveCall call = make_call(spec, group);
    const auto& algo = algo_of(CollectiveType::kAllToAllv, a);
    const auto pd = algo.lower(call, topo);
    spec.matrix = sparse;
    const auto ps = algo.lower(call, topo);
    ASSERT_EQ(pd.size(), ps.size());
    for (size_t i = 0; i < pd.size(); ++i) {
      ASSERT_EQ(pd[i].transfers.size(), ps[i].transfers.size());
      for (size_t k = 0; k < pd[i].transfers.size(); ++k) {
        EXPECT_EQ(pd[i].transfers[k].dst, ps[i].transfers[k].dst);
        EXPECT_EQ(pd[i].transfers[k].bytes, ps[i].transfers[k].bytes);
      }
    }
    for (const auto& ph : pd)
      for (const auto& t : ph.transfers) EXPECT_GT(t.bytes, 0) << "zero entries must be skipped";
    check_a2av_data(pd, group, *dense);
    check_a2av_data(ps, group, *sparse);
  }
}

TEST(AllToAllv, LinearSkipsZeroEntriesExactly) {
  FakeCluster topo({.nodes = 1, .m = 3});
  const auto group = iota_group(3);
  // 0 -> 1: 5, 1 -> 2: 7, 2 -> 2 (self): 4, everything else 0.
  auto spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear, 0);
  spec.matrix = dense_matrix(3, {0, 5, 0, 0, 0, 7, 0, 0, 4});
  const CollectiveCall call = make_call(spec, group);
  const auto phases =
      algo_of(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear).lower(call, topo);
  ASSERT_EQ(phases.size(), 1u);
  ASSERT_EQ(phases[0].transfers.size(), 2u);
  EXPECT_EQ(phases[0].transfers[0].src, 0);
  EXPECT_EQ(phases[0].transfers[0].dst, 1);
  EXPECT_EQ(phases[0].transfers[0].bytes, 5);
  EXPECT_EQ(phases[0].transfers[1].bytes, 7);
  ASSERT_EQ(phases[0].copies.size(), 1u);
  EXPECT_EQ(phases[0].copies[0].bytes, 4);
  EXPECT_EQ(phases[0].local_bytes, Bytes(8));
}

// deepep (DeepEP's per-node dispatch), worked by hand on 2 nodes x 2 GPUs (positions 0, 1 on
// node 0; 2, 3 on node 1), 10 bytes per token. Distinct tokens per destination GPU (rows: the
// source) and per destination node (own-node entries are not sent and set to junk):
//   gpu  0: 5 3 4 2   1: 1 6 0 3   2: 2 0 7 1   3: 0 0 0 9
//   node 0: - 5       1: - 3       2: 2 -       3: 0 -
// inter: each GPU to its rail peer on the other node, its distinct tokens for that node:
//   0 -> 2: 5, 1 -> 3: 3, 2 -> 0: 2, 3 -> 1: nothing.
// intra: forwarder (b, j) to (b, k), the tokens of every source with local index j for (b, k):
//   0 -> 1: gpu[0][1] + gpu[2][1] = 3; 1 -> 0: gpu[1][0] + gpu[3][0] = 1;
//   2 -> 3: gpu[0][3] + gpu[2][3] = 3; 3 -> 2: gpu[1][2] + gpu[3][2] = 0 (nothing).
// Without layout (the simulator) both sets are one phase (DeepEP pipelines the forwarding with
// the RDMA sends); the combine runs the same transfers reversed. With layout (exec/) they are two
// phases, inter then intra, at row offsets (x 10 bytes):
//   inter: every send and receive at offset 0 (one block per rank here);
//   intra: forwarder f's rows per target k ascending (k = f's own index: a local copy), the
//   target's per forwarder j ascending. The blocks fwd[j][t] = sum over a of gpu[(a, j)][t]:
//   t = 0: fwd[0] 7 (self copy on 0), fwd[1] 1;  t = 1: fwd[0] 3, fwd[1] 6 (self copy on 1);
//   t = 2: fwd[0] 11 (self copy on 2), fwd[1] 0;  t = 3: fwd[0] 3, fwd[1] 12 (self copy on 3).
//   So 0 -> 1 sends from 70 (after its 7 own rows) to 0; 1 -> 0 from 0 to 70 (after the 7 of
//   forwarder 0); 2 -> 3 from 110 to 0; copies (rank, from, to, bytes): (0, 0, 0, 70),
//   (1, 10, 30, 60), (2, 0, 0, 110), (3, 0, 30, 120).
// The combine with layout: the intra set reversed (offsets swapped), then the inter set reversed.
TEST(AllToAllv, DeepepSendsEachTokenOncePerNodeThenOncePerGpu) {
  FakeCluster topo({});
  const auto group = iota_group(4);
  auto dedup = std::make_shared<NodeDedup>();
  dedup->size = 4;
  dedup->nodes = 2;
  dedup->unit = Bytes(10);
  dedup->gpu_tokens = {5, 3, 4, 2, 1, 6, 0, 3, 2, 0, 7, 1, 0, 0, 0, 9};
  dedup->node_tokens = {77, 5, 77, 3, 2, 77, 0, 77};
  auto spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::kDeepep, 0);
  const auto& algo = algo_of(CollectiveType::kAllToAllv, CollectiveAlgo::kDeepep);
  EXPECT_THAT(algo.inapplicable_reason(make_call(spec, group), topo),
              ::testing::HasSubstr("per-node token counts"));
  spec.node_dedup = {dedup};
  using T = std::tuple<int, int, double>;
  auto list = [](const Phase& ph) {
    std::vector<T> out;
    for (const Transfer& t : ph.transfers) out.emplace_back(t.src, t.dst, t.bytes);
    return out;
  };
  auto sim_call = [&] {
    CollectiveCall c = make_call(spec, group);
    c.with_layout = false;
    return c;
  };
  auto phases = algo.lower(sim_call(), topo);
  ASSERT_EQ(phases.size(), 1u);
  EXPECT_EQ(phases[0].label, "dispatch");
  EXPECT_THAT(list(phases[0]), ::testing::ElementsAre(T{0, 2, 50}, T{1, 3, 30}, T{2, 0, 20},
                                                      T{0, 1, 30}, T{1, 0, 10}, T{2, 3, 30}));
  EXPECT_TRUE(phases[0].chunks.empty());
  const CostContext ctx{&topo, {}, BytesPerSecond(0)};
  EXPECT_EQ(algo.analytical_time(make_call(spec, group), ctx), phases_time(phases, ctx));

  using C = std::tuple<double, double>;  // (send offset, receive offset)
  auto offsets = [](const Phase& ph) {
    std::vector<C> out;
    for (const ChunkRef& c : ph.chunks) out.emplace_back(c.send_offset, c.recv_offset);
    return out;
  };
  using L = std::tuple<int, double, double, double>;
  auto copies = [](const Phase& ph) {
    std::vector<L> out;
    for (const LocalCopy& c : ph.copies)
      out.emplace_back(c.rank, c.src_offset, c.dst_offset, c.bytes);
    return out;
  };
  phases = algo.lower(make_call(spec, group), topo);
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[0].label, "dispatch_inter");
  EXPECT_THAT(list(phases[0]), ::testing::ElementsAre(T{0, 2, 50}, T{1, 3, 30}, T{2, 0, 20}));
  EXPECT_THAT(offsets(phases[0]), ::testing::ElementsAre(C{0, 0}, C{0, 0}, C{0, 0}));
  EXPECT_TRUE(phases[0].copies.empty());
  EXPECT_EQ(phases[1].label, "dispatch_intra");
  EXPECT_THAT(list(phases[1]), ::testing::ElementsAre(T{0, 1, 30}, T{1, 0, 10}, T{2, 3, 30}));
  EXPECT_THAT(offsets(phases[1]), ::testing::ElementsAre(C{70, 0}, C{0, 70}, C{110, 0}));
  EXPECT_THAT(copies(phases[1]), ::testing::ElementsAre(L{0, 0, 0, 70}, L{1, 10, 30, 60},
                                                        L{2, 0, 0, 110}, L{3, 0, 30, 120}));

  spec.dedup_combine = true;
  phases = algo.lower(sim_call(), topo);
  ASSERT_EQ(phases.size(), 1u);
  EXPECT_EQ(phases[0].label, "combine");
  EXPECT_THAT(list(phases[0]), ::testing::ElementsAre(T{2, 0, 50}, T{3, 1, 30}, T{0, 2, 20},
                                                      T{1, 0, 30}, T{0, 1, 10}, T{3, 2, 30}));
  phases = algo.lower(make_call(spec, group), topo);
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[0].label, "combine_intra");
  EXPECT_THAT(list(phases[0]), ::testing::ElementsAre(T{1, 0, 30}, T{0, 1, 10}, T{3, 2, 30}));
  EXPECT_THAT(offsets(phases[0]), ::testing::ElementsAre(C{0, 70}, C{70, 0}, C{0, 110}));
  EXPECT_THAT(copies(phases[0]), ::testing::ElementsAre(L{0, 0, 0, 70}, L{1, 30, 10, 60},
                                                        L{2, 0, 0, 110}, L{3, 30, 0, 120}));
  EXPECT_EQ(phases[1].label, "combine_inter");
  EXPECT_THAT(list(phases[1]), ::testing::ElementsAre(T{2, 0, 50}, T{3, 1, 30}, T{0, 2, 20}));
  EXPECT_THAT(offsets(phases[1]), ::testing::ElementsAre(C{0, 0}, C{0, 0}, C{0, 0}));

  // The inter blocks' offsets on 3 nodes of one GPU (every token of another node arrives by
  // fabric; the intra set is each rank's own copy of sum over sources of gpu[s][t] rows):
  //   node  0: - 4 2   1: 3 - 5   2: 1 6 -     (own tokens on the diagonal of gpu: 7 8 9)
  // source s sends its blocks by destination node ascending; forwarder b receives them by
  // source node ascending: 0 -> 1 (40 @ 0 -> 0), 0 -> 2 (20 @ 40 -> 0), 1 -> 0 (30 @ 0 -> 0),
  // 1 -> 2 (50 @ 30 -> 20), 2 -> 0 (10 @ 0 -> 30), 2 -> 1 (60 @ 10 -> 40); copies of 11, 18, 16
  // rows.
  {
    FakeCluster three({.nodes = 3, .m = 1});
    const auto g3 = iota_group(3);
    auto d3 = std::make_shared<NodeDedup>();
    d3->size = 3;
    d3->nodes = 3;
    d3->unit = Bytes(10);
    d3->gpu_tokens = {7, 4, 2, 3, 8, 5, 1, 6, 9};
    d3->node_tokens = {7, 4, 2, 3, 8, 5, 1, 6, 9};
    auto s3 = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::kDeepep, 0);
    s3.node_dedup = {d3};
    const auto ph = algo.lower(make_call(s3, g3), three);
    ASSERT_EQ(ph.size(), 2u);
    EXPECT_THAT(list(ph[0]), ::testing::ElementsAre(T{0, 1, 40}, T{0, 2, 20}, T{1, 0, 30},
                                                    T{1, 2, 50}, T{2, 0, 10}, T{2, 1, 60}));
    EXPECT_THAT(offsets(ph[0]),
                ::testing::ElementsAre(C{0, 0}, C{40, 0}, C{0, 0}, C{30, 20}, C{0, 30}, C{10, 40}));
    EXPECT_TRUE(ph[1].transfers.empty());
    EXPECT_THAT(copies(ph[1]),
                ::testing::ElementsAre(L{0, 0, 0, 110}, L{1, 0, 0, 180}, L{2, 0, 0, 160}));
  }

  // Counts for another group shape are refused with what they are for.
  dedup->nodes = 1;
  EXPECT_THAT([&] { (void)algo.lower(make_call(spec, group), topo); },
              ::testing::ThrowsMessage<InputError>(::testing::HasSubstr("4 positions on 1 nodes")));
}

TEST(AllToAllv, TwoDhMovesSkewedDataOnSeveralGrids) {
  for (auto [nodes, m, seed] : {std::tuple{2, 2, 1u}, {3, 2, 2u}, {2, 4, 3u}, {4, 3, 4u}}) {
    FakeCluster topo({.nodes = nodes, .m = m});
    const int w = nodes * m;
    const auto group = iota_group(w);
    auto spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::k2dh, 0);
    spec.matrix = dense_matrix(w, random_counts(w, seed, 4, 0.4));
    const CollectiveCall call = make_call(spec, group);
    check_a2av_data(algo_of(CollectiveType::kAllToAllv, CollectiveAlgo::k2dh).lower(call, topo),
                    group, *spec.matrix);
  }
}

TEST(Conservation, EveryTransferPhaseOfAllToAllMovesEachByteOnce) {
  FakeCluster topo({.nodes = 3, .m = 4});
  const int w = 12;
  const double size = 12 * 1000;
  const auto group = iota_group(w);
  for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
    const auto spec = make_spec(CollectiveType::kAllToAll, a, size);
    const CollectiveCall call = make_call(spec, group);
    for (const Phase& ph : algo_of(CollectiveType::kAllToAll, a).lower(call, topo)) {
      if (ph.kind != Phase::Kind::kTransfers) continue;
      // Network transfers plus self copies = all the data of all ranks.
      EXPECT_DOUBLE_EQ(transfer_bytes(ph) + copy_bytes(ph), w * size) << ph.label;
    }
  }
  auto spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::k2dh, 0);
  spec.matrix = dense_matrix(w, random_counts(w, 9, 100, 0.2));
  for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
    spec.algo = a;
    const CollectiveCall call = make_call(spec, group);
    for (const Phase& ph : algo_of(CollectiveType::kAllToAllv, a).lower(call, topo)) {
      if (ph.kind != Phase::Kind::kTransfers) continue;
      EXPECT_DOUBLE_EQ(transfer_bytes(ph) + copy_bytes(ph), spec.matrix->total().value());
    }
  }
}

// ---- Ring, tree, hierarchical: contributor sets through the chunk layout -----------------------

// Each element of each rank's working buffer carries the set of ranks whose data it contains
// (bit mask). Transfers of reduce phases OR into the receiver, others overwrite. A repeated phase
// applies the documented shift: at step t a chunk index k becomes (k - t) mod ring size.
void run_reduction(const std::vector<Phase>& phases, std::map<int, std::vector<std::uint64_t>>& st,
                   const std::map<std::string_view, std::pair<int, double>>& ring_of_label) {
  for (const Phase& ph : phases) {
    if (ph.kind != Phase::Kind::kTransfers) continue;
    const bool reduce = ph.label.find("rs") != std::string_view::npos || ph.label == "tree_reduce";
    int ring = 1;
    double span = 0;
    if (ph.repeat > 1) std::tie(ring, span) = ring_of_label.at(ph.label);
    for (int t = 0; t < ph.repeat; ++t) {
      auto before = st;
      for (size_t i = 0; i < ph.transfers.size(); ++i) {
        const auto& tr = ph.transfers[i];
        double off = ph.chunks[i].send_offset;
        if (ph.repeat > 1) {
          const double base = std::floor(off / span) * span;
          const double c = span / ring;
          const int k = static_cast<int>(std::llround((off - base) / c));
          off = base + (((k - t) % ring + ring) % ring) * c;
        }
        for (size_t e = 0; e < as_index(tr.bytes); ++e) {
          const auto v = before[tr.src][as_index(off) + e];
          auto& dst = st[tr.dst][as_index(off) + e];
          dst = reduce ? (dst | v) : v;
        }
      }
    }
  }
}

std::map<int, std::vector<std::uint64_t>> initial_masks(const std::vector<int>& group,
                                                        size_t size) {
  std::map<int, std::vector<std::uint64_t>> st;
  for (int r : group) st[r].assign(size, std::uint64_t{1} << r);
  return st;
}

TEST(RingAllReduce, StepCountBytesAndResult) {
  FakeCluster topo({.nodes = 2, .m = 3});
  const int w = 6;
  const auto group = iota_group(w);
  const double size = 6 * 4;
  const auto spec = make_spec(CollectiveType::kAllReduce, CollectiveAlgo::kRing, size);
  const CollectiveCall call = make_call(spec, group);
  const auto phases = algo_of(CollectiveType::kAllReduce, CollectiveAlgo::kRing).lower(call, topo);
  ASSERT_EQ(phases.size(), 3u);
  EXPECT_EQ(phases[0].repeat, w - 1);
  EXPECT_EQ(phases[2].repeat, w - 1);
  EXPECT_EQ(phases[1].kind, Phase::Kind::kReduce);
  EXPECT_EQ(phases[1].local_bytes, Bytes(3 * 4 * (w - 1)));
  for (int i : {0, 2}) {
    ASSERT_EQ(phases[i].transfers.size(), static_cast<size_t>(w));
    for (int p = 0; p < w; ++p) {
      EXPECT_EQ(phases[i].transfers[p].src, p);
      EXPECT_EQ(phases[i].transfers[p].dst, (p + 1) % w);
      EXPECT_EQ(phases[i].transfers[p].bytes, size / w);
    }
  }
  // Every rank sends 2(W-1)/W * S: the nccl-tests bus bandwidth definition.
  EXPECT_DOUBLE_EQ((transfer_bytes(phases[0]) + transfer_bytes(phases[2])) / w,
                   busbw_factor(CollectiveType::kAllReduce, w) * size);
  auto st = initial_masks(group, static_cast<size_t>(size));
  run_reduction(phases, st, {{"rs_step", {w, size}}, {"ag_step", {w, size}}});
  for (int r : group)
    for (auto v : st[r]) EXPECT_EQ(v, (1u << w) - 1);
}

TEST(RingReduceScatterAndAllGather, OwnChunkReducedAndEveryChunkGathered) {
  FakeCluster topo({.nodes = 1, .m = 5});
  const int w = 5;
  const auto group = iota_group(w);
  const double size = 10;
  {
    const auto spec = make_spec(CollectiveType::kReduceScatter, CollectiveAlgo::kRing, size);
    const CollectiveCall call = make_call(spec, group);
    const auto phases =
        algo_of(CollectiveType::kReduceScatter, CollectiveAlgo::kRing).lower(call, topo);
    auto st = initial_masks(group, 10);
    run_reduction(phases, st, {{"rs_step", {w, size}}});
    for (int p = 0; p < w; ++p) {
      EXPECT_EQ(st[p][2 * p], (1u << w) - 1);
      EXPECT_EQ(st[p][2 * p + 1], (1u << w) - 1);
    }
  }
  {
    const auto spec = make_spec(CollectiveType::kAllGather, CollectiveAlgo::kRing, size);
    const CollectiveCall call = make_call(spec, group);
    const auto phases =
        algo_of(CollectiveType::kAllGather, CollectiveAlgo::kRing).lower(call, topo);
    ASSERT_EQ(phases.size(), 2u);
    EXPECT_EQ(phases[0].kind, Phase::Kind::kCopy);
    ASSERT_EQ(phases[0].copies.size(), 5u);
    // The state after the self copy: chunk p of rank p holds p's data, others hold nothing.
    std::map<int, std::vector<std::uint64_t>> st;
    for (int p = 0; p < w; ++p) {
      st[p].assign(10, 0);
      const auto& c = phases[0].copies[p];
      for (size_t e = 0; e < as_index(c.bytes); ++e) st[p][as_index(c.dst_offset) + e] = 1u << p;
    }
    run_reduction(phases, st, {{"ag_step", {w, size}}});
    for (int p = 0; p < w; ++p)
      for (int e = 0; e < 10; ++e) EXPECT_EQ(st[p][e], 1u << (e / 2)) << p << " " << e;
  }
}

// Field-by-field equality of two phases (all of Phase's data, layout included).
void expect_same_phase(const Phase& a, const Phase& b, const std::string& where) {
  SCOPED_TRACE(where);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.label, b.label);
  EXPECT_EQ(a.repeat, b.repeat);
  EXPECT_EQ(a.src, b.src);
  EXPECT_EQ(a.dst, b.dst);
  EXPECT_EQ(a.local_bytes, b.local_bytes);
  EXPECT_EQ(a.stride_h, b.stride_h);
  EXPECT_EQ(a.stride_w, b.stride_w);
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  ASSERT_EQ(a.transfers.size(), b.transfers.size());
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  ASSERT_EQ(a.copies.size(), b.copies.size());
  for (size_t i = 0; i < a.transfers.size(); ++i) {
    EXPECT_EQ(a.transfers[i].src, b.transfers[i].src) << i;
    EXPECT_EQ(a.transfers[i].dst, b.transfers[i].dst) << i;
    EXPECT_EQ(a.transfers[i].bytes, b.transfers[i].bytes) << i;
  }
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    EXPECT_EQ(a.chunks[i].send_offset, b.chunks[i].send_offset) << i;
    EXPECT_EQ(a.chunks[i].recv_offset, b.chunks[i].recv_offset) << i;
  }
  for (size_t i = 0; i < a.copies.size(); ++i) {
    EXPECT_EQ(a.copies[i].rank, b.copies[i].rank) << i;
    EXPECT_EQ(a.copies[i].src_offset, b.copies[i].src_offset) << i;
    EXPECT_EQ(a.copies[i].dst_offset, b.copies[i].dst_offset) << i;
    EXPECT_EQ(a.copies[i].bytes, b.copies[i].bytes) << i;
  }
}

// A ring all_reduce is exactly a ring reduce_scatter followed by the ring all_gather's steps (the
// all_gather's self copy is not needed: after the reduce-scatter, position p already holds its
// chunk p in place). Pinned by hand on 4 ranks (2 nodes x 2), S = 16 bytes, chunks of 4.
TEST(RingAllReduce, IsReduceScatterPhasesThenAllGatherStepsExactly) {
  FakeCluster topo({.nodes = 2, .m = 2});
  const auto group = iota_group(4);
  const double size = 16;
  const auto lower = [&](CollectiveType type) {
    const auto spec = make_spec(type, CollectiveAlgo::kRing, size);
    return algo_of(type, CollectiveAlgo::kRing).lower(make_call(spec, group), topo);
  };
  const auto ar = lower(CollectiveType::kAllReduce);
  const auto rs = lower(CollectiveType::kReduceScatter);
  const auto ag = lower(CollectiveType::kAllGather);

  // Hand-computed phases. Ring 0 -> 1 -> 2 -> 3 -> 0, 4 bytes per step. Reduce-scatter step 0:
  // position p sends chunk (p - 1) mod 4 (offset 4k on both sides); all-gather step 0 sends
  // chunk p. The reduction phase reads 2 and writes 1 chunk per received chunk: 3 * 4 * 3.
  const auto ring_step = [](std::string_view label, std::vector<double> offsets) {
    Phase ph;
    ph.label = label;
    ph.src = ph.dst = Buffer::kRecv;
    ph.repeat = 3;
    for (int p = 0; p < 4; ++p) {
      ph.transfers.push_back({p, (p + 1) % 4, 4.0});
      ph.chunks.push_back({offsets[p], offsets[p]});
    }
    return ph;
  };
  const Phase rs_step = ring_step("rs_step", {12, 0, 4, 8});
  const Phase ag_step = ring_step("ag_step", {0, 4, 8, 12});
  Phase rs_reduce;
  rs_reduce.kind = Phase::Kind::kReduce;
  rs_reduce.label = "rs_reduce";
  rs_reduce.src = rs_reduce.dst = Buffer::kRecv;
  rs_reduce.local_bytes = Bytes(36);
  Phase self_copy;
  self_copy.kind = Phase::Kind::kCopy;
  self_copy.label = "self_copy";
  self_copy.src = Buffer::kSend;
  self_copy.dst = Buffer::kRecv;
  self_copy.local_bytes = Bytes(8);
  for (int p = 0; p < 4; ++p) self_copy.copies.push_back({p, 0.0, 4.0 * p, 4.0});

  ASSERT_EQ(rs.size(), 2u);
  expect_same_phase(rs[0], rs_step, "reduce_scatter step");
  expect_same_phase(rs[1], rs_reduce, "reduce_scatter reduction");
  ASSERT_EQ(ag.size(), 2u);
  expect_same_phase(ag[0], self_copy, "all_gather self copy");
  expect_same_phase(ag[1], ag_step, "all_gather step");
  ASSERT_EQ(ar.size(), 3u);
  expect_same_phase(ar[0], rs[0], "all_reduce = reduce_scatter (step)");
  expect_same_phase(ar[1], rs[1], "all_reduce = reduce_scatter (reduction)");
  expect_same_phase(ar[2], ag[1], "all_reduce = all_gather (step)");

  // The alpha-beta costs agree: all_reduce = reduce_scatter + all_gather - the self copy
  // (2 * S/W HBM bytes), at every size and with per-message costs.
  const double hbm = 1e12;
  const CostContext ctx{&topo, {2e-6, 1e-6}, BytesPerSecond(hbm)};
  for (const double bytes : {16.0, 4096.0, 64e6}) {
    const auto time = [&](CollectiveType type) {
      const auto spec = make_spec(type, CollectiveAlgo::kRing, bytes);
      return algo_of(type, CollectiveAlgo::kRing)
          .analytical_time(make_call(spec, group), ctx)
          .value();
    };
    const double expected = time(CollectiveType::kReduceScatter) +
                            time(CollectiveType::kAllGather) - 2 * bytes / 4 / hbm;
    EXPECT_NEAR(time(CollectiveType::kAllReduce), expected, 1e-12 * expected) << bytes;
  }
}

// 2DH all_to_all and all_to_allv share their phase skeleton and exchange helper: with a uniform
// matrix the intra and inter phases are identical (transfers, chunk offsets, self copies, local
// bytes); the stride copies differ only in form (a stride permutation vs explicit block copies)
// and move the same bytes.
TEST(TwoDh, UniformAllToAllvExchangesExactlyLikeAllToAll) {
  for (auto [nodes, m] : {std::pair{2, 2}, {3, 4}, {4, 2}}) {
    FakeCluster topo({.nodes = nodes, .m = m});
    const int w = nodes * m;
    const auto group = iota_group(w);
    const auto a2a_spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 3.0 * w);
    auto a2av_spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::k2dh, 0);
    a2av_spec.matrix = std::make_shared<ByteMatrix>(uniform_matrix(w, 3));
    const auto a2a = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh)
                         .lower(make_call(a2a_spec, group), topo);
    const auto a2av = algo_of(CollectiveType::kAllToAllv, CollectiveAlgo::k2dh)
                          .lower(make_call(a2av_spec, group), topo);
    ASSERT_EQ(a2a.size(), 4u);
    ASSERT_EQ(a2av.size(), 4u);
    const std::string grid = std::to_string(nodes) + "x" + std::to_string(m);
    expect_same_phase(a2a[1], a2av[1], grid + " intra");
    expect_same_phase(a2a[3], a2av[3], grid + " inter");
    for (int i : {0, 2}) {
      EXPECT_EQ(a2a[i].label, a2av[i].label);
      EXPECT_EQ(a2a[i].src, a2av[i].src);
      EXPECT_EQ(a2a[i].dst, a2av[i].dst);
      EXPECT_EQ(a2a[i].local_bytes, a2av[i].local_bytes) << grid << " " << a2a[i].label;
      double copied = 0;
      for (const auto& c : a2av[i].copies) copied += c.bytes;
      EXPECT_EQ(copied, 3.0 * w * w) << grid;  // every rank's whole buffer
    }
  }
}

TEST(TreeAllReduce, BinaryHeapTreeReducesAndBroadcasts) {
  FakeCluster topo({.nodes = 1, .m = 6});
  const int w = 6;  // depths: 0 | 1 2 | 3 4 5
  const auto group = iota_group(w);
  const auto spec = make_spec(CollectiveType::kAllReduce, CollectiveAlgo::kTree, 8);
  const CollectiveCall call = make_call(spec, group);
  const auto phases = algo_of(CollectiveType::kAllReduce, CollectiveAlgo::kTree).lower(call, topo);
  // reduce depth 2, sum, reduce depth 1, sum, bcast depth 1, bcast depth 2
  ASSERT_EQ(phases.size(), 6u);
  EXPECT_EQ(phases[0].transfers.size(), 3u);  // 3->1, 4->1, 5->2
  EXPECT_EQ(phases[0].transfers[2].src, 5);
  EXPECT_EQ(phases[0].transfers[2].dst, 2);
  EXPECT_EQ(phases[1].local_bytes, Bytes(3 * 8 * 2));  // node 1 adds two children
  EXPECT_EQ(phases[2].transfers.size(), 2u);           // 1->0, 2->0
  EXPECT_EQ(phases[5].transfers.size(), 3u);
  auto st = initial_masks(group, 8);
  run_reduction(phases, st, {});
  for (int r : group)
    for (auto v : st[r]) EXPECT_EQ(v, (1u << w) - 1);
}

TEST(HierarchicalAllReduce, ThreeLevelsProduceTheFullSum) {
  for (auto [nodes, m] : {std::pair{2, 2}, {3, 2}, {2, 4}, {1, 4}, {4, 1}}) {
    FakeCluster topo({.nodes = nodes, .m = m});
    const int w = nodes * m;
    const auto group = iota_group(w);
    const double size = w * 2.0;
    const auto spec = make_spec(CollectiveType::kAllReduce, CollectiveAlgo::kHierarchical, size);
    const CollectiveCall call = make_call(spec, group);
    const auto phases =
        algo_of(CollectiveType::kAllReduce, CollectiveAlgo::kHierarchical).lower(call, topo);
    // Inter-node transfers connect same-local-index ranks only and carry S/(m*n) each.
    for (const auto& ph : phases) {
      if (ph.label.substr(0, 5) != "inter") continue;
      for (const auto& t : ph.transfers) {
        EXPECT_EQ(topo.local_of(t.src), topo.local_of(t.dst));
        EXPECT_EQ(t.bytes, size / w);
      }
    }
    auto st = initial_masks(group, static_cast<size_t>(size));
    run_reduction(phases, st,
                  {{"intra_rs_step", {m, size}},
                   {"intra_ag_step", {m, size}},
                   {"inter_rs_step", {nodes, size / m}},
                   {"inter_ag_step", {nodes, size / m}}});
    for (int r : group)
      for (auto v : st[r]) EXPECT_EQ(v, (std::uint64_t{1} << w) - 1) << nodes << "x" << m;
  }
}

TEST(SendRecv, PeerOffsetWrapsAround) {
  FakeCluster topo({.nodes = 1, .m = 4});
  const auto group = iota_group(4, 0);
  auto spec = make_spec(CollectiveType::kSendRecv, CollectiveAlgo::kLinear, 100);
  spec.peer_offset = -1;
  const CollectiveCall call = make_call(spec, group);
  const auto phases = algo_of(CollectiveType::kSendRecv, CollectiveAlgo::kLinear).lower(call, topo);
  ASSERT_EQ(phases.size(), 1u);
  ASSERT_EQ(phases[0].transfers.size(), 4u);
  EXPECT_EQ(phases[0].transfers[0].dst, 3);
  EXPECT_EQ(phases[0].transfers[1].dst, 0);
  spec.peer_offset = 4;  // onto itself: nothing to move
  EXPECT_TRUE(
      algo_of(CollectiveType::kSendRecv, CollectiveAlgo::kLinear).lower(call, topo).empty());
}

// ---- Analytical model ---------------------------------------------------------------------------

TEST(Analytical, TwoGpusOnOneLinkIsAlphaPlusBytesOverBandwidth) {
  const double bw = 50e9, lat = 3e-6, bytes = 8e6;
  OneLink topo(bw, lat);
  const auto group = iota_group(2);
  CostContext ctx{&topo, {}, BytesPerSecond(0)};
  {
    const auto spec = make_spec(CollectiveType::kSendRecv, CollectiveAlgo::kLinear, bytes);
    const CollectiveCall call = make_call(spec, group);
    EXPECT_DOUBLE_EQ(select_algorithm(call, ctx).analytical_time(call, ctx).value(),
                     lat + bytes / bw);
  }
  {
    // all_to_all of S: each rank sends S/2 to the other (the self half is a free local copy).
    const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, 2 * bytes);
    const CollectiveCall call = make_call(spec, group);
    EXPECT_DOUBLE_EQ(select_algorithm(call, ctx).analytical_time(call, ctx).value(),
                     lat + bytes / bw);
    // Per-message terms: one message per rank.
    ctx.net.message_latency_s = 1e-6;
    ctx.net.message_overhead_s = 0.5e-6;
    EXPECT_DOUBLE_EQ(select_algorithm(call, ctx).analytical_time(call, ctx).value(),
                     lat + bytes / bw + 1.5e-6);
  }
  {
    // Ring all_reduce on 2 GPUs: 2 steps of S/2 plus one reduction of S/2 (read 2, write 1).
    ctx.net = {};
    ctx.local_copy_bandwidth = BytesPerSecond(1e12);
    const auto spec = make_spec(CollectiveType::kAllReduce, CollectiveAlgo::kRing, 2 * bytes);
    const CollectiveCall call = make_call(spec, group);
    const auto& ring = algo_of(CollectiveType::kAllReduce, CollectiveAlgo::kRing);
    EXPECT_DOUBLE_EQ(ring.analytical_time(call, ctx).value(),
                     2 * (lat + bytes / bw) + 3 * bytes / 1e12);
  }
}

TEST(Analytical, LinearAllToAllOnTwoNodesIsBoundByTheSlowerTier) {
  FakeCluster::Params p{.nodes = 2, .m = 2};
  FakeCluster topo(p);
  const auto group = iota_group(4);
  const double size = 4e6;  // chunk 1 MB
  const CostContext ctx{&topo, {1e-6, 2e-6}, BytesPerSecond(0)};
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, size);
  const CollectiveCall call = make_call(spec, group);
  const double intra = p.intra_lat + 1e6 / p.intra_bw;
  const double inter = p.inter_lat + 2 * 1e6 / p.nic_bw;  // two peers on the other node
  EXPECT_DOUBLE_EQ(algo_of(CollectiveType::kAllToAll, CollectiveAlgo::kLinear)
                       .analytical_time(call, ctx)
                       .value(),
                   1e-6 + 3 * 2e-6 + std::max(intra, inter));
}

// The fast paths (representative ranks, cached summaries, per-class means) must agree with the
// generic evaluation of the lowered phases wherever the topology is homogeneous.
TEST(Analytical, FastPathsEqualTheGenericEvaluationOfTheLowering) {
  const CostContext base{nullptr, {2e-6, 1e-6}, BytesPerSecond(2e12)};
  for (auto [nodes, m] : {std::pair{2, 2}, {3, 4}, {4, 2}, {1, 5}, {5, 1}}) {
    FakeCluster topo({.nodes = nodes, .m = m});
    CostContext ctx = base;
    ctx.topo = &topo;
    const int w = nodes * m;
    const auto group = iota_group(w);
    const auto matrix = dense_matrix(w, random_counts(w, 11, 1000, 0.3));
    for (const CollectiveType type :
         {CollectiveType::kAllToAll, CollectiveType::kAllToAllv, CollectiveType::kAllReduce,
          CollectiveType::kAllGather, CollectiveType::kReduceScatter, CollectiveType::kSendRecv}) {
      for (const Algorithm* algo : algorithms_for(type)) {
        for (double size : {4096.0 * w, 1e6 * w}) {
          auto spec = make_spec(type, algo->algo(), size);
          spec.matrix = matrix;
          spec.peer_offset = 1 + m;
          const CollectiveCall call = make_call(spec, group);
          // 3dh needs several leaf switches (its own tests below), deepep a dispatch's per-node
          // counts (its analytical time is the generic evaluation itself); the rest run here.
          if (algo->algo() == CollectiveAlgo::k3dh || algo->algo() == CollectiveAlgo::kDeepep)
            continue;
          ASSERT_TRUE(algo->applicable(call, topo));
          const double fast = algo->analytical_time(call, ctx).value();
          const double generic = phases_time(algo->lower(call, topo), ctx).value();
          EXPECT_NEAR(fast, generic, 1e-12 + 1e-9 * generic)
              << collective_type_name(type) << "/" << collective_algo_name(algo->algo()) << " "
              << nodes << "x" << m << " S=" << size;
          EXPECT_GT(fast, 0);
        }
      }
    }
  }
}

// The same agreement on topologies from build_topology, NIC sharing included (4 GPUs per NIC).
TEST(Analytical, FastPathsEqualTheGenericEvaluationOnBuiltTopologies) {
  for (const InterKind kind : {InterKind::kSwitch, InterKind::kFatTree}) {
    ClusterSpec cs;
    cs.gpu.name = "a100-sxm-80gb";
    cs.nodes = 4;
    cs.gpus_per_node = 4;
    cs.intra.kind = IntraKind::kNvswitch;
    cs.intra.bandwidth = BytesPerSecond(300e9);
    cs.inter.kind = kind;
    cs.inter.nic_bandwidth = BytesPerSecond(25e9);
    cs.inter.nics_per_node = 1;
    const auto topo = topology::build_topology(cs);
    ASSERT_LT(topo->pair_cost(0, 4).bandwidth.value(), 25e9 / 4 * 1.0000001);
    const CostContext ctx{topo.get(), {1e-6, 1e-6}, BytesPerSecond(0)};
    const auto group = iota_group(16);
    for (const CollectiveType type : {CollectiveType::kAllToAll, CollectiveType::kAllReduce}) {
      for (const Algorithm* algo : algorithms_for(type)) {
        const auto spec = make_spec(type, algo->algo(), 16 << 20);
        const CollectiveCall call = make_call(spec, group);
        if (algo->algo() == CollectiveAlgo::k3dh) continue;  // one leaf: see the ThreeDh tests
        const double fast = algo->analytical_time(call, ctx).value();
        const double generic = phases_time(algo->lower(call, *topo), ctx).value();
        EXPECT_NEAR(fast, generic, 1e-9 * generic) << collective_algo_name(algo->algo());
      }
    }
  }
}

TEST(Analytical, UniformAllToAllvCostsTheSameAsAllToAll) {
  FakeCluster topo({.nodes = 4, .m = 4});
  const CostContext ctx{&topo, {2e-6, 1e-6}, BytesPerSecond(2e12)};
  const auto group = iota_group(16);
  for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
    const auto a2a = make_spec(CollectiveType::kAllToAll, a, 16 * 1000);
    auto a2av = make_spec(CollectiveType::kAllToAllv, a, 0);
    a2av.matrix = std::make_shared<ByteMatrix>(uniform_matrix(16, 1000));
    const CollectiveCall c1 = make_call(a2a, group), c2 = make_call(a2av, group);
    EXPECT_NEAR(find_algorithm(CollectiveType::kAllToAll, a)->analytical_time(c1, ctx).value(),
                find_algorithm(CollectiveType::kAllToAllv, a)->analytical_time(c2, ctx).value(),
                1e-15);
  }
}

TEST(Analytical, MonotoneInSizeAndManySmallMessagesCostMore) {
  FakeCluster topo({.nodes = 4, .m = 4});
  const CostContext ctx{&topo, {2e-6, 1e-6}, BytesPerSecond(2e12)};
  const auto group = iota_group(16);
  for (const CollectiveType type :
       {CollectiveType::kAllToAll, CollectiveType::kAllReduce, CollectiveType::kAllGather,
        CollectiveType::kReduceScatter, CollectiveType::kSendRecv}) {
    for (const Algorithm* algo : algorithms_for(type)) {
      double prev = 0;
      if (algo->algo() == CollectiveAlgo::k3dh) continue;  // one leaf: see the ThreeDh tests
      for (double size = 1024; size <= 1e9; size *= 4) {
        const auto spec = make_spec(type, algo->algo(), size);
        const CollectiveCall call = make_call(spec, group);
        const double t = algo->analytical_time(call, ctx).value();
        EXPECT_GT(t, prev) << collective_type_name(type) << "/"
                           << collective_algo_name(algo->algo()) << " at " << size;
        prev = t;
      }
    }
  }
  // Same bytes between the same pair, 16 messages vs 1: the per-message terms make the former
  // slower by exactly 15 message overheads.
  OneLink link(50e9, 1e-6);
  const CostContext lctx{&link, {1e-6, 1e-6}, BytesPerSecond(0)};
  Phase one, many;
  one.transfers.push_back({0, 1, 16000});
  for (int i = 0; i < 16; ++i) many.transfers.push_back({0, 1, 1000});
  const double t1 = phases_time({one}, lctx).value();
  const double t16 = phases_time({many}, lctx).value();
  EXPECT_DOUBLE_EQ(t1, 1e-6 + 1e-6 + 1e-6 + 16000 / 50e9);
  EXPECT_NEAR(t16 - t1, 15 * 1e-6, 1e-15);
}

TEST(Analytical, SizeZeroCostsNothing) {
  FakeCluster topo({.nodes = 2, .m = 2});
  const CostContext ctx{&topo, {2e-6, 1e-6}, BytesPerSecond(2e12)};
  const auto group = iota_group(4);
  for (const CollectiveType type : {CollectiveType::kAllToAll, CollectiveType::kAllReduce,
                                    CollectiveType::kAllGather, CollectiveType::kSendRecv}) {
    for (const Algorithm* algo : algorithms_for(type)) {
      const auto spec = make_spec(type, algo->algo(), 0);
      const CollectiveCall call = make_call(spec, group);
      EXPECT_EQ(algo->analytical_time(call, ctx).value(), 0.0);
      if (algo->applicable(call, topo)) {  // (3dh needs leaf groups: not on this topology)
        EXPECT_TRUE(algo->lower(call, topo).empty());
      }
    }
  }
}

// ---- Selection
// ------------------------------------------------------------------------------------

TEST(Select, AutoPicks2dhForSmallMessagesAtScaleAndLinearForLargeMessagesOnFewGpus) {
  // NVSwitch 300 GB/s, 25 GB/s NIC per GPU, HBM 2 TB/s, 5 us per message at the endpoint.
  FakeCluster::Params p{.nodes = 64,
                        .m = 8,
                        .intra_bw = 300e9,
                        .intra_lat = 1e-6,
                        .nic_bw = 25e9,
                        .inter_lat = 4e-6,
                        .hbm_bw = 2e12};
  FakeCluster big(p);
  const CostContext ctx{&big, {1e-6, 5e-6}, BytesPerSecond(0)};
  const auto group = iota_group(512);
  auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kAuto, 1 << 20);
  const CollectiveCall call = make_call(spec, group);
  EXPECT_EQ(select_algorithm(call, ctx).algo(), CollectiveAlgo::k2dh);

  p.nodes = 2;
  p.m = 2;
  FakeCluster small(p);
  const CostContext sctx{&small, {1e-6, 5e-6}, BytesPerSecond(0)};
  const auto g4 = iota_group(4);
  spec.bytes = Bytes(256 << 20);
  const CollectiveCall scall = make_call(spec, g4);
  EXPECT_EQ(select_algorithm(scall, sctx).algo(), CollectiveAlgo::kLinear);
  // The choice is the minimum of the candidates' predicted times.
  const double lin = find_algorithm(CollectiveType::kAllToAll, CollectiveAlgo::kLinear)
                         ->analytical_time(scall, sctx)
                         .value();
  const double tdh = find_algorithm(CollectiveType::kAllToAll, CollectiveAlgo::k2dh)
                         ->analytical_time(scall, sctx)
                         .value();
  EXPECT_LT(lin, tdh);
}

TEST(Select, AllReduceAutoPrefersTreeForTinyAndHierarchicalOrRingForLarge) {
  FakeCluster topo({.nodes = 16,
                    .m = 8,
                    .intra_bw = 300e9,
                    .intra_lat = 1e-6,
                    .nic_bw = 25e9,
                    .inter_lat = 4e-6,
                    .hbm_bw = 2e12});
  const CostContext ctx{&topo, {1e-6, 1e-6}, BytesPerSecond(0)};
  const auto group = iota_group(128);
  auto spec = make_spec(CollectiveType::kAllReduce, CollectiveAlgo::kAuto, 1024);
  const CollectiveCall call = make_call(spec, group);
  EXPECT_EQ(select_algorithm(call, ctx).algo(), CollectiveAlgo::kTree);
  spec.bytes = Bytes(1 << 30);
  EXPECT_NE(select_algorithm(call, ctx).algo(), CollectiveAlgo::kTree);
}

TEST(Select, UnknownAlgorithmForTheTypeIsAnInputError) {
  FakeCluster topo({});
  const CostContext ctx{&topo, {}, BytesPerSecond(0)};
  const auto group = iota_group(4);
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kRing, 1024);
  const CollectiveCall call = make_call(spec, group);
  EXPECT_THROW(select_algorithm(call, ctx), InputError);
  EXPECT_EQ(find_algorithm(CollectiveType::kAllToAll, CollectiveAlgo::kRing), nullptr);
}

TEST(Select, MissingOrMisSizedMatrixIsAnInputError) {
  FakeCluster topo({});
  const CostContext ctx{&topo, {}, BytesPerSecond(0)};
  const auto group = iota_group(4);
  auto spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear, 0);
  const CollectiveCall call = make_call(spec, group);
  EXPECT_THROW(find_algorithm(spec.type, spec.algo)->lower(call, topo), InputError);
  spec.matrix = dense_matrix(3, std::vector<std::uint32_t>(9, 1));
  EXPECT_THROW(find_algorithm(spec.type, spec.algo)->analytical_time(call, ctx), InputError);
}

TEST(Cache, SummariesFollowTheGroupContentNotItsAddress) {
  FakeCluster topo({.nodes = 2, .m = 2});
  const CostContext ctx{&topo, {1e-6, 1e-6}, BytesPerSecond(0)};
  std::vector<int> group = iota_group(4);
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::k2dh, 4096);
  const CollectiveCall call = make_call(spec, group);
  const auto& tdh = algo_of(CollectiveType::kAllToAll, CollectiveAlgo::k2dh);
  ASSERT_TRUE(tdh.applicable(call, topo));
  const double t_aligned = tdh.analytical_time(call, ctx).value();
  group = {0, 2, 1, 3};  // same vector, now interleaving the nodes
  EXPECT_FALSE(tdh.applicable(call, topo));
  group = {2, 3, 0, 1};  // aligned again (node 1 first): same cost by symmetry
  EXPECT_TRUE(tdh.applicable(call, topo));
  EXPECT_DOUBLE_EQ(tdh.analytical_time(call, ctx).value(), t_aligned);
  // A different topology object with the same group gets its own summary.
  FakeCluster slower({.nodes = 2, .m = 2, .nic_bw = 5e9});
  CostContext sctx = ctx;
  sctx.topo = &slower;
  EXPECT_GT(tdh.analytical_time(call, sctx).value(), t_aligned);
}

TEST(Cache, ATopologyRebuiltWithOtherBandwidthsIsNotConfusedWithTheFreedOne) {
  // Sweeps free a topology and build the next, often at the same address.
  const auto group = iota_group(8);
  const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, 8 << 20);
  const CollectiveCall call = make_call(spec, group);
  std::vector<double> times;
  for (double nic : {25e9, 5e9, 25e9}) {
    auto topo =
        std::make_unique<FakeCluster>(FakeCluster::Params{.nodes = 2, .m = 4, .nic_bw = nic});
    const CostContext ctx{topo.get(), {}, BytesPerSecond(0)};
    times.push_back(select_algorithm(call, ctx).analytical_time(call, ctx).value());
  }
  EXPECT_DOUBLE_EQ(times[0], 4e-6 + 4 * (1 << 20) / 25e9);
  EXPECT_DOUBLE_EQ(times[1], 4e-6 + 4 * (1 << 20) / 5e9);
  EXPECT_DOUBLE_EQ(times[2], times[0]);
}

TEST(Registry, EveryAlgorithmIsFoundUnderItsOwnTypeAndName) {
  for (int t = 0; t <= static_cast<int>(CollectiveType::kSendRecv); ++t) {
    const auto type = static_cast<CollectiveType>(t);
    const auto algos = algorithms_for(type);
    EXPECT_FALSE(algos.empty()) << collective_type_name(type);
    for (const Algorithm* a : algos) {
      EXPECT_EQ(a->type(), type);
      EXPECT_EQ(find_algorithm(type, a->algo()), a);
    }
  }
}

TEST(BusBw, FactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveType::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveType::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveType::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveType::kAllToAll, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveType::kSendRecv, 4), 1.0);
  EXPECT_DOUBLE_EQ(busbw_factor(CollectiveType::kAllReduce, 1), 0.0);
}

// ---- Fabric cuts (oversubscription) -------------------------------------------------------------

// 12 single-GPU nodes on a 2-level fat tree of radix 8, oversubscription 3: two leaves of 6 NICs,
// each with 2 uplinks of 6 x 25 / (3 x 2) = 25 GB/s (50 GB/s out of a leaf, 150 GB/s into it
// from its NICs). NICs 200 Gb/s = 25 GB/s.
ClusterSpec oversubscribed_tree(double oversubscription) {
  ClusterSpec s;
  s.gpu.name = "a100-sxm-80gb";
  s.gpu.from_catalog = true;
  s.nodes = 12;
  s.gpus_per_node = 1;
  s.intra.kind = IntraKind::kNvswitch;
  s.intra.bandwidth = BytesPerSecond(300e9);
  s.intra.latency = Seconds(1e-6);
  s.inter.kind = InterKind::kFatTree;
  s.inter.nic_bandwidth = BytesPerSecond(25e9);
  s.intra.efficiency = s.inter.nic_efficiency = 1;  // spec-sheet rates: hand-worked cuts
  s.inter.nics_per_node = 1;
  s.inter.latency = Seconds(2e-6);
  s.inter.switch_radix = 8;
  s.inter.oversubscription = oversubscription;
  return s;
}

TEST(FabricCuts, LeavesOfAnOversubscribedTreeAreClassesWithTheirUplinks) {
  const auto topo = topology::build_topology(oversubscribed_tree(3));
  const topology::FabricCuts cuts = topology::compute_fabric_cuts(*topo);
  ASSERT_EQ(cuts.tiers.size(), 2u);
  // Tier 1: every node is a class; its NIC cable is the way out.
  EXPECT_EQ(cuts.tiers[0].tier, 1);
  EXPECT_EQ(cuts.tiers[0].classes, 12);
  for (int c = 0; c < 12; ++c) {
    EXPECT_DOUBLE_EQ(cuts.tiers[0].egress[c], 25e9);
    EXPECT_DOUBLE_EQ(cuts.tiers[0].ingress[c], 25e9);
  }
  // Tier 2: the two leaves, 6 GPUs each, 2 x 25 GB/s of uplinks.
  EXPECT_EQ(cuts.tiers[1].tier, 2);
  ASSERT_EQ(cuts.tiers[1].classes, 2);
  for (int c = 0; c < 2; ++c) {
    EXPECT_EQ(cuts.tiers[1].gpus[c], 6);
    EXPECT_DOUBLE_EQ(cuts.tiers[1].egress[c], 50e9);
    EXPECT_DOUBLE_EQ(cuts.tiers[1].ingress[c], 50e9);
  }
  for (int g = 0; g < 12; ++g) EXPECT_EQ(cuts.tiers[1].gpu_class[g], g / 6);

  // The meter: 6 GPUs of leaf 0 send 1 GB each to leaf 1 -> 6 GB over 50 GB/s; a transfer
  // inside a leaf crosses only its nodes' NIC cut (1 GB over 25 GB/s).
  topology::CutMeter meter(cuts);
  meter.add(0, 1, 1e9);
  EXPECT_DOUBLE_EQ(meter.seconds(0), 1e9 / 25e9);
  meter.clear();
  for (int g = 0; g < 6; ++g) meter.add(g, 6 + g, 1e9);
  EXPECT_DOUBLE_EQ(meter.seconds(0), 6e9 / 50e9);
  // Each message also carries overhead x its injection link's bandwidth (the GPU -> NIC link,
  // the GPU's PCIe: 32 GB/s on an A100) through the cut, as the flow model charges it.
  ASSERT_EQ(cuts.injection.size(), 12u);
  EXPECT_DOUBLE_EQ(cuts.injection[0], 32e9);
  EXPECT_DOUBLE_EQ(meter.seconds(1e-6), (6e9 + 6 * 1e-6 * 32e9) / 50e9);
}

TEST(FabricCuts, AnalyticalAllToAllPaysTheLeafUplinksWhenOversubscribed) {
  for (const double oversub : {1.0, 3.0}) {
    const auto topo = topology::build_topology(oversubscribed_tree(oversub));
    const CostContext ctx{topo.get(), {}, BytesPerSecond(0)};
    const auto group = iota_group(12);
    const double size = 12e6, chunk = size / 12;  // 1 MB to each peer
    double inter_alpha = 0;
    for (int d = 1; d < 12; ++d)
      inter_alpha = std::max(inter_alpha, topo->pair_cost(0, d).alpha.value());
    // Per GPU: 11 chunks through its 25 GB/s NIC (every pair's bottleneck is 25 GB/s).
    const double per_gpu = inter_alpha + 11 * chunk / 25e9;
    // Per leaf (oversubscription 3): 6 x 6 chunks leave through 50 GB/s. Without
    // oversubscription (3 leaves of 4, 4 x 25 GB/s up) the leaf cut is 4 x 8 chunks / 100 GB/s,
    // below the per-GPU bound.
    const double leaf = inter_alpha + 36 * chunk / 50e9;
    const double expected = oversub > 1 ? std::max(per_gpu, leaf) : per_gpu;
    ASSERT_GT(leaf, per_gpu);  // the case is built so that the cut binds
    for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
      const auto spec = make_spec(CollectiveType::kAllToAll, a, size);
      EXPECT_NEAR(algo_of(CollectiveType::kAllToAll, a)
                      .analytical_time(make_call(spec, group), ctx)
                      .value(),
                  expected, 1e-12)
          << "oversubscription " << oversub << " algo " << static_cast<int>(a);
    }
    if (oversub > 1) {
      // With 1 us per message: the GPU line pays 11 overheads, the leaf cut 36 overheads' worth
      // of injection-link bytes (1 us x 32 GB/s each) over 50 GB/s.
      CostContext octx = ctx;
      octx.net.message_overhead_s = 1e-6;
      const auto spec = make_spec(CollectiveType::kAllToAll, CollectiveAlgo::kLinear, size);
      const double leaf_o = inter_alpha + 36 * (chunk + 1e-6 * 32e9) / 50e9;
      EXPECT_NEAR(algo_of(CollectiveType::kAllToAll, CollectiveAlgo::kLinear)
                      .analytical_time(make_call(spec, group), octx)
                      .value(),
                  std::max(per_gpu + 11e-6, leaf_o), 1e-12);
    }
    // The same exchange as a uniform all_to_allv (1 MB per entry) costs the same.
    auto vspec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear, 0);
    auto mat = dense_matrix(12, std::vector<std::uint32_t>(144, 1));
    mat->unit = Bytes(chunk);
    vspec.matrix = mat;
    EXPECT_NEAR(algo_of(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear)
                    .analytical_time(make_call(vspec, group), ctx)
                    .value(),
                expected, 1e-12)
        << "all_to_allv, oversubscription " << oversub;
  }
}

TEST(FabricCuts, SkewedAllToAllvIsChargedWhatCrossesTheLeaf) {
  // GPUs 0..5 (leaf 0) each send 1 MB to GPU 6+i (leaf 1), nothing else: each GPU's NIC
  // carries 1 MB (40 us) but leaf 0's 50 GB/s of uplinks carry 6 MB (120 us).
  const auto topo = topology::build_topology(oversubscribed_tree(3));
  const CostContext ctx{topo.get(), {}, BytesPerSecond(0)};
  const auto group = iota_group(12);
  std::vector<std::uint32_t> counts(144, 0);
  for (int i = 0; i < 6; ++i) counts[static_cast<size_t>(i) * 12 + 6 + i] = 1;
  auto spec = make_spec(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear, 0);
  auto mat = dense_matrix(12, counts);
  mat->unit = Bytes(1e6);
  spec.matrix = mat;
  double alpha = 0;
  for (int d = 1; d < 12; ++d) alpha = std::max(alpha, topo->pair_cost(0, d).alpha.value());
  EXPECT_NEAR(algo_of(CollectiveType::kAllToAllv, CollectiveAlgo::kLinear)
                  .analytical_time(make_call(spec, group), ctx)
                  .value(),
              alpha + 6e6 / 50e9, 1e-12);
}

TEST(FabricCuts, RingCollectivesCrossingALeafOnceAreNotSlowedDown) {
  // A ring over ranks 0..11 leaves each leaf by one flow per step: the cut (one chunk over
  // 50 GB/s) stays below a GPU's own NIC (one chunk over 25 GB/s), so oversubscription 3 costs
  // the ring nothing, as on the flow engine.
  const auto flat = topology::build_topology(oversubscribed_tree(1));
  const auto over = topology::build_topology(oversubscribed_tree(3));
  const auto group = iota_group(12);
  const auto spec = make_spec(CollectiveType::kAllReduce, CollectiveAlgo::kRing, 48e6);
  const CostContext flat_ctx{flat.get(), {}, BytesPerSecond(0)};
  const CostContext over_ctx{over.get(), {}, BytesPerSecond(0)};
  const auto& ring = algo_of(CollectiveType::kAllReduce, CollectiveAlgo::kRing);
  const double t_flat = ring.analytical_time(make_call(spec, group), flat_ctx).value();
  const double t_over = ring.analytical_time(make_call(spec, group), over_ctx).value();
  // Both trees have leaf-crossing ring edges with the same hops and pair bandwidth.
  EXPECT_DOUBLE_EQ(t_over, t_flat);
  EXPECT_GT(t_flat, 22 * (4e6 / 25e9));
}

}  // namespace
}  // namespace moesim::collectives
