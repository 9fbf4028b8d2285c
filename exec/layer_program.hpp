// The MoE layer program (docs/design.md §4.2): the forward MoE layer written ONCE, as
// typed steps over a small backend interface, and run by the host path and the GPU path alike.
//
//  - LayerLayout is the typed record of one layer as a rank runs it: how tokens are routed
//    (the capacity gate, or the plan's routed all_to_allv), the EP group, the expert slices this
//    rank computes (dE whole experts, or one hidden slice of a sharded expert), the chunks and
//    their capacities. The data paths differ only in the layout they build:
//      plain    capacity gate, dE whole experts per EP position, rho = n = 1;
//      sharded  capacity gate, expert x on n positions, rho hidden slices (Tutel P1 / P2 / rho);
//      routed   the plan's all_to_allv matrices decide which rows go where (routing strategies,
//               dropless capacity, inference placement; exec/routed_path.hpp).
//  - layer_buffers() lists the layer's buffers and their element counts, so the host path
//    allocates vectors and the GPU path reserves one arena from the same list.
//  - run_forward_step() is the program: for one op of the plan (gate, encode, dispatch chunk j,
//    fc1, fc2, combine, partial sum, parameter gather, decode) it issues the backend steps
//    (LayerOps): gate kernels, encode / decode kernels, 2-D block copies, strided-batched GEMMs,
//    an activation, a slice sum, the lowered collective of the plan's op. Which rows move where
//    is computed here (pack_blocks, expert_gemms), from the layout alone, so the CPU tests of
//    the host path exercise exactly the indexing the GPU runs.
//
// The check's reference (exec/moe_data.hpp) does NOT run this program: it recomputes the layer
// with plain loops from the seeds, so that a wrong index here cannot hide behind a reference that
// shares it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/plan.hpp"
#include "exec/moe_data.hpp"

