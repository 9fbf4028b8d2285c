// `moesim route-train SCENARIO.yaml`: the TA-MoE gate-training lab (strategies/routing/
// gate_lab.hpp, docs/ta_moe.md) on the scenario's cluster, with and without the topology loss,
// printing per-epoch curves. Also the `moesim topo --ta-moe` report (print_ta_moe): target share
// per tier and the predicted all-to-all time of even vs target dispatch.
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "core/error.hpp"
#include "core/scenario_loader.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/routing/gate_lab.hpp"
#include "strategies/routing/target.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

// lambda of the scenario's first ta_moe strategy, else the default 0.1.
double scenario_lambda(const Scenario& sc) {
  for (const auto& s : sc.strategies)
    if (s.routing == RoutingRole::kTaMoe) return s.ta_moe.lambda;
  return TaMoeParams{}.lambda;
}

struct Solved {
  std::vector<int> ranks;
  routing::PairCostMatrix costs;
  routing::TargetPattern target;
  double solve_s = 0;
};

// The target of the first EP group (all EP groups of a scenario see the same kind of fabric).
Solved solve_first_group(const Scenario& sc, const topology::Topology& topo) {
  Solved s;
  s.ranks = strategies::make_groups(sc.stage_scenario()).ep.groups.at(0);
  const auto t0 = std::chrono::steady_clock::now();
  s.costs = routing::pair_costs(topo, s.ranks);
  const std::int64_t supply = sc.model.tokens_per_gpu() * sc.model.top_k;
  const double b = static_cast<double>(sc.model.model_dim) * sc.bytes_per_element();
  s.target = routing::solve_target(s.costs, supply, b, scenario_lambda(sc));
  s.solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

}  // namespace

void print_ta_moe(const Scenario& sc, const topology::Topology& topo, std::string* json) {
  const Solved s = solve_first_group(sc, topo);
  const auto& t = s.target;
  const double smoothed_time = routing::predicted_time_s(
      s.costs, [&](int i, int j) { return t.share_at(i, j) * static_cast<double>(t.supply); },
      t.bytes_per_token);
  fmt::print("\nTA-MoE target (EP group of {} GPUs, {} tokens x {} B per GPU, lambda {})\n", t.size,
             t.supply, t.bytes_per_token, t.lambda);
  fmt::print("solver      {} ({} max-flow solves), {:.3f} s\n", target_method_name(t.method),
             t.iterations, s.solve_s);
  fmt::print("{:>4}  {:>8}  {:>10}  {:>10}  {:>10}\n", "tier", "peers", "even", "target",
             "smoothed");
  const auto rows = routing::tier_shares(s.costs, t);
  for (const auto& r : rows)
    fmt::print("{:>4}  {:>8.2f}  {:>9.2f}%  {:>9.2f}%  {:>9.2f}%\n", r.tier, r.peers, 100 * r.even,
               100 * r.target, 100 * r.smoothed);
  fmt::print("predicted all-to-all: even {}, target {} ({:.2f}x), smoothed {} ({:.2f}x)\n",
             to_string(Seconds(t.even_time_s)), to_string(Seconds(t.time_s)),
             t.time_s > 0 ? t.even_time_s / t.time_s : 0.0, to_string(Seconds(smoothed_time)),
             smoothed_time > 0 ? t.even_time_s / smoothed_time : 0.0);
  if (json) {
    nlohmann::ordered_json j;
    j["group_size"] = t.size;
    j["tokens_per_gpu"] = t.supply;
    j["bytes_per_token"] = t.bytes_per_token;
    j["lambda"] = t.lambda;
    j["method"] = std::string(target_method_name(t.method));
    j["max_flow_solves"] = t.iterations;
    j["solve_wall_s"] = s.solve_s;
    j["even_time_s"] = t.even_time_s;
    j["target_time_s"] = t.time_s;
    j["smoothed_time_s"] = smoothed_time;
    auto& tiers = j["tiers"] = nlohmann::ordered_json::array();
    for (const auto& r : rows)
      tiers.push_back({{"tier", r.tier},
                       {"peers", r.peers},
                       {"even_share", r.even},
                       {"target_share", r.target},
                       {"smoothed_share", r.smoothed}});
    *json = j.dump();
  }
}

