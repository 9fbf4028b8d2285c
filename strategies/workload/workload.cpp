#include "strategies/workload/workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>

#include "core/error.hpp"
#include "strategies/workload/balanced.hpp"
#include "strategies/workload/random.hpp"
#include "strategies/workload/sampling.hpp"

namespace moesim::workload {

using detail::ChoiceSampler;
using detail::Stream;
using detail::substream_key;
using detail::Xoshiro256;

std::int64_t LayerDispatch::expert_load(int expert) const {
  std::int64_t load = 0;
  for (int i = 0; i < num_gpus; ++i) load += at(i, expert);
  return load;
}

double LayerDispatch::imbalance() const {
  if (num_experts == 0) return 0.0;
  // One pass over the matrix (column sums), not E calls of expert_load.
  std::vector<std::int64_t> load(static_cast<std::size_t>(num_experts), 0);
  for (int i = 0; i < num_gpus; ++i) {
    const std::uint32_t* row = kept.data() + static_cast<std::size_t>(i) * num_experts;
    for (int e = 0; e < num_experts; ++e) load[static_cast<std::size_t>(e)] += row[e];
  }
  std::int64_t total = 0, largest = 0;
  for (const std::int64_t x : load) {
    total += x;
    largest = std::max(largest, x);
  }
  if (total == 0) return 0.0;
  return static_cast<double>(largest) * num_experts / static_cast<double>(total);
}

std::uint32_t LayerDispatch::demanded_at(int gpu, int expert) const {
  if (!demanded.empty()) return demanded[static_cast<std::size_t>(gpu) * num_experts + expert];
  MOESIM_ASSERT(dropped == 0, "demanded counts were not kept and differ from kept");
  return at(gpu, expert);
}

std::int64_t LayerDispatch::gpu_sent(int gpu) const {
  std::int64_t sent = 0;
  for (int e = 0; e < num_experts; ++e) sent += at(gpu, e);
  return sent;
}

struct WorkloadGenerator::Impl {
  int num_gpus = 0;
  int num_experts = 0;
  int top_k = 0;
  int num_layers = 0;
  std::int64_t tokens = 0;
  RoutingWorkloadSpec routing;
  CapacityWorkloadSpec capacity;
  double base_factor = 1.0;
  std::optional<RoutingTrace> trace;
  std::vector<std::vector<double>> zipf;  // per layer, built on first use
  std::vector<double> walk;               // random walk factors of iterations 0..size-1

  std::vector<double> popularity(int iteration, int layer);
  // Node-limited routing: the distinct expert-to-node partitions of the rows' EP groups and each
  // row's index into them (null without a limit).
  int node_limit = 0;
  std::shared_ptr<const std::vector<std::vector<std::uint32_t>>> partitions;
  std::shared_ptr<const std::vector<std::uint32_t>> row_partition;
  // Distinct destinations (a strategy with a2a: deepep): each expert's EP position, the group
  // size and the largest node count of the rows' partitions (which are then always set).
  bool distinct = false;
  std::vector<std::uint32_t> pos_of;
  int distinct_positions = 0, distinct_nodes = 0, distinct_experts_per_gpu = 0;
  // Balanced routing: each row's EP position (where its tokens start in the group's sequence).
  bool balanced = false;
  std::vector<std::uint32_t> row_pos;
  int threads = 0;  // 0: hardware concurrency
  bool keep_demanded = true;
  bool count_distinct = true;
  SampleCache* cache = nullptr;

  // Applies capacity `cap` to one GPU's per-choice counts (counts[j * E + e]) and fills row i;
  // accumulates the row's drops per choice and its largest demand.
  void fill_row(LayerDispatch& d, int gpu, const std::uint32_t* counts, std::int64_t cap,
                std::int64_t& max_demanded, std::int64_t* dropped_by_choice) const;

