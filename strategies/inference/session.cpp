#include "strategies/inference/session.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "strategies/plan_builder.hpp"

namespace moesim::inference {

namespace {

[[noreturn]] void fail_at(const Scenario& sc, const std::string& key, const std::string& what) {
  throw InputError(sc.location_of(key), key, what);
}

std::string inference_key(const Scenario& sc, const StrategySpec& spec) {
  for (std::size_t i = 0; i < sc.strategies.size(); ++i)
    if (sc.strategies[i].name == spec.name) return fmt::format("strategies[{}].inference", i);
  return "strategies";
}

// Popularity from counts (sum 1; uniform when nothing was routed).
std::vector<double> normalised(const std::vector<double>& x) {
  const double s = std::accumulate(x.begin(), x.end(), 0.0);
  std::vector<double> out(x.size(), x.empty() ? 0.0 : 1.0 / static_cast<double>(x.size()));
  if (s > 0)
    for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] / s;
  return out;
}

constexpr double kKeepTolerance = 0.05;

bool any_moved(const std::vector<std::shared_ptr<const ByteMatrix>>& ms) {
  for (const auto& m : ms)
    for (auto c : m->counts)
      if (c != 0) return true;
  return false;
}

}  // namespace

bool placement_active(const Scenario& sc) {
  if (sc.model.mode != Mode::kInference) return false;
  if (sc.workload.routing.distribution == RoutingDistribution::kCorrelated) return true;
  return std::any_of(sc.strategies.begin(), sc.strategies.end(),
                     [](const StrategySpec& s) { return s.inference != InferenceRole::kBaseline; });
}

int max_experts_per_gpu(const Scenario& sc) {
  return std::max(4, sc.num_experts() / std::max(1, sc.parallelism.ep));
}

InferenceSession::InferenceSession(const Scenario& sc, const StrategySpec& spec)
    : sc_(sc), role_(spec.inference), gen_(CorrelatedRoutingParams::of(sc)) {
  const std::string key = inference_key(sc, spec);
  if (sc.model.mode != Mode::kInference)
    fail_at(sc, key, "expert placement needs model.mode: inference");
  const auto dist = sc.workload.routing.distribution;
  if (dist == RoutingDistribution::kDirichlet || dist == RoutingDistribution::kTrace ||
      dist == RoutingDistribution::kBalanced)
    fail_at(sc, "workload.routing.distribution",
            fmt::format("found {} with inference placement (strategy '{}'), expected correlated, "
                        "zipf or uniform: placement needs the tokens' paths",
                        name_of(dist), spec.name));
  if (sc.parallelism.esp != 1 || sc.parallelism.mp != 1)
    fail_at(sc, "parallelism", "inference placement needs esp = 1 and mp = 1 (whole experts)");
  if (sc.model.experts_per_gpu < 1)
    fail_at(sc, "model.experts_per_gpu",
            "inference placement needs whole experts (experts_per_gpu >= 1), found sharded ones");
  groups_ = strategies::make_groups(sc).ep.groups;
  const int L = sc.model.num_moe_layers();
  const int W = sc.parallelism.ep;
  current_.assign(static_cast<std::size_t>(L),
                  std::vector<Placement>(groups_.size(), uniform_placement(W, sc.num_experts())));
  if (role_ == InferenceRole::kLina) {
    // The profiling trace: other batches of the same generator (its kProfile stream).
    // A path needs about E profiled choices before its distribution says more than its suffix's.
    profile_.emplace(sc.num_experts(), L, spec.lina_inference.path_length,
                     static_cast<std::uint64_t>(sc.num_experts()));
    for (int b = 0; b < spec.lina_inference.profile_batches; ++b)
      profile_->add_batch(
          gen_.batch(BatchStream::kProfile, b, sc.num_gpus(), sc.model.tokens_per_gpu()));
  }
}

void InferenceSession::generate(int iteration) {
  batch_ = gen_.batch(BatchStream::kServe, iteration, sc_.num_gpus(), sc_.model.tokens_per_gpu());
}