namespace moesim::exec {

/// The buffers of one layer. Element type: kF32 always fp32 (the gate's inputs and outputs, the
/// routing weights), kI32 int32 (routing tables), kData the run's dtype (fp32 on the host path).
enum class LayerBuf : std::uint8_t {
  // S below is the layer's routing unit, LayerLayout::unit_tokens(): the rows one gate call sees.
  kX32,           // S x M tokens, fp32 (the gate's input)
  kX,             // S x M tokens, data (the encode's input; the host path aliases kX32)
  kGateW,         // M x E, fp32
  kLogits,        // S x E, fp32
  kExpert,        // S*k, i32: expert of entry t*k+c (routed: 0, one pseudo-expert of R rows)
  kSlot,          // S*k, i32: its slot (routed: its row in kSend / kBack), -1 dropped
  kWeight,        // S*k, fp32: its combine weight
  kSlotEntry,     // E*C, i32 (routed: R)
  kCount,         // E, i32
  kRoutedExpert,  // S*k, i32, routed only: the real expert of each entry (its gate weight)
  kDispatched,    // (E, rho, C, M), data: encoded slots, rho copies
  kExpertOut,     // (E, rho, C, M), data: expert outputs back at the token side
  kSummed,        // (E, C, M), data: rho > 1 only (the encode's single copy, then the sum)
  kY,             // S x M, data
  kW1,            // [slice] M x hidden, data
  kW2,            // [slice] hidden x M, data
  kParamIn,       // sharded with n / rho > 1: this rank's own 1/n slice [W1 (M x h) | W2 (h x M)]
  kParamAll,      // ... the n / rho slices of its gather group, gathered
  kXOwn,          // S x M, data: this rank's tokens where the gate sees other rows (Parm)
  kYOwn,          // S x M, data: this rank's output where the decode makes other rows (Parm)
  kSend,          // [chunk] capacity: the packed send buffer; routed: [0] every chunk's rows
  kIn,            // [chunk] received rows, (W, slices, rows, M)
  kHidden,        // [chunk] (W, slices, rows, hidden)
  kOut,           // [chunk] expert outputs, as kIn
  kBack,          // [chunk] returned outputs; routed: [0] every chunk's rows; deepep: the
                  // per-node output rows (kSend's layout)
  // a2a deepep (exec/deepep_path.hpp): kSend holds the rows a source sends to other nodes, one
  // per (token, node); a forwarder receives them, sends on one row per (token, GPU of its node),
  // and reduces the outputs back; a target computes its experts on the distinct token rows.
  // The k*Sum tables are CSR row sums (LayerOps::sum_rows): begin (rows + 1), the source row of
  // every term, and (kTokSum) every term's weight element.
  kFwdIn,      // forwarder: rows received from the other nodes (dispatch_inter)
  kFwdOut,     // forwarder: rows sent on to the GPUs of its node, per target (dispatch_intra)
  kFwdBack,    // forwarder: the targets' output rows, kFwdOut's layout (combine_intra)
  kNodeOut,    // forwarder: those summed per (source, token), kFwdIn's layout (combine_inter)
  kTokIn,      // target: the distinct token rows it received
  kTokIn32,    // target: the same in fp32, the gate's input (the host path aliases kTokIn)
  kTokOut,     // target: their outputs, summed over its experts with the gate's weights
  kTokLogits,  // target: fp32 gate logits of kTokIn (the weights are recomputed, not sent)
  kTokExpert,  // target: i32, k per row: the row's experts on this GPU (-1: none)
  kTokWeight,  // target: fp32, k per row: their gate probabilities
  kSendIdx,    // i32: kSend row -> token (kX row)
  kFwdOwnIdx,  // i32: kFwdOut row -> the forwarder's own token (kX row), or -1
  kFwdInIdx,   // i32: kFwdOut row -> kFwdIn row, or -1
  kEntryRow,   // i32: kIn row (one per (token, expert) entry) -> kTokIn row
  kTokSum,     // i32 table: kTokOut row <- its entries' kOut rows, weighted by kTokWeight
  kOwnSum,     // i32 table: kY row (own token) <- the kFwdBack rows of it
  kNodeSum,    // i32 table: kNodeOut row <- the kFwdBack rows of it
  kBackSum,    // i32 table: kY row <- the kBack rows of it (one per other node)
  // Gradients (LayerLayout::backward; run_backward_step), each beside the forward buffer whose
  // gradient it holds. Capacity routing: kDExpertOut / kDDispatched token side, kDBack / kDSend
  // the packed chunks; plan routing: kDBack[0] / kDSend[0] every chunk's rows (kSend's layout).
  kDY,           // S x M, data: the layer's output gradient (seeded, make_grad_output)
  kDWeight,      // S*k, fp32: dLoss / dWeight of every entry (0 where dropped)
  kDExpertOut,   // (E, rho, C, M), data
  kDDispatched,  // (E, rho, C, M), data
  kDX,           // S x M, data: the encode's share of dX
  kDX32,         // S x M, fp32: dX with the gate's share (the host path aliases kDX)
  kDLogits,      // S x E, fp32
  kDGateW,       // M x E, fp32, accumulated over the step's passes
  kDW,           // [dW1 of every slice | dW2 of every slice], fp32, accumulated (dw_offset)
  kDSend,        // [chunk] the input gradients back at the token side (kBack's rows: as the
                 // combine returned, every esp shard's partial and, SAA, every MP share's)
  kDIn,          // [chunk] as kIn
  kDHidden,      // [chunk] as kHidden
  kDOut,         // [chunk] as kOut
  kDBack,        // [chunk] the output gradients packed at the token side (kSend's rows: as
                 // the dispatch sent)
  kDSummed,      // (E, C, M), data, rho > 1: the decode's input gradient, then the encode's sum
  kDParamAll,    // fp32, n / rho > 1: kDW cut into the gather group's blocks (kParamAll's)
  kDParamIn,     // fp32: their sum over the group for this rank's own slice (kParamIn's layout)
  kDYOwn,        // S x M, data: this rank's output gradient where the decode made other rows
  kDXOwn,        // S x M, data: this rank's input gradient where the gate saw other rows (Parm)
  // deepep's gradients, each beside its forward buffer (kDBack / kDSend: kSend's rows).
  kDFwdIn,       // forwarder: kFwdIn's rows (the combine's node rows, then the dispatch's)
  kDFwdOut,      // forwarder: kFwdOut's rows
  kDTokIn,       // target: kTokIn's rows
  kDTokIn32,     // ... in fp32, with the target gate's share (the host path aliases kDTokIn)
  kDTokOut,      // target: kTokOut's rows
  kDTokWeight,   // target: fp32, k per row
  kDTokLogits,   // target: fp32
  kEntrySum,     // i32 table: kOut row (entry) <- its kTokOut row, weighted (one term each)
  kEntryWeight,  // i32: each entry's kTokWeight element
};
inline constexpr std::size_t kLayerBufKinds = static_cast<std::size_t>(LayerBuf::kEntryWeight) + 1;
enum class ElemType : std::uint8_t { kF32, kData, kI32 };
ElemType elem_type(LayerBuf b);
const char* layer_buf_name(LayerBuf b);

struct BufId {
  LayerBuf buf = LayerBuf::kX;
  int index = 0;  // slice (kW1, kW2) or chunk (kSend ... kBack)
  bool operator==(const BufId&) const = default;
  auto operator<=>(const BufId&) const = default;
};

struct BufferSize {
  BufId id;
  std::size_t elements = 0;
};

enum class LayerRouting : std::uint8_t {
  kCapacity,  // the gate's top-k and capacity rule route the tokens (plain, sharded)
  kPlan,      // the plan's all_to_allv matrices do (routed_path.hpp's assignment)
  kDeepep,    // the same assignment, moved once per node and GPU (deepep_path.hpp)
};

/// `rows` consecutive slots of copy `copy` of expert `expert`, from slot `first`: one block of a
/// chunk's send (or returned) buffer.
struct SlotBlock {
  int expert = 0, copy = 0, first = 0, rows = 0;
  bool operator==(const SlotBlock&) const = default;
};

/// Where the gate's rows come from, and where the layer's output rows go.
enum class GateInput : std::uint8_t {
  kOwn,       // this rank's S tokens (kX32 holds them)
  kOwnRows,   // rows [gate_first, + gate_tokens) of them (Parm S1: the MP split before the gate)
  kGathered,  // the all-gather of its ESP group's tokens (Parm baseline)
};
enum class LayerOutput : std::uint8_t {
  kGateRows,    // the decode's rows are the output (kY)
  kOwnRows,     // rows [own_first, + S) of them (Parm baseline: the ESP split back), in kYOwn
  kMpGathered,  // the MP all-gather of every MP share's rows (Parm S1), in kYOwn
};

/// The typed record of one MoE layer as one rank runs it.
struct LayerLayout {
  int moe = 0;     // MoE layer number
  int block = -1;  // the plan's block (roles' block)
  LayerRouting routing = LayerRouting::kCapacity;
  // The plan runs this layer's backward through the program (run_backward_step): its gradient
  // buffers exist, and the experts' gradient all-reduce comes in grad_sync_parts micro-ops.
  bool backward = false;
  int grad_sync_parts = 0;
  int ep = 1;           // W: ranks of the EP group (1: experts local, no all-to-all)
  int ep_pos = 0;       // this rank's position in it
  int slices = 0;       // expert slices this rank computes: dE (plain), 1 (sharded), routed: its
                        // distinct experts
  int shards = 1;       // n: positions per expert (sharded), 1 otherwise
  int rho = 1;          // hidden slices of an expert's computation (sharded), 1 otherwise
  int hidden = 0;       // width of a slice's hidden layer: H / rho
  bool has_a2a = true;  // dispatch / combine all-to-alls (false: W = 1, every expert local)
  std::vector<int> caps, offset;  // capacity routing: chunk j's slots [offset, offset + caps)
  int capacity = 0;               // C
  // Capacity routing: per chunk, the slot blocks of the send buffer in order (destination-major:
  // position p's blocks first), and of the buffer the combine returns (default: the same).
  // fill_capacity_blocks() derives them for the plain and sharded layouts; Parm's fused
  // schedules list them from the group layout (exec/parm_path.cpp).
  std::vector<std::vector<SlotBlock>> send_blocks, back_blocks;
  bool dump_op = false;          // a local-dump op packs every chunk before the dispatches
  bool accumulate_back = false;  // returned blocks are summed into kExpertOut by the local
                                 // combine (Parm S1 / S2: the esp partial outputs), not copied
  bool combine_op = false;       // ... and the plan has that op (otherwise the decode sums)
  // The routing unit (Parm): the gate sees gate_tokens rows (0: S) taken as `input` says; the
  // output is `output`'s rows.
  int gate_tokens = 0;
  GateInput input = GateInput::kOwn;
  int gate_first = 0;
  LayerOutput output = LayerOutput::kGateRows;
  int own_first = 0;
  // Plan routing (kPlan): per chunk, the rows this rank sends (kSend rows [send_first,
  // send_first + send_rows)) and the runs it receives: (rows, slice) in receive order.
  std::vector<int> send_rows, send_first;
  std::vector<std::vector<std::pair<int, int>>> runs;
  // kDeepep (one chunk; runs[0] the entry runs per expert slice): the rows of its buffers.
  struct DeepepRows {
    int send = 0;        // kSend / kBack
    int fwd_in = 0;      // kFwdIn / kNodeOut
    int fwd_out = 0;     // kFwdOut / kFwdBack
    int tok = 0;         // kTokIn / kTokOut
    int entries = 0;     // kIn / kOut: (token, expert) entries (kTokSum's terms)
    int own_terms = 0;   // kFwdOut rows of its own tokens (kOwnSum's terms)
    int node_terms = 0;  // kFwdOut rows of other nodes' tokens (kNodeSum's terms)
  } deepep;

