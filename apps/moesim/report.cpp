#include "apps/moesim/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "strategies/model_flops.hpp"

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

std::string tokens_text(const RunSummary& r) {
  return r.tokens_per_s_per_gpu > 0 ? fmt::format("{:.0f}", r.tokens_per_s_per_gpu) : "-";
}

std::string tflops_text(const RunSummary& r) {
  return r.has_model_flops && r.model_tflops_per_gpu > 0
             ? fmt::format("{:.1f}", r.model_tflops_per_gpu)
             : "-";
}

std::string mfu_text(const RunSummary& r) {
  return r.has_model_flops && r.mfu > 0 ? fmt::format("{:.1f}%", 100 * r.mfu) : "-";
}

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
  if (!run.iterations.empty()) {
    const double n = static_cast<double>(run.iterations.size());
    for (const auto& r : run.iterations) {
      s.gemm_mean_s += r.breakdown.gemm_s / n;
      s.attention_mean_s += r.breakdown.attention_s / n;
      s.memory_bound_mean_s += r.breakdown.memory_bound_s / n;
      s.optimizer_mean_s += r.breakdown.optimizer_s / n;
      s.recompute_mean_s += r.breakdown.recompute_s / n;
    }
  }
  const auto fig =
      strategies::step_figures(run.tokens_per_step, run.model_flops_per_token, run.training, gpus,
                               s.step_mean_s, run.gpu_peak_flops_per_s);
  s.tokens_per_step = fig.tokens_per_step;
  s.model_flops_per_token = fig.model_flops_per_token;
  s.tokens_per_s_per_gpu = fig.tokens_per_s_per_gpu;
  s.has_model_flops = fig.has_model_flops;
  s.model_tflops_per_gpu = fig.model_flops_per_s_per_gpu / 1e12;
  s.mfu = fig.mfu;
  if (!run.iterations.empty()) s.decisions = run.iterations.back().decision.describe();
  s.wall_s = wall_s;
  s.gpu_memory_bytes = run.gpu_memory_bytes;
  for (const auto& r : run.iterations)
    if (r.memory.total_bytes() > s.memory.total_bytes()) s.memory = r.memory;
  s.memory_bytes = s.memory.total_bytes();
  strategies::InferenceRecord inf;
  for (const auto& r : run.iterations) {
    if (!r.inference) continue;
    s.inference = true;
    inf.placements += r.inference->placements;
    inf.estimated += r.inference->estimated;
    inf.topk_matches += r.inference->topk_matches;
    inf.popularity_error += r.inference->popularity_error;
    inf.phase2 += r.inference->phase2;
    inf.load_imbalance_sum += r.inference->load_imbalance_sum;
    inf.moved_weight_bytes += r.inference->moved_weight_bytes;
  }
  if (s.inference) {
    if (inf.placements > 0) s.load_imbalance = inf.load_imbalance_sum / inf.placements;
    s.moved_weight_bytes = inf.moved_weight_bytes / static_cast<double>(run.iterations.size());
    if (inf.estimated > 0) {
      const double n = inf.estimated;
      s.topk_accuracy = inf.topk_matches / n;
      s.popularity_error = inf.popularity_error / n;
      s.phase2_rate = inf.phase2 / n;
    }
  }
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
  rows[baseline].is_baseline = true;
  for (auto& r : rows) r.speedup = r.step_mean_s > 0 ? base / r.step_mean_s : 0;
  const RunSummary& b = rows[baseline];
  for (auto& r : rows) {
    r.speedup_p50 = r.step_p50_s > 0 ? b.step_p50_s / r.step_p50_s : 0;
    r.speedup_p95 = r.step_p95_s > 0 ? b.step_p95_s / r.step_p95_s : 0;
  }
}