  // One layer's rows from the routing trace (its entries are sorted by GPU).
  void trace_rows(LayerDispatch& d, int iteration, int layer, std::int64_t cap,
                  std::int64_t& max_demanded) const;
  // One layer's rows drawn from the routing distribution, or read from the sample cache.
  void sampled_rows(LayerDispatch& d, int iteration, int layer, std::int64_t cap,
                    std::int64_t& max_demanded);
  // The sample cache's key of one layer's draw.
  SampleCache::Key cache_key(int iteration, int layer) const;
  // One sampler per expert-to-node partition (one without a node limit): balanced or drawn.
  struct Samplers {
    std::vector<ChoiceSampler> drawn;
    std::vector<detail::BalancedSampler> balanced;
  };
  Samplers make_samplers(int iteration, int layer);
  // A partition's destination sets (deepep's node dedup), when the dispatch needs them.
  detail::DistinctDestinations distinct_of(const std::vector<std::uint32_t>& part) const;
};

std::vector<double> WorkloadGenerator::Impl::popularity(int iteration, int layer) {
  switch (routing.distribution) {
    case RoutingDistribution::kUniform:
    case RoutingDistribution::kBalanced:  // uniform in expectation; balanced_order fixes the rest
    case RoutingDistribution::kTrace:
      return {};
    case RoutingDistribution::kZipf:
    case RoutingDistribution::kCorrelated: {  // its per-layer marginals (strategies/inference/)
      auto& p = zipf[static_cast<std::size_t>(layer)];
      if (p.empty()) p = detail::zipf_popularity(num_experts, routing.skew, routing.seed, layer);
      return p;
    }
    case RoutingDistribution::kDirichlet:
      return detail::dirichlet_popularity(num_experts, routing.dirichlet_alpha, routing.seed,
                                          iteration, layer);
  }
  return {};
}

void WorkloadGenerator::Impl::fill_row(LayerDispatch& d, int gpu, const std::uint32_t* counts,
                                       std::int64_t cap, std::int64_t& max_demanded,
                                       std::int64_t* dropped_by_choice) const {
  const std::size_t E = static_cast<std::size_t>(num_experts);
  const std::size_t k = static_cast<std::size_t>(top_k);
  std::uint32_t* kept = d.kept.data() + static_cast<std::size_t>(gpu) * E;
  std::uint32_t* demanded =
      d.demanded.empty() ? nullptr : d.demanded.data() + static_cast<std::size_t>(gpu) * E;
  std::uint32_t by_choice[64];
  std::uint32_t kept_by_choice[64];
  for (std::size_t e = 0; e < E; ++e) {
    std::int64_t demand = 0;
    for (std::size_t j = 0; j < k; ++j) demand += counts[j * E + e];
    MOESIM_ASSERT(demand <= std::numeric_limits<std::uint32_t>::max(),
                  "per-pair demand exceeds 32-bit counts");
    if (demanded) demanded[e] = static_cast<std::uint32_t>(demand);
    max_demanded = std::max(max_demanded, demand);
    if (demand <= cap) {  // the common case: nothing dropped, no per-choice bookkeeping
      kept[e] = static_cast<std::uint32_t>(demand);
      continue;
    }
    for (std::size_t j = 0; j < k; ++j) by_choice[j] = counts[j * E + e];
    kept[e] = static_cast<std::uint32_t>(apply_capacity({by_choice, k}, cap, {kept_by_choice, k}));
    for (std::size_t j = 0; j < k; ++j)
      dropped_by_choice[j] += static_cast<std::int64_t>(by_choice[j]) - kept_by_choice[j];
  }
}

void WorkloadGenerator::Impl::trace_rows(LayerDispatch& d, int iteration, int layer,
                                         std::int64_t cap, std::int64_t& max_demanded) const {
  const std::size_t E = static_cast<std::size_t>(num_experts);
  const std::size_t k = static_cast<std::size_t>(top_k);
  std::vector<std::uint32_t> counts(k * E, 0u);
  const auto& entries = trace->entries[static_cast<std::size_t>(
      (iteration % trace->num_iterations) * num_layers + layer)];
  // Fill one GPU's counts, emit its row, clear what was touched.
  for (std::size_t a = 0; a < entries.size();) {
    const int gpu = entries[a].gpu;
    std::size_t b = a;
    for (; b < entries.size() && entries[b].gpu == gpu; ++b)
      counts[static_cast<std::size_t>(entries[b].choice) * E +
             static_cast<std::size_t>(entries[b].expert)] = entries[b].count;
    fill_row(d, gpu, counts.data(), cap, max_demanded, d.dropped_by_choice.data());
    for (std::size_t x = a; x < b; ++x)
      counts[static_cast<std::size_t>(entries[x].choice) * E +
             static_cast<std::size_t>(entries[x].expert)] = 0;
    a = b;
  }
}

SampleCache::Key WorkloadGenerator::Impl::cache_key(int iteration, int layer) const {
  return SampleCache::Key{num_gpus,
                          num_experts,
                          top_k,
                          tokens,
                          static_cast<int>(routing.distribution),
                          routing.skew,
                          routing.dirichlet_alpha,
                          routing.seed,
                          iteration,
                          layer,
                          node_limit,
                          distinct ? distinct_positions : 0,
                          distinct ? distinct_experts_per_gpu : 0,
                          partitions,
                          row_partition};
}

detail::DistinctDestinations WorkloadGenerator::Impl::distinct_of(
    const std::vector<std::uint32_t>& part) const {
  detail::DistinctDestinations dd;
  if (distinct)
    dd = {pos_of, part, static_cast<std::uint32_t>(distinct_positions),
          static_cast<std::uint32_t>(distinct_nodes)};
  return dd;
}

WorkloadGenerator::Impl::Samplers WorkloadGenerator::Impl::make_samplers(int iteration, int layer) {
  Samplers out;
  if (balanced) {
    const auto order = [&](std::span<const std::uint32_t> node_of) {
      return detail::balanced_order(num_experts, node_of, node_limit, routing.seed, iteration,
                                    layer);
    };
    if (!partitions) {
      out.balanced.emplace_back(order({}), top_k, tokens);
    } else {
      for (const auto& part : *partitions)
        out.balanced.emplace_back(order(part), top_k, tokens, distinct_of(part));
    }
    return out;
  }
  const std::vector<double> p = popularity(iteration, layer);
  if (!partitions) {
    out.drawn.emplace_back(p, num_experts, top_k, tokens);
  } else {
    for (const auto& part : *partitions) {
      out.drawn.emplace_back(
          p, num_experts, top_k, tokens, ChoiceSampler::Method::kAuto,
          node_limit > 0 ? detail::NodeLimit{part, node_limit} : detail::NodeLimit{},
          distinct_of(part));
    }
  }
  return out;
}

void WorkloadGenerator::Impl::sampled_rows(LayerDispatch& d, int iteration, int layer,
                                           std::int64_t cap, std::int64_t& max_demanded) {
  Impl& m = *this;
  const std::size_t E = static_cast<std::size_t>(m.num_experts);
  const std::size_t k = static_cast<std::size_t>(m.top_k);
  // With a cache: rows come from the cached counts, or are sampled into a new entry.
  SampleCache::Counts cached;
  std::shared_ptr<std::vector<std::uint32_t>> fresh;
  SampleCache::Key key;
  const std::size_t dw = static_cast<std::size_t>(m.distinct_positions + m.distinct_nodes);
  // The samplers still draw as distinct counting has them; only the count may be skipped.
  const bool count_distinct = m.distinct && (m.count_distinct || m.cache);
  if (count_distinct) {
    d.distinct_positions = m.distinct_positions;
    d.distinct_nodes = m.distinct_nodes;
    d.distinct.assign(static_cast<std::size_t>(m.num_gpus) * dw, 0u);
  }
  if (m.cache) {
    key = cache_key(iteration, layer);
    cached = m.cache->find(key);
    if (!cached)
      fresh = std::make_shared<std::vector<std::uint32_t>>(static_cast<std::size_t>(m.num_gpus) *
                                                           (k * E + (m.distinct ? dw : 0)));
    else if (m.distinct)
      std::copy_n(cached->data() + static_cast<std::size_t>(m.num_gpus) * k * E, d.distinct.size(),
                  d.distinct.begin());
  }
  Samplers samplers;
  if (!cached) samplers = make_samplers(iteration, layer);
  // Rows are independent (one substream per GPU) and written to disjoint memory, so threads
  // split the GPUs into contiguous blocks; per-thread maxima and drop counts are merged in
  // thread order. Small layers stay on the calling thread.
  int threads = m.threads > 0 ? m.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::int64_t work =
      static_cast<std::int64_t>(m.num_gpus) * (cached ? m.num_experts : m.tokens) * m.top_k;
  threads = static_cast<int>(
      std::clamp<std::int64_t>(std::min<std::int64_t>(threads, work / 2'000'000), 1, m.num_gpus));
  struct Partial {
    std::int64_t max_demanded = 0;
    std::vector<std::int64_t> dropped_by_choice;
    std::exception_ptr error;
  };
  std::vector<Partial> partial(static_cast<std::size_t>(threads));
  auto run = [&](int t) {
    Partial& out = partial[static_cast<std::size_t>(t)];
    try {
      out.dropped_by_choice.assign(k, 0);
      std::vector<std::uint32_t> scratch(cached || fresh ? 0 : k * E, 0u);
      const int begin = static_cast<int>(static_cast<std::int64_t>(m.num_gpus) * t / threads);
      const int end = static_cast<int>(static_cast<std::int64_t>(m.num_gpus) * (t + 1) / threads);
      for (int gpu = begin; gpu < end; ++gpu) {
        const std::size_t row = static_cast<std::size_t>(gpu) * k * E;
        if (cached) {
          m.fill_row(d, gpu, cached->data() + row, cap, out.max_demanded,
                     out.dropped_by_choice.data());
          continue;
        }
        const std::span<std::uint32_t> counts =
            fresh ? std::span<std::uint32_t>(fresh->data() + row, k * E) : scratch;
        Xoshiro256 rng(
            substream_key(m.routing.seed, Stream::kTokens, static_cast<std::uint64_t>(iteration),
                          static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(gpu)));
        const std::span<std::uint32_t> distinct =
            count_distinct ? std::span<std::uint32_t>(
                                 d.distinct.data() + static_cast<std::size_t>(gpu) * dw, dw)
                           : std::span<std::uint32_t>();
        const std::size_t part =
            m.row_partition ? (*m.row_partition)[static_cast<std::size_t>(gpu)] : 0;
        if (m.balanced)
          samplers.balanced[part].sample(m.row_pos[static_cast<std::size_t>(gpu)], counts,
                                         distinct);
        else
          samplers.drawn[part].sample(rng, counts, distinct);
        m.fill_row(d, gpu, counts.data(), cap, out.max_demanded, out.dropped_by_choice.data());
      }
    } catch (...) {
      out.error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) pool.emplace_back(run, t);
  run(0);
  for (std::thread& th : pool) th.join();
  for (const Partial& p : partial) {
    if (p.error) std::rethrow_exception(p.error);
    max_demanded = std::max(max_demanded, p.max_demanded);
    for (std::size_t j = 0; j < k; ++j) d.dropped_by_choice[j] += p.dropped_by_choice[j];
  }
  if (fresh) {
    std::copy(
        d.distinct.begin(), d.distinct.end(),
        fresh->begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(m.num_gpus) * k * E));
    m.cache->insert(key, std::move(fresh));
  }
}

std::vector<std::uint32_t> expert_nodes(const Scenario& sc, int gpu) {
  const ParallelismSpec& p = sc.parallelism;
  if (gpu < 0 || gpu >= sc.num_gpus() || p.ep < 1 || p.ranks_per_dp() < 1)
    throw InputError(fmt::format("workload: no GPU {} in a layout of {} GPUs", gpu, sc.num_gpus()));
  // The coordinates of `gpu` other than its EP position fix its EP group (docs/model.md).
  const int d = gpu / p.ranks_per_dp();
  const int s = p.esp_index(gpu);
  const int t = p.moe_major() ? 0 : p.mp_index(gpu);
  const auto placement = ExpertPlacement::of(sc.model);
  const int gpn = std::max(1, sc.cluster.gpus_per_node);
  std::vector<std::uint32_t> out(static_cast<std::size_t>(sc.num_experts()));
  // Node -> label, in order of first appearance (a flat table: this runs per EP group at 4,096+
  // GPUs, where a map's allocations dominated).
  constexpr std::uint32_t kNone = ~std::uint32_t{0};
  std::vector<std::uint32_t> label(static_cast<std::size_t>((sc.num_gpus() + gpn - 1) / gpn),
                                   kNone);
  std::uint32_t next = 0;
  for (int e = 0; e < sc.num_experts(); ++e) {
    const int pos = placement.owner(e);
    if (pos >= p.ep)
      throw InputError(
          sc.location_of("model.experts"), "model.experts",
          fmt::format("expert {} would live on EP position {}, but ep = {}", e, pos, p.ep));
    const auto node = static_cast<std::size_t>(p.rank_of(d, pos, s, t) / gpn);
    if (label[node] == kNone) label[node] = next++;
    out[static_cast<std::size_t>(e)] = label[node];
  }
  return out;
}

bool samples_distinct_destinations(const Scenario& scenario) {
  const auto dist = scenario.workload.routing.distribution;
  return dist != RoutingDistribution::kTrace && dist != RoutingDistribution::kCorrelated &&
         ExpertPlacement::of(scenario.model).shards == 1 &&  // the a2a role refuses sharded ones
         std::any_of(scenario.strategies.begin(), scenario.strategies.end(),
                     [](const StrategySpec& s) { return s.a2a == A2aRole::kDeepep; });
}

WorkloadGenerator::WorkloadGenerator(const Scenario& scenario) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.num_gpus = scenario.num_gpus();
  m.num_experts = scenario.num_experts();
  m.top_k = scenario.model.top_k;
  m.num_layers = scenario.model.num_moe_layers();
  m.tokens = scenario.tokens_per_gpu();
  m.routing = scenario.workload.routing;
  m.capacity = scenario.workload.capacity;
  m.base_factor = scenario.model.capacity_factor;
  // The loader validates these; scenarios built in code get the same guarantees here.
  if (m.num_gpus < 1) throw InputError("workload: the cluster needs at least one GPU");
  if (m.num_experts < 1)
    throw InputError(scenario.location_of("model.experts"), "model.experts",
                     fmt::format("found {} experts, expected at least 1", m.num_experts));
  if (m.top_k < 1 || m.top_k > m.num_experts || m.top_k > 64)
    throw InputError(scenario.location_of("model.top_k"), "model.top_k",
                     fmt::format("found {}, expected 1..min(E = {}, 64)", m.top_k, m.num_experts));
  if (m.tokens < 0 || m.tokens > std::numeric_limits<std::uint32_t>::max())
    throw InputError(scenario.location_of("model.batch_per_gpu"), "model.batch_per_gpu",
                     fmt::format("found {} tokens per GPU, expected 0..2^32-1", m.tokens));
  if (m.num_layers < 0) throw InputError("workload: negative number of MoE layers");
  if (m.routing.distribution == RoutingDistribution::kZipf && !(m.routing.skew >= 0))
    throw InputError(scenario.location_of("workload.routing.skew"), "workload.routing.skew",
                     fmt::format("found {}, expected a number >= 0", m.routing.skew));
  if (m.routing.distribution == RoutingDistribution::kDirichlet && !(m.routing.dirichlet_alpha > 0))
    throw InputError(scenario.location_of("workload.routing.alpha"), "workload.routing.alpha",
                     fmt::format("found {}, expected a number > 0", m.routing.dirichlet_alpha));
  if (m.capacity.kind == CapacityKind::kTrace && m.capacity.factors.empty())
    throw InputError(scenario.location_of("workload.capacity.factors"), "workload.capacity.factors",
                     "found an empty list, expected factors");
  if (m.capacity.kind == CapacityKind::kRandomWalk &&
      !(m.capacity.min > 0 && m.capacity.min <= m.capacity.max && m.capacity.step > 0))
    throw InputError(scenario.location_of("workload.capacity"), "workload.capacity",
                     fmt::format("found random_walk min {}, max {}, step {}, expected 0 < min <= "
                                 "max and step > 0",
                                 m.capacity.min, m.capacity.max, m.capacity.step));
  m.distinct = samples_distinct_destinations(scenario);
  if (m.distinct) {
    const auto placement = ExpertPlacement::of(scenario.model);
    m.distinct_positions = scenario.parallelism.ep;
    m.distinct_experts_per_gpu = placement.experts_per_gpu;
    for (int e = 0; e < m.num_experts; ++e)
      m.pos_of.push_back(static_cast<std::uint32_t>(placement.owner(e)));
    for (const std::uint32_t q : m.pos_of)
      if (q >= static_cast<std::uint32_t>(m.distinct_positions)) m.distinct = false;
  }
  if (m.routing.node_limit > 0 || m.distinct) {
    if (m.routing.node_limit > 0 && (m.routing.distribution == RoutingDistribution::kTrace ||
                                     m.routing.distribution == RoutingDistribution::kCorrelated))
      throw InputError(scenario.location_of("workload.routing.node_limit"),
                       "workload.routing.node_limit",
                       "applies to sampled routing (uniform, zipf, dirichlet, balanced) only");
    m.node_limit = m.routing.node_limit;
    auto parts = std::make_shared<std::vector<std::vector<std::uint32_t>>>();
    auto rows = std::make_shared<std::vector<std::uint32_t>>(static_cast<std::size_t>(m.num_gpus));
    std::map<std::vector<std::uint32_t>, std::uint32_t> index;
    // GPUs of one EP group (the same coordinates but the EP position) see the same experts on
    // the same nodes: one expert_nodes per group.
    const ParallelismSpec& par = scenario.parallelism;
    std::map<std::tuple<int, int, int>, std::uint32_t> group_row;
    for (int gpu = 0; gpu < m.num_gpus; ++gpu) {
      const std::tuple<int, int, int> group{gpu / std::max(1, par.ranks_per_dp()),
                                            par.esp_index(gpu),
                                            par.moe_major() ? 0 : par.mp_index(gpu)};
      if (auto g = group_row.find(group); g != group_row.end()) {
        (*rows)[static_cast<std::size_t>(gpu)] = g->second;
        continue;
      }
      auto nodes = expert_nodes(scenario, gpu);
      auto [it, added] = index.try_emplace(nodes, static_cast<std::uint32_t>(parts->size()));
      if (added) parts->push_back(std::move(nodes));
      (*rows)[static_cast<std::size_t>(gpu)] = it->second;
      group_row.emplace(group, it->second);
    }
    // Every token must find top_k experts on the nodes it may use: the `limit` nodes holding the
    // fewest experts must hold k of them (a limit at or above an EP group's node count never
    // binds).
    for (const auto& part : *parts) {
      std::vector<std::uint32_t> sizes;
      for (const std::uint32_t n : part) {
        if (n >= sizes.size()) sizes.resize(n + 1, 0);
        ++sizes[n];
      }
      m.distinct_nodes = std::max(m.distinct_nodes, static_cast<int>(sizes.size()));
      if (m.node_limit == 0 || static_cast<std::size_t>(m.node_limit) >= sizes.size()) continue;
      std::sort(sizes.begin(), sizes.end());
      const std::uint32_t fewest =
          std::accumulate(sizes.begin(), sizes.begin() + m.node_limit, std::uint32_t{0});
      if (fewest < static_cast<std::uint32_t>(m.top_k))
        throw InputError(
            scenario.location_of("workload.routing.node_limit"), "workload.routing.node_limit",
            fmt::format("found {}: an EP group spans {} nodes, and its {} node(s) with the "
                        "fewest experts hold {} in all, fewer than top_k = {}; expected a limit "
                        "whose nodes hold at least top_k experts",
                        m.node_limit, sizes.size(), m.node_limit, fewest, m.top_k));
    }
    m.partitions = std::move(parts);
    m.row_partition = std::move(rows);
  }
  if (m.routing.distribution == RoutingDistribution::kBalanced) {
    m.balanced = true;
    for (int gpu = 0; gpu < m.num_gpus; ++gpu)
      m.row_pos.push_back(static_cast<std::uint32_t>(scenario.parallelism.ep_index(gpu)));
    // The window layout decides how many nodes a token touches; the seeded order inside each
    // node does not, so one check per layout holds for every (iteration, layer).
    if (m.node_limit > 0)
      for (const auto& part : *m.partitions) {
        const auto order = detail::balanced_order(m.num_experts, part, m.node_limit, 0, 0, 0);
        const int most = detail::balanced_max_nodes(order, part, m.top_k);
        if (most > m.node_limit)
          throw InputError(
              scenario.location_of("workload.routing.node_limit"), "workload.routing.node_limit",
              fmt::format("found {} with distribution balanced: the balanced windows of top_k = {} "
                          "experts over blocks of {} node(s) would put a token on {} nodes; "
                          "expected a layout where each block of node_limit nodes holds a "
                          "multiple of top_k experts (docs/workload.md, \"Balanced routing\")",
                          m.node_limit, m.top_k, m.node_limit, most));
      }
  }
  m.zipf.resize(static_cast<std::size_t>(std::max(m.num_layers, 0)));
  if (m.routing.distribution == RoutingDistribution::kTrace)
    m.trace =
        read_routing_trace(m.routing.trace_path, m.num_gpus, m.num_experts, m.num_layers, m.top_k);
}

