// Tests of the `flow` network model: exact times on hand-sized topologies (message costs 0 unless
// they are what is tested), and a randomized comparison against a naive reference max-min
// simulator written independently below.
#include "sim/flow_model.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::sim {
namespace {

using topology::LinkId;

// A hand-wired topology: GPUs 0..n-1 plus extra switch vertices, explicit links and routes.
class TestTopology : public topology::Topology {
 public:
  explicit TestTopology(int gpus) : Topology(make_spec(gpus)) {
    for (int g = 0; g < gpus; ++g) {
      gpu_vertex_.push_back(add_vertex(topology::VertexKind::kGpu, g));
    }
  }
  topology::VertexId add_switch() { return add_vertex(topology::VertexKind::kSwitch, -1); }
  LinkId add_link(topology::VertexId a, topology::VertexId b, double bw, double lat) {
    links_.push_back({a, b, BytesPerSecond(bw), Seconds(lat), 0});
    return static_cast<LinkId>(links_.size() - 1);
  }
  void set_route(int src, int dst, std::vector<LinkId> links) { routes_[{src, dst}] = links; }
  void route(int src, int dst, std::vector<LinkId>& out) const override {
    const auto& r = routes_.at({src, dst});
    out.insert(out.end(), r.begin(), r.end());
  }

 private:
  static ClusterSpec make_spec(int gpus) {
    ClusterSpec spec;
    spec.nodes = 1;
    spec.gpus_per_node = gpus;
    return spec;
  }
  topology::VertexId add_vertex(topology::VertexKind kind, int index) {
    vertices_.push_back({kind, 0, index, 0, "v" + std::to_string(vertices_.size())});
    return static_cast<topology::VertexId>(vertices_.size() - 1);
  }
  std::map<std::pair<int, int>, std::vector<LinkId>> routes_;
};

// GPUs on one switch: uplink g -> switch and downlink switch -> g per GPU, routes up + down.
struct StarTopology : TestTopology {
  StarTopology(int gpus, std::vector<double> up_bw, std::vector<double> down_bw, double lat)
      : TestTopology(gpus) {
    const auto sw = add_switch();
    for (int g = 0; g < gpus; ++g) up.push_back(add_link(gpu_vertex(g), sw, up_bw[g], lat));
    for (int g = 0; g < gpus; ++g) down.push_back(add_link(sw, gpu_vertex(g), down_bw[g], lat));
    for (int s = 0; s < gpus; ++s) {
      for (int d = 0; d < gpus; ++d) {
        if (s != d) set_route(s, d, {up[s], down[d]});
      }
    }
  }
  StarTopology(int gpus, double bw, double lat)
      : StarTopology(gpus, std::vector<double>(gpus, bw), std::vector<double>(gpus, bw), lat) {}
  std::vector<LinkId> up, down;
};

// Two GPUs joined by one cable (two directed links).
struct PairTopology : TestTopology {
  PairTopology(double bw, double lat) : TestTopology(2) {
    set_route(0, 1, {add_link(gpu_vertex(0), gpu_vertex(1), bw, lat)});
    set_route(1, 0, {add_link(gpu_vertex(1), gpu_vertex(0), bw, lat)});
  }
};

// Runs the model until nothing is in flight; returns completion time per batch id.
std::map<BatchId, double> drain(NetworkModel& model) {
  std::map<BatchId, double> done;
  for (double t = model.next_completion_time(); t != NetworkModel::kNever;
       t = model.next_completion_time()) {
    const auto completed = model.advance_to(t);
    EXPECT_FALSE(completed.empty()) << "advance_to(next_completion_time()) returned nothing";
    for (const auto& c : completed) {
      EXPECT_EQ(c.time_s, t);
      done[c.id] = c.time_s;
    }
  }
  return done;
}

double run_one(NetworkModel& model, const std::vector<Transfer>& batch) {
  const BatchId id = model.start_batch(0.0, batch);
  const auto done = drain(model);
  EXPECT_EQ(done.size(), 1u);
  return done.at(id);
}

constexpr double kGB = 1e9;
constexpr double kUs = 1e-6;
constexpr double kTol = 1e-9;  // relative

void expect_time(double actual, double expected) {
  EXPECT_NEAR(actual, expected, kTol * expected) << "expected " << expected;
}

TEST(FlowModel, SingleLinkTimeIsLatencyPlusBytesOverBandwidth) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo);
  EXPECT_EQ(model.name(), "flow");
  expect_time(run_one(model, {{0, 1, 1e6}}), 2 * kUs + 1e6 / (10 * kGB));
}

TEST(FlowModel, MessageLatencyAddsToRouteLatency) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo, NetworkParams{.message_latency_s = 3 * kUs, .message_overhead_s = 0});
  expect_time(run_one(model, {{0, 1, 1e6}}), 5 * kUs + 1e6 / (10 * kGB));
}

TEST(FlowModel, TwoFlowsOnOneLinkGetHalfEach) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo);
  // Identical transfers are aggregated into one entry of multiplicity 2.
  expect_time(run_one(model, {{0, 1, 1e6}, {0, 1, 1e6}}), 2 * kUs + 2 * 1e6 / (10 * kGB));
  EXPECT_EQ(model.stats().flows, 1);
  EXPECT_EQ(model.stats().transfers, 2);
}

TEST(FlowModel, TwoSendersShareTheReceiversDownlink) {
  StarTopology topo(3, 10 * kGB, 1 * kUs);
  FlowModel model(topo);
  const BatchId a = model.start_batch(0, {{0, 2, 1e6}});
  const BatchId b = model.start_batch(0, {{1, 2, 1e6}});
  const auto done = drain(model);
  expect_time(done.at(a), 2 * kUs + 2e6 / (10 * kGB));
  expect_time(done.at(b), 2 * kUs + 2e6 / (10 * kGB));
}

TEST(FlowModel, OppositeDirectionsDoNotShare) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo);
  expect_time(run_one(model, {{0, 1, 1e6}, {1, 0, 1e6}}), 2 * kUs + 1e6 / (10 * kGB));
}

TEST(FlowModel, TwoHopFlowIsBoundedByItsSlowerLink) {
  StarTopology topo(2, {20 * kGB, 20 * kGB}, {5 * kGB, 5 * kGB}, 1 * kUs);
  FlowModel model(topo);
  expect_time(run_one(model, {{0, 1, 1e6}}), 2 * kUs + 1e6 / (5 * kGB));
}

