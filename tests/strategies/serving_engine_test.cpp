// The serving engine (strategies/serving/serving_engine.hpp): the `serving:` section as the loader
// reads it, the KV cache geometry worked by hand, the iteration price's properties, and whole
// serving runs on small clusters.
#include "strategies/serving/serving_engine.hpp"

#include <gtest/gtest.h>

#include <string>

#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/serving_output.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "topology/topology.hpp"

namespace moesim {
namespace {

// Two nodes of 4 GPUs (80 GiB), a GQA MoE model of 4 blocks (8 query heads, 2 KV heads of 64,
// model dim 512, 8 experts of hidden 1,024, top-2, SwiGLU, vocabulary 1,000), served co-located
// by default; `serving` replaces the section.
std::string scenario_text(const std::string& serving, const std::string& model_extra = "",
                          const std::string& attention = "{heads: 8, kv_heads: 2, head_dim: 64}") {
  return R"(name: serve-test
cluster:
  gpu: h100-sxm
  nodes: 2
  gpus_per_node: 4
  intra_node: {kind: nvswitch, bandwidth: 450GB/s, latency: 1us}
  inter_node: {kind: fat_tree, nic_bandwidth: 400Gb/s, nics_per_node: 4, latency: 2us,
               oversubscription: 1.0, switch_radix: 16}
model:
  layers: 4
  model_dim: 512
  expert_hidden_dim: 1024
  activation: swiglu
  attention: )" +
         attention + R"(
  experts: 8
  top_k: 2
  vocab_size: 1000
  tie_embeddings: false
  dtype: bf16
)" + model_extra +
         R"(engine: {network: analytical}
strategies: [{name: baseline}]
serving:
)" + serving;
}

const char* kRequests = R"(  requests:
    requests_per_s: 50
    count: 200
    prompt: {distribution: uniform, min: 100, max: 300}
    output: {distribution: uniform, min: 10, max: 50}
    seed: 3
)";

Scenario load(const std::string& serving, const std::string& model_extra = "",
              const std::string& attention = "{heads: 8, kv_heads: 2, head_dim: 64}") {
  return parse_scenario_string(scenario_text(serving, model_extra, attention), "serve.yaml");
}

