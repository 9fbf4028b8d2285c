// The MoE step plan builder. Every FLOP count, byte count and op structure used here is
// documented in docs/model.md (the same formulas, with the reasons); comments below say why the
// DAG has the shape it has.
#include "strategies/plan_builder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/routed_assignment.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/model_params.hpp"
#include "strategies/schedules/lina.hpp"
#include "strategies/schedules/parm.hpp"
#include "strategies/stage_schedule.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {

namespace {

std::int64_t div_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The MoE groupings of the overlapped layout (ParallelismSpec): rank (d*ep + e)*esp + s, MP
// groups the blocks of mp consecutive ranks inside one DP index.
void overlapped_groups(const ParallelismSpec& p, int n, Groups& g) {
  const int W = p.ranks_per_dp();
  for (int d = 0; d < p.dp; ++d)
    for (int s = 0; s < p.esp; ++s) {
      std::vector<int> grp;
      for (int e = 0; e < p.ep; ++e) grp.push_back(p.rank_of(d, e, s, 0));
      for (int x = 0; x < p.ep / n; ++x)
        g.shard.groups.emplace_back(grp.begin() + x * n, grp.begin() + (x + 1) * n);
      g.ep.groups.push_back(std::move(grp));
    }
  for (int d = 0; d < p.dp; ++d)
    for (int e = 0; e < p.ep; ++e) {
      std::vector<int> grp;
      for (int s = 0; s < p.esp; ++s) grp.push_back(p.rank_of(d, e, s, 0));
      g.esp.groups.push_back(std::move(grp));
    }
  for (int q = 0; q < p.dp * W / p.mp; ++q) {
    std::vector<int> grp;
    for (int t = 0; t < p.mp; ++t) grp.push_back(q * p.mp + t);
    g.mp.groups.push_back(std::move(grp));
  }
  for (int e = 0; e < p.ep; ++e)
    for (int s = 0; s < p.esp; ++s) {
      std::vector<int> grp;
      for (int d = 0; d < p.dp; ++d) grp.push_back(p.rank_of(d, e, s, 0));
      g.dp.groups.push_back(std::move(grp));
    }
  for (int d = 0; d < p.dp; ++d) {
    std::vector<int> grp;
    for (int i = 0; i < W; ++i) grp.push_back(d * W + i);
    g.ep_esp.groups.push_back(std::move(grp));
  }
  // Dense data parallelism: the ranks of one MP index (t = rank % mp), as in the disjoint layout;
  // folded, that is Megatron's DP x CP group (attention rank (a*cp + c)*tp + t).
  for (int t = 0; t < p.mp; ++t) {
    std::vector<int> grp;
    for (int r = t; r < p.dp * W; r += p.mp) grp.push_back(r);
    g.dense_dp.groups.push_back(std::move(grp));
  }
  if (p.folded())
    for (int a = 0; a < p.adp; ++a)
      for (int t = 0; t < p.mp; ++t) {
        std::vector<int> grp;
        for (int c = 0; c < p.cp; ++c) grp.push_back((a * p.cp + c) * p.mp + t);
        g.cp.groups.push_back(std::move(grp));
      }
}

}  // namespace

Groups make_groups(const Scenario& sc) {
  const ParallelismSpec& p = sc.parallelism;
  if (p.ep < 1 || p.esp < 1 || p.mp < 1 || p.dp < 1 || p.product() != sc.num_gpus() ||
      (p.overlapped() && p.ranks_per_dp() % p.mp != 0) ||
      (p.folded() && static_cast<std::int64_t>(p.mp) * p.cp * p.adp != sc.num_gpus()))
    throw InputError(
        sc.location_of("parallelism"), "parallelism",
        p.folded() ? fmt::format("found tp {} x cp {} x dp {} and etp {} x ep {} x edp {} "
                                 "(layout folded), expected both products equal to the {} GPUs "
                                 "of the cluster",
                                 p.mp, p.cp, p.adp, p.esp, p.ep, p.dp, sc.num_gpus())
        : p.overlapped()
            ? fmt::format("found ep {} x esp {} x dp {} with mp {} (layout overlapped), expected "
                          "a product equal to the {} GPUs of the cluster and mp dividing ep x esp",
                          p.ep, p.esp, p.dp, p.mp, sc.num_gpus())
            : fmt::format("found ep {} x esp {} x mp {} x dp {}, expected a product equal "
                          "to the {} GPUs of the cluster",
                          p.ep, p.esp, p.mp, p.dp, sc.num_gpus()));
  const int n = sc.model.expert_shards();
  if (p.ep % n != 0)
    throw InputError(
        sc.location_of("model.experts_per_gpu"), "model.experts_per_gpu",
        fmt::format("experts sharded over {} GPUs, expected a divisor of ep = {}", n, p.ep));
  Groups g;
  g.ep.name = "ep";
  g.esp.name = "esp";
  g.mp.name = "mp";
  g.dp.name = "dp";
  g.ep_esp.name = "ep_esp";
  g.dense_dp.name = "dense_dp";
  g.shard.name = "shard";
  g.cp.name = "cp";
  if (p.moe_major()) {
    overlapped_groups(p, n, g);
    return g;
  }
  const auto rank_of = [&p](int d, int e, int s, int t) { return p.rank_of(d, e, s, t); };
  for (int d = 0; d < p.dp; ++d)
    for (int s = 0; s < p.esp; ++s)
      for (int t = 0; t < p.mp; ++t) {
        std::vector<int> grp;
        for (int e = 0; e < p.ep; ++e) grp.push_back(rank_of(d, e, s, t));
        // The n GPUs of one sharded expert are n consecutive EP positions (ExpertPlacement).
        for (int x = 0; x < p.ep / n; ++x)
          g.shard.groups.emplace_back(grp.begin() + x * n, grp.begin() + (x + 1) * n);
        g.ep.groups.push_back(std::move(grp));
      }
  for (int d = 0; d < p.dp; ++d)
    for (int e = 0; e < p.ep; ++e)
      for (int t = 0; t < p.mp; ++t) {
        std::vector<int> grp;
        for (int s = 0; s < p.esp; ++s) grp.push_back(rank_of(d, e, s, t));
        g.esp.groups.push_back(std::move(grp));
      }
  for (int d = 0; d < p.dp; ++d)
    for (int e = 0; e < p.ep; ++e)
      for (int s = 0; s < p.esp; ++s) {
        std::vector<int> grp;
        for (int t = 0; t < p.mp; ++t) grp.push_back(rank_of(d, e, s, t));
        g.mp.groups.push_back(std::move(grp));
      }
  for (int e = 0; e < p.ep; ++e)
    for (int s = 0; s < p.esp; ++s)
      for (int t = 0; t < p.mp; ++t) {
        std::vector<int> grp;
        for (int d = 0; d < p.dp; ++d) grp.push_back(rank_of(d, e, s, t));
        g.dp.groups.push_back(std::move(grp));
      }
  for (int d = 0; d < p.dp; ++d)
    for (int t = 0; t < p.mp; ++t) {
      std::vector<int> grp;
      for (int e = 0; e < p.ep; ++e)
        for (int s = 0; s < p.esp; ++s) grp.push_back(rank_of(d, e, s, t));
      g.ep_esp.groups.push_back(std::move(grp));
    }
  for (int t = 0; t < p.mp; ++t) {
    std::vector<int> grp;
    for (int d = 0; d < p.dp; ++d)
      for (int e = 0; e < p.ep; ++e)
        for (int s = 0; s < p.esp; ++s) grp.push_back(rank_of(d, e, s, t));
    g.dense_dp.groups.push_back(std::move(grp));
  }
  return g;
}

namespace {

constexpr OpId kNone = -1;

std::vector<OpId> deps_of(std::initializer_list<OpId> ids) {
  std::vector<OpId> out;
  for (OpId id : ids)
    if (id != kNone) out.push_back(id);
  return out;
}

/// Sizes of one MoE layer of this iteration (docs/model.md, "MoE layer").
struct MoeDims {
  std::int64_t capacity = 0;         // dC from the workload
  std::vector<std::int64_t> chunks;  // dC split into r near-equal chunks (equal when r | dC)
};

class Builder {
 public:
  // `sc` is the scenario of one pipeline stage (Scenario::stage_scenario) and `part` the blocks
  // it runs; the whole model on all of sc's GPUs when part is the default.
  Builder(const Scenario& sc, const topology::Topology& topo,
          const workload::IterationWorkload& work, const Decision& dec, StagePart part = {})
      : sc_(sc), topo_(topo), work_(work), dec_(dec), part_(part), plan_(sc.num_gpus()) {
    if (part_.end_block < 0) part_.end_block = sc.model.layers;
  }

  // The stage's forward (ops [0, bwd_begin)) then backward (ops [bwd_begin, end)); out.fwd_out /
  // out.bwd_out are the last op of each pass (what the next stage's input waits for).
  StagePlan build() {
    init();
    check_decision();
    const ModelSpec& m = sc_.model;
    const bool training = m.mode == Mode::kTraining;
    const bool embed = m.vocab_size > 0 && part_.embedding;
    const bool head = m.vocab_size > 0 && part_.head;
    // A tied matrix whose embedding and LM head sit on different stages is two copies, each
    // all-reduced over its own stage's DP group (Megatron adds a V x M/mp all-reduce between the
    // first and the last stage to keep them equal; not modelled, docs/model.md).
    const bool tied_here = m.tie_embeddings && part_.embedding && part_.head;
    // Forward: blocks in order; block l has an MoE FFN when model.is_moe_block(l).
    OpId prev = kNone;
    int moe = 0;
    for (int l = 0; l < part_.first_block; ++l) moe += is_moe(l) ? 1 : 0;
    moe_begin_ = moe;
    if (embed) prev = embedding(prev, /*backward=*/false);
    for (int l = part_.first_block; l < part_.end_block; ++l) {
      prev = attention(l, prev, /*backward=*/false);
      prev = is_moe(l) ? moe_forward(l, moe++, prev) : dense_ffn(l, prev, false);
    }
    if (head) prev = lm_head(prev, /*backward=*/false);
    // The MTP modules (training) run with the LM head, after it.
    const int mtp_end = head ? m.num_blocks() : m.layers;
    for (int l = m.layers; l < mtp_end; ++l) prev = mtp_module(l, moe, prev, false);
    StagePlan out;
    out.fwd_out = prev;
    out.bwd_begin = static_cast<OpId>(plan_.ops().size());
    if (training) {
      // Backward mirrors forward, last block first. The dense gradients fill buckets
      // (parallelism.grad_bucket) all-reduced as soon as they are full, on the "grad" stream, so
      // the next blocks' backward overlaps them (PyTorch DDP, Megatron's overlapped grad reduce).
      bucket_ = DenseBucket{};
      for (int l = mtp_end - 1; l >= m.layers; --l) prev = mtp_module(l, moe, prev, true);
      flush_dense_bucket(prev);
      // The MTP modules' embedding copy (the stage lacks the embedding): its gradient is complete.
      if (mtp_end > m.layers && !embed) vocab_gradient_sync("mtp.embed.grad.allreduce", prev);
      if (head) {
        prev = lm_head(prev, /*backward=*/true);
        // The LM head's gradient (shared with the MTP modules' heads) is complete.
        if (!tied_here) vocab_gradient_sync("lm_head.grad.allreduce", prev);
      }
      bucket_ = DenseBucket{};
      bucket_.first = !head;  // with a head, its gradients were the first bucket
      for (int l = part_.end_block - 1; l >= part_.first_block; --l) {
        prev = is_moe(l) ? moe_backward(l, --moe, prev) : dense_ffn(l, prev, true);
        prev = attention(l, prev, /*backward=*/true);
        dense_gradient_sync(l, prev);
      }
      flush_dense_bucket(prev);
      if (embed) {
        prev = embedding(prev, /*backward=*/true);
        // Tied: the one matrix's gradient (LM head + embedding) is complete only now.
        vocab_gradient_sync("embed.grad.allreduce", prev);
      }
    }
    out.bwd_out = prev;
    if (training) out.last_micro_batch_only.push_back(optimizer_step(prev));
    if (schedules::is_lina(dec_.schedule)) {
      grad_before_.resize(index_.moe_layers.size(), 0);
      schedules::apply_lina(plan_, index_, dec_.schedule, grad_before_);
    }
    out.built = BuiltPlan{std::move(plan_), std::move(index_)};
    return out;
  }

