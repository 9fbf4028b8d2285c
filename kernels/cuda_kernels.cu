// CUDA kernels of moe_kernels.hpp. Semantics are those of the CPU twins (cpu_kernels.cpp), which
// the gpu-labelled tests compare against. Memory-bound kernels (encode, decode and their backward
// passes, stride copy) move 16-byte vectors whenever the row size and pointers allow it, one block
// per row, so each block streams contiguous rows at full HBM width.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <string>
#include <type_traits>

#include "kernels/errors.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::kernels::cuda {
namespace {

#define MOESIM_KCUDA_CHECK(expr)                                                                   \
  do {                                                                                             \
    const cudaError_t moesim_err_ = (expr);                                                        \
    if (moesim_err_ != cudaSuccess) {                                                              \
      throw ::moesim::kernels::DeviceError("kernels/cuda_kernels.cu:" + std::to_string(__LINE__) + \
                                           ": " #expr ": " + cudaGetErrorString(moesim_err_));     \
    }                                                                                              \
  } while (0)

#define MOESIM_KCUBLAS_CHECK(expr)                                                                 \
  do {                                                                                             \
    const cublasStatus_t moesim_st_ = (expr);                                                      \
    if (moesim_st_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      throw ::moesim::kernels::DeviceError("kernels/cuda_kernels.cu:" + std::to_string(__LINE__) + \
                                           ": " #expr ": cuBLAS status " +                         \
                                           std::to_string(static_cast<int>(moesim_st_)));          \
    }                                                                                              \
  } while (0)

// Kernel launches report configuration errors only through cudaGetLastError.
#define MOESIM_KCUDA_LAUNCHED() MOESIM_KCUDA_CHECK(cudaGetLastError())

std::size_t elem_size(DType d) { return d == DType::kF32 ? 4 : 2; }

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

template <typename Fn>
void dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(float{});
      return;
    case DType::kF16:
      fn(__half{});
      return;
    case DType::kBF16:
      fn(__nv_bfloat16{});
      return;
  }
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// A vector of N elements of T moved as one load / store (N*sizeof(T) is 16, or N = 1).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

bool aligned(const void* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a == 0; }

int grid_for(std::size_t blocks) {
  return static_cast<int>(blocks < 2147483647u ? blocks : 2147483647u);
}

void check_routing(const Routing& r) {
  if (r.num_tokens < 0 || r.num_experts < 1 || r.capacity < 0 || r.top_k < 1 || r.top_k > 8) {
    throw ArgumentError("kernels::cuda: bad routing shape");
  }
}

// --- gate ----------------------------------------------------------------------------------------

// One thread per token: kernels/rules.hpp route_token (softmax, top-k on the logits, weights),
// with the token's choices in registers before they are stored.
__global__ void topk_kernel(int s, int e, int k, bool normalize, int group, int limit,
                            const float* __restrict__ logits, int* __restrict__ expert,
                            float* __restrict__ weight, float* __restrict__ top_prob) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= s) return;
  std::int32_t chosen[rules::kMaxTopK];
  float w[rules::kMaxTopK];
  top_prob[t] = rules::route_token(logits + static_cast<std::size_t>(t) * e, e, k, normalize,
                                   chosen, w, group, limit);
  for (int c = 0; c < k; ++c) {
    expert[static_cast<std::size_t>(t) * k + c] = chosen[c];
    weight[static_cast<std::size_t>(t) * k + c] = w[c];
  }
}

// One warp per token for wide gates (E >= kWarpTopKMinExperts): the same rule as topk_kernel
// (rules::route_token: the k largest logits, the lower index first on ties; node-limited groups
// by rules::choose_groups), with the row in shared memory and each choice found by a warp-wide
// argmax. One thread walking E experts k times was 750 us at S = 8,192, E = 256, top-8 on an
// H200 (64 blocks, each thread reading its own 1 KiB row k + 2 times). The choices and the
// argmax are exact; the softmax sum is a tree over the lanes (an ulp from the sequential sum, as
// expf on the device already is from the host's).
constexpr int kWarpTopKMinExperts = 64;
constexpr int kWarpTopKWarps = 4;

__global__ void topk_warp_kernel(int s, int e, int k, bool normalize, int group, int limit,
                                 const float* __restrict__ logits, int* __restrict__ expert,
                                 float* __restrict__ weight, float* __restrict__ top_prob) {
  extern __shared__ float rows[];  // kWarpTopKWarps x e
  __shared__ std::int32_t groups_of[kWarpTopKWarps][rules::kMaxTopK];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarpTopKWarps + warp;
  if (t >= s) return;  // whole warps leave: only __syncwarp below
  float* row = rows + static_cast<std::size_t>(warp) * e;
  const float* src = logits + static_cast<std::size_t>(t) * e;
  for (int j = lane; j < e; j += 32) row[j] = src[j];
  __syncwarp();
  float mx = -INFINITY;
  for (int j = lane; j < e; j += 32) mx = fmaxf(mx, row[j]);
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sum = 0.0f;
  for (int j = lane; j < e; j += 32) sum += expf(row[j] - mx);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  const bool limited = rules::group_limit_binds(e, k, group, limit);
  if (limited) {
    if (lane == 0) rules::choose_groups(row, e, k, group, limit, groups_of[warp]);
    __syncwarp();
  }
  std::int32_t chosen[rules::kMaxTopK];
  float chosen_sum = 0.0f, top = 0.0f;
  for (int c = 0; c < k; ++c) {
    int best = -1;
    float best_v = 0.0f;
    for (int j = lane; j < e; j += 32) {
      if (!rules::choice_open(j, chosen, c, limited, groups_of[warp], limit, group)) continue;
      if (best < 0 || row[j] > best_v) {  // ascending j: the lower index keeps a tie
        best = j;
        best_v = row[j];
      }
    }
    for (int off = 16; off > 0; off /= 2) {
      const int ob = __shfl_xor_sync(0xffffffffu, best, off);
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
      if (ob >= 0 && (best < 0 || ov > best_v || (ov == best_v && ob < best))) {
        best = ob;
        best_v = ov;
      }
    }
    chosen[c] = best;
    const float p = expf(row[best] - mx) / sum;
    chosen_sum += p;
    if (c == 0) top = p;
    if (lane == 0) {
      expert[static_cast<std::size_t>(t) * k + c] = best;
      weight[static_cast<std::size_t>(t) * k + c] = p;
    }
  }
  if (lane == 0) {
    if (normalize)
      for (int c = 0; c < k; ++c) weight[static_cast<std::size_t>(t) * k + c] /= chosen_sum;
    top_prob[t] = top;
  }
}