WorkloadGenerator::~WorkloadGenerator() = default;
WorkloadGenerator::WorkloadGenerator(WorkloadGenerator&&) noexcept = default;
WorkloadGenerator& WorkloadGenerator::operator=(WorkloadGenerator&&) noexcept = default;

double WorkloadGenerator::capacity_factor(int iteration) {
  if (iteration < 0) throw InputError(fmt::format("workload: iteration {} is negative", iteration));
  Impl& m = *impl_;
  switch (m.capacity.kind) {
    case CapacityKind::kFixed:
      return m.base_factor;
    case CapacityKind::kTrace:
      return m.capacity.factors[static_cast<std::size_t>(iteration) % m.capacity.factors.size()];
    case CapacityKind::kRandomWalk: {
      // Extend the walk from iteration 0; every step's direction is a coin from its own
      // substream, so factor(i) does not depend on the order the iterations are asked for.
      if (m.walk.empty())
        m.walk.push_back(std::clamp(m.base_factor, m.capacity.min, m.capacity.max));
      while (static_cast<int>(m.walk.size()) <= iteration) {
        const auto i = static_cast<std::uint64_t>(m.walk.size());
        Xoshiro256 coin(substream_key(m.routing.seed, Stream::kCapacityWalk, i));
        const double step = (coin() >> 63) ? m.capacity.step : -m.capacity.step;
        m.walk.push_back(std::clamp(m.walk.back() + step, m.capacity.min, m.capacity.max));
      }
      return m.walk[static_cast<std::size_t>(iteration)];
    }
  }
  return m.base_factor;
}

