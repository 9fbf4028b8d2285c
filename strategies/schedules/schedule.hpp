// The `schedule` role of a strategy entry (docs/strategy-specs.md §5-§6): Parm's schedules and
// Lina's communication scheduler. The module checks that the schedule applies (InputError naming
// strategies[i].schedule otherwise), resolves parm_auto with Parm Alg. 1 for this iteration's
// capacity, and hands the result to the plan builder through Decision::schedule.
#pragma once

#include <memory>

#include "core/scenario.hpp"
#include "strategies/strategy.hpp"

namespace moesim::strategies::schedules {

std::unique_ptr<Strategy> make_schedule_strategy(const StrategySpec& spec);

}  // namespace moesim::strategies::schedules
