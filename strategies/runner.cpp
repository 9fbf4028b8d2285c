#include "strategies/runner.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/error.hpp"
#include "core/gemm_model.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/inference/session.hpp"
#include "strategies/model_flops.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/strategy.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::strategies {

namespace {

// The scenario one pipeline stage decides on: `whole` itself without stages (no copy: a
// Scenario copy carries every strategy, and each strategy's run would pay for all of them),
// else its stage_scenario() kept in `storage`.
const Scenario& stage_of(const Scenario& whole, std::optional<Scenario>& storage) {
  if (whole.parallelism.pp <= 1) return whole;
  return storage.emplace(whole.stage_scenario());
}

// Last end minus first start over a set of ops (0 for an empty set).
double span_s(const RunResult& r, const std::vector<OpId>& ops) {
  if (ops.empty()) return 0;
  double first = std::numeric_limits<double>::infinity();
  double last = -std::numeric_limits<double>::infinity();
  for (OpId id : ops) {
    first = std::min(first, r.op_first_start(id));
    last = std::max(last, r.op_last_end(id));
  }
  return last - first;
}

// The ops' time per rank, averaged over the plan's ranks: each op's span counts for the ranks it
// runs on. Ops over every rank add their spans; a pipeline stage's ops count for that stage's
// ranks only, so a staged plan is not charged every stage's all-to-alls on every rank.
double durations_s(const RunResult& r, const Plan& plan, const std::vector<OpId>& ops) {
  double sum = 0;
  for (OpId id : ops) sum += (r.op_last_end(id) - r.op_first_start(id)) * plan.op(id).ranks.size();
  return plan.num_ranks() > 0 ? sum / plan.num_ranks() : 0.0;
}

// The dC an iteration's memory estimate assumes: its largest MoE layer's (an upper bound of
// every layer's padded buffers).
// dC the memory estimate sizes the expert rows with (R = E dC): the padded buffer's, or, for a
// routed dispatch (variable_dispatch, unsharded experts, no packing or placement), the rows the
// fullest GPU really receives, as E dC: those send and keep only the routed tokens (DeepEP's
// dispatch among them), not a buffer padded to the busiest (source, expert) pair's count.
// `sc` is the stage's scenario the workload was sampled on.
std::int64_t memory_capacity(const Scenario& sc, const Decision& d,
                             const workload::IterationWorkload& work) {
  std::int64_t capacity = 0;
  for (const auto& l : work.layers) capacity = std::max(capacity, l.capacity);
  const ModelSpec& m = sc.model;
  if (!d.variable_dispatch || d.expert_pack > 1 || d.inference || m.expert_shards() > 1 ||
      sc.parallelism.esp > 1 || work.layers.empty())
    return capacity;
  const Groups groups = make_groups(sc);
  const int dE = m.local_experts();
  std::int64_t rows = 0;
  for (const auto& l : work.layers)
    for (const auto& grp : groups.ep.groups)
      for (std::size_t pos = 0; pos < grp.size(); ++pos) {
        std::int64_t received = 0;
        for (int src : grp)
          for (int e = static_cast<int>(pos) * dE; e < static_cast<int>(pos + 1) * dE; ++e)
            received += l.at(src, e);
        rows = std::max(rows, received);
      }
  return std::min(capacity, (rows + m.experts - 1) / m.experts);
}

IterationRecord make_record(const Scenario& sc, int index, double f, const Decision& d,
                            const workload::IterationWorkload& work, const BuiltPlan& built,
                            const RunResult& result) {
  IterationRecord rec;
  rec.index = index;
  rec.capacity_factor = f;
  rec.decision = d;
  rec.step_time_s = result.makespan_s;
  const auto& layers = built.index.moe_layers;
  double moe = 0, a2a = 0;
  for (const auto& l : layers) {
    // Forward and backward of one layer are separated by the rest of the model's forward and
    // backward, so the layer's time is the sum of the two spans, not one span over both.
    moe += span_s(result, l.forward) + span_s(result, l.backward);
    a2a += durations_s(result, built.plan, l.dispatch) + durations_s(result, built.plan, l.combine);
  }
  rec.moe_layer_time_s = layers.empty() ? 0 : moe / static_cast<double>(layers.size());
  rec.a2a_s = a2a;
  rec.allreduce_s = result.breakdown.allreduce_s;
  rec.compute_s = result.breakdown.compute_s;
  rec.exposed_comm_s = result.breakdown.exposed_comm_s;
  rec.breakdown = result.breakdown;
  for (const auto& l : work.layers) rec.dropped_tokens += l.dropped;
  std::optional<Scenario> staged;
  rec.memory = estimate_memory(sc, d, memory_capacity(stage_of(sc, staged), d, work));
  return rec;
}

// Iteration i up to its plan: dC before rounding (what the stack decides for), the stack's
// decision, and the workload rounded to the decision's capacity multiple. run_stack and
// planned_memory share it, so both estimate memory from the same decision and dC.
struct Prepared {
  double f = 0;
  std::int64_t capacity = 0;
  Decision decision;
  workload::IterationWorkload work;
};

Prepared prepare_iteration(const Scenario& sc, const StrategySpec& spec,
                           const topology::Topology& topo, const CostModel& cost,
                           StrategyStack& stack, workload::WorkloadGenerator& generator,
                           inference::InferenceSession* session,
                           const std::vector<IterationRecord>& history, int i, bool for_execution) {
  const auto& md = sc.model;
  Prepared p;
  p.f = generator.capacity_factor(i);
  const double f = p.f;
  // dC before rounding to the capacity multiple: closed form for f > 0; dropless factors need
  // the sampled counts (the first MoE layer's), so the iteration is sampled once here, with
  // capacity multiple 1, and round_capacity re-rounds dC to capacity_multiple after the
  // decision: the same counts next(i, multiple) would draw (only a capped f < 0 that dropped
  // choices has to sample again, as a larger dC keeps more of them).
  std::int64_t capacity = 0;
  std::optional<workload::IterationWorkload> sampled;
  if (session) session->generate(i);
  if (session && f <= 0 && md.num_moe_layers() > 0)
    capacity = session->workload(i, f, 1).layers[0].capacity;
  else if (f > 0 || md.num_moe_layers() == 0)
    capacity =
        workload::capacity_slots(f > 0 ? f : 1.0, md.top_k, md.tokens_per_gpu(), md.experts, 0, 1);
  else {
    sampled = generator.next(i, 1);
    capacity = sampled->layers[0].capacity;
  }
  p.capacity = std::max<std::int64_t>(capacity, 1);

  const StrategyContext ctx{sc, spec, topo, cost, i, f, p.capacity, &history};
  p.decision.expert_routing = for_execution;
  stack.decide(ctx, p.decision);
  // dC rounded up so that every chunk's per-peer share is whole (capacity_multiple): the
  // pipeline degree, times n / rho for sharded experts and mp for Parm's fused schedules.
  const int multiple = capacity_multiple(sc, p.decision);
  p.work = session ? session->workload(i, f, multiple)
           : sampled && generator.round_capacity(*sampled, multiple) ? std::move(*sampled)
                                                                     : generator.next(i, multiple);
  return p;
}

}  // namespace