std::string verdict_line(const std::vector<RunSummary>& rows) {
  // The question a user runs simulate for: which stack wins, and by how much. Ties (within
  // 0.05%) are named together rather than picking one by table order.
  const RunSummary* best = nullptr;
  const RunSummary* base = nullptr;
  for (const auto& r : rows) {
    if (r.step_mean_s <= 0) continue;
    if (!best || r.step_mean_s < best->step_mean_s) best = &r;
    if (r.is_baseline) base = &r;
  }
  if (!best || rows.size() < 2) return "";
  std::string names;
  int tied = 0;
  for (const auto& r : rows) {
    if (r.step_mean_s > 0 && r.step_mean_s <= best->step_mean_s * 1.0005) {
      names += (tied++ ? ", " : "") + r.strategy;
    }
  }
  std::string line = fmt::format("fastest: {} ({} ms per step", names, ms(best->step_mean_s));
  if (base && best->speedup > 0)
    line += fmt::format(", {:.2f}x over {} at {} ms", best->speedup, base->strategy,
                        ms(base->step_mean_s));
  return line + ")";
}

void print_verdict(const std::vector<RunSummary>& rows) {
  const std::string line = verdict_line(rows);
  if (line.empty()) return;
  fmt::print("{}\n", line);
  // a2a(ms) is a sum over every all-to-all of a step, pipeline chunks included: chunks that
  // overlap each other or compute add up past the step time, which confused users.
  if (std::any_of(rows.begin(), rows.end(),
                  [](const RunSummary& r) { return r.a2a_mean_s > r.step_mean_s; }))
    fmt::print(
        "note: a2a(ms) sums every all-to-all of a step (pipeline chunks included), so overlapped "
        "chunks can exceed step(ms); exposed(ms) is the communication nothing overlaps\n");
}

void print_table(const std::vector<RunSummary>& rows) {
  // The figures frameworks print go after the speedup; the free-width decisions stay last.
  fmt::print("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>8} {:>11} {:>11} {:>6}  {}\n",
             "strategy", "step(ms)", "p50(ms)", "p95(ms)", "moe(ms)", "a2a(ms)", "exposed(ms)",
             "speedup", "tok/s/GPU", "TFLOP/s/GPU", "MFU", "decisions (last iteration)");
  for (const auto& r : rows) {
    std::string speedup = r.speedup > 0 ? fmt::format("{:.2f}x", r.speedup) : "-";
    fmt::print("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>8} {:>11} {:>11} {:>6}  {}\n",
               r.strategy, ms(r.step_mean_s), ms(r.step_p50_s), ms(r.step_p95_s),
               ms(r.moe_layer_mean_s), ms(r.a2a_mean_s), ms(r.exposed_comm_mean_s), speedup,
               tokens_text(r), tflops_text(r), mfu_text(r), r.decisions);
  }
  print_verdict(rows);
  // Inference placement (docs/strategy-specs.md §7): batch latency median / p95 against the
  // baseline's.
  if (std::none_of(rows.begin(), rows.end(), [](const RunSummary& r) { return r.inference; }))
    return;
  auto ratio = [](double x) { return x > 0 ? fmt::format("{:.2f}x", x) : std::string("-"); };
  auto share = [](double x) { return x >= 0 ? fmt::format("{:.1f}%", 100 * x) : std::string("-"); };
  fmt::print("\n{:<16} {:>10} {:>10} {:>8} {:>8} {:>10} {:>10} {:>9} {:>8} {:>11}\n", "inference",
             "p50(ms)", "p95(ms)", "p50 x", "p95 x", "imbalance", "top-k acc", "pop err", "phase 2",
             "moved(MB)");
  for (const auto& r : rows) {
    if (!r.inference) continue;
    fmt::print("{:<16} {:>10} {:>10} {:>8} {:>8} {:>10.3f} {:>10} {:>9} {:>8} {:>11.1f}\n",
               r.strategy, ms(r.step_p50_s), ms(r.step_p95_s), ratio(r.speedup_p50),
               ratio(r.speedup_p95), r.load_imbalance, share(r.topk_accuracy),
               r.popularity_error >= 0 ? fmt::format("{:.4f}", r.popularity_error) : "-",
               share(r.phase2_rate), r.moved_weight_bytes / 1e6);
  }
}

