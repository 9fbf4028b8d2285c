#include "sim/flow_model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_map>

#include "core/error.hpp"
#include "sim/progress.hpp"

namespace moesim::sim {

namespace {
// Shares within this relative amount of the level's minimum saturate together in one level.
constexpr double kLevelTol = 1e-9;
// Below this event_tolerance the slack is negligible and no duration bound is computed for it.
constexpr double kMinDurationTolerance = 1e-7;
// Least number of finish times a segment's heap takes per refill (Segment::finish).
constexpr std::size_t kFinishHeapMin = 4096;

// A partial re-solve keeps the flows whose rate is below its threshold times this factor: a margin
// of many level tolerances, so that levels merged within kLevelTol are never split between the
// kept and the re-solved flows.
constexpr double kKeepMargin = 1 - 1e-6;

// Weighted flow counts below this are empty (rounding residue of adding and removing weights).
constexpr double kWeightEps = 1e-12;

// Per-flow states. Whether a moving flow already has its rate in the current solve is told by its
// solve stamp (Segment::stamp == FlowModel::stamp_), so no reset pass is needed between solves.
constexpr std::uint8_t kPending = 0;
constexpr std::uint8_t kMoving = 1;
constexpr std::uint8_t kDone = 3;
inline bool is_moving(std::uint8_t s) { return s == kMoving; }

class ScopedTimer {
 public:
  explicit ScopedTimer(double& acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  double& acc_;
  std::chrono::steady_clock::time_point t0_;
};

// The least of the active links' shares, a level's hot loop, in one pass that also lists every
// link whose share may lie within kLevelTol of it: a link enters `cand` when its share is within
// the tolerance of the least seen so far, which is a superset of the final level's links (the
// running least only falls). Few links pass the test, so the pass is one compare per link.
double min_share(const std::vector<double>& v, std::vector<std::uint32_t>& cand) {
  cand.clear();
  double best = std::numeric_limits<double>::infinity(), bound = best;
  const std::size_t n = v.size();
  const double* p = v.data();
  for (std::size_t a = 0; a < n; ++a) {
    const double x = p[a];
    if (x <= bound) {
      if (x < best) {
        best = x;
        bound = x * (1 + kLevelTol);
      }
      cand.push_back(static_cast<std::uint32_t>(a));
    }
  }
  return best;
}

bool transfer_less(const Transfer& a, const Transfer& b) {
  return std::tie(a.src, a.dst, a.bytes) < std::tie(b.src, b.dst, b.bytes);
}
bool transfer_same(const Transfer& a, const Transfer& b) {
  return a.src == b.src && a.dst == b.dst && a.bytes == b.bytes;
}

}  // namespace

// One batch: its flows in flat arrays, indexed by a local flow id.
struct FlowModel::Segment {
  BatchId id = -1;
  double start_s = 0;  // start_batch's time: event_tolerance is relative to t - start_s
  // A lower bound on the batch's duration (least route latency + the most loaded link's bytes /
  // its capacity); set only under a coarse event_tolerance, whose slack uses at least this.
  double min_duration_s = 0;
  std::int64_t unfinished = 0;  // flow entries not done (pending or moving)
  std::int64_t num_moving = 0;  // flow entries moving
  // Latest exact finish time of its finished flows: with a coarse event_tolerance a flow is
  // finished (its bandwidth released) up to that tolerance early, but the batch completes at the
  // time its last byte arrives under the rates in force, not at the event that released it.
  double last_finish = 0;
  // Bytes per copy still to move at time t0 (W before the flow starts): a moving flow's remaining
  // bytes at time t are remaining - rate * (t - t0), brought up to date only when its rate changes.
  std::vector<double> remaining;
  std::vector<double> t0;
  std::vector<double> rate;  // bytes/s per copy, valid while moving (kNever: not solved yet)
  std::vector<std::uint32_t> stamp;  // == FlowModel::stamp_: to be (re)solved in the current solve
  std::vector<std::uint32_t> mult;   // identical copies represented by this entry
  // Max-min weight of each copy (FlowModelOptions::sharing): a flow's rate is weight x the level
  // of its bottleneck. One value for the whole batch (1 under per-flow sharing), so that it costs
  // no per-flow memory traffic.
  double weight = 1.0;
  double norm_rate(std::uint32_t i) const { return rate[i] / weight; }
  std::vector<std::uint8_t> state;
  std::vector<std::uint32_t> route_begin;  // size n+1, into routes
  std::vector<topology::LinkId> routes;
  std::vector<std::uint32_t> link_begin;  // size num_links+1, into link_flows (CSR link -> flows)
  std::vector<std::uint32_t> link_flows;
  std::vector<topology::LinkId> links;  // the distinct links its flows cross
  // The current event finished or started some of its flows; the solve re-rates it (and what it
  // reaches through shared links: `reached`).
  bool touched = false;
  bool reached = false;
  // Flows grouped by the absolute time at which they start moving, sorted by time.
  struct Group {
    double time_s = 0;
    std::vector<std::uint32_t> flows;
  };
  std::vector<Group> groups;
  std::size_t next_group = 0;

  // Moving flows by ascending rate (finished ones are dropped lazily): a re-solve re-rates a
  // suffix of it, and water-filling assigns rates in ascending order, so no sort is needed.
  std::vector<std::uint32_t> order;
  // Flows re-solved by the current solve, by ascending flow id (their route entries are then read
  // in memory order); scan levels drop the ones already rated.
  std::vector<std::uint32_t> resolve;
  std::size_t resolve_count = 0;  // flows re-solved by the current solve (resolve's first size)
  std::vector<std::uint32_t> assigned;  // the same, in the order the current solve rated them
  // Finish times t0 + remaining / rate of the moving flows that finish by `horizon`, a min-heap;
  // entries of flows re-rated since are stale (the time no longer matches) and dropped when they
  // reach the top. Flows finishing later have no entry: most of them are re-rated before they
  // finish, and pushing every re-rated flow into one heap of millions cost more than the solve.
  // When the heap runs dry, refill_finish() scans the moving flows for the next earliest share.
  struct Finish {
    double time_s;
    std::uint32_t flow;
    bool operator>(const Finish& o) const { return time_s > o.time_s; }
  };
  std::vector<Finish> finish;
  double horizon = std::numeric_limits<double>::infinity();
  std::size_t finish_base = 0;  // heap size after the last refill or compaction
  // The heap is empty (a new batch, a bulk finish in process_event, a full solve) and the next
  // finish_solve() refills it from every moving flow, kept ones included.
  bool finish_stale = true;
  double finish_time(std::uint32_t i) const { return t0[i] + remaining[i] / rate[i]; }
  bool finish_valid(const Finish& f) const {
    return state[f.flow] == 1 && f.time_s == finish_time(f.flow);
  }

