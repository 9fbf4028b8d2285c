// `moesim topo SCENARIO.yaml [--json F] [--dot F]`: what the simulator sees of the cluster —
// counts, bisection bandwidth and the per-tier table of alpha/beta that the analytical model and
// TA-MoE read.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "apps/moesim/commands.hpp"
#include "apps/moesim/output.hpp"
#include "apps/moesim/overrides.hpp"
#include "core/scenario_loader.hpp"
#include "strategies/cost_model.hpp"
#include "topology/fabric_cuts.hpp"
#include "topology/gpu_catalog.hpp"
#include "topology/nic_catalog.hpp"
#include "topology/topology.hpp"

namespace moesim::app {

namespace {

struct TopoSummary {
  std::map<std::string, int> vertex_counts;
  std::size_t cables = 0;
  BytesPerSecond bisection{0};
  std::vector<topology::TierRow> tiers;
  // Fabric cuts (topology/fabric_cuts.hpp) as users read them: per tier, the parts the fabric
  // splits into and the least uplink bandwidth per GPU of a part, against the NIC share.
  struct Cut {
    int tier = 0, parts = 0, min_gpus = 0, max_gpus = 0;
    double min_out_per_gpu = 0;  // bytes/s: min over parts of min(egress, ingress) / GPUs
    double nic_per_gpu = 0;      // bytes/s: the least NIC share of a GPU
  };
  std::vector<Cut> cuts;
};

TopoSummary summarize(const topology::Topology& topo) {
  TopoSummary s;
  for (const auto& v : topo.vertices()) s.vertex_counts[std::string(vertex_kind_name(v.kind))]++;
  s.cables = topo.links().size() / 2;
  s.bisection = topo.bisection_bandwidth();
  s.tiers = topo.tier_table();
  double nic = 0;
  for (int g = 0; g < topo.num_gpus(); ++g) {
    const double share = topo.nic_share_bandwidth(g).value();
    if (share > 0) nic = nic == 0 ? share : std::min(nic, share);
  }
  for (const topology::CutTier& t : topology::compute_fabric_cuts(topo).tiers) {
    TopoSummary::Cut c;
    c.tier = t.tier;
    c.parts = t.classes;
    c.nic_per_gpu = nic;
    c.min_gpus = *std::min_element(t.gpus.begin(), t.gpus.end());
    c.max_gpus = *std::max_element(t.gpus.begin(), t.gpus.end());
    c.min_out_per_gpu = -1;
    for (int k = 0; k < t.classes; ++k) {
      const double per_gpu = std::min(t.egress[k], t.ingress[k]) / t.gpus[k];
      if (c.min_out_per_gpu < 0 || per_gpu < c.min_out_per_gpu) c.min_out_per_gpu = per_gpu;
    }
    s.cuts.push_back(c);
  }
  return s;
}

// Where a figure came from: the scenario's own key or the hardware catalog's default
// (topology/gpu_catalog.hpp). A calibration file rescales links and interference in the
// simulating commands, not here.
std::string source_of(bool from_scenario) { return from_scenario ? "scenario" : "catalog"; }

// The compute slow-down beside communication the engines use without a calibration.
double interference_of(const Scenario& sc, const topology::Topology& topo) {
  return sc.engine.interference.value_or(topology::default_interference(topo.gpu()));
}

// The GEMM ceiling's origin: the catalog's measured figure, or the generic one where the GPU or
// dtype has no measurement (topology::default_gemm_ceiling).
std::string gemm_ceiling_source(const Scenario& sc) {
  const bool measured = topology::default_gemm_ceiling(sc.cluster.gpu, sc.model.dtype) !=
                        topology::kGemmCeilingUnmeasured;
  return measured ? "catalog: measured maximum matmul rate" : "default: no measurement";
}

// The per-peer connection costs the engines charge (strategies::scenario_network_params): the
// scenario's engine keys, else the NIC model's queue-pair cache.
struct PeerCosts {
  int cache = 0;
  Seconds miss{0};
  std::string source;
};
PeerCosts peer_costs_of(const Scenario& sc) {
  const collectives::NetworkParams net = strategies::scenario_network_params(sc);
  const bool own = sc.engine.peer_cache.has_value() || sc.engine.peer_miss_overhead.has_value();
  return {net.peer_cache, Seconds(net.peer_miss_overhead_s), source_of(own)};
}

nlohmann::ordered_json to_json(const Scenario& sc, const topology::Topology& topo,
                               const TopoSummary& s) {
  nlohmann::ordered_json j;
  j["scenario"] = sc.name;
  j["gpu"] = topo.gpu().name;
  j["gpus"] = topo.num_gpus();
  j["nodes"] = topo.num_nodes();
  j["gpus_per_node"] = topo.gpus_per_node();
  j["intra_node"] = std::string(intra_kind_name(topo.spec().intra.kind));
  j["inter_node"] = std::string(inter_kind_name(topo.spec().inter.kind));
  const auto& spec = topo.spec();
  if (spec.inter.kind != InterKind::kCustom) {
    j["intra_bandwidth_Bps"] = spec.intra.bandwidth.value();
    j["intra_nominal_Bps"] = spec.intra.nominal_bandwidth.value();
    j["intra_efficiency"] = spec.intra.efficiency;
    j["intra_efficiency_source"] = source_of(sc.cluster.intra.efficiency > 0);
    if (spec.inter.kind != InterKind::kNone) {
      j["nic_bandwidth_Bps"] = spec.inter.nic_bandwidth.value();
      j["nic_nominal_Bps"] = spec.inter.nominal_nic_bandwidth.value();
      j["nic_efficiency"] = spec.inter.nic_efficiency;
      j["nic_efficiency_source"] = source_of(sc.cluster.inter.nic_efficiency > 0);
      if (const topology::NicModel* nic = topology::cluster_nic(sc.cluster)) {
        j["nic"] = std::string(nic->name);
        j["nic_source"] = source_of(!sc.cluster.inter.nic.empty());
      }
    }
  }
  const PeerCosts peers = peer_costs_of(sc);
  j["message_overhead_s"] = sc.engine.message_overhead.value();
  j["peer_cache"] = peers.cache;
  j["peer_miss_overhead_s"] = peers.miss.value();
  j["peer_source"] = peers.source;
  j["sms"] = topo.gpu().sms;
  j["l2_cache_bytes"] = topo.gpu().l2_cache.value();
  j["interference"] = interference_of(sc, topo);
  j["interference_source"] = source_of(sc.engine.interference.has_value());
  j["gemm_ceiling"] = strategies::scenario_gemm_ceiling(sc);
  j["gemm_ceiling_source"] = gemm_ceiling_source(sc);
  if (!sc.cluster.calibration_path.empty()) j["calibration"] = sc.cluster.calibration_path;
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  for (const auto& [k, n] : s.vertex_counts) counts[k] = n;
  j["vertices"] = counts;
  j["links"] = s.cables;
  j["directed_links"] = topo.links().size();
  j["gpus_per_nic"] = topo.gpus_per_nic();
  j["bisection_bandwidth_Bps"] = s.bisection.value();
  auto& tiers = j["tiers"] = nlohmann::ordered_json::array();
  for (const auto& t : s.tiers) {
    tiers.push_back({{"tier", t.tier},
                     {"pairs", t.pairs},
                     {"min_hops", t.min_hops},
                     {"max_hops", t.max_hops},
                     {"min_alpha_s", t.min_alpha.value()},
                     {"max_alpha_s", t.max_alpha.value()},
                     {"min_bandwidth_Bps", t.min_bandwidth.value()},
                     {"max_bandwidth_Bps", t.max_bandwidth.value()}});
  }
  auto& cuts = j["cuts"] = nlohmann::ordered_json::array();
  for (const auto& c : s.cuts) {
    cuts.push_back({{"tier", c.tier},
                    {"parts", c.parts},
                    {"min_gpus_per_part", c.min_gpus},
                    {"max_gpus_per_part", c.max_gpus},
                    {"min_out_per_gpu_Bps", c.min_out_per_gpu},
                    {"nic_per_gpu_Bps", c.nic_per_gpu}});
  }
  return j;
}

template <typename T>
std::string range_str(T lo, T hi) {
  return lo == hi ? to_string(lo) : to_string(lo) + " .. " + to_string(hi);
}

void print_table(const Scenario& sc, const topology::Topology& topo, const TopoSummary& s) {
  const auto& spec = topo.spec();
  fmt::print("scenario    {}\n", sc.name);
  fmt::print("gpus        {} x {} = {} nodes x {} per node\n", topo.num_gpus(), topo.gpu().name,
             topo.num_nodes(), topo.gpus_per_node());
  if (spec.inter.kind == InterKind::kCustom) {
    fmt::print("wiring      custom: {} vertices and {} links given in the scenario\n",
               spec.custom ? spec.custom->vertices.size() : 0,
               spec.custom ? spec.custom->links.size() : 0);
  } else {
    fmt::print("intra-node  {}, {} per GPU per direction ({} x {:.2f}, {}), latency {}\n",
               intra_kind_name(spec.intra.kind), to_string(spec.intra.bandwidth),
               to_string(spec.intra.nominal_bandwidth), spec.intra.efficiency,
               source_of(sc.cluster.intra.efficiency > 0), to_string(spec.intra.latency));
    if (spec.inter.kind == InterKind::kNone)
      fmt::print("inter-node  none\n");
    else
      fmt::print("inter-node  {}, {} NIC(s) per node at {} ({} x {:.2f}, {}), latency {}\n",
                 inter_kind_name(spec.inter.kind), spec.inter.nics_per_node,
                 to_string(spec.inter.nic_bandwidth), to_string(spec.inter.nominal_nic_bandwidth),
                 spec.inter.nic_efficiency, source_of(sc.cluster.inter.nic_efficiency > 0),
                 to_string(spec.inter.latency));
    if (const topology::NicModel* nic = topology::cluster_nic(sc.cluster))
      fmt::print("nic         {}: {} ({})\n", nic->name, nic->description,
                 source_of(!sc.cluster.inter.nic.empty()));
  }
  const PeerCosts peers = peer_costs_of(sc);
  fmt::print("messages    {} per message; {}\n", to_string(sc.engine.message_overhead),
             peers.cache > 0
                 ? fmt::format("{} peers' connection state kept hot per GPU, {} more per message "
                               "to any other ({})",
                               peers.cache, to_string(peers.miss), peers.source)
                 : fmt::format("no per-peer cost ({})", peers.source));
  fmt::print("compute     interference {:.3f} beside communication ({}{})\n",
             interference_of(sc, topo), source_of(sc.engine.interference.has_value()),
             sc.engine.interference ? ""
             : topo.gpu().sms > 0   ? fmt::format(": {} of {} SMs run communication",
                                                  topology::kCommunicationSms, topo.gpu().sms)
                                    : ": SM count unknown");
  fmt::print("            large {} GEMMs at {:.3f} of the dense peak ({})\n",
             dtype_name(sc.model.dtype), strategies::scenario_gemm_ceiling(sc),
             gemm_ceiling_source(sc));
  if (topo.gpu().l2_cache.value() > 0)
    fmt::print("            L2 {} ({}): a batched GEMM's items re-read shared weights from it\n",
               to_string(topo.gpu().l2_cache), source_of(!topo.gpu().from_catalog));
  if (!sc.cluster.calibration_path.empty())
    fmt::print("calibration {} replaces these figures where it measured them\n",
               sc.cluster.calibration_path);
  std::string counts;
  for (const auto& [k, n] : s.vertex_counts)
    counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", n, k);
  fmt::print("vertices    {}\n", counts);
  fmt::print("links       {} full-duplex ({} directed)\n", s.cables, topo.links().size());
  fmt::print("bisection   {} per direction (ranks 0..{} | {}..{})\n", to_string(s.bisection),
             topo.num_gpus() / 2 - 1, topo.num_gpus() / 2, topo.num_gpus() - 1);
  fmt::print("\n{:>4}  {:>12}  {:>5}  {:>18}  {:>22}\n", "tier", "pairs", "hops", "alpha",
             "bandwidth");
  for (const auto& t : s.tiers) {
    std::string hops = t.min_hops == t.max_hops ? fmt::format("{}", t.min_hops)
                                                : fmt::format("{}-{}", t.min_hops, t.max_hops);
    fmt::print("{:>4}  {:>12}  {:>5}  {:>18}  {:>22}\n", t.tier, t.pairs, hops,
               range_str(t.min_alpha, t.max_alpha), range_str(t.min_bandwidth, t.max_bandwidth));
  }
  if (s.cuts.empty()) return;
  // Oversubscription as the analytical engine charges it: traffic leaving a part shares its
  // uplinks; "x:1" is a GPU's NIC share over its part's uplink bandwidth per GPU.
  fmt::print("\n{:>4}  {:>8}  {:>11}  {:>16}  {:>14}\n", "cut", "parts", "GPUs/part",
             "uplink per GPU", "vs NIC share");
  for (const auto& c : s.cuts) {
    const std::string gpus = c.min_gpus == c.max_gpus
                                 ? fmt::format("{}", c.min_gpus)
                                 : fmt::format("{}-{}", c.min_gpus, c.max_gpus);
    const std::string ratio = c.nic_per_gpu > 0 && c.min_out_per_gpu > 0
                                  ? fmt::format("{:.2f}:1", c.nic_per_gpu / c.min_out_per_gpu)
                                  : std::string("-");
    fmt::print("{:>4}  {:>8}  {:>11}  {:>16}  {:>14}\n", c.tier, c.parts, gpus,
               to_string(BytesPerSecond(c.min_out_per_gpu)), ratio);
  }
}

}  // namespace

void register_topo(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("topo", "Topology summary: counts, bisection, per-tier alpha/beta");
  auto scenario = std::make_shared<std::string>();
  auto json_path = std::make_shared<std::string>();
  auto dot_path = std::make_shared<std::string>();
  auto ta_moe = std::make_shared<bool>(false);
  cmd->add_option("scenario", *scenario, "Scenario YAML (default: scenarios/quickstart.yaml)");
  auto sets = std::make_shared<std::vector<std::string>>();
  add_set_option(cmd, sets.get());
  cmd->add_option("--json", *json_path, "Write the summary as JSON to this file");
  cmd->add_option("--dot", *dot_path, "Write the graph in GraphViz DOT format to this file");
  cmd->add_flag("--ta-moe", *ta_moe,
                "Also print the TA-MoE target share per tier and the predicted all-to-all time "
                "of even vs target dispatch");
  cmd->callback([=] {
    check_output_paths({{"--json", *json_path}, {"--dot", *dot_path}});
    std::string path = scenario->empty() ? default_scenario_path() : *scenario;
    Scenario sc = load_scenario_with(path, *sets);
    auto topo = topology::build_topology(sc.cluster);
    TopoSummary s = summarize(*topo);
    print_table(sc, *topo, s);
    std::string ta_moe_json;
    if (*ta_moe) print_ta_moe(sc, *topo, &ta_moe_json);
    if (!json_path->empty()) {
      auto j = to_json(sc, *topo, s);
      if (*ta_moe) j["ta_moe"] = nlohmann::ordered_json::parse(ta_moe_json);
      write_file_atomic(*json_path, [&](std::ostream& os) { os << j.dump(2) << "\n"; });
    }
    if (!dot_path->empty())
      write_file_atomic(*dot_path, [&](std::ostream& os) { topology::write_dot(*topo, os); });
  });
}

}  // namespace moesim::app