namespace {

// The "inference" object of a run or an iteration (new fields of docs/design.md §5).
nlohmann::ordered_json inference_json(const strategies::InferenceRecord& r) {
  nlohmann::ordered_json j;
  j["placements"] = r.placements;
  j["estimated"] = r.estimated;
  j["topk_matches"] = r.topk_matches;
  j["phase2"] = r.phase2;
  j["popularity_error"] = r.estimated > 0 ? r.popularity_error / r.estimated : 0.0;
  j["load_imbalance"] = r.placements > 0 ? r.load_imbalance_sum / r.placements : 0.0;
  j["moved_weight_bytes"] = r.moved_weight_bytes;
  return j;
}

nlohmann::ordered_json number_or_null(double x, bool valid) {
  return valid ? nlohmann::ordered_json(x) : nlohmann::ordered_json(nullptr);
}

}  // namespace

nlohmann::ordered_json breakdown_json(const RunSummary& s) {
  return {{"compute_s", s.compute_mean_s},
          {"a2a_s", s.a2a_mean_s},
          {"allreduce_s", s.allreduce_mean_s},
          {"exposed_comm_s", s.exposed_comm_mean_s},
          {"gemm_s", s.gemm_mean_s},
          {"attention_s", s.attention_mean_s},
          {"memory_bound_s", s.memory_bound_mean_s},
          {"optimizer_s", s.optimizer_mean_s},
          {"recompute_s", s.recompute_mean_s}};
}

