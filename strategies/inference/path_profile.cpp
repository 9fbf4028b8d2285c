#include "strategies/inference/path_profile.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "strategies/workload/random.hpp"

namespace moesim::inference {

namespace wd = workload::detail;

PathProfile::PathProfile(int num_experts, int num_layers, int path_length, std::uint64_t min_count)
    : num_experts_(num_experts),
      num_layers_(num_layers),
      path_length_(path_length),
      min_count_(std::max<std::uint64_t>(min_count, 1)) {
  if (num_experts < 1 || num_layers < 0 || path_length < 1)
    throw InputError(fmt::format(
        "path profile: {} experts, {} layers, path length {}: expected >= 1, >= 0, >= 1",
        num_experts, num_layers, path_length));
}

std::uint64_t PathProfile::path_key(int layer, std::span<const std::uint16_t> path) {
  std::uint64_t h = wd::mix64(0x6c696e61ULL ^ static_cast<std::uint64_t>(layer));  // "lina"
  h = wd::mix64(h ^ (path.size() << 32));
  for (std::uint16_t e : path) h = wd::mix64(h ^ (static_cast<std::uint64_t>(e) + 1));
  return h;
}

std::uint64_t PathProfile::joint_key(std::uint64_t path, std::uint16_t expert) {
  return wd::mix64(path ^ (0x9e3779b97f4a7c15ULL * (static_cast<std::uint64_t>(expert) + 1)));
}

void PathProfile::add(int layer, std::span<const std::uint16_t> path,
                      std::span<const std::uint16_t> next) {
  MOESIM_ASSERT(layer >= 0 && layer < num_layers_, "path profile: layer out of range");
  if (path.size() > static_cast<std::size_t>(path_length_)) path = path.last(path_length_);
  // Every suffix, from the empty one (the marginal) to the full path.
  for (std::size_t q = 0; q <= path.size(); ++q) {
    const std::uint64_t key = path_key(layer, path.last(q));
    PathEntry& entry = paths_[key];
    for (std::uint16_t e : next) {
      ++entry.total;
      std::uint64_t& c = joint_[joint_key(key, e)];
      if (c++ == 0) entry.experts.push_back(e);
    }
  }
}

void PathProfile::add_batch(const RoutingBatch& b) {
  std::vector<std::uint16_t> path(static_cast<std::size_t>(path_length_));
  for (std::int64_t t = 0; t < b.num_tokens; ++t)
    for (int l = 0; l < b.num_layers; ++l) {
      const int len = std::min(l, path_length_);
      for (int q = 0; q < len; ++q) path[static_cast<std::size_t>(q)] = b.first(l - len + q, t);
      add(l, std::span<const std::uint16_t>(path.data(), static_cast<std::size_t>(len)),
          b.of(l, t));
    }
}

bool PathProfile::accumulate(std::uint64_t key, double count, std::vector<double>& out) const {
  const auto it = paths_.find(key);
  if (it == paths_.end() || it->second.total < min_count_) return false;
  const double scale = count / static_cast<double>(it->second.total);
  for (std::uint16_t e : it->second.experts)
    out[e] += scale * static_cast<double>(joint_.at(joint_key(key, e)));
  return true;
}

std::vector<double> PathProfile::conditional(int layer, std::span<const std::uint16_t> path) const {
  std::vector<double> out(static_cast<std::size_t>(num_experts_), 0.0);
  if (!accumulate(path_key(layer, path), 1.0, out)) return {};
  return out;
}

std::vector<double> PathProfile::estimate(const RoutingBatch& b, int layer,
                                          std::span<const int> gpus,
                                          std::int64_t tokens_per_gpu) const {
  const int len = std::min(layer, path_length_);
  // Tokens grouped by their full path first: the estimate costs one profile look-up per distinct
  // path, not per token.
  struct Group {
    double count = 0;
    std::int64_t token = 0;  // one token of the group (to read the path back)
  };
  std::unordered_map<std::uint64_t, Group> groups;
  std::vector<std::uint16_t> path(static_cast<std::size_t>(len));
  double tokens = 0;
  for (int g : gpus)
    for (std::int64_t t = g * tokens_per_gpu; t < (g + 1) * tokens_per_gpu; ++t) {
      for (int q = 0; q < len; ++q) path[static_cast<std::size_t>(q)] = b.first(layer - len + q, t);
      Group& grp = groups[path_key(layer, path)];
      if (grp.count == 0) grp.token = t;
      grp.count += 1;
      tokens += 1;
    }
  std::vector<double> est(static_cast<std::size_t>(num_experts_), 0.0);
  for (const auto& [key, grp] : groups) {
    for (int q = 0; q < len; ++q)
      path[static_cast<std::size_t>(q)] = b.first(layer - len + q, grp.token);
    bool found = false;
    for (int q = len; q >= 0 && !found; --q)
      found = accumulate(
          path_key(layer, std::span<const std::uint16_t>(path).last(static_cast<std::size_t>(q))),
          grp.count, est);
    if (!found)
      for (auto& x : est) x += grp.count / static_cast<double>(num_experts_);
  }
  if (tokens > 0)
    for (auto& x : est) x /= tokens;
  return est;
}

}  // namespace moesim::inference
