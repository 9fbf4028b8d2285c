#include "core/scenario_loader.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace moesim {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

const std::string kData = std::string(MOESIM_SOURCE_DIR) + "/tests/data/scenarios";

// A small valid scenario; line numbers below are referred to by the tests.
const char* const kTiny =
    "name: tiny\n"                                             // 1
    "cluster:\n"                                               // 2
    "  gpu: a100-sxm-80gb\n"                                   // 3
    "  nodes: 2\n"                                             // 4
    "  gpus_per_node: 2\n"                                     // 5
    "  intra_node: {kind: nvswitch, bandwidth: 300GB/s}\n"     // 6
    "  inter_node: {kind: switch, nic_bandwidth: 200Gb/s}\n"   // 7
    "model:\n"                                                 // 8
    "  batch_per_gpu: 2\n"                                     // 9
    "  seq_len: 8\n"                                           // 10
    "  model_dim: 16\n"                                        // 11
    "  hidden_dim: 32\n"                                       // 12
    "  experts_per_gpu: 1\n"                                   // 13
    "strategies:\n"                                            // 14
    "  - {name: baseline}\n"                                   // 15
    "  - {name: tutel, a2a: auto, pipeline: tutel_online}\n";  // 16

Scenario parse(const std::string& yaml) { return parse_scenario_string(yaml, "test.yaml"); }

// Replaces the first occurrence of `from` in `s` by `to` (the test's edit must apply).
std::string edit(std::string s, const std::string& from, const std::string& to) {
  auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << "fixture edit not found: " << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}
std::string tiny_with(const std::string& from, const std::string& to) {
  return edit(kTiny, from, to);
}

