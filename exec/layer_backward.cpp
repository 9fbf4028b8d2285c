// The backward half of the MoE layer program (exec/layer_program.hpp): each backward step is the
// transpose of the forward step of the same role, on the gradient buffers beside the forward's.
#include <fmt/format.h>

#include "core/error.hpp"
#include "exec/layer_program.hpp"

namespace moesim::exec {

namespace {

std::size_t sz(long long v) { return static_cast<std::size_t>(v); }
BufId buf(LayerBuf b, int index = 0) { return BufId{b, index}; }

// One weight's rows of a chunk: `rows` rows from `first`, `batch` times `stride` rows apart
// (capacity routing: slice le's block of every source position; plan routing: one run).
struct ExpertBlock {
  int slice = 0, first = 0, rows = 0, batch = 1, stride = 0;
};

std::vector<ExpertBlock> expert_blocks(const LayerLayout& L, int j) {
  std::vector<ExpertBlock> out;
  if (L.routing != LayerRouting::kCapacity) {
    int row = 0;
    for (const auto& [rows, slice] : L.runs[sz(j)]) {
      if (rows > 0) out.push_back({slice, row, rows, 1, 0});
      row += rows;
    }
    return out;
  }
  const int rows = L.block_rows(j);
  if (rows == 0) return out;
  for (int le = 0; le < L.slices; ++le) out.push_back({le, le * rows, rows, L.ep, L.slices * rows});
  return out;
}

// Chunk j's backward GEMMs of fc2 (fc2) or fc1. With the forward C = A W (A rows x a_w, W
// a_w x c_w): the weight's gradient dW += A^T dC, one GEMM per batch entry since they all
// accumulate into the one dW; the input's gradient dA = dC W^T, batched like the forward.
void expert_backward(const LayerLayout& L, const MoeShape& s, int j, bool fc2, LayerOps& ops) {
  const int M = s.model_dim, H = L.hidden;
  const int a_w = fc2 ? H : M, c_w = fc2 ? M : H;
  const BufId a = buf(fc2 ? LayerBuf::kHidden : LayerBuf::kIn, j);
  const BufId dc = buf(fc2 ? LayerBuf::kDOut : LayerBuf::kDHidden, j);
  const BufId da = buf(fc2 ? LayerBuf::kDHidden : LayerBuf::kDIn, j);
  for (const ExpertBlock& b : expert_blocks(L, j)) {
    for (int w = 0; w < b.batch; ++w) {
      const std::size_t row = sz(b.first) + sz(w) * sz(b.stride);
      GemmJob g;
      g.a = a;
      g.a_off = row * sz(a_w);
      g.trans_a = true;
      g.b = dc;
      g.b_off = row * sz(c_w);
      g.c = buf(LayerBuf::kDW);
      g.c_off = dw_offset(L, s, fc2, b.slice);
      g.m = a_w;
      g.n = c_w;
      g.k = b.rows;
      g.accumulate = true;
      ops.gemm(g, false);
    }
    GemmJob g;
    g.a = dc;
    g.a_off = sz(b.first) * sz(c_w);
    g.a_stride = static_cast<long long>(b.stride) * c_w;
    g.b = buf(fc2 ? LayerBuf::kW2 : LayerBuf::kW1, b.slice);
    g.trans_b = true;
    g.c = da;
    g.c_off = sz(b.first) * sz(a_w);
    g.c_stride = static_cast<long long>(b.stride) * a_w;
    g.m = b.rows;
    g.n = a_w;
    g.k = c_w;
    g.batch = b.batch;
    ops.gemm(g, false);
  }
}

// The gate's backward: the softmax's (kDLogits from kDWeight), then dWgate += x^T dLogits and
// dX += dLogits Wg^T in fp32 (the gate's own precision).
void gate_backward(const LayerLayout& L, const MoeShape& s, LayerOps& ops) {
  const int T = L.unit_tokens(s), M = s.model_dim, E = s.experts;
  const std::size_t Mz = sz(M);
  ops.widen(buf(LayerBuf::kDX), buf(LayerBuf::kDX32), sz(T) * Mz);
  ops.softmax_backward(
      buf(LayerBuf::kLogits),
      buf(L.routing == LayerRouting::kCapacity ? LayerBuf::kExpert : LayerBuf::kRoutedExpert),
      buf(LayerBuf::kDWeight), buf(LayerBuf::kDLogits), T, E, s.top_k);
  if (T == 0) return;
  GemmJob w;
  w.a = buf(LayerBuf::kX32);
  w.trans_a = true;
  w.b = buf(LayerBuf::kDLogits);
  w.c = buf(LayerBuf::kDGateW);
  w.m = M;
  w.n = E;
  w.k = T;
  w.accumulate = true;
  ops.gemm(w, /*f32=*/true);
  GemmJob x;
  x.a = buf(LayerBuf::kDLogits);
  x.b = buf(LayerBuf::kGateW);
  x.trans_b = true;
  x.c = buf(LayerBuf::kDX32);
  x.m = T;
  x.n = M;
  x.k = E;
  x.accumulate = true;
  ops.gemm(x, /*f32=*/true);
}

// Chunk j's output gradients packed as the forward dispatch sent its slots (kDBack[j]).
void pack_output_grads(const LayerLayout& L, const MoeShape& s, int j, LayerOps& ops) {
  for (const BlockCopy& c : slot_block_copies(L, j, s.model_dim, false, buf(LayerBuf::kDExpertOut),
                                              buf(LayerBuf::kDBack, j), true))
    ops.copy(c);
}

// The local combine's backward: every chunk's returned input gradients (each esp shard's partial
// and, SAA, every MP share's slots) summed into kDDispatched.
void gather_input_grads(const LayerLayout& L, const MoeShape& s, LayerOps& ops) {
  const std::size_t Mz = sz(s.model_dim);
  ops.zero(buf(LayerBuf::kDDispatched), sz(s.experts) * sz(L.rho) * sz(L.capacity) * Mz);
  for (int j = 0; j < L.chunks(); ++j)
    for (const BlockCopy& c :
         slot_block_copies(L, j, s.model_dim, true, buf(LayerBuf::kDDispatched),
                           buf(LayerBuf::kDSend, j), false, true))
      ops.copy(c);
}

// Chunk j's combine backward: the output gradients to the experts (the forward dispatch's
// direction). Capacity routing packs them by the send blocks first (unless the local dump packed
// every chunk): an expert's slots returned by several sources (Parm's esp partials, SAA's MP
// shares) take one gradient, sent where the forward dispatch sent the slots.
std::int64_t combine_backward(const LayerLayout& L, const MoeShape& s, int j, const Op& op,
                              LayerOps& ops) {
  const std::size_t Mz = sz(s.model_dim);
  Exchange x;
  x.recv = buf(LayerBuf::kDOut, j);
  x.recv_elems = sz(L.received_rows(j)) * Mz;
  if (L.routing != LayerRouting::kCapacity) {
    x.send = buf(LayerBuf::kDBack);
    x.send_off = sz(L.send_first[sz(j)]) * Mz;
    x.send_elems = sz(L.send_rows[sz(j)]) * Mz;
    x.row_elems = Mz;
    return ops.exchange(op, x);
  }
  if (!L.dump_op) pack_output_grads(L, s, j, ops);
  x.send = buf(LayerBuf::kDBack, j);
  x.send_elems = sz(L.send_block_rows(j)) * Mz;
  return ops.exchange(op, x);
}

// Chunk j's dispatch backward: the input gradients back to the tokens' ranks (the forward
// combine's direction, SAA's MP all-gather included), unpacked by the returned blocks into
// kDDispatched under capacity routing; where the forward's local combine summed the returns
// (accumulate_back), its backward sums them (gather_input_grads).
std::int64_t dispatch_backward(const LayerLayout& L, const MoeShape& s, int j, const Op& op,
                               LayerOps& ops) {
  const std::size_t Mz = sz(s.model_dim);
  Exchange x;
  x.send = buf(LayerBuf::kDIn, j);
  x.send_elems = sz(L.received_rows(j)) * Mz;
  if (L.routing != LayerRouting::kCapacity) {
    x.recv = buf(LayerBuf::kDSend);
    x.recv_off = sz(L.send_first[sz(j)]) * Mz;
    x.recv_elems = sz(L.send_rows[sz(j)]) * Mz;
    x.row_elems = Mz;
    return ops.exchange(op, x);
  }
  x.recv = buf(LayerBuf::kDSend, j);
  x.recv_elems = sz(L.back_block_rows(j)) * Mz;
  const std::int64_t algo = ops.exchange(op, x);
  if (!L.accumulate_back)
    for (const BlockCopy& c : slot_block_copies(
             L, j, s.model_dim, true, buf(LayerBuf::kDDispatched), buf(LayerBuf::kDSend, j), false))
      ops.copy(c);
  return algo;
}

// The parameter gather's backward (sharded, n / rho > 1): kDW cut into the gather group's blocks,
// member i's hidden units [i h, i h + h) of the slice (the transpose of run_param_gather's
// copies), reduce-scattered: this rank keeps the gradient of its own 1/n shard.
std::int64_t param_gather_backward(const LayerLayout& L, const MoeShape& s, const Op& op,
                                   LayerOps& ops) {
  const std::size_t Mz = sz(s.model_dim);
  const int g = L.gather(), h = s.hidden_dim / L.shards, hq = L.hidden;
  const std::size_t block = 2 * Mz * sz(h);
  for (int i = 0; i < g; ++i) {
    BlockCopy w1;
    w1.src = buf(LayerBuf::kDW);
    w1.src_off = dw_offset(L, s, false, 0) + sz(i) * sz(h);
    w1.src_pitch = sz(hq);
    w1.dst = buf(LayerBuf::kDParamAll);
    w1.dst_off = block * sz(i);
    w1.dst_pitch = sz(h);
    w1.run = sz(h);
    w1.count = s.model_dim;
    ops.copy(w1);
    BlockCopy w2;
    w2.src = buf(LayerBuf::kDW);
    w2.src_off = dw_offset(L, s, true, 0) + sz(i) * sz(h) * Mz;
    w2.dst = buf(LayerBuf::kDParamAll);
    w2.dst_off = block * sz(i) + Mz * sz(h);
    w2.run = sz(h) * Mz;
    w2.count = 1;
    ops.copy(w2);
  }
  return ops.reduce_scatter(op, buf(LayerBuf::kDParamAll), block, buf(LayerBuf::kDParamIn));
}

// Micro-op `part` of grad_sync_parts of the experts' gradient all-reduce: its share of the
// gradients this rank owns (owned_dw).
std::int64_t expert_grad_sync(const LayerLayout& L, const MoeShape& s, int part, const Op& op,
                              LayerOps& ops) {
  const std::size_t total =
      2 * sz(L.slices) * sz(s.model_dim) * sz(L.gather() > 1 ? s.hidden_dim / L.shards : L.hidden);
  const int parts = std::max(1, L.grad_sync_parts), i = std::max(0, part);
  MOESIM_ASSERT(i < parts,
                fmt::format("'{}': gradient all-reduce part {} of {}", op.label, i + 1, parts));
  const std::size_t lo = total * sz(i) / sz(parts), hi = total * sz(i + 1) / sz(parts);
  return ops.all_reduce(op, buf(owned_dw(L)), lo, hi - lo);
}

// A deepep layer's backward steps, each the transpose of its forward step (run_deepep_step):
// a row gather's transpose is a row sum by the same index (its CSR table), and a row sum's is a
// gather. The combine's backward moves like the forward dispatch (inter, then intra) and the
// dispatch's like the forward combine; the targets, which computed the gate's weights from the
// rows they received, take the gate's backward too, so dWgate is summed where the rows were
// (its EP-group total is the layer's) and the tokens' share of dX returns with the rows.
std::int64_t deepep_backward(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, const Op& op,
                             LayerOps& ops) {
  const auto& d = L.deepep;
  const std::size_t M = sz(s.model_dim);
  const int E = s.experts, k = s.top_k, S = L.unit_tokens(s);
  auto exchange = [&](LayerBuf send, int send_rows, LayerBuf recv, int recv_rows, int phase) {
    return ops.exchange(op, deepep_phase(send, send_rows, recv, recv_rows, M, phase));
  };
  const BufId none = buf(LayerBuf::kX);
  switch (kind) {
    case OpRoleKind::kDecode:  // every node row of a token gets the token's dY
      ops.gather_rows(buf(LayerBuf::kDY), buf(LayerBuf::kDBack), buf(LayerBuf::kSendIdx), d.send,
                      M);
      return -1;
    case OpRoleKind::kCombine: {
      const std::int64_t algo = exchange(LayerBuf::kDBack, d.send, LayerBuf::kDFwdIn, d.fwd_in, 0);
      ops.gather_rows(buf(LayerBuf::kDY), buf(LayerBuf::kDFwdOut), buf(LayerBuf::kFwdOwnIdx),
                      d.fwd_out, M);
      ops.gather_rows(buf(LayerBuf::kDFwdIn), buf(LayerBuf::kDFwdOut), buf(LayerBuf::kFwdInIdx),
                      d.fwd_out, M);
      exchange(LayerBuf::kDFwdOut, d.fwd_out, LayerBuf::kDTokOut, d.tok, 1);
      return algo;
    }
    case OpRoleKind::kFc2:
      // The weighted sum's backward: each entry's weight gradient, and its output's gradient.
      ops.zero(buf(LayerBuf::kDTokWeight), sz(d.tok) * sz(k));
      ops.dot_rows(buf(LayerBuf::kDTokOut), buf(LayerBuf::kEntryRow), buf(LayerBuf::kOut, 0),
                   d.entries, M, buf(LayerBuf::kEntryWeight), buf(LayerBuf::kDTokWeight));
      ops.zero(buf(LayerBuf::kDOut, 0), sz(d.entries) * M);
      ops.sum_rows(buf(LayerBuf::kDTokOut), buf(LayerBuf::kDOut, 0), buf(LayerBuf::kEntrySum),
                   d.entries, d.entries, M, true, buf(LayerBuf::kTokWeight));
      expert_backward(L, s, 0, true, ops);
      ops.relu_backward(buf(LayerBuf::kHidden, 0), buf(LayerBuf::kDHidden, 0),
                        sz(d.entries) * sz(L.hidden));
      return -1;
    case OpRoleKind::kFc1: {
      expert_backward(L, s, 0, false, ops);
      ops.zero(buf(LayerBuf::kDTokIn), sz(d.tok) * M);
      ops.sum_rows(buf(LayerBuf::kDIn, 0), buf(LayerBuf::kDTokIn), buf(LayerBuf::kTokSum), d.tok,
                   d.entries, M, false, none);
      // The target's gate: its softmax backward, dWgate += rows^T dLogits, rows += dLogits Wg^T.
      ops.softmax_backward(buf(LayerBuf::kTokLogits), buf(LayerBuf::kTokExpert),
                           buf(LayerBuf::kDTokWeight), buf(LayerBuf::kDTokLogits), d.tok, E, k);
      if (d.tok == 0) return -1;
      ops.widen(buf(LayerBuf::kDTokIn), buf(LayerBuf::kDTokIn32), sz(d.tok) * M);
      GemmJob w;
      w.a = buf(LayerBuf::kTokIn32);
      w.trans_a = true;
      w.b = buf(LayerBuf::kDTokLogits);
      w.c = buf(LayerBuf::kDGateW);
      w.m = s.model_dim;
      w.n = E;
      w.k = d.tok;
      w.accumulate = true;
      ops.gemm(w, /*f32=*/true);
      GemmJob x;
      x.a = buf(LayerBuf::kDTokLogits);
      x.b = buf(LayerBuf::kGateW);
      x.trans_b = true;
      x.c = buf(LayerBuf::kDTokIn32);
      x.m = d.tok;
      x.n = s.model_dim;
      x.k = E;
      x.accumulate = true;
      ops.gemm(x, /*f32=*/true);
      ops.narrow(buf(LayerBuf::kDTokIn32), buf(LayerBuf::kDTokIn), sz(d.tok) * M);
      return -1;
    }
    case OpRoleKind::kDispatch: {
      const std::int64_t algo =
          exchange(LayerBuf::kDTokIn, d.tok, LayerBuf::kDFwdOut, d.fwd_out, 0);
      ops.zero(buf(LayerBuf::kDX), sz(S) * M);
      ops.sum_rows(buf(LayerBuf::kDFwdOut), buf(LayerBuf::kDX), buf(LayerBuf::kOwnSum), S,
                   d.own_terms, M, false, none);
      ops.zero(buf(LayerBuf::kDFwdIn), sz(d.fwd_in) * M);
      ops.sum_rows(buf(LayerBuf::kDFwdOut), buf(LayerBuf::kDFwdIn), buf(LayerBuf::kNodeSum),
                   d.fwd_in, d.node_terms, M, false, none);
      exchange(LayerBuf::kDFwdIn, d.fwd_in, LayerBuf::kDSend, d.send, 1);
      return algo;
    }
    case OpRoleKind::kEncode:
      ops.sum_rows(buf(LayerBuf::kDSend), buf(LayerBuf::kDX), buf(LayerBuf::kBackSum), S, d.send, M,
                   false, none);
      return -1;
    case OpRoleKind::kGate:  // the source's gate weighs nothing here: dX is complete
      ops.widen(buf(LayerBuf::kDX), buf(LayerBuf::kDX32), sz(S) * M);
      return -1;
    default:
      break;
  }
  throw InternalError(fmt::format(
      "layer program: op '{}' is not a backward step of deepep MoE layer {}", op.label, L.moe));
}

}  // namespace

LayerBuf input_grad_buffer(const LayerLayout& L) {
  return L.input == GateInput::kOwn ? LayerBuf::kDX32 : LayerBuf::kDXOwn;
}

bool is_backward_step(const Op& op) {
  if (!op.role.backward) return false;
  switch (op.role.kind) {
    case OpRoleKind::kGate:
    case OpRoleKind::kEncode:
    case OpRoleKind::kDispatch:
    case OpRoleKind::kFc1:
    case OpRoleKind::kFc2:
    case OpRoleKind::kCombine:
    case OpRoleKind::kDecode:
    case OpRoleKind::kPartialSum:
    case OpRoleKind::kParamGather:
    case OpRoleKind::kEspAllGather:
    case OpRoleKind::kEspAllReduce:
    case OpRoleKind::kParmLocalDump:
    case OpRoleKind::kParmLocalCombine:
    case OpRoleKind::kParmJoin:
    case OpRoleKind::kParmMpAllGather:
    case OpRoleKind::kExpertGradSync:
    case OpRoleKind::kExpertMpGradSync:
      return true;
    default:
      return false;
  }
}

std::int64_t run_backward_step(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, int chunk,
                               const Op& op, LayerOps& ops) {
  MOESIM_ASSERT(L.backward, fmt::format("'{}': layer {} has no gradient buffers", op.label, L.moe));
  const int M = s.model_dim, E = s.experts, T = L.unit_tokens(s);
  const bool plan_routed = L.routing == LayerRouting::kPlan;
  const int j = chunk;
  if (L.routing == LayerRouting::kDeepep && kind != OpRoleKind::kExpertGradSync)
    return deepep_backward(L, s, kind, op, ops);
  switch (kind) {
    case OpRoleKind::kEspAllGather:  // the split's transpose: the ESP group's dY, the unit's rows
      MOESIM_ASSERT(L.output == LayerOutput::kOwnRows, "ESP all-gather of dY without the split");
      return ops.all_gather(op, buf(LayerBuf::kDYOwn), sz(s.tokens) * sz(M), buf(LayerBuf::kDY));
    case OpRoleKind::kDecode:                    // dWeight and the returned rows' gradients
      if (L.output == LayerOutput::kMpGathered)  // the MP all-gather's transpose: this share
        ops.copy(rows_copy(buf(LayerBuf::kDYOwn), sz(L.gate_first), buf(LayerBuf::kDY), 0, sz(T),
                           sz(M)));
      if (plan_routed)
        ops.decode_backward(buf(LayerBuf::kBack), buf(LayerBuf::kDBack), T, 1, L.total_send_rows());
      else if (L.rho > 1)  // the decode read the slices' sum: its gradient, copied per slice next
        ops.decode_backward(buf(LayerBuf::kSummed), buf(LayerBuf::kDSummed), T, E, L.capacity);
      else
        ops.decode_backward(buf(LayerBuf::kExpertOut), buf(LayerBuf::kDExpertOut), T, E,
                            L.capacity);
      return -1;
    case OpRoleKind::kPartialSum: {  // the sum's backward: every slice's output gets it
      const std::size_t run = sz(L.capacity) * sz(M);
      for (int q = 0; q < L.rho; ++q) {
        BlockCopy c;
        c.src = buf(LayerBuf::kDSummed);
        c.src_pitch = run;
        c.dst = buf(LayerBuf::kDExpertOut);
        c.dst_off = sz(q) * run;
        c.dst_pitch = sz(L.rho) * run;
        c.run = run;
        c.count = E;
        ops.copy(c);
      }
      return -1;
    }
    case OpRoleKind::kParamGather:
      return param_gather_backward(L, s, op, ops);
    case OpRoleKind::kParmLocalDump:  // every chunk packed before the first combine backward
      for (int c = 0; c < L.chunks(); ++c) pack_output_grads(L, s, c, ops);
      return -1;
    case OpRoleKind::kCombine:
      return combine_backward(L, s, j, op, ops);
    case OpRoleKind::kEspAllReduce:  // the esp shards' partial input gradients summed
    {
      const std::int64_t algo =
          ops.all_reduce(op, buf(LayerBuf::kDIn, j), 0, sz(L.received_rows(j)) * sz(M));
      if (!L.has_a2a)  // no dispatch: unpacked here, once summed (fc1's backward left it)
        for (const BlockCopy& c : slot_block_copies(L, j, M, false, buf(LayerBuf::kDDispatched),
                                                    buf(LayerBuf::kDIn, j), false))
          ops.copy(c);
      return algo;
    }
    case OpRoleKind::kParmLocalCombine:
    case OpRoleKind::kParmJoin:
      MOESIM_ASSERT(L.accumulate_back, "local combine of a layer that copies its returns");
      gather_input_grads(L, s, ops);
      return -1;
    case OpRoleKind::kExpertMpGradSync:  // the MP copies of this rank's expert slices
      return ops.all_reduce(op, buf(owned_dw(L)), 0, 2 * sz(L.slices) * sz(M) * sz(L.hidden));
    case OpRoleKind::kParmMpAllGather:  // every MP share's dX (Parm S1)
      MOESIM_ASSERT(L.input == GateInput::kOwnRows, "MP all-gather of dX without the MP split");
      return ops.all_gather(op, buf(LayerBuf::kDX), sz(T) * sz(M), buf(LayerBuf::kDXOwn));
    case OpRoleKind::kFc2:
      // W = 1: no combine, the output gradients are packed straight into the experts' rows.
      if (!plan_routed && !L.has_a2a)
        for (const BlockCopy& c : slot_block_copies(L, j, M, true, buf(LayerBuf::kDExpertOut),
                                                    buf(LayerBuf::kDOut, j), true))
          ops.copy(c);
      expert_backward(L, s, j, true, ops);
      ops.relu_backward(buf(LayerBuf::kHidden, j), buf(LayerBuf::kDHidden, j),
                        sz(L.received_rows(j)) * sz(L.hidden));
      return -1;
    case OpRoleKind::kFc1:
      expert_backward(L, s, j, false, ops);
      // (the ESP baseline's partials are unpacked once summed, by its all-reduce's backward)
      if (!plan_routed && !L.has_a2a && L.input != GateInput::kGathered)
        for (const BlockCopy& c : slot_block_copies(L, j, M, false, buf(LayerBuf::kDDispatched),
                                                    buf(LayerBuf::kDIn, j), false))
          ops.copy(c);
      return -1;
    case OpRoleKind::kDispatch:
      return dispatch_backward(L, s, j, op, ops);
    case OpRoleKind::kExpertGradSync:
      return expert_grad_sync(L, s, j, op, ops);
    case OpRoleKind::kEncode:
      if (plan_routed) {
        ops.encode_backward(buf(LayerBuf::kDSend), T, 1, L.total_send_rows());
      } else if (L.rho > 1) {  // the encode wrote rho copies: their gradients summed first
        ops.sum_slices(buf(LayerBuf::kDDispatched), buf(LayerBuf::kDSummed), E, L.rho,
                       sz(L.capacity) * sz(M));
        ops.encode_backward(buf(LayerBuf::kDSummed), T, E, L.capacity);
      } else {
        if (L.accumulate_back && !L.combine_op) gather_input_grads(L, s, ops);
        ops.encode_backward(buf(LayerBuf::kDDispatched), T, E, L.capacity);
      }
      return -1;
    case OpRoleKind::kGate:
      gate_backward(L, s, ops);
      if (L.input != GateInput::kOwn)  // dX in the data type, as the forward's rows moved
        ops.narrow(buf(LayerBuf::kDX32), buf(LayerBuf::kDX), sz(T) * sz(M));
      if (L.input == GateInput::kGathered)  // the ESP all-gather's transpose: own rows
        ops.copy(rows_copy(buf(LayerBuf::kDX), sz(L.own_first), buf(LayerBuf::kDXOwn), 0,
                           sz(s.tokens), sz(M)));
      return -1;
    default:
      break;
  }
  throw InternalError(fmt::format("layer program: op '{}' is not a backward step of MoE layer {}",
                                  op.label, L.moe));
}

}  // namespace moesim::exec
