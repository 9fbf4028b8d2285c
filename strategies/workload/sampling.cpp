#include "strategies/workload/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.hpp"

namespace moesim::workload::detail {

AliasTable::AliasTable(std::span<const double> weights) {
  const std::size_t n = weights.size();
  MOESIM_ASSERT(n > 0 && n <= 0xffffffffULL, "alias table needs 1..2^32-1 weights");
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  MOESIM_ASSERT(total > 0 && std::isfinite(total), "alias table weights must have a positive sum");
  // Vose's method: scaled weights n * w / total; pair each small column with a large one.
  std::vector<double> scaled(n);
  std::vector<std::uint32_t> small, large;
  small.reserve(n);
  large.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    MOESIM_ASSERT(weights[i] >= 0, "alias table weights must be >= 0");
    scaled[i] = weights[i] * static_cast<double>(n) / total;
    (scaled[i] < 1.0 ? small : large).push_back(static_cast<std::uint32_t>(i));
  }
  std::vector<std::uint64_t> threshold(n, 0xffffffffULL);
  std::vector<std::uint32_t> alias(n);
  std::iota(alias.begin(), alias.end(), 0u);  // leftovers (rounding) keep their own column
  while (!small.empty() && !large.empty()) {
    const std::uint32_t s = small.back();
    small.pop_back();
    const std::uint32_t l = large.back();
    threshold[s] = std::min<std::uint64_t>(
        static_cast<std::uint64_t>(std::llround(scaled[s] * 0x1.0p32)), 0xffffffffULL);
    alias[s] = l;
    scaled[l] -= 1.0 - scaled[s];
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  table_.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    table_[i] = threshold[i] | (static_cast<std::uint64_t>(alias[i]) << 32);
}

std::vector<double> zipf_popularity(int num_experts, double skew, std::uint64_t seed, int layer) {
  std::vector<std::uint32_t> ranking(static_cast<std::size_t>(num_experts));
  std::iota(ranking.begin(), ranking.end(), 0u);
  // Fisher-Yates with our own index draws (std::shuffle's algorithm is not specified, and the
  // ranking should be the same on every standard library).
  Xoshiro256 rng(substream_key(seed, Stream::kZipfRanking, static_cast<std::uint64_t>(layer)));
  for (std::uint32_t i = static_cast<std::uint32_t>(num_experts); i > 1; --i)
    std::swap(ranking[i - 1], ranking[rng.below(i)]);
  std::vector<double> p(static_cast<std::size_t>(num_experts));
  double total = 0;
  for (int r = 0; r < num_experts; ++r) {
    const double w = std::pow(static_cast<double>(r + 1), -skew);
    p[ranking[static_cast<std::size_t>(r)]] = w;
    total += w;
  }
  for (double& x : p) x /= total;
  return p;
}

std::vector<double> dirichlet_popularity(int num_experts, double alpha, std::uint64_t seed,
                                         int iteration, int layer) {
  Xoshiro256 rng(substream_key(seed, Stream::kDirichlet, static_cast<std::uint64_t>(iteration),
                               static_cast<std::uint64_t>(layer)));
  const bool boost = alpha < 1.0;
  std::gamma_distribution<double> gamma(boost ? alpha + 1.0 : alpha, 1.0);
  std::vector<double> log_g(static_cast<std::size_t>(num_experts));
  for (double& lg : log_g) {
    double g = gamma(rng);
    lg = std::log(std::max(g, std::numeric_limits<double>::min()));
    // Gamma(a) = Gamma(a + 1) * U^(1/a): the U factor in log space cannot underflow.
    if (boost) lg += std::log(1.0 - rng.uniform()) / alpha;
  }
  const double m = *std::max_element(log_g.begin(), log_g.end());
  std::vector<double> p(log_g.size());
  double total = 0;
  for (std::size_t e = 0; e < p.size(); ++e) total += p[e] = std::exp(log_g[e] - m);
  for (double& x : p) x /= total;
  return p;
}

ChoiceSampler::ChoiceSampler(std::vector<double> popularity, int num_experts, int top_k,
                             std::int64_t tokens_per_gpu, Method method)
    : num_experts_(static_cast<std::uint32_t>(num_experts)),
      top_k_(top_k),
      tokens_(tokens_per_gpu),
      uniform_(popularity.empty()),
      method_(method),
      p_(std::move(popularity)) {
  MOESIM_ASSERT(num_experts >= 1 && top_k >= 1 && top_k <= num_experts,
                "need 1 <= top_k <= experts");
  MOESIM_ASSERT(tokens_per_gpu >= 0 && tokens_per_gpu <= 0xffffffffLL,
                "tokens per GPU must fit 32-bit counts");
  if (uniform_) p_.assign(num_experts_, 1.0 / num_experts_);
  MOESIM_ASSERT(p_.size() == num_experts_, "popularity needs one weight per expert");
  if (method_ == Method::kAuto)
    method_ = tokens_ <= kTokenMethodMaxRatio * static_cast<std::int64_t>(num_experts_)
                  ? Method::kTokens
                  : Method::kCounts;
  if (method_ == Method::kTokens) {
    if (!uniform_) alias_ = AliasTable(p_);
    return;
  }
  // Count method: rank weights q^(j)_e proportional to p_e * (1 - pi_e), pi_e = the (clamped)
  // sum of the earlier ranks' weights: the chance that e is already taken by the token.
  const std::size_t E = num_experts_;
  q_.assign(static_cast<std::size_t>(top_k_) * E, 0.0);
  cond_.assign(q_.size(), 0.0);
  std::vector<double> taken(E, 0.0);
  for (int j = 0; j < top_k_; ++j) {
    double* q = q_.data() + static_cast<std::size_t>(j) * E;
    double total = 0;
    for (std::size_t e = 0; e < E; ++e) total += q[e] = p_[e] * std::max(0.0, 1.0 - taken[e]);
    if (!(total > 0)) {  // every popular expert taken: fall back to the untaken ones evenly
      for (std::size_t e = 0; e < E; ++e) total += q[e] = taken[e] < 1.0 ? 1.0 : 0.0;
      if (!(total > 0)) std::fill(q, q + E, total = 1.0);
    }
    for (std::size_t e = 0; e < E; ++e) {
      q[e] /= total;
      taken[e] += q[e];
    }
    // Conditional probabilities of the binomial chain, from suffix sums (the last expert with
    // weight gets probability 1, so every rank's counts sum to S exactly).
    double* cond = cond_.data() + static_cast<std::size_t>(j) * E;
    double suffix = 0;
    for (std::size_t e = E; e-- > 0;) {
      suffix += q[e];
      cond[e] = q[e] > 0 ? std::min(1.0, q[e] / suffix) : 0.0;
    }
    for (std::size_t e = E; e-- > 0;)
      if (q[e] > 0) {
        cond[e] = 1.0;
        break;
      }
  }
}

std::span<const double> ChoiceSampler::rank_weights(int j) const {
  if (q_.empty()) return {};
  return {q_.data() + static_cast<std::size_t>(j) * num_experts_, num_experts_};
}

void ChoiceSampler::sample(Xoshiro256& rng, std::span<std::uint32_t> counts) const {
  MOESIM_ASSERT(counts.size() == static_cast<std::size_t>(top_k_) * num_experts_,
                "counts must hold top_k * E entries");
  std::fill(counts.begin(), counts.end(), 0u);
  if (method_ == Method::kTokens)
    sample_tokens(rng, counts);
  else
    sample_counts(rng, counts);
}

std::uint32_t ChoiceSampler::draw_excluding(Xoshiro256& rng, const std::uint32_t* chosen,
                                            int n) const {
  // Rejection: a draw from p conditioned on not being among the token's earlier choices. Exact;
  // expected attempts 1 / (1 - mass of the chosen), ~1 unless a few experts hold nearly all
  // mass. After many misses, switch to an exact scan of the same conditional distribution.
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::uint32_t e = draw(rng);
    if (std::find(chosen, chosen + n, e) == chosen + n) return e;
  }
  double remaining = 1.0;
  for (int i = 0; i < n; ++i) remaining -= p_[chosen[i]];
  auto is_chosen = [&](std::uint32_t e) { return std::find(chosen, chosen + n, e) != chosen + n; };
  if (remaining > 1e-12) {
    double u = rng.uniform() * remaining;
    std::uint32_t last = num_experts_;
    for (std::uint32_t e = 0; e < num_experts_; ++e) {
      if (is_chosen(e) || p_[e] <= 0) continue;
      last = e;
      if ((u -= p_[e]) < 0) return e;
    }
    if (last < num_experts_) return last;  // rounding at the end of the scan
  }
  // The untaken experts have (numerically) no mass: any of them, evenly.
  std::uint32_t r = rng.below(num_experts_ - static_cast<std::uint32_t>(n));
  for (std::uint32_t e = 0;; ++e)
    if (!is_chosen(e) && r-- == 0) return e;
}

