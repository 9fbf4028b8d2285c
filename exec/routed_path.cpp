#include "exec/routed_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.hpp"
#include "exec/executor.hpp"
#include "exec/host_layer.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

std::size_t idx(std::size_t a, std::size_t b, std::size_t n) { return a * n + b; }

// Tokens (counts) of pair (src, dst) in an all_to_allv matrix.
std::uint32_t pair_count(const ByteMatrix& m, int src, int dst) {
  return static_cast<std::uint32_t>(std::llround(m.at(src, dst).value() / m.unit.value()));
}

// The group of `grp` that holds `rank`: (group index, position), or (-1, -1).
std::pair<int, int> find_rank(const Grouping& grp, int rank) {
  for (std::size_t gi = 0; gi < grp.groups.size(); ++gi) {
    const auto& g = grp.groups[gi];
    const auto it = std::find(g.begin(), g.end(), rank);
    if (it != g.end()) return {static_cast<int>(gi), static_cast<int>(it - g.begin())};
  }
  return {-1, -1};
}

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

std::vector<std::vector<RoutedRun>> routed_receives(const ExpertRouting& r, int dst, int chunks) {
  std::vector<std::vector<RoutedRun>> out(static_cast<std::size_t>(chunks));
  for (int a = 0; a < r.size; ++a) {
    std::vector<RoutedPiece> mine;
    std::uint32_t n = 0;
    for (const RoutedPiece& p : routed_pieces(r, a))
      if (p.dst == dst) {
        mine.push_back(p);
        n += p.count;
      }
    // Chunk j covers [begin, end) of the pair's entries; intersect with the pieces.
    std::uint32_t begin = 0;
    for (int j = 0; j < chunks; ++j) {
      const std::uint32_t end = begin + chunk_share(n, chunks, j);
      std::uint32_t at = 0;
      for (const RoutedPiece& p : mine) {
        const std::uint32_t lo = std::max(begin, at), hi = std::min(end, at + p.count);
        if (lo < hi) out[j].push_back({a, p.expert, static_cast<int>(hi - lo)});
        at += p.count;
      }
      begin = end;
    }
  }
  return out;
}

std::vector<float> reference_layer_routed(const MoeShape& s, const std::vector<float>& tokens,
                                          std::uint64_t seed, int layer, const ExpertRouting& r,
                                          int src, long long* dropped) {
  const RoutedAssignment a = assign_routed(r, src, s.tokens, s.top_k, 1);
  if (dropped) *dropped = a.dropped;
  return reference_layer_seeded_routed(s, tokens, seed, layer, a.expert);
}

namespace {

// Dispatch ops of `block`, by chunk.
std::vector<const Op*> dispatch_ops(const Plan& plan, int block) {
  std::vector<const Op*> ops;
  for (const Op& op : plan.ops()) {
    const MoeOpRef ref = moe_op_ref(op);
    if (ref.block != block || ref.kind != OpRoleKind::kDispatch) continue;
    if (static_cast<int>(ops.size()) <= ref.chunk)
      ops.resize(static_cast<std::size_t>(ref.chunk) + 1);
    ops[static_cast<std::size_t>(ref.chunk)] = &op;
  }
  return ops;
}

}  // namespace

bool is_routed_layer(const Plan& plan, int block) {
  for (const Op* op : dispatch_ops(plan, block))
    if (op && op->collective().type == CollectiveType::kAllToAllv) return true;
  return false;
}