__global__ void iota_kernel(int n, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i;
}

// Capacity slots in three passes over tiles of kCapTile entries in priority order (choice level,
// then token order; kernels/rules.hpp priority_entry), so the result equals the sequential rule:
// an expert's slot for an entry is the number of that expert's entries before it.
//  1. capacity_hist_kernel: per tile, how many entries each expert has (shared-memory histogram);
//  2. capacity_base_kernel: per expert, the exclusive sum of those over the tiles, and its count;
//  3. capacity_slot_kernel: per (expert, tile) with entries, each thread takes kCapPerThread
//     consecutive entries, one block-wide scan ranks them, slot = tile base + rank.
// (The first version gave each expert one block that walked all S k entries with a block scan
// per 256: S k / 256 dependent steps, about 150 us at S = 16,384, k = 2 on an H200, more than
// the decode kernel.)
constexpr int kScanThreads = 256;
constexpr int kCapPerThread = 8;
constexpr int kCapTile = kScanThreads * kCapPerThread;

// kShared: the histogram in shared memory (E ints, up to kCapSharedExperts); otherwise straight
// into tile_count with global atomics (zeroed beforehand), for gates wider than shared memory.
constexpr int kCapSharedExperts = 12 * 1024;

template <bool kShared>
__global__ void capacity_hist_kernel(long long total, int s, int k, int e,
                                     const int* __restrict__ order, const int* __restrict__ expert,
                                     int* __restrict__ tile_count) {
  extern __shared__ int hist[];
  const long long tiles = (total + kCapTile - 1) / kCapTile;
  for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    int* h = kShared ? hist : tile_count + tile * e;
    if (kShared) {
      for (int i = threadIdx.x; i < e; i += blockDim.x) hist[i] = 0;
      __syncthreads();
    }
    const long long p0 = tile * kCapTile;
    for (int i = threadIdx.x; i < kCapTile; i += blockDim.x) {
      const long long p = p0 + i;
      if (p < total) {
        const int ex = expert[rules::priority_entry(p, s, k, order)];
        if (ex >= 0 && ex < e) atomicAdd(&h[ex], 1);
      }
    }
    if (kShared) {
      __syncthreads();
      for (int i = threadIdx.x; i < e; i += blockDim.x) tile_count[tile * e + i] = hist[i];
      __syncthreads();  // hist is cleared for the next tile
    }
  }
}

__global__ void capacity_base_kernel(long long tiles, int e, int capacity,
                                     const int* __restrict__ tile_count,
                                     int* __restrict__ tile_base, int* __restrict__ expert_count) {
  const int ex = blockIdx.x * blockDim.x + threadIdx.x;
  if (ex >= e) return;
  int sum = 0;
  for (long long t = 0; t < tiles; ++t) {
    tile_base[t * e + ex] = sum;
    sum += tile_count[t * e + ex];
  }
  if (expert_count) expert_count[ex] = sum < capacity ? sum : capacity;
}

__global__ void capacity_slot_kernel(long long total, int s, int k, int e, int capacity,
                                     const int* __restrict__ order, const int* __restrict__ expert,
                                     const int* __restrict__ tile_count,
                                     const int* __restrict__ tile_base, int* __restrict__ slot,
                                     int* __restrict__ slot_entry) {
  using Scan = cub::BlockScan<int, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int ex = blockIdx.x;
  const long long tiles = (total + kCapTile - 1) / kCapTile;
  for (long long tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    if (tile_count[tile * e + ex] == 0) continue;  // uniform over the block
    const long long p0 = tile * kCapTile + static_cast<long long>(threadIdx.x) * kCapPerThread;
    long long entry[kCapPerThread];
    int n = 0;
#pragma unroll
    for (int j = 0; j < kCapPerThread; ++j) {
      entry[j] = -1;
      const long long p = p0 + j;
      if (p < total) {
        const long long en = rules::priority_entry(p, s, k, order);
        if (expert[en] == ex) {
          entry[j] = en;
          ++n;
        }
      }
    }
    int rank = 0;
    Scan(temp).ExclusiveSum(n, rank);
    int sl = tile_base[tile * e + ex] + rank;
#pragma unroll
    for (int j = 0; j < kCapPerThread; ++j) {
      if (entry[j] < 0) continue;
      if (sl < capacity) {
        slot[entry[j]] = sl;
        if (slot_entry)
          slot_entry[static_cast<std::size_t>(ex) * capacity + sl] = static_cast<int>(entry[j]);
      } else {
        slot[entry[j]] = -1;
      }
      ++sl;
    }
    __syncthreads();  // temp storage is reused by the next tile
  }
}

__global__ void slot_index_kernel(long long entries, int num_experts, int capacity,
                                  const int* __restrict__ expert, const int* __restrict__ slot,
                                  int* __restrict__ slot_entry) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= entries) return;
  const int sl = slot[i], ex = expert[i];
  // Out-of-range entries are ignored on the device (the CPU twin throws ArgumentError).
  if (sl < 0 || sl >= capacity || ex < 0 || ex >= num_experts) return;
  slot_entry[static_cast<std::size_t>(ex) * capacity + sl] = static_cast<int>(i);
}

// --- encode / decode -----------------------------------------------------------------------------

constexpr int kRowThreads = 128;

// dispatched row (e, s) = x row of the entry's token, zeros when empty. V is a 16-, 4- or 2-byte
// word; row_words rows of V.
template <typename V>
__global__ void encode_kernel(std::size_t rows, int row_words, int k,
                              const int* __restrict__ slot_entry, const V* __restrict__ x,
                              V* __restrict__ out) {
  for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int entry = slot_entry[row];
    V* dst = out + row * row_words;
    if (entry < 0) {
      V zero{};
      for (int i = threadIdx.x; i < row_words; i += blockDim.x) dst[i] = zero;
    } else {
      const V* src = x + static_cast<std::size_t>(entry / k) * row_words;
#pragma unroll 4
      for (int i = threadIdx.x; i < row_words; i += blockDim.x) dst[i] = src[i];
    }
  }
}

