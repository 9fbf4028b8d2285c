#include "strategies/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/gpu_catalog.hpp"
#include "topology/nic_catalog.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {

AlphaBeta AlphaBeta::through(double x1, double t1, double x2, double t2) {
  MOESIM_ASSERT(x1 != x2, "alpha-beta fit needs two distinct sizes");
  AlphaBeta ab;
  ab.beta_s = std::max(0.0, (t2 - t1) / (x2 - x1));
  ab.alpha_s = t2 - ab.beta_s * x2;
  if (ab.alpha_s < 0) {
    // A negative startup cost is not physical: take the line through the origin and (x2, t2).
    ab.alpha_s = 0;
    ab.beta_s = x2 != 0 ? t2 / x2 : 0;
  }
  return ab;
}

std::shared_ptr<const Calibration> scenario_calibration(const Scenario& sc) {
  const auto& c = sc.cluster;
  if (c.calibration_path.empty()) return nullptr;
  return load_calibration_cached(c.calibration_path, c.location_of("cluster.calibration"));
}

double calibrated_message_latency(const Calibration* cal, const ClusterSpec& cluster,
                                  double fallback) {
  if (cal == nullptr) return fallback;
  const TierCalibration* t0 = cal->tier(0);
  if (t0 == nullptr) return fallback;
  return std::max(0.0, t0->fit.alpha.value() - cluster.intra.latency.value());
}

double scenario_interference(const Scenario& sc) {
  if (const auto cal = scenario_calibration(sc); cal && cal->interference)
    return *cal->interference;
  return sc.engine.interference.value_or(topology::default_interference(sc.cluster.gpu));
}

double scenario_gemm_ceiling(const Scenario& sc) {
  return topology::default_gemm_ceiling(sc.cluster.gpu, sc.model.dtype);
}

collectives::NetworkParams scenario_network_params(const Scenario& sc) {
  collectives::NetworkParams net;
  net.message_latency_s = sc.engine.message_latency.value();
  net.message_overhead_s = sc.engine.message_overhead.value();
  const topology::PeerState nic = topology::nic_peer_state(sc.cluster);
  net.peer_cache = sc.engine.peer_cache.value_or(nic.peer_cache);
  net.peer_miss_overhead_s = sc.engine.peer_miss_overhead.value_or(nic.peer_miss_overhead).value();
  if (auto cal = scenario_calibration(sc)) {
    // The per-message latency the measured intra-node point-to-point alpha implies on top of the
    // topology's own latency; the measured per-collective lines for the analytical closed forms.
    net.message_latency_s =
        calibrated_message_latency(cal.get(), sc.cluster, net.message_latency_s);
    net.calibration = std::move(cal);
  }
  return net;
}

collectives::CostContext scenario_cost_context(const Scenario& sc, const topology::Topology& topo) {
  return collectives::CostContext{&topo, scenario_network_params(sc), BytesPerSecond(0)};
}

CostModel::CostModel(const Scenario& sc, const topology::Topology& topo, GemmModelParams gemm)
    : sc_(sc), topo_(topo), gemm_(gemm) {
  // The engine charges the scenario's launch overhead per kernel (apps/moesim/engine_setup).
  gemm_.launch_overhead = sc.engine.launch_overhead;
  gemm_.max_gemm_efficiency = scenario_gemm_ceiling(sc);
  cal_ = scenario_calibration(sc);
  if (cal_) gemm_cal_ = cal_->gemm;
  // The closed forms' per-message figures; a2a_time looks a measured line up itself.
  net_ = scenario_network_params(sc);
  net_.calibration = nullptr;
  interference_ = scenario_interference(sc);
  const auto& par = sc.parallelism;
  MOESIM_ASSERT(par.ep >= 1, "cost model needs a resolved EP group size");
  // Rank map of strategies/plan_builder.hpp: rank = ((d * ep + e) * esp + s) * mp + t; the EP
  // group of rank 0 has d = s = t = 0.
  ep_group_.reserve(par.ep);
  for (int e = 0; e < par.ep; ++e) ep_group_.push_back(par.rank_of(0, e, 0, 0));
  peak_ = peak_for(topo.gpu(), sc.model.dtype);
  hbm_ = topo.gpu().hbm_bandwidth;
  l2_ = topo.gpu().l2_cache;
  if (peak_.value() <= 0 && !gemm_cal_.beta_gemm_s_per_flop)
    throw InputError(topo.gpu().where, "cluster.gpu",
                     fmt::format("GPU '{}' has no peak compute rate for {}", topo.gpu().name,
                                 dtype_name(sc.model.dtype)));
}

