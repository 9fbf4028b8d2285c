#include "exec/parm_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "core/error.hpp"
#include "exec/host_layer.hpp"
#include "exec/layer_program.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

// A forward MoE op of a Parm-path plan, read from its role (Op::role).
struct ParmOp {
  enum Kind {
    kNone,
    kEspAllGather,
    kGate,
    kEncode,
    kLocalDump,
    kDispatch,
    kFc1,
    kFc2,
    kEspAllReduce,
    kCombine,
    kCombineSaa,
    kLocalCombine,  // parm.local_combine or parm.join
    kDecode,
    kMpAllGather,
  } kind = kNone;
  int block = -1;
  int chunk = -1;  // 0-based
};

ParmOp parm_ref(const Op& op) {
  ParmOp r;
  if (op.role.backward) return r;  // the Parm path runs the forward
  switch (op.role.kind) {
    case OpRoleKind::kEspAllGather:
      r.kind = ParmOp::kEspAllGather;
      break;
    case OpRoleKind::kGate:
      r.kind = ParmOp::kGate;
      break;
    case OpRoleKind::kEncode:
      r.kind = ParmOp::kEncode;
      break;
    case OpRoleKind::kParmLocalDump:
      r.kind = ParmOp::kLocalDump;
      break;
    case OpRoleKind::kParmLocalCombine:
    case OpRoleKind::kParmJoin:
      r.kind = ParmOp::kLocalCombine;
      break;
    case OpRoleKind::kDecode:
      r.kind = ParmOp::kDecode;
      break;
    case OpRoleKind::kParmMpAllGather:
      r.kind = ParmOp::kMpAllGather;
      break;
    case OpRoleKind::kDispatch:
      r.kind = ParmOp::kDispatch;
      break;
    case OpRoleKind::kFc1:
      r.kind = ParmOp::kFc1;
      break;
    case OpRoleKind::kFc2:
      r.kind = ParmOp::kFc2;
      break;
    case OpRoleKind::kEspAllReduce:
      r.kind = ParmOp::kEspAllReduce;
      break;
    case OpRoleKind::kCombineSaa:
      r.kind = ParmOp::kCombineSaa;
      break;
    case OpRoleKind::kCombine:
      r.kind = ParmOp::kCombine;
      break;
    default:
      return r;
  }
  r.block = op.role.block;
  r.chunk = op.role.chunk;
  return r;
}

// Parm's fused EP x ESP grouping: "ep_esp", or "ep_esp.s{stage}" in a plan of pipeline stages
// (strategies/stage_schedule.cpp names each stage's copy of a grouping so).
bool fused_grouping(const Grouping& g) {
  return g.name == "ep_esp" || g.name.rfind("ep_esp.s", 0) == 0;
}

int div_exact(std::int64_t a, std::int64_t b, const char* what) {
  if (b <= 0 || a % b != 0)
    throw InputError(fmt::format("--check: the MP/ESP data path needs {} ({} / {})", what, a, b));
  return static_cast<int>(a / b);
}

}  // namespace

bool needs_parm_path(const Scenario& sc, const Plan& plan) {
  if (sc.parallelism.esp > 1) return true;
  for (const Op& op : plan.ops()) {
    const ParmOp r = parm_ref(op);
    if (r.kind == ParmOp::kDispatch && op.kind == OpKind::kCollective &&
        fused_grouping(plan.grouping(op.collective().grouping)))
      return true;
  }
  return false;
}

bool is_parm_data_op(const Op& op) { return parm_ref(op).kind != ParmOp::kNone; }

const char* parm_schedule_name(ParmSchedule s) {
  switch (s) {
    case ParmSchedule::kBaseline:
      return "baseline";
    case ParmSchedule::kS1:
      return "S1";
    case ParmSchedule::kS2:
      return "S2";
  }
  return "?";
}

