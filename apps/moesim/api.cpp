#include "apps/moesim/api.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string_view>
#include <system_error>

#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/serving_output.hpp"
#include "apps/moesim/serving_tune.hpp"
#include "apps/moesim/sweep.hpp"
#include "apps/moesim/tune.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

nlohmann::ordered_json simulate_json(const Scenario& sc, const sim::EngineConfig& cfg,
                                     const topology::Topology& topo,
                                     const std::vector<StackOutcome>& outcomes) {
  nlohmann::ordered_json j;
  j["moesim_version"] = MOESIM_VERSION;
  j["scenario"] = sc.name;
  j["engine"] = std::string(sim::network_kind_name(cfg.network));
  if (auto m = simgrid_mode_used(cfg, topo.num_gpus()); !m.empty()) j["simgrid_mode"] = m;
  if (cfg.network == sim::NetworkKind::kFlow) j["flow_event_tolerance"] = cfg.flow_event_tolerance;
  // The compute slow-down beside communication the run used (scenario, GPU default or
  // calibration).
  j["interference"] = cfg.compute.interference;
  // The per-message and per-peer costs it charged (scenario keys or the NIC model's).
  j["message_overhead_s"] = cfg.net.message_overhead_s;
  j["peer_cache"] = cfg.net.peer_cache;
  j["peer_miss_overhead_s"] = cfg.net.peer_miss_overhead_s;
  j["seed"] = sc.workload.routing.seed;
  auto& runs = j["runs"] = nlohmann::ordered_json::array();
  double wall = 0;
  for (const auto& o : outcomes) {
    runs.push_back(run_json(sc, o.run, o.summary));
    wall += o.summary.wall_s;
  }
  j["wall_s"] = wall;
  return j;
}

nlohmann::ordered_json summary_record(const RunSummary& s) {
  auto or_null = [](bool has, double v) {
    return has ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json r;
  r["strategy"] = s.strategy;
  r["topology"] = s.topology;
  r["gpus"] = s.gpus;
  r["step_time_s"] = s.step_mean_s;
  r["step_time_p50_s"] = s.step_p50_s;
  r["step_time_p95_s"] = s.step_p95_s;
  r["moe_layer_time_s"] = s.moe_layer_mean_s;
  r["a2a_s"] = s.a2a_mean_s;
  r["allreduce_s"] = s.allreduce_mean_s;
  r["compute_s"] = s.compute_mean_s;
  r["exposed_comm_s"] = s.exposed_comm_mean_s;
  r["speedup"] = or_null(s.speedup > 0, s.speedup);
  r["tokens_per_s_per_gpu"] = s.tokens_per_s_per_gpu;
  r["model_tflops_per_gpu"] = or_null(s.has_model_flops, s.model_tflops_per_gpu);
  r["mfu"] = or_null(s.has_model_flops && s.mfu > 0, s.mfu);
  r["memory_bytes"] = s.memory_bytes;
  r["gpu_memory_bytes"] = s.gpu_memory_bytes;
  r["fits_memory"] = s.fits_memory();
  r["decisions"] = s.decisions;
  r["wall_s"] = s.wall_s;
  return r;
}

namespace {

// A plain scalar as JSON: what YAML 1.2's core schema reads as a number, boolean or null.
nlohmann::ordered_json scalar_json(const YAML::Node& n) {
  const std::string& v = n.Scalar();
  if (n.Tag() == "!") return v;  // quoted: a string whatever it looks like
  if (v == "~" || v == "null" || v == "Null" || v == "NULL" || v.empty()) return nullptr;
  if (v == "true" || v == "True" || v == "TRUE") return true;
  if (v == "false" || v == "False" || v == "FALSE") return false;
  const char* b = v.data();
  const char* e = b + v.size();
  std::int64_t i = 0;
  if (auto [p, ec] = std::from_chars(b, e, i); ec == std::errc() && p == e) return i;
  double d = 0;
  if (auto [p, ec] = std::from_chars(b, e, d); ec == std::errc() && p == e && std::isfinite(d))
    return d;
  return v;
}

nlohmann::ordered_json node_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::ordered_json o = nlohmann::ordered_json::object();
      for (const auto& kv : n) o[kv.first.Scalar()] = node_json(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::ordered_json a = nlohmann::ordered_json::array();
      for (const auto& x : n) a.push_back(node_json(x));
      return a;
    }
    case YAML::NodeType::Scalar:
      return scalar_json(n);
    default:
      return nullptr;
  }
}

}  // namespace

nlohmann::ordered_json yaml_text_to_json(const std::string& text, const std::string& pseudo_file) {
  return node_json(parse_yaml_string(text, pseudo_file));
}

