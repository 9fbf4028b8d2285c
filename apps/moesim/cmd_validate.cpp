// `moesim validate SCENARIO.yaml`: parse and check a scenario (schema, units, consistency, GPU
// and topology), print what it resolved to. Errors name file:line, key, found and expected.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/report.hpp"
#include "core/scenario_loader.hpp"
#include "strategies/memory.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/runner.hpp"
#include "strategies/serving/serving_engine.hpp"
#include "strategies/stage_schedule.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

// A serving scenario (docs/serving.md): its requests and each pool's instances, weights and KV
// cache per GPU (an InputError, exit 2, when the weights leave no room for the KV cache).
void print_serving(const Scenario& sc, const topology::Topology& topo) {
  const ServingSpec& sv = *sc.serving;
  const RequestSpec& r = sv.requests;
  if (r.arrival == RequestSpec::Arrival::kTrace)
    fmt::print("  serving      requests from {}\n", r.trace);
  else
    fmt::print("  serving      {} requests, {} arrivals at {:g}/s, prefix hit {:g}, seed {}\n",
               r.count, r.arrival == RequestSpec::Arrival::kGamma ? "gamma" : "Poisson",
               r.requests_per_s, r.prefix_hit, r.seed);
  const std::vector<const ServingPool*> pools =
      sv.disaggregated ? std::vector<const ServingPool*>{&sv.prefill, &sv.decode}
                       : std::vector<const ServingPool*>{&sv.instance};
  const double gib = 1024.0 * 1024.0 * 1024.0;
  for (const ServingPool* p : pools) {
    const serving::KvGeometry g = serving::kv_geometry(sc, *p, topo.gpu().memory.value());
    fmt::print(
        "  pool         {}: {} x {} node(s), ep {}{}; per GPU weights {:.1f} GiB, KV cache "
        "{} tokens ({:.1f} GiB, {:.0f} B per token)\n",
        p->key, p->instances, p->nodes, p->ep,
        p->redundant_experts > 0 ? fmt::format(" + {} redundant experts", p->redundant_experts)
                                 : std::string(),
        g.weights_bytes / gib, g.kv_tokens,
        static_cast<double>(g.kv_tokens) * g.kv_bytes_per_token / gib, g.kv_bytes_per_token);
  }
}

// Per-GPU memory (docs/model.md, "Memory"): the layout alone (the baseline stack), then each
// strategy, each through planned_memory: the decision and the sampled dC that simulate's run
// records, so the figure printed here is simulate's memory_bytes. A warning on stderr for each
// that does not fit (one for all), with the single keys that would make it fit; validation still
// succeeds. First, values no real cluster has (implausible_values).
void print_memory(const Scenario& sc, const topology::Topology& topo) {
  warn_implausible(sc);
  const double gpu_bytes = topo.gpu().memory.value();
  const auto& m = sc.model;
  const bool training = m.mode == Mode::kTraining;
  const std::string mode =
      training ? fmt::format("training, Adam: {} + {} + {} bytes per parameter",
                             sc.bytes_per_element(), dtype_bytes(m.precision.main_grads),
                             strategies::optimizer_bytes_per_param(m.dtype, m.precision.moments))
               : std::string("inference: weights and one block in flight");
  const std::string zero =
      sc.parallelism.zero >= 1 && training
          ? fmt::format(" (ZeRO-1: optimizer state sharded over {} dense / {} expert replicas)",
                        strategies::dense_replicas(sc), strategies::expert_replicas(sc))
          : std::string();
  const std::string recompute =
      training && m.recompute.granularity != RecomputeGranularity::kNone
          ? fmt::format("; recompute {}", name_of(m.recompute.granularity))
          : std::string();
  const std::string fp8 =
      m.precision.gemm == Dtype::kFp8 ? std::string("; fp8 GEMM inputs cached") : std::string();
  // One sampling of the workload for every strategy (they draw the same counts).
  workload::SampleCache cache;
  const int iterations = sc.workload.iterations;
  const auto layout_est = strategies::planned_memory(sc, StrategySpec{}, topo, iterations, &cache);
  fmt::print("  memory/GPU   {}{}{}{}; dC = {} slots; {:.0f} dense + {:.0f} expert parameters",
             mode, zero, recompute, fp8, layout_est.capacity, layout_est.dense_params,
             layout_est.expert_params);
  // A pipeline_layout's chunks need not be equal shares of the stage.
  const std::string chunk = sc.parallelism.pipeline_layout.empty()
                                ? fmt::format("of 1/{} of its blocks", layout_est.chunks)
                                : "(pieces of the pipeline_layout)";
  if (sc.parallelism.pp > 1)
    fmt::print("; stage {} with {} in flight", layout_est.stage,
               layout_est.chunks > 1
                   ? fmt::format("{} micro-batch chunk(s) {}", layout_est.in_flight, chunk)
                   : fmt::format("{} micro-batch(es)", layout_est.in_flight));
  fmt::print("\n");
  fmt::print("  memory/GPU   {:<16} {}\n", "(layout)", describe_memory(layout_est, gpu_bytes));
  std::vector<RunSummary> rows;
  for (const auto& spec : sc.strategies) {
    const auto est = strategies::planned_memory(sc, spec, topo, iterations, &cache);
    fmt::print("  memory/GPU   {:<16} {}{}\n", spec.name, describe_memory(est, gpu_bytes),
               est.expert_pack > 1 ? fmt::format(" [pack={}]", est.expert_pack) : "");
    RunSummary r;
    r.strategy = spec.name;
    r.memory = est;
    r.memory_bytes = est.total_bytes();
    r.gpu_memory_bytes = gpu_bytes;
    rows.push_back(std::move(r));
  }
  warn_memory(sc, rows, topo.gpu().name);
}