// One MoE layer on this rank. Chunk j covers slots [offset[j], offset[j] + caps[j]) of the
// per-expert slot range this rank dispatches: baseline caps = esp * dC_j of the gathered buffer;
// S1 / S2 caps = dC_j / mp (S2: of MP share t, at slot mp * offset[j] + t * caps[j] of the
// encoded (E, dC, M) buffer).
struct ParmPath::Layer {
  int moe = 0, block = -1;
  ParmSchedule sched = ParmSchedule::kBaseline;
  std::vector<int> caps, offset;
  int capacity = 0;     // slots per expert of the encoded buffer (the gate's capacity)
  int gate_tokens = 0;  // rows the gate sees
  int own_first = 0;    // first of this rank's S rows among them (baseline: s * S)
  bool has_a2a = false;
  bool dump_op = false, combine_op = false;  // the plan has parm.local_dump / local_combine|join
  bool on_rank = false;  // this rank's pipeline stage runs the layer (else nothing else is set)
  int dispatches = 0;    // dispatch chunks parsed (the first micro-batch's)
  int dE = 0;            // experts per EP position
  int my_e = 0;          // EP index of this rank's experts
  int blocks = 0;        // (source, local expert) blocks the experts receive per chunk
  std::vector<int> a2a_group, esp_group, mp_group, saa_group;
  // The layer program's record and buffers (exec/layer_program.hpp), and the plan's backward.
  LayerLayout lay;
  HostLayerBuffers buf;
  LayerBackwardPlan bwd;
};

ParmPath::ParmPath(const Scenario& sc, const topology::Topology& topo, Communicator& comm,
                   const MoeShape& shape, const Plan& plan, int iteration)
    : sc_(sc),
      topo_(topo),
      cost_(strategies::scenario_cost_context(sc, topo)),
      comm_(comm),
      shape_(shape),
      iteration_(iteration) {
  const ParallelismSpec& p = sc.parallelism;
  ep_ = p.ep;
  esp_ = p.esp;
  mp_ = p.mp;
  const int r = comm.rank();
  t_ = p.mp_index(r);
  s_ = p.esp_index(r);
  e_ = p.ep_index(r);
  if (sc.model.expert_shards() != 1)
    throw InputError(
        "--check: the MP/ESP data path needs unsharded experts (experts_per_gpu >= 1)");
  div_exact(shape_.hidden_dim, esp_, "esp to divide the hidden dim");
  const std::map<int, std::vector<double>> fused_sm = parse_plan(plan);
  for (auto& lp : layers_) {
    Layer& L = *lp;
    if (!L.on_rank) continue;  // another pipeline stage's layer: no data here
    auto it = fused_sm.find(L.block);
    set_geometry(L, it == fused_sm.end() ? std::vector<double>{} : it->second);
    build_layout(L);
    L.bwd = layer_backward_plan(plan, L.block, comm_.rank());
    L.lay.backward = L.bwd.passes > 0;
    L.lay.grad_sync_parts = L.bwd.sync_parts;
    load_inputs(L);
  }
}

