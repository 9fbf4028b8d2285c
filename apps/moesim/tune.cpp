// `moesim tune` (tune.hpp): the search, its report and the emitted scenario.
#include "apps/moesim/tune.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/memory.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/runner.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

using Clock = std::chrono::steady_clock;

std::string gib(double bytes) { return fmt::format("{:.1f}", bytes / (1024.0 * 1024 * 1024)); }

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The role space: one list of YAML values per role, baseline value first. Values that cannot
// apply to any layout of this scenario are left out (2dh, ta_moe, faster_moe_hir on one node;
// training schedules in inference; parm_auto on SwiGLU experts), and so are routing roles that
// change what the model learns unless asked for (TuneOptions::include_routing). Values that apply
// to some layouts only are kept: the strategy refuses them with an InputError, counted as
// inapplicable.
struct Role {
  std::string key;
  std::vector<std::string> values;  // "" = the baseline (key omitted)
};

std::vector<Role> role_space(const Scenario& sc, bool include_routing) {
  const bool multi_node = sc.cluster.nodes > 1;
  const bool training = sc.model.mode == Mode::kTraining;
  std::vector<Role> roles;
  roles.push_back({"routing", {""}});
  if (multi_node && training && include_routing) {
    roles.back().values.push_back("ta_moe");
    roles.back().values.push_back("faster_moe_hir");
  }
  roles.push_back({"a2a", {"", "auto"}});
  if (multi_node) roles.back().values.push_back("2dh");
  // DeepEP's per-node dispatch, for a dropless dispatch of sampled routing across nodes (the role
  // refuses the stacks it cannot join, topology-aware routing and searched pipeline degrees:
  // counted as inapplicable).
  const auto dist = sc.workload.routing.distribution;
  if (multi_node && sc.model.capacity_factor == 0 && dist != RoutingDistribution::kTrace &&
      dist != RoutingDistribution::kCorrelated)
    roles.back().values.push_back("deepep");
  roles.push_back({"layout", {"", "flexible"}});
  roles.push_back({"pipeline", {"", "pipemoe", "tutel_online"}});
  roles.push_back({"parallel", {"", "tutel_router"}});
  if (training) {
    roles.push_back({"schedule", {"", "lina"}});
    // Parm's fused schedules build GELU expert FFNs (the plan builder refuses them on SwiGLU).
    if (!sc.model.swiglu()) roles.back().values.push_back("parm_auto");
  } else {
    roles.push_back({"inference", {"", "lina"}});
  }
  return roles;
}

// The role space of one layout: values that are exact no-ops or always refused there are left
// out. parallel: unsharded experts have nothing to switch (every degree is 1, parallel.cpp), so
// p2 and tutel_router only where experts are sharded; parm_auto only with mp or esp > 1 and
// unsharded experts, ta_moe and faster_moe_hir only with unsharded experts and esp = 1 (the
// strategies refuse them otherwise).
std::vector<Role> layout_roles(const std::vector<Role>& all, const TuneLayout& l) {
  std::vector<Role> out = all;
  for (Role& role : out) {
    if (role.key == "parallel") {
      role.values = {""};
      if (l.experts_per_gpu < 0) role.values = {"", "p2", "tutel_router"};
    }
    if (role.key == "schedule" && (l.experts_per_gpu < 1 || (l.par.mp < 2 && l.par.esp < 2)))
      std::erase(role.values, "parm_auto");
    // Topology-aware routing (TA-MoE, FasterMoE's hierarchy) needs unsharded experts, esp = 1.
    if (role.key == "routing" && (l.experts_per_gpu < 1 || l.par.esp > 1)) role.values = {""};
    // DeepEP sends whole tokens to whole experts.
    if (role.key == "a2a" && l.experts_per_gpu < 1) std::erase(role.values, "deepep");
  }
  return out;
}

int space_size(const std::vector<Role>& roles) {
  int n = 1;
  for (const Role& role : roles) n *= static_cast<int>(role.values.size());
  return n;
}

using Choice = std::vector<int>;  // value index per role

std::string stack_yaml(const std::vector<Role>& roles, const Choice& c, const std::string& name) {
  std::string out = "{name: " + name;
  for (std::size_t i = 0; i < roles.size(); ++i)
    if (!roles[i].values[c[i]].empty()) out += ", " + roles[i].key + ": " + roles[i].values[c[i]];
  return out + "}";
}

// The baseline candidate: choice 0 of every layout's role space (each role at its baseline
// value). The reference runs use this very stack, so the reference and the search's own baseline
// candidate are one run, not two (the state key names the stack).
const char* const kBaselineStack = "{name: tuned}";

// A layout's parallelism as YAML. The scenario's pipeline_layout goes along only where the layout
// keeps the scenario's pp, schedule and vp (it names one piece per model chunk).
std::string par_yaml(const ParallelismSpec& p) {
  std::string extra;
  if (p.schedule != PipelineSchedule::kOneFOneB)
    extra += fmt::format(", schedule: {}", name_of(p.schedule));
  if (p.vp > 1) extra += fmt::format(", vp: {}", p.vp);
  if (!p.pipeline_layout.empty())
    extra += fmt::format(", pipeline_layout: [{}]", fmt::join(p.pipeline_layout, ", "));
  return fmt::format("{{pp: {}, zero: {}, ep: {}, esp: {}, mp: {}, dp: {}, layout: {}{}}}", p.pp,
                     p.zero, p.ep, p.esp, p.mp, p.dp, name_of(p.layout), extra);
}

std::string recompute_yaml(const RecomputeSpec& r) {
  if (r.granularity != RecomputeGranularity::kSelective)
    return fmt::format("{{granularity: {}}}", name_of(r.granularity));
  std::vector<std::string_view> names;
  for (RecomputeModule m : r.modules) names.push_back(name_of(m));
  return fmt::format("{{granularity: selective, modules: [{}]}}", fmt::join(names, ", "));
}

}  // namespace

void set_layout_edits(TuneLayout& l) {
  l.edits = {"parallelism=" + par_yaml(l.par),
             fmt::format("model.batch_per_gpu={}", l.batch_per_gpu),
             fmt::format("model.micro_batches={}", l.micro_batches),
             fmt::format("model.experts_per_gpu={}", l.experts_per_gpu),
             "model.recompute=" + recompute_yaml(l.recompute)};
}

namespace {

// Stage counts the loader accepts (core/scenario_loader.cpp): pp divides the GPUs into stages of
// whole nodes or of a divisor of one node, and every stage runs at least one block.
std::vector<int> stage_counts(const Scenario& sc) {
  const std::int64_t gpus = sc.num_gpus(), gpn = sc.cluster.gpus_per_node;
  std::vector<int> out;
  for (int pp = 1; pp <= sc.model.layers && pp <= gpus; ++pp) {
    if (gpus % pp != 0) continue;
    const std::int64_t stage = gpus / pp;
    if (stage % gpn == 0 || gpn % stage == 0) out.push_back(pp);
  }
  return out;
}

struct PipelineChoice {
  int pp = 1;
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int vp = 1;
};

// The schedules of pp stages with m micro-batches (the loader's rules): 1f1b; interleaved with
// vp the smallest of 2..8 dividing the blocks per stage (an even split, m a multiple of pp);
// dualpipe with an even pp and an even m >= 2 pp.
std::vector<PipelineChoice> schedules_of(const Scenario& sc, int pp, int m) {
  std::vector<PipelineChoice> out = {{pp, PipelineSchedule::kOneFOneB, 1}};
  if (pp < 2) return out;
  const int layers = sc.model.layers;
  if (layers % pp == 0 && m % pp == 0)
    for (int vp = 2; vp <= 8; ++vp)
      if ((layers / pp) % vp == 0) {
        out.push_back({pp, PipelineSchedule::kInterleaved, vp});
        break;
      }
  if (pp % 2 == 0 && m % 2 == 0 && m >= 2 * pp) out.push_back({pp, PipelineSchedule::kDualPipe, 1});
  return out;
}

// The (B, m) splits of n sequences per replica: B a power of two or n itself, m = n / B >= pp; up
// to three, the largest B first at pp = 1 (micro-batches there only save memory), the smallest
// first at pp > 1 (more micro-batches, a smaller bubble).
std::vector<std::pair<int, int>> batch_splits(std::int64_t n, int pp) {
  std::vector<std::pair<int, int>> out;
  for (std::int64_t b = 1; b <= n; ++b) {
    const bool pow2 = (b & (b - 1)) == 0;
    if (n % b != 0 || (!pow2 && b != n) || n / b < pp) continue;
    out.emplace_back(static_cast<int>(b), static_cast<int>(n / b));
  }
  if (pp == 1) std::reverse(out.begin(), out.end());
  if (out.size() > 3) out.resize(3);
  return out;
}

}  // namespace

