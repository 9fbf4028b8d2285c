#include "strategies/inference/correlated_routing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "core/error.hpp"
#include "strategies/workload/sampling.hpp"

namespace moesim::inference {

namespace wd = workload::detail;

namespace {

// Substream purposes of this generator, away from workload::detail::Stream's values.
constexpr std::uint64_t kDominantPurpose = 103;
constexpr std::uint64_t kBatchPopularityPurpose = 104;

std::uint64_t group_hash(std::span<const std::uint16_t> group) {
  std::uint64_t h = wd::mix64(0x70617468ULL ^ group.size());  // "path"
  for (std::uint16_t e : group) h = wd::mix64(h ^ (static_cast<std::uint64_t>(e) + 1));
  return h;
}

}  // namespace

CorrelatedRoutingParams CorrelatedRoutingParams::of(const Scenario& sc) {
  CorrelatedRoutingParams p;
  const auto& rt = sc.workload.routing;
  p.num_experts = sc.num_experts();
  p.top_k = sc.model.top_k;
  p.num_layers = sc.model.num_moe_layers();
  p.seed = rt.seed;
  p.memory = rt.memory;
  switch (rt.distribution) {
    case RoutingDistribution::kCorrelated:
      p.skew = rt.skew;
      p.stickiness = rt.stickiness;
      p.batch_variation = rt.batch_variation;
      break;
    case RoutingDistribution::kZipf:
      p.skew = rt.skew;
      p.stickiness = 0;
      break;
    default:
      p.skew = 0;
      p.stickiness = 0;
      break;
  }
  return p;
}

CorrelatedRouting::CorrelatedRouting(CorrelatedRoutingParams params) : p_(params) {
  if (p_.num_experts < 1 || p_.num_experts > 65536)
    throw InputError(
        fmt::format("correlated routing: {} experts, expected 1..65536 (expert ids are 16-bit)",
                    p_.num_experts));
  if (p_.top_k < 1 || p_.top_k > p_.num_experts)
    throw InputError(fmt::format("correlated routing: top_k {} with {} experts, expected 1..E",
                                 p_.top_k, p_.num_experts));
  if (p_.num_layers < 0 || !(p_.skew >= 0) || !(p_.stickiness >= 0 && p_.stickiness <= 1) ||
      p_.memory < 1 || !(p_.batch_variation >= 0 && p_.batch_variation < 1))
    throw InputError(fmt::format(
        "correlated routing: layers {}, skew {}, stickiness {}, memory {}, batch_variation {}: "
        "expected layers >= 0, skew >= 0, stickiness in [0, 1], memory >= 1, batch_variation in "
        "[0, 1)",
        p_.num_layers, p_.skew, p_.stickiness, p_.memory, p_.batch_variation));
  for (int l = 0; l < p_.num_layers; ++l) {
    pop_.push_back(wd::zipf_popularity(p_.num_experts, p_.skew, p_.seed, l));
    std::vector<double> c(pop_.back().size());
    double s = 0;
    for (std::size_t e = 0; e < c.size(); ++e) c[e] = (s += pop_.back()[e]);
    cdf_.push_back(std::move(c));
  }
}

int CorrelatedRouting::dominant(int layer, std::span<const std::uint16_t> group) const {
  const std::size_t keep = std::min<std::size_t>(group.size(), static_cast<std::size_t>(p_.memory));
  const std::uint64_t key =
      wd::mix64(wd::mix64(p_.seed ^ kDominantPurpose) ^
                wd::mix64(static_cast<std::uint64_t>(layer) ^ group_hash(group.last(keep))));
  // Inverse CDF of the layer's marginals at a uniform u: dominant experts follow popularity.
  const auto& cdf = cdf_[static_cast<std::size_t>(layer)];
  const double u = static_cast<double>(key >> 11) * 0x1.0p-53 * cdf.back();
  const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
  return static_cast<int>(
      std::min<std::ptrdiff_t>(it - cdf.begin(), static_cast<std::ptrdiff_t>(cdf.size()) - 1));
}

int CorrelatedRouting::draw_other(wd::Xoshiro256& rng, const wd::AliasTable& alias,
                                  const std::vector<double>& p, const std::uint16_t* chosen,
                                  int n) {
  auto taken = [&](std::uint32_t e) { return std::find(chosen, chosen + n, e) != chosen + n; };
  // Rejection is cheap unless the chosen experts hold almost all the mass; after a bounded
  // number of tries, draw exactly from the renormalised rest.
  for (int attempt = 0; attempt < 64; ++attempt) {
    const std::uint32_t e = alias.sample(rng);
    if (!taken(e)) return static_cast<int>(e);
  }
  double rest = 0;
  for (std::size_t e = 0; e < p.size(); ++e)
    if (!taken(static_cast<std::uint32_t>(e))) rest += p[e];
  double u = rng.uniform() * rest;
  int last = -1;
  for (std::size_t e = 0; e < p.size(); ++e) {
    if (taken(static_cast<std::uint32_t>(e))) continue;
    last = static_cast<int>(e);
    if ((u -= p[e]) < 0) return last;
  }
  return last;
}

std::vector<double> CorrelatedRouting::batch_popularity(BatchStream stream, int index,
                                                        int layer) const {
  const auto& p = pop_[static_cast<std::size_t>(layer)];
  const double v = p_.batch_variation;
  if (v <= 0) return p;
  const double c = 1.0 / (v * v) - 1.0;
  wd::Xoshiro256 rng(wd::mix64(wd::substream_key(
      p_.seed, static_cast<wd::Stream>(kBatchPopularityPurpose), static_cast<std::uint64_t>(stream),
      static_cast<std::uint64_t>(index), static_cast<std::uint64_t>(layer))));
  std::vector<double> q(p.size(), 0.0);
  double sum = 0;
  for (std::size_t e = 0; e < p.size(); ++e) {
    if (p[e] <= 0) continue;
    std::gamma_distribution<double> gamma(c * p[e], 1.0);
    sum += q[e] = gamma(rng);
  }
  if (!(sum > 0)) return p;  // every gamma underflowed: keep the marginals
  for (auto& x : q) x /= sum;
  return q;
}

RoutingBatch CorrelatedRouting::batch(BatchStream stream, int index, int num_gpus,
                                      std::int64_t tokens_per_gpu) const {
  RoutingBatch b;
  b.num_layers = p_.num_layers;
  b.top_k = p_.top_k;
  b.num_tokens = static_cast<std::int64_t>(num_gpus) * tokens_per_gpu;
  const int k = p_.top_k;
  b.choices.assign(static_cast<std::size_t>(p_.num_layers),
                   std::vector<std::uint16_t>(static_cast<std::size_t>(b.num_tokens) * k));
  std::vector<std::uint16_t> path(static_cast<std::size_t>(p_.num_layers));
  std::vector<std::uint16_t> chosen(static_cast<std::size_t>(k));
  std::vector<std::vector<double>> q;
  std::vector<wd::AliasTable> q_alias;
  for (int l = 0; l < p_.num_layers; ++l) {
    q.push_back(batch_popularity(stream, index, l));
    q_alias.emplace_back(q.back());
  }
  for (int g = 0; g < num_gpus; ++g) {
    wd::Xoshiro256 rng(wd::substream_key(p_.seed, static_cast<wd::Stream>(stream),
                                         static_cast<std::uint64_t>(index),
                                         static_cast<std::uint64_t>(g)));
    for (std::int64_t t = g * tokens_per_gpu; t < (g + 1) * tokens_per_gpu; ++t) {
      for (int l = 0; l < p_.num_layers; ++l) {
        int first;
        if (l > 0 && p_.stickiness > 0 && rng.uniform() < p_.stickiness)
          first = dominant(l, std::span<const std::uint16_t>(path.data(), static_cast<size_t>(l)));
        else
          first = static_cast<int>(q_alias[static_cast<std::size_t>(l)].sample(rng));
        chosen[0] = static_cast<std::uint16_t>(first);
        for (int j = 1; j < k; ++j)
          chosen[static_cast<std::size_t>(j)] = static_cast<std::uint16_t>(
              draw_other(rng, q_alias[static_cast<std::size_t>(l)], q[static_cast<std::size_t>(l)],
                         chosen.data(), j));
        path[static_cast<std::size_t>(l)] = chosen[0];
        std::copy(chosen.begin(), chosen.end(),
                  b.choices[static_cast<std::size_t>(l)].begin() + t * k);
      }
    }
  }
  return b;
}

}  // namespace moesim::inference
