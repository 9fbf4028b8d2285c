// The MoE layer program (exec/layer_program.hpp): the copies, GEMMs and buffers it computes from
// a layer's layout, worked out by hand on tiny layouts, the steps it issues per op, recorded
// through a LayerOps that only logs (the host and GPU paths run these lists as they are, so these
// tests pin the indexing both paths share), and a whole layer's forward and backward run on one
// rank against the independent reference (the outcome; the multi-rank layouts' outcomes are the
// `exec --check` tests under mpirun).
#include "exec/layer_program.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario_loader.hpp"
#include "exec/host_layer.hpp"
#include "exec/moe_data.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {
namespace {

using B = LayerBuf;

LayerLayout plain(int W, int dE, std::vector<int> caps, int H) {
  LayerLayout L;
  L.ep = W;
  L.slices = dE;
  L.hidden = H;
  L.has_a2a = W > 1;
  L.caps = caps;
  int off = 0;
  for (int c : caps) {
    L.offset.push_back(off);
    off += c;
  }
  L.capacity = off;
  fill_capacity_blocks(L);
  return L;
}

LayerLayout sharded(int E, int n, int rho, std::vector<int> caps, int H) {
  LayerLayout L = plain(E * n, 1, std::move(caps), H / rho);
  L.shards = n;
  L.rho = rho;
  fill_capacity_blocks(L);
  return L;
}

BlockCopy copy(BufId src, std::size_t src_off, std::size_t src_pitch, BufId dst,
               std::size_t dst_off, std::size_t dst_pitch, std::size_t run, int count) {
  BlockCopy c;
  c.src = src;
  c.dst = dst;
  c.src_off = src_off;
  c.src_pitch = src_pitch;
  c.dst_off = dst_off;
  c.dst_pitch = dst_pitch;
  c.run = run;
  c.count = count;
  return c;
}

// Applies copies to element-indexed buffers (the value of element i of a source is i).
void apply(const std::vector<BlockCopy>& copies, const std::vector<float>& src,
           std::vector<float>& dst) {
  for (const BlockCopy& c : copies)
    for (int r = 0; r < c.count; ++r)
      for (std::size_t e = 0; e < c.run; ++e)
        dst.at(c.dst_off + r * c.dst_pitch + e) = src.at(c.src_off + r * c.src_pitch + e);
}

TEST(LayerProgram, PlainChunkPacksInOneTwoDimensionalCopy) {
  // W 2, dE 2 (E 4), chunks of 3 and 2 slots (C 5), M 4: chunk j is E runs of c_j rows, pitch
  // C * M in the (E, C, M) buffer and c_j * M in the send buffer.
  const LayerLayout L = plain(2, 2, {3, 2}, 5);
  EXPECT_EQ(pack_blocks(L, 0, 4, {B::kSend, 0}),
            std::vector<BlockCopy>{copy({B::kDispatched}, 0, 20, {B::kSend, 0}, 0, 12, 12, 4)});
  EXPECT_EQ(pack_blocks(L, 1, 4, {B::kSend, 1}),
            std::vector<BlockCopy>{copy({B::kDispatched}, 12, 20, {B::kSend, 1}, 0, 8, 8, 4)});
  // unpack: the same runs from the returned buffer into the expert outputs.
  EXPECT_EQ(unpack_blocks(L, 1, 4, {B::kBack, 1}),
            std::vector<BlockCopy>{copy({B::kBack, 1}, 0, 8, {B::kExpertOut}, 12, 20, 8, 4)});
}

TEST(LayerProgram, ShardedChunkSendsEachMemberItsShareOfTheSlots) {
  // E 2, n 2, rho 1 (P1: g 2), chunks {2, 2}, M 1. Chunk 1 (slots 2..3), one row per member:
  // p 0 -> expert 0 slot 2, p 1 -> expert 0 slot 3, p 2 -> expert 1 slot 2 (element 6), p 3 ->
  // expert 1 slot 3. Two runs of two rows, since expert 1's slots do not continue expert 0's.
  const LayerLayout L = sharded(2, 2, 1, {2, 2}, 8);
  EXPECT_EQ(L.block_rows(1), 1);
  EXPECT_EQ(pack_blocks(L, 1, 1, {B::kSend, 1}),
            (std::vector<BlockCopy>{copy({B::kDispatched}, 2, 1, {B::kSend, 1}, 0, 1, 1, 2),
                                    copy({B::kDispatched}, 6, 1, {B::kSend, 1}, 2, 1, 1, 2)}));
}

TEST(LayerProgram, HiddenSlicesGetTheirOwnCopyOfEveryExpertsSlots) {
  // E 2, n 4, rho 2 (g 2), one chunk of 4 slots, M 1: (E, rho, C) = 16 elements. Position p = x
  // n + q g + i gets slots [2 i, 2 i + 2) of copy q of expert x, i.e. element ((x rho + q) C +
  // 2 i): p 0..7 -> 0, 2, 4, 6, 8, 10, 12, 14, each 2 rows.
  const LayerLayout L = sharded(2, 4, 2, {4}, 8);
  const auto copies = pack_blocks(L, 0, 1, {B::kSend, 0});
  std::vector<float> src(16), dst(16, -1);
  for (int i = 0; i < 16; ++i) src[i] = static_cast<float>(i);
  apply(copies, src, dst);
  EXPECT_EQ(dst, src);  // every source slot lands once, in destination order
  // A layout where positions skip slots: E 2, n 4, rho 1 (g 4), chunks {4, 4}, chunk 1 (slots
  // 4..7), one row per member: p = 4 x + i -> element x C + 4 + i, C = 8.
  const LayerLayout P1 = sharded(2, 4, 1, {4, 4}, 8);
  std::vector<float> big(16), got(8, -1);
  for (int i = 0; i < 16; ++i) big[i] = static_cast<float>(i);
  apply(pack_blocks(P1, 1, 1, {B::kSend, 1}), big, got);
  EXPECT_EQ(got, (std::vector<float>{4, 5, 6, 7, 12, 13, 14, 15}));
}

TEST(LayerProgram, ExpertGemmsBatchEverySourceBlockOfASlice) {
  // W 2, dE 2, c 3, M 4, H 5: In is (W, dE, c, M); slice le's blocks start at le c M and repeat
  // every dE c M elements (one per source).
  const LayerLayout L = plain(2, 2, {3}, 5);
  const auto fc1 = expert_gemms(L, 0, false, 4);
  ASSERT_EQ(fc1.size(), 2u);
  EXPECT_EQ(fc1[1].a, (BufId{B::kIn, 0}));
  EXPECT_EQ(fc1[1].b, (BufId{B::kW1, 1}));
  EXPECT_EQ(fc1[1].c, (BufId{B::kHidden, 0}));
  EXPECT_EQ(fc1[1].a_off, 12u);
  EXPECT_EQ(fc1[1].a_stride, 24);
  EXPECT_EQ(fc1[1].c_off, 15u);
  EXPECT_EQ(fc1[1].c_stride, 30);
  EXPECT_EQ(fc1[1].m, 3);
  EXPECT_EQ(fc1[1].n, 5);
  EXPECT_EQ(fc1[1].k, 4);
  EXPECT_EQ(fc1[1].batch, 2);
  const auto fc2 = expert_gemms(L, 0, true, 4);
  ASSERT_EQ(fc2.size(), 2u);
  EXPECT_EQ(fc2[0].b, (BufId{B::kW2, 0}));
  EXPECT_EQ(fc2[1].a_off, 15u);
  EXPECT_EQ(fc2[1].a_stride, 30);
  EXPECT_EQ(fc2[1].c_off, 12u);
  EXPECT_EQ(fc2[1].c_stride, 24);
  EXPECT_EQ(fc2[1].n, 4);
  EXPECT_EQ(fc2[1].k, 5);
}

TEST(LayerProgram, PlanRoutedGemmsFollowTheReceivedRuns) {
  LayerLayout L;
  L.routing = LayerRouting::kPlan;
  L.ep = 2;
  L.slices = 2;
  L.hidden = 6;
  L.send_rows = {4};
  L.send_first = {0};
  L.runs = {{{2, 1}, {0, 0}, {3, 0}}};
  EXPECT_EQ(L.received_rows(0), 5);
  const auto fc1 = expert_gemms(L, 0, false, 4);
  ASSERT_EQ(fc1.size(), 2u);  // the empty run has no GEMM
  EXPECT_EQ(fc1[0].b, (BufId{B::kW1, 1}));
  EXPECT_EQ(fc1[0].m, 2);
  EXPECT_EQ(fc1[1].b, (BufId{B::kW1, 0}));
  EXPECT_EQ(fc1[1].a_off, 8u);   // row 2 of M 4
  EXPECT_EQ(fc1[1].c_off, 12u);  // row 2 of H 6
  EXPECT_EQ(fc1[1].m, 3);
  EXPECT_EQ(fc1[1].batch, 1);
}

std::map<BufId, std::size_t> sizes(const LayerLayout& L, const MoeShape& s) {
  std::map<BufId, std::size_t> m;
  for (const BufferSize& b : layer_buffers(L, s)) {
    EXPECT_FALSE(m.count(b.id)) << layer_buf_name(b.id.buf) << " listed twice";
    m[b.id] = b.elements;
  }
  return m;
}

TEST(LayerProgram, BuffersAreSizedFromTheLayout) {
  MoeShape s{6, 4, 8, 4, 2};  // S 6, M 4, H 8, E 4, k 2
  const auto p = sizes(plain(2, 2, {3, 2}, 8), s);
  EXPECT_EQ(p.at({B::kDispatched}), 4u * 5 * 4);
  EXPECT_EQ(p.at({B::kSlotEntry}), 4u * 5);
  EXPECT_EQ(p.at({B::kSend, 1}), 2u * 2 * 2 * 4);    // W dE c_1 M
  EXPECT_EQ(p.at({B::kHidden, 0}), 2u * 2 * 3 * 8);  // W dE c_0 H
  EXPECT_EQ(p.at({B::kW1, 1}), 4u * 8);
  EXPECT_FALSE(p.count({B::kSummed}));
  EXPECT_FALSE(p.count({B::kParamIn}));
  // W 1: no all-to-all, so no send / back buffers.
  const auto local = sizes(plain(1, 4, {5}, 8), s);
  EXPECT_FALSE(local.count({B::kSend, 0}));
  EXPECT_FALSE(local.count({B::kBack, 0}));
  EXPECT_EQ(local.at({B::kIn, 0}), 4u * 5 * 4);
  // Sharded E 4 x n 2, rho 2 (g 1): rho copies, a sum buffer, slices of H / 2, no gather.
  MoeShape s2{6, 4, 8, 4, 2};
  const auto r2 = sizes(sharded(4, 2, 2, {2}, 8), s2);
  EXPECT_EQ(r2.at({B::kDispatched}), 4u * 2 * 2 * 4);
  EXPECT_EQ(r2.at({B::kSummed}), 4u * 2 * 4);
  EXPECT_EQ(r2.at({B::kW1, 0}), 4u * 4);
  EXPECT_FALSE(r2.count({B::kParamIn}));
  // rho 1 (g 2): the gather's own slice (2 M H / n) and the gathered g of them.
  const auto r1 = sizes(sharded(4, 2, 1, {2}, 8), s2);
  EXPECT_EQ(r1.at({B::kParamIn}), 2u * 4 * 4);
  EXPECT_EQ(r1.at({B::kParamAll}), 2u * 2 * 4 * 4);
  EXPECT_EQ(r1.at({B::kIn, 0}), 8u * 1 * 4);  // W (c / g) M
}

// A backend that records the steps it is given.
class RecordingOps final : public LayerOps {
 public:
  std::vector<std::string> log;
  std::vector<BlockCopy> copies;
  std::vector<Exchange> exchanges;
  void gate(const kernels::GateParams& p) override {
    log.push_back("gate C" + std::to_string(p.capacity));
  }
  void routed_weights(BufId logits, BufId, BufId weight, int, int, int) override {
    log.push_back(std::string("routed_weights ") + layer_buf_name(logits.buf) + "->" +
                  layer_buf_name(weight.buf));
  }
  void gather_rows(BufId src, BufId dst, BufId index, int rows, std::size_t) override {
    log.push_back(std::string("gather ") + layer_buf_name(src.buf) + "->" +
                  layer_buf_name(dst.buf) + " by " + layer_buf_name(index.buf) + " " +
                  std::to_string(rows));
  }
  void sum_rows(BufId src, BufId dst, BufId table, int rows, int terms, std::size_t, bool weighted,
                BufId) override {
    log.push_back(std::string("sum ") + layer_buf_name(src.buf) + "->" + layer_buf_name(dst.buf) +
                  " by " + layer_buf_name(table.buf) + " " + std::to_string(rows) + "<-" +
                  std::to_string(terms) + (weighted ? " weighted" : ""));
  }
  void widen(BufId src, BufId dst, std::size_t n) override {
    log.push_back(std::string("widen ") + layer_buf_name(src.buf) + "->" + layer_buf_name(dst.buf) +
                  " " + std::to_string(n));
  }
  void encode(BufId dst, int t, int e, int c) override {
    log.push_back(std::string("encode ") + layer_buf_name(dst.buf) + " " + std::to_string(t) + ":" +
                  std::to_string(e) + "x" + std::to_string(c));
  }
  void decode(BufId src, BufId dst, int t, int e, int c) override {
    log.push_back(std::string("decode ") + layer_buf_name(src.buf) + "->" +
                  layer_buf_name(dst.buf) + " " + std::to_string(t) + ":" + std::to_string(e) +
                  "x" + std::to_string(c));
  }
  void widen_tokens(std::size_t n) override { log.push_back("widen " + std::to_string(n)); }
  void zero(BufId b, std::size_t n) override {
    log.push_back(std::string("zero ") + layer_buf_name(b.buf) + " " + std::to_string(n));
  }
  void copy(const BlockCopy& c) override {
    copies.push_back(c);
    log.push_back(std::string("copy ") + layer_buf_name(c.src.buf) + "->" +
                  layer_buf_name(c.dst.buf));
  }
  void gemm(const GemmJob& g, bool f32) override {
    log.push_back(std::string(f32 ? "gemm32 " : "gemm ") + layer_buf_name(g.b.buf));
  }
  void relu(BufId b, std::size_t n) override {
    log.push_back(std::string("relu ") + layer_buf_name(b.buf) + " " + std::to_string(n));
  }
  void sum_slices(BufId, BufId, int groups, int terms, std::size_t run) override {
    log.push_back("sum " + std::to_string(groups) + "x" + std::to_string(terms) + "x" +
                  std::to_string(run));
  }
  std::int64_t exchange(const Op&, const Exchange& x) override {
    exchanges.push_back(x);
    log.push_back(std::string("exchange ") + layer_buf_name(x.send.buf) + "->" +
                  layer_buf_name(x.recv.buf));
    return 7;
  }
  std::int64_t all_gather(const Op&, BufId in, std::size_t n, BufId out) override {
    log.push_back(std::string("all_gather ") + layer_buf_name(in.buf) + "->" +
                  layer_buf_name(out.buf) + " " + std::to_string(n));
    return 3;
  }
  std::int64_t all_reduce(const Op&, BufId b, std::size_t offset, std::size_t n) override {
    log.push_back(std::string("all_reduce ") + layer_buf_name(b.buf) +
                  (offset ? "+" + std::to_string(offset) : "") + " " + std::to_string(n));
    return 5;
  }
  std::int64_t reduce_scatter(const Op&, BufId in, std::size_t n, BufId out) override {
    log.push_back(std::string("reduce_scatter ") + layer_buf_name(in.buf) + "->" +
                  layer_buf_name(out.buf) + " " + std::to_string(n));
    return 6;
  }
  void decode_backward(BufId out, BufId d_out, int t, int e, int c) override {
    log.push_back(std::string("decode_backward ") + layer_buf_name(out.buf) + "->" +
                  layer_buf_name(d_out.buf) + " " + std::to_string(t) + ":" + std::to_string(e) +
                  "x" + std::to_string(c));
  }
  void encode_backward(BufId d_slots, int t, int e, int c) override {
    log.push_back(std::string("encode_backward ") + layer_buf_name(d_slots.buf) + " " +
                  std::to_string(t) + ":" + std::to_string(e) + "x" + std::to_string(c));
  }
  void relu_backward(BufId act, BufId grad, std::size_t n) override {
    log.push_back(std::string("relu_backward ") + layer_buf_name(act.buf) + "->" +
                  layer_buf_name(grad.buf) + " " + std::to_string(n));
  }
  void softmax_backward(BufId logits, BufId expert, BufId, BufId d_logits, int t, int e,
                        int k) override {
    log.push_back(std::string("softmax_backward ") + layer_buf_name(logits.buf) + "->" +
                  layer_buf_name(d_logits.buf) + " by " + layer_buf_name(expert.buf) + " " +
                  std::to_string(t) + ":" + std::to_string(e) + "x" + std::to_string(k));
  }
  void narrow(BufId src, BufId dst, std::size_t n) override {
    log.push_back(std::string("narrow ") + layer_buf_name(src.buf) + "->" +
                  layer_buf_name(dst.buf) + " " + std::to_string(n));
  }
  void dot_rows(BufId a, BufId, BufId b, int rows, std::size_t, BufId, BufId out) override {
    log.push_back(std::string("dot_rows ") + layer_buf_name(a.buf) + "." + layer_buf_name(b.buf) +
                  "->" + layer_buf_name(out.buf) + " " + std::to_string(rows));
  }
};

TEST(LayerProgram, PlainStepsIssueTheKernelsAndTheExchange) {
  const MoeShape s{6, 4, 8, 4, 2};
  const LayerLayout L = plain(2, 2, {3, 2}, 8);
  const Op op;
  RecordingOps ops;
  EXPECT_EQ(run_forward_step(L, s, OpRoleKind::kGate, -1, op, ops), -1);
  EXPECT_EQ(run_forward_step(L, s, OpRoleKind::kEncode, -1, op, ops), -1);
  EXPECT_EQ(run_forward_step(L, s, OpRoleKind::kDispatch, 1, op, ops), 7);
  run_forward_step(L, s, OpRoleKind::kFc1, 1, op, ops);
  run_forward_step(L, s, OpRoleKind::kFc2, 1, op, ops);
  EXPECT_EQ(run_forward_step(L, s, OpRoleKind::kCombine, 1, op, ops), 7);
  run_forward_step(L, s, OpRoleKind::kDecode, -1, op, ops);
  EXPECT_EQ(ops.log,
            (std::vector<std::string>{"gate C5", "encode dispatched 6:4x5", "copy dispatched->send",
                                      "exchange send->in", "gemm w1", "gemm w1",
                                      "relu hidden 64",  // W dE c_1 H = 2 2 2 8
                                      "gemm w2", "gemm w2", "exchange out->back",
                                      "copy back->expert_out", "decode expert_out->y 6:4x5"}));
  ASSERT_EQ(ops.exchanges.size(), 2u);
  EXPECT_EQ(ops.exchanges[0].send_elems, 2u * 2 * 2 * 4);
  EXPECT_EQ(ops.exchanges[0].recv_elems, 2u * 2 * 2 * 4);
  EXPECT_EQ(ops.exchanges[0].row_elems, 0u);
  // A step that is not the layer's throws (a plan the program does not describe).
  EXPECT_THROW(run_forward_step(L, s, OpRoleKind::kEspAllGather, -1, op, ops), InternalError);
}

TEST(LayerProgram, LocalExpertsSkipTheExchanges) {
  const MoeShape s{6, 4, 8, 4, 2};
  const LayerLayout L = plain(1, 4, {5}, 8);
  const Op op;
  RecordingOps ops;
  run_forward_step(L, s, OpRoleKind::kFc1, 0, op, ops);
  run_forward_step(L, s, OpRoleKind::kFc2, 0, op, ops);
  run_forward_step(L, s, OpRoleKind::kDecode, -1, op, ops);
  // The outputs are placed at the decode (after an ESP all-reduce of them, where there is one).
  EXPECT_EQ(ops.log, (std::vector<std::string>{
                         "copy dispatched->in", "gemm w1", "gemm w1", "gemm w1", "gemm w1",
                         "relu hidden 160", "gemm w2", "gemm w2", "gemm w2", "gemm w2",
                         "copy out->expert_out", "decode expert_out->y 6:4x5"}));
}

TEST(LayerProgram, ShardedStepsReplicateGatherAndSum) {
  const MoeShape s{6, 4, 8, 4, 2};
  const Op op;
  RecordingOps ops;
  const LayerLayout r2 = sharded(4, 2, 2, {2}, 8);  // rho 2
  run_forward_step(r2, s, OpRoleKind::kEncode, -1, op, ops);
  run_forward_step(r2, s, OpRoleKind::kPartialSum, -1, op, ops);
  run_forward_step(r2, s, OpRoleKind::kDecode, -1, op, ops);
  EXPECT_EQ(ops.log, (std::vector<std::string>{"encode summed 6:4x2", "copy summed->dispatched",
                                               "copy summed->dispatched", "sum 4x2x8",
                                               "decode summed->y 6:4x2"}));
  // Copy q of the encode lands every C M = 8 elements at q C M, pitch rho C M = 16.
  EXPECT_EQ(ops.copies[1], copy({B::kSummed}, 0, 8, {B::kDispatched}, 8, 16, 8, 4));
  RecordingOps gather;
  const LayerLayout r1 = sharded(4, 2, 1, {2}, 8);  // g 2, h = H / n = 4
  EXPECT_EQ(run_forward_step(r1, s, OpRoleKind::kParamGather, -1, op, gather), 3);
  // The gather, then per member its W1 columns (M runs of h, pitch h -> hq) and W2 rows.
  EXPECT_EQ(gather.log, (std::vector<std::string>{"all_gather param_in->param_all 32",
                                                  "copy param_all->w1", "copy param_all->w2",
                                                  "copy param_all->w1", "copy param_all->w2"}));
  EXPECT_EQ(gather.copies[2], copy({B::kParamAll}, 32, 4, {B::kW1}, 4, 8, 4, 4));
  EXPECT_EQ(gather.copies[3], copy({B::kParamAll}, 48, 0, {B::kW2}, 16, 0, 16, 1));
}

// Parm's routing units: the baseline gates its ESP group's gathered tokens and keeps its own
// rows of the output; S1 gates an MP share and all-gathers the outputs; the fused schedules sum
// what the combine returns (the esp partials) in the local combine, into a zeroed buffer.
TEST(LayerProgram, ParmRoutingUnitsAndLocalCombine) {
  const MoeShape s{6, 4, 8, 4, 2};  // S 6, M 4
  const Op op;
  LayerLayout base = plain(2, 2, {2}, 8);
  base.input = GateInput::kGathered;
  base.gate_tokens = 12;  // esp 2 x S
  base.output = LayerOutput::kOwnRows;
  base.own_first = 6;
  RecordingOps b;
  run_forward_step(base, s, OpRoleKind::kEspAllGather, -1, op, b);
  run_forward_step(base, s, OpRoleKind::kGate, -1, op, b);
  run_forward_step(base, s, OpRoleKind::kDecode, -1, op, b);
  EXPECT_EQ(b.log, (std::vector<std::string>{"all_gather x_own->x 24", "widen 48", "gate C2",
                                             "decode expert_out->y 12:4x2", "copy y->y_own"}));
  EXPECT_EQ(b.copies.back(), copy({B::kY}, 24, 0, {B::kYOwn}, 0, 0, 24, 1));
  EXPECT_EQ(base.output_buffer(), B::kYOwn);

  LayerLayout s1 = plain(2, 2, {2}, 8);
  s1.input = GateInput::kOwnRows;
  s1.gate_tokens = 3;  // MP share 1 of 2
  s1.gate_first = 3;
  s1.output = LayerOutput::kMpGathered;
  s1.accumulate_back = true;
  s1.combine_op = true;
  RecordingOps r;
  run_forward_step(s1, s, OpRoleKind::kGate, -1, op, r);
  run_forward_step(s1, s, OpRoleKind::kEncode, -1, op, r);
  run_forward_step(s1, s, OpRoleKind::kCombine, 0, op, r);
  run_forward_step(s1, s, OpRoleKind::kParmLocalCombine, -1, op, r);
  run_forward_step(s1, s, OpRoleKind::kDecode, -1, op, r);
  run_forward_step(s1, s, OpRoleKind::kParmMpAllGather, -1, op, r);
  EXPECT_EQ(r.log, (std::vector<std::string>{
                       "copy x_own->x", "widen 12", "gate C2", "zero expert_out 32",
                       "encode dispatched 3:4x2", "exchange out->back", "copy back->expert_out",
                       "decode expert_out->y 3:4x2", "all_gather y->y_own 12"}));
  EXPECT_EQ(r.copies[0], copy({B::kXOwn}, 12, 0, {B::kX}, 0, 0, 12, 1));
  EXPECT_TRUE(r.copies[1].accumulate);
  // The local combine's sums are the combine's copies, summed: one 2-D run over the 4 experts.
  EXPECT_EQ(r.copies[1].count, 4);
}

TEST(LayerProgram, PlanRoutedStepsMoveRowsOfTheSendBuffer) {
  const MoeShape s{6, 4, 8, 4, 2};
  LayerLayout L;
  L.routing = LayerRouting::kPlan;
  L.ep = 2;
  L.slices = 1;
  L.hidden = 8;
  L.send_rows = {3, 5};
  L.send_first = {0, 3};
  L.runs = {{{4, 0}}, {{1, 0}}};
  const Op op;
  RecordingOps ops;
  run_forward_step(L, s, OpRoleKind::kGate, -1, op, ops);
  run_forward_step(L, s, OpRoleKind::kEncode, -1, op, ops);
  run_forward_step(L, s, OpRoleKind::kDispatch, 1, op, ops);
  run_forward_step(L, s, OpRoleKind::kCombine, 1, op, ops);
  run_forward_step(L, s, OpRoleKind::kDecode, -1, op, ops);
  EXPECT_EQ(ops.log, (std::vector<std::string>{"gemm32 gate_w", "routed_weights logits->weight",
                                               "encode send 6:1x8", "exchange send->in",
                                               "exchange out->back", "decode back->y 6:1x8"}));
  // Chunk 1: rows 3..7 of the send buffer go, 1 row comes in; the combine is the transpose.
  EXPECT_EQ(ops.exchanges[0].send_off, 12u);
  EXPECT_EQ(ops.exchanges[0].send_elems, 20u);
  EXPECT_EQ(ops.exchanges[0].recv_elems, 4u);
  EXPECT_EQ(ops.exchanges[0].row_elems, 4u);
  EXPECT_EQ(ops.exchanges[1].recv_off, 12u);
  EXPECT_EQ(ops.exchanges[1].recv_elems, 20u);
}

// A deepep layer (exec/deepep_path.hpp) after its gate: the source's node rows gathered, the
// dispatch as its two phases with the forwarder's gathers between them, the target's weights
// recomputed (fp32 gate GEMM of its rows), its entries gathered, the expert GEMMs per run, the
// weighted sum per row, the combine as the two phases reversed with the forwarder's sums between
// them, and the node rows added into the output. Buffers sized from the layout's row counts.
TEST(LayerProgram, DeepepLayerRunsBothPhasesWithTheRowWorkBetween) {
  const MoeShape s{6, 4, 8, 4, 2};  // S 6, M 4, H 8, E 4, k 2
  LayerLayout L;
  L.routing = LayerRouting::kDeepep;
  L.ep = 4;
  L.slices = 2;
  L.hidden = 8;
  L.deepep = {3, 2, 5, 4, 6, 1, 4};  // send, fwd_in, fwd_out, tok, entries, own, node terms
  L.runs = {{{4, 0}, {2, 1}}};
  const auto sz = sizes(L, s);
  EXPECT_EQ(sz.at({LayerBuf::kSend}), 3u * 4);
  EXPECT_EQ(sz.at({LayerBuf::kNodeOut}), 2u * 4);
  EXPECT_EQ(sz.at({LayerBuf::kFwdBack}), 5u * 4);
  EXPECT_EQ(sz.at({LayerBuf::kTokIn32}), 4u * 4);
  EXPECT_EQ(sz.at({LayerBuf::kTokLogits}), 4u * 4);
  EXPECT_EQ(sz.at({LayerBuf::kTokWeight}), 4u * 2);
  EXPECT_EQ(sz.at({LayerBuf::kTokSum}), 4u + 1 + 2 * 6);  // begin, source rows, weights
  EXPECT_EQ(sz.at({LayerBuf::kOwnSum}), 6u + 1 + 1);
  EXPECT_EQ(sz.at({LayerBuf::kNodeSum}), 2u + 1 + 4);
  EXPECT_EQ(sz.at({LayerBuf::kBackSum}), 6u + 1 + 3);
  EXPECT_EQ(sz.at({LayerBuf::kHidden, 0}), 6u * 8);
  const Op op;
  RecordingOps ops;
  for (OpRoleKind kind :
       {OpRoleKind::kGate, OpRoleKind::kEncode, OpRoleKind::kDispatch, OpRoleKind::kFc1,
        OpRoleKind::kFc2, OpRoleKind::kCombine, OpRoleKind::kDecode})
    run_forward_step(L, s, kind, 0, op, ops);
  EXPECT_EQ(ops.log, (std::vector<std::string>{"gemm32 gate_w",
                                               "routed_weights logits->weight",
                                               "gather x->send by send_idx 3",
                                               "exchange send->fwd_in",
                                               "gather x->fwd_out by fwd_own_idx 5",
                                               "gather fwd_in->fwd_out by fwd_in_idx 5",
                                               "exchange fwd_out->tok_in",
                                               "widen tok_in->tok_in32 16",
                                               "gemm32 gate_w",
                                               "routed_weights tok_logits->tok_weight",
                                               "gather tok_in->in by entry_row 6",
                                               "gemm w1",
                                               "gemm w1",
                                               "relu hidden 48",
                                               "gemm w2",
                                               "gemm w2",
                                               "zero tok_out 16",
                                               "sum out->tok_out by tok_sum 4<-6 weighted",
                                               "exchange tok_out->fwd_back",
                                               "zero y 24",
                                               "zero node_out 8",
                                               "sum fwd_back->y by own_sum 6<-1",
                                               "sum fwd_back->node_out by node_sum 2<-4",
                                               "exchange node_out->back",
                                               "sum back->y by back_sum 6<-3"}));
  ASSERT_EQ(ops.exchanges.size(), 4u);
  // Phase 0 then phase 1 of the dispatch, and of the combine; rows of M = 4 elements.
  const std::vector<std::pair<int, std::size_t>> want{{0, 12}, {1, 20}, {0, 16}, {1, 8}};
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ops.exchanges[i].first_phase, want[i].first) << i;
    EXPECT_EQ(ops.exchanges[i].phase_count, 1) << i;
    EXPECT_EQ(ops.exchanges[i].send_elems, want[i].second) << i;
    EXPECT_EQ(ops.exchanges[i].row_elems, 4u) << i;
  }
  EXPECT_EQ(ops.exchanges[1].recv_elems, 16u);  // the target's 4 token rows
  EXPECT_EQ(ops.exchanges[3].recv_elems, 12u);  // the source's 3 node rows
}

