#include "strategies/inference/placement.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "core/error.hpp"

namespace moesim::inference {

namespace {

constexpr double kEps = 1e-9;  // float slack in "fits in one GPU" and "at least one GPU"
// (ours) An expert gets ceil(load - 0.1) replicas: a load of 1.05 GPUs stays on one GPU instead of
// two half-idle ones. Without it a flat popularity (loads 1 +- noise) re-replicates different
// experts every batch and moves their weights for nothing.
constexpr double kReplicaSlack = 0.1;

// GPUs under construction: each a set of experts; an expert's tokens split evenly over the
// units holding it.
struct Units {
  std::vector<std::vector<int>> sets;
  const std::vector<double>* load = nullptr;  // load_e in GPUs' worth
  std::vector<int> holders;                   // per expert: units holding it

  void add_unit(std::vector<int> s) {
    for (int e : s) ++holders[static_cast<std::size_t>(e)];
    sets.push_back(std::move(s));
  }
  void add(std::size_t u, int e) {
    sets[u].push_back(e);
    ++holders[static_cast<std::size_t>(e)];
  }
  void erase(std::size_t u, std::vector<int>::iterator it) {
    --holders[static_cast<std::size_t>(*it)];
    sets[u].erase(it);
  }
  double share(int e) const {
    return (*load)[static_cast<std::size_t>(e)] / holders[static_cast<std::size_t>(e)];
  }
  double unit_load(std::size_t u) const {
    double x = 0;
    for (int e : sets[u]) x += share(e);
    return x;
  }
  // Least loaded unit with fewer than `cap` experts (ties: lowest index), or -1.
  int least_loaded_with_room(int cap) const {
    int best = -1;
    double best_load = 0;
    for (std::size_t u = 0; u < sets.size(); ++u) {
      if (static_cast<int>(sets[u].size()) >= cap) continue;
      const double x = unit_load(u);
      if (best < 0 || x < best_load - kEps) {
        best = static_cast<int>(u);
        best_load = x;
      }
    }
    return best;
  }
};

}  // namespace

Placement Placement::from_gpu_experts(std::vector<std::vector<int>> gpu_experts, int num_experts) {
  Placement p;
  p.gpu_experts = std::move(gpu_experts);
  p.replicas.assign(static_cast<std::size_t>(num_experts), {});
  for (std::size_t g = 0; g < p.gpu_experts.size(); ++g) {
    auto& s = p.gpu_experts[g];
    std::sort(s.begin(), s.end());
    for (int e : s) p.replicas.at(static_cast<std::size_t>(e)).push_back(static_cast<int>(g));
  }
  return p;
}

Placement uniform_placement(int num_gpus, int num_experts) {
  if (num_gpus < 1 || num_experts < num_gpus || num_experts % num_gpus != 0)
    throw InputError(
        fmt::format("inference placement: {} experts on {} GPUs, expected a multiple of the GPUs",
                    num_experts, num_gpus));
  const int per = num_experts / num_gpus;
  std::vector<std::vector<int>> sets(static_cast<std::size_t>(num_gpus));
  for (int e = 0; e < num_experts; ++e) sets[static_cast<std::size_t>(e / per)].push_back(e);
  return Placement::from_gpu_experts(std::move(sets), num_experts);
}

namespace {

// Phase 1's packing before it meets the GPU count: replicas of the experts worth at least one
// GPU, the rest packed first-fit-decreasing into bins of at most one GPU's load and `cap` experts.
struct Packing {
  std::vector<int> reps;  // per expert
  int dedicated = 0;      // GPUs the replicas take
  std::vector<int> zero;  // experts with no estimated load
  std::vector<std::vector<int>> bins;
  std::vector<double> bin_load;
};

Packing pack_experts(const std::vector<double>& load, int cap) {
  const int E = static_cast<int>(load.size());
  Packing p;
  p.reps.assign(static_cast<std::size_t>(E), 0);
  std::vector<int> small;
  for (int e = 0; e < E; ++e) {
    const double x = load[static_cast<std::size_t>(e)];
    if (x >= 1 - kEps) {
      p.reps[static_cast<std::size_t>(e)] =
          std::max(1, static_cast<int>(std::ceil(x - kReplicaSlack - kEps)));
      p.dedicated += p.reps[static_cast<std::size_t>(e)];
    } else if (x > 0) {
      small.push_back(e);
    } else {
      p.zero.push_back(e);
    }
  }
  std::stable_sort(small.begin(), small.end(), [&](int a, int b) {
    return load[static_cast<std::size_t>(a)] > load[static_cast<std::size_t>(b)];
  });
  for (int e : small) {
    const double x = load[static_cast<std::size_t>(e)];
    std::size_t b = 0;
    while (b < p.bins.size() &&
           (p.bin_load[b] + x > 1 + kEps || static_cast<int>(p.bins[b].size()) >= cap))
      ++b;
    if (b == p.bins.size()) {
      p.bins.emplace_back();
      p.bin_load.push_back(0);
    }
    p.bins[b].push_back(e);
    p.bin_load[b] += x;
  }
  return p;
}

// Too many GPUs needed: one GPU at a time, either take a replica away (from the expert whose
// per-replica load would stay smallest) or merge the two lightest bins (when their experts fit on
// one GPU), whichever leaves the smaller load on the GPU it changes. Stops when neither is
// possible; the caller then dissolves the lightest bins.
void shrink_to_gpus(Packing& p, const std::vector<double>& load, int W, int cap) {
  const int E = static_cast<int>(load.size());
  auto& bins = p.bins;
  auto& bin_load = p.bin_load;
  while (p.dedicated + static_cast<int>(bins.size()) > W) {
    int pick = -1;
    double pick_share = 0;
    for (int e = 0; e < E; ++e) {
      const int r = p.reps[static_cast<std::size_t>(e)];
      if (r <= 1) continue;
      const double s = load[static_cast<std::size_t>(e)] / (r - 1);
      if (pick < 0 || s < pick_share - kEps) {
        pick = e;
        pick_share = s;
      }
    }
    std::size_t lo1 = bins.size(), lo2 = bins.size();  // the two lightest bins
    for (std::size_t b = 0; b < bins.size(); ++b) {
      if (lo1 == bins.size() || bin_load[b] < bin_load[lo1] - kEps) {
        lo2 = lo1;
        lo1 = b;
      } else if (lo2 == bins.size() || bin_load[b] < bin_load[lo2] - kEps) {
        lo2 = b;
      }
    }
    const bool can_merge =
        lo2 < bins.size() && static_cast<int>(bins[lo1].size() + bins[lo2].size()) <= cap;
    const double merged = can_merge ? bin_load[lo1] + bin_load[lo2] : 0;
    if (can_merge && (pick < 0 || merged < pick_share - kEps)) {
      const std::size_t keep_b = std::min(lo1, lo2), drop_b = std::max(lo1, lo2);
      bins[keep_b].insert(bins[keep_b].end(), bins[drop_b].begin(), bins[drop_b].end());
      bin_load[keep_b] = merged;
      bins.erase(bins.begin() + static_cast<std::ptrdiff_t>(drop_b));
      bin_load.erase(bin_load.begin() + static_cast<std::ptrdiff_t>(drop_b));
      continue;
    }
    if (pick < 0) break;
    --p.reps[static_cast<std::size_t>(pick)];
    --p.dedicated;
  }
}

// The GPUs' expert sets, W of them: the replicas, the heaviest bins that fit, the spilled and
// unestimated experts on the least loaded GPUs with room, then empty GPUs relieving the most
// loaded one.
std::vector<std::vector<int>> gpu_sets(const Packing& p, const std::vector<double>& load, int W,
                                       int cap) {
  const int E = static_cast<int>(load.size());
  Units units;
  units.load = &load;
  units.holders.assign(static_cast<std::size_t>(E), 0);
  for (int e = 0; e < E; ++e)
    for (int r = 0; r < p.reps[static_cast<std::size_t>(e)]; ++r) units.add_unit({e});
  std::vector<std::size_t> order(p.bins.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return p.bin_load[a] > p.bin_load[b]; });
  const std::size_t keep = static_cast<std::size_t>(std::max(0, W - p.dedicated));
  std::vector<int> spilled;
  for (std::size_t i = 0; i < order.size(); ++i) {
    if (i < keep)
      units.add_unit(p.bins[order[i]]);
    else
      spilled.insert(spilled.end(), p.bins[order[i]].begin(), p.bins[order[i]].end());
  }
  std::stable_sort(spilled.begin(), spilled.end(), [&](int a, int b) {
    return load[static_cast<std::size_t>(a)] > load[static_cast<std::size_t>(b)];
  });
  auto place_on_least_loaded = [&](int e) {
    const int u = units.least_loaded_with_room(cap);
    MOESIM_ASSERT(u >= 0, "inference placement: no GPU with room (cap * W >= E was checked)");
    units.add(static_cast<std::size_t>(u), e);
  };
  for (int e : spilled) place_on_least_loaded(e);
  // Unestimated experts.
  for (int e : p.zero) {
    if (static_cast<int>(units.sets.size()) < W)
      units.add_unit({e});
    else
      place_on_least_loaded(e);
  }
  // Empty GPUs relieve the most loaded one.
  while (static_cast<int>(units.sets.size()) < W) {
    std::size_t top = 0;
    double top_load = -1;
    for (std::size_t u = 0; u < units.sets.size(); ++u) {
      const double x = units.unit_load(u);
      if (x > top_load + kEps) {
        top = u;
        top_load = x;
      }
    }
    if (units.sets.empty() || top_load <= 0) break;
    auto& s = units.sets[top];
    if (s.size() > 1) {
      auto heaviest = s.begin();
      for (auto it = s.begin(); it != s.end(); ++it)
        if (units.share(*it) > units.share(*heaviest) + kEps) heaviest = it;
      const int e = *heaviest;
      units.erase(top, heaviest);
      units.add_unit({e});
    } else {
      units.add_unit({s.front()});
    }
  }
  while (static_cast<int>(units.sets.size()) < W) units.sets.emplace_back();
  return std::move(units.sets);
}

// Positions: each set goes to the free GPU that already holds most of it under `previous`.
std::vector<std::vector<int>> keep_positions(std::vector<std::vector<int>> sets, int W, int E,
                                             const Placement* previous) {
  std::vector<std::vector<int>> at(static_cast<std::size_t>(W));
  std::set<int> free;
  for (int g = 0; g < W; ++g) free.insert(g);
  const bool has_prev =
      previous != nullptr && previous->num_gpus() == W && previous->num_experts() == E;
  for (auto& s : sets) {
    int best = -1, best_overlap = 0;
    if (has_prev)
      for (int e : s)
        for (int g : previous->replicas[static_cast<std::size_t>(e)]) {
          if (!free.count(g)) continue;
          const auto& held = previous->gpu_experts[static_cast<std::size_t>(g)];
          int overlap = 0;
          for (int x : s) overlap += std::binary_search(held.begin(), held.end(), x) ? 1 : 0;
          if (overlap > best_overlap || (overlap == best_overlap && best >= 0 && g < best)) {
            best = g;
            best_overlap = overlap;
          }
        }
    if (best < 0) best = *free.begin();
    free.erase(best);
    at[static_cast<std::size_t>(best)] = std::move(s);
  }
  return at;
}

}  // namespace

