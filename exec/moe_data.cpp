#include "exec/moe_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::exec {

namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void fill_uniform(std::vector<float>& out, std::uint64_t seed, std::uint64_t a, std::uint64_t b,
                  std::uint64_t c, float scale) {
  const std::uint64_t key = splitmix(splitmix(splitmix(splitmix(seed) ^ a) ^ b) ^ c);
  for (size_t i = 0; i < out.size(); ++i) {
    // 24 random bits -> [0, 1) exactly representable, then [-scale, scale).
    const double u = static_cast<double>(splitmix(key + i) >> 40) / 16777216.0;
    out[i] = static_cast<float>((2.0 * u - 1.0) * scale);
  }
}

int token_key_rank(const ParallelismSpec& p, int rank) {
  const int mp = std::max(1, p.mp);
  return rank - rank % mp;
}

std::vector<float> make_tokens(const MoeShape& s, std::uint64_t seed, int iteration, int layer,
                               int rank) {
  std::vector<float> v(static_cast<size_t>(s.tokens) * s.model_dim);
  fill_uniform(v, seed, 1, (static_cast<std::uint64_t>(iteration) << 20) | layer, rank, 1.0f);
  return v;
}

std::vector<float> make_gate_weights(const MoeShape& s, std::uint64_t seed, int layer) {
  std::vector<float> v(static_cast<size_t>(s.model_dim) * s.experts);
  fill_uniform(v, seed, 2, layer, 0, 1.0f / std::sqrt(static_cast<float>(s.model_dim)));
  return v;
}

std::vector<float> make_w1(const MoeShape& s, std::uint64_t seed, int layer, int expert) {
  std::vector<float> v(static_cast<size_t>(s.model_dim) * s.hidden_dim);
  fill_uniform(v, seed, 3, layer, expert, 1.0f / std::sqrt(static_cast<float>(s.model_dim)));
  return v;
}

std::vector<float> make_w2(const MoeShape& s, std::uint64_t seed, int layer, int expert) {
  std::vector<float> v(static_cast<size_t>(s.hidden_dim) * s.model_dim);
  fill_uniform(v, seed, 4, layer, expert, 1.0f / std::sqrt(static_cast<float>(s.hidden_dim)));
  return v;
}

namespace {
int slice_width(const MoeShape& s, int part, int parts) {
  MOESIM_ASSERT(parts >= 1 && part >= 0 && part < parts && s.hidden_dim % parts == 0,
                "hidden dim must split evenly into the expert's slices");
  return s.hidden_dim / parts;
}
}  // namespace

std::vector<float> make_w1_slice(const MoeShape& s, std::uint64_t seed, int layer, int expert,
                                 int part, int parts) {
  const int h = slice_width(s, part, parts), H = s.hidden_dim, M = s.model_dim;
  const std::vector<float> full = make_w1(s, seed, layer, expert);
  std::vector<float> out(static_cast<size_t>(M) * h);
  for (int m = 0; m < M; ++m)
    std::copy_n(&full[static_cast<size_t>(m) * H + static_cast<size_t>(part) * h], h,
                &out[static_cast<size_t>(m) * h]);
  return out;
}

std::vector<float> make_w2_slice(const MoeShape& s, std::uint64_t seed, int layer, int expert,
                                 int part, int parts) {
  const int h = slice_width(s, part, parts), M = s.model_dim;
  const std::vector<float> full = make_w2(s, seed, layer, expert);
  const auto first = full.begin() + static_cast<std::ptrdiff_t>(part) * h * M;
  return std::vector<float>(first, first + static_cast<std::ptrdiff_t>(h) * M);
}

namespace {
// Token t's gate in double: logits (x_t . Wg), and softmax probability p_e = exp(l_e - max) /
// sum, returned as (max, sum) so prob(e) = exp(logit[e] - max) / sum.
std::pair<double, double> reference_gate_row(const MoeShape& s, const std::vector<float>& tokens,
                                             const std::vector<float>& gate_w, int t,
                                             std::vector<double>& logit) {
  const int M = s.model_dim, E = s.experts;
  double mx = -1e300;
  for (int e = 0; e < E; ++e) {
    double acc = 0;
    for (int m = 0; m < M; ++m)
      acc += static_cast<double>(tokens[static_cast<size_t>(t) * M + m]) *
             gate_w[static_cast<size_t>(m) * E + e];
    logit[e] = acc;
    mx = std::max(mx, acc);
  }
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += std::exp(logit[e] - mx);
  return {mx, sum};
}
}  // namespace

