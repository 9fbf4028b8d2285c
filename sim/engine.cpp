#include "sim/engine.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <span>
#include <thread>
#include <unordered_map>

#include "core/error.hpp"
#include "sim/analytical_model.hpp"
#include "sim/event_queue.hpp"
#include "sim/flow_model.hpp"
#include "sim/progress.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"
#ifdef MOESIM_HAVE_SIMGRID
#include "sim/simgrid_model.hpp"
#endif

namespace moesim::sim {

std::string_view network_kind_name(NetworkKind k) {
  switch (k) {
    case NetworkKind::kAnalytical:
      return "analytical";
    case NetworkKind::kFlow:
      return "flow";
    case NetworkKind::kSimgrid:
      return "simgrid";
  }
  return "?";
}

std::optional<NetworkKind> parse_network_kind(std::string_view s) {
  for (NetworkKind k : {NetworkKind::kAnalytical, NetworkKind::kFlow, NetworkKind::kSimgrid})
    if (s == network_kind_name(k)) return k;
  return std::nullopt;
}

std::unique_ptr<NetworkModel> make_network_model(NetworkKind kind, const topology::Topology& topo,
                                                 const NetworkParams& params,
                                                 double flow_event_tolerance,
                                                 FlowSharing flow_sharing,
                                                 SimgridMode simgrid_mode) {
  switch (kind) {
    case NetworkKind::kAnalytical:
      return std::make_unique<AnalyticalModel>(topo, params);
    case NetworkKind::kFlow:
      return std::make_unique<FlowModel>(topo, params,
                                         FlowModelOptions{flow_event_tolerance, flow_sharing});
    case NetworkKind::kSimgrid:
#ifdef MOESIM_HAVE_SIMGRID
      return std::make_unique<SimgridModel>(topo, params, SimgridOptions{simgrid_mode});
#else
      (void)simgrid_mode;
      throw InputError(
          "engine: network 'simgrid' is not available (moesim was built without "
          "SimGrid); use 'flow' or 'analytical'");
#endif
  }
  throw InputError("engine: unknown network kind");
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class EventType : std::uint8_t {
  kComputeDone,
  kCopyDone,
  kGroupBegin,  // analytical: a group's collective gets its members' NICs
  kGroupDone,
  kPhasePartDone
};

struct Event {
  // A constructor, not an aggregate: EventQueue::emplace builds events in place from their
  // fields, and clang before 16 has no parenthesised aggregate initialisation (bench/fuzz.sh).
  Event() = default;
  Event(EventType t, std::uint32_t v, std::int32_t x, std::int32_t y)
      : type(t), version(v), a(x), b(y) {}
  EventType type{};
  std::uint32_t version = 0;
  std::int32_t a = 0;  // op (compute/copy/group) or cohort id
  std::int32_t b = 0;  // position in op.ranks, or group index
};

// One op instance in a (rank, stream) queue.
struct QueueEntry {
  OpId op;
  std::int32_t pos;
};

// A compute instance whose speed depends on communication on its rank (interference only).
struct RunningCompute {
  OpId op;
  std::int32_t pos;
  double work_left_s;  // at full speed
  double last_t;
  std::uint32_t version;
};

// Groups of one collective running their phases in lockstep.
struct Cohort {
  OpId op = -1;
  std::vector<int> groups;
  std::vector<collectives::Phase> phases;
  size_t phase = 0;
  int repeat_left = 0;
  int chunks_left = 1;  // partitioned collectives run the phase list this many times
  int parts_left = 0;   // completions the current phase still waits for
  bool active = false;
};

class Engine {
 public:
  Engine(const Plan& plan, const topology::Topology& topo, const EngineConfig& cfg,
         NetworkModel* net)
      : plan_(plan),
        topo_(topo),
        cfg_(cfg),
        net_(net),
        compute_(topo.gpu(), cfg.precision, cfg.compute),
        ctx_(make_cost_context(topo, cfg.net, compute_.hbm_bandwidth())),
        P_(plan.num_ranks()),
        S_(static_cast<int>(plan.stream_names().size())) {
    if (P_ > topo.num_gpus())
      throw InputError(fmt::format("engine: the plan has {} ranks but the topology only {} GPUs",
                                   P_, topo.num_gpus()));
    interference_ = cfg.compute.interference;
  }

  RunResult run() {
    auto wall0 = std::chrono::steady_clock::now();
    build();
    // Polls during this run (also the network model's) report how many op instances finished.
    const ProgressOpsScope ops_scope(&finished_, result_.op_offset.back());
    for (int r = 0; r < P_; ++r)
      for (int s = 0; s < S_; ++s) try_start(key(r, s));
    loop();
    check_finished();
    finish_result();
    result_.wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    result_.peak_rss_bytes = process_peak_rss_bytes();
    return std::move(result_);
  }

 private:
  size_t key(int rank, int stream) const {
    return static_cast<size_t>(rank) * static_cast<size_t>(S_) + static_cast<size_t>(stream);
  }
  std::int64_t entry(OpId op, int pos) const { return result_.op_offset[op] + pos; }

  // ---- setup -----------------------------------------------------------------------------------

  void build() {
    const auto& ops = plan_.ops();
    const size_t n_ops = ops.size();
    init_op_offsets(plan_, result_);
    result_.backend = net_ ? std::string(net_->name()) : std::string("analytical");
    result_.gpus_per_node = topo_.gpus_per_node();
    const std::int64_t n_entries = result_.op_offset.back();

    // The "not run" times and the remaining deps per instance (deps that share the instance's
    // rank) are written by a second thread while this one builds the dependents and the queues:
    // first touches of ~1 GiB on DeepSeek-V3, most of the setup. A dep on the same ranks (most
    // of them) counts for every position without a search.
    auto fill_times_and_deps = [this, &ops, n_entries] {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      result_.start_s.assign(static_cast<size_t>(n_entries), nan);
      result_.end_s.assign(static_cast<size_t>(n_entries), nan);
      deps_left_.assign(static_cast<size_t>(n_entries), 0);
      for (const Op& op : ops) {
        if (op.deps.empty()) continue;
        std::int32_t* left = deps_left_.data() + entry(op.id, 0);
        const int n = op.ranks.size();
        for (OpId d : op.deps) {
          const RankSet& dr = ops[d].ranks;
          if (dr == op.ranks) {
            for (int p = 0; p < n; ++p) ++left[p];
          } else {
            for (int p = 0; p < n; ++p) left[p] += dr.contains(op.ranks.at(p)) ? 1 : 0;
          }
        }
      }
    };
    std::exception_ptr deps_error;
    std::jthread deps_thread;
    if (n_entries >= 1'000'000 && std::thread::hardware_concurrency() > 1) {
      deps_thread = std::jthread([&] {
        try {
          fill_times_and_deps();
        } catch (...) {
          deps_error = std::current_exception();
        }
      });
    } else {
      fill_times_and_deps();
    }

    // Dependents (reverse edges), CSR.
    dep_off_.assign(n_ops + 1, 0);
    for (const Op& op : ops)
      for (OpId d : op.deps) ++dep_off_[d + 1];
    for (size_t i = 1; i <= n_ops; ++i) dep_off_[i] += dep_off_[i - 1];
    dependents_.resize(dep_off_.back());
    {
      std::vector<std::int64_t> fill(dep_off_.begin(), dep_off_.end() - 1);
      for (const Op& op : ops)
        for (OpId d : op.deps) dependents_[fill[d]++] = op.id;
    }

    // Per (rank, stream) queues in plan order, as links: next_q_[entry] is the instance after
    // that one on its rank's stream. A CSR by stream put the entries that advance together (an
    // op's ranks finishing) 2,048 segments apart; the links lie in entry order, beside them.
    const size_t n_keys = static_cast<size_t>(P_) * S_;
    head_q_.assign(n_keys, QueueEntry{-1, 0});
    next_q_.resize(static_cast<size_t>(n_entries));
    {
      std::vector<std::int64_t> last(n_keys, -1);
      for (const Op& op : ops)
        for (int p = 0; p < op.ranks.size(); ++p) {
          const size_t k = key(op.ranks.at(p), op.stream);
          const std::int64_t e = entry(op.id, p);
          next_q_[static_cast<size_t>(e)] = QueueEntry{-1, 0};
          (last[k] < 0 ? head_q_[k] : next_q_[static_cast<size_t>(last[k])]) = QueueEntry{op.id, p};
          last[k] = e;
        }
    }
    head_started_.assign(n_keys, 0);

    // Collectives: rank -> group maps per grouping used, ready counters, records.
    group_of_.resize(plan_.groupings().size());
    group_ready_off_.assign(n_ops + 1, 0);
    for (const Op& op : ops) {
      std::int64_t ng = 0;
      if (op.kind == OpKind::kCollective) {
        const auto gid = op.collective().grouping;
        const Grouping& g = plan_.grouping(gid);
        ng = static_cast<std::int64_t>(g.groups.size());
        if (group_of_[gid].empty()) {
          group_of_[gid].assign(P_, -1);
          for (size_t gi = 0; gi < g.groups.size(); ++gi)
            for (int r : g.groups[gi]) group_of_[gid][r] = static_cast<int>(gi);
        }
        result_.collectives.push_back(make_record(op));
        record_index_[op.id] = result_.collectives.size() - 1;
      }
      group_ready_off_[op.id + 1] = group_ready_off_[op.id] + ng;
    }
    group_ready_.assign(group_ready_off_.back(), 0);

    active_comm_.assign(P_, 0);
    // Lina's per-GPU priority gate (engine.hpp): only plans with yielding ops pay for it.
    gating_ = std::any_of(ops.begin(), ops.end(), [](const Op& o) { return o.priority < 0; });
    if (gating_) {
      reserve_.assign(P_, 0);
      gated_.assign(P_, {});
    }
    if (interference_ > 0) running_.resize(P_);
    if (deps_thread.joinable()) deps_thread.join();
    if (deps_error) std::rethrow_exception(deps_error);
  }

  CollectiveRecord make_record(const Op& op) {
    const CollectiveSpec& c = op.collective();
    const Grouping& g = plan_.grouping(c.grouping);
    CollectiveRecord rec;
    rec.op = op.id;
    rec.label = op.label;
    rec.type = c.type;
    rec.algo = c.algo;
    rec.num_groups = static_cast<int>(g.groups.size());
    rec.start_s = kInf;
    rec.end_s = -kInf;
    if (c.type == CollectiveType::kAllToAllv) {
      double total = 0;
      for (size_t gi = 0; gi < g.groups.size(); ++gi) {
        const ByteMatrix* m = c.per_group.empty() ? c.matrix.get() : c.per_group[gi].get();
        if (m) total += m->total().value();
      }
      double ranks = static_cast<double>(g.groups.size()) * g.group_size();
      rec.size_bytes = ranks > 0 ? total / ranks : 0;
    } else {
      rec.size_bytes = c.bytes.value();
    }
    return rec;
  }

  // ---- events ----------------------------------------------------------------------------------

  void push(double t, EventType type, std::int32_t a, std::int32_t b, std::uint32_t version = 0) {
    events_.emplace(t, type, version, a, b);
  }

  void loop() {
    while (true) {
      if (gating_) wake_gated();
      flush_ready_groups();
      double te = events_.empty() ? kInf : events_.top_time();
      double tn = net_ ? net_->next_completion_time_before(te) : kInf;
      double t = std::min(te, tn);
      if (t == kInf) break;
      MOESIM_ASSERT(t >= now_, fmt::format("time went backwards: {} < {}", t, now_));
      now_ = t;
      if (tn <= t) {
        for (const BatchCompletion& c : net_->advance_to(t)) {
          ++result_.num_events;
          progress_tick(t);  // may throw Interrupted (the run is abandoned, see sim/progress)
          auto it = batch_cohort_.find(c.id);
          MOESIM_ASSERT(it != batch_cohort_.end(), "network completed an unknown batch");
          int cohort = it->second;
          batch_cohort_.erase(it);
          phase_part_done(cohort);
        }
      }
      while (!events_.empty() && events_.top_time() <= t) {
        const Event e = events_.pop();
        ++result_.num_events;
        progress_tick(t);
        handle(e);
      }
    }
  }

  void handle(const Event& e) {
    switch (e.type) {
      case EventType::kComputeDone:
        if (interference_ > 0) {
          int r = plan_.op(e.a).ranks.at(e.b);
          auto& run = running_[r];
          auto it = std::find_if(run.begin(), run.end(), [&](const RunningCompute& c) {
            return c.op == e.a && c.pos == e.b;
          });
          if (it == run.end() || it->version != e.version) {
            // Superseded by a reschedule after a rate change (possibly already finished).
            MOESIM_ASSERT(it != run.end() || !std::isnan(result_.end_s[entry(e.a, e.b)]),
                          "compute completion for an op that never started");
            return;
          }
          run.erase(it);
        }
        finish_instance(e.a, e.b);
        break;
      case EventType::kCopyDone:
        finish_instance(e.a, e.b);
        break;
      case EventType::kGroupBegin:
        begin_analytical_group(e.a, e.b);
        break;
      case EventType::kGroupDone:
        finish_group(e.a, e.b);
        break;
      case EventType::kPhasePartDone:
        phase_part_done(e.a);
        break;
    }
  }

  // ---- per-rank instances ----------------------------------------------------------------------

  void try_start(size_t k) {
    if (head_started_[k]) return;
    const QueueEntry q = head_q_[k];
    if (q.op < 0) return;
    if (deps_left_[entry(q.op, q.pos)] > 0) return;
    if (gating_ && plan_.op(q.op).priority < 0) {
      const int r = static_cast<int>(k / static_cast<size_t>(S_));
      // A yielding op starts only from wake_gated, after every event of the instant: an op that
      // becomes ready in the same instant as a priority op (both fed by one finishing op) must
      // not slip in because it happens to be visited first.
      if (reserve_[r] > 0 || !waking_) {
        gated_[r].push_back(k);
        if (!waking_) wake_.push_back(r);
        return;
      }
    }
    head_started_[k] = 1;
    start_instance(q.op, q.pos);
  }

  void start_instance(OpId id, int pos) {
    const Op& op = plan_.op(id);
    const int r = op.ranks.at(pos);
    if (gating_ && op.priority > 0) ++reserve_[r];
    switch (op.kind) {
      case OpKind::kCompute: {
        const ComputeSpec& spec = op.compute();
        double d;
        if (spec.rank_scale) {
          d = compute_.duration(spec, static_cast<double>((*spec.rank_scale)[pos])).value();
        } else {  // the same on every rank: computed once per op (a GEMM's time is not cheap)
          if (unscaled_duration_.empty())
            unscaled_duration_.assign(plan_.ops().size(), std::numeric_limits<double>::quiet_NaN());
          double& once = unscaled_duration_[static_cast<std::size_t>(id)];
          if (std::isnan(once)) once = compute_.duration(spec, 1.0).value();
          d = once;
        }
        result_.start_s[entry(id, pos)] = now_;
        if (interference_ > 0) {
          double f = active_comm_[r] > 0 ? 1.0 + interference_ : 1.0;
          running_[r].push_back({id, pos, d, now_, 0});
          push(now_ + d * f, EventType::kComputeDone, id, pos, 0);
        } else {
          push(now_ + d, EventType::kComputeDone, id, pos);
        }
        break;
      }
      case OpKind::kCopy:
        result_.start_s[entry(id, pos)] = now_;
        push(now_ + compute_.copy_duration(op.copy().bytes).value(), EventType::kCopyDone, id, pos);
        break;
      case OpKind::kCollective: {
        const auto gid = op.collective().grouping;
        const int gi = group_of_[gid][r];
        MOESIM_ASSERT(gi >= 0, "collective rank outside its grouping");
        auto& ready = group_ready_[group_ready_off_[id] + gi];
        if (++ready == plan_.grouping(gid).group_size()) ready_groups_.push_back({id, gi});
        break;
      }
    }
  }

  void finish_instance(OpId id, int pos) {
    const Op& op = plan_.op(id);
    const int r = op.ranks.at(pos);
    result_.end_s[entry(id, pos)] = now_;
    ++finished_;
    if (gating_ && op.priority > 0 && --reserve_[r] == 0) wake_.push_back(r);
    const size_t k = key(r, op.stream);
    MOESIM_ASSERT(head_q_[k].op == id, "finished op is not the head of its stream");
    head_q_[k] = next_q_[static_cast<size_t>(entry(id, pos))];
    head_started_[k] = 0;
    try_start(k);
    for (auto i = dep_off_[id]; i < dep_off_[id + 1]; ++i) {
      const Op& b = plan_.op(dependents_[i]);
      int q = b.ranks.index_of(r);
      if (q < 0) continue;
      if (--deps_left_[entry(b.id, q)] == 0) try_start(key(r, b.stream));
    }
  }

  // Communication starts (delta = +1) or ends (-1) on rank r: running compute changes speed.
  void comm_change(int r, int delta) {
    const int before = active_comm_[r];
    active_comm_[r] += delta;
    MOESIM_ASSERT(active_comm_[r] >= 0, "negative communication count");
    if (interference_ <= 0 || (before > 0) == (active_comm_[r] > 0)) return;
    const double f_old = before > 0 ? 1.0 + interference_ : 1.0;
    const double f_new = active_comm_[r] > 0 ? 1.0 + interference_ : 1.0;
    for (RunningCompute& c : running_[r]) {
      c.work_left_s = std::max(0.0, c.work_left_s - (now_ - c.last_t) / f_old);
      c.last_t = now_;
      ++c.version;
      push(now_ + c.work_left_s * f_new, EventType::kComputeDone, c.op, c.pos, c.version);
    }
  }

  // ---- collectives -----------------------------------------------------------------------------

  int num_chunks(const Op& op) const {
    double size = result_.collectives[record_index_.at(op.id)].size_bytes;
    if (op.partition_size.value() <= 0 || size <= op.partition_size.value()) return 1;
    return static_cast<int>(std::ceil(size / op.partition_size.value()));
  }

  // The spec one chunk of a partitioned collective runs with (bytes / n, matrices scaled).
  const CollectiveSpec& chunk_spec(const Op& op, int chunks) {
    if (chunks == 1) return op.collective();
    auto it = chunk_specs_.find(op.id);
    if (it != chunk_specs_.end()) return *it->second;
    auto spec = std::make_unique<CollectiveSpec>(op.collective());
    spec->bytes = spec->bytes / chunks;
    auto scale = [&](const std::shared_ptr<const ByteMatrix>& m) {
      if (!m) return m;
      auto s = std::make_shared<ByteMatrix>(*m);
      s->unit = s->unit / chunks;
      return std::shared_ptr<const ByteMatrix>(std::move(s));
    };
    spec->matrix = scale(spec->matrix);
    for (auto& m : spec->per_group) m = scale(m);
    return *chunk_specs_.emplace(op.id, std::move(spec)).first->second;
  }

  void group_started(OpId id, int gi, const collectives::Algorithm& algo) {
    const Op& op = plan_.op(id);
    const auto& group = plan_.grouping(op.collective().grouping).groups[gi];
    for (int r : group) {
      result_.start_s[entry(id, op.ranks.index_of(r))] = now_;
      comm_change(r, +1);
    }
    CollectiveRecord& rec = result_.collectives[record_index_.at(id)];
    if (rec.start_s == kInf) {
      rec.algo = algo.algo();
    } else if (rec.algo != algo.algo()) {
      rec.mixed_algos = true;
    }
    rec.start_s = std::min(rec.start_s, now_);
  }

  void finish_group(OpId id, int gi) {
    const Op& op = plan_.op(id);
    const auto& group = plan_.grouping(op.collective().grouping).groups[gi];
    CollectiveRecord& rec = result_.collectives[record_index_.at(id)];
    rec.end_s = std::max(rec.end_s, now_);
    for (int r : group) comm_change(r, -1);
    for (int r : group) finish_instance(id, op.ranks.index_of(r));
  }

  void flush_ready_groups() {
    if (ready_groups_.empty()) return;
    std::vector<std::pair<OpId, int>> ready;
    ready.swap(ready_groups_);
    std::sort(ready.begin(), ready.end());
    for (size_t i = 0; i < ready.size();) {
      size_t j = i;
      while (j < ready.size() && ready[j].first == ready[i].first) ++j;
      start_groups(ready[i].first, std::span(ready).subspan(i, j - i));
      i = j;
    }
  }

  // The analytical time of one group's collective, remembered by what decides it: a step's
  // micro-batches repeat the same collectives (the same grouping, sizes and shared matrices), and
  // the choice among algorithms with the fabric's cut charge is most of the cost of one. The
  // key holds every field of the spec the cost formulas read, so a hit is the same computation.
  AnalyticalCollective analytical_time_of(const collectives::CollectiveCall& call) {
    const CollectiveSpec& c = *call.spec;
    const ByteMatrix* m = call.matrix();
    const AnalyticalKey key{static_cast<int>(c.type),
                            static_cast<int>(c.algo),
                            c.grouping,
                            call.group_index,
                            c.bytes.value(),
                            m,
                            c.peer_offset,
                            c.sub_group,
                            c.saa_a2a_spans_group};
    if (auto it = analytical_memo_.find(key); it != analytical_memo_.end()) return it->second;
    const AnalyticalCollective a = analytical_collective_time(call, ctx_);
    analytical_memo_.emplace(key, a);
    return a;
  }

  void start_groups(OpId id, std::span<const std::pair<OpId, int>> groups) {
    const Op& op = plan_.op(id);
    const int chunks = num_chunks(op);
    const CollectiveSpec& spec = chunk_spec(op, chunks);
    const Grouping& grouping = plan_.grouping(spec.grouping);
    if (!net_) {
      for (const auto& [_, gi] : groups) {
        const AnalyticalCollective a = analytical_group(spec, gi, chunks);
        const double start = reserve_nics(grouping.groups[gi], a.time.value());
        if (start > now_) {
          push(start, EventType::kGroupBegin, id, gi);  // waits for its members' NICs
          continue;
        }
        group_started(id, gi, *a.algorithm);
        push(now_ + a.time.value(), EventType::kGroupDone, id, gi);
      }
      return;
    }
    // Lower every group; merge those with the same algorithm and phase structure into cohorts.
    std::vector<int> open;  // cohorts opened by this call, by algorithm/structure
    std::vector<const collectives::Algorithm*> open_algo;
    for (const auto& [_, gi] : groups) {
      collectives::CollectiveCall call{&spec, &grouping.groups[gi], gi, false};
      const collectives::Algorithm& algo = collectives::select_algorithm(call, ctx_);
      std::vector<collectives::Phase> phases = algo.lower(call, topo_);
      group_started(id, gi, algo);
      int target = -1;
      if (cfg_.merge_ready_groups) {
        for (size_t c = 0; c < open.size() && target < 0; ++c)
          if (open_algo[c] == &algo && same_structure(cohorts_[open[c]].phases, phases))
            target = open[c];
      }
      if (target < 0) {
        target = new_cohort();
        Cohort& co = cohorts_[target];
        co.op = id;
        co.phases = std::move(phases);
        co.chunks_left = chunks;
        open.push_back(target);
        open_algo.push_back(&algo);
      } else {
        merge_into(cohorts_[target].phases, std::move(phases));
      }
      cohorts_[target].groups.push_back(gi);
    }
    for (int c : open) {
      cohorts_[c].phase = 0;
      run_phase(c);
    }
  }

  // The analytical path's contention: a group that spans nodes takes its members' NICs from
  // when all of them are free until it ends, so collectives that would share the NICs (a
  // pipeline's dispatch and combine chunks on their two streams, an all-reduce beside an
  // all-to-all) follow one another, as on the flow engine's links. Groups inside a node do not
  // queue. Returns when the group's collective can start.
  double reserve_nics(const std::vector<int>& ranks, double duration_s) {
    if (!cfg_.analytical_nic_sharing || ranks.empty()) return now_;
    const int node = topo_.node_of(ranks.front());
    if (std::all_of(ranks.begin(), ranks.end(), [&](int r) { return topo_.node_of(r) == node; }))
      return now_;
    if (nic_free_at_.empty()) nic_free_at_.assign(P_, 0.0);
    double start = now_;
    for (int r : ranks) start = std::max(start, nic_free_at_[r]);
    for (int r : ranks) nic_free_at_[r] = start + duration_s;
    return start;
  }

  // Group gi of a collective on the analytical path: its algorithm and its time over all
  // `chunks` (each chunk runs `spec`).
  AnalyticalCollective analytical_group(const CollectiveSpec& spec, int gi, int chunks) {
    const Grouping& grouping = plan_.grouping(spec.grouping);
    collectives::CollectiveCall call{&spec, &grouping.groups[gi], gi, false};
    AnalyticalCollective a = analytical_time_of(call);
    a.time = Seconds(a.time.value() * chunks);
    return a;
  }

  // A queued analytical group starts now (its NICs are free): the same call and time as when
  // it was reserved.
  void begin_analytical_group(OpId id, int gi) {
    const Op& op = plan_.op(id);
    const int chunks = num_chunks(op);
    const AnalyticalCollective a = analytical_group(chunk_spec(op, chunks), gi, chunks);
    group_started(id, gi, *a.algorithm);
    push(now_ + a.time.value(), EventType::kGroupDone, id, gi);
  }

  static bool same_structure(const std::vector<collectives::Phase>& a,
                             const std::vector<collectives::Phase>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].kind != b[i].kind || a[i].repeat != b[i].repeat) return false;
      // Local work must cost the same, or lockstep would charge one group another's copies.
      if (a[i].local_bytes != b[i].local_bytes) return false;
    }
    return true;
  }

  static void merge_into(std::vector<collectives::Phase>& into,
                         std::vector<collectives::Phase>&& from) {
    for (size_t i = 0; i < into.size(); ++i)
      into[i].transfers.insert(into[i].transfers.end(), from[i].transfers.begin(),
                               from[i].transfers.end());
  }

  int new_cohort() {
    if (!free_cohorts_.empty()) {
      int c = free_cohorts_.back();
      free_cohorts_.pop_back();
      cohorts_[c] = Cohort{};
      cohorts_[c].active = true;
      return c;
    }
    cohorts_.emplace_back();
    cohorts_.back().active = true;
    return static_cast<int>(cohorts_.size()) - 1;
  }

  // Starts cohort c's current phase (from its first repetition), or completes the cohort.
  void run_phase(int c) {
    Cohort& co = cohorts_[c];
    if (co.phase == co.phases.size()) {
      if (--co.chunks_left > 0) {
        co.phase = 0;
      } else {
        complete_cohort(c);
        return;
      }
    }
    co.repeat_left = std::max(1, co.phases[co.phase].repeat);
    run_repetition(c);
  }

  void run_repetition(int c) {
    Cohort& co = cohorts_[c];
    const collectives::Phase& ph = co.phases[co.phase];
    const double local_s = compute_.memory_time(ph.local_bytes).value();
    co.parts_left = 0;
    if (ph.kind == collectives::Phase::Kind::kTransfers) {
      if (!ph.transfers.empty()) {
        BatchId b = net_->start_batch(now_, ph.transfers, plan_.op(co.op).priority);
        batch_cohort_.emplace(b, c);
        ++co.parts_left;
        double bytes = 0;
        for (const Transfer& t : ph.transfers) bytes += t.bytes;
        result_.collectives[record_index_.at(co.op)].wire_bytes += bytes;
      }
    }
    // Copies and reductions, and the self copies that run alongside a transfer phase.
    if (local_s > 0 || co.parts_left == 0) {
      push(now_ + local_s, EventType::kPhasePartDone, c, 0);
      ++co.parts_left;
    }
  }

  void phase_part_done(int c) {
    Cohort& co = cohorts_[c];
    MOESIM_ASSERT(co.active && co.parts_left > 0, "phase completion for an idle cohort");
    if (--co.parts_left > 0) return;
    if (--co.repeat_left > 0) {
      run_repetition(c);
      return;
    }
    if (co.chunks_left == 1) {
      // Last use of this phase: release its transfers (a 4,096-rank all-to-all holds millions).
      std::vector<Transfer>().swap(co.phases[co.phase].transfers);
    }
    ++co.phase;
    run_phase(c);
  }

  void complete_cohort(int c) {
    std::vector<int> groups = std::move(cohorts_[c].groups);
    OpId id = cohorts_[c].op;
    cohorts_[c] = Cohort{};
    free_cohorts_.push_back(c);
    for (int gi : groups) finish_group(id, gi);
  }

  // ---- end -------------------------------------------------------------------------------------

  void check_finished() {
    if (finished_ == result_.op_offset.back()) return;
    // Name the first op instance that never ran and why.
    for (const Op& op : plan_.ops()) {
      for (int p = 0; p < op.ranks.size(); ++p) {
        if (!std::isnan(result_.end_s[entry(op.id, p)])) continue;
        int r = op.ranks.at(p);
        std::string why;
        if (deps_left_[entry(op.id, p)] > 0) {
          why = fmt::format("{} of its deps never finished there", deps_left_[entry(op.id, p)]);
        } else if (head_q_[key(r, op.stream)].op != op.id) {
          const Op& h = plan_.op(head_q_[key(r, op.stream)].op);
          why = fmt::format("stream '{}' is blocked by op {} '{}'", plan_.stream_names()[op.stream],
                            h.id, h.label);
        } else if (op.kind == OpKind::kCollective) {
          why = "other members of its group never reached it";
        } else {
          why = "it never completed";
        }
        throw RuntimeError(
            fmt::format("engine: the plan deadlocks: op {} '{}' never ran on "
                        "rank {}: {}",
                        op.id, op.label, r, why));
      }
    }
    throw RuntimeError("engine: the plan deadlocks");
  }

  void finish_result() {
    summarize_run(plan_, result_);
    if (!net_) return;
    std::vector<double> bytes = net_->link_bytes();
    const auto& links = topo_.links();
    if (bytes.empty() || bytes.size() != links.size()) return;
    const double span = result_.makespan_s;
    std::vector<LinkTierUtilisation>& tiers = result_.link_tiers;
    for (size_t i = 0; i < links.size(); ++i) {
      const int tier = links[i].tier;
      auto it = std::find_if(tiers.begin(), tiers.end(),
                             [&](const LinkTierUtilisation& t) { return t.tier == tier; });
      if (it == tiers.end()) {
        tiers.push_back({});
        it = tiers.end() - 1;
        it->tier = tier;
      }
      const double cap = links[i].bandwidth.value() * span;
      const double u = cap > 0 ? bytes[i] / cap : 0.0;
      ++it->num_links;
      it->bytes += bytes[i];
      it->max_utilisation = std::max(it->max_utilisation, u);
      it->mean_utilisation += u;  // divided below
    }
    for (auto& t : tiers) t.mean_utilisation /= std::max(1, t.num_links);
    std::sort(tiers.begin(), tiers.end(),
              [](const auto& a, const auto& b) { return a.tier < b.tier; });
  }

  const Plan& plan_;
  const topology::Topology& topo_;
  const EngineConfig& cfg_;
  NetworkModel* net_;
  ComputeModel compute_;
  collectives::CostContext ctx_;
  std::vector<double> unscaled_duration_;  // per op without rank_scale: its compute time
  struct AnalyticalKey {
    int type, algo;
    GroupingId grouping;
    int group_index;
    double bytes;
    const ByteMatrix* matrix;  // shared by the micro-batches' copies of an op
    int peer_offset, sub_group;
    bool spans;
    bool operator==(const AnalyticalKey&) const = default;
  };
  struct AnalyticalKeyHash {
    std::size_t operator()(const AnalyticalKey& k) const {
      std::size_t h = std::hash<double>()(k.bytes);
      for (std::size_t v :
           {static_cast<std::size_t>(k.type), static_cast<std::size_t>(k.algo),
            static_cast<std::size_t>(k.grouping), static_cast<std::size_t>(k.group_index),
            std::hash<const void*>()(k.matrix), static_cast<std::size_t>(k.peer_offset),
            static_cast<std::size_t>(k.sub_group), static_cast<std::size_t>(k.spans)})
        h = h * 1000003u ^ v;
      return h;
    }
  };
  std::unordered_map<AnalyticalKey, AnalyticalCollective, AnalyticalKeyHash> analytical_memo_;
  // Per GPU, when its NIC is free of analytical collectives (reserve_nics).
  std::vector<double> nic_free_at_;
  const int P_;
  const int S_;
  double interference_ = 0;

  RunResult result_;
  double now_ = 0;
  std::int64_t finished_ = 0;
  EventQueue<Event> events_;

  std::vector<std::int64_t> dep_off_;
  std::vector<OpId> dependents_;
  std::vector<std::int32_t> deps_left_;
  std::vector<QueueEntry> next_q_;  // per instance: the next one on its (rank, stream), op -1
  std::vector<char> head_started_;
  std::vector<QueueEntry> head_q_;  // each (rank, stream)'s next instance, op -1 once done

  std::vector<std::vector<int>> group_of_;  // per grouping: rank -> group index (-1)
  std::vector<std::int64_t> group_ready_off_;
  std::vector<std::int32_t> group_ready_;
  std::unordered_map<OpId, size_t> record_index_;
  std::unordered_map<OpId, std::unique_ptr<CollectiveSpec>> chunk_specs_;
  std::vector<std::pair<OpId, int>> ready_groups_;

  std::vector<Cohort> cohorts_;
  std::vector<int> free_cohorts_;
  std::unordered_map<BatchId, int> batch_cohort_;

  std::vector<int> active_comm_;
  // Priority gate (Lina): per rank, instances with priority > 0 ready or running; stream keys
  // whose head (priority < 0) waits for that count to reach 0; ranks whose count just did.
  bool gating_ = false;
  std::vector<int> reserve_;
  std::vector<std::vector<size_t>> gated_;
  std::vector<int> wake_;
  bool waking_ = false;  // inside wake_gated: yielding ops may start

  // Runs after every event of one instant, so a priority op that becomes ready in the same
  // instant as another one finishes keeps the gate closed (no micro-op slips in between).
  void wake_gated() {
    if (wake_.empty()) return;
    std::vector<int> ranks;
    ranks.swap(wake_);
    waking_ = true;
    for (int r : ranks) {
      if (reserve_[r] > 0) continue;
      std::vector<size_t> keys;
      keys.swap(gated_[r]);
      for (size_t k : keys) try_start(k);
    }
    waking_ = false;
  }
  std::vector<std::vector<RunningCompute>> running_;
};

}  // namespace

RunResult run_plan(const Plan& plan, const topology::Topology& topo, const EngineConfig& config) {
  if (config.network == NetworkKind::kAnalytical) {
    plan.validate();
    return Engine(plan, topo, config, nullptr).run();
  }
  auto net = make_network_model(config.network, topo, config.net, config.flow_event_tolerance,
                                config.flow_sharing, config.simgrid_mode);
  return run_plan(plan, topo, config, *net);
}

RunResult run_plan(const Plan& plan, const topology::Topology& topo, const EngineConfig& config,
                   NetworkModel& network) {
  plan.validate();
  return Engine(plan, topo, config, &network).run();
}

}  // namespace moesim::sim
