// Chakra execution-trace export (apps/moesim/chakra_export.hpp): a pipelined MoE plan written and
// read back with the schema (apps/moesim/chakra_et.proto); node counts, dependencies, sizes,
// process groups and send / receive pairs checked against the plan and the simulated times.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "apps/moesim/chakra_export.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/runner.hpp"
#include "topology/topology.hpp"

#ifdef MOESIM_HAVE_CHAKRA
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "apps/moesim/chakra_et.pb.h"
#endif

namespace moesim::app {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() /
                     fmt::format("moesim-chakra-{}-{}", ::getpid(), std::rand());  // NOLINT
  fs::create_directories(d);
  return d;
}

TEST(Chakra, RefusesAForeignDirectoryAndReplacesAnEarlierExport) {
  if (!chakra_available()) GTEST_SKIP() << "built without protobuf";
  const fs::path d = temp_dir();
  EXPECT_NO_THROW(check_chakra_dir((d / "new").string()));
  fs::create_directories(d / "theirs");
  std::ofstream(d / "theirs" / "notes.txt") << "keep me\n";
  EXPECT_THROW(check_chakra_dir((d / "theirs").string()), InputError);
  EXPECT_THROW(check_chakra_dir((d / "missing" / "x").string()), InputError);
  fs::create_directories(d / "ours");
  std::ofstream(d / "ours" / "moesim_chakra.json") << "{}\n";
  EXPECT_NO_THROW(check_chakra_dir((d / "ours").string()));
  fs::remove_all(d);
}

#ifdef MOESIM_HAVE_CHAKRA

struct Trace {
  ChakraProtoMsg::GlobalMetadata meta;
  std::vector<ChakraProtoMsg::Node> nodes;
};

Trace read_trace(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << path;
  google::protobuf::io::IstreamInputStream zero(&file);
  google::protobuf::io::CodedInputStream in(&zero);
  Trace t;
  auto next = [&](google::protobuf::Message& msg) {
    std::uint32_t size = 0;
    if (!in.ReadVarint32(&size)) return false;
    const auto limit = in.PushLimit(static_cast<int>(size));
    const bool ok = msg.ParseFromCodedStream(&in) && in.ConsumedEntireMessage();
    in.PopLimit(limit);
    EXPECT_TRUE(ok) << path;
    return ok;
  };
  EXPECT_TRUE(next(t.meta));
  for (ChakraProtoMsg::Node n; next(n); n.Clear()) t.nodes.push_back(n);
  return t;
}

const ChakraProtoMsg::AttributeProto* attr(const ChakraProtoMsg::Node& n, const std::string& name) {
  for (const auto& a : n.attr())
    if (a.name() == name) return &a;
  return nullptr;
}

// 2 nodes x 2 GPUs, 2 pipeline stages of one node (EP 2), 2 blocks, 2 micro-batches.
Scenario pipelined() {
  return parse_scenario_string(R"(
name: chakra-test
cluster:
  gpu: a100-sxm-80gb
  nodes: 2
  gpus_per_node: 2
  intra_node: {kind: nvswitch, bandwidth: 300GB/s, latency: 1us}
  inter_node: {kind: switch, nic_bandwidth: 200Gb/s, nics_per_node: 2, latency: 2us}
model:
  layers: 2
  batch_per_gpu: 2
  seq_len: 128
  model_dim: 128
  hidden_dim: 256
  experts_per_gpu: 1
  top_k: 1
  micro_batches: 2
parallelism: {pp: 2, ep: 2}
strategies:
  - {name: baseline}
)",
                               "chakra.yaml");
}

// The scenario's first strategy, one iteration on the analytical engine.
strategies::StackRun first_stack(const Scenario& sc) {
  const auto topo = topology::build_topology(sc.cluster);
  sim::EngineConfig cfg;
  cfg.network = sim::NetworkKind::kAnalytical;
  return strategies::run_stack(
      sc, sc.strategies[0], *topo, [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); }, 1);
}

