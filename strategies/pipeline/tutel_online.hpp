// Tutel's online search of the pipeline degree and all-to-all algorithm (docs/strategy-specs.md §3;
// Hwang et al., "Tutel: Adaptive Mixture-of-Experts at Scale", MLSys 2023, §3.3-3.4).
//
// Strategy space: r in {1, 2, 4, 8} x algo in {linear, 2dh} (2dh only where it can run). Per
// capacity factor f the search keeps the measured time of each strategy it ran at f. Known f
// values are grouped into buckets of width `bucket_width` (sorted, greedy: a bucket starts at the
// lowest f not yet placed and takes every f < start + width). For a new iteration at f:
//   1. f itself has tried every strategy -> its best;
//   2. else f's bucket has tried every strategy -> the bucket's best;
//   3. else the first strategy (in space order) the bucket has not tried.
// A bucket's time for a strategy is the mean over its members f that ran it of t * f_low / f
// (normalised to the bucket's lowest f, as if the work scaled with f). Measured times come from
// the backend, simulated or real: the same code adapts in both.
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "core/plan.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies {

struct TutelChoice {
  int degree = 1;
  CollectiveAlgo algo = CollectiveAlgo::kLinear;
  bool operator==(const TutelChoice&) const = default;
};

/// The search itself, independent of any backend (tests drive it with tables of times).
class TutelOnlineSearch {
 public:
  /// `space` non-empty, `bucket_width` > 0.
  TutelOnlineSearch(std::vector<TutelChoice> space, double bucket_width);

  /// Tutel's space {1,2,4,8} x {linear, 2dh}; without 2dh when `with_2dh` is false.
  static std::vector<TutelChoice> default_space(bool with_2dh);

  /// The strategy to run at capacity factor f (f becomes a known factor).
  TutelChoice choose(double f);
  /// The backend's measured time of `choice` at f.
  void record(double f, const TutelChoice& choice, double time_s);

  /// The buckets of the known factors, each sorted ascending.
  std::vector<std::vector<double>> buckets() const;
  /// Strategies tried at exactly f.
  int tried_at(double f) const;
  const std::vector<TutelChoice>& space() const { return space_; }

 private:
  int index_of(const TutelChoice& c) const;
  struct Times {
    double sum = 0;
    int count = 0;
  };
  std::vector<TutelChoice> space_;
  double width_;
  std::map<double, std::map<int, Times>> per_f_;  // f -> strategy index -> measured times
};

/// pipeline: tutel_online. Decides the pipeline degree and the all-to-all algorithm; learns from
/// the MoE layer time of each IterationRecord (the step time when the plan has no MoE layer).
class TutelOnlineStrategy final : public Strategy {
 public:
  explicit TutelOnlineStrategy(double bucket_width) : width_(bucket_width) {}
  std::string_view name() const override { return "tutel_online"; }
  void decide(const StrategyContext& ctx, Decision& decision) override;
  void observe(const StrategyContext& ctx, const IterationRecord& record) override;
  const TutelOnlineSearch* search() const { return search_ ? &*search_ : nullptr; }

  /// The factor the search keys on: f when f > 0, else the effective factor of the capacity
  /// (dropless runs: dC * E / (k * S)).
  static double search_factor(const StrategyContext& ctx);

 private:
  double width_;
  std::optional<TutelOnlineSearch> search_;
  TutelChoice last_;
  double last_f_ = 0;
};

}  // namespace moesim::strategies