std::string error_of(const std::string& serving, const std::string& model_extra = "") {
  try {
    load(serving, model_extra);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(ServingSpec, DefaultsToOneInstanceOverTheCluster) {
  const Scenario sc = load(kRequests);
  ASSERT_TRUE(sc.serving.has_value());
  EXPECT_EQ(sc.model.mode, Mode::kInference);
  EXPECT_FALSE(sc.serving->disaggregated);
  EXPECT_EQ(sc.serving->instance.nodes, 2);
  EXPECT_EQ(sc.serving->instance.instances, 1);
  EXPECT_EQ(sc.serving->instance.ep, 8);
  EXPECT_EQ(sc.serving->instance.max_batch_tokens, 8192);
  EXPECT_EQ(sc.serving->instance.max_running, 256);
  EXPECT_EQ(sc.serving->instance.block_tokens, 16);
  EXPECT_EQ(sc.serving->kv_dtype, Dtype::kBf16);
  EXPECT_EQ(sc.serving->requests.count, 200);
}

TEST(ServingSpec, InstancesFillTheClusterAndPoolsAreRead) {
  const Scenario co = load(std::string(kRequests) + "  instance: {nodes: 1, ep: 2}\n");
  EXPECT_EQ(co.serving->instance.instances, 2);
  EXPECT_EQ(co.serving->instance.ep, 2);
  const Scenario d =
      load(std::string(kRequests) +
           "  prefill: {nodes: 1}\n  decode: {nodes: 1, max_running: 64}\n  kv_dtype: fp8\n"
           "  slo: {ttft: 500ms, tpot: 20ms}\n");
  EXPECT_TRUE(d.serving->disaggregated);
  EXPECT_EQ(d.serving->prefill.key, "serving.prefill");
  EXPECT_EQ(d.serving->decode.max_running, 64);
  EXPECT_EQ(d.serving->kv_dtype, Dtype::kFp8);
  EXPECT_DOUBLE_EQ(d.serving->slo_ttft.value(), 0.5);
  EXPECT_DOUBLE_EQ(d.serving->slo_tpot.value(), 0.02);
}

TEST(ServingSpec, BadInputNamesTheKeyAndWhatFits) {
  const std::string r = kRequests;
  EXPECT_NE(error_of(r + "  instance: {nodes: 1}\n  prefill: {nodes: 1}\n  decode: {nodes: 1}\n")
                .find("exclude each other"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  prefill: {nodes: 1}\n").find("missing required key 'decode'"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  prefill: {nodes: 2}\n  decode: {nodes: 1}\n")
                .find("the pools need 1 x 2 + 1 x 1 = 3 nodes, the cluster has 2"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  instance: {nodes: 1, ep: 3}\n").find("a divisor of the instance's 4"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  instance: {nodes: 2, ep: 8}\n", "  mode: training\n")
                .find("expected inference"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  instance: {nodes: 1, max_running: 100, max_batch_tokens: 50}\n")
                .find("expected max_running <= max_batch_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  slo: {ttft: 0s}\n").find("serving.slo.ttft"), std::string::npos);
  EXPECT_NE(error_of(r + "  instance: {nodes: 1, memory_utilization: 1.5}\n").find("in (0, 1]"),
            std::string::npos);
  EXPECT_NE(error_of("  instance: {nodes: 1}\n").find("missing required key 'requests'"),
            std::string::npos);
  EXPECT_NE(error_of(r + "  instance: {nodes: 2, ep: 8, redundant_experts: 3}\n")
                .find("the model's 8 experts + 3 redundant over ep = 8: expected ep to divide the "
                      "expert slots (every EP rank holds the same number); redundant_experts: 8 "
                      "fits"),
            std::string::npos);
  // The file and line of the offending key.
  EXPECT_NE(error_of(r + "  instance: {nodes: 1, ep: 3}\n").find("serve.yaml:"), std::string::npos);
}

// GQA: 2 KV heads x 64 x 2 (K and V) x 2 bytes = 512 B per token and layer, x 4 layers.
// Weights (bf16): attention q 512x512, k and v 512x128 each, o 512x512 = 655,360 per block;
// experts 3 x 512 x 1,024 = 1,572,864 each; gate 512 x 8; norms 2 x 512 per block + 512;
// embedding and head 1,000 x 512 each.
TEST(ServingEngine, KvGeometryByHand) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 1, ep: 4}\n");
  const ServingPool& pool = sc.serving->instance;
  const double hbm = 80.0 * (1 << 30);
  const serving::KvGeometry g = serving::kv_geometry(sc, pool, hbm);
  EXPECT_DOUBLE_EQ(g.kv_bytes_per_token, 4 * 512.0);
  const double per_block = 655360.0 + 512.0 * 8 + 8.0 / 4 * 1572864.0;
  const double weights = 4 * per_block * 2 + (2 * 1000.0 * 512 + 4 * 2 * 512 + 512) * 2;
  EXPECT_DOUBLE_EQ(g.weights_bytes, weights);
  EXPECT_DOUBLE_EQ(g.usable_bytes, 0.9 * hbm);
  EXPECT_EQ(g.kv_tokens, static_cast<long long>((0.9 * hbm - weights) / 2048.0));
  // Four redundant experts: 12 slots over 4 GPUs, 3 experts' weights per GPU instead of 2.
  const Scenario red =
      load(std::string(kRequests) + "  instance: {nodes: 1, ep: 4, redundant_experts: 4}\n");
  EXPECT_DOUBLE_EQ(serving::kv_geometry(red, red.serving->instance, hbm).weights_bytes,
                   weights + 4 * 1572864.0 * 2);
  EXPECT_EQ(serving::instance_scenario(red, red.serving->instance).model.experts_per_gpu, 3);
  // fp8 KV halves the bytes per token.
  Scenario f = sc;
  f.serving->kv_dtype = Dtype::kFp8;
  EXPECT_DOUBLE_EQ(serving::kv_geometry(f, pool, hbm).kv_bytes_per_token, 4 * 256.0);
}

// MLA caches the kv_lora latent and the rope key: (512 + 64) x 2 bytes per layer.
TEST(ServingEngine, MlaCachesTheLatent) {
  const Scenario sc = load(std::string(kRequests), "",
                           "{kind: mla, heads: 8, q_lora_rank: 256, kv_lora_rank: 512, "
                           "qk_nope_head_dim: 64, qk_rope_head_dim: 64, v_head_dim: 64}");
  EXPECT_DOUBLE_EQ(
      serving::kv_geometry(sc, sc.serving->instance, 80.0 * (1 << 30)).kv_bytes_per_token,
      4 * 576.0 * 2);
}

// The serving core in the plan: decode queries under MLA run the absorbed form (2 x 512 + 64 per
// head and pair: scores over the latent and rope key, the output in the latent), prefill queries
// the expanded one (qk 128 + v 64); the KV read is the cached latent and rope key, 576 x 2 bytes.
TEST(ServingEngine, AttentionCoreReadsTheKvCache) {
  const Scenario sc = load(std::string(kRequests), "",
                           "{kind: mla, heads: 8, q_lora_rank: 256, kv_lora_rank: 512, "
                           "qk_nope_head_dim: 64, qk_rope_head_dim: 64, v_head_dim: 64}");
  Scenario i = serving::instance_scenario(sc, sc.serving->instance);
  i.model.batch_per_gpu = 4;
  i.model.serving_decode_pairs = 1000;
  i.model.serving_prefill_pairs = 200;
  i.model.serving_kv_read_tokens = 1100;
  const auto topo = app::simulation_topology(i);
  const sim::EngineConfig cfg = app::engine_config_from(i, "");
  const ComputeSpec* core = nullptr;
  Plan kept;
  const strategies::Backend capture = [&](const Plan& p) {
    kept = p;
    return sim::run_plan(p, *topo, cfg);
  };
  strategies::run_stack(i, sc.strategies[0], *topo, capture, 1);
  for (const auto& op : kept.ops())
    if (op.label == "L0.fwd.attn.core") core = &op.compute();
  ASSERT_NE(core, nullptr);
  EXPECT_DOUBLE_EQ(core->flops.value(), 2.0 * 8 * (1000.0 * (2 * 512 + 64) + 200.0 * (128 + 64)));
  EXPECT_DOUBLE_EQ(core->bytes.value(), 1100.0 * 576 * 2);
  // No backward in a serving iteration.
  for (const auto& op : kept.ops()) EXPECT_EQ(op.label.find(".bwd."), std::string::npos);
}

TEST(ServingEngine, WeightsThatLeaveNoRoomAreRefusedAtThePool) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 1, ep: 4}\n");
  try {
    serving::kv_geometry(sc, sc.serving->instance, 1e6);  // a 1 MB GPU
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("serving.instance"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("leaving no room for a KV block"), std::string::npos);
  }
}