  // Checkpoint (see FlowModel::take_checkpoint).
  std::vector<double> ck_remaining;  // at the checkpoint's time
  std::vector<std::uint8_t> ck_state;
  std::int64_t ck_unfinished = 0, ck_num_moving = 0;
  double ck_last_finish = 0;
  std::size_t ck_next_group = 0;

  std::size_t size() const { return remaining.size(); }
};

FlowModel::FlowModel(const topology::Topology& topo, NetworkParams params, FlowModelOptions options)
    : topo_(topo), params_(params), options_(options) {
  MOESIM_ASSERT(options_.event_tolerance > 0 && options_.event_tolerance < 0.1,
                "flow model event_tolerance must be in (0, 0.1)");
  const auto& links = topo.links();
  cap_.reserve(links.size());
  latency_.reserve(links.size());
  for (std::size_t l = 0; l < links.size(); ++l) {
    MOESIM_ASSERT(links[l].bandwidth.value() > 0 && std::isfinite(links[l].bandwidth.value()),
                  "link " + std::to_string(l) + " has no positive bandwidth");
    MOESIM_ASSERT(links[l].latency.value() >= 0, "link " + std::to_string(l) + " latency < 0");
    cap_.push_back(links[l].bandwidth.value());
    latency_.push_back(links[l].latency.value());
  }
  MOESIM_ASSERT(params_.message_latency_s >= 0 && params_.message_overhead_s >= 0,
                "negative message cost");
  const std::size_t num_links = cap_.size();
  moving_cnt_.assign(num_links, 0.0);
  load_.assign(num_links, 0.0);
  link_bytes_.assign(num_links, 0.0);
  saturated_.assign(num_links, 0);
  new_cnt_.assign(num_links, 0.0);
  since_.assign(num_links, 0.0);
  in_links_.assign(num_links, 0);
  dirty_.assign(num_links, 0);
  act_pos_.assign(num_links, 0);
  w_.assign(num_links, LinkFill{});
}

FlowModel::~FlowModel() = default;

std::int64_t FlowModel::num_flow_entries() const {
  std::int64_t n = 0;
  for (const auto& g : segments_) n += static_cast<std::int64_t>(g->size());
  return n;
}

void FlowModel::add_moving(const Segment& g, std::uint32_t i, double sign) {
  const double m = sign * g.mult[i] * g.weight;
  for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
    moving_cnt_[g.routes[k]] += m;
  }
  // A finishing flow gives its bandwidth back (a starting one has none yet: rate kNever).
  if (sign < 0 && g.rate[i] != kNever) {
    const double used = g.rate[i] * g.mult[i];
    for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
      const topology::LinkId l = g.routes[k];
      flush_link(l);
      load_[l] -= used;
    }
  }
}

