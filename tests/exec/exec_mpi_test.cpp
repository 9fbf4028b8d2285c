// Host-path tests of exec/, run under `mpirun -np 4 --oversubscribe` (CTest does): every rank
// runs every test; collectives inside a test are matched across ranks. Expectations are exact
// where the answer is known (byte patterns of an all-to-all, drop counts from the capacity rule)
// and bitwise where two executions must agree (linear vs 2DH, pipeline degrees 1, 2, 4).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/scenario_loader.hpp"
#include "exec/executor.hpp"
#include "exec/moe_data.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/phase_runner.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/workload/workload.hpp"
#include "tests/exec/mpi_test_main.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
namespace {

Scenario host4() {
  return load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/exec-host-4.yaml");
}

// Byte j of the chunk position s sends to position d.
std::byte pattern(int s, int d, std::size_t j) {
  return static_cast<std::byte>((s * 31 + d * 7 + static_cast<int>(j) * 3) & 0xff);
}

TEST(ExecMpi, RunsOnFourRanks) { ASSERT_EQ(g_session->size(), 4) << "run under mpirun -np 4"; }

// One all-to-all of c bytes per pair: the lowered linear and 2DH phases and MPI_Alltoallv all
// deliver chunk (s -> me) to slot s.
TEST(ExecMpi, AllToAllLinearTwoDhAndAlltoallvDeliverTheSameBytes) {
  Scenario sc = host4();
  auto topo = topology::build_topology(sc.cluster);
  MpiCommunicator comm;
  const int P = comm.size(), me = comm.rank();
  const std::size_t c = 24;  // bytes per pair
  std::vector<std::byte> send(c * P), expected(c * P);
  for (int d = 0; d < P; ++d)
    for (std::size_t j = 0; j < c; ++j) {
      send[d * c + j] = pattern(me, d, j);
      expected[d * c + j] = pattern(d, me, j);
    }
  std::vector<int> world{0, 1, 2, 3};
  for (CollectiveAlgo algo : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAll;
    spec.algo = algo;
    spec.bytes = Bytes(static_cast<double>(c * P));
    collectives::CollectiveCall call{&spec, &world, 0, true};
    const auto* a = collectives::find_algorithm(spec.type, algo);
    ASSERT_NE(a, nullptr);
    std::vector<std::byte> recv(c * P);
    PhaseStats st = run_phases(comm, a->lower(call, *topo), send.data(), send.size(), recv.data(),
                               recv.size(), 5);
    EXPECT_EQ(recv, expected) << collective_algo_name(algo);
    // Linear: one exchange of P-1 messages; 2DH: an intra and an inter exchange, 1 peer each.
    EXPECT_EQ(st.exchanges, algo == CollectiveAlgo::kLinear ? 1 : 2);
    EXPECT_EQ(st.sent_bytes, algo == CollectiveAlgo::kLinear ? c * (P - 1) : 2 * c * 2);
  }
  std::vector<std::size_t> counts(P, c), displs(P);
  for (int d = 0; d < P; ++d) displs[d] = d * c;
  std::vector<std::byte> recv(c * P);
  comm.all_to_allv(send.data(), counts, displs, recv.data(), counts, displs, world);
  EXPECT_EQ(recv, expected);
}

TEST(ExecMpi, GroupCollectivesSumAndGather) {
  MpiCommunicator comm;
  const int me = comm.rank();
  // Two groups {0, 2} and {1, 3}: the sum of the members' values.
  std::vector<int> group = me % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
  std::vector<float> v{static_cast<float>(me), 1.0f};
  comm.all_reduce_sum(v.data(), v.size(), group);
  EXPECT_EQ(v[0], static_cast<float>(group[0] + group[1]));
  EXPECT_EQ(v[1], 2.0f);
  std::byte mine{static_cast<unsigned char>(10 + me)};
  std::vector<std::byte> all(2);
  comm.all_gather(&mine, 1, all.data(), group);
  EXPECT_EQ(all[0], std::byte{static_cast<unsigned char>(10 + group[0])});
  EXPECT_EQ(all[1], std::byte{static_cast<unsigned char>(10 + group[1])});
  std::vector<float> in{1.0f + me, 100.0f + me}, out(1);
  comm.reduce_scatter_sum(in.data(), out.data(), 1, group);
  const int pos = me == group[0] ? 0 : 1;
  EXPECT_EQ(out[0], pos == 0 ? 2.0f + group[0] + group[1] : 200.0f + group[0] + group[1]);
}

TEST(ExecMpi, WaitTimesOutInsteadOfHanging) {
  setenv("MOESIM_EXEC_TIMEOUT_S", "0.3", 1);
  std::vector<MPI_Request> req;
  if (g_session->rank() == 0) {
    int x = 0;
    req.emplace_back();
    MPI_Irecv(&x, 1, MPI_INT, 1, 999, MPI_COMM_WORLD, &req.back());  // rank 1 never sends
    EXPECT_THROW(wait_all(req, "a message nobody sends"), ExecError);
    MPI_Cancel(&req[0]);
    MPI_Wait(&req[0], MPI_STATUS_IGNORE);
  }
  unsetenv("MOESIM_EXEC_TIMEOUT_S");
  g_session->barrier("after the timeout test");
}

// The watchdog of calls that cannot be polled (NCCL bootstrap): it reports a call still blocked
// after its timeout, naming it, and stays silent for a call that returned (its destructor
// disarms it). Margins are wide (10 ms vs 2 s of blocking, 60 s vs an immediate return).
TEST(ExecMpi, BlockingCallWatchdogFiresOnlyOnABlockedCall) {
  std::string fired;
  std::mutex m;
  std::condition_variable cv;
  {
    BlockingCallWatchdog guard("a call that blocks", g_session->rank(), 0.01,
                               [&](const std::string& message) {
                                 std::lock_guard lock(m);
                                 fired = message;
                                 cv.notify_all();
                               });
    std::unique_lock lock(m);
    cv.wait_for(lock, std::chrono::seconds(2), [&] { return !fired.empty(); });
  }
  EXPECT_NE(fired.find("timed out after 0 s in a call that blocks"), std::string::npos) << fired;
  EXPECT_EQ(fired.rfind(fmt::format("rank {}:", g_session->rank()), 0), 0u) << fired;
  bool quiet_fired = false;
  {
    BlockingCallWatchdog guard("a call that returns", g_session->rank(), 60.0,
                               [&](const std::string&) { quiet_fired = true; });
  }
  EXPECT_FALSE(quiet_fired);
}

// SAA (Parm) with m = 2, A = 2 on the four ranks, through the host PhaseIo: rank (a, t) =
// position a * 2 + t receives in slot t' * A + a' the chunk that (a', t') sent to all-to-all
// peer a, i.e. the all-to-all result all-gathered over the sub-group, strided pieces included.
TEST(ExecMpi, SaaDeliversTheAllToAllAllGatheredOverTheSubGroup) {
  Scenario sc = host4();
  auto topo = topology::build_topology(sc.cluster);
  MpiCommunicator comm;
  const int me = comm.rank(), m = 2, A = 2;
  const std::size_t c = 24;  // bytes per all-to-all peer, a multiple of the n = 2 slices
  std::vector<std::byte> send(c * A), expected(c * A * m), recv(c * A * m);
  for (int a = 0; a < A; ++a)
    for (std::size_t j = 0; j < c; ++j) send[a * c + j] = pattern(me, a, j);
  const int my_a = me / m;
  for (int t2 = 0; t2 < m; ++t2)
    for (int a2 = 0; a2 < A; ++a2)
      for (std::size_t j = 0; j < c; ++j)
        expected[(t2 * A + a2) * c + j] = pattern(a2 * m + t2, my_a, j);
  std::vector<int> world{0, 1, 2, 3};
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.algo = CollectiveAlgo::kSaa;
  spec.sub_group = m;
  spec.bytes = Bytes(static_cast<double>(c * A));
  collectives::CollectiveCall call{&spec, &world, 0, true};
  const auto* algo = collectives::find_algorithm(spec.type, spec.algo);
  ASSERT_NE(algo, nullptr);
  const SaaLayout saa(spec, 4, static_cast<double>(c * A));
  run_phases(comm, algo->lower(call, *topo), send.data(), send.size(), recv.data(), recv.size(), 5,
             &saa);
  EXPECT_EQ(recv, expected);
}

// The overlapped layout's SAA (saa_a2a_spans_group): the all-to-all runs over all A = 4 ranks and
// the all-gather over the blocks {0, 1}, {2, 3}: rank p (block q = p / 2) receives in slot
// t' * A + a' the chunk that rank a' sent to rank q * 2 + t'.
TEST(ExecMpi, SaaSpanningTheGroupDeliversTheWholeAllToAllAllGatheredOverTheBlock) {
  Scenario sc = host4();
  auto topo = topology::build_topology(sc.cluster);
  MpiCommunicator comm;
  const int me = comm.rank(), m = 2, A = 4;
  const std::size_t c = 24;  // bytes per all-to-all peer, a multiple of the n = 4 slices
  std::vector<std::byte> send(c * A), expected(c * A * m), recv(c * A * m);
  for (int a = 0; a < A; ++a)
    for (std::size_t j = 0; j < c; ++j) send[a * c + j] = pattern(me, a, j);
  const int block = me / m;
  for (int t2 = 0; t2 < m; ++t2)
    for (int a2 = 0; a2 < A; ++a2)
      for (std::size_t j = 0; j < c; ++j)
        expected[(t2 * A + a2) * c + j] = pattern(a2, block * m + t2, j);
  std::vector<int> world{0, 1, 2, 3};
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.algo = CollectiveAlgo::kSaa;
  spec.sub_group = m;
  spec.saa_a2a_spans_group = true;
  spec.bytes = Bytes(static_cast<double>(c * A));
  collectives::CollectiveCall call{&spec, &world, 0, true};
  const auto* algo = collectives::find_algorithm(spec.type, spec.algo);
  ASSERT_NE(algo, nullptr);
  const SaaLayout saa(spec, 4, static_cast<double>(c * A));
  ASSERT_EQ(saa.a2a_peers(), A);
  run_phases(comm, algo->lower(call, *topo), send.data(), send.size(), recv.data(), recv.size(), 6,
             &saa);
  EXPECT_EQ(recv, expected);
}

using Outcome = ExecOutcome;

Outcome run_once(const Scenario& sc, int r, CollectiveAlgo a2a, bool check = true) {
  MpiCommunicator comm;
  strategies::Decision d;
  d.pipeline_degree = r;
  d.a2a = a2a;
  return run_step(sc, comm, d, check);
}

TEST(ExecMpi, OutputsMatchTheReferenceAndAgreeAcrossAlgorithmsAndPipelineDegrees) {
  Scenario sc = host4();
  Outcome base = run_once(sc, 1, CollectiveAlgo::kLinear);
  ASSERT_EQ(base.outputs.size(), 2u);  // two MoE blocks
  ASSERT_EQ(base.checks.size(), 2u);
  for (const auto& c : base.checks) {
    EXPECT_EQ(c.wrong, 0) << "layer " << c.layer;
    EXPECT_EQ(c.compared, 4LL * 32 * 16);
    EXPECT_EQ(c.dropped, c.expected_dropped);
  }
  // The output is not trivially zero.
  double norm = 0;
  for (float v : base.outputs[0]) norm += std::fabs(v);
  EXPECT_GT(norm, 0.0);
  for (int r : {1, 2, 4})
    for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
      Outcome o = run_once(sc, r, a, false);
      EXPECT_EQ(o.outputs, base.outputs) << "r=" << r << " " << collective_algo_name(a);
      EXPECT_EQ(o.dropped, base.dropped);
    }
}

