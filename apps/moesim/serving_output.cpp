#include "apps/moesim/serving_output.hpp"

#include <fmt/format.h>

#include "apps/moesim/engine_setup.hpp"
#include "sim/compute_model.hpp"

namespace moesim::app {

serving::MakeInstanceBackend instance_backends(const sim::EngineConfig& cfg) {
  return [&cfg](const Scenario& instance) {
    serving::InstanceBackend ib;
    ib.topology = simulation_topology(instance);
    const topology::Topology* topo = ib.topology.get();
    ib.backend = [topo, &cfg](const Plan& plan) { return sim::run_plan(plan, *topo, cfg); };
    auto compute = std::make_shared<sim::ComputeModel>(topo->gpu(), cfg.precision, cfg.compute);
    ib.kernel_seconds = [compute](const ComputeSpec& spec) {
      return compute->duration(spec).value();
    };
    return ib;
  };
}

std::vector<serving::ServingReport> run_serving_stacks(const Scenario& sc,
                                                       const std::vector<StrategySpec>& specs,
                                                       const topology::Topology& cluster,
                                                       const sim::EngineConfig& cfg) {
  const serving::MakeInstanceBackend make = instance_backends(cfg);
  std::vector<serving::ServingReport> out;
  for (const auto& spec : specs) out.push_back(serving::run_serving(sc, spec, cluster, make));
  return out;
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string pool_line(const serving::PoolReport& p) {
  return fmt::format(
      "# {}: {} instance(s) x {} node(s), {} GPUs each, ep {}; per GPU: weights {:.1f} GiB, KV "
      "{} tokens x {:.0f} B = {:.1f} GiB (HBM {:.0f} GiB); batch <= {} tokens, {} requests; "
      "{} batch shapes priced",
      p.key, p.instances, p.nodes, p.gpus_per_instance, p.ep, p.kv.weights_bytes / kGiB,
      p.kv.kv_tokens, p.kv.kv_bytes_per_token,
      static_cast<double>(p.kv.kv_tokens) * p.kv.kv_bytes_per_token / kGiB, p.kv.hbm_bytes / kGiB,
      p.config.max_batch_tokens, p.config.max_running, p.priced_batches);
}

nlohmann::ordered_json latency_json(const serving::Latency& l) {
  return {{"mean", l.mean}, {"p50", l.p50}, {"p90", l.p90}, {"p99", l.p99}};
}

}  // namespace

void print_serving_table(const Scenario& sc, const std::vector<serving::ServingReport>& reports) {
  if (reports.empty()) return;
  const auto& first = reports.front();
  const auto& rq = first.requests;
  fmt::print(
      "# requests: {} at {:.3g}/s, prompt {:.0f} (cached {:.1f}%), output {:.0f} tokens on "
      "average\n",
      rq.count, rq.requests_per_s, rq.mean_prompt, 100 * rq.cached_share, rq.mean_output);
  for (const auto& p : first.pools) fmt::print("{}\n", pool_line(p));
  if (first.disaggregated)
    fmt::print("# KV transfer prefill -> decode: {:.3f} ms per request on average\n",
               first.kv_transfer_mean_s * 1e3);
  const ServingSpec& sv = *sc.serving;
  fmt::print("{:<20} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>9} {:>8} {:>7}\n", "strategy",
             "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "in tok/s/nd", "out tok/s/nd",
             "tok/s/usr", "SLO ok", "KV use");
  for (const auto& r : reports) {
    const auto& m = r.metrics;
    const bool judged = sv.slo_ttft.value() > 0 || sv.slo_tpot.value() > 0;
    fmt::print(
        "{:<20} {:>8.1f}ms {:>8.1f}ms {:>8.2f}ms {:>8.2f}ms {:>12.0f} {:>12.0f} {:>9.1f} "
        "{:>8} {:>6.1f}%\n",
        r.strategy, m.ttft_s.p50 * 1e3, m.ttft_s.p99 * 1e3, m.tpot_s.p50 * 1e3, m.tpot_s.p99 * 1e3,
        r.input_tokens_per_s_per_node, r.output_tokens_per_s_per_node,
        r.output_tokens_per_s_per_user,
        judged ? fmt::format("{:.1f}%", 100 * m.slo_attainment) : std::string("-"),
        100 * r.overall.kv_utilization);
  }
}

nlohmann::ordered_json serving_json(const Scenario& sc, const sim::EngineConfig& cfg,
                                    const std::vector<serving::ServingReport>& reports) {
  nlohmann::ordered_json j;
  j["moesim_version"] = MOESIM_VERSION;
  j["scenario"] = sc.name;
  j["engine"] = std::string(sim::network_kind_name(cfg.network));
  if (cfg.network == sim::NetworkKind::kFlow) j["flow_event_tolerance"] = cfg.flow_event_tolerance;
  const ServingSpec& sv = *sc.serving;
  j["slo"] = {{"ttft_s", sv.slo_ttft.value()}, {"tpot_s", sv.slo_tpot.value()}};
  auto& runs = j["serving"] = nlohmann::ordered_json::array();
  for (const auto& r : reports) {
    nlohmann::ordered_json o;
    o["strategy"] = r.strategy;
    o["disaggregated"] = r.disaggregated;
    o["requests"] = {{"count", r.requests.count},
                     {"requests_per_s", r.requests.requests_per_s},
                     {"mean_prompt_tokens", r.requests.mean_prompt},
                     {"mean_output_tokens", r.requests.mean_output},
                     {"cached_share", r.requests.cached_share}};
    o["ttft_s"] = latency_json(r.metrics.ttft_s);
    o["tpot_s"] = latency_json(r.metrics.tpot_s);
    o["e2e_s"] = latency_json(r.metrics.e2e_s);
    o["input_tokens_per_s"] = r.metrics.input_tokens_per_s;
    o["output_tokens_per_s"] = r.metrics.output_tokens_per_s;
    o["window_start_s"] = r.window.start_s;
    o["window_end_s"] = r.window.end_s;
    o["input_tokens_per_s_per_node"] = r.input_tokens_per_s_per_node;
    o["output_tokens_per_s_per_node"] = r.output_tokens_per_s_per_node;
    o["output_tokens_per_s_per_user"] = r.output_tokens_per_s_per_user;
    o["goodput_requests_per_s"] = r.metrics.goodput_requests_per_s;
    o["slo_attainment"] = r.metrics.slo_attainment;
    o["makespan_s"] = r.overall.makespan_s;
    o["iterations"] = r.overall.iterations;
    o["preemptions"] = r.overall.preemptions;
    o["kv_utilization"] = r.overall.kv_utilization;
    if (r.disaggregated) o["kv_transfer_mean_s"] = r.kv_transfer_mean_s;
    auto& pools = o["pools"] = nlohmann::ordered_json::array();
    for (const auto& p : r.pools)
      pools.push_back({{"key", p.key},
                       {"nodes", p.nodes},
                       {"instances", p.instances},
                       {"gpus_per_instance", p.gpus_per_instance},
                       {"ep", p.ep},
                       {"weights_bytes_per_gpu", p.kv.weights_bytes},
                       {"kv_bytes_per_token", p.kv.kv_bytes_per_token},
                       {"kv_tokens_per_gpu", p.kv.kv_tokens},
                       {"max_batch_tokens", p.config.max_batch_tokens},
                       {"max_running", p.config.max_running},
                       {"iterations", p.result.iterations},
                       {"preemptions", p.result.preemptions},
                       {"kv_utilization", p.result.kv_utilization},
                       {"priced_batches", p.priced_batches}});
    runs.push_back(std::move(o));
  }
  return j;
}

void write_serving_csv(std::ostream& os, const Scenario& sc,
                       const std::vector<serving::ServingReport>& reports) {
  os << "scenario,strategy,disaggregated,requests,ttft_p50_s,ttft_p90_s,ttft_p99_s,tpot_p50_s,"
        "tpot_p90_s,tpot_p99_s,input_tokens_per_s_per_node,output_tokens_per_s_per_node,"
        "output_tokens_per_s_per_user,goodput_requests_per_s,slo_attainment,kv_utilization,"
        "preemptions\n";
  for (const auto& r : reports) {
    const auto& m = r.metrics;
    os << fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", sc.name, r.strategy,
                      r.disaggregated ? 1 : 0, r.requests.count, m.ttft_s.p50, m.ttft_s.p90,
                      m.ttft_s.p99, m.tpot_s.p50, m.tpot_s.p90, m.tpot_s.p99,
                      r.input_tokens_per_s_per_node, r.output_tokens_per_s_per_node,
                      r.output_tokens_per_s_per_user, m.goodput_requests_per_s, m.slo_attainment,
                      r.overall.kv_utilization, r.overall.preemptions);
  }
}

}  // namespace moesim::app