Placement popularity_placement(std::span<const double> popularity, int num_gpus, int max_per_gpu,
                               const Placement* previous) {
  const int W = num_gpus;
  const int E = static_cast<int>(popularity.size());
  const int cap = max_per_gpu;
  if (W < 1 || E < 1 || cap < 1 || static_cast<std::int64_t>(cap) * W < E)
    throw InputError(
        fmt::format("inference placement: {} experts on {} GPUs with at most {} per GPU do not fit",
                    E, W, cap));
  std::vector<double> load(static_cast<std::size_t>(E));
  const double total = std::accumulate(popularity.begin(), popularity.end(), 0.0);
  for (int e = 0; e < E; ++e)
    load[static_cast<std::size_t>(e)] =
        total > 0 ? std::max(0.0, popularity[static_cast<std::size_t>(e)]) / total * W
                  : static_cast<double>(W) / E;
  Packing packing = pack_experts(load, cap);
  shrink_to_gpus(packing, load, W, cap);
  return Placement::from_gpu_experts(
      keep_positions(gpu_sets(packing, load, W, cap), W, E, previous), E);
}

double predicted_max_load(const Placement& placement, std::span<const double> popularity) {
  const int W = placement.num_gpus();
  double worst = 0;
  for (int g = 0; g < W; ++g) {
    double x = 0;
    for (int e : placement.gpu_experts[static_cast<std::size_t>(g)])
      x += popularity[static_cast<std::size_t>(e)] /
           static_cast<double>(placement.replicas[static_cast<std::size_t>(e)].size());
    worst = std::max(worst, x * W);
  }
  return worst;
}

