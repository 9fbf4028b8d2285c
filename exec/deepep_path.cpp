#include "exec/deepep_path.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/routed_assignment.hpp"
#include "exec/host_layer.hpp"

namespace moesim::exec {

namespace {

// The CSR table summing every source row j with target[j] = d >= 0 into row d < rows:
// begin (rows + 1), the source rows by d then ascending j, and with `weight`, their weight[j].
std::vector<int> sum_table(const std::vector<int>& target, int rows,
                           const std::vector<int>* weight) {
  std::vector<int> begin(static_cast<std::size_t>(rows) + 1, 0);
  for (int d : target)
    if (d >= 0) ++begin[static_cast<std::size_t>(d) + 1];
  for (std::size_t d = 0; d < static_cast<std::size_t>(rows); ++d) begin[d + 1] += begin[d];
  const auto n = static_cast<std::size_t>(begin.back());
  std::vector<int> out(begin.size() + n * (weight ? 2 : 1));
  std::copy(begin.begin(), begin.end(), out.begin());
  std::vector<int> fill(begin.begin(), begin.end() - 1);
  for (std::size_t j = 0; j < target.size(); ++j) {
    const int d = target[j];
    if (d < 0) continue;
    const auto at = static_cast<std::size_t>(fill[static_cast<std::size_t>(d)]++);
    out[begin.size() + at] = static_cast<int>(j);
    if (weight) out[begin.size() + n + at] = (*weight)[j];
  }
  return out;
}

std::size_t at(int a, int b, int n) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(n) + static_cast<std::size_t>(b);
}

}  // namespace

bool is_deepep_layer(const RoutedLayer& R) {
  return R.dispatch && R.dispatch->algo == CollectiveAlgo::kDeepep;
}

