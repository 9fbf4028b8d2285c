// `moesim simulate` (docs/design.md §5):
//   moesim simulate [SCENARIO.yaml] [--strategy NAME]... [--engine E] [--iterations N] [--seed S]
//                   [--json F] [--csv F] [--trace F] [--report F.html]
// runs every strategy stack of the scenario (or the named ones) for N iterations and prints the
// comparison table; and the single-collective mode (nccl-tests style):
//   moesim simulate SCENARIO.yaml --collective all_to_all --size 128MiB [--algo A] [--engine E]
// one collective over all GPUs of the scenario's cluster: time, algbw and busbw as nccl-tests
// defines them, plus the simulator's own wall time and peak memory.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "apps/moesim/api.hpp"
#include "apps/moesim/chakra_export.hpp"
#include "apps/moesim/commands.hpp"
#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/html_report.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/progress.hpp"
#include "apps/moesim/report.hpp"
#include "apps/moesim/serving_output.hpp"
#include "apps/moesim/stacks.hpp"
#include "core/error.hpp"
#include "core/plan.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "sim/progress.hpp"
#include "sim/trace.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/workload/workload.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

struct CollectiveArgs {
  std::string scenario;
  std::vector<std::string> sets;  // --set KEY=VALUE
  std::string simgrid_mode;       // --simgrid-mode
  std::string skew;               // --skew (all_to_allv)
  std::vector<std::string> strategies;
  std::optional<std::string> iterations;  // absent: the scenario's workload.iterations
  std::optional<std::string> seed;        // absent: the scenario's workload.routing.seed
  std::string csv_path;
  std::string collective;
  std::vector<std::string> sizes;
  std::string algo = "nccl";
  std::string engine;
  std::string json_path;
  std::string trace_path;
  std::string report_path;  // --report F.html
  std::string chakra_dir;
  std::string chakra_a2av = "p2p";
  bool quiet = false;  // --quiet: no progress on stderr
};

struct CollectiveRow {
  CollectiveType type;
  CollectiveAlgo algo;
  double size_bytes;
  double time_s;
  double algbw_Bps;
  double busbw_Bps;
  double wall_s;
};

// --skew: uniform | zipf:S | dirichlet:A replaces the scenario's routing distribution.
void apply_skew_flag(RoutingWorkloadSpec& r, const std::string& spec) {
  auto fail = [&] {
    throw InputError(fmt::format(
        "--skew: found '{}', expected uniform, zipf:S (S in [0, 100], e.g. zipf:1.0) or "
        "dirichlet:A (A in (0, 1e6]), the ranges of workload.routing.skew and alpha",
        spec));
  };
  auto number_after = [&](std::size_t colon) {
    const std::string text = spec.substr(colon + 1);
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      fail();
    }
    if (used != text.size() || !std::isfinite(v)) fail();
    return v;
  };
  if (spec == "uniform") {
    r.distribution = RoutingDistribution::kUniform;
    r.skew = 0;
  } else if (spec.rfind("zipf:", 0) == 0) {
    const double s = number_after(4);
    if (!(s >= 0 && s <= 100)) fail();
    r.distribution = RoutingDistribution::kZipf;
    r.skew = s;
  } else if (spec.rfind("dirichlet:", 0) == 0) {
    const double alpha = number_after(9);
    if (!(alpha > 0 && alpha <= 1e6)) fail();
    r.distribution = RoutingDistribution::kDirichlet;
    r.dirichlet_alpha = alpha;
  } else {
    fail();
  }
}

std::string describe_routing(const RoutingWorkloadSpec& r) {
  switch (r.distribution) {
    case RoutingDistribution::kZipf:
      return fmt::format("zipf:{}", r.skew);
    case RoutingDistribution::kDirichlet:
      return fmt::format("dirichlet:{}", r.dirichlet_alpha);
    default:
      return std::string(name_of(r.distribution));
  }
}

