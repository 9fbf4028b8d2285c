#include "strategies/workload/workload.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <optional>
#include <thread>

#include "core/error.hpp"
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
  int threads = 0;  // 0: hardware concurrency

  // Applies capacity `cap` to one GPU's per-choice counts (counts[j * E + e]) and fills row i;
  // accumulates the row's drops per choice and its largest demand.
  void fill_row(LayerDispatch& d, int gpu, const std::uint32_t* counts, std::int64_t cap,
                std::int64_t& max_demanded, std::int64_t* dropped_by_choice) const;
};

std::vector<double> WorkloadGenerator::Impl::popularity(int iteration, int layer) {
  switch (routing.distribution) {
    case RoutingDistribution::kUniform:
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
  std::uint32_t* demanded = d.demanded.data() + static_cast<std::size_t>(gpu) * E;
  std::uint32_t by_choice[64];
  std::uint32_t kept_by_choice[64];
  for (std::size_t e = 0; e < E; ++e) {
    std::int64_t demand = 0;
    for (std::size_t j = 0; j < k; ++j) demand += counts[j * E + e];
    MOESIM_ASSERT(demand <= std::numeric_limits<std::uint32_t>::max(),
                  "per-pair demand exceeds 32-bit counts");
    demanded[e] = static_cast<std::uint32_t>(demand);
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
  d.demanded.assign(d.kept.size(), 0u);
  d.dropped_by_choice.assign(k, 0);

  // The cap the rows are cut at. For f < 0 it is the -f value: when the dropless capacity turns
  // out smaller, nothing exceeds it anyway, so cutting at the -f value gives the same counts.
  std::int64_t cap = std::numeric_limits<std::int64_t>::max();
  if (f != 0)
    cap = capacity_slots(f > 0 ? f : -f, m.top_k, m.tokens, m.num_experts, 0, capacity_multiple);

  std::int64_t max_demanded = 0;
  if (m.trace) {
    std::vector<std::uint32_t> counts(k * E, 0u);
    const auto& entries = m.trace->entries[static_cast<std::size_t>(
        (iteration % m.trace->num_iterations) * m.num_layers + layer)];
    // Entries are sorted by GPU: fill one GPU's counts, emit its row, clear what was touched.
    for (std::size_t a = 0; a < entries.size();) {
      const int gpu = entries[a].gpu;
      std::size_t b = a;
      for (; b < entries.size() && entries[b].gpu == gpu; ++b)
        counts[static_cast<std::size_t>(entries[b].choice) * E +
               static_cast<std::size_t>(entries[b].expert)] = entries[b].count;
      m.fill_row(d, gpu, counts.data(), cap, max_demanded, d.dropped_by_choice.data());
      for (std::size_t x = a; x < b; ++x)
        counts[static_cast<std::size_t>(entries[x].choice) * E +
               static_cast<std::size_t>(entries[x].expert)] = 0;
      a = b;
    }
  } else {
    const ChoiceSampler sampler(m.popularity(iteration, layer), m.num_experts, m.top_k, m.tokens);
    // Rows are independent (one substream per GPU) and written to disjoint memory, so threads
    // split the GPUs into contiguous blocks; per-thread maxima and drop counts are merged in
    // thread order. Small layers stay on the calling thread.
    int threads = m.threads > 0
                      ? m.threads
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const std::int64_t work = static_cast<std::int64_t>(m.num_gpus) * m.tokens * m.top_k;
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
        std::vector<std::uint32_t> scratch(k * E, 0u);
        const int begin = static_cast<int>(static_cast<std::int64_t>(m.num_gpus) * t / threads);
        const int end = static_cast<int>(static_cast<std::int64_t>(m.num_gpus) * (t + 1) / threads);
        for (int gpu = begin; gpu < end; ++gpu) {
          Xoshiro256 rng(
              substream_key(m.routing.seed, Stream::kTokens, static_cast<std::uint64_t>(iteration),
                            static_cast<std::uint64_t>(layer), static_cast<std::uint64_t>(gpu)));
          sampler.sample(rng, scratch);
          m.fill_row(d, gpu, scratch.data(), cap, out.max_demanded, out.dropped_by_choice.data());
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
  }
  d.capacity = capacity_slots(f, m.top_k, m.tokens, m.num_experts, max_demanded, capacity_multiple);
  for (const std::int64_t x : d.dropped_by_choice) d.dropped += x;
  return d;
}

void WorkloadGenerator::set_threads(int threads) {
  if (threads < 0) throw InputError(fmt::format("workload: threads {} must be >= 0", threads));
  impl_->threads = threads;
}

IterationWorkload WorkloadGenerator::next(int iteration, int capacity_multiple) {
  IterationWorkload w;
  w.index = iteration;
  w.capacity_factor = capacity_factor(iteration);
  w.layers.reserve(static_cast<std::size_t>(impl_->num_layers));
  for (int l = 0; l < impl_->num_layers; ++l)
    w.layers.push_back(sample_layer(iteration, l, w.capacity_factor, capacity_multiple));
  return w;
}

}  // namespace moesim::workload