// Every layout of the scenario's GPUs for its model (see tune.hpp). mp and esp stay inside a node
// (tensor and expert-shard groups are intra-node in every system the strategies come from).
std::vector<TuneLayout> tune_layouts(const Scenario& sc, const TuneSpace& space) {
  const int N = sc.num_gpus(), g = sc.cluster.gpus_per_node, E = sc.num_experts();
  const ParallelismSpec& p0 = sc.parallelism;
  const ModelSpec& m0 = sc.model;
  const bool inference = m0.mode == Mode::kInference;
  // Global batch in sequences per step: the dense data-parallel replicas of one stage (P / pp /
  // mp: MP ranks share their tokens) times B times m.
  const std::int64_t global =
      static_cast<std::int64_t>(sc.stage_gpus() / p0.mp) * m0.batch_per_gpu * m0.micro_batches;
  const bool vary_pipeline = space.pipeline && !inference;
  const std::vector<int> pps = vary_pipeline ? stage_counts(sc) : std::vector<int>{p0.pp};
  std::vector<int> zeros = {p0.zero};
  if (space.zero && !inference) zeros = {0, 1};
  std::vector<TuneLayout> out;
  for (int pp : pps) {
    const int P = N / pp;  // GPUs of one stage
    for (int mp : divisors(g)) {
      if (mp > 8 || m0.model_dim % mp != 0 || (inference && mp > 1) || P % mp != 0) continue;
      const std::int64_t replicas = P / mp;
      if (global % replicas != 0) continue;
      const std::int64_t n = global / replicas;  // sequences per replica per step
      std::vector<std::pair<int, int>> splits;
      if (vary_pipeline) {
        splits = batch_splits(n, pp);
      } else if (n % m0.micro_batches == 0) {
        splits = {{static_cast<int>(n / m0.micro_batches), m0.micro_batches}};
      }
      for (const auto& [batch, micro] : splits) {
        std::vector<PipelineChoice> scheds = {{pp, p0.schedule, p0.vp}};
        if (vary_pipeline) scheds = schedules_of(sc, pp, micro);
        for (const PipelineChoice& pc : scheds) {
          for (int esp : divisors(g)) {
            if (esp > 8 || m0.hidden_dim % esp != 0 || (inference && esp > 1)) continue;
            for (MpLayout lay : {MpLayout::kDisjoint, MpLayout::kOverlapped}) {
              if (lay == MpLayout::kOverlapped && mp == 1) continue;  // the same as disjoint
              const std::int64_t fixed = lay == MpLayout::kOverlapped ? esp : esp * mp;
              if (P % fixed != 0) continue;
              const int rest = static_cast<int>(P / fixed);
              for (int ep : divisors(rest)) {
                if (lay == MpLayout::kOverlapped && (ep * esp) % mp != 0) continue;
                int epg = 0;
                if (E % ep == 0) {
                  epg = E / ep;
                } else if (ep % E == 0 && esp == 1) {
                  epg = -(ep / E);
                } else {
                  continue;
                }
                for (int zero : zeros) {
                  TuneLayout l;
                  l.par.pp = pc.pp;
                  l.par.schedule = pc.schedule;
                  l.par.vp = pc.vp;
                  // The scenario's pipeline_layout names its own pieces: kept with its pp,
                  // schedule and vp, else the even split.
                  if (pc.pp == p0.pp && pc.schedule == p0.schedule && pc.vp == p0.vp)
                    l.par.pipeline_layout = p0.pipeline_layout;
                  l.par.zero = zero;
                  l.par.ep = ep;
                  l.par.esp = esp;
                  l.par.mp = mp;
                  l.par.dp = rest / ep;
                  l.par.layout = lay;
                  l.batch_per_gpu = batch;
                  l.micro_batches = micro;
                  l.experts_per_gpu = epg;
                  l.recompute = m0.recompute;
                  set_layout_edits(l);
                  l.is_scenario = pp == p0.pp && pc.schedule == p0.schedule && pc.vp == p0.vp &&
                                  zero == p0.zero && ep == p0.ep && esp == p0.esp && mp == p0.mp &&
                                  l.par.dp == p0.dp && lay == p0.layout &&
                                  batch == m0.batch_per_gpu && micro == m0.micro_batches;
                  out.push_back(std::move(l));
                }
              }
            }
          }
        }
      }
    }
  }
  return out;
}

namespace {

// One run as the search keeps it (the --state file, messages between ranks).
struct Stored {
  bool ok = false;
  RunSummary summary;      // the fields tune reads (stored_json)
  std::string refusal;     // why the strategy refused, when !ok
  bool from_file = false;  // read from --state (counted as resumed when used)
};

nlohmann::json stored_json(const Stored& st) {
  if (!st.ok) return {{"ok", false}, {"refusal", st.refusal}};
  const RunSummary& x = st.summary;
  return {{"ok", true},
          {"step_mean_s", x.step_mean_s},
          {"step_p50_s", x.step_p50_s},
          {"step_p95_s", x.step_p95_s},
          {"moe_layer_mean_s", x.moe_layer_mean_s},
          {"a2a_mean_s", x.a2a_mean_s},
          {"allreduce_mean_s", x.allreduce_mean_s},
          {"compute_mean_s", x.compute_mean_s},
          {"exposed_comm_mean_s", x.exposed_comm_mean_s},
          {"decisions", x.decisions},
          {"memory_bytes", x.memory_bytes},
          {"gpu_memory_bytes", x.gpu_memory_bytes},
          {"tokens_per_step", x.tokens_per_step},
          {"model_flops_per_token", x.model_flops_per_token},
          {"tokens_per_s_per_gpu", x.tokens_per_s_per_gpu},
          {"has_model_flops", x.has_model_flops},
          {"model_tflops_per_gpu", x.model_tflops_per_gpu},
          {"mfu", x.mfu}};
}

Stored stored_of(const nlohmann::json& v) {
  Stored st;
  st.ok = v.at("ok").get<bool>();
  if (!st.ok) {
    st.refusal = v.at("refusal");
    return st;
  }
  RunSummary& x = st.summary;
  x.step_mean_s = v.at("step_mean_s");
  x.step_p50_s = v.at("step_p50_s");
  x.step_p95_s = v.at("step_p95_s");
  x.moe_layer_mean_s = v.at("moe_layer_mean_s");
  x.a2a_mean_s = v.at("a2a_mean_s");
  x.allreduce_mean_s = v.at("allreduce_mean_s");
  x.compute_mean_s = v.at("compute_mean_s");
  x.exposed_comm_mean_s = v.at("exposed_comm_mean_s");
  x.decisions = v.at("decisions");
  x.memory_bytes = v.at("memory_bytes");
  x.gpu_memory_bytes = v.at("gpu_memory_bytes");
  // The figures (docs/figures.md); absent from a state file written before them.
  x.tokens_per_step = v.value("tokens_per_step", 0.0);
  x.model_flops_per_token = v.value("model_flops_per_token", 0.0);
  x.tokens_per_s_per_gpu = v.value("tokens_per_s_per_gpu", 0.0);
  x.has_model_flops = v.value("has_model_flops", false);
  x.model_tflops_per_gpu = v.value("model_tflops_per_gpu", 0.0);
  x.mfu = v.value("mfu", 0.0);
  return st;
}

class Search {
 public:
  Search(const YAML::Node& tree, const std::string& path, const std::vector<std::string>& sets,
         const TuneOptions& opts)
      : path_(path), opts_(opts), t0_(Clock::now()), tp_(opts.transport) {
    jobs_ = opts.jobs > 0 ? opts.jobs
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    workers_ = jobs_ * (tp_ ? tp_->size() : 1);
    if (tp_ && tp_->rank() != 0) opts_.progress = false;
    tree_ = edited_tree(tree, sets);  // the user's --set edits first; YAML `experts` goes below
    base_ = parse_scenario(YAML::Clone(tree_), path_);
    refuse_serving(base_, "tune");
    // The layouts tune writes (make_layout's edits, the global batch of P / mp groups) are the
    // disjoint and overlapped ones; a folded scenario would be re-laid out under other keys.
    if (base_.parallelism.folded())
      throw InputError(base_.location_of("parallelism.layout"), "parallelism.layout",
                       "found folded, expected disjoint or overlapped: `moesim tune` searches "
                       "those layouts only (run a folded layout with `moesim simulate`)");
    // The layouts set experts_per_gpu; a file giving `experts` would then have both.
    if (tree_["model"] && tree_["model"]["experts"]) tree_["model"].remove("experts");
    topo_ = simulation_topology(base_);
    if (opts_.rerun_engine == "auto") {
      // One flow step of a 4,096-GPU scenario takes minutes (bench/flow_scale.sh): above
      // kAutoFlowGpus auto re-runs nothing, and says so.
      const int gpus = base_.num_gpus();
      opts_.rerun_engine = gpus <= kAutoFlowGpus ? "flow" : opts_.screen_engine;
      if (gpus > kAutoFlowGpus)
        auto_note_ = fmt::format(
            "no flow re-run: --engine auto re-runs on flow up to {} GPUs (one flow step of {} "
            "GPUs can take minutes); --engine flow forces it",
            kAutoFlowGpus, gpus);
    }
    roles_ = role_space(base_, opts_.include_routing);
    base_f0_ = workload::WorkloadGenerator(base_.stage_scenario()).capacity_factor(0);
    iterations_ = opts.iterations.value_or(base_.workload.iterations);
    if (!tp_ || tp_->rank() == 0) load_state();
  }

  TuneResult run() {
    TuneResult r;
    r.scenario = path_;
    r.gpus = base_.num_gpus();
    r.screen_engine = opts_.screen_engine;
    r.rerun_engine = opts_.rerun_engine;
    layouts(r);
    screen(r);
    rerun(r);
    r.resumed = resumed_;
    r.workers = workers_;
    if (!auto_note_.empty()) r.notes.push_back(auto_note_);
    save_state();
    if (tp_) {  // the other ranks' serve() ends
      std::string done = R"({"done":true})";
      tp_->broadcast(done);
    }
    return r;
  }

  const YAML::Node& tree() const { return tree_; }

 private:
  double left() const { return opts_.budget_s - since(t0_); }

  // --state: what a search is (the scenario after --set, the engines, the iterations, the layout
  // search, the version). A file written by another search is refused: its runs are not these.
  std::string fingerprint() const {
    YAML::Emitter em;
    em << tree_;
    const std::string what =
        fmt::format("{}\n{}\n{}\n{}\n{}\n{} {} {} {}", MOESIM_VERSION, em.c_str(),
                    opts_.screen_engine, opts_.rerun_engine, iterations_, opts_.search_layouts,
                    opts_.search_pipeline, opts_.search_memory, opts_.include_routing);
    return fmt::format("{:016x}", std::hash<std::string>{}(what));
  }

