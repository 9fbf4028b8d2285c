#include "exec/sharded_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "core/error.hpp"
#include "exec/executor.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

namespace kc = kernels::cpu;
constexpr auto kF32 = kernels::DType::kF32;

// This rank's group of `g` (and its position there), or null.
const std::vector<int>* group_of(const Grouping& g, int rank, int* pos, int* index) {
  for (size_t gi = 0; gi < g.groups.size(); ++gi) {
    const auto it = std::find(g.groups[gi].begin(), g.groups[gi].end(), rank);
    if (it == g.groups[gi].end()) continue;
    *pos = static_cast<int>(it - g.groups[gi].begin());
    *index = static_cast<int>(gi);
    return &g.groups[gi];
  }
  return nullptr;
}

// The forward MoE ops of one block, in plan order.
struct BlockOps {
  int block = -1;
  std::vector<const Op*> dispatch, fc1, combine;
  const Op* gather = nullptr;
  const Op* partial_sum = nullptr;
};

long long elements(const Op& op, int bytes_per_element) {
  return std::llround(op.collective().bytes.value() / bytes_per_element);
}

}  // namespace

std::string plan_sharded_layers(const Plan& plan, int rank, const MoeShape& shape, int shards,
                                int bytes_per_element, std::vector<ShardedLayerPlan>* out) {
  std::vector<BlockOps> blocks;
  std::map<int, std::size_t> block_index;  // MoE layers in order of first appearance
  for (const Op& op : plan.ops()) {
    const MoeOpRef ref = moe_op_ref(op);
    if (ref.kind == OpRoleKind::kNone) continue;
    if (!block_index.count(ref.block)) {
      block_index[ref.block] = blocks.size();
      blocks.push_back(BlockOps{ref.block, {}, {}, {}, nullptr, nullptr});
    }
    BlockOps& b = blocks[block_index[ref.block]];
    switch (ref.kind) {
      case OpRoleKind::kDispatch:
        b.dispatch.push_back(&op);
        break;
      case OpRoleKind::kFc1:
        b.fc1.push_back(&op);
        break;
      case OpRoleKind::kCombine:
        b.combine.push_back(&op);
        break;
      case OpRoleKind::kParamGather:
        b.gather = &op;
        break;
      case OpRoleKind::kPartialSum:
        b.partial_sum = &op;
        break;
      default:
        break;
    }
  }
  const int n = shards, M = shape.model_dim, H = shape.hidden_dim, E = shape.experts;
  if (H % n != 0)
    return fmt::format("the hidden dim H = {} does not split into the n = {} expert shards", H, n);
  out->clear();
  for (const BlockOps& b : blocks) {
    ShardedLayerPlan L;
    L.moe = static_cast<int>(out->size());
    L.shards = n;
    const std::string where = fmt::format("MoE layer {} (block {})", L.moe, b.block);
    if (b.fc1.empty() || b.dispatch.size() != b.fc1.size() || b.combine.size() != b.fc1.size())
      return where + ": expected one dispatch, fc1 and combine per chunk";
    for (const Op* op : b.dispatch)
      if (op->collective().type != CollectiveType::kAllToAll)
        return where +
               ": dispatch is not a padded all_to_all (routed all_to_allv dispatch is "
               "not supported with sharded experts)";
    int index = 0;
    const std::vector<int>* ep =
        group_of(plan.grouping(b.dispatch[0]->collective().grouping), rank, &L.ep_pos, &index);
    if (!ep) return where + ": this rank is in no group of the dispatch";
    L.ep = static_cast<int>(ep->size());
    if (E * n != L.ep)
      return fmt::format("{}: {} experts x {} shards on an EP group of {} ranks", where, E, n,
                         L.ep);
    const auto& g1 = b.fc1[0]->compute().gemm;
    if (!g1 || g1->n < 1 || H % g1->n != 0 || n % (H / g1->n) != 0)
      return where + ": the expert fc1 GEMM's hidden width is not H / rho for a divisor rho of n";
    const std::int64_t hs = g1->n;
    L.rho = static_cast<int>(H / hs);
    const int g = L.gather();
    // Exact FLOPs of each expert GEMM: 2 * T_j * M * H/rho with T_j = (W/n) * c_j * rho.
    const double per_slot = 2.0 * M * static_cast<double>(hs) * (L.ep / n) * L.rho;
    for (size_t j = 0; j < b.fc1.size(); ++j) {
      const double flops = b.fc1[j]->compute().flops.value();
      const long long c = std::llround(flops / per_slot);
      if (std::fabs(static_cast<double>(c) * per_slot - flops) > 0.5)
        return fmt::format("{}: fc1.c{} FLOPs {} are not 2 (W/n) c rho M H/rho", where, j + 1,
                           flops);
      if (c % g != 0)
        return fmt::format(
            "{}: chunk {} has capacity {} slots, not a multiple of n / rho = {} (each of the {} "
            "GPUs of a hidden slice takes an equal share of every source's slots)",
            where, j + 1, c, g, g);
      L.caps.push_back(static_cast<int>(c));
      // The all_to_all moves rho copies of the (E, c_j, M) chunk: exactly our buffers.
      const long long want = static_cast<long long>(L.rho) * E * c * M;
      MOESIM_ASSERT(elements(*b.dispatch[j], bytes_per_element) == want &&
                        elements(*b.combine[j], bytes_per_element) == want,
                    "sharded dispatch/combine bytes differ from rho * E * c_j * M elements");
    }
    if ((g > 1) != (b.gather != nullptr))
      return fmt::format("{}: param_allgather {} but n / rho = {}", where,
                         b.gather ? "present" : "missing", g);
    if (b.gather) {
      int pos = 0, gi = 0;
      const std::vector<int>* grp =
          group_of(plan.grouping(b.gather->collective().grouping), rank, &pos, &gi);
      if (!grp || static_cast<int>(grp->size()) != g || pos != L.member())
        return where +
               ": the param_allgather group is not the n / rho consecutive shards of "
               "this rank's hidden slice";
      MOESIM_ASSERT(elements(*b.gather, bytes_per_element) == 2LL * M * H / L.rho,
                    "param_allgather bytes differ from 2 M H / rho elements");
    }
    if ((L.rho > 1) != (b.partial_sum != nullptr))
      return fmt::format("{}: partial_sum {} but rho = {}", where,
                         b.partial_sum ? "present" : "missing", L.rho);
    L.offset.assign(L.caps.size(), 0);
    for (size_t j = 1; j < L.caps.size(); ++j) L.offset[j] = L.offset[j - 1] + L.caps[j - 1];
    L.capacity = L.offset.back() + L.caps.back();
    out->push_back(std::move(L));
  }
  return "";
}