TEST(Chakra, ATracePerRankReadsBackWithTheSchemaAndMatchesThePlan) {
  const Scenario sc = pipelined();
  const strategies::StackRun run = first_stack(sc);
  const Plan& plan = run.last_plan.plan;
  const RunResult& result = run.last_result;
  const fs::path d = temp_dir();
  const fs::path out = d / "et";
  write_chakra(out.string(), sc.name, {{"baseline", &plan, &result}});
  ASSERT_TRUE(fs::exists(out / "moesim_chakra.json"));
  nlohmann::json groups;
  std::ifstream(out / "baseline" / "comm_group.json") >> groups;

  // (src, dst, tag, bytes) of every send, and of every receive, over all ranks.
  std::multiset<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::uint64_t>> sends, recvs;
  int colls = 0;
  for (int rank = 0; rank < 4; ++rank) {
    const Trace t = read_trace(out / "baseline" / fmt::format("et.{}.et", rank));
    EXPECT_EQ(t.meta.version(), "0.0.4");
    // One node per op on this rank; the stage sends are one node (a send or a receive) on each
    // side.
    std::size_t expected = 0;
    for (const Op& op : plan.ops())
      if (op.ranks.index_of(rank) >= 0) ++expected;
    ASSERT_EQ(t.nodes.size(), expected) << "rank " << rank;
    std::size_t k = 0;
    for (const Op& op : plan.ops()) {
      const int pos = op.ranks.index_of(rank);
      if (pos < 0) continue;
      const auto& n = t.nodes[k];
      EXPECT_EQ(n.id(), k);
      for (auto dep : n.data_deps()) EXPECT_LT(dep, n.id());
      for (auto dep : n.ctrl_deps()) EXPECT_LT(dep, n.id());
      EXPECT_EQ(n.duration_micros(),
                static_cast<std::uint64_t>(
                    std::llround((result.op_end(op.id, pos) - result.op_start(op.id, pos)) * 1e6)));
      if (op.kind == OpKind::kCompute) {
        EXPECT_EQ(n.type(), ChakraProtoMsg::COMP_NODE);
        ASSERT_NE(attr(n, "num_ops"), nullptr);
        const double scale = op.compute().rank_scale
                                 ? (*op.compute().rank_scale)[static_cast<std::size_t>(pos)]
                                 : 1.0;
        EXPECT_EQ(attr(n, "num_ops")->int64_val(),
                  std::llround(op.compute().flops.value() * scale));
      } else if (op.kind == OpKind::kCollective && n.type() == ChakraProtoMsg::COMM_COLL_NODE) {
        ++colls;
        const auto& spec = op.collective();
        // The rank's group, as comm_group.json lists it under the node's pg_name.
        const auto& members = groups.at(attr(n, "pg_name")->string_val());
        bool in = false;
        for (const auto& g : plan.grouping(spec.grouping).groups)
          if (std::find(g.begin(), g.end(), rank) != g.end()) {
            in = true;
            EXPECT_EQ(members.get<std::vector<int>>(), g);
          }
        EXPECT_TRUE(in);
        if (spec.type == CollectiveType::kAllToAll || spec.type == CollectiveType::kAllReduce) {
          EXPECT_EQ(attr(n, "comm_size")->int64_val(), std::llround(spec.bytes.value()));
        }
        EXPECT_EQ(
            attr(n, "comm_type")->int64_val(),
            spec.type == CollectiveType::kAllReduce ? ChakraProtoMsg::ALL_REDUCE
            : spec.type == CollectiveType::kAllToAll || spec.type == CollectiveType::kAllToAllv
                ? ChakraProtoMsg::ALL_TO_ALL
            : spec.type == CollectiveType::kAllGather ? ChakraProtoMsg::ALL_GATHER
                                                      : ChakraProtoMsg::REDUCE_SCATTER);
      } else if (n.type() == ChakraProtoMsg::COMM_SEND_NODE ||
                 n.type() == ChakraProtoMsg::COMM_RECV_NODE) {
        EXPECT_NE(op.label.find(".pp."), std::string::npos) << op.label;
        auto key =
            std::make_tuple(attr(n, "comm_src")->int32_val(), attr(n, "comm_dst")->int32_val(),
                            attr(n, "comm_tag")->int32_val(),
                            static_cast<std::uint64_t>(attr(n, "comm_size")->int64_val()));
        EXPECT_EQ(n.type() == ChakraProtoMsg::COMM_SEND_NODE ? std::get<0>(key) : std::get<1>(key),
                  rank);
        (n.type() == ChakraProtoMsg::COMM_SEND_NODE ? sends : recvs).insert(key);
      }
      ++k;
    }
  }
  EXPECT_GT(colls, 0);
  // Every send has its receive: 2 stage pairs x 2 micro-batches x (activation + gradient), each
  // one rank's activation of S x M x 2 bytes.
  EXPECT_EQ(sends.size(), 8u);
  EXPECT_EQ(sends, recvs);
  for (const auto& s : sends) EXPECT_EQ(std::get<3>(s), 256u * 128u * 2u);
  // Again over it: an earlier export is replaced, not merged.
  write_chakra(out.string(), sc.name, {{"baseline", &plan, &result}});
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 2);
  fs::remove_all(d);
}