Decision first_decision(const Scenario& whole, const StrategySpec& spec,
                        const topology::Topology& topo, std::int64_t capacity, double f) {
  std::optional<Scenario> staged;
  const Scenario& sc = stage_of(whole, staged);  // strategies decide for one pipeline stage
  const CostModel cost(sc, topo);
  std::unique_ptr<StrategyStack> stack = make_stack(spec);
  const std::vector<IterationRecord> history;
  const StrategyContext ctx{sc, spec, topo, cost, 0, f, capacity, &history};
  Decision decision;
  stack->decide(ctx, decision);
  return decision;
}

Decision first_decision(const Scenario& whole, const StrategySpec& spec,
                        const topology::Topology& topo, std::int64_t capacity) {
  std::optional<Scenario> staged;
  workload::WorkloadGenerator generator(stage_of(whole, staged));
  return first_decision(whole, spec, topo, capacity, generator.capacity_factor(0));
}

MemoryEstimate planned_memory(const Scenario& whole, const StrategySpec& spec,
                              const topology::Topology& topo, int iterations,
                              workload::SampleCache* cache) {
  std::optional<Scenario> staged;
  const Scenario& sc = stage_of(whole, staged);  // as run_stack: one stage decides and samples
  workload::WorkloadGenerator generator(sc);
  generator.set_keep_demanded(false);
  generator.set_count_distinct(false);  // the estimate reads dC and kept counts only
  generator.set_cache(cache);
  const CostModel cost(sc, topo);
  std::unique_ptr<StrategyStack> stack = make_stack(spec);
  std::optional<inference::InferenceSession> session;
  if (inference::placement_active(sc)) session.emplace(sc, spec);
  const std::vector<IterationRecord> history;
  MemoryEstimate worst;
  for (int i = 0; i < std::max(iterations, 1); ++i) {
    const Prepared p = prepare_iteration(sc, spec, topo, cost, *stack, generator,
                                         session ? &*session : nullptr, history, i, false);
    const MemoryEstimate est =
        estimate_memory(whole, p.decision, memory_capacity(sc, p.decision, p.work));
    // The first iteration that needs the most, as the run's summary picks it.
    if (i == 0 || est.total_bytes() > worst.total_bytes()) worst = est;
  }
  return worst;
}

