// Parm S1 / S2 MoE layers (docs/strategy-specs.md §5). Formulas and reasons: docs/schedules.md.
#include "strategies/schedules/parm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "core/error.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies::schedules {

bool is_parm(ScheduleRole r) { return r == ScheduleRole::kParmBaseline || is_fused_parm(r); }

bool is_fused_parm(ScheduleRole r) {
  return r == ScheduleRole::kParmS1 || r == ScheduleRole::kParmS2 || r == ScheduleRole::kParmAuto;
}

std::string parm_inapplicable_reason(const Scenario& sc, int parallel_degree) {
  const ParallelismSpec& p = sc.parallelism;
  if (p.mp < 2 && p.esp < 2)
    return fmt::format(
        "Parm schedules are for MP+EP+ESP layers: expected parallelism.mp >= 2 or "
        "parallelism.esp >= 2, found mp = {}, esp = {}",
        p.mp, p.esp);
  if (sc.model.expert_shards() > 1)
    return "Parm schedules split experts with parallelism.esp, expected model.experts_per_gpu >= 1";
  if (parallel_degree != 1)
    return fmt::format("Parm schedules need token repeat factor 1 (parallel role), found {}",
                       parallel_degree);
  return "";
}

Grouping saa_grouping(const Scenario& sc) {
  const ParallelismSpec& p = sc.parallelism;
  Grouping g;
  g.name = "ep_esp_mp";
  const int per_d = p.ranks_per_dp();
  for (int d = 0; d < p.dp; ++d) {
    std::vector<int> grp(per_d);
    for (int i = 0; i < per_d; ++i) grp[i] = d * per_d + i;  // rank order (ParallelismSpec)
    g.groups.push_back(std::move(grp));
  }
  return g;
}

namespace {

double closed_form_s(const topology::Topology& topo, const collectives::CostContext& ctx,
                     CollectiveType type, CollectiveAlgo algo, const std::vector<int>& group,
                     double bytes, int sub_group = 1, bool spans = false) {
  if (group.size() < 2 || bytes <= 0) return 0;
  CollectiveSpec spec;
  spec.type = type;
  spec.algo = algo;
  spec.bytes = Bytes(bytes);
  spec.sub_group = sub_group;
  spec.saa_a2a_spans_group = spans;
  collectives::CollectiveCall call{&spec, &group, 0, false};
  MOESIM_ASSERT(ctx.topo == &topo, "cost context on another topology");
  return collectives::select_algorithm(call, ctx).analytical_time(call, ctx).value();
}

}  // namespace