  void load_state() {
    if (opts_.state_path.empty() || !std::filesystem::exists(opts_.state_path)) return;
    nlohmann::json j;
    try {
      std::ifstream in(opts_.state_path);
      j = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      throw InputError(
          fmt::format("--state {}: not a tune state file ({}); delete it or name "
                      "another file",
                      opts_.state_path, e.what()));
    }
    if (!j.is_object() || j.value("fingerprint", "") != fingerprint())
      throw InputError(fmt::format(
          "--state {}: written by another search (the scenario after --set, the engines, the "
          "iterations, --keep-layout or the moesim version differ), so its runs are not this "
          "search's; delete it or name another file",
          opts_.state_path));
    for (const auto& [k, v] : j.at("runs").items()) {
      Stored st = stored_of(v);
      st.from_file = true;
      state_[k] = std::move(st);
    }
    say(fmt::format("{} runs read from {}", state_.size(), opts_.state_path));
  }

  void save_state() const {
    if (opts_.state_path.empty()) return;
    nlohmann::json runs = nlohmann::json::object();
    for (const auto& [k, st] : state_) runs[k] = stored_json(st);
    const nlohmann::json j{{"moesim_version", MOESIM_VERSION},
                           {"scenario", path_},
                           {"fingerprint", fingerprint()},
                           {"runs", std::move(runs)}};
    write_file_atomic(opts_.state_path, [&](std::ostream& os) { os << j.dump() << "\n"; });
  }
  // Mean wall time of a run so far; a run is started only when it should end before the budget
  // less `reserve` (a 4,096-GPU run takes seconds: checking only the time left overran by one).
  // Predicted cost of the next run, per iteration (so the 1-iteration layout probes predict the
  // full runs too): twice the mean, at most the dearest so far. The mean alone overran a
  // 4,096-GPU budget by a pipelined stack's run; the dearest alone (a layout's first run pays its
  // topology caches) stopped a third early.
  // Costs are per unit of run size (units()), so a layout's probe predicts its full runs and one
  // layout's runs predict another's.
  double run_cost(double units) const {
    const double per = units_ > 0 ? std::min(max_per_unit_s_, 2.0 * run_s_ / units_) : 0.0;
    return per * units;
  }
  bool room(double reserve, double units) const { return left() - run_cost(units) >= reserve; }

  // A run's size in what its wall time grows with: micro-batches x blocks per stage (the plan's
  // ops per rank) x iterations, a full recomputation's second forward counted. Per iteration
  // alone, a pp = 1 layout of 30 micro-batches at 2,048 GPUs (4x the ops of the pp = 16
  // reference) overran the budget by a minute.
  static double units(const ParallelismSpec& p, int micro, int layers, const RecomputeSpec& rc,
                      int iterations) {
    const double per_stage = static_cast<double>(layers) / std::max(1, p.pp);
    return micro * per_stage * (rc.full() ? 4.0 / 3.0 : 1.0) * iterations;
  }
  double layout_units(const TuneResult& r, int li, int iterations = 0) const {
    const TuneLayout& l = r.layouts[li];
    return units(l.par, l.micro_batches, base_.model.layers, l.recompute,
                 iterations > 0 ? iterations : iterations_);
  }
  // How many runs of `per_run_s` the workers finish within `wall_s` (a group runs ahead only as
  // far as the budget goes: 8 runs of a 4,096-GPU scenario on 2 workers overran it by seconds).
  std::size_t affordable(double wall_s, double per_run_s) const {
    if (per_run_s <= 0) return std::numeric_limits<std::size_t>::max();
    if (wall_s < per_run_s) return 0;
    return static_cast<std::size_t>(wall_s / per_run_s) * static_cast<std::size_t>(workers_);
  }

  void say(const std::string& line) const {
    if (opts_.progress) std::fprintf(stderr, "tune: %s\n", line.c_str());
  }

  Scenario scenario_of(const TuneLayout& l, const std::string& stack) const {
    std::vector<std::string> edits = l.edits;
    edits.push_back("strategies=[" + stack + "]");
    return parse_scenario(edited_tree(tree_, edits), path_);
  }

  // The layout scenario stack `spec` runs on: a deepep stack's holds that strategy, so the
  // workload samples each token's destinations for it (workload::samples_distinct_destinations),
  // as `simulate` does for a scenario with a deepep strategy (and as scenario_of gives a deepep
  // stack run alone). The other stacks keep the plain sample.
  const Scenario* run_scenario(const Scenario* all, int li, const StrategySpec& spec) const {
    if (!all || spec.a2a != A2aRole::kDeepep) return all;
    return layout_deepep_sc_.at(li).get();
  }

  // Layout li with every stack of the role space as its strategies ("s<index>", mixed radix over
  // the roles, the first role slowest): parsed once per layout, so a run costs no YAML parse.
  // nullptr when the loader refuses some stack statically (then each stack is parsed alone).
  const Scenario* layout_scenario(const TuneResult& r, int li) {
    auto it = layout_sc_.find(li);
    if (it != layout_sc_.end()) return it->second.get();
    std::string list = "strategies=[";
    const std::vector<Role>& rl = roles(r, li);
    Choice c(rl.size(), 0);
    for (int i = 0; i < space_size(rl); ++i) {
      list += (i ? ", " : "") + stack_yaml(rl, c, fmt::format("s{}", i));
      next(rl, c);
    }
    list += "]";
    std::unique_ptr<Scenario> sc;
    try {
      std::vector<std::string> edits = r.layouts[li].edits;
      edits.push_back(list);
      sc = std::make_unique<Scenario>(parse_scenario(edited_tree(tree_, edits), path_));
      // The stacks move out: a strategy run copies its scenario (Lina's packing), and 324
      // strategies with their key locations would be copied along every time.
      specs_[li] = std::move(sc->strategies);
      sc->strategies.assign(1, specs_[li].front());
      for (const StrategySpec& spec : specs_[li])
        if (spec.a2a == A2aRole::kDeepep) {  // run_scenario
          auto with = std::make_unique<Scenario>(*sc);
          with->strategies.push_back(spec);
          layout_deepep_sc_[li] = std::move(with);
          break;
        }
      auto kept = std::make_shared<Scenario::Locations>(*sc->locations);
      std::erase_if(*kept, [](const auto& kv) { return kv.first.rfind("strategies[", 0) == 0; });
      sc->locations = std::move(kept);
    } catch (const InputError&) {
      sc = nullptr;
    }
    return layout_sc_.emplace(li, std::move(sc)).first->second.get();
  }

  const std::vector<Role>& roles(const TuneResult& r, int li) {
    auto it = lroles_.find(li);
    if (it == lroles_.end()) it = lroles_.emplace(li, layout_roles(roles_, r.layouts[li])).first;
    return it->second;
  }

  static int index_of(const std::vector<Role>& rl, const Choice& c) {
    int i = 0;
    for (std::size_t k = 0; k < rl.size(); ++k)
      i = i * static_cast<int>(rl[k].values.size()) + c[k];
    return i;
  }

  // Advances c in mixed radix (last role fastest); false after the last combination.
  static bool next(const std::vector<Role>& rl, Choice& c) {
    std::size_t k = rl.size();
    while (k > 0) {
      --k;
      if (++c[k] < static_cast<int>(rl[k].values.size())) return true;
      c[k] = 0;
    }
    return false;
  }

  std::string state_key(const std::string& key, const std::string& engine, int iterations) const {
    return fmt::format("{}|{}|{}", key, engine, iterations > 0 ? iterations : iterations_);
  }

  // One run of a stack with `engine`; nullopt when the stack cannot apply. `key` names the run
  // in the --state file: a run the file already has (or a prefetch() ran) is not run again.
  std::optional<RunSummary> run_spec(const Scenario& sc, const StrategySpec& spec,
                                     const std::string& engine, const std::string& key,
                                     int iterations = 0) {
    const std::string k = state_key(key, engine, iterations);
    auto it = state_.find(k);
    if (it == state_.end()) {
      Outcome o = run_job(sc, spec, engine, iterations);
      note_cost(engine,
                units(sc.parallelism, sc.model.micro_batches, sc.model.layers, sc.model.recompute,
                      iterations > 0 ? iterations : iterations_),
                o.wall_s);
      it = state_.emplace(k, std::move(o.stored)).first;
    } else if (it->second.from_file) {
      ++resumed_;
    }
    const Stored& st = it->second;
    if (!st.ok) ++refusals_[st.refusal];
    return st.ok ? std::optional<RunSummary>(st.summary) : std::nullopt;
  }

  struct Outcome {
    Stored stored;
    double wall_s = 0;
  };

  // One run. Workers call it concurrently: it reads the topology and the scenario only, and the
  // sample cache is thread-safe.
  Outcome run_job(const Scenario& sc, const StrategySpec& spec, const std::string& engine,
                  int iterations) {
    const sim::EngineConfig cfg = engine_config_from(sc, engine);
    strategies::Backend backend = [&](const Plan& plan) {
      return sim::run_plan(plan, *topo_, cfg);
    };
    const auto t = Clock::now();
    Outcome out;
    try {
      strategies::StackRun run = strategies::run_stack(
          sc, spec, *topo_, backend, iterations > 0 ? iterations : iterations_, &cache_);
      out.stored = Stored{true, summarize(run, "cluster", topo_->num_gpus(), since(t)), ""};
    } catch (const InputError& e) {
      // "strategy 's17', role routing: ..." -> "role routing: ...", so one reason counts once.
      std::string msg = e.message();
      if (msg.rfind("strategy '", 0) == 0)
        if (auto at = msg.find("', "); at != std::string::npos) msg = msg.substr(at + 3);
      out.stored = Stored{false, {}, msg};
    }
    out.wall_s = since(t);
    return out;
  }