void print_summary(const Scenario& sc, const topology::Topology& topo) {
  const auto& m = sc.model;
  const auto& p = sc.parallelism;
  fmt::print("{}: valid\n", sc.source_file);
  fmt::print("  name         {}\n", sc.name);
  if (!sc.description.empty()) fmt::print("  description  {}\n", sc.description);
  fmt::print("  cluster      {} GPUs ({}) = {} nodes x {}; {} intra-node; {} inter-node\n",
             topo.num_gpus(), topo.gpu().name, sc.cluster.nodes, sc.cluster.gpus_per_node,
             intra_kind_name(sc.cluster.intra.kind), inter_kind_name(sc.cluster.inter.kind));
  fmt::print("  topology     {} vertices, {} full-duplex links\n", topo.vertices().size(),
             topo.links().size() / 2);
  // The dense FFN's width shows only where the model has dense FFN blocks.
  const std::string dense_h = m.num_blocks() > m.num_moe_layers()
                                  ? fmt::format(" dense H={}", m.dense_hidden())
                                  : std::string();
  fmt::print(
      "  model        {}, {} layer(s){}, MoE every {}{}; B={} L={} (S={} tokens/GPU) M={} "
      "H={}{}{}\n",
      name_of(m.mode), m.layers,
      m.mtp_blocks() > 0 ? fmt::format(" + {} MTP module(s)", m.mtp_blocks()) : "", m.moe_every,
      m.first_dense_layers > 0 ? fmt::format(" after {} dense", m.first_dense_layers) : "",
      m.batch_per_gpu, m.seq_len, m.tokens_per_gpu(), m.model_dim, m.hidden_dim, dense_h,
      m.shared_experts > 0 ? fmt::format(" + {} shared expert(s)", m.shared_experts) : "");
  std::string experts =
      m.experts_per_gpu < 0
          ? fmt::format("{} experts, each sharded over {} GPUs", m.experts, m.expert_shards())
          : fmt::format("{} experts ({} per GPU)", m.experts, m.experts_per_gpu);
  std::string cf =
      m.capacity_factor > 0
          ? fmt::format("f={}", m.capacity_factor)
          : (m.capacity_factor == 0 ? std::string("f=dropless")
                                    : fmt::format("f=dropless<={}", -m.capacity_factor));
  fmt::print("  experts      {}; top-{}; {}; {}\n", experts, m.top_k, cf, dtype_name(m.dtype));
  // model.hf_config: what was read, and the config's fields the model does not follow.
  const ModelImport& hf = sc.model_import;
  if (!hf.hf_config.empty()) {
    fmt::print("  hf_config    {} (read as {})\n", hf.hf_config, hf.family);
    for (const std::string& f : hf.ignored) fmt::print("  not modelled {}\n", f);
    if (!hf.unknown.empty())
      fmt::print("  not read     {} (unknown fields)\n", fmt::join(hf.unknown, ", "));
  }
  // The block's kernels as the plan lowers them (docs/model.md, "A block as the kernels").
  const AttentionSpec& at = m.attention;
  const std::string heads =
      at.is_mla()
          ? fmt::format("mla, {} heads (q_lora {}, kv_lora {}, qk {}+{}, v {})", at.heads,
                        at.q_lora_rank, at.kv_lora_rank, at.qk_nope_head_dim, at.qk_rope_head_dim,
                        at.v_head_dim)
          : fmt::format("{}, {} heads of {} over {} kv heads",
                        at.kv_heads < at.heads ? "gqa" : "mha", at.heads, at.head_dim, at.kv_heads);
  fmt::print("  attention    {}{}; ffn {}\n", heads, at.causal ? ", causal" : "",
             name_of(m.activation));
  std::string modules;
  for (RecomputeModule mod : m.recompute.modules)
    modules += fmt::format("{}{}", modules.empty() ? " [" : ", ", name_of(mod));
  if (!modules.empty()) modules += "]";
  const PrecisionSpec& pr = m.precision;
  fmt::print(
      "  precision    gemm {}, dispatch {}, combine {}, main grads {}, Adam moments {}; recompute "
      "{}{}\n",
      dtype_name(pr.gemm), dtype_name(pr.dispatch), dtype_name(pr.combine),
      dtype_name(pr.main_grads), dtype_name(pr.moments), name_of(m.recompute.granularity), modules);
  const std::string per = p.pp > 1 ? "P / pp" : "P";
  if (p.folded())
    fmt::print(
        "  parallelism  layout=folded: attention tp={} cp={} dp={} (sequence parallel {}), "
        "experts etp={} ep={} edp={}; each side's product = {}\n",
        p.mp, p.cp, p.adp, p.sp ? "on" : "off", p.esp, p.ep, p.dp, per);
  else
    fmt::print("  parallelism  ep={} esp={} mp={} dp={} layout={} ({})\n", p.ep, p.esp, p.mp, p.dp,
               name_of(p.layout),
               p.overlapped() ? "MP ranks share the EP x ESP GPUs: ep*esp*dp = " + per
                              : "MP ranks on GPUs of their own: ep*esp*mp*dp = " + per);
  if (p.pp > 1 || m.micro_batches > 1) {
    // Blocks per stage: a rank-stage's chunks summed (DualPipe: stage s of one direction, as each
    // direction's stages are the pieces); per piece too where pieces are not stages.
    const bool dual = p.schedule == PipelineSchedule::kDualPipe;
    const int chunks = dual ? 1 : strategies::chunks_per_stage(sc);
    std::string stages;
    for (int s = 0; s < p.pp; ++s) {
      int blocks = 0;
      for (int c = 0; c < chunks; ++c) {
        const auto [first, end] = strategies::piece_blocks(sc, strategies::piece_of(sc, s, c));
        blocks += end - first;
      }
      stages += fmt::format("{}{}", s == 0 ? "" : " ", blocks);
    }
    if (chunks > 1) {  // runs of equal pieces as Megatron's layout writes them: 4*15 1
      std::string pieces;
      const int n = strategies::model_pieces(sc);
      for (int k = 0; k < n;) {
        const auto [first, end] = strategies::piece_blocks(sc, k);
        int run = 1;
        while (k + run < n && strategies::piece_blocks(sc, k + run).second -
                                      strategies::piece_blocks(sc, k + run).first ==
                                  end - first)
          ++run;
        pieces += fmt::format("{}{}", pieces.empty() ? "" : " ", end - first);
        if (run > 1) pieces += fmt::format("*{}", run);
        k += run;
      }
      stages += "], per piece [" + pieces;
    }
    stages = "blocks per stage [" + stages + "]";
    if (!p.pipeline_layout.empty()) stages += " (pipeline_layout)";
    // The schedule's bubble share at equal stages (interleaving divides the bubble by vp);
    // DualPipe's depends on how much F&B overlap hides, so the engine's step is the figure.
    std::string schedule;
    const double bubble = (p.pp - 1.0) / p.vp;
    switch (p.schedule) {
      case PipelineSchedule::kOneFOneB:
        schedule = fmt::format("1F1B; bubble (pp-1)/(m+pp-1) = {:.1f}%",
                               100.0 * bubble / (m.micro_batches + bubble));
        break;
      case PipelineSchedule::kInterleaved:
        schedule = fmt::format(
            "interleaved, vp={} chunks per stage; bubble (pp-1)/vp/(m+(pp-1)/vp) "
            "= {:.1f}%",
            p.vp, 100.0 * bubble / (m.micro_batches + bubble));
        break;
      case PipelineSchedule::kDualPipe:
        schedule = "DualPipe, stages s and pp-1-s on each stage's GPUs; bubble: the simulated step";
        break;
    }
    fmt::print(
        "  pipeline     pp={} stage(s) of {} GPUs, {}; {} micro-batch(es) per step, {} at equal "
        "stages\n",
        p.pp, sc.stage_gpus(), stages, m.micro_batches, schedule);
  }
  fmt::print("  workload     {} routing (seed {}), {} iteration(s)\n",
             name_of(sc.workload.routing.distribution), sc.workload.routing.seed,
             sc.workload.iterations);
  fmt::print("  engine       {}\n", name_of(sc.engine.network));
  for (const auto& s : sc.strategies)
    fmt::print("  strategy     {:<16} {}\n", s.name, describe_roles(s));
  if (sc.serving) {
    print_serving(sc, topo);
    return;
  }
  print_memory(sc, topo);
}

}  // namespace

void register_validate(CLI::App& app) {
  auto* cmd = app.add_subcommand("validate", "Parse and check a scenario, print a summary");
  auto scenario = std::make_shared<std::string>();
  cmd->add_option("scenario", *scenario, "Scenario YAML")->required();
  auto sets = std::make_shared<std::vector<std::string>>();
  add_set_option(cmd, sets.get());
  cmd->callback([=] {
    Scenario sc = load_scenario_with(*scenario, *sets);
    // Everything simulate reads before its first iteration is read here too, so a scenario that
    // validates is one that every later command can run: the topology (the GPU and the cluster's
    // wiring, scaled by the calibration file, which is loaded and checked), the engine settings,
    // and the workload generator, which reads every row of a routing trace file against the
    // scenario's shape.
    auto topo = simulation_topology(sc);
    (void)engine_config_from(sc, "");
    workload::WorkloadGenerator check_workload(sc.stage_scenario());
    print_summary(sc, *topo);
  });
}

}  // namespace moesim::app
