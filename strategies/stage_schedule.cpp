#include "strategies/stage_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace moesim::strategies {

std::vector<StageAction> one_f_one_b(int pp, int stage, int micro_batches, bool training) {
  MOESIM_ASSERT(pp >= 1 && stage >= 0 && stage < pp && micro_batches >= 1,
                "1F1B needs pp >= 1, a stage in [0, pp) and micro_batches >= 1");
  std::vector<StageAction> out;
  const int m = micro_batches;
  if (!training) {
    for (int i = 0; i < m; ++i) out.push_back({false, i});
    return out;
  }
  const int warm = std::min(pp - 1 - stage, m);
  for (int i = 0; i < warm; ++i) out.push_back({false, i});
  for (int j = 0; j < m - warm; ++j) {
    out.push_back({false, warm + j});
    out.push_back({true, j});
  }
  for (int j = m - warm; j < m; ++j) out.push_back({true, j});
  return out;
}

namespace {

constexpr OpId kUnset = -1;
constexpr OpId kSkipped = -2;  // a gradient all-reduce left out of a non-last micro-batch

class Stitcher {
 public:
  Stitcher(const Scenario& sc, const std::vector<StagePlan>& stages)
      : sc_(sc),
        stages_(stages),
        pp_(static_cast<int>(stages.size())),
        m_(sc.model.micro_batches),
        stage_gpus_(sc.stage_gpus()),
        training_(sc.model.mode == Mode::kTraining),
        full_(sc.num_gpus()) {
    MOESIM_ASSERT(pp_ == sc.parallelism.pp, "one StagePlan per pipeline stage");
  }

  BuiltPlan run() {
    init();
    std::vector<std::vector<StageAction>> seq(static_cast<std::size_t>(pp_));
    for (int s = 0; s < pp_; ++s) seq[s] = one_f_one_b(pp_, s, m_, training_);
    // Emit in a topological order that keeps every stage's own order: sweep the stages, each
    // emitting its next actions while what they receive has been emitted. 1F1B never deadlocks,
    // so every sweep emits something.
    std::vector<std::size_t> next(static_cast<std::size_t>(pp_), 0);
    std::vector<std::vector<char>> done_f(pp_, std::vector<char>(m_, 0));
    std::vector<std::vector<char>> done_b(pp_, std::vector<char>(m_, 0));
    for (bool more = true; more;) {
      more = false;
      bool progress = false;
      for (int s = 0; s < pp_; ++s) {
        while (next[s] < seq[s].size()) {
          const StageAction a = seq[s][next[s]];
          const bool ready = a.backward ? (s == pp_ - 1 || done_b[s + 1][a.micro_batch])
                                        : (s == 0 || done_f[s - 1][a.micro_batch]);
          if (!ready) break;
          emit(s, a);
          (a.backward ? done_b : done_f)[s][a.micro_batch] = 1;
          ++next[s];
          progress = true;
        }
        more = more || next[s] < seq[s].size();
      }
      MOESIM_ASSERT(!more || progress, "1F1B schedule made no progress");
    }
    return BuiltPlan{std::move(full_), make_index()};
  }

 private:
  void init() {
    // Streams: stage 0's in its order first (so "compute" and the others keep their usual ids),
    // then the stage-to-stage ones.
    smap_.resize(pp_);
    for (int s = 0; s < pp_; ++s)
      for (const std::string& name : stages_[s].built.plan.stream_names())
        smap_[s].push_back(full_.stream(name));
    for (int b = 0; b < 2; ++b) {
      act_stream_[b] = full_.stream(fmt::format("pp_act{}", b));
      grad_stream_[b] = full_.stream(fmt::format("pp_grad{}", b));
    }
    gmap_.resize(pp_);
    for (int s = 0; s < pp_; ++s) gmap_[s].assign(stages_[s].built.plan.groupings().size(), kUnset);
    boundary_.assign(static_cast<std::size_t>(std::max(pp_ - 1, 0)), kUnset);
    const ModelSpec& m = sc_.model;
    const Bytes act(static_cast<double>(m.tokens_per_gpu()) * m.model_dim * m.bytes_per_element());
    auto two_rank = [&](bool forward) {
      ByteMatrix mat;
      mat.size = 2;
      mat.unit = act;
      mat.counts =
          forward ? std::vector<std::uint32_t>{0, 1, 0, 0} : std::vector<std::uint32_t>{0, 0, 1, 0};
      return std::make_shared<const ByteMatrix>(std::move(mat));
    };
    act_matrix_ = two_rank(true);
    grad_matrix_ = two_rank(false);
    fwd_.assign(pp_, std::vector<std::vector<OpId>>(m_));
    bwd_.assign(pp_, std::vector<std::vector<OpId>>(m_));
    recv_act_.assign(pp_, std::vector<OpId>(m_, kUnset));
    recv_grad_.assign(pp_, std::vector<OpId>(m_, kUnset));
    last_out_.assign(pp_, kUnset);
    grad_ops_.resize(pp_);
    for (int s = 0; s < pp_; ++s) {
      grad_ops_[s].insert(stages_[s].built.index.gradient_sync.begin(),
                          stages_[s].built.index.gradient_sync.end());
      grad_ops_[s].insert(stages_[s].last_micro_batch_only.begin(),
                          stages_[s].last_micro_batch_only.end());
    }
  }