  // Screening runs, refused ones too, are what run_cost() predicts the next one from.
  void note_cost(const std::string& engine, double units, double wall_s) {
    if (engine != opts_.screen_engine || units <= 0) return;
    max_per_unit_s_ = std::max(max_per_unit_s_, wall_s / units);
    run_s_ += wall_s;
    units_ += units;
  }

  // --- Spreading runs over threads and ranks -------------------------------------------------
  // The search stays one sequential walk (the same decisions whatever the worker count): before
  // a group of runs it will ask for independently (a chunk of layout probes, of an exhaustive
  // space, one role's values in a descent, a chunk of re-runs), prefetch() runs the group on
  // every worker, and the walk then finds each in state_, as it would a resumed run.

  // One run the walk will ask for. `spec` indexes specs_[layout] (the layout's parsed stacks),
  // -1: the stack is parsed alone.
  struct Job {
    int layout = 0;
    std::string stack;
    int spec = -1;
    std::string engine;
    int iterations = 0;  // 0: the search's
  };

  static nlohmann::json job_json(const Job& j) {
    return {j.layout, j.stack, j.spec, j.engine, j.iterations};
  }
  static Job job_of(const nlohmann::json& v) {
    return Job{v.at(0).get<int>(), v.at(1).get<std::string>(), v.at(2).get<int>(),
               v.at(3).get<std::string>(), v.at(4).get<int>()};
  }

  void prefetch(TuneResult& r, const std::vector<Job>& wanted) {
    if (workers_ <= 1) return;  // one worker: the walk runs each when it asks, same results
    std::vector<Job> jobs;
    std::set<std::string> keys;
    for (const Job& j : wanted) {
      const std::string k = state_key(run_key(r, j.layout, j.stack), j.engine, j.iterations);
      if (state_.count(k) == 0 && keys.insert(k).second) jobs.push_back(j);
    }
    if (jobs.empty()) return;
    if (tp_) {
      nlohmann::json list = nlohmann::json::array();
      for (const Job& j : jobs) list.push_back(job_json(j));
      std::string text = nlohmann::json{{"jobs", std::move(list)}}.dump();
      tp_->broadcast(text);
    }
    std::vector<std::optional<Outcome>> out = run_share(r, jobs);
    r.runs_per_rank.resize(tp_ ? static_cast<std::size_t>(tp_->size()) : 1);
    for (const auto& o : out) r.runs_per_rank[0] += o ? 1 : 0;
    // The other ranks' shares: one message each.
    for (int got = 0; tp_ && got < tp_->size() - 1;) {
      auto text = tp_->try_receive();
      if (!text) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      ++got;
      const auto msg = nlohmann::json::parse(*text);
      const int from = msg.at("rank").get<int>();
      if (from <= 0 || from >= tp_->size())
        throw RuntimeError(fmt::format("tune: a message from rank {} of {}", from, tp_->size()));
      r.runs_per_rank[static_cast<std::size_t>(from)] += static_cast<int>(msg.at("results").size());
      for (const auto& v : msg.at("results")) {
        const auto i = v.at(0).get<std::size_t>();
        if (i >= jobs.size()) throw RuntimeError("tune: a rank's result for an unknown run");
        out[i] = Outcome{stored_of(v.at(1)), v.at(2).get<double>()};
      }
    }
    for (std::size_t i = 0; i < jobs.size(); ++i) {  // in job order: deterministic
      if (!out[i]) continue;  // its stack does not parse alone: the walk meets that itself
      const Job& j = jobs[i];
      note_cost(j.engine, layout_units(r, j.layout, j.iterations), out[i]->wall_s);
      state_[state_key(run_key(r, j.layout, j.stack), j.engine, j.iterations)] =
          std::move(out[i]->stored);
    }
  }

  // This rank's jobs (every size-th from its rank), on opts_.jobs threads. The scenarios are
  // parsed here on the calling thread (YAML trees are not shared between threads).
  std::vector<std::optional<Outcome>> run_share(const TuneResult& r, const std::vector<Job>& jobs) {
    const std::size_t ranks = tp_ ? static_cast<std::size_t>(tp_->size()) : 1;
    const std::size_t rank = tp_ ? static_cast<std::size_t>(tp_->rank()) : 0;
    std::vector<std::size_t> mine;
    std::vector<std::pair<const Scenario*, const StrategySpec*>> what;
    std::deque<Scenario> alone;
    for (std::size_t i = rank; i < jobs.size(); i += ranks) {
      const Job& j = jobs[i];
      if (j.spec >= 0) {
        const Scenario* all = layout_scenario(r, j.layout);
        if (!all) continue;
        const StrategySpec* spec = &specs_.at(j.layout).at(static_cast<std::size_t>(j.spec));
        what.emplace_back(run_scenario(all, j.layout, *spec), spec);
      } else {
        try {
          alone.push_back(scenario_of(r.layouts.at(static_cast<std::size_t>(j.layout)), j.stack));
        } catch (const InputError&) {
          continue;
        }
        what.emplace_back(&alone.back(), &alone.back().strategies.at(0));
      }
      mine.push_back(i);
    }
    std::vector<std::optional<Outcome>> out(jobs.size());
    std::atomic<std::size_t> next{0};
    std::exception_ptr error;
    std::mutex mu;
    auto work = [&] {
      try {
        for (std::size_t x; (x = next.fetch_add(1)) < mine.size();) {
          const Job& j = jobs[mine[x]];
          out[mine[x]] = run_job(*what[x].first, *what[x].second, j.engine, j.iterations);
        }
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next.store(mine.size());
      }
    };
    std::vector<std::thread> pool;
    const std::size_t threads = std::min(static_cast<std::size_t>(jobs_), mine.size());
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    if (error) std::rethrow_exception(error);
    return out;
  }

 public:
  // Ranks > 0 under mpirun: run the share of every group rank 0 broadcasts, until it says done.
  void serve() {
    TuneResult r;
    layouts(r);
    for (;;) {
      std::string text;
      tp_->broadcast(text);
      const auto msg = nlohmann::json::parse(text);
      if (msg.contains("done")) return;
      std::vector<Job> jobs;
      for (const auto& v : msg.at("jobs")) jobs.push_back(job_of(v));
      const std::vector<std::optional<Outcome>> out = run_share(r, jobs);
      nlohmann::json results = nlohmann::json::array();
      for (std::size_t i = 0; i < out.size(); ++i)
        if (out[i]) results.push_back({i, stored_json(out[i]->stored), out[i]->wall_s});
      tp_->send_to_root(
          nlohmann::json{{"rank", tp_->rank()}, {"results", std::move(results)}}.dump());
    }
  }

 private:
  std::optional<RunSummary> run_one(TuneResult& r, int li, const std::string& stack,
                                    const std::string& engine, int iterations = 0) {
    const Scenario sc = scenario_of(r.layouts[li], stack);
    return run_spec(sc, sc.strategies.at(0), engine, run_key(r, li, stack), iterations);
  }

  static std::string run_key(const TuneResult& r, int li, const std::string& stack) {
    return r.layouts[li].describe() + "|" + stack;
  }

  // The recomputation a layout tries, cheapest first: the scenario's, then (training, when the
  // memory is searched) the light modules' selective recomputation, then full.
  std::vector<RecomputeSpec> recompute_ladder() const {
    std::vector<RecomputeSpec> out = {base_.model.recompute};
    if (!opts_.search_memory || base_.model.mode != Mode::kTraining) return out;
    if (base_.model.recompute.granularity == RecomputeGranularity::kNone) {
      RecomputeSpec sel;
      sel.granularity = RecomputeGranularity::kSelective;
      sel.modules = strategies::light_modules(base_.model);
      out.push_back(sel);
    }
    if (!base_.model.recompute.full()) {
      RecomputeSpec full;
      full.granularity = RecomputeGranularity::kFull;
      out.push_back(full);
    }
    return out;
  }

  // A layout's estimate without a routing sample: the baseline's first decision at the nominal
  // dC (nominal_capacity; for dropless routing the mean demand, below any sampled dC) and the
  // scenario's own iteration-0 factor.
  double quick_memory(const Scenario& sc) const {
    const std::int64_t cap = strategies::nominal_capacity(sc.stage_scenario());
    const strategies::Decision d =
        strategies::first_decision(sc, sc.strategies.at(0), *topo_, cap, base_f0_);
    return strategies::estimate_memory(sc, d, cap).total_bytes();
  }