std::pair<int, int> node_limit_groups(const Scenario& sc, int rank) {
  const int limit = sc.workload.routing.node_limit;
  if (limit <= 0) return {0, 0};
  const std::vector<std::uint32_t> node = workload::expert_nodes(sc, rank);
  const int E = static_cast<int>(node.size());
  const int nodes = node.empty() ? 0 : static_cast<int>(node.back()) + 1;
  // Equal blocks of consecutive experts: node n holds experts [n * E / nodes, (n + 1) * E / nodes).
  bool blocks = nodes > 0 && E % nodes == 0;
  for (int e = 0; blocks && e < E; ++e) blocks = static_cast<int>(node[e]) == e / (E / nodes);
  if (!blocks)
    throw InputError(sc.location_of("workload.routing.node_limit"), "workload.routing.node_limit",
                     fmt::format("the EP group of rank {} places its {} experts on {} nodes in "
                                 "blocks of different sizes; the real backend's node-limited gate "
                                 "needs every node to hold the same number of consecutive experts",
                                 rank, E, nodes));
  return {E / nodes, limit};
}

kernels::GateParams gate_params(const MoeShape& s, int tokens, int capacity) {
  kernels::GateParams gp;
  gp.num_tokens = tokens;
  gp.model_dim = s.model_dim;
  gp.num_experts = s.experts;
  gp.top_k = s.top_k;
  gp.capacity = capacity;
  gp.experts_per_group = s.experts_per_group;
  gp.group_limit = s.group_limit;
  return gp;
}

ReferenceRouting reference_routing(const MoeShape& s, const std::vector<float>& tokens,
                                   const std::vector<float>& gate_w, int capacity,
                                   GateLogits kernel) {
  const int S = s.tokens, E = s.experts, k = s.top_k;
  ReferenceRouting rr;
  rr.expert.resize(static_cast<size_t>(S) * k);
  rr.prob.resize(static_cast<size_t>(S) * k);
  rr.kept.assign(static_cast<size_t>(S) * k, 0);
  // Gate: softmax probabilities and the k best experts per token (ties: lower index).
  std::vector<double> ref_logit(E), kernel_logit(E);
  std::vector<int> order(E);
  for (int t = 0; t < S; ++t) {
    const auto [mx, sum] = reference_gate_row(s, tokens, gate_w, t, ref_logit);
    // `logit`: what the decisions are taken on (see GateLogits).
    const std::vector<double>* decide = &ref_logit;
    if (kernel.logits) {
      for (int e = 0; e < E; ++e) {
        const double got = kernel.logits[static_cast<size_t>(t) * E + e];
        if (!(std::fabs(got - ref_logit[e]) <= kernel.tolerance * (1 + std::fabs(ref_logit[e]))))
          ++rr.logits_wrong;
        kernel_logit[e] = got;
      }
      decide = &kernel_logit;
    }
    const std::vector<double>& logit = *decide;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    if (s.node_limit_binds()) {
      // Node-limited gate: rank the groups by the sum of their ceil(k / limit) best logits (ties:
      // lower group), keep the experts of the best `limit` groups, in the same logit order.
      const int G = E / s.experts_per_group, r = (k + s.group_limit - 1) / s.group_limit;
      std::vector<double> score(G, 0.0);
      std::vector<int> taken(G, 0);
      for (int e : order) {
        const int g = e / s.experts_per_group;
        if (taken[g] < r) {
          score[g] += logit[e];
          ++taken[g];
        }
      }
      std::vector<int> groups(G);
      std::iota(groups.begin(), groups.end(), 0);
      std::stable_sort(groups.begin(), groups.end(),
                       [&](int a, int b) { return score[a] > score[b]; });
      std::vector<char> allowed(G, 0);
      for (int a = 0; a < s.group_limit; ++a) allowed[groups[a]] = 1;
      std::stable_partition(order.begin(), order.end(),
                            [&](int e) { return allowed[e / s.experts_per_group] != 0; });
    }
    for (int c = 0; c < k; ++c) {
      rr.expert[static_cast<size_t>(t) * k + c] = order[c];
      rr.prob[static_cast<size_t>(t) * k + c] =
          static_cast<float>(std::exp(ref_logit[order[c]] - mx) / sum);
    }
  }
  // Capacity rule: all first choices in token order, then all second choices, ...
  std::vector<int> used(E, 0);
  for (int c = 0; c < k; ++c)
    for (int t = 0; t < S; ++t) {
      const size_t entry = static_cast<size_t>(t) * k + c;
      const int e = rr.expert[entry];
      if (used[e] < capacity) {
        ++used[e];
        rr.kept[entry] = 1;
      } else {
        ++rr.dropped;
      }
    }
  return rr;
}