BatchId FlowModel::start_batch(double now_s, const std::vector<Transfer>& transfers,
                               int /*priority*/) {
  MOESIM_ASSERT(std::isfinite(now_s), "start_batch at a non-finite time");
  MOESIM_ASSERT(now_s >= committed_, "start_batch earlier than the model's clock");
  if (spec_valid_ && spec_time_ != kNever && now_s >= spec_time_) {
    MOESIM_ASSERT(now_s == spec_time_, "start_batch past a completion not yet advanced to");
    // The lookahead stopped exactly here: its completions are real, report them later.
    for (BatchId id : spec_done_) ready_.push_back({id, spec_time_});
    spec_done_.clear();
    spec_valid_ = false;
    committed_ = now_s;
    commit();
  } else {
    spec_valid_ = false;
    spec_done_.clear();
    committed_ = now_s;
    materialize(now_s);
  }

  ScopedTimer timer(stats_.build_s);
  const BatchId id = next_id_++;
  const int num_gpus = topo_.num_gpus();
  const std::size_t num_links = cap_.size();

  // Validate, count the real flows and check whether they are already sorted (the usual case for
  // generated collectives), so that aggregation needs no sort.
  std::size_t kept = 0;
  bool sorted = true;
  const Transfer* prev = nullptr;
  for (const Transfer& t : transfers) {
    if (t.src < 0 || t.src >= num_gpus || t.dst < 0 || t.dst >= num_gpus) {
      throw InputError("flow model: transfer " + std::to_string(t.src) + " -> " +
                       std::to_string(t.dst) + " names a rank outside 0.." +
                       std::to_string(num_gpus - 1));
    }
    if (!(t.bytes >= 0) || !std::isfinite(t.bytes)) {
      throw InputError("flow model: transfer " + std::to_string(t.src) + " -> " +
                       std::to_string(t.dst) + " has invalid size " + std::to_string(t.bytes) +
                       " bytes, expected a finite number >= 0");
    }
    if (t.src == t.dst) continue;
    if (prev != nullptr && transfer_less(t, *prev)) sorted = false;
    prev = &t;
    ++kept;
  }
  stats_.transfers += static_cast<std::int64_t>(kept);
  if (kept == 0) {
    ready_.push_back({id, now_s});
    return id;
  }
  std::vector<std::uint32_t> order;
  if (!sorted) {
    MOESIM_ASSERT(transfers.size() < (std::size_t{1} << 32), "batch too large");
    // Two stable counting passes (by dst, then by src) instead of a comparison sort: O(n + P)
    // for the millions of transfers of a 4,096-GPU all-to-all; then the rare runs of equal
    // (src, dst) are put in size order.
    std::vector<std::uint32_t> by_dst(kept);
    order.resize(kept);
    std::vector<std::uint32_t> start(static_cast<std::size_t>(num_gpus) + 1);
    for (const Transfer& t : transfers) {
      if (t.src != t.dst) ++start[static_cast<std::size_t>(t.dst) + 1];
    }
    std::partial_sum(start.begin(), start.end(), start.begin());
    for (std::uint32_t i = 0; i < transfers.size(); ++i) {
      if (transfers[i].src != transfers[i].dst) by_dst[start[transfers[i].dst]++] = i;
    }
    std::fill(start.begin(), start.end(), 0);
    for (std::uint32_t i : by_dst) ++start[static_cast<std::size_t>(transfers[i].src) + 1];
    std::partial_sum(start.begin(), start.end(), start.begin());
    for (std::uint32_t i : by_dst) order[start[transfers[i].src]++] = i;
    std::vector<std::uint32_t>().swap(by_dst);
    for (std::size_t a = 0; a < kept;) {
      std::size_t b = a + 1;
      while (b < kept && transfers[order[b]].src == transfers[order[a]].src &&
             transfers[order[b]].dst == transfers[order[a]].dst) {
        ++b;
      }
      if (b - a > 1) {
        std::sort(order.begin() + static_cast<std::ptrdiff_t>(a),
                  order.begin() + static_cast<std::ptrdiff_t>(b),
                  [&](std::uint32_t x, std::uint32_t y) {
                    return transfer_less(transfers[x], transfers[y]);
                  });
      }
      a = b;
    }
  }

  auto seg = std::make_unique<Segment>();
  Segment& g = *seg;
  g.id = id;
  g.start_s = now_s;
  g.remaining.reserve(kept);
  g.mult.reserve(kept);
  g.route_begin.reserve(kept + 1);
  g.route_begin.push_back(0);
  {
    // Reserve the route pool from a sample so that it is not regrown (and copied) at scale.
    std::size_t max_len = 1;
    const std::size_t step = std::max<std::size_t>(1, transfers.size() / 64);
    for (std::size_t i = 0; i < transfers.size(); i += step) {
      if (transfers[i].src == transfers[i].dst) continue;
      route_buf_.clear();
      topo_.route(transfers[i].src, transfers[i].dst, route_buf_);
      max_len = std::max(max_len, route_buf_.size());
    }
    g.routes.reserve(kept * max_len);
  }

  const bool per_peer = params_.peer_cache > 0;
  if (per_peer) senders_.count(transfers);
  std::unordered_map<double, std::uint32_t> group_of_time;
  double last_time = -1;
  std::uint32_t last_group = 0;
  const Transfer* cur = nullptr;
  auto emit = [&](const Transfer& t, std::uint32_t mult) {
    progress_work(now_s);  // progress / Ctrl-C: millions of flows take seconds to route
    // route() appends straight into the pool: no per-flow temporary.
    const std::size_t begin = g.routes.size();
    topo_.route(t.src, t.dst, g.routes);
    const std::size_t end = g.routes.size();
    MOESIM_ASSERT(end > begin,
                  "empty route " + std::to_string(t.src) + " -> " + std::to_string(t.dst));
    MOESIM_ASSERT(end < (std::size_t{1} << 32), "route pool overflow");
    double route_latency = params_.message_latency_s;
    for (std::size_t k = begin; k < end; ++k) {
      MOESIM_ASSERT(g.routes[k] < num_links, "route names an unknown link");
      route_latency += latency_[g.routes[k]];
    }
    const auto flow = static_cast<std::uint32_t>(g.remaining.size());
    g.route_begin.push_back(static_cast<std::uint32_t>(end));
    const double overhead_s =
        per_peer ? params_.overhead_s(senders_[t.src]) : params_.message_overhead_s;
    const double w = t.bytes > 0 ? t.bytes + overhead_s * cap_[g.routes[begin]] : 0.0;
    g.remaining.push_back(w);
    g.mult.push_back(mult);
    const double start = now_s + route_latency;
    if (start != last_time) {
      auto [it, inserted] =
          group_of_time.try_emplace(start, static_cast<std::uint32_t>(g.groups.size()));
      if (inserted) g.groups.push_back({start, {}});
      last_time = start;
      last_group = it->second;
    }
    g.groups[last_group].flows.push_back(flow);
  };
  std::uint32_t run = 0;
  auto feed = [&](const Transfer& t) {
    if (cur != nullptr && transfer_same(t, *cur)) {
      ++run;
      return;
    }
    if (cur != nullptr) emit(*cur, run);
    cur = &t;
    run = 1;
  };
  if (sorted) {
    for (const Transfer& t : transfers) {
      if (t.src != t.dst) feed(t);
    }
  } else {
    for (std::uint32_t i : order) feed(transfers[i]);
    std::vector<std::uint32_t>().swap(order);
  }
  emit(*cur, run);

  const std::size_t n = g.remaining.size();
  g.rate.assign(n, kNever);
  g.t0.assign(n, now_s);
  g.stamp.assign(n, 0);
  g.state.assign(n, kPending);
  g.unfinished = static_cast<std::int64_t>(n);
  stats_.flows += static_cast<std::int64_t>(n);
  std::sort(g.groups.begin(), g.groups.end(),
            [](const Segment::Group& a, const Segment::Group& b) { return a.time_s < b.time_s; });

  // CSR link -> flows: offsets now (cheap, and they price the CSR in solve()); the flow lists
  // only when a water-filling level first wants them (ensure_csr), since symmetric collectives
  // resolve every level by a scan and never need them.
  g.link_begin.assign(num_links + 1, 0);
  for (topology::LinkId l : g.routes) ++g.link_begin[l + 1];
  std::partial_sum(g.link_begin.begin(), g.link_begin.end(), g.link_begin.begin());
  for (std::size_t l = 0; l < num_links; ++l) {
    if (g.link_begin[l + 1] > g.link_begin[l]) g.links.push_back(static_cast<topology::LinkId>(l));
  }
  if (options_.event_tolerance > kMinDurationTolerance) {
    // A lower bound on the batch's duration, which the tolerance's slack may use from its start:
    // its flows start no earlier than the least route latency, and no link carries its bytes
    // faster than its capacity, whatever else shares it.
    std::vector<double>& bytes = link_scratch_;
    bytes.resize(num_links, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      const double w = g.remaining[i] * g.mult[i];
      for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
        bytes[g.routes[k]] += w;
      }
    }
    double drain_s = 0;
    for (topology::LinkId l : g.links) {
      drain_s = std::max(drain_s, bytes[l] / cap_[l]);
      bytes[l] = 0;
    }
    g.min_duration_s = (g.groups.empty() ? 0.0 : g.groups.front().time_s - now_s) + drain_s;
  }
  if (options_.sharing == FlowSharing::kPerCollective) {
    // Each batch (one phase of one collective) shares links as one party, as NCCL runs each
    // collective on channels of its own: all its flows weigh 1 / the copies of the batch on its
    // most crowded link, so there the batch weighs 1 in all. One weight for the whole batch keeps
    // per-flow fairness inside it: a batch alone is rated exactly as under per-flow sharing.
    std::vector<double>& cnt = new_cnt_;  // zero outside start_bound()
    double most = 1;
    for (std::size_t i = 0; i < n; ++i) {
      for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
        most = std::max(most, cnt[g.routes[k]] += g.mult[i]);
      }
    }
    for (topology::LinkId l : g.routes) cnt[l] = 0;
    g.weight = 1.0 / most;
  }
  segments_.push_back(std::move(seg));
  return id;
}

void FlowModel::ensure_csr(Segment& g) {
  if (g.routes.empty() || !g.link_flows.empty()) return;
  ++stats_.csr_builds;
  g.link_flows.resize(g.routes.size());
  std::vector<std::uint32_t> pos(g.link_begin.begin(), g.link_begin.end() - 1);
  const auto n = static_cast<std::uint32_t>(g.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
      g.link_flows[pos[g.routes[k]]++] = i;
    }
  }
}

