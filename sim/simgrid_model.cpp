// SimGrid network model: see simgrid_model.hpp for the semantics and the two traffic modes.
//
// Platform: one SimGrid host per GPU (netpoint id == rank) and one SimGrid link per directed
// topology link, all in a single custom routing zone whose get_local_route() asks
// topology.route() on demand. Routes are never stored: a full routing table would need P^2 routes
// (16 M at 4,096 GPUs), while our Topology computes a route in O(path length). Switches need no
// SimGrid counterpart because a route is just the list of links it crosses.
#include "sim/simgrid_model.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <xbt/log.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <simgrid/kernel/resource/Model.hpp>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u.hpp>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/error.hpp"
#include "topology/topology.hpp"

namespace moesim::sim {

namespace sg4 = simgrid::s4u;
namespace sgr = simgrid::kernel::routing;
namespace sgres = simgrid::kernel::resource;

std::string_view simgrid_mode_name(SimgridMode m) {
  switch (m) {
    case SimgridMode::kPerFlow:
      return "per_flow";
    case SimgridMode::kPtask:
      return "ptask";
    case SimgridMode::kAuto:
      return "auto";
  }
  return "?";
}

SimgridMode parse_simgrid_mode(std::string_view text) {
  if (text == "per_flow") return SimgridMode::kPerFlow;
  if (text == "ptask") return SimgridMode::kPtask;
  if (text == "auto") return SimgridMode::kAuto;
  throw InputError({}, "simgrid.mode",
                   "found '" + std::string(text) + "', expected one of per_flow, ptask, auto");
}

namespace {

std::atomic<bool> g_engine_created{false};

/// Routing zone that answers every route query from our Topology. SimGrid owns and deletes it.
class TopologyZone final : public sgr::NetZoneImpl {
 public:
  /// With `report_latency` false, routes report zero latency (per_flow mode pays it itself).
  TopologyZone(const std::string& name, const topology::Topology& topo, double message_latency_s,
               bool report_latency)
      : sgr::NetZoneImpl(name),
        topo_(topo),
        message_latency_s_(message_latency_s),
        report_latency_(report_latency) {}

  void set_links(std::vector<sgres::StandardLinkImpl*> links) { links_ = std::move(links); }
  void set_ranks(std::vector<int> rank_of_netpoint) {
    rank_of_netpoint_ = std::move(rank_of_netpoint);
  }

  /// L = sum of the route's link latencies + the per-message latency. L07 keeps a task out of the
  /// sharing during its latency phase (the largest L of its flows).
  void get_local_route(const sgr::NetPoint* src, const sgr::NetPoint* dst, sgr::Route* into,
                       double* latency) override {
    const int s = rank_of(src);
    const int d = rank_of(dst);
    MOESIM_ASSERT(s != d, "simgrid: route asked from a GPU to itself");
    scratch_.clear();
    topo_.route(s, d, scratch_);
    double lat = message_latency_s_;
    for (topology::LinkId l : scratch_) {
      into->link_list_.push_back(links_[l]);
      lat += topo_.links()[l].latency.value();
    }
    if (latency != nullptr && report_latency_) *latency += lat;
  }

 private:
  int rank_of(const sgr::NetPoint* p) const {
    const auto id = p->id();
    MOESIM_ASSERT(id < rank_of_netpoint_.size() && rank_of_netpoint_[id] >= 0,
                  "simgrid: route endpoint is not a GPU host");
    return rank_of_netpoint_[id];
  }

