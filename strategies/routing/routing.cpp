#include "strategies/routing/routing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.hpp"
#include "strategies/plan_builder.hpp"
#include "topology/topology.hpp"

namespace moesim::routing {

namespace {

// Rounds non-negative `want` to integers summing to `total` (largest remainder; ties to the lower
// index, so the result is deterministic).
void round_to_total(const std::vector<double>& want, std::int64_t total,
                    std::vector<std::int64_t>& out) {
  const std::size_t n = want.size();
  out.assign(n, 0);
  if (n == 0) return;
  double sum = 0;
  for (double w : want) sum += std::max(0.0, w);
  if (sum <= 0) {  // nothing to follow: spread evenly
    for (std::size_t i = 0; i < n; ++i)
      out[i] = total / static_cast<std::int64_t>(n) +
               (static_cast<std::int64_t>(i) < total % static_cast<std::int64_t>(n) ? 1 : 0);
    return;
  }
  std::vector<std::pair<double, std::size_t>> rem(n);
  std::int64_t assigned = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double exact = std::max(0.0, want[i]) * static_cast<double>(total) / sum;
    out[i] = static_cast<std::int64_t>(std::floor(exact));
    assigned += out[i];
    rem[i] = {exact - static_cast<double>(out[i]), i};
  }
  std::sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (std::size_t r = 0; assigned < total; r = (r + 1) % n, ++assigned) ++out[rem[r].second];
}

// Rewrites row `rank` of `layer` so that group position b receives volume[b] tokens, split over
// b's experts in proportion to the row's current counts.
void write_row(workload::LayerDispatch& layer, int rank, std::span<const int> group_ranks,
               const workload::ExpertPlacement& placement,
               const std::vector<std::int64_t>& volume) {
  const int E = layer.num_experts;
  const int W = static_cast<int>(group_ranks.size());
  const int dE = placement.experts_per_gpu;
  std::uint32_t* row = layer.kept.data() + static_cast<std::size_t>(rank) * E;
  std::vector<double> w(static_cast<std::size_t>(dE));
  std::vector<std::int64_t> split;
  for (int b = 0; b < W; ++b) {
    for (int x = 0; x < dE; ++x) w[x] = row[b * dE + x];
    round_to_total(w, volume[b], split);
    for (int x = 0; x < dE; ++x) row[b * dE + x] = static_cast<std::uint32_t>(split[x]);
  }
  if (!layer.demanded.empty())  // the runner's generator does not keep demanded
    std::copy(row, row + E, layer.demanded.begin() + static_cast<std::ptrdiff_t>(rank) * E);
}

void check_shape(const workload::LayerDispatch& layer, std::span<const int> group_ranks,
                 const workload::ExpertPlacement& placement) {
  MOESIM_ASSERT(placement.shards == 1, "routing strategies need unsharded experts");
  MOESIM_ASSERT(static_cast<std::int64_t>(group_ranks.size()) * placement.experts_per_gpu ==
                    layer.num_experts,
                "routing: EP group size x experts per GPU must equal the experts");
}

std::vector<double> row_volume(const workload::LayerDispatch& layer, int rank, int W, int dE) {
  std::vector<double> v(static_cast<std::size_t>(W), 0.0);
  for (int e = 0; e < layer.num_experts; ++e) v[e / dE] += layer.at(rank, e);
  return v;
}

class TaMoeStrategy final : public strategies::Strategy {
 public:
  explicit TaMoeStrategy(TaMoeParams p) : params_(p) {}
  std::string_view name() const override { return "ta_moe"; }

  void decide(const strategies::StrategyContext& ctx, strategies::Decision& d) override {
    if (!(params_.lambda >= 0 && params_.lambda <= 1))
      strategies::throw_role_error(ctx, "ta_moe.lambda",
                                   fmt::format("{} is outside [0, 1]", params_.lambda));
    if (!(params_.adherence >= 0 && params_.adherence <= 1))
      strategies::throw_role_error(ctx, "ta_moe.adherence",
                                   fmt::format("{} is outside [0, 1]", params_.adherence));
    check_supported(ctx, "routing");
    d.variable_dispatch = true;
  }

  void route(const strategies::StrategyContext& ctx, const strategies::Decision&,
             workload::IterationWorkload& work) override {
    const Scenario& sc = ctx.scenario;
    const auto groups = strategies::make_groups(sc).ep.groups;
    if (targets_.empty()) {
      // The topology and the model do not change between iterations: solve once per EP group.
      const std::int64_t supply = sc.model.tokens_per_gpu() * sc.model.top_k;
      const double b = static_cast<double>(sc.model.model_dim) * sc.bytes_per_element();
      for (const auto& g : groups)
        targets_.push_back(solve_target(pair_costs(ctx.topo, g), supply, b, params_.lambda));
    }
    const auto placement = workload::ExpertPlacement::of(sc.model);
    for (auto& layer : work.layers)
      for (std::size_t gi = 0; gi < groups.size(); ++gi)
        route_towards_target(layer, groups[gi], placement, targets_[gi], params_.adherence);
  }