// Accumulate w * v into acc, and round acc into o, N elements at a time: fp16 / bf16 convert in
// pairs (one packed conversion per two elements, Pair), fp32 and odd N one by one.
template <typename T>
struct Pair {  // no packed type: element by element
  static constexpr bool kPacked = false;
};
template <>
struct Pair<__half> {
  static constexpr bool kPacked = true;
  using P = __half2;
  __device__ static float2 widen(P p) { return __half22float2(p); }
  __device__ static P narrow(float a, float b) { return __floats2half2_rn(a, b); }
};
template <>
struct Pair<__nv_bfloat16> {
  static constexpr bool kPacked = true;
  using P = __nv_bfloat162;
  __device__ static float2 widen(P p) { return __bfloat1622float2(p); }
  __device__ static P narrow(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

template <typename T, int N>
__device__ __forceinline__ void fma_vec(float (&acc)[N], float w, const Vec<T, N>& v) {
  if constexpr (Pair<T>::kPacked && N % 2 == 0) {
    using P = typename Pair<T>::P;
#pragma unroll
    for (int j = 0; j < N; j += 2) {
      const float2 f = Pair<T>::widen(*reinterpret_cast<const P*>(&v.v[j]));
      acc[j] += w * f.x;
      acc[j + 1] += w * f.y;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] += w * to_f(v.v[j]);
  }
}
template <typename T, int N>
__device__ __forceinline__ void round_vec(const float (&acc)[N], Vec<T, N>& o) {
  if constexpr (Pair<T>::kPacked && N % 2 == 0) {
    using P = typename Pair<T>::P;
#pragma unroll
    for (int j = 0; j < N; j += 2)
      *reinterpret_cast<P*>(&o.v[j]) = Pair<T>::narrow(acc[j], acc[j + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) o.v[j] = from_f<T>(acc[j]);
  }
}

// One block per token: out[t] = sum over kept choices of w_c * in[row_c] (kUseWeight) or of
// in[row_c] (encode backward), in choice order. N elements per thread step.
// Every thread reads the token's k (expert, slot, weight) words itself: the whole block reads the
// same few words (one L1 line, broadcast), so there is no serial head on one thread and no
// barrier between tokens. (The first version had thread 0 gather the kept rows into shared
// memory between two __syncthreads: 67% of HBM in fp16 and 52% in bf16 at S = 16,384, M = 4,096
// on an H200.)
// K is k rounded up to 2, 4 or 8: the per-choice registers (K 16-byte words per thread) are sized
// for it, so top-2 holds 2 words rather than 8 (86 registers and 5 blocks per SM in bf16 with
// room for 8 choices).
template <typename T, int N, bool kUseWeight, int K>
__global__ void combine_kernel(int s, int k, int capacity, int m, const int* __restrict__ expert,
                               const int* __restrict__ slot, const float* __restrict__ weight,
                               const T* __restrict__ in, T* __restrict__ out) {
  using V = Vec<T, N>;
  const int words = m / N;
  for (int t = blockIdx.x; t < s; t += gridDim.x) {
    const V* rows[K];
    float ws[K];
#pragma unroll
    for (int c = 0; c < K; ++c) {
      rows[c] = nullptr;
      ws[c] = 0.0f;
      if (c < k) {
        const std::size_t entry = static_cast<std::size_t>(t) * k + c;
        const int sl = slot[entry];
        if (sl >= 0) {
          rows[c] = reinterpret_cast<const V*>(
              in + (static_cast<std::size_t>(expert[entry]) * capacity + sl) * m);
          ws[c] = kUseWeight ? weight[entry] : 1.0f;
        }
      }
    }
    V* dst = reinterpret_cast<V*>(out + static_cast<std::size_t>(t) * m);
#pragma unroll 2
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
      // Issue every choice's load before using any, so each thread keeps up to k 16-byte loads
      // in flight (k <= K: the loop is fully unrolled with a guard).
      V v[K];
#pragma unroll
      for (int c = 0; c < K; ++c)
        if (rows[c] != nullptr) v[c] = rows[c][i];
      float acc[N];
#pragma unroll
      for (int j = 0; j < N; ++j) acc[j] = 0.0f;
#pragma unroll
      for (int c = 0; c < K; ++c)
        if (rows[c] != nullptr) fma_vec(acc, ws[c], v[c]);
      V o;
      round_vec(acc, o);
      dst[i] = o;
    }
  }
}

// grad_expert_out row (e, s) = w_entry * grad_y[token], zeros when empty.
template <typename T, int N>
__global__ void scatter_grad_kernel(std::size_t rows, int k, int m,
                                    const int* __restrict__ slot_entry,
                                    const float* __restrict__ weight, const T* __restrict__ grad_y,
                                    T* __restrict__ out) {
  using V = Vec<T, N>;
  const int words = m / N;
  for (std::size_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int entry = slot_entry[row];
    V* dst = reinterpret_cast<V*>(out + row * m);
    if (entry < 0) {
      V zero;
#pragma unroll
      for (int j = 0; j < N; ++j) zero.v[j] = from_f<T>(0.0f);
      for (int i = threadIdx.x; i < words; i += blockDim.x) dst[i] = zero;
      continue;
    }
    const float w = weight[entry];
    const V* src = reinterpret_cast<const V*>(grad_y + static_cast<std::size_t>(entry / k) * m);
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
      const V v = src[i];
      V o;
#pragma unroll
      for (int j = 0; j < N; ++j) o.v[j] = from_f<T>(w * to_f(v.v[j]));
      dst[i] = o;
    }
  }
}

// grad_weight[entry] = <grad_y[token], expert_out[row]>, one block per entry.
template <typename T, int N>
__global__ void weight_grad_kernel(long long entries, int k, int capacity, int m,
                                   const int* __restrict__ expert, const int* __restrict__ slot,
                                   const T* __restrict__ expert_out, const T* __restrict__ grad_y,
                                   float* __restrict__ grad_weight) {
  using Reduce = cub::BlockReduce<float, kRowThreads>;
  __shared__ typename Reduce::TempStorage temp;
  using V = Vec<T, N>;
  const int words = m / N;
  for (long long entry = blockIdx.x; entry < entries; entry += gridDim.x) {
    const int sl = slot[entry];
    if (sl < 0) {  // uniform across the block
      if (threadIdx.x == 0) grad_weight[entry] = 0.0f;
      continue;
    }
    const V* a = reinterpret_cast<const V*>(
        expert_out + (static_cast<std::size_t>(expert[entry]) * capacity + sl) * m);
    const V* g = reinterpret_cast<const V*>(grad_y + static_cast<std::size_t>(entry / k) * m);
    float dot = 0.0f;
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
      const V av = a[i], gv = g[i];
#pragma unroll
      for (int j = 0; j < N; ++j) dot += to_f(av.v[j]) * to_f(gv.v[j]);
    }
    const float total = Reduce(temp).Sum(dot);
    if (threadIdx.x == 0) grad_weight[entry] = total;
    __syncthreads();
  }
}

