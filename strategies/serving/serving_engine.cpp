#include "strategies/serving/serving_engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>

#include "core/error.hpp"
#include "strategies/model_params.hpp"
#include "strategies/plan_builder.hpp"
#include "topology/topology.hpp"

namespace moesim::serving {

namespace {

// Batches of more than this many tokens per GPU are priced at the nearest point of a geometric
// grid of kGridSteps points per doubling (half a step, about 2.2%, at most off).
constexpr double kExactTokens = 32;
constexpr double kGridSteps = 16;

long long grid_index(double x) { return std::llround(kGridSteps * std::log2(x)); }
double grid_value(long long index) { return std::exp2(static_cast<double>(index) / kGridSteps); }

int gpus_of(const Scenario& sc, const ServingPool& pool) {
  return pool.nodes * sc.cluster.gpus_per_node;
}

int clamp_int(long long v) { return static_cast<int>(std::min<long long>(v, INT_MAX)); }

}  // namespace

KvGeometry kv_geometry(const Scenario& sc, const ServingPool& pool, double gpu_memory_bytes) {
  const ModelSpec& m = sc.model;
  KvGeometry g;
  g.kv_bytes_per_token = strategies::kv_cache_bytes_per_token(m, sc.serving->kv_dtype, 1) *
                         static_cast<double>(m.layers);
  const strategies::ModelParams p = strategies::model_params(m);
  // Attention DP: every GPU holds the dense weights whole, and the experts of its EP rank. GEMM
  // weights are stored in the GEMMs' precision (fp8 serving keeps fp8 weights), the embedding,
  // LM head and norms in model.dtype.
  const double slots = static_cast<double>(m.experts + pool.redundant_experts) / m.experts;
  const double linear = p.attention + p.dense_ffn + p.gates + p.shared_experts +
                        p.routed_experts * slots / static_cast<double>(pool.ep);
  const double other = p.embedding + p.lm_head + p.norms;
  g.weights_bytes = linear * dtype_bytes(m.precision.gemm) + other * dtype_bytes(m.dtype);
  g.hbm_bytes = gpu_memory_bytes;
  g.usable_bytes = gpu_memory_bytes * pool.memory_utilization;
  if (pool.kv_tokens_per_gpu > 0) {
    g.kv_tokens = pool.kv_tokens_per_gpu;
    return g;
  }
  const double left = g.usable_bytes - g.weights_bytes;
  g.kv_tokens = left > 0 ? static_cast<long long>(left / g.kv_bytes_per_token) : 0;
  if (g.kv_tokens < pool.block_tokens)
    throw InputError(
        pool.where, pool.key,
        fmt::format("the weights take {:.1f} GiB of a GPU's {:.1f} GiB x memory_utilization {} = "
                    "{:.1f} GiB (the experts over ep = {}), leaving no room for a KV block of {} "
                    "tokens x {:.0f} bytes: expected a larger ep or more nodes per instance",
                    g.weights_bytes / (1 << 30), g.hbm_bytes / (1 << 30), pool.memory_utilization,
                    g.usable_bytes / (1 << 30), pool.ep, pool.block_tokens, g.kv_bytes_per_token));
  return g;
}

Scenario instance_scenario(const Scenario& sc, const ServingPool& pool) {
  Scenario s = sc;
  s.serving.reset();
  s.cluster.nodes = pool.nodes;
  ModelSpec& m = s.model;
  m.mode = Mode::kInference;
  m.capacity_factor = 0;  // servers drop no token
  m.micro_batches = 1;
  m.recompute = RecomputeSpec{};
  m.batch_per_gpu = 1;
  m.seq_len = 1;
  m.serving_kv_dtype = sc.serving->kv_dtype;
  const int gpus = gpus_of(sc, pool);
  ParallelismSpec p;
  p.ep = pool.ep;
  p.dp = gpus / pool.ep;
  // Redundant experts are more expert slots the routing spreads the tokens over, as a load
  // balancer placing the copies keeps each slot's share even (docs/serving.md).
  m.experts += pool.redundant_experts;
  m.experts_per_gpu = m.experts / pool.ep;
  s.parallelism = p;
  s.workload.iterations = 1;
  s.workload.capacity = CapacityWorkloadSpec{};
  return s;
}

struct IterationPricer::Impl {
  Scenario base;
  StrategySpec spec;
  InstanceBackend ib;
  int gpus = 1;
  int moe_blocks = 0, dense_blocks = 0;
  // Per token bucket: the attention core's time and the price of the batch first priced there.
  struct Priced {
    double core_s = 0, price_s = 0;
  };
  std::map<long long, Priced> cache;