  void layouts(TuneResult& r) {
    std::vector<TuneLayout> all;
    if (opts_.search_layouts)
      all = tune_layouts(base_, TuneSpace{opts_.search_pipeline, opts_.search_memory});
    bool has_own = false;
    for (const auto& l : all) has_own = has_own || l.is_scenario;
    if (!has_own) {  // the scenario's own layout is always a candidate
      TuneLayout own;
      own.par = base_.parallelism;
      own.batch_per_gpu = base_.model.batch_per_gpu;
      own.micro_batches = base_.model.micro_batches;
      own.experts_per_gpu = base_.model.experts_per_gpu;
      own.recompute = base_.model.recompute;
      set_layout_edits(own);
      own.is_scenario = true;
      all.insert(all.begin(), own);
    }
    const double gpu_bytes = topo_->gpu().memory.value();
    const std::vector<RecomputeSpec> ladder = recompute_ladder();
    std::vector<TuneLayout> kept;
    int refused = 0;
    std::string why;
    for (auto& l : all) {
      // The cheapest recomputation that fits by the estimate without sampling (the scenario's
      // own layout keeps its own: it is the reference); when none fits, the one needing least.
      double best = INFINITY;
      try {
        Scenario sc = scenario_of(l, "{name: baseline}");
        for (std::size_t i = 0; i < (l.is_scenario ? 1 : ladder.size()); ++i) {
          sc.model.recompute = ladder[i];
          const double bytes = quick_memory(sc);
          if (bytes < best) {
            best = bytes;
            l.recompute = ladder[i];
          }
          if (gpu_bytes <= 0 || bytes <= gpu_bytes) break;
        }
      } catch (const InputError& e) {
        // A layout the scenario's other keys rule out (a routing node limit that its EP
        // groups cannot meet, for one).
        if (l.is_scenario) throw;
        if (refused++ == 0) why = e.what();
        continue;
      }
      set_layout_edits(l);
      l.memory_bytes = best;
      if (gpu_bytes <= 0 || l.memory_bytes <= gpu_bytes) ++r.layouts_fit;
      kept.push_back(std::move(l));
    }
    if (refused > 0)
      r.notes.push_back(
          fmt::format("{} layouts refused by the scenario's other keys, e.g. {}", refused, why));
    r.layouts = std::move(kept);
    for (int li = 0; li < static_cast<int>(r.layouts.size()); ++li)
      r.stacks_in_space += space_size(roles(r, li));
    say(fmt::format("{} GPUs; {} layouts ({} fit the {}'s {:.0f} GiB), {} stacks in all; {:.1f} s",
                    r.gpus, r.layouts.size(), r.layouts_fit, topo_->gpu().name,
                    gpu_bytes / (1 << 30), r.stacks_in_space, since(t0_)));
    if (r.layouts_fit == 0) closest_note(r, gpu_bytes);
  }

  // Nothing fits: the three layouts needing least memory, and what each lacks.
  void closest_note(TuneResult& r, double gpu_bytes) const {
    std::vector<int> idx(r.layouts.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
      return r.layouts[a].memory_bytes < r.layouts[b].memory_bytes;
    });
    std::vector<std::string> closest;
    for (std::size_t i = 0; i < idx.size() && i < 3; ++i) {
      const TuneLayout& l = r.layouts[idx[i]];
      closest.push_back(fmt::format("{} needs {} GiB ({} GiB more)", l.describe(),
                                    gib(l.memory_bytes), gib(l.memory_bytes - gpu_bytes)));
    }
    r.notes.push_back(fmt::format(
        "no layout fits the {}'s {} GiB{}; closest: {}. More GPUs (cluster.nodes), fp8 "
        "(model.precision) or a shorter model.seq_len shrink what a GPU holds; tune changes none "
        "of them",
        topo_->gpu().name, gib(gpu_bytes),
        opts_.search_memory ? " with ZeRO-1 and full recomputation" : "",
        fmt::join(closest, "; ")));
  }

  // Before layout li's first run: its estimate from the sampled dC (planned_memory, what the run
  // records), moving up the recomputation ladder while it does not fit. False when nothing fits.
  bool fits_sampled(TuneResult& r, int li) {
    TuneLayout& l = r.layouts[li];
    const double gpu_bytes = topo_->gpu().memory.value();
    if (l.memory_sampled || l.is_scenario) return gpu_bytes <= 0 || l.memory_bytes <= gpu_bytes;
    const std::vector<RecomputeSpec> ladder = recompute_ladder();
    std::size_t i = 0;
    while (i < ladder.size() && !(ladder[i].granularity == l.recompute.granularity &&
                                  ladder[i].modules == l.recompute.modules))
      ++i;
    for (; i < ladder.size(); ++i) {
      l.recompute = ladder[i];
      set_layout_edits(l);
      try {
        const Scenario sc = scenario_of(l, "{name: baseline}");
        l.memory_bytes =
            strategies::planned_memory(sc, sc.strategies.at(0), *topo_, iterations_, &cache_)
                .total_bytes();
      } catch (const InputError& e) {
        // The workload refuses the layout (a routing node limit its EP groups cannot meet).
        l.memory_sampled = true;
        l.memory_bytes = INFINITY;
        ++refusals_[e.message()];
        ++r.inapplicable;
        return false;
      }
      if (gpu_bytes <= 0 || l.memory_bytes <= gpu_bytes) break;
    }
    l.memory_sampled = true;
    const bool fits = gpu_bytes <= 0 || l.memory_bytes <= gpu_bytes;
    if (!fits) ++r.over_memory_sampled;
    return fits;
  }

  void add(TuneResult& r, int li, const std::string& stack, const std::string& roles,
           const RunSummary& s) {
    if (!s.fits_memory()) {  // e.g. Lina's packing on a layout that fits only unpacked
      ++r.over_memory;
      return;
    }
    TuneRow row;
    row.layout = li;
    row.stack_yaml = stack;
    row.roles = roles;
    row.screen = s;
    if (best_ < 0 || s.step_mean_s < rows_[best_].screen.step_mean_s) {
      best_ = static_cast<int>(rows_.size());
      r.time_to_best_s = since(t0_);
    }
    rows_.push_back(std::move(row));
  }

  // Evaluates choice c on layout li (memoised); +inf when inapplicable or over memory.
  double eval(TuneResult& r, int li, const Choice& c) {
    const std::vector<Role>& rl = roles(r, li);
    const int idx = index_of(rl, c);
    const auto key = std::make_pair(li, idx);
    if (auto it = seen_.find(key); it != seen_.end()) return it->second;
    ++r.evaluated;
    double t = INFINITY;
    const std::string stack = stack_yaml(rl, c, "tuned");
    const Scenario* all = layout_scenario(r, li);
    std::optional<Scenario> alone;
    if (!all) {
      try {
        alone = scenario_of(r.layouts[li], stack);
      } catch (const InputError&) {
        ++r.inapplicable;
        seen_[key] = t;
        return t;
      }
    }
    const StrategySpec& spec = all ? specs_.at(li).at(idx) : alone->strategies.at(0);
    const Scenario& sc = all ? *run_scenario(all, li, spec) : *alone;
    if (auto s = run_spec(sc, spec, opts_.screen_engine, run_key(r, li, stack))) {
      t = s->fits_memory() ? s->step_mean_s : INFINITY;
      add(r, li, stack, describe_roles(spec), *s);
    } else {
      ++r.inapplicable;
    }
    seen_[key] = t;
    tick(r);
    return t;
  }

  // A progress line every 2 s: runs, rate, the best so far and the ETA (the rest of the space at
  // the rate so far, at most what is left of the budget).
  void tick(const TuneResult& r) {
    // The state file is rewritten every 10 s, so a killed search keeps most of its runs.
    if (!opts_.state_path.empty() && since(last_save_) >= 10.0) {
      save_state();
      last_save_ = Clock::now();
    }
    if (!opts_.progress || since(last_tick_) < 2.0) return;
    last_tick_ = Clock::now();
    const double rate = r.evaluated / std::max(1e-9, since(t0_));
    const double rest = (r.stacks_in_space - r.evaluated) / std::max(rate, 1e-9);
    say(fmt::format(
        "{} of {} runs ({:.2g}/s), best {}, ETA {:.0f} s", r.evaluated, r.stacks_in_space, rate,
        best_ >= 0 ? fmt::format("{:.3f} ms ({}; {})", rows_[best_].screen.step_mean_s * 1e3,
                                 r.layouts[rows_[best_].layout].describe(), rows_[best_].roles)
                   : std::string("-"),
        std::min(rest, std::max(0.0, left()))));
  }

  // The layout screen's probe of choice c: one iteration when the scenario runs several (the
  // layout's order only; the ranked rows all run the scenario's iterations), else eval itself.
  double probe(TuneResult& r, int li, const Choice& c) {
    if (iterations_ <= 1) return eval(r, li, c);
    ++r.probes;
    const std::vector<Role>& rl = roles(r, li);
    const Scenario* all = layout_scenario(r, li);
    std::optional<RunSummary> s;
    const std::string stack = stack_yaml(rl, c, "tuned");
    if (all) {
      const StrategySpec& spec = specs_.at(li).at(index_of(rl, c));
      s = run_spec(*run_scenario(all, li, spec), spec, opts_.screen_engine, run_key(r, li, stack),
                   1);
    } else {
      try {
        s = run_one(r, li, stack, opts_.screen_engine, 1);
      } catch (const InputError&) {
      }
    }
    return s && s->fits_memory() ? s->step_mean_s : INFINITY;
  }

