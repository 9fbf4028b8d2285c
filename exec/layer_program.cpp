#include "exec/layer_program.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "core/error.hpp"
#include "strategies/collectives/collective.hpp"

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
    case LayerBuf::kTokExpert:
    case LayerBuf::kSendIdx:
    case LayerBuf::kFwdOwnIdx:
    case LayerBuf::kFwdInIdx:
    case LayerBuf::kEntryRow:
    case LayerBuf::kTokSum:
    case LayerBuf::kOwnSum:
    case LayerBuf::kNodeSum:
    case LayerBuf::kBackSum:
      return ElemType::kI32;
    case LayerBuf::kTokIn32:
    case LayerBuf::kTokLogits:
    case LayerBuf::kTokWeight:
    case LayerBuf::kDWeight:
    case LayerBuf::kDX32:
    case LayerBuf::kDLogits:
    case LayerBuf::kDGateW:
    case LayerBuf::kDTokIn32:
    case LayerBuf::kDTokWeight:
    case LayerBuf::kDTokLogits:
    case LayerBuf::kDW:  // parameter gradients accumulate in fp32 (frameworks' main gradients)
    case LayerBuf::kDParamAll:
    case LayerBuf::kDParamIn:
      return ElemType::kF32;
    case LayerBuf::kEntrySum:
    case LayerBuf::kEntryWeight:
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
    case LayerBuf::kXOwn:
      return "x_own";
    case LayerBuf::kYOwn:
      return "y_own";
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
    case LayerBuf::kFwdIn:
      return "fwd_in";
    case LayerBuf::kFwdOut:
      return "fwd_out";
    case LayerBuf::kFwdBack:
      return "fwd_back";
    case LayerBuf::kNodeOut:
      return "node_out";
    case LayerBuf::kTokIn:
      return "tok_in";
    case LayerBuf::kTokOut:
      return "tok_out";
    case LayerBuf::kTokLogits:
      return "tok_logits";
    case LayerBuf::kTokExpert:
      return "tok_expert";
    case LayerBuf::kTokWeight:
      return "tok_weight";
    case LayerBuf::kSendIdx:
      return "send_idx";
    case LayerBuf::kFwdOwnIdx:
      return "fwd_own_idx";
    case LayerBuf::kFwdInIdx:
      return "fwd_in_idx";
    case LayerBuf::kEntryRow:
      return "entry_row";
    case LayerBuf::kTokIn32:
      return "tok_in32";
    case LayerBuf::kTokSum:
      return "tok_sum";
    case LayerBuf::kOwnSum:
      return "own_sum";
    case LayerBuf::kNodeSum:
      return "node_sum";
    case LayerBuf::kBackSum:
      return "back_sum";
    case LayerBuf::kDY:
      return "d_y";
    case LayerBuf::kDWeight:
      return "d_weight";
    case LayerBuf::kDExpertOut:
      return "d_expert_out";
    case LayerBuf::kDDispatched:
      return "d_dispatched";
    case LayerBuf::kDX:
      return "d_x";
    case LayerBuf::kDX32:
      return "d_x32";
    case LayerBuf::kDLogits:
      return "d_logits";
    case LayerBuf::kDGateW:
      return "d_gate_w";
    case LayerBuf::kDW:
      return "d_w";
    case LayerBuf::kDSend:
      return "d_send";
    case LayerBuf::kDIn:
      return "d_in";
    case LayerBuf::kDHidden:
      return "d_hidden";
    case LayerBuf::kDOut:
      return "d_out";
    case LayerBuf::kDBack:
      return "d_back";
    case LayerBuf::kDSummed:
      return "d_summed";
    case LayerBuf::kDParamAll:
      return "d_param_all";
    case LayerBuf::kDParamIn:
      return "d_param_in";
    case LayerBuf::kDYOwn:
      return "d_y_own";
    case LayerBuf::kDXOwn:
      return "d_x_own";
    case LayerBuf::kDFwdIn:
      return "d_fwd_in";
    case LayerBuf::kDFwdOut:
      return "d_fwd_out";
    case LayerBuf::kDTokIn:
      return "d_tok_in";
    case LayerBuf::kDTokIn32:
      return "d_tok_in32";
    case LayerBuf::kDTokOut:
      return "d_tok_out";
    case LayerBuf::kDTokWeight:
      return "d_tok_weight";
    case LayerBuf::kDTokLogits:
      return "d_tok_logits";
    case LayerBuf::kEntrySum:
      return "entry_sum";
    case LayerBuf::kEntryWeight:
      return "entry_weight";
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

int LayerLayout::send_block_rows(int j) const {
  int n = 0;
  for (const SlotBlock& b : send_blocks[static_cast<std::size_t>(j)]) n += b.rows;
  return n;
}

