#include "core/routed_assignment.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.hpp"

namespace moesim {

namespace {
std::size_t idx(std::size_t a, std::size_t b, std::size_t n) { return a * n + b; }
}  // namespace

std::vector<RoutedPiece> routed_pieces(const ExpertRouting& r, int src) {
  const int W = r.size, E = r.experts;
  MOESIM_ASSERT(src >= 0 && src < W && r.counts.size() == static_cast<std::size_t>(W) * E,
                "routed_pieces: routing shape");
  const std::uint32_t* row = &r.counts[idx(static_cast<std::size_t>(src), 0, E)];
  std::vector<RoutedPiece> out;
  if (r.spread) {
    // The row's entries in expert order, dealt as consecutive runs to (src + y) mod W.
    const std::uint64_t total = std::accumulate(row, row + E, std::uint64_t{0});
    int e = 0;
    std::uint32_t left = E > 0 ? row[0] : 0;
    for (int y = 0; y < W; ++y) {
      const int dst = (src + y) % W;
      std::uint64_t n = total / W + (static_cast<std::uint64_t>(y) < total % W ? 1 : 0);
      while (n > 0) {
        while (left == 0) left = row[++e];
        const auto take = static_cast<std::uint32_t>(std::min<std::uint64_t>(n, left));
        out.push_back({e, dst, take});
        n -= take;
        left -= take;
      }
    }
    return out;
  }
  for (int e = 0; e < E; ++e) {
    const std::uint32_t c = row[e];
    if (c == 0) continue;
    if (r.replicas.empty()) {
      out.push_back({e, e / std::max(1, r.experts_per_gpu), c});
      continue;
    }
    const auto& reps = r.replicas.at(static_cast<std::size_t>(e));
    MOESIM_ASSERT(!reps.empty(), "routed_pieces: an expert with tokens and no GPU");
    const auto nr = static_cast<std::uint32_t>(reps.size());
    // inference::token_matrix's split: replica (src + y) mod r gets c / r (+1 for y < c % r).
    for (std::uint32_t y = 0; y < nr; ++y) {
      const std::uint32_t n = c / nr + (y < c % nr ? 1u : 0u);
      if (n > 0) out.push_back({e, reps[(static_cast<std::uint32_t>(src) + y) % nr], n});
    }
  }
  return out;
}

std::uint32_t chunk_share(std::uint32_t n, int chunks, int j) {
  const auto r = static_cast<std::uint32_t>(chunks);
  return n / r + (static_cast<std::uint32_t>(j) < n % r ? 1u : 0u);
}

RoutedAssignment assign_routed(const ExpertRouting& r, int src, int tokens, int top_k, int chunks) {
  const int W = r.size, E = r.experts, S = tokens, k = top_k;
  MOESIM_ASSERT(chunks >= 1 && S >= 0 && k >= 1, "assign_routed: shape");
  const std::uint32_t* row = &r.counts[idx(static_cast<std::size_t>(src), 0, E)];
  std::uint64_t total = 0;
  for (int e = 0; e < E; ++e) {
    if (row[e] > static_cast<std::uint32_t>(S))
      throw InputError(fmt::format(
          "plan-routed MoE layer: GPU position {} routes {} tokens to expert {} but has only {} "
          "tokens (a token's choices must be distinct experts)",
          src, row[e], e, S));
    total += row[e];
  }
  if (total > static_cast<std::uint64_t>(S) * k)
    throw InputError(fmt::format(
        "plan-routed MoE layer: GPU position {} routes {} choices, more than its {} tokens x "
        "top_k {}",
        src, total, S, k));
  RoutedAssignment a;
  a.expert.assign(static_cast<std::size_t>(S) * k, -1);
  std::vector<std::vector<int>> pair(static_cast<std::size_t>(W));
  std::uint64_t i = 0;
  for (const RoutedPiece& p : routed_pieces(r, src))
    for (std::uint32_t q = 0; q < p.count; ++q, ++i) {
      // Entry i of the expert-ordered list: token i % S, choice i / S.
      const auto entry = static_cast<int>((i % S) * k + i / S);
      a.expert[static_cast<std::size_t>(entry)] = p.expert;
      pair[static_cast<std::size_t>(p.dst)].push_back(entry);
    }
  a.dropped = static_cast<long long>(static_cast<std::uint64_t>(S) * k - total);
  a.send.assign(static_cast<std::size_t>(chunks), std::vector<std::vector<int>>(W));
  for (int b = 0; b < W; ++b) {
    const auto& list = pair[static_cast<std::size_t>(b)];
    const auto n = static_cast<std::uint32_t>(list.size());
    std::size_t off = 0;
    for (int j = 0; j < chunks; ++j) {
      const std::uint32_t c = chunk_share(n, chunks, j);
      a.send[j][b].assign(list.begin() + static_cast<std::ptrdiff_t>(off),
                          list.begin() + static_cast<std::ptrdiff_t>(off + c));
      off += c;
    }
  }
  return a;
}

std::vector<std::vector<int>> token_positions(const ExpertRouting& r, const RoutedAssignment& a,
                                              int tokens, int top_k) {
  MOESIM_ASSERT(r.replicas.empty() && !r.spread, "token_positions: one GPU per expert");
  MOESIM_ASSERT(a.expert.size() == static_cast<std::size_t>(tokens) * top_k,
                "token_positions: assignment shape");
  const int per_gpu = std::max(1, r.experts_per_gpu);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(tokens));
  for (int t = 0; t < tokens; ++t) {
    auto& pos = out[static_cast<std::size_t>(t)];
    for (int c = 0; c < top_k; ++c) {
      const int e = a.expert[static_cast<std::size_t>(t) * top_k + c];
      if (e >= 0) pos.push_back(e / per_gpu);
    }
    std::sort(pos.begin(), pos.end());
    pos.erase(std::unique(pos.begin(), pos.end()), pos.end());
  }
  return out;
}

std::shared_ptr<NodeDedup> assignment_dedup(const ExpertRouting& r, int tokens, int top_k,
                                            int nodes, Bytes unit) {
  const int w = r.size;
  MOESIM_ASSERT(nodes >= 1 && w % nodes == 0, "assignment_dedup: the group is not node-aligned");
  const int m = w / nodes;
  auto d = std::make_shared<NodeDedup>();
  d->size = w;
  d->nodes = nodes;
  d->unit = unit;
  d->gpu_tokens.assign(static_cast<std::size_t>(w) * w, 0);
  d->node_tokens.assign(static_cast<std::size_t>(w) * nodes, 0);
  for (int s = 0; s < w; ++s) {
    const RoutedAssignment a = assign_routed(r, s, tokens, top_k, 1);
    for (const std::vector<int>& pos : token_positions(r, a, tokens, top_k)) {
      int last_node = -1;
      for (int q : pos) {  // ascending, so a node's positions are consecutive
        ++d->gpu_tokens[idx(static_cast<std::size_t>(s), static_cast<std::size_t>(q), w)];
        if (q / m != last_node) {
          last_node = q / m;
          ++d->node_tokens[idx(static_cast<std::size_t>(s), static_cast<std::size_t>(last_node),
                               nodes)];
        }
      }
    }
  }
  return d;
}

}  // namespace moesim
