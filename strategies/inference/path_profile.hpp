// Lina's path profile (docs/strategy-specs.md §7; Lina §5.2): from a profiling trace, for every
// path of the last `path_length` experts a token visited, the distribution of its experts at the
// next MoE layer; and the popularity estimate of a batch built from its tokens' paths.
//
// A token's path at MoE layer l is its first choices at layers max(0, l - path_length) .. l - 1
// (oldest first). The profile counts, for every suffix of that path (lengths 0 .. its length;
// length 0 is the layer's marginal), the token's k choices at layer l. Estimating, a token whose
// full path was never profiled falls back to the longest suffix that was, then to the marginal,
// then (a layer never profiled) to uniform. A path seen fewer than `min_count` times counts as
// unseen (Katz-style back-off), so longer paths do not trade the shorter ones' statistics for
// noise.
//
// Storage is sparse: (layer, path) keys are 64-bit hashes (a collision, probability ~2^-64 per
// pair, would merge two paths' counts), each with the next experts seen after it and their
// counts, so memory grows with the distinct (path, next) pairs seen, not with E^path_length.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "strategies/inference/correlated_routing.hpp"

namespace moesim::inference {

class PathProfile {
 public:
  /// path_length >= 1, num_experts >= 1, num_layers >= 0. Estimating, a path counts as seen
  /// only with at least `min_count` profiled choices under it (fewer: back off to its suffix;
  /// a rare long path's distribution is mostly noise).
  PathProfile(int num_experts, int num_layers, int path_length, std::uint64_t min_count = 1);

  int path_length() const { return path_length_; }

  /// Counts one token at `layer`: `path` = its first choices at the previous layers, oldest first
  /// (only the last path_length are used); `next` = its choices at `layer`.
  void add(int layer, std::span<const std::uint16_t> path, std::span<const std::uint16_t> next);
  /// Counts every token of every layer of `b`.
  void add_batch(const RoutingBatch& b);

  /// P(choice = e | the path is exactly `path`) at `layer` (sums to 1 over e); empty when the path
  /// was never seen. An empty path gives the layer's marginal.
  std::vector<double> conditional(int layer, std::span<const std::uint16_t> path) const;

  /// Estimated popularity at `layer` (sums to 1) of the tokens of GPUs `gpus` of batch `b`
  /// (S = tokens per GPU): the mean over the tokens of their path's conditional distribution.
  std::vector<double> estimate(const RoutingBatch& b, int layer, std::span<const int> gpus,
                               std::int64_t tokens_per_gpu) const;

 private:
  struct PathEntry {
    std::uint64_t total = 0;             // choices counted under this path
    std::vector<std::uint16_t> experts;  // distinct next experts seen, in order of first sight
    std::vector<std::uint64_t> counts;   // counts[i]: choices of experts[i]
  };
  static std::uint64_t path_key(int layer, std::span<const std::uint16_t> path);
  // Adds count * P(. | path) into `out`; false when the path is unknown.
  bool accumulate(std::uint64_t key, double count, std::vector<double>& out) const;

  int num_experts_;
  int num_layers_;
  int path_length_;
  std::uint64_t min_count_;
  std::unordered_map<std::uint64_t, PathEntry> paths_;
};

}  // namespace moesim::inference