 private:
  bool is_moe(int l) const { return sc_.model.is_moe_block(l); }

  void init() {
    const ModelSpec& m = sc_.model;
    groups_ = make_groups(sc_);
    P_ = sc_.num_gpus();
    W_ = sc_.parallelism.ep;
    esp_ = sc_.parallelism.esp;
    mp_ = sc_.parallelism.mp;
    dp_ = sc_.parallelism.dp;
    S_ = m.tokens_per_gpu();
    // Folded (sequence parallel): a GPU holds S tokens of the residual stream; its TP group's
    // column-parallel GEMMs see the tp ranks' tokens all-gathered, S * tp rows (one CP chunk).
    sp_ = sc_.parallelism.folded() && mp_ > 1;
    cp_ = sc_.parallelism.folded() ? sc_.parallelism.cp : 1;
    tok_esp_ = sc_.parallelism.folded() ? 1 : esp_;
    etp_ = sc_.parallelism.folded() ? esp_ : 1;
    rows_ = sc_.parallelism.folded() ? S_ * mp_ : S_;
    L_ = m.seq_len;
    B_ = m.batch_per_gpu;
    M_ = m.model_dim;
    H_ = m.hidden_dim;
    E_ = sc_.num_experts();
    dE_ = m.local_experts();
    k_ = m.top_k;
    n_ = m.expert_shards();
    rep_ = dec_.parallel_degree;
    b_ = sc_.bytes_per_element();
    fp8_gemm_ = m.precision.gemm == Dtype::kFp8;
    grad_bytes_ = dtype_bytes(m.precision.main_grads);
    // Stream ids are created in a fixed order so that every rank (and exec/) sees the same ids.
    s_compute_ = plan_.stream("compute");
    s_comm_ = plan_.stream("comm");
    s_comm_out_ = plan_.stream("comm_out");
    s_param_ = plan_.stream("param");
    s_grad_ = plan_.stream("grad");
  }

  void check_decision() {
    const int num_moe = sc_.model.num_moe_layers();
    if (static_cast<int>(work_.layers.size()) != num_moe)
      throw InputError(
          fmt::format("plan builder: the workload has {} MoE layers, the model has {} (layers {} / "
                      "moe_every {})",
                      work_.layers.size(), num_moe, sc_.model.layers, sc_.model.moe_every));
    const SourceLocation where = sc_.location_of("strategies");
    const int r = dec_.pipeline_degree;
    if (r < 1)
      throw InputError(where, "pipeline",
                       fmt::format("strategy role pipeline: degree {}, expected >= 1", r));
    for (const auto& ld : work_.layers) {
      if (ld.num_gpus != P_ || ld.num_experts != E_)
        throw InputError(fmt::format(
            "plan builder: workload layer is {} GPUs x {} experts, the scenario has {} x {}",
            ld.num_gpus, ld.num_experts, P_, E_));
      if (ld.capacity < r)
        throw InputError(where, "pipeline",
                         fmt::format("strategy role pipeline: degree {} exceeds the expert "
                                     "capacity dC = {} tokens (chunks split dC)",
                                     r, ld.capacity));
    }
    if (rep_ < 1 || n_ % rep_ != 0)
      throw InputError(where, "parallel",
                       fmt::format("strategy role parallel: degree r = {} must divide the expert "
                                   "shard count n = {} (model.experts_per_gpu = {})",
                                   rep_, n_, sc_.model.experts_per_gpu));
    if (n_ > 1 && esp_ > 1)
      throw InputError(sc_.location_of("model.experts_per_gpu"), "model.experts_per_gpu",
                       "sharded experts (experts_per_gpu < 0) with parallelism.esp > 1: expected "
                       "one of the two ways of splitting an expert");
    if (dec_.inference &&
        (dec_.inference->layers.size() != work_.layers.size() || !dec_.variable_dispatch))
      throw InputError(fmt::format(
          "plan builder: inference placement of {} MoE layers for {} (variable dispatch {})",
          dec_.inference->layers.size(), work_.layers.size(), dec_.variable_dispatch));
    if (dec_.a2a != CollectiveAlgo::kLinear && dec_.a2a != CollectiveAlgo::k2dh &&
        dec_.a2a != CollectiveAlgo::k3dh && dec_.a2a != CollectiveAlgo::kDeepep &&
        dec_.a2a != CollectiveAlgo::kAuto)
      throw InputError(
          where, "a2a",
          fmt::format("strategy role a2a: algorithm {}, expected linear, 2dh, 3dh or deepep",
                      collective_algo_name(dec_.a2a)));
    if (dec_.a2a == CollectiveAlgo::kDeepep && !dec_.variable_dispatch)
      throw InputError(where, "a2a",
                       "strategy role a2a: deepep is the routed all_to_allv dispatch of the "
                       "sampled tokens; this decision sends padded buffers");
    if (schedules::is_fused_parm(dec_.schedule) && sc_.model.swiglu())
      throw InputError(where, "schedule",
                       fmt::format("strategy role schedule {} builds GELU expert FFNs (two "
                                   "GEMMs); model.activation is swiglu: expected another "
                                   "schedule, or activation gelu with expert_hidden_dim x 1.5",
                                   name_of(dec_.schedule)));
    if (schedules::is_parm(dec_.schedule)) {
      const std::string why = schedules::parm_inapplicable_reason(sc_, rep_);
      if (!why.empty())
        throw InputError(where, "schedule",
                         fmt::format("strategy role schedule {}: {}", name_of(dec_.schedule), why));
      // S1 splits the S tokens of a GPU over its mp ranks before the gate: whole tokens only.
      // Padding to ceil(S / mp) rows would gate padding rows that then compete for capacity
      // slots, so S1 is refused instead (parm_auto picks S2 here, parm_choose).
      if (dec_.schedule == ScheduleRole::kParmS1 && mp_ > 1 && S_ % mp_ != 0)
        throw InputError(sc_.location_of("model.batch_per_gpu"), "model.batch_per_gpu",
                         fmt::format("strategy role schedule parm_s1 splits the {} tokens per GPU "
                                     "(model.batch_per_gpu {} x model.seq_len {}) over mp = {} "
                                     "ranks: expected mp to divide them (or parm_s2 / parm_auto)",
                                     S_, B_, L_, mp_));
    }
    if (sc_.parallelism.folded()) {
      // Parm's fused layers split the MP ranks' shared tokens (overlapped layout); folded, every
      // rank already holds its own tokens.
      if (schedules::is_parm(dec_.schedule))
        throw InputError(where, "schedule",
                         fmt::format("strategy role schedule {} needs parallelism.layout "
                                     "overlapped or disjoint; found layout folded (expected "
                                     "another schedule)",
                                     name_of(dec_.schedule)));
      // A routed dispatch's per-rank expert scale counts one rank's received rows; under ETP the
      // GEMMs run on the ETP group's gathered rows, which the routed matrices do not give.
      if (esp_ > 1 && dec_.variable_dispatch)
        throw InputError(sc_.location_of("parallelism.etp"), "parallelism.etp",
                         fmt::format("found {} with a routed (all_to_allv) dispatch, expected etp "
                                     "1 there: expert tensor parallelism is lowered for the "
                                     "padded dispatch only",
                                     esp_));
    }
    if (dec_.a2a == CollectiveAlgo::k3dh && dec_.variable_dispatch)
      throw InputError(where, "a2a",
                       "strategy role a2a: 3dh is defined for the padded all_to_all, not for a "
                       "routed all_to_allv dispatch");
    if ((dec_.a2a == CollectiveAlgo::k2dh || dec_.a2a == CollectiveAlgo::k3dh) && W_ > 1) {
      const auto* algo = collectives::find_algorithm(CollectiveType::kAllToAll, dec_.a2a);
      MOESIM_ASSERT(algo != nullptr, "hierarchical all_to_all is not registered");
      CollectiveSpec spec;
      spec.type = CollectiveType::kAllToAll;
      spec.algo = dec_.a2a;
      spec.bytes = Bytes(static_cast<double>(W_));
      for (size_t gi = 0; gi < groups_.ep.groups.size(); ++gi) {
        collectives::CollectiveCall call;
        call.spec = &spec;
        call.group = &groups_.ep.groups[gi];
        call.group_index = static_cast<int>(gi);
        call.with_layout = false;
        std::string why = algo->inapplicable_reason(call, topo_);
        if (!why.empty())
          throw InputError(where, "a2a",
                           fmt::format("strategy role a2a: {} cannot run on EP group {}: {}",
                                       collective_algo_name(dec_.a2a), gi, why));
      }
    }
  }

  // ---- op helpers -------------------------------------------------------------------------

  GroupingId grouping(const Grouping& g) {
    for (const auto& [name, id] : grouping_ids_)
      if (name == g.name) return id;
    GroupingId id = plan_.add_grouping(g);
    grouping_ids_.emplace_back(g.name, id);
    return id;
  }

  OpId gemm(ComputeClass cls, GemmShape shape, double flops, std::vector<OpId> deps, OpTag label,
            std::shared_ptr<const std::vector<float>> rank_scale = nullptr, bool fp8 = false,
            bool replay = false, double cast_bytes = 0) {
    ComputeSpec spec;
    spec.cls = cls;
    spec.flops = Flops(flops);
    spec.gemm = shape;
    spec.rank_scale = std::move(rank_scale);
    spec.fp8 = fp8;
    spec.recompute = replay;
    spec.cast_bytes = Bytes(fp8 ? cast_bytes : 0.0);
    return plan_.add_compute(RankSet::all(P_), s_compute_, std::move(spec), std::move(deps),
                             std::move(label));
  }

  // fp8 GEMMs (docs/model.md, "Precision"): HBM bytes of the quantization kernels that feed one,
  // as DeepSeek-V3's recipe runs them (1 x 128 tiles, one fp32 scale per 128 elements). Forward:
  // the input cast (read at b, write 1 byte), unless it arrives in fp8; backward: the output
  // gradient cast twice (per token for the input gradient, transposed per channel for the weight
  // gradient) and the cached fp8 input transposed (read and write 1 byte).
  double fp8_cast_bytes(const GemmShape& s, bool backward, bool input_fp8) const {
    const double batch = static_cast<double>(s.batch), m = static_cast<double>(s.m);
    const double in = m * static_cast<double>(s.k) * batch;
    const double out = m * static_cast<double>(s.n) * batch;
    constexpr double kScale = 4.0 / 128.0;
    if (!backward) return input_fp8 ? 0.0 : in * (static_cast<double>(b_) + 1.0 + kScale);
    return 2.0 * out * (static_cast<double>(b_) + 1.0 + kScale) + in * (2.0 + kScale);
  }