const Placement& keep_unless_better(const Placement& current, const Placement& proposed,
                                    std::span<const double> popularity, double tolerance) {
  return predicted_max_load(current, popularity) <=
                 predicted_max_load(proposed, popularity) * (1 + tolerance)
             ? current
             : proposed;
}

std::vector<int> top_k_experts(std::span<const double> popularity, int k) {
  std::vector<int> ids(popularity.size());
  std::iota(ids.begin(), ids.end(), 0);
  k = std::clamp(k, 0, static_cast<int>(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) {
    const double pa = popularity[static_cast<std::size_t>(a)];
    const double pb = popularity[static_cast<std::size_t>(b)];
    return pa != pb ? pa > pb : a < b;
  });
  ids.resize(static_cast<std::size_t>(k));
  std::sort(ids.begin(), ids.end());
  return ids;
}

bool phase2_fires(std::span<const double> estimated, std::span<const double> actual, int k) {
  return top_k_experts(estimated, k) != top_k_experts(actual, k);
}

ByteMatrix token_matrix(const Placement& placement, std::span<const std::uint32_t> counts,
                        Bytes bytes_per_token) {
  const int W = placement.num_gpus();
  const int E = placement.num_experts();
  MOESIM_ASSERT(counts.size() == static_cast<std::size_t>(W) * E, "token_matrix: counts shape");
  ByteMatrix m;
  m.size = W;
  m.unit = bytes_per_token;
  m.counts.assign(static_cast<std::size_t>(W) * W, 0);
  for (int a = 0; a < W; ++a)
    for (int e = 0; e < E; ++e) {
      const std::uint32_t c = counts[static_cast<std::size_t>(a) * E + e];
      if (c == 0) continue;
      const auto& reps = placement.replicas[static_cast<std::size_t>(e)];
      MOESIM_ASSERT(!reps.empty(), "token_matrix: an expert without a GPU");
      const auto r = static_cast<std::uint32_t>(reps.size());
      for (std::uint32_t y = 0; y < r; ++y) {
        const std::uint32_t x = (static_cast<std::uint32_t>(a) + y) % r;
        const std::uint32_t n = c / r + (y < c % r ? 1u : 0u);
        m.counts[static_cast<std::size_t>(a) * W + static_cast<std::size_t>(reps[x])] += n;
      }
    }
  return m;
}