// Tokens GPU a sends to GPU b in one dropless dispatch of MoE layer 0, iteration 0 of the
// scenario's workload (experts placed as the scenario's model places them): the per-pair traffic
// MoE routing makes, before any strategy reshapes it. With `dedup` (--algo deepep) also the same
// dispatch's distinct tokens per destination GPU and node (unit 1 token).
ByteMatrix routed_token_matrix(const Scenario& sc, int gpus,
                               std::shared_ptr<NodeDedup>* dedup = nullptr) {
  Scenario s = sc.stage_scenario();  // the routing model covers one pipeline stage
  s.model.capacity_factor = 0;       // dropless: drops would flatten the skew being measured
  if (dedup) {
    // The sampler counts distinct destinations when a strategy dispatches per node.
    StrategySpec deepep;
    deepep.name = "deepep";
    deepep.a2a = A2aRole::kDeepep;
    s.strategies = {deepep};
  }
  workload::WorkloadGenerator gen(s);
  gen.set_keep_demanded(false);
  const workload::LayerDispatch layer = gen.sample_layer(0, 0, 0.0);
  if (layer.num_gpus != gpus)
    throw InputError(fmt::format(
        "--collective all_to_allv: the routing model covers {} GPUs, the cluster has {}; set "
        "parallelism.ep to the GPU count",
        layer.num_gpus, gpus));
  std::vector<int> ranks(gpus);
  for (int r = 0; r < gpus; ++r) ranks[r] = r;
  ByteMatrix m =
      workload::dispatch_matrix(layer, ranks, workload::ExpertPlacement::of(s.model), Bytes(1));
  if (!(m.total().value() > 0))
    throw InputError("--collective all_to_allv: the routing model sends no tokens");
  if (dedup) {
    if (layer.distinct.empty())
      throw InputError(
          "--algo deepep: the routing model gives no per-token destination sets: it needs "
          "sampled routing (uniform, zipf, dirichlet; --skew) and unsharded experts");
    *dedup = workload::node_dedup(layer, ranks, Bytes(1));
  }
  return m;
}