TEST(ServingEngine, InstanceScenarioIsTheInstancesNodesDropless) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 1, ep: 2}\n");
  const Scenario i = serving::instance_scenario(sc, sc.serving->instance);
  EXPECT_EQ(i.num_gpus(), 4);
  EXPECT_EQ(i.parallelism.ep, 2);
  EXPECT_EQ(i.parallelism.dp, 2);
  EXPECT_EQ(i.model.experts_per_gpu, 4);
  EXPECT_TRUE(i.model.capacity_is_dropless());
  EXPECT_FALSE(i.serving.has_value());
}

serving::MakeInstanceBackend backend_for(const sim::EngineConfig& cfg) {
  return app::instance_backends(cfg);
}

// Properties of the price: more tokens, more KV read or more attention pairs never cost less;
// the grid keeps the price within its half step of the exact one.
TEST(ServingEngine, IterationPriceGrowsWithTheBatchAndItsContext) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 2}\n");
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  serving::IterationPricer price(serving::instance_scenario(sc, sc.serving->instance),
                                 sc.strategies[0], backend_for(cfg));
  double last = 0;
  for (long long t : {1, 2, 8, 64, 512, 4096}) {
    const double s = price.price_per_gpu(t, 0, 0, 0);
    EXPECT_GT(s, last) << t;
    last = s;
  }
  const double base = price.price_per_gpu(64, 64 * 1000.0, 0, 64 * 1000.0);
  EXPECT_GT(price.price_per_gpu(64, 64 * 4000.0, 0, 64 * 4000.0), base);
  EXPECT_GT(base, price.price_per_gpu(64, 0, 0, 0));
  // A batch of 8 GPUs x 300 tokens: 300 is priced at the nearest grid point (2^(132/16) = 304.4).
  serving::BatchShape b;
  b.decode_tokens = 8 * 300;
  const double grid = price(b);
  const double exact = price.price_per_gpu(300, 0, 0, 0);
  EXPECT_NEAR(grid / exact, 1.0, 0.022);
  EXPECT_EQ(price.evaluations(), 1);
  EXPECT_EQ(price(b), grid);  // cached
  EXPECT_EQ(price.evaluations(), 1);
}