std::vector<double> WorkloadGenerator::expert_popularity(int iteration, int layer) {
  Impl& m = *impl_;
  if (iteration < 0 || layer < 0 || layer >= m.num_layers)
    throw InputError(fmt::format("workload: no MoE layer {} at iteration {} ({} layers)", layer,
                                 iteration, m.num_layers));
  if (m.routing.distribution == RoutingDistribution::kTrace) return {};
  std::vector<double> p = m.popularity(iteration, layer);
  if (p.empty()) p.assign(static_cast<std::size_t>(m.num_experts), 1.0 / m.num_experts);
  return p;
}

LayerDispatch WorkloadGenerator::sample_layer(int iteration, int layer, double f,
                                              int capacity_multiple) {
  Impl& m = *impl_;
  if (iteration < 0 || layer < 0 || layer >= m.num_layers)
    throw InputError(fmt::format("workload: no MoE layer {} at iteration {} ({} layers)", layer,
                                 iteration, m.num_layers));
  if (capacity_multiple < 1)
    throw InputError(fmt::format("workload: capacity multiple {} must be >= 1", capacity_multiple));
  const std::size_t E = static_cast<std::size_t>(m.num_experts);
  const std::size_t k = static_cast<std::size_t>(m.top_k);

  LayerDispatch d;
  d.num_gpus = m.num_gpus;
  d.num_experts = m.num_experts;
  d.top_k = m.top_k;
  d.capacity_factor = f;
  d.kept.assign(static_cast<std::size_t>(m.num_gpus) * E, 0u);
  if (m.keep_demanded) d.demanded.assign(d.kept.size(), 0u);
  d.dropped_by_choice.assign(k, 0);

  // The cap the rows are cut at. For f < 0 it is the -f value: when the dropless capacity turns
  // out smaller, nothing exceeds it anyway, so cutting at the -f value gives the same counts.
  std::int64_t cap = std::numeric_limits<std::int64_t>::max();
  if (f != 0)
    cap = capacity_slots(f > 0 ? f : -f, m.top_k, m.tokens, m.num_experts, 0, capacity_multiple);

  std::int64_t max_demanded = 0;
  if (m.trace)
    m.trace_rows(d, iteration, layer, cap, max_demanded);
  else
    m.sampled_rows(d, iteration, layer, cap, max_demanded);
  d.max_demanded = max_demanded;
  d.capacity = capacity_slots(f, m.top_k, m.tokens, m.num_experts, max_demanded, capacity_multiple);
  for (const std::int64_t x : d.dropped_by_choice) d.dropped += x;
  return d;
}