struct ShardedPath::Impl {
  struct Layer : ShardedLayerPlan {
    std::vector<float> gate_w;
    std::vector<float> w1, w2;  // the hidden slice q of rho this rank computes with
    std::vector<float> x, logits, weight;
    std::vector<std::int32_t> expert, slot, slot_entry, expert_count;
    std::vector<float> dispatched;  // (E, rho, C, M): copy q of expert x for hidden slice q
    std::vector<float> expert_out;  // (E, rho, C, M): partial outputs of slice q
    std::vector<float> summed;      // (E, C, M): sum over q (rho > 1)
    std::vector<float> y;
    std::vector<std::vector<float>> chunk_in, hidden, chunk_out;  // per chunk: (W * c_j / g, .)
  };

  const Scenario& sc;
  const topology::Topology& topo;
  collectives::CostContext cost;  // the simulator's selection context (scenario_cost_context)
  Communicator& comm;
  MoeShape shape;
  int iteration = 0;
  bool active = false;
  std::vector<Layer> layers;
  std::vector<ShardedLayerPlan> plans;
  // This rank's own 1/n slices (the parameters it keeps), per (layer, expert, shard): the same
  // for every rho, so generated once.
  std::map<std::tuple<int, int, int>, std::pair<std::vector<float>, std::vector<float>>> own;

  Impl(const Scenario& s, const topology::Topology& t, Communicator& c, const MoeShape& sh)
      : sc(s), topo(t), cost(strategies::scenario_cost_context(s, t)), comm(c), shape(sh) {}

