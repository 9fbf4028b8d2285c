#include "exec/backward_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"
#include "exec/executor.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

namespace kc = kernels::cpu;
constexpr auto kF32 = kernels::DType::kF32;

std::vector<float> transpose(const std::vector<float>& a, int rows, int cols) {
  std::vector<float> t(a.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      t[static_cast<size_t>(c) * rows + r] = a[static_cast<size_t>(r) * cols + c];
  return t;
}

kernels::Routing routing_of(const ForwardView& f, const MoeShape& s) {
  kernels::Routing r;
  r.num_tokens = s.tokens;
  r.top_k = s.top_k;
  r.num_experts = s.experts;
  r.capacity = f.plan->capacity;
  r.expert = f.expert->data();
  r.slot = f.slot->data();
  r.weight = f.weight->data();
  r.slot_entry = f.slot_entry->data();
  return r;
}

// Slots [offset_j, offset_j + c_j) of every expert of a token-side (E, C, M) buffer as the
// chunk's (E, c, M) all-to-all buffer (expert e lives on EP position e / dE, so destination d's
// block is contiguous), and back.
std::vector<float> pack_chunk(const std::vector<float>& full, const MoeLayerPlan& lp, int j, int E,
                              int M) {
  const int c = lp.caps[j];
  std::vector<float> packed(static_cast<size_t>(E) * c * M);
  for (int e = 0; e < E; ++e)
    std::memcpy(&packed[static_cast<size_t>(e) * c * M],
                &full[(static_cast<size_t>(e) * lp.capacity + lp.offset[j]) * M],
                sizeof(float) * c * M);
  return packed;
}
void unpack_chunk(const float* src, const MoeLayerPlan& lp, int j, int E, int M,
                  std::vector<float>& full) {
  const int c = lp.caps[j];
  for (int e = 0; e < E; ++e)
    std::memcpy(&full[(static_cast<size_t>(e) * lp.capacity + lp.offset[j]) * M],
                src + static_cast<size_t>(e) * c * M, sizeof(float) * c * M);
}

// The padded all_to_all of a backward chunk through the shared lowering, exactly as the
// forward's dispatch / combine (the plan's spec, with the real buffer's size).
std::int64_t exchange(Communicator& comm, const collectives::CostContext& cost, const Plan& plan,
                      const Op& op, const std::vector<float>& send, std::vector<float>& recv) {
  recv.assign(send.size(), 0.0f);
  CollectiveSpec spec = op.collective();
  MOESIM_ASSERT(spec.type == CollectiveType::kAllToAll, "backward MoE exchange is an all_to_all");
  spec.bytes = Bytes(static_cast<double>(send.size() * sizeof(float)));
  const Grouping& g = plan.grouping(spec.grouping);
  std::int64_t algo_id = -1;
  for (size_t gi = 0; gi < g.groups.size(); ++gi) {
    if (std::find(g.groups[gi].begin(), g.groups[gi].end(), comm.rank()) == g.groups[gi].end())
      continue;
    collectives::CollectiveCall call{&spec, &g.groups[gi], static_cast<int>(gi), true};
    const collectives::CostContext& cctx = cost;
    const topology::Topology& topo = *cost.topo;
    const auto& algo = collectives::select_algorithm(call, cctx);
    algo_id = static_cast<std::int64_t>(algo.algo());
    run_phases(comm, algo.lower(call, topo), reinterpret_cast<const std::byte*>(send.data()),
               send.size() * 4, reinterpret_cast<std::byte*>(recv.data()), recv.size() * 4,
               op.id % 32000);
  }
  return algo_id;
}

const std::vector<int>* my_group(const Plan& plan, const Op& op, int rank) {
  const Grouping& g = plan.grouping(op.collective().grouping);
  for (const auto& members : g.groups)
    if (std::find(members.begin(), members.end(), rank) != members.end()) return &members;
  return nullptr;
}

}  // namespace

MoeBwdRef moe_bwd_ref(const Op& plan_op) {
  MoeBwdRef ref;
  if (plan_op.role.kind == OpRoleKind::kExpertGradSync) {
    ref.kind = OpRoleKind::kExpertGradSync;
    ref.block = plan_op.role.block;
    ref.micro = plan_op.role.chunk;
    return ref;
  }
  const MoeOpRef op = moe_bwd_op_ref(plan_op);
  switch (op.kind) {
    case OpRoleKind::kGate:
    case OpRoleKind::kEncode:
    case OpRoleKind::kDecode:
    case OpRoleKind::kDispatch:
    case OpRoleKind::kFc1:
    case OpRoleKind::kFc2:
    case OpRoleKind::kCombine:
      ref.kind = op.kind;
      ref.block = op.block;
      ref.chunk = op.chunk;
      break;
    default:  // kNone, and kParamGather / kPartialSum: not backward ops of the plain data path
      break;
  }
  return ref;
}

