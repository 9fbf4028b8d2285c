// The `analytical` network path: closed-form alpha-beta costs; collectives take turns on NICs.
//
// Two levels:
//  - Whole collectives: with EngineConfig::network == analytical the engine never lowers a
//    collective into transfers; each group's collective takes
//    select_algorithm(call, ctx).analytical_time(call, ctx) from the collective library, as if it
//    ran alone on the cluster, except that a group spanning nodes first waits until its members'
//    NICs are free of the analytical collectives started before it (EngineConfig::
//    analytical_nic_sharing): a pipeline's dispatch and combine chunks, or an all-reduce beside
//    an all-to-all, follow one another instead of overlapping for free. How they share a link
//    while both run (and Lina's priorities) stays the flow model's. A
//    collective alone does pay an oversubscribed fabric: the closed forms take the max with the
//    fabric cut bound (topology/fabric_cuts.hpp: bytes leaving a leaf / pod / group over its
//    uplinks), so a 4:1 tree is no longer priced like a 1:1 one; imbalance inside a cut (d-mod-k
//    or hash collisions) stays the flow model's.
//  - Batches: AnalyticalModel is also a NetworkModel, so lowered phases can be costed in closed
//    form (tests, quick what-ifs, and a contention-free reference for the flow model). Each GPU
//    sends and receives its messages back to back at the pair's bottleneck bandwidth and pays
//    the route latency once:
//      batch_time = max over GPUs g of [ max alpha of g's messages + message_latency
//                                        + sum over g's messages (message_overhead + bytes / bw) ]
//    where the messages of g are those it sends, or those it receives, whichever costs more;
//    alpha and bw come from Topology::pair_cost. Batches never share anything.
#pragma once

#include <queue>
#include <vector>

#include "core/calibration.hpp"
#include "sim/network_model.hpp"
#include "strategies/collectives/collective.hpp"

namespace moesim::sim {

/// The cost context the collective library reads for the analytical formulas.
collectives::CostContext make_cost_context(const topology::Topology& topo,
                                           const NetworkParams& params,
                                           BytesPerSecond local_copy_bandwidth);

/// The calibration file's measured line for this call (ctx.net.calibration's `collectives` entry
/// with the resolved algorithm's type and algo over a group of the call's size), or nullptr.
/// Groups of another size than the measured one get no line: they keep the closed form, whose
/// bandwidths are the calibrated topology's (topology/calibrated.hpp) and whose per-message
/// latency is the calibrated one, so they still scale with the measured per-tier rates.
const CollectiveCalibration* measured_line(const collectives::CollectiveCall& call,
                                           const collectives::Algorithm& algorithm,
                                           const collectives::CostContext& ctx);

/// Time of one group's collective on the analytical path, and the algorithm it resolved to:
/// measured_line's alpha + beta x CollectiveSpec::bytes when there is one, else the algorithm's
/// closed form. `auto` resolves on the closed forms (as the executor resolves it), so the
/// algorithm priced by a measured line is the one that would run.
struct AnalyticalCollective {
  const collectives::Algorithm* algorithm = nullptr;
  Seconds time{0};
};
AnalyticalCollective analytical_collective_time(const collectives::CollectiveCall& call,
                                                const collectives::CostContext& ctx);

class AnalyticalModel final : public NetworkModel {
 public:
  AnalyticalModel(const topology::Topology& topo, NetworkParams params);
  std::string_view name() const override { return "analytical"; }
  BatchId start_batch(double now_s, const std::vector<Transfer>& transfers,
                      int priority = 0) override;
  double next_completion_time() override;
  std::vector<BatchCompletion> advance_to(double t) override;

  /// The closed-form duration of a batch (what start_batch adds to now).
  double batch_time(const std::vector<Transfer>& transfers) const;

 private:
  const topology::Topology& topo_;
  NetworkParams params_;
  BatchId next_id_ = 0;
  using Pending = std::pair<double, BatchId>;  // (completion time, id)
  std::priority_queue<Pending, std::vector<Pending>, std::greater<>> pending_;
  // Scratch, per GPU: busy time as sender / receiver and the largest alpha seen.
  mutable std::vector<double> send_busy_, recv_busy_, send_alpha_, recv_alpha_;
  mutable std::vector<char> seen_;
  mutable std::vector<int> touched_;
  mutable SenderMessages senders_;
};

}  // namespace moesim::sim