std::unique_ptr<DeepepLayer> prepare_deepep_layer(const RoutedLayer& R, const MoeShape& s) {
  if (R.chunks != 1)
    throw InputError(fmt::format(
        "MoE layer {}: a2a deepep runs on the real backend with one pipeline chunk, the plan has "
        "{}: set the strategy's pipeline: 1",
        R.moe, R.chunks));
  MOESIM_ASSERT(is_deepep_layer(R), "deepep layer without a deepep dispatch");
  const auto gi = static_cast<std::size_t>(R.group_index);
  const auto& all = R.dispatch->node_dedup;
  if (all.empty() || (all.size() > 1 && gi >= all.size()) || !all[all.size() == 1 ? 0 : gi])
    throw InputError(
        fmt::format("MoE layer {}: the deepep dispatch carries no per-node token counts", R.moe));
  const NodeDedup& nd = *all[all.size() == 1 ? 0 : gi];
  const ExpertRouting& r = *R.routing;
  const int W = R.group_size, S = s.tokens, k = s.top_k;
  MOESIM_ASSERT(nd.size == W && nd.nodes >= 1 && W % nd.nodes == 0,
                "deepep layer: token counts of another group shape");
  auto D = std::make_unique<DeepepLayer>();
  const int n = nd.nodes, m = W / n;
  // Every source's assignment: a forwarder and a target need the other ranks' tokens.
  std::vector<RoutedAssignment> assign;
  std::vector<std::vector<std::vector<int>>> pos_of;  // [source][token]: positions, ascending
  for (int src = 0; src < W; ++src) {
    assign.push_back(assign_routed(r, src, S, k, 1));
    pos_of.push_back(token_positions(r, assign.back(), S, k));
  }
  const auto has_node = [&](int src, int t, int node) {
    for (int q : pos_of[static_cast<std::size_t>(src)][static_cast<std::size_t>(t)])
      if (q / m == node) return true;
    return false;
  };
  const auto has_pos = [&](int src, int t, int q) {
    const auto& v = pos_of[static_cast<std::size_t>(src)][static_cast<std::size_t>(t)];
    return std::binary_search(v.begin(), v.end(), q);
  };
  const auto expect = [&](const char* what, int from, int to, std::size_t rows,
                          std::uint32_t plan_rows) {
    if (rows != plan_rows)
      throw InternalError(fmt::format(
          "deepep layer {}: {} {} -> {}: the assignment gives {} rows, the plan's token counts {}",
          R.moe, what, from, to, rows, plan_rows));
  };
  const int p = R.pos, b = p / m, j = p % m;
  // Source: one row per (token, other node).
  for (int node = 0; node < n; ++node) {
    if (node == b) continue;
    const std::size_t before = D->send_idx.size();
    for (int t = 0; t < S; ++t)
      if (has_node(p, t, node)) D->send_idx.push_back(t);
    expect("node rows", p, node, D->send_idx.size() - before, nd.node_tokens[at(p, node, n)]);
  }
  // Forwarder: what arrives from rail j of the other nodes, then one row per (token, GPU here).
  std::vector<std::vector<int>> in_row(static_cast<std::size_t>(n), std::vector<int>(S, -1));
  int fwd_in = 0;
  for (int a = 0; a < n; ++a) {
    if (a == b) continue;
    const int src = a * m + j;
    const int before = fwd_in;
    for (int t = 0; t < S; ++t)
      if (has_node(src, t, b))
        in_row[static_cast<std::size_t>(a)][static_cast<std::size_t>(t)] = fwd_in++;
    expect("node rows", src, b, static_cast<std::size_t>(fwd_in - before),
           nd.node_tokens[at(src, b, n)]);
  }
  for (int kk = 0; kk < m; ++kk) {
    const int target = b * m + kk;
    for (int a = 0; a < n; ++a) {
      const int src = a * m + j;
      const std::size_t before = D->fwd_own_idx.size();
      for (int t = 0; t < S; ++t) {
        if (!has_pos(src, t, target)) continue;
        D->fwd_own_idx.push_back(a == b ? t : -1);
        D->fwd_in_idx.push_back(
            a == b ? -1 : in_row[static_cast<std::size_t>(a)][static_cast<std::size_t>(t)]);
      }
      expect("GPU rows", src, target, D->fwd_own_idx.size() - before,
             nd.gpu_tokens[at(src, target, W)]);
    }
  }
  // Target: the distinct token rows from every forwarder of its node, and their entries here.
  struct Entry {
    int expert, row, slot;
  };
  std::vector<Entry> entries;
  int tok = 0;
  const int per_gpu = std::max(1, r.experts_per_gpu);
  for (int jj = 0; jj < m; ++jj)
    for (int a = 0; a < n; ++a) {
      const int src = a * m + jj;
      const RoutedAssignment& as = assign[static_cast<std::size_t>(src)];
      for (int t = 0; t < S; ++t) {
        if (!has_pos(src, t, p)) continue;
        const int row = tok++;
        D->tok_expert.resize(static_cast<std::size_t>(tok) * k, -1);
        int slot = 0;
        for (int c = 0; c < k; ++c) {
          const int e = as.expert[static_cast<std::size_t>(t) * k + c];
          if (e < 0 || e / per_gpu != p) continue;
          D->tok_expert[static_cast<std::size_t>(row) * k + slot] = e;
          entries.push_back({e, row, slot++});
        }
      }
    }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& x, const Entry& y) { return x.expert < y.expert; });
  // Its slices are the experts it owns, whether or not a row came (every DP replica of the
  // position holds the same ones; their gradients are summed); a run per expert with entries.
  for (int e = p * per_gpu; e < std::min(r.experts, (p + 1) * per_gpu); ++e)
    D->experts.push_back(e);
  int last = -1;
  for (const Entry& e : entries) {
    if (e.expert != last) {
      D->runs.emplace_back(0, e.expert - p * per_gpu);
      last = e.expert;
    }
    ++D->runs.back().first;
    D->entry_row.push_back(e.row);
    D->entry_weight.push_back(e.row * k + e.slot);
  }
  // The row sums as CSR tables (LayerOps::sum_rows): a token row's entries, a token's or a node
  // row's forwarded outputs, a token's node rows, each in ascending source row.
  D->tok_sum = sum_table(D->entry_row, tok, &D->entry_weight);
  D->own_sum = sum_table(D->fwd_own_idx, S, nullptr);
  D->node_sum = sum_table(D->fwd_in_idx, fwd_in, nullptr);
  D->back_sum = sum_table(D->send_idx, S, nullptr);
  D->rows.send = static_cast<int>(D->send_idx.size());
  D->rows.fwd_in = fwd_in;
  D->rows.fwd_out = static_cast<int>(D->fwd_own_idx.size());
  D->rows.tok = tok;
  D->rows.entries = static_cast<int>(entries.size());
  D->rows.own_terms = D->own_sum[static_cast<std::size_t>(S)];
  D->rows.node_terms = D->node_sum[static_cast<std::size_t>(fwd_in)];
  return D;
}