  // Stage s's grouping g moved to the stage's GPUs (added on first use).
  GroupingId grouping(int s, GroupingId g) {
    GroupingId& id = gmap_[s][static_cast<std::size_t>(g)];
    if (id == kUnset) {
      Grouping copy = stages_[s].built.plan.grouping(g);
      if (pp_ > 1) copy.name = fmt::format("{}.s{}", copy.name, s);
      for (auto& grp : copy.groups)
        for (int& r : grp) r += s * stage_gpus_;
      id = full_.add_grouping(std::move(copy));
    }
    return id;
  }

  // The pairs (rank of stage b, the same position in stage b + 1).
  GroupingId boundary(int b) {
    GroupingId& id = boundary_[static_cast<std::size_t>(b)];
    if (id == kUnset) {
      Grouping g;
      g.name = fmt::format("pp{}_{}", b, b + 1);
      for (int r = 0; r < stage_gpus_; ++r)
        g.groups.push_back({b * stage_gpus_ + r, (b + 1) * stage_gpus_ + r});
      id = full_.add_grouping(std::move(g));
    }
    return id;
  }

  OpId send(int b, bool forward, OpId after, int micro_batch) {
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAllv;
    spec.algo = CollectiveAlgo::kLinear;
    spec.grouping = boundary(b);
    spec.matrix = forward ? act_matrix_ : grad_matrix_;
    const std::string label =
        fmt::format("{}pp.{}.s{}_s{}", prefix(micro_batch), forward ? "act" : "grad",
                    forward ? b : b + 1, forward ? b + 1 : b);
    return full_.add_collective(forward ? act_stream_[b % 2] : grad_stream_[b % 2], std::move(spec),
                                {after}, OpTag(label));
  }

  std::string prefix(int micro_batch) const {
    return m_ > 1 ? fmt::format("mb{}.", micro_batch) : std::string();
  }

