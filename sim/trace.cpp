#include "sim/trace.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.hpp"

namespace moesim::sim {

std::vector<int> trace_sample_ranks(int num_ranks, int gpus_per_node, int max_ranks) {
  max_ranks = std::max(1, max_ranks);
  std::vector<int> out;
  if (num_ranks <= max_ranks) {
    for (int r = 0; r < num_ranks; ++r) out.push_back(r);
    return out;
  }
  const int gpn = std::max(1, gpus_per_node);
  const int per_end = std::max(1, std::min(gpn, max_ranks / 3));
  for (int r = 0; r < per_end; ++r) out.push_back(r);  // first node
  const int last_node_first = (num_ranks - 1) / gpn * gpn;
  int tail = 0;
  if (static_cast<int>(out.size()) < max_ranks) {
    for (int r = last_node_first; r < num_ranks && tail < per_end; ++r, ++tail) out.push_back(r);
  }
  // Evenly spaced over the ranks between the two ends.
  const int lo = per_end, hi = last_node_first;  // [lo, hi)
  const int left = max_ranks - static_cast<int>(out.size());
  if (left > 0 && hi > lo) {
    const int n = std::min(left, hi - lo);
    for (int i = 0; i < n; ++i)
      out.push_back(lo + static_cast<int>(static_cast<long long>(hi - lo) * (2 * i + 1) / (2 * n)));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {

using nlohmann::json;

// The events of one run: its sampled ranks as processes `pid_offset + rank`, named with `prefix`
// and sorted after `sort_base`. Returns the sampled ranks.
std::vector<int> emit_run(const Plan& plan, const RunResult& result, int max_ranks, int pid_offset,
                          const std::string& prefix, int sort_base,
                          const std::function<void(const json&)>& emit) {
  MOESIM_ASSERT(result.num_ops() == static_cast<int>(plan.ops().size()),
                "trace: the run result does not belong to this plan");
  const std::vector<int> ranks =
      trace_sample_ranks(plan.num_ranks(), result.gpus_per_node, max_ranks);
  const int gpn = std::max(1, result.gpus_per_node);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    const int pid = pid_offset + r;
    std::string name = result.gpus_per_node > 0
                           ? "rank " + std::to_string(r) + " (node " + std::to_string(r / gpn) + ")"
                           : "rank " + std::to_string(r);
    emit(
        {{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", prefix + name}}}});
    emit({{"name", "process_sort_index"},
          {"ph", "M"},
          {"pid", pid},
          {"args", {{"sort_index", sort_base + static_cast<int>(i)}}}});
    for (size_t s = 0; s < plan.stream_names().size(); ++s)
      emit({{"name", "thread_name"},
            {"ph", "M"},
            {"pid", pid},
            {"tid", static_cast<int>(s)},
            {"args", {{"name", plan.stream_names()[s]}}}});
  }
  for (const Op& op : plan.ops()) {
    const CollectiveRecord* rec =
        op.kind == OpKind::kCollective ? result.collective(op.id) : nullptr;
    for (int r : ranks) {
      const int pos = op.ranks.index_of(r);
      if (pos < 0) continue;
      const double s = result.op_start(op.id, pos), e = result.op_end(op.id, pos);
      if (std::isnan(s) || std::isnan(e)) continue;
      json args = {{"op", op.id}};
      if (op.kind == OpKind::kCollective) {
        args["type"] = collective_type_name(op.collective().type);
        if (rec) args["algo"] = record_algo_name(*rec);
        if (rec) args["size_bytes"] = rec->size_bytes;
      } else if (op.kind == OpKind::kCompute) {
        args["class"] = compute_class_name(op.compute().cls);
      }
      emit({{"name", op.label.empty() ? std::string(op_kind_name(op.kind)) : op.label},
            {"cat", op_kind_name(op.kind)},
            {"ph", "X"},
            {"pid", pid_offset + r},
            {"tid", static_cast<int>(op.stream)},
            {"ts", s * 1e6},
            {"dur", (e - s) * 1e6},
            {"args", std::move(args)}});
    }
  }
  return ranks;
}

}  // namespace

void write_chrome_trace(const Plan& plan, const RunResult& result, std::ostream& os,
                        int max_ranks) {
  write_chrome_trace(std::vector<TraceRun>{{"", &plan, &result}}, os, max_ranks);
}

void write_chrome_trace(const std::vector<TraceRun>& runs, std::ostream& os, int max_ranks) {
  MOESIM_ASSERT(!runs.empty(), "trace: no run to write");
  bool first = true;
  auto emit = [&](const json& j) {
    os << (first ? "\n" : ",\n") << j.dump();
    first = false;
  };
  os << "{\"traceEvents\": [";
  const bool several = runs.size() > 1;
  json other;
  if (several) {
    other["backend"] = runs.front().result->backend;
    other["runs"] = json::array();
  }
  int pid_offset = 0, sort_base = 0;
  for (const TraceRun& run : runs) {
    const std::vector<int> ranks = emit_run(*run.plan, *run.result, max_ranks, pid_offset,
                                            several ? run.name + ": " : "", sort_base, emit);
    if (several) {
      other["runs"].push_back({{"name", run.name},
                               {"pid_offset", pid_offset},
                               {"num_ranks", run.plan->num_ranks()},
                               {"makespan_s", run.result->makespan_s},
                               {"sampled_ranks", ranks}});
    } else {
      other = {{"backend", run.result->backend},
               {"num_ranks", run.plan->num_ranks()},
               {"makespan_s", run.result->makespan_s},
               {"sampled_ranks", ranks}};
    }
    pid_offset += run.plan->num_ranks();
    sort_base += static_cast<int>(ranks.size());
  }
  os << "\n],\n\"displayTimeUnit\": \"ns\",\n\"otherData\": " << other.dump() << "}\n";
}

}  // namespace moesim::sim
