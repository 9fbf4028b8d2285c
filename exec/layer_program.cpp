#include "exec/layer_program.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace moesim::exec {

ElemType elem_type(LayerBuf b) {
  switch (b) {
    case LayerBuf::kX32:
    case LayerBuf::kGateW:
    case LayerBuf::kLogits:
    case LayerBuf::kWeight:
      return ElemType::kF32;
    case LayerBuf::kExpert:
    case LayerBuf::kSlot:
    case LayerBuf::kSlotEntry:
    case LayerBuf::kCount:
    case LayerBuf::kRoutedExpert:
      return ElemType::kI32;
    default:
      return ElemType::kData;
  }
}

const char* layer_buf_name(LayerBuf b) {
  switch (b) {
    case LayerBuf::kX32:
      return "x32";
    case LayerBuf::kX:
      return "x";
    case LayerBuf::kGateW:
      return "gate_w";
    case LayerBuf::kLogits:
      return "logits";
    case LayerBuf::kExpert:
      return "expert";
    case LayerBuf::kSlot:
      return "slot";
    case LayerBuf::kWeight:
      return "weight";
    case LayerBuf::kSlotEntry:
      return "slot_entry";
    case LayerBuf::kCount:
      return "count";
    case LayerBuf::kRoutedExpert:
      return "routed_expert";
    case LayerBuf::kDispatched:
      return "dispatched";
    case LayerBuf::kExpertOut:
      return "expert_out";
    case LayerBuf::kSummed:
      return "summed";
    case LayerBuf::kY:
      return "y";
    case LayerBuf::kW1:
      return "w1";
    case LayerBuf::kW2:
      return "w2";
    case LayerBuf::kParamIn:
      return "param_in";
    case LayerBuf::kParamAll:
      return "param_all";
    case LayerBuf::kSend:
      return "send";
    case LayerBuf::kIn:
      return "in";
    case LayerBuf::kHidden:
      return "hidden";
    case LayerBuf::kOut:
      return "out";
    case LayerBuf::kBack:
      return "back";
  }
  return "?";
}

int LayerLayout::received_rows(int j) const {
  if (routing == LayerRouting::kCapacity) return ep * slices * block_rows(j);
  int n = 0;
  for (const auto& [rows, slice] : runs[static_cast<std::size_t>(j)]) n += rows;
  return n;
}

int LayerLayout::total_send_rows() const {
  int n = 0;
  for (int r : send_rows) n += r;
  return n;
}

namespace {

std::size_t sz(long long v) { return static_cast<std::size_t>(v); }

BufId buf(LayerBuf b, int index = 0) { return BufId{b, index}; }

}  // namespace

std::vector<BufferSize> layer_buffers(const LayerLayout& L, const MoeShape& s) {
  const std::size_t S = sz(s.tokens), M = sz(s.model_dim), E = sz(s.experts), k = sz(s.top_k),
                    C = sz(L.capacity), hid = sz(L.hidden);
  std::vector<BufferSize> out;
  auto add = [&](LayerBuf b, std::size_t n, int index = 0) { out.push_back({buf(b, index), n}); };
  add(LayerBuf::kX32, S * M);
  add(LayerBuf::kX, S * M);
  add(LayerBuf::kGateW, M * E);
  add(LayerBuf::kLogits, S * E);
  add(LayerBuf::kExpert, S * k);
  add(LayerBuf::kSlot, S * k);
  add(LayerBuf::kWeight, S * k);
  add(LayerBuf::kY, S * M);
  for (int sl = 0; sl < L.slices; ++sl) {
    add(LayerBuf::kW1, M * hid, sl);
    add(LayerBuf::kW2, hid * M, sl);
  }
  if (L.routing == LayerRouting::kPlan) {
    const std::size_t R = sz(L.total_send_rows());
    add(LayerBuf::kSlotEntry, R);
    add(LayerBuf::kCount, 1);
    add(LayerBuf::kRoutedExpert, S * k);
    add(LayerBuf::kSend, R * M);
    add(LayerBuf::kBack, R * M);
    for (int j = 0; j < L.chunks(); ++j) {
      const std::size_t rows = sz(L.received_rows(j));
      add(LayerBuf::kIn, rows * M, j);
      add(LayerBuf::kHidden, rows * hid, j);
      add(LayerBuf::kOut, rows * M, j);
    }
    return out;
  }
  add(LayerBuf::kSlotEntry, E * C);
  add(LayerBuf::kCount, E);
  add(LayerBuf::kDispatched, E * sz(L.rho) * C * M);
  add(LayerBuf::kExpertOut, E * sz(L.rho) * C * M);
  if (L.rho > 1) add(LayerBuf::kSummed, E * C * M);
  if (L.gather() > 1) {
    const std::size_t h = sz(s.hidden_dim / L.shards);
    add(LayerBuf::kParamIn, 2 * M * h);
    add(LayerBuf::kParamAll, sz(L.gather()) * 2 * M * h);
  }
  for (int j = 0; j < L.chunks(); ++j) {
    const std::size_t rows = sz(L.received_rows(j));
    if (L.has_a2a) add(LayerBuf::kSend, rows * M, j);
    add(LayerBuf::kIn, rows * M, j);
    add(LayerBuf::kHidden, rows * hid, j);
    add(LayerBuf::kOut, rows * M, j);
    if (L.has_a2a) add(LayerBuf::kBack, rows * M, j);
  }
  return out;
}

