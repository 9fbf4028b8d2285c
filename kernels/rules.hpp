// The per-element and per-row rules of the MoE kernels, written once for the CPU twins and the
// CUDA kernels: one token's softmax and top-k, the capacity priority order, the
// 2DH stride index and the expert activation. cpu_kernels.cpp and cuda_kernels.cu both call these,
// so the CPU tests exercise the arithmetic and the tie-breaking the GPU runs; what remains
// GPU-only is the parallel decomposition (which thread or block computes which row or entry).
//
// Plain C++17 with no dependency (nvcc compiles this header too), no exceptions, no allocation:
// callers check shapes first. Float maths goes through the C library's float functions (expf,
// tanhf), which CUDA provides on the device; host and device results agree to a few ulp, and the
// discrete decisions (top-k on the logits, not on the probabilities) are exact on both.
#pragma once

#include <math.h>  // exp, expf, tanhf in the global namespace, as CUDA device code has them

#include <cstdint>

#if defined(__CUDACC__)
#define MOESIM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MOESIM_HOST_DEVICE inline
#endif

namespace moesim::kernels {

/// Expert FFN activation. kGelu is the tanh approximation
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (as in GShard / Megatron / Tutel).
enum class Activation { kNone, kRelu, kGelu };

namespace rules {

/// The largest top-k the kernels support (a token's choices live in registers on the GPU).
inline constexpr int kMaxTopK = 8;

/// acc + w * x rounded twice (product, then sum), never fused: the CPU twin and the GPU (where
/// nvcc would contract it to an FMA) add the same floats (sum_rows).
MOESIM_HOST_DEVICE float mul_add(float w, float x, float acc) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(w, x), acc);
#else
  const volatile float product = w * x;  // a separate rounding whatever the host's contraction
  return product + acc;
#endif
}

/// act(x) for one element.
MOESIM_HOST_DEVICE float activate(Activation act, float x) {
  if (act == Activation::kRelu) return x > 0.0f ? x : 0.0f;
  if (act == Activation::kGelu) {
    const float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  }
  return x;
}

/// Node-limited routing (DeepSeek's device-limited routing, workload.routing.node_limit): with
/// `group` >= 1, experts [g * group, (g + 1) * group) form group g (the experts of one node); a
/// `limit` below both k and the number of groups makes the token pick `limit` groups first,
/// by score = the sum of the group's ceil(k / limit) largest logits (added largest first; ties:
/// the lower group), and then its k choices among those groups' experts only. The weights stay
/// the softmax over all e experts. Otherwise (group or limit 0, or a limit that cannot bind)
/// every expert is eligible. Group scores are sums of logits, not of probabilities, so that the
/// CPU and the GPU, adding the same floats in the same order, pick the same groups.
MOESIM_HOST_DEVICE bool group_limit_binds(int e, int k, int group, int limit) {
  return group >= 1 && limit >= 1 && limit < k && e % group == 0 && limit < e / group;
}

/// The score of group g (see group_limit_binds): the sum of its r largest logits.
MOESIM_HOST_DEVICE float group_score(const float* row, int g, int group, int r) {
  std::int32_t taken[kMaxTopK];
  float score = 0.0f;
  for (int c = 0; c < r && c < group; ++c) {
    int best = -1;
    for (int j = g * group; j < (g + 1) * group; ++j) {
      bool used = false;
      for (int cc = 0; cc < c; ++cc) used = used || taken[cc] == j;
      if (used) continue;
      if (best < 0 || row[j] > row[best]) best = j;
    }
    taken[c] = best;
    score += row[best];
  }
  return score;
}

/// The `limit` groups a token's choices come from when the limit binds (group_limit_binds): the
/// groups with the highest group_score (r = ceil(k / limit)), the lower group first on ties.
MOESIM_HOST_DEVICE void choose_groups(const float* row, int e, int k, int group, int limit,
                                      std::int32_t* groups) {
  const int r = (k + limit - 1) / limit;
  for (int a = 0; a < limit; ++a) {
    int best = -1;
    float best_score = 0.0f;
    for (int g = 0; g < e / group; ++g) {
      bool used = false;
      for (int aa = 0; aa < a; ++aa) used = used || groups[aa] == g;
      if (used) continue;
      const float sc = group_score(row, g, group, r);
      if (best < 0 || sc > best_score) {  // strict: the lower group keeps a tie
        best = g;
        best_score = sc;
      }
    }
    groups[a] = best;
  }
}

/// Whether expert j may be a token's choice c: none of its choices 0..c-1 (chosen[]) and, when
/// the group limit binds, in one of its `limit` groups (choose_groups). The rule of route_token's
/// top-k, shared with the GPU's warp-per-token top-k.
MOESIM_HOST_DEVICE bool choice_open(int j, const std::int32_t* chosen, int c, bool limited,
                                    const std::int32_t* groups, int limit, int group) {
  bool used = false;
  for (int cc = 0; cc < c; ++cc) used = used || chosen[cc] == j;
  if (limited) {
    bool eligible = false;
    for (int a = 0; a < limit; ++a) eligible = eligible || groups[a] == j / group;
    used = used || !eligible;
  }
  return !used;
}