  double step(const Scenario& s) const {
    strategies::StackRun r = strategies::run_stack(s, spec, *ib.topology, ib.backend, 1);
    return r.iterations.at(0).step_time_s;
  }
  // The blocks a model of `moe` and `dense` blocks runs, and the head when `vocab`.
  Scenario blocks(const Scenario& s, int dense, bool vocab) const {
    Scenario b = s;
    b.model.layers = 1 + dense;
    b.model.first_dense_layers = dense;
    b.model.moe_every = 1;
    b.model.mtp_layers = 0;
    if (!vocab) b.model.vocab_size = 0;
    return b;
  }
  double price(long long tokens, double decode_pairs, double prefill_pairs, double kv) const {
    Scenario s = base;
    ModelSpec& m = s.model;
    m.batch_per_gpu = static_cast<int>(tokens);
    m.serving_decode_pairs = decode_pairs;
    m.serving_prefill_pairs = prefill_pairs;
    m.serving_kv_read_tokens = kv;
    const double moe = step(blocks(s, 0, false));
    double total = moe_blocks * moe;
    if (dense_blocks > 0) total += dense_blocks * (step(blocks(s, 1, false)) - moe);
    if (m.vocab_size > 0) total += step(blocks(s, 0, true)) - moe;
    return total;
  }
};

IterationPricer::IterationPricer(const Scenario& instance, const StrategySpec& spec,
                                 const MakeInstanceBackend& make)
    : impl_(std::make_unique<Impl>()) {
  impl_->base = instance;
  impl_->spec = spec;
  impl_->ib = make(instance);
  impl_->gpus = instance.num_gpus();
  impl_->moe_blocks = instance.model.num_moe_layers();
  impl_->dense_blocks = instance.model.layers - impl_->moe_blocks;
}
IterationPricer::~IterationPricer() = default;

double IterationPricer::price_per_gpu(long long tokens_per_gpu, double decode_pairs,
                                      double prefill_pairs, double kv_read_tokens) {
  return impl_->price(tokens_per_gpu, decode_pairs, prefill_pairs, kv_read_tokens);
}

double IterationPricer::operator()(const BatchShape& batch) {
  const double g = impl_->gpus;
  const double t = (batch.decode_tokens + batch.prefill_tokens) / g;
  if (t <= 0) return 0;
  // Every attention rank runs the layer together (the MoE layer synchronises them), so a batch
  // thinner than one token per GPU still costs a token's iteration.
  const long long ti = t <= kExactTokens ? static_cast<long long>(std::ceil(t)) : -grid_index(t);
  const long long tokens = ti > 0 ? ti : std::llround(grid_value(-ti));
  ModelSpec m = impl_->base.model;
  m.serving_decode_pairs = static_cast<double>(batch.decode_pairs) / g;
  m.serving_prefill_pairs = batch.prefill_pairs / g;
  m.serving_kv_read_tokens = static_cast<double>(batch.context_tokens) / g;
  const strategies::ServingCore c = strategies::serving_attention_core(m, tokens, 1);
  ComputeSpec core;
  core.cls = ComputeClass::kAttention;
  core.flops = Flops(c.flops);
  core.bytes = Bytes(c.bytes);
  core.gemm = c.shape;
  const double core_s = impl_->ib.kernel_seconds(core);
  auto it = impl_->cache.find(ti);
  if (it == impl_->cache.end()) {
    const double s = impl_->price(tokens, m.serving_decode_pairs, m.serving_prefill_pairs,
                                  m.serving_kv_read_tokens);
    it = impl_->cache.emplace(ti, Impl::Priced{core_s, s}).first;
  }
  // A forward pass runs its blocks' attention cores one after the other, nothing beside them:
  // another batch of the bucket differs by its cores' time, once per block.
  return it->second.price_s + impl_->base.model.layers * (core_s - it->second.core_s);
}

long long IterationPricer::evaluations() const {
  return static_cast<long long>(impl_->cache.size());
}

namespace {

PoolReport pool_report(const Scenario& sc, const ServingPool& pool, double gpu_memory) {
  PoolReport r;
  r.key = pool.key;
  r.nodes = pool.nodes;
  r.instances = pool.instances;
  r.gpus_per_instance = gpus_of(sc, pool);
  r.ep = pool.ep;
  r.kv = kv_geometry(sc, pool, gpu_memory);
  const long long g = r.gpus_per_instance;
  r.config.kv_capacity_tokens = r.kv.kv_tokens * g;
  r.config.block_tokens = pool.block_tokens;
  r.config.max_batch_tokens = clamp_int(pool.max_batch_tokens * g);
  r.config.max_running = clamp_int(pool.max_running * g);
  r.config.instances = pool.instances;
  return r;
}

// A request lives on one attention rank: its prompt and output must fit one GPU's KV cache.
void check_fits(const std::vector<workload::Request>& reqs, const PoolReport& pool,
                const ServingPool& spec, bool prompt_only) {
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const long long need =
        reqs[i].prompt_tokens + (prompt_only ? 1LL : static_cast<long long>(reqs[i].output_tokens));
    if (need > pool.kv.kv_tokens)
      throw InputError(
          spec.where, spec.key,
          fmt::format("request {} needs {} KV tokens ({} prompt + {} output), one GPU of the pool "
                      "holds {} ({:.1f} GiB after {:.1f} GiB of weights): expected a shorter "
                      "request, a larger ep or a larger kv_tokens_per_gpu",
                      i, need, reqs[i].prompt_tokens, prompt_only ? 1 : reqs[i].output_tokens,
                      pool.kv.kv_tokens, pool.kv.kv_tokens * pool.kv.kv_bytes_per_token / (1 << 30),
                      pool.kv.weights_bytes / (1 << 30)));
  }
}

}  // namespace

