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
      const auto it = std::find(entry.experts.begin(), entry.experts.end(), e);
      if (it == entry.experts.end()) {
        entry.experts.push_back(e);
        entry.counts.push_back(1);
      } else {
        ++entry.counts[static_cast<std::size_t>(it - entry.experts.begin())];
      }
    }
  }
}

void PathProfile::add_batch(const RoutingBatch& b) {
  // Same counts as add() token by token, but sorted into (path, next) runs first: one hash-map
  // access per distinct path instead of one per token (the maps do not fit in cache).
  std::vector<std::pair<std::uint64_t, std::uint16_t>> kv;
  kv.reserve(static_cast<std::size_t>(b.num_tokens) * static_cast<std::size_t>(b.top_k));
  std::vector<std::uint16_t> path(static_cast<std::size_t>(path_length_));
  for (int l = 0; l < b.num_layers; ++l) {
    MOESIM_ASSERT(l < num_layers_, "path profile: layer out of range");
    const int len = std::min(l, path_length_);
    for (int q = 0; q <= len; ++q) {
      kv.clear();
      for (std::int64_t t = 0; t < b.num_tokens; ++t) {
        for (int i = 0; i < q; ++i) path[static_cast<std::size_t>(i)] = b.first(l - q + i, t);
        const std::uint64_t key =
            path_key(l, std::span<const std::uint16_t>(path.data(), static_cast<std::size_t>(q)));
        for (std::uint16_t e : b.of(l, t)) kv.emplace_back(key, e);
      }
      std::sort(kv.begin(), kv.end());
      for (std::size_t i = 0; i < kv.size();) {
        PathEntry& entry = paths_[kv[i].first];
        const std::uint64_t key = kv[i].first;
        while (i < kv.size() && kv[i].first == key) {
          const std::uint16_t e = kv[i].second;
          std::uint64_t c = 0;
          for (; i < kv.size() && kv[i].first == key && kv[i].second == e; ++i) ++c;
          entry.total += c;
          const auto it = std::find(entry.experts.begin(), entry.experts.end(), e);
          if (it == entry.experts.end()) {
            entry.experts.push_back(e);
            entry.counts.push_back(c);
          } else {
            entry.counts[static_cast<std::size_t>(it - entry.experts.begin())] += c;
          }
        }
      }
    }
  }
}

bool PathProfile::accumulate(std::uint64_t key, double count, std::vector<double>& out) const {
  const auto it = paths_.find(key);
  if (it == paths_.end() || it->second.total < min_count_) return false;
  const double scale = count / static_cast<double>(it->second.total);
  const PathEntry& entry = it->second;
  for (std::size_t i = 0; i < entry.experts.size(); ++i)
    out[entry.experts[i]] += scale * static_cast<double>(entry.counts[i]);
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
  // Resolve every group to the longest profiled suffix of its path first, then expand each
  // resolved distribution once: many rare long paths share a short suffix.
  std::unordered_map<std::uint64_t, double> resolved;
  double unresolved = 0;
  for (const auto& [key, grp] : groups) {
    for (int q = 0; q < len; ++q)
      path[static_cast<std::size_t>(q)] = b.first(layer - len + q, grp.token);
    bool found = false;
    for (int q = len; q >= 0 && !found; --q) {
      const std::uint64_t k =
          path_key(layer, std::span<const std::uint16_t>(path).last(static_cast<std::size_t>(q)));
      const auto it = paths_.find(k);
      if (it != paths_.end() && it->second.total >= min_count_) {
        resolved[k] += grp.count;
        found = true;
      }
    }
    if (!found) unresolved += grp.count;
  }
  std::vector<double> est(static_cast<std::size_t>(num_experts_),
                          unresolved / static_cast<double>(num_experts_));
  // Sorted keys: the floating-point sum does not depend on the hash map's iteration order.
  std::vector<std::pair<std::uint64_t, double>> order(resolved.begin(), resolved.end());
  std::sort(order.begin(), order.end());
  for (const auto& [k, count] : order) accumulate(k, count, est);
  if (tokens > 0)
    for (auto& x : est) x /= tokens;
  return est;
}

}  // namespace moesim::inference