// 2 nodes x 4 GPUs, EP 8, Zipf-skewed routing under TA-MoE: every dispatch and combine is an
// all_to_allv whose rows differ per rank (the trace that deadlocked ASTRA-sim as collectives).
Scenario skewed() {
  return parse_scenario_string(R"(
name: chakra-skewed
cluster:
  gpu: a100-sxm-80gb
  nodes: 2
  gpus_per_node: 4
  intra_node: {kind: nvswitch, bandwidth: 300GB/s, latency: 1us}
  inter_node: {kind: switch, nic_bandwidth: 200Gb/s, nics_per_node: 4, latency: 2us}
model:
  layers: 2
  batch_per_gpu: 2
  seq_len: 256
  model_dim: 128
  hidden_dim: 256
  experts_per_gpu: 1
  top_k: 2
workload:
  routing: {distribution: zipf, skew: 1.0, seed: 3}
parallelism: {ep: 8}
strategies:
  - {name: ta_moe, routing: ta_moe}
)",
                               "chakra-skewed.yaml");
}

// What ASTRA-sim needs to replay a trace without deadlock, checked on the files as written: every
// send has one receive of the same (src, dst, tag) and size on the peer, every dependency names an
// earlier node, and the plan's bytes of each all_to_allv pair are what the nodes carry.
TEST(Chakra, ASkewedAllToAllvIsExactPerPeerSendsAndReceivesThatPairUp) {
  const Scenario sc = skewed();
  const strategies::StackRun run = first_stack(sc);
  const Plan& plan = run.last_plan.plan;
  const RunResult& result = run.last_result;
  // The plan's bytes per (src rank, dst rank, op id) of its all_to_allvs, and whether rows differ.
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::uint64_t> plan_pairs;
  bool rows_differ = false;
  for (const Op& op : plan.ops()) {
    if (op.kind != OpKind::kCollective || op.collective().type != CollectiveType::kAllToAllv)
      continue;
    const CollectiveSpec& c = op.collective();
    const Grouping& g = plan.grouping(c.grouping);
    for (std::size_t gi = 0; gi < g.groups.size(); ++gi) {
      const ByteMatrix& m = c.per_group.empty() ? *c.matrix : *c.per_group[gi];
      const auto& grp = g.groups[gi];
      for (int a = 0; a < m.size; ++a) {
        if (m.row_sum(a).value() != m.row_sum(0).value()) rows_differ = true;
        for (int b = 0; b < m.size; ++b)
          if (a != b && m.at(a, b).value() > 0)
            plan_pairs[{grp[static_cast<std::size_t>(a)], grp[static_cast<std::size_t>(b)],
                        op.id}] = static_cast<std::uint64_t>(std::llround(m.at(a, b).value()));
      }
    }
  }
  ASSERT_FALSE(plan_pairs.empty());
  ASSERT_TRUE(rows_differ) << "the test needs a plan whose all_to_allv rows differ";

  const fs::path d = temp_dir();
  write_chakra((d / "p2p").string(), sc.name, {{"baseline", &plan, &result}});
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, std::uint64_t> sends, recvs;
  std::size_t gemms = 0;
  for (int rank = 0; rank < 8; ++rank) {
    const Trace t = read_trace(d / "p2p" / "baseline" / fmt::format("et.{}.et", rank));
    for (const auto& n : t.nodes) {
      for (auto dep : n.data_deps()) EXPECT_LT(dep, n.id());
      for (auto dep : n.ctrl_deps()) EXPECT_LT(dep, n.id());
      if (n.type() == ChakraProtoMsg::COMM_COLL_NODE) {
        // Only the padded collectives (gradient all-reduces) stay collective nodes.
        EXPECT_NE(attr(n, "comm_type")->int64_val(), ChakraProtoMsg::ALL_TO_ALL) << n.name();
      } else if (n.type() == ChakraProtoMsg::COMM_SEND_NODE ||
                 n.type() == ChakraProtoMsg::COMM_RECV_NODE) {
        const bool send = n.type() == ChakraProtoMsg::COMM_SEND_NODE;
        const auto key =
            std::make_tuple(attr(n, "comm_src")->int32_val(), attr(n, "comm_dst")->int32_val(),
                            attr(n, "comm_tag")->int32_val());
        EXPECT_EQ(send ? std::get<0>(key) : std::get<1>(key), rank);
        auto& side = send ? sends : recvs;
        EXPECT_TRUE(
            side.emplace(key, static_cast<std::uint64_t>(attr(n, "comm_size")->int64_val())).second)
            << "two nodes for one pair of one op: " << n.name();
      } else if (n.type() == ChakraProtoMsg::COMP_NODE &&
                 n.name().find("fc1") != std::string::npos) {
        ++gemms;
        // A GEMM's tensor_size is its operands and result at 2 bytes (fp16), never 0.
        EXPECT_GT(attr(n, "tensor_size")->uint64_val(), 0u) << n.name();
      }
    }
  }
  EXPECT_GT(gemms, 0u);
  EXPECT_EQ(sends, recvs);
  EXPECT_EQ(sends, plan_pairs);

  // The approximation on request: one all_to_all node per rank, the group's mean row, marked.
  ChakraOptions approx;
  approx.a2av_as_collective = true;
  write_chakra((d / "coll").string(), sc.name, {{"baseline", &plan, &result}}, approx);
  const Trace t0 = read_trace(d / "coll" / "baseline" / "et.0.et");
  std::size_t marked = 0;
  for (const auto& n : t0.nodes) {
    EXPECT_NE(n.type(), ChakraProtoMsg::COMM_SEND_NODE);
    if (attr(n, "moesim_approximation") != nullptr) ++marked;
  }
  EXPECT_GT(marked, 0u);
  fs::remove_all(d);
}