void begin_backward_layer(const Plan& plan, const MoeLayerPlan& lp, int rank, const MoeShape& s,
                          const ForwardView& fwd, BackwardLayer& bl) {
  const int M = s.model_dim, H = s.hidden_dim, dE = lp.local_experts;
  bl = BackwardLayer{};
  bl.ep_group = {rank};
  for (const Op& op : plan.ops()) {
    if (op.kind != OpKind::kCollective || op.role.block != lp.block) continue;
    if (op.role.kind == OpRoleKind::kDispatch && !op.role.backward && op.role.chunk == 0) {
      if (const auto* g = my_group(plan, op, rank)) bl.ep_group = *g;
    } else if (op.role.kind == OpRoleKind::kExpertGradSync) {
      ++bl.dp_parts;
      if (const auto* g = my_group(plan, op, rank)) bl.dp_group = *g;
    }
  }
  bl.dw1.assign(dE, std::vector<float>(static_cast<size_t>(M) * H, 0.0f));
  bl.dw2.assign(dE, std::vector<float>(static_cast<size_t>(H) * M, 0.0f));
  bl.dgate_w.assign(static_cast<size_t>(M) * s.experts, 0.0f);
  for (int le = 0; le < dE; ++le) {
    bl.w1t.push_back(transpose((*fwd.w1)[le], M, H));  // H x M
    bl.w2t.push_back(transpose((*fwd.w2)[le], H, M));  // M x H
  }
  const size_t chunks = lp.caps.size();
  bl.chunk_dout.resize(chunks);
  bl.chunk_dhidden.resize(chunks);
  bl.chunk_din.resize(chunks);
  bl.grad_dispatched.assign(static_cast<size_t>(s.experts) * lp.capacity * M, 0.0f);
}