// A bucket's second batch costs the bucket's price plus its attention cores' difference: the same
// as its own plan, for decodes (KV-bound and compute-bound contexts) and prefill chunks alike.
TEST(ServingEngine, ABucketsOtherContextsCostTheirOwnPlan) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 2}\n", "",
                           "{kind: mla, heads: 8, q_lora_rank: 256, kv_lora_rank: 512, "
                           "qk_nope_head_dim: 64, qk_rope_head_dim: 64, v_head_dim: 64}");
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  serving::IterationPricer price(serving::instance_scenario(sc, sc.serving->instance),
                                 sc.strategies[0], backend_for(cfg));
  serving::BatchShape first;
  first.decode_tokens = 8 * 16;
  first.decode_pairs = first.context_tokens = 8 * 16 * 300;
  price(first);
  for (const long long context : {10LL, 2000LL, 100000LL}) {
    serving::BatchShape b = first;
    b.decode_pairs = b.context_tokens = 8 * 16 * context;
    const double own = price.price_per_gpu(16, 16.0 * context, 0, 16.0 * context);
    EXPECT_NEAR(price(b) / own, 1.0, 1e-9) << context;
  }
  serving::BatchShape chunk;
  chunk.prefill_tokens = 8 * 16;
  chunk.prefill_pairs = 8 * (16.0 * 4000 + 16.0 * 17 / 2);
  chunk.context_tokens = 8 * 4016;
  EXPECT_NEAR(price(chunk) / price.price_per_gpu(16, 0, chunk.prefill_pairs / 8, 4016), 1.0, 1e-9);
  EXPECT_EQ(price.evaluations(), 1);
}

// A model of D dense and N MoE blocks and a head is priced as D x dense + N x MoE + head: the
// decomposition equals the plan of the whole model's forward pass (its blocks run one after the
// other), here 1 dense + 3 MoE blocks with the embedding and head.
TEST(ServingEngine, ModelPriceIsItsBlocks) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 2}\n",
                           "  first_dense_layers: 1\n  dense_hidden_dim: 2048\n");
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  Scenario inst = serving::instance_scenario(sc, sc.serving->instance);
  serving::IterationPricer price(inst, sc.strategies[0], backend_for(cfg));
  inst.model.batch_per_gpu = 16;
  inst.model.serving_decode_pairs = 16 * 500.0;
  inst.model.serving_kv_read_tokens = 16 * 500.0;
  const auto topo = app::simulation_topology(inst);
  const strategies::Backend run = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const double whole =
      strategies::run_stack(inst, sc.strategies[0], *topo, run, 1).iterations.at(0).step_time_s;
  const double parts = price.price_per_gpu(16, 16 * 500.0, 0, 16 * 500.0);
  EXPECT_NEAR(parts / whole, 1.0, 5e-3) << parts << " vs " << whole;
}