std::vector<BlockCopy> pack_blocks(const LayerLayout& L, int j, int model_dim, BufId dst) {
  MOESIM_ASSERT(L.routing == LayerRouting::kCapacity, "pack_blocks: capacity routing only");
  MOESIM_ASSERT(L.shards == 1 || L.slices == 1, "a sharded layer computes one slice per rank");
  const std::size_t M = sz(model_dim), C = sz(L.capacity), rows = sz(L.block_rows(j));
  const int n = L.shards, g = L.gather();
  std::vector<BlockCopy> out;
  if (rows == 0) return out;
  for (int p = 0; p < L.ep; ++p)
    for (int le = 0; le < L.slices; ++le) {
      const int x = n == 1 ? p * L.slices + le : p / n;
      const int q = (p % n) / g, i = p % g;
      const std::size_t slot = sz(L.offset[static_cast<std::size_t>(j)]) + sz(i) * rows;
      BlockCopy c;
      c.src = buf(LayerBuf::kDispatched);
      c.dst = dst;
      c.src_off = ((sz(x) * sz(L.rho) + sz(q)) * C + slot) * M;
      c.dst_off = (sz(p) * sz(L.slices) + sz(le)) * rows * M;
      c.run = rows * M;
      c.count = 1;
      // Merge with the previous copy when this one continues it at constant pitches.
      if (!out.empty() && c.src_off > out.back().src_off && c.dst_off > out.back().dst_off) {
        BlockCopy& prev = out.back();
        const std::size_t n = sz(prev.count);
        const std::size_t ds = c.src_off - prev.src_off, dd = c.dst_off - prev.dst_off;
        if (prev.count == 1 && ds >= c.run && dd >= c.run) {
          prev.src_pitch = ds;
          prev.dst_pitch = dd;
          prev.count = 2;
          continue;
        }
        if (prev.count > 1 && ds == prev.src_pitch * n && dd == prev.dst_pitch * n) {
          ++prev.count;
          continue;
        }
      }
      out.push_back(c);
    }
  return out;
}

std::vector<BlockCopy> unpack_blocks(const LayerLayout& L, int j, int model_dim, BufId src) {
  std::vector<BlockCopy> out = pack_blocks(L, j, model_dim, src);
  for (BlockCopy& c : out) {
    std::swap(c.src, c.dst);
    std::swap(c.src_off, c.dst_off);
    std::swap(c.src_pitch, c.dst_pitch);
    c.dst = buf(LayerBuf::kExpertOut);
  }
  return out;
}