// The InputError message for `yaml`; fails the test if it parses. Every message is one line.
std::string error_of(const std::string& yaml) {
  try {
    parse(yaml);
  } catch (const InputError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "multi-line message: " << what;
    return what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an InputError for:\n" << yaml;
  return "";
}

// ---------------------------------------------------------------------------------------------
// Valid input

// Input a run would fail on, or silently misread, is refused where it is: a second YAML document
// (it would be ignored) at its line; bytes that are not UTF-8 (the JSON writer fails on them at
// the end of a run) at their line and column, with the byte. Valid UTF-8 passes.
TEST(ScenarioLoader, OneUtf8DocumentOnly) {
  EXPECT_EQ(error_of(std::string(kTiny) + "---\nname: second\n"),
            "test.yaml:18:1: found 2 YAML documents (separated by ---), expected one: the later "
            "ones would be ignored");
  EXPECT_EQ(error_of(tiny_with("name: tiny", "name: \"caf\xe9\"")),
            "test.yaml:1:11: found the byte 0xE9, which is not UTF-8; expected UTF-8 text "
            "(re-save the file as UTF-8)");
  // Overlong encoding of '/' and a lone surrogate are not UTF-8 either.
  EXPECT_NE(error_of(tiny_with("name: tiny", "name: \"a\xc0\xaf\"")).find("byte 0xC0"),
            std::string::npos);
  EXPECT_NE(error_of(tiny_with("name: tiny", "name: \"a\xed\xa0\x80\"")).find("byte 0xED"),
            std::string::npos);
  EXPECT_EQ(parse(tiny_with("name: tiny", "name: \"caf\xc3\xa9 \xe2\x9c\x93\"")).name,
            "caf\xc3\xa9 \xe2\x9c\x93");
  EXPECT_EQ(parse("---\n" + std::string(kTiny)).name, parse(kTiny).name);  // one document, marked
}

TEST(ScenarioLoader, TinyScenarioGetsDocumentedDefaults) {
  Scenario s = parse(kTiny);
  EXPECT_EQ(s.name, "tiny");
  EXPECT_EQ(s.description, "");
  EXPECT_EQ(s.source_file, "test.yaml");
  // cluster
  EXPECT_EQ(s.cluster.gpu.name, "a100-sxm-80gb");
  EXPECT_TRUE(s.cluster.gpu.from_catalog);
  EXPECT_EQ(s.cluster.nodes, 2);
  EXPECT_EQ(s.cluster.gpus_per_node, 2);
  EXPECT_EQ(s.num_gpus(), 4);
  EXPECT_EQ(s.cluster.intra.kind, IntraKind::kNvswitch);
  EXPECT_DOUBLE_EQ(s.cluster.intra.bandwidth.value(), 300e9);
  EXPECT_DOUBLE_EQ(s.cluster.intra.latency.value(), 1e-6);
  EXPECT_EQ(s.cluster.inter.kind, InterKind::kSwitch);
  EXPECT_DOUBLE_EQ(s.cluster.inter.nic_bandwidth.value(), 25e9);
  EXPECT_EQ(s.cluster.inter.nics_per_node, 1);
  EXPECT_DOUBLE_EQ(s.cluster.inter.latency.value(), 2e-6);
  EXPECT_FALSE(s.cluster.custom.has_value());
  EXPECT_EQ(s.cluster.calibration_path, "");
  EXPECT_EQ(s.cluster.name, "tiny");
  // model
  EXPECT_EQ(s.model.mode, Mode::kTraining);
  EXPECT_EQ(s.model.layers, 1);
  EXPECT_EQ(s.model.moe_every, 1);
  EXPECT_EQ(s.model.num_moe_layers(), 1);
  EXPECT_EQ(s.model.top_k, 2);
  EXPECT_DOUBLE_EQ(s.model.capacity_factor, 1.0);
  EXPECT_EQ(s.model.dtype, Dtype::kFp16);
  EXPECT_EQ(s.bytes_per_element(), 2);
  EXPECT_EQ(s.tokens_per_gpu(), 16);
  // parallelism omitted: ep = P, dp = 1
  EXPECT_EQ(s.parallelism.ep, 4);
  EXPECT_EQ(s.parallelism.esp, 1);
  EXPECT_EQ(s.parallelism.mp, 1);
  EXPECT_EQ(s.parallelism.dp, 1);
  EXPECT_TRUE(s.parallelism.ep_auto);
  EXPECT_TRUE(s.parallelism.dp_auto);
  EXPECT_EQ(s.num_experts(), 4);
  EXPECT_EQ(s.model.experts_per_gpu, 1);
  EXPECT_EQ(s.model.expert_shards(), 1);
  // workload and engine defaults
  EXPECT_EQ(s.workload.routing.distribution, RoutingDistribution::kUniform);
  EXPECT_DOUBLE_EQ(s.workload.routing.skew, 0.0);
  EXPECT_EQ(s.workload.routing.seed, 1u);
  EXPECT_EQ(s.workload.capacity.kind, CapacityKind::kFixed);
  EXPECT_EQ(s.workload.iterations, 10);
  EXPECT_EQ(s.engine.network, NetworkModelKind::kFlow);
  EXPECT_DOUBLE_EQ(s.engine.message_latency.value(), 0.0);
  EXPECT_DOUBLE_EQ(s.engine.message_overhead.value(), 1e-6);
  // Unset: the NIC model's queue-pair cache (topology::nic_peer_state).
  EXPECT_FALSE(s.engine.peer_cache.has_value());
  EXPECT_FALSE(s.engine.peer_miss_overhead.has_value());
  EXPECT_DOUBLE_EQ(s.engine.launch_overhead.value(), 5e-6);
  EXPECT_FALSE(s.engine.interference.has_value());  // the GPU's default
  // strategies
  ASSERT_EQ(s.strategies.size(), 2u);
  EXPECT_TRUE(s.strategies[0].is_baseline());
  EXPECT_EQ(describe_roles(s.strategies[0]), "baseline");
  const StrategySpec* t = s.find_strategy("tutel");
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(t->is_baseline());
  EXPECT_EQ(t->a2a, A2aRole::kAuto);
  EXPECT_EQ(t->pipeline, PipelineRole::kTutelOnline);
  EXPECT_DOUBLE_EQ(t->tutel_online.bucket_width, 0.5);
  EXPECT_EQ(t->parallel, ParallelRole::kP1);
  EXPECT_EQ(describe_roles(*t), "pipeline=tutel_online a2a=auto");
  EXPECT_EQ(s.find_strategy("nope"), nullptr);
}

TEST(ScenarioLoader, RecordsKeyLocations) {
  Scenario s = parse(kTiny);
  SourceLocation gpu = s.location_of("cluster.gpu");
  EXPECT_EQ(gpu.file, "test.yaml");
  EXPECT_EQ(gpu.line, 3);
  EXPECT_EQ(gpu.column, 3);
  EXPECT_EQ(s.cluster.gpu.where.line, 3);
  EXPECT_EQ(s.cluster.where.line, 2);
  EXPECT_EQ(s.location_of("cluster.intra_node.bandwidth").line, 6);
  EXPECT_EQ(s.location_of("strategies[1]").line, 16);
  EXPECT_EQ(s.location_of("strategies[1].pipeline").line, 16);
  EXPECT_EQ(s.strategies[1].where.line, 16);
  // The cluster spec carries its own keys (topology errors), and only those.
  EXPECT_EQ(s.cluster.location_of("cluster.inter_node.nic_bandwidth").line, 7);
  EXPECT_EQ(s.cluster.locations.count("model.seq_len"), 0u);
  EXPECT_EQ(s.location_of("model.seq_len").line, 10);
  // Absent keys: the file without a line.
  EXPECT_EQ(s.location_of("engine.network").line, 0);
  EXPECT_EQ(s.location_of("engine.network").file, "test.yaml");
}

TEST(ScenarioLoader, ReadsEveryModelWorkloadEngineAndRoleValue) {
  Scenario s = parse(R"(
name: full
description: every section
cluster:
  gpu: h100-sxm
  nodes: 4
  gpus_per_node: 8
  intra_node: {kind: nvswitch, bandwidth: 450GB/s, latency: 500ns}
  inter_node:
    kind: fat_tree
    nic_bandwidth: 400Gb/s
    nics_per_node: 4
    latency: 3us
    oversubscription: 2
    switch_radix: 32
    levels: 2
model:
  mode: training
  layers: 12
  moe_every: 2
  batch_per_gpu: 4
  seq_len: 1024
  model_dim: 2048
  hidden_dim: 8192
  experts: 64
  top_k: 1
  capacity_factor: -2.5
  dtype: bf16
parallelism: {ep: 16, esp: 1, mp: 2, dp: auto}
workload:
  routing: {distribution: dirichlet, alpha: 0.5, skew: 1.5, seed: 42}
  capacity: {kind: random_walk, min: 1, max: 4, step: 0.25}
  iterations: 7
engine: {network: simgrid, message_latency: 1us, message_overhead: 2us, launch_overhead: 10us,
         interference: 0.3, peer_cache: 12, peer_miss_overhead: 3us}
strategies:
  - {name: topo, routing: ta_moe, ta_moe: {lambda: 0.2, adherence: 0.5}}
  - {name: hir, routing: faster_moe_hir, faster_moe_hir: {max_offnode_share: 0.25}}
  - {name: p2, parallel: p2, pipeline: 4, a2a: 2dh, layout: flexible}
  - {name: router, parallel: tutel_router, pipeline: pipemoe}
  - {name: lina, schedule: lina, lina: {micro_op: 16MiB, pack_experts: false, max_pack: 4}}
  - {name: s1, schedule: parm_s1}
  - {name: between, schedule: between_a2a}
)");
  EXPECT_EQ(s.description, "every section");
  EXPECT_DOUBLE_EQ(s.cluster.intra.latency.value(), 500e-9);
  EXPECT_EQ(s.cluster.inter.kind, InterKind::kFatTree);
  EXPECT_DOUBLE_EQ(s.cluster.inter.nic_bandwidth.value(), 50e9);
  EXPECT_EQ(s.cluster.inter.nics_per_node, 4);
  EXPECT_DOUBLE_EQ(s.cluster.inter.latency.value(), 3e-6);
  EXPECT_DOUBLE_EQ(s.cluster.inter.oversubscription, 2.0);
  EXPECT_EQ(s.cluster.inter.switch_radix, 32);
  EXPECT_EQ(s.cluster.inter.levels, 2);
  EXPECT_EQ(s.model.layers, 12);
  EXPECT_EQ(s.model.num_moe_layers(), 6);
  EXPECT_EQ(s.tokens_per_gpu(), 4096);
  EXPECT_EQ(s.model.model_dim, 2048);
  EXPECT_EQ(s.model.hidden_dim, 8192);
  // experts: 64 over ep 16 -> 4 per GPU
  EXPECT_EQ(s.num_experts(), 64);
  EXPECT_EQ(s.model.experts_per_gpu, 4);
  EXPECT_EQ(s.model.local_experts(), 4);
  EXPECT_EQ(s.model.top_k, 1);
  EXPECT_DOUBLE_EQ(s.model.capacity_factor, -2.5);
  EXPECT_TRUE(s.model.capacity_is_dropless());
  EXPECT_EQ(s.model.dtype, Dtype::kBf16);
  // 32 GPUs = ep 16 x mp 2 x dp 1
  EXPECT_EQ(s.parallelism.dp, 1);
  EXPECT_EQ(s.parallelism.mp, 2);
  EXPECT_FALSE(s.parallelism.ep_auto);
  EXPECT_TRUE(s.parallelism.dp_auto);
  EXPECT_EQ(s.workload.routing.distribution, RoutingDistribution::kDirichlet);
  EXPECT_DOUBLE_EQ(s.workload.routing.dirichlet_alpha, 0.5);
  EXPECT_DOUBLE_EQ(s.workload.routing.skew, 1.5);
  EXPECT_EQ(s.workload.routing.seed, 42u);
  EXPECT_EQ(s.workload.capacity.kind, CapacityKind::kRandomWalk);
  EXPECT_DOUBLE_EQ(s.workload.capacity.min, 1.0);
  EXPECT_DOUBLE_EQ(s.workload.capacity.max, 4.0);
  EXPECT_DOUBLE_EQ(s.workload.capacity.step, 0.25);
  EXPECT_EQ(s.workload.iterations, 7);
  EXPECT_EQ(s.engine.network, NetworkModelKind::kSimgrid);
  EXPECT_DOUBLE_EQ(s.engine.message_latency.value(), 1e-6);
  EXPECT_DOUBLE_EQ(s.engine.message_overhead.value(), 2e-6);
  EXPECT_EQ(s.engine.peer_cache, 12);
  EXPECT_DOUBLE_EQ(s.engine.peer_miss_overhead.value().value(), 3e-6);
  EXPECT_DOUBLE_EQ(s.engine.launch_overhead.value(), 10e-6);
  EXPECT_DOUBLE_EQ(s.engine.interference.value_or(-1), 0.3);

  ASSERT_EQ(s.strategies.size(), 7u);
  const auto& topo = s.strategies[0];
  EXPECT_EQ(topo.routing, RoutingRole::kTaMoe);
  EXPECT_DOUBLE_EQ(topo.ta_moe.lambda, 0.2);
  EXPECT_DOUBLE_EQ(topo.ta_moe.adherence, 0.5);
  EXPECT_EQ(s.strategies[1].routing, RoutingRole::kFasterMoeHir);
  EXPECT_DOUBLE_EQ(s.strategies[1].faster_moe_hir.max_offnode_share, 0.25);
  const auto& p2 = s.strategies[2];
  EXPECT_EQ(p2.parallel, ParallelRole::kP2);
  EXPECT_EQ(p2.parallel_degree, 1);  // experts are not sharded here: n = 1
  EXPECT_EQ(p2.pipeline, PipelineRole::kDegree);
  EXPECT_EQ(p2.pipeline_degree, 4);
  EXPECT_EQ(p2.a2a, A2aRole::k2dh);
  EXPECT_EQ(p2.layout, LayoutRole::kFlexible);
  EXPECT_EQ(describe_roles(p2), "parallel=p2 pipeline=4 a2a=2dh layout=flexible");
  EXPECT_EQ(s.strategies[3].parallel, ParallelRole::kTutelRouter);
  EXPECT_EQ(s.strategies[3].pipeline, PipelineRole::kPipeMoe);
  EXPECT_EQ(s.strategies[4].schedule, ScheduleRole::kLina);
  EXPECT_DOUBLE_EQ(s.strategies[4].lina.micro_op.value(), 16.0 * 1024 * 1024);
  EXPECT_FALSE(s.strategies[4].lina.pack_experts);
  EXPECT_EQ(s.strategies[4].lina.max_pack, 4);
  EXPECT_EQ(s.strategies[6].lina.max_pack, 2);  // default: Lina packs at most 2 experts per GPU
  EXPECT_EQ(s.strategies[5].schedule, ScheduleRole::kParmS1);
  EXPECT_EQ(s.strategies[6].schedule, ScheduleRole::kBetweenA2a);
}

TEST(ScenarioLoader, ShardedExpertsAndParallelDegrees) {
  // 8 GPUs, experts_per_gpu -4: 2 experts, each over 4 GPUs; p2 repeats tokens n = 4 times.
  std::string y = tiny_with("gpus_per_node: 2", "gpus_per_node: 4");
  y = edit(y, "experts_per_gpu: 1", "experts_per_gpu: -4\n  top_k: 1");
  y = edit(y, "{name: tutel, a2a: auto, pipeline: tutel_online}",
           "{name: p2, parallel: p2}\n  - {name: r2, parallel: 2}");
  Scenario s = parse(y);
  EXPECT_EQ(s.num_gpus(), 8);
  EXPECT_EQ(s.num_experts(), 2);
  EXPECT_EQ(s.model.experts_per_gpu, -4);
  EXPECT_EQ(s.model.expert_shards(), 4);
  EXPECT_EQ(s.model.local_experts(), 1);
  EXPECT_EQ(s.find_strategy("p2")->parallel_degree, 4);
  EXPECT_EQ(s.find_strategy("r2")->parallel, ParallelRole::kDegree);
  EXPECT_EQ(s.find_strategy("r2")->parallel_degree, 2);
}

TEST(ScenarioLoader, GlobalExpertCountBelowEpIsSharded) {
  Scenario s = parse(tiny_with("experts_per_gpu: 1", "experts: 2"));
  EXPECT_EQ(s.num_experts(), 2);
  EXPECT_EQ(s.model.experts_per_gpu, -2);  // 4 GPUs, 2 experts
}

TEST(ScenarioLoader, ParallelismResolution) {
  auto with_par = [](const std::string& par) {
    return parse(tiny_with("strategies:", "parallelism: " + par + "\nstrategies:"));
  };
  Scenario a = with_par("{ep: 2}");  // dp auto = 4 / 2
  EXPECT_EQ(a.parallelism.ep, 2);
  EXPECT_EQ(a.parallelism.dp, 2);
  EXPECT_EQ(a.num_experts(), 2);
  Scenario b = with_par("{dp: 2}");  // ep auto = 4 / 2
  EXPECT_EQ(b.parallelism.ep, 2);
  EXPECT_TRUE(b.parallelism.ep_auto);
  Scenario c = with_par("{ep: 2, esp: 2, dp: auto}");
  EXPECT_EQ(c.parallelism.dp, 1);
  Scenario d = with_par("{ep: auto, mp: 2, dp: 1}");
  EXPECT_EQ(d.parallelism.ep, 2);
  EXPECT_EQ(d.parallelism.layout, MpLayout::kDisjoint);
  // Overlapped: the MP ranks are the EP x ESP GPUs, so mp is not a factor of P.
  Scenario o = with_par("{ep: auto, esp: 2, mp: 2, layout: overlapped}");
  EXPECT_EQ(o.parallelism.layout, MpLayout::kOverlapped);
  EXPECT_EQ(o.parallelism.ep, 2);
  EXPECT_EQ(o.parallelism.dp, 1);
  EXPECT_EQ(o.parallelism.product(), 4);
  EXPECT_EQ(o.num_experts(), 2);
  Scenario o4 = with_par("{ep: 4, mp: 4, dp: auto, layout: overlapped}");
  EXPECT_EQ(o4.parallelism.dp, 1);
  EXPECT_EQ(o4.parallelism.ranks_per_dp(), 4);
}

TEST(ScenarioErrors, OverlappedLayout) {
  auto err = [](const std::string& par) {
    return error_of(tiny_with("strategies:", "parallelism: " + par + "\nstrategies:"));
  };
  EXPECT_THAT(err("{ep: 4, esp: 2, layout: overlapped}"),
              HasSubstr("parallelism.ep: ep*esp = 8 does not divide P = 4 (cluster.nodes 2 x "
                        "cluster.gpus_per_node 2); expected ep*esp*dp = P (layout overlapped)"));
  EXPECT_THAT(err("{ep: 2, esp: 1, mp: 4, dp: 2, layout: overlapped}"),
              HasSubstr("parallelism.mp: found mp = 4, expected a divisor of ep*esp = 2*1 = 2"));
  EXPECT_THAT(err("{ep: 2, esp: 1, dp: 1, layout: overlapped}"),
              HasSubstr("parallelism.dp: ep*esp*dp = 2*1*1 = 2, expected P = 4"));
  EXPECT_THAT(
      err("{ep: 2, layout: shared}"),
      HasSubstr(
          "parallelism.layout: found 'shared', expected one of disjoint, overlapped or folded"));
}

TEST(ScenarioLoader, InlineGpuMap) {
  Scenario s = parse(tiny_with(
      "gpu: a100-sxm-80gb",
      "gpu: {name: mygpu, peak_tflops: {fp16: 100TFLOPS, fp32: 20TFLOPS}, hbm_bandwidth: 1TB/s, "
      "memory: 16GiB, nvlink_bandwidth: 50GB/s, pcie_bandwidth: 16GB/s, sms: 84, "
      "l2_cache: 6MiB}"));
  const GpuSpec& g = s.cluster.gpu;
  EXPECT_EQ(g.sms, 84);
  EXPECT_DOUBLE_EQ(g.l2_cache.value(), 6.0 * 1024 * 1024);
  EXPECT_FALSE(g.from_catalog);
  EXPECT_EQ(g.name, "mygpu");
  ASSERT_EQ(g.peak.size(), 2u);
  EXPECT_DOUBLE_EQ(g.peak.at(Dtype::kFp16).value(), 100e12);
  EXPECT_DOUBLE_EQ(g.peak.at(Dtype::kFp32).value(), 20e12);
  EXPECT_DOUBLE_EQ(g.hbm_bandwidth.value(), 1e12);
  EXPECT_DOUBLE_EQ(g.memory.value(), 16.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(g.nvlink_bandwidth.value(), 50e9);
  EXPECT_DOUBLE_EQ(g.pcie_bandwidth.value(), 16e9);
  EXPECT_EQ(g.where.line, 3);
  // A single rate is the fp16 peak.
  Scenario t = parse(tiny_with(
      "gpu: a100-sxm-80gb", "gpu: {peak_tflops: 50TFLOPS, hbm_bandwidth: 900GB/s, memory: 32GB}"));
  ASSERT_EQ(t.cluster.gpu.peak.size(), 1u);
  EXPECT_DOUBLE_EQ(t.cluster.gpu.peak.at(Dtype::kFp16).value(), 50e12);
  EXPECT_EQ(t.cluster.gpu.sms, 0);               // unknown: no default interference
  EXPECT_EQ(t.cluster.gpu.l2_cache.value(), 0);  // unknown: no weight reuse
  EXPECT_THAT(error_of(tiny_with("gpu: a100-sxm-80gb",
                                 "gpu: {peak_tflops: 50TFLOPS, hbm_bandwidth: 900GB/s, "
                                 "memory: 32GB, l2_cache: -1MiB}")),
              HasSubstr("cluster.gpu.l2_cache"));
  EXPECT_THAT(error_of(tiny_with("gpu: a100-sxm-80gb",
                                 "gpu: {peak_tflops: 50TFLOPS, hbm_bandwidth: 900GB/s, "
                                 "memory: 32GB, sms: 0}")),
              HasSubstr("cluster.gpu.sms"));
}

TEST(ScenarioLoader, AchievableFractionsOfLinks) {
  Scenario s = parse(tiny_with("{kind: nvswitch, bandwidth: 300GB/s}",
                               "{kind: nvswitch, bandwidth: 300GB/s, efficiency: 0.75}"));
  EXPECT_DOUBLE_EQ(s.cluster.intra.efficiency, 0.75);
  EXPECT_DOUBLE_EQ(s.cluster.inter.nic_efficiency, 0);  // unset: the catalog's
  s = parse(tiny_with("nic_bandwidth: 200Gb/s}", "nic_bandwidth: 200Gb/s, nic_efficiency: 1}"));
  EXPECT_DOUBLE_EQ(s.cluster.inter.nic_efficiency, 1.0);
  // Outside (0, 1]: exit 2 with the key and what fits.
  EXPECT_THAT(error_of(tiny_with("{kind: nvswitch, bandwidth: 300GB/s}",
                                 "{kind: nvswitch, bandwidth: 300GB/s, efficiency: 1.2}")),
              HasSubstr("cluster.intra_node.efficiency: found 1.2, expected the achievable "
                        "fraction of the spec-sheet bandwidth, a number in (0, 1]"));
  EXPECT_THAT(
      error_of(tiny_with("nic_bandwidth: 200Gb/s}", "nic_bandwidth: 200Gb/s, nic_efficiency: 0}")),
      HasSubstr("cluster.inter_node.nic_efficiency: found 0, expected"));
}

TEST(ScenarioLoader, PcieIntraNode) {
  Scenario s = parse(edit(tiny_with("gpus_per_node: 2", "gpus_per_node: 8"),
                          "{kind: nvswitch, bandwidth: 300GB/s}",
                          "{kind: pcie, bandwidth: 32GB/s, sockets: 2, "
                          "socket_link_bandwidth: 40GB/s}"));
  EXPECT_EQ(s.cluster.intra.kind, IntraKind::kPcie);
  EXPECT_EQ(s.cluster.intra.gpus_per_pcie_switch, 2);  // default
  EXPECT_EQ(s.cluster.intra.sockets, 2);
  EXPECT_DOUBLE_EQ(s.cluster.intra.socket_link_bandwidth.value(), 40e9);
}

TEST(ScenarioLoader, TreeNestedListNotation) {
  Scenario s =
      parse(edit(tiny_with("nodes: 2", "nodes: 6"), "{kind: switch, nic_bandwidth: 200Gb/s}",
                 "{kind: tree, nic_bandwidth: 100Gb/s, tree: [[2, 2], [2]], "
                 "tree_level_bandwidth: [100Gb/s, 50Gb/s]}"));
  const TreeSpec& root = s.cluster.inter.tree;
  ASSERT_FALSE(root.is_leaf);
  ASSERT_EQ(root.children.size(), 2u);
  ASSERT_EQ(root.children[0].children.size(), 2u);
  EXPECT_TRUE(root.children[0].children[0].is_leaf);
  EXPECT_EQ(root.children[0].children[0].leaf_nodes, 2);
  EXPECT_EQ(root.children[0].children[1].leaf_nodes, 2);
  ASSERT_EQ(root.children[1].children.size(), 1u);
  EXPECT_EQ(root.children[1].children[0].leaf_nodes, 2);
  ASSERT_EQ(s.cluster.inter.tree_level_bandwidth.size(), 2u);
  EXPECT_DOUBLE_EQ(s.cluster.inter.tree_level_bandwidth[1].value(), 50e9 / 8);
}

TEST(ScenarioLoader, CustomGraph) {
  std::string yaml = tiny_with(
      "  intra_node: {kind: nvswitch, bandwidth: 300GB/s}\n"
      "  inter_node: {kind: switch, nic_bandwidth: 200Gb/s}\n",
      "  inter_node: {kind: custom}\n"
      "  custom:\n"
      "    vertices:\n"
      "      - {name: sw, kind: switch}\n"
      "      - {name: nic0, kind: nic, node: 0}\n"
      "    links:\n"
      "      - {a: gpu0, b: gpu1, bandwidth: 100GB/s}\n"
      "      - {a: gpu0, b: nic0, bandwidth: 32GB/s, latency: 1us}\n"
      "      - {a: nic0, b: sw, bandwidth: 100Gb/s}\n"
      "      - {a: gpu2, b: sw, bandwidth: 100Gb/s}\n"
      "      - {a: gpu3, b: sw, bandwidth: 100Gb/s}\n");
  Scenario s = parse(yaml);
  ASSERT_TRUE(s.cluster.custom.has_value());
  const auto& c = *s.cluster.custom;
  // The 4 implicit GPUs come first (rank order, node-major), then the listed vertices.
  ASSERT_EQ(c.vertices.size(), 6u);
  for (int g = 0; g < 4; ++g) {
    EXPECT_EQ(c.vertices[g].name, "gpu" + std::to_string(g));
    EXPECT_EQ(c.vertices[g].kind, "gpu");
    EXPECT_EQ(c.vertices[g].node, g / 2);
  }
  EXPECT_EQ(c.vertices[5].name, "nic0");
  EXPECT_EQ(c.vertices[5].kind, "nic");
  EXPECT_EQ(c.vertices[5].node, 0);
  EXPECT_EQ(c.vertices[4].node, -1);
  ASSERT_EQ(c.links.size(), 5u);
  EXPECT_EQ(c.links[1].a, "gpu0");
  EXPECT_EQ(c.links[1].b, "nic0");
  EXPECT_DOUBLE_EQ(c.links[1].bandwidth.value(), 32e9);
  EXPECT_DOUBLE_EQ(c.links[1].latency.value(), 1e-6);
  EXPECT_DOUBLE_EQ(c.links[0].latency.value(), 0.0);
  EXPECT_EQ(c.links[1].where.line, 13);

  // Unknown endpoint, with a hint.
  std::string e = error_of(edit(yaml, "{a: nic0, b: sw,", "{a: nic0, b: sww,"));
  EXPECT_THAT(e, StartsWith("test.yaml:14:22: "));
  EXPECT_THAT(e, HasSubstr("cluster.custom.links[2].b: found 'sww'"));
  EXPECT_THAT(e, HasSubstr("did you mean 'sw'?"));
  // A GPU that no link reaches.
  EXPECT_THAT(error_of(edit(yaml, "      - {a: gpu3, b: sw, bandwidth: 100Gb/s}\n", "")),
              HasSubstr("cluster.custom.links: gpu3 is not connected to gpu0"));
  EXPECT_THAT(error_of(edit(yaml, "{name: sw, kind: switch}", "{name: gpu1, kind: switch}")),
              HasSubstr("cluster.custom.vertices[0].name: found 'gpu1', which names a GPU, with "
                        "kind switch"));
  EXPECT_THAT(error_of(edit(yaml, "{name: sw, kind: switch}", "{name: sw, kind: router}")),
              HasSubstr("cluster.custom.vertices[0].kind: found 'router', expected one of gpu, "
                        "nic, nvswitch, pcie_switch, host_bridge or switch"));
  EXPECT_THAT(error_of(edit(yaml, "{name: sw, kind: switch}", "{name: gpu9, kind: gpu}")),
              HasSubstr("cluster.custom.vertices[0].name: found 'gpu9' for a vertex of kind gpu, "
                        "expected gpu0..gpu3"));
  EXPECT_THAT(error_of(edit(yaml, "{name: sw, kind: switch}", "{name: gpu2, kind: gpu, node: 0}")),
              HasSubstr("cluster.custom.vertices[0].node: found 0 for gpu2, expected 1"));
  // GPUs may also be listed explicitly; they are then not added again.
  std::string listed = edit(yaml, "      - {name: sw, kind: switch}\n",
                            "      - {name: sw, kind: switch}\n      - {name: gpu3, kind: gpu}\n");
  Scenario with_gpu = parse(listed);
  ASSERT_EQ(with_gpu.cluster.custom->vertices.size(), 6u);
  EXPECT_EQ(with_gpu.cluster.custom->vertices[3].name, "sw");
  EXPECT_EQ(with_gpu.cluster.custom->vertices[4].name, "gpu3");
  EXPECT_EQ(with_gpu.cluster.custom->vertices[4].node, 1);
}

TEST(ScenarioLoader, EditedTreeParsesLikeASweepPoint) {
  // Sweeps edit the YAML tree of the base scenario and parse it again.
  YAML::Node root = parse_yaml_string(kTiny, "base.yaml");
  root["model"]["hidden_dim"] = 4096;
  root["cluster"]["nodes"] = 4;
  Scenario s = parse_scenario(root, "base.yaml");
  EXPECT_EQ(s.model.hidden_dim, 4096);
  EXPECT_EQ(s.num_gpus(), 8);
  EXPECT_EQ(s.num_experts(), 8);
  // An invalid edited value: a node built in memory has no line of its own; the error names the
  // file, the key path, and the nearest location known (the enclosing `model:` section).
  root["model"]["top_k"] = "two";
  try {
    parse_scenario(root, "base.yaml");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "model.top_k");
    EXPECT_EQ(e.location().file, "base.yaml");
    EXPECT_EQ(e.location().line, 8);
    EXPECT_THAT(e.what(),
                HasSubstr("model.top_k: found 'two', expected an integer in [1, 1048576]"));
  }
}

TEST(ScenarioLoader, RelativePathsResolveAgainstTheFile) {
  Scenario s = load_scenario(kData + "/with-calibration.yaml");
  EXPECT_EQ(s.cluster.calibration_path, kData + "/calibration.yaml");
  EXPECT_EQ(s.workload.routing.distribution, RoutingDistribution::kTrace);
  EXPECT_EQ(s.workload.routing.trace_path, kData + "/routing_trace.csv");
  // Intra bandwidth omitted: 0, left to the topology builder (the GPU's NVLink figure).
  EXPECT_DOUBLE_EQ(s.cluster.intra.bandwidth.value(), 0.0);
  EXPECT_EQ(s.cluster.inter.kind, InterKind::kNone);
}

TEST(ScenarioLoader, LoadsATopologyFile) {
  ClusterSpec c = load_cluster_file(kData + "/two-node-topology.yaml");
  EXPECT_EQ(c.name, "two-dgx");
  EXPECT_EQ(c.num_gpus(), 16);
  EXPECT_EQ(c.inter.kind, InterKind::kFatTree);
  EXPECT_DOUBLE_EQ(c.inter.oversubscription, 2.0);
  EXPECT_EQ(c.where.line, 3);
  EXPECT_EQ(c.location_of("cluster.inter_node").line, 8);
  // A whole scenario file also works as a topology: its cluster, named after the scenario.
  ClusterSpec from_scenario = load_cluster_file(kData + "/with-calibration.yaml");
  EXPECT_EQ(from_scenario.name, "with-calibration");
  EXPECT_EQ(from_scenario.num_gpus(), 2);
  // Otherwise only name/description/cluster are allowed.
  try {
    load_cluster_file(kData + "/routing_trace.csv");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), StartsWith(kData + "/routing_trace.csv:1:1: "));
  }
}