ParmChoice parm_choose(const Scenario& sc, const topology::Topology& topo, std::int64_t capacity) {
  const ParallelismSpec& p = sc.parallelism;
  const Groups g = make_groups(sc);
  collectives::CostContext ctx;
  ctx.topo = &topo;
  ctx.net = scenario_network_params(sc);
  ctx.net.calibration = nullptr;  // the closed forms, as before calibration lines existed
  const double b = static_cast<double>(sc.bytes_per_element());
  const double M = static_cast<double>(sc.model.model_dim);
  const double x = static_cast<double>(sc.tokens_per_gpu()) * M * b;
  const double y =
      static_cast<double>(sc.num_experts()) * static_cast<double>(capacity) * M * p.esp * b;
  const double n = y / p.mp;
  const double t_a2a = closed_form_s(topo, ctx, CollectiveType::kAllToAll, CollectiveAlgo::kLinear,
                                     g.ep_esp.groups.at(0), n);
  const double t_ag = closed_form_s(topo, ctx, CollectiveType::kAllGather, CollectiveAlgo::kAuto,
                                    g.mp.groups.at(0), x);
  double t_saa = t_a2a;  // mp = 1: the return all-to-all alone
  if (p.mp > 1)
    t_saa = closed_form_s(topo, ctx, CollectiveType::kAllToAll, CollectiveAlgo::kSaa,
                          saa_grouping(sc).groups.at(0), n, p.mp, p.overlapped());
  ParmChoice c;
  c.t_s1_s = 2 * t_a2a + t_ag;
  c.t_s2_s = t_a2a + t_saa;
  // (ours) S2 also gates, encodes, decodes and combines all S tokens where S1 handles S / mp:
  // that compute is on the critical path, so Alg. 1 alone misjudges configurations where the
  // communication gap is small. Forward and backward both have the terms above once (the
  // backward mirrors the forward's collectives), so the compared sums cover fwd + bwd.
  c.t_s1_s *= 2;
  c.t_s2_s *= 2;
  if (p.mp > 1) {
    const CostModel cost(sc, topo);
    const double S = static_cast<double>(sc.tokens_per_gpu());
    const double E = static_cast<double>(sc.num_experts());
    const auto Mi = sc.model.model_dim;
    const auto rows = [](double r) {
      return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(r)));
    };
    const GemmShape full{rows(S), sc.num_experts(), Mi, 1};
    const GemmShape split{rows(S / p.mp), sc.num_experts(), Mi, 1};
    const double gate = (cost.gemm_time(full, 1).value() - cost.gemm_time(split, 1).value()) +
                        (cost.gemm_time(full, 2).value() - cost.gemm_time(split, 2).value());
    const double hbm = topo.gpu().hbm_bandwidth.value();
    const double dslots = static_cast<double>(capacity) * (1.0 - 1.0 / p.mp);
    const double dtokens = S * (1.0 - 1.0 / p.mp);
    double mem_bytes = 2 * (2.0 * E * dslots * M * b);                         // encode fwd + bwd
    mem_bytes += 2 * (static_cast<double>(sc.model.top_k) * dtokens * M * b);  // decode
    if (p.esp > 1) mem_bytes += 2 * ((p.esp + 1.0) * E * dslots * M * b);      // local combine
    c.t_s2_s += gate + (hbm > 0 ? mem_bytes / hbm : 0.0);
  }
  c.choice = c.t_s1_s <= c.t_s2_s ? ScheduleRole::kParmS1 : ScheduleRole::kParmS2;
  // S1 splits the S tokens per GPU over the mp ranks before the gate; when mp does not divide S
  // that is a fraction of a token (the plan builder refuses an explicit parm_s1), so auto takes S2.
  if (p.mp > 1 && sc.tokens_per_gpu() % p.mp != 0) c.choice = ScheduleRole::kParmS2;
  return c;
}