  OpId kernel(ComputeClass cls, double flops, double bytes, std::vector<OpId> deps, OpTag label) {
    ComputeSpec spec;
    spec.cls = cls;
    spec.flops = Flops(flops);
    spec.bytes = Bytes(bytes);
    return plan_.add_compute(RankSet::all(P_), s_compute_, std::move(spec), std::move(deps),
                             std::move(label));
  }

  OpId collective(StreamId stream, CollectiveType type, CollectiveAlgo algo, GroupingId g,
                  double bytes, std::vector<OpId> deps, OpTag label) {
    CollectiveSpec spec;
    spec.type = type;
    spec.algo = algo;
    spec.grouping = g;
    spec.bytes = Bytes(bytes);
    return plan_.add_collective(stream, std::move(spec), std::move(deps), std::move(label));
  }

  // ---- routed dispatch (Decision::variable_dispatch, docs/strategy-specs.md §8)
  // ------------------------ The workload's per-pair token counts (dispatch_matrix) move as an
  // all_to_allv instead of the padded all_to_all; chunk j of r carries c / r (+1 for the first c %
  // r chunks) of every pair's c tokens. Expert GEMMs run on the tokens a rank received: rank_scale
  // = received tokens / the padded W * cap * dE the GEMM shape assumes.
  struct RoutedChunk {
    std::vector<std::shared_ptr<const ByteMatrix>> to_experts, to_tokens;  // per EP group
    std::vector<std::shared_ptr<const ExpertRouting>> routing;  // per EP group (every chunk's)
    std::shared_ptr<const std::vector<float>> rank_scale;
    // a2a deepep: the distinct tokens per destination GPU and node, per EP group
    std::vector<std::shared_ptr<const NodeDedup>> dedup;
    // The forward dispatch's matrices and counts at model.precision.dispatch's bytes per token,
    // when they differ from the combine's (fp8 dispatch, bf16 combine); else empty.
    std::vector<std::shared_ptr<const ByteMatrix>> to_experts_fwd;
    std::vector<std::shared_ptr<const NodeDedup>> dedup_fwd;
  };
  // a2a deepep in a plan for the real backend: the distinct tokens of the assignment exec moves
  // (core/routed_assignment.hpp), not the workload's sampled token sets, which exec cannot
  // reproduce from the counts; `exec --predict` then prices what runs. One chunk: exec forwards
  // a token's rows within the chunk that carried it, and the per-pair chunk split of the counts
  // does not keep a token's destinations together.
  std::shared_ptr<const NodeDedup> exec_dedup(const ExpertRouting& split,
                                              const std::vector<int>& grp, Bytes unit,
                                              std::uint32_t chunks) const {
    if (chunks != 1)
      throw InputError(fmt::format(
          "a2a deepep on the real backend runs with pipeline degree 1 (found {}): set the "
          "strategy's pipeline: 1",
          chunks));
    std::set<int> nodes;
    const int gpn = std::max(1, sc_.cluster.gpus_per_node);
    for (int g : grp) nodes.insert(g / gpn);
    return assignment_dedup(split, static_cast<int>(S_), sc_.model.top_k,
                            static_cast<int>(nodes.size()), unit);
  }
  const std::vector<RoutedChunk>& routed(int moe) {
    if (routed_.size() <= static_cast<std::size_t>(moe)) routed_.resize(moe + 1);
    auto& chunks = routed_[moe];
    if (!chunks.empty()) return chunks;
    const MoeDims dims = moe_dims(moe);
    const auto& layer = work_.layers[moe];
    const auto placement = workload::ExpertPlacement::of(sc_.model);
    const Bytes unit(token_bytes(sc_.model.precision.combine));
    const Bytes fwd_unit(token_bytes(sc_.model.precision.dispatch));
    const bool own_fwd = fwd_unit.value() != unit.value();
    const auto r = static_cast<std::uint32_t>(dims.chunks.size());
    chunks.resize(r);
    std::vector<std::vector<float>> scale(r, std::vector<float>(P_, 0.0f));
    for (std::size_t gi = 0; gi < groups_.ep.groups.size(); ++gi) {
      const auto& grp = groups_.ep.groups[gi];
      // Inference placement (docs/strategy-specs.md §7): the placement decided where the tokens go.
      const ByteMatrix full = dec_.inference
                                  ? *dec_.inference->layers.at(moe).tokens.at(gi)
                                  : workload::dispatch_matrix(layer, grp, placement, unit);
      // The expert split behind `full`, for the real backend's data path (ExpertRouting).
      std::shared_ptr<const ExpertRouting> split;
      if (!dec_.expert_routing) {
        // simulation: nothing reads it (Decision::expert_routing)
      } else if (dec_.inference) {
        const auto& rt = dec_.inference->layers.at(moe).routing;
        if (gi < rt.size()) split = rt[gi];
      } else if (placement.shards == 1) {
        auto er = std::make_shared<ExpertRouting>();
        er->size = static_cast<int>(grp.size());
        er->experts = static_cast<int>(E_);
        er->experts_per_gpu = placement.experts_per_gpu;
        er->counts.resize(grp.size() * static_cast<std::size_t>(E_));
        for (std::size_t a = 0; a < grp.size(); ++a)
          for (int e = 0; e < er->experts; ++e)
            er->counts[a * static_cast<std::size_t>(E_) + static_cast<std::size_t>(e)] =
                layer.at(grp[a], e);
        split = std::move(er);
      }
      for (std::uint32_t j = 0; j < r; ++j) {
        ByteMatrix m = full;
        for (auto& c : m.counts) c = c / r + (j < c % r ? 1u : 0u);
        const double padded = static_cast<double>(W_ * dims.chunks[j] * dE_);
        for (int pos = 0; pos < m.size; ++pos)
          scale[j][grp[pos]] =
              padded > 0 ? static_cast<float>(m.col_sum(pos).value() / unit.value() / padded) : 0;
        ByteMatrix t = m;
        const auto w = static_cast<std::size_t>(m.size);
        for (std::size_t a = 0; a < w; ++a)
          for (std::size_t c = a + 1; c < w; ++c)
            std::swap(t.counts[a * w + c], t.counts[c * w + a]);
        if (own_fwd) {
          ByteMatrix f = m;
          f.unit = fwd_unit;
          chunks[j].to_experts_fwd.push_back(std::make_shared<const ByteMatrix>(std::move(f)));
        }
        chunks[j].to_experts.push_back(std::make_shared<const ByteMatrix>(std::move(m)));
        chunks[j].to_tokens.push_back(std::make_shared<const ByteMatrix>(std::move(t)));
        if (split) chunks[j].routing.push_back(split);
        if (dec_.a2a == CollectiveAlgo::kDeepep) {
          chunks[j].dedup.push_back(split ? exec_dedup(*split, grp, unit, r)
                                          : workload::node_dedup(layer, grp, unit, j, r));
          if (own_fwd) {
            NodeDedup f = *chunks[j].dedup.back();
            f.unit = fwd_unit;
            chunks[j].dedup_fwd.push_back(std::make_shared<const NodeDedup>(std::move(f)));
          }
        }
      }
    }
    for (std::uint32_t j = 0; j < r; ++j)
      chunks[j].rank_scale = std::make_shared<const std::vector<float>>(std::move(scale[j]));
    return chunks;
  }

  // Dispatch / combine collective of chunk j: the padded all_to_all, or the routed all_to_allv
  // (to_experts: dispatch forward and combine backward; else combine forward, dispatch backward).
  // forward_dispatch: the forward pass's dispatch, at model.precision.dispatch's bytes.
  OpId moe_a2a(StreamId stream, int moe, std::size_t j, bool to_experts, double padded_bytes,
               std::vector<OpId> deps, OpTag label, bool forward_dispatch = false) {
    if (!dec_.variable_dispatch)
      return collective(stream, CollectiveType::kAllToAll, dec_.a2a, grouping(groups_.ep),
                        padded_bytes, std::move(deps), std::move(label));
    const RoutedChunk& rc = routed(moe)[j];
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAllv;
    spec.algo = dec_.a2a;
    spec.grouping = grouping(groups_.ep);
    const bool fwd = forward_dispatch && !rc.to_experts_fwd.empty();
    const auto& mats = fwd ? rc.to_experts_fwd : to_experts ? rc.to_experts : rc.to_tokens;
    if (mats.size() == 1)
      spec.matrix = mats[0];
    else
      spec.per_group = mats;
    if (rc.routing.size() == mats.size()) spec.expert_routing = rc.routing;
    if (!rc.dedup.empty()) {
      spec.node_dedup = forward_dispatch && !rc.dedup_fwd.empty() ? rc.dedup_fwd : rc.dedup;
      spec.dedup_combine = !to_experts;
    }
    return plan_.add_collective(stream, std::move(spec), std::move(deps), std::move(label));
  }
  // Expert weights moved between the GPUs of every EP group (inference placement): an
  // all_to_allv of per-group matrices counted in experts.
  OpId weight_move(StreamId stream, const std::vector<std::shared_ptr<const ByteMatrix>>& mats,
                   std::vector<OpId> deps, OpTag label) {
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAllv;
    spec.algo = CollectiveAlgo::kLinear;
    spec.grouping = grouping(groups_.ep);
    if (mats.size() == 1)
      spec.matrix = mats[0];
    else
      spec.per_group = mats;
    return plan_.add_collective(stream, std::move(spec), std::move(deps), std::move(label));
  }
  std::shared_ptr<const std::vector<float>> expert_scale(int moe, std::size_t j) {
    return dec_.variable_dispatch ? routed(moe)[j].rank_scale : nullptr;
  }

  std::string lbl(int l, bool backward, std::string_view what) const {
    return fmt::format("L{}.{}.{}", l, backward ? "bwd" : "fwd", what);
  }
  // The gradient all-reduce of block l's dense (or expert) parameters, in the backward pass.
  static OpRole grad_role(int l, bool experts) {
    return OpRole{experts ? OpRoleKind::kExpertGradSync : OpRoleKind::kDenseGradSync, true, l, -1};
  }
  // A MoE data step exec runs: its role, labelled by role_label (core/plan.hpp).
  static OpTag tag(int l, bool backward, OpRoleKind kind, std::size_t chunk = ~std::size_t{0}) {
    return OpTag(
        OpRole{kind, backward, l, chunk == ~std::size_t{0} ? -1 : static_cast<int>(chunk)});
  }

  // ---- dense parts ------------------------------------------------------------------------