TEST(FlowModel, LinearAllToAllOnOneSwitch) {
  // 4 GPUs, each sends b to the 3 others: every uplink and downlink carries 3 flows at bw/3.
  StarTopology topo(4, 10 * kGB, 1 * kUs);
  FlowModel model(topo);
  const double b = 4e6;
  std::vector<Transfer> batch;
  for (int s = 0; s < 4; ++s) {
    for (int d = 0; d < 4; ++d) batch.push_back({s, d, b});  // s == d: not a flow
  }
  expect_time(run_one(model, batch), 2 * kUs + 3 * b / (10 * kGB));
  EXPECT_EQ(model.stats().flows, 12);
  // Every link carried exactly 3 b.
  const auto bytes = model.link_bytes();
  ASSERT_EQ(bytes.size(), 8u);
  for (double x : bytes) EXPECT_NEAR(x, 3 * b, 1e-6 * b);
}

TEST(FlowModel, ThousandsFinishingTogetherLeaveTheRestExact) {
  // 72 GPUs on one switch, each sends b to peers of its own parity and 2 b to the others: 35 and
  // 36 flows per uplink and downlink. Phase 1: all 71 share every link at bw/71, and the 2,520
  // b-flows finish together at 71 b / bw (thousands at one event: the by-id bulk finish). Phase 2:
  // the 36 others per link run at bw/36 for their last b: 36 b / bw more.
  constexpr int kGpus = 72;
  const double bw = 10 * kGB, b = 1e6;
  StarTopology topo(kGpus, bw, 1 * kUs);
  FlowModel model(topo);
  std::vector<Transfer> batch;
  for (int s = 0; s < kGpus; ++s) {
    for (int d = 0; d < kGpus; ++d) batch.push_back({s, d, (s + d) % 2 == 0 ? b : 2 * b});
  }
  expect_time(run_one(model, batch), 2 * kUs + (71 + 36) * b / bw);
  EXPECT_EQ(model.stats().flows, kGpus * (kGpus - 1));
  for (double x : model.link_bytes()) EXPECT_NEAR(x, (35 + 2 * 36) * b, 1e-6 * b);
}

TEST(FlowModel, UnequalFlowsFollowMaxMinPiecewise) {
  // Links (GB/s): up0 10, up1 2, down2 4, down3 10. Flows A 0->2 (6 GB), B 1->2 (5 GB),
  // C 1->3 (1 GB); route latency L = 2 us.
  // [L, L+1]: up1 is the bottleneck (B = C = 1), A takes the rest of down2: 3.
  //   C finishes at L+1; A has 3 GB left, B 4 GB.
  // [L+1, L+2.5]: up1 alone would give B 2, down2 gives 2 each: A = B = 2. A finishes at L+2.5,
  //   B has 1 GB left.
  // [L+2.5, L+3]: B alone at 2 (up1): finishes at L+3.
  StarTopology topo(4, {10 * kGB, 2 * kGB, 10 * kGB, 10 * kGB},
                    {10 * kGB, 10 * kGB, 4 * kGB, 10 * kGB}, 1 * kUs);
  FlowModel model(topo);
  const BatchId a = model.start_batch(0, {{0, 2, 6 * kGB}});
  const BatchId b = model.start_batch(0, {{1, 2, 5 * kGB}});
  const BatchId c = model.start_batch(0, {{1, 3, 1 * kGB}});
  const auto done = drain(model);
  const double L = 2 * kUs;
  expect_time(done.at(c), L + 1.0);
  expect_time(done.at(a), L + 2.5);
  expect_time(done.at(b), L + 3.0);
  const auto bytes = model.link_bytes();
  EXPECT_NEAR(bytes[topo.up[1]], 6 * kGB, 1e-6 * kGB);
  EXPECT_NEAR(bytes[topo.down[2]], 11 * kGB, 1e-6 * kGB);
  EXPECT_NEAR(bytes[topo.up[0]], 6 * kGB, 1e-6 * kGB);
  EXPECT_NEAR(bytes[topo.down[3]], 1 * kGB, 1e-6 * kGB);
  EXPECT_EQ(bytes[topo.up[2]], 0.0);
}

TEST(FlowModel, BatchesStartedAtDifferentTimesShare) {
  // A starts at 0, B (same route, same size) at x. Overlap at bw/2 each:
  // A ends at L + 2b/bw - x, B at L + 2b/bw.
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo);
  const double b = 1e7, bw = 10 * kGB, L = 2 * kUs, x = 3e-4;
  const BatchId a = model.start_batch(0, {{0, 1, b}});
  expect_time(model.next_completion_time(), L + b / bw);  // alone so far
  EXPECT_TRUE(model.advance_to(x).empty());
  const BatchId bb = model.start_batch(x, {{0, 1, b}});
  const auto done = drain(model);
  expect_time(done.at(a), L + 2 * b / bw - x);
  expect_time(done.at(bb), L + 2 * b / bw);
  EXPECT_NEAR(model.link_bytes()[0], 2 * b, 1e-6 * b);
}

TEST(FlowModel, StartInsideLookaheadRewindsExactly) {
  // Batch 1 has a small and a big flow on two senders into GPU 2; the lookahead goes past the
  // small flow's finish (an internal event) to the batch's completion. A batch started between
  // the internal event and that completion must see the state at its own start time.
  StarTopology topo(4, 10 * kGB, 0);
  FlowModel model(topo);
  model.start_batch(0, {{0, 2, 1e7}, {1, 2, 3e7}});
  // Alone: both at bw/2 until 2e-3 (small done), then the big one at bw: 2e-3 + 2e7/bw = 4e-3.
  expect_time(model.next_completion_time(), 4e-3);
  EXPECT_TRUE(model.advance_to(3e-3).empty());
  // At 3e-3 the big flow has 1e7 left. C: 3 -> 2, 1e7, shares down2 from 3e-3: both at bw/2.
  const BatchId c = model.start_batch(3e-3, {{3, 2, 1e7}});
  expect_time(model.next_completion_time(), 5e-3);
  const auto done = model.advance_to(model.next_completion_time());
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, 0);
  EXPECT_EQ(done[1].id, c);
  EXPECT_GE(model.stats().restores, 1);
  EXPECT_EQ(model.next_completion_time(), NetworkModel::kNever);
  EXPECT_NEAR(model.link_bytes()[topo.down[2]], 5e7, 1e-6 * 5e7);
}

TEST(FlowModel, StartExactlyAtACompletionKeepsIt) {
  PairTopology topo(10 * kGB, 0);
  FlowModel model(topo);
  const BatchId a = model.start_batch(0, {{0, 1, 1e7}});
  const double t = model.next_completion_time();
  expect_time(t, 1e-3);
  const BatchId b = model.start_batch(t, {{0, 1, 1e7}});
  EXPECT_EQ(model.next_completion_time(), t);
  const auto first = model.advance_to(t);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].id, a);
  const auto done = drain(model);
  expect_time(done.at(b), 2e-3);
}

