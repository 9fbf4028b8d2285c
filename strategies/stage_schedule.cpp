#include "strategies/stage_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>
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

std::vector<StageAction> interleaved_one_f_one_b(int pp, int vp, int stage, int micro_batches) {
  MOESIM_ASSERT(pp >= 1 && vp >= 1 && stage >= 0 && stage < pp && micro_batches >= 1 &&
                    micro_batches % pp == 0,
                "interleaved 1F1B needs a stage in [0, pp) and micro_batches a multiple of pp");
  const int m = micro_batches, group = pp * vp, total = m * vp;
  // Megatron's get_model_chunk_id / get_microbatch_id_in_model_chunk: virtual micro-batches go
  // in groups of pp per chunk, so chunk c + 1 of a micro-batch starts pp forwards after chunk c.
  auto action = [&](int k, bool backward) {
    int chunk = (k % group) / pp;
    if (backward) chunk = vp - 1 - chunk;
    return StageAction{backward, (k / group) * pp + k % pp, chunk, false};
  };
  const int warm = m == pp ? total : std::min((pp - stage - 1) * 2 + (vp - 1) * pp, total);
  std::vector<StageAction> out;
  for (int k = 0; k < warm; ++k) out.push_back(action(k, false));
  for (int k = 0; k < total - warm; ++k) {
    out.push_back(action(warm + k, false));
    out.push_back(action(k, true));
  }
  for (int k = total - warm; k < total; ++k) out.push_back(action(k, true));
  return out;
}

std::vector<StageAction> dualpipe(int pp, int stage, int micro_batches) {
  MOESIM_ASSERT(pp >= 2 && pp % 2 == 0 && stage >= 0 && stage < pp && micro_batches % 2 == 0 &&
                    micro_batches >= 2 * pp,
                "DualPipe needs an even pp, a stage in [0, pp) and an even m >= 2 pp");
  const int half = pp / 2, hr = std::min(stage, pp - 1 - stage), hm = micro_batches / 2;
  const bool second = stage >= half;
  const bool middle = stage == half - 1 || stage == half;
  // Phase 0 is the direction whose micro-batches reach this rank first (the forward direction on
  // the first half of the ranks); chunk = the direction (0: the micro-batches entering at rank 0).
  int next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::vector<StageAction> out;
  auto add = [&](bool backward, int phase, bool overlap_next = false) {
    const int chunk = phase ^ (second ? 1 : 0);
    int& next = backward ? next_b[chunk] : next_f[chunk];
    out.push_back({backward, chunk * hm + next++, chunk, overlap_next});
  };
  auto f_and_b = [&](int f_phase, int b_phase) {
    add(false, f_phase, true);
    add(true, b_phase);
  };
  for (int i = 0; i < (half - hr - 1) * 2; ++i) add(false, 0);  // step 1: nF0
  for (int i = 0; i < hr + 1; ++i) {                            // step 2: nF0F1
    add(false, 0);
    add(false, 1);
  }
  for (int i = 0; i < half - hr - 1; ++i) {  // step 3: nB1W1F1 (W inside B here)
    add(true, 1);
    add(false, 1);
  }
  for (int i = 0; i < hm - pp + hr + 1; ++i) {  // step 4, the main step: nF0B1F1B0
    if (i == 0 && middle) {
      // The reference keeps the middle ranks' first pair apart (it shortens the bubble).
      add(false, 0);
      add(true, 1);
    } else {
      f_and_b(0, 1);
    }
    f_and_b(1, 0);
  }
  for (int i = 0; i < half - hr - 1; ++i) {  // step 5: nB1F1B0
    add(true, 1);
    f_and_b(1, 0);
  }
  for (int i = 0; i < hr + 1; ++i) {  // step 6: nB1B0
    add(true, 1);
    add(true, 0);
  }
  for (int i = 0; i < half - hr - 1; ++i) add(true, 0);  // step 7: nWB0 (W inside B here)
  return out;
}

int chunks_per_stage(const Scenario& sc) {
  switch (sc.parallelism.schedule) {
    case PipelineSchedule::kInterleaved:
      return sc.parallelism.vp;
    case PipelineSchedule::kDualPipe:
      return 2;
    case PipelineSchedule::kOneFOneB:
      break;
  }
  return 1;
}

