#include "strategies/schedules/schedule.hpp"

#include <fmt/format.h>

#include "strategies/schedules/lina.hpp"
#include "strategies/schedules/parm.hpp"

namespace moesim::strategies::schedules {
namespace {

class ScheduleModule final : public Strategy {
 public:
  explicit ScheduleModule(ScheduleRole role) : role_(role) {}
  std::string_view name() const override { return "schedule"; }

  void decide(const StrategyContext& ctx, Decision& decision) override {
    decision.schedule = role_;
    if (is_lina(role_)) {
      if (ctx.spec.lina.micro_op.value() <= 0)
        throw_role_error(ctx, "lina", "micro_op must be a positive size, such as 30MB");
      decision.lina_micro_op = ctx.spec.lina.micro_op;
      // Micro-op pipelining and expert packing are Lina's own (its baselines keep the plan).
      if (role_ == ScheduleRole::kLina) {
        const LinaChoice c = lina_choose(
            ctx.scenario, ctx.topo, ctx.capacity, ctx.spec.lina.micro_op, decision.layout,
            ctx.spec.lina.pack_experts ? ctx.spec.lina.max_pack : 1, decision.pipeline_degree);
        decision.pipeline_degree = c.pipeline_degree;
        decision.expert_pack = c.expert_pack;
      }
      return;
    }
    if (!is_parm(role_)) return;
    const std::string why = parm_inapplicable_reason(ctx.scenario, decision.parallel_degree);
    if (!why.empty()) throw_role_error(ctx, "schedule", fmt::format("{}: {}", name_of(role_), why));
    // Alg. 1 on this iteration's capacity (the plan builder would resolve auto the same way;
    // resolving here makes the choice visible in the iteration's decisions).
    if (role_ == ScheduleRole::kParmAuto)
      decision.schedule = parm_choose(ctx.scenario, ctx.topo, ctx.capacity).choice;
  }

 private:
  ScheduleRole role_;
};

}  // namespace

std::unique_ptr<Strategy> make_schedule_strategy(const StrategySpec& spec) {
  return std::make_unique<ScheduleModule>(spec.schedule);
}

}  // namespace moesim::strategies::schedules
