// CPU reference twins of the MoE kernels (moe_kernels.hpp). They define the semantics the CUDA
// kernels are tested against, so they favour plain, obviously correct loops; only the GEMM is
// blocked (and optionally threaded) because the expert FFN reference runs at real sizes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kernels/errors.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::kernels::cpu {
namespace {

// Typed element access: the dtype switch is hoisted out of the loops by dispatch().
struct F32 {
  using Storage = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
// All 65,536 half values as floats (256 KiB): a table load is several times faster than the
// bit manipulation in the gather / scatter loops.
const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) t[i] = half_to_float(static_cast<std::uint16_t>(i));
    return t;
  }();
  return table.data();
}

struct F16 {
  using Storage = std::uint16_t;
  static float load(std::uint16_t v) { return half_table()[v]; }
  static std::uint16_t store(float v) { return float_to_half(v); }
};
struct BF16 {
  using Storage = std::uint16_t;
  static float load(std::uint16_t v) { return bf16_to_float(v); }
  static std::uint16_t store(float v) { return float_to_bf16(v); }
};

template <typename Fn>
void dispatch(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      fn(F32{});
      return;
    case DType::kF16:
      fn(F16{});
      return;
    case DType::kBF16:
      fn(BF16{});
      return;
  }
  throw ArgumentError("kernels: unknown dtype");
}

void check_routing(const Routing& r) {
  if (r.num_tokens < 0 || r.num_experts < 1 || r.capacity < 0 || r.top_k < 1 || r.top_k > 8) {
    throw ArgumentError("kernels: bad routing shape (S=" + std::to_string(r.num_tokens) + ", E=" +
                        std::to_string(r.num_experts) + ", C=" + std::to_string(r.capacity) +
                        ", k=" + std::to_string(r.top_k) + ")");
  }
}

// C (m x n, fp32) = A (m x k) * B (k x n), all fp32, rows [row_begin, row_end). Blocked over k and
// n so a block of B stays in cache; the i-k-j order vectorises the inner loop. Every element sums
// its k products in order, each product rounded then added (no FMA contraction: x86-64's baseline
// has no FMA, and the AVX2 clone does not enable it), so the result is bitwise the same whatever
// the rows' split, the clone the CPU picks, or the caller (the --check reference takes its ReLU
// mask from this GEMM). The AVX2 clone, where the CPU has it, is 8 floats wide instead of 4.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void gemm_rows_f32(int row_begin, int row_end, int n, int k, const float* a, const float* b,
                   float* c) {
  constexpr int kBlockK = 128;
  constexpr int kBlockN = 512;
  for (int i = row_begin; i < row_end; ++i)
    std::fill(c + std::size_t(i) * n, c + std::size_t(i) * n + n, 0.0f);
  for (int k0 = 0; k0 < k; k0 += kBlockK) {
    const int k1 = std::min(k, k0 + kBlockK);
    for (int n0 = 0; n0 < n; n0 += kBlockN) {
      const int n1 = std::min(n, n0 + kBlockN);
      for (int i = row_begin; i < row_end; ++i) {
        float* ci = c + std::size_t(i) * n;
        const float* ai = a + std::size_t(i) * k;
        for (int kk = k0; kk < k1; ++kk) {
          const float av = ai[kk];
          const float* bk = b + std::size_t(kk) * n;
          for (int j = n0; j < n1; ++j) ci[j] += av * bk[j];
        }
      }
    }
  }
}

void gemm_f32(int num_threads, int m, int n, int k, const float* a, const float* b, float* c) {
  const int threads = std::max(1, std::min(num_threads, m));
  if (threads == 1) {
    gemm_rows_f32(0, m, n, k, a, b, c);
    return;
  }
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int r0 = int(std::int64_t(m) * t / threads);
    const int r1 = int(std::int64_t(m) * (t + 1) / threads);
    pool.emplace_back([=] { gemm_rows_f32(r0, r1, n, k, a, b, c); });
  }
  for (auto& th : pool) th.join();
}