int model_pieces(const Scenario& sc) {
  return sc.parallelism.schedule == PipelineSchedule::kInterleaved
             ? sc.parallelism.pp * sc.parallelism.vp
             : sc.parallelism.pp;
}

std::pair<int, int> piece_blocks(const Scenario& sc, int k) {
  if (sc.parallelism.schedule != PipelineSchedule::kInterleaved) return sc.stage_blocks(k);
  const int pieces = model_pieces(sc);
  if (const auto& layout = sc.parallelism.pipeline_layout; !layout.empty()) {
    MOESIM_ASSERT(k >= 0 && k < pieces && static_cast<int>(layout.size()) == pieces,
                  "a pipeline layout of pp * vp pieces (the loader checks)");
    int first = 0;
    for (int j = 0; j < k; ++j) first += layout[static_cast<std::size_t>(j)];
    return {first, first + layout[static_cast<std::size_t>(k)]};
  }
  MOESIM_ASSERT(k >= 0 && k < pieces && sc.model.layers % pieces == 0,
                "interleaved chunks split the blocks evenly (the loader checks vp)");
  const int per = sc.model.layers / pieces;
  return {k * per, (k + 1) * per};
}

int piece_of(const Scenario& sc, int stage, int chunk) {
  switch (sc.parallelism.schedule) {
    case PipelineSchedule::kInterleaved:
      return chunk * sc.parallelism.pp + stage;
    case PipelineSchedule::kDualPipe:
      return chunk == 0 ? stage : sc.parallelism.pp - 1 - stage;
    case PipelineSchedule::kOneFOneB:
      break;
  }
  return stage;
}

bool schedule_applies(const Scenario& sc) {
  const auto& p = sc.parallelism;
  const int m = sc.model.micro_batches, layers = sc.model.layers;
  // A layout is written for one pp (and vp): it fits only its own piece count and block count.
  if (!p.pipeline_layout.empty()) {
    int blocks = 0;
    for (int n : p.pipeline_layout) blocks += n;
    if (static_cast<int>(p.pipeline_layout.size()) != model_pieces(sc) || blocks != layers)
      return false;
  }
  switch (p.schedule) {
    case PipelineSchedule::kInterleaved:
      return p.pp >= 2 && m % p.pp == 0 &&
             (!p.pipeline_layout.empty() || layers % (p.pp * p.vp) == 0);
    case PipelineSchedule::kDualPipe:
      return p.pp >= 2 && p.pp % 2 == 0 && m % 2 == 0 && m >= 2 * p.pp;
    case PipelineSchedule::kOneFOneB:
      break;
  }
  return true;
}

std::vector<StageAction> stage_order(const Scenario& sc, int stage) {
  const int pp = sc.parallelism.pp, m = sc.model.micro_batches;
  const bool training = sc.model.mode == Mode::kTraining;
  switch (sc.parallelism.schedule) {
    case PipelineSchedule::kInterleaved:
      return interleaved_one_f_one_b(pp, sc.parallelism.vp, stage, m);
    case PipelineSchedule::kDualPipe:
      return dualpipe(pp, stage, m);
    case PipelineSchedule::kOneFOneB:
      break;
  }
  return one_f_one_b(pp, stage, m, training);
}

int peak_in_flight(const std::vector<StageAction>& order) {
  int held = 0, peak = 0;
  for (const StageAction& a : order) {
    held += a.backward ? -1 : 1;
    peak = std::max(peak, held);
  }
  return peak;
}

double peak_in_flight_bytes(const std::vector<StageAction>& order,
                            const std::vector<double>& chunk_bytes) {
  double held = 0, peak = 0;
  for (const StageAction& a : order) {
    const double bytes = chunk_bytes.at(static_cast<std::size_t>(a.chunk));
    held += a.backward ? -bytes : bytes;
    peak = std::max(peak, held);
  }
  return peak;
}

