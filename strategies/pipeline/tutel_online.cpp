#include "strategies/pipeline/tutel_online.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/error.hpp"

namespace moesim::strategies {

TutelOnlineSearch::TutelOnlineSearch(std::vector<TutelChoice> space, double bucket_width)
    : space_(std::move(space)), width_(bucket_width) {
  MOESIM_ASSERT(!space_.empty(), "tutel_online needs a non-empty strategy space");
  if (!(bucket_width > 0))
    throw InputError(fmt::format("tutel_online.bucket_width {}, expected > 0", bucket_width));
}

std::vector<TutelChoice> TutelOnlineSearch::default_space(bool with_2dh) {
  std::vector<TutelChoice> s;
  for (int r : {1, 2, 4, 8}) {
    s.push_back({r, CollectiveAlgo::kLinear});
    if (with_2dh) s.push_back({r, CollectiveAlgo::k2dh});
  }
  return s;
}

int TutelOnlineSearch::index_of(const TutelChoice& c) const {
  for (size_t i = 0; i < space_.size(); ++i)
    if (space_[i] == c) return static_cast<int>(i);
  return -1;
}

std::vector<std::vector<double>> TutelOnlineSearch::buckets() const {
  std::vector<std::vector<double>> out;
  double start = 0;
  for (const auto& [f, _] : per_f_) {  // std::map: ascending f
    if (out.empty() || f - start >= width_) {
      out.emplace_back();
      start = f;
    }
    out.back().push_back(f);
  }
  return out;
}

int TutelOnlineSearch::tried_at(double f) const {
  auto it = per_f_.find(f);
  return it == per_f_.end() ? 0 : static_cast<int>(it->second.size());
}

TutelChoice TutelOnlineSearch::choose(double f) {
  const int n = static_cast<int>(space_.size());
  const auto& own = per_f_[f];
  auto best_of = [&](const std::vector<double>& t) {
    int best = 0;
    for (int i = 1; i < n; ++i)
      if (t[i] < t[best]) best = i;  // first in space order on ties
    return space_[best];
  };
  if (static_cast<int>(own.size()) == n) {
    std::vector<double> t(n);
    for (const auto& [i, times] : own) t[i] = times.sum / times.count;
    return best_of(t);
  }
  std::vector<double> bucket;
  for (auto& b : buckets())
    if (std::find(b.begin(), b.end(), f) != b.end()) bucket = std::move(b);
  MOESIM_ASSERT(!bucket.empty(), "a known factor has a bucket");
  const double f_low = bucket.front();
  std::vector<double> sum(n, 0.0);
  std::vector<int> count(n, 0);
  for (double g : bucket)
    for (const auto& [i, times] : per_f_.at(g)) {
      sum[i] += times.sum / times.count * (f_low / g);
      ++count[i];
    }
  for (int i = 0; i < n; ++i)
    if (count[i] == 0) return space_[i];  // untried in the bucket: try it
  for (int i = 0; i < n; ++i) sum[i] /= count[i];
  return best_of(sum);
}

void TutelOnlineSearch::record(double f, const TutelChoice& choice, double time_s) {
  const int i = index_of(choice);
  MOESIM_ASSERT(i >= 0, "recorded strategy is not in the search space");
  Times& t = per_f_[f][i];
  t.sum += time_s;
  ++t.count;
}

double TutelOnlineStrategy::search_factor(const StrategyContext& ctx) {
  if (ctx.capacity_factor > 0) return ctx.capacity_factor;
  const auto& md = ctx.scenario.model;
  const double per_factor = md.top_k * static_cast<double>(md.tokens_per_gpu()) / md.experts;
  return per_factor > 0 ? static_cast<double>(ctx.capacity) / per_factor : 0.0;
}

void TutelOnlineStrategy::decide(const StrategyContext& ctx, Decision& decision) {
  if (!search_) {
    const bool with_2dh =
        ctx.scenario.parallelism.ep > 1 && ctx.cost.a2a_applicable(CollectiveAlgo::k2dh);
    search_.emplace(TutelOnlineSearch::default_space(with_2dh), width_);
  }
  last_f_ = search_factor(ctx);
  last_ = search_->choose(last_f_);
  decision.pipeline_degree = last_.degree;
  decision.a2a = last_.algo;
}

void TutelOnlineStrategy::observe(const StrategyContext& ctx, const IterationRecord& record) {
  (void)ctx;
  if (!search_) return;
  const double t = record.moe_layer_time_s > 0 ? record.moe_layer_time_s : record.step_time_s;
  search_->record(last_f_, last_, t);
}

}  // namespace moesim::strategies