nlohmann::ordered_json simulate_text(const SimulateRequest& req) {
  std::vector<std::string> sets = req.sets;
  if (req.iterations) sets.push_back(fmt::format("workload.iterations={}", *req.iterations));
  if (req.seed) sets.push_back(fmt::format("workload.routing.seed={}", *req.seed));
  const Scenario sc = parse_scenario_with(parse_yaml_string(req.text, req.path), req.path, sets);
  const auto topo = simulation_topology(sc);
  const sim::EngineConfig cfg = engine_config_from(sc, req.engine);
  const auto specs = select_strategies(sc, req.strategies);
  if (sc.serving) return serving_json(sc, cfg, run_serving_stacks(sc, specs, *topo, cfg));
  const std::string topo_name = sc.cluster.name.empty() ? sc.name : sc.cluster.name;
  const auto outcomes = run_stacks(sc, specs, *topo, cfg, sc.workload.iterations, topo_name, false);
  nlohmann::ordered_json j = simulate_json(sc, cfg, *topo, outcomes);
  auto& records = j["records"] = nlohmann::ordered_json::array();
  for (const auto& o : outcomes) records.push_back(summary_record(o.summary));
  return j;
}

nlohmann::ordered_json sweep_text(const std::string& text, const std::string& path,
                                  const std::vector<std::string>& sets, const std::string& engine,
                                  int jobs) {
  SweepSpec spec = parse_sweep(parse_yaml_string(text, path), path);
  add_command_line_sets(spec, sets);
  SweepOptions opts;
  opts.jobs = jobs;
  opts.engine = engine;
  opts.progress = false;
  const SweepResult res = run_sweep(spec, opts);
  nlohmann::ordered_json j;
  j["name"] = spec.name;
  j["engine"] = res.engine;
  j["points"] = res.points_total;
  j["wall_s"] = res.wall_s;
  auto& records = j["records"] = nlohmann::ordered_json::array();
  for (const SweepRow& row : res.rows) {
    nlohmann::ordered_json r;
    r["point"] = row.point;
    for (std::size_t a = 0; a < spec.axes.size() && a < row.values.size(); ++a)
      r[spec.axes[a].key] = scalar_json(YAML::Node(row.values[a]));
    if (row.serving) {  // a serving sweep: who, and the serving figures
      r["strategy"] = row.summary.strategy;
      r["gpus"] = row.summary.gpus;
      for (const auto& [name, field] : ServingRowFigures::fields()) r[name] = (*row.serving).*field;
      records.push_back(std::move(r));
      continue;
    }
    const nlohmann::ordered_json summary = summary_record(row.summary);  // outlives the loop
    for (const auto& [k, v] : summary.items()) r[k] = v;
    records.push_back(std::move(r));
  }
  return j;
}

nlohmann::ordered_json tune_text(const TuneRequest& req) {
  const YAML::Node tree = parse_yaml_string(req.text, req.path);
  if (parse_scenario_with(YAML::Clone(tree), req.path, req.sets).serving) {
    // A serving deployment: its pool shapes for its SLO (serving_tune.hpp).
    ServingTuneOptions so;
    so.budget_s = req.budget_s;
    so.top = req.top;
    so.jobs = req.jobs;
    so.progress = false;
    const ServingTuneResult r = tune_serving(tree, req.path, req.sets, so);
    nlohmann::ordered_json j = serving_tune_json(r);
    j["emit"] = r.met()
                    ? nlohmann::ordered_json(serving_tuned_yaml(tree, req.sets, r.ranked.front()))
                    : nlohmann::ordered_json(nullptr);
    return j;
  }
  TuneOptions o;
  o.budget_s = req.budget_s;
  if (req.engine != "auto" && req.engine != "analytical" && req.engine != "flow" &&
      req.engine != "simgrid")
    throw InputError(fmt::format(
        "engine: found '{}', expected auto, analytical, flow or simgrid (the engine the best "
        "candidates are re-run on)",
        req.engine));
  if (!(req.budget_s > 0)) throw InputError("budget: expected a positive number of seconds");
  if (req.top < 1 || req.top > 1000) throw InputError("top: expected an integer in [1, 1000]");
  o.rerun_engine = req.engine;
  o.top = req.top;
  o.jobs = req.jobs;
  o.progress = false;
  o.search_layouts = !req.keep_layout;
  o.search_pipeline = !req.keep_pipeline;
  o.search_memory = !req.keep_memory;
  o.include_routing = req.include_routing;
  const TuneResult r = tune(tree, req.path, req.sets, o);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(tune_json(r));
  j["emit"] = r.ranked.empty() ? nlohmann::ordered_json(nullptr)
                               : nlohmann::ordered_json(tuned_scenario_yaml(
                                     tree, req.path, req.sets, r, r.ranked.front()));
  return j;
}

}  // namespace moesim::app