  // Screening order: the scenario's layout, then one layout of each family (pp, schedule, mp,
  // esp, disjoint / overlapped; fewest stages first) in turn, so a budget that stops the screen
  // early has still seen every family. In a family: the least recomputation first, then the
  // largest ep, then ZeRO-1 before 0, then the batch split batch_splits put first.
  std::vector<int> screen_order(const TuneResult& r) const {
    std::map<std::tuple<int, int, int, int, int, int>, std::vector<int>> families;
    for (int li = 0; li < static_cast<int>(r.layouts.size()); ++li) {
      const ParallelismSpec& p = r.layouts[li].par;
      families[{p.pp, static_cast<int>(p.schedule), p.vp, p.mp, p.esp, static_cast<int>(p.layout)}]
          .push_back(li);
    }
    for (auto& [key, list] : families)
      std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
        const TuneLayout& x = r.layouts[a];
        const TuneLayout& y = r.layouts[b];
        const auto level = [](const TuneLayout& l) {
          return static_cast<int>(l.recompute.granularity);
        };
        return std::make_tuple(level(x), -x.par.ep, -x.par.zero) <
               std::make_tuple(level(y), -y.par.ep, -y.par.zero);
      });
    std::vector<int> out;
    for (std::size_t round = 0; out.size() < r.layouts.size(); ++round)
      for (auto& [key, list] : families)
        if (round < list.size()) out.push_back(list[round]);
    // Then by the time a layout adds to the step by its pipeline bubble and recomputation, in
    // steps of 5% (the order within a step stays the families' turn): layouts that pay little
    // for fitting are screened first.
    std::stable_sort(out.begin(), out.end(), [&](int a, int b) {
      const auto bucket = [&](int li) {
        return static_cast<int>(std::floor(std::log(overhead(r.layouts[li])) / std::log(1.05)));
      };
      const bool sa = r.layouts[a].is_scenario, sb = r.layouts[b].is_scenario;
      if (sa != sb) return sa;
      return bucket(a) < bucket(b);
    });
    return out;
  }

  // A layout's step time over an ideal one's, for the screening order only: the pipeline's
  // bubble ((m + pp - 1) / m for 1F1B, the bubble over vp interleaved, about half the stages'
  // for DualPipe) times recomputation (the light modules about 5%, a full forward again 4/3).
  static double overhead(const TuneLayout& l) {
    const double m = l.micro_batches, pp = l.par.pp;
    double bubble = pp - 1;
    if (l.par.schedule == PipelineSchedule::kInterleaved) bubble /= l.par.vp;
    if (l.par.schedule == PipelineSchedule::kDualPipe) bubble = pp / 2 - 1;
    double rc = 1.0;
    if (l.recompute.granularity == RecomputeGranularity::kSelective) rc = 1.05;
    if (l.recompute.full()) rc = 4.0 / 3.0;
    return (m + bubble) / m * rc;
  }

  // Whether choice c on layout li has its screening run already (evaluated, prefetched, resumed).
  bool ready(const TuneResult& r, int li, const Choice& c, int iterations = 0) {
    const std::vector<Role>& rl = roles(r, li);
    if (iterations == 0 && seen_.count({li, index_of(rl, c)})) return true;
    const std::string key = run_key(r, li, stack_yaml(rl, c, "tuned"));
    return state_.count(state_key(key, opts_.screen_engine, iterations)) > 0;
  }

  Job choice_job(const TuneResult& r, int li, const Choice& c, int iterations) {
    const std::vector<Role>& rl = roles(r, li);
    return Job{li, stack_yaml(rl, c, "tuned"), layout_scenario(r, li) ? index_of(rl, c) : -1,
               opts_.screen_engine, iterations};
  }

  void prefetch_choices(TuneResult& r, int li, const std::vector<Choice>& cs, std::size_t from,
                        std::size_t to) {
    if (workers_ <= 1) return;
    std::vector<Job> jobs;
    for (std::size_t i = from; i < to; ++i)
      if (!ready(r, li, cs[i])) jobs.push_back(choice_job(r, li, cs[i], 0));
    prefetch(r, jobs);
  }

  // The layout screen's choices of layout li: the baseline stack, and parm_auto where it applies.
  std::vector<Choice> probe_choices(const TuneResult& r, int li) {
    const std::vector<Role>& rl = roles(r, li);
    Choice base(rl.size(), 0), parm = base;
    for (std::size_t k = 0; k < rl.size(); ++k)
      for (std::size_t v = 0; v < rl[k].values.size(); ++v)
        if (rl[k].values[v] == "parm_auto") parm[k] = static_cast<int>(v);
    if (parm == base) return {base};
    return {base, parm};
  }

  bool probed(const TuneResult& r, int li) {
    for (const Choice& c : probe_choices(r, li))
      if (!ready(r, li, c, iterations_ > 1 ? 1 : 0)) return false;
    return true;
  }

  // Coordinate descent from the baseline: each role in turn takes its best value given the
  // others; repeats until a full pass changes nothing (at most 3 passes).
  void descend(TuneResult& r, int li, double stop_at) {
    const std::vector<Role>& rl = roles(r, li);
    const double cost = layout_units(r, li);
    Choice c(rl.size(), 0);
    double best = eval(r, li, c);
    for (int pass = 0; pass < 3; ++pass) {
      bool changed = false;
      for (std::size_t k = 0; k < rl.size(); ++k) {
        std::vector<Choice> alts;  // role k's other values, independent of each other
        for (int v = 0; v < static_cast<int>(rl[k].values.size()); ++v) {
          if (v == c[k]) continue;
          alts.push_back(c);
          alts.back()[k] = v;
        }
        if (room(stop_at, cost))
          prefetch_choices(r, li, alts, 0,
                           std::min(alts.size(), affordable(left() - stop_at, run_cost(cost))));
        for (const Choice& d : alts) {
          if (!ready(r, li, d) && !room(stop_at, cost)) continue;
          const double t = eval(r, li, d);
          if (t < best * (1 - 1e-9)) {
            best = t;
            c = d;
            changed = true;
          }
        }
      }
      if (!changed) break;
    }
    if (!room(stop_at, cost)) r.complete = false;
  }

  void exhaustive(TuneResult& r, int li, double stop_at) {
    const std::vector<Role>& rl = roles(r, li);
    const double cost = layout_units(r, li);
    std::vector<Choice> all;
    Choice c(rl.size(), 0);
    do all.push_back(c);
    while (next(rl, c));
    // Several runs per worker and chunk: run times differ (pipelined stacks cost more), and a
    // chunk waits for its slowest worker.
    const auto chunk = static_cast<std::size_t>(workers_ > 1 ? 4 * workers_ : 1);
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (i % chunk == 0) {  // one worker: a check before every run, as the runs are sequential
        if (!room(stop_at, cost)) {
          r.complete = false;
          return;
        }
        const std::size_t n = std::min(chunk, affordable(left() - stop_at, run_cost(cost)));
        prefetch_choices(r, li, all, i, std::min(all.size(), i + std::max<std::size_t>(n, 1)));
      }
      eval(r, li, all[i]);
    }
  }

  void screen(TuneResult& r) {
    const auto t = Clock::now();
    // The re-run keeps a share of the budget when it is a different engine: what top + 1 runs
    // cost at the price of the scenario's baseline on that engine (run first: it is the
    // reference of the re-run speedups), with a margin, at most half the budget.
    const bool reruns = opts_.rerun_engine != opts_.screen_engine;
    int own = 0;
    for (int li = 0; li < static_cast<int>(r.layouts.size()); ++li)
      if (r.layouts[li].is_scenario) own = li;
    double keep = 0;
    if (reruns) {
      const auto tb = Clock::now();
      r.baseline_rerun = run_one(r, own, kBaselineStack, opts_.rerun_engine);
      // Pipelined stacks cost a few times the baseline's events on flow: a margin of 3.
      keep = std::min(0.5 * opts_.budget_s,
                      std::max(0.1 * opts_.budget_s, 3.0 * (opts_.top + 1) * since(tb)));
      say(fmt::format(
          "baseline on {}: {:.3f} ms ({:.2f} s); {:.1f} s kept for the re-runs", opts_.rerun_engine,
          r.baseline_rerun ? r.baseline_rerun->step_mean_s * 1e3 : NAN, since(tb), keep));
    }
    // (1) Every fitting layout with the baseline stack (and Parm where it applies).
    const double gpu_bytes = topo_->gpu().memory.value();
    std::vector<std::pair<double, int>> order;
    int unscreened = 0;
    // Layouts get at most 40% of the screening time, so the best ones still get a stack search.
    const int probe_iters = iterations_ > 1 ? 1 : 0;
    auto screen_room = [&](int li) {
      const double c = run_cost(layout_units(r, li, probe_iters));
      return since(t) + c <= 0.4 * (opts_.budget_s - keep) && left() - c >= keep;
    };
    const std::vector<int> sorder = screen_order(r);
    const auto chunk = static_cast<std::size_t>(workers_);
    for (std::size_t i = 0; i < sorder.size(); ++i) {
      const int li = sorder[i];
      // The next chunk's probes at once, once a run has priced them (the reference runs first).
      if (workers_ > 1 && i % chunk == 0 && units_ > 0 && screen_room(li)) {
        // As many as the workers finish within the screen's time, at each layout's own cost.
        const double wall =
            std::min(0.4 * (opts_.budget_s - keep) - since(t), left() - keep) * workers_;
        double planned = 0;
        std::vector<Job> jobs;
        for (std::size_t x = i; x < std::min(sorder.size(), i + chunk); ++x) {
          const TuneLayout& lx = r.layouts[sorder[x]];
          if (lx.is_scenario || (gpu_bytes > 0 && lx.memory_bytes > gpu_bytes)) continue;
          const double c = run_cost(layout_units(r, sorder[x], probe_iters));
          if (planned + c > wall) break;
          if (!fits_sampled(r, sorder[x])) continue;
          planned += c;
          for (const Choice& ch : probe_choices(r, sorder[x]))
            jobs.push_back(choice_job(r, sorder[x], ch, probe_iters));
        }
        prefetch(r, jobs);
      }
      const TuneLayout& l = r.layouts[li];
      if (l.is_scenario) {  // the reference of every speedup, fitting or not
        if (auto s = run_one(r, li, kBaselineStack, opts_.screen_engine))
          r.baseline_screen = *s;
        else
          throw InputError(
              fmt::format("{}: the scenario's own layout cannot run the baseline "
                          "stack, so tune has no reference to compare with",
                          path_));
        if (!r.baseline_screen.fits_memory())
          r.notes.push_back(fmt::format(
              "the scenario's own layout does not fit the GPU memory "
              "({} GiB of {} GiB); speedups are still against it",
              gib(r.baseline_screen.memory_bytes), gib(r.baseline_screen.gpu_memory_bytes)));
      }
      if (gpu_bytes > 0 && l.memory_bytes > gpu_bytes) continue;
      // Until one fitting layout has run, the budget does not stop the screen: a search that
      // names nothing that fits (the scenario's own layout over memory) has no answer to give.
      if (!l.is_scenario && !probed(r, li) && !order.empty() && !screen_room(li)) {
        ++unscreened;
        r.complete = false;
        continue;
      }
      if (!fits_sampled(r, li)) continue;
      double best = INFINITY;
      for (const Choice& c : probe_choices(r, li)) best = std::min(best, probe(r, li, c));
      r.layouts[li].screen_s = best;
      if (std::isfinite(best)) order.emplace_back(best, li);
    }
    if (r.over_memory_sampled > 0)
      r.notes.push_back(fmt::format(
          "{} layouts that fit by the estimate without a routing sample did not with the sampled "
          "dC, even with the most recomputation tried (not screened)",
          r.over_memory_sampled));
    if (unscreened > 0)
      r.notes.push_back(
          fmt::format("budget: {} fitting layouts were not screened (screening takes those "
                      "whose bubble and recomputation cost least first, one layout of each pp / "
                      "schedule / mp / esp / layout family in turn; a larger --budget screens "
                      "them)",
                      unscreened));
    std::stable_sort(order.begin(), order.end());
    say(fmt::format("layouts screened: {} ran, best {:.3f} ms ({}), {:.1f} s{}", order.size(),
                    order.empty() ? 0.0 : order[0].first * 1e3,
                    order.empty() ? "-" : r.layouts[order[0].second].describe(), since(t),
                    iterations_ > 1 ? " (1-iteration probes)" : ""));
    // (2) Stack search on the best layouts while the budget lasts.
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (!room(keep, layout_units(r, order[i].second))) {
        r.complete = r.complete && i == order.size();
        if (i < order.size())
          r.notes.push_back(fmt::format("budget: {} of {} layouts got no stack search",
                                        order.size() - i, order.size()));
        break;
      }
      const int li = order[i].second;
      const int before = r.evaluated;
      // Exhaustive when the space fits half of what is left at the cost seen so far per run.
      const int runs = r.evaluated + r.probes;
      const double per_run = runs > 0 ? since(t) / runs : 0.0;
      const bool all = per_run * space_size(roles(r, li)) < 0.5 * (left() - keep);
      if (all) {
        exhaustive(r, li, keep);
      } else {
        descend(r, li, keep);
      }
      if (i == 0) r.search = all ? "exhaustive" : "coordinate descent";
      r.layouts[li].search = all ? "exhaustive" : "coordinate descent";
      ++r.layouts_searched;
      say(fmt::format("layout {}/{} {}: {} ({} runs), best so far {:.3f} ms, {:.0f} s left", i + 1,
                      order.size(), r.layouts[li].describe(),
                      all ? "exhaustive" : "coordinate descent", r.evaluated - before,
                      best_ >= 0 ? rows_[best_].screen.step_mean_s * 1e3 : 0.0,
                      std::max(0.0, left())));
    }
    r.screen_wall_s = since(t);
    // Why stacks were refused, most frequent first (the strategies' own error messages).
    std::vector<std::pair<int, std::string>> why;
    for (const auto& [msg, n] : refusals_) why.emplace_back(-n, msg);
    std::sort(why.begin(), why.end());
    for (std::size_t i = 0; i < why.size() && i < 3; ++i)
      r.notes.push_back(fmt::format("{} stack runs refused: {}", -why[i].first, why[i].second));
  }

  void rerun(TuneResult& r) {
    // Distinct candidates, best first: one per (layout, decisions) — several stacks often take
    // the same decisions (a2a auto choosing linear).
    std::vector<int> idx(rows_.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int>(i);
    // Ties: the stack with fewer roles set first (lina on dp = 1 changes nothing, for one).
    auto roles_set = [](const TuneRow& row) {
      return row.roles == "baseline" ? 0 : std::count(row.roles.begin(), row.roles.end(), '=');
    };
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
      if (rows_[a].screen.step_mean_s != rows_[b].screen.step_mean_s)
        return rows_[a].screen.step_mean_s < rows_[b].screen.step_mean_s;
      return roles_set(rows_[a]) < roles_set(rows_[b]);
    });
    // One row per (layout, step time): stacks that tie on a layout run the same plan in effect
    // (a2a auto choosing linear, a schedule with nothing to schedule).
    for (int i : idx) {
      if (static_cast<int>(r.ranked.size()) >= opts_.top) break;
      const TuneRow& row = rows_[i];
      const double t = row.screen.step_mean_s;
      const bool dup = std::any_of(r.ranked.begin(), r.ranked.end(), [&](const TuneRow& x) {
        return x.layout == row.layout && std::fabs(x.screen.step_mean_s - t) <= 1e-9 * t;
      });
      if (!dup) r.ranked.push_back(row);
    }
    const auto t = Clock::now();
    if (opts_.rerun_engine != opts_.screen_engine && !r.ranked.empty()) {
      std::size_t done = 0, chunks = 0;
      const auto chunk = static_cast<std::size_t>(workers_);
      for (auto& row : r.ranked) {
        if (done % chunk == 0) {
          // Every chunk of re-runs costs about what the first did; stop when the next would
          // overrun.
          const double per = chunks > 0 ? since(t) / static_cast<double>(chunks) : 0.0;
          if (chunks > 0 && left() < per) break;
          ++chunks;
          std::vector<Job> jobs;
          for (std::size_t x = done; x < std::min(r.ranked.size(), done + chunk); ++x)
            jobs.push_back({r.ranked[x].layout, r.ranked[x].stack_yaml, -1, opts_.rerun_engine, 0});
          prefetch(r, jobs);
        }
        row.rerun = run_one(r, row.layout, row.stack_yaml, opts_.rerun_engine);
        ++done;
        say(fmt::format("re-run {}/{} on {}: {:.3f} ms", done, r.ranked.size(), opts_.rerun_engine,
                        row.rerun ? row.rerun->step_mean_s * 1e3 : NAN));
      }
      if (done < r.ranked.size()) {
        r.notes.push_back(fmt::format(
            "budget: {} of the {} best were not re-run on {} (ranked by "
            "{} below them)",
            r.ranked.size() - done, r.ranked.size(), opts_.rerun_engine, opts_.screen_engine));
        r.complete = false;
      }
      // Re-run rows first, by their re-run time; the rest after, by the screen time.
      std::stable_sort(r.ranked.begin(), r.ranked.end(), [](const TuneRow& a, const TuneRow& b) {
        if (a.rerun.has_value() != b.rerun.has_value()) return a.rerun.has_value();
        return a.time_s() < b.time_s();
      });
    }
    r.rerun_wall_s = since(t);
    const RunSummary* base = r.baseline_rerun ? &*r.baseline_rerun : &r.baseline_screen;
    for (auto& row : r.ranked) {
      const RunSummary& s = row.rerun && r.baseline_rerun ? *row.rerun : row.screen;
      const RunSummary& b = row.rerun && r.baseline_rerun ? *base : r.baseline_screen;
      const double speedup = s.step_mean_s > 0 ? b.step_mean_s / s.step_mean_s : 0.0;
      row.screen.speedup = speedup;
      if (row.rerun) row.rerun->speedup = speedup;
    }
  }

  std::string path_;
  TuneOptions opts_;
  Clock::time_point t0_;
  YAML::Node tree_;
  Scenario base_;
  std::unique_ptr<topology::Topology> topo_;
  std::vector<Role> roles_;
  std::map<int, std::vector<Role>> lroles_;
  int iterations_ = 1;
  double base_f0_ = 1.0;  // the workload's capacity factor at iteration 0 (every layout's)
  // Layouts of one mp share the tokens per GPU, so their routing samples are the same: keep a
  // few iterations' worth (k P E 4 bytes each: 134 MB at 4,096 GPUs x 4,096 experts, top-2).
  workload::SampleCache cache_{std::size_t{1} << 30};
  std::map<int, std::unique_ptr<Scenario>> layout_sc_;
  std::map<int, std::unique_ptr<Scenario>> layout_deepep_sc_;  // run_scenario
  std::map<int, std::vector<StrategySpec>> specs_;
  std::map<std::pair<int, int>, double> seen_;
  std::vector<TuneRow> rows_;
  int best_ = -1;
  std::map<std::string, int> refusals_;
  std::map<std::string, Stored> state_;  // "layout|stack|engine|iterations" -> run
  int resumed_ = 0;
  std::string auto_note_;         // why --engine auto re-runs nothing
  SweepTransport* tp_ = nullptr;  // under mpirun: the ranks; rank 0 walks, the others serve()
  int jobs_ = 1;                  // threads per rank
  int workers_ = 1;               // threads of all ranks
  Clock::time_point last_tick_ = Clock::now();
  Clock::time_point last_save_ = Clock::now();
  double max_per_unit_s_ = 0;  // of the screening runs
  double run_s_ = 0;           // their wall time
  double units_ = 0;           // and size (units())
};

}  // namespace

