#include "apps/moesim/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace moesim::app {

namespace {

double mean_of(const std::vector<strategies::IterationRecord>& it,
               double strategies::IterationRecord::*field) {
  if (it.empty()) return 0;
  double s = 0;
  for (const auto& r : it) s += r.*field;
  return s / static_cast<double>(it.size());
}

// Nearest-rank percentile: the smallest value with at least q of the samples at or below it.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

std::string parallel_name(const Scenario& sc, int r) {
  if (r <= 1) return "p1";
  if (r == sc.model.expert_shards()) return "p2";
  return fmt::format("r{}", r);
}

std::string ms(double s) { return fmt::format("{:.3f}", s * 1e3); }

}  // namespace

RunSummary summarize(const strategies::StackRun& run, const std::string& topology, int gpus,
                     double wall_s) {
  RunSummary s;
  s.strategy = run.strategy;
  s.topology = topology;
  s.gpus = gpus;
  std::vector<double> steps;
  for (const auto& r : run.iterations) steps.push_back(r.step_time_s);
  s.step_mean_s = mean_of(run.iterations, &strategies::IterationRecord::step_time_s);
  s.step_p50_s = percentile(steps, 0.5);
  s.step_p95_s = percentile(steps, 0.95);
  s.moe_layer_mean_s = mean_of(run.iterations, &strategies::IterationRecord::moe_layer_time_s);
  s.a2a_mean_s = mean_of(run.iterations, &strategies::IterationRecord::a2a_s);
  s.allreduce_mean_s = mean_of(run.iterations, &strategies::IterationRecord::allreduce_s);
  s.compute_mean_s = mean_of(run.iterations, &strategies::IterationRecord::compute_s);
  s.exposed_comm_mean_s = mean_of(run.iterations, &strategies::IterationRecord::exposed_comm_s);
  if (!run.iterations.empty()) s.decisions = run.iterations.back().decision.describe();
  s.wall_s = wall_s;
  return s;
}

int baseline_index(const std::vector<StrategySpec>& specs) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == "baseline") return static_cast<int>(i);
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].is_baseline()) return static_cast<int>(i);
  return -1;
}

void apply_speedups(std::vector<RunSummary>& rows, int baseline) {
  if (baseline < 0 || baseline >= static_cast<int>(rows.size())) return;
  double base = rows[baseline].step_mean_s;
  for (auto& r : rows) r.speedup = r.step_mean_s > 0 ? base / r.step_mean_s : 0;
}

void print_table(const std::vector<RunSummary>& rows) {
  fmt::print("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}  {}\n", "strategy", "step(ms)",
             "p50(ms)", "p95(ms)", "moe(ms)", "a2a(ms)", "exposed", "speedup",
             "decisions (last iteration)");
  for (const auto& r : rows) {
    std::string speedup = r.speedup > 0 ? fmt::format("{:.2f}x", r.speedup) : "-";
    fmt::print("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}  {}\n", r.strategy,
               ms(r.step_mean_s), ms(r.step_p50_s), ms(r.step_p95_s), ms(r.moe_layer_mean_s),
               ms(r.a2a_mean_s), ms(r.exposed_comm_mean_s), speedup, r.decisions);
  }
}

nlohmann::ordered_json decision_json(const Scenario& sc, const strategies::Decision& d) {
  nlohmann::ordered_json j;
  j["pipeline_degree"] = d.pipeline_degree;
  j["a2a"] = std::string(collective_algo_name(d.a2a));
  j["parallel"] = parallel_name(sc, d.parallel_degree);
  j["layout"] = d.layout == LayoutRole::kFlexible ? "flexible" : "plain";
  j["schedule"] = std::string(name_of(d.schedule));
  return j;
}

nlohmann::ordered_json run_json(const Scenario& sc, const strategies::StackRun& run,
                                const RunSummary& s) {
  nlohmann::ordered_json j;
  j["strategy"] = s.strategy;
  j["topology"] = s.topology;
  j["gpus"] = s.gpus;
  j["step_time_s"] = s.step_mean_s;
  j["step_time_p50_s"] = s.step_p50_s;
  j["step_time_p95_s"] = s.step_p95_s;
  j["moe_layer_time_s"] = s.moe_layer_mean_s;
  auto& its = j["iterations"] = nlohmann::ordered_json::array();
  for (const auto& r : run.iterations) {
    nlohmann::ordered_json it;
    it["index"] = r.index;
    it["capacity_factor"] = r.capacity_factor;
    it["step_time_s"] = r.step_time_s;
    it["moe_layer_time_s"] = r.moe_layer_time_s;
    it["dropped_tokens"] = r.dropped_tokens;
    it["decisions"] = decision_json(sc, r.decision);
    its.push_back(std::move(it));
  }
  j["breakdown"] = {{"compute_s", s.compute_mean_s},
                    {"a2a_s", s.a2a_mean_s},
                    {"allreduce_s", s.allreduce_mean_s},
                    {"exposed_comm_s", s.exposed_comm_mean_s}};
  if (!run.iterations.empty()) j["decisions"] = decision_json(sc, run.iterations.back().decision);
  if (s.speedup > 0)
    j["speedup_vs_baseline"] = s.speedup;
  else
    j["speedup_vs_baseline"] = nullptr;
  return j;
}

void write_csv_header(std::ostream& os) {
  os << "scenario,topology,strategy,iteration,capacity_factor,step_time_s,moe_layer_time_s,a2a_s,"
        "allreduce_s,compute_s,exposed_comm_s,dropped_tokens,pipeline_degree,a2a,parallel,layout,"
        "schedule\n";
}

void write_csv_rows(std::ostream& os, const Scenario& sc, const strategies::StackRun& run,
                    const std::string& topology) {
  for (const auto& r : run.iterations) {
    const auto& d = r.decision;
    os << fmt::format(
        "{},{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{},{},{},{},{},{}\n", sc.name,
        topology, run.strategy, r.index, r.capacity_factor, r.step_time_s, r.moe_layer_time_s,
        r.a2a_s, r.allreduce_s, r.compute_s, r.exposed_comm_s, r.dropped_tokens, d.pipeline_degree,
        collective_algo_name(d.a2a), parallel_name(sc, d.parallel_degree),
        d.layout == LayoutRole::kFlexible ? "flexible" : "plain", name_of(d.schedule));
  }
}

}  // namespace moesim::app