TEST(FlowModel, EmptyAndSelfBatchesCompleteImmediately) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo);
  EXPECT_EQ(model.next_completion_time(), NetworkModel::kNever);
  EXPECT_TRUE(model.advance_to(1.0).empty());
  const BatchId e = model.start_batch(1.0, {});
  const BatchId s = model.start_batch(1.0, {{1, 1, 1e9}});
  EXPECT_EQ(model.next_completion_time(), 1.0);
  const auto done = model.advance_to(1.0);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, e);
  EXPECT_EQ(done[1].id, s);
  EXPECT_EQ(model.next_completion_time(), NetworkModel::kNever);
}

TEST(FlowModel, ZeroByteTransfersPayLatencyOnly) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo, NetworkParams{.message_latency_s = 1 * kUs, .message_overhead_s = 1e-6});
  expect_time(run_one(model, {{0, 1, 0}, {1, 0, 0}}), 3 * kUs);
}

TEST(FlowModel, TimeIsMonotoneInSize) {
  StarTopology topo(4, {10 * kGB, 2 * kGB, 10 * kGB, 10 * kGB},
                    {10 * kGB, 10 * kGB, 4 * kGB, 10 * kGB}, 1 * kUs);
  double last = 0;
  for (double b : {1e3, 1e4, 1e5, 1e6, 3e6, 1e7, 1e8}) {
    FlowModel model(topo, NetworkParams{.message_latency_s = 1 * kUs, .message_overhead_s = 1e-7});
    const double t = run_one(model, {{0, 2, b}, {1, 2, 2 * b}, {1, 3, b / 3}, {3, 0, b}});
    EXPECT_GT(t, last) << "bytes " << b;
    last = t;
  }
}

TEST(FlowModel, PerMessageOverheadMakesManySmallMessagesSlower) {
  // W = b + o * B per message, messages share the link: 1000 x (b + oB) / B = 1000 b/B + 1000 o.
  PairTopology topo(10 * kGB, 2 * kUs);
  const NetworkParams params{.message_latency_s = 0, .message_overhead_s = 5 * kUs};
  const double b = 1e5, bw = 10 * kGB;
  FlowModel many(topo, params);
  const double t_many = run_one(many, std::vector<Transfer>(1000, Transfer{0, 1, b}));
  FlowModel one(topo, params);
  const double t_one = run_one(one, {{0, 1, 1000 * b}});
  expect_time(t_many, 2 * kUs + 1000 * b / bw + 1000 * 5 * kUs);
  expect_time(t_one, 2 * kUs + 1000 * b / bw + 5 * kUs);
  EXPECT_GT(t_many, t_one);
}

TEST(FlowModel, PeerCacheMissesRaiseEachMessagesOverheadWithThePeerCount) {
  // GPU 0 sends 1 MB to each of 4 peers through its one uplink (10 GB/s, no latency). With the
  // state of 2 peers kept hot, each message costs o + miss * (1 - 2/4) = 1 + 4 * 0.5 = 3 us of
  // endpoint time, carried as 3 us * 10 GB/s = 30 kB of extra work per flow on the uplink:
  // 4 * (1e6 + 3e4) / 1e10 s. A cache holding all 4 peers (or 0 = unlimited) costs only o.
  StarTopology topo(5, 10 * kGB, 0);
  const std::vector<Transfer> fan_out = {{0, 1, 1e6}, {0, 2, 1e6}, {0, 3, 1e6}, {0, 4, 1e6}};
  NetworkParams params{.message_latency_s = 0, .message_overhead_s = 1 * kUs};
  params.peer_miss_overhead_s = 4 * kUs;
  EXPECT_DOUBLE_EQ(params.overhead_s(4), 1 * kUs);  // peer_cache 0: unlimited
  for (const auto& [cache, overhead] : std::vector<std::pair<int, double>>{
           {0, 1 * kUs}, {4, 1 * kUs}, {2, 3 * kUs}, {1, 4 * kUs}}) {
    params.peer_cache = cache;
    EXPECT_DOUBLE_EQ(params.overhead_s(4), overhead) << "peer_cache " << cache;
    FlowModel model(topo, params);
    expect_time(run_one(model, fan_out), 4 * (1e6 + overhead * 10 * kGB) / (10 * kGB));
  }
  // The count is per sender and per batch: one message per sender stays at o.
  params.peer_cache = 2;
  FlowModel model(topo, params);
  expect_time(run_one(model, {{0, 1, 1e6}, {2, 3, 1e6}, {4, 1, 1e6}}),
              2 * (1e6 + 1 * kUs * 10 * kGB) / (10 * kGB));
}

TEST(FlowModel, UnsortedInputAggregatesLikeSorted) {
  StarTopology topo(4, 10 * kGB, 1 * kUs);
  std::vector<Transfer> sorted, shuffled;
  for (int s = 0; s < 4; ++s) {
    for (int d = 0; d < 4; ++d) {
      if (s == d) continue;
      for (int k = 0; k < 3; ++k) sorted.push_back({s, d, 1e6 * (1 + (s + d) % 3)});
    }
  }
  shuffled = sorted;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(7));
  FlowModel m1(topo), m2(topo);
  const double t1 = run_one(m1, sorted);
  const double t2 = run_one(m2, shuffled);
  EXPECT_DOUBLE_EQ(t1, t2);
  EXPECT_EQ(m1.stats().flows, 12);
  EXPECT_EQ(m2.stats().flows, 12);

  // Several sizes per (src, dst) pair, interleaved with self transfers: the unsorted path orders
  // by (src, dst) and then by size inside each pair, so equal sizes still aggregate (3 pairs x
  // 2 sizes = 6 entries per ordered pair group) and the result is the sorted one.
  std::vector<Transfer> mixed;
  for (int k = 0; k < 4; ++k) {
    for (int s = 3; s >= 0; --s) {
      for (int d = 0; d < 4; ++d) mixed.push_back({s, d, 1e6 * (1 + (k + s) % 2)});
    }
  }
  std::vector<Transfer> mixed_sorted = mixed;
  std::sort(mixed_sorted.begin(), mixed_sorted.end(), [](const Transfer& a, const Transfer& b) {
    return std::tie(a.src, a.dst, a.bytes) < std::tie(b.src, b.dst, b.bytes);
  });
  std::shuffle(mixed.begin(), mixed.end(), std::mt19937(11));
  FlowModel m3(topo), m4(topo);
  EXPECT_DOUBLE_EQ(run_one(m3, mixed), run_one(m4, mixed_sorted));
  EXPECT_EQ(m3.stats().flows, 24);  // 12 ordered pairs x 2 sizes
  EXPECT_EQ(m4.stats().flows, 24);
  EXPECT_EQ(m3.stats().transfers, 48);  // self transfers are not flows
}