// --- stride copy, activation ---------------------------------------------------------------------

template <typename V>
__global__ void stride_copy_kernel(int h, int w, std::size_t chunk_words, const V* __restrict__ src,
                                   V* __restrict__ dst) {
  for (int i = blockIdx.y; i < h * w; i += gridDim.y) {
    const int slot = rules::stride_slot(i, h, w);
    const V* in = src + static_cast<std::size_t>(i) * chunk_words;
    V* out = dst + static_cast<std::size_t>(slot) * chunk_words;
    for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         j < chunk_words; j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
      out[j] = in[j];
    }
  }
}

template <typename T>
__global__ void activation_kernel(std::size_t n, int act, T* data) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    data[i] = from_f<T>(rules::activate(static_cast<Activation>(act), to_f(data[i])));
  }
}

// One thread per (token, choice) entry: the plan-routed combine weight (rules::softmax_prob).
__global__ void softmax_pick_kernel(long long entries, int experts, int k,
                                    const float* __restrict__ logits,
                                    const std::int32_t* __restrict__ expert,
                                    float* __restrict__ weight) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < entries;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int e = expert[i];
    weight[i] =
        e < 0 ? 0.0f
              : rules::softmax_prob(logits + (i / k) * static_cast<long long>(experts), experts, e);
  }
}

// One thread per row: its dot product in element order with unfused products (rules::mul_add),
// the CPU twin's sum.
template <typename T>
__global__ void dot_rows_kernel(int rows, std::size_t row_elems, const T* __restrict__ a,
                                const std::int32_t* __restrict__ a_row, const T* __restrict__ b,
                                const std::int32_t* __restrict__ out_index,
                                float* __restrict__ out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += gridDim.x * blockDim.x) {
    const T* x = a + static_cast<std::size_t>(a_row[i]) * row_elems;
    const T* y = b + static_cast<std::size_t>(i) * row_elems;
    float acc = 0.0f;
    for (std::size_t e = 0; e < row_elems; ++e) acc = rules::mul_add(to_f(x[e]), to_f(y[e]), acc);
    out[out_index[i]] = acc;
  }
}

// One thread per token row: the gate softmax's backward (rules::softmax_backward_row).
__global__ void softmax_backward_kernel(int tokens, int experts, int k,
                                        const float* __restrict__ logits,
                                        const std::int32_t* __restrict__ expert,
                                        const float* __restrict__ grad_weight,
                                        float* __restrict__ grad_logits) {
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < tokens; t += gridDim.x * blockDim.x) {
    const long long first = static_cast<long long>(t) * k;
    rules::softmax_backward_row(logits + static_cast<long long>(t) * experts, experts, k,
                                expert + first, grad_weight + first,
                                grad_logits + static_cast<long long>(t) * experts);
  }
}

template <typename T>
__global__ void relu_backward_kernel(std::size_t n, const T* __restrict__ activated,
                                     T* __restrict__ grad) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    grad[i] = from_f<T>(rules::relu_grad(to_f(activated[i]), to_f(grad[i])));
}

// dst row r += src row r over `count` rows of `run` elements (blockIdx.y walks the rows).
template <typename T>
__global__ void add_rows_kernel(std::size_t run, int count, const T* __restrict__ src,
                                std::size_t src_pitch, T* __restrict__ dst, std::size_t dst_pitch) {
  for (int r = blockIdx.y; r < count; r += gridDim.y) {
    const T* in = src + static_cast<std::size_t>(r) * src_pitch;
    T* out = dst + static_cast<std::size_t>(r) * dst_pitch;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < run;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
      out[i] = from_f<T>(to_f(out[i]) + to_f(in[i]));
  }
}

// dst row i = src row index[i] (blockIdx.y walks the rows; negative index: left as is).
template <typename T>
__global__ void gather_rows_kernel(int rows, std::size_t row_elems, const T* __restrict__ src,
                                   const std::int32_t* __restrict__ index, T* __restrict__ dst) {
  for (int i = blockIdx.y; i < rows; i += gridDim.y) {
    const std::int32_t r = index[i];
    if (r < 0) continue;
    const T* in = src + static_cast<std::size_t>(r) * row_elems;
    T* out = dst + static_cast<std::size_t>(i) * row_elems;
    for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         e < row_elems; e += static_cast<std::size_t>(gridDim.x) * blockDim.x)
      out[e] = in[e];
  }
}

// dst row d += its table's weighted src rows, in table order, in fp32 (one thread per element of
// the row: no two threads write one element, and the order is the CPU twin's).
template <typename T>
__global__ void sum_rows_kernel(int rows, std::size_t row_elems, const T* __restrict__ src,
                                const std::int32_t* __restrict__ begin,
                                const std::int32_t* __restrict__ src_row,
                                const float* __restrict__ weight,
                                const std::int32_t* __restrict__ weight_index,
                                T* __restrict__ dst) {
  for (int d = blockIdx.y; d < rows; d += gridDim.y) {
    const std::int32_t j0 = begin[d], j1 = begin[d + 1];
    T* out = dst + static_cast<std::size_t>(d) * row_elems;
    for (std::size_t e = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         e < row_elems; e += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
      float acc = to_f(out[e]);
      for (std::int32_t j = j0; j < j1; ++j) {
        const float w = weight ? weight[weight_index[j]] : 1.0f;
        acc =
            rules::mul_add(w, to_f(src[static_cast<std::size_t>(src_row[j]) * row_elems + e]), acc);
      }
      out[e] = from_f<T>(acc);
    }
  }
}

template <typename S, typename D>
__global__ void convert_kernel(std::size_t n, const S* __restrict__ src, D* __restrict__ dst) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    dst[i] = from_f<D>(to_f(src[i]));
}

// Largest vector width (in elements of T) for rows of m elements at the given pointers.
template <typename T>
int vec_width(int m, std::initializer_list<const void*> ptrs) {
  constexpr int kWide = static_cast<int>(16 / sizeof(T));
  bool ok = m % kWide == 0;
  for (const void* p : ptrs) ok = ok && (p == nullptr || aligned(p, 16));
  return ok ? kWide : 1;
}

}  // namespace

// --- Context -------------------------------------------------------------------------------------

struct Context::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