  static void check_supported(const strategies::StrategyContext& ctx, std::string_view role) {
    if (ctx.scenario.model.expert_shards() > 1 || ctx.scenario.parallelism.esp > 1)
      strategies::throw_role_error(ctx, role,
                                   "topology-aware routing needs unsharded experts and esp = 1");
  }

 private:
  TaMoeParams params_;
  std::vector<TargetPattern> targets_;
};

class FasterMoeHirStrategy final : public strategies::Strategy {
 public:
  explicit FasterMoeHirStrategy(FasterMoeHirParams p) : params_(p) {}
  std::string_view name() const override { return "faster_moe_hir"; }

  void decide(const strategies::StrategyContext& ctx, strategies::Decision& d) override {
    if (!(params_.max_offnode_share >= 0 && params_.max_offnode_share <= 1))
      strategies::throw_role_error(ctx, "faster_moe_hir.max_offnode_share",
                                   fmt::format("{} is outside [0, 1]", params_.max_offnode_share));
    TaMoeStrategy::check_supported(ctx, "routing");
    d.variable_dispatch = true;
  }

  void route(const strategies::StrategyContext& ctx, const strategies::Decision&,
             workload::IterationWorkload& work) override {
    const auto groups = strategies::make_groups(ctx.scenario).ep.groups;
    const auto placement = workload::ExpertPlacement::of(ctx.scenario.model);
    for (auto& layer : work.layers)
      for (const auto& g : groups)
        cap_offnode_share(layer, g, placement, ctx.topo, params_.max_offnode_share);
  }

 private:
  FasterMoeHirParams params_;
};

}  // namespace

void route_towards_target(workload::LayerDispatch& layer, std::span<const int> group_ranks,
                          const workload::ExpertPlacement& placement, const TargetPattern& target,
                          double adherence) {
  check_shape(layer, group_ranks, placement);
  const int W = static_cast<int>(group_ranks.size());
  MOESIM_ASSERT(target.size == W, "routing: target size differs from the EP group");
  const double a = std::clamp(adherence, 0.0, 1.0);
  std::vector<std::int64_t> volume;
  for (int pos = 0; pos < W; ++pos) {
    const int rank = group_ranks[pos];
    std::vector<double> v = row_volume(layer, rank, W, placement.experts_per_gpu);
    const double sent = std::accumulate(v.begin(), v.end(), 0.0);
    for (int b = 0; b < W; ++b) v[b] = (1.0 - a) * v[b] + a * target.share_at(pos, b) * sent;
    round_to_total(v, static_cast<std::int64_t>(std::llround(sent)), volume);
    write_row(layer, rank, group_ranks, placement, volume);
  }
}

void cap_offnode_share(workload::LayerDispatch& layer, std::span<const int> group_ranks,
                       const workload::ExpertPlacement& placement, const topology::Topology& topo,
                       double max_offnode_share) {
  check_shape(layer, group_ranks, placement);
  const int W = static_cast<int>(group_ranks.size());
  const double k = std::max(1, layer.top_k);
  std::vector<std::int64_t> volume;
  for (int pos = 0; pos < W; ++pos) {
    const int rank = group_ranks[pos];
    const int node = topo.node_of(rank);
    std::vector<double> v = row_volume(layer, rank, W, placement.experts_per_gpu);
    double sent = 0, off = 0, on = 0;
    for (int b = 0; b < W; ++b) {
      sent += v[b];
      (topo.node_of(group_ranks[b]) == node ? on : off) += v[b];
    }
    // First choices are 1/k of the counts; only they are capped (FasterMoE's hir gate).
    const double excess = std::max(0.0, (off - max_offnode_share * sent) / k);
    if (excess <= 0 || off <= 0) continue;
    int on_peers = 0;
    for (int b = 0; b < W; ++b) on_peers += topo.node_of(group_ranks[b]) == node;
    for (int b = 0; b < W; ++b) {
      if (topo.node_of(group_ranks[b]) == node)
        v[b] += on > 0 ? excess * v[b] / on : excess / on_peers;
      else
        v[b] -= excess * v[b] / off;
    }
    round_to_total(v, static_cast<std::int64_t>(std::llround(sent)), volume);
    write_row(layer, rank, group_ranks, placement, volume);
  }
}

double offnode_share(const workload::LayerDispatch& layer,
                     const workload::ExpertPlacement& placement, std::span<const int> group_ranks,
                     const topology::Topology& topo) {
  double off = 0, all = 0;
  for (int rank : group_ranks)
    for (int e = 0; e < layer.num_experts; ++e) {
      const double c = layer.at(rank, e);
      all += c;
      if (topo.node_of(group_ranks[placement.owner(e)]) != topo.node_of(rank)) off += c;
    }
  return all > 0 ? off / all : 0;
}

std::unique_ptr<strategies::Strategy> make_routing_strategy(const StrategySpec& spec) {
  switch (spec.routing) {
    case RoutingRole::kTaMoe:
      return std::make_unique<TaMoeStrategy>(spec.ta_moe);
    case RoutingRole::kFasterMoeHir:
      return std::make_unique<FasterMoeHirStrategy>(spec.faster_moe_hir);
    case RoutingRole::kEven:
      break;
  }
  MOESIM_ASSERT(false, "make_routing_strategy: routing even has no module");
  return nullptr;
}

}  // namespace moesim::routing