int LayerLayout::back_block_rows(int j) const {
  if (back_blocks.empty()) return send_block_rows(j);
  int n = 0;
  for (const SlotBlock& b : back_blocks[static_cast<std::size_t>(j)]) n += b.rows;
  return n;
}

LayerLayout capacity_layout(int moe, int block, int ep, int ep_pos, int slices, int hidden,
                            bool has_a2a, const std::vector<int>& caps, int capacity) {
  LayerLayout L;
  L.moe = moe;
  L.block = block;
  L.routing = LayerRouting::kCapacity;
  L.ep = ep;
  L.ep_pos = ep_pos;
  L.slices = slices;
  L.hidden = hidden;
  L.has_a2a = has_a2a;
  L.caps = caps;
  int first = 0;
  for (int c : caps) {
    L.offset.push_back(first);
    first += c;
  }
  L.capacity = capacity;
  return L;
}

void fill_capacity_blocks(LayerLayout& L) {
  MOESIM_ASSERT(L.routing == LayerRouting::kCapacity, "slot blocks: capacity routing only");
  MOESIM_ASSERT(L.shards == 1 || L.slices == 1, "a sharded layer computes one slice per rank");
  const int n = L.shards, g = L.gather();
  L.send_blocks.assign(L.caps.size(), {});
  L.back_blocks.clear();
  for (int j = 0; j < static_cast<int>(L.caps.size()); ++j) {
    const int rows = L.block_rows(j);
    for (int p = 0; p < L.ep; ++p)
      for (int le = 0; le < L.slices; ++le) {
        const int x = n == 1 ? p * L.slices + le : p / n;
        const int q = (p % n) / g, i = p % g;
        L.send_blocks[static_cast<std::size_t>(j)].push_back(
            SlotBlock{x, q, L.offset[static_cast<std::size_t>(j)] + i * rows, rows});
      }
  }
}

namespace {

std::size_t sz(long long v) { return static_cast<std::size_t>(v); }

BufId buf(LayerBuf b, int index = 0) { return BufId{b, index}; }

}  // namespace

namespace {

// The gradient buffers of a layer whose backward the program runs: each as big as the forward
// buffer it is the gradient of.
void add_gradient_buffers(const LayerLayout& L, const MoeShape& s, std::vector<BufferSize>& out) {
  const std::size_t S = sz(L.unit_tokens(s)), M = sz(s.model_dim), E = sz(s.experts),
                    k = sz(s.top_k), hid = sz(L.hidden);
  auto add = [&](LayerBuf b, std::size_t n, int index = 0) { out.push_back({buf(b, index), n}); };
  add(LayerBuf::kDY, S * M);
  if (L.output != LayerOutput::kGateRows) add(LayerBuf::kDYOwn, sz(s.tokens) * M);
  if (L.input != GateInput::kOwn) add(LayerBuf::kDXOwn, sz(s.tokens) * M);
  add(LayerBuf::kDWeight, S * k);
  add(LayerBuf::kDX, S * M);
  add(LayerBuf::kDX32, S * M);
  add(LayerBuf::kDLogits, S * E);
  add(LayerBuf::kDGateW, M * E);
  add(LayerBuf::kDW, 2 * sz(L.slices) * M * hid);
  if (L.routing == LayerRouting::kDeepep) {
    const auto& d = L.deepep;
    add(LayerBuf::kDBack, sz(d.send) * M);
    add(LayerBuf::kDSend, sz(d.send) * M);
    add(LayerBuf::kDFwdIn, sz(d.fwd_in) * M);
    add(LayerBuf::kDFwdOut, sz(d.fwd_out) * M);
    add(LayerBuf::kDTokIn, sz(d.tok) * M);
    add(LayerBuf::kDTokIn32, sz(d.tok) * M);
    add(LayerBuf::kDTokOut, sz(d.tok) * M);
    add(LayerBuf::kDTokWeight, sz(d.tok) * k);
    add(LayerBuf::kDTokLogits, sz(d.tok) * E);
    add(LayerBuf::kEntrySum, 3 * sz(d.entries) + 1);
    add(LayerBuf::kEntryWeight, sz(d.entries));
    add(LayerBuf::kDIn, sz(d.entries) * M);
    add(LayerBuf::kDHidden, sz(d.entries) * hid);
    add(LayerBuf::kDOut, sz(d.entries) * M);
    return;
  }
  if (L.routing == LayerRouting::kPlan) {
    const std::size_t R = sz(L.total_send_rows());
    add(LayerBuf::kDBack, R * M);
    add(LayerBuf::kDSend, R * M);
  } else {
    add(LayerBuf::kDExpertOut, E * sz(L.rho) * sz(L.capacity) * M);
    add(LayerBuf::kDDispatched, E * sz(L.rho) * sz(L.capacity) * M);
    if (L.rho > 1) add(LayerBuf::kDSummed, E * sz(L.capacity) * M);
    if (L.gather() > 1) {
      const std::size_t h = sz(s.hidden_dim / L.shards);
      add(LayerBuf::kDParamIn, 2 * M * h);
      add(LayerBuf::kDParamAll, sz(L.gather()) * 2 * M * h);
    }
  }
  for (int j = 0; j < L.chunks(); ++j) {
    const std::size_t rows = sz(L.received_rows(j));
    add(LayerBuf::kDIn, rows * M, j);
    add(LayerBuf::kDHidden, rows * hid, j);
    add(LayerBuf::kDOut, rows * M, j);
    if (L.routing == LayerRouting::kCapacity && L.has_a2a) {
      add(LayerBuf::kDBack, sz(L.send_block_rows(j)) * M, j);
      add(LayerBuf::kDSend, sz(L.back_block_rows(j)) * M, j);
    }
  }
}

std::vector<BufferSize> forward_buffers(const LayerLayout& L, const MoeShape& s);

}  // namespace