void register_route_train(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "route-train",
      "TA-MoE gate-training lab: SGD on synthetic tokens with and without the topology loss");
  auto scenario = std::make_shared<std::string>();
  auto cfg = std::make_shared<routing::GateLabConfig>();
  auto json_path = std::make_shared<std::string>();
  // The numeric flags are read as text and parsed strictly (overrides.hpp), with their ranges.
  auto flags = std::make_shared<std::map<std::string, std::string>>();
  auto flag = [&](const std::string& name, const std::string& help, const std::string& dflt) {
    cmd->add_option_function<std::string>(
           name, [flags, name](const std::string& v) { (*flags)[name] = v; }, help)
        ->default_str(dflt);
  };
  cmd->add_option("scenario", *scenario, "Scenario YAML (default: scenarios/quickstart.yaml)");
  flag("--epochs", "Training epochs, in [1, 100000]", std::to_string(cfg->epochs));
  flag("--tokens", "Training tokens per GPU per epoch, in [1, 2^24]",
       std::to_string(cfg->tokens_per_gpu));
  flag("--batch", "Tokens per GPU per SGD step, in [1, 2^24]", std::to_string(cfg->batch));
  flag("--lr", "SGD learning rate, in (0, 1000]", fmt::format("{}", cfg->learning_rate));
  flag("--aux-weight", "Weight of the auxiliary (balance or topology) loss, in [0, 1000]",
       fmt::format("{}", cfg->aux_weight));
  flag("--label-smoothing", "Label smoothing of the task loss, in [0, 1]",
       fmt::format("{}", cfg->label_smoothing));
  flag("--dim", "Token feature dimension, in [0, 65536] (0: max(16, number of experts))",
       std::to_string(cfg->feature_dim));
  flag("--seed", "Seed of the synthetic data and the initial gate, in [0, 2^63-1]",
       std::to_string(cfg->seed));
  cmd->add_option("--json", *json_path, "Write both runs' curves as JSON to this file");
  cmd->callback([=] {
    for (const auto& [name, text] : *flags) {
      if (name == "--epochs") cfg->epochs = static_cast<int>(parse_int_flag(name, text, 1, 100000));
      if (name == "--tokens")
        cfg->tokens_per_gpu = static_cast<int>(parse_int_flag(name, text, 1, 1 << 24));
      if (name == "--batch") cfg->batch = static_cast<int>(parse_int_flag(name, text, 1, 1 << 24));
      if (name == "--lr") cfg->learning_rate = parse_number_flag(name, text, 0, 1000, true);
      if (name == "--aux-weight") cfg->aux_weight = parse_number_flag(name, text, 0, 1000);
      if (name == "--label-smoothing") cfg->label_smoothing = parse_number_flag(name, text, 0, 1);
      if (name == "--dim")
        cfg->feature_dim = static_cast<int>(parse_int_flag(name, text, 0, 65536));
      if (name == "--seed")
        cfg->seed = static_cast<std::uint64_t>(
            parse_int_flag(name, text, 0, std::numeric_limits<std::int64_t>::max()));
    }
    check_output_path(*json_path, "--json");
    const std::string path = scenario->empty() ? default_scenario_path() : *scenario;
    const Scenario sc = load_scenario_with(path, {});
    const auto topo = topology::build_topology(sc.cluster);
    if (sc.model.expert_shards() > 1)
      throw InputError(sc.location_of("model.experts_per_gpu"), "model.experts_per_gpu",
                       "route-train needs unsharded experts (experts_per_gpu >= 1)");
    const Solved s = solve_first_group(sc, *topo);
    routing::GateLabConfig c = *cfg;
    c.num_gpus = static_cast<int>(s.ranks.size());
    c.experts_per_gpu = sc.model.local_experts();
    c.top_k = sc.model.top_k;
    if (c.feature_dim == 0)
      c.feature_dim = routing::default_feature_dim(c.num_gpus * c.experts_per_gpu);
    c.node_of.clear();
    for (int r : s.ranks) c.node_of.push_back(topo->node_of(r));
    c.target_share.resize(static_cast<std::size_t>(c.num_gpus) * c.num_gpus);
    for (int i = 0; i < c.num_gpus; ++i)
      for (int j = 0; j < c.num_gpus; ++j)
        c.target_share[static_cast<std::size_t>(i) * c.num_gpus + j] = s.target.share_at(i, j);
    double target_off = 0;
    for (int i = 0; i < c.num_gpus; ++i)
      for (int j = 0; j < c.num_gpus; ++j)
        if (c.node_of[i] != c.node_of[j])
          target_off += c.target_share[static_cast<std::size_t>(i) * c.num_gpus + j];
    target_off /= c.num_gpus;

    fmt::print("route-train  {}: {} GPUs on {} nodes, {} experts, top-{}, lambda {}\n", sc.name,
               c.num_gpus, topo->num_nodes(), c.num_gpus * c.experts_per_gpu, c.top_k,
               s.target.lambda);
    fmt::print(
        "gate         linear, {} features + GPU one-hot; SGD lr {}, batch {}, {} tokens/GPU/"
        "epoch, aux weight {}, seed {}\n",
        c.feature_dim, c.learning_rate, c.batch, c.tokens_per_gpu, c.aux_weight, c.seed);
    fmt::print("target       off-node share of c-hat: {:.1f}%\n\n", 100 * target_off);
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<routing::GateLabRun> runs = routing::run_gate_lab(c);
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("{:>5}  | {:^34} | {:^34}\n", "", "without topology loss (balance)",
               "with topology loss");
    fmt::print("{:>5}  | {:>8} {:>8} {:>7} {:>8} | {:>8} {:>8} {:>7} {:>8}\n", "epoch", "task",
               "acc", "balance", "off-node", "task", "acc", "balance", "off-node");
    for (std::size_t e = 0; e < runs[0].epochs.size(); ++e) {
      const auto& a = runs[0].epochs[e];
      const auto& b = runs[1].epochs[e];
      fmt::print(
          "{:>5}  | {:>8.4f} {:>7.2f}% {:>7.2f} {:>7.2f}% | {:>8.4f} {:>7.2f}% {:>7.2f} "
          "{:>7.2f}%\n",
          a.epoch, a.task_loss, 100 * a.accuracy, a.balance, 100 * a.offnode_share, b.task_loss,
          100 * b.accuracy, b.balance, 100 * b.offnode_share);
    }
    const auto& fa = runs[0].epochs.back();
    const auto& fb = runs[1].epochs.back();
    const double drop = fa.offnode_share > 0 ? 1 - fb.offnode_share / fa.offnode_share : 0;
    fmt::print(
        "\nfinal: off-node share {:.2f}% -> {:.2f}% ({:.1f}% lower), accuracy {:.2f}% -> "
        "{:.2f}% ({:+.2f} points), wall {:.2f} s\n",
        100 * fa.offnode_share, 100 * fb.offnode_share, 100 * drop, 100 * fa.accuracy,
        100 * fb.accuracy, 100 * (fb.accuracy - fa.accuracy), wall);
    if (!json_path->empty()) {
      nlohmann::ordered_json j;
      j["scenario"] = sc.name;
      j["gpus"] = c.num_gpus;
      j["experts"] = c.num_gpus * c.experts_per_gpu;
      j["top_k"] = c.top_k;
      j["feature_dim"] = c.feature_dim;
      j["lambda"] = s.target.lambda;
      j["target_offnode_share"] = target_off;
      auto& jr = j["runs"] = nlohmann::ordered_json::array();
      for (const auto& r : runs) {
        nlohmann::ordered_json run;
        run["topology_loss"] = r.topology_loss;
        auto& ep = run["epochs"] = nlohmann::ordered_json::array();
        for (const auto& e : r.epochs)
          ep.push_back({{"epoch", e.epoch},
                        {"task_loss", e.task_loss},
                        {"aux_loss", e.aux_loss},
                        {"accuracy", e.accuracy},
                        {"balance", e.balance},
                        {"offnode_share", e.offnode_share}});
        jr.push_back(run);
      }
      j["offnode_reduction"] = drop;
      j["accuracy_change"] = fb.accuracy - fa.accuracy;
      j["wall_s"] = wall;
      write_file_atomic(*json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
    }
  });
}

}  // namespace moesim::app
