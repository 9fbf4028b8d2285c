// The `flow` network model, the default engine (docs/design.md §4.1): a fluid model in which every
// transfer is one flow along its route over directed links, waits its route latency, then shares
// link capacity max-min fairly with the other moving flows (water-filling). Its semantics are
// normative: the simgrid model implements the same. It scales to 4,096 GPUs and millions of
// concurrent flows: flows live in flat per-batch arrays, identical transfers are aggregated, and
// an event re-solves only the flows whose rates it can change.
//
// Semantics, data layout, incremental events, cost and lookahead: docs/engines.md, sections
// "Semantics" and "The flow model".
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "sim/network_model.hpp"
#include "topology/topology.hpp"

namespace moesim::sim {

/// Counters and wall-clock timers of one FlowModel, for benchmarks and profiling.
struct FlowModelStats {
  std::int64_t transfers = 0;          // transfers with src != dst handed to start_batch
  std::int64_t flows = 0;              // flow entries after aggregating identical transfers
  std::int64_t events = 0;             // internal events processed (replays included)
  std::int64_t solves = 0;             // max-min recomputations
  std::int64_t partial_solves = 0;     // of which re-solved only the flows an event can affect
  std::int64_t partial_fallbacks = 0;  // partial solves redone in full (rounding check failed)
  std::int64_t kept_segments = 0;      // moving batches a partial solve left alone (unreachable)
  std::int64_t resolved_flows = 0;     // flow entries (re)rated over all solves
  std::int64_t levels = 0;             // water-filling levels over all solves
  std::int64_t scan_levels = 0;        // levels resolved by a sequential scan instead of the CSR
  std::int64_t checkpoints = 0;  // checkpoints taken before simulating past the engine's clock
  std::int64_t restores = 0;     // rewinds to a checkpoint (start_batch inside a lookahead)
  std::int64_t csr_builds = 0;   // segments whose link -> flows lists were built
  double build_s = 0;            // start_batch: aggregation, routing, CSR index
  double advance_s = 0;          // moving flows between events, finish and start detection
  double solve_s = 0;            // water-filling
  double checkpoint_s = 0;       // taking and restoring checkpoints
};

/// How concurrent transfers share a link (engine.flow.sharing).
/// - kPerFlow: plain max-min, every flow one party (SimGrid's per-flow model, the reference).
/// - kPerCollective: weighted max-min in which each batch (one phase of one collective) is one
///   party on its most crowded link: all its flows weigh 1 / the number of its flows on that link.
///   Inside a batch sharing stays per flow (a batch alone is rated exactly as kPerFlow). NCCL
///   runs every collective on channels and queue pairs of its own, and a concurrent all-reduce
///   slows an all-to-all by ~1.83x on Lina's testbed (docs/validation.md V1), not the ~1.08x
///   per-flow sharing gives when the all-to-all's many flows crowd out the ring's one flow per NIC.
enum class FlowSharing { kPerFlow, kPerCollective };

/// Knobs of the flow model beyond the shared NetworkParams.
struct FlowModelOptions {
  /// Flows finishing (or starting to move) within this fraction of max(the time their batch has
  /// run, a lower bound on the batch's duration) are handled now, in one recomputation. Relative
  /// to the batch, not to the absolute clock: a slack of tolerance x t would release whole
  /// collectives early deep into a long run. The duration bound (least route latency + the most
  /// loaded link's bytes / capacity) keeps the early finishes of a skewed batch from being an
  /// event each. 1e-9 (this struct's default) is the exact model; scenarios default to 3e-3
  /// (engine.flow.event_tolerance, docs/engines.md). Larger values cut the events when every flow
  /// finishes at its own time (skewed sizes, hash-based ECMP collisions). A flow finished early
  /// releases its bandwidth early, but its batch completes when its last byte arrives under the
  /// rates in force (a deferred completion event), so batch times are not cut short. The window
  /// is centred on its event (refresh_next_finish), so flows finish up to half of it late or
  /// early and the errors cancel. Tested bound (empirical): every batch within 0.75 x the
  /// tolerance (relative) of the exact model on skewed all-to-allv traffic
  /// (tests/sim/flow_model_test.cpp, EventToleranceErrorIsBounded...).
  double event_tolerance = 1e-9;
  FlowSharing sharing = FlowSharing::kPerFlow;
  /// Re-solve only the batches an event can reach through shared links (see solve()); false
  /// re-solves every batch's flows above the event's level. Exact either way; the switch is for
  /// tests and benchmarks.
  bool split_components = true;
};

class FlowModel final : public NetworkModel {
 public:
  /// `topo` must outlive the model. Every link must have a positive bandwidth.
  explicit FlowModel(const topology::Topology& topo, NetworkParams params = {},
                     FlowModelOptions options = {});
  ~FlowModel() override;
  FlowModel(const FlowModel&) = delete;
  FlowModel& operator=(const FlowModel&) = delete;