Context::Context(int device, Stream stream) : impl_(std::make_unique<Impl>()) {
  if (device < 0) MOESIM_KCUDA_CHECK(cudaGetDevice(&device));
  MOESIM_KCUDA_CHECK(cudaSetDevice(device));
  impl_->device = device;
  impl_->stream = stream;
  MOESIM_KCUBLAS_CHECK(cublasCreate(&impl_->cublas));
  MOESIM_KCUBLAS_CHECK(cublasSetStream(impl_->cublas, stream));
}

Context::~Context() {
  // Destructors never throw: failures here leave nothing the caller could act on.
  if (impl_->workspace) (void)cudaFreeAsync(impl_->workspace, impl_->stream);
  if (impl_->cublas) (void)cublasDestroy(impl_->cublas);
}

int Context::device() const { return impl_->device; }
Stream Context::stream() const { return impl_->stream; }
void Context::set_stream(Stream stream) {
  // The workspace belongs to the old stream's order: released there, reallocated on first use in
  // the new one (another stream may only use it after synchronising with the old).
  if (impl_->workspace && stream != impl_->stream) {
    MOESIM_KCUDA_CHECK(cudaFreeAsync(impl_->workspace, impl_->stream));
    impl_->workspace = nullptr;
    impl_->workspace_bytes = 0;
  }
  impl_->stream = stream;
  MOESIM_KCUBLAS_CHECK(cublasSetStream(impl_->cublas, stream));
}
void Context::synchronize() { MOESIM_KCUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }
void* Context::cublas_handle() { return impl_->cublas; }

void* Context::workspace(std::size_t bytes) {
  if (bytes > impl_->workspace_bytes) {
    // Stream-ordered, on this context's stream: cudaFree would synchronise the whole device,
    // waiting on NCCL kernels of other streams that may themselves wait for peer ranks (a hang),
    // and cudaMalloc outside the pool may do the same. The old block is released after the work
    // queued on the stream that uses it; the new one is valid for the work queued after.
    if (impl_->workspace) MOESIM_KCUDA_CHECK(cudaFreeAsync(impl_->workspace, impl_->stream));
    impl_->workspace = nullptr;
    impl_->workspace_bytes = 0;
    MOESIM_KCUDA_CHECK(cudaMallocAsync(&impl_->workspace, bytes, impl_->stream));
    impl_->workspace_bytes = bytes;
  }
  return impl_->workspace;
}

// --- Kernels -------------------------------------------------------------------------------------