  // ---- operator-level lowering of a block (docs/model.md, "Transformer block l") ----------
  // A block's forward is a list of kernels; backward runs the same list reversed at 2x the FLOPs
  // (input and weight gradients), preceded by the forward kernels model.recompute replays. Each
  // kernel is described once (KernelDesc) so forward, backward and the recomputed forward cannot
  // disagree.
  struct KernelDesc {
    ComputeClass cls = ComputeClass::kGemm;
    std::string what;
    GemmShape shape{};       // GEMMs and the attention core
    double flops = 0;        // forward FLOPs
    double bytes = 0;        // elementwise kernels: HBM bytes (read + write)
    bool fp8 = false;        // a linear layer under model.precision.gemm: fp8
    bool recompute = false;  // replayed in backward (model.recompute)
    // Sequence parallelism (layout folded, tp > 1): the TP all-gather of the S * tp rows before
    // this kernel (a column-parallel GEMM's input) / their reduce-scatter after it (a row-parallel
    // GEMM's output); backward runs the mirror (reduce-scatter after, all-gather before).
    bool sp_gather_before = false;
    bool sp_scatter_after = false;
    // Context parallelism (the attention core, cp > 1): the K and V all-gathered over the CP
    // group, output bytes per rank; backward gathers them again and reduce-scatters dK, dV.
    double cp_kv_bytes = 0;
  };

  KernelDesc linear(std::string what, std::int64_t rows, std::int64_t out, std::int64_t in) const {
    KernelDesc d;
    d.what = std::move(what);
    d.shape = GemmShape{rows, out, in, 1};
    d.flops = d.shape.flops();
    d.fp8 = fp8_gemm_;
    return d;
  }
  static KernelDesc elementwise(std::string what, double elements_read, double elements_written,
                                double bytes_per_element) {
    KernelDesc d;
    d.cls = ComputeClass::kNorm;
    d.what = std::move(what);
    d.bytes = (elements_read + elements_written) * bytes_per_element;
    return d;
  }
  // RMSNorm / LayerNorm with the residual add fused (TransformerEngine, Megatron): reads the
  // residual stream and the sublayer output, writes the new residual and the normalised input.
  KernelDesc norm(std::string what, double rows, double width) const {
    return elementwise(std::move(what), 2 * rows * width, 2 * rows * width, b_);
  }

  OpId emit(const KernelDesc& d, bool backward, bool replay, int l, OpId dep) {
    ComputeSpec spec;
    spec.cls = d.cls;
    spec.flops = Flops(backward && !replay ? 2.0 * d.flops : d.flops);
    spec.bytes = Bytes(d.bytes);
    if (d.cls == ComputeClass::kGemm || d.cls == ComputeClass::kAttention) spec.gemm = d.shape;
    if (d.cls == ComputeClass::kNorm) spec.flops = Flops(0);
    spec.fp8 = d.fp8;
    if (d.fp8 && d.cls == ComputeClass::kGemm)
      spec.cast_bytes = Bytes(fp8_cast_bytes(d.shape, backward && !replay, false));
    spec.recompute = replay;
    spec.backward = backward && !replay;
    const std::string label =
        replay ? lbl(l, true, "recompute." + d.what) : lbl(l, backward, d.what);
    return plan_.add_compute(RankSet::all(P_), s_compute_, std::move(spec), deps_of({dep}), label);
  }
  // One TP (sequence-parallel) or CP collective around kernel d; `what` names it after the
  // kernel's sublayer ("attn.sp_allgather").
  OpId around(const KernelDesc& d, CollectiveType type, const Grouping& g, double bytes,
              std::string_view what, bool backward, int l, OpId dep) {
    const std::string part = d.what.substr(0, d.what.find('.'));
    return collective(s_comm_, type, CollectiveAlgo::kAuto, grouping(g), bytes, deps_of({dep}),
                      lbl(l, backward, part + "." + std::string(what)));
  }
  // A kernel with its sequence- / context-parallel collectives. Forward and the recomputed
  // forward: [TP all-gather] [CP K/V all-gather] kernel [TP reduce-scatter]; backward, the
  // mirror: [TP all-gather] [CP K/V all-gather] kernel [CP dK/dV reduce-scatter]
  // [TP reduce-scatter].
  OpId emit_with_comm(const KernelDesc& d, bool backward, bool replay, int l, OpId dep) {
    const double tp_bytes = static_cast<double>(rows_ * M_ * b_);
    const bool bwd = backward && !replay;
    const auto ag = CollectiveType::kAllGather, rs = CollectiveType::kReduceScatter;
    OpId last = dep;
    if (bwd ? d.sp_scatter_after : d.sp_gather_before)
      last = around(d, ag, groups_.mp, tp_bytes, "sp_allgather", backward, l, last);
    if (d.cp_kv_bytes > 0)
      last = around(d, ag, groups_.cp, d.cp_kv_bytes, "cp_kv_allgather", backward, l, last);
    last = emit(d, backward, replay, l, last);
    if (bwd && d.cp_kv_bytes > 0)
      last = around(d, rs, groups_.cp, d.cp_kv_bytes, "cp_kv_reduce_scatter", backward, l, last);
    if (bwd ? d.sp_gather_before : d.sp_scatter_after)
      last = around(d, rs, groups_.mp, tp_bytes, "sp_reduce_scatter", backward, l, last);
    return last;
  }
  // Forward: the kernels in order. Backward: the recomputed ones first (in forward order), then
  // every kernel in reverse.
  OpId run_kernels(const std::vector<KernelDesc>& ks, int l, bool backward, OpId prev) {
    OpId last = prev;
    if (!backward) {
      for (const auto& k : ks) last = emit_with_comm(k, false, false, l, last);
      return last;
    }
    for (const auto& k : ks)
      if (k.recompute) last = emit_with_comm(k, true, true, l, last);
    for (auto it = ks.rbegin(); it != ks.rend(); ++it)
      last = emit_with_comm(*it, true, false, l, last);
    return last;
  }
  // Sequence parallelism: the first GEMM after the block's norm takes the all-gathered rows, the
  // last one's output is reduce-scattered (both none when the list has no GEMM).
  void mark_sequence_parallel(std::vector<KernelDesc>& ks) const {
    if (!sp_) return;
    auto first = std::find_if(ks.begin(), ks.end(),
                              [](const KernelDesc& k) { return k.cls == ComputeClass::kGemm; });
    auto last = std::find_if(ks.rbegin(), ks.rend(),
                             [](const KernelDesc& k) { return k.cls == ComputeClass::kGemm; });
    if (first == ks.end()) return;
    first->sp_gather_before = true;
    last->sp_scatter_after = true;
  }

  // The attention sublayer's kernels (MHA / GQA / MLA by model.attention), split over mp by heads
  // as Megatron splits them (MLA's down-projections are not split).
  std::vector<KernelDesc> attention_kernels() const {
    const AttentionSpec& a = sc_.model.attention;
    const ModelSpec& m = sc_.model;
    const RecomputeSpec& rc = m.recompute;
    // The norm runs on the rank's S tokens; everything after it on the rows the GEMMs see (the
    // all-gathered S * tp under sequence parallelism).
    const double S = static_cast<double>(rows_);
    // Per MP rank: heads / mp (the loader checks mp | heads where attention is written).
    const auto per_rank = [this](std::int64_t width) { return div_up(width, mp_); };
    const std::int64_t dqk = a.qk_head_dim(), dv = a.value_head_dim();
    const std::int64_t h = a.heads;
    std::vector<KernelDesc> ks;
    ks.push_back(norm("attn.norm", static_cast<double>(S_), static_cast<double>(M_)));
    ks.back().recompute = rc.has(RecomputeModule::kLayernorm);
    if (!a.is_mla()) {
      const std::int64_t qkv = per_rank((h + 2 * a.kv_heads) * a.head_dim);
      ks.push_back(linear("attn.qkv", rows_, qkv, M_));
      // Rotary on q and k: read and write them once.
      const double qk = S * static_cast<double>(per_rank((h + a.kv_heads) * a.head_dim));
      ks.push_back(elementwise("attn.rope", qk, qk, b_));
    } else {
      const std::int64_t ql = a.q_lora_rank, kvl = a.kv_lora_rank, rope = a.qk_rope_head_dim;
      if (ql > 0) {
        ks.push_back(linear("attn.qkv_down", rows_, ql + kvl + rope, M_));
      } else {
        ks.push_back(linear("attn.q", rows_, per_rank(h * dqk), M_));
        ks.push_back(linear("attn.kv_down", rows_, kvl + rope, M_));
      }
      // The latents' RMSNorms.
      const double latent = S * static_cast<double>(ql + kvl);
      ks.push_back(elementwise("attn.latent_norm", latent, latent, b_));
      ks.back().recompute = rc.has(RecomputeModule::kLayernorm);
      const bool up = rc.has(RecomputeModule::kMlaUpProj);
      if (ql > 0) {
        ks.push_back(linear("attn.q_up", rows_, per_rank(h * dqk), ql));
        ks.back().recompute = up;
      }
      ks.push_back(linear("attn.kv_up", rows_, per_rank(h * (a.qk_nope_head_dim + dv)), kvl));
      ks.back().recompute = up;
      const double roped = S * static_cast<double>(per_rank(h * rope) + rope);
      ks.push_back(elementwise("attn.rope", roped, roped, b_));
      ks.back().recompute = up;
    }
    // The core (FlashAttention): QK^T over dqk and PV over dv per query head; causal skips half.
    const double hp = static_cast<double>(h) / static_cast<double>(mp_);
    KernelDesc core;
    core.cls = ComputeClass::kAttention;
    core.what = "attn.core";
    // Each rank's queries are its CP chunk (L / cp of every sequence) against the whole sequence's
    // keys (context parallelism exchanges K and V).
    const std::int64_t q_len = L_ / cp_;
    core.shape = GemmShape{q_len, L_, dqk, std::max<std::int64_t>(1, rows_ / q_len * h / mp_)};
    core.flops = 2.0 * S * static_cast<double>(L_) * hp * static_cast<double>(dqk + dv) *
                 (a.causal ? 0.5 : 1.0);
    core.recompute = rc.has(RecomputeModule::kCoreAttn);
    if (m.serving_iteration()) {  // a serving batch: each query against its own KV cache
      const ServingCore c = serving_attention_core(m, rows_, mp_);
      core.flops = c.flops;
      core.bytes = c.bytes;
      core.shape = c.shape;
    }
    // CP: the K and V of the other chunks (cp chunks of rows_ each, the rank's heads; MLA's after
    // the up-projection, as Megatron's CP exchanges them), gathered whole (ring moves the same).
    const std::int64_t kv_width =
        a.is_mla() ? per_rank(h * dqk) + per_rank(h * dv) : 2 * per_rank(a.kv_heads * a.head_dim);
    if (cp_ > 1)
      core.cp_kv_bytes = static_cast<double>(cp_) * S * static_cast<double>(kv_width * b_);
    ks.push_back(core);
    ks.push_back(linear("attn.proj", rows_, M_, per_rank(h * dv)));
    if (rc.full())
      for (auto& k : ks) k.recompute = true;
    mark_sequence_parallel(ks);
    return ks;
  }

  // Weights of a kernel list: the linear layers' in x out (the parameters a rank holds).
  static double linear_params(const std::vector<KernelDesc>& ks) {
    double p = 0;
    for (const auto& k : ks)
      if (k.cls == ComputeClass::kGemm)
        p += static_cast<double>(k.shape.n) * static_cast<double>(k.shape.k);
    return p;
  }

  OpId attention(int l, OpId prev, bool backward) {
    OpId last = run_kernels(attention_kernels(), l, backward, prev);
    // Megatron's g (forward) after the output projection, f's backward after the QKV backward
    // (sequence parallel: the reduce-scatter and all-gather of run_kernels instead).
    if (mp_ > 1 && !sp_)
      last = collective(s_comm_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), static_cast<double>(S_ * M_ * b_), deps_of({last}),
                        lbl(l, backward, "attn.mp_allreduce"));
    return last;
  }