// The backward MoE layer on real data (exec/layer_backward.cpp): exec-host-4 (ep = 4, dp = 1) and
// its ep = 2 x dp = 2 variant (the expert gradients' DP all-reduce sums real dW1 / dW2). --check
// compares every gradient (per layer: dX 4 x 32 x 16, dWgate 4 x 16 x E, dW1 + dW2 of E experts
// 2 x 16 x 32 each, on their owners: both replicas with dp = 2) with #wrong 0; the gradients are
// bitwise the same with linear and 2DH all-to-alls (only the transport differs) and the same to
// fp32 rounding with r = 2 chunks (dW accumulates chunk by chunk).
TEST(ExecMpi, BackwardGradientsMatchTheReferenceAndAgreeAcrossAlgorithmsAndPipelineDegrees) {
  struct Case {
    Scenario sc;
    int experts;
    int dp;
  };
  std::vector<Case> cases;
  cases.push_back({host4(), 8, 1});
  cases.push_back(
      {load_scenario(std::string(MOESIM_SOURCE_DIR) + "/tests/data/exec/backward-dp2-4.yaml"), 4,
       2});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.sc.name);
    Outcome base = run_once(c.sc, 1, CollectiveAlgo::kLinear);
    ASSERT_EQ(base.grad_checks.size(), 2u);
    const long long E = c.experts, per_layer = 4LL * 32 * 16 + 4LL * 16 * E +
                                               c.dp * E * 2LL * 16 * 32;  // owners x replicas
    for (const auto& g : base.grad_checks) {
      EXPECT_EQ(g.compared, per_layer) << "layer " << g.layer;
      EXPECT_EQ(g.wrong, 0) << "layer " << g.layer;
      EXPECT_LT(g.max_abs_error, 1e-5);
    }
    ASSERT_EQ(base.grads.size(), 2u);
    const size_t dE = static_cast<size_t>(E) * c.dp / 4;
    ASSERT_EQ(base.grads[0].size(), 32u * 16 + 16u * E + dE * 2 * 16 * 32);
    double norm = 0;
    for (float v : base.grads[0]) norm += std::fabs(v);
    EXPECT_GT(norm, 1.0);
    for (int r : {1, 2})
      for (CollectiveAlgo a : {CollectiveAlgo::kLinear, CollectiveAlgo::k2dh}) {
        Outcome o = run_once(c.sc, r, a, false);
        ASSERT_EQ(o.grads.size(), base.grads.size());
        for (size_t l = 0; l < o.grads.size(); ++l) {
          ASSERT_EQ(o.grads[l].size(), base.grads[l].size());
          if (r == 1) {
            EXPECT_EQ(o.grads[l], base.grads[l]) << collective_algo_name(a);
            continue;
          }
          for (size_t i = 0; i < o.grads[l].size(); ++i)
            ASSERT_NEAR(o.grads[l][i], base.grads[l][i], 1e-5 * (1 + std::fabs(base.grads[l][i])))
                << "r=" << r << " " << collective_algo_name(a) << " layer " << l << " i " << i;
        }
      }
  }
}