// A whole run: every request finishes after it arrives, every output token is produced, and the
// throughput figures are the tokens over the makespan per node.
TEST(ServingEngine, CoLocatedRunServesEveryRequest) {
  const Scenario sc = load(std::string(kRequests) + "  instance: {nodes: 1}\n");
  const auto topo = app::simulation_topology(sc);
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  const auto reports = app::run_serving_stacks(sc, sc.strategies, *topo, cfg);
  ASSERT_EQ(reports.size(), 1u);
  const auto& r = reports[0];
  ASSERT_EQ(r.overall.requests.size(), 200u);
  for (const auto& o : r.overall.requests) EXPECT_GE(o.finish_s, o.first_token_s);
  EXPECT_EQ(r.pools.size(), 1u);
  EXPECT_EQ(r.pools[0].instances, 2);
  EXPECT_GT(r.pools[0].priced_batches, 0);
  // Every output token and every prompt is counted once in the iterations' tokens.
  double out_events = 0, in_events = 0;
  for (const auto& e : r.overall.tokens) {
    out_events += e.output_tokens;
    in_events += static_cast<double>(e.input_tokens);
  }
  EXPECT_NEAR(out_events, r.requests.mean_output * r.requests.count, 1e-6);
  EXPECT_NEAR(in_events, r.requests.mean_prompt * r.requests.count, 1e-6);
  // Per node: the steady window's (the 21st arrival to the last) over the 2 nodes.
  const serving::WindowThroughput w =
      serving::window_throughput(r.overall, r.window.start_s, r.window.end_s);
  EXPECT_GT(r.window.end_s, r.window.start_s);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s_per_node, w.output_tokens_per_s / 2);
  EXPECT_DOUBLE_EQ(r.input_tokens_per_s_per_node, w.input_tokens_per_s / 2);
  EXPECT_GT(r.metrics.ttft_s.p50, 0);
  EXPECT_GT(r.metrics.tpot_s.p50, 0);
}

TEST(ServingEngine, DisaggregatedRunMovesTheKv) {
  const Scenario sc =
      load(std::string(kRequests) + "  prefill: {nodes: 1}\n  decode: {nodes: 1}\n");
  const auto topo = app::simulation_topology(sc);
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  const auto r = app::run_serving_stacks(sc, sc.strategies, *topo, cfg).at(0);
  ASSERT_EQ(r.pools.size(), 2u);
  // Mean prompt x 2,048 B per token over one GPU's share of a 400 Gb/s NIC (x 0.95 achievable),
  // plus the route's latency.
  const double bytes = r.requests.mean_prompt * 2048.0;
  const double bw = 400e9 / 8 * 0.95;
  EXPECT_NEAR(r.kv_transfer_mean_s, bytes / bw, 0.05 * bytes / bw + 1e-5);
  EXPECT_GT(r.metrics.tpot_s.p50, 0);
  for (const auto& o : r.overall.requests) EXPECT_GE(o.finish_s, o.first_token_s);
}

// One request has no steady window: its throughput is over the whole run, its tokens over its
// makespan.
TEST(ServingEngine, ASingleRequestsThroughputIsOverItsRun) {
  const Scenario sc = load(
      "  requests: {requests_per_s: 1, count: 1, prompt: {distribution: fixed, "
      "tokens: 100}, output: {distribution: fixed, tokens: 20}}\n"
      "  instance: {nodes: 1}\n");
  const auto topo = app::simulation_topology(sc);
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  const auto r = app::run_serving_stacks(sc, sc.strategies, *topo, cfg).at(0);
  ASSERT_GT(r.overall.makespan_s, 0);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s_per_node, 20 / r.overall.makespan_s / 2);
  EXPECT_DOUBLE_EQ(r.input_tokens_per_s_per_node, 100 / r.overall.makespan_s / 2);
}

TEST(ServingEngine, ARequestLongerThanOneGpusKvIsRefused) {
  const Scenario sc = load(std::string(kRequests) +
                           "  instance: {nodes: 1, kv_tokens_per_gpu: 200, block_tokens: 16}\n");
  const auto topo = app::simulation_topology(sc);
  const sim::EngineConfig cfg = app::engine_config_from(sc, "");
  try {
    app::run_serving_stacks(sc, sc.strategies, *topo, cfg);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("KV tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("one GPU of the pool holds 200"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moesim