  int chunks() const {
    return static_cast<int>(routing == LayerRouting::kCapacity ? caps.size() : runs.size());
  }
  int gather() const { return shards / rho; }  // g: positions that share one hidden slice
  /// Capacity routing: rows of one (source, slice) block in chunk j: c_j / g.
  int block_rows(int j) const { return caps[static_cast<std::size_t>(j)] / gather(); }
  /// Rows this rank's experts receive in chunk j.
  int received_rows(int j) const;
  /// Total rows of the plan-routed send buffer.
  int total_send_rows() const;
  /// Rows of chunk j's capacity-routed send / returned buffer.
  int send_block_rows(int j) const;
  int back_block_rows(int j) const;
  int unit_tokens(const MoeShape& s) const { return gate_tokens > 0 ? gate_tokens : s.tokens; }
  /// The buffer holding this rank's S output rows after the layer.
  LayerBuf output_buffer() const {
    return output == LayerOutput::kGateRows ? LayerBuf::kY : LayerBuf::kYOwn;
  }
};

/// The plain and sharded layouts' slot blocks (see pack_blocks): fills send_blocks and clears
/// back_blocks (the combine returns the send order).
void fill_capacity_blocks(LayerLayout& L);

/// A capacity-routed layout's common part: layer `moe` of plan block `block` on an EP group of
/// `ep` sources (this rank at `ep_pos`), `slices` expert slices of hidden width `hidden`, chunks
/// of `caps` slots (offsets derived) out of `capacity` per expert. The data paths set the rest.
LayerLayout capacity_layout(int moe, int block, int ep, int ep_pos, int slices, int hidden,
                            bool has_a2a, const std::vector<int>& caps, int capacity);

/// A 2-D copy inside one layer: `count` runs of `run` elements, run r from
/// src[src_off + r * src_pitch] to dst[dst_off + r * dst_pitch] (elements of the buffers' type).
struct BlockCopy {
  BufId src, dst;
  std::size_t src_off = 0, src_pitch = 0, dst_off = 0, dst_pitch = 0, run = 0;
  int count = 0;
  bool accumulate = false;  // dst += src instead of dst = src
  bool operator==(const BlockCopy&) const = default;
};

/// Rows [src_row, src_row + rows) of a buffer of rows of M elements to row dst_row of another:
/// one copy (a routing unit's rows moved in or out).
BlockCopy rows_copy(BufId src, std::size_t src_row, BufId dst, std::size_t dst_row,
                    std::size_t rows, std::size_t M);

/// `batch` GEMMs C_i (m x n) = op(A_i) (m x k) * op(B) (k x n) [+ C_i], A_i = a + a_off + i *
/// a_stride (C the same); B (at b_off) is one matrix for every batch entry. op(X) = X, or X^T
/// stored transposed (trans_a: A_i stored k x m; trans_b: B stored n x k). accumulate: C_i +=.
struct GemmJob {
  BufId a, b, c;
  std::size_t a_off = 0, b_off = 0, c_off = 0;
  long long a_stride = 0, c_stride = 0;
  int m = 0, n = 0, k = 0, batch = 1;
  bool trans_a = false, trans_b = false, accumulate = false;
  bool operator==(const GemmJob&) const = default;
};

/// One lowered collective of the data path: the plan's op on [send_off, send_off + send_elems)
/// of `send` into [recv_off, recv_off + recv_elems) of `recv`. row_elems > 0: the op is an
/// all_to_allv whose matrix (or, deepep, NodeDedup) counts rows of row_elems elements (the plan's
/// unit rescaled). phase_count >= 0: only phases [first_phase, first_phase + phase_count) of the
/// lowering (deepep's two sets, with the data path's row work between them).
struct Exchange {
  BufId send, recv;
  std::size_t send_off = 0, send_elems = 0, recv_off = 0, recv_elems = 0;
  std::size_t row_elems = 0;
  int first_phase = 0, phase_count = -1;
};

/// Phase `phase` of a deepep exchange (its two sets run separately, with row work between): rows
/// of `row_elems` elements from `send` to `recv`, forward or backward.
Exchange deepep_phase(LayerBuf send, int send_rows, LayerBuf recv, int recv_rows,
                      std::size_t row_elems, int phase);

/// The plan's spec of exchange `x` of `op` as a backend runs it on `rank`'s group, its buffers'
/// elements of `elem_bytes`: padded (bytes = the send buffer), an all_to_allv whose matrix counts
/// rows of x.row_elems elements (its unit rescaled; the send and receive sizes must be this
/// rank's row and column of it), or deepep's NodeDedup rescaled the same way. Every backend
/// prepares its exchanges here, so none moves other bytes than the plan's. InternalError when
/// the buffers disagree with the plan.
CollectiveSpec exchange_spec(const Plan& plan, const Op& op, const Exchange& x, int rank,
                             std::size_t elem_bytes);

/// The backend interface of the program: what the host path (exec/host_layer.hpp) and the GPU
/// path (exec/cuda_executor.cpp) implement. A step the backend cannot run throws ExecError.
class LayerOps {
 public:
  virtual ~LayerOps() = default;
  /// kX32 x kGateW -> kLogits, then top-k and the capacity rule -> kExpert, kSlot, kWeight,
  /// kSlotEntry, kCount (kernels gate).
  virtual void gate(const kernels::GateParams& params) = 0;
  /// weight[t*k+c] = softmax(logits[t])[expert[t*k+c]] (0 where expert is -1), fp32, for
  /// `tokens` rows of `experts` logits (plan-routed layers: kLogits from a GemmJob, kRoutedExpert,
  /// kWeight; deepep targets: kTokLogits, kTokExpert, kTokWeight).
  virtual void routed_weights(BufId logits, BufId expert, BufId weight, int tokens, int experts,
                              int top_k) = 0;
  /// dst row i = src row index[i] for i < rows where index[i] >= 0 (rows of row_elems, data;
  /// kernels gather_rows).
  virtual void gather_rows(BufId src, BufId dst, BufId index, int rows, std::size_t row_elems) = 0;
  /// dst row d += the weighted src rows of its table's terms, d < rows (kernels sum_rows): the
  /// i32 `table` holds begin (rows + 1), then the source row of each of the `terms` terms, then,
  /// `weighted`, each term's element of the fp32 `weight` buffer.
  virtual void sum_rows(BufId src, BufId dst, BufId table, int rows, int terms,
                        std::size_t row_elems, bool weighted, BufId weight) = 0;
  /// dst (fp32) = src (data) for `elements`: a no-op where they are one buffer (host path).
  virtual void widen(BufId src, BufId dst, std::size_t elements) = 0;
  /// kernels encode / decode with the layer's routing tables (num_experts x capacity slots).
  /// `tokens` rows of kX / kY: the routing unit.
  virtual void encode(BufId dst, int tokens, int num_experts, int capacity) = 0;
  virtual void decode(BufId src, BufId dst, int tokens, int num_experts, int capacity) = 0;
  /// kernels decode_backward: from the forward's returned outputs `out` and the output gradient
  /// kDY, the returned rows' gradients `d_out` and kDWeight (the layer's routing tables).
  virtual void decode_backward(BufId out, BufId d_out, int tokens, int num_experts,
                               int capacity) = 0;
  /// kernels encode_backward: kDX = each token's kept slots' rows of `d_slots` summed.
  virtual void encode_backward(BufId d_slots, int tokens, int num_experts, int capacity) = 0;
  /// grad = activated > 0 ? grad : 0 for `elements` (the ReLU's backward).
  virtual void relu_backward(BufId activated, BufId grad, std::size_t elements) = 0;
  /// d_logits (fp32) from `logits` and the entries' d_weight (fp32; kernels softmax_backward);
  /// `expert`: the entries' experts (i32, -1: none).
  virtual void softmax_backward(BufId logits, BufId expert, BufId d_weight, BufId d_logits,
                                int tokens, int experts, int top_k) = 0;
  /// dst (data) = src (fp32) for `elements`: a no-op where they are one buffer (host path).
  virtual void narrow(BufId src, BufId dst, std::size_t elements) = 0;
  /// out (fp32) element out_index[i] = <a row a_row[i], b row i> for i < rows (kernels dot_rows;
  /// a_row and out_index i32 buffers).
  virtual void dot_rows(BufId a, BufId a_row, BufId b, int rows, std::size_t row_elems,
                        BufId out_index, BufId out) = 0;
  virtual void zero(BufId buf, std::size_t elements) = 0;
  /// kX32 (fp32) = kX (data) for `elements`: the gate's fp32 copy of tokens that arrived in the
  /// data type (Parm's ESP all-gather, MP split). A no-op where the two are one buffer (host).
  virtual void widen_tokens(std::size_t elements) = 0;
  virtual void copy(const BlockCopy& c) = 0;
  /// f32: a fp32 GEMM (the gate's); otherwise in the data type.
  virtual void gemm(const GemmJob& g, bool f32) = 0;
  virtual void relu(BufId buf, std::size_t elements) = 0;
  /// dst[x * run + e] = sum over q < terms of src[(x * terms + q) * run + e], x < groups.
  virtual void sum_slices(BufId src, BufId dst, int groups, int terms, std::size_t run) = 0;
  /// The plan's collective `op` on the exchange's buffers (shared lowering); returns the
  /// algorithm it ran.
  virtual std::int64_t exchange(const Op& op, const Exchange& x) = 0;
  /// all_gather over `op`'s group of `elements` of `in` into `out` (g blocks).
  virtual std::int64_t all_gather(const Op& op, BufId in, std::size_t elements, BufId out) = 0;
  /// reduce_scatter over `op`'s group: `in` holds g blocks of `elements`; this member's block of
  /// their sum goes to `out`.
  virtual std::int64_t reduce_scatter(const Op& op, BufId in, std::size_t elements, BufId out) = 0;
  /// In-place sum of elements [offset, offset + elements) of `buf` over `op`'s group.
  virtual std::int64_t all_reduce(const Op& op, BufId buf, std::size_t offset,
                                  std::size_t elements) = 0;
};

/// The buffers of a layer and their element counts (every buffer the program touches).
std::vector<BufferSize> layer_buffers(const LayerLayout& L, const MoeShape& s);

/// Capacity routing: the copies that pack chunk j of kDispatched into `dst` (kSend[j], or kIn[j]
/// when W = 1), in send_blocks order. The plain and sharded layouts (fill_capacity_blocks):
/// position p's block of slice le is (expert x, copy q, slots [offset_j + i * rows, + rows)) with
/// x = p * dE + le (n = 1) or p / n, q = (p mod n) / g, i = p mod g. Runs that continue each
/// other with constant pitches are merged (the plain layout packs a chunk in one 2-D copy).
/// unpack: the copies (or, accumulate_back, the sums) from `src`, in back_blocks order, into
/// kExpertOut.
std::vector<BlockCopy> pack_blocks(const LayerLayout& L, int j, int model_dim, BufId dst);
std::vector<BlockCopy> unpack_blocks(const LayerLayout& L, int j, int model_dim, BufId src);
/// The same copies between any (E, rho, C, M) buffer `slots` and chunk rows `chunk`, by the send
/// blocks or (back) the returned blocks: to_chunk packs, otherwise unpacks (the backward moves
/// the gradients of kExpertOut / kDispatched along the forward's blocks).
std::vector<BlockCopy> slot_block_copies(const LayerLayout& L, int j, int model_dim, bool back,
                                         BufId slots, BufId chunk, bool to_chunk,
                                         bool accumulate = false);

/// Where slice `slice`'s dW1 (fc2 false, M x hidden) or dW2 (hidden x M) starts in kDW.
std::size_t dw_offset(const LayerLayout& L, const MoeShape& s, bool fc2, int slice);
/// The buffer holding the gradients of the parameters this rank owns after the backward:
/// [dW1 of each slice | dW2 of each], the slices' hidden width being H / n on sharded layouts.
LayerBuf owned_dw(const LayerLayout& L);

/// The expert GEMMs of chunk j: fc1 (kIn -> kHidden) or fc2 (kHidden -> kOut). Capacity routing:
/// one strided-batched GEMM per slice over the W source blocks; plan routing: one per received
/// run with its expert's weights.
std::vector<GemmJob> expert_gemms(const LayerLayout& L, int j, bool fc2, int model_dim);

/// Whether `op` is a forward step of the program (its role: gate, encode, dispatch, fc1, fc2,
/// combine, decode, the sharded experts' gather and partial sum, Parm's steps).
bool is_forward_step(const Op& op);

/// The program: runs the forward op `op` (role kind `kind`, chunk `chunk`) of layer L through
/// `ops`. Returns the algorithm of the collective it ran, or -1.
std::int64_t run_forward_step(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, int chunk,
                              const Op& op, LayerOps& ops);

/// Whether `op` is a backward step of the program: the backward decode, partial sum, combine,
/// fc2, fc1, dispatch, encode and gate, Parm's (ESP all-gather of dY, ESP all-reduce, local dump
/// and combine, MP all-gather of dX), and the experts' gradient reduce-scatter (sharded) and
/// all-reduces (DP, its micro-ops; Parm's MP).
bool is_backward_step(const Op& op);

/// The buffer holding this rank's S rows of dX after the backward (kDX32, or kDXOwn where the
/// routing unit is not the rank's own tokens).
LayerBuf input_grad_buffer(const LayerLayout& L);

/// The backward program: the backward op `op` of layer L (L.backward) through `ops`, the
/// transpose of the forward step of the same role. Where the routing unit is not the rank's own
/// tokens (Parm), kDYOwn in and kDXOwn out, the unit's rows moved as the forward's were
/// transposed (ESP all-gather of dY, a split; MP all-gather of dX). Gradients: kDY in; kDX32,
/// kDGateW and the experts' out (kDW, or kDParamIn for a sharded slice gathered over n / rho > 1
/// ranks: owned_dw; kDGateW and kDW accumulate over the step's passes). Returns the collective's
/// algorithm or -1.
std::int64_t run_backward_step(const LayerLayout& L, const MoeShape& s, OpRoleKind kind, int chunk,
                               const Op& op, LayerOps& ops);

}  // namespace moesim::exec
