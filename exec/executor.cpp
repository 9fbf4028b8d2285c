#include "exec/executor.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <queue>

#include "exec/cuda_executor.hpp"
#include "exec/deepep_path.hpp"
#include "exec/host_layer.hpp"
#include "exec/layer_program.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/parm_path.hpp"
#include "exec/phase_runner.hpp"
#include "exec/routed_path.hpp"
#include "exec/sharded_path.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/plan_builder.hpp"
#include "topology/topology.hpp"
#ifdef MOESIM_HAVE_NCCL
#include "exec/nccl_communicator.hpp"
#endif

namespace moesim::exec {

#ifndef MOESIM_HAVE_NCCL
// Without NCCL the GPU path is never created; unique_ptr<DevicePath> still needs a destructor.
struct DevicePath::Impl {};
DevicePath::~DevicePath() = default;
#endif

namespace {

using Clock = std::chrono::steady_clock;

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

}  // namespace

namespace {
// The forward data steps of the plain, routed and sharded paths (the plan builder's roles).
MoeOpRef moe_ref_of_pass(const Op& op) {
  MoeOpRef ref;
  if (op.role.backward) return ref;
  switch (op.role.kind) {
    case OpRoleKind::kGate:
    case OpRoleKind::kEncode:
    case OpRoleKind::kDecode:
    case OpRoleKind::kParamGather:
    case OpRoleKind::kPartialSum:
    case OpRoleKind::kDispatch:
    case OpRoleKind::kFc1:
    case OpRoleKind::kFc2:
    case OpRoleKind::kCombine:
      break;
    default:
      return ref;  // Parm's steps and gradient syncs: not this grammar
  }
  ref.kind = op.role.kind;
  ref.block = op.role.block;
  ref.chunk = op.role.chunk;
  return ref;
}
}  // namespace

MoeOpRef moe_op_ref(const Op& op) { return moe_ref_of_pass(op); }

std::vector<MoeLayerPlan> plan_moe_layers(const Plan& plan, int rank, int experts) {
  std::vector<MoeLayerPlan> layers;
  std::map<int, int> block_to_layer;
  for (const Op& op : plan.ops()) {
    MoeOpRef ref = moe_op_ref(op);
    if (ref.kind == OpRoleKind::kNone) continue;
    if (!block_to_layer.count(ref.block)) {
      block_to_layer[ref.block] = static_cast<int>(layers.size());
      layers.emplace_back();
      layers.back().moe = static_cast<int>(layers.size()) - 1;
      layers.back().block = ref.block;
    }
    MoeLayerPlan& L = layers[block_to_layer[ref.block]];
    if (op.ranks.index_of(rank) >= 0) L.on_rank = true;
    if (ref.kind == OpRoleKind::kFc1) {
      const GemmShape& g = *op.compute().gemm;
      const int cap = static_cast<int>(g.m * g.batch / experts);
      // Micro-batches (model.micro_batches) repeat a layer's ops with the same shapes: the first
      // instance lays the layer out, the others must match it.
      if (ref.chunk < static_cast<int>(L.caps.size())) {
        MOESIM_ASSERT(L.caps[static_cast<std::size_t>(ref.chunk)] == cap,
                      "a micro-batch's expert chunk differs from the first one's");
        continue;
      }
      MOESIM_ASSERT(ref.chunk == static_cast<int>(L.caps.size()), "expert chunks out of order");
      L.caps.push_back(cap);
    }
    if (ref.kind == OpRoleKind::kDispatch && !L.has_a2a) {
      L.has_a2a = true;
      L.routed = op.collective().type == CollectiveType::kAllToAllv;
      const Grouping& grp = plan.grouping(op.collective().grouping);
      for (const auto& members : grp.groups)
        for (size_t i = 0; i < members.size(); ++i)
          if (members[i] == rank) {
            L.ep = static_cast<int>(members.size());
            L.ep_pos = static_cast<int>(i);
          }
      MOESIM_ASSERT(L.ep >= 1 && experts % L.ep == 0, "EP group size must divide the experts");
    }
  }
  for (MoeLayerPlan& L : layers) {
    L.local_experts = experts / L.ep;
    L.offset.assign(L.caps.size(), 0);
    for (size_t j = 1; j < L.caps.size(); ++j) L.offset[j] = L.offset[j - 1] + L.caps[j - 1];
    L.capacity = L.caps.empty() ? 0 : L.offset.back() + L.caps.back();
  }
  return layers;
}

ExchangeSizes exchange_sizes(const CollectiveSpec& spec, const ByteMatrix* matrix,
                             std::size_t group_size, int pos) {
  ExchangeSizes sz;
  if (spec.type == CollectiveType::kAllToAllv) {
    MOESIM_ASSERT(matrix != nullptr, "all_to_allv without a matrix");
    sz.send = static_cast<std::size_t>(matrix->row_sum(pos).value());
    sz.recv = static_cast<std::size_t>(matrix->col_sum(pos).value());
    return sz;
  }
  const bool saa = spec.algo == CollectiveAlgo::kSaa;  // never picked by auto: named by the plan
  const std::size_t bytes = static_cast<std::size_t>(std::ceil(spec.bytes.value()));
  const std::size_t unit = 4 * group_size * (saa ? 840 : 1);
  sz.send = sz.recv = round_up(std::max<std::size_t>(bytes, 1), unit);
  if (saa) sz.recv *= static_cast<std::size_t>(std::max(1, spec.sub_group));
  return sz;
}

std::vector<OpId> priority_issue_order(const Plan& plan) {
  const auto& ops = plan.ops();
  std::vector<int> waiting(ops.size(), 0);
  std::vector<std::vector<OpId>> next(ops.size());
  for (const Op& op : ops)
    for (OpId d : op.deps) {
      ++waiting[op.id];
      next[d].push_back(op.id);
    }
  // Ready ops by (highest priority, lowest id).
  auto later = [&](OpId a, OpId b) {
    if (ops[a].priority != ops[b].priority) return ops[a].priority < ops[b].priority;
    return a > b;
  };
  std::priority_queue<OpId, std::vector<OpId>, decltype(later)> ready(later);
  for (const Op& op : ops)
    if (waiting[op.id] == 0) ready.push(op.id);
  std::vector<OpId> order;
  order.reserve(ops.size());
  while (!ready.empty()) {
    const OpId id = ready.top();
    ready.pop();
    order.push_back(id);
    for (OpId n : next[id])
      if (--waiting[n] == 0) ready.push(n);
  }
  MOESIM_ASSERT(order.size() == ops.size(), "plan has a dependency cycle");
  return order;
}

LayerLayout layer_layout(const MoeLayerPlan& p, const MoeShape& s) {
  LayerLayout L = capacity_layout(p.moe, p.block, p.ep, p.ep_pos, p.local_experts, s.hidden_dim,
                                  p.has_a2a, p.caps, p.capacity);
  fill_capacity_blocks(L);
  return L;
}

// One MoE layer on this rank: its plan, and on the host path its layout and buffers (the layer
// program's, exec/layer_program.hpp; allocated for this rank's stage's layers only).
struct Executor::Layer : MoeLayerPlan {
  LayerLayout lay;
  HostLayerBuffers buf;
  std::unique_ptr<RoutedLayer> rpath;  // plan-routed layer (exec/routed_path.hpp), or null
  std::unique_ptr<DeepepLayer> dpath;  // ... whose dispatch is deepep (exec/deepep_path.hpp)
  LayerBackwardPlan bwd;               // the plan's backward of it (lay.backward: the program's)
  // Its gradients as the check reads them (lay.backward).
  LayerGradients gradients() const {
    LayerGradients g;
    g.moe = moe;
    g.expert_first = lay.ep_pos * lay.slices;
    g.local_experts = lay.slices;
    g.capacity = capacity;
    g.routed_expert = rpath ? &rpath->sent.expert : nullptr;
    g.gate_on_targets = lay.routing == LayerRouting::kDeepep;
    g.plan = &bwd;
    g.dx = &buf.f({LayerBuf::kDX32});
    g.dgate_w = &buf.f({LayerBuf::kDGateW});
    g.dw = &buf.f({LayerBuf::kDW});
    return g;
  }
};

Executor::Executor(const Scenario& sc, const topology::Topology& topo, MpiSession& session,
                   Communicator& comm, ExecOptions options)
    : sc_(sc),
      topo_(topo),
      cost_(strategies::scenario_cost_context(sc, topo)),
      session_(session),
      comm_(comm),
      options_(options) {
  const auto& md = sc.model;
  // The data paths run GELU expert FFNs with every tensor in model.dtype.
  const PrecisionSpec& pr = md.precision;
  if (md.swiglu() || pr.gemm != md.dtype || pr.dispatch != md.dtype || pr.combine != md.dtype)
    throw InputError(fmt::format(
        "exec runs GELU expert FFNs with every tensor in model.dtype ({}); this scenario sets "
        "model.activation {} / model.precision: expected activation gelu and no precision map",
        dtype_name(md.dtype), name_of(md.activation)));
  if (md.mtp_blocks() > 0)
    throw InputError(fmt::format(
        "exec runs the model's blocks without multi-token prediction; this scenario sets "
        "model.mtp_layers {}: expected 0",
        md.mtp_layers));
  shape_ = MoeShape{static_cast<int>(md.tokens_per_gpu()), md.model_dim, md.hidden_dim, md.experts,
                    md.top_k};
  std::tie(shape_.experts_per_group, shape_.group_limit) = node_limit_groups(sc, comm_.rank());
  // Unsharded experts: the plain data path, or exec/parm_path.hpp for plans with esp > 1 or
  // Parm's fused MP schedules (chosen per plan in run()). Sharded experts (esp = 1): the
  // sharded path (exec/sharded_path.hpp).
  data_path_ = md.expert_shards() == 1;
  const bool sharded = sc.parallelism.esp == 1 && md.expert_shards() > 1;
  if (options_.check && !data_path_ && !sharded)
    throw InputError(
        "--check: no data path runs experts that are both sharded (experts_per_gpu < 0) and "
        "split over esp > 1 GPUs; run without --check (scratch buffers)");
  if (options_.check && sharded && md.hidden_dim % md.expert_shards() != 0)
    throw InputError(fmt::format(
        "--check: sharded experts need the hidden dim (H = {}) divisible by the shard count "
        "n = {}",
        md.hidden_dim, md.expert_shards()));
  tolerance_ = options_.tolerance;
#ifdef MOESIM_HAVE_NCCL
  if (auto* nccl = dynamic_cast<NcclCommunicator*>(&comm_)) {
    // Every data path (plain, plan-routed, sharded, Parm) builds its layers on the host and the
    // GPU path runs them through the same layer program (exec/layer_program.hpp).
    const kernels::DType dt = kernel_dtype(md.dtype);
    tolerance_ = std::max(tolerance_, check_tolerance(dt));
    device_ = std::make_unique<DevicePath>(sc_, topo_, *nccl, shape_, dt, data_path_ || sharded);
  }
#endif
  if (sharded) sharded_ = std::make_unique<ShardedPath>(sc_, topo_, comm_, shape_);
}

Executor::~Executor() = default;

strategies::Backend Executor::backend() {
  return [this](const Plan& plan) { return run(plan); };
}

bool Executor::has_data_path() const { return real_data_; }

long long Executor::total_wrong() const {
  long long w = 0;
  for (const auto& c : checks_) w += c.wrong;
  for (const auto& c : grad_checks_) w += c.wrong;
  return w;
}

RunResult Executor::run(const Plan& plan) {
  if (plan.num_ranks() != comm_.size())
    throw InputError(
        fmt::format("plan of {} ranks run on {} ranks", plan.num_ranks(), comm_.size()));
  const auto wall0 = Clock::now();
  prepare_layers(plan);
  const std::vector<double> mine = run_ops(plan);
  collect_layer_results();

  // Every rank gets every rank's times, so every strategy stack sees the same RunResult.
  RunResult result = gather_result(plan, session_.all_gather_doubles(mine));
  if (options_.check) check_layers();
  ++iteration_;
  result.wall_s =
      session_.all_reduce_max(std::chrono::duration<double>(Clock::now() - wall0).count());
  result.peak_rss_bytes = process_peak_rss_bytes();
  return result;
}

// The data paths this plan's MoE layers run on (sharded, Parm or the layer program), each layer's
// buffers allocated and loaded with its inputs (the data generation is not part of the timing).
void Executor::prepare_layers(const Plan& plan) {
  const int me = comm_.rank();
  layers_.clear();
  checked_.clear();
  if (sharded_) {
    // Sharded experts: the plan's rho and chunks decide the layout (exec/sharded_path.hpp).
    const std::string why = sharded_->begin(plan, iteration_);
    if (!why.empty() && options_.check)
      throw InputError("--check: the sharded-expert data path cannot run this plan: " + why);
    for (const auto& lp : sharded_->layers()) checked_.emplace_back(lp.moe, lp.capacity);
  }
  parm_.reset();
  const bool parm_plan = data_path_ && needs_parm_path(sc_, plan);
  if (parm_plan) {
    try {
      parm_ = std::make_unique<ParmPath>(sc_, topo_, comm_, shape_, plan, iteration_);
    } catch (const InputError&) {
      // A layer that cannot run on real data exactly (e.g. mp does not divide a chunk's
      // capacity): --check stops; without it the plan runs with scratch buffers, as before.
      if (options_.check) throw;
    }
  }
  if (!data_path_ || parm_plan) return;
  for (MoeLayerPlan& lp : plan_moe_layers(plan, me, sc_.model.experts)) {
    layers_.push_back(std::make_unique<Layer>());
    static_cast<MoeLayerPlan&>(*layers_.back()) = std::move(lp);
  }
  // This rank's experts: EP position * dE + le.
  const std::uint64_t seed = sc_.workload.routing.seed;
  const int token_rank = token_key_rank(sc_.parallelism, me);  // MP ranks share tokens
  for (auto& lp : layers_) {
    Layer& L = *lp;
    if (!L.on_rank) continue;  // another pipeline stage's layer: no data here
    if (L.routed) {            // the routing decision comes from the plan's all_to_allv matrices
      L.rpath = prepare_routed_layer(plan, L.block, L.moe, me, shape_);
      if (is_deepep_layer(*L.rpath)) {  // the same assignment, moved once per node
        L.dpath = prepare_deepep_layer(*L.rpath, shape_);
        L.lay = deepep_layout(*L.rpath, *L.dpath, shape_);
        enable_backward(plan, L);
        L.buf.allocate(L.lay, shape_);
        fill_deepep_layer(*L.rpath, *L.dpath, shape_, seed, L.buf, L.lay.backward);
      } else {
        L.lay = routed_layout(*L.rpath, shape_);
        enable_backward(plan, L);
        L.buf.allocate(L.lay, shape_);
        fill_routed_layer(*L.rpath, shape_, seed, L.buf);
      }
    } else {
      L.lay = layer_layout(L, shape_);
      enable_backward(plan, L);
      L.buf.allocate(L.lay, shape_);
      const int dE = L.local_experts;
      for (int le = 0; le < dE; ++le) {
        L.buf.f({LayerBuf::kW1, le}) = make_w1(shape_, seed, L.moe, L.ep_pos * dE + le);
        L.buf.f({LayerBuf::kW2, le}) = make_w2(shape_, seed, L.moe, L.ep_pos * dE + le);
      }
    }
    L.buf.f({LayerBuf::kGateW}) = make_gate_weights(shape_, seed, L.moe);
    L.buf.f({LayerBuf::kX32}) = make_tokens(shape_, seed, iteration_, L.moe, token_rank);
    if (L.lay.backward)
      L.buf.f({LayerBuf::kDY}) = make_grad_output(shape_, seed, iteration_, L.moe, token_rank);
  }
}

// The layer's backward runs through the layer program when the plan has it. Called before the
// buffers are allocated (the gradients' are among them).
void Executor::enable_backward(const Plan& plan, Layer& L) {
  L.bwd = layer_backward_plan(plan, L.block, comm_.rank());
  L.lay.backward = L.bwd.passes > 0;
  L.lay.grad_sync_parts = L.bwd.sync_parts;
}

// This rank's ops of the plan, on the GPU or on the host: (start, end) of each, in op order.
std::vector<double> Executor::run_ops(const Plan& plan) {
  const int me = comm_.rank();
  collective_algo_.assign(plan.ops().size(), -1);
  std::vector<double> mine;
  if (device_) {
#ifdef MOESIM_HAVE_NCCL
    // The layers every data path built (loaded with their inputs): the GPU runs them.
    std::vector<ProgramLayerRef> refs;
    for (auto& lp : layers_)
      if (lp->buf.allocated()) refs.push_back({lp->block, &lp->lay, &lp->buf});
    if (sharded_)
      for (const ProgramLayerRef& r : sharded_->program_layers()) refs.push_back(r);
    if (parm_)
      for (const ProgramLayerRef& r : parm_->program_layers()) refs.push_back(r);
    DeviceStep step = device_->run(plan, refs, collective_algo_,
                                   [this] { session_.barrier("start of the step"); });
    mine = std::move(step.times);
#endif
    return mine;
  }
  session_.barrier("start of the step");
  const auto t0 = Clock::now();
  for (const Op& op : plan.ops()) {
    if (!op.ranks.contains(me)) continue;
    const double start = std::chrono::duration<double>(Clock::now() - t0).count();
    run_op(plan, op);
    const double end = std::chrono::duration<double>(Clock::now() - t0).count();
    mine.push_back(start);
    mine.push_back(end);
  }
  return mine;
}

// Outputs, drops and gradients from the data paths' buffers (the GPU path downloaded its
// results there).
void Executor::collect_layer_results() {
  outputs_.clear();
  dropped_.clear();
  for (int li = 0; parm_ && li < parm_->num_layers(); ++li) {
    outputs_.push_back(parm_->output(li));
    dropped_.push_back(parm_->dropped(li));
  }
  for (auto& lp : layers_) {
    if (!lp->buf.allocated()) {  // another stage's layer
      outputs_.emplace_back();
      dropped_.push_back(0);
      continue;
    }
    outputs_.push_back(lp->buf.f({LayerBuf::kY}));
    long long d = 0;  // plan-routed layers: the entries the plan left without a slot
    for (auto sl : lp->buf.i({LayerBuf::kSlot})) d += sl < 0 ? 1 : 0;
    dropped_.push_back(d);
  }
  if (sharded_) {
    outputs_ = sharded_->outputs();
    dropped_ = sharded_->dropped();
  }
  for (const auto& lp : layers_) checked_.emplace_back(lp->moe, lp->capacity);
  gradients_.clear();
  real_backward_ = false;
  for (const auto& lp : layers_) {
    gradients_.emplace_back();
    if (!lp->buf.allocated() || !lp->lay.backward) continue;
    real_backward_ = true;
    const LayerGradients lg = lp->gradients();
    auto& g = gradients_.back();
    for (const std::vector<float>* v : {lg.dx, lg.dgate_w, lg.dw})
      g.insert(g.end(), v->begin(), v->end());
  }
  for (int li = 0; sharded_ && li < static_cast<int>(sharded_->layers().size()); ++li)
    if (sharded_->gradients(li)) real_backward_ = true;
  for (int li = 0; parm_ && li < parm_->num_layers(); ++li) {
    gradients_.emplace_back();
    const std::optional<LayerGradients> lg = parm_->gradients(li, /*units=*/false);
    if (!lg) continue;
    real_backward_ = true;
    auto& g = gradients_.back();
    for (const std::vector<float>* v : {lg->dx, lg->dgate_w, lg->dw})
      g.insert(g.end(), v->begin(), v->end());
  }
  real_data_ = !layers_.empty() || parm_ != nullptr || (sharded_ && sharded_->active());
}

// The RunResult of every rank's (start, end) times, in rank then op order, with one record per
// collective (its algorithm as run and its mean bytes per rank).
RunResult Executor::gather_result(const Plan& plan, const std::vector<double>& all) const {
  RunResult result;
  init_run_result(plan, result);
  result.backend = std::string(comm_.name());
  result.gpus_per_node = sc_.cluster.gpus_per_node;
  std::size_t cursor = 0;
  for (int r = 0; r < comm_.size(); ++r)
    for (const Op& op : plan.ops()) {
      const int p = op.ranks.index_of(r);
      if (p < 0) continue;
      MOESIM_ASSERT(cursor + 1 < all.size() + 1, "timing gather too short");
      result.start_s[result.entry(op.id, p)] = all[cursor++];
      result.end_s[result.entry(op.id, p)] = all[cursor++];
    }
  MOESIM_ASSERT(cursor == all.size(), "timing gather size mismatch");
  for (const Op& op : plan.ops()) {
    if (op.kind != OpKind::kCollective) continue;
    const CollectiveSpec& c = op.collective();
    const Grouping& g = plan.grouping(c.grouping);
    CollectiveRecord rec;
    rec.op = op.id;
    rec.label = op.label;
    rec.type = c.type;
    rec.algo = collective_algo_[op.id] >= 0 ? static_cast<CollectiveAlgo>(collective_algo_[op.id])
                                            : c.algo;
    if (collective_algo_[op.id] == kLibraryAlgo) {
      rec.algo = CollectiveAlgo::kAuto;
      rec.library_algo = true;
    }
    rec.num_groups = static_cast<int>(g.groups.size());
    rec.start_s = result.op_first_start(op.id);
    rec.end_s = result.op_last_end(op.id);
    if (c.type == CollectiveType::kAllToAllv) {
      double total = 0;
      for (size_t gi = 0; gi < g.groups.size(); ++gi) {
        const ByteMatrix* m = c.per_group.empty() ? c.matrix.get() : c.per_group[gi].get();
        if (m) total += m->total().value();
      }
      const double ranks = static_cast<double>(g.groups.size()) * g.group_size();
      rec.size_bytes = ranks > 0 ? total / ranks : 0;
    } else {
      rec.size_bytes = c.bytes.value();
    }
    result.collectives.push_back(rec);
  }
  summarize_run(plan, result);
  return result;
}

void Executor::run_op(const Plan& plan, const Op& op) {
  if (sharded_ && sharded_->run_op(plan, op, collective_algo_)) return;
  if (parm_ && parm_->run_op(plan, op, collective_algo_[op.id])) return;
  if (!layers_.empty() && is_backward_step(op)) {
    // The backward program on the layer's gradient buffers, where the layer has them.
    const int moe = sc_.model.moe_layer_of_block(op.role.block);
    Layer* L = moe >= 0 && moe < static_cast<int>(layers_.size()) ? layers_[moe].get() : nullptr;
    if (L && L->block == op.role.block && L->buf.allocated() && L->lay.backward) {
      HostLayerOps ops(comm_, cost_, topo_, plan, shape_, L->buf);
      const std::int64_t algo =
          run_backward_step(L->lay, shape_, op.role.kind, op.role.chunk, op, ops);
      if (algo >= 0) collective_algo_[op.id] = algo;
      return;
    }
  }
  MoeOpRef ref = !layers_.empty() ? moe_op_ref(op) : MoeOpRef{};
  Layer* L = nullptr;
  if (ref.kind != OpRoleKind::kNone) {
    const int moe = sc_.model.moe_layer_of_block(ref.block);
    MOESIM_ASSERT(moe >= 0 && moe < static_cast<int>(layers_.size()), "MoE layer out of range");
    L = layers_[moe].get();
  }
  if (L) {
    // The layer program (exec/layer_program.hpp) on this rank's host buffers.
    MOESIM_ASSERT(L->buf.allocated(), "MoE op of a layer this rank does not run");
    HostLayerOps ops(comm_, cost_, topo_, plan, shape_, L->buf);
    const std::int64_t algo = run_forward_step(L->lay, shape_, ref.kind, ref.chunk, op, ops);
    if (algo >= 0) collective_algo_[op.id] = algo;
    return;
  }
  if (op.kind == OpKind::kCollective) run_collective(plan, op);
  // Other compute and copy ops: empty on the host path (see executor.hpp).
}

// A collective outside the MoE data path: scratch buffers of the plan's sizes, real bytes moved.
void Executor::run_collective(const Plan& plan, const Op& op) {
  const CollectiveSpec& spec = op.collective();
  const Grouping& g = plan.grouping(spec.grouping);
  const int me = comm_.rank();
  for (size_t gi = 0; gi < g.groups.size(); ++gi) {
    const std::vector<int>& group = g.groups[gi];
    auto it = std::find(group.begin(), group.end(), me);
    if (it == group.end()) continue;
    const int pos = static_cast<int>(it - group.begin());
    const std::size_t W = group.size();
    CollectiveSpec s = spec;
    collectives::CollectiveCall call{&s, &group, static_cast<int>(gi), true};
    const std::size_t bytes = static_cast<std::size_t>(std::ceil(spec.bytes.value()));
    switch (spec.type) {
      case CollectiveType::kAllToAll:
      case CollectiveType::kSendRecv:
      case CollectiveType::kAllToAllv: {
        const ExchangeSizes sz = exchange_sizes(spec, call.matrix(), W, pos);
        const std::size_t send_bytes = sz.send, recv_bytes = sz.recv;
        if (spec.type != CollectiveType::kAllToAllv) s.bytes = Bytes(static_cast<double>(sz.send));
        const auto& algo = collectives::select_algorithm(call, cost_);
        collective_algo_[op.id] = static_cast<std::int64_t>(algo.algo());
        const bool is_saa = algo.algo() == CollectiveAlgo::kSaa;
        const SaaLayout saa(s, static_cast<int>(W), static_cast<double>(send_bytes));
        const auto phases = algo.lower(call, topo_);
        // A 2DH all_to_allv stages forwarded blocks in the receive buffer (phase_runner.hpp).
        // deepep's intra phase sends from the forwarder's rows, which can outnumber its own.
        std::vector<std::byte> send(
            std::max(send_bytes, phase_buffer_extent(phases, me, collectives::Buffer::kSend)),
            std::byte{1}),
            recv(std::max(recv_bytes, phase_buffer_extent(phases, me, collectives::Buffer::kRecv)));
        run_phases(comm_, phases, send.data(), send.size(), recv.data(), recv.size(), op.id % 32000,
                   is_saa ? &saa : nullptr);
        break;
      }
      case CollectiveType::kAllReduce: {
        collective_algo_[op.id] =
            static_cast<std::int64_t>(collectives::select_algorithm(call, cost_).algo());
        std::vector<float> buf((bytes + 3) / 4, 1.0f);
        comm_.all_reduce_sum(buf.data(), buf.size(), group);
        break;
      }
      case CollectiveType::kAllGather: {
        collective_algo_[op.id] =
            static_cast<std::int64_t>(collectives::select_algorithm(call, cost_).algo());
        const std::size_t block = (bytes + W - 1) / W;
        std::vector<std::byte> in(block, std::byte{1}), out(block * W);
        comm_.all_gather(in.data(), block, out.data(), group);
        break;
      }
      case CollectiveType::kReduceScatter: {
        collective_algo_[op.id] =
            static_cast<std::int64_t>(collectives::select_algorithm(call, cost_).algo());
        const std::size_t count = ((bytes + 3) / 4 + W - 1) / W;
        std::vector<float> in(count * W, 1.0f), out(count);
        comm_.reduce_scatter_sum(in.data(), out.data(), count, group);
        break;
      }
    }
  }
}

// Every rank checks its own tokens' outputs against the reference (computed from the seeds, so
// nothing is gathered): the check's cost is spread over the ranks instead of one rank computing
// all P references while the others wait on it (and time out at real sizes).
void Executor::check_layers() {
  const std::uint64_t seed = sc_.workload.routing.seed;
  const std::size_t per_rank = static_cast<std::size_t>(shape_.tokens) * shape_.model_dim;
  // Layers: the Parm path's, else (moe, capacity) of the plain or sharded path's (checked_).
  const std::size_t num_layers = parm_ ? parm_->num_layers() : checked_.size();
  for (size_t li = 0; li < num_layers; ++li) {
    const int moe = parm_ ? parm_->layer_number(static_cast<int>(li)) : checked_[li].first;
    const std::vector<float>& got = outputs_.at(li);
    LayerCheck chk;
    chk.iteration = iteration_;
    chk.layer = moe;
    chk.dropped = session_.all_reduce_sum(dropped_.at(li));
    long long wrong = 0, drops = 0;
    double max_err = 0;
    // Plain and plan-routed layers are layers_[li] (checked_ lists them in order); the sharded
    // path keeps its own layers and the Parm path its own reference.
    const Layer* L = !parm_ && li < layers_.size() ? layers_[li].get() : nullptr;
    // Another pipeline stage's layer: this rank has no output to check, but takes part in the
    // check's collectives below (every rank calls them for every layer, in order).
    bool here = !L || L->on_rank;
    if (parm_)
      here = parm_->on_rank(static_cast<int>(li));
    else if (sharded_ && li < sharded_->layers().size())
      here = sharded_->layers()[li].on_rank;
    if (here) {
      const std::vector<float> tokens =
          make_tokens(shape_, seed, iteration_, moe, token_key_rank(sc_.parallelism, comm_.rank()));
      // The gate's own logits, where this rank has them (the host gate's, or the GPU's downloaded):
      // the reference decides on them and checks them (GateLogits).
      const std::size_t num_logits = static_cast<std::size_t>(shape_.tokens) * shape_.experts;
      GateLogits kernel;
      const HostLayerBuffers* gated = L && !L->rpath && L->buf.allocated() ? &L->buf : nullptr;
      if (!parm_ && sharded_)  // its gate sees this rank's S tokens too
        gated = sharded_->buffers(static_cast<int>(li));
      if (gated && gated->f({LayerBuf::kLogits}).size() == num_logits)
        kernel = {gated->f({LayerBuf::kLogits}).data(), tolerance_};
      long long logits_wrong = 0;
      const auto ref =
          parm_ ? parm_->reference(static_cast<int>(li), &drops, tolerance_, &logits_wrong)
          : L && L->rpath ? reference_layer_routed(shape_, tokens, seed, moe, *L->rpath->routing,
                                                   L->rpath->pos, &drops)
                          : reference_layer_seeded(shape_, tokens, seed, moe, checked_[li].second,
                                                   &drops, kernel, &logits_wrong);
      wrong += logits_wrong;
      for (std::size_t i = 0; i < per_rank; ++i) {
        const double err = std::fabs((got.size() == per_rank ? got[i] : NAN) - ref[i]);
        if (!(err <= tolerance_ * (1.0 + std::fabs(ref[i])))) ++wrong;
        if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
      }
    }
    chk.compared = session_.all_reduce_sum(here ? static_cast<long long>(per_rank) : 0LL);
    chk.wrong = session_.all_reduce_sum(wrong);
    chk.expected_dropped = session_.all_reduce_sum(drops);
    chk.max_abs_error = session_.all_reduce_max(max_err);
    checks_.push_back(chk);
    // The layer's gradients, when the program ran its backward (the same on every rank of the
    // layer's stage: they run every op of the layer; the others join idle).
    std::optional<LayerGradients> grads;
    if (L && L->buf.allocated() && L->lay.backward)
      grads = L->gradients();
    else if (parm_)
      grads = parm_->gradients(static_cast<int>(li));
    else if (sharded_)
      grads = sharded_->gradients(static_cast<int>(li));
    if (session_.all_reduce_sum(grads ? 1LL : 0LL) > 0)
      grad_checks_.push_back(
          grads ? check_backward_layer(comm_, session_, *grads, shape_, seed, iteration_,
                                       token_key_rank(sc_.parallelism, comm_.rank()), tolerance_)
                : idle_backward_check(session_, iteration_, moe));
  }
}

}  // namespace moesim::exec