void add_figures_json(nlohmann::ordered_json& j, const RunSummary& s) {
  j["tokens_per_step"] = s.tokens_per_step;
  j["tokens_per_s_per_gpu"] = s.tokens_per_s_per_gpu;
  j["model_flops_per_token"] = s.model_flops_per_token;
  j["model_tflops_per_gpu"] = number_or_null(s.model_tflops_per_gpu, s.has_model_flops);
  j["mfu"] = number_or_null(s.mfu, s.has_model_flops && s.mfu > 0);
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

nlohmann::ordered_json memory_json(const strategies::MemoryEstimate& m, double gpu_memory_bytes) {
  nlohmann::ordered_json j;
  j["memory_bytes"] = m.total_bytes();
  j["weights_bytes"] = m.weights_bytes;
  j["gradients_bytes"] = m.gradients_bytes;
  j["optimizer_bytes"] = m.optimizer_bytes;
  j["activations_bytes"] = m.activations_bytes;
  j["buffers_bytes"] = m.buffers_bytes;
  j["dense_params"] = m.dense_params;
  j["expert_params"] = m.expert_params;
  j["capacity"] = m.capacity;
  j["pipeline_stage"] = m.stage;
  j["in_flight_micro_batches"] = m.in_flight;
  j["model_chunks"] = m.chunks;  // in_flight counts chunks of 1 / model_chunks of the stage
  j["recompute"] = std::string(name_of(m.recompute));
  j["gpu_memory_bytes"] = gpu_memory_bytes;
  j["fits"] = gpu_memory_bytes <= 0 || m.total_bytes() <= gpu_memory_bytes;
  return j;
}

std::string describe_memory(const strategies::MemoryEstimate& m, double gpu_memory_bytes) {
  auto gib = [](double b) { return fmt::format("{:.2f} GiB", b / (1024.0 * 1024.0 * 1024.0)); };
  std::string s =
      fmt::format("{} = weights {} + gradients {} + optimizer {} + activations {} + buffers {}",
                  gib(m.total_bytes()), gib(m.weights_bytes), gib(m.gradients_bytes),
                  gib(m.optimizer_bytes), gib(m.activations_bytes), gib(m.buffers_bytes));
  if (gpu_memory_bytes > 0)
    s += fmt::format(" ({:.0f}% of {})", 100 * m.total_bytes() / gpu_memory_bytes,
                     gib(gpu_memory_bytes));
  return s;
}

std::vector<std::string> implausible_values(const Scenario& sc) {
  // Bounds no real fabric is outside of: a link below 1 Mb/s (a 1990s modem's order) or a hop
  // slower than a second. The run would still complete, with a step of years; say why up front.
  constexpr double kMinLinkBytesPerS = 1e6 / 8;
  constexpr double kMaxLatencyS = 1.0;
  std::vector<std::string> out;
  auto link = [&](const std::string& key, double bytes_per_s) {
    if (bytes_per_s > 0 && bytes_per_s < kMinLinkBytesPerS)
      out.push_back(
          fmt::format("{}: {:.3g} b/s is below 1 Mb/s, far below any real link (a "
                      "unit typo? e.g. 100Gb/s, 25GB/s)",
                      key, bytes_per_s * 8));
  };
  auto hop = [&](const std::string& key, double s) {
    if (s > kMaxLatencyS)
      out.push_back(
          fmt::format("{}: {:.3g} s per hop is above 1 s, far above any real link (a "
                      "unit typo? e.g. 2us, 1.5ms)",
                      key, s));
  };
  const ClusterSpec& c = sc.cluster;
  link("cluster.intra_node.bandwidth", c.intra.bandwidth.value());
  link("cluster.intra_node.socket_link_bandwidth", c.intra.socket_link_bandwidth.value());
  hop("cluster.intra_node.latency", c.intra.latency.value());
  link("cluster.inter_node.nic_bandwidth", c.inter.nic_bandwidth.value());
  link("cluster.inter_node.global_bandwidth", c.inter.global_bandwidth.value());
  link("cluster.inter_node.local_bandwidth", c.inter.local_bandwidth.value());
  for (std::size_t i = 0; i < c.inter.tree_level_bandwidth.size(); ++i)
    link(fmt::format("cluster.inter_node.tree_level_bandwidth[{}]", i),
         c.inter.tree_level_bandwidth[i].value());
  hop("cluster.inter_node.latency", c.inter.latency.value());
  if (c.custom)
    for (std::size_t i = 0; i < c.custom->links.size(); ++i) {
      link(fmt::format("cluster.custom.links[{}].bandwidth", i),
           c.custom->links[i].bandwidth.value());
      hop(fmt::format("cluster.custom.links[{}].latency", i), c.custom->links[i].latency.value());
    }
  link("cluster.gpu.hbm_bandwidth", c.gpu.hbm_bandwidth.value());
  return out;
}

void warn_implausible(const Scenario& sc) {
  for (const std::string& w : implausible_values(sc))
    std::fprintf(stderr, "moesim: warning: %s\n", w.c_str());
}

void warn_memory(const Scenario& sc, const std::vector<RunSummary>& rows,
                 const std::string& gpu_name) {
  // One warning per run: the strategies over memory, and the largest one's estimate with the
  // single keys that make it fit (strategies::fit_advice; a key that fits the largest fits the
  // rest, as the estimates differ only by what the stacks add).
  std::vector<const RunSummary*> over;
  for (const auto& r : rows)
    if (!r.fits_memory()) over.push_back(&r);
  if (over.empty()) return;
  const RunSummary& worst = **std::max_element(
      over.begin(), over.end(),
      [](const RunSummary* a, const RunSummary* b) { return a->memory_bytes < b->memory_bytes; });
  // A summary restored from a sweep's CSV has no parts to re-estimate from.
  const std::string advice = worst.memory.total_bytes() > 0
                                 ? strategies::fit_advice(sc, worst.memory, worst.gpu_memory_bytes)
                                 : std::string();
  std::string who;
  if (over.size() == 1) {
    who = fmt::format("strategy '{}' does not fit in memory", worst.strategy);
  } else {
    std::vector<std::string> names;
    for (const RunSummary* r : over) names.push_back("'" + r->strategy + "'");
    who = fmt::format("{} of {} strategies ({}) do not fit in memory; the largest, '{}'",
                      over.size(), rows.size(), fmt::join(names, ", "), worst.strategy);
  }
  std::fprintf(stderr,
               "moesim: warning: %s: estimated %s per GPU, more than the %s's memory "
               "(docs/model.md, \"Memory\")%s%s\n",
               who.c_str(), describe_memory(worst.memory, worst.gpu_memory_bytes).c_str(),
               gpu_name.c_str(), advice.empty() ? "" : "; ", advice.c_str());
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
    if (r.inference) it["inference"] = inference_json(*r.inference);
    its.push_back(std::move(it));
  }
  j["breakdown"] = breakdown_json(s);
  if (!run.iterations.empty()) j["decisions"] = decision_json(sc, run.iterations.back().decision);
  j["memory_bytes"] = s.memory_bytes;
  j["memory"] = memory_json(s.memory, s.gpu_memory_bytes);
  if (s.speedup > 0)
    j["speedup_vs_baseline"] = s.speedup;
  else
    j["speedup_vs_baseline"] = nullptr;
  add_figures_json(j, s);
  if (s.inference) {
    auto& inf = j["inference"];
    inf["latency_p50_s"] = s.step_p50_s;
    inf["latency_p95_s"] = s.step_p95_s;
    inf["speedup_p50_vs_baseline"] = number_or_null(s.speedup_p50, s.speedup_p50 > 0);
    inf["speedup_p95_vs_baseline"] = number_or_null(s.speedup_p95, s.speedup_p95 > 0);
    inf["load_imbalance"] = s.load_imbalance;
    inf["moved_weight_bytes_per_batch"] = s.moved_weight_bytes;
    inf["topk_accuracy"] = number_or_null(s.topk_accuracy, s.topk_accuracy >= 0);
    inf["popularity_error"] = number_or_null(s.popularity_error, s.popularity_error >= 0);
    inf["phase2_rate"] = number_or_null(s.phase2_rate, s.phase2_rate >= 0);
  }
  return j;
}