void run_collective(const CollectiveArgs& a, ProgressReporter& progress) {
  auto type = parse_collective_type(a.collective);
  if (!type)
    throw InputError(
        fmt::format("--collective: found '{}', expected one of all_to_all, all_to_allv, "
                    "all_reduce, all_gather, reduce_scatter, send_recv",
                    a.collective));
  const bool variable = *type == CollectiveType::kAllToAllv;
  if (!a.skew.empty() && !variable)
    throw InputError("--skew: only meaningful with --collective all_to_allv");
  // "nccl" (the default) is what NCCL runs, so a row compares with nccl-tests as it stands: its
  // all-to-all is one send/receive per peer (linear); the other collectives take moesim's cheapest
  // applicable algorithm, as NCCL's tuner picks among ring and tree by its cost model.
  const bool a2a_type = *type == CollectiveType::kAllToAll || *type == CollectiveType::kAllToAllv;
  auto algo = a.algo == "nccl"
                  ? std::optional(a2a_type ? CollectiveAlgo::kLinear : CollectiveAlgo::kAuto)
                  : parse_collective_algo(a.algo);
  if (!algo)
    throw InputError(
        fmt::format("--algo: found '{}', expected one of nccl, linear, 2dh, 3dh, deepep, ring, "
                    "tree, hierarchical, auto",
                    a.algo));
  std::vector<Bytes> sizes;
  for (const auto& s : a.sizes)
    sizes.push_back(Bytes(parse_quantity_flag("--size", s, UnitKind::kBytes)));
  if (sizes.empty()) throw InputError("--size: missing, expected a size such as 128MiB");

  // One collective has no iterations; --seed picks the all_to_allv routing draw. An explicit
  // value is checked either way, never ignored.
  if (a.iterations)
    throw InputError(
        "--iterations: only meaningful without --collective (one collective runs once)");
  const auto seed_flag =
      parse_int_flag("--seed", a.seed, 0, std::numeric_limits<std::int64_t>::max());
  std::string path = a.scenario.empty() ? default_scenario_path() : a.scenario;
  Scenario sc = load_scenario_with(path, a.sets);
  if (seed_flag) sc.workload.routing.seed = static_cast<std::uint64_t>(*seed_flag);
  auto topo = simulation_topology(sc);
  sim::EngineConfig cfg = engine_config_from(sc, a.engine, a.simgrid_mode);
  const int gpus = topo->num_gpus();
  announce_simgrid_mode(cfg, gpus);
  // all_to_allv: one dispatch of the scenario's routing model (or --skew), in tokens, scaled to
  // the requested mean bytes per GPU below.
  std::shared_ptr<ByteMatrix> tokens;
  std::shared_ptr<NodeDedup> dedup;  // --algo deepep: distinct tokens, unit 1 token
  std::string skew_label;
  double recv_max_over_mean = 1;
  if (variable) {
    if (!a.skew.empty()) apply_skew_flag(sc.workload.routing, a.skew);
    skew_label = describe_routing(sc.workload.routing);
    tokens = std::make_shared<ByteMatrix>(
        routed_token_matrix(sc, gpus, *algo == CollectiveAlgo::kDeepep ? &dedup : nullptr));
    double most = 0;
    for (int d = 0; d < gpus; ++d) most = std::max(most, tokens->col_sum(d).value());
    recv_max_over_mean = most * gpus / tokens->total().value();
  }

  fmt::print("# {} on {} ({} GPUs), engine {}{}\n", a.collective, sc.name, gpus,
             sim::network_kind_name(cfg.network),
             variable ? fmt::format(", routing {}, received bytes max/mean {:.2f}", skew_label,
                                    recv_max_over_mean)
                      : "");
  fmt::print("{:>12} {:>8} {:>12} {:>10} {:>10} {:>9}\n", "size", "algo", "time(us)", "algbw(GB/s)",
             "busbw(GB/s)", "wall(s)");
  std::vector<CollectiveRow> rows;
  RunResult last;
  Plan last_plan;
  progress.set_total_units(static_cast<int>(sizes.size()));
  progress.begin_group(a.collective, static_cast<int>(sizes.size()), "size");
  for (Bytes size : sizes) {
    std::shared_ptr<const ByteMatrix> matrix;
    std::shared_ptr<const NodeDedup> sized_dedup;
    if (variable) {
      // Mean bytes sent per GPU (diagonal included, as all_to_all's size) = size: one token
      // copy is that many bytes, for the deduplicated dispatch too (which sends fewer copies).
      auto m = std::make_shared<ByteMatrix>(*tokens);
      m->unit = Bytes(size.value() * gpus / tokens->total().value());
      if (dedup) {
        auto d = std::make_shared<NodeDedup>(*dedup);
        d->unit = m->unit;
        sized_dedup = std::move(d);
      }
      matrix = std::move(m);
    }
    Plan plan = world_collective_plan(gpus, *type, *algo, size, matrix, sized_dedup);
    auto t0 = std::chrono::steady_clock::now();
    progress.begin_unit();
    RunResult res = sim::run_plan(plan, *topo, cfg);
    progress.end_unit();
    progress.finish();  // the row goes to stdout, which may be the same terminal
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const CollectiveRecord& rec = res.collectives.at(0);
    CollectiveRow row{*type, rec.algo, size.value(), rec.duration_s(), 0, 0, wall};
    row.algbw_Bps = row.time_s > 0 ? size.value() / row.time_s : 0;
    row.busbw_Bps = row.algbw_Bps * collectives::busbw_factor(*type, gpus);
    fmt::print("{:>12} {:>8} {:>12.2f} {:>10.2f} {:>10.2f} {:>9.3f}\n", to_string(size),
               record_algo_name(rec), row.time_s * 1e6, row.algbw_Bps / 1e9, row.busbw_Bps / 1e9,
               wall);
    rows.push_back(row);
    last = std::move(res);
    last_plan = std::move(plan);
  }
  sim::throw_if_interrupted();  // Ctrl-C after the last poll: still no output files
  double rss = peak_rss_bytes();
  fmt::print("# peak memory {}\n", to_string(Bytes(rss)));

  if (!a.json_path.empty()) {
    auto to_json = [&](const CollectiveRow& r) {
      nlohmann::ordered_json c;
      c["type"] = std::string(collective_type_name(r.type));
      c["algo"] = std::string(collective_algo_name(r.algo));
      c["size_bytes"] = r.size_bytes;
      c["gpus"] = gpus;
      c["engine"] = std::string(sim::network_kind_name(cfg.network));
      if (auto m = simgrid_mode_used(cfg, gpus); !m.empty()) c["simgrid_mode"] = m;
      if (cfg.network == sim::NetworkKind::kFlow)
        c["flow_event_tolerance"] = cfg.flow_event_tolerance;
      c["time_s"] = r.time_s;
      c["algbw_GBps"] = r.algbw_Bps / 1e9;
      c["busbw_GBps"] = r.busbw_Bps / 1e9;
      c["wall_s"] = r.wall_s;
      if (variable) {
        c["routing"] = skew_label;
        c["recv_max_over_mean"] = recv_max_over_mean;
      }
      return c;
    };
    nlohmann::ordered_json j;
    j["moesim_version"] = MOESIM_VERSION;
    j["scenario"] = sc.name;
    j["collective"] = to_json(rows.front());
    if (rows.size() > 1) {
      auto& all = j["collectives"] = nlohmann::ordered_json::array();
      for (const auto& r : rows) all.push_back(to_json(r));
    }
    double wall_total = 0;
    for (const auto& r : rows) wall_total += r.wall_s;
    j["wall_s"] = wall_total;
    j["peak_rss_bytes"] = rss;
    write_file_atomic(a.json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
  }
  if (!a.trace_path.empty())
    write_file_atomic(a.trace_path, [&](std::ostream& os) {
      sim::write_chrome_trace(last_plan, last, os, cfg.trace_max_ranks);
    });
}

// A scenario with `serving:` (docs/serving.md): its requests through every strategy's pools.
void run_serving_scenario(const CollectiveArgs& a, const Scenario& sc,
                          const topology::Topology& topo, const sim::EngineConfig& cfg,
                          const std::vector<StrategySpec>& specs) {
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string&>{"--report", a.report_path},
        {"--trace", a.trace_path},
        {"--chakra", a.chakra_dir}})
    if (!path.empty())
      throw InputError(
          fmt::format("{}: not for a serving scenario (its runs are thousands of "
                      "iterations; --json and --csv have its figures)",
                      flag));
  const ServingSpec& sv = *sc.serving;
  fmt::print("# {}: serving {} requests on {}, engine {}\n", sc.name,
             sv.requests.arrival == RequestSpec::Arrival::kTrace
                 ? std::string("traced")
                 : fmt::format("{}", sv.requests.count),
             sv.disaggregated ? "prefill and decode pools" : "co-located instances",
             sim::network_kind_name(cfg.network));
  const auto reports = run_serving_stacks(sc, specs, topo, cfg);
  sim::throw_if_interrupted();
  print_serving_table(sc, reports);
  if (!a.json_path.empty()) {
    const nlohmann::ordered_json j = serving_json(sc, cfg, reports);
    write_file_atomic(a.json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
  }
  if (!a.csv_path.empty())
    write_file_atomic(a.csv_path, [&](std::ostream& os) { write_serving_csv(os, sc, reports); });
}