std::vector<float> to_f32(DType dtype, const void* data, std::size_t n) {
  std::vector<float> out(n);
  convert(dtype, data, DType::kF32, out.data(), n);
  return out;
}

}  // namespace

Context::Context(int num_threads) : num_threads_(std::max(1, num_threads)) {}

void gemm(Context& ctx, DType dtype, int m, int n, int k, const void* a, const void* b, void* c,
          float alpha, float beta) {
  if (m < 0 || n < 0 || k < 0) throw ArgumentError("kernels::gemm: negative dimension");
  if (dtype == DType::kF32) {
    // fp32: no conversion copies; C is written in place unless it overlaps an input.
    const auto* af = static_cast<const float*>(a);
    const auto* bf = static_cast<const float*>(b);
    auto* cf = static_cast<float*>(c);
    const std::size_t mn = std::size_t(m) * n;
    auto overlaps = [&](const float* p, std::size_t len) {
      return len > 0 && mn > 0 && p < cf + mn && cf < p + len;
    };
    const bool alias = overlaps(af, std::size_t(m) * k) || overlaps(bf, std::size_t(k) * n);
    if (alpha == 1.0f && beta == 0.0f && !alias) {
      gemm_f32(ctx.num_threads(), m, n, k, af, bf, cf);
      return;
    }
    std::vector<float> prod(mn);
    gemm_f32(ctx.num_threads(), m, n, k, af, bf, prod.data());
    if (beta == 0.0f)
      for (std::size_t i = 0; i < mn; ++i) cf[i] = alpha * prod[i];
    else
      for (std::size_t i = 0; i < mn; ++i) cf[i] = alpha * prod[i] + beta * cf[i];
    return;
  }
  const std::vector<float> af = to_f32(dtype, a, std::size_t(m) * k);
  const std::vector<float> bf = to_f32(dtype, b, std::size_t(k) * n);
  std::vector<float> cf(std::size_t(m) * n);
  gemm_f32(ctx.num_threads(), m, n, k, af.data(), bf.data(), cf.data());
  for (std::size_t i = 0; i < cf.size(); ++i) {
    const float old = beta != 0.0f ? load_element(dtype, c, i) : 0.0f;
    store_element(dtype, c, i, alpha * cf[i] + beta * old);
  }
}

void gate(Context& ctx, DType dtype, const GateParams& params, const void* x, const void* wg,
          float* logits, const RoutingOut& out) {
  if (params.model_dim < 1) throw ArgumentError("kernels::gate: model_dim must be >= 1");
  const int s = params.num_tokens, m = params.model_dim, e = params.num_experts;
  const std::vector<float> xf = to_f32(dtype, x, std::size_t(s) * m);
  const std::vector<float> wf = to_f32(dtype, wg, std::size_t(m) * e);
  gemm_f32(ctx.num_threads(), s, e, m, xf.data(), wf.data(), logits);
  gate_from_logits(ctx, params, logits, out);
}

void gate_from_logits(Context&, const GateParams& p, const float* logits, const RoutingOut& out) {
  check_routing(Routing{p.num_tokens, p.top_k, p.num_experts, p.capacity});
  if (p.top_k > p.num_experts) throw ArgumentError("kernels::gate: top_k > num_experts");
  detail::check_group_limit(p);
  const int s = p.num_tokens, e = p.num_experts, k = p.top_k;
  std::vector<float> top_prob(s);
  for (int t = 0; t < s; ++t) {
    top_prob[t] = rules::route_token(
        logits + std::size_t(t) * e, e, k, p.normalize_top_k, out.expert + std::size_t(t) * k,
        out.weight + std::size_t(t) * k, p.experts_per_group, p.group_limit);
  }
  // Capacity locations: choice level by choice level, tokens in priority order.
  std::vector<std::int32_t> order(s);
  std::iota(order.begin(), order.end(), 0);
  if (p.batch_prioritized) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return top_prob[a] > top_prob[b]; });
  }
  std::vector<std::int32_t> count(e, 0);
  if (out.slot_entry) std::fill(out.slot_entry, out.slot_entry + std::size_t(e) * p.capacity, -1);
  for (std::int64_t q = 0; q < std::int64_t(s) * k; ++q) {
    const auto entry = static_cast<std::size_t>(rules::priority_entry(q, s, k, order.data()));
    const int ex = out.expert[entry];
    if (count[ex] < p.capacity) {
      out.slot[entry] = count[ex];
      if (out.slot_entry) out.slot_entry[std::size_t(ex) * p.capacity + count[ex]] = int(entry);
      ++count[ex];
    } else {
      out.slot[entry] = -1;
    }
  }
  if (out.expert_count) std::copy(count.begin(), count.end(), out.expert_count);
}

