#include "sim/analytical_model.hpp"

#include <algorithm>

#include "core/calibration.hpp"
#include "core/error.hpp"
#include "topology/topology.hpp"

namespace moesim::sim {

collectives::CostContext make_cost_context(const topology::Topology& topo,
                                           const NetworkParams& params,
                                           BytesPerSecond local_copy_bandwidth) {
  collectives::CostContext ctx;
  ctx.topo = &topo;
  ctx.net = params;
  ctx.local_copy_bandwidth = local_copy_bandwidth;
  return ctx;
}

const CollectiveCalibration* measured_line(const collectives::CollectiveCall& call,
                                           const collectives::Algorithm& algorithm,
                                           const collectives::CostContext& ctx) {
  if (!ctx.net.calibration) return nullptr;
  return ctx.net.calibration->collective(algorithm.type(), algorithm.algo(),
                                         static_cast<int>(call.group->size()));
}

AnalyticalCollective analytical_collective_time(const collectives::CollectiveCall& call,
                                                const collectives::CostContext& ctx) {
  AnalyticalCollective out;
  out.algorithm = &collectives::select_algorithm(call, ctx);
  if (const CollectiveCalibration* line = measured_line(call, *out.algorithm, ctx)) {
    out.time = Seconds(line->fit.time(call.spec->bytes.value()));
  } else {
    out.time = out.algorithm->analytical_time(call, ctx);
  }
  MOESIM_ASSERT(out.time.value() >= 0, "negative analytical collective time");
  return out;
}

AnalyticalModel::AnalyticalModel(const topology::Topology& topo, NetworkParams params)
    : topo_(topo), params_(params) {
  const size_t p = static_cast<size_t>(topo.num_gpus());
  send_busy_.assign(p, 0);
  recv_busy_.assign(p, 0);
  send_alpha_.assign(p, 0);
  recv_alpha_.assign(p, 0);
  seen_.assign(p, 0);
}

double AnalyticalModel::batch_time(const std::vector<Transfer>& transfers) const {
  if (transfers.empty()) return 0;
  touched_.clear();
  const bool per_peer = params_.peer_cache > 0;
  if (per_peer) senders_.count(transfers);
  for (const Transfer& t : transfers) {
    MOESIM_ASSERT(t.src >= 0 && t.src < topo_.num_gpus() && t.dst >= 0 && t.dst < topo_.num_gpus(),
                  "transfer names a GPU outside the topology");
    double alpha = 0,
           cost = per_peer ? params_.overhead_s(senders_[t.src]) : params_.message_overhead_s;
    if (t.src != t.dst) {
      // A GPU sending to itself is a local copy inside the collective: no network time.
      auto pc = topo_.pair_cost(t.src, t.dst);
      alpha = pc.alpha.value();
      cost += t.bytes / pc.bandwidth.value();
    }
    for (int g : {t.src, t.dst}) {
      if (!seen_[g]) seen_[g] = 1, touched_.push_back(g);
    }
    send_busy_[t.src] += cost;
    send_alpha_[t.src] = std::max(send_alpha_[t.src], alpha);
    recv_busy_[t.dst] += cost;
    recv_alpha_[t.dst] = std::max(recv_alpha_[t.dst], alpha);
  }
  double worst = 0;
  for (int g : touched_) {
    worst = std::max({worst, send_alpha_[g] + send_busy_[g], recv_alpha_[g] + recv_busy_[g]});
    send_busy_[g] = recv_busy_[g] = send_alpha_[g] = recv_alpha_[g] = 0;
    seen_[g] = 0;
  }
  return params_.message_latency_s + worst;
}

BatchId AnalyticalModel::start_batch(double now_s, const std::vector<Transfer>& transfers,
                                     int /*priority*/) {
  BatchId id = next_id_++;
  pending_.emplace(now_s + batch_time(transfers), id);
  return id;
}

double AnalyticalModel::next_completion_time() {
  return pending_.empty() ? kNever : pending_.top().first;
}

std::vector<BatchCompletion> AnalyticalModel::advance_to(double t) {
  std::vector<BatchCompletion> done;
  while (!pending_.empty() && pending_.top().first <= t) {
    done.push_back({pending_.top().second, pending_.top().first});
    pending_.pop();
  }
  std::sort(done.begin(), done.end(),
            [](const BatchCompletion& a, const BatchCompletion& b) { return a.id < b.id; });
  return done;
}

}  // namespace moesim::sim