  std::string_view name() const override { return "flow"; }
  /// Throws InputError for a transfer with a rank outside the topology or negative / non-finite
  /// bytes. `priority` is ignored (max-min fairness treats all flows alike).
  BatchId start_batch(double now_s, const std::vector<Transfer>& transfers,
                      int priority = 0) override;
  double next_completion_time() override;
  double next_completion_time_before(double horizon) override;
  std::vector<BatchCompletion> advance_to(double t) override;
  /// Bytes (payload plus per-message overhead bytes) carried per directed link up to the last
  /// processed event; exact whenever the model stands at a completion time it has returned.
  std::vector<double> link_bytes() const override;

  const FlowModelStats& stats() const { return stats_; }
  /// Flow entries currently held (pending, moving or done in batches not yet retired).
  std::int64_t num_flow_entries() const;

 private:
  struct Segment;

  double next_event_time() const;
  // Processes everything that happens at time t >= sim_t_ (flows advanced, finished, started;
  // rates recomputed if the moving set changed) and returns the batches completed at t.
  std::vector<BatchId> process_event(double t);
  // Water-filling. Moving flows whose rate is below `keep_below` keep it (the event cannot change
  // it); the others are re-solved on the capacity left. keep_below <= 0: everything.
  void solve(double keep_below);
  // solve()'s parts, in order. The flows to re-solve (Segment::resolve, by id, stamped) and the
  // links they cross, with the capacity the kept flows leave; returns their route entries.
  double gather_resolved(bool partial, double keep_thr, std::uint32_t stamp);
  // Marks (Segment::reached) the segments the event's touched ones reach through shared links:
  // the only ones whose rates it can change.
  void mark_reached();
  // The links unrated flows cross, with their fair shares (act_links_, act_share_).
  void build_active_links();
  // One level: rates the unrated flows crossing a bottleneck_ link at `share`, through the CSR
  // lists or by a scan of the flows still unrated (returns their route entries).
  void rate_level_by_csr(double share, std::uint32_t stamp);
  double rate_level_by_scan(double share, std::uint32_t stamp);
  void assign(Segment& g, std::uint32_t i, double share, std::uint32_t stamp);
  // The links the level's rated flows cross: shares refreshed, links without unrated flows out.
  void refresh_dirty_links();
  // load_ from the residual capacities; rated flows into the rate orders and finish heaps.
  void finish_solve();
  double share_of(topology::LinkId l) const { return std::max(w_[l].rem, 0.0) / w_[l].cnt; }
  // For the flows in started_: a level below which their arrival changes no rate. Adds their
  // copies to moving_cnt_.
  double start_bound();
  // Earliest valid finish over the segments' heaps (stale entries dropped).
  void refresh_next_finish();
  /// How far after time t segment `g`'s flows may be due and still finish at t: half the window
  /// of a coarse event_tolerance (centred on the event), the whole of the exact model's.
  double finish_slack(const Segment& g, double t) const;
  /// Refills segment `g`'s finish heap from its moving flows (Segment::finish); false when none
  /// has a rate yet.
  bool refill_finish(Segment& g);
  // Brings link_bytes_[l] up to sim_t_ (before load_[l] changes).
  void flush_link(topology::LinkId l);
  void materialize(double now_s);
  void take_checkpoint();
  void restore_checkpoint();
  // The engine's clock caught up with the internal state: drop the checkpoint, retire batches.
  void commit();
  void add_moving(const Segment& g, std::uint32_t i, double sign);
  void ensure_csr(Segment& g);