// Capacity factor 0.5: dC = ceil(2 * 0.5 * 32 / 8) = 4 slots per expert, so many choices drop.
// Drops per expert are exactly max(0, demand - dC); which choices drop follows "all first choices
// before any second choice" (workload::apply_capacity), checked choice by choice.
TEST(ExecMpi, DropsExactlyWhereTheCapacityRuleSays) {
  Scenario sc = host4();
  sc.model.capacity_factor = 0.5;
  Outcome o = run_once(sc, 1, CollectiveAlgo::kLinear);
  const MoeShape s{32, 16, 32, 8, 2};
  const int C = 4;
  for (int layer = 0; layer < 2; ++layer) {
    auto tokens = make_tokens(s, sc.workload.routing.seed, 0, layer, g_session->rank());
    auto rr =
        reference_routing(s, tokens, make_gate_weights(s, sc.workload.routing.seed, layer), C);
    std::vector<std::uint32_t> by_choice(8 * 2, 0);
    for (int t = 0; t < s.tokens; ++t)
      for (int c = 0; c < 2; ++c) ++by_choice[rr.expert[t * 2 + c] * 2 + c];
    long long expected = 0;
    for (int e = 0; e < 8; ++e) {
      std::uint32_t kept[2];
      workload::apply_capacity({&by_choice[e * 2], 2}, C, {kept, 2});
      std::uint32_t ref_kept[2] = {0, 0};
      for (int t = 0; t < s.tokens; ++t)
        for (int c = 0; c < 2; ++c)
          if (rr.expert[t * 2 + c] == e && rr.kept[t * 2 + c]) ++ref_kept[c];
      EXPECT_EQ(ref_kept[0], kept[0]);
      EXPECT_EQ(ref_kept[1], kept[1]);
      expected += static_cast<long long>(by_choice[e * 2] + by_choice[e * 2 + 1]) -
                  std::min<long long>(by_choice[e * 2] + by_choice[e * 2 + 1], C);
    }
    EXPECT_GT(expected, 0);
    EXPECT_EQ(o.dropped[layer], expected) << "layer " << layer;
    // Tokens with every choice dropped produce zero rows.
    for (int t = 0; t < s.tokens; ++t)
      if (!rr.kept[t * 2] && !rr.kept[t * 2 + 1]) {
        for (int m = 0; m < s.model_dim; ++m) EXPECT_EQ(o.outputs[layer][t * 16 + m], 0.0f);
      }
  }
  for (const auto& c : o.checks) {
    EXPECT_EQ(c.wrong, 0);
    EXPECT_EQ(c.dropped, c.expected_dropped);
  }
}

TEST(ExecMpi, RunResultIsCompleteAndIdenticalOnEveryRank) {
  Scenario sc = host4();
  Outcome o = run_once(sc, 2, CollectiveAlgo::k2dh, false);
  const RunResult& r = o.result;
  EXPECT_EQ(r.backend, "mpi");
  EXPECT_GT(r.makespan_s, 0.0);
  for (size_t i = 0; i < r.start_s.size(); ++i) {
    ASSERT_TRUE(std::isfinite(r.start_s[i]) && std::isfinite(r.end_s[i]));
    EXPECT_LE(r.start_s[i], r.end_s[i]);
  }
  EXPECT_FALSE(r.collectives.empty());
  for (const auto& c : r.collectives)
    if (c.label.find("dispatch") != std::string::npos) {
      EXPECT_EQ(c.algo, CollectiveAlgo::k2dh);
    }
  // Same makespan everywhere (rank 0's value broadcast and compared).
  double m = r.makespan_s;
  MPI_Bcast(&m, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(m, r.makespan_s);
}

}  // namespace
}  // namespace moesim::exec