  const std::pair<std::vector<float>, std::vector<float>>& own_slice(const Layer& L) {
    const auto key = std::make_tuple(L.moe, L.expert_id(), L.shard_pos());
    auto it = own.find(key);
    if (it == own.end()) {
      const std::uint64_t seed = sc.workload.routing.seed;
      it = own.emplace(
                  key,
                  std::make_pair(
                      make_w1_slice(shape, seed, L.moe, L.expert_id(), L.shard_pos(), L.shards),
                      make_w2_slice(shape, seed, L.moe, L.expert_id(), L.shard_pos(), L.shards)))
               .first;
    }
    return it->second;
  }

  // One all_to_all of the data path through the shared lowering (as the unsharded dispatch).
  void all_to_all(const Plan& plan, const Op& op, const std::vector<float>& send,
                  std::vector<float>& recv, std::vector<std::int64_t>& collective_algo) {
    recv.assign(send.size(), 0);
    CollectiveSpec spec = op.collective();
    spec.bytes = Bytes(static_cast<double>(send.size() * sizeof(float)));
    const Grouping& g = plan.grouping(spec.grouping);
    int pos = 0, gi = 0;
    const std::vector<int>* group = group_of(g, comm.rank(), &pos, &gi);
    MOESIM_ASSERT(group != nullptr, "rank outside the all_to_all's grouping");
    collectives::CollectiveCall call{&spec, group, gi, true};
    const collectives::CostContext& cctx = cost;
    const auto& algo = collectives::select_algorithm(call, cctx);
    collective_algo[op.id] = static_cast<std::int64_t>(algo.algo());
    run_phases(comm, algo.lower(call, topo), reinterpret_cast<const std::byte*>(send.data()),
               send.size() * 4, reinterpret_cast<std::byte*>(recv.data()), recv.size() * 4,
               op.id % 32000);
  }

  void param_gather(const Plan& plan, const Op& op, Layer& L,
                    std::vector<std::int64_t>& collective_algo) {
    const int M = shape.model_dim, g = L.gather(), h = shape.hidden_dim / L.shards;
    const auto& [w1_own, w2_own] = own_slice(L);
    // Block of one member: its W1 slice (M x h) then its W2 slice (h x M).
    const std::size_t block = 2 * static_cast<std::size_t>(M) * h;
    std::vector<float> in(block), gathered(block * g);
    std::copy(w1_own.begin(), w1_own.end(), in.begin());
    std::copy(w2_own.begin(), w2_own.end(), in.begin() + static_cast<std::ptrdiff_t>(M) * h);
    const Grouping& grouping = plan.grouping(op.collective().grouping);
    int pos = 0, gi = 0;
    const std::vector<int>* group = group_of(grouping, comm.rank(), &pos, &gi);
    MOESIM_ASSERT(group != nullptr, "rank outside the param_allgather's grouping");
    collectives::CollectiveCall call{&op.collective(), group, gi, true};
    const collectives::CostContext& cctx = cost;
    collective_algo[op.id] =
        static_cast<std::int64_t>(collectives::select_algorithm(call, cctx).algo());
    comm.all_gather(reinterpret_cast<const std::byte*>(in.data()), block * sizeof(float),
                    reinterpret_cast<std::byte*>(gathered.data()), *group);
    // Member i's shard s = q * g + i holds hidden units [s h, s h + h): slice q of rho is the
    // members' columns of W1 side by side and their rows of W2 one after the other.
    const int hq = g * h;
    L.w1.assign(static_cast<std::size_t>(M) * hq, 0);
    L.w2.assign(static_cast<std::size_t>(hq) * M, 0);
    for (int i = 0; i < g; ++i) {
      const float* b1 = &gathered[block * i];
      const float* b2 = b1 + static_cast<std::size_t>(M) * h;
      for (int m = 0; m < M; ++m)
        std::copy_n(b1 + static_cast<std::size_t>(m) * h, h,
                    &L.w1[static_cast<std::size_t>(m) * hq + static_cast<std::size_t>(i) * h]);
      std::copy_n(b2, static_cast<std::size_t>(h) * M, &L.w2[static_cast<std::size_t>(i) * h * M]);
    }
  }

  kernels::Routing routing(Layer& L) const {
    kernels::Routing r;
    r.num_tokens = shape.tokens;
    r.top_k = shape.top_k;
    r.num_experts = shape.experts;
    r.capacity = L.capacity;
    r.expert = L.expert.data();
    r.slot = L.slot.data();
    r.weight = L.weight.data();
    r.slot_entry = L.slot_entry.data();
    return r;
  }