// ---------------------------------------------------------------------------------------------
// One test per error class: each names file:line and the key path.

TEST(ScenarioErrors, MissingFile) {
  try {
    load_scenario("/no/such/dir/scenario.yaml");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), StartsWith("/no/such/dir/scenario.yaml: "));
    EXPECT_THAT(e.what(), HasSubstr("file not found"));
  }
  EXPECT_THROW(load_cluster_file("/no/such/topology.yaml"), InputError);
}

// /dev/zero never ends: reading it hung `moesim validate` (found by fuzzing's corpus review).
TEST(ScenarioErrors, DevicesAreRefusedNotRead) {
  try {
    load_scenario("/dev/zero");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), StartsWith("/dev/zero: "));
    EXPECT_THAT(e.what(), HasSubstr("found a device, pipe or socket, expected the path of a "
                                    "YAML file (a regular file)"));
  }
  EXPECT_THROW(load_cluster_file("/dev/zero"), InputError);
}

TEST(ScenarioErrors, YamlSyntaxError) {
  std::string e = error_of(tiny_with("  seq_len: 8\n", "  seq_len: [8\n"));
  EXPECT_THAT(e, StartsWith("test.yaml:11:"));  // the parser notices at the next key
  EXPECT_THAT(e, HasSubstr("YAML syntax error"));
}