workload::IterationWorkload InferenceSession::workload(int iteration, double f,
                                                       int capacity_multiple) const {
  const int P = sc_.num_gpus();
  const int E = sc_.num_experts();
  const int k = sc_.model.top_k;
  const std::int64_t S = sc_.model.tokens_per_gpu();
  workload::IterationWorkload work;
  work.index = iteration;
  work.capacity_factor = f;
  std::vector<std::uint32_t> per_choice(static_cast<std::size_t>(P) * k * E);
  std::vector<std::uint32_t> by_choice(static_cast<std::size_t>(k)), kept(static_cast<size_t>(k));
  for (int l = 0; l < batch_.num_layers; ++l) {
    std::fill(per_choice.begin(), per_choice.end(), 0u);
    const auto& ch = batch_.choices[static_cast<std::size_t>(l)];
    for (std::int64_t t = 0; t < batch_.num_tokens; ++t) {
      const std::int64_t g = t / S;
      for (int j = 0; j < k; ++j)
        ++per_choice[static_cast<std::size_t>((g * k + j) * E +
                                              ch[static_cast<std::size_t>(t * k + j)])];
    }
    std::int64_t max_demanded = 0;
    for (int g = 0; g < P; ++g)
      for (int e = 0; e < E; ++e) {
        std::int64_t d = 0;
        for (int j = 0; j < k; ++j)
          d += per_choice[(static_cast<std::size_t>(g) * k + j) * E + static_cast<size_t>(e)];
        max_demanded = std::max(max_demanded, d);
      }
    workload::LayerDispatch d;
    d.num_gpus = P;
    d.num_experts = E;
    d.top_k = k;
    d.capacity_factor = f;
    d.capacity = workload::capacity_slots(f, k, S, E, max_demanded, capacity_multiple);
    d.kept.assign(static_cast<std::size_t>(P) * E, 0);
    d.demanded.assign(static_cast<std::size_t>(P) * E, 0);
    d.dropped_by_choice.assign(static_cast<std::size_t>(k), 0);
    for (int g = 0; g < P; ++g)
      for (int e = 0; e < E; ++e) {
        std::uint32_t demanded = 0;
        for (int j = 0; j < k; ++j) {
          by_choice[static_cast<std::size_t>(j)] =
              per_choice[(static_cast<std::size_t>(g) * k + j) * E + static_cast<size_t>(e)];
          demanded += by_choice[static_cast<std::size_t>(j)];
        }
        const std::int64_t total = workload::apply_capacity(by_choice, d.capacity, kept);
        const std::size_t at = static_cast<std::size_t>(g) * E + static_cast<std::size_t>(e);
        d.kept[at] = static_cast<std::uint32_t>(total);
        d.demanded[at] = demanded;
        for (int j = 0; j < k; ++j)
          d.dropped_by_choice[static_cast<std::size_t>(j)] +=
              by_choice[static_cast<std::size_t>(j)] - kept[static_cast<std::size_t>(j)];
        d.dropped += demanded - total;
      }
    work.layers.push_back(std::move(d));
  }
  return work;
}