bool CostModel::a2a_applicable(CollectiveAlgo algo) const {
  const collectives::Algorithm* a = collectives::find_algorithm(CollectiveType::kAllToAll, algo);
  if (a == nullptr) return false;
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.algo = algo;
  spec.bytes = Bytes(1 << 20);
  collectives::CollectiveCall call{&spec, &ep_group_, 0, false};
  return a->applicable(call, topo_);
}

Seconds CostModel::a2a_time(CollectiveAlgo algo, Bytes bytes_per_rank) const {
  const auto key = std::make_pair(static_cast<int>(algo), bytes_per_rank.value());
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = a2a_memo_.find(key);
    if (it != a2a_memo_.end()) return Seconds(it->second);
  }
  if (cal_ && algo != CollectiveAlgo::kAuto) {
    // A measured line for this algorithm over a group of this size replaces the closed form.
    const CollectiveCalibration* c =
        cal_->collective(CollectiveType::kAllToAll, algo, static_cast<int>(ep_group_.size()));
    if (c != nullptr) return Seconds(c->fit.time(bytes_per_rank.value()));
  }
  CollectiveSpec spec;
  spec.type = CollectiveType::kAllToAll;
  spec.algo = algo;
  spec.bytes = bytes_per_rank;
  collectives::CollectiveCall call{&spec, &ep_group_, 0, false};
  collectives::CostContext ctx;
  ctx.topo = &topo_;
  ctx.net = net_;
  // 0 = the GPU's HBM bandwidth, which is what the engine passes (sim/engine.cpp).
  ctx.local_copy_bandwidth = BytesPerSecond(0);
  const double t = collectives::select_algorithm(call, ctx).analytical_time(call, ctx).value();
  std::lock_guard<std::mutex> lock(mu_);
  if (a2a_memo_.size() > 4096) a2a_memo_.clear();  // bounded: sweeps call with many sizes
  a2a_memo_[key] = t;
  return Seconds(t);
}

AlphaBeta CostModel::a2a_fit(CollectiveAlgo algo, Bytes lo, Bytes hi) const {
  if (hi.value() <= lo.value()) hi = Bytes(lo.value() * 2 + 1);
  return AlphaBeta::through(lo.value(), a2a_time(algo, lo).value(), hi.value(),
                            a2a_time(algo, hi).value());
}

Seconds CostModel::gemm_time(const GemmShape& s, double flops_factor) const {
  // flops_factor: backward GEMMs do 2x the work on the same shapes (input and weight gradients);
  // their memory traffic is modelled as the forward's, as the compute model does.
  GemmWork w;
  w.m = static_cast<double>(s.m);
  w.n = static_cast<double>(s.n);
  w.k = static_cast<double>(s.k);
  w.batch = static_cast<double>(s.batch);
  w.flops = s.flops() * flops_factor;
  w.bytes = gemm_min_bytes(s, sc_.model.bytes_per_element(), l2_);
  return moesim::gemm_time(gemm_, gemm_cal_, peak_, hbm_, w);
}