TEST(ScenarioErrors, UnknownKeyWithHint) {
  std::string e = error_of(tiny_with("  nodes: 2", "  nodse: 2"));
  EXPECT_THAT(e, StartsWith("test.yaml:4:3: cluster.nodse: unknown key 'nodse'"));
  EXPECT_THAT(e, HasSubstr("did you mean 'nodes'?"));
  // Deep keys and top-level keys too.
  EXPECT_THAT(error_of(tiny_with("nic_bandwidth:", "nic_bandwith:")),
              HasSubstr("test.yaml:7:30: cluster.inter_node.nic_bandwith: unknown key"));
  EXPECT_THAT(error_of(std::string(kTiny) + "stratgies: []\n"),
              HasSubstr("test.yaml:17:1: stratgies: unknown key 'stratgies' in the document (did "
                        "you mean 'strategies'?)"));
  // A key far from every known key gets no hint, but the list of known keys.
  std::string far = error_of(tiny_with("  seq_len: 8", "  zzzzzzzzzz: 8"));
  EXPECT_THAT(far, Not(HasSubstr("did you mean")));
  EXPECT_THAT(far, HasSubstr("expected one of mode, layers"));
}

TEST(ScenarioErrors, DuplicateKey) {
  EXPECT_THAT(error_of(tiny_with("  seq_len: 8\n", "  seq_len: 8\n  seq_len: 16\n")),
              StartsWith("test.yaml:11:3: model.seq_len: duplicate key 'seq_len'"));
}