TEST(FlowModel, EventToleranceMergesNearlySimultaneousFinishes) {
  // Two independent flows (opposite directions) finishing at 1.0 s and 1.0005 s after latency 0.
  PairTopology topo(1 * kGB, 0);
  FlowModel exact(topo);
  const BatchId a = exact.start_batch(0, {{0, 1, 1e9}});
  const BatchId b = exact.start_batch(0, {{1, 0, 1.0005e9}});
  auto done = drain(exact);
  expect_time(done.at(a), 1.0);
  expect_time(done.at(b), 1.0005);

  // With a relative tolerance of 1e-3 the second flow is finished (its bandwidth released) in the
  // first one's event, one rate recomputation for both; its batch still completes when its last
  // byte arrives under the rates in force, 1.0005 s, not early.
  FlowModel coarse(topo, {}, FlowModelOptions{.event_tolerance = 1e-3});
  const BatchId c = coarse.start_batch(0, {{0, 1, 1e9}});
  const BatchId d = coarse.start_batch(0, {{1, 0, 1.0005e9}});
  const auto first = coarse.advance_to(coarse.next_completion_time());
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].id, c);
  expect_time(first[0].time_s, 1.0);
  const auto second = coarse.advance_to(coarse.next_completion_time());
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].id, d);
  expect_time(second[0].time_s, 1.0005);
  EXPECT_EQ(coarse.next_completion_time(), NetworkModel::kNever);
  EXPECT_LT(coarse.stats().solves, exact.stats().solves);
}

TEST(FlowModel, RejectsRanksOutsideTheTopologyAndBadSizes) {
  PairTopology topo(10 * kGB, 2 * kUs);
  FlowModel model(topo);
  EXPECT_THROW(model.start_batch(0, {{0, 2, 1}}), InputError);
  EXPECT_THROW(model.start_batch(0, {{-1, 0, 1}}), InputError);
  EXPECT_THROW(model.start_batch(0, {{0, 1, -5}}), InputError);
  EXPECT_THROW(model.start_batch(0, {{0, 1, std::nan("")}}), InputError);
}

// ---- Randomized comparison against a naive reference -------------------------------------
// The reference keeps one record per transfer (no aggregation, no CSR, no lookahead), computes
// max-min rates by textbook progressive filling (freeze the flows of the single most constrained
// link, repeat) and steps from event to event.
struct RefFlow {
  std::vector<LinkId> route;
  double start_s, remaining;
  int batch;
  bool done = false;
};

std::vector<double> reference_completions(const topology::Topology& topo,
                                          const std::vector<std::vector<Transfer>>& batches,
                                          const std::vector<double>& starts) {
  std::vector<RefFlow> flows;
  std::vector<double> completion(batches.size(), 0);
  for (std::size_t b = 0; b < batches.size(); ++b) {
    completion[b] = starts[b];
    for (const Transfer& t : batches[b]) {
      if (t.src == t.dst) continue;
      RefFlow f;
      topo.route(t.src, t.dst, f.route);
      double lat = 0;
      for (LinkId l : f.route) lat += topo.links()[l].latency.value();
      f.start_s = starts[b] + lat;
      f.remaining = t.bytes;
      f.batch = static_cast<int>(b);
      flows.push_back(f);
    }
  }
  const std::size_t num_links = topo.links().size();
  double now = 0;
  for (;;) {
    std::vector<double> rate(flows.size(), 0), rem(num_links);
    std::vector<bool> frozen(flows.size(), true);
    for (std::size_t l = 0; l < num_links; ++l) rem[l] = topo.links()[l].bandwidth.value();
    for (std::size_t i = 0; i < flows.size(); ++i) {
      frozen[i] = flows[i].done || flows[i].start_s > now;
    }
    for (;;) {
      std::vector<int> count(num_links, 0);
      for (std::size_t i = 0; i < flows.size(); ++i) {
        if (!frozen[i]) {
          for (LinkId l : flows[i].route) ++count[l];
        }
      }
      int best = -1;
      for (std::size_t l = 0; l < num_links; ++l) {
        if (count[l] > 0 && (best < 0 || rem[l] / count[l] < rem[best] / count[best])) {
          best = static_cast<int>(l);
        }
      }
      if (best < 0) break;
      const double share = rem[best] / count[best];
      for (std::size_t i = 0; i < flows.size(); ++i) {
        if (frozen[i] || std::find(flows[i].route.begin(), flows[i].route.end(), LinkId(best)) ==
                             flows[i].route.end()) {
          continue;
        }
        frozen[i] = true;
        rate[i] = share;
        for (LinkId l : flows[i].route) rem[l] -= share;
      }
    }
    double next = NetworkModel::kNever;
    for (std::size_t i = 0; i < flows.size(); ++i) {
      if (flows[i].done) continue;
      if (flows[i].start_s > now) {
        next = std::min(next, flows[i].start_s);
      } else if (flows[i].remaining <= 0) {
        next = std::min(next, now);
      } else {
        next = std::min(next, now + flows[i].remaining / rate[i]);
      }
    }
    if (next == NetworkModel::kNever) break;
    for (std::size_t i = 0; i < flows.size(); ++i) {
      RefFlow& f = flows[i];
      if (f.done || f.start_s > now) continue;
      f.remaining -= rate[i] * (next - now);
      if (f.remaining <= 1e-3) {  // bytes; sizes here are >= 1e5
        f.done = true;
        completion[f.batch] = std::max(completion[f.batch], next);
      }
    }
    for (RefFlow& f : flows) {
      if (!f.done && f.start_s <= next && f.remaining <= 0) {
        f.done = true;
        completion[f.batch] = std::max(completion[f.batch], next);
      }
    }
    now = next;
  }
  return completion;
}

// Two switches in a line, 8 GPUs (4 per switch), a 2:1 oversubscribed trunk, uneven bandwidths.
struct TwoSwitchTopology : TestTopology {
  TwoSwitchTopology() : TestTopology(8) {
    const auto s0 = add_switch(), s1 = add_switch();
    std::vector<LinkId> up, down;
    for (int g = 0; g < 8; ++g) {
      const auto sw = g < 4 ? s0 : s1;
      up.push_back(add_link(gpu_vertex(g), sw, (4 + g) * kGB, 0.5 * kUs));
      down.push_back(add_link(sw, gpu_vertex(g), (11 - g) * kGB, 0.5 * kUs));
    }
    const LinkId t01 = add_link(s0, s1, 8 * kGB, 1 * kUs);
    const LinkId t10 = add_link(s1, s0, 12 * kGB, 1 * kUs);
    for (int s = 0; s < 8; ++s) {
      for (int d = 0; d < 8; ++d) {
        if (s == d) continue;
        if (s / 4 == d / 4) {
          set_route(s, d, {up[s], down[d]});
        } else {
          set_route(s, d, {up[s], s < 4 ? t01 : t10, down[d]});
        }
      }
    }
  }
};

