// `moesim tune` (apps/moesim/tune.hpp): the layout space counted by hand, the stacks the tuner
// must find where the answer is known (one node: no 2DH; a slow inter-node link: topology-aware
// routing or 2DH, or all of EP inside a node), determinism, and the emitted scenario reproducing
// the reported time through `moesim simulate`.
#include "apps/moesim/tune.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "apps/moesim/overrides.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"

namespace moesim::app {
namespace {

namespace fs = std::filesystem;
const std::string kBinary = MOESIM_BINARY;

struct RunOutput {
  int exit_code = -1;
  std::string out;
};

// The binary with `args`; `launcher` (an mpirun command line) goes before it when given.
RunOutput run(const std::string& args, const std::string& launcher = "") {
  const std::string cmd = fmt::format("{} '{}' {} 2>&1", launcher, kBinary, args);
  RunOutput r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

fs::path temp_dir() {
  const fs::path d =
      fs::temp_directory_path() /
      fmt::format("moesim_tune_{}_{}",
                  ::testing::UnitTest::GetInstance()->current_test_info()->name(), getpid());
  fs::create_directories(d);
  return d;
}

// nodes x gpn GPUs, 4 experts per node-worth of GPUs, one MoE block, small dims.
std::string scenario_yaml(int nodes, int gpn, const std::string& inter, int experts,
                          const std::string& mode = "training", int batch = 4) {
  return fmt::format(R"(name: tune-test
cluster:
  gpu: a100-sxm-80gb
  nodes: {}
  gpus_per_node: {}
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
  inter_node: {}
model:
  mode: {}
  layers: 1
  moe_every: 1
  batch_per_gpu: {}
  seq_len: 512
  model_dim: 1024
  hidden_dim: 2048
  experts: {}
  top_k: 2
  capacity_factor: 1.0
  dtype: fp16
workload:
  routing: {{distribution: uniform, seed: 1}}
  iterations: 1
engine: {{network: flow}}
strategies:
  - {{name: baseline}}
)",
                     nodes, gpn, inter, mode, batch, experts);
}

const char* kNoInter = "{kind: none}";

TEST(TuneLayouts, CountedByHandOnFourGpus) {
  // 1 node x 4 GPUs, E = 4, B = 4 on 4 replicas (16 sequences). By mp (B = 16 mp / 4):
  //  mp 1: esp 1 -> ep 1, 2, 4; esp 2 -> ep 1, 2; esp 4 -> ep 1: 6.
  //  mp 2: disjoint esp 1 -> ep 1, 2; esp 2 -> ep 1; overlapped (mp | ep esp) esp 1 -> ep 2, 4;
  //        esp 2 -> ep 1, 2; esp 4 -> ep 1: 8.
  //  mp 4: disjoint esp 1 -> ep 1; overlapped esp 1 -> ep 4; esp 2 -> ep 2; esp 4 -> ep 1: 4.
  const Scenario sc = parse_scenario_string(scenario_yaml(1, 4, kNoInter, 4), "t.yaml");
  const TuneSpace stage_only{false, false};  // pp, micro-batches and ZeRO as written
  const auto ls = tune_layouts(sc, stage_only);
  ASSERT_EQ(ls.size(), 18u);
  int per_mp[5] = {0, 0, 0, 0, 0}, own = 0;
  for (const auto& l : ls) {
    ++per_mp[l.par.mp];
    EXPECT_EQ(l.par.product(), 4) << l.describe();
    EXPECT_EQ(l.batch_per_gpu, 4 * l.par.mp) << l.describe();    // the global batch is kept
    EXPECT_EQ(l.experts_per_gpu * l.par.ep, 4) << l.describe();  // E is kept
    if (l.par.overlapped()) {
      EXPECT_EQ(l.par.ep * l.par.esp % l.par.mp, 0) << l.describe();
    }
    own += l.is_scenario ? 1 : 0;
  }
  EXPECT_EQ(per_mp[1], 6);
  EXPECT_EQ(per_mp[2], 8);
  EXPECT_EQ(per_mp[4], 4);
  EXPECT_EQ(own, 1);  // ep 4 x dp 1, the scenario's resolved layout
  // Inference runs neither MP nor ESP (inference session): ep 1, 2, 4 only.
  const Scenario inf =
      parse_scenario_string(scenario_yaml(1, 4, kNoInter, 4, "inference"), "t.yaml");
  EXPECT_EQ(tune_layouts(inf, stage_only).size(), 3u);
  EXPECT_EQ(tune_layouts(inf).size(), 3u);  // nor pp, micro-batches or ZeRO
  // 2 experts on 4 GPUs: ep 4 shards each expert over 2 GPUs (experts_per_gpu -2), only at esp 1.
  const Scenario sharded = parse_scenario_string(scenario_yaml(1, 4, kNoInter, 2), "t.yaml");
  bool found = false;
  for (const auto& l : tune_layouts(sharded, stage_only)) {
    if (l.experts_per_gpu < 0) {
      EXPECT_EQ(l.par.esp, 1);
      EXPECT_EQ(l.experts_per_gpu, -(l.par.ep / 2));
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

// The pipeline space counted by hand: 2 nodes x 2 GPUs, 4 blocks, E = 4, a global batch of 16
// sequences (B = 4 on 4 replicas). Stage counts the loader accepts: pp 1, 2 (a node each), 4 (a
// GPU each). With mp = esp = 1, the largest ep and ZeRO 0, the (pp, schedule, B, m) are:
//  pp 1: n = 4 sequences per replica -> B 4, 2, 1 (m 1, 2, 4), 1f1b: 3.
//  pp 2: n = 8 -> B 1, 2, 4 (m 8, 4, 2 >= pp); 1f1b each, interleaved vp 2 each (4 blocks over 2
//        stages, m even), dualpipe for m 8 and 4 (m >= 2 pp): 8.
//  pp 4: n = 16 -> B 1, 2, 4 (m 16, 8, 4); 1f1b each, no interleaving (one block per stage),
//        dualpipe for m 16 and 8: 5.
TEST(TuneLayouts, PipelineStagesMicroBatchesAndZeroCountedByHand) {
  const std::string inter =
      "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 2, latency: 2us}";
  YAML::Node tree = YAML::Load(scenario_yaml(2, 2, inter, 4));
  tree["model"]["layers"] = 4;
  const Scenario sc = parse_scenario(YAML::Clone(tree), "t.yaml");
  const auto ls = tune_layouts(sc);
  std::multiset<std::string> got;
  int zero0 = 0, zero1 = 0;
  for (const auto& l : ls) {
    const int stage = 4 / l.par.pp;
    // The global batch (16 sequences) is kept in every layout.
    EXPECT_EQ(static_cast<std::int64_t>(stage / l.par.mp) * l.batch_per_gpu * l.micro_batches, 16)
        << l.describe();
    EXPECT_EQ(l.par.product(), stage) << l.describe();
    EXPECT_GE(l.micro_batches, l.par.pp) << l.describe();
    ++(l.par.zero == 0 ? zero0 : zero1);
    if (l.par.mp == 1 && l.par.esp == 1 && l.par.ep == stage && l.par.zero == 0)
      got.insert(fmt::format("pp{} {} vp{} B{} m{}", l.par.pp, name_of(l.par.schedule), l.par.vp,
                             l.batch_per_gpu, l.micro_batches));
  }
  EXPECT_EQ(zero0, zero1);  // every layout with ZeRO 0 and 1
  const std::multiset<std::string> want = {
      "pp1 1f1b vp1 B4 m1",      "pp1 1f1b vp1 B2 m2",        "pp1 1f1b vp1 B1 m4",
      "pp2 1f1b vp1 B1 m8",      "pp2 interleaved vp2 B1 m8", "pp2 dualpipe vp1 B1 m8",
      "pp2 1f1b vp1 B2 m4",      "pp2 interleaved vp2 B2 m4", "pp2 dualpipe vp1 B2 m4",
      "pp2 1f1b vp1 B4 m2",      "pp2 interleaved vp2 B4 m2", "pp4 1f1b vp1 B1 m16",
      "pp4 dualpipe vp1 B1 m16", "pp4 1f1b vp1 B2 m8",        "pp4 dualpipe vp1 B2 m8",
      "pp4 1f1b vp1 B4 m4"};
  EXPECT_EQ(got, want);
  // Every layout parses as written (the edits are valid scenario keys).
  YAML::Node without_e = YAML::Clone(tree);  // the layouts give experts_per_gpu, as tune does
  without_e["model"].remove("experts");
  for (const auto& l : ls) {
    try {
      const Scenario x = parse_scenario_with(YAML::Clone(without_e), "t.yaml", l.edits);
      EXPECT_EQ(x.parallelism.pp, l.par.pp);
      EXPECT_EQ(x.model.micro_batches, l.micro_batches);
      EXPECT_EQ(x.num_experts(), 4);
    } catch (const InputError& e) {
      ADD_FAILURE() << l.describe() << ": " << e.what();
    }
  }
}

// A pipeline_layout names the scenario's own pieces: it goes along with the layouts of the
// scenario's pp, schedule and vp (1f1b here, and interleaved) and no other.
TEST(TuneLayouts, KeepThePipelineLayoutWithItsOwnStagesOnly) {
  const std::string inter =
      "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 2, latency: 2us}";
  YAML::Node tree = YAML::Load(scenario_yaml(2, 2, inter, 4));
  tree["model"]["layers"] = 3;
  tree["model"]["micro_batches"] = 2;
  tree["parallelism"] = YAML::Load("{pp: 2, pipeline_layout: 't*2|t'}");
  const Scenario sc = parse_scenario(YAML::Clone(tree), "t.yaml");
  ASSERT_EQ(sc.parallelism.pipeline_layout, (std::vector<int>{2, 1}));
  int with = 0;
  for (const auto& l : tune_layouts(sc)) {
    const bool own = l.par.pp == 2 && l.par.schedule == PipelineSchedule::kOneFOneB;
    if (own) {
      ++with;
      EXPECT_EQ(l.par.pipeline_layout, (std::vector<int>{2, 1})) << l.describe();
      EXPECT_THAT(l.edits.at(0), ::testing::HasSubstr("pipeline_layout: [2, 1]"));
    } else {
      EXPECT_TRUE(l.par.pipeline_layout.empty()) << l.describe();
    }
  }
  EXPECT_GT(with, 0);
  TuneOptions o;
  o.budget_s = 600;
  o.rerun_engine = "analytical";
  o.progress = false;
  o.search_layouts = false;
  const TuneResult r = tune(tree, "t.yaml", {}, o);
  ASSERT_TRUE(r.complete);
  ASSERT_FALSE(r.ranked.empty());
  ASSERT_EQ(r.layouts.size(), 1u);
  EXPECT_THAT(r.layouts[0].edits.at(0), ::testing::HasSubstr("pipeline_layout: [2, 1]"));

  tree["model"]["layers"] = 4;
  tree["parallelism"] = YAML::Load("{pp: 2, vp: 2, pipeline_layout: [1, 1, 1, 1]}");
  const Scenario inter_sc = parse_scenario(YAML::Clone(tree), "t.yaml");
  ASSERT_EQ(inter_sc.parallelism.schedule, PipelineSchedule::kInterleaved);
  for (const auto& l : tune_layouts(inter_sc)) {
    const bool own =
        l.par.pp == 2 && l.par.schedule == PipelineSchedule::kInterleaved && l.par.vp == 2;
    EXPECT_EQ(l.par.pipeline_layout.empty(), !own) << l.describe();
  }
  const TuneResult ri = tune(tree, "t.yaml", {}, o);
  ASSERT_TRUE(ri.complete);
  ASSERT_FALSE(ri.ranked.empty());
  EXPECT_THAT(ri.layouts[0].edits.at(0), ::testing::HasSubstr("pipeline_layout: [1, 1, 1, 1]"));
  EXPECT_THAT(ri.layouts[0].edits.at(0), ::testing::HasSubstr("schedule: interleaved, vp: 2"));
}

// The stage layouts only (pp, micro-batches, ZeRO and recomputation as written): these tests
// are about the stacks; the pipeline and memory space has tests of its own.
TuneOptions screening_only() {
  TuneOptions o;
  o.budget_s = 600;  // never reached on these sizes: the search completes
  o.rerun_engine = "analytical";
  o.progress = false;
  o.search_pipeline = false;
  o.search_memory = false;
  return o;
}

TEST(Tune, OneNodeNeverPicks2dhAndKeepsTheModel) {
  const std::string yaml = scenario_yaml(1, 8, kNoInter, 8);
  const YAML::Node tree = YAML::Load(yaml);
  TuneOptions o = screening_only();
  const TuneResult r = tune(tree, "t.yaml", {}, o);
  ASSERT_TRUE(r.complete);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.evaluated, r.stacks_in_space);  // exhaustive everywhere
  for (const auto& row : r.ranked) {
    EXPECT_THAT(row.screen.decisions, ::testing::Not(::testing::HasSubstr("2dh")));
  }
  // Ranked best first, and the best beats (or ties) the scenario's baseline.
  for (std::size_t i = 1; i < r.ranked.size(); ++i)
    EXPECT_LE(r.ranked[i - 1].time_s(), r.ranked[i].time_s());
  EXPECT_GE(r.ranked[0].screen.speedup, 1.0);
}

TEST(Tune, SlowInterNodeLinkMakesTheTunerAvoidOrShapeTheInterNodeAllToAll) {
  // 4 nodes x 4 GPUs, fast NVSwitch inside, a 10 Gb/s NIC per node: EP over all 16 GPUs pays
  // the slow link in every all-to-all.
  const std::string yaml = scenario_yaml(
      4, 4, "{kind: switch, nic_bandwidth: 10Gb/s, nics_per_node: 1, latency: 5us}", 16);
  const YAML::Node tree = YAML::Load(yaml);
  // On the scenario's layout (ep = 16) the best stack routes topology-aware or runs 2DH.
  TuneOptions keep = screening_only();
  keep.search_layouts = false;
  keep.include_routing = true;  // topology-aware routing changes what the model learns
  const TuneResult fixed = tune(tree, "t.yaml", {}, keep);
  ASSERT_FALSE(fixed.ranked.empty());
  ASSERT_EQ(fixed.layouts.size(), 1u);
  const std::string& best = fixed.ranked[0].roles;
  EXPECT_TRUE(best.find("ta_moe") != std::string::npos ||
              best.find("faster_moe_hir") != std::string::npos ||
              fixed.ranked[0].screen.decisions.find("a2a=2dh") != std::string::npos)
      << best << " / " << fixed.ranked[0].screen.decisions;
  EXPECT_GT(fixed.ranked[0].screen.speedup, 1.2);
  // With the layout free as well, the answer is at least as fast.
  TuneOptions all = screening_only();
  all.include_routing = true;
  const TuneResult free = tune(tree, "t.yaml", {}, all);
  ASSERT_FALSE(free.ranked.empty());
  EXPECT_LE(free.ranked[0].time_s(), fixed.ranked[0].time_s() * (1 + 1e-12));
  // By default no stack changes the routing: the space is smaller by the routing role's values,
  // and the best keeps the model's routing.
  keep.include_routing = false;
  const TuneResult kept = tune(tree, "t.yaml", {}, keep);
  EXPECT_EQ(kept.stacks_in_space * 3, fixed.stacks_in_space);  // even, ta_moe, faster_moe_hir
  for (const auto& row : kept.ranked) EXPECT_FALSE(row.changes_routing()) << row.roles;
  EXPECT_TRUE(fixed.ranked[0].changes_routing() ||
              fixed.ranked[0].screen.decisions.find("a2a=2dh") != std::string::npos);
}

// A GPU too small for the scenario's own layout: the search finds layouts that fit (ZeRO-1, more
// stages or micro-batches, recomputation), every ranked row fits, and the scenario's layout is
// still the reference. A GPU too small for any layout gets no row and a note naming the closest.
TEST(Tune, FindsLayoutsThatFitWhereTheScenarioDoesNot) {
  const std::string inter =
      "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 2, latency: 2us}";
  YAML::Node tree = YAML::Load(scenario_yaml(2, 2, inter, 4));
  tree["model"]["layers"] = 4;
  TuneOptions own = screening_only();
  own.search_layouts = false;
  const double need = tune(tree, "t.yaml", {}, own).baseline_screen.memory_bytes;
  ASSERT_GT(need, 0);
  auto small_gpu = [&](double bytes) {
    tree["cluster"]["gpu"] = YAML::Load(fmt::format(
        "{{name: small, peak_tflops: 312TFLOPS, hbm_bandwidth: 2039GB/s, memory: {}KiB}}",
        static_cast<long long>(bytes / 1024)));
  };
  small_gpu(0.7 * need);
  TuneOptions o = screening_only();
  o.search_pipeline = o.search_memory = true;
  const TuneResult r = tune(tree, "t.yaml", {}, o);
  EXPECT_FALSE(r.baseline_screen.fits_memory());
  EXPECT_GT(r.layouts_fit, 0);
  ASSERT_FALSE(r.ranked.empty());
  for (const auto& row : r.ranked) {
    EXPECT_TRUE(row.screen.fits_memory()) << r.layouts[row.layout].describe();
    EXPECT_FALSE(r.layouts[row.layout].is_scenario);
  }
  // The stage layouts alone (pp, micro-batches, ZeRO and recomputation as written) hold less.
  const TuneResult stage_only = tune(tree, "t.yaml", {}, screening_only());
  EXPECT_LT(stage_only.layouts_fit, r.layouts_fit);

  small_gpu(4096);  // 4 MiB: not even the weights
  const TuneResult none = tune(tree, "t.yaml", {}, o);
  EXPECT_EQ(none.layouts_fit, 0);
  EXPECT_TRUE(none.ranked.empty());
  bool named = false;
  for (const auto& n : none.notes)
    named = named || (n.find("no layout fits") != std::string::npos &&
                      n.find("closest: ") != std::string::npos);
  EXPECT_TRUE(named) << fmt::format("{}", fmt::join(none.notes, "\n"));
}

// DeepEP's per-node dispatch joins the a2a role for a dropless dispatch across nodes: with
// node-limited routing (a token's two experts on one node) and a slow NIC its all-to-all time
// is about half the routed baseline's on the same layout, and stacks it cannot join are refused
// (counted inapplicable), not run. A capacity factor leaves it out of the space.
TEST(Tune, DeepepJoinsTheSpaceForADroplessDispatchAcrossNodes) {
  const YAML::Node tree = YAML::Load(scenario_yaml(
      2, 2, "{kind: switch, nic_bandwidth: 25Gb/s, nics_per_node: 1, latency: 2us}", 8));
  TuneOptions o = screening_only();
  o.search_layouts = false;
  o.top = 1000;
  const TuneResult r =
      tune(tree, "t.yaml", {"model.capacity_factor=0", "workload.routing.node_limit=1"}, o);
  ASSERT_TRUE(r.complete);
  const TuneRow* baseline = nullptr;
  const TuneRow* deepep = nullptr;
  for (const auto& row : r.ranked) {
    if (row.roles == "baseline") baseline = &row;
    if (!deepep && row.roles == "a2a=deepep") deepep = &row;
  }
  ASSERT_NE(baseline, nullptr);
  ASSERT_NE(deepep, nullptr) << "no plain deepep stack ranked";
  EXPECT_THAT(deepep->screen.decisions, ::testing::HasSubstr("a2a=deepep"));
  EXPECT_LT(deepep->screen.a2a_mean_s, 0.7 * baseline->screen.a2a_mean_s);
  EXPECT_GT(deepep->screen.a2a_mean_s, 0.3 * baseline->screen.a2a_mean_s);
  EXPECT_GT(r.inapplicable, 0);  // deepep with ta_moe / faster_moe_hir / searched pipelines
  const TuneResult capped = tune(tree, "t.yaml", {}, o);
  for (const auto& row : capped.ranked)
    EXPECT_THAT(row.roles, ::testing::Not(::testing::HasSubstr("deepep")));
}

TEST(Tune, DeterministicWhenComplete) {
  const YAML::Node tree = YAML::Load(scenario_yaml(2, 4,
                                                   "{kind: switch, nic_bandwidth: "
                                                   "100Gb/s, nics_per_node: 1, latency: "
                                                   "2us}",
                                                   8));
  const TuneResult a = tune(tree, "t.yaml", {}, screening_only());
  const TuneResult b = tune(tree, "t.yaml", {}, screening_only());
  ASSERT_TRUE(a.complete && b.complete);
  ASSERT_EQ(a.ranked.size(), b.ranked.size());
  for (std::size_t i = 0; i < a.ranked.size(); ++i) {
    EXPECT_EQ(a.ranked[i].stack_yaml, b.ranked[i].stack_yaml);
    EXPECT_EQ(a.ranked[i].layout, b.ranked[i].layout);
    EXPECT_EQ(a.ranked[i].screen.step_mean_s, b.ranked[i].screen.step_mean_s);
  }
}

// Threads change when runs happen, never what the search finds: the same rows, times, counts and
// re-runs with one worker and with three.
TEST(Tune, ThreadsRankTheSameAsOneWorker) {
  const YAML::Node tree = YAML::Load(scenario_yaml(2, 4,
                                                   "{kind: switch, nic_bandwidth: "
                                                   "100Gb/s, nics_per_node: 1, latency: "
                                                   "2us}",
                                                   8));
  TuneOptions o = screening_only();
  o.rerun_engine = "flow";
  o.top = 4;
  o.jobs = 1;
  const TuneResult one = tune(tree, "t.yaml", {}, o);
  o.jobs = 3;
  const TuneResult three = tune(tree, "t.yaml", {}, o);
  ASSERT_TRUE(one.complete && three.complete);
  EXPECT_EQ(one.workers, 1);
  EXPECT_EQ(three.workers, 3);
  EXPECT_EQ(one.evaluated, three.evaluated);
  EXPECT_EQ(one.probes, three.probes);
  EXPECT_EQ(one.inapplicable, three.inapplicable);
  EXPECT_EQ(one.layouts_searched, three.layouts_searched);
  ASSERT_EQ(one.ranked.size(), 4u);
  ASSERT_EQ(one.ranked.size(), three.ranked.size());
  for (std::size_t i = 0; i < one.ranked.size(); ++i) {
    EXPECT_EQ(one.ranked[i].stack_yaml, three.ranked[i].stack_yaml);
    EXPECT_EQ(one.ranked[i].layout, three.ranked[i].layout);
    EXPECT_EQ(one.ranked[i].screen.step_mean_s, three.ranked[i].screen.step_mean_s);
    ASSERT_TRUE(one.ranked[i].rerun && three.ranked[i].rerun);
    EXPECT_EQ(one.ranked[i].rerun->step_mean_s, three.ranked[i].rerun->step_mean_s);
  }
}

// --state keeps every run: the same search again runs nothing new and ranks the same; a state
// file of another search (here another seed through --set) is refused with exit 2.
TEST(TuneCli, StateFileResumesAndRefusesAnotherSearch) {
  const fs::path d = temp_dir();
  const YAML::Node tree = YAML::Load(scenario_yaml(1, 4, kNoInter, 4));
  TuneOptions o = screening_only();
  o.rerun_engine = "flow";
  o.top = 3;
  o.state_path = (d / "state.json").string();
  const TuneResult first = tune(tree, "t.yaml", {}, o);
  ASSERT_TRUE(first.complete);
  EXPECT_EQ(first.resumed, 0);
  ASSERT_TRUE(fs::exists(o.state_path));
  const TuneResult again = tune(tree, "t.yaml", {}, o);
  // Every screening run, the probes, the reference and the re-runs come from the file.
  EXPECT_EQ(again.resumed, again.evaluated + again.probes + 2 + 3);
  ASSERT_EQ(again.ranked.size(), first.ranked.size());
  for (std::size_t i = 0; i < first.ranked.size(); ++i) {
    EXPECT_EQ(again.ranked[i].stack_yaml, first.ranked[i].stack_yaml);
    ASSERT_TRUE(again.ranked[i].rerun && first.ranked[i].rerun);
    EXPECT_EQ(again.ranked[i].rerun->step_mean_s, first.ranked[i].rerun->step_mean_s);
  }
  try {
    tune(tree, "t.yaml", {"workload.routing.seed=7"}, o);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("written by another search"));
  }
  fs::remove_all(d);
}

TEST(TuneCli, EmittedScenarioReproducesTheReportedTime) {
  const fs::path d = temp_dir();
  {
    std::ofstream(d / "s.yaml") << scenario_yaml(
        2, 4, "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}", 8);
  }
  const std::string s = (d / "s.yaml").string(), best = (d / "out" / "best.yaml").string();
  fs::create_directories(d / "out");
  const RunOutput t =
      run(fmt::format("tune '{}' --budget 120s --top 3 --engine flow -q --json "
                      "'{}' --emit '{}'",
                      s, (d / "t.json").string(), best));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  std::ifstream js(d / "t.json");
  const auto j = nlohmann::json::parse(js);
  ASSERT_FALSE(j["ranked"].empty());
  const auto& top = j["ranked"][0];
  ASSERT_TRUE(top.contains("rerun")) << j.dump(1);
  const double reported = top["rerun"]["step_time_s"].get<double>();
  // The emitted file validates and `simulate` on flow gives the tuned stack's reported time.
  const RunOutput v = run(fmt::format("validate '{}'", best));
  ASSERT_EQ(v.exit_code, 0) << v.out;
  const RunOutput sim = run(
      fmt::format("simulate '{}' --engine flow --json '{}' -q", best, (d / "sim.json").string()));
  ASSERT_EQ(sim.exit_code, 0) << sim.out;
  std::ifstream ss(d / "sim.json");
  const auto sj = nlohmann::json::parse(ss);
  double simulated = -1;
  for (const auto& run_j : sj["runs"])
    if (run_j["strategy"] == "tuned") simulated = run_j["step_time_s"].get<double>();
  ASSERT_GT(simulated, 0) << sj.dump(1).substr(0, 2000);
  EXPECT_NEAR(simulated, reported, 1e-9 * reported);
  fs::remove_all(d);
}

// Where the winner changes pp, micro-batches, ZeRO or recomputation, the emitted file carries them
// and reproduces the reported time.
TEST(TuneCli, EmittedMemoryLayoutReproducesTheReportedTime) {
  const fs::path d = temp_dir();
  const std::string inter =
      "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 2, latency: 2us}";
  YAML::Node tree = YAML::Load(scenario_yaml(2, 2, inter, 4));
  tree["model"]["layers"] = 4;
  TuneOptions own = screening_only();
  own.search_layouts = false;
  const double need = tune(tree, "t.yaml", {}, own).baseline_screen.memory_bytes;
  tree["cluster"]["gpu"] = YAML::Load(
      fmt::format("{{name: small, peak_tflops: 312TFLOPS, hbm_bandwidth: 2039GB/s, memory: {}KiB}}",
                  static_cast<long long>(0.7 * need / 1024)));
  {
    YAML::Emitter em;
    em << tree;
    std::ofstream(d / "s.yaml") << em.c_str() << "\n";
  }
  const std::string s = (d / "s.yaml").string(), best = (d / "best.yaml").string();
  const RunOutput t =
      run(fmt::format("tune '{}' --budget 120s --top 3 --engine analytical -q "
                      "--json '{}' --emit '{}'",
                      s, (d / "t.json").string(), best));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  std::ifstream js(d / "t.json");
  const auto j = nlohmann::json::parse(js);
  ASSERT_FALSE(j["ranked"].empty());
  const auto& top = j["ranked"][0];
  const auto& par = top["parallelism"];
  // The winner is not the scenario's settings: something that saves memory changed.
  EXPECT_TRUE(par["pp"].get<int>() > 1 || par["zero"].get<int>() == 1 ||
              top["micro_batches"].get<int>() > 1 || top["recompute"] != "none")
      << top.dump(1);
  const double reported = top["screen"]["step_time_s"].get<double>();
  const Scenario emitted = parse_scenario(YAML::LoadFile(best), best);
  EXPECT_EQ(emitted.parallelism.pp, par["pp"].get<int>());
  EXPECT_EQ(emitted.parallelism.zero, par["zero"].get<int>());
  EXPECT_EQ(emitted.model.micro_batches, top["micro_batches"].get<int>());
  EXPECT_EQ(name_of(emitted.model.recompute.granularity), top["recompute"].get<std::string>());
  const RunOutput sim = run(fmt::format("simulate '{}' --engine analytical --json '{}' -q", best,
                                        (d / "sim.json").string()));
  ASSERT_EQ(sim.exit_code, 0) << sim.out;
  std::ifstream ss(d / "sim.json");
  const auto sj = nlohmann::json::parse(ss);
  double simulated = -1;
  for (const auto& run_j : sj["runs"])
    if (run_j["strategy"] == "tuned") simulated = run_j["step_time_s"].get<double>();
  ASSERT_GT(simulated, 0);
  EXPECT_NEAR(simulated, reported, 1e-9 * reported);
  fs::remove_all(d);
}

// A model preset whose own layout does not fit the H100 (Mixtral 8x7B at EP 8 x DP 8, 150 GiB
// with Adam): tune finds layouts that fit, ranks them, and the emitted one simulates to the
// reported time. (bench/tune_bench.sh --rows presets runs every preset with a minute's budget.)
TEST(TuneCli, MixtralPresetFindsFittingLayoutsAndEmitsOne) {
  const fs::path d = temp_dir();
  const std::string preset = std::string(MOESIM_SOURCE_DIR) + "/scenarios/models/mixtral-8x7b.yaml";
  const std::string best = (d / "best.yaml").string(), js_path = (d / "t.json").string();
  const RunOutput t = run(
      fmt::format("tune '{}' --budget 20s --top 3 --engine analytical -q --json '{}' --emit '{}'",
                  preset, js_path, best));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("the scenario's own layout does not fit"));
  std::ifstream js(js_path);
  const auto j = nlohmann::json::parse(js);
  EXPECT_GT(j["space"]["layouts_fit_memory"].get<int>(), 0);
  ASSERT_FALSE(j["ranked"].empty());
  for (const auto& row : j["ranked"])
    EXPECT_LE(row["screen"]["memory_bytes"].get<double>(), 80.0 * (1 << 30)) << row.dump();
  const double reported = j["ranked"][0]["screen"]["step_time_s"].get<double>();
  const RunOutput sim =
      run(fmt::format("simulate '{}' --engine analytical --strategy tuned --json '{}' -q", best,
                      (d / "sim.json").string()));
  ASSERT_EQ(sim.exit_code, 0) << sim.out;
  std::ifstream ss(d / "sim.json");
  const auto sj = nlohmann::json::parse(ss);
  ASSERT_EQ(sj["runs"].size(), 1u);
  EXPECT_NEAR(sj["runs"][0]["step_time_s"].get<double>(), reported, 0.01 * reported);
  fs::remove_all(d);
}

// A budget spent before anything ran (here at once; on a slow machine, by the layout space and
// the baseline) still screens the first layout that fits, so tune always names one.
TEST(TuneCli, BudgetSpentAtOnceStillNamesALayoutThatFits) {
  const fs::path d = temp_dir();
  const std::string preset = std::string(MOESIM_SOURCE_DIR) + "/scenarios/models/mixtral-8x7b.yaml";
  const std::string js_path = (d / "t.json").string();
  const RunOutput t =
      run(fmt::format("tune '{}' --budget 1ms --engine analytical -q --json '{}' --emit '{}'",
                      preset, js_path, (d / "best.yaml").string()));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_THAT(t.out, ::testing::HasSubstr("fitting layouts were not screened"));
  std::ifstream js(js_path);
  const auto j = nlohmann::json::parse(js);
  ASSERT_EQ(j["ranked"].size(), 1u) << j["ranked"].dump(1);
  EXPECT_LE(j["ranked"][0]["screen"]["memory_bytes"].get<double>(), 80.0 * (1 << 30));
  EXPECT_FALSE(j["search"]["complete"].get<bool>());
  EXPECT_TRUE(fs::exists(d / "best.yaml"));
  fs::remove_all(d);
}

// `mpirun -np 2 moesim tune` spreads the runs over both ranks and ranks what one process ranks;
// rank 0 alone prints and writes; an input error is reported once and exits 2.
TEST(TuneCli, MpirunSpreadsRunsAndRanksTheSame) {
#ifndef MOESIM_MPIEXEC
  GTEST_SKIP() << "moesim built without MPI";
#else
  const fs::path d = temp_dir();
  {
    std::ofstream(d / "s.yaml") << scenario_yaml(
        2, 4, "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}", 8);
  }
  const std::string s = (d / "s.yaml").string();
  const RunOutput one =
      run(fmt::format("tune '{}' --budget 300s --top 3 --engine flow --jobs 1 -q --json '{}'", s,
                      (d / "one.json").string()));
  ASSERT_EQ(one.exit_code, 0) << one.out;
  // detect_leaks=0: OpenMPI's components leave allocations behind at MPI_Finalize (see the
  // sweep's mpirun test); the search's own leaks are covered by the single-process runs.
  const std::string mpirun = fmt::format(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMPI_MCA_rmaps_base_oversubscribe=1 ASAN_OPTIONS=detect_leaks=0 "
      "{} -np 2 --oversubscribe",
      MOESIM_MPIEXEC);
  auto under_mpirun = [&](const std::string& args) { return run(args, mpirun); };
  const RunOutput two =
      under_mpirun(fmt::format("tune '{}' --budget 300s --top 3 --engine flow --jobs 1 --json '{}'",
                               s, (d / "two.json").string()));
  ASSERT_EQ(two.exit_code, 0) << two.out;
  std::size_t tables = 0;
  for (std::size_t at = 0; (at = two.out.find("# moesim tune ", at)) != std::string::npos; ++at)
    ++tables;
  EXPECT_EQ(tables, 1u) << two.out;  // rank 0 alone prints
  EXPECT_THAT(two.out, ::testing::HasSubstr("on 2 worker(s)"));
  std::ifstream ja(d / "one.json"), jb(d / "two.json");
  const auto a = nlohmann::json::parse(ja), b = nlohmann::json::parse(jb);
  ASSERT_EQ(a["ranked"].size(), 3u);
  ASSERT_EQ(a["ranked"].size(), b["ranked"].size());
  for (std::size_t i = 0; i < a["ranked"].size(); ++i) {
    EXPECT_EQ(a["ranked"][i]["stack"], b["ranked"][i]["stack"]);
    EXPECT_EQ(a["ranked"][i]["parallelism"], b["ranked"][i]["parallelism"]);
    EXPECT_EQ(a["ranked"][i]["screen"], b["ranked"][i]["screen"]);
    EXPECT_EQ(a["ranked"][i]["rerun"], b["ranked"][i]["rerun"]);
  }
  EXPECT_EQ(a["space"], b["space"]);
  EXPECT_EQ(b["search"]["workers"], 2);
  // Both ranks ran their share of the spread runs (every other one).
  const auto spread = b["search"]["spread_runs_per_rank"].get<std::vector<int> >();
  ASSERT_EQ(spread.size(), 2u);
  EXPECT_GT(spread[0], 0);
  EXPECT_GT(spread[1], 0);
  EXPECT_LE(std::abs(spread[0] - spread[1]), spread[0] / 2 + 2) << b["search"].dump();

  const RunOutput bad = under_mpirun(fmt::format("tune '{}' --set model.hiden_dim=8 -q", s));
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  std::size_t errors = 0;
  for (std::size_t at = 0; (at = bad.out.find("moesim: error:", at)) != std::string::npos; ++at)
    ++errors;
  EXPECT_EQ(errors, 1u) << bad.out;
  EXPECT_THAT(bad.out, ::testing::HasSubstr("hiden_dim"));
  fs::remove_all(d);
#endif
}

// --report: one self-contained page with the ranked candidates (bars and a row each, the
// reference first) and every layout of the space.
TEST(TuneCli, ReportShowsTheRankedCandidatesAndEveryLayout) {
  const fs::path d = temp_dir();
  {
    std::ofstream(d / "s.yaml") << scenario_yaml(
        2, 4, "{kind: switch, nic_bandwidth: 100Gb/s, nics_per_node: 1, latency: 2us}", 8);
  }
  const RunOutput t =
      run(fmt::format("tune '{}' --budget 300s --top 3 --engine flow -q --json '{}' --report '{}'",
                      (d / "s.yaml").string(), (d / "t.json").string(), (d / "r.html").string()));
  ASSERT_EQ(t.exit_code, 0) << t.out;
  std::ifstream js(d / "t.json");
  const auto j = nlohmann::json::parse(js);
  std::ifstream hs(d / "r.html");
  std::stringstream ss;
  ss << hs.rdbuf();
  const std::string html = ss.str();
  auto count = [&](const std::string& what, std::size_t from = 0,
                   std::size_t to = std::string::npos) {
    std::size_t n = 0;
    for (std::size_t at = html.find(what, from); at < to; at = html.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count("<script"), 0u);  // self-contained, nothing to run or fetch
  EXPECT_EQ(count("http://", 0), count("http://www.w3.org/2000/svg"));
  // The bars: the reference and the 3 candidates.
  EXPECT_EQ(count("<rect "), 4u);
  // The ranked table: a head row, the reference, the 3 candidates in the JSON's order.
  const std::size_t ranked = html.find("<table id=\"ranked\">");
  ASSERT_NE(ranked, std::string::npos);
  const std::size_t ranked_end = html.find("</table>", ranked);
  EXPECT_EQ(count("<tr>", ranked, ranked_end), 5u);
  std::size_t at = ranked;
  for (const auto& row : j["ranked"]) {
    std::string stack = row["stack"].get<std::string>();
    // html_escape leaves braces, colons and commas alone; the stacks have no quotes.
    const std::size_t pos = html.find(stack, at);
    ASSERT_NE(pos, std::string::npos) << stack;
    EXPECT_LT(pos, ranked_end);
    at = pos;
  }
  // Every layout of the space has a row (and a head row).
  const std::size_t layouts = html.find("<table id=\"layouts\">");
  ASSERT_NE(layouts, std::string::npos);
  EXPECT_EQ(count("<tr>", layouts, html.find("</table>", layouts)),
            j["space"]["layouts"].get<std::size_t>() + 1);
  EXPECT_EQ(count("(the scenario's)", layouts), 1u);
  fs::remove_all(d);
}

// A serving deployment: tune searches its pool shapes for the scenario's SLO. serving-mixtral-h100
// is one co-located pool over 2 nodes x 8 GPUs: shapes by hand, 1 node x 2 instances with ep 8,
// 4, 2, 1 and 2 nodes x 1 with ep 16, 8, 4, 2; ep 16 does not divide the 8 experts and ep 1
// leaves no memory for the KV cache: 6 run, each with both strategies, 12 rows.
TEST(TuneCli, ServingDeploymentRanksPoolShapesForItsSlo) {
  const fs::path d = temp_dir();
  const std::string scen =
      "'" + (fs::path(MOESIM_SOURCE_DIR) / "scenarios/serving-mixtral-h100.yaml").string() + "'";
  const std::string small = " --set engine.network=analytical --set serving.requests.count=300";
  auto r = run("tune " + scen + small + " -q --jobs 2 --budget 600s --json '" +
               (d / "t.json").string() + "' --emit '" + (d / "best.yaml").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("6 of 8 shapes run, 2 refused"));
  EXPECT_THAT(r.out, ::testing::HasSubstr("# best: "));
  std::ifstream jf(d / "t.json");
  const auto j = nlohmann::json::parse(jf);
  EXPECT_TRUE(j["met"].get<bool>());
  EXPECT_EQ(j["shapes"], 8);
  EXPECT_EQ(j["run"], 6);
  EXPECT_EQ(j["refused"], 2);
  const auto& ranked = j["ranked"];
  ASSERT_EQ(ranked.size(), 12u);
  int own = 0;
  for (std::size_t i = 0; i < ranked.size(); ++i) {
    own += ranked[i]["changes"] == 0;
    EXPECT_EQ(ranked[i]["nodes"], 2);
    // Shapes meeting the SLO first, by goodput per node.
    if (i > 0 && ranked[i]["meets"] == ranked[i - 1]["meets"] && ranked[i]["meets"]) {
      EXPECT_LE(ranked[i]["goodput_per_node"].get<double>(),
                ranked[i - 1]["goodput_per_node"].get<double>());
    }
  }
  EXPECT_EQ(own, 2);  // the scenario's own shape, once per strategy
  // The emitted deployment serves the requests as the search measured them.
  const std::string best = ranked[0]["strategy"];
  r = run("simulate '" + (d / "best.yaml").string() + "' --engine analytical -q --json '" +
          (d / "s.json").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream sf(d / "s.json");
  const auto s = nlohmann::json::parse(sf);
  bool found = false;
  for (const auto& run_j : s["serving"]) {
    if (run_j["strategy"] != best) continue;
    found = true;
    EXPECT_DOUBLE_EQ(run_j["tpot_s"]["p50"].get<double>(), ranked[0]["tpot_p50_s"].get<double>());
  }
  EXPECT_TRUE(found) << best;

  // An SLO no shape meets is an outcome: exit 0, the closest named, nothing emitted.
  r = run("tune " + scen + small + " --set serving.slo.tpot=1us -q --json '" +
          (d / "u.json").string() + "' --emit '" + (d / "none.yaml").string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("# no shape meets the SLO (90% of requests within"));
  EXPECT_FALSE(fs::exists(d / "none.yaml"));
  std::ifstream uf(d / "u.json");
  EXPECT_FALSE(nlohmann::json::parse(uf)["met"].get<bool>());

  // Bad input: no SLO to meet, training-only flags, an attainment outside (0, 1].
  const std::string v12 =
      "'" + (fs::path(MOESIM_SOURCE_DIR) / "scenarios/deepseek-v3-serving-h800.yaml").string() +
      "'";
  r = run("tune " + v12 + " -q");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("serving.slo: found none"));
  r = run("tune " + scen + " --keep-layout -q");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("--keep-layout: not for a serving deployment"));
  r = run("tune " + scen + " --attainment 0 -q");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("--attainment"));
  r = run("tune '" + (fs::path(MOESIM_SOURCE_DIR) / "scenarios/quickstart.yaml").string() +
          "' --attainment 0.5 -q");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_THAT(r.out, ::testing::HasSubstr("--attainment: for a serving deployment only"));
  fs::remove_all(d);
}

TEST(TuneCli, BadFlagsExitTwoAndWriteNothing) {
  const fs::path d = temp_dir();
  const std::string q =
      "'" + (fs::path(MOESIM_SOURCE_DIR) / "scenarios/quickstart.yaml").string() + "'";
  auto e = run("tune " + q + " --engine warp -q");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_THAT(e.out, ::testing::HasSubstr("--engine: found 'warp', expected auto, analytical"));
  e = run("tune " + q + " --budget 10GB -q");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_THAT(e.out, ::testing::HasSubstr("--budget"));
  e = run("tune " + q + " --top 0 -q");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  e = run("tune " + q + " -q --emit '" + (d / "nope" / "x.yaml").string() + "'");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_THAT(e.out, ::testing::HasSubstr("--emit"));
  e = run("tune " + q + " -q --report '" + (d / "nope" / "r.html").string() + "'");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_THAT(e.out, ::testing::HasSubstr("--report"));
  e = run("tune " + q + " -q --jobs -1");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_THAT(e.out, ::testing::HasSubstr("--jobs"));
  EXPECT_FALSE(fs::exists(d / "nope"));
  fs::remove_all(d);
}

}  // namespace
}  // namespace moesim::app