bool WorkloadGenerator::round_capacity(IterationWorkload& w, int capacity_multiple) const {
  if (capacity_multiple < 1)
    throw InputError(fmt::format("workload: capacity multiple {} must be >= 1", capacity_multiple));
  if (w.capacity_multiple == capacity_multiple) return true;
  // Only from multiple 1: round_up(x, 1) = x <= round_up(x, m) for every m, so a cap that
  // dropped nothing stays a cap that drops nothing (from m0 > 1 the new cap can be smaller).
  if (w.capacity_multiple != 1) return false;
  for (const LayerDispatch& d : w.layers)
    if (d.dropped != 0) return false;
  const Impl& m = *impl_;
  for (LayerDispatch& d : w.layers)
    d.capacity = capacity_slots(d.capacity_factor, m.top_k, m.tokens, m.num_experts, d.max_demanded,
                                capacity_multiple);
  w.capacity_multiple = capacity_multiple;
  return true;
}

void WorkloadGenerator::set_keep_demanded(bool keep) { impl_->keep_demanded = keep; }

void WorkloadGenerator::set_cache(SampleCache* cache) { impl_->cache = cache; }

void WorkloadGenerator::set_count_distinct(bool count) { impl_->count_distinct = count; }

// ---------------------------------------------------------------------------------------------