  const topology::Topology& topo_;
  double message_latency_s_;
  bool report_latency_;
  std::vector<sgres::StandardLinkImpl*> links_;
  std::vector<int> rank_of_netpoint_;
  std::vector<topology::LinkId> scratch_;
};

/// SimGrid 3.32 exposes the models only through shared_ptrs to classes whose definitions are in
/// private headers. NetworkModel and HostModel derive from resource::Model first (single or
/// primary base), so the pointer is the Model's address; the constructor checks the model names
/// to make sure the layout is what we expect.
/// "gpu12", "l7": built by appending, because `"gpu" + std::to_string(g)` trips a GCC 12
/// -Wrestrict false positive at -O3.
std::string prefixed(const char* prefix, std::size_t i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

template <typename T>
sgres::Model* as_model(const std::shared_ptr<T>& p) {
  return reinterpret_cast<sgres::Model*>(p.get());
}

/// Fingerprint of a topology, to tell whether a later model may reuse the platform built for an
/// earlier one: its address (the zone keeps a reference to it), GPU count and every link.
std::vector<double> topology_fingerprint(const topology::Topology& topo) {
  std::vector<double> f{static_cast<double>(reinterpret_cast<std::uintptr_t>(&topo)),
                        static_cast<double>(topo.num_gpus())};
  f.reserve(2 + 2 * topo.links().size());
  for (const topology::Link& l : topo.links()) {
    f.push_back(l.bandwidth.value());
    f.push_back(l.latency.value());
  }
  return f;
}

/// The process's one SimGrid engine and platform (SimGrid 3.32 allows one engine per process).
/// Built by the first SimgridModel and kept for the life of the process, so that later models on
/// the same topology and mode (the strategies and iterations of one `moesim simulate`) run on it,
/// each from the engine's clock at its creation as its time zero.
struct SharedPlatform {
  std::unique_ptr<sg4::Engine> engine;
  TopologyZone* zone = nullptr;  // owned by SimGrid
  std::vector<sg4::Host*> hosts;
  std::vector<sgres::Model*> models;  // the ones that schedule our activities
  SimgridMode mode = SimgridMode::kPerFlow;
  double message_latency_s = 0;
  std::vector<double> fingerprint;
  bool in_use = false;  // a model is running on it (one at a time: completions go to `active`)
};
SharedPlatform* g_platform = nullptr;  // never freed: SimGrid's engine lives until exit

}  // namespace

struct SimgridModel::Impl {
  struct Batch {
    std::vector<Transfer> flows;     // the network flows, grouped by activity
    std::vector<double> overhead_s;  // per flow: its endpoint time (NetworkParams::overhead_s)
    std::int64_t remaining = 0;      // activities not finished
    double floor_s = 0;              // earliest completion (latency of zero-byte flows, start time)
  };
  struct InFlight {
    BatchId batch = -1;
    std::uint32_t begin = 0, end = 0;  // range in Batch::flows
    sg4::ActivityPtr activity;
  };

  const topology::Topology& topo;
  NetworkParams params;
  SenderMessages senders;  // per-batch message counts, when params.peer_cache > 0
  SimgridMode mode;
  SharedPlatform* pf = nullptr;
  sg4::Engine* engine = nullptr;
  std::vector<sg4::Host*>& hosts;
  std::vector<sgres::Model*>& models;
  // The engine's clock when this model was built: SimGrid time = base + model time.
  double base = 0;

  double now = 0;
  double target = 0;  // the time advance_sg() is running to, for snapping completion times
  BatchId next_id = 0;
  std::int64_t activities_started = 0;
  std::map<BatchId, Batch> batches;
  std::unordered_map<const sg4::Activity*, InFlight> inflight;
  std::vector<sg4::ActivityPtr> finished;  // released after run_until returns
  std::multimap<double, BatchId> pending;  // batches done in SimGrid, not yet reported
  // per_flow: flows in their latency phase, by the time they start moving.
  struct Waiting {
    double time_s;
    BatchId batch;
    std::uint32_t index;
    double work;
    bool operator>(const Waiting& o) const { return time_s > o.time_s; }
  };
  std::priority_queue<Waiting, std::vector<Waiting>, std::greater<Waiting>> waiting;
  std::vector<double> bytes_per_link;
  std::vector<topology::LinkId> scratch;
  std::vector<int> local_index;  // ptask grouping: GPU -> index in the task's host list

  static Impl* active;  // the one model receiving SimGrid's completion signals

  Impl(const topology::Topology& t, NetworkParams p, SharedPlatform& shared)
      : topo(t),
        params(p),
        mode(shared.mode),
        pf(&shared),
        engine(shared.engine.get()),
        hosts(shared.hosts),
        models(shared.models),
        base(sg4::Engine::get_clock()),
        bytes_per_link(t.links().size(), 0.0) {}

  double clock() const { return sg4::Engine::get_clock() - base; }