  // The kernels of an FFN of hidden size `hidden` on the block's S tokens, split mp ways: its
  // norm (dense blocks; an MoE block's norm runs before the gate), fc1 (2x wide under SwiGLU),
  // the activation, fc2.
  std::vector<KernelDesc> ffn_kernels(std::int64_t hidden, const std::string& what, bool with_norm,
                                      bool replay) const {
    const ModelSpec& m = sc_.model;
    const std::int64_t Hp = div_up(hidden, mp_);
    const std::int64_t w1 = m.fc1_width(Hp);
    std::vector<KernelDesc> ks;
    if (with_norm) {
      ks.push_back(norm(what + ".norm", static_cast<double>(S_), static_cast<double>(M_)));
      ks.back().recompute = m.recompute.has(RecomputeModule::kLayernorm);
    }
    ks.push_back(linear(what + ".fc1", rows_, w1, M_));
    ks.back().recompute = replay;
    ks.push_back(elementwise(what + ".act", static_cast<double>(rows_ * w1),
                             static_cast<double>(rows_ * Hp), b_));
    ks.back().recompute = replay;
    ks.push_back(linear(what + ".fc2", rows_, M_, Hp));
    ks.back().recompute = replay;
    if (m.recompute.full())
      for (auto& k : ks) k.recompute = true;
    mark_sequence_parallel(ks);
    return ks;
  }