struct SampleCache::Impl {
  std::mutex mutex;
  std::size_t max_bytes = 0;
  std::size_t bytes = 0;
  std::map<Key, Counts> entries;
  std::deque<Key> order;  // insertion order: the oldest is dropped first
  std::int64_t hits = 0, misses = 0;
};

SampleCache::SampleCache(std::size_t max_bytes) : impl_(std::make_unique<Impl>()) {
  impl_->max_bytes = max_bytes;
}
SampleCache::~SampleCache() = default;

bool SampleCache::Key::operator<(const Key& o) const {
  const auto scalars = [](const Key& k) {
    return std::tie(k.num_gpus, k.num_experts, k.top_k, k.tokens, k.distribution, k.skew, k.alpha,
                    k.seed, k.iteration, k.layer, k.node_limit, k.distinct_positions,
                    k.distinct_experts_per_gpu);
  };
  if (scalars(*this) != scalars(o)) return scalars(*this) < scalars(o);
  // Node-limited keys: the layouts, by content (generators of one scenario share the vectors, so
  // the same pointers are equal without comparing P entries).
  if (partitions == o.partitions && row_partition == o.row_partition) return false;
  static const std::vector<std::vector<std::uint32_t>> kNoParts;
  static const std::vector<std::uint32_t> kNoRows;
  const auto& pa = partitions ? *partitions : kNoParts;
  const auto& pb = o.partitions ? *o.partitions : kNoParts;
  if (pa != pb) return pa < pb;
  return (row_partition ? *row_partition : kNoRows) <
         (o.row_partition ? *o.row_partition : kNoRows);
}

