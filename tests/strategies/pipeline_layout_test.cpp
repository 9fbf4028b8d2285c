// parallelism.pipeline_layout (Megatron-LM's --pipeline-model-parallel-layout): the strings
// Megatron-Bridge runs DeepSeek-V3 with, the integer list, every refusal, the blocks each piece
// of the stitched plan runs, pieces that hold only the embedding or the LM head, the memory of
// uneven stages and chunks, and that a layout equal to the even split changes nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/memory.hpp"
#include "strategies/stage_schedule.hpp"
#include "strategy_test_util.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {
namespace {

struct Cfg {
  int nodes = 2, gpn = 1;
  int layers = 6, pp = 2, micro_batches = 4;
  int ep = 1;
  int vocab = 0;
  int mtp = 0;                 // model.mtp_layers
  std::string parallel_extra;  // more `parallelism:` keys, e.g. ", vp: 2"
};

Scenario make_scenario(const Cfg& c) {
  return parse_scenario_string(fmt::format(R"(
name: layout-test
cluster:
  gpu: a100-sxm-80gb
  nodes: {}
  gpus_per_node: {}
  intra_node: {{kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
  inter_node: {{kind: switch, nic_bandwidth: 200Gb/s, nics_per_node: {}, latency: 2us}}
model:
  mode: training
  layers: {}
  batch_per_gpu: 2
  seq_len: 256
  model_dim: 256
  hidden_dim: 512
  vocab_size: {}
  mtp_layers: {}
  experts_per_gpu: 1
  top_k: 1
  capacity_factor: 1.0
  micro_batches: {}
  dtype: fp16
parallelism: {{pp: {}, ep: {}, dp: auto{}}}
strategies:
  - {{name: baseline}}
)",
                                           c.nodes, c.gpn, c.gpn, c.layers, c.vocab, c.mtp,
                                           c.micro_batches, c.pp, c.ep, c.parallel_extra),
                               "layout.yaml");
}

std::string error_of(const Cfg& c) {
  try {
    make_scenario(c);
  } catch (const InputError& e) {
    return e.what();
  }
  return "accepted";
}

std::vector<int> blocks_per_piece(const Scenario& sc) {
  std::vector<int> out;
  for (int k = 0; k < model_pieces(sc); ++k) {
    const auto [first, end] = piece_blocks(sc, k);
    out.push_back(end - first);
  }
  return out;
}

std::vector<int> repeat(int value, int times) { return std::vector<int>(times, value); }

std::vector<int> concat(std::vector<int> a, const std::vector<int>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Built {
  Scenario sc;
  std::unique_ptr<topology::Topology> topo;
  BuiltPlan bp;
};

Built build(const Cfg& c) {
  Built b{make_scenario(c), nullptr, BuiltPlan{Plan(0), PlanIndex{}}};
  b.topo = topology::build_topology(b.sc.cluster);
  const Scenario stage = b.sc.stage_scenario();
  b.bp = build_step_plan(b.sc, *b.topo,
                         testing::uniform_work(stage, stage.tokens_per_gpu() * stage.model.top_k /
                                                          stage.num_experts()),
                         Decision{});
  return b;
}

double makespan(const Built& b) {
  sim::EngineConfig cfg;
  cfg.network = sim::NetworkKind::kAnalytical;
  cfg.precision = b.sc.model.dtype;
  return sim::run_plan(b.bp.plan, *b.topo, cfg).makespan_s;
}

// Megatron-Bridge's DeepSeek-V3 layouts (61 blocks): PP 4 x VP 4 and PP 8 x VP 4.
TEST(PipelineLayoutLoader, MegatronBridgeDeepSeekV3Strings) {
  Cfg c;
  c.nodes = 16;
  c.layers = 61;
  c.pp = 4;
  c.vocab = 1000;
  c.micro_batches = 8;
  c.parallel_extra = ", vp: 4, pipeline_layout: 'Et*4|(t*4|)*14tL'";
  const Scenario a = make_scenario(c);
  EXPECT_EQ(a.parallelism.schedule, PipelineSchedule::kInterleaved);
  EXPECT_EQ(a.parallelism.pipeline_layout, concat(repeat(4, 15), {1}));
  EXPECT_EQ(blocks_per_piece(a), a.parallelism.pipeline_layout);
  EXPECT_EQ(piece_blocks(a, 1), std::make_pair(4, 8));
  EXPECT_EQ(piece_blocks(a, 15), std::make_pair(60, 61));
  // Neither 61 % 4 nor the old per-stage rule holds: the layout places the blocks itself.
  EXPECT_TRUE(schedule_applies(a));

  c.pp = 8;
  c.parallel_extra = ", vp: 4, pipeline_layout: 'Et|(tt|)*30mL'";
  const std::string mtp = error_of(c);
  EXPECT_NE(mtp.find("parallelism.pipeline_layout: found 'Et|(tt|)*30mL' with 1 m, expected "
                     "model.mtp_layers = 0 of them"),
            std::string::npos)
      << mtp;
  // With the MTP module (DeepSeek-V3's depth 1) the last piece holds it and the LM head; written
  // without the m it is the same layout.
  c.mtp = 1;
  const Scenario b = make_scenario(c);
  EXPECT_EQ(b.parallelism.pipeline_layout, concat(concat({1}, repeat(2, 30)), {0}));
  EXPECT_EQ(piece_blocks(b, 31), std::make_pair(61, 61));
  c.parallel_extra = ", vp: 4, pipeline_layout: 'Et|(tt|)*30L'";
  EXPECT_EQ(make_scenario(c).parallelism.pipeline_layout, b.parallelism.pipeline_layout);
}

// Nested groups, whitespace, a group ending in '|' and a trailing symbol after the last group.
TEST(PipelineLayoutLoader, NestedGroupsAndWhitespace) {
  Cfg c;
  c.nodes = 8;
  c.pp = 8;
  c.layers = 13;
  c.vocab = 1000;
  c.micro_batches = 8;
  c.parallel_extra = ", pipeline_layout: 'E (t | (t*2 |)*2)*2 t*2 | t L'";
  const Scenario sc = make_scenario(c);
  EXPECT_EQ(sc.parallelism.pipeline_layout, (std::vector<int>{1, 2, 2, 1, 2, 2, 2, 1}));
  // 1f1b: Scenario::stage_blocks follows the layout.
  EXPECT_EQ(sc.stage_blocks(0), std::make_pair(0, 1));
  EXPECT_EQ(sc.stage_blocks(3), std::make_pair(5, 6));
  EXPECT_EQ(sc.stage_blocks(7), std::make_pair(12, 13));
  // The stage scenario is one stage: no layout.
  EXPECT_TRUE(sc.stage_scenario().parallelism.pipeline_layout.empty());
}

TEST(PipelineLayoutLoader, IntegerListUnderEverySchedule) {
  Cfg c;
  c.parallel_extra = ", pipeline_layout: [5, 1]";
  const Scenario one = make_scenario(c);
  EXPECT_EQ(one.stage_blocks(0), std::make_pair(0, 5));
  EXPECT_EQ(one.stage_blocks(1), std::make_pair(5, 6));
  c.parallel_extra = ", schedule: dualpipe, pipeline_layout: [4, 2]";
  const Scenario dual = make_scenario(c);
  EXPECT_EQ(blocks_per_piece(dual), (std::vector<int>{4, 2}));
  c.parallel_extra = ", vp: 2, pipeline_layout: [2, 1, 1, 2]";
  const Scenario inter = make_scenario(c);
  EXPECT_EQ(blocks_per_piece(inter), (std::vector<int>{2, 1, 1, 2}));
  EXPECT_EQ(piece_blocks(inter, 2), std::make_pair(3, 4));
  // 10 blocks on 4 stages of 2 chunks: the even split refuses vp 2 (10 % 4 != 0), a layout not.
  c.nodes = 4;
  c.pp = 4;
  c.layers = 10;
  c.micro_batches = 8;
  c.parallel_extra = ", vp: 2";
  EXPECT_NE(error_of(c).find("only vp = 1 fits"), std::string::npos) << error_of(c);
  c.parallel_extra = ", vp: 2, pipeline_layout: [2, 1, 1, 1, 1, 1, 1, 2]";
  EXPECT_EQ(make_scenario(c).parallelism.pipeline_layout.size(), 8u);
  // Megatron's interleaved order still needs m a multiple of pp.
  c.micro_batches = 6;
  EXPECT_NE(error_of(c).find("model.micro_batches: found 6"), std::string::npos) << error_of(c);
}

// Every refusal is at the key (file:line), says what was found and what was expected.
TEST(PipelineLayoutLoader, RefusalsNameTheKeyAndWhatWasExpected) {
  struct Case {
    std::string extra;
    int vocab;
    std::string expect;
  };
  const std::string key = "parallelism.pipeline_layout: ";
  const std::vector<Case> cases = {
      {", pipeline_layout: 't*2|t*2|t*2'", 0,
       key + "found 3 pieces, expected 2 (schedule 1f1b runs one piece on each of the pp = 2 "
             "stages)"},
      {", vp: 2, pipeline_layout: [3, 3]", 0,
       key + "found 2 pieces, expected 4 (the interleaved schedule runs pp * vp = 2 * 2 "
             "pieces, vp on each stage)"},
      {", schedule: dualpipe, pipeline_layout: [2, 2, 2]", 0,
       key + "found 3 pieces, expected 2 (dualpipe runs pp = 2 pieces: stage s holds piece s and "
             "pp - 1 - s)"},
      {", pipeline_layout: 'Et*3|t*2L'", 1000,
       key + "found 5 blocks (t) in the pieces, expected model.layers = 6"},
      {", pipeline_layout: [3, 4]", 0,
       key + "found 7 blocks (t) in the pieces, expected model.layers = 6"},
      {", pipeline_layout: 't*3|Et*3'", 1000,
       key + "found 't*3|Et*3', E at character 5 (piece 1), expected E only at the start of the "
             "first piece"},
      {", pipeline_layout: 'tEt*2|t*3'", 1000, "E at character 2 (piece 0)"},
      {", pipeline_layout: 't*3L|t*3'", 1000,
       key + "found 't*3L|t*3', L at character 4 (piece 0), expected L only at the end of the "
             "last piece"},
      {", pipeline_layout: 't*3|t*3mL'", 1000,
       key + "found 't*3|t*3mL' with 1 m, expected model.mtp_layers = 0 of them"},
      {", pipeline_layout: 't*3m|t*3L'", 1000,
       key + "found 't*3m|t*3L', m at character 4 (piece 0), expected m only at the end of the "
             "last piece, before its L"},
      {", pipeline_layout: 't*3|tmt*2L'", 1000, "m at character 6 (piece 1)"},
      {", pipeline_layout: 't*3|t*3x'", 0, "at character 8: unknown symbol 'x'"},
      {", pipeline_layout: '(t*3|t*3'", 0, "at character 1: '(' without a matching ')'"},
      {", pipeline_layout: 't*3)|t*3'", 0, "at character 4: ')' without a matching '('"},
      {", pipeline_layout: 't*|t*3'", 0, "at character 2: '*' without a count after it"},
      {", pipeline_layout: 't*0|t*6'", 0, "at character 3: a count of 0"},
      {", pipeline_layout: '*3t|t*3'", 0, "at character 1: '*' with nothing before it to repeat"},
      {", pipeline_layout: 't3|t*3'", 0, "at character 2: a count '3' without a '*' before it"},
      {", pipeline_layout: '(t*1000)*1000000'", 0, "expands the layout past 262144 symbols"},
      // A piece without blocks: refused in the middle, and at the ends without a vocabulary.
      {", pipeline_layout: [6, 0]", 0,
       key + "found piece 1 of 2 without blocks, expected each piece to hold at least one t"},
      {", vp: 2, pipeline_layout: [3, 0, 1, 2]", 1000, key + "found piece 1 of 4 without blocks"},
      {", pipeline_layout: [3, -1, 4]", 0,
       "parallelism.pipeline_layout[1]: found -1, expected an integer in [0, 65536]"},
      {", pipeline_layout: [3, 3.5]", 0, "parallelism.pipeline_layout[1]: found '3.5'"},
      {", pipeline_layout: []", 0, key + "found an empty list, expected 2 integers"},
      {", pipeline_layout: {a: 1}", 0,
       key + "found a map, expected Megatron's layout string (e.g. 'Et*4|(t*4|)*14tL') or a list "
             "of blocks per piece"},
  };
  for (const Case& k : cases) {
    Cfg c;
    c.vocab = k.vocab;
    c.parallel_extra = k.extra;
    const std::string e = error_of(c);
    EXPECT_EQ(e.rfind("layout.yaml:", 0), 0u) << k.extra << ": " << e;  // file:line:col first
    EXPECT_NE(e.find("parallelism.pipeline_layout"), std::string::npos) << k.extra << ": " << e;
    EXPECT_NE(e.find(k.expect), std::string::npos) << k.extra << ": " << e;
  }
}

// The block of an op labelled "[mb{i}.]L{block}.{fwd|bwd|grad}.<name>", or -1. Parsed by hand:
// GCC 12's <regex> fails -Werror=maybe-uninitialized in the sanitizer build.
int block_of(const std::string& label) {
  for (std::size_t at = 0; at < label.size(); at = label.find('.', at) + 1) {
    if (label[at] == 'L') {
      std::size_t end = at + 1;
      while (end < label.size() && std::isdigit(static_cast<unsigned char>(label[end]))) ++end;
      if (end > at + 1) {
        const std::string rest = label.substr(end);
        if (rest.rfind(".fwd.", 0) == 0 || rest.rfind(".bwd.", 0) == 0 ||
            rest.rfind(".grad.", 0) == 0)
          return std::stoi(label.substr(at + 1, end - at - 1));
      }
    }
    if (label.find('.', at) == std::string::npos) break;
  }
  return -1;
}

// The blocks of every op of the stitched plan (labels L{block}.fwd / .bwd) by rank-stage.
std::map<int, std::set<int>> blocks_by_stage(const Built& b) {
  std::map<int, std::set<int>> out;
  for (const Op& op : b.bp.plan.ops()) {
    const int block = block_of(op.label);
    if (block < 0) continue;
    const int stage = op.ranks.at(0) / b.sc.stage_gpus();
    out[stage].insert(block);
    // Every op of a block lies on one stage.
    for (int i = 0; i < op.ranks.size(); ++i)
      EXPECT_EQ(op.ranks.at(i) / b.sc.stage_gpus(), stage) << op.label;
  }
  return out;
}

int count_label(const Built& b, const std::string& part) {
  int n = 0;
  for (const Op& op : b.bp.plan.ops()) n += op.label.find(part) != std::string::npos ? 1 : 0;
  return n;
}

// 6 blocks, pp 2 x vp 2, layout [2, 1, 1, 2]: stage 0 runs pieces 0 (blocks 0, 1) and 2 (block
// 3), stage 1 pieces 1 (block 2) and 3 (blocks 4, 5); each piece's ops per micro-batch are those
// of its one-stage plan.
TEST(PipelineLayoutPlan, EveryPieceRunsItsOwnBlocksOnItsStage) {
  Cfg c;
  c.gpn = 2;
  c.ep = 2;
  c.micro_batches = 2;
  c.parallel_extra = ", vp: 2, pipeline_layout: [2, 1, 1, 2]";
  const Built b = build(c);
  EXPECT_NO_THROW(b.bp.plan.validate());
  const auto by_stage = blocks_by_stage(b);
  ASSERT_EQ(by_stage.size(), 2u);
  EXPECT_EQ(by_stage.at(0), (std::set<int>{0, 1, 3}));
  EXPECT_EQ(by_stage.at(1), (std::set<int>{2, 4, 5}));
  const Scenario stage = b.sc.stage_scenario();
  const auto work = testing::uniform_work(
      stage, stage.tokens_per_gpu() * stage.model.top_k / stage.num_experts());
  const std::vector<std::pair<int, int>> pieces = {{0, 2}, {2, 3}, {3, 4}, {4, 6}};
  for (int k = 0; k < 4; ++k) {
    const StagePlan one =
        build_stage_plan(stage, *b.topo, work, Decision{},
                         StagePart{pieces[k].first, pieces[k].second, k == 0, k == 3});
    for (int l = pieces[k].first; l < pieces[k].second; ++l) {
      int in_one = 0;
      for (const Op& op : one.built.plan.ops())
        in_one += op.label.rfind(fmt::format("L{}.fwd.", l), 0) == 0 ? 1 : 0;
      ASSERT_GT(in_one, 0);
      for (int i = 0; i < 2; ++i)
        EXPECT_EQ(count_label(b, fmt::format("mb{}.L{}.fwd.", i, l)), in_one)
            << "block " << l << " micro-batch " << i;
    }
  }
  // Sends: piece 0 -> 1 (stage 0 to 1), 1 -> 2 (the wrap, stage 1 to 0), 2 -> 3, per micro-batch.
  EXPECT_EQ(count_label(b, "pp.act.s0_s1.p0"), 2);
  EXPECT_EQ(count_label(b, "pp.act.s1_s0.p1"), 2);
  EXPECT_EQ(count_label(b, "pp.act.s0_s1.p2"), 2);
  EXPECT_EQ(count_label(b, "pp.act."), 6);
  EXPECT_EQ(count_label(b, "pp.grad."), 6);
  EXPECT_EQ(b.bp.index.moe_layers.size(), 6u * 2u);
  EXPECT_GT(makespan(b), 0);
}

// A layout equal to the even split is the even split: the same plan, step and memory.
TEST(PipelineLayoutPlan, TheEvenSplitWrittenOutChangesNothing) {
  for (const std::string& schedule : {std::string(""), std::string(", vp: 2")}) {
    Cfg c;
    c.gpn = 2;
    c.ep = 2;
    c.layers = 8;
    c.micro_batches = 2;
    c.parallel_extra = schedule;
    const Built plain = build(c);
    c.parallel_extra = schedule + (schedule.empty() ? ", pipeline_layout: [4, 4]"
                                                    : ", pipeline_layout: 't*2|t*2|t*2|t*2'");
    const Built layout = build(c);
    ASSERT_FALSE(layout.sc.parallelism.pipeline_layout.empty());
    ASSERT_EQ(plain.bp.plan.ops().size(), layout.bp.plan.ops().size()) << schedule;
    for (std::size_t i = 0; i < plain.bp.plan.ops().size(); ++i) {
      EXPECT_EQ(plain.bp.plan.ops()[i].label, layout.bp.plan.ops()[i].label);
      EXPECT_EQ(plain.bp.plan.ops()[i].deps, layout.bp.plan.ops()[i].deps);
    }
    EXPECT_EQ(makespan(plain), makespan(layout)) << schedule;
    EXPECT_EQ(estimate_memory(plain.sc, Decision{}, 512).total_bytes(),
              estimate_memory(layout.sc, Decision{}, 512).total_bytes())
        << schedule;
  }
}

// The first piece may hold the embedding alone and the last the LM head alone: each still runs
// ops, so every micro-batch's activation and gradient pass through it.
TEST(PipelineLayoutPlan, PiecesHoldingOnlyTheEmbeddingOrTheHeadRunAndPassOn) {
  struct Case {
    std::string extra;
    int pieces;
  };
  for (const Case& k :
       {Case{", pipeline_layout: 'E|t*6L'", 2}, Case{", pipeline_layout: 'Et*6|L'", 2},
        Case{", vp: 2, pipeline_layout: [0, 2, 2, 2]", 4},
        Case{", vp: 2, pipeline_layout: [2, 2, 2, 0]", 4}}) {
    Cfg c;
    c.gpn = 2;
    c.ep = 2;
    c.vocab = 1000;
    c.micro_batches = 2;
    c.parallel_extra = k.extra;
    const Built b = build(c);
    EXPECT_NO_THROW(b.bp.plan.validate()) << k.extra;
    EXPECT_EQ(count_label(b, "pp.act."), (k.pieces - 1) * 2) << k.extra;
    EXPECT_EQ(count_label(b, "pp.grad."), (k.pieces - 1) * 2) << k.extra;
    EXPECT_EQ(count_label(b, "mb0.embed.fwd"), 1) << k.extra;
    EXPECT_EQ(count_label(b, "mb0.lm_head.fwd"), 1) << k.extra;
    EXPECT_EQ(b.bp.index.moe_layers.size(), 6u * 2u) << k.extra;
    EXPECT_GT(makespan(b), 0) << k.extra;
  }
  // 'Et*6|L': the head's forward waits for the activation sent from stage 0.
  Cfg c;
  c.gpn = 2;
  c.ep = 2;
  c.vocab = 1000;
  c.micro_batches = 2;
  c.parallel_extra = ", pipeline_layout: 'Et*6|L'";
  const Built b = build(c);
  std::map<std::string, OpId> id;
  for (const Op& op : b.bp.plan.ops()) id.emplace(op.label, op.id);
  for (int i = 0; i < 2; ++i) {
    const Op& head = b.bp.plan.op(id.at(fmt::format("mb{}.lm_head.fwd", i)));
    const OpId send = id.at(fmt::format("mb{}.pp.act.s0_s1", i));
    EXPECT_NE(std::find(head.deps.begin(), head.deps.end(), send), head.deps.end()) << i;
    EXPECT_EQ(head.ranks.at(0) / b.sc.stage_gpus(), 1);
  }
}

// DeepSeek-V3's multi-token prediction (model.mtp_layers 1): the module's block (index
// `layers`) runs on the stage with the LM head, after it, with its own MoE layer, projection,
// head pass and embedding copy; the other stage is unchanged.
TEST(PipelineLayoutPlan, MtpModuleRunsWithTheHeadOnTheLastStage) {
  Cfg c;
  c.gpn = 2;
  c.ep = 2;
  c.vocab = 1000;
  c.micro_batches = 2;
  const Built plain = build(c);
  c.mtp = 1;
  const Built b = build(c);
  EXPECT_NO_THROW(b.bp.plan.validate());
  const auto by_stage = blocks_by_stage(b);
  EXPECT_EQ(by_stage.at(0), (std::set<int>{0, 1, 2}));
  EXPECT_EQ(by_stage.at(1), (std::set<int>{3, 4, 5, 6}));
  // Seven MoE layers per micro-batch, the seventh the module's.
  EXPECT_EQ(b.bp.index.moe_layers.size(), 7u * 2u);
  std::map<std::string, const Op*> op;
  for (const Op& o : b.bp.plan.ops()) op.emplace(o.label, &o);
  for (int i = 0; i < 2; ++i) {
    const std::string mb = fmt::format("mb{}.", i);
    for (const char* name :
         {"L6.mtp.embed.fwd", "L6.fwd.mtp.norms", "L6.fwd.mtp.proj", "L6.mtp.lm_head.fwd",
          "L6.mtp.loss.fwd", "L6.mtp.lm_head.bwd", "L6.bwd.mtp.proj", "L6.mtp.embed.bwd"}) {
      ASSERT_TRUE(op.count(mb + name)) << mb + name;
      EXPECT_EQ(op.at(mb + name)->ranks.at(0) / b.sc.stage_gpus(), 1) << mb + name;
    }
    // The projection S x 2M . 2M x M: 2 * 512 * 512 * 256 FLOPs (S = 2 x 256, M = 256); its
    // backward twice that; the head pass S x M . M x V as the main head's.
    EXPECT_DOUBLE_EQ(op.at(mb + "L6.fwd.mtp.proj")->compute().flops.value(), 134217728.0);
    EXPECT_DOUBLE_EQ(op.at(mb + "L6.bwd.mtp.proj")->compute().flops.value(), 2 * 134217728.0);
    EXPECT_DOUBLE_EQ(op.at(mb + "L6.mtp.lm_head.fwd")->compute().flops.value(),
                     op.at(mb + "lm_head.fwd")->compute().flops.value());
    // Forward: the module after the main head; backward: before the main head's.
    const Op& mtp_embed = *op.at(mb + "L6.mtp.embed.fwd");
    EXPECT_GT(mtp_embed.id, op.at(mb + "loss.fwd")->id);
    EXPECT_LT(op.at(mb + "L6.mtp.embed.bwd")->id, op.at(mb + "lm_head.bwd")->id);
  }
  // Stage 1 lacks the embedding: its copy's gradient is all-reduced over the stage's DP group
  // (one per step, like the head's).
  EXPECT_EQ(count_label(b, "mtp.embed.grad.allreduce"), 1);
  EXPECT_EQ(count_label(plain, "mtp."), 0);
  EXPECT_GT(makespan(b), makespan(plain));
}

// An MTP module holds what one more block holds, plus its projection and norms (pp = 1: the
// embedding is the stage's own, no copy); its logits are kept like the main head's.
TEST(PipelineLayoutMemory, MtpModuleHoldsABlockAProjectionAndAHeadsActivations) {
  Cfg c;
  c.nodes = 1;
  c.gpn = 2;
  c.ep = 2;
  c.pp = 1;
  c.vocab = 1000;
  c.micro_batches = 1;
  c.mtp = 1;
  const MemoryEstimate mtp = estimate_memory(make_scenario(c), Decision{}, 512);
  c.mtp = 0;
  c.layers = 7;
  const MemoryEstimate seven = estimate_memory(make_scenario(c), Decision{}, 512);
  EXPECT_DOUBLE_EQ(mtp.expert_params, seven.expert_params);
  EXPECT_DOUBLE_EQ(mtp.dense_params - seven.dense_params, 2.0 * 256 * 256 + 2 * 256);
  // One more head pass: the head's input and its S x V logits, and the 4 S M of the module's
  // norms and projection input (S = 512, M = 256, V = 1000, fp16).
  EXPECT_DOUBLE_EQ(mtp.activations_bytes - seven.activations_bytes,
                   (2.0 * 512 * 256 + 512 * 1000.0) * 2 + 4.0 * 512 * 256 * 2);
}

// 1F1B, 8 blocks on 2 stages (m 4: stage 0 keeps 2 micro-batches, stage 1 one): [5, 3] gives
// stage 0 5/4 of the even split's parameters and 2 x 5 blocks of activations against 2 x 4.
TEST(PipelineLayoutMemory, AStageWithMoreBlocksHoldsProportionallyMore) {
  Cfg c;
  c.layers = 8;
  const MemoryEstimate plain = estimate_memory(make_scenario(c), Decision{}, 512);
  c.parallel_extra = ", pipeline_layout: [5, 3]";
  const MemoryEstimate more = estimate_memory(make_scenario(c), Decision{}, 512);
  EXPECT_EQ(plain.stage, 0);
  EXPECT_EQ(more.stage, 0);
  EXPECT_EQ(more.in_flight, 2);
  EXPECT_DOUBLE_EQ(more.dense_params, plain.dense_params * 5 / 4);
  EXPECT_DOUBLE_EQ(more.expert_params, plain.expert_params * 5 / 4);
  EXPECT_DOUBLE_EQ(more.activations_bytes, plain.activations_bytes * 10 / 8);
}

// Interleaved, 8 blocks, pp 2 x vp 2, m 4, layout [3, 1, 1, 3]: stage 0's chunks hold 3 blocks
// (piece 0) and 1 (piece 2). Its order (below) has at most four chunk-0 forwards and one chunk-1
// in flight (after F3.0 and after F2.1): 4 x 3 + 1 = 13 blocks' activations, against 1F1B's
// 2 micro-batches x 4 blocks and the even split's 5 chunks x 2 blocks. Stage 1 peaks at
// 1 + 1 + 3 = 5 blocks, so stage 0 is the estimate.
TEST(PipelineLayoutMemory, UnevenChunksCountTheBlocksInFlight) {
  std::string order;
  for (const auto& a : interleaved_one_f_one_b(2, 2, 0, 4))
    order += fmt::format("{}{}.{} ", a.backward ? 'B' : 'F', a.micro_batch, a.chunk);
  ASSERT_EQ(order,
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0 ");
  Cfg c;
  c.layers = 8;
  const MemoryEstimate one = estimate_memory(make_scenario(c), Decision{}, 512);
  c.parallel_extra = ", vp: 2";
  const MemoryEstimate even = estimate_memory(make_scenario(c), Decision{}, 512);
  c.parallel_extra = ", vp: 2, pipeline_layout: [3, 1, 1, 3]";
  const MemoryEstimate uneven = estimate_memory(make_scenario(c), Decision{}, 512);
  EXPECT_EQ(uneven.stage, 0);
  EXPECT_EQ(uneven.in_flight, 5);
  EXPECT_DOUBLE_EQ(even.activations_bytes, one.activations_bytes * 10 / 8);
  EXPECT_DOUBLE_EQ(uneven.activations_bytes, one.activations_bytes * 13 / 8);
  EXPECT_DOUBLE_EQ(uneven.dense_params, one.dense_params);  // 4 blocks on each stage
  // The weighted peak by hand: chunk 0 = 3, chunk 1 = 1.
  EXPECT_DOUBLE_EQ(peak_in_flight_bytes(interleaved_one_f_one_b(2, 2, 0, 4), {3.0, 1.0}), 13.0);
  EXPECT_DOUBLE_EQ(peak_in_flight_bytes(interleaved_one_f_one_b(2, 2, 1, 4), {1.0, 3.0}), 5.0);
}

// fit_advice proposes a larger pp only without a layout (a layout is written for its own pp).
TEST(PipelineLayoutMemory, FitAdviceKeepsTheLayoutsPp) {
  Cfg c;
  c.nodes = 4;
  c.layers = 8;
  const Scenario plain = make_scenario(c);
  const MemoryEstimate est = estimate_memory(plain, Decision{}, 512);
  Cfg deeper = c;
  deeper.pp = 4;
  const double at_four = estimate_memory(make_scenario(deeper), Decision{}, 512).total_bytes();
  ASSERT_LT(at_four, est.total_bytes());
  const double gpu = (at_four + est.total_bytes()) / 2;
  EXPECT_NE(fit_advice(plain, est, gpu).find("parallelism.pp: 4"), std::string::npos)
      << fit_advice(plain, est, gpu);
  c.parallel_extra = ", pipeline_layout: [4, 4]";
  const Scenario fixed = make_scenario(c);
  EXPECT_EQ(fit_advice(fixed, est, gpu).find("parallelism.pp"), std::string::npos)
      << fit_advice(fixed, est, gpu);
}

}  // namespace
}  // namespace moesim::strategies