void build_slot_index(Context&, const Routing& r, std::int32_t* slot_entry) {
  check_routing(r);
  std::fill(slot_entry, slot_entry + std::size_t(r.num_experts) * r.capacity, -1);
  const std::size_t entries = std::size_t(r.num_tokens) * r.top_k;
  for (std::size_t i = 0; i < entries; ++i) {
    if (r.slot[i] < 0) continue;
    if (r.expert[i] < 0 || r.expert[i] >= r.num_experts || r.slot[i] >= r.capacity) {
      throw ArgumentError("kernels::build_slot_index: entry " + std::to_string(i) +
                          " out of range (expert " + std::to_string(r.expert[i]) + ", slot " +
                          std::to_string(r.slot[i]) + ")");
    }
    slot_entry[std::size_t(r.expert[i]) * r.capacity + r.slot[i]] = std::int32_t(i);
  }
}

void encode(Context&, DType dtype, const Routing& r, int model_dim, const void* x,
            void* dispatched) {
  check_routing(r);
  const std::size_t row_bytes = std::size_t(model_dim) * dtype_size(dtype);
  const auto* src = static_cast<const std::byte*>(x);
  auto* dst = static_cast<std::byte*>(dispatched);
  const std::size_t rows = std::size_t(r.num_experts) * r.capacity;
  for (std::size_t row = 0; row < rows; ++row) {
    const int entry = r.slot_entry[row];
    if (entry < 0) {
      std::memset(dst + row * row_bytes, 0, row_bytes);
    } else {
      std::memcpy(dst + row * row_bytes, src + std::size_t(entry / r.top_k) * row_bytes, row_bytes);
    }
  }
}

void encode_backward(Context&, DType dtype, const Routing& r, int model_dim,
                     const void* grad_dispatched, void* grad_x) {
  check_routing(r);
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = typename T::Storage;
    const S* g = static_cast<const S*>(grad_dispatched);
    S* out = static_cast<S*>(grad_x);
    std::vector<float> acc(model_dim);
    for (int t = 0; t < r.num_tokens; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int c = 0; c < r.top_k; ++c) {
        const std::size_t entry = std::size_t(t) * r.top_k + c;
        if (r.slot[entry] < 0) continue;
        const S* row = g + (std::size_t(r.expert[entry]) * r.capacity + r.slot[entry]) * model_dim;
        for (int i = 0; i < model_dim; ++i) acc[i] += T::load(row[i]);
      }
      for (int i = 0; i < model_dim; ++i) out[std::size_t(t) * model_dim + i] = T::store(acc[i]);
    }
  });
}

void decode(Context&, DType dtype, const Routing& r, int model_dim, const void* expert_out,
            void* y) {
  check_routing(r);
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = typename T::Storage;
    const S* eo = static_cast<const S*>(expert_out);
    S* out = static_cast<S*>(y);
    std::vector<float> acc(model_dim);
    for (int t = 0; t < r.num_tokens; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int c = 0; c < r.top_k; ++c) {
        const std::size_t entry = std::size_t(t) * r.top_k + c;
        if (r.slot[entry] < 0) continue;
        const float w = r.weight[entry];
        const S* row = eo + (std::size_t(r.expert[entry]) * r.capacity + r.slot[entry]) * model_dim;
        for (int i = 0; i < model_dim; ++i) acc[i] += w * T::load(row[i]);
      }
      for (int i = 0; i < model_dim; ++i) out[std::size_t(t) * model_dim + i] = T::store(acc[i]);
    }
  });
}