std::int64_t SampleCache::hits() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->hits;
}

std::int64_t SampleCache::misses() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->misses;
}

SampleCache::Counts SampleCache::find(const Key& key) {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->entries.find(key);
  if (it == impl_->entries.end()) {
    ++impl_->misses;
    return nullptr;
  }
  ++impl_->hits;
  return it->second;
}

void SampleCache::insert(const Key& key, Counts counts) {
  MOESIM_ASSERT(counts != nullptr, "sample cache entries must hold counts");
  const std::size_t size = counts->size() * sizeof(std::uint32_t);
  std::lock_guard lock(impl_->mutex);
  if (size > impl_->max_bytes || !impl_->entries.emplace(key, std::move(counts)).second) return;
  impl_->order.push_back(key);
  impl_->bytes += size;
  while (impl_->bytes > impl_->max_bytes) {
    const auto oldest = impl_->entries.find(impl_->order.front());
    impl_->bytes -= oldest->second->size() * sizeof(std::uint32_t);
    impl_->entries.erase(oldest);
    impl_->order.pop_front();
  }
}

void WorkloadGenerator::set_threads(int threads) {
  if (threads < 0) throw InputError(fmt::format("workload: threads {} must be >= 0", threads));
  impl_->threads = threads;
}

IterationWorkload WorkloadGenerator::next(int iteration, int capacity_multiple) {
  IterationWorkload w;
  w.index = iteration;
  w.capacity_factor = capacity_factor(iteration);
  w.capacity_multiple = capacity_multiple;
  w.layers.reserve(static_cast<std::size_t>(impl_->num_layers));
  for (int l = 0; l < impl_->num_layers; ++l)
    w.layers.push_back(sample_layer(iteration, l, w.capacity_factor, capacity_multiple));
  return w;
}

}  // namespace moesim::workload