double FlowModel::finish_slack(const Segment& g, double t) const {
  const double slack_s = options_.event_tolerance * std::max(t - g.start_s, g.min_duration_s);
  // A coarse window is centred on its event (refresh_next_finish): half of it lies ahead.
  return options_.event_tolerance > kMinDurationTolerance ? 0.5 * slack_s : slack_s;
}

double FlowModel::next_event_time() const {
  double t = next_finish_;
  for (const auto& c : deferred_) t = std::min(t, c.time_s);
  for (const auto& g : segments_) {
    if (g->next_group < g->groups.size()) t = std::min(t, g->groups[g->next_group].time_s);
  }
  return t;
}

std::vector<double> FlowModel::link_bytes() const {
  std::vector<double> out(link_bytes_.size());
  for (std::size_t l = 0; l < out.size(); ++l) {
    out[l] = link_bytes_[l] + load_[l] * (sim_t_ - since_[l]);
  }
  return out;
}

void FlowModel::refresh_next_finish() {
  next_finish_ = kNever;
  for (auto& gp : segments_) {
    Segment& g = *gp;
    for (;;) {
      while (!g.finish.empty() && !g.finish_valid(g.finish.front())) {
        std::pop_heap(g.finish.begin(), g.finish.end(), std::greater<>());
        g.finish.pop_back();
      }
      if (!g.finish.empty() || !refill_finish(g)) break;
    }
    if (g.finish.empty()) continue;
    const double top_s = g.finish.front().time_s;
    double time_s = top_s;
    if (options_.event_tolerance > kMinDurationTolerance) {
      // A coarse tolerance handles the flows finishing within its window in one event, at the
      // window's midpoint: they finish up to half the slack late or early, so that their errors
      // cancel instead of all running early. A lone flow finishes at its own time, and a batch's
      // last flows at the last one's time (the batch completes on time).
      const double window_s = top_s + 2 * finish_slack(g, top_s);
      std::int64_t due = 0;
      double last_s = top_s;
      // The heap's entries up to the window: a walk from the root that stops at later ones.
      walk_.assign(1, 0);
      while (!walk_.empty()) {
        const std::size_t k = walk_.back();
        walk_.pop_back();
        const Segment::Finish& f = g.finish[k];
        if (f.time_s > window_s) continue;
        if (g.finish_valid(f)) {
          ++due;
          last_s = std::max(last_s, f.time_s);
        }
        for (std::size_t c = 2 * k + 1; c <= 2 * k + 2 && c < g.finish.size(); ++c) {
          walk_.push_back(c);
        }
      }
      const bool last_flows = g.next_group == g.groups.size() && due >= g.unfinished;
      time_s = last_flows ? last_s : 0.5 * (top_s + last_s);
    }
    next_finish_ = std::min(next_finish_, time_s);
  }
}

std::vector<BatchId> FlowModel::process_event(double t) {
  MOESIM_ASSERT(t >= sim_t_, "flow model event in the past");
  progress_tick(t, kProgressPollWeight);  // progress / Ctrl-C: each event may be a long solve
  ++stats_.events;
  bool changed = false;
  // Rates below `keep_below` are unchanged by this event (see solve()): the least rate of the
  // flows finishing, and a lower bound of where the starting flows first constrain anyone.
  double keep_below = kNever;
  std::vector<BatchId> completed;
  {
    ScopedTimer timer(stats_.advance_s);
    // Finishing (or starting) within the slack: now. The slack is relative to the time the batch
    // has run, not to the absolute clock: late in a long run (a training step of seconds made of
    // millisecond collectives) a slack of tolerance x t would release whole collectives early.
    // Early in a batch that time is short, so the slack uses at least a lower bound on the
    // batch's whole duration (Segment::min_duration_s): the bound on the error relative to the
    // duration still holds, and a skewed batch's early finishes are not each an event of their own.
    const auto slack_of = [&](const Segment& g) {
      return options_.event_tolerance * std::max(t - g.start_s, g.min_duration_s);
    };
    sim_t_ = t;
    std::vector<std::int64_t> unfinished_before(segments_.size());
    for (std::size_t s = 0; s < segments_.size(); ++s) {
      Segment& g = *segments_[s];
      const double slack_s = finish_slack(g, t);
      unfinished_before[s] = g.unfinished;
      // Only the flows at the top of the finish heap can finish now; the others are untouched.
      auto due = [&](const Segment::Finish& f) { return f.time_s <= t + slack_s; };
      auto finish_one = [&](const Segment::Finish& f) {
        if (!g.finish_valid(f)) return;
        const std::uint32_t i = f.flow;
        g.last_finish = std::max(g.last_finish, f.time_s);
        add_moving(g, i, -1.0);
        keep_below = std::min(keep_below, g.norm_rate(i));
        g.remaining[i] = 0;
        g.t0[i] = t;
        g.state[i] = kDone;
        --g.unfinished;
        --g.num_moving;
        g.touched = true;
        changed = true;
      };
      // Many finish together (symmetric traffic) in a segment mostly moving: one pass over the
      // flows by id. By id, a finishing flow's route and per-flow arrays are read in memory order
      // (in heap order each costs cache misses: 16.8 M flows finish in a few events of a
      // 4,096-GPU all-to-all). A moving flow's finish time is finish_time() exactly, as its heap
      // entry would hold, so the same flows finish as by the heap, past its horizon included.
      const auto by_id_pass = [&] {
        const double due_s = t + slack_s;
        const auto n = static_cast<std::uint32_t>(g.size());
        for (std::uint32_t i = 0; i < n; ++i) {
          if (is_moving(g.state[i]) && g.rate[i] != kNever && g.finish_time(i) <= due_s) {
            finish_one({g.finish_time(i), i});
          }
        }
        // The solve that follows this event refills the heap (finish_solve() sees finish_stale):
        // filling it here as well would cost a second pass over every flow.
        g.finish.clear();
        g.finish_stale = true;
      };
      std::size_t pops = 0;
      for (;;) {
        while (!g.finish.empty() && due(g.finish.front())) {
          if (++pops > 256 && g.finish.size() > 4096 && g.finish.size() * 2 >= g.size() &&
              static_cast<std::size_t>(g.num_moving) * 16 >= g.size()) {
            by_id_pass();  // the heap holds most of a segment mostly moving
            break;
          }
          if (pops > 256 && g.finish.size() > 4096) {
            // Many finish together: one pass over the heap instead of a pop each.
            const auto mid = std::partition(g.finish.begin(), g.finish.end(),
                                            [&](const Segment::Finish& f) { return !due(f); });
            for (auto it = mid; it != g.finish.end(); ++it) finish_one(*it);
            g.finish.erase(mid, g.finish.end());
            std::make_heap(g.finish.begin(), g.finish.end(), std::greater<>());
            break;
          }
          const Segment::Finish f = g.finish.front();
          std::pop_heap(g.finish.begin(), g.finish.end(), std::greater<>());
          g.finish.pop_back();
          finish_one(f);
        }
        if (!g.finish.empty() || g.horizon > t + slack_s) break;
        // The heap's whole share was due, and flows past its horizon may be too.
        if (static_cast<std::size_t>(g.num_moving) * 16 >= g.size()) {
          by_id_pass();
          break;
        }
        if (!refill_finish(g)) break;
      }
    }
    // Starts after finishes, so that the bound below sees the links without the finished flows.
    started_.clear();
    for (auto& gp : segments_) {
      Segment& g = *gp;
      const double slack_s = slack_of(g);
      while (g.next_group < g.groups.size() && g.groups[g.next_group].time_s <= t + slack_s) {
        for (std::uint32_t i : g.groups[g.next_group].flows) {
          if (g.remaining[i] <= 0) {  // zero-byte message: latency only
            g.state[i] = kDone;
            --g.unfinished;
          } else {
            g.state[i] = kMoving;
            g.rate[i] = kNever;
            g.t0[i] = t;
            ++g.num_moving;
            started_.push_back({&g, i});
            g.touched = true;
            changed = true;
          }
        }
        ++g.next_group;
      }
    }
    if (!started_.empty()) keep_below = std::min(keep_below, start_bound());
    for (std::size_t s = 0; s < segments_.size(); ++s) {
      const Segment& g = *segments_[s];
      if (unfinished_before[s] > 0 && g.unfinished == 0) {
        // Released early (coarse tolerance): the batch completes when its last flow would have.
        if (g.last_finish > t * (1 + kLevelTol)) {
          deferred_.push_back({g.id, g.last_finish});
        } else {
          completed.push_back(g.id);
        }
      }
    }
    std::erase_if(deferred_, [&](const BatchCompletion& c) {
      if (c.time_s > t) return false;
      completed.push_back(c.id);
      return true;
    });
  }
  if (changed) solve(keep_below);
  return completed;
}