void write_csv_header(std::ostream& os) {
  os << "scenario,topology,strategy,iteration,capacity_factor,step_time_s,moe_layer_time_s,a2a_s,"
        "allreduce_s,compute_s,exposed_comm_s,dropped_tokens,pipeline_degree,a2a,parallel,layout,"
        "schedule,memory_bytes,tokens_per_s_per_gpu,model_tflops_per_gpu,mfu,"
        "model_flops_per_token,gemm_s,attention_s,memory_bound_s,optimizer_s,recompute_s\n";
}

void write_csv_rows(std::ostream& os, const Scenario& sc, const strategies::StackRun& run,
                    const std::string& topology) {
  for (const auto& r : run.iterations) {
    const auto& d = r.decision;
    const auto& b = r.breakdown;
    // This iteration's figures (the table and the JSON take them at the mean step time). No
    // model FLOP/s for inference and no MFU without a peak: empty fields.
    const auto fig =
        strategies::step_figures(run.tokens_per_step, run.model_flops_per_token, run.training,
                                 sc.num_gpus(), r.step_time_s, run.gpu_peak_flops_per_s);
    const std::string tflops =
        fig.has_model_flops ? fmt::format("{:.9g}", fig.model_flops_per_s_per_gpu / 1e12) : "";
    const std::string mfu =
        fig.has_model_flops && fig.mfu > 0 ? fmt::format("{:.9g}", fig.mfu) : "";
    os << fmt::format(
        "{},{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{},{},{},{},{},{},{:.0f},{:.9g},{"
        "},"
        "{},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g},{:.9g}\n",
        sc.name, topology, run.strategy, r.index, r.capacity_factor, r.step_time_s,
        r.moe_layer_time_s, r.a2a_s, r.allreduce_s, r.compute_s, r.exposed_comm_s, r.dropped_tokens,
        d.pipeline_degree, collective_algo_name(d.a2a), parallel_name(sc, d.parallel_degree),
        d.layout == LayoutRole::kFlexible ? "flexible" : "plain", name_of(d.schedule),
        r.memory.total_bytes(), fig.tokens_per_s_per_gpu, tflops, mfu, fig.model_flops_per_token,
        b.gemm_s, b.attention_s, b.memory_bound_s, b.optimizer_s, b.recompute_s);
  }
}

}  // namespace moesim::app
