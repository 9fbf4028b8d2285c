// The one table of collective algorithms (docs/design.md §7), algorithm selection and nccl-tests
// bus bandwidth factors.
#include <array>
#include <limits>
#include <string>

#include "strategies/collectives/common.hpp"

namespace moesim::collectives {
namespace {

// Registry order is the tie-break order of `auto` (first wins on equal predicted time).
const std::vector<const Algorithm*>& table() {
  static const std::vector<const Algorithm*> t = {
      &detail::linear_all_to_all(),   &detail::two_dh_all_to_all(),
      &detail::three_dh_all_to_all(), &detail::linear_all_to_allv(),
      &detail::two_dh_all_to_allv(),  &detail::ring_all_reduce(),
      &detail::tree_all_reduce(),     &detail::hierarchical_all_reduce(),
      &detail::ring_all_gather(),     &detail::ring_reduce_scatter(),
      &detail::send_recv(),           &detail::saa_all_to_all(),
      &detail::deepep_all_to_allv(),
  };
  return t;
}

std::string available(CollectiveType type) {
  std::string s;
  for (const Algorithm* a : algorithms_for(type)) {
    if (!s.empty()) s += ", ";
    s += collective_algo_name(a->algo());
  }
  return s;
}

}  // namespace

const Algorithm* find_algorithm(CollectiveType type, CollectiveAlgo algo) {
  for (const Algorithm* a : table())
    if (a->type() == type && a->algo() == algo) return a;
  return nullptr;
}

std::vector<const Algorithm*> algorithms_for(CollectiveType type) {
  std::vector<const Algorithm*> out;
  for (const Algorithm* a : table())
    if (a->type() == type) out.push_back(a);
  return out;
}

const Algorithm& select_algorithm(const CollectiveCall& call, const CostContext& ctx) {
  MOESIM_ASSERT(call.spec != nullptr && call.group != nullptr, "collective call without spec");
  MOESIM_ASSERT(ctx.topo != nullptr, "select_algorithm needs a topology");
  const CollectiveType type = call.spec->type;
  const std::string type_name(collective_type_name(type));
  if (call.spec->algo != CollectiveAlgo::kAuto) {
    const std::string algo_name(collective_algo_name(call.spec->algo));
    const Algorithm* a = find_algorithm(type, call.spec->algo);
    if (a == nullptr) {
      throw InputError("no algorithm '" + algo_name + "' for collective " + type_name +
                       ", expected one of: auto, " + available(type));
    }
    const std::string why = a->inapplicable_reason(call, *ctx.topo);
    if (!why.empty()) {
      throw InputError("algorithm '" + algo_name + "' cannot run this " + type_name + " over " +
                       std::to_string(call.group->size()) + " ranks: " + why);
    }
    return *a;
  }
  const Algorithm* best = nullptr;
  double best_t = std::numeric_limits<double>::infinity();
  for (const Algorithm* a : algorithms_for(type)) {
    // SAA also all-gathers over its sub-groups: a different output, only run when named.
    if (a->algo() == CollectiveAlgo::kSaa) continue;
    if (!a->applicable(call, *ctx.topo)) continue;
    const double t = a->analytical_time(call, ctx).value();
    if (best == nullptr || t < best_t) {
      best = a;
      best_t = t;
    }
  }
  if (best == nullptr)
    throw InputError("no algorithm for collective " + type_name + " can run over " +
                     std::to_string(call.group->size()) + " ranks");
  return *best;
}

double busbw_factor(CollectiveType type, int group_size) {
  MOESIM_ASSERT(group_size > 0, "busbw_factor needs a positive group size");
  const double w = group_size;
  switch (type) {
    case CollectiveType::kAllReduce:
      return 2.0 * (w - 1) / w;
    case CollectiveType::kAllGather:
    case CollectiveType::kReduceScatter:
    case CollectiveType::kAllToAll:
    case CollectiveType::kAllToAllv:
      return (w - 1) / w;
    case CollectiveType::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

}  // namespace moesim::collectives