LayerLayout deepep_layout(const RoutedLayer& R, const DeepepLayer& D, const MoeShape& s) {
  LayerLayout lay =
      routed_layout_base(R, LayerRouting::kDeepep, static_cast<int>(D.experts.size()), s);
  lay.deepep = D.rows;
  lay.runs.push_back(D.runs);
  return lay;
}

void fill_deepep_layer(const RoutedLayer& R, const DeepepLayer& D, const MoeShape& s,
                       std::uint64_t seed, HostLayerBuffers& buffers, bool backward) {
  const auto put = [&](LayerBuf b, const std::vector<int>& v) {
    auto& dst = buffers.i({b});
    MOESIM_ASSERT(dst.size() == v.size(), fmt::format("deepep table {} size", layer_buf_name(b)));
    std::copy(v.begin(), v.end(), dst.begin());
  };
  put(LayerBuf::kRoutedExpert, R.sent.expert);
  put(LayerBuf::kSendIdx, D.send_idx);
  put(LayerBuf::kFwdOwnIdx, D.fwd_own_idx);
  put(LayerBuf::kFwdInIdx, D.fwd_in_idx);
  put(LayerBuf::kTokExpert, D.tok_expert);
  put(LayerBuf::kEntryRow, D.entry_row);
  put(LayerBuf::kTokSum, D.tok_sum);
  put(LayerBuf::kOwnSum, D.own_sum);
  put(LayerBuf::kNodeSum, D.node_sum);
  put(LayerBuf::kBackSum, D.back_sum);
  if (backward) {
    // The backward's tables (allocated when the program runs the layer's backward): each entry's
    // weight element, and the one-term row sum that scatters a token row's gradient to its
    // entries with their weights.
    const std::size_t n = D.entry_row.size();
    std::vector<int> entry_sum(3 * n + 1);
    for (std::size_t e = 0; e <= n; ++e) entry_sum[e] = static_cast<int>(e);
    std::copy(D.entry_row.begin(), D.entry_row.end(),
              entry_sum.begin() + static_cast<std::ptrdiff_t>(n + 1));
    std::copy(D.entry_weight.begin(), D.entry_weight.end(),
              entry_sum.begin() + static_cast<std::ptrdiff_t>(2 * n + 1));
    put(LayerBuf::kEntryWeight, D.entry_weight);
    put(LayerBuf::kEntrySum, entry_sum);
  }
  for (std::size_t i = 0; i < D.experts.size(); ++i) {
    buffers.f({LayerBuf::kW1, static_cast<int>(i)}) = make_w1(s, seed, R.moe, D.experts[i]);
    buffers.f({LayerBuf::kW2, static_cast<int>(i)}) = make_w2(s, seed, R.moe, D.experts[i]);
  }
}

}  // namespace moesim::exec