  // ---- time ----
  void advance_sg(double t) {
    target = t;
    // run_until() must not be given a date in the past, even by one ulp.
    const double goal = std::max(base + t, sg4::Engine::get_clock());
    // Engine::run_until stops early when it lands within 1e-5 s of the goal (the loop condition
    // of EngineImpl::run), so repeat until the clock is there; each call makes progress.
    int guard = 0;
    do {
      engine->run_until(goal);
    } while (sg4::Engine::get_clock() < goal && ++guard < 1000000);
    MOESIM_ASSERT(sg4::Engine::get_clock() >= goal, "simgrid: run_until makes no progress");
    // SimGrid can leave an activity a few bytes short, due d > 0 after the clock but within its
    // rounding: run_until() to the time asked for then steps its models by 0 (clock + d == clock,
    // or base + t rounds below clock + d once runs share the clock, base > 0), the activity never
    // finishes, and the engine asks for that same time forever (the DeepSeek-V3 and Qwen3 presets
    // stalled so in ptask mode). One ulp past the clock lets the models step by d.
    for (int step = 0; step < 64 && !inflight.empty() && due_by(t); ++step)
      engine->run_until(std::nextafter(sg4::Engine::get_clock(), kNever));
    finished.clear();
  }

  // Whether a model's next event falls at or before model time t, by the arithmetic
  // next_completion_time() reports it with (clock() + d): an event it reported as due by t is.
  bool due_by(double t) const {
    const double c = sg4::Engine::get_clock();
    for (sgres::Model* m : models) {
      const double e = m->next_occurring_event(c);
      if (e >= 0 && c - base + e <= t) return true;
    }
    return false;
  }

  void sync_to(double t) {
    MOESIM_ASSERT(t >= now, "simgrid: time went backwards");
    // Flows whose latency phase ends by t start moving at exactly that time.
    while (!waiting.empty() && waiting.top().time_s <= t) {
      const double ts = waiting.top().time_s;
      advance_sg(ts);
      while (!waiting.empty() && waiting.top().time_s <= ts) {
        const Waiting w = waiting.top();
        waiting.pop();
        start_comm(w.batch, w.index, w.work);
      }
    }
    if (t > now || !inflight.empty()) advance_sg(t);
    now = t;
  }

  double completion_time_now() const {
    const double c = clock();
    return std::abs(c - target) <= 1e-12 * std::max(1.0, std::abs(target)) ? target : c;
  }

  // ---- completions ----
  void on_activity_done(const sg4::Activity& a) {
    auto it = inflight.find(&a);
    if (it == inflight.end()) return;
    InFlight f = std::move(it->second);
    inflight.erase(it);
    // Keep the activity alive until SimGrid is done with its completion callbacks.
    finished.push_back(std::move(f.activity));
    Batch& b = batches.at(f.batch);
    for (std::uint32_t i = f.begin; i < f.end; ++i) {
      const Transfer& tr = b.flows[i];
      scratch.clear();
      topo.route(tr.src, tr.dst, scratch);
      // Payload plus the per-message overhead bytes, as the flow model counts them.
      const double w = tr.bytes + b.overhead_s[i] * topo.links()[scratch.front()].bandwidth.value();
      for (topology::LinkId l : scratch) bytes_per_link[l] += w;
    }
    if (--b.remaining == 0) {
      pending.emplace(std::max(completion_time_now(), b.floor_s), f.batch);
    }
  }

  // ---- starting traffic ----
  double flow_work(const Transfer& tr, double overhead_s, double* latency_s) {
    scratch.clear();
    topo.route(tr.src, tr.dst, scratch);
    MOESIM_ASSERT(!scratch.empty(), "simgrid: empty route between two GPUs");
    double lat = params.message_latency_s;
    for (topology::LinkId l : scratch) lat += topo.links()[l].latency.value();
    *latency_s = lat;
    if (tr.bytes <= 0) return 0;
    return tr.bytes + overhead_s * topo.links()[scratch.front()].bandwidth.value();
  }

  void track(const sg4::ActivityPtr& act, BatchId id, std::uint32_t begin, std::uint32_t end) {
    inflight.emplace(act.get(), InFlight{id, begin, end, act});
    ++activities_started;
  }

  void start_comm(BatchId id, std::uint32_t i, double work) {
    const Transfer& tr = batches.at(id).flows[i];
    // Payloads are integer bytes in SimGrid: W is rounded (an error of at most half a byte).
    auto comm = sg4::Comm::sendto_init(hosts[tr.src], hosts[tr.dst]);
    comm->set_payload_size(static_cast<std::uint64_t>(std::llround(work)));
    track(comm, id, i, i + 1);
    comm->start();
  }