namespace {

constexpr OpId kUnset = -1;
constexpr OpId kSkipped = -2;  // a gradient all-reduce left out of a non-last micro-batch

class Stitcher {
 public:
  Stitcher(const Scenario& sc, const std::vector<StagePlan>& stages)
      : sc_(sc),
        stages_(stages),
        pp_(sc.parallelism.pp),
        pieces_(static_cast<int>(stages.size())),
        m_(sc.model.micro_batches),
        stage_gpus_(sc.stage_gpus()),
        chunks_(chunks_per_stage(sc)),
        dual_(sc.parallelism.schedule == PipelineSchedule::kDualPipe),
        full_(sc.num_gpus()) {
    MOESIM_ASSERT(pieces_ == model_pieces(sc), "one StagePlan per model piece");
  }

  BuiltPlan run() {
    init();
    std::vector<std::vector<StageAction>> seq(static_cast<std::size_t>(pp_));
    for (int s = 0; s < pp_; ++s) seq[s] = stage_order(sc_, s);
    // Emit in a topological order that keeps every stage's own order: sweep the stages, each
    // emitting its next actions (an overlapped pair at once) while what they receive has been
    // emitted. The schedules never deadlock, so every sweep emits something.
    std::vector<std::size_t> next(static_cast<std::size_t>(pp_), 0);
    std::vector<std::vector<char>> done_f(pieces_, std::vector<char>(m_, 0));
    std::vector<std::vector<char>> done_b(pieces_, std::vector<char>(m_, 0));
    auto ready = [&](int s, StageAction a) {
      const int k = piece_of(sc_, s, a.chunk), i = a.micro_batch;
      if (!a.backward) return k == 0 || done_f[k - 1][i] != 0;
      return k == pieces_ - 1 ? done_f[k][i] != 0 : done_b[k + 1][i] != 0;
    };
    auto mark = [&](int s, StageAction a) {
      (a.backward ? done_b : done_f)[piece_of(sc_, s, a.chunk)][a.micro_batch] = 1;
    };
    for (bool more = true; more;) {
      more = false;
      bool progress = false;
      for (int s = 0; s < pp_; ++s) {
        while (next[s] < seq[s].size()) {
          const StageAction a = seq[s][next[s]];
          if (!ready(s, a)) break;
          if (a.overlap_next) {
            MOESIM_ASSERT(next[s] + 1 < seq[s].size(), "an overlapped action without a partner");
            const StageAction b = seq[s][next[s] + 1];
            if (!ready(s, b)) break;
            emit(s, {a, b});
            mark(s, a);
            mark(s, b);
            next[s] += 2;
          } else {
            emit(s, {a});
            mark(s, a);
            ++next[s];
          }
          progress = true;
        }
        more = more || next[s] < seq[s].size();
      }
      MOESIM_ASSERT(!more || progress, "pipeline schedule made no progress");
    }
    return BuiltPlan{std::move(full_), make_index()};
  }

 private:
  // The rank-stage and chunk that run piece k of micro-batch i.
  int rank_of(int k, int i) const {
    switch (sc_.parallelism.schedule) {
      case PipelineSchedule::kInterleaved:
        return k % pp_;
      case PipelineSchedule::kDualPipe:
        return i < m_ / 2 ? k : pp_ - 1 - k;
      case PipelineSchedule::kOneFOneB:
        break;
    }
    return k;
  }
  int chunk_of(int k, int i) const {
    if (dual_) return i < m_ / 2 ? 0 : 1;
    return k / pp_;
  }