TEST(FlowModel, MatchesNaiveReferenceOnRandomTraffic) {
  TwoSwitchTopology topo;
  std::mt19937 rng(2024);
  std::uniform_int_distribution<int> gpu(0, 7), count(1, 12);
  std::uniform_real_distribution<double> size(1e5, 5e7), gap(0, 2e-3);
  std::int64_t csr_levels = 0, scan_levels = 0, restores = 0;
  for (int trial = 0; trial < 30; ++trial) {
    const int num_batches = 1 + trial % 5;
    std::vector<std::vector<Transfer>> batches(num_batches);
    std::vector<double> starts(num_batches);
    double t = 0;
    for (int b = 0; b < num_batches; ++b) {
      starts[b] = t;
      t += gap(rng);
      const int n = count(rng);
      for (int k = 0; k < n; ++k) batches[b].push_back({gpu(rng), gpu(rng), std::round(size(rng))});
      if (trial % 3 == 0) batches[b].push_back(batches[b].front());  // a duplicate: multiplicity
    }
    const auto expected = reference_completions(topo, batches, starts);

    // Drive the model the way the engine does: start each batch when the clock reaches it.
    FlowModel model(topo);
    std::vector<double> got(num_batches, -1);
    std::vector<BatchId> ids;
    int next_batch = 0;
    for (;;) {
      const double t_done = model.next_completion_time();
      const double t_start = next_batch < num_batches ? starts[next_batch] : NetworkModel::kNever;
      if (t_done == NetworkModel::kNever && t_start == NetworkModel::kNever) break;
      if (t_start < t_done) {
        EXPECT_TRUE(model.advance_to(t_start).empty());
        ids.push_back(model.start_batch(t_start, batches[next_batch++]));
        continue;
      }
      for (const auto& c : model.advance_to(t_done)) got[c.id] = c.time_s;
    }
    for (int b = 0; b < num_batches; ++b) {
      EXPECT_NEAR(got[ids[b]], expected[b], 1e-7 * expected[b] + 1e-12)
          << "trial " << trial << " batch " << b;
    }
    csr_levels += model.stats().levels - model.stats().scan_levels;
    scan_levels += model.stats().scan_levels;
    restores += model.stats().restores;
  }
  // Both ways of resolving a level, and rewinds of the lookahead, were exercised.
  EXPECT_GT(csr_levels, 0);
  EXPECT_GT(scan_levels, 0);
  EXPECT_GT(restores, 0);
}

// Drives the model like the engine (each batch starts when the clock reaches it); completion
// time per batch, in batch order.
// horizon: ask with next_completion_time_before(the next start), as the engine does.
std::vector<double> run_staggered(FlowModel& model,
                                  const std::vector<std::vector<Transfer>>& batches,
                                  const std::vector<double>& starts, bool horizon = false) {
  const int num_batches = static_cast<int>(batches.size());
  std::vector<double> got(num_batches, -1);
  std::vector<BatchId> ids;
  std::map<BatchId, double> by_id;
  int next_batch = 0;
  for (;;) {
    const double t_start = next_batch < num_batches ? starts[next_batch] : NetworkModel::kNever;
    const double t_done =
        horizon ? model.next_completion_time_before(t_start) : model.next_completion_time();
    if (t_done == NetworkModel::kNever && t_start == NetworkModel::kNever) break;
    if (t_start < t_done) {
      // (advance_to checks t against the full lookahead: the engine calls it at completions only.)
      if (!horizon) {
        EXPECT_TRUE(model.advance_to(t_start).empty());
      }
      ids.push_back(model.start_batch(t_start, batches[next_batch++]));
      continue;
    }
    for (const auto& c : model.advance_to(t_done)) by_id[c.id] = c.time_s;
  }
  for (int b = 0; b < num_batches; ++b) got[b] = by_id.at(ids[b]);
  return got;
}

// 4 nodes x 4 GPUs (NVSwitch), 4 NICs per node, radix-4 switches: a 3-level fat tree (8 leaves of
// 2 NICs with 2 uplinks, 4 pods) from the topology library, with the given ECMP mode.
ClusterSpec small_fat_tree(EcmpMode ecmp) {
  ClusterSpec c;
  c.gpu.name = "a100-sxm-80gb";
  c.nodes = 4;
  c.gpus_per_node = 4;
  c.intra.kind = IntraKind::kNvswitch;
  c.intra.bandwidth = BytesPerSecond(300e9);
  c.intra.latency = Seconds(1e-6);
  c.inter.kind = InterKind::kFatTree;
  c.inter.nic_bandwidth = BytesPerSecond(25e9);
  c.intra.efficiency = c.inter.nic_efficiency = 1;  // spec-sheet rates: hand-computed times
  c.inter.nics_per_node = 4;
  c.inter.latency = Seconds(2e-6);
  c.inter.switch_radix = 4;
  // Non-blocking (2 NIC ports, 2 uplinks per leaf), but hash collisions still contend.
  c.inter.ecmp = ecmp;
  return c;
}

// A skewed all-to-allv among p GPUs as MoE routing makes it: every pair a different size (x 0.5 to
// 1.5 of its base), destination d's experts drawing a Zipf(1) share (4 MB / (1 + d % 8)).
std::vector<Transfer> zipf_all_to_allv(int p, std::mt19937& rng) {
  std::uniform_real_distribution<double> noise(0.5, 1.5);
  std::vector<Transfer> a2av;
  for (int s = 0; s < p; ++s)
    for (int d = 0; d < p; ++d) a2av.push_back({s, d, 4e6 / (1 + d % 8) * noise(rng)});
  return a2av;
}

