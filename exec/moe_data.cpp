#include "exec/moe_data.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"

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

ReferenceRouting reference_routing(const MoeShape& s, const std::vector<float>& tokens,
                                   const std::vector<float>& gate_w, int capacity) {
  const int S = s.tokens, M = s.model_dim, E = s.experts, k = s.top_k;
  ReferenceRouting rr;
  rr.expert.resize(static_cast<size_t>(S) * k);
  rr.prob.resize(static_cast<size_t>(S) * k);
  rr.kept.assign(static_cast<size_t>(S) * k, 0);
  // Gate: softmax probabilities and the k best experts per token (ties: lower index).
  std::vector<double> logit(E);
  std::vector<int> order(E);
  for (int t = 0; t < S; ++t) {
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
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    for (int c = 0; c < k; ++c) {
      rr.expert[static_cast<size_t>(t) * k + c] = order[c];
      rr.prob[static_cast<size_t>(t) * k + c] =
          static_cast<float>(std::exp(logit[order[c]] - mx) / sum);
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

std::vector<float> reference_layer(const MoeShape& s, const std::vector<float>& tokens,
                                   const std::vector<float>& gate_w,
                                   const std::vector<std::vector<float>>& w1,
                                   const std::vector<std::vector<float>>& w2, int capacity,
                                   long long* dropped) {
  const int S = s.tokens, M = s.model_dim, H = s.hidden_dim, E = s.experts, k = s.top_k;
  MOESIM_ASSERT(static_cast<int>(w1.size()) == E && static_cast<int>(w2.size()) == E,
                "reference needs every expert's weights");
  const ReferenceRouting rr = reference_routing(s, tokens, gate_w, capacity);
  if (dropped) *dropped = rr.dropped;
  const auto& choice = rr.expert;
  const auto& prob = rr.prob;
  const auto& kept = rr.kept;
  // Per token: y = sum over kept choices of p * relu(x W1_e) W2_e.
  std::vector<float> y(static_cast<size_t>(S) * M, 0.0f);
  std::vector<double> hidden(H), out(M);
  for (int t = 0; t < S; ++t)
    for (int c = 0; c < k; ++c) {
      if (!kept[static_cast<size_t>(t) * k + c]) continue;
      const int e = choice[static_cast<size_t>(t) * k + c];
      const float* x = &tokens[static_cast<size_t>(t) * M];
      for (int h = 0; h < H; ++h) {
        double acc = 0;
        for (int m = 0; m < M; ++m)
          acc += static_cast<double>(x[m]) * w1[e][static_cast<size_t>(m) * H + h];
        hidden[h] = acc > 0 ? acc : 0;
      }
      for (int m = 0; m < M; ++m) {
        double acc = 0;
        for (int h = 0; h < H; ++h) acc += hidden[h] * w2[e][static_cast<size_t>(h) * M + m];
        y[static_cast<size_t>(t) * M + m] +=
            static_cast<float>(prob[static_cast<size_t>(t) * k + c] * acc);
      }
    }
  return y;
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

}  // namespace moesim::exec