TEST(ScenarioErrors, WrongYamlType) {
  EXPECT_THAT(error_of(tiny_with("{kind: nvswitch, bandwidth: 300GB/s}", "[nvswitch, 300GB/s]")),
              AllOf(StartsWith("test.yaml:6:"), HasSubstr("cluster.intra_node: found a list"),
                    HasSubstr("expected a map")));
  EXPECT_THAT(error_of(tiny_with("gpus_per_node: 2", "gpus_per_node: two")),
              StartsWith("test.yaml:5:18: cluster.gpus_per_node: found 'two', expected an "
                         "integer in [1, 131072]"));
  EXPECT_THAT(error_of(tiny_with("gpus_per_node: 2", "gpus_per_node: 2.5")),
              HasSubstr("cluster.gpus_per_node: found '2.5', expected an integer"));
  EXPECT_THAT(error_of(tiny_with("  - {name: baseline}\n", "  - baseline\n")),
              AllOf(StartsWith("test.yaml:15:"), HasSubstr("strategies[0]: found 'baseline', "
                                                           "expected a map")));
  std::string head = std::string(kTiny).substr(0, std::string(kTiny).find("strategies:"));
  EXPECT_THAT(error_of(head + "strategies: {name: baseline}\n"),
              AllOf(StartsWith("test.yaml:14:"), HasSubstr("strategies: found a map, expected a "
                                                           "list")));
  EXPECT_THAT(error_of(tiny_with("seq_len: 8", "seq_len:")),
              AllOf(StartsWith("test.yaml:10:"), HasSubstr("model.seq_len: found nothing")));
}

TEST(ScenarioErrors, NumberWithoutUnit) {
  EXPECT_THAT(error_of(tiny_with("bandwidth: 300GB/s", "bandwidth: 300")),
              AllOf(StartsWith("test.yaml:6:43: cluster.intra_node.bandwidth: found the bare "
                               "number '300' without a unit"),
                    HasSubstr("expected a bandwidth")));
}

TEST(ScenarioErrors, UnitOfTheWrongKind) {
  std::string e = error_of(tiny_with("{kind: switch, nic_bandwidth: 200Gb/s}",
                                     "{kind: switch, nic_bandwidth: 200Gb/s, latency: 5GB/s}"));
  EXPECT_THAT(e, StartsWith("test.yaml:7:"));
  EXPECT_THAT(e, HasSubstr("cluster.inter_node.latency: found '5GB/s', which is a bandwidth"));
  EXPECT_THAT(e, HasSubstr("expected a duration"));
}

TEST(ScenarioErrors, InconsistentSizes) {
  std::string e = error_of(tiny_with("strategies:", "parallelism: {ep: 8}\nstrategies:"));
  EXPECT_THAT(e, StartsWith("test.yaml:14:"));
  EXPECT_THAT(e, HasSubstr("parallelism.ep: ep*esp*mp = 8 does not divide P = 4 (cluster.nodes 2 "
                           "x cluster.gpus_per_node 2)"));
  std::string all = error_of(tiny_with("strategies:", "parallelism: {ep: 2, dp: 4}\nstrategies:"));
  EXPECT_THAT(all, HasSubstr("parallelism.dp: ep*esp*mp*dp = 2*1*1*4 = 8, expected P = 4"));
}

TEST(ScenarioErrors, UnknownStrategyRoleValue) {
  std::string e = error_of(tiny_with("pipeline: tutel_online", "pipeline: tutel_onlin"));
  EXPECT_THAT(e, StartsWith("test.yaml:16:"));
  EXPECT_THAT(e, HasSubstr("strategies[1].pipeline: found 'tutel_onlin', expected an integer >= "
                           "1 or pipemoe or tutel_online (did you mean 'tutel_online'?)"));
  EXPECT_THAT(error_of(tiny_with("a2a: auto", "a2a: 4dh")),
              HasSubstr("strategies[1].a2a: found '4dh', expected one of linear, 2dh, 3dh, "
                        "deepep or auto"));
  EXPECT_THAT(error_of(tiny_with("pipeline: tutel_online", "pipeline: 0")),
              HasSubstr("strategies[1].pipeline: found '0', expected an integer in [1, 1024]"));
}

// expert_hidden_dim is hidden_dim's other name; dense_hidden_dim defaults to 4 M.
TEST(ScenarioLoader, ExpertAndDenseHiddenDims) {
  const Scenario a = parse(kTiny);
  EXPECT_EQ(a.model.hidden_dim, 32);
  EXPECT_EQ(a.model.dense_hidden_dim, 0);
  EXPECT_EQ(a.model.dense_hidden(), 64);  // 4 x model_dim 16
  const Scenario b =
      parse(tiny_with("  hidden_dim: 32\n", "  expert_hidden_dim: 24\n  dense_hidden_dim: 96\n"));
  EXPECT_EQ(b.model.hidden_dim, 24);
  EXPECT_EQ(b.model.dense_hidden(), 96);
  EXPECT_THAT(
      error_of(tiny_with("  hidden_dim: 32\n", "  hidden_dim: 32\n  expert_hidden_dim: 32\n")),
      HasSubstr("model.expert_hidden_dim: found both 'hidden_dim' and "
                "'expert_hidden_dim'"));
  EXPECT_THAT(
      error_of(tiny_with("  hidden_dim: 32\n", "  hidden_dim: 32\n  dense_hidden_dim: 0\n")),
      HasSubstr("model.dense_hidden_dim: found 0, expected an integer in [1, "));
  EXPECT_THAT(error_of(tiny_with("  hidden_dim: 32\n", "")),
              HasSubstr("also written expert_hidden_dim"));
}

TEST(ScenarioLoader, SharedExperts) {
  EXPECT_EQ(parse(kTiny).model.shared_experts, 0);
  EXPECT_EQ(
      parse(tiny_with("  experts_per_gpu: 1\n", "  experts_per_gpu: 1\n  shared_experts: 2\n"))
          .model.shared_experts,
      2);
  EXPECT_THAT(error_of(tiny_with("  experts_per_gpu: 1\n",
                                 "  experts_per_gpu: 1\n  shared_experts: 40000\n")),
              HasSubstr("model.shared_experts: found 40000, expected an integer in [0, 1024]"));
  EXPECT_THAT(
      error_of(tiny_with("  hidden_dim: 32\n  experts_per_gpu: 1\n",
                         "  hidden_dim: 4096\n  experts_per_gpu: 1\n  shared_experts: 512\n")),
      HasSubstr("model.shared_experts: found 512, expected an integer in [0, 2^20/H = 256]"));
  EXPECT_THAT(
      error_of(tiny_with("  experts_per_gpu: 1\n", "  experts_per_gpu: 1\n  shared_experts: 1\n") +
               "  - {name: parm, schedule: parm_s1}\n"),
      HasSubstr("schedule: found 'parm_s1' with model.shared_experts = 1"));
}

TEST(ScenarioLoader, Vocabulary) {
  EXPECT_EQ(parse(kTiny).model.vocab_size, 0);
  EXPECT_TRUE(parse(kTiny).model.tie_embeddings);
  const Scenario s = parse(tiny_with("  experts_per_gpu: 1\n",
                                     "  experts_per_gpu: 1\n  vocab_size: 129280\n"
                                     "  tie_embeddings: false\n"));
  EXPECT_EQ(s.model.vocab_size, 129280);
  EXPECT_FALSE(s.model.tie_embeddings);
  EXPECT_THAT(
      error_of(tiny_with("  experts_per_gpu: 1\n", "  experts_per_gpu: 1\n  vocab_size: -1\n")),
      HasSubstr("model.vocab_size: found -1, expected an integer in [0, "));
  // MTP modules end in the LM head: refused without a vocabulary, bounded, read with one.
  EXPECT_THAT(
      error_of(tiny_with("  experts_per_gpu: 1\n", "  experts_per_gpu: 1\n  mtp_layers: 1\n")),
      HasSubstr("model.mtp_layers: found 1 with model.vocab_size = 0, expected 0"));
  EXPECT_THAT(error_of(tiny_with("  experts_per_gpu: 1\n",
                                 "  experts_per_gpu: 1\n  vocab_size: 64\n"
                                 "  mtp_layers: 17\n")),
              HasSubstr("model.mtp_layers: found 17, expected an integer in [0, 16]"));
  EXPECT_EQ(parse(tiny_with("  experts_per_gpu: 1\n",
                            "  experts_per_gpu: 1\n  vocab_size: 64\n"
                            "  mtp_layers: 2\n"))
                .model.num_blocks(),
            parse(kTiny).model.layers + 2);
}

TEST(ScenarioErrors, MissingRequiredKey) {
  std::string e = error_of(tiny_with("  gpus_per_node: 2\n", ""));
  EXPECT_THAT(e, StartsWith("test.yaml:2:1: cluster.gpus_per_node: missing required key "
                            "'gpus_per_node' in 'cluster'"));
  EXPECT_THAT(error_of(tiny_with("  hidden_dim: 32\n", "")),
              StartsWith("test.yaml:8:1: model.hidden_dim: missing required key"));
  EXPECT_THAT(error_of(tiny_with("  experts_per_gpu: 1\n", "")),
              HasSubstr("model.experts_per_gpu: missing required key"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}", "{a2a: 2dh}")),
              StartsWith("test.yaml:15:5: strategies[0].name: missing required key 'name'"));
  EXPECT_THAT(error_of(""), HasSubstr("found an empty document"));
}

// ---------------------------------------------------------------------------------------------
// Validation rules (scenarios/README.md, "Validation")