  OpId ffn(int l, OpId prev, bool backward, std::int64_t hidden, const std::string& what,
           bool with_norm, bool replay) {
    OpId last = run_kernels(ffn_kernels(hidden, what, with_norm, replay), l, backward, prev);
    if (mp_ > 1 && !sp_)
      last = collective(s_comm_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), static_cast<double>(S_ * M_ * b_), deps_of({last}),
                        lbl(l, backward, what + ".mp_allreduce"));
    return last;
  }

  // Dense FFN of hidden size model.dense_hidden() (4M unless dense_hidden_dim is set).
  OpId dense_ffn(int l, OpId prev, bool backward) {
    return ffn(l, prev, backward, sc_.model.dense_hidden(), "ffn", true,
               sc_.model.recompute.has(RecomputeModule::kMlp));
  }

  // Token embedding (vocab-parallel over mp, Megatron): a row gather of S*M*b, then an MP
  // all-reduce of S*M*b when mp > 1; backward: the scatter-add of the rows' gradients. Sequence
  // parallel: the TP group's S * tp rows, reduce-scattered to the ranks' S (the gradients'
  // all-gather before the backward).
  OpId embedding(OpId prev, bool backward, const std::string& prefix = "") {
    const double bytes = 2.0 * static_cast<double>(rows_ * M_ * b_);
    const double sp_bytes = static_cast<double>(rows_ * M_ * b_);
    if (sp_ && backward)
      prev = collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), sp_bytes, deps_of({prev}),
                        prefix + "embed.bwd.sp_allgather");
    OpId last = kernel(ComputeClass::kElementwise, 0, bytes, deps_of({prev}),
                       prefix + (backward ? "embed.bwd" : "embed.fwd"));
    if (sp_ && !backward)
      return collective(s_comm_, CollectiveType::kReduceScatter, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), sp_bytes, deps_of({last}),
                        prefix + "embed.sp_reduce_scatter");
    if (!backward && mp_ > 1)
      last = collective(s_comm_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), static_cast<double>(S_ * M_ * b_), deps_of({last}),
                        prefix + "embed.mp_allreduce");
    return last;
  }

  // LM head S x M . M x V/mp and the loss over the S x V/mp logits (softmax cross-entropy: read
  // and write the logits, ~5 FLOPs per logit; Megatron's vocab-parallel version all-reduces two
  // floats per token over mp). Backward: the loss's gradient, then the GEMM at 2x the FLOPs.
  // Sequence parallel: the head's input is the TP group's S * tp rows, all-gathered (its
  // gradient reduce-scattered after the backward GEMM).
  OpId lm_head(OpId prev, bool backward, const std::string& prefix = "") {
    const std::int64_t Vp = div_up(static_cast<std::int64_t>(sc_.model.vocab_size), mp_);
    const GemmShape head{rows_, Vp, M_, 1};
    const double logits = static_cast<double>(rows_ * Vp);
    const double loss_bytes = 2.0 * logits * static_cast<double>(b_);
    const double sp_bytes = static_cast<double>(rows_ * M_ * b_);
    if (backward) {
      OpId g = kernel(ComputeClass::kElementwise, 2 * logits, loss_bytes, deps_of({prev}),
                      prefix + "loss.bwd");
      OpId last =
          gemm(ComputeClass::kGemm, head, 2.0 * head.flops(), deps_of({g}), prefix + "lm_head.bwd");
      if (sp_)
        last = collective(s_comm_, CollectiveType::kReduceScatter, CollectiveAlgo::kAuto,
                          grouping(groups_.mp), sp_bytes, deps_of({last}),
                          prefix + "lm_head.bwd.sp_reduce_scatter");
      return last;
    }
    if (sp_)
      prev = collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), sp_bytes, deps_of({prev}),
                        prefix + "lm_head.sp_allgather");
    OpId h = gemm(ComputeClass::kGemm, head, head.flops(), deps_of({prev}), prefix + "lm_head.fwd");
    OpId last = kernel(ComputeClass::kElementwise, 5 * logits, loss_bytes, deps_of({h}),
                       prefix + "loss.fwd");
    if (mp_ > 1)
      last = collective(s_comm_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), 8.0 * static_cast<double>(rows_), deps_of({last}),
                        prefix + "loss.mp_allreduce");
    return last;
  }

  // MTP module of block l (model.mtp_layers; DeepSeek-V3, section 2.2): the embeddings of the
  // tokens one depth further ahead and the previous depth's hidden states, each normalised,
  // concatenated and projected 2M -> M (column-parallel over mp, all-gathered), then block l and
  // the shared LM head with a loss of its own. Backward runs it in reverse; `moe` is the running
  // MoE layer index (advanced in forward, taken back in backward).
  OpId mtp_module(int l, int& moe, OpId prev, bool backward) {
    const std::string prefix = fmt::format("L{}.mtp.", l);
    const double S = static_cast<double>(S_), M = static_cast<double>(M_);
    std::vector<KernelDesc> ks = {norm("mtp.norms", S, 2 * M),
                                  linear("mtp.proj", rows_, div_up(M_, mp_), 2 * M_)};
    mark_sequence_parallel(ks);
    const bool gather = mp_ > 1 && !sp_;
    const double gather_bytes = static_cast<double>(S_ * M_ * b_);
    if (!backward) {
      prev = embedding(prev, false, prefix);
      prev = run_kernels(ks, l, false, prev);
      if (gather)
        prev = collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                          grouping(groups_.mp), gather_bytes, deps_of({prev}),
                          lbl(l, false, "mtp.proj.mp_allgather"));
      prev = attention(l, prev, false);
      prev = is_moe(l) ? moe_forward(l, moe++, prev) : dense_ffn(l, prev, false);
      return lm_head(prev, false, prefix);
    }
    prev = lm_head(prev, true, prefix);
    prev = is_moe(l) ? moe_backward(l, --moe, prev) : dense_ffn(l, prev, true);
    prev = attention(l, prev, true);
    if (gather)
      prev = collective(s_comm_, CollectiveType::kReduceScatter, CollectiveAlgo::kAuto,
                        grouping(groups_.mp), gather_bytes, deps_of({prev}),
                        lbl(l, true, "mtp.proj.mp_reduce_scatter"));
    prev = run_kernels(ks, l, true, prev);
    dense_gradient_sync(l, prev);
    return embedding(prev, true, prefix);
  }

  // The V x M/mp embedding (or LM head) weights' gradient, all-reduced over the dense DP group
  // like a block's dense bucket: tied, one all-reduce after the embedding's backward; untied, the
  // LM head's right after its backward and the embedding's at the end.
  void vocab_gradient_sync(const std::string& label, OpId after) {
    if (groups_.dense_dp.group_size() <= 1) return;
    const double bytes = static_cast<double>(sc_.model.vocab_size) *
                         static_cast<double>(div_up(M_, mp_)) * grad_bytes_;
    gradient_allreduce(groups_.dense_dp, bytes, after, label,
                       OpRole{OpRoleKind::kDenseGradSync, true, -1, -1});
  }

  // The optimizer step (Adam, memory-bound) over the parameters this rank updates, once the
  // step's backward and every gradient reduction are done: read the gradient (main_grads), read
  // and write the fp32 master copy (mixed precision) and both moments (precision.moments), write
  // the weight.
  // parallelism.zero: 1 (Megatron's distributed optimizer) updates a 1/replicas share of them.
  OpId optimizer_step(OpId after) {
    const ModelSpec& m = sc_.model;
    const bool zero = sc_.parallelism.zero >= 1;
    const double dense_replicas = zero ? std::max(1, groups_.dense_dp.group_size()) : 1;
    const double expert_replicas = zero ? std::max(1, groups_.dp.group_size()) : 1;
    double dense = 0, experts = 0;
    std::vector<int> blocks;
    for (int l = part_.first_block; l < part_.end_block; ++l) blocks.push_back(l);
    const bool head = m.vocab_size > 0 && part_.head;
    for (int l = m.layers; head && l < m.num_blocks(); ++l) blocks.push_back(l);
    for (int l : blocks) {
      dense += dense_param_bytes(l) / grad_bytes_;
      if (is_moe(l))
        experts += static_cast<double>(m.ffn_params(H_)) * static_cast<double>(dE_) /
                   static_cast<double>(esp_ * n_);
    }
    const double vocab = static_cast<double>(m.vocab_size) * static_cast<double>(div_up(M_, mp_));
    if (m.vocab_size > 0 && part_.embedding) dense += vocab;
    if (m.vocab_size > 0 && part_.head && !(m.tie_embeddings && part_.embedding)) dense += vocab;
    if (head && m.mtp_blocks() > 0 && !part_.embedding) dense += vocab;  // the MTP's copy
    const double params = dense / dense_replicas + experts / expert_replicas;
    const double per_param = grad_bytes_ + 4.0 * dtype_bytes(m.precision.moments) +
                             (b_ < 4 ? 8.0 : 0.0) + static_cast<double>(b_);
    std::vector<OpId> deps = index_.gradient_sync;
    deps.push_back(after);
    ComputeSpec spec;
    spec.cls = ComputeClass::kOptimizer;
    spec.flops = Flops(0);
    spec.bytes = Bytes(params * per_param);
    return plan_.add_compute(RankSet::all(P_), s_compute_, std::move(spec), std::move(deps),
                             "optimizer.step");
  }

  // The shared experts of MoE block l (model.shared_experts = N): one FFN of hidden N*H on the
  // block's S tokens, like the dense FFN. kNone when the model has none; else the last op.
  OpId shared_experts(int l, OpId prev, bool backward) {
    const int n = sc_.model.shared_experts;
    if (n <= 0) return kNone;
    const RecomputeSpec& rc = sc_.model.recompute;
    return ffn(l, prev, backward, static_cast<std::int64_t>(n) * H_, "shared", false,
               rc.has(RecomputeModule::kSharedExperts) || rc.has(RecomputeModule::kMoe));
  }

  // Dense parameters of block l (per GPU): attention 4*M*M/mp, dense FFN 2*M*Hd/mp (Hd =
  // model.dense_hidden(), 8*M*M/mp at the default 4M); an MoE block's gate M*E and shared experts
  // 2*M*N*H/mp.
  double dense_param_bytes(int l) const {
    const ModelSpec& m = sc_.model;
    double params = linear_params(attention_kernels());
    if (is_moe(l))
      params += static_cast<double>(M_) * static_cast<double>(E_) +
                linear_params(ffn_kernels(static_cast<std::int64_t>(m.shared_experts) * H_,
                                          "shared", false, false));
    else
      params += linear_params(ffn_kernels(m.dense_hidden(), "ffn", false, false));
    // An MTP block's module adds its 2M -> M projection (split over mp) and two norms.
    if (l >= m.layers)
      params += 2.0 * static_cast<double>(M_) * static_cast<double>(div_up(M_, mp_)) +
                2.0 * static_cast<double>(M_);
    return params * grad_bytes_;
  }

  // Dense gradients waiting for their bucket's all-reduce: blocks [low, high], in backward order.
  struct DenseBucket {
    double bytes = 0;
    int low = 0, high = -1;
    bool first = true;  // PyTorch DDP's first bucket is small, so communication starts early
  };

  // Bytes at which the open bucket is all-reduced (docs/model.md, "Gradient buckets").
  double bucket_cap_bytes() const {
    constexpr double kMiB = 1024.0 * 1024.0;
    const ParallelismSpec& p = sc_.parallelism;
    switch (p.grad_bucket) {
      case GradBucketKind::kPytorch:
        // torch.nn.parallel.DistributedDataParallel: bucket_cap_mb = 25, and the first bucket
        // 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES).
        return (bucket_.first ? 1.0 : 25.0) * kMiB;
      case GradBucketKind::kMegatron:
        // Megatron-Core's DDP (training.py): bucket_size = max(40,000,000, 1,000,000 x DP)
        // parameters, in the gradient buffer's dtype.
        return std::max(40e6, 1e6 * groups_.dense_dp.group_size()) * grad_bytes_;
      case GradBucketKind::kBlock:
        return 0;  // every block closes its own bucket
      case GradBucketKind::kBytes:
        return p.grad_bucket_bytes.value();
    }
    return 0;
  }

  void dense_gradient_sync(int l, OpId after) {
    if (groups_.dense_dp.group_size() <= 1) return;
    // Lina all-reduces each block's gradients in its own micro-ops.
    if (schedules::is_lina(dec_.schedule)) {
      gradient_allreduce(groups_.dense_dp, dense_param_bytes(l), after,
                         fmt::format("L{}.grad.dense_allreduce", l), grad_role(l, false));
      return;
    }
    if (bucket_.high < 0) bucket_.high = l;
    bucket_.low = l;
    bucket_.bytes += dense_param_bytes(l);
    if (bucket_.bytes >= bucket_cap_bytes()) flush_dense_bucket(after);
  }

  void flush_dense_bucket(OpId after) {
    if (bucket_.high < 0) return;
    const std::string blocks = bucket_.low == bucket_.high
                                   ? fmt::format("L{}", bucket_.low)
                                   : fmt::format("L{}-{}", bucket_.low, bucket_.high);
    gradient_allreduce(groups_.dense_dp, bucket_.bytes, after, blocks + ".grad.dense_allreduce",
                       grad_role(bucket_.low, false));
    bucket_ = DenseBucket{.first = false};
  }

  // One gradient's all-reduce on the grad stream: whole, or Lina's micro-ops.
  void gradient_allreduce(const Grouping& g, double bytes, OpId after, const std::string& label,
                          OpRole role) {
    if (schedules::is_lina(dec_.schedule)) {
      lina_allreduce(grouping(g), bytes, after, label, role);
      return;
    }
    OpId id = collective(s_grad_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto, grouping(g),
                         bytes, deps_of({after}), OpTag(label, role));
    index_.gradient_sync.push_back(id);
  }

  // ---- MoE layer --------------------------------------------------------------------------

  MoeDims moe_dims(int moe) const {
    MoeDims d;
    d.capacity = work_.layers[moe].capacity;
    const int r = dec_.pipeline_degree;
    for (int j = 0; j < r; ++j) d.chunks.push_back(d.capacity / r + (j < d.capacity % r ? 1 : 0));
    return d;
  }

  // Bytes one rank sends in the dispatch (and combine) all-to-all of a chunk of `cap` slots:
  // the padded (E, cap, M) buffer, times esp (ESP-gathered tokens; not ETP's) and the token
  // repeat factor.
  // forward_dispatch: the forward dispatch, at model.precision.dispatch's token bytes; every other
  // all-to-all (combine, the backward's) at model.precision.combine's.
  double a2a_bytes(std::int64_t cap, bool forward_dispatch = false) const {
    const ModelSpec& m = sc_.model;
    const double token = token_bytes(forward_dispatch ? m.precision.dispatch : m.precision.combine);
    return static_cast<double>(rep_ * tok_esp_) * static_cast<double>(E_ * cap) * token;
  }
  // Bytes of one token of M elements sent as `d`: fp8 carries one fp32 scale per 128 elements
  // (DeepEP's fp8 dispatch: 7,168 + 56 x 4 = 7,392 bytes at M = 7,168).
  double token_bytes(Dtype d) const {
    if (d == Dtype::kFp8) return static_cast<double>(M_ + 4 * div_up(M_, 128));
    return static_cast<double>(M_ * dtype_bytes(d));
  }

  // Expert GEMM shapes of a chunk of `cap` slots (docs/model.md, "expert FFN"). Tokens one GPU
  // processes per local expert: W sources x cap slots x esp (gathered) x rep (repeated), split
  // over the n / rep replicas of its hidden slice; hidden dim per GPU H / (esp * rep).
  struct ExpertShapes {
    GemmShape fc1, fc2;
    // Exact FLOPs of each GEMM (the plain shape rounds rows up); fc1 is 2x wide under SwiGLU.
    double flops_fc1 = 0, flops_fc2 = 0;
    double rows = 0;  // token rows this GPU's experts process (all local experts), exact
    std::int64_t hs = 0;
  };
  ExpertShapes expert_shapes(std::int64_t cap) const {
    const std::int64_t per_source = cap * esp_ * rep_;  // before the replica split
    const std::int64_t tokens = W_ / n_ * per_source;   // per local expert, exact
    const std::int64_t hs = div_up(H_, static_cast<std::int64_t>(esp_) * rep_);
    const std::int64_t w1 = sc_.model.fc1_width(hs);
    ExpertShapes s;
    // A routed dispatch (DeepEP, Megatron's token dispatchers) hands each local expert its tokens
    // contiguously, with no per-source capacity: one grouped GEMM per expert, as flexible.
    if (dec_.layout == LayoutRole::kFlexible || dec_.variable_dispatch) {
      s.fc1 = GemmShape{tokens, w1, M_, dE_};
      s.fc2 = GemmShape{tokens, M_, hs, dE_};
    } else {
      const std::int64_t rows = div_up(per_source, n_);
      // W sources x dE experts: the sources of one expert share its weights.
      s.fc1 = GemmShape{rows, w1, M_, W_ * dE_, dE_};
      s.fc2 = GemmShape{rows, M_, hs, W_ * dE_, dE_};
    }
    s.rows = static_cast<double>(tokens) * static_cast<double>(dE_);
    s.hs = hs;
    s.flops_fc1 = 2.0 * s.rows * static_cast<double>(M_) * static_cast<double>(w1);
    s.flops_fc2 = 2.0 * s.rows * static_cast<double>(M_) * static_cast<double>(hs);
    return s;
  }

  // The MoE block's pre-FFN norm (with the residual add), replayed in backward under
  // recompute layernorm / moe / full.
  KernelDesc moe_norm() const {
    return norm("moe.norm", static_cast<double>(S_), static_cast<double>(M_));
  }
  // The expert FFN's activation on a chunk's rows (SwiGLU reads 2 hs and writes hs per row),
  // scaled per rank like the expert GEMMs.
  OpId expert_act(int l, int moe, std::size_t j, const ExpertShapes& sh, bool backward, bool replay,
                  OpId dep) {
    const double w1 = static_cast<double>(sc_.model.fc1_width(sh.hs));
    ComputeSpec spec;
    spec.cls = ComputeClass::kNorm;
    spec.bytes = Bytes(sh.rows * (w1 + static_cast<double>(sh.hs)) * static_cast<double>(b_));
    spec.rank_scale = expert_scale(moe, j);
    spec.recompute = replay;
    spec.backward = backward && !replay;
    // Chunks are numbered from 1 in labels, as role_label numbers the chunk's GEMMs.
    const std::string what = fmt::format("{}expert.act.c{}", replay ? "recompute." : "", j + 1);
    return plan_.add_compute(RankSet::all(P_), s_compute_, std::move(spec), deps_of({dep}),
                             lbl(l, backward || replay, what));
  }

  // Expert parameter bytes one GPU holds after the P1 / intermediate all-gather: the H/rep
  // slice of both weight matrices. Only for sharded experts with n / rep > 1.
  double gathered_expert_bytes() const {
    return static_cast<double>(sc_.model.ffn_params(H_)) * static_cast<double>(b_) / rep_;
  }
  bool needs_param_gather() const { return n_ / rep_ > 1; }
  // Groups of n / rep consecutive shard positions that gather one hidden slice together.
  const Grouping& gather_grouping() {
    if (gather_.groups.empty()) {
      gather_.name = fmt::format("shard_gather{}", n_ / rep_);
      const int g = n_ / rep_;
      for (const auto& shard : groups_.shard.groups)
        for (int x = 0; x < rep_; ++x)
          gather_.groups.emplace_back(shard.begin() + x * g, shard.begin() + (x + 1) * g);
    }
    return gather_;
  }

  // Forward: [ESP all-gather of tokens] -> gate -> encode -> for each chunk j: dispatch_j
  // (stream comm) -> fc1_j, fc2_j (compute) -> [ESP all-reduce_j] -> combine_j (stream
  // comm_out) -> [local sum of the rep partial outputs] -> decode.
  // Dispatch and combine chunks are on two different comm streams: dispatch_j never waits for a
  // combine, combine_j waits only for expert_j and combine_{j-1}; exactly docs/strategy-specs.md
  // §3's recurrences (one shared stream would make dispatch_{j+1} wait behind combine_{j-1}). Parm
  // S1 / S2 / auto (strategies/schedules/parm.cpp) build the whole layer themselves.
  schedules::MoeLayerBuild schedule_build(int l, int moe, PlanIndex::MoeLayerOps* ops) {
    schedules::MoeLayerBuild b;
    b.sc = &sc_;
    b.topo = &topo_;
    b.plan = &plan_;
    b.grouping = [this](const Grouping& g) { return grouping(g); };
    b.groups = &groups_;
    b.compute = s_compute_;
    b.comm = s_comm_;
    b.comm_out = s_comm_out_;
    b.grad = s_grad_;
    b.layer = l;
    b.W = W_;
    b.esp = esp_;
    b.mp = mp_;
    b.dp = dp_;
    b.S = S_;
    b.M = M_;
    b.H = H_;
    b.E = E_;
    b.dE = dE_;
    b.k = k_;
    b.b = b_;
    b.a2a = dec_.a2a;
    b.layout = dec_.layout;
    b.chunks = moe_dims(moe).chunks;
    b.ops = ops;
    b.gradient_sync = &index_.gradient_sync;
    return b;
  }

  OpId moe_forward(int l, int moe, OpId prev) {
    PlanIndex::MoeLayerOps ops;
    ops.layer = moe;
    if (schedules::is_fused_parm(dec_.schedule)) {
      OpId out = schedules::parm_forward(schedule_build(l, moe, &ops), dec_.schedule, prev);
      index_.moe_layers.push_back(std::move(ops));
      return out;
    }
    // Inference placement, phase 1 (docs/strategy-specs.md §7): the weights of this layer's
    // placement move on the param stream once the previous MoE layer's gate ran (its tokens' paths
    // are known then), overlapping the layers in between; outside the layer's own ops.
    const InferenceLayerPlan* inf =
        dec_.inference ? &dec_.inference->layers.at(static_cast<std::size_t>(moe)) : nullptr;
    OpId prefetch = kNone;
    if (inf && !inf->prefetch.empty())
      prefetch = weight_move(s_param_, inf->prefetch, deps_of({last_gate_}),
                             lbl(l, false, "expert_prefetch"));
    const OpId first_id = static_cast<OpId>(plan_.ops().size());
    const MoeDims dims = moe_dims(moe);
    const std::int64_t St = S_ * tok_esp_;  // tokens the gate sees (ESP-gathered)

    // The pre-FFN norm: the gate, the shared experts and the dispatch read its output.
    prev = emit(moe_norm(), false, false, l, prev);
    OpId in = prev;
    if (tok_esp_ > 1)
      in = collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                      grouping(groups_.esp), static_cast<double>(St * M_ * b_), deps_of({prev}),
                      tag(l, false, OpRoleKind::kEspAllGather));
    OpId param_gather = kNone;
    if (needs_param_gather())
      param_gather = collective(s_param_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                                grouping(gather_grouping()), gathered_expert_bytes(),
                                deps_of({prev}), tag(l, false, OpRoleKind::kParamGather));
    const GemmShape gate{St, E_, M_, 1};
    OpId g = gemm(ComputeClass::kGate, gate, gate.flops(), deps_of({in}),
                  tag(l, false, OpRoleKind::kGate));
    last_gate_ = g;
    // Lina's check after the gate: all-reduce of the E actual counts; phase 2 then moves weights
    // to the re-planned placement. Both block the dispatch (encode waits for them).
    if (inf && inf->sync_counts && W_ > 1)
      g = collective(s_comm_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                     grouping(groups_.ep), 4.0 * static_cast<double>(E_), deps_of({g}),
                     lbl(l, false, "count_allreduce"));
    if (inf && !inf->replan.empty())
      g = weight_move(s_comm_, inf->replan, deps_of({g}), lbl(l, false, "expert_replan"));
    OpId enc = kernel(ComputeClass::kEncode, 0, encode_bytes(dims.capacity), deps_of({g}),
                      tag(l, false, OpRoleKind::kEncode));
    // Shared experts on the compute stream right after the encode: they need only the block's
    // input, so they run while the first dispatch is on the wire.
    const OpId shared = shared_experts(l, prev, false);
    OpId last_combine = kNone, last_expert = kNone;
    for (size_t j = 0; j < dims.chunks.size(); ++j) {
      const std::int64_t cap = dims.chunks[j];
      OpId disp = kNone;
      if (W_ > 1) {
        disp = moe_a2a(s_comm_, moe, j, true, a2a_bytes(cap, true), deps_of({enc}),
                       tag(l, false, OpRoleKind::kDispatch, j), true);
        ops.dispatch.push_back(disp);
      }
      // ETP: the ETP group's dispatched rows, all-gathered (Megatron's alltoall dispatcher).
      if (etp_ > 1)
        disp = collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                          grouping(groups_.esp), etp_bytes(cap), deps_of({enc, disp}),
                          lbl(l, false, fmt::format("etp_allgather.c{}", j + 1)));
      const ExpertShapes sh = expert_shapes(cap);
      // fc1's input arrives in fp8 when the dispatch sends fp8 (DeepEP casts before sending).
      const bool fp8_in = W_ > 1 && sc_.model.precision.dispatch == Dtype::kFp8;
      OpId f1 = gemm(ComputeClass::kGemm, sh.fc1, sh.flops_fc1,
                     deps_of({enc, disp, j == 0 ? param_gather : kNone, prefetch}),
                     tag(l, false, OpRoleKind::kFc1, j), expert_scale(moe, j), fp8_gemm_, false,
                     fp8_cast_bytes(sh.fc1, false, fp8_in));
      OpId act = expert_act(l, moe, j, sh, false, false, f1);
      OpId f2 = gemm(ComputeClass::kGemm, sh.fc2, sh.flops_fc2, deps_of({act}),
                     tag(l, false, OpRoleKind::kFc2, j), expert_scale(moe, j), fp8_gemm_, false,
                     fp8_cast_bytes(sh.fc2, false, false));
      ops.expert.push_back(f1);
      ops.expert.push_back(f2);
      last_expert = f2;
      OpId out = f2;
      if (tok_esp_ > 1)
        out = collective(s_comm_out_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                         grouping(groups_.esp), a2a_bytes(cap), deps_of({f2}),
                         tag(l, false, OpRoleKind::kEspAllReduce, j));
      if (etp_ > 1)  // the H / etp partial outputs summed and scattered back to their rows
        out = collective(s_comm_out_, CollectiveType::kReduceScatter, CollectiveAlgo::kAuto,
                         grouping(groups_.esp), etp_bytes(cap), deps_of({f2}),
                         lbl(l, false, fmt::format("etp_reduce_scatter.c{}", j + 1)));
      if (W_ > 1) {
        out = moe_a2a(s_comm_out_, moe, j, false, a2a_bytes(cap), deps_of({out}),
                      tag(l, false, OpRoleKind::kCombine, j));
        ops.combine.push_back(out);
      }
      last_combine = out;
    }
    OpId before_decode = std::max(last_combine, last_expert);
    if (rep_ > 1)
      before_decode = kernel(ComputeClass::kElementwise, partial_sum_flops(dims.capacity),
                             partial_sum_bytes(dims.capacity), deps_of({before_decode}),
                             tag(l, false, OpRoleKind::kPartialSum));
    OpId dec = kernel(ComputeClass::kDecode, 2.0 * k_ * St * M_, decode_bytes(),
                      deps_of({before_decode, shared}), tag(l, false, OpRoleKind::kDecode));
    for (OpId id = first_id; id <= dec; ++id) ops.forward.push_back(id);
    index_.moe_layers.push_back(std::move(ops));
    return dec;
  }

  // Backward, the mirror: decode backward (a scatter of the same volume) -> [partial sum's
  // backward: replicate rep times] -> per chunk: combine-backward all-to-all (gradients to the
  // experts, stream comm) -> fc2, fc1 backward (2x FLOPs each: input and weight gradients) ->
  // [ESP all-reduce of the input gradient's partial sums] -> dispatch-backward all-to-all
  // (stream comm_out) -> encode backward -> gate backward -> [ESP reduce-scatter, the
  // all-gather's backward]. Expert gradients: P1 reduce-scatter in the shard gather groups, then
  // all-reduce over dp (grad stream, launched as soon as the expert backward is done).
  OpId moe_backward(int l, int moe, OpId prev) {
    // index_ holds this stage's MoE layers, from moe_begin_ on.
    PlanIndex::MoeLayerOps& ops = index_.moe_layers.at(static_cast<std::size_t>(moe - moe_begin_));
    if (grad_before_.size() < index_.moe_layers.size())
      grad_before_.resize(index_.moe_layers.size());
    // between_a2a: all-reduces before this layer
    grad_before_[static_cast<std::size_t>(moe - moe_begin_)] = index_.gradient_sync.size();
    if (schedules::is_fused_parm(dec_.schedule)) {
      const schedules::ParmBackward r =
          schedules::parm_backward(schedule_build(l, moe, &ops), dec_.schedule, prev);
      expert_gradient_sync(l, r.grad_ready);
      return r.out;
    }
    const MoeDims dims = moe_dims(moe);
    const std::int64_t St = S_ * tok_esp_;
    auto note = [&](OpId id) {
      ops.backward.push_back(id);
      return id;
    };
    // Recomputed router (moe module or full recompute): its norm and gate run again first.
    const RecomputeSpec& rc = sc_.model.recompute;
    const bool replay_moe = rc.full() || rc.has(RecomputeModule::kMoe);
    if (replay_moe || rc.has(RecomputeModule::kLayernorm))
      prev = note(emit(moe_norm(), true, true, l, prev));
    if (replay_moe) {
      const GemmShape gate{St, E_, M_, 1};
      prev = note(gemm(ComputeClass::kGate, gate, gate.flops(), deps_of({prev}),
                       lbl(l, true, "recompute.gate"), nullptr, false, true));
    }
    // ESP-gathered tokens: every ESP rank decoded the whole gathered unit and kept its own rows,
    // so the split's backward gathers the unit's output gradients (the experts' shards then see
    // every row's, and the input gradient's split back is free).
    if (tok_esp_ > 1)
      prev = note(collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                             grouping(groups_.esp), static_cast<double>(St * M_ * b_),
                             deps_of({prev}), tag(l, true, OpRoleKind::kEspAllGather)));
    OpId dec = note(kernel(ComputeClass::kDecode, 2.0 * k_ * St * M_, decode_bytes(),
                           deps_of({prev}), tag(l, true, OpRoleKind::kDecode)));
    OpId in = dec;
    if (rep_ > 1)
      in = note(kernel(ComputeClass::kElementwise, 0, partial_sum_bytes(dims.capacity),
                       deps_of({in}), tag(l, true, OpRoleKind::kPartialSum)));
    // Shared experts' backward right after the decode's: it overlaps the first combine-backward
    // all-to-all, as the forward overlaps the dispatch.
    const auto first_shared = static_cast<OpId>(plan_.ops().size());
    const OpId shared = shared_experts(l, dec, true);
    if (shared != kNone)
      for (OpId id = first_shared; id <= shared; ++id) ops.backward.push_back(id);
    OpId last_out = kNone, last_expert = kNone;
    for (size_t j = 0; j < dims.chunks.size(); ++j) {
      const std::int64_t cap = dims.chunks[j];
      OpId cb = kNone;
      if (W_ > 1) {
        cb = note(moe_a2a(s_comm_, moe, j, true, a2a_bytes(cap), deps_of({in}),
                          tag(l, true, OpRoleKind::kCombine, j)));
        ops.combine.push_back(cb);
      }
      // ETP: the reduce-scatter's backward, the output gradients all-gathered over the group.
      if (etp_ > 1)
        cb = note(collective(s_comm_, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                             grouping(groups_.esp), etp_bytes(cap), deps_of({in, cb}),
                             lbl(l, true, fmt::format("etp_allgather.c{}", j + 1))));
      const ExpertShapes sh = expert_shapes(cap);
      // Replayed expert forward (model.recompute): fc1 under moe / full, the activation also
      // under moe_act; they need only the kept expert input, not the incoming gradients.
      OpId rin = in;
      if (replay_moe)
        rin = note(gemm(ComputeClass::kGemm, sh.fc1, sh.flops_fc1, deps_of({rin}),
                        lbl(l, true, fmt::format("recompute.expert.fc1.c{}", j + 1)),
                        expert_scale(moe, j), fp8_gemm_, true,
                        fp8_cast_bytes(sh.fc1, false, true)));  // its kept input is fp8
      if (replay_moe || rc.has(RecomputeModule::kMoeAct))
        rin = note(expert_act(l, moe, j, sh, true, true, rin));
      OpId f2 = note(gemm(ComputeClass::kGemm, sh.fc2, 2.0 * sh.flops_fc2, deps_of({rin, cb}),
                          tag(l, true, OpRoleKind::kFc2, j), expert_scale(moe, j), fp8_gemm_, false,
                          fp8_cast_bytes(sh.fc2, true, false)));
      OpId act = note(expert_act(l, moe, j, sh, true, false, f2));
      OpId f1 = note(gemm(ComputeClass::kGemm, sh.fc1, 2.0 * sh.flops_fc1, deps_of({act}),
                          tag(l, true, OpRoleKind::kFc1, j), expert_scale(moe, j), fp8_gemm_, false,
                          fp8_cast_bytes(sh.fc1, true, false)));
      ops.expert.push_back(f2);
      ops.expert.push_back(f1);
      last_expert = f1;
      OpId out = f1;
      if (tok_esp_ > 1)
        out = note(collective(s_comm_out_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto,
                              grouping(groups_.esp), a2a_bytes(cap), deps_of({f1}),
                              tag(l, true, OpRoleKind::kEspAllReduce, j)));
      if (etp_ > 1)  // the all-gather's backward: input gradients summed over the H slices
        out = note(collective(s_comm_out_, CollectiveType::kReduceScatter, CollectiveAlgo::kAuto,
                              grouping(groups_.esp), etp_bytes(cap), deps_of({f1}),
                              lbl(l, true, fmt::format("etp_reduce_scatter.c{}", j + 1))));
      if (W_ > 1) {
        out = note(moe_a2a(s_comm_out_, moe, j, false, a2a_bytes(cap), deps_of({out}),
                           tag(l, true, OpRoleKind::kDispatch, j)));
        ops.dispatch.push_back(out);
      }
      last_out = out;
    }
    expert_gradient_sync(l, last_expert);
    OpId enc = note(kernel(ComputeClass::kEncode, 0, encode_bytes(dims.capacity),
                           deps_of({std::max(last_out, last_expert), shared}),
                           tag(l, true, OpRoleKind::kEncode)));
    const GemmShape gate{St, E_, M_, 1};
    OpId last = note(gemm(ComputeClass::kGate, gate, 2.0 * gate.flops(), deps_of({enc}),
                          tag(l, true, OpRoleKind::kGate)));
    last = note(emit(moe_norm(), true, false, l, last));
    return last;
  }

  // Lina family (strategies/schedules/lina.hpp): one gradient's all-reduce as micro-ops of at
  // most dec_.lina_micro_op bytes, each its own op so the engine's priority gate sees each.
  void lina_allreduce(GroupingId g, double bytes, OpId after, const std::string& label,
                      OpRole role) {
    const int n = schedules::lina_micro_op_count(bytes, dec_.lina_micro_op);
    for (int i = 0; i < n; ++i) {
      OpId id = collective(
          s_grad_, CollectiveType::kAllReduce, CollectiveAlgo::kAuto, g, bytes / n,
          deps_of({after}),
          OpTag(fmt::format("{}.m{}", label, i), OpRole{role.kind, true, role.block, i}));
      plan_.mutable_ops()[id].priority = schedules::lina_allreduce_priority(dec_.schedule);
      index_.gradient_sync.push_back(id);
    }
  }

  void expert_gradient_sync(int l, OpId after) {
    OpId prev = after;
    if (needs_param_gather()) {
      prev = collective(s_grad_, CollectiveType::kReduceScatter, CollectiveAlgo::kAuto,
                        grouping(gather_grouping()), gathered_expert_bytes(), deps_of({prev}),
                        OpTag(fmt::format("L{}.grad.expert_reduce_scatter", l),
                              OpRole{OpRoleKind::kParamGather, true, l, -1}));
      index_.gradient_sync.push_back(prev);
    }
    if (dp_ > 1) {
      // Expert parameters one GPU owns: dE experts' H/esp slices, or a 1/n slice when sharded.
      const double bytes = static_cast<double>(sc_.model.ffn_params(H_)) * grad_bytes_ *
                           static_cast<double>(dE_) / (esp_ * n_);
      gradient_allreduce(groups_.dp, bytes, prev, fmt::format("L{}.grad.expert_allreduce", l),
                         grad_role(l, true));
    }
  }

  // Encode reads the tokens once and writes rep copies of the padded (E, dC*esp, M) buffer:
  // (1 + rep) * E * dC * esp * M * b (= 2 E dC M b in the plain case).
  double encode_bytes(std::int64_t cap) const {
    return static_cast<double>(1 + rep_) * static_cast<double>(E_ * cap * tok_esp_ * M_ * b_);
  }
  // ETP (layout folded): the rows of a chunk the ETP group's ranks received, etp x the combine's
  // bytes: the all-gather's output and the reduce-scatter's input per rank.
  double etp_bytes(std::int64_t cap) const { return static_cast<double>(etp_) * a2a_bytes(cap); }
  // Decode gathers k weighted rows per token: k * S * M * b (S gathered over esp).
  double decode_bytes() const { return static_cast<double>(k_ * S_ * tok_esp_ * M_ * b_); }
  // Sum of the rep partial outputs (P2 / intermediate): read rep buffers, write one.
  double partial_sum_bytes(std::int64_t cap) const {
    return static_cast<double>(rep_ + 1) * static_cast<double>(E_ * cap * tok_esp_ * M_ * b_);
  }
  double partial_sum_flops(std::int64_t cap) const {
    return static_cast<double>(rep_ - 1) * static_cast<double>(E_ * cap * tok_esp_ * M_);
  }

  const Scenario& sc_;
  const topology::Topology& topo_;
  const workload::IterationWorkload& work_;
  const Decision& dec_;
  StagePart part_;
  int moe_begin_ = 0;  // global index of the stage's first MoE layer
  Plan plan_;
  PlanIndex index_;
  Groups groups_;
  Grouping gather_;
  std::vector<size_t> grad_before_;  // per MoE layer (lina schedules)
  std::vector<std::pair<std::string, GroupingId>> grouping_ids_;
  std::vector<std::vector<RoutedChunk>> routed_;  // per MoE layer, per chunk (variable dispatch)
  OpId last_gate_ = kNone;                        // gate of the previous MoE layer (forward)
  int P_ = 0, W_ = 1, esp_ = 1, mp_ = 1, dp_ = 1, cp_ = 1;
  // How esp splits an expert: DeepSpeed-MoE's ESP gathers the tokens before the gate (tok_esp_ =
  // esp), Megatron's ETP (layout folded) gathers the dispatched rows per chunk (etp_ = esp).
  int tok_esp_ = 1, etp_ = 1;
  bool sp_ = false;
  std::int64_t rows_ = 0;  // rows of the attention / dense GEMMs per rank (S, or S * tp folded)
  std::int64_t S_ = 0, L_ = 0, B_ = 0, M_ = 0, H_ = 0, E_ = 0, dE_ = 1, k_ = 1, n_ = 1, rep_ = 1;
  std::int64_t b_ = 2;
  double grad_bytes_ = 2;  // bytes per gradient element reduced (model.precision.main_grads)
  DenseBucket bucket_;
  bool fp8_gemm_ = false;  // model.precision.gemm is fp8: the linear layers' GEMMs run in fp8
  StreamId s_compute_ = 0, s_comm_ = 0, s_comm_out_ = 0, s_param_ = 0, s_grad_ = 0;
};

}  // namespace