void ChoiceSampler::sample_tokens(Xoshiro256& rng, std::span<std::uint32_t> counts) const {
  const std::size_t E = num_experts_;
  std::uint32_t* c = counts.data();
  if (top_k_ == 1) {
    for (std::int64_t t = 0; t < tokens_; ++t) ++c[draw(rng)];
    return;
  }
  if (top_k_ == 2 && uniform_) {  // the commonest case: both choices from one 64-bit draw
    std::uint32_t* c2 = c + E;
    const std::uint64_t n = num_experts_;
    for (std::int64_t t = 0; t < tokens_; ++t) {
      const std::uint64_t u = rng();
      const auto first = static_cast<std::uint32_t>((u & 0xffffffffULL) * n >> 32);
      auto second = static_cast<std::uint32_t>((u >> 32) * n >> 32);
      if (second == first) second = draw_excluding(rng, &first, 1);
      ++c[first];
      ++c2[second];
    }
    return;
  }
  if (top_k_ == 2) {  // without the general loop's bookkeeping
    std::uint32_t* c2 = c + E;
    for (std::int64_t t = 0; t < tokens_; ++t) {
      const std::uint32_t first = draw(rng);
      ++c[first];
      std::uint32_t second = draw(rng);
      if (second == first) second = draw_excluding(rng, &first, 1);
      ++c2[second];
    }
    return;
  }
  std::vector<std::uint32_t> chosen(static_cast<std::size_t>(top_k_));
  for (std::int64_t t = 0; t < tokens_; ++t) {
    chosen[0] = draw(rng);
    ++c[chosen[0]];
    for (int j = 1; j < top_k_; ++j) {
      chosen[static_cast<std::size_t>(j)] = draw_excluding(rng, chosen.data(), j);
      ++c[static_cast<std::size_t>(j) * E + chosen[static_cast<std::size_t>(j)]];
    }
  }
}

void ChoiceSampler::sample_counts(Xoshiro256& rng, std::span<std::uint32_t> counts) const {
  const std::size_t E = num_experts_;
  for (int j = 0; j < top_k_; ++j) {
    const double* cond = cond_.data() + static_cast<std::size_t>(j) * E;
    std::uint32_t* c = counts.data() + static_cast<std::size_t>(j) * E;
    std::int64_t left = tokens_;
    for (std::size_t e = 0; e < E && left > 0; ++e) {
      if (cond[e] <= 0) continue;
      std::int64_t x = left;
      if (cond[e] < 1.0) x = std::binomial_distribution<std::int64_t>(left, cond[e])(rng);
      c[e] = static_cast<std::uint32_t>(x);
      left -= x;
    }
    MOESIM_ASSERT(left == 0, "multinomial chain must place every token");
  }
}

}  // namespace moesim::workload::detail