// A GEMM's tensor_size: M x K + K x N + M x N elements at the run's element size, for one
// expert's fc1 of the pipelined scenario (no skew: the rank's scale is 1).
TEST(Chakra, GemmNodesCarryTheirOperandBytes) {
  const Scenario sc = pipelined();
  const strategies::StackRun run = first_stack(sc);
  const Plan& plan = run.last_plan.plan;
  const fs::path d = temp_dir();
  ChakraOptions opt;
  opt.bytes_per_element = 2;
  write_chakra((d / "et").string(), sc.name, {{"baseline", &plan, &run.last_result}}, opt);
  const Trace t = read_trace(d / "et" / "baseline" / "et.0.et");
  std::size_t k = 0, checked = 0;
  for (const Op& op : plan.ops()) {
    if (op.ranks.index_of(0) < 0) continue;
    const auto& n = t.nodes[k++];
    if (op.kind != OpKind::kCompute || !op.compute().gemm || op.compute().bytes.value() > 0)
      continue;
    const GemmShape& g = *op.compute().gemm;
    const double elems = static_cast<double>(g.batch) * (g.m * g.k + g.k * g.n + g.m * g.n);
    EXPECT_EQ(attr(n, "tensor_size")->uint64_val(),
              static_cast<std::uint64_t>(std::llround(2 * elems)))
        << op.label;
    ++checked;
  }
  EXPECT_GT(checked, 0u);
  fs::remove_all(d);
}

#endif

}  // namespace
}  // namespace moesim::app