int capacity_multiple(const Scenario& sc, const Decision& decision) {
  if (decision.expert_pack > 1) {  // the builder builds the packed scenario (Lina expert packing)
    Decision unpacked = decision;
    unpacked.expert_pack = 1;
    return capacity_multiple(schedules::packed_scenario(sc, decision.expert_pack), unpacked);
  }
  std::int64_t multiple = std::max(decision.pipeline_degree, 1);
  const int n = sc.model.expert_shards();
  const int rho = decision.parallel_degree;
  // A rho that does not divide n is the builder's InputError (check_decision); leave dC alone.
  if (n > 1 && rho >= 1 && n % rho == 0) multiple *= n / rho;
  if (schedules::is_fused_parm(decision.schedule) && sc.parallelism.mp > 1)
    multiple *= sc.parallelism.mp;
  MOESIM_ASSERT(multiple <= std::numeric_limits<int>::max(), "capacity multiple overflows int");
  return static_cast<int>(multiple);
}

StagePlan build_stage_plan(const Scenario& stage_sc, const topology::Topology& topo,
                           const workload::IterationWorkload& work, const Decision& decision,
                           StagePart part) {
  if (decision.expert_pack > 1) {  // Lina expert packing: the same job on fewer, fuller EP ranks
    const Scenario packed = schedules::packed_scenario(stage_sc, decision.expert_pack);
    return Builder(packed, topo, work, decision, part).build();
  }
  return Builder(stage_sc, topo, work, decision, part).build();
}