ByteMatrix weight_moves(const Placement& from, const Placement& to, Bytes bytes_per_expert) {
  const int W = to.num_gpus();
  MOESIM_ASSERT(from.num_gpus() == W && from.num_experts() == to.num_experts(),
                "weight_moves: placements of different shapes");
  ByteMatrix m;
  m.size = W;
  m.unit = bytes_per_expert;
  m.counts.assign(static_cast<std::size_t>(W) * W, 0);
  std::vector<int> sent(static_cast<std::size_t>(W), 0);
  for (int b = 0; b < W; ++b) {
    const auto& held = from.gpu_experts[static_cast<std::size_t>(b)];
    for (int e : to.gpu_experts[static_cast<std::size_t>(b)]) {
      if (std::binary_search(held.begin(), held.end(), e)) continue;
      int src = -1;
      for (int g : from.replicas[static_cast<std::size_t>(e)])
        if (src < 0 || sent[static_cast<std::size_t>(g)] < sent[static_cast<std::size_t>(src)])
          src = g;
      MOESIM_ASSERT(src >= 0, "weight_moves: an expert nobody holds");
      ++sent[static_cast<std::size_t>(src)];
      ++m.counts[static_cast<std::size_t>(src) * W + static_cast<std::size_t>(b)];
    }
  }
  return m;
}

std::vector<double> received_tokens(const ByteMatrix& tokens) {
  std::vector<double> out(static_cast<std::size_t>(tokens.size), 0.0);
  for (int b = 0; b < tokens.size; ++b)
    out[static_cast<std::size_t>(b)] = tokens.col_sum(b).value() / tokens.unit.value();
  return out;
}

}  // namespace moesim::inference
