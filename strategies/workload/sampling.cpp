#include "strategies/workload/sampling.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.hpp"

namespace moesim::workload::detail {

namespace {

// log(x!): a table below 32, Stirling's series for log Gamma(x + 1) above (truncation error
// below 1 / (1680 (x+1)^7) < 1e-13 there). Our own, not std::lgamma, which may write the global
// signgam (a data race between sampling threads).
double log_factorial(std::int64_t x) {
  static const std::array<double, 32> table = [] {
    std::array<double, 32> t{};
    double sum = 0;
    for (std::size_t i = 2; i < t.size(); ++i) t[i] = sum += std::log(static_cast<double>(i));
    return t;
  }();
  if (x < static_cast<std::int64_t>(table.size())) return table[static_cast<std::size_t>(x)];
  const double n = static_cast<double>(x) + 1.0;
  const double inv = 1.0 / n;
  const double inv2 = inv * inv;
  constexpr double kHalfLog2Pi = 0.91893853320467274178;
  return (n - 0.5) * std::log(n) - n + kHalfLog2Pi +
         inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 / 1260.0));
}

}  // namespace

std::int64_t binomial(Xoshiro256& rng, std::int64_t n, double p) {
  if (n <= 0 || !(p > 0)) return 0;
  if (p >= 1) return n;
  if (p > 0.5) return n - binomial(rng, n, 1.0 - p);  // both methods want p <= 1/2
  const double q = 1.0 - p;
  const double dn = static_cast<double>(n);
  const double np = dn * p;
  if (np < 10) {
    // Inversion: walk the pmf from 0, f(x) = f(x-1) * ((n+1)/x - 1) * p/q. f(0) = q^n >= e^-14
    // here (n p < 10, p <= 1/2), so it never underflows. The rare walk that runs off the end
    // (rounding leaves u above the summed mass) or into an underflowed tail draws again.
    const double s = p / q;
    const double a = (dn + 1.0) * s;
    const double f0 = std::exp(dn * std::log1p(-p));
    for (;;) {
      double u = rng.uniform();
      double f = f0;
      for (std::int64_t x = 0;;) {
        if (u < f) return x;
        u -= f;
        if (++x > n) break;
        f *= a / static_cast<double>(x) - s;
        if (f < 1e-300) break;
      }
    }
  }
  // BTRS (Hoermann 1993, valid for n p >= 10): k = floor((2a/us + b) u + c) with u uniform on
  // (-1/2, 1/2), us = 1/2 - |u|; accept when v * alpha / (a/us^2 + b) <= pmf(k) / pmf(m), m the
  // mode (a/us^2 + b is dk/du). The squeeze (us >= 0.07 and v <= vr) accepts without the pmf.
  const double spq = std::sqrt(np * q);
  const double b = 1.15 + 2.53 * spq;
  const double a = -0.0873 + 0.0248 * b + 0.01 * p;
  const double c = np + 0.5;
  const double alpha = (2.83 + 5.1 / b) * spq;
  const double vr = 0.92 - 4.2 / b;
  // The exact test's constants cost three logs: computed on its first use only (the squeeze
  // settles ~85% of the draws without them).
  double log_r = 0, log_fm = 0;
  std::int64_t m = -1;
  for (;;) {
    const double u = rng.uniform() - 0.5;
    const double v = rng.uniform();
    const double us = 0.5 - std::abs(u);
    const double kd = std::floor((2.0 * a / us + b) * u + c);
    if (!(kd >= 0 && kd <= dn)) continue;  // also rejects us = 0 (kd = -inf)
    const auto k = static_cast<std::int64_t>(kd);
    if (us >= 0.07 && v <= vr) return k;
    // log(pmf(k) / pmf(m)) = log(m! (n-m)!) - log(k! (n-k)!) + (k - m) log(p/q).
    if (m < 0) {
      m = static_cast<std::int64_t>(std::floor((dn + 1.0) * p));
      log_r = std::log(p / q);
      log_fm = log_factorial(m) + log_factorial(n - m);
    }
    const double log_ratio =
        log_fm - log_factorial(k) - log_factorial(n - k) + static_cast<double>(k - m) * log_r;
    if (std::log(v * alpha / (a / (us * us) + b)) <= log_ratio) return k;
  }
}

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
                             std::int64_t tokens_per_gpu, Method method, NodeLimit node_limit,
                             DistinctDestinations distinct)
    : num_experts_(static_cast<std::uint32_t>(num_experts)),
      top_k_(top_k),
      tokens_(tokens_per_gpu),
      uniform_(popularity.empty()),
      method_(method),
      p_(std::move(popularity)),
      distinct_(std::move(distinct)) {
  if (!distinct_.pos_of.empty()) {
    MOESIM_ASSERT(distinct_.pos_of.size() == num_experts_ &&
                      distinct_.node_of.size() == num_experts_ && top_k <= 64,
                  "distinct destinations need a position and a node per expert, top_k <= 64");
    for (std::uint32_t e = 0; e < num_experts_; ++e)
      MOESIM_ASSERT(
          distinct_.pos_of[e] < distinct_.positions && distinct_.node_of[e] < distinct_.nodes,
          "an expert's position or node is out of range");
    method_ = Method::kTokens;
  }
  MOESIM_ASSERT(num_experts >= 1 && top_k >= 1 && top_k <= num_experts,
                "need 1 <= top_k <= experts");
  MOESIM_ASSERT(tokens_per_gpu >= 0 && tokens_per_gpu <= 0xffffffffLL,
                "tokens per GPU must fit 32-bit counts");
  if (uniform_) p_.assign(num_experts_, 1.0 / num_experts_);
  MOESIM_ASSERT(p_.size() == num_experts_, "popularity needs one weight per expert");
  if (!node_limit.node_of.empty()) {
    MOESIM_ASSERT(node_limit.node_of.size() == num_experts_ && node_limit.limit >= 1,
                  "a node limit needs one node per expert and a limit >= 1");
    const std::uint32_t nodes =
        *std::max_element(node_limit.node_of.begin(), node_limit.node_of.end()) + 1;
    if (static_cast<std::uint32_t>(node_limit.limit) < nodes && top_k_ > 1) {
      // Experts grouped by node (counting sort), for the exact fallback of draw_on_nodes.
      node_begin_.assign(nodes + 1, 0);
      for (const std::uint32_t n : node_limit.node_of) ++node_begin_[n + 1];
      std::vector<std::uint32_t> sizes(node_begin_.begin() + 1, node_begin_.end());
      std::sort(sizes.begin(), sizes.end());
      std::uint32_t smallest = 0;  // experts on the `limit` smallest nodes
      for (int i = 0; i < node_limit.limit; ++i) smallest += sizes[static_cast<std::size_t>(i)];
      MOESIM_ASSERT(smallest >= static_cast<std::uint32_t>(top_k_),
                    "every node_limit nodes must hold top_k experts");
      for (std::uint32_t n = 0; n < nodes; ++n) node_begin_[n + 1] += node_begin_[n];
      node_experts_.resize(num_experts_);
      std::vector<std::uint32_t> fill(node_begin_.begin(), node_begin_.end() - 1);
      for (std::uint32_t e = 0; e < num_experts_; ++e)
        node_experts_[fill[node_limit.node_of[e]]++] = e;
      node_mass_.assign(nodes, 0.0);
      if (!uniform_) node_alias_.resize(nodes);
      for (std::uint32_t n = 0; n < nodes; ++n) {
        std::vector<double> w;
        for (std::uint32_t x = node_begin_[n]; x < node_begin_[n + 1]; ++x)
          w.push_back(p_[node_experts_[x]]);
        for (const double v : w) node_mass_[n] += v;
        if (!uniform_ && node_mass_[n] > 0) node_alias_[n] = AliasTable(w);
      }
      node_size_ = node_begin_[1];
      for (std::uint32_t n = 1; n < nodes; ++n)
        if (node_begin_[n + 1] - node_begin_[n] != node_size_) node_size_ = 0;
      node_of_ = std::move(node_limit.node_of);
      node_limit_ = node_limit.limit;
      method_ = Method::kTokens;
    }
  }
  // The pair method needs a second expert with weight for every first choice to move to.
  const auto positive = std::count_if(p_.begin(), p_.end(), [](double x) { return x > 0; });
  const bool pairs_ok = top_k_ <= 2 && (top_k_ == 1 || positive >= 2);
  if (method_ == Method::kAuto) {
    const auto E = static_cast<std::int64_t>(num_experts_);
    if (pairs_ok && tokens_ > kPairsMinRatio * E)
      method_ = Method::kPairs;
    else
      method_ = tokens_ <= kTokenMethodMaxRatio * E ? Method::kTokens : Method::kCounts;
  }
  if (method_ == Method::kPairs) {
    MOESIM_ASSERT(pairs_ok, "the pair method needs top_k <= 2 and two experts with weight");
    build_pairs_tables();
    return;
  }
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

void ChoiceSampler::build_pairs_tables() {
  const std::size_t E = num_experts_;
  first_cond_.assign(E, 0.0);
  lo_prob_.assign(E, 0.0);
  down_cond_.assign(E, 0.0);
  if (uniform_) {  // exact ratios instead of sums of 1/E
    for (std::size_t e = 0; e < E; ++e) {
      first_cond_[e] = 1.0 / static_cast<double>(E - e);
      lo_prob_[e] = E > 1 ? static_cast<double>(e) / static_cast<double>(E - 1) : 0.0;
      down_cond_[e] = 1.0 / static_cast<double>(e + 1);
    }
    return;
  }
  // prefix[e] = p_0 + ... + p_{e-1}, suffix[e] = p_e + ... + p_{E-1}; each summed from its
  // small end, so a ratio of a tail weight to a tail sum keeps its relative precision.
  std::vector<double> prefix(E + 1, 0.0), suffix(E + 1, 0.0);
  for (std::size_t e = 0; e < E; ++e) prefix[e + 1] = prefix[e] + p_[e];
  for (std::size_t e = E; e-- > 0;) suffix[e] = suffix[e + 1] + p_[e];
  for (std::size_t e = 0; e < E; ++e) {
    if (p_[e] > 0) {
      first_cond_[e] = std::min(1.0, p_[e] / suffix[e]);
      down_cond_[e] = std::min(1.0, p_[e] / prefix[e + 1]);
    }
    const double rest = prefix[e] + suffix[e + 1];
    lo_prob_[e] = rest > 0 ? std::min(1.0, prefix[e] / rest) : 0.0;
    if (suffix[e + 1] == 0 && prefix[e] > 0) lo_prob_[e] = 1.0;
  }
  // The chains end at the last (first) expert with weight: probability 1 there, so rounding in
  // the sums can never leave tokens unplaced.
  for (std::size_t e = E; e-- > 0;)
    if (p_[e] > 0) {
      first_cond_[e] = 1.0;
      break;
    }
  for (std::size_t e = 0; e < E; ++e)
    if (p_[e] > 0) {
      down_cond_[e] = 1.0;
      break;
    }
}

std::span<const double> ChoiceSampler::rank_weights(int j) const {
  if (q_.empty()) return {};
  return {q_.data() + static_cast<std::size_t>(j) * num_experts_, num_experts_};
}

void ChoiceSampler::sample(Xoshiro256& rng, std::span<std::uint32_t> counts,
                           std::span<std::uint32_t> distinct) const {
  MOESIM_ASSERT(counts.size() == static_cast<std::size_t>(top_k_) * num_experts_,
                "counts must hold top_k * E entries");
  std::fill(counts.begin(), counts.end(), 0u);
  if (counts_distinct()) {
    MOESIM_ASSERT(
        distinct.empty() || distinct.size() == std::size_t{distinct_.positions} + distinct_.nodes,
        "distinct must hold positions + nodes entries");
    std::fill(distinct.begin(), distinct.end(), 0u);
    // Without `distinct`, still this sampler's draws: the plain token method's may differ.
    std::uint32_t* out = distinct.empty() ? nullptr : distinct.data();
    if (!node_of_.empty())
      sample_tokens_node_limited(rng, counts, out);
    else
      sample_tokens_distinct(rng, counts, out);
    return;
  }
  if (method_ == Method::kTokens)
    sample_tokens(rng, counts);
  else if (method_ == Method::kPairs)
    sample_pairs(rng, counts);
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
  return draw_excluding_scan(rng, chosen, n);
}

std::uint32_t ChoiceSampler::draw_excluding_scan(Xoshiro256& rng, const std::uint32_t* chosen,
                                                 int n) const {
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

std::uint32_t ChoiceSampler::draw_on_nodes(Xoshiro256& rng, const std::uint32_t* chosen, int n,
                                           const std::uint32_t* nodes, int num_nodes) const {
  auto is_chosen = [&](std::uint32_t e) { return std::find(chosen, chosen + n, e) != chosen + n; };
  // A node by its mass among the token's nodes, then an expert of it by p: a draw from p
  // restricted to those nodes; rejecting the token's earlier choices makes it the exact
  // conditional law (few attempts: a token has at most k - 1 earlier choices).
  if (uniform_ && node_size_ > 0) {  // equal nodes, every expert alike: a node, then one of it
    for (int attempt = 0; attempt < 64; ++attempt) {
      const std::uint32_t n = nodes[rng.below(static_cast<std::uint32_t>(num_nodes))];
      const std::uint32_t e = node_experts_[node_begin_[n] + rng.below(node_size_)];
      if (!is_chosen(e)) return e;
    }
  } else if (uniform_) {  // every expert of the token's nodes alike: one draw picks one of them
    std::uint32_t count = 0;
    for (int a = 0; a < num_nodes; ++a) count += node_begin_[nodes[a] + 1] - node_begin_[nodes[a]];
    for (int attempt = 0; attempt < 64; ++attempt) {
      std::uint32_t x = rng.below(count);
      int a = 0;
      for (std::uint32_t size; x >= (size = node_begin_[nodes[a] + 1] - node_begin_[nodes[a]]);)
        x -= size, ++a;
      const std::uint32_t e = node_experts_[node_begin_[nodes[a]] + x];
      if (!is_chosen(e)) return e;
    }
  }
  double total = 0;
  for (int a = 0; a < num_nodes; ++a) total += node_mass_[nodes[a]];
  for (int attempt = 0; !uniform_ && total > 0 && attempt < 64; ++attempt) {
    double u = rng.uniform() * total;
    int a = 0;
    while (a + 1 < num_nodes && (u -= node_mass_[nodes[a]]) >= 0) ++a;
    while (node_mass_[nodes[a]] <= 0) --a;  // rounding past the end lands on a node with mass
    const std::uint32_t n = nodes[a];
    const std::uint32_t e = node_experts_[node_begin_[n] + node_alias_[n].sample(rng)];
    if (!is_chosen(e)) return e;
  }
  return draw_on_nodes_scan(rng, chosen, n, nodes, num_nodes);
}

std::uint32_t ChoiceSampler::draw_on_nodes_scan(Xoshiro256& rng, const std::uint32_t* chosen, int n,
                                                const std::uint32_t* nodes, int num_nodes) const {
  auto is_chosen = [&](std::uint32_t e) { return std::find(chosen, chosen + n, e) != chosen + n; };
  // The same conditional law by a scan of the allowed nodes' experts only.
  double mass = 0;
  std::uint32_t available = 0;
  for (int a = 0; a < num_nodes; ++a)
    for (std::uint32_t x = node_begin_[nodes[a]]; x < node_begin_[nodes[a] + 1]; ++x) {
      const std::uint32_t e = node_experts_[x];
      if (is_chosen(e)) continue;
      mass += p_[e];
      ++available;
    }
  MOESIM_ASSERT(available > 0, "the token's nodes have no expert left");
  if (mass > 1e-300) {
    double u = rng.uniform() * mass;
    std::uint32_t last = num_experts_;
    for (int a = 0; a < num_nodes; ++a)
      for (std::uint32_t x = node_begin_[nodes[a]]; x < node_begin_[nodes[a] + 1]; ++x) {
        const std::uint32_t e = node_experts_[x];
        if (is_chosen(e) || p_[e] <= 0) continue;
        last = e;
        if ((u -= p_[e]) < 0) return e;
      }
    if (last < num_experts_) return last;  // rounding at the end of the scan
  }
  // No mass left on the token's nodes: any of their untaken experts, evenly.
  std::uint32_t r = rng.below(available);
  for (int a = 0; a < num_nodes; ++a)
    for (std::uint32_t x = node_begin_[nodes[a]]; x < node_begin_[nodes[a] + 1]; ++x) {
      const std::uint32_t e = node_experts_[x];
      if (!is_chosen(e) && r-- == 0) return e;
    }
  MOESIM_ASSERT(false, "unreachable: an available expert was counted");
  return 0;
}

void ChoiceSampler::count_distinct(const std::uint32_t* chosen, std::uint32_t* distinct,
                                   std::uint8_t* seen) const {
  // Flags, not searches: a position or node counts when its flag was clear (branch-free; whether
  // a choice repeats a node is a coin flip the predictor would miss), then the flags are cleared.
  const std::uint32_t w = distinct_.positions;
  for (int j = 0; j < top_k_; ++j) {
    const std::uint32_t q = distinct_.pos_of[chosen[j]];
    const std::uint32_t b = w + distinct_.node_of[chosen[j]];
    distinct[q] += seen[q] ^ 1u;
    seen[q] = 1;
    distinct[b] += seen[b] ^ 1u;
    seen[b] = 1;
  }
  for (int j = 0; j < top_k_; ++j) {
    seen[distinct_.pos_of[chosen[j]]] = 0;
    seen[w + distinct_.node_of[chosen[j]]] = 0;
  }
}

void ChoiceSampler::sample_tokens_distinct(Xoshiro256& rng, std::span<std::uint32_t> counts,
                                           std::uint32_t* distinct) const {
  const std::size_t E = num_experts_;
  std::uint32_t chosen[64];
  std::vector<std::uint8_t> seen(std::size_t{distinct_.positions} + distinct_.nodes, 0);
  for (std::int64_t t = 0; t < tokens_; ++t) {
    chosen[0] = draw(rng);
    ++counts[chosen[0]];
    for (int j = 1; j < top_k_; ++j) {
      chosen[j] = draw_excluding(rng, chosen, j);
      ++counts[static_cast<std::size_t>(j) * E + chosen[j]];
    }
    if (distinct != nullptr) count_distinct(chosen, distinct, seen.data());
  }
}

void ChoiceSampler::sample_tokens_node_limited(Xoshiro256& rng, std::span<std::uint32_t> counts,
                                               std::uint32_t* distinct) const {
  // Choices in affinity order, each from p without the token's earlier choices; once they span
  // `limit` nodes, the rest come from those nodes only: the token's top experts pick its nodes.
  // Two loops and branch-free node bookkeeping: which phase a choice is in, and whether its node
  // is new, are coin flips the branch predictor would miss (twice the sampling time).
  if (uniform_ && node_size_ > 0) {
    sample_tokens_node_limited_uniform(rng, counts, distinct);
    return;
  }
  const std::size_t E = num_experts_;
  std::uint32_t chosen[64];
  std::uint32_t nodes[65];  // take() writes one past the token's nodes (limit <= 64)
  std::vector<std::uint8_t> on(node_begin_.size() - 1, 0);  // nodes the token uses, as flags
  std::vector<std::uint8_t> seen(
      distinct != nullptr ? std::size_t{distinct_.positions} + distinct_.nodes : 0, 0);
  int num_nodes = 0;
  auto take = [&](int j, std::uint32_t e) {
    chosen[j] = e;
    ++counts[static_cast<std::size_t>(j) * E + e];
    const std::uint32_t n = node_of_[e];
    nodes[num_nodes] = n;
    num_nodes += on[n] ^ 1;
    on[n] = 1;
  };
  for (std::int64_t t = 0; t < tokens_; ++t) {
    num_nodes = 0;
    take(0, draw(rng));
    int j = 1;
    for (; j < top_k_ && num_nodes < node_limit_; ++j) take(j, draw_excluding(rng, chosen, j));
    for (; j < top_k_; ++j) take(j, draw_on_nodes(rng, chosen, j, nodes, num_nodes));
    for (int a = 0; a < num_nodes; ++a) on[nodes[a]] = 0;
    if (distinct != nullptr) count_distinct(chosen, distinct, seen.data());
  }
}

void ChoiceSampler::sample_tokens_node_limited_uniform(Xoshiro256& rng,
                                                       std::span<std::uint32_t> counts,
                                                       std::uint32_t* distinct) const {
  // sample_tokens_node_limited with draw, draw_excluding, draw_on_nodes and count_distinct
  // inlined for uniform p on nodes of node_size_ experts: the same draws from rng in the same
  // order, the same fallbacks after 64 attempts, so the same counts.
  const std::size_t E = num_experts_;
  const std::uint32_t num_experts = num_experts_;
  const std::uint32_t node_size = node_size_;
  const std::uint32_t* node_of = node_of_.data();
  const std::uint32_t* node_begin = node_begin_.data();
  const std::uint32_t* node_experts = node_experts_.data();
  std::uint32_t* c = counts.data();
  std::uint32_t chosen[64];
  std::uint32_t nodes[65];  // take() writes one past the token's nodes (limit <= 64)
  // node_experts offset of each of the token's nodes: one load less between a draw and its test
  const std::uint32_t* experts_of[65];
  std::vector<std::uint8_t> on_flags(node_begin_.size() - 1, 0);  // nodes the token uses
  std::vector<std::uint8_t> taken_flags(E, 0);                    // the token's choices
  std::uint8_t* on = on_flags.data();
  std::uint8_t* taken = taken_flags.data();
  const std::uint32_t w = distinct != nullptr ? distinct_.positions : 0;
  const std::uint32_t* pos_of = distinct != nullptr ? distinct_.pos_of.data() : nullptr;
  const std::uint32_t* dnode_of = distinct != nullptr ? distinct_.node_of.data() : nullptr;
  std::vector<std::uint8_t> seen_flags(distinct != nullptr ? std::size_t{w} + distinct_.nodes : 0,
                                       0);
  std::uint8_t* seen = seen_flags.data();
  // A local generator whose address never escapes stays in registers: through `rng` every byte
  // flag store (which may alias anything) forced its state back to memory.
  Xoshiro256 r = rng;
  int num_nodes = 0;
  auto scan_excluding = [&](int j) {
    Xoshiro256 g = r;
    const std::uint32_t e = draw_excluding_scan(g, chosen, j);
    r = g;
    return e;
  };
  auto scan_on_nodes = [&](int j) {
    Xoshiro256 g = r;
    const std::uint32_t e = draw_on_nodes_scan(g, chosen, j, nodes, num_nodes);
    r = g;
    return e;
  };
  auto take = [&](int j, std::uint32_t e) {
    chosen[j] = e;
    taken[e] = 1;
    ++c[static_cast<std::size_t>(j) * E + e];
    const std::uint32_t n = node_of[e];
    nodes[num_nodes] = n;
    experts_of[num_nodes] = node_experts + node_begin[n];
    num_nodes += on[n] ^ 1;
    on[n] = 1;
  };
  const int k = top_k_;
  const int limit = node_limit_;
  for (std::int64_t t = 0; t < tokens_; ++t) {
    num_nodes = 0;
    take(0, r.below(num_experts));
    int j = 1;
    for (; j < k && num_nodes < limit; ++j) {
      std::uint32_t e = 0;
      int attempt = 0;
      for (; attempt < 64; ++attempt)
        if (!taken[e = r.below(num_experts)]) break;
      take(j, attempt < 64 ? e : scan_excluding(j));
    }
    for (; j < k; ++j) {
      std::uint32_t e = 0;
      int attempt = 0;
      for (; attempt < 64; ++attempt) {
        const std::uint32_t* of = experts_of[r.below(static_cast<std::uint32_t>(num_nodes))];
        e = of[r.below(node_size)];
        if (!taken[e]) break;
      }
      take(j, attempt < 64 ? e : scan_on_nodes(j));
    }
    for (int a = 0; a < num_nodes; ++a) on[nodes[a]] = 0;
    for (int i = 0; i < k; ++i) taken[chosen[i]] = 0;
    if (distinct != nullptr) {
      // count_distinct, inlined.
      for (int i = 0; i < k; ++i) {
        const std::uint32_t q = pos_of[chosen[i]];
        const std::uint32_t b = w + dnode_of[chosen[i]];
        distinct[q] += seen[q] ^ 1u;
        seen[q] = 1;
        distinct[b] += seen[b] ^ 1u;
        seen[b] = 1;
      }
      for (int i = 0; i < k; ++i) {
        seen[pos_of[chosen[i]]] = 0;
        seen[w + dnode_of[chosen[i]]] = 0;
      }
    }
  }
  rng = r;
}

void ChoiceSampler::sample_tokens(Xoshiro256& rng, std::span<std::uint32_t> counts) const {
  if (!node_of_.empty()) {
    sample_tokens_node_limited(rng, counts, nullptr);
    return;
  }
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
      if (cond[e] < 1.0) x = binomial(rng, left, cond[e]);
      c[e] = static_cast<std::uint32_t>(x);
      left -= x;
    }
    MOESIM_ASSERT(left == 0, "multinomial chain must place every token");
  }
}