double FlowModel::start_bound() {
  // New copies per link first, then for each link they cross the least level y at which it could
  // saturate once they join: the old flows there use at most min(load, count * y) at level y, so
  // y >= the root of min(load, n * y) + m * y = cap. Below the least such y over all their links,
  // water-filling proceeds exactly as before, so rates below it are unchanged.
  touched_.clear();
  for (const auto& [gp, i] : started_) {
    const Segment& g = *gp;
    for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
      const topology::LinkId l = g.routes[k];
      if (new_cnt_[l] == 0) touched_.push_back(l);
      new_cnt_[l] += g.mult[i] * g.weight;
    }
  }
  double bound = kNever;
  for (topology::LinkId l : touched_) {
    const double c = cap_[l], n = moving_cnt_[l], m = new_cnt_[l];
    const double load = std::max(0.0, load_[l]);
    double y;
    if (n > kWeightEps && c * n <= load * (n + m)) {
      y = c / (n + m);
    } else {
      y = std::max(0.0, c - load) / m;
    }
    bound = std::min(bound, y);
    moving_cnt_[l] += m;
    new_cnt_[l] = 0;
  }
  return bound;
}

void FlowModel::solve(double keep_below) {
  ScopedTimer timer(stats_.solve_s);
  ++stats_.solves;
  ++stamp_;
  const std::uint32_t stamp = stamp_;
  // Max-min fairness is a sequence of levels: flows frozen below level x never cross a link that
  // saturates at or above x. So when the event leaves every rate below `keep_below` unchanged,
  // those flows keep their rates and only the others (a suffix of Segment::order, plus the flows
  // just started) are water-filled, on the capacity the kept flows leave. keep_below <= 0 (or a
  // failed check below) is a full recomputation.
  const double keep_thr = keep_below * kKeepMargin;
  const bool partial = keep_thr > 0 && keep_below != kNever;
  if (partial) ++stats_.partial_solves;
  double scan_entries = gather_resolved(partial, keep_thr, stamp);
  build_active_links();
  // A scan follows the routes of every flow being re-solved; the CSR visits only the bottleneck
  // links' flows (kept ones included, skipped) but in scattered order. Building missing CSR
  // lists costs about two passes over a segment's route entries.
  double unbuilt_entries = 0;
  for (const auto& g : segments_) {
    if (g->num_moving > 0 && g->link_flows.empty()) {
      unbuilt_entries += static_cast<double>(g->routes.size());
    }
  }
  bool first_level = true;
  while (!act_links_.empty()) {
    progress_work(sim_t_, kProgressPollWeight);  // progress / Ctrl-C inside one long solve
    ++stats_.levels;
    const double share = min_share(act_share_, level_cand_);
    if (first_level && partial && !(share >= keep_thr)) {
      // The kept rates do not leave room for the rest as they should (rounding drift in load_):
      // recompute from scratch, which is always exact. Nothing was assigned yet.
      ++stats_.partial_fallbacks;
      for (std::uint32_t l : solve_links_) in_links_[l] = 0;
      for (auto& gp : segments_) {
        for (std::uint32_t i : gp->resolve) gp->stamp[i] = stamp - 1;
      }
      solve(0.0);
      return;
    }
    first_level = false;
    MOESIM_ASSERT(share > 0 && std::isfinite(share), "max-min share must be positive");
    // Links whose fair share is within kLevelTol of the minimum saturate at this level together:
    // in exact arithmetic freezing flows at `share` leaves their share unchanged.
    const double threshold = share * (1 + kLevelTol);
    bottleneck_.clear();
    double csr_entries = 0;
    for (std::uint32_t a : level_cand_) {
      if (act_share_[a] > threshold) continue;
      const topology::LinkId l = act_links_[a];
      bottleneck_.push_back(l);
      saturated_[l] = 1;
      for (const auto& g : segments_) csr_entries += g->link_begin[l + 1] - g->link_begin[l];
    }
    // Rent or buy: a level the CSR would serve more cheaply than a scan adds what it would save
    // to csr_savings_, and the missing lists are built once the savings (over this and earlier
    // solves) pay for them. A skewed batch (tens of levels per solve, over thousands of solves)
    // builds them after a few solves; a symmetric all-to-all (a few levels, a dozen solves)
    // scans and never spends their memory (0.5 GiB at 4,096 GPUs).
    const double build_cost = 2 * unbuilt_entries;
    bool use_csr = false;
    if (csr_entries * 4 < scan_entries) {
      if (build_cost == 0) {
        use_csr = true;
      } else {
        csr_savings_ += scan_entries - csr_entries * 4;
        use_csr = csr_savings_ >= build_cost;
      }
    }
    if (use_csr) {
      if (unbuilt_entries > 0) csr_savings_ = 0;
      unbuilt_entries = 0;
      rate_level_by_csr(share, stamp);
    } else {
      ++stats_.scan_levels;
      scan_entries = rate_level_by_scan(share, stamp);
    }
    for (std::uint32_t l : bottleneck_) {
      saturated_[l] = 0;
      MOESIM_ASSERT(w_[l].num < 0.5, "bottleneck link kept unassigned flows");
    }
    refresh_dirty_links();
  }
  finish_solve();
}