// The plan's Parm ops of this rank's layers, in op order: each layer's groups, schedule, dispatch
// chunks and expert GEMM rows. Returns per fused layer (block) each chunk's dC_j / mp from the
// dispatch bytes.
std::map<int, std::vector<double>> ParmPath::parse_plan(const Plan& plan) {
  const int r = comm_.rank();
  const int M = shape_.model_dim, E = shape_.experts;
  const double b = static_cast<double>(sc_.bytes_per_element());
  std::map<int, int> block_to_layer;
  auto layer_of = [&](int block) -> Layer& {
    auto it = block_to_layer.find(block);
    if (it == block_to_layer.end()) {
      it = block_to_layer.emplace(block, static_cast<int>(layers_.size())).first;
      layers_.push_back(std::make_unique<Layer>());
      layers_.back()->moe = static_cast<int>(layers_.size()) - 1;
      layers_.back()->block = block;
    }
    return *layers_[it->second];
  };
  auto group_of = [&](const Op& op) {
    int gi = 0;
    return my_group(plan.grouping(op.collective().grouping), &gi);
  };
  std::map<int, std::vector<double>> fused_sm;  // block -> per chunk dC_j / mp from the bytes
  for (const Op& op : plan.ops()) {
    const ParmOp ref = parm_ref(op);
    if (ref.kind == ParmOp::kNone) continue;
    Layer& L = layer_of(ref.block);
    // Pipeline stages: a rank parses its stage's layers only (the others' groups are not its);
    // micro-batches repeat a layer's ops, and the first instance of each chunk lays it out.
    if (!op.ranks.contains(r)) continue;
    L.on_rank = true;
    const bool chunk_seen =
        (ref.kind == ParmOp::kDispatch && ref.chunk < L.dispatches) ||
        (ref.kind == ParmOp::kFc1 && ref.chunk < static_cast<int>(L.caps.size()));
    if (chunk_seen) continue;
    switch (ref.kind) {
      case ParmOp::kEspAllGather:
        L.esp_group = group_of(op);
        break;
      case ParmOp::kMpAllGather:
        L.mp_group = group_of(op);
        break;
      case ParmOp::kLocalDump:
        L.dump_op = true;
        break;
      case ParmOp::kLocalCombine:
        L.combine_op = true;
        break;
      case ParmOp::kCombineSaa:
        L.sched = ParmSchedule::kS2;
        L.saa_group = group_of(op);
        break;
      case ParmOp::kDispatch: {
        const CollectiveSpec& c = op.collective();
        if (c.type != CollectiveType::kAllToAll)
          throw InputError(fmt::format(
              "--check: the MP/ESP data path runs padded all_to_all dispatches, '{}' is a {}",
              op.label, collective_type_name(c.type)));
        MOESIM_ASSERT(ref.chunk == L.dispatches, "dispatch chunks out of order");
        ++L.dispatches;
        L.has_a2a = true;
        L.a2a_group = group_of(op);
        if (fused_grouping(plan.grouping(c.grouping))) {
          if (L.sched == ParmSchedule::kBaseline) L.sched = ParmSchedule::kS1;
          const double sm = c.bytes.value() / (static_cast<double>(esp_) * E * M * b);
          fused_sm[ref.block].push_back(sm);
        }
        break;
      }
      case ParmOp::kFc1: {
        const GemmShape& g = *op.compute().gemm;
        MOESIM_ASSERT(ref.chunk == static_cast<int>(L.caps.size()), "expert chunks out of order");
        L.caps.push_back(static_cast<int>(g.m * g.batch / E));
        break;
      }
      default:
        break;
    }
  }
  return fused_sm;
}