TEST(ScenarioValidation, ClusterRules) {
  EXPECT_THAT(error_of(tiny_with("{kind: switch, nic_bandwidth: 200Gb/s}", "{kind: none}")),
              HasSubstr("cluster.inter_node.kind: found 'none' with cluster.nodes = 2"));
  // No nic_bandwidth: the NIC model's line rate (topology::cluster_nic), checked when the
  // topology is built; the loader accepts it.
  EXPECT_EQ(parse(tiny_with("{kind: switch, nic_bandwidth: 200Gb/s}", "{kind: fat_tree, nic: cx7}"))
                .cluster.inter.nic,
            "cx7");
  EXPECT_THAT(error_of(tiny_with("  inter_node: {kind: switch, nic_bandwidth: 200Gb/s}\n", "")),
              HasSubstr("cluster.inter_node: missing required key"));
  EXPECT_THAT(error_of(tiny_with("nic_bandwidth: 200Gb/s", "nic_bandwidth: 200Gb/s, groups: 4")),
              HasSubstr("cluster.inter_node.groups: 'groups' applies only to kind dragonfly, but "
                        "kind is switch"));
  EXPECT_THAT(error_of(tiny_with("bandwidth: 300GB/s}", "bandwidth: 300GB/s, sockets: 2}")),
              HasSubstr("cluster.intra_node.sockets: 'sockets' applies only to kind pcie"));
  EXPECT_THAT(error_of(tiny_with("nic_bandwidth: 200Gb/s",
                                 "nic_bandwidth: 200Gb/s, "
                                 "nics_per_node: 3")),
              HasSubstr("cluster.inter_node.nics_per_node: found 3, expected a divisor of "
                        "cluster.gpus_per_node = 2"));
  EXPECT_THAT(error_of(tiny_with("nodes: 2", "nodes: 0")),
              HasSubstr("cluster.nodes: found 0, expected an integer in [1, 131072]"));
  EXPECT_THAT(error_of(tiny_with("bandwidth: 300GB/s", "bandwidth: 0GB/s")),
              HasSubstr("cluster.intra_node.bandwidth: found a zero bandwidth"));
  EXPECT_THAT(error_of(tiny_with("{kind: switch, nic_bandwidth: 200Gb/s}",
                                 "{kind: tree, nic_bandwidth: 1Gb/s, tree: [[2], [1]]}")),
              HasSubstr("cluster.inter_node.tree: the tree's leaves hold 3 nodes, expected "
                        "cluster.nodes = 2"));
  EXPECT_THAT(error_of(tiny_with("{kind: switch, nic_bandwidth: 200Gb/s}",
                                 "{kind: tree, nic_bandwidth: 1Gb/s, tree: [1, 1], "
                                 "tree_level_bandwidth: [1Gb/s, 1Gb/s]}")),
              HasSubstr("found 2 bandwidth(s), expected at most 1"));
  EXPECT_THAT(error_of(tiny_with("{kind: switch, nic_bandwidth: 200Gb/s}",
                                 "{kind: tree, nic_bandwidth: 1Gb/s, tree: [[]]}")),
              HasSubstr("cluster.inter_node.tree[0]: found a list of 0 item(s)"));
  EXPECT_THAT(error_of(tiny_with("  nodes: 2\n", "  nodes: 2\n  calibration: nope.yaml\n")),
              AllOf(StartsWith("test.yaml:5:"), HasSubstr("cluster.calibration: found 'nope.yaml' "
                                                          "(resolved to 'nope.yaml'), which does "
                                                          "not exist")));
  EXPECT_THAT(error_of(tiny_with("inter_node: {kind: switch, nic_bandwidth: 200Gb/s}",
                                 "inter_node: {kind: switch, nic_bandwidth: 200Gb/s}\n"
                                 "  custom: {links: []}")),
              HasSubstr("cluster.custom: found a custom graph, but inter_node.kind is switch"));
}

TEST(ScenarioValidation, ModelAndParallelismRules) {
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: -3")),
              HasSubstr("model.experts_per_gpu: found -3 (one expert sharded over 3 GPUs), "
                        "expected -x with x dividing parallelism.ep = 4"));
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: 0")),
              HasSubstr("model.experts_per_gpu: found 0"));
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts: 6")),
              HasSubstr("model.experts: found 6, expected a multiple or a divisor of "
                        "parallelism.ep = 4"));
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: 1\n  experts: 4")),
              HasSubstr("found both 'experts' and 'experts_per_gpu'"));
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: 1\n  top_k: 5")),
              AllOf(StartsWith("test.yaml:14:"),
                    HasSubstr("model.top_k: found 5, expected at most the 4 experts (E)")));
  EXPECT_THAT(
      error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: 1\n  dtype: fp12")),
      HasSubstr("model.dtype: found 'fp12', expected one of fp32, tf32, fp16, bf16 or fp8"));
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: 1\n  mode: serving")),
              HasSubstr("model.mode: found 'serving', expected one of training or inference"));
  EXPECT_THAT(error_of(tiny_with("experts_per_gpu: 1", "experts_per_gpu: 1\n  moe_every: 3")),
              HasSubstr("model.moe_every: found 3 with model.layers = 1"));
  EXPECT_THAT(error_of(tiny_with("strategies:", "parallelism: {ep: 2, dp: fast}\nstrategies:")),
              HasSubstr("parallelism.dp: found 'fast', expected an integer >= 1 or 'auto'"));
  EXPECT_THAT(error_of(tiny_with("strategies:", "parallelism: {mp: 3}\nstrategies:")),
              HasSubstr("parallelism.mp: esp*mp = 3 does not divide P = 4"));
  for (const char* bad : {"0MB", "fast", "-25MiB"}) {
    EXPECT_THAT(error_of(tiny_with("strategies:", std::string("parallelism: {grad_bucket: ") + bad +
                                                      "}\nstrategies:")),
                HasSubstr(std::string("parallelism.grad_bucket: found '") + bad +
                          "', expected pytorch, megatron, block or a positive size such as 25MiB"));
  }
  EXPECT_EQ(parse(tiny_with("strategies:", "parallelism: {grad_bucket: 50MiB}\nstrategies:"))
                .parallelism.grad_bucket_bytes.value(),
            50.0 * 1024 * 1024);
  EXPECT_EQ(parse(tiny_with("strategies:", "parallelism: {grad_bucket: megatron}\nstrategies:"))
                .parallelism.grad_bucket,
            GradBucketKind::kMegatron);
  EXPECT_EQ(parse(kTiny).parallelism.grad_bucket, GradBucketKind::kPytorch);
  // Any real capacity factor is valid.
  for (const char* f : {"2.0", "0", "-1.5"})
    EXPECT_NO_THROW(parse(tiny_with("experts_per_gpu: 1",
                                    std::string("experts_per_gpu: 1\n  capacity_factor: ") + f)));
}

TEST(ScenarioValidation, WorkloadAndEngineRules) {
  auto with = [](const std::string& section) {
    return tiny_with("strategies:", section + "\nstrategies:");
  };
  EXPECT_THAT(error_of(with("workload: {routing: {distribution: gaussian}}")),
              HasSubstr("workload.routing.distribution: found 'gaussian', expected one of "
                        "uniform, zipf, dirichlet, trace, correlated or balanced"));
  EXPECT_THAT(error_of(with("workload: {routing: {distribution: zipf, skew: -1}}")),
              HasSubstr("workload.routing.skew: found -1, expected a number in [0, 100]"));
  EXPECT_THAT(error_of(with("workload: {routing: {distribution: trace}}")),
              HasSubstr("workload.routing.trace: missing required key"));
  EXPECT_THAT(error_of(with("workload: {routing: {distribution: trace, trace: missing.csv}}")),
              HasSubstr("workload.routing.trace: found 'missing.csv'"));
  EXPECT_THAT(error_of(with("workload: {routing: {alpha: 2}}")),
              HasSubstr("'alpha' applies only to distribution dirichlet"));
  EXPECT_THAT(error_of(with("workload: {routing: {node_limit: 0}}")),
              HasSubstr("workload.routing.node_limit: found 0, expected an integer in [1, 64]"));
  EXPECT_THAT(error_of(with("workload: {routing: {distribution: correlated, node_limit: 2}}")),
              HasSubstr("workload.routing.node_limit: 'node_limit' applies to sampled routing "
                        "(uniform, zipf, dirichlet, balanced), but distribution is correlated"));
  EXPECT_THAT(error_of(with("workload: {routing: {distribution: balanced, skew: 0}}")),
              HasSubstr("workload.routing.skew: 'skew' does not apply to distribution balanced"));
  EXPECT_THAT(error_of(with("workload: {capacity: {kind: wobble}}")),
              HasSubstr("workload.capacity.kind: found 'wobble', expected one of fixed, trace or "
                        "random_walk"));
  EXPECT_THAT(error_of(with("workload: {capacity: {kind: random_walk, min: 4, max: 2}}")),
              HasSubstr("workload.capacity.max: found 2, expected a number in [min = 4, 1024]"));
  EXPECT_THAT(error_of(with("workload: {capacity: {kind: trace, factors: []}}")),
              HasSubstr("workload.capacity.factors: found a list of 0 item(s), expected a "
                        "non-empty list"));
  EXPECT_THAT(error_of(with("workload: {capacity: {kind: trace, factors: [1, x]}}")),
              HasSubstr("workload.capacity.factors[1]: found 'x', expected a plain number"));
  EXPECT_THAT(error_of(with("workload: {capacity: {kind: fixed, min: 1}}")),
              HasSubstr("'min' applies only to kind random_walk"));
  EXPECT_THAT(error_of(with("workload: {iterations: 0}")),
              HasSubstr("workload.iterations: found 0, expected an integer in [1, 1000000]"));
  EXPECT_THAT(error_of(with("engine: {network: packet}")),
              HasSubstr("engine.network: found 'packet', expected one of analytical, flow or "
                        "simgrid"));
  EXPECT_THAT(error_of(with("engine: {interference: -0.1}")),
              HasSubstr("engine.interference: found -0.1, expected a number in [0, 100]"));
  EXPECT_THAT(error_of(with("engine: {peer_cache: -1}")),
              HasSubstr("engine.peer_cache: found -1, expected an integer in [0, 1000000]"));
  EXPECT_THAT(error_of(with("engine: {peer_miss_overhead: -2us}")),
              HasSubstr("engine.peer_miss_overhead"));
  EXPECT_THAT(error_of(with("engine: {launch_overhead: 5}")),
              HasSubstr("engine.launch_overhead: found the bare number '5' without a unit"));
  Scenario s = parse(with("workload: {capacity: {kind: trace, factors: [1, 2.5, -2]}}"));
  EXPECT_EQ(s.workload.capacity.factors, (std::vector<double>{1.0, 2.5, -2.0}));
}