void ChoiceSampler::sample_pairs(Xoshiro256& rng, std::span<std::uint32_t> counts) const {
  const std::size_t E = num_experts_;
  std::uint32_t* c1 = counts.data();
  // First choices: Multinomial(S, p) as a chain of conditional binomials.
  std::int64_t left = tokens_;
  for (std::size_t e = 0; e < E && left > 0; ++e) {
    const std::int64_t x = binomial(rng, left, first_cond_[e]);
    c1[e] = static_cast<std::uint32_t>(x);
    left -= x;
  }
  MOESIM_ASSERT(left == 0, "first-choice chain must place every token");
  if (top_k_ == 1) return;
  // Second choices. A token whose first choice is f draws its second from p restricted to the
  // other experts: below f with probability P_f / (P_f + T_{f+1}), then distributed as p over
  // [0, f); otherwise as p over (f, E). Ascending pass: split every expert's first-choice tokens
  // into lo and hi; the pending hi tokens all follow p over [e, E), so the number landing on e
  // is Binomial(pending, p_e / T_e) and the rest follow p over (e, E). Descending pass: the same
  // for the lo tokens with p_e / P_{e+1}. Every step is the exact conditional law, so the counts
  // have exactly the token method's joint distribution.
  std::uint32_t* c2 = c1 + E;
  std::vector<std::uint32_t> lo(E);
  std::int64_t above = 0;
  for (std::size_t e = 0; e < E; ++e) {
    if (above > 0) {
      const std::int64_t x = binomial(rng, above, first_cond_[e]);
      c2[e] = static_cast<std::uint32_t>(x);
      above -= x;
    }
    const std::int64_t below_f = binomial(rng, c1[e], lo_prob_[e]);
    lo[e] = static_cast<std::uint32_t>(below_f);
    above += c1[e] - below_f;
  }
  MOESIM_ASSERT(above == 0, "second-choice chain (above the first) must place every token");
  std::int64_t below = 0;
  for (std::size_t e = E; e-- > 0;) {
    if (below > 0) {
      const std::int64_t x = binomial(rng, below, down_cond_[e]);
      c2[e] += static_cast<std::uint32_t>(x);
      below -= x;
    }
    below += lo[e];
  }
  MOESIM_ASSERT(below == 0, "second-choice chain (below the first) must place every token");
}

}  // namespace moesim::workload::detail