  const topology::Topology& topo_;
  NetworkParams params_;
  FlowModelOptions options_;
  std::vector<double> cap_;      // per link, bytes/s
  std::vector<double> latency_;  // per link, s

  std::vector<std::unique_ptr<Segment>> segments_;
  BatchId next_id_ = 0;
  double committed_ = 0;     // the engine's clock (last start_batch / advance_to time)
  double sim_t_ = 0;         // time of the internal state; ahead of committed_ during lookahead
  std::uint32_t stamp_ = 0;  // current solve; a flow with this stamp has its rate in it
  std::vector<double> moving_cnt_;  // per link: weight of the moving flow copies crossing it
  std::vector<double> load_;        // per link: allocated bytes/s
  std::vector<double> link_bytes_;  // per link: bytes carried up to since_
  std::vector<double> since_;       // per link: time link_bytes_ is exact at (load_ constant since)
  double next_finish_ = kNever;     // earliest flow finish under the current rates

  // Lookahead result: the next completion time and the batches completing then.
  bool spec_valid_ = false;
  double spec_time_ = kNever;
  std::vector<BatchId> spec_done_;
  std::vector<BatchCompletion> ready_;  // completions known but not yet returned
  // Batches whose flows are all finished (released early by a coarse event_tolerance) and that
  // complete later, when their last flow's bytes would have arrived: an event of their own.
  std::vector<BatchCompletion> deferred_, ck_deferred_;

  bool has_ck_ = false;
  double ck_t_ = 0;
  std::vector<double> ck_moving_cnt_, ck_link_bytes_;

  // Water-filling scratch, kept to avoid reallocating per solve.
  // Per link during a solve: residual capacity, weighted and plain counts of unrated copies; one
  // record per link, since every visit of a route's link reads or writes all three.
  struct LinkFill {
    double rem = 0, cnt = 0, num = 0;
  };
  std::vector<LinkFill> w_;
  std::vector<std::uint32_t> bottleneck_, dirty_links_;
  std::vector<std::uint8_t> dirty_;  // per link: in dirty_links_
  // Active links of the current solve with their fair shares, and each link's position there.
  std::vector<std::uint32_t> act_links_, act_pos_;
  std::vector<double> act_share_;
  std::vector<std::uint32_t> level_cand_;  // positions in act_links_ that may saturate now
  std::vector<std::uint8_t> saturated_;
  std::vector<topology::LinkId> route_buf_;
  double csr_savings_ = 0;  // scan work the CSR lists would have saved while unbuilt (entries)
  std::vector<std::uint32_t> pick_;    // a CSR level's unrated flows on one bottleneck link
  std::vector<double> finish_sample_;  // refill_finish's scratch
  std::vector<std::size_t> walk_;      // refresh_next_finish's scratch
  SenderMessages senders_;             // per-batch message counts, when params_.peer_cache > 0
  std::vector<std::pair<Segment*, std::uint32_t>> started_;  // flows starting in this event
  std::vector<double> new_cnt_;                              // per link, for start_bound()
  std::vector<topology::LinkId> touched_;
  std::vector<topology::LinkId> solve_links_;  // links crossed by the flows being re-solved
  std::vector<std::uint8_t> in_links_;         // per link: in solve_links_
  std::vector<double> link_scratch_;           // per link, zero between uses
  std::vector<std::uint32_t> link_mark_;       // per link: == mark_stamp_ when reached
  std::uint32_t mark_stamp_ = 0;

  FlowModelStats stats_;
};

}  // namespace moesim::sim