namespace {

constexpr OpId kNoOp = -1;

std::vector<OpId> deps_of(std::initializer_list<OpId> ids) {
  std::vector<OpId> out;
  for (OpId id : ids)
    if (id != kNoOp) out.push_back(id);
  return out;
}

std::int64_t div_up(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Small emitter over the plan: the same op kinds and streams as the plan builder.
class Emit {
 public:
  Emit(const MoeLayerBuild& b, ScheduleRole s, bool backward)
      : b_(b), backward_(backward), s2_(resolve(b, s) == ScheduleRole::kParmS2 && b.mp > 1) {}

  bool s2() const { return s2_; }

  // An op's name in the layer: a data step exec runs (its role; the label follows from it) or a
  // plain name no data path reads.
  struct What {
    std::string text;
    OpRoleKind kind = OpRoleKind::kNone;
    int chunk = -1;
    What(const char* t) : text(t) {}             // NOLINT
    What(std::string t) : text(std::move(t)) {}  // NOLINT
    What(OpRoleKind k) : kind(k) {}              // NOLINT: a per-layer step (no chunk)
    What(OpRoleKind k, std::size_t c) : kind(k), chunk(static_cast<int>(c)) {}  // chunk c
  };
  OpTag tag(const What& w) const {
    if (w.kind == OpRoleKind::kNone)
      return OpTag(fmt::format("L{}.{}.{}", b_.layer, backward_ ? "bwd" : "fwd", w.text));
    if (w.kind == OpRoleKind::kExpertMpGradSync)  // labelled as the builder's gradient syncs
      return OpTag(fmt::format("L{}.grad.expert_mp_allreduce", b_.layer),
                   OpRole{w.kind, true, b_.layer, -1});
    return OpTag(OpRole{w.kind, backward_, b_.layer, w.chunk});
  }
  OpId gemm(ComputeClass cls, GemmShape shape, double flops, std::vector<OpId> deps,
            const What& what) {
    ComputeSpec spec;
    spec.cls = cls;
    spec.flops = Flops(flops);
    spec.gemm = shape;
    return note(b_.plan->add_compute(RankSet::all(b_.plan->num_ranks()), b_.compute,
                                     std::move(spec), std::move(deps), tag(what)));
  }
  OpId kernel(ComputeClass cls, double flops, double bytes, std::vector<OpId> deps,
              const What& what) {
    ComputeSpec spec;
    spec.cls = cls;
    spec.flops = Flops(flops);
    spec.bytes = Bytes(bytes);
    return note(b_.plan->add_compute(RankSet::all(b_.plan->num_ranks()), b_.compute,
                                     std::move(spec), std::move(deps), tag(what)));
  }
  OpId copy(double bytes, std::vector<OpId> deps, const What& what) {
    return note(b_.plan->add_copy(RankSet::all(b_.plan->num_ranks()), b_.compute,
                                  CopySpec{Bytes(bytes)}, std::move(deps), tag(what)));
  }
  OpId collective(StreamId stream, CollectiveType type, CollectiveAlgo algo, const Grouping& g,
                  double bytes, std::vector<OpId> deps, const What& what, int sub_group = 1) {
    CollectiveSpec spec;
    spec.type = type;
    spec.algo = algo;
    spec.grouping = b_.grouping(g);
    spec.bytes = Bytes(bytes);
    spec.sub_group = sub_group;
    spec.saa_a2a_spans_group = algo == CollectiveAlgo::kSaa && b_.sc->parallelism.overlapped();
    return note(b_.plan->add_collective(stream, std::move(spec), std::move(deps), tag(what)));
  }
  OpId note(OpId id) {
    if (backward_) b_.ops->backward.push_back(id);
    return id;
  }

 private:
  static ScheduleRole resolve(const MoeLayerBuild& b, ScheduleRole s) {
    if (s != ScheduleRole::kParmAuto) return s;
    std::int64_t cap = 0;
    for (std::int64_t c : b.chunks) cap += c;
    return parm_choose(*b.sc, *b.topo, cap).choice;
  }

  const MoeLayerBuild& b_;
  bool backward_;
  bool s2_;
};

// Per-chunk sizes: sm = dC_j / mp slots per (source, expert) after the MP split.
struct ChunkDims {
  double sm = 0;         // slots after the MP split (whole: run_stack pads dC, capacity_multiple)
  double a2a_bytes = 0;  // y_j / mp = esp * E * sm * M * b
  GemmShape fc1, fc2;
  double flops_each = 0;
};

ChunkDims chunk_dims(const MoeLayerBuild& b, std::int64_t cap) {
  ChunkDims d;
  d.sm = static_cast<double>(cap) / b.mp;
  d.a2a_bytes = static_cast<double>(b.esp) * b.E * d.sm * b.M * b.b;
  // Tokens per local expert: W * esp sources (the fused group) x sm slots; hidden H / esp.
  const double tokens = static_cast<double>(b.W) * b.esp * d.sm;
  const std::int64_t hs = div_up(b.H, b.esp);
  const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(d.sm)));
  if (b.layout == LayoutRole::kFlexible) {
    const auto t = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(tokens)));
    d.fc1 = GemmShape{t, hs, b.M, b.dE};
    d.fc2 = GemmShape{t, b.M, hs, b.dE};
  } else {
    d.fc1 = GemmShape{rows, hs, b.M, b.W * b.esp * b.dE, b.dE};
    d.fc2 = GemmShape{rows, b.M, hs, b.W * b.esp * b.dE, b.dE};
  }
  d.flops_each =
      2.0 * tokens * static_cast<double>(b.dE) * static_cast<double>(b.M) * static_cast<double>(hs);
  return d;
}

}  // namespace