namespace {

// The reference's inner loops, in double. dot_f64 sums in four chains: the long reductions (M or
// H terms per element) are bound by the latency of one add chain otherwise; the order changes the
// sum by rounding only (~1e-16 relative, far inside the check's 1e-4 tolerance). Every loop
// rounds each product, then adds (no FMA contraction: x86-64's baseline has none and the AVX2
// clones do not enable it), so both clones give the same bits. These loops are most of a full-size
// exec --check run in CI.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MOESIM_REFERENCE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MOESIM_REFERENCE_CLONES
#endif
MOESIM_REFERENCE_CLONES double dot_f64(const double* a, const float* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}
// y += a x for n elements.
MOESIM_REFERENCE_CLONES void axpy_f64(double* y, double a, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}
MOESIM_REFERENCE_CLONES void axpy_f64(double* y, double a, const double* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// The expert FFN part of the reference for a routing already decided: per expert, the kept
// (token, choice) entries in blocks of kBlock tokens, so one row of W1 / W2 (H or M floats) is
// reused by the whole block while it is in L1; products accumulate in double. `weights(e)` gives
// expert e's (W1, W2), generated only while expert e is processed (one expert's weights live at
// a time: E x M x H floats would not fit on a rank at real sizes).
template <typename Weights>
std::vector<float> reference_ffn(const MoeShape& s, const std::vector<float>& tokens,
                                 const ReferenceRouting& rr, Weights&& weights) {
  constexpr int kBlock = 16;
  const int S = s.tokens, M = s.model_dim, H = s.hidden_dim, E = s.experts, k = s.top_k;
  std::vector<std::vector<std::size_t>> entries(E);  // kept (t * k + c) per expert, token order
  for (std::size_t entry = 0; entry < static_cast<std::size_t>(S) * k; ++entry)
    if (rr.kept[entry]) entries[rr.expert[entry]].push_back(entry);
  std::vector<float> y(static_cast<size_t>(S) * M, 0.0f);
  std::vector<double> hidden(static_cast<size_t>(kBlock) * H), out(static_cast<size_t>(kBlock) * M);
  for (int e = 0; e < E; ++e) {
    if (entries[e].empty()) continue;
    const auto [w1, w2] = weights(e);
    const auto& list = entries[e];
    for (std::size_t b0 = 0; b0 < list.size(); b0 += kBlock) {
      const int nb = static_cast<int>(std::min<std::size_t>(kBlock, list.size() - b0));
      std::fill(hidden.begin(), hidden.end(), 0.0);
      for (int m = 0; m < M; ++m) {
        const float* row = w1 + static_cast<size_t>(m) * H;
        for (int i = 0; i < nb; ++i) {
          const double xm = tokens[list[b0 + i] / k * M + m];
          axpy_f64(&hidden[static_cast<size_t>(i) * H], xm, row, H);
        }
      }
      for (double& v : hidden) v = v > 0 ? v : 0;  // ReLU
      std::fill(out.begin(), out.end(), 0.0);
      for (int j = 0; j < H; ++j) {
        const float* row = w2 + static_cast<size_t>(j) * M;
        for (int i = 0; i < nb; ++i) {
          const double hj = hidden[static_cast<size_t>(i) * H + j];
          if (hj == 0) continue;
          axpy_f64(&out[static_cast<size_t>(i) * M], hj, row, M);
        }
      }
      for (int i = 0; i < nb; ++i) {
        const std::size_t entry = list[b0 + i];
        float* yt = &y[entry / k * M];
        for (int m = 0; m < M; ++m)
          yt[m] += static_cast<float>(rr.prob[entry] * out[static_cast<size_t>(i) * M + m]);
      }
    }
  }
  return y;
}

}  // namespace

std::vector<float> reference_layer(const MoeShape& s, const std::vector<float>& tokens,
                                   const std::vector<float>& gate_w,
                                   const std::vector<std::vector<float>>& w1,
                                   const std::vector<std::vector<float>>& w2, int capacity,
                                   long long* dropped) {
  MOESIM_ASSERT(
      static_cast<int>(w1.size()) == s.experts && static_cast<int>(w2.size()) == s.experts,
      "reference needs every expert's weights");
  const ReferenceRouting rr = reference_routing(s, tokens, gate_w, capacity);
  if (dropped) *dropped = rr.dropped;
  return reference_ffn(s, tokens, rr, [&](int e) {
    return std::pair<const float*, const float*>{w1[e].data(), w2[e].data()};
  });
}

std::vector<float> reference_layer_seeded(const MoeShape& s, const std::vector<float>& tokens,
                                          std::uint64_t seed, int layer, int capacity,
                                          long long* dropped, GateLogits kernel,
                                          long long* logits_wrong) {
  const ReferenceRouting rr =
      reference_routing(s, tokens, make_gate_weights(s, seed, layer), capacity, kernel);
  if (dropped) *dropped = rr.dropped;
  if (logits_wrong) *logits_wrong = rr.logits_wrong;
  std::vector<float> w1, w2;
  return reference_ffn(s, tokens, rr, [&](int e) {
    w1 = make_w1(s, seed, layer, e);
    w2 = make_w2(s, seed, layer, e);
    return std::pair<const float*, const float*>{w1.data(), w2.data()};
  });
}

std::vector<float> reference_layer_seeded_rows(const MoeShape& s, const std::vector<float>& tokens,
                                               std::uint64_t seed, int layer, int capacity,
                                               int first, int count, long long* dropped,
                                               GateLogits kernel, long long* logits_wrong) {
  MOESIM_ASSERT(first >= 0 && count >= 0 && first + count <= s.tokens, "rows outside the unit");
  const ReferenceRouting all =
      reference_routing(s, tokens, make_gate_weights(s, seed, layer), capacity, kernel);
  if (logits_wrong) *logits_wrong += all.logits_wrong;
  const int k = s.top_k, M = s.model_dim;
  // The rows' routing entries and tokens as a unit of their own (the decisions are already made).
  ReferenceRouting rr;
  const auto e0 = static_cast<std::ptrdiff_t>(first) * k,
             e1 = e0 + static_cast<std::ptrdiff_t>(count) * k;
  rr.expert.assign(all.expert.begin() + e0, all.expert.begin() + e1);
  rr.prob.assign(all.prob.begin() + e0, all.prob.begin() + e1);
  rr.kept.assign(all.kept.begin() + e0, all.kept.begin() + e1);
  for (char kept : rr.kept) rr.dropped += kept ? 0 : 1;
  if (dropped) *dropped = rr.dropped;
  const std::vector<float> rows(tokens.begin() + static_cast<std::ptrdiff_t>(first) * M,
                                tokens.begin() + static_cast<std::ptrdiff_t>(first + count) * M);
  MoeShape part = s;
  part.tokens = count;
  std::vector<float> w1, w2;
  return reference_ffn(part, rows, rr, [&](int e) {
    w1 = make_w1(s, seed, layer, e);
    w2 = make_w2(s, seed, layer, e);
    return std::pair<const float*, const float*>{w1.data(), w2.data()};
  });
}

namespace {

// A routing decided elsewhere (plan-routed layers): entry t * k + c goes to expert[entry] (-1:
// dropped) with the gate's softmax probability of that expert, in double.
ReferenceRouting routed_reference_routing(const MoeShape& s, const std::vector<float>& tokens,
                                          const std::vector<float>& gate_w,
                                          const std::vector<int>& expert) {
  const int S = s.tokens, E = s.experts, k = s.top_k;
  MOESIM_ASSERT(expert.size() == static_cast<size_t>(S) * k, "routed reference: entries");
  ReferenceRouting rr;
  rr.expert.assign(expert.size(), 0);
  rr.prob.assign(expert.size(), 0.0f);
  rr.kept.assign(expert.size(), 0);
  std::vector<double> logit(E);
  for (int t = 0; t < S; ++t) {
    const auto [mx, sum] = reference_gate_row(s, tokens, gate_w, t, logit);
    for (int c = 0; c < k; ++c) {
      const size_t entry = static_cast<size_t>(t) * k + c;
      if (expert[entry] < 0) continue;
      MOESIM_ASSERT(expert[entry] < E, "routed reference: expert out of range");
      rr.expert[entry] = expert[entry];
      rr.kept[entry] = 1;
      rr.prob[entry] = static_cast<float>(std::exp(logit[expert[entry]] - mx) / sum);
    }
  }
  return rr;
}

}  // namespace

std::vector<float> reference_layer_seeded_routed(const MoeShape& s,
                                                 const std::vector<float>& tokens,
                                                 std::uint64_t seed, int layer,
                                                 const std::vector<int>& expert) {
  const ReferenceRouting rr =
      routed_reference_routing(s, tokens, make_gate_weights(s, seed, layer), expert);
  std::vector<float> w1, w2;
  return reference_ffn(s, tokens, rr, [&](int e) {
    w1 = make_w1(s, seed, layer, e);
    w2 = make_w2(s, seed, layer, e);
    return std::pair<const float*, const float*>{w1.data(), w2.data()};
  });
}

std::vector<float> make_grad_output(const MoeShape& s, std::uint64_t seed, int iteration, int layer,
                                    int rank) {
  std::vector<float> v(static_cast<size_t>(s.tokens) * s.model_dim);
  fill_uniform(v, seed, 5, (static_cast<std::uint64_t>(iteration) << 20) | layer, rank, 1.0f);
  return v;
}

namespace {

// The backward of reference_ffn + the gate for a routing already decided (rr), in double. Per
// expert, its kept entries in blocks of kBlock tokens (one row of W1 / W2 / dW1 / dW2 reused by
// the whole block, as in reference_ffn). Per entry (t, c) of expert e with probability p:
//   pre = x_t W1, h = relu(pre), out = h W2            (recomputed, not taken from the executor)
//   dWeight = <dY_t, out>, dOut = p dY_t
//   dh = (dOut W2^T) * [pre > 0],  dW2 += h^T dOut,  dW1 += x_t^T dh,  dx_t += dh W1^T
// then the gate: g (E) = dWeight at the kept choices' experts, dLogits = p (g - <p, g>) (softmax
// backward over all E), dWgate += x_t^T dLogits, dx_t += dLogits Wg^T. Drops are constants
// (their choice contributes nothing, so neither its expert nor its probability gets a gradient).
template <typename Weights, typename OnExpert>
ReferenceGrads reference_backward_impl(const MoeShape& s, const std::vector<float>& tokens,
                                       const std::vector<float>& gate_w,
                                       const std::vector<float>& dy, const ReferenceRouting& rr,
                                       Weights&& weights, OnExpert&& on_expert) {
  constexpr int kBlock = 16;
  const int S = s.tokens, M = s.model_dim, H = s.hidden_dim, E = s.experts, k = s.top_k;
  MOESIM_ASSERT(dy.size() == static_cast<size_t>(S) * M, "reference_backward: dY size");
  ReferenceGrads g;
  g.dropped = rr.dropped;
  g.dx.assign(static_cast<size_t>(S) * M, 0.0);
  g.dgate_w.assign(static_cast<size_t>(M) * E, 0.0);
  std::vector<double> gw(static_cast<size_t>(S) * k, 0.0);  // dWeight per entry
  std::vector<std::vector<std::size_t>> entries(E);
  for (std::size_t entry = 0; entry < static_cast<std::size_t>(S) * k; ++entry)
    if (rr.kept[entry]) entries[rr.expert[entry]].push_back(entry);
  std::vector<double> pre(static_cast<size_t>(kBlock) * H), out(static_cast<size_t>(kBlock) * M),
      dout(static_cast<size_t>(kBlock) * M), dh(static_cast<size_t>(kBlock) * H);
  std::vector<double> dw1, dw2;
  std::vector<float> xblock(static_cast<size_t>(kBlock) * M),
      pre32(static_cast<size_t>(kBlock) * H);
  kernels::cpu::Context ctx;
  for (int e = 0; e < E; ++e) {
    dw1.assign(static_cast<size_t>(M) * H, 0.0);
    dw2.assign(static_cast<size_t>(H) * M, 0.0);
    const auto& list = entries[e];
    if (!list.empty()) {
      const auto [w1, w2] = weights(e);
      for (std::size_t b0 = 0; b0 < list.size(); b0 += kBlock) {
        const int nb = static_cast<int>(std::min<std::size_t>(kBlock, list.size() - b0));
        auto xrow = [&](int i) { return &tokens[list[b0 + i] / k * M]; };
        auto dyrow = [&](int i) { return &dy[list[b0 + i] / k * M]; };
        std::fill(pre.begin(), pre.end(), 0.0);
        for (int m = 0; m < M; ++m) {
          const float* row = w1 + static_cast<size_t>(m) * H;
          for (int i = 0; i < nb; ++i) {
            const double xm = xrow(i)[m];
            axpy_f64(&pre[static_cast<size_t>(i) * H], xm, row, H);
          }
        }
        // The ReLU's derivative jumps at 0, so a pre-activation within rounding of 0 may be
        // active in double and not in fp32 (at M = 1,024, H = 2,048 about ten per rank flip, each
        // changing a whole column of dW1 by O(0.01)). Which side of the kink counts is a choice
        // (both are subgradients); the reference takes the fp32 kernel's: the same GEMM on the
        // same fp32 inputs accumulates every element in the same order (kernels::cpu::gemm), so
        // the mask is exactly the executor's. Every value stays in double.
        for (int i = 0; i < nb; ++i) std::copy_n(xrow(i), M, &xblock[static_cast<size_t>(i) * M]);
        kernels::cpu::gemm(ctx, kernels::DType::kF32, nb, H, M, xblock.data(), w1, pre32.data());
        for (size_t i = 0; i < static_cast<size_t>(nb) * H; ++i)
          pre[i] = pre32[i] > 0 ? std::max(pre[i], std::numeric_limits<double>::min()) : 0.0;
        std::fill(out.begin(), out.end(), 0.0);
        for (int j = 0; j < H; ++j) {
          const float* row = w2 + static_cast<size_t>(j) * M;
          for (int i = 0; i < nb; ++i) {
            const double hj = std::max(0.0, pre[static_cast<size_t>(i) * H + j]);
            if (hj == 0) continue;
            axpy_f64(&out[static_cast<size_t>(i) * M], hj, row, M);
          }
        }
        for (int i = 0; i < nb; ++i) {
          const std::size_t entry = list[b0 + i];
          const float* d = dyrow(i);
          double dot = 0;
          for (int m = 0; m < M; ++m) {
            dot += static_cast<double>(d[m]) * out[static_cast<size_t>(i) * M + m];
            dout[static_cast<size_t>(i) * M + m] = static_cast<double>(rr.prob[entry]) * d[m];
          }
          gw[entry] = dot;
        }
        // dh = dOut W2^T masked by the ReLU; dW2 += h^T dOut (row j of W2 / dW2 per pass).
        for (int j = 0; j < H; ++j) {
          const float* row = w2 + static_cast<size_t>(j) * M;
          double* grow = &dw2[static_cast<size_t>(j) * M];
          for (int i = 0; i < nb; ++i) {
            const double p = pre[static_cast<size_t>(i) * H + j];
            const double* o = &dout[static_cast<size_t>(i) * M];
            dh[static_cast<size_t>(i) * H + j] = p > 0 ? dot_f64(o, row, M) : 0.0;
            if (p > 0) axpy_f64(grow, p, o, M);
          }
        }
        // dW1 += x^T dh; dx += dh W1^T (row m of W1 / dW1 per pass).
        for (int m = 0; m < M; ++m) {
          const float* row = w1 + static_cast<size_t>(m) * H;
          double* grow = &dw1[static_cast<size_t>(m) * H];
          for (int i = 0; i < nb; ++i) {
            const double xm = xrow(i)[m];
            const double* d = &dh[static_cast<size_t>(i) * H];
            axpy_f64(grow, xm, d, H);
            g.dx[list[b0 + i] / k * M + m] += dot_f64(d, row, H);
          }
        }
      }
    }
    on_expert(e, dw1, dw2);
  }
  // Gate backward: softmax over all E experts, probabilities recomputed in double.
  std::vector<double> logit(E), p(E), gsum(E);
  for (int t = 0; t < S; ++t) {
    const auto [mx, sum] = reference_gate_row(s, tokens, gate_w, t, logit);
    for (int e = 0; e < E; ++e) p[e] = std::exp(logit[e] - mx) / sum;
    std::fill(gsum.begin(), gsum.end(), 0.0);
    for (int c = 0; c < k; ++c) {
      const size_t entry = static_cast<size_t>(t) * k + c;
      if (rr.kept[entry]) gsum[rr.expert[entry]] += gw[entry];
    }
    double pg = 0;
    for (int e = 0; e < E; ++e) pg += p[e] * gsum[e];
    for (int e = 0; e < E; ++e) {
      const double dl = p[e] * (gsum[e] - pg);
      if (dl == 0) continue;
      for (int m = 0; m < M; ++m) {
        g.dgate_w[static_cast<size_t>(m) * E + e] += tokens[static_cast<size_t>(t) * M + m] * dl;
        g.dx[static_cast<size_t>(t) * M + m] += dl * gate_w[static_cast<size_t>(m) * E + e];
      }
    }
  }
  return g;
}

}  // namespace

ReferenceGrads reference_backward(const MoeShape& s, const std::vector<float>& tokens,
                                  const std::vector<float>& gate_w,
                                  const std::vector<std::vector<float>>& w1,
                                  const std::vector<std::vector<float>>& w2,
                                  const std::vector<float>& dy, int capacity) {
  MOESIM_ASSERT(
      static_cast<int>(w1.size()) == s.experts && static_cast<int>(w2.size()) == s.experts,
      "reference needs every expert's weights");
  const ReferenceRouting rr = reference_routing(s, tokens, gate_w, capacity);
  std::vector<std::vector<double>> dw1(s.experts), dw2(s.experts);
  ReferenceGrads g = reference_backward_impl(
      s, tokens, gate_w, dy, rr,
      [&](int e) {
        return std::pair<const float*, const float*>{w1[e].data(), w2[e].data()};
      },
      [&](int e, const std::vector<double>& a, const std::vector<double>& b) {
        dw1[e] = a;
        dw2[e] = b;
      });
  g.dw1 = std::move(dw1);
  g.dw2 = std::move(dw2);
  return g;
}

ReferenceGrads reference_backward_seeded(
    const MoeShape& s, const std::vector<float>& tokens, std::uint64_t seed, int layer,
    int capacity, const std::vector<float>& dy,
    const std::function<void(int, const std::vector<double>&, const std::vector<double>&)>&
        on_expert,
    const std::vector<int>* routed_expert) {
  const std::vector<float> gate_w = make_gate_weights(s, seed, layer);
  const ReferenceRouting rr = routed_expert
                                  ? routed_reference_routing(s, tokens, gate_w, *routed_expert)
                                  : reference_routing(s, tokens, gate_w, capacity);
  std::vector<float> w1, w2;
  return reference_backward_impl(
      s, tokens, gate_w, dy, rr,
      [&](int e) {
        w1 = make_w1(s, seed, layer, e);
        w2 = make_w2(s, seed, layer, e);
        return std::pair<const float*, const float*>{w1.data(), w2.data()};
      },
      on_expert);
}

double check_tolerance(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return 1e-4;
    case kernels::DType::kF16:
      return 5e-3;
    case kernels::DType::kBF16:
      return 2e-2;
  }
  return 1e-4;
}

kernels::DType kernel_dtype(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
    case Dtype::kTf32:
      return kernels::DType::kF32;
    case Dtype::kBf16:
      return kernels::DType::kBF16;
    case Dtype::kFp16:
    case Dtype::kFp8:
      return kernels::DType::kF16;
  }
  return kernels::DType::kF32;
}

}  // namespace moesim::exec
