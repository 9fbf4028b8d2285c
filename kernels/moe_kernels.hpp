// MoE kernels for real execution (docs/design.md §4.2): gate (GEMM + softmax + top-k +
// capacity locations), encode / decode and their backward passes, the 2DH stride copy, and the
// expert FFN. Every kernel exists twice with the same signature shape (the per-element and
// per-row rules of both are single-source, in kernels/rules.hpp):
//   moesim::kernels::cpu::f(cpu::Context&, ...)   host pointers, reference implementation
//   moesim::kernels::cuda::f(cuda::Context&, ...) device pointers, runs on the context's stream
// and both are tested against the same hand-computed cases. This header does not include CUDA
// headers, so exec/ and tests can include it on machines without the toolkit; the cuda:: functions
// are only defined when the library was built with MOESIM_WITH_CUDA (kCudaCompiled).
//
// Conventions (all kernels):
//  * Matrices are row-major and dense. S = tokens, M = model dim, E = experts, C = capacity (slots
//    per expert), H = FFN hidden dim, k = top-k choices (1..8).
//  * Activations and weights are `DType` (fp32, fp16, bf16); fp16 / bf16 are passed as 16-bit
//    storage (uint16_t on the host, __half / __nv_bfloat16 on the device: same bits). Arithmetic
//    accumulates in fp32 and rounds once to nearest-even on the store.
//  * Routing tables are per (token, choice) "entries", entry = t*k + c (c = 0 is the top choice):
//    expert[entry], slot[entry] (-1 when dropped by capacity) and weight[entry] (fp32 gate value).
//    slot_entry[e*C + s] is the inverse map: the entry in slot s of expert e, or -1 when empty.
//  * The dispatched buffer is (E, C, M): row e*C + s holds the token routed to slot s of expert e;
//    encode writes every row (zeros in empty slots) so experts never read garbage.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/errors.hpp"
#include "kernels/rules.hpp"

#ifndef MOESIM_KERNELS_HAVE_CUDA
#define MOESIM_KERNELS_HAVE_CUDA 0
#endif

// cudaStream_t is `CUstream_st*`; declaring the struct here keeps CUDA headers out of this one.
struct CUstream_st;