void decode_backward(Context&, DType dtype, const Routing& r, int model_dim, const void* expert_out,
                     const void* grad_y, void* grad_expert_out, float* grad_weight) {
  check_routing(r);
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = typename T::Storage;
    const S* eo = static_cast<const S*>(expert_out);
    const S* gy = static_cast<const S*>(grad_y);
    S* geo = static_cast<S*>(grad_expert_out);
    const std::size_t rows = std::size_t(r.num_experts) * r.capacity;
    for (std::size_t row = 0; row < rows; ++row) {
      const int entry = r.slot_entry[row];
      S* dst = geo + row * model_dim;
      if (entry < 0) {
        std::fill(dst, dst + model_dim, T::store(0.0f));
        continue;
      }
      const float w = r.weight[entry];
      const S* g = gy + std::size_t(entry / r.top_k) * model_dim;
      for (int i = 0; i < model_dim; ++i) dst[i] = T::store(w * T::load(g[i]));
    }
    if (!grad_weight) return;
    const std::size_t entries = std::size_t(r.num_tokens) * r.top_k;
    for (std::size_t entry = 0; entry < entries; ++entry) {
      if (r.slot[entry] < 0) {
        grad_weight[entry] = 0.0f;
        continue;
      }
      const S* row = eo + (std::size_t(r.expert[entry]) * r.capacity + r.slot[entry]) * model_dim;
      const S* g = gy + (entry / r.top_k) * model_dim;
      float dot = 0.0f;
      for (int i = 0; i < model_dim; ++i) dot += T::load(g[i]) * T::load(row[i]);
      grad_weight[entry] = dot;
    }
  });
}

void stride_copy(Context&, const void* src, void* dst, int h, int w, std::size_t chunk_bytes) {
  if (h < 1 || w < 1) throw ArgumentError("kernels::stride_copy: h and w must be >= 1");
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(dst);
  for (int i = 0; i < h * w; ++i) {
    const int slot = rules::stride_slot(i, h, w);
    std::memcpy(out + std::size_t(slot) * chunk_bytes, in + std::size_t(i) * chunk_bytes,
                chunk_bytes);
  }
}

void expert_ffn(Context& ctx, DType dtype, Activation act, const FfnShape& shape, const void* x,
                const void* w1, const void* w2, void* hidden, void* y) {
  const int rows = shape.rows, m = shape.model_dim, h = shape.hidden_dim;
  if (shape.num_experts < 1 || rows < 0 || m < 1 || h < 1) {
    throw ArgumentError("kernels::expert_ffn: bad shape");
  }
  const std::size_t es = dtype_size(dtype);
  std::vector<float> hf(std::size_t(rows) * h), yf(std::size_t(rows) * m);
  for (int e = 0; e < shape.num_experts; ++e) {
    const auto* xe = static_cast<const std::byte*>(x) + std::size_t(e) * rows * m * es;
    const auto* w1e = static_cast<const std::byte*>(w1) + std::size_t(e) * m * h * es;
    const auto* w2e = static_cast<const std::byte*>(w2) + std::size_t(e) * h * m * es;
    auto* he = static_cast<std::byte*>(hidden) + std::size_t(e) * rows * h * es;
    auto* ye = static_cast<std::byte*>(y) + std::size_t(e) * rows * m * es;
    const std::vector<float> xf = to_f32(dtype, xe, std::size_t(rows) * m);
    const std::vector<float> w1f = to_f32(dtype, w1e, std::size_t(m) * h);
    const std::vector<float> w2f = to_f32(dtype, w2e, std::size_t(h) * m);
    gemm_f32(ctx.num_threads(), rows, h, m, xf.data(), w1f.data(), hf.data());
    // Round the GEMM output to the dtype before the activation, as the CUDA path does (cuBLAS
    // writes the dtype, then the activation kernel reads it back), so both twins agree bit for bit
    // up to GEMM summation order.
    for (std::size_t i = 0; i < hf.size(); ++i) {
      store_element(dtype, he, i, hf[i]);
      store_element(dtype, he, i, rules::activate(act, load_element(dtype, he, i)));
      hf[i] = load_element(dtype, he, i);
    }
    gemm_f32(ctx.num_threads(), rows, m, h, hf.data(), w2f.data(), yf.data());
    convert(DType::kF32, yf.data(), dtype, ye, yf.size());
  }
}