ServingReport run_serving(const Scenario& sc, const StrategySpec& spec,
                          const topology::Topology& cluster, const MakeInstanceBackend& make) {
  MOESIM_ASSERT(sc.serving.has_value(), "run_serving without a serving section");
  const ServingSpec& sv = *sc.serving;
  const std::vector<workload::Request> reqs = workload::make_requests(sv.requests);
  const double memory = cluster.gpu().memory.value();
  const Slo slo{sv.slo_ttft.value(), sv.slo_tpot.value()};
  ServingReport out;
  out.strategy = spec.name;
  out.disaggregated = sv.disaggregated;
  out.requests = workload::request_stats(reqs);
  double input_nodes = 0, output_nodes = 0;
  if (!sv.disaggregated) {
    PoolReport pool = pool_report(sc, sv.instance, memory);
    check_fits(reqs, pool, sv.instance, false);
    IterationPricer price(instance_scenario(sc, sv.instance), spec, make);
    pool.result = simulate_continuous_batching(reqs, pool.config,
                                               [&](const BatchShape& b) { return price(b); });
    pool.priced_batches = price.evaluations();
    out.overall = pool.result;
    input_nodes = output_nodes = static_cast<double>(pool.nodes) * pool.instances;
    out.pools.push_back(std::move(pool));
  } else {
    PoolReport pre = pool_report(sc, sv.prefill, memory);
    PoolReport dec = pool_report(sc, sv.decode, memory);
    check_fits(reqs, pre, sv.prefill, true);
    check_fits(reqs, dec, sv.decode, false);
    IterationPricer pre_price(instance_scenario(sc, sv.prefill), spec, make);
    IterationPricer dec_price(instance_scenario(sc, sv.decode), spec, make);
    // The KV leaves the prefill GPU for a decode GPU on another node: one GPU's share of its
    // NIC, on the route's latency (transfers are not modelled as contending with each other).
    const int gpn = sc.cluster.gpus_per_node;
    const topology::PairCost route =
        cluster.num_gpus() > gpn ? cluster.pair_cost(0, gpn) : cluster.pair_cost(0, gpn > 1);
    const double per_token = pre.kv.kv_bytes_per_token;
    const KvTransferTime transfer = [&](const workload::Request& r) {
      return route.alpha.value() + r.prompt_tokens * per_token * route.beta();
    };
    DisaggregatedResult d = simulate_disaggregated(
        reqs, pre.config, [&](const BatchShape& b) { return pre_price(b); }, dec.config,
        [&](const BatchShape& b) { return dec_price(b); }, transfer);
    pre.result = std::move(d.prefill);
    dec.result = std::move(d.decode);
    pre.priced_batches = pre_price.evaluations();
    dec.priced_batches = dec_price.evaluations();
    out.overall = std::move(d.overall);
    double sum = 0;
    for (const auto& r : reqs) sum += transfer(r);
    out.kv_transfer_mean_s = reqs.empty() ? 0 : sum / static_cast<double>(reqs.size());
    input_nodes = static_cast<double>(pre.nodes) * pre.instances;
    output_nodes = static_cast<double>(dec.nodes) * dec.instances;
    out.pools.push_back(std::move(pre));
    out.pools.push_back(std::move(dec));
  }
  out.metrics = serving_metrics(reqs, out.overall, slo);
  if (!reqs.empty()) {
    double start = reqs[reqs.size() / 10].arrival_s, end = reqs.back().arrival_s;
    if (!(end > start)) {  // too few arrivals for a steady window: the whole run
      start = reqs.front().arrival_s;
      end = start + out.overall.makespan_s;
    }
    const ServingResult& in = out.pools.front().result;  // co-located: the one pool
    const ServingResult& gen = out.pools.back().result;
    out.window = window_throughput(in, start, end);
    out.window.output_tokens_per_s = window_throughput(gen, start, end).output_tokens_per_s;
  }
  out.input_tokens_per_s_per_node = out.window.input_tokens_per_s / input_nodes;
  out.output_tokens_per_s_per_node = out.window.output_tokens_per_s / output_nodes;
  out.output_tokens_per_s_per_user =
      out.metrics.tpot_s.mean > 0 ? 1.0 / out.metrics.tpot_s.mean : 0;
  return out;
}

}  // namespace moesim::serving