  // Offset of slot `slot` of copy q of expert x in an (E, rho, C, M) buffer.
  static std::size_t at(const Layer& L, int x, int q, int slot, int M) {
    return ((static_cast<std::size_t>(x) * L.rho + q) * L.capacity + slot) * M;
  }

  bool run_op(const Plan& plan, const Op& op, std::vector<std::int64_t>& collective_algo) {
    if (!active) return false;
    const MoeOpRef ref = moe_op_ref(op);
    if (ref.kind == OpRoleKind::kNone) return false;
    const int moe = sc.model.moe_layer_of_block(ref.block);
    MOESIM_ASSERT(moe >= 0 && moe < static_cast<int>(layers.size()), "MoE layer out of range");
    Layer& L = layers[moe];
    const int S = shape.tokens, M = shape.model_dim, E = shape.experts, k = shape.top_k;
    const int W = L.ep, n = L.shards, rho = L.rho, g = L.gather(), C = L.capacity;
    const int hq = shape.hidden_dim / rho;
    kc::Context ctx;
    switch (ref.kind) {
      case OpRoleKind::kParamGather:
        param_gather(plan, op, L, collective_algo);
        return true;
      case OpRoleKind::kGate: {
        L.x = make_tokens(shape, sc.workload.routing.seed, iteration, L.moe,
                          token_key_rank(sc.parallelism, comm.rank()));
        L.logits.assign(static_cast<size_t>(S) * E, 0);
        L.expert.assign(static_cast<size_t>(S) * k, 0);
        L.slot.assign(static_cast<size_t>(S) * k, 0);
        L.weight.assign(static_cast<size_t>(S) * k, 0);
        L.slot_entry.assign(static_cast<size_t>(E) * C, -1);
        L.expert_count.assign(E, 0);
        const kernels::GateParams gp = gate_params(shape, S, C);
        kernels::RoutingOut out{L.expert.data(), L.slot.data(), L.weight.data(),
                                L.slot_entry.data(), L.expert_count.data()};
        kc::gate(ctx, kF32, gp, L.x.data(), L.gate_w.data(), L.logits.data(), out);
        return true;
      }
      case OpRoleKind::kEncode: {
        std::vector<float> once(static_cast<size_t>(E) * C * M, 0);
        kc::encode(ctx, kF32, routing(L), M, L.x.data(), once.data());
        // rho copies of each expert's slots, one per hidden slice (P2 / intermediate repeat).
        L.dispatched.assign(once.size() * rho, 0);
        for (int x = 0; x < E; ++x)
          for (int q = 0; q < rho; ++q)
            std::copy_n(&once[static_cast<size_t>(x) * C * M], static_cast<size_t>(C) * M,
                        &L.dispatched[at(L, x, q, 0, M)]);
        L.expert_out.assign(L.dispatched.size(), 0);
        return true;
      }
      case OpRoleKind::kDispatch: {
        const int j = ref.chunk, cg = L.caps[j] / g, off = L.offset[j];
        // Destination p = x n + q g + i (EP order) gets slots [off + i cg, off + (i + 1) cg) of
        // copy q of expert x: W contiguous blocks of cg rows.
        const std::size_t blk = static_cast<std::size_t>(cg) * M;
        std::vector<float> send(blk * W);
        for (int p = 0; p < W; ++p) {
          const int x = p / n, q = (p % n) / g, i = p % g;
          std::copy_n(&L.dispatched[at(L, x, q, off + i * cg, M)], blk, &send[blk * p]);
        }
        all_to_all(plan, op, send, L.chunk_in[j], collective_algo);
        return true;
      }
      case OpRoleKind::kFc1: {
        const int j = ref.chunk, rows = W * (L.caps[j] / g);
        MOESIM_ASSERT(L.w1.size() == static_cast<size_t>(M) * hq, "fc1 before its parameters");
        L.hidden[j].assign(static_cast<size_t>(rows) * hq, 0);
        if (rows > 0)
          kc::gemm(ctx, kF32, rows, hq, M, L.chunk_in[j].data(), L.w1.data(), L.hidden[j].data());
        for (float& v : L.hidden[j]) v = v > 0 ? v : 0;
        return true;
      }
      case OpRoleKind::kFc2: {
        const int j = ref.chunk, rows = W * (L.caps[j] / g);
        L.chunk_out[j].assign(static_cast<size_t>(rows) * M, 0);
        if (rows > 0)
          kc::gemm(ctx, kF32, rows, M, hq, L.hidden[j].data(), L.w2.data(), L.chunk_out[j].data());
        return true;
      }
      case OpRoleKind::kCombine: {
        const int j = ref.chunk, cg = L.caps[j] / g, off = L.offset[j];
        std::vector<float> back;
        // Row block w of chunk_out came from source w: the all_to_all returns it there.
        all_to_all(plan, op, L.chunk_out[j], back, collective_algo);
        const std::size_t blk = static_cast<std::size_t>(cg) * M;
        for (int p = 0; p < W; ++p) {
          const int x = p / n, q = (p % n) / g, i = p % g;
          std::copy_n(&back[blk * p], blk, &L.expert_out[at(L, x, q, off + i * cg, M)]);
        }
        return true;
      }
      case OpRoleKind::kPartialSum: {
        const std::size_t per = static_cast<size_t>(C) * M;
        L.summed.assign(static_cast<size_t>(E) * per, 0);
        for (int x = 0; x < E; ++x)
          for (int q = 0; q < rho; ++q) {
            const float* src = &L.expert_out[at(L, x, q, 0, M)];
            float* dst = &L.summed[static_cast<size_t>(x) * per];
            for (std::size_t e = 0; e < per; ++e) dst[e] += src[e];
          }
        return true;
      }
      case OpRoleKind::kDecode:
        L.y.assign(static_cast<size_t>(S) * M, 0);
        // rho = 1: expert_out is already (E, C, M).
        kc::decode(ctx, kF32, routing(L), M, rho > 1 ? L.summed.data() : L.expert_out.data(),
                   L.y.data());
        return true;
      default:  // kNone (moe_op_ref lists no other kind)
        break;
    }
    return false;
  }
};

