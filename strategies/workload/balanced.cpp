#include "strategies/workload/balanced.hpp"

#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "strategies/workload/random.hpp"

namespace moesim::workload::detail {

namespace {
// Fisher-Yates with our own index draws, as zipf_popularity: the same order on every library.
void shuffle(std::vector<std::uint32_t>& v, Xoshiro256& rng) {
  for (auto i = static_cast<std::uint32_t>(v.size()); i > 1; --i)
    std::swap(v[i - 1], v[rng.below(i)]);
}
}  // namespace

std::vector<std::uint32_t> balanced_order(int num_experts, std::span<const std::uint32_t> node_of,
                                          int limit, std::uint64_t seed, int iteration, int layer) {
  MOESIM_ASSERT(num_experts >= 1, "balanced routing needs experts");
  const auto E = static_cast<std::size_t>(num_experts);
  const auto it = static_cast<std::uint64_t>(iteration);
  const auto ly = static_cast<std::uint64_t>(layer);
  const std::uint32_t nodes =
      node_of.empty() ? 1 : *std::max_element(node_of.begin(), node_of.end()) + 1;
  std::vector<std::uint32_t> order;
  order.reserve(E);
  if (limit <= 0 || static_cast<std::uint32_t>(limit) >= nodes) {
    order.resize(E);
    std::iota(order.begin(), order.end(), 0u);
    Xoshiro256 rng(substream_key(seed, Stream::kBalanced, it, ly, 0));
    shuffle(order, rng);
    return order;
  }
  MOESIM_ASSERT(node_of.size() == E, "balanced routing: one node per expert");
  std::vector<std::vector<std::uint32_t>> per_node(nodes);
  for (std::uint32_t e = 0; e < E; ++e) per_node[node_of[e]].push_back(e);
  for (std::uint32_t n = 0; n < nodes; ++n) {
    Xoshiro256 rng(substream_key(seed, Stream::kBalanced, it, ly, n + 1));
    shuffle(per_node[n], rng);
  }
  // Blocks of `limit` nodes in label order (the last may hold fewer), listed round robin so a
  // token's window spreads over its block's nodes as DeepSeek's tokens spread over their M nodes.
  for (std::uint32_t first = 0; first < nodes; first += static_cast<std::uint32_t>(limit)) {
    const std::uint32_t end = std::min(nodes, first + static_cast<std::uint32_t>(limit));
    for (std::size_t i = 0;; ++i) {
      bool any = false;
      for (std::uint32_t n = first; n < end; ++n) {
        if (i >= per_node[n].size()) continue;
        order.push_back(per_node[n][i]);
        any = true;
      }
      if (!any) break;
    }
  }
  return order;
}

int balanced_max_nodes(std::span<const std::uint32_t> order, std::span<const std::uint32_t> node_of,
                       int top_k) {
  const std::size_t E = order.size();
  if (E == 0 || node_of.empty()) return 0;
  const std::size_t k = static_cast<std::size_t>(top_k);
  const std::size_t g = std::gcd(k, E);
  std::vector<std::uint8_t> seen(*std::max_element(node_of.begin(), node_of.end()) + 1, 0);
  int most = 0;
  for (std::size_t a = 0; a < E; a += g) {
    int count = 0;
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint32_t n = node_of[order[(a + j) % E]];
      if (!seen[n]) seen[n] = 1, ++count;
    }
    for (std::size_t j = 0; j < k; ++j) seen[node_of[order[(a + j) % E]]] = 0;
    most = std::max(most, count);
  }
  return most;
}

BalancedSampler::BalancedSampler(std::vector<std::uint32_t> order, int top_k,
                                 std::int64_t tokens_per_gpu, DistinctDestinations distinct)
    : order_(std::move(order)),
      top_k_(top_k),
      tokens_(tokens_per_gpu),
      distinct_(std::move(distinct)) {
  MOESIM_ASSERT(top_k_ >= 1 && static_cast<std::size_t>(top_k_) <= order_.size(),
                "balanced routing needs 1 <= top_k <= E");
  MOESIM_ASSERT(tokens_ >= 0, "balanced routing: negative tokens");
}

void BalancedSampler::sample(std::uint64_t ep_position, std::span<std::uint32_t> counts,
                             std::span<std::uint32_t> distinct) const {
  const std::uint64_t E = order_.size();
  const auto k = static_cast<std::uint64_t>(top_k_);
  const auto S = static_cast<std::uint64_t>(tokens_);
  MOESIM_ASSERT(counts.size() == k * E, "balanced routing: counts of the wrong size");
  std::fill(counts.begin(), counts.end(), 0u);
  const bool count_distinct = !distinct_.pos_of.empty() && !distinct.empty();
  if (count_distinct) std::fill(distinct.begin(), distinct.end(), 0u);
  // Where this GPU's slots start in the group's sequence, mod E (no overflow: both factors < E).
  const std::uint64_t start = (ep_position % E) * ((S % E) * k % E) % E;
  // Token t and token t + period take the same experts: count one period with multiplicities.
  const std::uint64_t period = E / std::gcd(k, E);
  const std::uint64_t distinct_tokens = std::min(S, period);
  std::vector<std::uint8_t> seen(count_distinct ? distinct.size() : 0, 0);
  for (std::uint64_t t = 0; t < distinct_tokens; ++t) {
    const auto weight = static_cast<std::uint32_t>((S - t + period - 1) / period);
    const std::uint64_t base = (start + t * k) % E;
    for (std::uint64_t j = 0; j < k; ++j) {
      const std::uint32_t e = order_[(base + j) % E];
      counts[j * E + e] += weight;
      if (!count_distinct) continue;
      const std::size_t slots[2] = {distinct_.pos_of[e],
                                    distinct_.positions + distinct_.node_of[e]};
      for (const std::size_t x : slots)
        if (!seen[x]) seen[x] = 1, distinct[x] += weight;
    }
    if (count_distinct)
      for (std::uint64_t j = 0; j < k; ++j) {
        const std::uint32_t e = order_[(base + j) % E];
        seen[distinct_.pos_of[e]] = 0;
        seen[distinct_.positions + distinct_.node_of[e]] = 0;
      }
  }
}

}  // namespace moesim::workload::detail