std::string TuneLayout::describe() const {
  std::string out =
      fmt::format("ep={} esp={} mp={} dp={}{} B={}", par.ep, par.esp, par.mp, par.dp,
                  par.mp > 1 ? fmt::format(" {}", name_of(par.layout)) : "", batch_per_gpu);
  if (par.pp > 1) {
    out += fmt::format(" pp={} {}", par.pp, name_of(par.schedule));
    if (par.vp > 1) out += fmt::format(" vp={}", par.vp);
  }
  if (micro_batches > 1) out += fmt::format(" m={}", micro_batches);
  if (par.zero > 0) out += fmt::format(" zero={}", par.zero);
  if (recompute.granularity != RecomputeGranularity::kNone)
    out += fmt::format(" rc={}", name_of(recompute.granularity));
  return out;
}

TuneResult tune(const YAML::Node& tree, const std::string& path,
                const std::vector<std::string>& sets, const TuneOptions& opts) {
  Search s(tree, path, sets, opts);
  if (opts.transport && opts.transport->rank() != 0) {
    s.serve();
    return {};
  }
  return s.run();
}

std::string tuned_scenario_yaml(const YAML::Node& tree, const std::string& path,
                                const std::vector<std::string>& sets, const TuneResult& result,
                                const TuneRow& row) {
  YAML::Node t = edited_tree(tree, sets);
  if (t["model"] && t["model"]["experts"]) t["model"].remove("experts");
  const TuneLayout& l = result.layouts.at(row.layout);
  std::vector<std::string> edits = l.edits;
  edits.push_back("strategies=[{name: baseline}, " + row.stack_yaml + "]");
  t = edited_tree(t, edits);
  // Paths in the file are relative to it; the emitted file may live elsewhere.
  const Scenario sc = parse_scenario(YAML::Clone(t), path);
  if (!sc.cluster.calibration_path.empty())
    t["cluster"]["calibration"] = std::filesystem::absolute(sc.cluster.calibration_path).string();
  if (!sc.workload.routing.trace_path.empty())
    t["workload"]["routing"]["trace"] =
        std::filesystem::absolute(sc.workload.routing.trace_path).string();
  YAML::Emitter em;
  em << t;
  std::ostringstream out;
  out << fmt::format(
      "# Written by `moesim tune {}`: the best stack found ({}) on layout {}.\n"
      "# Predicted step time: {:.3f} ms on {} ({:.2f}x the scenario's baseline).\n"
      "# `moesim simulate` on this file runs the baseline stack on this layout and the tuned "
      "one.\n",
      path, row.roles, l.describe(), row.time_s() * 1e3,
      row.rerun ? result.rerun_engine : result.screen_engine,
      row.rerun ? row.rerun->speedup : row.screen.speedup);
  out << em.c_str() << "\n";
  return out.str();
}