// A layer's experts, capacities and token rows on this rank, from what parse_plan read.
void ParmPath::set_geometry(Layer& L, const std::vector<double>& sm) {
  const ParallelismSpec& p = sc_.parallelism;
  const int r = comm_.rank();
  const int S = shape_.tokens, E = shape_.experts;
  if (L.sched != ParmSchedule::kBaseline) {
    // Fused: the chunk's per-(source, expert) slots dC_j / mp come from the dispatch bytes
    // (esp * E * dC_j / mp * M * b); the GEMM rows are rounded up, so they cannot tell.
    MOESIM_ASSERT(sm.size() == L.caps.size(), "one dispatch per expert chunk");
    for (std::size_t j = 0; j < sm.size(); ++j) {
      const double rounded = std::round(sm[j]);
      if (std::fabs(sm[j] - rounded) > 1e-9 || rounded < 1)
        throw InputError(fmt::format(
            "--check: Parm {} splits each expert chunk's capacity over the mp = {} ranks; chunk "
            "{} of MoE layer {} has {} slots per MP rank (not whole): choose a capacity factor "
            "or sizes that mp divides",
            parm_schedule_name(L.sched), mp_, j + 1, L.moe, sm[j]));
      MOESIM_ASSERT(L.caps[j] == static_cast<int>(rounded) * esp_,
                    "fused expert GEMM rows disagree with the dispatch bytes");
      L.caps[j] = static_cast<int>(rounded);
    }
    MOESIM_ASSERT(static_cast<int>(L.a2a_group.size()) == ep_ * esp_,
                  "the fused all-to-all spans EP x ESP");
    L.dE = E / ep_;
    L.my_e = e_;
    L.blocks = ep_ * esp_ * L.dE;
  } else {
    MOESIM_ASSERT(static_cast<int>(L.esp_group.size()) == esp_ && esp_ > 1,
                  "the ESP path all-gathers the tokens over esp ranks");
    MOESIM_ASSERT(L.esp_group[s_] == r, "ESP group order is the shard order");
    const int W = L.has_a2a ? static_cast<int>(L.a2a_group.size()) : 1;
    MOESIM_ASSERT(E % W == 0, "EP group size must divide the experts");
    L.dE = E / W;
    L.my_e = L.has_a2a ? static_cast<int>(std::find(L.a2a_group.begin(), L.a2a_group.end(), r) -
                                          L.a2a_group.begin())
                       : 0;
    L.blocks = W * L.dE;
  }
  L.offset.assign(L.caps.size(), 0);
  for (std::size_t j = 1; j < L.caps.size(); ++j) L.offset[j] = L.offset[j - 1] + L.caps[j - 1];
  const int sum = L.caps.empty() ? 0 : L.offset.back() + L.caps.back();
  switch (L.sched) {
    case ParmSchedule::kBaseline:
      L.capacity = sum;
      L.gate_tokens = S * esp_;
      L.own_first = s_ * S;
      break;
    case ParmSchedule::kS1:
      L.capacity = sum;
      L.gate_tokens = div_exact(S, mp_, "mp to divide the tokens per GPU (Parm S1 MP split)");
      L.own_first = 0;
      if (mp_ > 1)
        MOESIM_ASSERT(static_cast<int>(L.mp_group.size()) == mp_ && L.mp_group[t_] == r,
                      "S1 ends with the MP all-gather in MP order");
      break;
    case ParmSchedule::kS2:
      L.capacity = sum * mp_;
      L.gate_tokens = S;
      L.own_first = 0;
      MOESIM_ASSERT(static_cast<int>(L.saa_group.size()) == p.ranks_per_dp(),
                    "SAA spans the ranks of one DP index");
      break;
  }
}

// The layer's buffers, loaded with its gate, this rank's expert slices and its tokens.
void ParmPath::load_inputs(Layer& L) {
  const std::uint64_t seed = sc_.workload.routing.seed;
  L.buf.allocate(L.lay, shape_);
  L.buf.f({LayerBuf::kGateW}) = make_gate_weights(shape_, seed, L.moe);
  for (int le = 0; le < L.dE; ++le) {
    L.buf.f({LayerBuf::kW1, le}) = make_w1_slice(shape_, seed, L.moe, L.my_e * L.dE + le, s_, esp_);
    L.buf.f({LayerBuf::kW2, le}) = make_w2_slice(shape_, seed, L.moe, L.my_e * L.dE + le, s_, esp_);
  }
  const int key = token_key_rank(sc_.parallelism, comm_.rank());
  L.buf.f({L.lay.input == GateInput::kOwn ? LayerBuf::kX32 : LayerBuf::kXOwn}) =
      make_tokens(shape_, seed, iteration_, L.moe, key);
  if (L.lay.backward)
    L.buf.f({L.lay.output == LayerOutput::kGateRows ? LayerBuf::kDY : LayerBuf::kDYOwn}) =
        make_grad_output(shape_, seed, iteration_, L.moe, key);
}