namespace {

// Chunk j's fc2 backward: dHidden = dOut W2^T through the ReLU, and dW2 += hidden^T dOut.
void backward_fc2(const ForwardView& fwd, BackwardLayer& bl, const MoeShape& s, int j) {
  const MoeLayerPlan& lp = *fwd.plan;
  const int M = s.model_dim, H = s.hidden_dim, E = s.experts;
  const int W = lp.ep, dE = lp.local_experts;
  kc::Context ctx;
  MOESIM_ASSERT(bl.decoded, "backward fc2 before the backward decode");
  const int c = lp.caps[j];
  if (!lp.has_a2a) bl.chunk_dout[j] = pack_chunk(bl.grad_expert_out, lp, j, E, M);  // W = 1
  const auto& dout = bl.chunk_dout[j];
  const auto& hidden = (*fwd.hidden)[j];
  auto& dh = bl.chunk_dhidden[j];
  dh.assign(static_cast<size_t>(W) * dE * c * H, 0.0f);
  for (int w = 0; w < W; ++w)
    for (int le = 0; le < dE; ++le) {
      const size_t blk = static_cast<size_t>(w) * dE + le;
      const float* h = &hidden[blk * c * H];
      const float* d = &dout[blk * c * M];
      float* g = &dh[blk * c * H];
      // dHidden = dOut W2^T, then the ReLU's backward (hidden is post-ReLU: > 0 iff active).
      kc::gemm(ctx, kF32, c, H, M, d, bl.w2t[le].data(), g);
      for (size_t i = 0; i < static_cast<size_t>(c) * H; ++i) g[i] = h[i] > 0 ? g[i] : 0.0f;
      // dW2 (H x M) += hidden^T (H x c) dOut (c x M); empty slots are zero rows of both.
      const std::vector<float> ht =
          transpose(std::vector<float>(h, h + static_cast<size_t>(c) * H), c, H);
      kc::gemm(ctx, kF32, H, M, c, ht.data(), d, bl.dw2[le].data(), 1.0f, 1.0f);
    }
  std::vector<float>().swap(bl.chunk_dout[j]);  // done with it: keep the peak memory down
}

// Chunk j's fc1 backward: dIn = dHidden W1^T and dW1 += in^T dHidden (W = 1: straight into the
// dispatched gradient, the experts being local).
void backward_fc1(const ForwardView& fwd, BackwardLayer& bl, const MoeShape& s, int j) {
  const MoeLayerPlan& lp = *fwd.plan;
  const int M = s.model_dim, H = s.hidden_dim, E = s.experts;
  const int W = lp.ep, dE = lp.local_experts;
  kc::Context ctx;
  const int c = lp.caps[j];
  const auto& dh = bl.chunk_dhidden[j];
  MOESIM_ASSERT(dh.size() == static_cast<size_t>(W) * dE * c * H, "fc1 backward before fc2");
  const auto& in = (*fwd.chunk_in)[j];
  auto& din = bl.chunk_din[j];
  din.assign(static_cast<size_t>(W) * dE * c * M, 0.0f);
  for (int w = 0; w < W; ++w)
    for (int le = 0; le < dE; ++le) {
      const size_t blk = static_cast<size_t>(w) * dE + le;
      const float* x = &in[blk * c * M];
      const float* g = &dh[blk * c * H];
      kc::gemm(ctx, kF32, c, M, H, g, bl.w1t[le].data(), &din[blk * c * M]);  // dIn
      const std::vector<float> xt =
          transpose(std::vector<float>(x, x + static_cast<size_t>(c) * M), c, M);
      kc::gemm(ctx, kF32, M, H, c, xt.data(), g, bl.dw1[le].data(), 1.0f, 1.0f);  // dW1
    }
  std::vector<float>().swap(bl.chunk_dhidden[j]);
  if (!lp.has_a2a) {  // W = 1: the experts are local
    unpack_chunk(din.data(), lp, j, E, M, bl.grad_dispatched);
    std::vector<float>().swap(din);
  }
  ++bl.fc1_done;
}

// The gate's backward, after the encode's: dWgate and the gate's share of dX.
void backward_gate(const ForwardView& fwd, BackwardLayer& bl, const MoeShape& s) {
  const int S = s.tokens, M = s.model_dim, E = s.experts, k = s.top_k;
  kc::Context ctx;
  // Softmax backward of the kept choices' dWeight (the gate's weights are the softmax
  // probabilities over all E experts, not renormalised over the top k): g (E) = dWeight at
  // the chosen experts, dLogits = p (g - <p, g>); dWgate = x^T dLogits, dX += dLogits Wg^T.
  MOESIM_ASSERT(bl.encoded, "backward gate before the backward encode");
  const auto& logits = *fwd.logits;
  std::vector<float> dl(static_cast<size_t>(S) * E, 0.0f);
  std::vector<double> p(E), g(E);
  for (int t = 0; t < S; ++t) {
    const float* lg = &logits[static_cast<size_t>(t) * E];
    const double mx = *std::max_element(lg, lg + E);
    double sum = 0;
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(static_cast<double>(lg[e]) - mx));
    std::fill(g.begin(), g.end(), 0.0);
    for (int c = 0; c < k; ++c) {
      const size_t entry = static_cast<size_t>(t) * k + c;
      if ((*fwd.slot)[entry] >= 0) g[(*fwd.expert)[entry]] += bl.grad_weight[entry];
    }
    double pg = 0;
    for (int e = 0; e < E; ++e) pg += (p[e] /= sum) * g[e];
    for (int e = 0; e < E; ++e)
      dl[static_cast<size_t>(t) * E + e] = static_cast<float>(p[e] * (g[e] - pg));
  }
  const std::vector<float> xt = transpose(*fwd.x, S, M);  // dWgate += x^T dLogits
  kc::gemm(ctx, kF32, M, E, S, xt.data(), dl.data(), bl.dgate_w.data(), 1.0f, 1.0f);
  const std::vector<float> wgt = transpose(*fwd.gate_w, M, E);
  kc::gemm(ctx, kF32, S, M, E, dl.data(), wgt.data(), bl.dx.data(), 1.0f, 1.0f);
  bl.gated = true;
}