void gemm(Context& ctx, DType dtype, int m, int n, int k, const void* a, const void* b, void* c,
          float alpha, float beta) {
  if (m < 0 || n < 0 || k < 0) throw ArgumentError("kernels::cuda::gemm: negative dimension");
  if (m == 0 || n == 0) return;
  const cudaDataType_t t = cuda_type(dtype);
  // Row-major C = A B is column-major C^T = B^T A^T.
  MOESIM_KCUBLAS_CHECK(cublasGemmEx(static_cast<cublasHandle_t>(ctx.cublas_handle()), CUBLAS_OP_N,
                                    CUBLAS_OP_N, n, m, k, &alpha, b, t, n, a, t, k, &beta, c, t, n,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gate(Context& ctx, DType dtype, const GateParams& params, const void* x, const void* wg,
          float* logits, const RoutingOut& out) {
  if (params.model_dim < 1) throw ArgumentError("kernels::cuda::gate: model_dim must be >= 1");
  const int s = params.num_tokens, m = params.model_dim, e = params.num_experts;
  if (s > 0) {
    const float alpha = 1.0f, beta = 0.0f;
    const cudaDataType_t t = cuda_type(dtype);
    MOESIM_KCUBLAS_CHECK(cublasGemmEx(
        static_cast<cublasHandle_t>(ctx.cublas_handle()), CUBLAS_OP_N, CUBLAS_OP_N, e, s, m, &alpha,
        wg, t, e, x, t, m, &beta, logits, CUDA_R_32F, e, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  gate_from_logits(ctx, params, logits, out);
}

void gate_from_logits(Context& ctx, const GateParams& p, const float* logits,
                      const RoutingOut& out) {
  check_routing(Routing{p.num_tokens, p.top_k, p.num_experts, p.capacity});
  if (p.top_k > p.num_experts) throw ArgumentError("kernels::cuda::gate: top_k > num_experts");
  detail::check_group_limit(p);
  const int s = p.num_tokens, e = p.num_experts, k = p.top_k;
  cudaStream_t stream = ctx.stream();
  if (s == 0) {
    if (out.slot_entry && p.capacity > 0) {
      MOESIM_KCUDA_CHECK(cudaMemsetAsync(
          out.slot_entry, 0xff, sizeof(int) * static_cast<std::size_t>(e) * p.capacity, stream));
    }
    if (out.expert_count) MOESIM_KCUDA_CHECK(cudaMemsetAsync(out.expert_count, 0, 4 * e, stream));
    return;
  }
  // Workspace: top_prob, sorted keys, order in, order out, then CUB's sort scratch.
  std::size_t sort_bytes = 0;
  if (p.batch_prioritized) {
    MOESIM_KCUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        nullptr, sort_bytes, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), s, 0, 32, stream));
  }
  const std::size_t n4 = (static_cast<std::size_t>(s) * 4 + 255) / 256 * 256;
  // Then the capacity passes' per-(tile, expert) counts and bases.
  const std::size_t cap_tiles = (static_cast<std::size_t>(s) * k + kCapTile - 1) / kCapTile;
  const std::size_t nt = (cap_tiles * e * 4 + 255) / 256 * 256;
  char* ws = static_cast<char*>(ctx.workspace(4 * n4 + 2 * nt + sort_bytes));
  float* top_prob = reinterpret_cast<float*>(ws);
  float* keys_out = reinterpret_cast<float*>(ws + n4);
  int* order_in = reinterpret_cast<int*>(ws + 2 * n4);
  int* order_out = reinterpret_cast<int*>(ws + 3 * n4);
  int* tile_count = reinterpret_cast<int*>(ws + 4 * n4);
  int* tile_base = reinterpret_cast<int*>(ws + 4 * n4 + nt);
  const std::size_t warp_rows = sizeof(float) * kWarpTopKWarps * static_cast<std::size_t>(e);
  if (e >= kWarpTopKMinExperts && warp_rows <= 48 * 1024) {
    topk_warp_kernel<<<(s + kWarpTopKWarps - 1) / kWarpTopKWarps, 32 * kWarpTopKWarps, warp_rows,
                       stream>>>(s, e, k, p.normalize_top_k, p.experts_per_group, p.group_limit,
                                 logits, out.expert, out.weight, top_prob);
  } else {
    topk_kernel<<<(s + 127) / 128, 128, 0, stream>>>(s, e, k, p.normalize_top_k,
                                                     p.experts_per_group, p.group_limit, logits,
                                                     out.expert, out.weight, top_prob);
  }
  MOESIM_KCUDA_LAUNCHED();
  const int* order = nullptr;
  if (p.batch_prioritized) {
    iota_kernel<<<(s + 255) / 256, 256, 0, stream>>>(s, order_in);
    MOESIM_KCUDA_LAUNCHED();
    // Radix sort is stable: equal top values keep ascending token order, as on the CPU.
    MOESIM_KCUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(ws + 4 * n4 + 2 * nt, sort_bytes,
                                                                 top_prob, keys_out, order_in,
                                                                 order_out, s, 0, 32, stream));
    order = order_out;
  }
  const long long total = static_cast<long long>(s) * k;
  const long long tiles = (total + kCapTile - 1) / kCapTile;
  if (out.slot_entry && p.capacity > 0) {  // slots nobody takes stay -1
    MOESIM_KCUDA_CHECK(cudaMemsetAsync(
        out.slot_entry, 0xff, sizeof(int) * static_cast<std::size_t>(e) * p.capacity, stream));
  }
  const int hist_blocks = static_cast<int>(std::min<long long>(tiles, 65535));
  if (e <= kCapSharedExperts) {
    capacity_hist_kernel<true>
        <<<hist_blocks, kScanThreads, sizeof(int) * static_cast<std::size_t>(e), stream>>>(
            total, s, k, e, order, out.expert, tile_count);
  } else {
    MOESIM_KCUDA_CHECK(cudaMemsetAsync(tile_count, 0, sizeof(int) * tiles * e, stream));
    capacity_hist_kernel<false>
        <<<hist_blocks, kScanThreads, 0, stream>>>(total, s, k, e, order, out.expert, tile_count);
  }
  MOESIM_KCUDA_LAUNCHED();
  capacity_base_kernel<<<(e + 255) / 256, 256, 0, stream>>>(tiles, e, p.capacity, tile_count,
                                                            tile_base, out.expert_count);
  MOESIM_KCUDA_LAUNCHED();
  capacity_slot_kernel<<<dim3(static_cast<unsigned>(e),
                              static_cast<unsigned>(std::min<long long>(tiles, 65535))),
                         kScanThreads, 0, stream>>>(total, s, k, e, p.capacity, order, out.expert,
                                                    tile_count, tile_base, out.slot,
                                                    out.slot_entry);
  MOESIM_KCUDA_LAUNCHED();
}

void build_slot_index(Context& ctx, const Routing& r, std::int32_t* slot_entry) {
  check_routing(r);
  const std::size_t slots = static_cast<std::size_t>(r.num_experts) * r.capacity;
  if (slots == 0) return;
  MOESIM_KCUDA_CHECK(cudaMemsetAsync(slot_entry, 0xff, sizeof(int) * slots, ctx.stream()));
  const long long entries = static_cast<long long>(r.num_tokens) * r.top_k;
  if (entries == 0) return;
  slot_index_kernel<<<grid_for((entries + 255) / 256), 256, 0, ctx.stream()>>>(
      entries, r.num_experts, r.capacity, r.expert, r.slot, slot_entry);
  MOESIM_KCUDA_LAUNCHED();
}

void encode(Context& ctx, DType dtype, const Routing& r, int model_dim, const void* x,
            void* dispatched) {
  check_routing(r);
  const std::size_t rows = static_cast<std::size_t>(r.num_experts) * r.capacity;
  if (rows == 0 || model_dim == 0) return;
  const std::size_t row_bytes = static_cast<std::size_t>(model_dim) * elem_size(dtype);
  const int grid = grid_for(rows);
  if (row_bytes % 16 == 0 && aligned(x, 16) && aligned(dispatched, 16)) {
    encode_kernel<uint4><<<grid, kRowThreads, 0, ctx.stream()>>>(
        rows, static_cast<int>(row_bytes / 16), r.top_k, r.slot_entry, static_cast<const uint4*>(x),
        static_cast<uint4*>(dispatched));
  } else if (row_bytes % 4 == 0 && aligned(x, 4) && aligned(dispatched, 4)) {
    encode_kernel<unsigned><<<grid, kRowThreads, 0, ctx.stream()>>>(
        rows, static_cast<int>(row_bytes / 4), r.top_k, r.slot_entry,
        static_cast<const unsigned*>(x), static_cast<unsigned*>(dispatched));
  } else {
    encode_kernel<unsigned short><<<grid, kRowThreads, 0, ctx.stream()>>>(
        rows, static_cast<int>(row_bytes / 2), r.top_k, r.slot_entry,
        static_cast<const unsigned short*>(x), static_cast<unsigned short*>(dispatched));
  }
  MOESIM_KCUDA_LAUNCHED();
}

namespace {
template <bool kUseWeight>
void combine(Context& ctx, DType dtype, const Routing& r, int m, const void* in, void* out) {
  check_routing(r);
  if (r.num_tokens == 0 || m == 0) return;
  const int grid = grid_for(static_cast<std::size_t>(r.num_tokens));
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(in);
    T* dst = static_cast<T*>(out);
    const auto launch = [&](auto n_tag, auto k_tag) {
      constexpr int N = decltype(n_tag)::value, K = decltype(k_tag)::value;
      combine_kernel<T, N, kUseWeight, K><<<grid, kRowThreads, 0, ctx.stream()>>>(
          r.num_tokens, r.top_k, r.capacity, m, r.expert, r.slot, r.weight, src, dst);
    };
    const auto for_k = [&](auto n_tag) {
      if (r.top_k <= 2) {
        launch(n_tag, std::integral_constant<int, 2>{});
      } else if (r.top_k <= 4) {
        launch(n_tag, std::integral_constant<int, 4>{});
      } else {
        launch(n_tag, std::integral_constant<int, 8>{});
      }
    };
    if (vec_width<T>(m, {in, out}) > 1) {
      for_k(std::integral_constant<int, static_cast<int>(16 / sizeof(T))>{});
    } else {
      for_k(std::integral_constant<int, 1>{});
    }
  });
  MOESIM_KCUDA_LAUNCHED();
}
}  // namespace

void encode_backward(Context& ctx, DType dtype, const Routing& r, int model_dim,
                     const void* grad_dispatched, void* grad_x) {
  combine<false>(ctx, dtype, r, model_dim, grad_dispatched, grad_x);
}