// The layer program's record of a Parm-path layer. Baseline: the plain layout on the gathered
// tokens (EP position p holds experts p dE + le), the esp partials summed by the ESP all-reduce
// before the combine. S1 / S2 (fused): the local dump sends all-to-all index a the slots of the
// experts of a's EP index (the esp shards of one EP index get the same tokens; S2: MP share t's
// slots, at mp * offset_j + t * c_j), and the local combine sums what every source (S2: of every
// MP share, SAA) returns into those slots.
void ParmPath::build_layout(Layer& L) const {
  L.lay = capacity_layout(L.moe, L.block, L.has_a2a ? static_cast<int>(L.a2a_group.size()) : 1,
                          L.my_e, L.dE, shape_.hidden_dim / esp_, L.has_a2a, L.caps, L.capacity);
  LayerLayout& lay = L.lay;
  const ParallelismSpec& p = sc_.parallelism;
  lay.gate_tokens = L.gate_tokens;
  switch (L.sched) {
    case ParmSchedule::kBaseline:
      lay.input = GateInput::kGathered;
      lay.output = LayerOutput::kOwnRows;
      lay.own_first = L.own_first;
      fill_capacity_blocks(lay);
      return;
    case ParmSchedule::kS1:
      if (mp_ > 1) {
        lay.input = GateInput::kOwnRows;
        lay.gate_first = t_ * L.gate_tokens;
        lay.output = LayerOutput::kMpGathered;
      }
      break;
    case ParmSchedule::kS2:
      break;
  }
  lay.dump_op = L.dump_op;
  lay.accumulate_back = true;
  lay.combine_op = L.combine_op;
  const bool s2 = L.sched == ParmSchedule::kS2;
  const int A = static_cast<int>(L.a2a_group.size()), shares = s2 ? mp_ : 1;
  // The rank that sent slot (t2, a): all-to-all index a of MP member t2's all-to-all; in SAA's
  // grouping position a * mp + t2 (disjoint layout) or a (overlapped: it spans the group).
  const std::vector<int>& g = s2 ? L.saa_group : L.a2a_group;
  const bool per_t = s2 && !p.overlapped();
  for (std::size_t j = 0; j < L.caps.size(); ++j) {
    const int c = L.caps[j];
    auto first = [&](int t2) { return s2 ? mp_ * L.offset[j] + t2 * c : L.offset[j]; };
    auto& send = lay.send_blocks.emplace_back();
    for (int a = 0; a < A; ++a) {
      const int ea = p.ep_index(L.a2a_group[static_cast<std::size_t>(a)]);
      for (int le = 0; le < L.dE; ++le) send.push_back(SlotBlock{ea * L.dE + le, 0, first(t_), c});
    }
    auto& back = lay.back_blocks.emplace_back();
    for (int t2 = 0; t2 < shares; ++t2)
      for (int a = 0; a < A; ++a) {
        const int ea = p.ep_index(g[static_cast<std::size_t>(per_t ? a * mp_ + t2 : a)]);
        for (int le = 0; le < L.dE; ++le)
          back.push_back(SlotBlock{ea * L.dE + le, 0, first(t2), c});
      }
  }
}

ParmPath::~ParmPath() = default;

int ParmPath::num_layers() const { return static_cast<int>(layers_.size()); }

std::vector<ProgramLayerRef> ParmPath::program_layers() {
  std::vector<ProgramLayerRef> out;
  for (auto& L : layers_)
    if (L->on_rank) out.push_back({L->block, &L->lay, &L->buf});
  return out;
}

bool ParmPath::on_rank(int li) const { return layers_.at(li)->on_rank; }
int ParmPath::layer_number(int li) const { return layers_.at(li)->moe; }
ParmSchedule ParmPath::schedule(int li) const { return layers_.at(li)->sched; }
const std::vector<float>& ParmPath::output(int li) const {
  static const std::vector<float> kNone;
  const Layer& L = *layers_.at(li);
  return L.on_rank ? L.buf.f({L.lay.output_buffer()}) : kNone;
}

const std::vector<int>& ParmPath::my_group(const Grouping& g, int* index) const {
  for (std::size_t gi = 0; gi < g.groups.size(); ++gi)
    if (std::find(g.groups[gi].begin(), g.groups[gi].end(), comm_.rank()) != g.groups[gi].end()) {
      *index = static_cast<int>(gi);
      return g.groups[gi];
    }
  throw InternalError(fmt::format("rank {} is in no group of grouping '{}'", comm_.rank(), g.name));
}