std::shared_ptr<const strategies::InferencePlan> InferenceSession::place(
    const workload::IterationWorkload& work, strategies::InferenceRecord& rec) {
  const int E = sc_.num_experts();
  const int W = sc_.parallelism.ep;
  const int k = sc_.model.top_k;
  const int cap = max_experts_per_gpu(sc_);
  const std::int64_t S = sc_.model.tokens_per_gpu();
  const Bytes token_bytes(static_cast<double>(sc_.model.model_dim) * sc_.bytes_per_element());
  const Bytes expert_bytes(static_cast<double>(sc_.model.ffn_params(sc_.model.hidden_dim)) *
                           sc_.bytes_per_element());
  auto plan = std::make_shared<strategies::InferencePlan>();
  plan->layers.resize(work.layers.size());
  for (std::size_t l = 0; l < work.layers.size(); ++l) {
    const auto& layer = work.layers[l];
    auto& out = plan->layers[l];
    for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
      const auto& grp = groups_[gi];
      std::vector<std::uint32_t> counts(static_cast<std::size_t>(W) * E);
      std::vector<double> per_expert(static_cast<std::size_t>(E), 0.0);
      for (int a = 0; a < W; ++a)
        for (int e = 0; e < E; ++e) {
          const std::uint32_t c = layer.at(grp[static_cast<std::size_t>(a)], e);
          counts[static_cast<std::size_t>(a) * E + static_cast<std::size_t>(e)] = c;
          per_expert[static_cast<std::size_t>(e)] += c;
        }
      const std::vector<double> actual = normalised(per_expert);
      Placement& cur = current_[l][gi];
      ByteMatrix tokens;
      switch (role_) {
        case InferenceRole::kBaseline:
          tokens = token_matrix(cur, counts, token_bytes);
          break;
        case InferenceRole::kIdeal: {
          tokens.size = W;
          tokens.unit = token_bytes;
          tokens.counts.assign(static_cast<std::size_t>(W) * W, 0);
          for (int a = 0; a < W; ++a) {
            std::uint64_t row = 0;
            for (int e = 0; e < E; ++e) row += counts[static_cast<std::size_t>(a) * E + e];
            for (int y = 0; y < W; ++y)
              tokens.counts[static_cast<std::size_t>(a) * W + (a + y) % W] =
                  static_cast<std::uint32_t>(row / W + (static_cast<std::uint64_t>(y) < row % W));
          }
          break;
        }
        case InferenceRole::kLina: {
          const std::vector<double> est = profile_->estimate(
              batch_, static_cast<int>(l), std::span<const int>(grp.data(), grp.size()), S);
          // (ours) A placement stays unless the new one is predicted >= 5% less loaded: every
          // change moves expert weights.
          Placement phase1 =
              keep_unless_better(cur, popularity_placement(est, W, cap, &cur), est, kKeepTolerance);
          out.prefetch.push_back(
              std::make_shared<const ByteMatrix>(weight_moves(cur, phase1, expert_bytes)));
          ++rec.estimated;
          const bool fires = phase2_fires(est, actual, k);
          if (!fires) ++rec.topk_matches;
          double err = 0;
          for (int e = 0; e < E; ++e)
            err += std::abs(est[static_cast<std::size_t>(e)] - actual[static_cast<std::size_t>(e)]);
          rec.popularity_error += 0.5 * err;
          out.sync_counts = true;
          if (fires) {
            ++rec.phase2;
            Placement phase2 = keep_unless_better(
                phase1, popularity_placement(actual, W, cap, &phase1), actual, kKeepTolerance);
            out.replan.push_back(
                std::make_shared<const ByteMatrix>(weight_moves(phase1, phase2, expert_bytes)));
            cur = std::move(phase2);
          } else {
            out.replan.push_back(std::make_shared<const ByteMatrix>(
                weight_moves(phase1, phase1, expert_bytes)));  // nothing moves
            cur = std::move(phase1);
          }
          tokens = token_matrix(cur, counts, token_bytes);
          break;
        }
      }
      auto split = std::make_shared<ExpertRouting>();
      split->size = W;
      split->experts = E;
      split->spread = role_ == InferenceRole::kIdeal;
      if (!split->spread) split->replicas = cur.replicas;
      split->counts = std::move(counts);
      out.routing.push_back(std::move(split));
      const std::vector<double> recv = received_tokens(tokens);
      const double mean = std::accumulate(recv.begin(), recv.end(), 0.0) / W;
      rec.load_imbalance_sum += mean > 0 ? *std::max_element(recv.begin(), recv.end()) / mean : 1;
      ++rec.placements;
      out.tokens.push_back(std::make_shared<const ByteMatrix>(std::move(tokens)));
    }
    for (const auto* ms : {&out.prefetch, &out.replan})
      for (const auto& m : *ms) rec.moved_weight_bytes += m->total().value();
    if (!any_moved(out.prefetch)) out.prefetch.clear();
    if (!any_moved(out.replan)) out.replan.clear();
  }
  return plan;
}

}  // namespace moesim::inference