void run_scenario(const CollectiveArgs& a, ProgressReporter& progress) {
  std::string path = a.scenario.empty() ? default_scenario_path() : a.scenario;
  auto [sc, iterations] = load_run_scenario(path, a.sets, a.iterations, a.seed);
  warn_implausible(sc);
  auto topo = simulation_topology(sc);
  sim::EngineConfig cfg = engine_config_from(sc, a.engine, a.simgrid_mode);
  auto specs = select_strategies(sc, a.strategies);
  std::string topo_name = sc.cluster.name.empty() ? sc.name : sc.cluster.name;
  announce_simgrid_mode(cfg, topo->num_gpus());
  if (sc.serving) {
    progress.finish();
    run_serving_scenario(a, sc, *topo, cfg, specs);
    return;
  }

  fmt::print("# {}: {} GPUs, engine {}, {} iteration(s), seed {}\n", sc.name, topo->num_gpus(),
             sim::network_kind_name(cfg.network), iterations, sc.workload.routing.seed);
  progress.set_total_units(static_cast<int>(specs.size()) * iterations);
  auto outcomes =
      run_stacks(sc, specs, *topo, cfg, iterations, topo_name, false, nullptr, &progress);
  sim::throw_if_interrupted();  // Ctrl-C after the last poll: still no output files
  progress.finish();
  std::vector<RunSummary> rows;
  for (const auto& o : outcomes) rows.push_back(o.summary);
  print_table(rows);
  warn_memory(sc, rows, topo->gpu().name);

  if (!a.json_path.empty()) {
    const nlohmann::ordered_json j = simulate_json(sc, cfg, *topo, outcomes);
    write_file_atomic(a.json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
  }
  if (!a.csv_path.empty()) {
    write_file_atomic(a.csv_path, [&](std::ostream& os) {
      write_csv_header(os);
      for (const auto& o : outcomes) write_csv_rows(os, sc, o.run, topo_name);
    });
  }
  if (!a.report_path.empty()) {
    CompareReport rep;
    rep.command = "simulate";
    rep.engine = std::string(sim::network_kind_name(cfg.network));
    for (const auto& s : specs) rep.strategies.push_back(s.name);
    rep.topology_names = {topo_name};
    rep.scenarios = {&sc};
    std::vector<ReportRun> runs;
    for (const auto& o : outcomes) runs.push_back({&o.run, o.summary});
    rep.runs = {std::move(runs)};
    write_compare_report(a.report_path, rep);
  }
  if (!a.chakra_dir.empty()) {
    std::vector<ChakraRun> runs;
    for (const auto& o : outcomes)
      runs.push_back({o.run.strategy, &o.run.last_plan.plan, &o.run.last_result});
    ChakraOptions opt;
    opt.bytes_per_element = sc.bytes_per_element();
    opt.a2av_as_collective = a.chakra_a2av == "collective";
    write_chakra(a.chakra_dir, sc.name, runs, opt);
  }
  if (!a.trace_path.empty()) {
    // One file for all strategies, each a group of processes named after it (sim/trace.hpp).
    std::vector<sim::TraceRun> runs;
    for (const auto& o : outcomes)
      runs.push_back({o.run.strategy, &o.run.last_plan.plan, &o.run.last_result});
    write_file_atomic(a.trace_path, [&](std::ostream& os) {
      sim::write_chrome_trace(runs, os, cfg.trace_max_ranks);
    });
  }
}

}  // namespace