  /// per_flow: CM02 weighs each flow's share by its latency (sharing penalty = route latency,
  /// TCP's RTT unfairness: a flow with twice the latency gets half the rate), which is not the
  /// max-min the flow model computes. No setting removes it (network/weight-S only adds to it),
  /// so routes report zero latency to SimGrid, every flow has the same penalty, and the model
  /// pays L itself: the Comm starts when the latency phase ends.
  void start_per_flow(BatchId id, Batch& b, const std::vector<double>& work,
                      const std::vector<double>& latency) {
    b.remaining = static_cast<std::int64_t>(b.flows.size());
    for (std::uint32_t i = 0; i < b.flows.size(); ++i) {
      if (latency[i] > 0) {
        waiting.push({now + latency[i], id, i, work[i]});
      } else {
        start_comm(id, i, work[i]);
      }
    }
  }

  void start_ptask(BatchId id, Batch& b, const std::vector<double>& work) {
    // Group by (source node, destination node): one parallel task per pair.
    const std::size_t n = b.flows.size();
    std::vector<std::uint32_t> order(n);
    for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
    const auto key = [&](std::uint32_t i) {
      return std::pair(topo.node_of(b.flows[i].src), topo.node_of(b.flows[i].dst));
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](std::uint32_t x, std::uint32_t y) { return key(x) < key(y); });
    std::vector<Transfer> sorted_flows(n);
    std::vector<double> sorted_work(n), sorted_overhead(n);
    for (std::size_t i = 0; i < n; ++i) {
      sorted_flows[i] = b.flows[order[i]];
      sorted_work[i] = work[order[i]];
      sorted_overhead[i] = b.overhead_s[order[i]];
    }
    b.flows = std::move(sorted_flows);
    b.overhead_s = std::move(sorted_overhead);

    if (local_index.size() != hosts.size()) local_index.assign(hosts.size(), -1);
    std::vector<sg4::Host*> task_hosts;
    std::vector<double> bytes, flops;
    std::size_t begin = 0;
    while (begin < n) {
      std::size_t end = begin + 1;
      const auto k0 = std::pair(topo.node_of(b.flows[begin].src), topo.node_of(b.flows[begin].dst));
      while (end < n &&
             std::pair(topo.node_of(b.flows[end].src), topo.node_of(b.flows[end].dst)) == k0) {
        ++end;
      }
      task_hosts.clear();
      const auto index_of = [&](int gpu) {
        if (local_index[gpu] < 0) {
          local_index[gpu] = static_cast<int>(task_hosts.size());
          task_hosts.push_back(hosts[gpu]);
        }
        return local_index[gpu];
      };
      for (std::size_t i = begin; i < end; ++i) {
        index_of(b.flows[i].src);
        index_of(b.flows[i].dst);
      }
      const std::size_t k = task_hosts.size();
      bytes.assign(k * k, 0.0);
      flops.assign(k, 0.0);
      for (std::size_t i = begin; i < end; ++i) {
        bytes[local_index[b.flows[i].src] * k + local_index[b.flows[i].dst]] += sorted_work[i];
      }
      for (std::size_t i = begin; i < end; ++i) {
        local_index[b.flows[i].src] = -1;
        local_index[b.flows[i].dst] = -1;
      }
      auto task = sg4::Exec::init();
      task->set_hosts(task_hosts);
      task->set_flops_amounts(flops);
      task->set_bytes_amounts(bytes);
      ++b.remaining;
      track(task, id, static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(end));
      task->start();
      begin = end;
    }
  }

  BatchId start_batch(double now_s, const std::vector<Transfer>& transfers) {
    sync_to(now_s);
    const BatchId id = next_id++;
    Batch& b = batches[id];
    b.floor_s = now;
    std::vector<double> work, latency;
    work.reserve(transfers.size());
    latency.reserve(transfers.size());
    const bool per_peer = params.peer_cache > 0;
    if (per_peer) senders.count(transfers);
    for (const Transfer& tr : transfers) {
      MOESIM_ASSERT(tr.src >= 0 && tr.src < static_cast<int>(hosts.size()) && tr.dst >= 0 &&
                        tr.dst < static_cast<int>(hosts.size()),
                    "simgrid: transfer between unknown GPUs");
      MOESIM_ASSERT(tr.bytes >= 0, "simgrid: negative transfer size");
      if (tr.src == tr.dst) continue;  // local: no network traffic
      double latency_s = 0;
      const double overhead_s =
          per_peer ? params.overhead_s(senders[tr.src]) : params.message_overhead_s;
      const double w = flow_work(tr, overhead_s, &latency_s);
      if (w <= 0) {
        // Zero bytes: only the latency. Handled here because a parallel task skips empty pairs.
        b.floor_s = std::max(b.floor_s, now + latency_s);
        continue;
      }
      b.flows.push_back(tr);
      b.overhead_s.push_back(overhead_s);
      work.push_back(w);
      latency.push_back(latency_s);
    }
    if (b.flows.empty()) {
      pending.emplace(b.floor_s, id);
      return id;
    }
    if (mode == SimgridMode::kPerFlow) {
      start_per_flow(id, b, work, latency);
    } else {
      start_ptask(id, b, work);
    }
    return id;
  }