// Partial re-solves (flows finishing, flows starting while others move) on a built fat tree with
// contended uplinks, checked against the reference; every ECMP mode.
TEST(FlowModel, MatchesNaiveReferenceOnBuiltFatTrees) {
  for (EcmpMode mode : {EcmpMode::kHash, EcmpMode::kSpray, EcmpMode::kDmodk}) {
    const auto topo = topology::build_topology(small_fat_tree(mode));
    const int p = topo->num_gpus();
    const char* name = mode == EcmpMode::kHash    ? "hash"
                       : mode == EcmpMode::kSpray ? "spray"
                                                  : "dmodk";
    std::mt19937 rng(mode == EcmpMode::kHash ? 11 : mode == EcmpMode::kSpray ? 7 : 13);
    std::uniform_int_distribution<int> gpu(0, p - 1), count(1, 40);
    std::uniform_real_distribution<double> size(1e5, 2e7), gap(0, 4e-4);
    std::int64_t partial = 0, solves = 0;
    for (int trial = 0; trial < 12; ++trial) {
      const int num_batches = 1 + trial % 6;
      std::vector<std::vector<Transfer>> batches(num_batches);
      std::vector<double> starts(num_batches);
      double t = 0;
      for (int b = 0; b < num_batches; ++b) {
        starts[b] = t;
        t += gap(rng);
        const int n = count(rng);
        for (int k = 0; k < n; ++k) {
          batches[b].push_back({gpu(rng), gpu(rng), std::round(size(rng))});
        }
      }
      const auto expected = reference_completions(*topo, batches, starts);
      FlowModel model(*topo);
      const auto got = run_staggered(model, batches, starts);
      for (int b = 0; b < num_batches; ++b) {
        EXPECT_NEAR(got[b], expected[b], 1e-7 * expected[b] + 1e-12)
            << name << " trial " << trial << " batch " << b;
      }
      // Conservation: every byte crossed every link of its route once.
      double expected_bytes = 0, got_bytes = 0;
      for (const auto& batch : batches) {
        for (const Transfer& x : batch) {
          if (x.src == x.dst) continue;
          std::vector<LinkId> route;
          topo->route(x.src, x.dst, route);
          expected_bytes += x.bytes * static_cast<double>(route.size());
        }
      }
      for (double b : model.link_bytes()) got_bytes += b;
      EXPECT_NEAR(got_bytes, expected_bytes, 1e-6 * expected_bytes) << "trial " << trial;
      partial += model.stats().partial_solves;
      solves += model.stats().solves;
    }
    // Most events re-solved only part of the flows.
    EXPECT_GT(partial, solves / 2) << name;
  }
}

// Skewed all-to-allvs of MoE groups on disjoint nodes (pipeline stages, DP replicas), staggered,
// with sends between the groups now and then: an event re-solves only the batches it reaches
// through shared links. The others keep their rates, so the result equals re-solving every batch
// (split_components = false) and the reference; and batches were actually left alone.
TEST(FlowModel, BatchesOnDisjointLinksAreLeftAloneAndExact) {
  for (EcmpMode mode : {EcmpMode::kDmodk, EcmpMode::kHash}) {
    const auto topo = topology::build_topology(small_fat_tree(mode));
    std::mt19937 rng(mode == EcmpMode::kHash ? 5 : 3);
    std::uniform_real_distribution<double> gap(0, 2e-4);
    std::vector<std::vector<Transfer>> batches;
    std::vector<double> starts;
    double t = 0;
    for (int b = 0; b < 8; ++b) {
      const int base = (b % 2) * 8;  // GPUs 0-7 (nodes 0, 1) or 8-15 (nodes 2, 3)
      std::vector<Transfer> a2av = zipf_all_to_allv(8, rng);
      for (Transfer& x : a2av) {
        x.src += base;
        x.dst += base;
      }
      if (b % 3 == 2) a2av.push_back({base + 1, 15 - base, 3e6});  // a send across the groups
      batches.push_back(std::move(a2av));
      starts.push_back(t);
      t += gap(rng);
    }
    const auto expected = reference_completions(*topo, batches, starts);
    FlowModel split(*topo);
    FlowModel whole(*topo, {}, FlowModelOptions{.split_components = false});
    const auto got = run_staggered(split, batches, starts);
    const auto all = run_staggered(whole, batches, starts);
    for (std::size_t b = 0; b < batches.size(); ++b) {
      EXPECT_NEAR(got[b], all[b], 1e-9 * all[b]) << "batch " << b;
      EXPECT_NEAR(got[b], expected[b], 1e-7 * expected[b]) << "batch " << b;
    }
    EXPECT_GT(split.stats().kept_segments, 0);
    EXPECT_EQ(whole.stats().kept_segments, 0);
    EXPECT_LT(split.stats().resolved_flows, whole.stats().resolved_flows);
  }
}

// The engine asks for the next completion up to its own next event (next_completion_time_before):
// the model then never simulates past a time at which a batch may start, so it never rewinds
// (restore_checkpoint and a replay), and the completions are those of full lookahead.
TEST(FlowModel, LookaheadUpToTheNextStartNeverRewindsAndAgrees) {
  const auto topo = topology::build_topology(small_fat_tree(EcmpMode::kDmodk));
  std::mt19937 rng(17);
  std::vector<std::vector<Transfer>> batches;
  std::vector<double> starts;
  for (int b = 0; b < 6; ++b) {
    batches.push_back(zipf_all_to_allv(16, rng));
    starts.push_back(2e-4 * b);  // each starts while the earlier ones are still moving
  }
  FlowModel full(*topo), bounded(*topo);
  const auto a = run_staggered(full, batches, starts);
  const auto b = run_staggered(bounded, batches, starts, /*horizon=*/true);
  for (std::size_t i = 0; i < batches.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-9 * a[i]) << i;
  EXPECT_GT(full.stats().restores, 0);
  EXPECT_EQ(bounded.stats().restores, 0);
  EXPECT_LT(bounded.stats().events, full.stats().events);
  // With no start ahead the bound is infinite: the same as next_completion_time(); a bound
  // before the first completion gives +infinity, and asking again goes on from there.
  FlowModel one(*topo), two(*topo);
  one.start_batch(0, batches[0]);
  two.start_batch(0, batches[0]);
  const double done = one.next_completion_time();
  EXPECT_EQ(two.next_completion_time_before(0.5 * done), NetworkModel::kNever);
  EXPECT_EQ(two.next_completion_time_before(NetworkModel::kNever), done);
}

// Spray splits every flow over all uplinks: a linear all-to-all sees a symmetric core, so all
// inter-node flows share one rate and finish together (few events), never later than with hash
// collisions, and the leaves' summed uplink capacity is the same in both modes.
TEST(FlowModel, SprayEcmpMakesTheFabricSymmetric) {
  const auto hash = topology::build_topology(small_fat_tree(EcmpMode::kHash));
  const auto spray = topology::build_topology(small_fat_tree(EcmpMode::kSpray));
  auto uplink_capacity = [](const topology::Topology& topo) {
    double sum = 0;
    for (const auto& l : topo.links()) {
      if (topo.vertices()[l.src].level == 1 && topo.vertices()[l.dst].level == 2) {
        sum += l.bandwidth.value();
      }
    }
    return sum;
  };
  EXPECT_DOUBLE_EQ(uplink_capacity(*hash), uplink_capacity(*spray));
  EXPECT_GT(uplink_capacity(*spray), 0);

  const int p = hash->num_gpus();
  std::vector<Transfer> a2a;
  for (int s = 0; s < p; ++s) {
    for (int d = 0; d < p; ++d) a2a.push_back({s, d, 4e6});
  }
  FlowModel hash_model(*hash), spray_model(*spray);
  const double t_hash = run_one(hash_model, a2a);
  const double t_spray = run_one(spray_model, a2a);
  EXPECT_LE(t_spray, t_hash * (1 + 1e-9));
  EXPECT_LT(spray_model.stats().events, hash_model.stats().events);
  // The same against the reference, for the spray fabric.
  const auto expected = reference_completions(*spray, {a2a}, {0.0});
  expect_time(t_spray, expected[0]);
}