void register_simulate(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("simulate", "Simulate a scenario, or one collective on its cluster");
  auto a = std::make_shared<CollectiveArgs>();
  cmd->add_option("scenario", a->scenario, "Scenario YAML (default: scenarios/quickstart.yaml)");
  add_set_option(cmd, &a->sets);
  cmd->add_option("--strategy", a->strategies, "Run only this strategy (repeatable)");
  cmd->add_option("--iterations", a->iterations,
                  "Iterations, in [1, 1000000] (default: workload.iterations)");
  cmd->add_option("--seed", a->seed,
                  "Routing seed, in [0, 2^63-1] (default: workload.routing.seed)");
  cmd->add_option("--csv", a->csv_path, "Write one row per strategy and iteration as CSV");
  cmd->add_option("--collective", a->collective,
                  "Simulate one collective over all GPUs: all_to_all, all_to_allv (one MoE "
                  "dispatch of the routing model), all_reduce, all_gather, reduce_scatter, "
                  "send_recv");
  cmd->add_option("--size", a->sizes,
                  "Collective size per rank, e.g. 128MiB, at most 1024TiB (repeatable)");
  cmd->add_option("--algo", a->algo,
                  "nccl (default: what NCCL runs; linear for all-to-all), linear, 2dh, 3dh, "
                  "deepep, ring, tree, hierarchical or auto (the cheapest by moesim's cost model)");
  cmd->add_option("--skew", a->skew,
                  "With --collective all_to_allv: uniform, zipf:S or dirichlet:A (default: the "
                  "scenario's workload.routing); --size is then the mean bytes each GPU sends");
  cmd->add_option("--engine", a->engine, "Network model: analytical, flow or simgrid");
  cmd->add_option("--simgrid-mode", a->simgrid_mode,
                  "With --engine simgrid: per_flow, ptask or auto (default: engine.simgrid.mode)");
  cmd->add_option("--json", a->json_path, "Write results as JSON to this file");
  cmd->add_option("--report", a->report_path,
                  "Self-contained HTML report: the scenario and cluster, the strategies' step "
                  "times and speedups, the breakdown and the decisions of every iteration");
  cmd->add_option("--trace", a->trace_path,
                  "Write a Chrome trace (chrome://tracing, Perfetto); several strategies share "
                  "the file, each one's ranks as processes named after it");
  cmd->add_option("--chakra", a->chakra_dir,
                  "Write each strategy's last plan as Chakra execution traces, one per rank "
                  "(DIR/<strategy>/et.<rank>.et and comm_group.json), for ASTRA-sim");
  cmd->add_option("--chakra-a2av", a->chakra_a2av,
                  "How --chakra writes an all_to_allv: p2p (default: per-peer sends and receives "
                  "of the plan's exact sizes) or collective (one all_to_all of the group's mean "
                  "row: an approximation when rows differ)")
      ->check(CLI::IsMember({"p2p", "collective"}));
  cmd->add_flag("--quiet,-q", a->quiet,
                "No progress line on stderr (shown otherwise for runs longer than 2 s)");
  cmd->callback([a] {
    check_output_paths({{"--json", a->json_path},
                        {"--csv", a->csv_path},
                        {"--trace", a->trace_path},
                        {"--report", a->report_path}});
    if (!a->collective.empty() && !a->report_path.empty())
      throw InputError("--report: only for a scenario's strategies, not with --collective");
    if (a->collective.empty() && !a->sizes.empty())
      throw InputError("--size: only meaningful with --collective");
    if (!a->collective.empty() && !a->chakra_dir.empty())
      throw InputError("--chakra: only for a scenario's strategies, not with --collective");
    if (a->chakra_dir.empty() && a->chakra_a2av != "p2p")
      throw InputError("--chakra-a2av: only meaningful with --chakra");
    check_chakra_dir(a->chakra_dir);
    // Progress on stderr; Ctrl-C: a summary, no output file, exit 130 (main.cpp).
    run_interruptible(a->quiet, [&](ProgressReporter& progress) {
      if (a->collective.empty())
        run_scenario(*a, progress);
      else
        run_collective(*a, progress);
    });
  });
}

}  // namespace moesim::app