// One rank with no peer: what a layer whose experts are all local (W = 1) needs.
class SelfCommunicator final : public Communicator {
 public:
  std::string_view name() const override { return "self"; }
  void exchange(std::span<const SendSpec>, std::span<const RecvSpec>, int) override {
    FAIL() << "a W = 1 layer exchanges nothing";
  }
  void all_to_allv(const std::byte*, std::span<const std::size_t>, std::span<const std::size_t>,
                   std::byte*, std::span<const std::size_t>, std::span<const std::size_t>,
                   std::span<const int>) override {
    FAIL() << "a W = 1 layer exchanges nothing";
  }
  void all_reduce_sum(float*, std::size_t, std::span<const int>) override {}
  void all_gather(const std::byte* in, std::size_t bytes, std::byte* out,
                  std::span<const int>) override {
    std::copy_n(in, bytes, out);
  }
  void reduce_scatter_sum(const float* in, float* out, std::size_t count,
                          std::span<const int>) override {
    std::copy_n(in, count, out);
  }
  void barrier() override {}
};

// The program run for real on one rank (HostLayerOps, the CPU kernels): a layer of 4 local
// experts in 2 chunks, forward then backward, against the independent reference (plain loops in
// double, moe_data.hpp). The outcome, not the list of steps: the output, the drops, and every
// gradient (dX, dWgate, dW1, dW2), after 2 passes (the parameter gradients accumulate).
TEST(LayerProgram, ForwardAndBackwardOnOneRankMatchTheReference) {
  const Scenario sc = parse_scenario_string(R"(
name: one-gpu
cluster: {gpu: a100-sxm-80gb, nodes: 1, gpus_per_node: 1,
          intra_node: {kind: nvswitch, bandwidth: 300GB/s, latency: 1us}}
model: {layers: 1, batch_per_gpu: 1, seq_len: 24, model_dim: 8, hidden_dim: 12,
        experts_per_gpu: 4, top_k: 2, capacity_factor: 1.0, dtype: fp32}
parallelism: {ep: 1}
strategies: [{name: baseline}]
)",
                                            "one-gpu.yaml");
  const auto topo = topology::build_topology(sc.cluster);
  collectives::CostContext cost;
  cost.topo = topo.get();
  const MoeShape s{24, 8, 12, 4, 2};
  const int C = 10;  // 48 choices for 40 slots: some drop
  const std::uint64_t seed = 17;
  LayerLayout L = plain(1, 4, {6, 4}, s.hidden_dim);
  L.backward = true;
  HostLayerBuffers b;
  b.allocate(L, s);
  b.f({B::kX32}) = make_tokens(s, seed, 0, 0, 0);
  b.f({B::kGateW}) = make_gate_weights(s, seed, 0);
  b.f({B::kDY}) = make_grad_output(s, seed, 0, 0, 0);
  std::vector<std::vector<float>> w1, w2;
  for (int e = 0; e < s.experts; ++e) {
    w1.push_back(b.f({B::kW1, e}) = make_w1(s, seed, 0, e));
    w2.push_back(b.f({B::kW2, e}) = make_w2(s, seed, 0, e));
  }
  SelfCommunicator comm;
  Plan plan;
  HostLayerOps ops(comm, cost, *topo, plan, s, b);
  const Op op;
  const int passes = 2;
  for (int pass = 0; pass < passes; ++pass) {
    run_forward_step(L, s, OpRoleKind::kGate, -1, op, ops);
    run_forward_step(L, s, OpRoleKind::kEncode, -1, op, ops);
    for (int j = 0; j < 2; ++j) {
      run_forward_step(L, s, OpRoleKind::kFc1, j, op, ops);
      run_forward_step(L, s, OpRoleKind::kFc2, j, op, ops);
    }
    run_forward_step(L, s, OpRoleKind::kDecode, -1, op, ops);
    run_backward_step(L, s, OpRoleKind::kDecode, -1, op, ops);
    for (int j = 0; j < 2; ++j) {
      run_backward_step(L, s, OpRoleKind::kFc2, j, op, ops);
      run_backward_step(L, s, OpRoleKind::kFc1, j, op, ops);
    }
    run_backward_step(L, s, OpRoleKind::kEncode, -1, op, ops);
    run_backward_step(L, s, OpRoleKind::kGate, -1, op, ops);
  }
  const std::vector<float>& x = b.f({B::kX32});
  long long dropped = 0;
  const std::vector<float> y = reference_layer(s, x, b.f({B::kGateW}), w1, w2, C, &dropped);
  ASSERT_GT(dropped, 0);
  long long kernel_dropped = 0;
  for (int sl : b.i({B::kSlot})) kernel_dropped += sl < 0 ? 1 : 0;
  EXPECT_EQ(kernel_dropped, dropped);
  auto expect_near = [](const std::vector<float>& got, const std::vector<double>& want,
                        double scale, const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (std::size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], scale * want[i], 1e-4 * (1 + std::fabs(scale * want[i])))
          << what << "[" << i << "]";
  };
  expect_near(b.f({B::kY}), std::vector<double>(y.begin(), y.end()), 1, "y");
  const ReferenceGrads g = reference_backward(s, x, b.f({B::kGateW}), w1, w2, b.f({B::kDY}), C);
  expect_near(b.f({B::kDX32}), g.dx, 1, "dX");  // the last pass's
  expect_near(b.f({B::kDGateW}), g.dgate_w, passes, "dWgate");
  const std::vector<float>& dw = b.f({B::kDW});
  const std::size_t per = static_cast<std::size_t>(s.model_dim) * s.hidden_dim;
  for (int e = 0; e < s.experts; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    expect_near(std::vector<float>(dw.begin() + e * per, dw.begin() + (e + 1) * per), g.dw1[e],
                passes, "dW1");
    expect_near(std::vector<float>(dw.begin() + (s.experts + e) * per,
                                   dw.begin() + (s.experts + e + 1) * per),
                g.dw2[e], passes, "dW2");
  }
}

}  // namespace
}  // namespace moesim::exec