void print_tune(const TuneResult& r) {
  fmt::print(
      "# moesim tune {}: {} GPUs; {} layouts ({} fit in memory, {} searched), {} stacks in all; "
      "{} runs on {} ({} inapplicable, {} over memory){}, {} re-run on {}\n",
      r.scenario, r.gpus, r.layouts.size(), r.layouts_fit, r.layouts_searched, r.stacks_in_space,
      r.evaluated, r.screen_engine, r.inapplicable, r.over_memory,
      r.probes > 0 ? fmt::format(" + {} one-iteration layout probes", r.probes) : "",
      std::count_if(r.ranked.begin(), r.ranked.end(),
                    [](const TuneRow& x) { return x.rerun.has_value(); }),
      r.rerun_engine);
  const bool rerun = r.baseline_rerun.has_value();
  fmt::print(
      "# baseline (the scenario's layout and {{name: baseline}}): {:.3f} ms on {}{}\n",
      r.baseline_screen.step_mean_s * 1e3, r.screen_engine,
      rerun ? fmt::format(", {:.3f} ms on {}", r.baseline_rerun->step_mean_s * 1e3, r.rerun_engine)
            : "");
  fmt::print("{:<4} {:>10} {:>10} {:>8} {:>9}  {:<36} {}\n", "rank",
             fmt::format("{}(ms)", r.screen_engine.substr(0, 5)),
             rerun ? fmt::format("{}(ms)", r.rerun_engine.substr(0, 5)) : std::string("-"),
             "speedup", "mem(GiB)", "layout", "stack (why: decisions; a2a / compute / exposed ms)");
  int rank = 0;
  bool routed = false;
  for (const TuneRow& row : r.ranked) {
    const RunSummary& s = row.rerun ? *row.rerun : row.screen;
    const bool changes_routing = row.changes_routing();
    routed = routed || changes_routing;
    fmt::print("{:<4} {:>10.3f} {:>10} {:>7.2f}x {:>9}  {:<36} {}\n", ++rank,
               row.screen.step_mean_s * 1e3,
               row.rerun ? fmt::format("{:.3f}", row.rerun->step_mean_s * 1e3) : std::string("-"),
               s.speedup, gib(row.screen.memory_bytes), r.layouts[row.layout].describe(),
               fmt::format("{}{}; {}; {:.2f} / {:.2f} / {:.2f}", changes_routing ? "* " : "",
                           row.roles, s.decisions, s.a2a_mean_s * 1e3, s.compute_mean_s * 1e3,
                           s.exposed_comm_mean_s * 1e3));
  }
  if (routed)
    fmt::print(
        "# * the stack's routing role changes which experts tokens reach (what the model "
        "learns); --include-routing put it in the search\n");
  fmt::print(
      "# search: {} on the best layout; {:.1f} s screening, {:.1f} s re-running on {} "
      "worker(s){}; best found after {:.1f} s; {}\n",
      r.search.empty() ? "-" : r.search, r.screen_wall_s, r.rerun_wall_s, r.workers,
      r.runs_per_rank.size() > 1
          ? fmt::format(" ({} ranks; runs spread {})", r.runs_per_rank.size(),
                        fmt::join(r.runs_per_rank, " + "))
          : "",
      r.time_to_best_s, r.complete ? "complete" : "cut short by --budget");
  for (const auto& n : r.notes) fmt::print("# note: {}\n", n);
}

std::string tune_json(const TuneResult& r) {
  using nlohmann::json;
  auto summary = [](const RunSummary& s) {
    return json{
        {"step_time_s", s.step_mean_s},
        {"a2a_s", s.a2a_mean_s},
        {"compute_s", s.compute_mean_s},
        {"exposed_comm_s", s.exposed_comm_mean_s},
        {"decisions", s.decisions},
        {"memory_bytes", s.memory_bytes},
        {"tokens_per_s_per_gpu", s.tokens_per_s_per_gpu},
        {"model_tflops_per_gpu", s.has_model_flops ? json(s.model_tflops_per_gpu) : json(nullptr)},
        {"mfu", s.has_model_flops && s.mfu > 0 ? json(s.mfu) : json(nullptr)}};
  };
  json j;
  j["scenario"] = r.scenario;
  j["gpus"] = r.gpus;
  j["screen_engine"] = r.screen_engine;
  j["rerun_engine"] = r.rerun_engine;
  j["space"] = {{"layouts", r.layouts.size()},
                {"layouts_fit_memory", r.layouts_fit},
                {"over_memory_sampled", r.over_memory_sampled},
                {"layouts_searched", r.layouts_searched},
                {"stacks", r.stacks_in_space},
                {"evaluated", r.evaluated},
                {"layout_probes", r.probes},
                {"runs_from_state", r.resumed},
                {"inapplicable", r.inapplicable},
                {"over_memory", r.over_memory}};
  j["search"] = {{"best_layout", r.search},
                 {"complete", r.complete},
                 {"workers", r.workers},
                 {"spread_runs_per_rank", r.runs_per_rank},
                 {"screen_wall_s", r.screen_wall_s},
                 {"rerun_wall_s", r.rerun_wall_s},
                 {"time_to_best_s", r.time_to_best_s},
                 {"runs_per_s", r.screen_wall_s > 0 ? r.evaluated / r.screen_wall_s : 0.0}};
  j["baseline"] = {{"screen", summary(r.baseline_screen)}};
  if (r.baseline_rerun) j["baseline"]["rerun"] = summary(*r.baseline_rerun);
  json rows = json::array();
  int rank = 0;
  for (const TuneRow& row : r.ranked) {
    const TuneLayout& l = r.layouts[row.layout];
    json x{{"rank", ++rank},
           {"parallelism",
            {{"pp", l.par.pp},
             {"schedule", std::string(name_of(l.par.schedule))},
             {"vp", l.par.vp},
             {"zero", l.par.zero},
             {"ep", l.par.ep},
             {"esp", l.par.esp},
             {"mp", l.par.mp},
             {"dp", l.par.dp},
             {"layout", std::string(name_of(l.par.layout))}}},
           {"batch_per_gpu", l.batch_per_gpu},
           {"micro_batches", l.micro_batches},
           {"experts_per_gpu", l.experts_per_gpu},
           {"recompute", std::string(name_of(l.recompute.granularity))},
           {"stack", row.stack_yaml},
           {"roles", row.roles},
           {"changes_routing", row.changes_routing()},
           {"screen", summary(row.screen)},
           {"speedup", row.rerun ? row.rerun->speedup : row.screen.speedup}};
    if (row.rerun) x["rerun"] = summary(*row.rerun);
    rows.push_back(std::move(x));
  }
  j["ranked"] = std::move(rows);
  j["notes"] = r.notes;
  return j.dump(2);
}

std::string tune_csv(const TuneResult& r) {
  std::ostringstream o;
  o << "rank,pp,schedule,vp,zero,ep,esp,mp,dp,layout,batch_per_gpu,micro_batches,experts_per_gpu,"
       "recompute,roles,screen_step_s,rerun_step_s,speedup,memory_bytes,decisions\n";
  int rank = 0;
  for (const TuneRow& row : r.ranked) {
    const TuneLayout& l = r.layouts[row.layout];
    o << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},\"{}\",{},{},{},{},\"{}\"\n",
                     ++rank, l.par.pp, name_of(l.par.schedule), l.par.vp, l.par.zero, l.par.ep,
                     l.par.esp, l.par.mp, l.par.dp, name_of(l.par.layout), l.batch_per_gpu,
                     l.micro_batches, l.experts_per_gpu, name_of(l.recompute.granularity),
                     row.roles, row.screen.step_mean_s,
                     row.rerun ? fmt::format("{}", row.rerun->step_mean_s) : std::string(""),
                     row.rerun ? row.rerun->speedup : row.screen.speedup, row.screen.memory_bytes,
                     row.screen.decisions);
  }
  return o.str();
}

}  // namespace moesim::app