bool ParmPath::run_op(const Plan& plan, const Op& op, std::int64_t& algo) {
  const bool backward = is_backward_step(op);
  if (!backward && parm_ref(op).kind == ParmOp::kNone) return false;
  Layer* L = nullptr;
  for (auto& lp : layers_)
    if (lp->block == op.role.block) L = lp.get();
  if (!L || !L->on_rank || (backward && !L->lay.backward)) return false;
  // The layer program (exec/layer_program.hpp); every collective is checked against the plan's
  // element count (its bytes in the scenario's dtype).
  HostLayerOps ops(comm_, cost_, topo_, plan, shape_, L->buf, sc_.bytes_per_element());
  const std::int64_t a =
      backward ? run_backward_step(L->lay, shape_, op.role.kind, op.role.chunk, op, ops)
               : run_forward_step(L->lay, shape_, op.role.kind, op.role.chunk, op, ops);
  if (a >= 0) algo = a;
  return true;
}

std::optional<LayerGradients> ParmPath::gradients(int li, bool units) const {
  const Layer& L = *layers_.at(li);
  if (!L.on_rank || !L.lay.backward) return std::nullopt;
  const int S = shape_.tokens, M = shape_.model_dim;
  const std::uint64_t seed = sc_.workload.routing.seed;
  auto tokens_of = [&](int rank) {
    return make_tokens(shape_, seed, iteration_, L.moe, token_key_rank(sc_.parallelism, rank));
  };
  auto dy_of = [&](int rank) {
    return make_grad_output(shape_, seed, iteration_, L.moe, token_key_rank(sc_.parallelism, rank));
  };
  LayerGradients g;
  g.moe = L.moe;
  g.expert_first = L.my_e * L.dE;
  g.local_experts = L.dE;
  g.hidden_first = s_ * (shape_.hidden_dim / esp_);
  g.hidden_cols = shape_.hidden_dim / esp_;
  g.capacity = L.capacity;
  g.plan = &L.bwd;
  g.dx = &L.buf.f({input_grad_buffer(L.lay)});
  g.dgate_w = &L.buf.f({LayerBuf::kDGateW});
  g.dw = &L.buf.f({LayerBuf::kDW});
  if (!units) return g;
  const std::size_t share = static_cast<std::size_t>(L.gate_tokens) * M;
  switch (L.sched) {
    case ParmSchedule::kBaseline: {  // the ESP group's tokens and dY, gathered in shard order
      GradUnit u;
      for (int member : L.esp_group) {
        const auto x = tokens_of(member), dy = dy_of(member);
        u.tokens.insert(u.tokens.end(), x.begin(), x.end());
        u.dy.insert(u.dy.end(), dy.begin(), dy.end());
      }
      u.rows = L.gate_tokens;
      u.dx_first = L.own_first;
      u.dx_rows = S;
      g.units.push_back(std::move(u));
      break;
    }
    case ParmSchedule::kS1: {  // each MP share its own unit; this rank's gate saw share t
      const auto x = tokens_of(comm_.rank()), dy = dy_of(comm_.rank());
      const int shares = L.lay.input == GateInput::kOwnRows ? mp_ : 1;
      for (int t2 = 0; t2 < shares; ++t2) {
        GradUnit u;
        const auto at = static_cast<std::ptrdiff_t>(share) * t2;
        u.tokens.assign(x.begin() + at, x.begin() + at + static_cast<std::ptrdiff_t>(share));
        u.dy.assign(dy.begin() + at, dy.begin() + at + static_cast<std::ptrdiff_t>(share));
        u.rows = L.gate_tokens;
        u.dx_rows = L.gate_tokens;
        u.own = shares == 1 || t2 == t_;
        g.units.push_back(std::move(u));
      }
      break;
    }
    case ParmSchedule::kS2:  // all S tokens; this rank dispatched MP share t of their slots
      g.dw_share = 1.0 / mp_;
      break;
  }
  return g;
}

