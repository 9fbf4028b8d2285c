#include "strategies/schedules/lina.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.hpp"
#include "strategies/cost_model.hpp"

namespace moesim::strategies::schedules {

bool is_lina(ScheduleRole r) {
  return r == ScheduleRole::kLina || r == ScheduleRole::kFair || r == ScheduleRole::kBetweenA2a;
}

int lina_micro_op_count(double bytes, Bytes micro_op) {
  MOESIM_ASSERT(micro_op.value() > 0, "Lina micro-op size must be positive");
  if (bytes <= micro_op.value()) return 1;
  return static_cast<int>(std::ceil(bytes / micro_op.value()));
}

int lina_allreduce_priority(ScheduleRole r) { return r == ScheduleRole::kLina ? -1 : 0; }

void apply_lina(Plan& plan, const PlanIndex& index, ScheduleRole r,
                const std::vector<std::size_t>& grad_before) {
  auto& ops = plan.mutable_ops();
  if (r == ScheduleRole::kLina) {
    for (const auto& layer : index.moe_layers) {
      for (OpId id : layer.dispatch) ops[id].priority = 1;
      for (OpId id : layer.combine) ops[id].priority = 1;
      // Backward compute whose result an all-to-all sends: the decode backward (first op of the
      // layer's backward) and each chunk's last expert GEMM (the dispatch-backward's input).
      for (OpId id : layer.backward) {
        const Op& op = ops[id];
        if (op.kind != OpKind::kCompute) continue;
        const bool feeds_a2a =
            id == layer.backward.front() || op.label.find(".bwd.expert.fc1.") != std::string::npos;
        if (feeds_a2a) ops[id].priority = 1;
      }
    }
  }
  if (r == ScheduleRole::kBetweenA2a) {
    MOESIM_ASSERT(grad_before.size() == index.moe_layers.size(), "grad_before per MoE layer");
    for (size_t i = 0; i < index.moe_layers.size(); ++i) {
      const auto& layer = index.moe_layers[i];
      // The layer's first backward all-to-all: the lowest-id combine op after its forward.
      OpId first = -1;
      for (OpId id : layer.combine)
        if (!layer.backward.empty() && id >= layer.backward.front() && (first < 0 || id < first))
          first = id;
      if (first < 0) continue;
      for (size_t g = 0; g < grad_before[i]; ++g) {
        const OpId dep = index.gradient_sync[g];
        if (dep < first) ops[first].deps.push_back(dep);
      }
    }
  }
}

Scenario packed_scenario(const Scenario& sc, int pack) {
  if (pack == 1) return sc;  // no packing: sharded experts (which Lina never packs) included
  MOESIM_ASSERT(pack >= 1 && sc.parallelism.ep % pack == 0 && sc.model.experts_per_gpu >= 1,
                "expert pack must divide ep, with unsharded experts");
  Scenario out = sc;
  out.parallelism.ep /= pack;
  out.parallelism.dp *= pack;
  out.model.experts_per_gpu *= pack;
  return out;
}

LinaChoice lina_choose(const Scenario& sc, const topology::Topology& topo, std::int64_t capacity,
                       Bytes micro_op, LayoutRole layout, int max_pack, int pipeline_degree) {
  MOESIM_ASSERT(max_pack >= 1, "Lina max_pack must be >= 1");
  LinaChoice c;
  const double a2a_bytes = static_cast<double>(sc.num_experts()) * static_cast<double>(capacity) *
                           sc.model.model_dim * sc.parallelism.esp * sc.bytes_per_element();
  c.pipeline_degree = pipeline_degree;
  if (pipeline_degree == 1)
    c.pipeline_degree = static_cast<int>(std::clamp<std::int64_t>(
        lina_micro_op_count(a2a_bytes, micro_op), 1, std::max<std::int64_t>(capacity, 1)));
  const int r = c.pipeline_degree;
  auto measure = [&](int pack) {
    const Scenario packed = packed_scenario(sc, pack);
    const CostModel cost(packed, topo);
    c.ffn_micro_s = cost.expert_time(static_cast<double>(capacity) / r, layout, 1).value();
    c.a2a_micro_s = packed.parallelism.ep > 1
                        ? cost.a2a_time(CollectiveAlgo::kLinear, Bytes(a2a_bytes / r)).value()
                        : 0.0;
  };
  c.expert_pack = 1;
  measure(1);
  const bool can_pack = sc.model.experts_per_gpu >= 1 && sc.parallelism.esp == 1;
  // Lina packs at most max_pack experts per GPU (2 in the paper, 4 for Transformer-XL): every
  // doubling doubles the expert weights, gradients and optimizer state a GPU holds. And (ours) at
  // least 2 EP ranks stay: packing every expert on every GPU would be plain data parallelism.
  while (can_pack && c.ffn_micro_s < c.a2a_micro_s && 2 * c.expert_pack <= max_pack &&
         sc.parallelism.ep % (2 * c.expert_pack) == 0 &&
         sc.parallelism.ep / (2 * c.expert_pack) >= 2) {
    c.expert_pack *= 2;
    measure(c.expert_pack);
  }
  return c;
}

double pipelining_efficiency(const Plan& plan, const PlanIndex& index, const RunResult& result) {
  // Rank 0's intervals: all-to-all activity and compute-stream activity.
  const StreamId compute = [&] {
    const auto& names = plan.stream_names();
    auto it = std::find(names.begin(), names.end(), "compute");
    return static_cast<StreamId>(it == names.end() ? -1 : it - names.begin());
  }();
  auto interval = [&](OpId id) -> std::pair<double, double> {
    const int pos = plan.op(id).ranks.index_of(0);
    if (pos < 0) return {0, 0};
    const auto e = result.op_offset[id] + pos;
    return {result.start_s[e], result.end_s[e]};
  };
  std::vector<std::pair<double, double>> busy;
  for (const Op& op : plan.ops())
    if (op.stream == compute && op.kind != OpKind::kCollective) busy.push_back(interval(op.id));
  double a2a_total = 0, overlapped = 0;
  for (const auto& layer : index.moe_layers)
    for (const auto* list : {&layer.dispatch, &layer.combine})
      for (OpId id : *list) {
        const auto [s, e] = interval(id);
        if (!(e > s)) continue;
        a2a_total += e - s;
        for (const auto& [bs, be] : busy)
          overlapped += std::max(0.0, std::min(e, be) - std::max(s, bs));
      }
  return a2a_total > 0 ? std::min(1.0, overlapped / a2a_total) : 0.0;
}

}  // namespace moesim::strategies::schedules