// d-mod-k (the fat_tree default) on a 2-leaf fat tree: 2 nodes x 8 GPUs (NVSwitch 300 GB/s,
// PCIe 32 GB/s to the GPU's own 25 GB/s NIC), radix 16: two leaves of 8 NIC ports, 8 uplinks of
// 25 GB/s to 8 spines. In a linear all-to-all of B bytes per pair every cross-leaf flow shares
// each link of its route with exactly 7 others (its NIC's 8 remote destinations, its spine's 8
// sources, its destination NIC's 8 sources), so all 128 get 25/8 GB/s and finish together at
// route latency (0.5 + 1 + 1 + 1 + 1 + 0.5 us) + B / 3.125 GB/s. The intra-node flows (7 per
// NVSwitch port, 300/7 GB/s) are done long before. Hash collisions can only be slower.
TEST(FlowModel, DmodkLinearAllToAllOnTwoLeavesHandComputed) {
  ClusterSpec c = small_fat_tree(EcmpMode::kDmodk);
  c.nodes = 2;
  c.gpus_per_node = 8;
  c.inter.nics_per_node = 8;
  c.inter.switch_radix = 16;
  const auto topo = topology::build_topology(c);
  const double bytes = 25e6;
  std::vector<Transfer> a2a;
  for (int s = 0; s < 16; ++s) {
    for (int d = 0; d < 16; ++d) a2a.push_back({s, d, bytes});
  }
  FlowModel model(*topo);
  const double t = run_one(model, a2a);
  expect_time(t, 5 * kUs + bytes / (25 * kGB / 8));
  // Two rate levels (intra-node, inter-node): the intra flows finish, then the inter flows.
  EXPECT_LE(model.stats().events, 4);

  c.inter.ecmp = EcmpMode::kHash;
  const auto hash_topo = topology::build_topology(c);
  FlowModel hash_model(*hash_topo);
  EXPECT_GE(run_one(hash_model, a2a), t * (1 - 1e-9));
}

// The scenario keys of this engine and routing: cluster.inter_node.ecmp (default dmodk, also on
// rail_optimized) and engine.flow.event_tolerance (default 1e-9, in (0, 0.1)).
std::string scenario_yaml(const std::string& inter_extra, const std::string& engine) {
  return "name: t\ndescription: t\ncluster:\n  gpu: a100-sxm-80gb\n  nodes: 4\n"
         "  gpus_per_node: 8\n  intra_node: {kind: nvswitch, bandwidth: 300GB/s, efficiency: 1, "
         "latency: 1us}\n"
         "  inter_node:\n    nic_bandwidth: 200Gb/s\n    nic_efficiency: 1\n    nics_per_node: "
         "8\n" +
         inter_extra +
         "model: {mode: training, layers: 1, moe_every: 1, batch_per_gpu: 1, seq_len: 128, "
         "model_dim: 256, hidden_dim: 256, experts_per_gpu: 1, top_k: 1}\n"
         "parallelism: {ep: 32, esp: 1, mp: 1, dp: auto}\n" +
         engine + "strategies:\n  - {name: baseline}\n";
}