long long ParmPath::dropped(int li) const {
  const Layer& L = *layers_.at(li);
  if (!L.on_rank) return 0;
  const int S = shape_.tokens, k = shape_.top_k;
  const std::vector<std::int32_t>& slot = L.buf.i({LayerBuf::kSlot});
  // Owned rows of the gate's unit: MP share t of this rank's S tokens (S1 gated only those).
  const int lo = L.sched == ParmSchedule::kS1 ? 0 : L.own_first + t_ * S / mp_;
  const int hi = L.sched == ParmSchedule::kS1 ? L.gate_tokens : L.own_first + (t_ + 1) * S / mp_;
  long long d = 0;
  for (std::size_t i = static_cast<std::size_t>(lo) * k; i < static_cast<std::size_t>(hi) * k; ++i)
    d += i < slot.size() && slot[i] < 0 ? 1 : 0;
  return d;
}

std::vector<float> ParmPath::reference(int li, long long* dropped, double tolerance,
                                       long long* logits_wrong) const {
  const Layer& L = *layers_.at(li);
  // The gate's own logits of this rank's unit (host gate's, or the GPU's downloaded), which the
  // reference decides on and checks (GateLogits): S1's other MP shares were gated elsewhere.
  GateLogits kernel;
  if (tolerance > 0 && L.on_rank) kernel = {L.buf.f({LayerBuf::kLogits}).data(), tolerance};
  const int S = shape_.tokens, M = shape_.model_dim, k = shape_.top_k;
  const std::uint64_t seed = sc_.workload.routing.seed;
  const std::vector<float> own =
      make_tokens(shape_, seed, iteration_, L.moe, token_key_rank(sc_.parallelism, comm_.rank()));
  // Drops among rows [lo, hi) of a unit, from the reference's own routing.
  auto drops_in = [&](const MoeShape& unit, const std::vector<float>& tokens, int lo, int hi) {
    const ReferenceRouting rr =
        reference_routing(unit, tokens, make_gate_weights(unit, seed, L.moe), L.capacity, kernel);
    long long d = 0;
    for (std::size_t i = static_cast<std::size_t>(lo) * k; i < static_cast<std::size_t>(hi) * k;
         ++i)
      d += rr.kept[i] ? 0 : 1;
    return d;
  };
  MoeShape unit = shape_;
  switch (L.sched) {
    case ParmSchedule::kBaseline: {
      // The ESP group's tokens, gathered in shard order.
      std::vector<float> all;
      for (int member : L.esp_group) {
        const auto x =
            make_tokens(shape_, seed, iteration_, L.moe, token_key_rank(sc_.parallelism, member));
        all.insert(all.end(), x.begin(), x.end());
      }
      unit.tokens = S * esp_;
      if (dropped)
        *dropped =
            drops_in(unit, all, L.own_first + t_ * S / mp_, L.own_first + (t_ + 1) * S / mp_);
      return reference_layer_seeded_rows(unit, all, seed, L.moe, L.capacity, L.own_first, S,
                                         nullptr, kernel, logits_wrong);
    }
    case ParmSchedule::kS1: {
      // Every MP share is its own unit (S / mp tokens, capacity dC / mp); the output is all of
      // them, as after the MP all-gather.
      unit.tokens = L.gate_tokens;
      std::vector<float> y;
      for (int t2 = 0; t2 < mp_; ++t2) {
        const std::vector<float> part(
            own.begin() + static_cast<std::ptrdiff_t>(t2) * L.gate_tokens * M,
            own.begin() + static_cast<std::ptrdiff_t>(t2 + 1) * L.gate_tokens * M);
        long long d = 0;
        const auto yp =
            reference_layer_seeded_rows(unit, part, seed, L.moe, L.capacity, 0, L.gate_tokens, &d,
                                        t2 == t_ ? kernel : GateLogits{}, logits_wrong);
        if (t2 == t_ && dropped) *dropped = d;
        y.insert(y.end(), yp.begin(), yp.end());
      }
      return y;
    }
    case ParmSchedule::kS2:
      if (dropped) *dropped = drops_in(unit, own, t_ * S / mp_, (t_ + 1) * S / mp_);
      return reference_layer_seeded_rows(unit, own, seed, L.moe, L.capacity, 0, S, nullptr, kernel,
                                         logits_wrong);
  }
  return {};
}

}  // namespace moesim::exec