TEST(ScenarioValidation, StrategyRules) {
  EXPECT_THAT(error_of(tiny_with("strategies:\n  - {name: baseline}\n  - {name: tutel, a2a: auto, "
                                 "pipeline: tutel_online}\n",
                                 "strategies: []\n")),
              HasSubstr("strategies: found an empty list, expected at least one strategy"));
  EXPECT_THAT(error_of(tiny_with("{name: tutel,", "{name: baseline,")),
              AllOf(StartsWith("test.yaml:16:"),
                    HasSubstr("strategies[1].name: duplicate strategy name 'baseline' (first "
                              "defined at line 15)")));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}", "{name: baseline, ta_moe: {lambda: 0.2}}")),
              HasSubstr("strategies[0].ta_moe: 'ta_moe' parameters are given, but routing is not "
                        "ta_moe"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, routing: ta_moe, ta_moe: {lambda: 1.5}}")),
              HasSubstr("strategies[0].ta_moe.lambda: found 1.5, expected a number in [0, 1]"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, routing: ta_moe, ta_moe: {lamda: 0.5}}")),
              HasSubstr("did you mean 'lambda'?"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}", "{name: baseline, inference: lina}")),
              HasSubstr("strategies[0].inference: found 'lina' with model.mode = training"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}", "{name: baseline, parallel: 2}")),
              HasSubstr("strategies[0].parallel: found 2, expected a divisor of the expert shard "
                        "count n = 1"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, schedule: lina, "
                                 "lina: {micro_op: 30}}")),
              HasSubstr("strategies[0].lina.micro_op: found the bare number '30' without a unit"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, schedule: lina, "
                                 "lina: {pack_experts: maybe}}")),
              HasSubstr("strategies[0].lina.pack_experts: found 'maybe', expected true or false"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, schedule: lina, lina: {max_pack: 3}}")),
              HasSubstr("strategies[0].lina.max_pack: found 3, expected a power of two"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, schedule: lina, lina: {max_pack: 0}}")),
              HasSubstr("strategies[0].lina.max_pack:"));
  EXPECT_THAT(error_of(tiny_with("{name: baseline}",
                                 "{name: baseline, schedule: lina, lina: {max_pack: 2.5}}")),
              HasSubstr("strategies[0].lina.max_pack:"));
}

// Alias bombs (nested *aliases expanding exponentially) and absurd nesting are refused before any
// node is built, naming the file, line, column and key; legitimate aliases still load.
TEST(ScenarioLoader, AliasBombAndDeepNestingAreRefused) {
  std::string bomb = "x0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int k = 1; k < 10; ++k) {  // 9^10 = 3.5e9 nodes once expanded, from ~500 bytes
    bomb += "x" + std::to_string(k) + ": &x" + std::to_string(k) + " [";
    for (int j = 0; j < 9; ++j) bomb += (j ? ", *x" : "*x") + std::to_string(k - 1);
    bomb += "]\n";
  }
  try {
    parse_yaml_string(bomb, "bomb.yaml");
    ADD_FAILURE() << "the alias bomb was accepted";
  } catch (const InputError& e) {
    // x6 = 9^7 = 4.8 M nodes is where the running total first passes 1 M, at line 7.
    EXPECT_THAT(e.what(), ::testing::HasSubstr("bomb.yaml:7:"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("x6"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("expands to more than 1000000 nodes"));
  }
  const std::string deep = "a: " + std::string(100, '[') + "1" + std::string(100, ']') + "\n";
  try {
    parse_yaml_string(deep, "deep.yaml");
    ADD_FAILURE() << "100 nested lists were accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("deep.yaml:1:"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("nested deeper than 64 levels"));
  }
  // yaml-cpp loops on some malformed text, emitting events without reading on (found by the
  // fuzzer): stopped at once, at the place it loops.
  try {
    parse_yaml_string("# x\n,ba$*", "loop.yaml");
    ADD_FAILURE() << "the parser loop was accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("loop.yaml:2:1"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("malformed YAML the parser cannot get past"));
  }
  // 64 levels and a few aliases are fine: the bound is on expansion, not on using aliases.
  const std::string ok = "a: " + std::string(63, '[') + "1" + std::string(63, ']') +
                         "\nb: &b {x: 1, y: [1, 2]}\nc: [*b, *b, *b]\n";
  const YAML::Node n = parse_yaml_string(ok, "ok.yaml");
  EXPECT_EQ(n["c"].size(), 3u);
  EXPECT_EQ(n["c"][2]["y"][1].as<int>(), 2);
}

}  // namespace
}  // namespace moesim

// ---------------------------------------------------------------------------------------------
// Every numeric key has a stated upper bound, and the sizes the plan derives from
// them are bounded too, so nothing that validates overflows at run time. Each value here used to
// load (and then crash, print an internal error or simulate an overflowed all-to-all).

