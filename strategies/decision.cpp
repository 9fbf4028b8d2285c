#include "strategies/decision.hpp"

#include <fmt/format.h>

namespace moesim::strategies {

std::string Decision::describe() const {
  // Stable field order: tables and JSON consumers compare these strings across runs.
  std::string s = fmt::format("r={} a2a={} layout={} parallel={}", pipeline_degree,
                              collective_algo_name(a2a), name_of(layout), parallel_degree);
  if (schedule != ScheduleRole::kNone) s += fmt::format(" schedule={}", name_of(schedule));
  if (expert_pack > 1) s += fmt::format(" pack={}", expert_pack);
  return s;
}

}  // namespace moesim::strategies