// One (micro-)op of the expert gradients' DP all-reduce, on the real dW1 / dW2.
std::int64_t expert_grad_sync(Communicator& comm, const collectives::CostContext& cost,
                              const Plan& plan, const Op& op, const MoeBwdRef& ref,
                              const MoeLayerPlan& lp, BackwardLayer& bl, const MoeShape& s) {
  const int M = s.model_dim, H = s.hidden_dim, dE = lp.local_experts;
  // The real dW1 / dW2 of the local experts, flattened [dW1 of le 0.. | dW2 of le 0..];
  // Lina's micro-op i of n sums part i of it.
  MOESIM_ASSERT(bl.fc1_done == static_cast<int>(lp.caps.size()),
                "expert gradient all-reduce before the expert backward");
  const std::vector<int>* group = my_group(plan, op, comm.rank());
  if (!group) return -1;
  const size_t per = static_cast<size_t>(M) * H, total = 2 * per * dE;
  const int parts = std::max(1, bl.dp_parts), part = std::max(0, ref.micro);
  MOESIM_ASSERT(part < parts, "expert all-reduce micro-op out of range");
  const size_t lo = total * part / parts, hi = total * (part + 1) / parts;
  std::vector<float> flat(hi - lo);
  auto at = [&](size_t i) -> float& {
    const size_t mat = i / per, off = i % per;
    return mat < static_cast<size_t>(dE) ? bl.dw1[mat][off] : bl.dw2[mat - dE][off];
  };
  for (size_t i = lo; i < hi; ++i) flat[i - lo] = at(i);
  comm.all_reduce_sum(flat.data(), flat.size(), *group);
  for (size_t i = lo; i < hi; ++i) at(i) = flat[i - lo];
  ++bl.dp_parts_done;
  collectives::CollectiveCall call{&op.collective(), group, 0, true};
  const collectives::CostContext& cctx = cost;
  return static_cast<std::int64_t>(collectives::select_algorithm(call, cctx).algo());
}

}  // namespace

std::int64_t run_backward_op(Communicator& comm, const collectives::CostContext& cost,
                             const Plan& plan, const Op& op, const MoeBwdRef& ref,
                             const ForwardView& fwd, BackwardLayer& bl, const MoeShape& s,
                             std::uint64_t seed, int iteration, int key_rank) {
  const MoeLayerPlan& lp = *fwd.plan;
  const int S = s.tokens, M = s.model_dim, E = s.experts, k = s.top_k;
  const int W = lp.ep, dE = lp.local_experts;
  kc::Context ctx;
  switch (ref.kind) {
    case OpRoleKind::kDecode:
      // A layer's backward starts here, once per micro-batch: the pass state starts over, the
      // parameter gradients keep accumulating.
      ++bl.passes;
      bl.decoded = bl.encoded = bl.gated = false;
      bl.fc1_done = 0;
      bl.dy = make_grad_output(s, seed, iteration, lp.moe, key_rank);
      bl.grad_expert_out.assign(static_cast<size_t>(E) * lp.capacity * M, 0.0f);
      bl.grad_weight.assign(static_cast<size_t>(S) * k, 0.0f);
      kc::decode_backward(ctx, kF32, routing_of(fwd, s), M, fwd.expert_out->data(), bl.dy.data(),
                          bl.grad_expert_out.data(), bl.grad_weight.data());
      bl.decoded = true;
      return -1;
    case OpRoleKind::kCombine: {
      // The combine's backward: the token owners send each expert its slots' dOut (the forward
      // dispatch's direction), received as (W, dE, c, M) on the expert side.
      MOESIM_ASSERT(bl.decoded, "backward combine before the backward decode");
      const int j = ref.chunk;
      return exchange(comm, cost, plan, op, pack_chunk(bl.grad_expert_out, lp, j, E, M),
                      bl.chunk_dout[j]);
    }
    case OpRoleKind::kFc2:
      backward_fc2(fwd, bl, s, ref.chunk);
      return -1;
    case OpRoleKind::kFc1:
      backward_fc1(fwd, bl, s, ref.chunk);
      return -1;
    case OpRoleKind::kDispatch: {
      // The dispatch's backward: each expert's dIn back to the token owners (the forward
      // combine's direction), received as (E, c, M) = source position s's dE experts.
      const int j = ref.chunk;
      MOESIM_ASSERT(bl.chunk_din[j].size() == static_cast<size_t>(W) * dE * lp.caps[j] * M,
                    "backward dispatch before the fc1 backward");
      std::vector<float> back;
      const std::int64_t algo = exchange(comm, cost, plan, op, bl.chunk_din[j], back);
      unpack_chunk(back.data(), lp, j, E, M, bl.grad_dispatched);
      std::vector<float>().swap(bl.chunk_din[j]);
      return algo;
    }
    case OpRoleKind::kEncode:
      bl.dx.assign(static_cast<size_t>(S) * M, 0.0f);
      kc::encode_backward(ctx, kF32, routing_of(fwd, s), M, bl.grad_dispatched.data(),
                          bl.dx.data());
      bl.encoded = true;
      return -1;
    case OpRoleKind::kGate:
      backward_gate(fwd, bl, s);
      return -1;
    case OpRoleKind::kExpertGradSync:
      return expert_grad_sync(comm, cost, plan, op, ref, lp, bl, s);
    default:  // kNone: moe_bwd_ref gives no other kind
      break;
  }
  return -1;
}