  double next_completion_time() const {
    double t = pending.empty() ? kNever : pending.begin()->first;
    if (!waiting.empty()) t = std::min(t, waiting.top().time_s);
    if (!inflight.empty()) {
      const double c = sg4::Engine::get_clock();
      double d = -1;
      for (sgres::Model* m : models) {
        const double e = m->next_occurring_event(c);
        if (e >= 0 && (d < 0 || e < d)) d = e;
      }
      MOESIM_ASSERT(d >= 0, "simgrid: flows in flight but no next event (zero bandwidth?)");
      t = std::min(t, std::max(now, c - base + d));
    }
    return t;
  }

  std::vector<BatchCompletion> advance_to(double t) {
    sync_to(t);
    std::vector<BatchCompletion> out;
    while (!pending.empty() && pending.begin()->first <= t) {
      out.push_back({pending.begin()->second, pending.begin()->first});
      batches.erase(pending.begin()->second);
      pending.erase(pending.begin());
    }
    std::sort(out.begin(), out.end(),
              [](const BatchCompletion& a, const BatchCompletion& b) { return a.id < b.id; });
    return out;
  }
};

SimgridModel::Impl* SimgridModel::Impl::active = nullptr;

bool SimgridModel::engine_created() { return g_engine_created.load(); }

SimgridModel::SimgridModel(const topology::Topology& topo, NetworkParams params,
                           SimgridOptions options) {
  SimgridMode mode = options.mode;
  if (mode == SimgridMode::kAuto) {
    mode = topo.num_gpus() <= options.auto_per_flow_max_gpus ? SimgridMode::kPerFlow
                                                             : SimgridMode::kPtask;
  }
  if (g_platform != nullptr) {
    // Reuse the platform: same topology object and links, same mode and message latency (the
    // zone reports it in ptask mode), and no other model running on it.
    SharedPlatform& pf = *g_platform;
    if (pf.in_use || pf.mode != mode || pf.message_latency_s != params.message_latency_s ||
        pf.fingerprint != topology_fingerprint(topo)) {
      throw RuntimeError(fmt::format(
          "simgrid: this process already built a SimGrid platform ({} mode{}); SimGrid 3.32 "
          "allows one engine per process, so one process runs one topology and mode at a time "
          "(here: {} mode on {} GPUs; run each topology in a moesim command of its own)",
          resolved_simgrid_mode_name(pf.mode), pf.in_use ? ", still in use" : "",
          resolved_simgrid_mode_name(mode), topo.num_gpus()));
    }
    pf.in_use = true;
    impl_ = std::make_unique<Impl>(topo, params, pf);
    Impl::active = impl_.get();
    return;
  }
  g_engine_created.store(true);
  g_platform = new SharedPlatform;
  SharedPlatform& pf = *g_platform;
  pf.mode = mode;
  pf.message_latency_s = params.message_latency_s;
  pf.fingerprint = topology_fingerprint(topo);

  // SimGrid prints every configuration change at INFO level; only warnings matter here.
  xbt_log_control_set("root.thresh:warning");
  // SimGrid installs its own SIGINT handler with the engine (it prints actor status and calls
  // exit(1)); the process's handler (moesim's Ctrl-C: stop, report, write nothing, exit 130) must
  // stay in force, so it is put back.
  struct sigaction sigint_before {};
  sigaction(SIGINT, nullptr, &sigint_before);
  pf.engine = std::make_unique<sg4::Engine>("moesim");
  sigaction(SIGINT, &sigint_before, nullptr);
  // The plain fluid max-min model (see the header): no TCP window bound, no latency or bandwidth
  // correction factors, no reverse-direction cross traffic, no RTT-weighted sharing.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");
  sg4::Engine::set_config("network/latency-factor:1");
  sg4::Engine::set_config("network/bandwidth-factor:1");
  sg4::Engine::set_config("network/weight-S:0");
  // Times closer than surf/precision count as equal: the default (1e-5 s) ends flows and latency
  // phases up to 10 us early, a 1-2% error on millisecond batches with microsecond latencies.
  // Not much lower than 1 ns: an L07 task ends when its remaining work (1.0 at start) falls below
  // surf/precision x maxmin/precision (1e-5), which must stay above double rounding.
  sg4::Engine::set_config("surf/precision:1e-9");
  if (mode == SimgridMode::kPtask) sg4::Engine::set_config("host/model:ptask_L07");

  // The first zone created becomes the root and instantiates the models.
  pf.zone = new TopologyZone("moesim", topo, params.message_latency_s,
                             /*report_latency=*/mode == SimgridMode::kPtask);
  const int p = topo.num_gpus();
  pf.hosts.reserve(p);
  std::vector<int> rank_of_netpoint;
  for (int g = 0; g < p; ++g) {
    sg4::Host* h = pf.zone->create_host(prefixed("gpu", g), std::vector<double>{1.0});
    h->seal();
    const auto id = h->get_netpoint()->id();
    if (rank_of_netpoint.size() <= id) rank_of_netpoint.resize(id + 1, -1);
    rank_of_netpoint[id] = g;
    pf.hosts.push_back(h);
  }
  pf.zone->set_ranks(std::move(rank_of_netpoint));
  std::vector<sgres::StandardLinkImpl*> links;
  links.reserve(topo.links().size());
  for (std::size_t l = 0; l < topo.links().size(); ++l) {
    const topology::Link& link = topo.links()[l];
    MOESIM_ASSERT(link.bandwidth.value() > 0, "simgrid: link with zero bandwidth");
    sg4::Link* sl =
        pf.zone->create_link(prefixed("l", l), std::vector<double>{link.bandwidth.value()});
    sl->set_latency(link.latency.value());
    sl->seal();
    links.push_back(sl->get_impl());
  }
  pf.zone->set_links(std::move(links));
  pf.zone->seal();

  sgres::Model* net = as_model(pf.zone->get_network_model());
  sgres::Model* host = as_model(pf.zone->get_host_model());
  const std::string expect_net = mode == SimgridMode::kPtask ? "Network_Ptask" : "Network_CM02";
  const std::string expect_host = mode == SimgridMode::kPtask ? "Host_Ptask" : "Host_CLM03";
  if (net == nullptr || host == nullptr || net->get_name() != expect_net ||
      host->get_name() != expect_host) {
    throw RuntimeError("simgrid: unexpected SimGrid models (expected " + expect_net + " and " +
                       expect_host + ")");
  }
  pf.models = {net, host};
  sg4::Activity::on_completion_cb([](const sg4::Activity& a) {
    if (Impl::active != nullptr) Impl::active->on_activity_done(a);
  });

  pf.in_use = true;
  impl_ = std::make_unique<Impl>(topo, params, pf);
  Impl::active = impl_.get();
}

SimgridModel::~SimgridModel() {
  Impl::active = nullptr;  // SimGrid may signal completions (cancellations) from here on
  if (impl_) {
    // A model destroyed mid-run (an error, Ctrl-C) leaves activities in SimGrid; cancelled, they
    // take no bandwidth from the next model on the shared platform.
    for (auto& [ptr, f] : impl_->inflight) {
      try {
        f.activity->cancel();
      } catch (...) {  // already over: nothing to stop
      }
    }
    impl_->inflight.clear();
    impl_->finished.clear();
    impl_->pf->in_use = false;
  }
}

BatchId SimgridModel::start_batch(double now_s, const std::vector<Transfer>& transfers,
                                  int /*priority: not modelled; max-min is priority-free*/) {
  return impl_->start_batch(now_s, transfers);
}

double SimgridModel::next_completion_time() { return impl_->next_completion_time(); }

std::vector<BatchCompletion> SimgridModel::advance_to(double t) { return impl_->advance_to(t); }

std::vector<double> SimgridModel::link_bytes() const { return impl_->bytes_per_link; }

SimgridMode SimgridModel::mode() const { return impl_->mode; }

double SimgridModel::now() const { return impl_->now; }

std::int64_t SimgridModel::num_activities_started() const { return impl_->activities_started; }

}  // namespace moesim::sim