double FlowModel::gather_resolved(bool partial, double keep_thr, std::uint32_t stamp) {
  const std::size_t num_links = cap_.size();
  const double now = sim_t_;
  // The links the re-solved flows cross: only their residual capacity and count matter.
  solve_links_.clear();
  if (!partial) {
    for (std::uint32_t l = 0; l < num_links; ++l) {
      flush_link(l);
      solve_links_.push_back(l);
      w_[l].rem = cap_[l];
      w_[l].cnt = 0;
      w_[l].num = 0;
      in_links_[l] = 1;
    }
  }
  double resolved_entries = 0;
  const bool split_components = partial && options_.split_components;
  if (split_components) mark_reached();
  for (auto& gp : segments_) {
    Segment& g = *gp;
    g.resolve.clear();
    g.assigned.clear();
    if (g.num_moving == 0) {
      g.order.clear();
      g.finish.clear();
      continue;
    }
    if (split_components && !g.reached) {  // the event cannot change its rates: all kept
      ++stats_.kept_segments;
      continue;
    }
    std::size_t split = 0;
    if (partial) {
      split = static_cast<std::size_t>(
          std::lower_bound(g.order.begin(), g.order.end(), keep_thr,
                           [&](std::uint32_t i, double x) { return g.norm_rate(i) < x; }) -
          g.order.begin());
      for (std::size_t k = split; k < g.order.size(); ++k) {
        if (is_moving(g.state[g.order[k]])) g.resolve.push_back(g.order[k]);
      }
    } else {
      g.finish.clear();
      g.finish_stale = true;
      const std::uint32_t n = static_cast<std::uint32_t>(g.size());
      for (std::uint32_t i = 0; i < n; ++i) {
        if (is_moving(g.state[i])) g.resolve.push_back(i);
      }
    }
    g.order.resize(split);
  }
  // Started flows are moving already: a full solve has them; a partial one adds them.
  if (partial) {
    for (const auto& [gp, i] : started_) gp->resolve.push_back(i);
  }
  started_.clear();
  for (auto& gp : segments_) {
    Segment& g = *gp;
    g.resolve_count = g.resolve.size();
    stats_.resolved_flows += static_cast<std::int64_t>(g.resolve.size());
    // Rate order is random in memory: visit the flows by id instead, so that the passes below
    // read route entries and per-flow arrays sequentially (cache misses dominated otherwise). A
    // large share is re-listed by one sweep of the stamps, a small one sorted.
    for (std::uint32_t i : g.resolve) g.stamp[i] = stamp;
    if (partial && g.resolve.size() * 32 >= g.size()) {  // (a full solve lists them by id)
      g.resolve.clear();
      const auto n = static_cast<std::uint32_t>(g.size());
      for (std::uint32_t i = 0; i < n; ++i) {
        if (g.stamp[i] == stamp) g.resolve.push_back(i);
      }
    } else if (partial) {
      std::sort(g.resolve.begin(), g.resolve.end());
    }
    const std::size_t nres = g.resolve.size();
    for (std::size_t x = 0; x < nres; ++x) {
      const std::uint32_t i = g.resolve[x];
      if (partial && x + 8 < nres) {  // a sparse subset: fetch ahead what a flow reads
        const std::uint32_t a = g.resolve[x + 8];
        __builtin_prefetch(&g.routes[g.route_begin[a]]);
        __builtin_prefetch(&g.rate[a]);
        __builtin_prefetch(&g.remaining[a]);
        __builtin_prefetch(&g.t0[a]);
      }
      const double r = g.rate[i];
      const double m = g.mult[i];
      if (r != kNever) {  // bring its remaining bytes up to now before the rate changes
        g.remaining[i] -= r * (now - g.t0[i]);
        g.t0[i] = now;
      }
      const double used = r == kNever || !partial ? 0.0 : r * m;
      for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
        const topology::LinkId l = g.routes[k];
        if (!in_links_[l]) {
          in_links_[l] = 1;
          solve_links_.push_back(l);
          flush_link(l);
          w_[l].rem = cap_[l] - load_[l];
          w_[l].cnt = 0;
          w_[l].num = 0;
        }
        w_[l].rem += used;
        w_[l].cnt += m * g.weight;
        w_[l].num += m;
      }
      resolved_entries += g.route_begin[i + 1] - g.route_begin[i];
    }
  }
  return resolved_entries;
}

void FlowModel::mark_reached() {
  // Max-min rates decompose over the connected components of the flow-link graph: water-filling
  // in one component never reads a link of another. The event changed only the touched segments'
  // flows (finished ones released their links, started ones joined theirs), so only the segments
  // connected to them through links (transitively) can change rate; the others keep every rate
  // exactly. Segments are the unit (a segment's static link set covers every flow it ever had: a
  // superset, so the reach is conservative). A segment without moving flows passes nothing on
  // unless touched (its finished flows freed its links).
  if (link_mark_.size() != cap_.size()) link_mark_.assign(cap_.size(), 0);
  const std::uint32_t mark = ++mark_stamp_;
  auto reach = [&](Segment& g) {
    g.reached = true;
    for (topology::LinkId l : g.links) link_mark_[l] = mark;
  };
  for (auto& gp : segments_) {
    gp->reached = false;
    if (gp->touched) reach(*gp);
  }
  for (bool grew = true; grew;) {
    grew = false;
    for (auto& gp : segments_) {
      Segment& g = *gp;
      if (g.reached || g.num_moving == 0) continue;
      for (topology::LinkId l : g.links) {
        if (link_mark_[l] == mark) {
          reach(g);
          grew = true;
          break;
        }
      }
    }
  }
}

void FlowModel::build_active_links() {
  // Level selection over a compact array of the active links' fair shares: a level is one
  // contiguous min pass (no division, no gather), and only the links a level changed (dirty) get
  // their share recomputed, or leave the array once no unassigned flow crosses them. (A heap was
  // slower: a level of an all-to-all changes most active links.)
  act_links_.clear();
  act_share_.clear();
  for (std::uint32_t l : solve_links_) {
    if (w_[l].num > 0.5) {
      act_pos_[l] = static_cast<std::uint32_t>(act_links_.size());
      act_links_.push_back(l);
      act_share_.push_back(share_of(l));
    }
  }
}