void gemm_strided_batched(Context& ctx, DType dtype, int m, int n, int k, const void* a,
                          long long stride_a, const void* b, long long stride_b, void* c,
                          long long stride_c, int batch) {
  if (batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
    throw ArgumentError("kernels::gemm_strided_batched: negative batch or stride");
  const std::size_t es = dtype_size(dtype);
  for (int i = 0; i < batch; ++i)
    gemm(ctx, dtype, m, n, k, static_cast<const std::byte*>(a) + i * stride_a * es,
         static_cast<const std::byte*>(b) + i * stride_b * es,
         static_cast<std::byte*>(c) + i * stride_c * es);
}

void gemm_strided_batched_t(Context& ctx, DType dtype, GemmLayout trans, int m, int n, int k,
                            const void* a, long long stride_a, const void* b, long long stride_b,
                            void* c, long long stride_c, int batch, float beta) {
  if (m < 0 || n < 0 || k < 0 || batch < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
    throw ArgumentError("kernels::gemm_strided_batched_t: negative dimension, batch or stride");
  const std::size_t es = dtype_size(dtype);
  const DType ct = trans.c_f32 ? DType::kF32 : dtype;
  const std::size_t mk = std::size_t(m) * k, kn = std::size_t(k) * n, mn = std::size_t(m) * n;
  std::vector<float> af(mk), bf(kn), prod(mn);
  for (int i = 0; i < batch; ++i) {
    const auto* ai = static_cast<const std::byte*>(a) + i * stride_a * es;
    const auto* bi = static_cast<const std::byte*>(b) + i * stride_b * es;
    auto* ci = static_cast<std::byte*>(c) + i * stride_c * dtype_size(ct);
    // op(A) as m x k and op(B) as k x n in fp32, then the plain blocked GEMM.
    for (int r = 0; r < m; ++r)
      for (int q = 0; q < k; ++q)
        af[std::size_t(r) * k + q] =
            load_element(dtype, ai, trans.a ? std::size_t(q) * m + r : std::size_t(r) * k + q);
    for (int r = 0; r < k; ++r)
      for (int q = 0; q < n; ++q)
        bf[std::size_t(r) * n + q] =
            load_element(dtype, bi, trans.b ? std::size_t(q) * k + r : std::size_t(r) * n + q);
    gemm_f32(ctx.num_threads(), m, n, k, af.data(), bf.data(), prod.data());
    for (std::size_t e = 0; e < mn; ++e)
      store_element(ct, ci, e, beta != 0.0f ? prod[e] + beta * load_element(ct, ci, e) : prod[e]);
  }
}

void relu_backward(Context&, DType dtype, const void* activated, void* grad, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    store_element(
        dtype, grad, i,
        rules::relu_grad(load_element(dtype, activated, i), load_element(dtype, grad, i)));
}

void softmax_backward(Context&, int tokens, int experts, int top_k, const float* logits,
                      const std::int32_t* expert, const float* grad_weight, float* grad_logits) {
  if (tokens < 0 || experts < 1 || top_k < 1)
    throw ArgumentError("kernels::softmax_backward: needs tokens >= 0, experts >= 1, top_k >= 1");
  for (int t = 0; t < tokens; ++t) {
    const std::size_t first = std::size_t(t) * top_k;
    for (int c = 0; c < top_k; ++c)
      if (expert[first + c] >= experts)
        throw ArgumentError("kernels::softmax_backward: expert out of range");
    rules::softmax_backward_row(logits + std::size_t(t) * experts, experts, top_k, expert + first,
                                grad_weight + first, grad_logits + std::size_t(t) * experts);
  }
}

void activation(Context&, DType dtype, Activation act, void* data, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    store_element(dtype, data, i, rules::activate(act, load_element(dtype, data, i)));
}

void softmax_pick(Context&, int tokens, int experts, int top_k, const float* logits,
                  const std::int32_t* expert, float* weight) {
  if (tokens < 0 || experts < 1 || top_k < 1)
    throw ArgumentError("kernels::softmax_pick: needs tokens >= 0, experts >= 1, top_k >= 1");
  for (int t = 0; t < tokens; ++t)
    for (int c = 0; c < top_k; ++c) {
      const std::size_t entry = std::size_t(t) * top_k + c;
      const int e = expert[entry];
      if (e >= experts) throw ArgumentError("kernels::softmax_pick: expert out of range");
      weight[entry] =
          e < 0 ? 0.0f : rules::softmax_prob(logits + std::size_t(t) * experts, experts, e);
    }
}

void add_rows(Context&, DType dtype, const void* src, std::size_t src_pitch, void* dst,
              std::size_t dst_pitch, std::size_t run, int count) {
  if (count < 0) throw ArgumentError("kernels::add_rows: negative count");
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = typename T::Storage;
    const S* in = static_cast<const S*>(src);
    S* out = static_cast<S*>(dst);
    for (int r = 0; r < count; ++r)
      for (std::size_t i = 0; i < run; ++i) {
        S& d = out[std::size_t(r) * dst_pitch + i];
        d = T::store(T::load(d) + T::load(in[std::size_t(r) * src_pitch + i]));
      }
  });
}