void decode(Context& ctx, DType dtype, const Routing& r, int model_dim, const void* expert_out,
            void* y) {
  combine<true>(ctx, dtype, r, model_dim, expert_out, y);
}

void decode_backward(Context& ctx, DType dtype, const Routing& r, int model_dim,
                     const void* expert_out, const void* grad_y, void* grad_expert_out,
                     float* grad_weight) {
  check_routing(r);
  const int m = model_dim;
  const std::size_t rows = static_cast<std::size_t>(r.num_experts) * r.capacity;
  const long long entries = static_cast<long long>(r.num_tokens) * r.top_k;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int N = 16 / sizeof(T);
    const T* eo = static_cast<const T*>(expert_out);
    const T* gy = static_cast<const T*>(grad_y);
    T* geo = static_cast<T*>(grad_expert_out);
    const bool wide = vec_width<T>(m, {expert_out, grad_y, grad_expert_out}) > 1;
    if (rows > 0 && m > 0) {
      if (wide) {
        scatter_grad_kernel<T, N><<<grid_for(rows), kRowThreads, 0, ctx.stream()>>>(
            rows, r.top_k, m, r.slot_entry, r.weight, gy, geo);
      } else {
        scatter_grad_kernel<T, 1><<<grid_for(rows), kRowThreads, 0, ctx.stream()>>>(
            rows, r.top_k, m, r.slot_entry, r.weight, gy, geo);
      }
      MOESIM_KCUDA_LAUNCHED();
    }
    if (grad_weight && entries > 0) {
      const int grid = grid_for(static_cast<std::size_t>(entries));
      if (wide) {
        weight_grad_kernel<T, N><<<grid, kRowThreads, 0, ctx.stream()>>>(
            entries, r.top_k, r.capacity, m, r.expert, r.slot, eo, gy, grad_weight);
      } else {
        weight_grad_kernel<T, 1><<<grid, kRowThreads, 0, ctx.stream()>>>(
            entries, r.top_k, r.capacity, m, r.expert, r.slot, eo, gy, grad_weight);
      }
      MOESIM_KCUDA_LAUNCHED();
    }
  });
}

void stride_copy(Context& ctx, const void* src, void* dst, int h, int w, std::size_t chunk_bytes) {
  if (h < 1 || w < 1) throw ArgumentError("kernels::cuda::stride_copy: h and w must be >= 1");
  if (chunk_bytes == 0) return;
  const int chunks = h * w;
  auto launch = [&](auto word) {
    using V = decltype(word);
    const std::size_t words = chunk_bytes / sizeof(V);
    const std::size_t per_chunk = (words + 255) / 256;
    const dim3 grid(static_cast<unsigned>(per_chunk < 1024 ? per_chunk : 1024),
                    static_cast<unsigned>(chunks < 65535 ? chunks : 65535));
    stride_copy_kernel<V><<<grid, 256, 0, ctx.stream()>>>(h, w, words, static_cast<const V*>(src),
                                                          static_cast<V*>(dst));
  };
  if (chunk_bytes % 16 == 0 && aligned(src, 16) && aligned(dst, 16)) {
    launch(uint4{});
  } else if (chunk_bytes % 4 == 0 && aligned(src, 4) && aligned(dst, 4)) {
    launch(0u);
  } else {
    launch(static_cast<unsigned char>(0));
  }
  MOESIM_KCUDA_LAUNCHED();
}

void expert_ffn(Context& ctx, DType dtype, Activation act, const FfnShape& shape, const void* x,
                const void* w1, const void* w2, void* hidden, void* y) {
  const int e = shape.num_experts, rows = shape.rows, m = shape.model_dim, h = shape.hidden_dim;
  if (e < 1 || rows < 0 || m < 1 || h < 1)
    throw ArgumentError("kernels::cuda::expert_ffn: bad shape");
  if (rows == 0) return;
  auto handle = static_cast<cublasHandle_t>(ctx.cublas_handle());
  const cudaDataType_t t = cuda_type(dtype);
  const float alpha = 1.0f, beta = 0.0f;
  const long long x_stride = static_cast<long long>(rows) * m;
  const long long h_stride = static_cast<long long>(rows) * h;
  const long long w_stride = static_cast<long long>(m) * h;
  // hidden_e (rows x H) = X_e (rows x M) W1_e (M x H), as column-major hidden^T = W1^T X^T.
  MOESIM_KCUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, h, rows, m, &alpha, w1, t, h, w_stride, x, t, m, x_stride,
      &beta, hidden, t, h, h_stride, e, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  if (act != Activation::kNone) {
    const std::size_t n = static_cast<std::size_t>(e) * h_stride;
    const int grid = grid_for(std::min<std::size_t>((n + 255) / 256, 65536));
    dispatch(dtype, [&](auto tag) {
      using T = decltype(tag);
      activation_kernel<T>
          <<<grid, 256, 0, ctx.stream()>>>(n, static_cast<int>(act), static_cast<T*>(hidden));
    });
    MOESIM_KCUDA_LAUNCHED();
  }
  // Y_e (rows x M) = hidden_e (rows x H) W2_e (H x M).
  MOESIM_KCUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, CUBLAS_OP_N, CUBLAS_OP_N, m, rows, h, &alpha, w2, t, m, w_stride, hidden, t, h,
      h_stride, &beta, y, t, m, x_stride, e, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched(Context& ctx, DType dtype, int m, int n, int k, const void* a,
                          long long stride_a, const void* b, long long stride_b, void* c,
                          long long stride_c, int batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
    throw ArgumentError("kernels::cuda::gemm_strided_batched: negative dimension, batch or stride");
  if (m == 0 || n == 0 || batch == 0) return;
  const cudaDataType_t t = cuda_type(dtype);
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C_i = A_i B_i is column-major C_i^T = B_i^T A_i^T (as gemm()).
  MOESIM_KCUBLAS_CHECK(cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(ctx.cublas_handle()), CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha,
      b, t, n, stride_b, a, t, k, stride_a, &beta, c, t, n, stride_c, batch, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched_t(Context& ctx, DType dtype, GemmLayout trans, int m, int n, int k,
                            const void* a, long long stride_a, const void* b, long long stride_b,
                            void* c, long long stride_c, int batch, float beta) {
  if (m < 0 || n < 0 || k < 0 || batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
    throw ArgumentError(
        "kernels::cuda::gemm_strided_batched_t: negative dimension, batch or stride");
  if (m == 0 || n == 0 || batch == 0) return;
  const cudaDataType_t t = cuda_type(dtype);
  const float alpha = 1.0f;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: a row-major operand is its
  // own transpose in column-major, so the operation flips where the operand is stored transposed.
  MOESIM_KCUBLAS_CHECK(cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(ctx.cublas_handle()), trans.b ? CUBLAS_OP_T : CUBLAS_OP_N,
      trans.a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, t, trans.b ? k : n, stride_b, a, t,
      trans.a ? m : k, stride_a, &beta, c, trans.c_f32 ? CUDA_R_32F : t, n, stride_c, batch,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void dot_rows(Context& ctx, DType dtype, const void* a, const std::int32_t* a_row, const void* b,
              int rows, std::size_t row_elems, const std::int32_t* out_index, float* out) {
  if (rows < 0) throw ArgumentError("kernels::cuda::dot_rows: negative rows");
  if (rows == 0) return;
  const int grid =
      grid_for(std::min<std::size_t>((static_cast<std::size_t>(rows) + 127) / 128, 65536));
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    dot_rows_kernel<T><<<grid, 128, 0, ctx.stream()>>>(
        rows, row_elems, static_cast<const T*>(a), a_row, static_cast<const T*>(b), out_index, out);
  });
  MOESIM_KCUDA_LAUNCHED();
}

void relu_backward(Context& ctx, DType dtype, const void* activated, void* grad, std::size_t n) {
  if (n == 0) return;
  const int grid = grid_for(std::min<std::size_t>((n + 255) / 256, 65536));
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    relu_backward_kernel<T><<<grid, 256, 0, ctx.stream()>>>(n, static_cast<const T*>(activated),
                                                            static_cast<T*>(grad));
  });
  MOESIM_KCUDA_LAUNCHED();
}

void softmax_backward(Context& ctx, int tokens, int experts, int top_k, const float* logits,
                      const std::int32_t* expert, const float* grad_weight, float* grad_logits) {
  if (tokens < 0 || experts < 1 || top_k < 1)
    throw ArgumentError(
        "kernels::cuda::softmax_backward: needs tokens >= 0, experts >= 1, top_k >= 1");
  if (tokens == 0) return;
  const int grid =
      grid_for(std::min<std::size_t>((static_cast<std::size_t>(tokens) + 127) / 128, 65536));
  softmax_backward_kernel<<<grid, 128, 0, ctx.stream()>>>(tokens, experts, top_k, logits, expert,
                                                          grad_weight, grad_logits);
  MOESIM_KCUDA_LAUNCHED();
}

void activation(Context& ctx, DType dtype, Activation act, void* data, std::size_t n) {
  if (n == 0 || act == Activation::kNone) return;
  const int grid = grid_for(std::min<std::size_t>((n + 255) / 256, 65536));
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    activation_kernel<T>
        <<<grid, 256, 0, ctx.stream()>>>(n, static_cast<int>(act), static_cast<T*>(data));
  });
  MOESIM_KCUDA_LAUNCHED();
}