void FlowModel::assign(Segment& g, std::uint32_t i, double share, std::uint32_t stamp) {
  g.stamp[i] = stamp - 1;
  g.rate[i] = share * g.weight;
  g.assigned.push_back(i);
  const double m = g.mult[i];
  const double used = g.rate[i] * m;
  const double wm = g.weight * m;
  for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
    const topology::LinkId l = g.routes[k];
    w_[l].rem -= used;
    w_[l].cnt -= wm;
    w_[l].num -= m;
    if (!dirty_[l]) {
      dirty_[l] = 1;
      dirty_links_.push_back(l);
    }
  }
}

void FlowModel::rate_level_by_csr(double share, std::uint32_t stamp) {
  for (std::uint32_t l : bottleneck_) {
    for (auto& gp : segments_) {
      Segment& g = *gp;
      if (g.resolve.empty()) continue;
      ensure_csr(g);
      // A link's flows are scattered over the segment (those into one destination, say), so
      // each costs cache misses on its stamp and route: first list the unrated ones
      // with their stamps prefetched ahead, then rate them with their routes prefetched.
      const std::uint32_t jb = g.link_begin[l], je = g.link_begin[l + 1];
      constexpr std::uint32_t kAhead = 16;
      pick_.clear();
      for (std::uint32_t j = jb; j < je; ++j) {
        if (j + kAhead < je) {
          const std::uint32_t a = g.link_flows[j + kAhead];
          __builtin_prefetch(&g.stamp[a]);
        }
        // Only moving flows get the solve's stamp (gather_resolved): no need to read the state.
        const std::uint32_t i = g.link_flows[j];
        if (g.stamp[i] == stamp) pick_.push_back(i);
      }
      const std::size_t np = pick_.size();
      for (std::size_t x = 0; x < np; ++x) {
        if (x + 16 < np) {
          const std::uint32_t a = pick_[x + 16];
          __builtin_prefetch(&g.route_begin[a]);
          __builtin_prefetch(&g.mult[a]);
          __builtin_prefetch(&g.rate[a]);
        }
        if (x + 6 < np) __builtin_prefetch(&g.routes[g.route_begin[pick_[x + 6]]]);
        assign(g, pick_[x], share, stamp);
      }
    }
  }
}

double FlowModel::rate_level_by_scan(double share, std::uint32_t stamp) {
  double scan_entries = 0;
  for (auto& gp : segments_) {
    Segment& g = *gp;
    // Drops the flows rated (here or by earlier levels): the next scan visits only the rest.
    std::size_t keep = 0;
    for (std::uint32_t i : g.resolve) {
      if (g.stamp[i] != stamp) continue;
      bool hit = false;
      for (std::uint32_t k = g.route_begin[i]; k < g.route_begin[i + 1]; ++k) {
        if (saturated_[g.routes[k]]) {
          hit = true;
          break;
        }
      }
      if (hit) {
        assign(g, i, share, stamp);
      } else {
        g.resolve[keep++] = i;
        scan_entries += g.route_begin[i + 1] - g.route_begin[i];
      }
    }
    g.resolve.resize(keep);
  }
  return scan_entries;
}

void FlowModel::refresh_dirty_links() {
  for (std::uint32_t l : dirty_links_) {
    dirty_[l] = 0;
    const std::uint32_t a = act_pos_[l];
    if (w_[l].num > 0.5) {
      act_share_[a] = share_of(l);
      continue;
    }
    // Swap-remove from the active array.
    const topology::LinkId last = act_links_.back();
    act_links_[a] = last;
    act_share_[a] = act_share_.back();
    act_pos_[last] = a;
    act_links_.pop_back();
    act_share_.pop_back();
  }
  dirty_links_.clear();
}

void FlowModel::finish_solve() {
  for (std::uint32_t l : solve_links_) {
    load_[l] = std::max(0.0, cap_[l] - w_[l].rem);
    in_links_[l] = 0;
  }
  // New finish times up to the horizon; the kept flows' entries stay valid.
  for (auto& gp : segments_) {
    Segment& g = *gp;
    MOESIM_ASSERT(g.assigned.size() == g.resolve_count, "flow left without a rate");
    g.order.insert(g.order.end(), g.assigned.begin(), g.assigned.end());
    if (g.finish_stale) {
      refill_finish(g);
    } else {
      const std::size_t old = g.finish.size();
      for (std::uint32_t i : g.assigned) {
        const double time_s = g.finish_time(i);
        if (time_s <= g.horizon) g.finish.push_back({time_s, i});
      }
      if (g.finish.size() > 2 * g.finish_base + 64) {
        // Grown mostly stale: keep the valid entries (the horizon stays).
        std::erase_if(g.finish, [&](const Segment::Finish& f) { return !g.finish_valid(f); });
        std::make_heap(g.finish.begin(), g.finish.end(), std::greater<>());
        g.finish_base = g.finish.size();
      } else if ((g.finish.size() - old) * 8 > old) {
        // Many new entries: appending and one heap build beats a push each.
        std::make_heap(g.finish.begin(), g.finish.end(), std::greater<>());
      } else {
        for (std::size_t k = old + 1; k <= g.finish.size(); ++k) {
          std::push_heap(g.finish.begin(), g.finish.begin() + static_cast<std::ptrdiff_t>(k),
                         std::greater<>());
        }
      }
    }
    g.resolve.clear();  // capacity kept: freeing and faulting it in again per solve cost more
    g.assigned.clear();
    g.touched = false;
  }
  refresh_next_finish();
}