namespace moesim::kernels {

/// True when the library was built with the CUDA kernels (MOESIM_WITH_CUDA).
inline constexpr bool kCudaCompiled = MOESIM_KERNELS_HAVE_CUDA != 0;

/// Number of usable CUDA devices; 0 without CUDA support, without a driver or without a device
/// (never throws, so GPU tests can GTEST_SKIP on 0).
int cuda_device_count();

// --- Element types -------------------------------------------------------------------------------

enum class DType { kF32, kF16, kBF16 };

/// Bytes per element: 4, 2, 2.
std::size_t dtype_size(DType dtype);
/// "fp32", "fp16", "bf16".
const char* dtype_name(DType dtype);

namespace detail {
// memcpy rather than std::bit_cast: this header is also compiled as C++17 by nvcc.
inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

/// IEEE binary16 <-> float, round to nearest even (overflow to inf, NaN kept NaN).
/// bfloat16 (upper 16 bits of binary32) <-> float, round to nearest even (NaN kept NaN).
/// Inline: the CPU kernels convert every element.
inline std::uint16_t float_to_half(float value) {
  const std::uint32_t x = detail::float_bits(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet mantissa bit)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs < 0x38800000u) {
    // Below 2^-14: a half subnormal is m * 2^-24. The multiply by 2^24 is exact, and nearbyint
    // rounds to nearest even in the default rounding mode; m = 1024 encodes 2^-14 correctly.
    const float scaled = detail::bits_float(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15), then round the 13 dropped bits to nearest even
  // without branches (the add carries into the exponent when the mantissa overflows).
  const std::uint32_t rebased = abs - ((127u - 15u) << 23);
  const std::uint32_t h = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  return static_cast<std::uint16_t>(sign | h);
}

inline float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
  return detail::bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline std::uint16_t float_to_bf16(float value) {
  std::uint32_t x = detail::float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

inline float bf16_to_float(std::uint16_t bits) {
  return detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
}

/// Host conversions of n elements between any two dtypes (same dtype: memcpy).
void convert(DType from, const void* src, DType to, void* dst, std::size_t n);
/// Element i of a host buffer as float / stored from float (rounded to the dtype).
float load_element(DType dtype, const void* data, std::size_t i);
void store_element(DType dtype, void* data, std::size_t i, float value);

// --- Parameter blocks ----------------------------------------------------------------------------

// Activation (kNone, kRelu, kGelu) is declared in kernels/rules.hpp, with the per-element rules
// both implementations share.

struct GateParams {
  int num_tokens = 0;   // S
  int model_dim = 0;    // M (only used by gate(); gate_from_logits() ignores it)
  int num_experts = 0;  // E
  int top_k = 1;        // k, 1..8, <= E
  int capacity = 0;     // C, slots per expert (>= 0)
  /// Capacity locations are handed out in priority order: all first choices (c = 0) of every
  /// token before any second choice, and so on. Within one choice level, tokens go in index order
  /// (false) or, batch-prioritised (true), in descending order of their top gate value (ties:
  /// lower token index first), so the most confident tokens are kept when an expert overflows.
  bool batch_prioritized = false;
  /// false: weight = softmax probability of the chosen expert. true: the k chosen probabilities
  /// are renormalised to sum to 1 per token (GShard top-2 style). Dropped choices keep their
  /// weight value in `weight` (decode ignores them since their slot is -1).
  bool normalize_top_k = false;
  /// Node-limited routing (rules::group_limit_binds): experts [g * experts_per_group, (g + 1) *
  /// experts_per_group) sit on node g, and a token's choices come from at most group_limit nodes,
  /// picked by the sum of their ceil(k / group_limit) largest logits. 0: no limit.
  /// experts_per_group must divide E, and group_limit nodes must hold k experts.
  int experts_per_group = 0;
  int group_limit = 0;
};

namespace detail {
/// Throws ArgumentError for a node limit the gate cannot apply (both gates call it).
inline void check_group_limit(const GateParams& p) {
  const int g = p.experts_per_group, m = p.group_limit;
  if (g < 0 || m < 0 || (g > 0 && p.num_experts % g != 0))
    throw ArgumentError("kernels: node-limited gate needs experts_per_group (" + std::to_string(g) +
                        ") dividing E (" + std::to_string(p.num_experts) +
                        ") and group_limit >= 0 (" + std::to_string(m) + ")");
  if (rules::group_limit_binds(p.num_experts, p.top_k, g, m) &&
      static_cast<long long>(g) * m < p.top_k)
    throw ArgumentError("kernels: node-limited gate: " + std::to_string(m) + " groups of " +
                        std::to_string(g) +
                        " experts cannot hold top_k = " + std::to_string(p.top_k) + " choices");
}
}  // namespace detail

/// Gate outputs (host pointers for cpu::, device pointers for cuda::). Sizes: S*k for expert,
/// slot, weight; E*C for slot_entry; E for expert_count. slot_entry and expert_count may be null.
struct RoutingOut {
  std::int32_t* expert = nullptr;
  std::int32_t* slot = nullptr;
  float* weight = nullptr;
  std::int32_t* slot_entry = nullptr;
  std::int32_t* expert_count = nullptr;  // kept (non-dropped) entries per expert, <= C
};

/// A routing table as the encode / decode kernels read it (same layout as RoutingOut). Which
/// arrays a kernel needs is stated on the kernel; the others may be null.
struct Routing {
  int num_tokens = 0;                        // S
  int top_k = 1;                             // k
  int num_experts = 0;                       // E
  int capacity = 0;                          // C
  const std::int32_t* expert = nullptr;      // [S*k]
  const std::int32_t* slot = nullptr;        // [S*k], -1 = dropped
  const float* weight = nullptr;             // [S*k]
  const std::int32_t* slot_entry = nullptr;  // [E*C], -1 = empty
};

/// Batched expert FFN: for each expert e < num_experts, rows x M input block X_e (consecutive
/// blocks of `rows` rows, i.e. the (E, C, M) dispatched buffer with rows = C),
///   hidden_e = act(X_e * W1_e)   (rows x H), W1 is (E, M, H)
///   Y_e      = hidden_e * W2_e   (rows x M), W2 is (E, H, M)
struct FfnShape {
  int num_experts = 1;
  int rows = 0;        // tokens per expert (C)
  int model_dim = 0;   // M
  int hidden_dim = 0;  // H
};

/// The operands of gemm_strided_batched_t: which are read transposed, and whether C is fp32
/// whatever the inputs' dtype (a gradient accumulated in fp32, as frameworks keep their main
/// gradients).
struct GemmLayout {
  bool a = false, b = false;
  bool c_f32 = false;
};

// --- CPU reference kernels -----------------------------------------------------------------------
namespace cpu {

/// Host execution context. num_threads > 1 splits GEMM rows over std::threads (results do not
/// depend on the thread count: each output element is computed by one thread in a fixed order).
class Context {
 public:
  explicit Context(int num_threads = 1);
  int num_threads() const { return num_threads_; }

 private:
  int num_threads_;
};

/// C (m x n) = alpha * A (m x k) * B (k x n) + beta * C; fp32 accumulation, blocked.
void gemm(Context& ctx, DType dtype, int m, int n, int k, const void* a, const void* b, void* c,
          float alpha = 1.0f, float beta = 0.0f);

/// logits (S x E, fp32) = X (S x M, dtype) * Wg (M x E, dtype), then gate_from_logits().
void gate(Context& ctx, DType dtype, const GateParams& params, const void* x, const void* wg,
          float* logits, const RoutingOut& out);
/// Softmax over E per token (fp32), top-k (ties: lower expert index first), capacity locations
/// as documented on GateParams. Writes every entry of `out` (and slot_entry / expert_count when
/// non-null).
void gate_from_logits(Context& ctx, const GateParams& params, const float* logits,
                      const RoutingOut& out);
/// slot_entry[E*C] from expert/slot (for routing tables not made by gate()). Needs expert, slot.
void build_slot_index(Context& ctx, const Routing& routing, std::int32_t* slot_entry);

/// dispatched (E, C, M)[e, s, :] = x (S, M)[entry / k, :] for entry = slot_entry[e*C+s], zeros
/// for empty slots. Needs slot_entry.
void encode(Context& ctx, DType dtype, const Routing& routing, int model_dim, const void* x,
            void* dispatched);
/// Backward of encode (a gather): grad_x[t, :] = sum over kept choices c of
/// grad_dispatched[expert, slot, :]; zero rows for fully dropped tokens. Needs expert, slot.
void encode_backward(Context& ctx, DType dtype, const Routing& routing, int model_dim,
                     const void* grad_dispatched, void* grad_x);
/// y (S, M)[t, :] = sum over kept choices c of weight[t*k+c] * expert_out (E, C, M)[e, s, :];
/// zero rows for fully dropped tokens. Needs expert, slot, weight.
void decode(Context& ctx, DType dtype, const Routing& routing, int model_dim,
            const void* expert_out, void* y);
/// Backward of decode: grad_expert_out[e, s, :] = weight[entry] * grad_y[entry / k, :] (zeros in
/// empty slots) and grad_weight[entry] = <grad_y[t, :], expert_out[e, s, :]> (fp32 dot, 0 for
/// dropped entries). Needs expert, slot, weight, slot_entry. grad_weight may be null.
void decode_backward(Context& ctx, DType dtype, const Routing& routing, int model_dim,
                     const void* expert_out, const void* grad_y, void* grad_expert_out,
                     float* grad_weight);

/// The 2DH stride copy T(h, w) on h*w chunks of chunk_bytes: input chunk i = a*h + j goes to
/// output slot j*w + a (strategies/collectives stride_copy_index). src and dst must not overlap.
void stride_copy(Context& ctx, const void* src, void* dst, int h, int w, std::size_t chunk_bytes);

/// Batched expert FFN (FfnShape). hidden (E, rows, H) is kept for the backward pass.
void expert_ffn(Context& ctx, DType dtype, Activation act, const FfnShape& shape, const void* x,
                const void* w1, const void* w2, void* hidden, void* y);

/// `batch` GEMMs C_i (m x n) = A_i (m x k) * B_i (k x n), A_i = a + i * stride_a elements (same
/// for B, C; a stride of 0 reuses one matrix, e.g. one expert's weights for every source rank's
/// block). fp32 accumulation, one rounding to the dtype on the store.
void gemm_strided_batched(Context& ctx, DType dtype, int m, int n, int k, const void* a,
                          long long stride_a, const void* b, long long stride_b, void* c,
                          long long stride_c, int batch);
/// gemm_strided_batched with transposed operands and an accumulating C, for the backward GEMMs
/// (dX = dY W^T, dW += X^T dY): C_i (m x n) = op(A_i) op(B_i) + beta C_i, where op(A_i) is m x k
/// (stored k x m when layout.a) and op(B_i) k x n (stored n x k when layout.b). fp32
/// accumulation, one rounding to C's type on the store (the dtype, or fp32: layout.c_f32, whose
/// stride_c then counts fp32 elements).
void gemm_strided_batched_t(Context& ctx, DType dtype, GemmLayout trans, int m, int n, int k,
                            const void* a, long long stride_a, const void* b, long long stride_b,
                            void* c, long long stride_c, int batch, float beta);
/// grad[i] = activated[i] > 0 ? grad[i] : 0 for n elements (the ReLU's backward, on its output).
void relu_backward(Context& ctx, DType dtype, const void* activated, void* grad, std::size_t n);
/// The gate softmax's backward (rules::softmax_backward_row) for `tokens` rows of `experts` fp32
/// logits: grad_logits (tokens x experts, fp32) from the entries' grad_weight (tokens x top_k,
/// fp32; expert < 0: dropped).
void softmax_backward(Context& ctx, int tokens, int experts, int top_k, const float* logits,
                      const std::int32_t* expert, const float* grad_weight, float* grad_logits);
/// data[i] = act(data[i]) for n elements (kGelu: the tanh approximation above).
void activation(Context& ctx, DType dtype, Activation act, void* data, std::size_t n);
/// weight[t*k+c] = softmax(logits[t, :])[expert[t*k+c]] for `tokens` rows of `experts` fp32
/// logits (rules::softmax_prob); 0 where expert < 0 (a dropped entry).
void softmax_pick(Context& ctx, int tokens, int experts, int top_k, const float* logits,
                  const std::int32_t* expert, float* weight);
/// `count` runs of `run` elements: dst[r * dst_pitch + i] += src[r * src_pitch + i] (fp32 sum,
/// one rounding to the dtype). Runs of dst must not overlap.
void add_rows(Context& ctx, DType dtype, const void* src, std::size_t src_pitch, void* dst,
              std::size_t dst_pitch, std::size_t run, int count);
/// dst row i = src row index[i] for i < rows (rows of row_elems elements); rows whose index is
/// negative are left as they are. (DeepEP-style dispatch: a token's row packed once per node or
/// per GPU; exec/deepep_path.hpp.)
void gather_rows(Context& ctx, DType dtype, const void* src, const std::int32_t* index, int rows,
                 std::size_t row_elems, void* dst);
/// Row sums by a CSR table: for d < rows, dst row d += sum over j in [begin[d], begin[d + 1]) of
/// w_j * src row src_row[j], w_j = weight[weight_index[j]] (weight null: 1); summed in fp32 in j
/// order, one rounding to the dtype. (Its combine: a token's expert outputs summed with the
/// gate's weights, then per node and per token.) Race-free on the GPU: one dst row per thread
/// row, its terms in table order.
void sum_rows(Context& ctx, DType dtype, const void* src, const std::int32_t* begin,
              const std::int32_t* src_row, const float* weight, const std::int32_t* weight_index,
              int rows, std::size_t row_elems, void* dst);
/// Row dot products: for i < rows, out[out_index[i]] = <a row a_row[i], b row i> (rows of
/// row_elems elements, summed in fp32 in element order). The backward of sum_rows' weights: a
/// summed row's gradient dotted with each of its terms.
void dot_rows(Context& ctx, DType dtype, const void* a, const std::int32_t* a_row, const void* b,
              int rows, std::size_t row_elems, const std::int32_t* out_index, float* out);

}  // namespace cpu

// --- CUDA kernels (defined only when kCudaCompiled) ----------------------------------------------
namespace cuda {

using Stream = ::CUstream_st*;  // == cudaStream_t

/// Device execution context: the device, the stream every kernel runs on, a cuBLAS handle bound
/// to that stream and a growable device workspace. Kernels are asynchronous on the stream; pointer
/// arguments are device pointers unless stated. Errors throw kernels::DeviceError naming the CUDA
/// / cuBLAS call, file and line.
class Context {
 public:
  /// device < 0: the current device. stream null: the legacy default stream.
  explicit Context(int device = -1, Stream stream = nullptr);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const;
  Stream stream() const;
  void set_stream(Stream stream);
  void synchronize();
  /// cublasHandle_t bound to stream() (cast it back in CUDA code).
  void* cublas_handle();
  /// Device scratch of at least `bytes` for work queued on stream() until the next call (kernels
  /// use it internally). Grows by stream-ordered allocation (cudaMallocAsync on stream()), never
  /// with a device-wide synchronisation; it is kept, so steady-state steps allocate nothing.
  void* workspace(std::size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

void gemm(Context& ctx, DType dtype, int m, int n, int k, const void* a, const void* b, void* c,
          float alpha = 1.0f, float beta = 0.0f);
void gate(Context& ctx, DType dtype, const GateParams& params, const void* x, const void* wg,
          float* logits, const RoutingOut& out);
void gate_from_logits(Context& ctx, const GateParams& params, const float* logits,
                      const RoutingOut& out);
void build_slot_index(Context& ctx, const Routing& routing, std::int32_t* slot_entry);
void encode(Context& ctx, DType dtype, const Routing& routing, int model_dim, const void* x,
            void* dispatched);
void encode_backward(Context& ctx, DType dtype, const Routing& routing, int model_dim,
                     const void* grad_dispatched, void* grad_x);
void decode(Context& ctx, DType dtype, const Routing& routing, int model_dim,
            const void* expert_out, void* y);
void decode_backward(Context& ctx, DType dtype, const Routing& routing, int model_dim,
                     const void* expert_out, const void* grad_y, void* grad_expert_out,
                     float* grad_weight);
void stride_copy(Context& ctx, const void* src, void* dst, int h, int w, std::size_t chunk_bytes);
/// cuBLAS strided-batched GEMMs + an activation kernel.
void expert_ffn(Context& ctx, DType dtype, Activation act, const FfnShape& shape, const void* x,
                const void* w1, const void* w2, void* hidden, void* y);
/// cublasGemmStridedBatchedEx with fp32 compute (see the cpu:: twin for the layout).
void gemm_strided_batched(Context& ctx, DType dtype, int m, int n, int k, const void* a,
                          long long stride_a, const void* b, long long stride_b, void* c,
                          long long stride_c, int batch);
/// cublasGemmStridedBatchedEx with the operations and leading dimensions of the transposes.
void gemm_strided_batched_t(Context& ctx, DType dtype, GemmLayout trans, int m, int n, int k,
                            const void* a, long long stride_a, const void* b, long long stride_b,
                            void* c, long long stride_c, int batch, float beta);
void relu_backward(Context& ctx, DType dtype, const void* activated, void* grad, std::size_t n);
void softmax_backward(Context& ctx, int tokens, int experts, int top_k, const float* logits,
                      const std::int32_t* expert, const float* grad_weight, float* grad_logits);
void activation(Context& ctx, DType dtype, Activation act, void* data, std::size_t n);
void softmax_pick(Context& ctx, int tokens, int experts, int top_k, const float* logits,
                  const std::int32_t* expert, float* weight);
void add_rows(Context& ctx, DType dtype, const void* src, std::size_t src_pitch, void* dst,
              std::size_t dst_pitch, std::size_t run, int count);
void gather_rows(Context& ctx, DType dtype, const void* src, const std::int32_t* index, int rows,
                 std::size_t row_elems, void* dst);
void sum_rows(Context& ctx, DType dtype, const void* src, const std::int32_t* begin,
              const std::int32_t* src_row, const float* weight, const std::int32_t* weight_index,
              int rows, std::size_t row_elems, void* dst);
void dot_rows(Context& ctx, DType dtype, const void* a, const std::int32_t* a_row, const void* b,
              int rows, std::size_t row_elems, const std::int32_t* out_index, float* out);
/// kernels::convert on the device: n elements of `from` at src to `to` at dst (through fp32).
void convert(Context& ctx, DType from, const void* src, DType to, void* dst, std::size_t n);

}  // namespace cuda
}  // namespace moesim::kernels