ShardedPath::ShardedPath(const Scenario& sc, const topology::Topology& topo, Communicator& comm,
                         const MoeShape& shape)
    : impl_(std::make_unique<Impl>(sc, topo, comm, shape)) {}

ShardedPath::~ShardedPath() = default;

std::string ShardedPath::begin(const Plan& plan, int iteration) {
  Impl& d = *impl_;
  d.iteration = iteration;
  d.layers.clear();
  d.active = false;
  std::vector<ShardedLayerPlan> plans;
  std::string why = plan_sharded_layers(plan, d.comm.rank(), d.shape, d.sc.model.expert_shards(),
                                        d.sc.bytes_per_element(), &plans);
  d.plans.clear();
  if (!why.empty()) return why;
  d.plans = plans;
  const std::uint64_t seed = d.sc.workload.routing.seed;
  for (ShardedLayerPlan& p : plans) {
    Impl::Layer L;
    static_cast<ShardedLayerPlan&>(L) = std::move(p);
    L.gate_w = make_gate_weights(d.shape, seed, L.moe);
    L.chunk_in.resize(L.caps.size());
    L.hidden.resize(L.caps.size());
    L.chunk_out.resize(L.caps.size());
    if (L.gather() == 1) {  // P2: no gather; this rank's own 1/n slice is hidden slice q of n
      L.w1 = d.own_slice(L).first;
      L.w2 = d.own_slice(L).second;
    }
    d.layers.push_back(std::move(L));
  }
  d.active = true;
  return "";
}

bool ShardedPath::run_op(const Plan& plan, const Op& op,
                         std::vector<std::int64_t>& collective_algo) {
  return impl_->run_op(plan, op, collective_algo);
}

std::vector<std::vector<float>> ShardedPath::outputs() const {
  std::vector<std::vector<float>> out;
  if (impl_->active)
    for (const auto& L : impl_->layers) out.push_back(L.y);
  return out;
}

std::vector<long long> ShardedPath::dropped() const {
  std::vector<long long> out;
  if (impl_->active)
    for (const auto& L : impl_->layers) {
      long long d = 0;
      for (auto s : L.slot) d += s < 0 ? 1 : 0;
      out.push_back(d);
    }
  return out;
}

const std::vector<ShardedLayerPlan>& ShardedPath::layers() const { return impl_->plans; }

bool ShardedPath::active() const { return impl_->active; }

}  // namespace moesim::exec