  void emit(int s, StageAction a) {
    const StagePlan& sp = stages_[s];
    const Plan& plan = sp.built.plan;
    const int i = a.micro_batch;
    const OpId lo = a.backward ? sp.bwd_begin : 0;
    const OpId hi = a.backward ? static_cast<OpId>(plan.ops().size()) : sp.bwd_begin;
    std::vector<OpId>& map = (a.backward ? bwd_ : fwd_)[s][i];
    map.assign(plan.ops().size(), kUnset);
    const std::vector<OpId>& fwd_map = fwd_[s][i];
    // What the action's first ops wait for: the stage's previous action and what it receives.
    std::vector<OpId> entry_deps;
    if (last_out_[s] != kUnset) entry_deps.push_back(last_out_[s]);
    const OpId recv = a.backward ? recv_grad_[s][i] : recv_act_[s][i];
    if (recv != kUnset) entry_deps.push_back(recv);
    const bool keep_grads = !a.backward || i == m_ - 1;
    std::unordered_map<OpId, std::vector<OpId>> skipped;  // a left-out op -> what it waited for
    for (OpId id = lo; id < hi; ++id) {
      const Op& src = plan.op(id);
      std::vector<OpId> deps;
      bool entry = true;  // no dependency inside this pass
      for (OpId d : src.deps) {
        if (d >= lo) entry = false;
        const OpId to = d < lo ? fwd_map.at(static_cast<std::size_t>(d)) : map[d];
        if (to == kSkipped) {
          const auto& via = skipped.at(d);
          deps.insert(deps.end(), via.begin(), via.end());
        } else {
          MOESIM_ASSERT(to >= 0, "stage plan dependency not instantiated");
          deps.push_back(to);
        }
      }
      if (entry) deps.insert(deps.end(), entry_deps.begin(), entry_deps.end());
      std::sort(deps.begin(), deps.end());
      deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
      if (!keep_grads && grad_ops_[s].count(id) > 0) {
        map[id] = kSkipped;
        skipped.emplace(id, std::move(deps));
        continue;
      }
      Op op = src;
      op.id = -1;
      op.ranks = src.ranks.shifted(s * stage_gpus_);
      op.stream = smap_[s][static_cast<std::size_t>(src.stream)];
      op.deps = std::move(deps);
      if (op.kind == OpKind::kCollective) {
        auto& spec = std::get<CollectiveSpec>(op.spec);
        spec.grouping = grouping(s, spec.grouping);
      }
      if (m_ > 1) op.label = prefix(i) + op.label;
      map[id] = full_.add(std::move(op));
    }
    const OpId out_src = a.backward ? sp.bwd_out : sp.fwd_out;
    if (out_src >= 0) {
      MOESIM_ASSERT(map[out_src] >= 0, "a stage pass's output op was left out");
      last_out_[s] = map[out_src];
    }
    if (!a.backward && s + 1 < pp_) recv_act_[s + 1][i] = send(s, true, last_out_[s], i);
    if (a.backward && s > 0) recv_grad_[s - 1][i] = send(s - 1, false, last_out_[s], i);
  }

  PlanIndex make_index() const {
    PlanIndex out;
    for (int s = 0; s < pp_; ++s) {
      const StagePlan& sp = stages_[s];
      for (int i = 0; i < m_; ++i) {
        auto id_of = [&](OpId id) {
          const OpId to = id < sp.bwd_begin ? fwd_[s][i][id] : bwd_[s][i][id];
          MOESIM_ASSERT(to >= 0, "an indexed MoE op was not instantiated");
          return to;
        };
        // A gradient all-reduce a schedule listed with the layer's ops (Parm's backward) exists
        // only in the last micro-batch; the other instances leave it out of their lists.
        auto mapped = [&](const std::vector<OpId>& ids) {
          std::vector<OpId> r;
          r.reserve(ids.size());
          for (OpId id : ids) {
            if (id >= sp.bwd_begin && bwd_[s][i][id] == kSkipped) continue;
            r.push_back(id_of(id));
          }
          return r;
        };
        for (const auto& l : sp.built.index.moe_layers) {
          PlanIndex::MoeLayerOps e;
          e.layer = l.layer;
          e.forward = mapped(l.forward);
          e.backward = mapped(l.backward);
          e.dispatch = mapped(l.dispatch);
          e.combine = mapped(l.combine);
          e.expert = mapped(l.expert);
          out.moe_layers.push_back(std::move(e));
        }
      }
      for (OpId id : sp.built.index.gradient_sync) out.gradient_sync.push_back(bwd_[s][m_ - 1][id]);
    }
    return out;
  }

  const Scenario& sc_;
  const std::vector<StagePlan>& stages_;
  int pp_, m_, stage_gpus_;
  bool training_;
  Plan full_;
  std::vector<std::vector<StreamId>> smap_;
  StreamId act_stream_[2] = {0, 0}, grad_stream_[2] = {0, 0};
  std::vector<std::vector<GroupingId>> gmap_;
  std::vector<GroupingId> boundary_;
  std::shared_ptr<const ByteMatrix> act_matrix_, grad_matrix_;
  // Per stage and micro-batch: stage-plan op id -> full plan op id, for its forward and backward.
  std::vector<std::vector<std::vector<OpId>>> fwd_, bwd_;
  std::vector<std::vector<OpId>> recv_act_, recv_grad_;  // the send a pass waits for
  std::vector<OpId> last_out_;                           // per stage: its last pass's output
  std::vector<std::unordered_set<OpId>> grad_ops_;
};

}  // namespace

BuiltPlan stitch_stages(const Scenario& sc, const std::vector<StagePlan>& stages) {
  return Stitcher(sc, stages).run();
}

}  // namespace moesim::strategies