/// The softmax probability of expert `chosen` for one token's `e` logits, in double (the
/// plan-routed layers' combine weight: the plan chose the expert, the gate weighs it).
MOESIM_HOST_DEVICE float softmax_prob(const float* row, int e, int chosen) {
  float mx = row[0];
  for (int j = 1; j < e; ++j) mx = row[j] > mx ? row[j] : mx;
  double sum = 0.0;
  for (int j = 0; j < e; ++j) sum += exp(static_cast<double>(row[j] - mx));
  return static_cast<float>(exp(static_cast<double>(row[chosen] - mx)) / sum);
}

/// The backward of the gate's softmax for one token's `e` logits: g_j = the sum of grad_weight[c]
/// over its `k` choices c with expert[c] == j (expert < 0: a dropped choice, skipped), and
/// grad_row[j] = p_j (g_j - <p, g>) with p = softmax(row) (in double, as softmax_prob). The
/// weights are the softmax over all e experts, so every logit gets a gradient.
MOESIM_HOST_DEVICE void softmax_backward_row(const float* row, int e, int k,
                                             const std::int32_t* expert, const float* grad_weight,
                                             float* grad_row) {
  float mx = row[0];
  for (int j = 1; j < e; ++j) mx = row[j] > mx ? row[j] : mx;
  double sum = 0.0;
  for (int j = 0; j < e; ++j) sum += exp(static_cast<double>(row[j] - mx));
  double pg = 0.0;
  for (int c = 0; c < k; ++c)
    if (expert[c] >= 0) pg += exp(static_cast<double>(row[expert[c]] - mx)) / sum * grad_weight[c];
  for (int j = 0; j < e; ++j) {
    double g = 0.0;
    for (int c = 0; c < k; ++c) g += expert[c] == j ? static_cast<double>(grad_weight[c]) : 0.0;
    grad_row[j] = static_cast<float>(exp(static_cast<double>(row[j] - mx)) / sum * (g - pg));
  }
}

/// The ReLU's backward on its output: the gradient passes where the unit was active.
MOESIM_HOST_DEVICE float relu_grad(float activated, float grad) {
  return activated > 0.0f ? grad : 0.0f;
}

/// One token's routing: softmax over its `e` logits, then its `k` choices (1 <= k <= min(e,
/// kMaxTopK)): the k largest logits in descending order, the lower expert index first on ties
/// (top-k on the logits, which the softmax preserves, so CPU and GPU choose alike). Writes
/// expert[0..k) and weight[0..k) (the softmax probability of each choice, renormalised to sum to
/// 1 over the k choices when `normalize`). Returns the top choice's probability before any
/// renormalisation (the batch-prioritised capacity order sorts tokens by it). `group` and `limit`:
/// node-limited routing, above (the choices come from the token's groups only).
MOESIM_HOST_DEVICE float route_token(const float* row, int e, int k, bool normalize,
                                     std::int32_t* expert, float* weight, int group = 0,
                                     int limit = 0) {
  // The token's groups when the limit binds (limit < k <= kMaxTopK, so they fit in registers).
  const bool limited = group_limit_binds(e, k, group, limit);
  std::int32_t groups[kMaxTopK];
  if (limited) choose_groups(row, e, k, group, limit, groups);
  float mx = row[0];
  for (int j = 1; j < e; ++j) mx = row[j] > mx ? row[j] : mx;
  float sum = 0.0f;
  for (int j = 0; j < e; ++j) sum += expf(row[j] - mx);
  float chosen_sum = 0.0f, top = 0.0f;
  for (int c = 0; c < k; ++c) {
    int best = -1;
    for (int j = 0; j < e; ++j) {
      if (!choice_open(j, expert, c, limited, groups, limit, group)) continue;
      if (best < 0 || row[j] > row[best]) best = j;  // strict: the lower index keeps a tie
    }
    expert[c] = best;
    const float p = expf(row[best] - mx) / sum;
    weight[c] = p;
    chosen_sum += p;
    if (c == 0) top = p;
  }
  if (normalize) {
    for (int c = 0; c < k; ++c) weight[c] /= chosen_sum;
  }
  return top;
}

/// The capacity rule's priority order over the s*k routing entries (entry = token*k + choice):
/// position p holds choice level c = p / s (every token's first choice before any second
/// choice), and within a level the token order[p % s] (`order` null: token p % s, i.e. index
/// order). An expert's slots go to its entries in this order, first come first served.
MOESIM_HOST_DEVICE std::int64_t priority_entry(std::int64_t p, std::int64_t s, int k,
                                               const std::int32_t* order) {
  const std::int64_t c = p / s, pos = p % s;
  const std::int64_t t = order ? order[pos] : pos;
  return t * k + c;
}

/// The 2DH stride copy T(h, w) on h*w chunks: input chunk i = a*h + j goes to output slot
/// j*w + a (strategies/collectives stride_copy_index, which plans the copy, states the same
/// formula; a test checks the two agree).
MOESIM_HOST_DEVICE int stride_slot(int i, int h, int w) { return (i % h) * w + i / h; }

}  // namespace rules
}  // namespace moesim::kernels