  void init() {
    // Streams: piece 0's in its order first (so "compute" and the others keep their usual ids),
    // then the stage-to-stage ones.
    smap_.assign(pieces_, {});
    for (int k = 0; k < pieces_; ++k)
      for (int v = 0; v < 2; ++v)
        smap_[k][v].assign(stages_[k].built.plan.stream_names().size(), -1);
    for (int k = 0; k < pieces_; ++k)
      for (std::size_t j = 0; j < stages_[k].built.plan.stream_names().size(); ++j)
        smap_[k][0][j] = full_.stream(stages_[k].built.plan.stream_names()[j]);
    for (int b = 0; b < 2; ++b) {
      full_.stream(fmt::format("pp_act{}", b));
      full_.stream(fmt::format("pp_grad{}", b));
    }
    const ModelSpec& m = sc_.model;
    const Bytes act(static_cast<double>(m.tokens_per_gpu()) * m.model_dim * m.bytes_per_element());
    auto two_rank = [&](bool up) {
      ByteMatrix mat;
      mat.size = 2;
      mat.unit = act;
      mat.counts =
          up ? std::vector<std::uint32_t>{0, 1, 0, 0} : std::vector<std::uint32_t>{0, 0, 1, 0};
      return std::make_shared<const ByteMatrix>(std::move(mat));
    };
    up_matrix_ = two_rank(true);
    down_matrix_ = two_rank(false);
    fwd_.assign(pieces_, std::vector<std::vector<OpId>>(m_));
    bwd_.assign(pieces_, std::vector<std::vector<OpId>>(m_));
    recv_act_.assign(pieces_, std::vector<OpId>(m_, kUnset));
    recv_grad_.assign(pieces_, std::vector<OpId>(m_, kUnset));
    last_out_.assign(pp_, {});
    last_mb_.assign(pieces_, std::vector<int>(pp_, -1));
    for (int i = 0; i < m_; ++i)
      for (int k = 0; k < pieces_; ++k) last_mb_[k][rank_of(k, i)] = i;
    grad_ops_.resize(pieces_);
    for (int k = 0; k < pieces_; ++k) {
      grad_ops_[k].insert(stages_[k].built.index.gradient_sync.begin(),
                          stages_[k].built.index.gradient_sync.end());
      grad_ops_[k].insert(stages_[k].last_micro_batch_only.begin(),
                          stages_[k].last_micro_batch_only.end());
    }
  }

  // Piece k's stream `src` on the full plan: DualPipe's reverse-direction chunk puts everything
  // but the compute stream on streams of its own, so an overlapped pair's collectives never queue
  // behind each other.
  StreamId stream(int k, int variant, StreamId src) {
    StreamId& id = smap_[k][variant][static_cast<std::size_t>(src)];
    if (id < 0) {
      const std::string& name = stages_[k].built.plan.stream_names()[src];
      id = full_.stream(name == "compute" ? name : name + ".rev");
    }
    return id;
  }

  // Piece k's grouping g moved to rank-stage s's GPUs (added on first use).
  GroupingId grouping(int k, int s, GroupingId g) {
    auto& ids = gmap_[{k, s}];
    if (ids.empty()) ids.assign(stages_[k].built.plan.groupings().size(), kUnset);
    GroupingId& id = ids[static_cast<std::size_t>(g)];
    if (id == kUnset) {
      Grouping copy = stages_[k].built.plan.grouping(g);
      if (pp_ > 1) copy.name = fmt::format("{}.s{}", copy.name, s);
      if (chunks_ > 1) copy.name += fmt::format(".p{}", k);
      for (auto& grp : copy.groups)
        for (int& r : grp) r += s * stage_gpus_;
      id = full_.add_grouping(std::move(copy));
    }
    return id;
  }

  // The pairs (rank of stage lo, the same position in stage hi).
  GroupingId pair(int lo, int hi) {
    if (auto it = pairs_.find({lo, hi}); it != pairs_.end()) return it->second;
    Grouping g;
    g.name = fmt::format("pp{}_{}", lo, hi);
    for (int r = 0; r < stage_gpus_; ++r)
      g.groups.push_back({lo * stage_gpus_ + r, hi * stage_gpus_ + r});
    return pairs_[{lo, hi}] = full_.add_grouping(std::move(g));
  }

  // A micro-batch's activation (forward) or gradient from rank-stage `from` to `to`. Streams:
  // per kind, direction and neighbour-boundary parity (1F1B's pp_act{b}, pp_grad{b}), the
  // opposite directions (DualPipe's reverse micro-batches) and the wrap from the last rank-stage
  // to the first (interleaved) on streams of their own.
  OpId send(int from, int to, bool forward, OpId after, int micro_batch, int piece) {
    const int lo = std::min(from, to), hi = std::max(from, to);
    const bool up = from < to;
    const bool natural = forward == up;  // 1F1B's directions
    std::string name = forward ? "pp_act" : "pp_grad";
    if (hi - lo == 1)
      name += fmt::format("{}{}", natural ? "" : "_rev", lo % 2);
    else
      name += natural ? "_wrap" : "_wrap_rev";
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAllv;
    spec.algo = CollectiveAlgo::kLinear;
    spec.grouping = pair(lo, hi);
    spec.matrix = up ? up_matrix_ : down_matrix_;
    spec.stage_send = true;
    std::string label =
        fmt::format("{}pp.{}.s{}_s{}", prefix(micro_batch), forward ? "act" : "grad", from, to);
    if (chunks_ > 1) label += fmt::format(".p{}", piece);
    return full_.add_collective(full_.stream(name), std::move(spec), {after}, OpTag(label));
  }