std::unique_ptr<RoutedLayer> prepare_routed_layer(const Plan& plan, int block, int moe, int rank,
                                                  const MoeShape& s) {
  auto L = std::make_unique<RoutedLayer>();
  L->block = block;
  L->moe = moe;
  const std::vector<const Op*> ops = dispatch_ops(plan, block);
  MOESIM_ASSERT(!ops.empty() && std::all_of(ops.begin(), ops.end(), [](const Op* o) { return o; }),
                "routed layer: dispatch chunks missing");
  L->chunks = static_cast<int>(ops.size());
  const CollectiveSpec& spec0 = ops[0]->collective();
  const Grouping& g = plan.grouping(spec0.grouping);
  const auto [gi, pos] = find_rank(g, rank);
  MOESIM_ASSERT(gi >= 0, "routed layer: rank outside the EP groups");
  L->pos = pos;
  L->group_size = static_cast<int>(g.groups[gi].size());
  const auto& er = spec0.expert_routing;
  if (er.size() == 1)
    L->routing = er[0];
  else if (er.size() == g.groups.size())
    L->routing = er[static_cast<std::size_t>(gi)];
  if (!L->routing)
    throw InputError(fmt::format(
        "--check: MoE layer {}'s routed dispatch carries no expert routing (sharded experts with "
        "variable dispatch are not supported by the host data path)",
        moe));
  const ExpertRouting& r = *L->routing;
  MOESIM_ASSERT(r.size == L->group_size && r.experts == s.experts, "routed layer: routing shape");
  L->sent = assign_routed(r, pos, s.tokens, s.top_k, L->chunks);
  L->received = routed_receives(r, pos, L->chunks);
  // The rule must reproduce every chunk's matrix (this rank's row and column): otherwise the
  // executor would move other bytes than the plan says.
  for (int j = 0; j < L->chunks; ++j) {
    collectives::CollectiveCall call{&ops[j]->collective(), &g.groups[gi], gi, true};
    const ByteMatrix* m = call.matrix();
    MOESIM_ASSERT(m != nullptr, "routed layer: dispatch without a matrix");
    for (int b = 0; b < L->group_size; ++b) {
      int from_b = 0;
      for (const auto& run : L->received[j])
        if (run.src == b) from_b += run.rows;
      if (pair_count(*m, pos, b) != L->sent.send[j][b].size() ||
          pair_count(*m, b, pos) != static_cast<std::uint32_t>(from_b))
        throw InternalError(fmt::format(
            "routed layer {} chunk {}: the plan's matrix ({} -> {}: {}, {} -> {}: {}) disagrees "
            "with its expert routing ({}, {})",
            moe, j + 1, pos, b, pair_count(*m, pos, b), b, pos, pair_count(*m, b, pos),
            L->sent.send[j][b].size(), from_b));
    }
  }
  for (const auto& runs : L->received)
    for (const auto& run : runs) L->experts.push_back(run.expert);
  std::sort(L->experts.begin(), L->experts.end());
  L->experts.erase(std::unique(L->experts.begin(), L->experts.end()), L->experts.end());
  return L;
}

LayerLayout routed_layout(const RoutedLayer& L, const MoeShape& s) {
  LayerLayout lay;
  lay.moe = L.moe;
  lay.block = L.block;
  lay.routing = LayerRouting::kPlan;
  lay.ep = L.group_size;
  lay.ep_pos = L.pos;
  lay.slices = static_cast<int>(L.experts.size());
  lay.hidden = s.hidden_dim;
  lay.has_a2a = true;
  int first = 0;
  for (int j = 0; j < L.chunks; ++j) {
    int rows = 0;
    for (const auto& entries : L.sent.send[static_cast<std::size_t>(j)])
      rows += static_cast<int>(entries.size());
    lay.send_first.push_back(first);
    lay.send_rows.push_back(rows);
    first += rows;
    auto& runs = lay.runs.emplace_back();
    for (const RoutedRun& run : L.received[static_cast<std::size_t>(j)]) {
      const auto it = std::lower_bound(L.experts.begin(), L.experts.end(), run.expert);
      MOESIM_ASSERT(it != L.experts.end() && *it == run.expert, "routed layer: expert missing");
      runs.emplace_back(run.rows, static_cast<int>(it - L.experts.begin()));
    }
  }
  return lay;
}

void fill_routed_layer(const RoutedLayer& L, const MoeShape& s, std::uint64_t seed,
                       HostLayerBuffers& buffers) {
  auto& expert = buffers.i({LayerBuf::kExpert});
  auto& slot = buffers.i({LayerBuf::kSlot});
  auto& real = buffers.i({LayerBuf::kRoutedExpert});
  auto& slot_entry = buffers.i({LayerBuf::kSlotEntry});
  std::fill(expert.begin(), expert.end(), 0);
  std::fill(slot.begin(), slot.end(), -1);
  std::copy(L.sent.expert.begin(), L.sent.expert.end(), real.begin());
  std::int32_t row = 0;
  for (const auto& chunk : L.sent.send)
    for (const auto& entries : chunk)
      for (int entry : entries) {
        slot[static_cast<std::size_t>(entry)] = row;
        slot_entry[static_cast<std::size_t>(row)] = entry;
        ++row;
      }
  MOESIM_ASSERT(static_cast<std::size_t>(row) == slot_entry.size(),
                "routed layer: send rows disagree with the layout");
  for (std::size_t i = 0; i < L.experts.size(); ++i) {
    buffers.f({LayerBuf::kW1, static_cast<int>(i)}) = make_w1(s, seed, L.moe, L.experts[i]);
    buffers.f({LayerBuf::kW2, static_cast<int>(i)}) = make_w2(s, seed, L.moe, L.experts[i]);
  }
}

}  // namespace moesim::exec
