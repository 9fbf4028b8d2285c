#include "exec/sharded_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>

#include "core/error.hpp"
#include "exec/executor.hpp"
#include "exec/host_layer.hpp"
#include "exec/layer_program.hpp"
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
  bool on_rank = false;  // some op of the layer runs on this rank (its pipeline stage's layer)
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
    if (op.ranks.index_of(rank) >= 0) b.on_rank = true;
    // Micro-batches (model.micro_batches) repeat a layer's ops with the same shapes: the first
    // instance of each chunk lays the layer out.
    auto first = [&](std::vector<const Op*>& v) {
      if (ref.chunk == static_cast<int>(v.size())) v.push_back(&op);
    };
    switch (ref.kind) {
      case OpRoleKind::kDispatch:
        first(b.dispatch);
        break;
      case OpRoleKind::kFc1:
        first(b.fc1);
        break;
      case OpRoleKind::kCombine:
        first(b.combine);
        break;
      case OpRoleKind::kParamGather:
        if (!b.gather) b.gather = &op;
        break;
      case OpRoleKind::kPartialSum:
        if (!b.partial_sum) b.partial_sum = &op;
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
    L.block = b.block;
    L.shards = n;
    L.on_rank = b.on_rank;
    if (!L.on_rank) {  // another pipeline stage's layer: this rank only joins its check
      out->push_back(std::move(L));
      continue;
    }
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
  // The layer program's record and buffers (exec/layer_program.hpp): kW1 / kW2 hold the
  // hidden slice q of rho this rank computes with, kDispatched / kExpertOut (E, rho, C, M).
  struct Layer : ShardedLayerPlan {
    LayerLayout lay;
    HostLayerBuffers buf;
    LayerBackwardPlan bwd;  // the plan's backward of it (lay.backward: the program runs it)
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

  bool run_op(const Plan& plan, const Op& op, std::vector<std::int64_t>& collective_algo) {
    if (!active) return false;
    if (is_backward_step(op)) {  // the backward program, where the layer has its gradients
      const int moe = sc.model.moe_layer_of_block(op.role.block);
      if (moe < 0 || moe >= static_cast<int>(layers.size())) return false;
      Layer& L = layers[static_cast<std::size_t>(moe)];
      if (!L.on_rank || !L.lay.backward) return false;
      HostLayerOps ops(comm, cost, topo, plan, shape, L.buf);
      const std::int64_t algo =
          run_backward_step(L.lay, shape, op.role.kind, op.role.chunk, op, ops);
      if (algo >= 0) collective_algo[op.id] = algo;
      return true;
    }
    const MoeOpRef ref = moe_op_ref(op);
    if (ref.kind == OpRoleKind::kNone) return false;
    const int moe = sc.model.moe_layer_of_block(ref.block);
    MOESIM_ASSERT(moe >= 0 && moe < static_cast<int>(layers.size()), "MoE layer out of range");
    Layer& L = layers[moe];
    HostLayerOps ops(comm, cost, topo, plan, shape, L.buf);
    const std::int64_t algo = run_forward_step(L.lay, shape, ref.kind, ref.chunk, op, ops);
    if (algo >= 0) collective_algo[op.id] = algo;
    return true;
  }
};

LayerLayout sharded_layout(const ShardedLayerPlan& p, const MoeShape& s) {
  LayerLayout L = capacity_layout(p.moe, p.block, p.ep, p.ep_pos, 1, s.hidden_dim / p.rho,
                                  /*has_a2a=*/true, p.caps, p.capacity);
  L.shards = p.shards;
  L.rho = p.rho;
  fill_capacity_blocks(L);
  return L;
}

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
    if (!L.on_rank) {  // another pipeline stage's layer: no data here
      d.layers.push_back(std::move(L));
      continue;
    }
    L.lay = sharded_layout(L, d.shape);
    L.bwd = layer_backward_plan(plan, L.block, d.comm.rank());
    L.lay.backward = L.bwd.passes > 0;
    L.lay.grad_sync_parts = L.bwd.sync_parts;
    L.buf.allocate(L.lay, d.shape);
    const int key_rank = token_key_rank(d.sc.parallelism, d.comm.rank());
    L.buf.f({LayerBuf::kGateW}) = make_gate_weights(d.shape, seed, L.moe);
    L.buf.f({LayerBuf::kX32}) = make_tokens(d.shape, seed, iteration, L.moe, key_rank);
    if (L.lay.backward)
      L.buf.f({LayerBuf::kDY}) = make_grad_output(d.shape, seed, iteration, L.moe, key_rank);
    const auto& [w1, w2] = d.own_slice(L);
    if (L.gather() == 1) {  // P2: no gather; this rank's own 1/n slice is hidden slice q of n
      L.buf.f({LayerBuf::kW1}) = w1;
      L.buf.f({LayerBuf::kW2}) = w2;
    } else {  // the param_allgather's block: [W1 slice (M x h) | W2 slice (h x M)]
      auto& in = L.buf.f({LayerBuf::kParamIn});
      std::copy(w1.begin(), w1.end(), in.begin());
      std::copy(w2.begin(), w2.end(), in.begin() + static_cast<std::ptrdiff_t>(w1.size()));
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
    for (const auto& L : impl_->layers)
      out.push_back(L.on_rank ? L.buf.f({LayerBuf::kY}) : std::vector<float>{});
  return out;
}

std::vector<long long> ShardedPath::dropped() const {
  std::vector<long long> out;
  if (impl_->active)
    for (const auto& L : impl_->layers) {
      long long d = 0;
      if (L.on_rank)
        for (auto s : L.buf.i({LayerBuf::kSlot})) d += s < 0 ? 1 : 0;
      out.push_back(d);
    }
  return out;
}

const std::vector<ShardedLayerPlan>& ShardedPath::layers() const { return impl_->plans; }

bool ShardedPath::active() const { return impl_->active; }

const HostLayerBuffers* ShardedPath::buffers(int li) const {
  if (!impl_->active || li < 0 || li >= static_cast<int>(impl_->layers.size())) return nullptr;
  const auto& L = impl_->layers[static_cast<std::size_t>(li)];
  return L.on_rank ? &L.buf : nullptr;
}

std::optional<LayerGradients> ShardedPath::gradients(int li) const {
  if (!impl_->active || li < 0 || li >= static_cast<int>(impl_->layers.size())) return {};
  const Impl::Layer& L = impl_->layers[static_cast<std::size_t>(li)];
  if (!L.on_rank || !L.lay.backward) return {};
  const int h = impl_->shape.hidden_dim / L.shards;
  LayerGradients g;
  g.moe = L.moe;
  g.expert_first = L.expert_id();
  g.local_experts = 1;
  g.hidden_first = L.shard_pos() * h;  // its own 1/n shard, after the reduce-scatter
  g.hidden_cols = h;
  g.capacity = L.capacity;
  g.plan = &L.bwd;
  g.dx = &L.buf.f({LayerBuf::kDX32});
  g.dgate_w = &L.buf.f({LayerBuf::kDGateW});
  g.dw = &L.buf.f({owned_dw(L.lay)});
  return g;
}

std::vector<ProgramLayerRef> ShardedPath::program_layers() {
  std::vector<ProgramLayerRef> out;
  if (impl_->active)
    for (auto& L : impl_->layers)
      if (L.on_rank) out.push_back({L.block, &L.lay, &L.buf});
  return out;
}

}  // namespace moesim::exec