std::vector<GemmJob> expert_gemms(const LayerLayout& L, int j, bool fc2, int model_dim) {
  const int M = model_dim, H = L.hidden;
  const BufId a = buf(fc2 ? LayerBuf::kHidden : LayerBuf::kIn, j);
  const BufId c = buf(fc2 ? LayerBuf::kOut : LayerBuf::kHidden, j);
  const int a_w = fc2 ? H : M, c_w = fc2 ? M : H;
  std::vector<GemmJob> out;
  auto job = [&](int slice, std::size_t row, int rows, long long stride_rows, int batch) {
    GemmJob g;
    g.a = a;
    g.b = buf(fc2 ? LayerBuf::kW2 : LayerBuf::kW1, slice);
    g.c = c;
    g.a_off = row * sz(a_w);
    g.c_off = row * sz(c_w);
    g.a_stride = stride_rows * a_w;
    g.c_stride = stride_rows * c_w;
    g.m = rows;
    g.n = c_w;
    g.k = a_w;
    g.batch = batch;
    out.push_back(g);
  };
  if (L.routing == LayerRouting::kPlan) {
    std::size_t row = 0;
    for (const auto& [rows, slice] : L.runs[static_cast<std::size_t>(j)]) {
      if (rows > 0) job(slice, row, rows, 0, 1);
      row += sz(rows);
    }
    return out;
  }
  // Block (w, le) of the chunk: source position w's rows for slice le; the slice's weights serve
  // every source block, so one strided-batched GEMM per slice over the W blocks.
  const int rows = L.block_rows(j);
  if (rows == 0) return out;
  for (int le = 0; le < L.slices; ++le)
    job(le, sz(le) * sz(rows), rows, static_cast<long long>(L.slices) * rows, L.ep);
  return out;
}