TEST(FlowModel, ScenarioKeysForRoutingAndEventTolerance) {
  const std::string fat = "    kind: fat_tree\n    switch_radix: 8\n";
  Scenario s = parse_scenario_string(scenario_yaml(fat, ""), "t.yaml");
  EXPECT_EQ(s.cluster.inter.ecmp, EcmpMode::kDmodk);
  EXPECT_EQ(s.engine.flow_event_tolerance, 3e-3);  // the default: within 0.1% of exact, finishes
  const std::pair<const char*, EcmpMode> modes[] = {
      {"dmodk", EcmpMode::kDmodk}, {"hash", EcmpMode::kHash}, {"spray", EcmpMode::kSpray}};
  for (const auto& [name, mode] : modes) {
    s = parse_scenario_string(scenario_yaml(fat + "    ecmp: " + name + "\n", ""), "t.yaml");
    EXPECT_EQ(s.cluster.inter.ecmp, mode) << name;
    s = parse_scenario_string(
        scenario_yaml(
            "    kind: rail_optimized\n    switch_radix: 8\n    ecmp: " + std::string(name) + "\n",
            ""),
        "t.yaml");
    EXPECT_EQ(s.cluster.inter.ecmp, mode) << name;
  }
  s = parse_scenario_string(scenario_yaml(fat, "engine: {flow: {event_tolerance: 1e-3}}\n"),
                            "t.yaml");
  EXPECT_EQ(s.engine.flow_event_tolerance, 1e-3);

  auto error_of = [](const std::string& yaml) {
    try {
      parse_scenario_string(yaml, "t.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of(scenario_yaml(fat + "    ecmp: adaptive\n", "")),
              ::testing::HasSubstr("ecmp"));
  EXPECT_THAT(error_of(scenario_yaml("    kind: dragonfly\n    ecmp: dmodk\n", "")),
              ::testing::HasSubstr("'ecmp' applies only to kind"));
  for (const char* bad : {"0", "0.5", "-1e-3"}) {
    EXPECT_THAT(error_of(scenario_yaml(
                    fat, std::string("engine: {flow: {event_tolerance: ") + bad + "}}\n")),
                ::testing::HasSubstr("engine.flow.event_tolerance"))
        << bad;
  }
  EXPECT_THAT(error_of(scenario_yaml(fat, "engine: {flow: {tolerance: 1e-3}}\n")),
              ::testing::HasSubstr("tolerance"));
  // engine.flow.sharing: per_collective by default, per_flow on request, nothing else.
  EXPECT_EQ(s.engine.flow_sharing, FlowSharingKind::kPerCollective);
  s = parse_scenario_string(scenario_yaml(fat, "engine: {flow: {sharing: per_flow}}\n"), "t.yaml");
  EXPECT_EQ(s.engine.flow_sharing, FlowSharingKind::kPerFlow);
  const std::string bad_sharing =
      error_of(scenario_yaml(fat, "engine: {flow: {sharing: per_channel}}\n"));
  EXPECT_THAT(bad_sharing, ::testing::HasSubstr("engine.flow.sharing"));
  EXPECT_THAT(bad_sharing, ::testing::HasSubstr("per_collective"));
}

// engine.flow.sharing, by hand: one 1 GB/s link, collective A = three 1 GB flows, collective B =
// one 1 GB flow, all started at 0. Per flow, the four flows get 0.25 GB/s each and all finish at
// 4 s. Per collective, A's copies weigh 1/3 each and B's flow 1, so A and B get 0.5 GB/s each: B
// finishes at 2 s; A's flows have 2/3 GB left each and then share the whole link: 2 s more, 4 s.
TEST(FlowModel, PerCollectiveSharingSplitsALinkBetweenCollectives) {
  PairTopology topo(1 * kGB, 0);
  const std::vector<Transfer> a = {{0, 1, 1e9}, {0, 1, 1e9}, {0, 1, 1e9}};
  const std::vector<Transfer> b = {{0, 1, 1e9}};
  FlowModel per_flow(topo);
  const BatchId pa = per_flow.start_batch(0, a);
  const BatchId pb = per_flow.start_batch(0, b);
  auto done = drain(per_flow);
  expect_time(done.at(pa), 4.0);
  expect_time(done.at(pb), 4.0);

  FlowModel per_coll(topo, {}, FlowModelOptions{.sharing = FlowSharing::kPerCollective});
  const BatchId ca = per_coll.start_batch(0, a);
  const BatchId cb = per_coll.start_batch(0, b);
  done = drain(per_coll);
  expect_time(done.at(cb), 2.0);
  expect_time(done.at(ca), 4.0);
  // Bytes are conserved whatever the sharing: 4 GB crossed the one link.
  double bytes = 0;
  for (double x : per_coll.link_bytes()) bytes += x;
  EXPECT_NEAR(bytes, 4e9, 1e-6 * 4e9);
}

// A collective alone is rated as under per-flow sharing (one weight for all its flows), skewed or
// not: a Zipf-loaded all-to-allv with every pair a different size.
TEST(FlowModel, PerCollectiveSharingLeavesALoneCollectiveUnchanged) {
  const auto topo = topology::build_topology(small_fat_tree(EcmpMode::kHash));
  const int p = topo->num_gpus();
  std::mt19937 rng(5);
  const std::vector<Transfer> a2a = zipf_all_to_allv(p, rng);
  FlowModel per_flow(*topo);
  FlowModel per_coll(*topo, {}, FlowModelOptions{.sharing = FlowSharing::kPerCollective});
  const BatchId x = per_flow.start_batch(0, a2a);
  const BatchId y = per_coll.start_batch(0, a2a);
  const double tx = drain(per_flow).at(x), ty = drain(per_coll).at(y);
  EXPECT_NEAR(ty, tx, 1e-12 * tx);
}

// The bound documented for engine.flow.event_tolerance (scenarios/README.md): on skewed
// all-to-allv traffic (every pair a different size, destinations Zipf-loaded as MoE routing makes
// them) overlapped by a second collective, every batch completes within 0.75 x `tolerance`
// (relative) of the exact model, for every ECMP mode, non-blocking and 4:1 oversubscribed, over
// several draws; and it needs fewer rate recomputations. The bound is empirical: flows finished
// early give their bandwidth to others and flows finished late keep it, which no closed form caps;
// with the window centred on its event the worst case measured is 0.53 x tolerance at 1e-3 and
// 0.31 x at 1e-2 (a window that only looked ahead: 1.004 x, all errors early).
TEST(FlowModel, EventToleranceErrorIsBoundedOnSkewedAllToAllv) {
  constexpr double kBoundFactor = 0.75;
  for (unsigned draw : {0u, 300u, 400u}) {
    for (double oversub : {1.0, 4.0}) {
      for (EcmpMode mode : {EcmpMode::kHash, EcmpMode::kSpray, EcmpMode::kDmodk}) {
        ClusterSpec spec = small_fat_tree(mode);
        spec.inter.oversubscription = oversub;
        const auto topo = topology::build_topology(spec);
        const int p = topo->num_gpus();
        std::mt19937 rng(static_cast<unsigned>(oversub * 10) + static_cast<unsigned>(mode) + draw);
        const std::vector<Transfer> a2av = zipf_all_to_allv(p, rng);
        std::vector<Transfer> ring;
        for (int s = 0; s < p; ++s) ring.push_back({s, (s + 1) % p, 8e6});
        const std::vector<std::vector<Transfer>> batches = {a2av, ring, a2av};
        const std::vector<double> starts = {0.0, 2e-4, 5e-4};
        FlowModel exact(*topo);
        const auto want = run_staggered(exact, batches, starts);
        for (double tol : {1e-3, 1e-2}) {
          FlowModel coarse(*topo, {}, FlowModelOptions{.event_tolerance = tol});
          const auto got = run_staggered(coarse, batches, starts);
          for (std::size_t b = 0; b < batches.size(); ++b) {
            EXPECT_NEAR(got[b], want[b], kBoundFactor * tol * want[b])
                << "draw " << draw << " oversubscription " << oversub << " ecmp "
                << static_cast<int>(mode) << " tolerance " << tol << " batch " << b;
          }
          EXPECT_LT(coarse.stats().solves, exact.stats().solves);
        }
      }
    }
  }
}

// The tolerance is relative to the time a batch has run, not to the clock: the same batches
// started 1 s into a run (a late layer of a long step) keep every completion within the
// tolerance of their own duration. (With a slack of tolerance x t, 1 s in, every flow of these
// millisecond batches fell within one slack and whole batches were released early: a 61-block
// DeepSeek-V3 step came out 13% short at 3e-3.)
TEST(FlowModel, EventToleranceIsRelativeToTheBatchNotTheClock) {
  const auto topo = topology::build_topology(small_fat_tree(EcmpMode::kHash));
  const int p = topo->num_gpus();
  std::mt19937 rng(5);
  const std::vector<Transfer> a2av = zipf_all_to_allv(p, rng);
  const std::vector<std::vector<Transfer>> batches = {a2av, a2av};
  const std::vector<double> starts = {1.0, 1.0 + 3e-4};
  FlowModel exact(*topo);
  const auto want = run_staggered(exact, batches, starts);
  for (double tol : {1e-3, 1e-2}) {
    FlowModel coarse(*topo, {}, FlowModelOptions{.event_tolerance = tol});
    const auto got = run_staggered(coarse, batches, starts);
    for (std::size_t b = 0; b < batches.size(); ++b) {
      const double duration = want[b] - starts[b];
      ASSERT_GT(duration, 1e-3) << "the batches run for milliseconds";
      EXPECT_NEAR(got[b], want[b], tol * duration) << "tolerance " << tol << " batch " << b;
    }
    EXPECT_LT(coarse.stats().solves, exact.stats().solves);
  }
}

}  // namespace
}  // namespace moesim::sim
