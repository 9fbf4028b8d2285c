#include "exec/routed_path.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "exec/executor.hpp"
#include "exec/host_layer.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

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
  L->dispatch = &spec0;
  L->group_index = gi;
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
  if (r.replicas.empty() && !r.spread) {
    // One GPU per expert (training): the position's own experts, whether or not a token came, so
    // that every DP replica of the position holds the same ones (their gradients are summed).
    const int dE = std::max(1, r.experts_per_gpu);
    for (int e : L->experts)
      MOESIM_ASSERT(e / dE == pos, "routed layer: rows for another position's expert");
    L->experts.clear();
    for (int e = pos * dE; e < std::min(r.experts, (pos + 1) * dE); ++e) L->experts.push_back(e);
  }
  return L;
}

LayerLayout routed_layout_base(const RoutedLayer& L, LayerRouting routing, int slices,
                               const MoeShape& s) {
  LayerLayout lay;
  lay.moe = L.moe;
  lay.block = L.block;
  lay.routing = routing;
  lay.ep = L.group_size;
  lay.ep_pos = L.pos;
  lay.slices = slices;
  lay.hidden = s.hidden_dim;
  lay.has_a2a = true;
  return lay;
}

LayerLayout routed_layout(const RoutedLayer& L, const MoeShape& s) {
  LayerLayout lay =
      routed_layout_base(L, LayerRouting::kPlan, static_cast<int>(L.experts.size()), s);
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