StackRun run_stack(const Scenario& whole, const StrategySpec& spec, const topology::Topology& topo,
                   const Backend& backend, int iterations, workload::SampleCache* cache,
                   bool for_execution) {
  if (iterations < 0) throw InputError("iterations must be >= 0");
  // The workload, the strategies and the cost model describe one pipeline stage (its MoE groups
  // are the same in every stage); the plan and the memory estimate the whole step (pp = 1: the
  // same scenario).
  std::optional<Scenario> staged;
  const Scenario& sc = stage_of(whole, staged);
  MOESIM_ASSERT(static_cast<bool>(backend), "run_stack needs a backend");
  workload::WorkloadGenerator generator(sc);
  generator.set_keep_demanded(false);  // the plan needs kept counts only (one P x E matrix less)
  // Distinct destinations are priced by a deepep dispatch only (a fifth of the sampling time).
  generator.set_count_distinct(spec.a2a == A2aRole::kDeepep);
  generator.set_cache(cache);
  const CostModel cost(sc, topo);
  std::unique_ptr<StrategyStack> stack = make_stack(spec);
  // Inference expert placement (docs/strategy-specs.md §7): the batches come from the correlated
  // routing generator and every MoE layer's tokens go where the inference role placed the experts.
  std::optional<inference::InferenceSession> session;
  if (inference::placement_active(sc)) session.emplace(sc, spec);

  StackRun run;
  run.strategy = spec.name;
  run.gpu_memory_bytes = topo.gpu().memory.value();
  run.tokens_per_step = static_cast<double>(tokens_per_step(whole));
  run.model_flops_per_token = model_flops_per_token(whole);
  run.training = whole.model.mode == Mode::kTraining;
  run.gpu_peak_flops_per_s = gemm_peak_for(topo.gpu(), whole.model.dtype).value();
  run.iterations.reserve(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    Prepared p = prepare_iteration(sc, spec, topo, cost, *stack, generator,
                                   session ? &*session : nullptr, run.iterations, i, for_execution);
    const double f = p.f;
    const StrategyContext ctx{sc, spec, topo, cost, i, f, p.capacity, &run.iterations};
    Decision& decision = p.decision;
    workload::IterationWorkload& work = p.work;
    stack->route(ctx, decision, work);
    InferenceRecord placed;
    if (session) {
      decision.inference = session->place(work, placed);
      decision.variable_dispatch = true;
    }
    BuiltPlan built = build_step_plan(whole, topo, work, decision);
    RunResult result = backend(built.plan);
    IterationRecord rec = make_record(whole, i, f, decision, work, built, result);
    if (session) {
      rec.inference = placed;
      rec.decision.inference.reset();  // P x P matrices per layer: not kept per iteration
    }
    stack->observe(ctx, rec);
    run.iterations.push_back(rec);
    run.last_result = std::move(result);
    run.last_plan = std::move(built);
  }
  return run;
}

}  // namespace moesim::strategies