  std::string prefix(int micro_batch) const {
    return m_ > 1 ? fmt::format("mb{}.", micro_batch) : std::string();
  }

  // One pass (a forward or a backward of piece k, micro-batch i) being instantiated.
  struct Pass {
    int s = 0, k = 0, i = 0, variant = 0;
    bool backward = false;
    OpId next = 0, hi = 0;
    std::vector<OpId> entry_deps;
    bool keep_grads = true;
    std::unordered_map<OpId, std::vector<OpId>> skipped;  // a left-out op -> what it waited for
  };

  Pass begin(int s, StageAction a) {
    Pass p;
    p.s = s;
    p.k = piece_of(sc_, s, a.chunk);
    p.i = a.micro_batch;
    p.variant = dual_ && a.chunk == 1 ? 1 : 0;
    p.backward = a.backward;
    const StagePlan& sp = stages_[p.k];
    p.next = a.backward ? sp.bwd_begin : 0;
    p.hi = a.backward ? static_cast<OpId>(sp.built.plan.ops().size()) : sp.bwd_begin;
    (a.backward ? bwd_ : fwd_)[p.k][p.i].assign(sp.built.plan.ops().size(), kUnset);
    // What the pass's first ops wait for: the stage's previous action(s) and what it receives.
    p.entry_deps = last_out_[s];
    const OpId recv = a.backward ? recv_grad_[p.k][p.i] : recv_act_[p.k][p.i];
    if (recv != kUnset) p.entry_deps.push_back(recv);
    p.keep_grads = !a.backward || p.i == last_mb_[p.k][s];
    return p;
  }

  // Instantiates the pass's ops up to and including its next collective (all when `whole`).
  void advance(Pass& p, bool whole) {
    const StagePlan& sp = stages_[p.k];
    const Plan& plan = sp.built.plan;
    const OpId lo = p.backward ? sp.bwd_begin : 0;
    std::vector<OpId>& map = (p.backward ? bwd_ : fwd_)[p.k][p.i];
    const std::vector<OpId>& fwd_map = fwd_[p.k][p.i];
    for (; p.next < p.hi; ++p.next) {
      const OpId id = p.next;
      const Op& src = plan.op(id);
      std::vector<OpId> deps;
      bool entry = true;  // no dependency inside this pass
      for (OpId d : src.deps) {
        if (d >= lo) entry = false;
        const OpId to = d < lo ? fwd_map.at(static_cast<std::size_t>(d)) : map[d];
        if (to == kSkipped) {
          const auto& via = p.skipped.at(d);
          deps.insert(deps.end(), via.begin(), via.end());
        } else {
          MOESIM_ASSERT(to >= 0, "stage plan dependency not instantiated");
          deps.push_back(to);
        }
      }
      if (entry) deps.insert(deps.end(), p.entry_deps.begin(), p.entry_deps.end());
      std::sort(deps.begin(), deps.end());
      deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
      if (!p.keep_grads && grad_ops_[p.k].count(id) > 0) {
        map[id] = kSkipped;
        p.skipped.emplace(id, std::move(deps));
        continue;
      }
      Op op = src;
      op.id = -1;
      op.ranks = src.ranks.shifted(p.s * stage_gpus_);
      op.stream = stream(p.k, p.variant, src.stream);
      op.deps = std::move(deps);
      const bool collective = op.kind == OpKind::kCollective;
      if (collective) {
        auto& spec = std::get<CollectiveSpec>(op.spec);
        spec.grouping = grouping(p.k, p.s, spec.grouping);
      }
      if (m_ > 1) op.label = prefix(p.i) + op.label;
      map[id] = full_.add(std::move(op));
      if (collective && !whole) {
        ++p.next;
        return;
      }
    }
  }