GemmShape CostModel::expert_gemm_shape(double chunk_capacity, LayoutRole layout,
                                       int parallel_degree, bool second) const {
  // The plan builder's shapes (strategies/plan_builder.cpp, docs/model.md): tokens one GPU
  // processes per local expert are W sources x chunk slots x esp (gathered) x r (repeated), split
  // over the n / r replicas of its hidden slice H / (esp * r).
  const auto& md = sc_.model;
  const double w = sc_.parallelism.ep, esp = sc_.parallelism.esp;
  const int shards = md.expert_shards();
  const int rep = shards > 1 ? std::max(parallel_degree, 1) : 1;
  const double per_source = chunk_capacity * esp * rep;
  const auto hidden = static_cast<std::int64_t>(std::ceil(md.hidden_dim / (esp * rep)));
  GemmShape g;
  if (layout == LayoutRole::kFlexible) {
    g.m = static_cast<std::int64_t>(std::ceil(w / shards * per_source));
    g.batch = md.local_experts();
  } else {
    g.m = static_cast<std::int64_t>(std::ceil(per_source / shards));
    g.batch = static_cast<std::int64_t>(w) * md.local_experts();
    g.weights = md.local_experts();
  }
  g.k = second ? hidden : md.model_dim;
  g.n = second ? md.model_dim : md.fc1_width(hidden);  // SwiGLU's fc1 is 2x wide
  return g;
}

Seconds CostModel::expert_time(double chunk_capacity, LayoutRole layout, int parallel_degree,
                               double flops_factor) const {
  return gemm_time(expert_gemm_shape(chunk_capacity, layout, parallel_degree, false),
                   flops_factor) +
         gemm_time(expert_gemm_shape(chunk_capacity, layout, parallel_degree, true), flops_factor);
}

AlphaBeta CostModel::expert_fit(std::int64_t capacity, LayoutRole layout, int parallel_degree,
                                int r_lo, int r_hi, double flops_factor) const {
  const MoeLayerShape shape = layer_shape(capacity, parallel_degree);
  const double cap = static_cast<double>(capacity);
  r_lo = std::max(1, r_lo);
  r_hi = std::max(r_lo + 1, r_hi);
  const double x_big = shape.expert_work / r_lo, x_small = shape.expert_work / r_hi;
  return AlphaBeta::through(
      x_small, expert_time(cap / r_hi, layout, parallel_degree, flops_factor).value(), x_big,
      expert_time(cap / r_lo, layout, parallel_degree, flops_factor).value());
}

std::int64_t CostModel::capacity_for(double f, int multiple) const {
  const auto& md = sc_.model;
  if (f <= 0) f = 1.0;
  return workload::capacity_slots(f, md.top_k, md.tokens_per_gpu(), md.experts, 0,
                                  std::max(multiple, 1));
}

MoeLayerShape CostModel::layer_shape(std::int64_t capacity, int parallel_degree) const {
  const auto& md = sc_.model;
  const double w = sc_.parallelism.ep, esp = sc_.parallelism.esp;
  const int shards = md.expert_shards();
  const double rep = shards > 1 ? std::max(parallel_degree, 1) : 1;
  MoeLayerShape s;
  s.capacity = capacity;
  const double cap = static_cast<double>(capacity);
  // Each GPU sends dC padded slots for every one of the E experts, x esp (ESP-gathered tokens;
  // layout folded's ETP gathers after the dispatch instead) and x r (tokens repeated for the r
  // hidden slices of a sharded expert).
  const double gathered = sc_.parallelism.folded() ? 1.0 : esp;
  s.dispatch_bytes = Bytes(rep * gathered * static_cast<double>(md.experts) * cap * md.model_dim *
                           md.bytes_per_element());
  // Work per GPU: W sources x dC slots x local experts x M x H, an n-sharded expert's work shared
  // by its n GPUs (the same for every r: r times the tokens, 1/r of the hidden dimension).
  // (SwiGLU: 1.5x, its three M x H matrices)
  s.expert_work = w * cap * md.local_experts() / shards *
                  static_cast<double>(md.ffn_params(md.hidden_dim)) / 2.0;
  return s;
}

Bytes CostModel::expert_parameter_bytes() const {
  const auto& md = sc_.model;
  return Bytes(static_cast<double>(md.ffn_params(md.hidden_dim)) * md.bytes_per_element());
}

}  // namespace moesim::strategies