OpId parm_forward(const MoeLayerBuild& b, ScheduleRole schedule, OpId prev) {
  MOESIM_ASSERT(b.plan && b.groups && b.ops && b.sc && b.topo, "incomplete MoeLayerBuild");
  Emit e(b, schedule, false);
  const OpId first_id = static_cast<OpId>(b.plan->ops().size());
  const bool s2 = e.s2();
  const CollectiveType a2a = CollectiveType::kAllToAll;
  std::int64_t cap = 0;
  for (std::int64_t c : b.chunks) cap += c;
  // S1 gates 1/mp of the tokens (MP-Split before the gate); S2 all of them.
  const double tokens = s2 ? static_cast<double>(b.S) : static_cast<double>(b.S) / b.mp;
  const auto tok_rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(tokens)));
  const GemmShape gate{tok_rows, b.E, b.M, 1};
  OpId g = e.gemm(ComputeClass::kGate, gate, 2.0 * tokens * b.E * b.M, deps_of({prev}),
                  OpRoleKind::kGate);
  // Encode writes the (E, dC', M) buffer: dC' = dC / mp (S1), dC (S2; the split is a view).
  const double enc_slots = s2 ? static_cast<double>(cap) : static_cast<double>(cap) / b.mp;
  OpId enc = e.kernel(ComputeClass::kEncode, 0, 2.0 * b.E * enc_slots * b.M * b.b, deps_of({g}),
                      OpRoleKind::kEncode);
  // Local dump: esp copies of this MP rank's share, so every ESP shard gets its tokens from the
  // one fused all-to-all (replaces the ESP all-gather).
  OpId dump = enc;
  if (b.esp > 1)
    dump = e.copy(static_cast<double>(b.esp) * b.E * (static_cast<double>(cap) / b.mp) * b.M * b.b,
                  deps_of({enc}), OpRoleKind::kParmLocalDump);
  std::vector<OpId> backs;
  for (size_t j = 0; j < b.chunks.size(); ++j) {
    const ChunkDims d = chunk_dims(b, b.chunks[j]);
    OpId disp = e.collective(b.comm, a2a, b.a2a, b.groups->ep_esp, d.a2a_bytes, deps_of({dump}),
                             {OpRoleKind::kDispatch, j});
    b.ops->dispatch.push_back(disp);
    OpId f1 = e.gemm(ComputeClass::kGemm, d.fc1, d.flops_each, deps_of({dump, disp}),
                     {OpRoleKind::kFc1, j});
    OpId f2 =
        e.gemm(ComputeClass::kGemm, d.fc2, d.flops_each, deps_of({f1}), {OpRoleKind::kFc2, j});
    b.ops->expert.push_back(f1);
    b.ops->expert.push_back(f2);
    OpId back = s2 ? e.collective(b.comm_out, a2a, CollectiveAlgo::kSaa, saa_grouping(*b.sc),
                                  d.a2a_bytes, deps_of({f2}), {OpRoleKind::kCombineSaa, j}, b.mp)
                   : e.collective(b.comm_out, a2a, b.a2a, b.groups->ep_esp, d.a2a_bytes,
                                  deps_of({f2}), {OpRoleKind::kCombine, j});
    b.ops->combine.push_back(back);
    backs.push_back(back);
  }
  // Local combine: sum the esp partial outputs of every expert (the ESP all-reduce's work).
  OpId last = backs.back();
  if (b.esp > 1) {
    const double slots = s2 ? static_cast<double>(cap) : static_cast<double>(cap) / b.mp;
    const double elems = static_cast<double>(b.E) * slots * b.M;
    last = e.kernel(ComputeClass::kElementwise, (b.esp - 1) * elems, (b.esp + 1) * elems * b.b,
                    backs, OpRoleKind::kParmLocalCombine);
  } else if (backs.size() > 1) {
    last = e.kernel(ComputeClass::kElementwise, 0, 0, backs, OpRoleKind::kParmJoin);
  }
  OpId dec = e.kernel(ComputeClass::kDecode, 2.0 * b.k * tokens * b.M, b.k * tokens * b.M * b.b,
                      deps_of({last}), OpRoleKind::kDecode);
  OpId out = dec;
  if (!s2 && b.mp > 1)
    out = e.collective(b.comm, CollectiveType::kAllGather, CollectiveAlgo::kAuto, b.groups->mp,
                       static_cast<double>(b.S) * b.M * b.b, deps_of({dec}),
                       OpRoleKind::kParmMpAllGather);
  for (OpId id = first_id; id <= out; ++id) b.ops->forward.push_back(id);
  return out;
}