  // The pass's output op (kUnset when the pass is empty), after sending it on.
  OpId finish(const Pass& p) {
    const StagePlan& sp = stages_[p.k];
    const OpId out_src = p.backward ? sp.bwd_out : sp.fwd_out;
    if (out_src < 0) return kUnset;
    const std::vector<OpId>& map = (p.backward ? bwd_ : fwd_)[p.k][p.i];
    MOESIM_ASSERT(map[out_src] >= 0, "a stage pass's output op was left out");
    const OpId out = map[out_src];
    const int to_piece = p.backward ? p.k - 1 : p.k + 1;
    if (to_piece >= 0 && to_piece < pieces_) {
      const int to = rank_of(to_piece, p.i);
      OpId& recv = (p.backward ? recv_grad_ : recv_act_)[to_piece][p.i];
      recv = to == p.s ? out : send(p.s, to, !p.backward, out, p.i, p.k);
    }
    return out;
  }

  // One action, or an overlapped pair whose ops alternate on the compute stream at every
  // collective: while one pass's all-to-all (or send) runs, the other computes.
  void emit(int s, const std::vector<StageAction>& actions) {
    std::vector<Pass> passes;
    for (const StageAction& a : actions) passes.push_back(begin(s, a));
    if (passes.size() == 1) {
      advance(passes[0], true);
    } else {
      for (bool more = true; more;) {
        more = false;
        for (Pass& p : passes) {
          if (p.next < p.hi) advance(p, false);
          more = more || p.next < p.hi;
        }
      }
    }
    std::vector<OpId> outs;
    for (const Pass& p : passes)
      if (const OpId out = finish(p); out != kUnset) outs.push_back(out);
    if (!outs.empty()) last_out_[s] = std::move(outs);
  }

  PlanIndex make_index() const {
    PlanIndex out;
    for (int k = 0; k < pieces_; ++k) {
      const StagePlan& sp = stages_[k];
      for (int i = 0; i < m_; ++i) {
        auto id_of = [&](OpId id) {
          const OpId to = id < sp.bwd_begin ? fwd_[k][i][id] : bwd_[k][i][id];
          MOESIM_ASSERT(to >= 0, "an indexed MoE op was not instantiated");
          return to;
        };
        // A gradient all-reduce a schedule listed with the layer's ops (Parm's backward) exists
        // only in the last micro-batch; the other instances leave it out of their lists.
        auto mapped = [&](const std::vector<OpId>& ids) {
          std::vector<OpId> r;
          r.reserve(ids.size());
          for (OpId id : ids) {
            if (id >= sp.bwd_begin && bwd_[k][i][id] == kSkipped) continue;
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
      for (int s = 0; s < pp_; ++s)
        if (const int last = last_mb_[k][s]; last >= 0)
          for (OpId id : sp.built.index.gradient_sync)
            out.gradient_sync.push_back(bwd_[k][last][id]);
    }
    return out;
  }

  const Scenario& sc_;
  const std::vector<StagePlan>& stages_;
  int pp_, pieces_, m_, stage_gpus_, chunks_;
  bool dual_;
  Plan full_;
  std::vector<std::array<std::vector<StreamId>, 2>> smap_;  // per piece and variant
  std::map<std::pair<int, int>, std::vector<GroupingId>> gmap_;
  std::map<std::pair<int, int>, GroupingId> pairs_;
  std::shared_ptr<const ByteMatrix> up_matrix_, down_matrix_;
  // Per piece and micro-batch: stage-plan op id -> full plan op id, for its forward and backward.
  std::vector<std::vector<std::vector<OpId>>> fwd_, bwd_;
  std::vector<std::vector<OpId>> recv_act_, recv_grad_;  // the send a pass waits for
  std::vector<std::vector<OpId>> last_out_;              // per stage: its last action's outputs
  std::vector<std::vector<int>> last_mb_;  // per piece and stage: the last micro-batch there
  std::vector<std::unordered_set<OpId>> grad_ops_;
};

}  // namespace

BuiltPlan stitch_stages(const Scenario& sc, const std::vector<StagePlan>& stages) {
  return Stitcher(sc, stages).run();
}

}  // namespace moesim::strategies