GradCheck check_backward_layer(Communicator& comm, const MpiSession& session,
                               const MoeLayerPlan& lp, const BackwardLayer& bl, const MoeShape& s,
                               std::uint64_t seed, int iteration, int key_rank, double tol) {
  const int M = s.model_dim, H = s.hidden_dim, dE = lp.local_experts;
  const double passes = std::max(1, bl.passes);
  GradCheck chk;
  chk.iteration = iteration;
  chk.layer = lp.moe;
  long long compared = 0, wrong = 0;
  double max_err = 0;
  auto compare = [&](const float* got, std::size_t got_n, const double* ref, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double err = std::fabs((got_n == n ? got[i] : NAN) - ref[i]);
      if (!(err <= tol * (1.0 + std::fabs(ref[i])))) ++wrong;
      if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
    }
    compared += static_cast<long long>(n);
  };
  const std::vector<float> tokens = make_tokens(s, seed, iteration, lp.moe, key_rank);
  const std::vector<float> dy = make_grad_output(s, seed, iteration, lp.moe, key_rank);
  // The DP all-reduce is part of the expected total only once every part of it ran.
  const bool dp_summed = !bl.dp_group.empty() && bl.dp_parts_done == bl.dp_parts;
  std::vector<float> sum(2 * static_cast<size_t>(M) * H);
  const int owner_pos_first = lp.ep_pos * dE;
  const ReferenceGrads ref = reference_backward_seeded(
      s, tokens, seed, lp.moe, lp.capacity, dy,
      [&](int e, const std::vector<double>& dw1, const std::vector<double>& dw2) {
        // Every rank's contribution to expert e, summed over its EP group (x the DP replicas):
        // the expected gradient on e's owner(s). One all-reduce per expert, so only one
        // expert's M x H x 2 values live at a time.
        const size_t per = static_cast<size_t>(M) * H;
        for (size_t i = 0; i < per; ++i) {
          sum[i] = static_cast<float>(dw1[i]);
          sum[per + i] = static_cast<float>(dw2[i]);
        }
        comm.all_reduce_sum(sum.data(), sum.size(), bl.ep_group);
        if (dp_summed) comm.all_reduce_sum(sum.data(), sum.size(), bl.dp_group);
        const int le = e - owner_pos_first;
        if (le < 0 || le >= dE) return;
        // Every micro-batch of the step runs the same tokens: the accumulated gradient is
        // passes x one pass's.
        std::vector<double> r1(sum.begin(), sum.begin() + static_cast<std::ptrdiff_t>(per)),
            r2(sum.begin() + static_cast<std::ptrdiff_t>(per), sum.end());
        for (double& v : r1) v *= passes;
        for (double& v : r2) v *= passes;
        compare(bl.dw1[le].data(), bl.dw1[le].size(), r1.data(), per);
        compare(bl.dw2[le].data(), bl.dw2[le].size(), r2.data(), per);
      });
  compare(bl.dx.data(), bl.dx.size(), ref.dx.data(), ref.dx.size());
  std::vector<double> dgate(ref.dgate_w.begin(), ref.dgate_w.end());
  for (double& v : dgate) v *= passes;
  compare(bl.dgate_w.data(), bl.dgate_w.size(), dgate.data(), dgate.size());
  chk.compared = session.all_reduce_sum(compared);
  chk.wrong = session.all_reduce_sum(wrong);
  chk.max_abs_error = session.all_reduce_max(max_err);
  return chk;
}

GradCheck idle_backward_check(const MpiSession& session, int iteration, int layer) {
  GradCheck chk;
  chk.iteration = iteration;
  chk.layer = layer;
  chk.compared = session.all_reduce_sum(0LL);  // check_backward_layer's three, in its order
  chk.wrong = session.all_reduce_sum(0LL);
  chk.max_abs_error = session.all_reduce_max(0.0);
  return chk;
}

}  // namespace moesim::exec
