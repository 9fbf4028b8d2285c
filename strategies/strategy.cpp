#include "strategies/strategy.hpp"

#include <fmt/format.h>

#include "core/error.hpp"
#include "strategies/a2a_select.hpp"
#include "strategies/parallel/parallel.hpp"
#include "strategies/parallel/tutel_router.hpp"
#include "strategies/pipeline/fixed.hpp"
#include "strategies/pipeline/pipemoe.hpp"
#include "strategies/pipeline/tutel_online.hpp"
#include "strategies/routing/routing.hpp"
#include "strategies/schedules/schedule.hpp"

namespace moesim::strategies {

namespace {

// layout: plain | flexible, straight from the spec (Tutel §3.1).
class LayoutStrategy final : public Strategy {
 public:
  explicit LayoutStrategy(LayoutRole role) : role_(role) {}
  std::string_view name() const override { return "layout"; }
  void decide(const StrategyContext&, Decision& decision) override { decision.layout = role_; }

 private:
  LayoutRole role_;
};

}  // namespace

void StrategyStack::decide(const StrategyContext& ctx, Decision& decision) {
  for (auto& m : modules_) m->decide(ctx, decision);
}

void StrategyStack::observe(const StrategyContext& ctx, const IterationRecord& record) {
  for (auto& m : modules_) m->observe(ctx, record);
}

void StrategyStack::route(const StrategyContext& ctx, const Decision& decision,
                          workload::IterationWorkload& work) {
  for (auto& m : modules_) m->route(ctx, decision, work);
}

std::unique_ptr<StrategyStack> make_stack(const StrategySpec& spec) {
  std::vector<std::unique_ptr<Strategy>> mods;
  mods.push_back(std::make_unique<LayoutStrategy>(spec.layout));
  if (spec.routing != RoutingRole::kEven) mods.push_back(routing::make_routing_strategy(spec));
  if (spec.parallel == ParallelRole::kTutelRouter)
    mods.push_back(std::make_unique<TutelRouterStrategy>());
  else
    mods.push_back(std::make_unique<FixedParallelStrategy>(spec.parallel, spec.parallel_degree));
  switch (spec.pipeline) {
    case PipelineRole::kDegree:
      mods.push_back(std::make_unique<FixedPipelineStrategy>(spec.pipeline_degree));
      break;
    case PipelineRole::kPipeMoe:
      mods.push_back(std::make_unique<PipeMoeStrategy>());
      break;
    case PipelineRole::kTutelOnline:
      mods.push_back(std::make_unique<TutelOnlineStrategy>(spec.tutel_online.bucket_width));
      break;
  }
  // tutel_online searches (r, algo) pairs itself: its choice of algorithm stands.
  if (spec.pipeline != PipelineRole::kTutelOnline)
    mods.push_back(std::make_unique<A2aStrategy>(spec.a2a));
  mods.push_back(schedules::make_schedule_strategy(spec));
  return std::make_unique<StrategyStack>(std::move(mods));
}

void throw_role_error(const StrategyContext& ctx, std::string_view role,
                      const std::string& message) {
  std::string key = fmt::format("strategies.{}", role);
  SourceLocation where = ctx.spec.where;
  const auto& all = ctx.scenario.strategies;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].name != ctx.spec.name) continue;
    key = fmt::format("strategies[{}].{}", i, role);
    const SourceLocation at = ctx.scenario.location_of(key);
    if (at.line > 0) where = at;
    break;
  }
  throw InputError(where, key,
                   fmt::format("strategy '{}', role {}: {}", ctx.spec.name, role, message));
}

}  // namespace moesim::strategies