bool FlowModel::refill_finish(Segment& g) {
  g.finish_stale = false;
  g.finish.clear();
  g.finish_base = 0;
  g.horizon = kNever;
  if (g.num_moving == 0) return false;
  // By id when most flows move (sequential reads of the per-flow arrays), else in rate order.
  const bool by_id = static_cast<std::size_t>(g.num_moving) * 16 >= g.size();
  const std::size_t n = by_id ? g.size() : g.order.size();
  const auto candidate = [&](std::size_t k) {
    return by_id ? static_cast<std::uint32_t>(k) : g.order[k];
  };
  const auto rated = [&](std::uint32_t i) { return is_moving(g.state[i]) && g.rate[i] != kNever; };
  // The earliest share goes into the heap, the rest waits for the next refill: a refill costs a
  // pass over the moving flows, so each must serve many finishes. The horizon is that share's
  // quantile in a sample, so that the heap, not a copy of every flow, is all that is stored.
  const auto moving = static_cast<std::size_t>(g.num_moving);
  if (moving > 2 * kFinishHeapMin) {
    const double share = std::max(1.0 / 8, static_cast<double>(kFinishHeapMin) / moving);
    const std::size_t stride = std::max<std::size_t>(1, n / (8 * kFinishHeapMin));
    finish_sample_.clear();
    for (std::size_t k = 0; k < n; k += stride) {
      const std::uint32_t i = candidate(k);
      if (rated(i)) finish_sample_.push_back(g.finish_time(i));
    }
    if (!finish_sample_.empty()) {
      const auto q =
          finish_sample_.begin() + static_cast<std::ptrdiff_t>(share * (finish_sample_.size() - 1));
      std::nth_element(finish_sample_.begin(), q, finish_sample_.end());
      g.horizon = *q;
    }
  }
  // Every flow finishing by the horizon (ties included) gets an entry.
  for (std::size_t k = 0; k < n; ++k) {
    const std::uint32_t i = candidate(k);
    if (!rated(i)) continue;
    const double time_s = g.finish_time(i);
    if (time_s <= g.horizon) g.finish.push_back({time_s, i});
  }
  std::make_heap(g.finish.begin(), g.finish.end(), std::greater<>());
  g.finish_base = g.finish.size();
  return !g.finish.empty();
}

void FlowModel::flush_link(topology::LinkId l) {
  link_bytes_[l] += load_[l] * (sim_t_ - since_[l]);
  since_[l] = sim_t_;
}

void FlowModel::take_checkpoint() {
  ScopedTimer timer(stats_.checkpoint_s);
  ++stats_.checkpoints;
  has_ck_ = true;
  ck_t_ = sim_t_;
  ck_deferred_ = deferred_;
  ck_moving_cnt_ = moving_cnt_;
  for (std::uint32_t l = 0; l < cap_.size(); ++l) flush_link(l);
  ck_link_bytes_ = link_bytes_;
  for (auto& gp : segments_) {
    Segment& g = *gp;
    // Remaining bytes as of the checkpoint's time: no start times or rates to keep (a restore
    // re-solves every rate), which keeps a checkpoint of 16.8 M flows at 9 bytes each.
    g.ck_remaining.resize(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      g.ck_remaining[i] = is_moving(g.state[i]) && g.rate[i] != kNever
                              ? g.remaining[i] - g.rate[i] * (ck_t_ - g.t0[i])
                              : g.remaining[i];
    }
    g.ck_state = g.state;
    g.ck_unfinished = g.unfinished;
    g.ck_num_moving = g.num_moving;
    g.ck_last_finish = g.last_finish;
    g.ck_next_group = g.next_group;
  }
}

void FlowModel::restore_checkpoint() {
  MOESIM_ASSERT(has_ck_, "flow model: no checkpoint to rewind to");
  {
    ScopedTimer timer(stats_.checkpoint_s);
    ++stats_.restores;
    sim_t_ = ck_t_;
    deferred_ = ck_deferred_;
    moving_cnt_ = ck_moving_cnt_;
    link_bytes_ = ck_link_bytes_;
    std::fill(since_.begin(), since_.end(), ck_t_);
    for (auto& gp : segments_) {
      Segment& g = *gp;
      g.remaining = g.ck_remaining;
      std::fill(g.t0.begin(), g.t0.end(), ck_t_);
      std::fill(g.rate.begin(), g.rate.end(), kNever);  // solve(0.0) below rates every mover
      g.state = g.ck_state;
      g.unfinished = g.ck_unfinished;
      g.num_moving = g.ck_num_moving;
      g.last_finish = g.ck_last_finish;
      g.next_group = g.ck_next_group;
    }
  }
  // Rates are a function of the moving set only, so they come back identical.
  solve(0.0);
}

void FlowModel::commit() {
  has_ck_ = false;
  std::vector<double>().swap(ck_moving_cnt_);
  std::vector<double>().swap(ck_link_bytes_);
  std::erase_if(segments_, [](const std::unique_ptr<Segment>& g) { return g->unfinished == 0; });
  for (auto& gp : segments_) {
    Segment& g = *gp;
    std::vector<double>().swap(g.ck_remaining);
    std::vector<std::uint8_t>().swap(g.ck_state);
    for (std::size_t k = 0; k < g.next_group; ++k) {
      std::vector<std::uint32_t>().swap(g.groups[k].flows);
    }
  }
}

void FlowModel::materialize(double now_s) {
  if (sim_t_ > now_s) restore_checkpoint();
  for (double t = next_event_time(); t <= now_s; t = next_event_time()) {
    for (BatchId id : process_event(t)) ready_.push_back({id, t});
  }
  if (sim_t_ < now_s) {
    for (BatchId id : process_event(now_s)) ready_.push_back({id, now_s});
  }
  commit();
}

double FlowModel::next_completion_time() { return next_completion_time_before(kNever); }

double FlowModel::next_completion_time_before(double horizon) {
  if (!ready_.empty()) {
    double t = kNever;
    for (const auto& c : ready_) t = std::min(t, c.time_s);
    return t;
  }
  if (spec_valid_) return spec_time_;
  for (;;) {
    const double t = next_event_time();
    if (t == kNever) {
      spec_valid_ = true;
      spec_time_ = kNever;
      return kNever;
    }
    // Nothing completes up to the engine's next event: stop there. Looking further ahead would
    // be undone (restore_checkpoint and a replay) as soon as the engine starts a batch at that
    // event, which in a pipelined step it nearly always does (DeepSeek-V3 with deepep: 8,650
    // rewinds at 4 micro-batches).
    if (t > horizon) return kNever;
    if (t > committed_ && !has_ck_) take_checkpoint();
    std::vector<BatchId> done = process_event(t);
    if (!done.empty()) {
      spec_valid_ = true;
      spec_time_ = t;
      spec_done_ = std::move(done);
      return t;
    }
  }
}

std::vector<BatchCompletion> FlowModel::advance_to(double t) {
  MOESIM_ASSERT(t >= committed_, "advance_to earlier than the model's clock");
  const double next = next_completion_time();
  MOESIM_ASSERT(t <= next, "advance_to past the next completion");
  committed_ = t;
  std::vector<BatchCompletion> out;
  if (!ready_.empty()) {
    std::erase_if(ready_, [&](const BatchCompletion& c) {
      if (c.time_s > t) return false;
      out.push_back(c);
      return true;
    });
  } else if (spec_valid_ && spec_time_ == t) {
    for (BatchId id : spec_done_) out.push_back({id, t});
    spec_done_.clear();
    spec_valid_ = false;
    commit();
  }
  std::sort(out.begin(), out.end(),
            [](const BatchCompletion& a, const BatchCompletion& b) { return a.id < b.id; });
  return out;
}

}  // namespace moesim::sim
