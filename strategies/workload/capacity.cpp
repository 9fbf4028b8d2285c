// Capacity (dC) modes, per-pair slot assignment, and the dispatch/combine matrices that follow
// from a LayerDispatch.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::workload {

namespace {

std::int64_t round_up(std::int64_t x, int multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// ceil(k * f * S / E), robust to the product landing a hair above an integer (k = 2, f = 1.2,
// S = 10, E = 24 is exactly 1 but 2 * 1.2 * 10 / 24 = 1.0000000000000002 in doubles).
std::int64_t fixed_slots(double f, int top_k, std::int64_t tokens_per_gpu, int num_experts) {
  const double x = static_cast<double>(top_k) * f * static_cast<double>(tokens_per_gpu) /
                   static_cast<double>(num_experts);
  const double nearest = std::round(x);
  if (std::abs(x - nearest) <= 1e-9 * std::max(1.0, x)) return static_cast<std::int64_t>(nearest);
  return static_cast<std::int64_t>(std::ceil(x));
}

}  // namespace

std::int64_t capacity_slots(double f, int top_k, std::int64_t tokens_per_gpu, int num_experts,
                            std::int64_t max_demanded, int multiple) {
  MOESIM_ASSERT(multiple >= 1, "capacity multiple must be >= 1");
  MOESIM_ASSERT(num_experts >= 1 && top_k >= 1 && tokens_per_gpu >= 0 && max_demanded >= 0,
                "capacity inputs out of range");
  MOESIM_ASSERT(std::isfinite(f), "capacity factor must be finite");
  if (f > 0) return round_up(fixed_slots(f, top_k, tokens_per_gpu, num_experts), multiple);
  const std::int64_t dropless = round_up(max_demanded, multiple);
  if (f == 0) return dropless;
  return std::min(dropless,
                  round_up(fixed_slots(-f, top_k, tokens_per_gpu, num_experts), multiple));
}

std::int64_t apply_capacity(std::span<const std::uint32_t> counts_by_choice, std::int64_t capacity,
                            std::span<std::uint32_t> kept_by_choice) {
  MOESIM_ASSERT(kept_by_choice.size() == counts_by_choice.size(),
                "kept_by_choice must match counts_by_choice");
  MOESIM_ASSERT(capacity >= 0, "capacity must be >= 0");
  std::int64_t free = capacity;
  for (std::size_t j = 0; j < counts_by_choice.size(); ++j) {
    const std::int64_t kept = std::min<std::int64_t>(counts_by_choice[j], free);
    kept_by_choice[j] = static_cast<std::uint32_t>(kept);
    free -= kept;
  }
  return capacity - free;
}

ByteMatrix dispatch_matrix(const LayerDispatch& layer, std::span<const int> group_ranks,
                           const ExpertPlacement& placement, Bytes bytes_per_token, bool padded) {
  const int W = static_cast<int>(group_ranks.size());
  const int E = layer.num_experts;
  MOESIM_ASSERT(placement.experts_per_gpu >= 1 && placement.shards >= 1,
                "placement needs experts_per_gpu >= 1 and shards >= 1");
  MOESIM_ASSERT(E == 0 || placement.owner(E - 1) + placement.shards <= W,
                "the EP group is too small for the layer's experts");
  ByteMatrix m;
  m.size = W;
  m.unit = bytes_per_token;
  m.dense = true;
  m.counts.assign(static_cast<std::size_t>(W) * W, 0u);
  for (int a = 0; a < W; ++a) {
    const int rank = group_ranks[static_cast<std::size_t>(a)];
    MOESIM_ASSERT(rank >= 0 && rank < layer.num_gpus, "group rank outside the layer's GPUs");
    std::uint32_t* row = m.counts.data() + static_cast<std::size_t>(a) * W;
    for (int e = 0; e < E; ++e) {
      // Padded buffers hold dC slots per expert whether filled or not.
      const auto tokens = padded ? static_cast<std::uint32_t>(layer.capacity) : layer.at(rank, e);
      row[placement.owner(e)] += tokens;
    }
  }
  return m;
}

ByteMatrix combine_matrix(const LayerDispatch& layer, std::span<const int> group_ranks,
                          const ExpertPlacement& placement, Bytes bytes_per_token, bool padded) {
  ByteMatrix d = dispatch_matrix(layer, group_ranks, placement, bytes_per_token, padded);
  const auto W = static_cast<std::size_t>(d.size);
  for (std::size_t a = 0; a < W; ++a)
    for (std::size_t b = a + 1; b < W; ++b) std::swap(d.counts[a * W + b], d.counts[b * W + a]);
  return d;
}

std::shared_ptr<NodeDedup> node_dedup(const LayerDispatch& layer, std::span<const int> group_ranks,
                                      Bytes bytes_per_token, std::uint32_t chunk,
                                      std::uint32_t chunks) {
  const int w = static_cast<int>(group_ranks.size()), n = layer.distinct_nodes;
  if (layer.distinct_positions != w || layer.distinct.empty())
    throw InputError(fmt::format(
        "a2a deepep: the workload counted distinct tokens for EP groups of {} GPUs, the plan's "
        "have {}",
        layer.distinct_positions, w));
  MOESIM_ASSERT(chunks >= 1 && chunk < chunks, "node_dedup: chunk out of range");
  auto d = std::make_shared<NodeDedup>();
  d->size = w;
  d->nodes = n;
  d->unit = bytes_per_token;
  d->gpu_tokens.resize(static_cast<std::size_t>(w) * w);
  d->node_tokens.resize(static_cast<std::size_t>(w) * n);
  const auto part = [&](std::uint32_t c) { return c / chunks + (chunk < c % chunks ? 1u : 0u); };
  const auto row_len = static_cast<std::size_t>(w + n);
  for (int a = 0; a < w; ++a) {
    const std::uint32_t* row =
        layer.distinct.data() +
        static_cast<std::size_t>(group_ranks[static_cast<std::size_t>(a)]) * row_len;
    for (int q = 0; q < w; ++q) d->gpu_tokens[static_cast<std::size_t>(a) * w + q] = part(row[q]);
    for (int b = 0; b < n; ++b)
      d->node_tokens[static_cast<std::size_t>(a) * n + b] = part(row[w + b]);
  }
  return d;
}

}  // namespace moesim::workload