ServingCore serving_attention_core(const ModelSpec& m, std::int64_t rows, int mp) {
  const AttentionSpec& a = m.attention;
  const double heads = static_cast<double>(a.heads) / mp;
  const double dqk = a.qk_head_dim(), dv = a.value_head_dim();
  const double decode_width = a.is_mla() ? 2.0 * a.kv_lora_rank + a.qk_rope_head_dim : dqk + dv;
  ServingCore c;
  c.flops =
      2.0 * heads * (m.serving_decode_pairs * decode_width + m.serving_prefill_pairs * (dqk + dv));
  c.bytes = m.serving_kv_read_tokens * kv_cache_bytes_per_token(m, m.serving_kv_dtype, mp);
  const double r = std::max<double>(1.0, static_cast<double>(rows));
  const auto keys = static_cast<std::int64_t>(
      std::max(1.0, (m.serving_decode_pairs + m.serving_prefill_pairs) / r));
  c.shape = GemmShape{1, keys, static_cast<std::int64_t>(dqk),
                      std::max<std::int64_t>(1, rows * a.heads / mp)};
  return c;
}

BuiltPlan build_step_plan(const Scenario& sc, const topology::Topology& topo,
                          const workload::IterationWorkload& work, const Decision& decision) {
  const int pp = sc.parallelism.pp;
  if (pp == 1 && sc.model.micro_batches == 1)
    return build_stage_plan(sc, topo, work, decision, StagePart{}).built;
  const Scenario stage_sc = sc.stage_scenario();
  // One plan per model piece: the stages, or pp * vp chunks under the interleaved schedule.
  std::vector<StagePlan> stages;
  const int pieces = model_pieces(sc);
  for (int k = 0; k < pieces; ++k) {
    const auto [first, end] = piece_blocks(sc, k);
    stages.push_back(build_stage_plan(stage_sc, topo, work, decision,
                                      StagePart{first, end, k == 0, k == pieces - 1}));
  }
  return stitch_stages(sc, stages);
}

}  // namespace moesim::strategies