void gather_rows(Context&, DType dtype, const void* src, const std::int32_t* index, int rows,
                 std::size_t row_elems, void* dst) {
  if (rows < 0) throw ArgumentError("kernels::gather_rows: negative rows");
  const std::size_t bytes = row_elems * dtype_size(dtype);
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(dst);
  for (int i = 0; i < rows; ++i) {
    const std::int32_t r = index[i];
    if (r >= 0) std::memcpy(out + std::size_t(i) * bytes, in + std::size_t(r) * bytes, bytes);
  }
}

void sum_rows(Context&, DType dtype, const void* src, const std::int32_t* begin,
              const std::int32_t* src_row, const float* weight, const std::int32_t* weight_index,
              int rows, std::size_t row_elems, void* dst) {
  if (rows < 0) throw ArgumentError("kernels::sum_rows: negative rows");
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = typename T::Storage;
    const S* in = static_cast<const S*>(src);
    S* out = static_cast<S*>(dst);
    for (int d = 0; d < rows; ++d)
      for (std::size_t e = 0; e < row_elems; ++e) {
        S& o = out[std::size_t(d) * row_elems + e];
        float acc = T::load(o);
        for (std::int32_t j = begin[d]; j < begin[d + 1]; ++j) {
          const float w = weight ? weight[weight_index[j]] : 1.0f;
          acc = rules::mul_add(w, T::load(in[std::size_t(src_row[j]) * row_elems + e]), acc);
        }
        o = T::store(acc);
      }
  });
}

void dot_rows(Context&, DType dtype, const void* a, const std::int32_t* a_row, const void* b,
              int rows, std::size_t row_elems, const std::int32_t* out_index, float* out) {
  if (rows < 0) throw ArgumentError("kernels::dot_rows: negative rows");
  dispatch(dtype, [&](auto tag) {
    using T = decltype(tag);
    using S = typename T::Storage;
    const S* x = static_cast<const S*>(a);
    const S* y = static_cast<const S*>(b);
    for (int i = 0; i < rows; ++i) {
      const S* xr = x + std::size_t(a_row[i]) * row_elems;
      const S* yr = y + std::size_t(i) * row_elems;
      float acc = 0.0f;
      for (std::size_t e = 0; e < row_elems; ++e)
        acc = rules::mul_add(T::load(xr[e]), T::load(yr[e]), acc);
      out[out_index[i]] = acc;
    }
  });
}

}  // namespace moesim::kernels::cpu