std::int64_t run_forward_step(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, int chunk,
                              const Op& op, LayerOps& ops) {
  const int S = s.tokens, M = s.model_dim, E = s.experts, k = s.top_k;
  const std::size_t Mz = sz(M);
  const bool plan_routed = L.routing == LayerRouting::kPlan;
  const int j = chunk;
  switch (kind) {
    case OpRoleKind::kGate: {
      if (!plan_routed) {
        ops.gate(gate_params(s, S, L.capacity));
        return -1;
      }
      // The plan decided which experts a token goes to; the gate decides how much each counts:
      // the fp32 gate GEMM, then the softmax probability of each entry's expert.
      GemmJob g;
      g.a = buf(LayerBuf::kX32);
      g.b = buf(LayerBuf::kGateW);
      g.c = buf(LayerBuf::kLogits);
      g.m = S;
      g.n = E;
      g.k = M;
      ops.gemm(g, /*f32=*/true);
      ops.routed_weights(S, E, k);
      return -1;
    }
    case OpRoleKind::kEncode:
      if (plan_routed) {  // every chunk's send rows at once: one pseudo-expert of R rows
        ops.encode(buf(LayerBuf::kSend), 1, L.total_send_rows());
        return -1;
      }
      if (L.rho == 1) {
        ops.encode(buf(LayerBuf::kDispatched), E, L.capacity);
        return -1;
      }
      // rho copies of each expert's slots, one per hidden slice (P2 / intermediate repeat).
      ops.encode(buf(LayerBuf::kSummed), E, L.capacity);
      for (int q = 0; q < L.rho; ++q) {
        BlockCopy c;
        c.src = buf(LayerBuf::kSummed);
        c.dst = buf(LayerBuf::kDispatched);
        c.run = sz(L.capacity) * Mz;
        c.src_pitch = c.run;
        c.dst_pitch = sz(L.rho) * c.run;
        c.dst_off = sz(q) * c.run;
        c.count = E;
        ops.copy(c);
      }
      return -1;
    case OpRoleKind::kDispatch: {
      Exchange x;
      x.recv = buf(LayerBuf::kIn, j);
      x.recv_elems = sz(L.received_rows(j)) * Mz;
      if (plan_routed) {
        x.send = buf(LayerBuf::kSend);
        x.send_off = sz(L.send_first[sz(j)]) * Mz;
        x.send_elems = sz(L.send_rows[sz(j)]) * Mz;
        x.row_elems = Mz;
      } else {
        for (const BlockCopy& c : pack_blocks(L, j, M, buf(LayerBuf::kSend, j))) ops.copy(c);
        x.send = buf(LayerBuf::kSend, j);
        x.send_elems = x.recv_elems;
      }
      return ops.exchange(op, x);
    }
    case OpRoleKind::kFc1:
      // W = 1: no dispatch, the chunk is packed straight into the experts' input.
      if (!plan_routed && !L.has_a2a)
        for (const BlockCopy& c : pack_blocks(L, j, M, buf(LayerBuf::kIn, j))) ops.copy(c);
      for (const GemmJob& g : expert_gemms(L, j, false, M)) ops.gemm(g, false);
      ops.relu(buf(LayerBuf::kHidden, j), sz(L.received_rows(j)) * sz(L.hidden));
      return -1;
    case OpRoleKind::kFc2:
      for (const GemmJob& g : expert_gemms(L, j, true, M)) ops.gemm(g, false);
      if (!plan_routed && !L.has_a2a)
        for (const BlockCopy& c : unpack_blocks(L, j, M, buf(LayerBuf::kOut, j))) ops.copy(c);
      return -1;
    case OpRoleKind::kCombine: {
      // The transpose of the dispatch: the outputs go back to the tokens' ranks.
      Exchange x;
      x.send = buf(LayerBuf::kOut, j);
      x.send_elems = sz(L.received_rows(j)) * Mz;
      if (plan_routed) {
        x.recv = buf(LayerBuf::kBack);
        x.recv_off = sz(L.send_first[sz(j)]) * Mz;
        x.recv_elems = sz(L.send_rows[sz(j)]) * Mz;
        x.row_elems = Mz;
        return ops.exchange(op, x);
      }
      x.recv = buf(LayerBuf::kBack, j);
      x.recv_elems = x.send_elems;
      const std::int64_t algo = ops.exchange(op, x);
      for (const BlockCopy& c : unpack_blocks(L, j, M, buf(LayerBuf::kBack, j))) ops.copy(c);
      return algo;
    }
    case OpRoleKind::kParamGather: {
      // Member i's shard s = q g + i holds hidden units [s h, s h + h): slice q of rho is the
      // members' columns of W1 side by side and their rows of W2 one after the other.
      const int g = L.gather(), h = s.hidden_dim / L.shards, hq = L.hidden;
      const std::size_t block = 2 * Mz * sz(h);
      const std::int64_t algo =
          ops.all_gather(op, buf(LayerBuf::kParamIn), block, buf(LayerBuf::kParamAll));
      for (int i = 0; i < g; ++i) {
        BlockCopy w1;
        w1.src = buf(LayerBuf::kParamAll);
        w1.dst = buf(LayerBuf::kW1);
        w1.src_off = block * sz(i);
        w1.src_pitch = sz(h);
        w1.dst_off = sz(i) * sz(h);
        w1.dst_pitch = sz(hq);
        w1.run = sz(h);
        w1.count = M;
        ops.copy(w1);
        BlockCopy w2;
        w2.src = buf(LayerBuf::kParamAll);
        w2.dst = buf(LayerBuf::kW2);
        w2.src_off = block * sz(i) + Mz * sz(h);
        w2.dst_off = sz(i) * sz(h) * Mz;
        w2.run = sz(h) * Mz;
        w2.count = 1;
        ops.copy(w2);
      }
      return algo;
    }
    case OpRoleKind::kPartialSum:
      ops.sum_slices(buf(LayerBuf::kExpertOut), buf(LayerBuf::kSummed), E, L.rho,
                     sz(L.capacity) * Mz);
      return -1;
    case OpRoleKind::kDecode:
      if (plan_routed)
        ops.decode(buf(LayerBuf::kBack), 1, L.total_send_rows());
      else
        ops.decode(buf(L.rho > 1 ? LayerBuf::kSummed : LayerBuf::kExpertOut), E, L.capacity);
      return -1;
    default:
      break;
  }
  throw InternalError(
      fmt::format("layer program: op '{}' is not a step of MoE layer {}", op.label, L.moe));
}

}  // namespace moesim::exec