void softmax_pick(Context& ctx, int tokens, int experts, int top_k, const float* logits,
                  const std::int32_t* expert, float* weight) {
  if (tokens < 0 || experts < 1 || top_k < 1)
    throw ArgumentError("kernels::cuda::softmax_pick: needs tokens >= 0, experts >= 1, top_k >= 1");
  const long long entries = static_cast<long long>(tokens) * top_k;
  if (entries == 0) return;
  const int grid =
      grid_for(static_cast<std::size_t>(std::min<long long>((entries + 255) / 256, 65536)));
  softmax_pick_kernel<<<grid, 256, 0, ctx.stream()>>>(entries, experts, top_k, logits, expert,
                                                      weight);
  MOESIM_KCUDA_LAUNCHED();
}

void add_rows(Context& ctx, DType dtype, const void* src, std::size_t src_pitch, void* dst,
              std::size_t dst_pitch, std::size_t run, int count) {
  if (count < 0) throw ArgumentError("kernels::cuda::add_rows: negative count");
  if (count == 0 || run == 0) return;
  const std::size_t per_row = (run + 255) / 256;
  const dim3 grid(static_cast<unsigned>(per_row < 1024 ? per_row : 1024),
                  static_cast<unsigned>(count < 65535 ? count : 65535));
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    add_rows_kernel<T><<<grid, 256, 0, ctx.stream()>>>(run, count, static_cast<const T*>(src),
                                                       src_pitch, static_cast<T*>(dst), dst_pitch);
  });
  MOESIM_KCUDA_LAUNCHED();
}

namespace {
dim3 row_grid(int rows, std::size_t row_elems) {
  const std::size_t per_row = (row_elems + 255) / 256;
  return dim3(static_cast<unsigned>(per_row < 1024 ? per_row : 1024),
              static_cast<unsigned>(rows < 65535 ? rows : 65535));
}
}  // namespace

void gather_rows(Context& ctx, DType dtype, const void* src, const std::int32_t* index, int rows,
                 std::size_t row_elems, void* dst) {
  if (rows < 0) throw ArgumentError("kernels::cuda::gather_rows: negative rows");
  if (rows == 0 || row_elems == 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    gather_rows_kernel<T><<<row_grid(rows, row_elems), 256, 0, ctx.stream()>>>(
        rows, row_elems, static_cast<const T*>(src), index, static_cast<T*>(dst));
  });
  MOESIM_KCUDA_LAUNCHED();
}

void sum_rows(Context& ctx, DType dtype, const void* src, const std::int32_t* begin,
              const std::int32_t* src_row, const float* weight, const std::int32_t* weight_index,
              int rows, std::size_t row_elems, void* dst) {
  if (rows < 0) throw ArgumentError("kernels::cuda::sum_rows: negative rows");
  if (rows == 0 || row_elems == 0) return;
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    sum_rows_kernel<T><<<row_grid(rows, row_elems), 256, 0, ctx.stream()>>>(
        rows, row_elems, static_cast<const T*>(src), begin, src_row, weight, weight_index,
        static_cast<T*>(dst));
  });
  MOESIM_KCUDA_LAUNCHED();
}

void convert(Context& ctx, DType from, const void* src, DType to, void* dst, std::size_t n) {
  if (n == 0) return;
  const int grid = grid_for(std::min<std::size_t>((n + 255) / 256, 65536));
  dispatch(from, [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch(to, [&](auto d_tag) {
      using D = decltype(d_tag);
      convert_kernel<S, D>
          <<<grid, 256, 0, ctx.stream()>>>(n, static_cast<const S*>(src), static_cast<D*>(dst));
    });
  });
  MOESIM_KCUDA_LAUNCHED();
}

}  // namespace moesim::kernels::cuda