ParmBackward parm_backward(const MoeLayerBuild& b, ScheduleRole schedule, OpId prev) {
  MOESIM_ASSERT(b.plan && b.groups && b.ops && b.sc && b.topo, "incomplete MoeLayerBuild");
  Emit e(b, schedule, true);
  const bool s2 = e.s2();
  const CollectiveType a2a = CollectiveType::kAllToAll;
  std::int64_t cap = 0;
  for (std::int64_t c : b.chunks) cap += c;
  // The backward of S1's final MP all-gather is a split (free): decode backward on S / mp.
  const double tokens = s2 ? static_cast<double>(b.S) : static_cast<double>(b.S) / b.mp;
  OpId dec = e.kernel(ComputeClass::kDecode, 2.0 * b.k * tokens * b.M, b.k * tokens * b.M * b.b,
                      deps_of({prev}), OpRoleKind::kDecode);
  // The local combine's backward duplicates each gradient esp ways (a dump).
  OpId dump = dec;
  if (b.esp > 1)
    dump = e.copy(static_cast<double>(b.esp) * b.E * (static_cast<double>(cap) / b.mp) * b.M * b.b,
                  deps_of({dec}), OpRoleKind::kParmLocalDump);
  std::vector<OpId> backs;
  OpId last_expert = kNoOp;
  for (size_t j = 0; j < b.chunks.size(); ++j) {
    const ChunkDims d = chunk_dims(b, b.chunks[j]);
    OpId cb = e.collective(b.comm, a2a, b.a2a, b.groups->ep_esp, d.a2a_bytes, deps_of({dump}),
                           {OpRoleKind::kCombine, j});
    b.ops->combine.push_back(cb);
    OpId f2 = e.gemm(ComputeClass::kGemm, d.fc2, 2.0 * d.flops_each, deps_of({dump, cb}),
                     {OpRoleKind::kFc2, j});
    OpId f1 = e.gemm(ComputeClass::kGemm, d.fc1, 2.0 * d.flops_each, deps_of({f2}),
                     {OpRoleKind::kFc1, j});
    b.ops->expert.push_back(f2);
    b.ops->expert.push_back(f1);
    last_expert = f1;
    // S2: MP-Split's backward (an MP all-gather) rides with the dispatch-backward all-to-all.
    OpId back = s2 ? e.collective(b.comm_out, a2a, CollectiveAlgo::kSaa, saa_grouping(*b.sc),
                                  d.a2a_bytes, deps_of({f1}), {OpRoleKind::kDispatch, j}, b.mp)
                   : e.collective(b.comm_out, a2a, b.a2a, b.groups->ep_esp, d.a2a_bytes,
                                  deps_of({f1}), {OpRoleKind::kDispatch, j});
    b.ops->dispatch.push_back(back);
    backs.push_back(back);
  }
  ParmBackward r;
  r.grad_ready = last_expert;
  if (b.mp > 1 && !b.sc->parallelism.overlapped()) {
    // MP ranks trained the same expert slices on different tokens: sum their gradients. (In the
    // overlapped layout the MP ranks hold different experts: nothing to sum.)
    const double bytes = 2.0 * b.M * b.H * b.b * b.dE / b.esp;
    r.grad_ready =
        e.collective(b.grad, CollectiveType::kAllReduce, CollectiveAlgo::kAuto, b.groups->mp, bytes,
                     deps_of({last_expert}), OpRoleKind::kExpertMpGradSync);
    if (b.gradient_sync) b.gradient_sync->push_back(r.grad_ready);
  }
  OpId last = backs.back();
  const double slots = s2 ? static_cast<double>(cap) : static_cast<double>(cap) / b.mp;
  if (b.esp > 1) {
    const double elems = static_cast<double>(b.E) * slots * b.M;
    last = e.kernel(ComputeClass::kElementwise, (b.esp - 1) * elems, (b.esp + 1) * elems * b.b,
                    backs, OpRoleKind::kParmLocalCombine);
  } else if (backs.size() > 1) {
    last = e.kernel(ComputeClass::kElementwise, 0, 0, backs, OpRoleKind::kParmJoin);
  }
  OpId enc = e.kernel(ComputeClass::kEncode, 0, 2.0 * b.E * slots * b.M * b.b,
                      deps_of({last, last_expert}), OpRoleKind::kEncode);
  const auto tok_rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil(tokens)));
  const GemmShape gate{tok_rows, b.E, b.M, 1};
  OpId out = e.gemm(ComputeClass::kGate, gate, 4.0 * tokens * b.E * b.M, deps_of({enc}),
                    OpRoleKind::kGate);
  // S1: MP-Split's backward is an MP all-gather of the input gradient (S * M).
  if (!s2 && b.mp > 1)
    out = e.collective(b.comm, CollectiveType::kAllGather, CollectiveAlgo::kAuto, b.groups->mp,
                       static_cast<double>(b.S) * b.M * b.b, deps_of({out}),
                       OpRoleKind::kParmMpAllGather);
  r.out = out;
  return r;
}

}  // namespace moesim::strategies::schedules
