#include "exec/parm_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "core/error.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

namespace kc = kernels::cpu;
constexpr auto kF32 = kernels::DType::kF32;

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
        plan.grouping(op.collective().grouping).name == "ep_esp")
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
  int dE = 0;      // experts per EP position
  int my_e = 0;    // EP index of this rank's experts
  int blocks = 0;  // (source, local expert) blocks the experts receive per chunk
  std::vector<int> a2a_group, esp_group, mp_group, saa_group;
  std::vector<std::vector<float>> w1, w2;  // local experts' hidden slices s of esp
  // Data of the step.
  std::vector<float> x_own, x_gate, logits, weight, dispatched, expert_out, y_gate, y;
  std::vector<std::int32_t> expert, slot, slot_entry, expert_count;
  std::vector<std::vector<float>> send, chunk_in, hidden, chunk_out, back;  // per chunk
  bool summed = false;

  kernels::Routing routing(const MoeShape& sh) {
    kernels::Routing r;
    r.num_tokens = gate_tokens;
    r.top_k = sh.top_k;
    r.num_experts = sh.experts;
    r.capacity = capacity;
    r.expert = expert.data();
    r.slot = slot.data();
    r.weight = weight.data();
    r.slot_entry = slot_entry.data();
    return r;
  }
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
  const int S = shape_.tokens, M = shape_.model_dim, E = shape_.experts;
  div_exact(shape_.hidden_dim, esp_, "esp to divide the hidden dim");
  const double b = static_cast<double>(sc.bytes_per_element());

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
    switch (ref.kind) {
      case ParmOp::kEspAllGather:
        L.esp_group = group_of(op);
        break;
      case ParmOp::kMpAllGather:
        L.mp_group = group_of(op);
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
        L.has_a2a = true;
        L.a2a_group = group_of(op);
        if (plan.grouping(c.grouping).name == "ep_esp") {
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
  for (auto& lp : layers_) {
    Layer& L = *lp;
    if (L.sched != ParmSchedule::kBaseline) {
      // Fused: the chunk's per-(source, expert) slots dC_j / mp come from the dispatch bytes
      // (esp * E * dC_j / mp * M * b); the GEMM rows are rounded up, so they cannot tell.
      const auto& sm = fused_sm[L.block];
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
    const std::uint64_t seed = sc.workload.routing.seed;
    for (int le = 0; le < L.dE; ++le) {
      L.w1.push_back(make_w1_slice(shape_, seed, L.moe, L.my_e * L.dE + le, s_, esp_));
      L.w2.push_back(make_w2_slice(shape_, seed, L.moe, L.my_e * L.dE + le, s_, esp_));
    }
    const std::size_t n = L.caps.size();
    L.send.resize(n);
    L.chunk_in.resize(n);
    L.hidden.resize(n);
    L.chunk_out.resize(n);
    L.back.resize(n);
  }
}

ParmPath::~ParmPath() = default;

int ParmPath::num_layers() const { return static_cast<int>(layers_.size()); }
int ParmPath::layer_number(int li) const { return layers_.at(li)->moe; }
ParmSchedule ParmPath::schedule(int li) const { return layers_.at(li)->sched; }
const std::vector<float>& ParmPath::output(int li) const { return layers_.at(li)->y; }

const std::vector<int>& ParmPath::my_group(const Grouping& g, int* index) const {
  for (std::size_t gi = 0; gi < g.groups.size(); ++gi)
    if (std::find(g.groups[gi].begin(), g.groups[gi].end(), comm_.rank()) != g.groups[gi].end()) {
      *index = static_cast<int>(gi);
      return g.groups[gi];
    }
  throw InternalError(fmt::format("rank {} is in no group of grouping '{}'", comm_.rank(), g.name));
}

// The chunk's all-to-all (or SAA) through the shared lowering, with the plan's algorithm; the
// spec's bytes are the fp32 buffer's (the plan counts the scenario's dtype).
void ParmPath::all_to_all(const Plan& plan, const Op& op, const std::vector<float>& send,
                          std::vector<float>& recv, std::int64_t& algo) {
  CollectiveSpec spec = op.collective();
  const double plan_elems = spec.bytes.value() / static_cast<double>(sc_.bytes_per_element());
  MOESIM_ASSERT(std::fabs(plan_elems - static_cast<double>(send.size())) < 0.5,
                fmt::format("'{}': the data path sends {} elements, the plan {}", op.label,
                            send.size(), plan_elems));
  spec.bytes = Bytes(static_cast<double>(send.size() * sizeof(float)));
  int gi = 0;
  const std::vector<int>& group = my_group(plan.grouping(spec.grouping), &gi);
  collectives::CollectiveCall call{&spec, &group, gi, true};
  const auto& a = collectives::select_algorithm(call, cost_);
  algo = static_cast<std::int64_t>(a.algo());
  const std::vector<collectives::Phase> phases = a.lower(call, topo_);
  const bool saa = a.algo() == CollectiveAlgo::kSaa;
  const int m = std::max(1, spec.sub_group);
  const SaaLayout layout(spec, static_cast<int>(group.size()),
                         static_cast<double>(send.size() * sizeof(float)));
  if (saa) {
    // run_phases posts each slice as whole bytes: the per-peer chunk must split evenly.
    int steps = 0;
    for (const auto& ph : phases) steps += ph.saa_step ? 1 : 0;
    const auto A = static_cast<std::size_t>(layout.a2a_peers());
    const std::size_t chunk = send.size() * sizeof(float) / A;
    if (steps < 2 || chunk % static_cast<std::size_t>(steps - 1) != 0)
      throw InputError(fmt::format(
          "--check: '{}': SAA cuts the {}-byte chunk per peer into {} slices; choose sizes "
          "it divides",
          op.label, chunk, steps - 1));
  }
  recv.assign(send.size() * (saa ? static_cast<std::size_t>(m) : 1), 0.0f);
  run_phases(comm_, phases, reinterpret_cast<const std::byte*>(send.data()),
             send.size() * sizeof(float), reinterpret_cast<std::byte*>(recv.data()),
             recv.size() * sizeof(float), static_cast<int>(op.id % 32000), saa ? &layout : nullptr);
}

// Local dump (S1 / S2): the chunk's send buffer (A, dE, c, M), block a = the slots of the experts
// of a's EP index; the esp shards of one EP index get the same tokens.
void ParmPath::pack_fused(Layer& L, int j) const {
  const int M = shape_.model_dim, c = L.caps[j], A = static_cast<int>(L.a2a_group.size());
  const int first = L.sched == ParmSchedule::kS2 ? mp_ * L.offset[j] + t_ * c : L.offset[j];
  auto& out = L.send[j];
  out.assign(static_cast<std::size_t>(A) * L.dE * c * M, 0.0f);
  for (int a = 0; a < A; ++a) {
    const int ea = sc_.parallelism.ep_index(L.a2a_group[a]);
    for (int le = 0; le < L.dE; ++le)
      std::memcpy(
          &out[((static_cast<std::size_t>(a) * L.dE + le) * c) * M],
          &L.dispatched[(static_cast<std::size_t>(ea * L.dE + le) * L.capacity + first) * M],
          sizeof(float) * c * M);
  }
}

// The chunks' returned outputs into expert_out (E, capacity, M): a copy in the baseline (the ESP
// all-reduce summed the partials), the local combine (sum of the esp shards' partials) in S1 / S2.
void ParmPath::sum_partials(Layer& L) const {
  if (L.summed) return;
  L.summed = true;
  const int M = shape_.model_dim, E = shape_.experts;
  const std::size_t row = static_cast<std::size_t>(M);
  for (std::size_t j = 0; j < L.caps.size(); ++j) {
    const int c = L.caps[j];
    if (L.sched == ParmSchedule::kBaseline) {
      const auto& src = L.has_a2a ? L.back[j] : L.chunk_out[j];  // (E, c, M)
      for (int e = 0; e < E; ++e)
        std::memcpy(&L.expert_out[(static_cast<std::size_t>(e) * L.capacity + L.offset[j]) * row],
                    &src[static_cast<std::size_t>(e) * c * row], sizeof(float) * c * M);
      continue;
    }
    // S1: back (A, dE, c, M); S2: (mp, A, dE, c, M), MP share t2 at slots mp * off + t2 * c.
    const bool s2 = L.sched == ParmSchedule::kS2;
    const int A = static_cast<int>(L.a2a_group.size()), shares = s2 ? mp_ : 1;
    const std::vector<int>& g = s2 ? L.saa_group : L.a2a_group;
    // The rank that sent slot (t2, a): all-to-all index a of MP member t2's all-to-all; in SAA's
    // grouping position a * mp + t2 (disjoint layout) or a (overlapped: it spans the group).
    const bool per_t = s2 && !sc_.parallelism.overlapped();
    for (int t2 = 0; t2 < shares; ++t2) {
      const int first = s2 ? mp_ * L.offset[j] + t2 * c : L.offset[j];
      for (int a = 0; a < A; ++a) {
        const int ea = sc_.parallelism.ep_index(g[per_t ? a * mp_ + t2 : a]);
        for (int le = 0; le < L.dE; ++le) {
          const float* src =
              &L.back[j][(((static_cast<std::size_t>(t2) * A + a) * L.dE + le) * c) * row];
          float* dst =
              &L.expert_out[(static_cast<std::size_t>(ea * L.dE + le) * L.capacity + first) * row];
          for (std::size_t i = 0; i < static_cast<std::size_t>(c) * row; ++i) dst[i] += src[i];
        }
      }
    }
  }
}

bool ParmPath::run_op(const Plan& plan, const Op& op, std::int64_t& algo) {
  const ParmOp ref = parm_ref(op);
  if (ref.kind == ParmOp::kNone) return false;
  Layer* Lp = nullptr;
  for (auto& lp : layers_)
    if (lp->block == ref.block) Lp = lp.get();
  if (!Lp) return false;
  Layer& L = *Lp;
  const int S = shape_.tokens, M = shape_.model_dim, E = shape_.experts, k = shape_.top_k;
  const int hs = shape_.hidden_dim / esp_;
  const std::uint64_t seed = sc_.workload.routing.seed;
  kc::Context ctx;
  auto group_collective_algo = [&](const std::vector<int>& group) {
    int gi = 0;
    CollectiveSpec spec = op.collective();
    const std::vector<int>& g = my_group(plan.grouping(spec.grouping), &gi);
    MOESIM_ASSERT(g == group, "group collective on another group than parsed");
    collectives::CollectiveCall call{&spec, &g, gi, true};
    algo = static_cast<std::int64_t>(collectives::select_algorithm(call, cost_).algo());
  };
  // A group collective's element count must be the plan's (bytes in the scenario's dtype).
  auto expect_plan_elements = [&](std::size_t elements) {
    const double plan_elems =
        op.collective().bytes.value() / static_cast<double>(sc_.bytes_per_element());
    MOESIM_ASSERT(std::fabs(plan_elems - static_cast<double>(elements)) < 0.5,
                  fmt::format("'{}': the data path moves {} elements, the plan {}", op.label,
                              elements, plan_elems));
  };
  auto own_tokens = [&] {
    if (L.x_own.empty())
      L.x_own = make_tokens(shape_, seed, iteration_, L.moe,
                            token_key_rank(sc_.parallelism, comm_.rank()));
  };
  const std::size_t row = static_cast<std::size_t>(M);

  switch (ref.kind) {
    case ParmOp::kEspAllGather: {
      own_tokens();
      group_collective_algo(L.esp_group);
      L.x_gate.assign(static_cast<std::size_t>(esp_) * S * row, 0.0f);
      expect_plan_elements(L.x_gate.size());  // the plan counts the gathered St x M
      comm_.all_gather(reinterpret_cast<const std::byte*>(L.x_own.data()),
                       L.x_own.size() * sizeof(float),
                       reinterpret_cast<std::byte*>(L.x_gate.data()), L.esp_group);
      return true;
    }
    case ParmOp::kGate: {
      own_tokens();
      if (L.sched == ParmSchedule::kS1)  // MP split before the gate: rows of MP share t
        L.x_gate.assign(L.x_own.begin() + static_cast<std::ptrdiff_t>(t_) * L.gate_tokens * M,
                        L.x_own.begin() + static_cast<std::ptrdiff_t>(t_ + 1) * L.gate_tokens * M);
      else if (L.sched == ParmSchedule::kS2)
        L.x_gate = L.x_own;
      MOESIM_ASSERT(L.x_gate.size() == static_cast<std::size_t>(L.gate_tokens) * M,
                    "gate input size");
      const std::size_t entries = static_cast<std::size_t>(L.gate_tokens) * k;
      L.logits.assign(static_cast<std::size_t>(L.gate_tokens) * E, 0);
      L.expert.assign(entries, 0);
      L.slot.assign(entries, 0);
      L.weight.assign(entries, 0);
      L.slot_entry.assign(static_cast<std::size_t>(E) * L.capacity, -1);
      L.expert_count.assign(E, 0);
      const kernels::GateParams gp = gate_params(shape_, L.gate_tokens, L.capacity);
      const std::vector<float> gate_w = make_gate_weights(shape_, seed, L.moe);
      kernels::RoutingOut out{L.expert.data(), L.slot.data(), L.weight.data(), L.slot_entry.data(),
                              L.expert_count.data()};
      kc::gate(ctx, kF32, gp, L.x_gate.data(), gate_w.data(), L.logits.data(), out);
      return true;
    }
    case ParmOp::kEncode:
      L.dispatched.assign(static_cast<std::size_t>(E) * L.capacity * row, 0.0f);
      L.expert_out.assign(L.dispatched.size(), 0.0f);
      L.summed = false;
      kc::encode(ctx, kF32, L.routing(shape_), M, L.x_gate.data(), L.dispatched.data());
      return true;
    case ParmOp::kLocalDump:
      for (std::size_t j = 0; j < L.caps.size(); ++j) pack_fused(L, static_cast<int>(j));
      return true;
    case ParmOp::kDispatch:
    case ParmOp::kFc1: {
      const int j = ref.chunk, c = L.caps.at(j);
      if (ref.kind == ParmOp::kDispatch || !L.has_a2a) {
        // The send buffer: the fused path's local dump (made here when esp = 1: no dump op), or
        // the baseline's (E, c, M) slots of the chunk, expert e's block at EP position e / dE.
        std::vector<float> packed;
        if (L.sched != ParmSchedule::kBaseline) {
          if (L.send[j].empty()) pack_fused(L, j);
          packed = std::move(L.send[j]);
          L.send[j].clear();
        } else {
          packed.assign(static_cast<std::size_t>(E) * c * row, 0.0f);
          for (int e = 0; e < E; ++e)
            std::memcpy(
                &packed[static_cast<std::size_t>(e) * c * row],
                &L.dispatched[(static_cast<std::size_t>(e) * L.capacity + L.offset[j]) * row],
                sizeof(float) * c * M);
        }
        if (ref.kind == ParmOp::kDispatch) {
          all_to_all(plan, op, packed, L.chunk_in[j], algo);
          return true;
        }
        L.chunk_in[j] = std::move(packed);  // W = 1: the experts are local
      }
      // fc1 + ReLU of every (source, local expert) block with this shard's hidden slice.
      L.hidden[j].assign(static_cast<std::size_t>(L.blocks) * c * hs, 0.0f);
      MOESIM_ASSERT(L.chunk_in[j].size() == static_cast<std::size_t>(L.blocks) * c * row,
                    "expert input size");
      for (int blk = 0; blk < L.blocks; ++blk) {
        float* h = &L.hidden[j][static_cast<std::size_t>(blk) * c * hs];
        kc::gemm(ctx, kF32, c, hs, M, &L.chunk_in[j][static_cast<std::size_t>(blk) * c * row],
                 L.w1[blk % L.dE].data(), h);
        for (std::size_t i = 0; i < static_cast<std::size_t>(c) * hs; ++i)
          h[i] = h[i] > 0 ? h[i] : 0;
      }
      return true;
    }
    case ParmOp::kFc2: {
      const int j = ref.chunk, c = L.caps.at(j);
      L.chunk_out[j].assign(static_cast<std::size_t>(L.blocks) * c * row, 0.0f);
      for (int blk = 0; blk < L.blocks; ++blk)
        kc::gemm(ctx, kF32, c, M, hs, &L.hidden[j][static_cast<std::size_t>(blk) * c * hs],
                 L.w2[blk % L.dE].data(), &L.chunk_out[j][static_cast<std::size_t>(blk) * c * row]);
      return true;
    }
    case ParmOp::kEspAllReduce: {
      const int j = ref.chunk;
      group_collective_algo(L.esp_group);
      expect_plan_elements(L.chunk_out[j].size());
      comm_.all_reduce_sum(L.chunk_out[j].data(), L.chunk_out[j].size(), L.esp_group);
      return true;
    }
    case ParmOp::kCombine:
    case ParmOp::kCombineSaa:
      all_to_all(plan, op, L.chunk_out[ref.chunk], L.back[ref.chunk], algo);
      return true;
    case ParmOp::kLocalCombine:
      sum_partials(L);
      return true;
    case ParmOp::kDecode: {
      sum_partials(L);
      L.y_gate.assign(static_cast<std::size_t>(L.gate_tokens) * row, 0.0f);
      kc::decode(ctx, kF32, L.routing(shape_), M, L.expert_out.data(), L.y_gate.data());
      if (L.sched == ParmSchedule::kS1 && mp_ > 1) return true;  // the MP all-gather follows
      // Baseline: the ESP split back to this rank's own S rows of the gathered tokens.
      L.y.assign(L.y_gate.begin() + static_cast<std::ptrdiff_t>(L.own_first) * M,
                 L.y_gate.begin() + static_cast<std::ptrdiff_t>(L.own_first + S) * M);
      return true;
    }
    case ParmOp::kMpAllGather: {
      group_collective_algo(L.mp_group);
      L.y.assign(static_cast<std::size_t>(S) * row, 0.0f);
      expect_plan_elements(L.y.size());  // the plan counts the gathered S x M
      comm_.all_gather(reinterpret_cast<const std::byte*>(L.y_gate.data()),
                       L.y_gate.size() * sizeof(float), reinterpret_cast<std::byte*>(L.y.data()),
                       L.mp_group);
      return true;
    }
    case ParmOp::kNone:
      break;
  }
  return false;
}

long long ParmPath::dropped(int li) const {
  const Layer& L = *layers_.at(li);
  const int S = shape_.tokens, k = shape_.top_k;
  // Owned rows of the gate's unit: MP share t of this rank's S tokens (S1 gated only those).
  const int lo = L.sched == ParmSchedule::kS1 ? 0 : L.own_first + t_ * S / mp_;
  const int hi = L.sched == ParmSchedule::kS1 ? L.gate_tokens : L.own_first + (t_ + 1) * S / mp_;
  long long d = 0;
  for (std::size_t i = static_cast<std::size_t>(lo) * k; i < static_cast<std::size_t>(hi) * k; ++i)
    d += i < L.slot.size() && L.slot[i] < 0 ? 1 : 0;
  return d;
}

std::vector<float> ParmPath::reference(int li, long long* dropped) const {
  const Layer& L = *layers_.at(li);
  const int S = shape_.tokens, M = shape_.model_dim, k = shape_.top_k;
  const std::uint64_t seed = sc_.workload.routing.seed;
  const std::vector<float> own =
      make_tokens(shape_, seed, iteration_, L.moe, token_key_rank(sc_.parallelism, comm_.rank()));
  // Drops among rows [lo, hi) of a unit, from the reference's own routing.
  auto drops_in = [&](const MoeShape& unit, const std::vector<float>& tokens, int lo, int hi) {
    const ReferenceRouting rr =
        reference_routing(unit, tokens, make_gate_weights(unit, seed, L.moe), L.capacity);
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
                                         nullptr);
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
            reference_layer_seeded_rows(unit, part, seed, L.moe, L.capacity, 0, L.gate_tokens, &d);
        if (t2 == t_ && dropped) *dropped = d;
        y.insert(y.end(), yp.begin(), yp.end());
      }
      return y;
    }
    case ParmSchedule::kS2:
      if (dropped) *dropped = drops_in(unit, own, t_ * S / mp_, (t_ + 1) * S / mp_);
      return reference_layer_seeded_rows(unit, own, seed, L.moe, L.capacity, 0, S, nullptr);
  }
  return {};
}

}  // namespace moesim::exec