namespace moesim {
namespace {

const std::string kWithCapacity = "  experts_per_gpu: 1\n  capacity_factor: ";  // line 14, col 20

TEST(ScenarioBounds, QuantitiesHaveAnUpperBound) {
  // 1e308Gb/s is infinite in bytes per second (it was an internal error at run time).
  EXPECT_EQ(error_of(tiny_with("nic_bandwidth: 200Gb/s", "nic_bandwidth: 1e308Gb/s")),
            "test.yaml:7:45: cluster.inter_node.nic_bandwidth: found '1e308Gb/s', expected a "
            "bandwidth (e.g. 300GB/s, 200Gb/s) of at most 1000TB/s");
  EXPECT_EQ(error_of(tiny_with("nic_bandwidth: 200Gb/s", "nic_bandwidth: 1001TB/s")),
            "test.yaml:7:45: cluster.inter_node.nic_bandwidth: found '1001TB/s', expected a "
            "bandwidth (e.g. 300GB/s, 200Gb/s) of at most 1000TB/s");
  EXPECT_EQ(parse(tiny_with("nic_bandwidth: 200Gb/s", "nic_bandwidth: 1000TB/s"))
                .cluster.inter.nic_bandwidth.value(),
            1e15);
  EXPECT_THAT(error_of(tiny_with("bandwidth: 300GB/s}", "bandwidth: 300GB/s, latency: 3601s}")),
              HasSubstr("cluster.intra_node.latency: found '3601s', expected a duration (e.g. "
                        "2us, 1.5ms) of at most 3600s"));
}

TEST(ScenarioBounds, CapacityFactorIsBounded) {
  // 1e30 was an internal error at run time; 1e12 simulated an all-to-all of 0.000 ms (overflow).
  EXPECT_EQ(error_of(tiny_with("  experts_per_gpu: 1\n", kWithCapacity + "1e30\n")),
            "test.yaml:14:20: model.capacity_factor: found 1e+30, expected a number in [-1024, "
            "1024]");
  EXPECT_EQ(error_of(tiny_with("  experts_per_gpu: 1\n", kWithCapacity + "1e12\n")),
            "test.yaml:14:20: model.capacity_factor: found 1000000000000, expected a number in "
            "[-1024, 1024]");
  EXPECT_EQ(error_of(tiny_with("  experts_per_gpu: 1\n", kWithCapacity + "-1025\n")),
            "test.yaml:14:20: model.capacity_factor: found -1025, expected a number in [-1024, "
            "1024]");
  EXPECT_EQ(
      parse(tiny_with("  experts_per_gpu: 1\n", kWithCapacity + "1024\n")).model.capacity_factor,
      1024);
  EXPECT_THAT(error_of(kTiny + std::string("workload:\n  capacity: {kind: trace, factors: [1, "
                                           "2000]}\n")),
              HasSubstr("workload.capacity.factors[1]: found 2000, expected a number in [-1024, "
                        "1024]"));
  EXPECT_THAT(error_of(kTiny + std::string("workload:\n  capacity: {kind: random_walk, min: 1, "
                                           "max: 1e9}\n")),
              HasSubstr("workload.capacity.max: found 1000000000, expected a number in (0, "
                        "1024]"));
}

TEST(ScenarioBounds, TokensPerGpuAreBounded) {
  // B = 2: S = B x L must stay within 2^31.
  EXPECT_EQ(error_of(tiny_with("seq_len: 8", "seq_len: 2147483647")),
            "test.yaml:10:12: model.seq_len: found 2147483647, expected an integer in [1, "
            "2^31/batch_per_gpu = 1073741824] (S = batch_per_gpu x seq_len tokens per GPU is at "
            "most 2^31)");
  EXPECT_EQ(error_of(tiny_with("seq_len: 8", "seq_len: 2147483648")),
            "test.yaml:10:12: model.seq_len: found 2147483648, expected an integer in [1, "
            "2^31-1]");
  EXPECT_EQ(error_of(tiny_with("model_dim: 16", "model_dim: 1048577")),
            "test.yaml:11:14: model.model_dim: found 1048577, expected an integer in [1, "
            "1048576]");
  EXPECT_EQ(parse(tiny_with("seq_len: 8", "seq_len: 1073741824")).tokens_per_gpu(),
            std::int64_t{1} << 31);
}

TEST(ScenarioBounds, PlanSizesMustFit) {
  // Each key in range, the dispatch buffer E x dC x M x bytes is not: 4 experts x
  // ceil(2 x 1024 x 2^28 / 4) = 2^37 slots x 2^20 x 2 bytes = 2^60.
  const std::string big =
      edit(tiny_with("seq_len: 8", "seq_len: 134217728"), "model_dim: 16", "model_dim: 1048576");
  EXPECT_EQ(error_of(edit(big, "  experts_per_gpu: 1\n", kWithCapacity + "1024\n")),
            "test.yaml:14:3: model.capacity_factor: found 1024: one GPU's dispatch all-to-all "
            "would send E x dC x M x bytes x esp x shards = 4 x 137438953472 x 1048576 x 2 x 1 x "
            "1 = 1.153e+18 bytes, expected at most 2^50 (1024TiB); lower model.capacity_factor, "
            "seq_len, batch_per_gpu or model_dim");
  // At capacity factor 1 the token count is what is too large: 4 x 2^30 x 2^20 x 2 = 2^53.
  EXPECT_EQ(error_of(edit(tiny_with("seq_len: 8", "seq_len: 1073741824"), "model_dim: 16",
                          "model_dim: 1048576")),
            "test.yaml:10:3: model.seq_len: found 1073741824: one GPU's dispatch all-to-all "
            "would send E x dC x M x bytes x esp x shards = 4 x 1073741824 x 1048576 x 2 x 1 x 1 "
            "= 9.007e+15 bytes, expected at most 2^50 (1024TiB); lower model.capacity_factor, "
            "seq_len, batch_per_gpu or model_dim");
  // Exactly 2^50 fits: S = 2^28, f = 1, k = 2: dC = 2^27; 4 x 2^27 x 2^20 x 2 = 2^50.
  EXPECT_NO_THROW(parse(
      edit(tiny_with("seq_len: 8", "seq_len: 134217728"), "model_dim: 16", "model_dim: 1048576")));
}

// Internal errors reach users through main's catch-all: the message names the failed check, not
// the path of the source file on the machine that built the binary.
TEST(ScenarioBounds, InternalErrorsCarryNoSourcePath) {
  try {
    MOESIM_ASSERT(1 + 1 == 3, "arithmetic is broken");
    ADD_FAILURE() << "MOESIM_ASSERT did not throw";
  } catch (const InternalError& e) {
    EXPECT_STREQ(e.what(),
                 "internal error (a bug in moesim, please report it): arithmetic is broken (check "
                 "failed: 1 + 1 == 3)");
  }
}

TEST(ScenarioBounds, IntegerRangesAreStated) {
  const std::string with_seed = kTiny + std::string("workload:\n  routing: {seed: -5}\n");
  EXPECT_EQ(error_of(with_seed),
            "test.yaml:18:19: workload.routing.seed: found -5, expected an integer in [0, "
            "2^63-1]");
  EXPECT_THAT(error_of(kTiny + std::string("workload: {iterations: 1000001}\n")),
              HasSubstr("workload.iterations: found 1000001, expected an integer in [1, "
                        "1000000]"));
  EXPECT_EQ(error_of(tiny_with("nodes: 2", "nodes: 65537")),
            "test.yaml:4:10: cluster.nodes: found 65537, expected an integer in [1, "
            "2^17/gpus_per_node = 65536] (65537 nodes x 2 GPUs is more than the 2^17 = 131,072 "
            "GPUs moesim simulates: its per-GPU tables outgrow memory beyond)");
  EXPECT_THAT(error_of(tiny_with("nodes: 2", "nodes: 1e6")),
              HasSubstr("cluster.nodes: found '1e6', expected an integer in [1, 131072]"));
  EXPECT_THAT(error_of(tiny_with("  experts_per_gpu: 1\n", "  experts: 1048577\n")),
              HasSubstr("model.experts: found 1048577, expected an integer in [1, 1048576]"));
}

}  // namespace
}  // namespace moesim

namespace moesim {
namespace {

// model.attention / activation / precision / recompute: what each resolves to, and the errors
// with the key and what is allowed.
TEST(ScenarioModelLayout, AttentionActivationPrecisionRecompute) {
  const Scenario plain = parse(kTiny);
  // Absent attention: one head of width M when 128 does not divide M (M = 16).
  EXPECT_EQ(plain.model.attention.heads, 1);
  EXPECT_EQ(plain.model.attention.head_dim, 16);
  EXPECT_EQ(plain.model.activation, FfnActivation::kGelu);
  EXPECT_EQ(plain.model.precision.gemm, Dtype::kFp16);  // model.dtype's default
  EXPECT_EQ(plain.model.recompute.granularity, RecomputeGranularity::kNone);

  const Scenario gqa = parse(
      tiny_with("  experts_per_gpu: 1\n",
                "  experts_per_gpu: 1\n  attention: {heads: 4, kv_heads: 2}\n  activation: swiglu\n"
                "  precision: {gemm: fp8, dispatch: fp8, combine: bf16, main_grads: fp32, "
                "moments: bf16}\n"
                "  recompute: {granularity: selective}\n"));
  EXPECT_EQ(gqa.model.attention.head_dim, 4);  // M / heads
  EXPECT_EQ(gqa.model.attention.kv_heads, 2);
  EXPECT_TRUE(gqa.model.swiglu());
  EXPECT_EQ(gqa.model.fc1_width(32), 64);
  EXPECT_EQ(gqa.model.ffn_params(32), 3 * 16 * 32);
  EXPECT_EQ(gqa.model.precision.gemm, Dtype::kFp8);
  EXPECT_EQ(gqa.model.precision.combine, Dtype::kBf16);
  EXPECT_EQ(gqa.model.precision.main_grads, Dtype::kFp32);
  EXPECT_EQ(gqa.model.precision.moments, Dtype::kBf16);
  EXPECT_EQ(plain.model.precision.moments, Dtype::kFp32);  // Adam's fp32 moments by default
  // Selective without modules: Megatron's default, the attention core.
  ASSERT_EQ(gqa.model.recompute.modules.size(), 1u);
  EXPECT_TRUE(gqa.model.recompute.has(RecomputeModule::kCoreAttn));

  const auto with = [](const std::string& lines) {
    return error_of(tiny_with("  experts_per_gpu: 1\n", "  experts_per_gpu: 1\n" + lines));
  };
  EXPECT_THAT(with("  attention: {heads: 3}\n"),
              HasSubstr("model.attention.heads: found 3, expected a divisor of model_dim = 16"));
  EXPECT_THAT(with("  attention: {heads: 4, kv_heads: 3}\n"),
              HasSubstr("model.attention.kv_heads: found 3, expected a divisor of heads = 4"));
  EXPECT_THAT(with("  attention: {heads: 4, kv_lora_rank: 8}\n"),
              HasSubstr("model.attention.kv_lora_rank: 'kv_lora_rank' is a multi-head latent "
                        "attention rank, expected kind: mla"));
  EXPECT_THAT(with("  attention: {kind: mla, heads: 4, kv_lora_rank: 8, qk_nope_head_dim: 4}\n"),
              HasSubstr("missing required key 'qk_rope_head_dim'"));
  // Tensor parallelism splits heads: mp must divide them.
  EXPECT_THAT(error_of(tiny_with("  experts_per_gpu: 1\n",
                                 "  experts_per_gpu: 2\n  attention: {heads: 2, head_dim: 8}\n"
                                 "parallelism: {mp: 4}\n")),
              AllOf(StartsWith("test.yaml:14:"),
                    HasSubstr("model.attention.heads: found 2 with parallelism.mp = 4, expected "
                              "a multiple of mp")));
  EXPECT_THAT(with("  recompute: {granularity: selective, modules: [mla_up_proj]}\n"),
              HasSubstr("model.recompute.modules[0]: mla_up_proj recomputes multi-head latent "
                        "attention's up-projections, but model.attention.kind is mha; expected a "
                        "module the model has"));
  EXPECT_THAT(with("  recompute: {granularity: selective, modules: [shared_experts]}\n"),
              HasSubstr("model.recompute.modules[0]: shared_experts recomputes the shared "
                        "experts, but model.shared_experts is 0"));
  EXPECT_THAT(with("  recompute: {granularity: selective, modules: [mlp]}\n"),
              HasSubstr("every block of the model has an MoE FFN"));
  EXPECT_THAT(with("  recompute: {granularity: selective, modules: [core_atn]}\n"),
              AllOf(HasSubstr("model.recompute.modules[0]: found 'core_atn', expected one of "
                              "core_attn, layernorm"),
                    HasSubstr("did you mean 'core_attn'")));
  EXPECT_THAT(with("  recompute: {granularity: full, modules: [moe]}\n"),
              HasSubstr("model.recompute.modules: found modules with granularity full, expected "
                        "granularity: selective"));
  EXPECT_THAT(with("  precision: {main_grads: fp8}\n"),
              HasSubstr("model.precision.main_grads: found fp8, expected fp32, bf16 or fp16"));
  EXPECT_THAT(with("  precision: {moments: fp8}\n"),
              HasSubstr("model.precision.moments: found fp8, expected fp32, bf16 or fp16"));
  EXPECT_THAT(with("  activation: relu\n"),
              HasSubstr("model.activation: found 'relu', expected one of gelu or swiglu"));
}

}  // namespace
}  // namespace moesim