std::vector<BufferSize> layer_buffers(const LayerLayout& L, const MoeShape& s) {
  std::vector<BufferSize> out = forward_buffers(L, s);
  if (L.backward) add_gradient_buffers(L, s, out);
  return out;
}

std::size_t dw_offset(const LayerLayout& L, const MoeShape& s, bool fc2, int slice) {
  return (sz(fc2 ? L.slices : 0) + sz(slice)) * sz(s.model_dim) * sz(L.hidden);
}

LayerBuf owned_dw(const LayerLayout& L) {
  return L.gather() > 1 ? LayerBuf::kDParamIn : LayerBuf::kDW;
}

namespace {

std::vector<BufferSize> forward_buffers(const LayerLayout& L, const MoeShape& s) {
  const std::size_t S = sz(L.unit_tokens(s)), M = sz(s.model_dim), E = sz(s.experts),
                    k = sz(s.top_k), C = sz(L.capacity), hid = sz(L.hidden);
  std::vector<BufferSize> out;
  auto add = [&](LayerBuf b, std::size_t n, int index = 0) { out.push_back({buf(b, index), n}); };
  if (L.input != GateInput::kOwn) add(LayerBuf::kXOwn, sz(s.tokens) * M);
  if (L.output != LayerOutput::kGateRows) add(LayerBuf::kYOwn, sz(s.tokens) * M);
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
  if (L.routing == LayerRouting::kDeepep) {
    const auto& d = L.deepep;
    add(LayerBuf::kRoutedExpert, S * k);
    add(LayerBuf::kSend, sz(d.send) * M);
    add(LayerBuf::kBack, sz(d.send) * M);
    add(LayerBuf::kSendIdx, sz(d.send));
    add(LayerBuf::kFwdIn, sz(d.fwd_in) * M);
    add(LayerBuf::kNodeOut, sz(d.fwd_in) * M);
    add(LayerBuf::kFwdOut, sz(d.fwd_out) * M);
    add(LayerBuf::kFwdBack, sz(d.fwd_out) * M);
    add(LayerBuf::kFwdOwnIdx, sz(d.fwd_out));
    add(LayerBuf::kFwdInIdx, sz(d.fwd_out));
    add(LayerBuf::kTokIn, sz(d.tok) * M);
    add(LayerBuf::kTokIn32, sz(d.tok) * M);
    add(LayerBuf::kTokOut, sz(d.tok) * M);
    add(LayerBuf::kTokLogits, sz(d.tok) * E);
    add(LayerBuf::kTokExpert, sz(d.tok) * k);
    add(LayerBuf::kTokWeight, sz(d.tok) * k);
    add(LayerBuf::kEntryRow, sz(d.entries));
    add(LayerBuf::kTokSum, sz(d.tok) + 1 + 2 * sz(d.entries));
    add(LayerBuf::kOwnSum, S + 1 + sz(d.own_terms));
    add(LayerBuf::kNodeSum, sz(d.fwd_in) + 1 + sz(d.node_terms));
    add(LayerBuf::kBackSum, S + 1 + sz(d.send));
    add(LayerBuf::kIn, sz(d.entries) * M, 0);
    add(LayerBuf::kHidden, sz(d.entries) * hid, 0);
    add(LayerBuf::kOut, sz(d.entries) * M, 0);
    return out;
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
    if (L.has_a2a) add(LayerBuf::kSend, sz(L.send_block_rows(j)) * M, j);
    add(LayerBuf::kIn, rows * M, j);
    add(LayerBuf::kHidden, rows * hid, j);
    add(LayerBuf::kOut, rows * M, j);
    if (L.has_a2a) add(LayerBuf::kBack, sz(L.back_block_rows(j)) * M, j);
  }
  return out;
}

// The copies between chunk j's slot blocks (in order, consecutive rows of `chunk`) and the (E,
// rho, C, M) buffer `slots`: to_chunk packs, otherwise unpacks. Runs that continue each other at
// constant pitches are merged into one 2-D copy.
std::vector<BlockCopy> block_copies(const LayerLayout& L, const std::vector<SlotBlock>& blocks,
                                    std::size_t M, BufId slots, BufId chunk, bool to_chunk,
                                    bool accumulate) {
  const std::size_t C = sz(L.capacity);
  std::vector<BlockCopy> out;
  std::size_t row = 0;
  for (const SlotBlock& blk : blocks) {
    if (blk.rows == 0) continue;
    const std::size_t at_slots =
        ((sz(blk.expert) * sz(L.rho) + sz(blk.copy)) * C + sz(blk.first)) * M;
    const std::size_t at_chunk = row * M;
    row += sz(blk.rows);
    BlockCopy c;
    c.src = to_chunk ? slots : chunk;
    c.dst = to_chunk ? chunk : slots;
    c.src_off = to_chunk ? at_slots : at_chunk;
    c.dst_off = to_chunk ? at_chunk : at_slots;
    c.run = sz(blk.rows) * M;
    c.count = 1;
    c.accumulate = accumulate;
    if (!out.empty() && out.back().run == c.run && c.src_off > out.back().src_off &&
        c.dst_off > out.back().dst_off) {
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

}  // namespace

std::vector<BlockCopy> pack_blocks(const LayerLayout& L, int j, int model_dim, BufId dst) {
  MOESIM_ASSERT(L.routing == LayerRouting::kCapacity, "pack_blocks: capacity routing only");
  MOESIM_ASSERT(static_cast<std::size_t>(j) < L.send_blocks.size(), "pack_blocks: no slot blocks");
  return block_copies(L, L.send_blocks[sz(j)], sz(model_dim), buf(LayerBuf::kDispatched), dst, true,
                      false);
}

std::vector<BlockCopy> slot_block_copies(const LayerLayout& L, int j, int model_dim, bool back,
                                         BufId slots, BufId chunk, bool to_chunk, bool accumulate) {
  MOESIM_ASSERT(L.routing == LayerRouting::kCapacity, "slot blocks: capacity routing only");
  const auto& blocks = back && !L.back_blocks.empty() ? L.back_blocks : L.send_blocks;
  MOESIM_ASSERT(static_cast<std::size_t>(j) < blocks.size(), "slot blocks: no such chunk");
  return block_copies(L, blocks[sz(j)], sz(model_dim), slots, chunk, to_chunk, accumulate);
}

Exchange deepep_phase(LayerBuf send, int send_rows, LayerBuf recv, int recv_rows,
                      std::size_t row_elems, int phase) {
  Exchange x;
  x.send = buf(send);
  x.send_elems = sz(send_rows) * row_elems;
  x.recv = buf(recv);
  x.recv_elems = sz(recv_rows) * row_elems;
  x.row_elems = row_elems;
  x.first_phase = phase;
  x.phase_count = 1;
  return x;
}

std::vector<BlockCopy> unpack_blocks(const LayerLayout& L, int j, int model_dim, BufId src) {
  MOESIM_ASSERT(L.routing == LayerRouting::kCapacity, "unpack_blocks: capacity routing only");
  const auto& blocks = L.back_blocks.empty() ? L.send_blocks : L.back_blocks;
  MOESIM_ASSERT(static_cast<std::size_t>(j) < blocks.size(), "unpack_blocks: no slot blocks");
  return block_copies(L, blocks[sz(j)], sz(model_dim), buf(LayerBuf::kExpertOut), src, false,
                      L.accumulate_back);
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
  if (L.routing != LayerRouting::kCapacity) {
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

CollectiveSpec exchange_spec(const Plan& plan, const Op& op, const Exchange& x, int rank,
                             std::size_t elem_bytes) {
  CollectiveSpec s = op.collective();
  const Grouping& g = plan.grouping(s.grouping);
  int gi = -1, pos = -1;
  for (std::size_t i = 0; i < g.groups.size() && gi < 0; ++i) {
    const auto it = std::find(g.groups[i].begin(), g.groups[i].end(), rank);
    if (it != g.groups[i].end()) {
      gi = static_cast<int>(i);
      pos = static_cast<int>(it - g.groups[i].begin());
    }
  }
  MOESIM_ASSERT(gi >= 0, fmt::format("'{}': this rank is in none of its groups", op.label));
  const Bytes row(static_cast<double>(x.row_elems * elem_bytes));
  if (s.algo == CollectiveAlgo::kDeepep) {
    // Its NodeDedup counts token rows (the phases' extents check the buffers).
    MOESIM_ASSERT(x.row_elems > 0 && !s.node_dedup.empty(),
                  fmt::format("'{}': deepep exchange without rows", op.label));
    for (auto& d : s.node_dedup) {
      auto rows = std::make_shared<NodeDedup>(*d);
      rows->unit = row;
      d = std::move(rows);
    }
    return s;
  }
  if (x.row_elems == 0) {
    s.bytes = Bytes(static_cast<double>(x.send_elems * elem_bytes));
    return s;
  }
  const collectives::CollectiveCall orig{&op.collective(), &g.groups[static_cast<std::size_t>(gi)],
                                         gi, true};
  const ByteMatrix* m = orig.matrix();
  MOESIM_ASSERT(s.type == CollectiveType::kAllToAllv && m != nullptr,
                fmt::format("'{}': row exchange without an all_to_allv matrix", op.label));
  auto rows = std::make_shared<ByteMatrix>(*m);
  rows->unit = row;
  MOESIM_ASSERT(static_cast<double>(x.send_elems * elem_bytes) == rows->row_sum(pos).value() &&
                    static_cast<double>(x.recv_elems * elem_bytes) == rows->col_sum(pos).value(),
                fmt::format("'{}': buffers ({} sent, {} received) disagree with the plan's matrix",
                            op.label, x.send_elems / x.row_elems, x.recv_elems / x.row_elems));
  s.matrix = std::move(rows);
  s.per_group.clear();
  return s;
}

bool is_forward_step(const Op& op) {
  if (op.role.backward) return false;
  switch (op.role.kind) {
    case OpRoleKind::kGate:
    case OpRoleKind::kEncode:
    case OpRoleKind::kDispatch:
    case OpRoleKind::kFc1:
    case OpRoleKind::kFc2:
    case OpRoleKind::kCombine:
    case OpRoleKind::kDecode:
    case OpRoleKind::kParamGather:
    case OpRoleKind::kPartialSum:
    case OpRoleKind::kEspAllGather:
    case OpRoleKind::kEspAllReduce:
    case OpRoleKind::kCombineSaa:
    case OpRoleKind::kParmLocalDump:
    case OpRoleKind::kParmLocalCombine:
    case OpRoleKind::kParmJoin:
    case OpRoleKind::kParmMpAllGather:
      return true;
    default:
      return false;
  }
}

BlockCopy rows_copy(BufId src, std::size_t src_row, BufId dst, std::size_t dst_row,
                    std::size_t rows, std::size_t M) {
  BlockCopy c;
  c.src = src;
  c.dst = dst;
  c.src_off = src_row * M;
  c.dst_off = dst_row * M;
  c.run = rows * M;
  c.count = 1;
  return c;
}

namespace {

// The returned blocks of every chunk summed into kExpertOut (Parm's local combine).
void combine_returned(const LayerLayout& L, int M, LayerOps& ops) {
  for (int j = 0; j < L.chunks(); ++j)
    for (const BlockCopy& c : unpack_blocks(L, j, M, buf(LayerBuf::kBack, j))) ops.copy(c);
}

// A deepep layer's steps after the gate (one chunk; exec/deepep_path.hpp builds the tables):
//  encode    the rows this rank sends to other nodes, one per (token, node): kX -> kSend;
//  dispatch  dispatch_inter (kSend -> kFwdIn), the rows for each GPU of this node gathered from
//            its own tokens and what arrived (-> kFwdOut), dispatch_intra (kFwdOut -> kTokIn);
//  fc1       the gate's probabilities of the rows' experts here, recomputed from the rows in
//            fp32 (DeepEP sends them; recomputing keeps the bytes the plan's), the (row, expert)
//            entries gathered by expert (kTokIn -> kIn), fc1 and the activation;
//  fc2       fc2, and each row's entries summed with their weights (kOut -> kTokOut);
//  combine   combine_intra (kTokOut -> kFwdBack), the rows summed per (source, token): this
//            rank's own tokens straight into kY, the others into kNodeOut; combine_inter
//            (kNodeOut -> kBack);
//  decode    each node's row added into its token's output (kBack -> kY).
std::int64_t run_deepep_step(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, const Op& op,
                             LayerOps& ops) {
  const auto& d = L.deepep;
  const std::size_t M = sz(s.model_dim);
  const int E = s.experts, k = s.top_k, T = L.unit_tokens(s);
  auto exchange = [&](LayerBuf send, int send_rows, LayerBuf recv, int recv_rows, int phase) {
    return ops.exchange(op, deepep_phase(send, send_rows, recv, recv_rows, M, phase));
  };
  const BufId none = buf(LayerBuf::kX);
  switch (kind) {
    case OpRoleKind::kEncode:
      ops.gather_rows(buf(LayerBuf::kX), buf(LayerBuf::kSend), buf(LayerBuf::kSendIdx), d.send, M);
      return -1;
    case OpRoleKind::kDispatch: {
      exchange(LayerBuf::kSend, d.send, LayerBuf::kFwdIn, d.fwd_in, 0);
      ops.gather_rows(buf(LayerBuf::kX), buf(LayerBuf::kFwdOut), buf(LayerBuf::kFwdOwnIdx),
                      d.fwd_out, M);
      ops.gather_rows(buf(LayerBuf::kFwdIn), buf(LayerBuf::kFwdOut), buf(LayerBuf::kFwdInIdx),
                      d.fwd_out, M);
      return exchange(LayerBuf::kFwdOut, d.fwd_out, LayerBuf::kTokIn, d.tok, 1);
    }
    case OpRoleKind::kFc1: {
      ops.widen(buf(LayerBuf::kTokIn), buf(LayerBuf::kTokIn32), sz(d.tok) * M);
      GemmJob g;
      g.a = buf(LayerBuf::kTokIn32);
      g.b = buf(LayerBuf::kGateW);
      g.c = buf(LayerBuf::kTokLogits);
      g.m = d.tok;
      g.n = E;
      g.k = s.model_dim;
      if (d.tok > 0) ops.gemm(g, /*f32=*/true);
      ops.routed_weights(buf(LayerBuf::kTokLogits), buf(LayerBuf::kTokExpert),
                         buf(LayerBuf::kTokWeight), d.tok, E, k);
      ops.gather_rows(buf(LayerBuf::kTokIn), buf(LayerBuf::kIn), buf(LayerBuf::kEntryRow),
                      d.entries, M);
      for (const GemmJob& job : expert_gemms(L, 0, false, s.model_dim)) ops.gemm(job, false);
      ops.relu(buf(LayerBuf::kHidden), sz(d.entries) * sz(L.hidden));
      return -1;
    }
    case OpRoleKind::kFc2:
      for (const GemmJob& job : expert_gemms(L, 0, true, s.model_dim)) ops.gemm(job, false);
      ops.zero(buf(LayerBuf::kTokOut), sz(d.tok) * M);
      ops.sum_rows(buf(LayerBuf::kOut), buf(LayerBuf::kTokOut), buf(LayerBuf::kTokSum), d.tok,
                   d.entries, M, true, buf(LayerBuf::kTokWeight));
      return -1;
    case OpRoleKind::kCombine: {
      const std::int64_t algo =
          exchange(LayerBuf::kTokOut, d.tok, LayerBuf::kFwdBack, d.fwd_out, 0);
      ops.zero(buf(LayerBuf::kY), sz(T) * M);
      ops.zero(buf(LayerBuf::kNodeOut), sz(d.fwd_in) * M);
      ops.sum_rows(buf(LayerBuf::kFwdBack), buf(LayerBuf::kY), buf(LayerBuf::kOwnSum), T,
                   d.own_terms, M, false, none);
      ops.sum_rows(buf(LayerBuf::kFwdBack), buf(LayerBuf::kNodeOut), buf(LayerBuf::kNodeSum),
                   d.fwd_in, d.node_terms, M, false, none);
      exchange(LayerBuf::kNodeOut, d.fwd_in, LayerBuf::kBack, d.send, 1);
      return algo;
    }
    case OpRoleKind::kDecode:
      ops.sum_rows(buf(LayerBuf::kBack), buf(LayerBuf::kY), buf(LayerBuf::kBackSum), T, d.send, M,
                   false, none);
      return -1;
    default:
      break;
  }
  throw InternalError(
      fmt::format("layer program: op '{}' is not a step of deepep MoE layer {}", op.label, L.moe));
}

// The gate: the capacity gate, or on plan-routed layers the softmax weights of the plan's
// choices (the plan decided which experts a token goes to; the gate decides how much each counts).
void run_gate(const LayerLayout& L, const MoeShape& s, LayerOps& ops) {
  const int M = s.model_dim, E = s.experts, k = s.top_k;
  const int T = L.unit_tokens(s);
  const std::size_t Mz = sz(M);
  if (L.input == GateInput::kOwnRows) {  // MP split before the gate (Parm S1)
    ops.copy(rows_copy(buf(LayerBuf::kXOwn), sz(L.gate_first), buf(LayerBuf::kX), 0, sz(T), Mz));
    ops.widen_tokens(sz(T) * Mz);
  }
  if (L.routing == LayerRouting::kCapacity) {
    ops.gate(gate_params(s, T, L.capacity));
    return;
  }
  GemmJob g;
  g.a = buf(LayerBuf::kX32);
  g.b = buf(LayerBuf::kGateW);
  g.c = buf(LayerBuf::kLogits);
  g.m = T;
  g.n = E;
  g.k = M;
  ops.gemm(g, /*f32=*/true);
  ops.routed_weights(buf(LayerBuf::kLogits), buf(LayerBuf::kRoutedExpert), buf(LayerBuf::kWeight),
                     T, E, k);
}

// The encode: tokens into their experts' slots (rho copies of each expert's slots, one per hidden
// slice, under P2 / intermediate repeat); plan-routed layers: every chunk's send rows at once.
void run_encode(const LayerLayout& L, const MoeShape& s, LayerOps& ops) {
  const int E = s.experts;
  const int T = L.unit_tokens(s);
  const std::size_t Mz = sz(s.model_dim);
  if (L.routing != LayerRouting::kCapacity) {  // one pseudo-expert of R rows
    ops.encode(buf(LayerBuf::kSend), T, 1, L.total_send_rows());
    return;
  }
  // A step may run several times (micro-batches): the local combine sums into a clean buffer.
  if (L.accumulate_back)
    ops.zero(buf(LayerBuf::kExpertOut), sz(E) * sz(L.rho) * sz(L.capacity) * Mz);
  if (L.rho == 1) {
    ops.encode(buf(LayerBuf::kDispatched), T, E, L.capacity);
    return;
  }
  ops.encode(buf(LayerBuf::kSummed), T, E, L.capacity);
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
}

// Chunk j's dispatch: the send blocks (packed now unless a dump op packed every chunk) to the
// experts' input; plan-routed layers send their rows of the plan's matrix.
std::int64_t run_dispatch(const LayerLayout& L, const MoeShape& s, int j, const Op& op,
                          LayerOps& ops) {
  const int M = s.model_dim;
  const std::size_t Mz = sz(M);
  Exchange x;
  x.recv = buf(LayerBuf::kIn, j);
  x.recv_elems = sz(L.received_rows(j)) * Mz;
  if (L.routing != LayerRouting::kCapacity) {
    x.send = buf(LayerBuf::kSend);
    x.send_off = sz(L.send_first[sz(j)]) * Mz;
    x.send_elems = sz(L.send_rows[sz(j)]) * Mz;
    x.row_elems = Mz;
  } else {
    if (!L.dump_op)
      for (const BlockCopy& c : pack_blocks(L, j, M, buf(LayerBuf::kSend, j))) ops.copy(c);
    x.send = buf(LayerBuf::kSend, j);
    x.send_elems = sz(L.send_block_rows(j)) * Mz;
  }
  return ops.exchange(op, x);
}

// Chunk j's combine, the transpose of its dispatch: the outputs go back to the tokens' ranks
// (SAA: every MP share's, all-gathered over the MP group in the same collective).
std::int64_t run_combine(const LayerLayout& L, const MoeShape& s, int j, const Op& op,
                         LayerOps& ops) {
  const int M = s.model_dim;
  const std::size_t Mz = sz(M);
  Exchange x;
  x.send = buf(LayerBuf::kOut, j);
  x.send_elems = sz(L.received_rows(j)) * Mz;
  if (L.routing != LayerRouting::kCapacity) {
    x.recv = buf(LayerBuf::kBack);
    x.recv_off = sz(L.send_first[sz(j)]) * Mz;
    x.recv_elems = sz(L.send_rows[sz(j)]) * Mz;
    x.row_elems = Mz;
    return ops.exchange(op, x);
  }
  x.recv = buf(LayerBuf::kBack, j);
  x.recv_elems = sz(L.back_block_rows(j)) * Mz;
  const std::int64_t algo = ops.exchange(op, x);
  if (!L.accumulate_back)
    for (const BlockCopy& c : unpack_blocks(L, j, M, buf(LayerBuf::kBack, j))) ops.copy(c);
  return algo;
}

// The sharded experts' parameter all-gather. Member i's shard s = q g + i holds hidden units
// [s h, s h + h): slice q of rho is the members' columns of W1 side by side and their rows of W2
// one after the other.
std::int64_t run_param_gather(const LayerLayout& L, const MoeShape& s, const Op& op,
                              LayerOps& ops) {
  const int M = s.model_dim;
  const std::size_t Mz = sz(M);
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

// The decode: the returned expert outputs weighted back into the tokens' rows (after the local
// combine, and with W = 1 the outputs placed now, after the ESP all-reduce if any).
void run_decode(const LayerLayout& L, const MoeShape& s, LayerOps& ops) {
  const int M = s.model_dim, E = s.experts;
  const int T = L.unit_tokens(s);
  const std::size_t Mz = sz(M);
  if (L.routing != LayerRouting::kCapacity) {
    ops.decode(buf(LayerBuf::kBack), buf(LayerBuf::kY), T, 1, L.total_send_rows());
    return;
  }
  if (L.accumulate_back && !L.combine_op) combine_returned(L, M, ops);
  if (!L.has_a2a)
    for (int c = 0; c < L.chunks(); ++c)
      for (const BlockCopy& b : unpack_blocks(L, c, M, buf(LayerBuf::kOut, c))) ops.copy(b);
  ops.decode(buf(L.rho > 1 ? LayerBuf::kSummed : LayerBuf::kExpertOut), buf(LayerBuf::kY), T, E,
             L.capacity);
  if (L.output == LayerOutput::kOwnRows)  // the ESP split back to this rank's own rows
    ops.copy(
        rows_copy(buf(LayerBuf::kY), sz(L.own_first), buf(LayerBuf::kYOwn), 0, sz(s.tokens), Mz));
}

}  // namespace

std::int64_t run_forward_step(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, int chunk,
                              const Op& op, LayerOps& ops) {
  const int M = s.model_dim, E = s.experts;
  const int T = L.unit_tokens(s);  // rows of the routing unit
  const std::size_t Mz = sz(M);
  const bool plan_routed = L.routing != LayerRouting::kCapacity;
  const int j = chunk;
  if (L.routing == LayerRouting::kDeepep && kind != OpRoleKind::kGate)
    return run_deepep_step(L, s, kind, op, ops);
  switch (kind) {
    case OpRoleKind::kEspAllGather:  // the ESP group's tokens: the baseline's routing unit
      MOESIM_ASSERT(L.input == GateInput::kGathered,
                    "ESP all-gather of a layer that gates its own");
      {
        // In the data type, as the plan counts it; the gate gets its fp32 copy.
        const std::int64_t algo =
            ops.all_gather(op, buf(LayerBuf::kXOwn), sz(s.tokens) * Mz, buf(LayerBuf::kX));
        ops.widen_tokens(sz(T) * Mz);
        return algo;
      }
    case OpRoleKind::kGate:
      run_gate(L, s, ops);
      return -1;
    case OpRoleKind::kEncode:
      run_encode(L, s, ops);
      return -1;
    case OpRoleKind::kParmLocalDump:  // every chunk's send buffer before the first dispatch
      for (int c = 0; c < L.chunks(); ++c)
        for (const BlockCopy& b : pack_blocks(L, c, M, buf(LayerBuf::kSend, c))) ops.copy(b);
      return -1;
    case OpRoleKind::kDispatch:
      return run_dispatch(L, s, j, op, ops);
    case OpRoleKind::kFc1:
      // W = 1: no dispatch, the chunk is packed straight into the experts' input.
      if (!plan_routed && !L.has_a2a)
        for (const BlockCopy& c : pack_blocks(L, j, M, buf(LayerBuf::kIn, j))) ops.copy(c);
      for (const GemmJob& g : expert_gemms(L, j, false, M)) ops.gemm(g, false);
      ops.relu(buf(LayerBuf::kHidden, j), sz(L.received_rows(j)) * sz(L.hidden));
      return -1;
    case OpRoleKind::kFc2:
      for (const GemmJob& g : expert_gemms(L, j, true, M)) ops.gemm(g, false);
      return -1;
    case OpRoleKind::kEspAllReduce:  // the esp shards' partial outputs summed (baseline)
      return ops.all_reduce(op, buf(LayerBuf::kOut, j), 0, sz(L.received_rows(j)) * Mz);
    case OpRoleKind::kCombine:
    case OpRoleKind::kCombineSaa:
      return run_combine(L, s, j, op, ops);
    case OpRoleKind::kParmLocalCombine:
    case OpRoleKind::kParmJoin:
      MOESIM_ASSERT(L.accumulate_back, "local combine of a layer that copies its returns");
      combine_returned(L, M, ops);
      return -1;
    case OpRoleKind::kParamGather:
      return run_param_gather(L, s, op, ops);
    case OpRoleKind::kPartialSum:
      ops.sum_slices(buf(LayerBuf::kExpertOut), buf(LayerBuf::kSummed), E, L.rho,
                     sz(L.capacity) * Mz);
      return -1;
    case OpRoleKind::kDecode:
      run_decode(L, s, ops);
      return -1;
    case OpRoleKind::kParmMpAllGather:  // every MP share's rows (Parm S1)
      MOESIM_ASSERT(L.output == LayerOutput::kMpGathered, "MP all-gather of a layer without it");
      return ops.all_gather(op, buf(LayerBuf::kY), sz(T) * Mz, buf(LayerBuf::kYOwn));
    default:
      break;
  }
  throw InternalError(
      fmt::format("layer program: op '{}' is not a step of MoE layer {}", op.label, L.moe));
}

}  // namespace moesim::exec
