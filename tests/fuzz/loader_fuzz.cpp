#include "tests/fuzz/loader_fuzz.hpp"

#include <string_view>

#include "apps/moesim/sweep.hpp"
#include "core/error.hpp"
#include "core/hf_config.hpp"
#include "core/scenario_loader.hpp"
#include "strategies/memory.hpp"
#include "strategies/plan_builder.hpp"
#include "strategies/runner.hpp"
#include "topology/topology.hpp"

namespace moesim::fuzz {

int scenario_input(const std::uint8_t* data, std::size_t size, const std::string& pseudo_file) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const Scenario sc = parse_scenario_string(text, pseudo_file);
    // Building a 4,096-GPU fabric takes ~0.1 s (Release) and 30x that under the sanitizers: past
    // kMaxBuiltGpus the input is checked by the loader only, so the fuzzer spends its time on
    // inputs, not on building large fabrics that the bundled scenarios' tests already build.
    if (sc.num_gpus() > kMaxBuiltGpus) return 0;
    const auto topo = topology::build_topology(sc.cluster);
    for (const auto& spec : sc.strategies) {
      const auto d = strategies::first_decision(sc, spec, *topo, strategies::nominal_capacity(sc));
      (void)strategies::estimate_memory(
          sc, d, strategies::nominal_capacity(sc, strategies::capacity_multiple(sc, d)));
    }
    return 0;
  } catch (const InputError&) {
    return 2;
  }
}

int sweep_input(const std::uint8_t* data, std::size_t size, const std::string& pseudo_file) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const YAML::Node root = parse_yaml_string(text, pseudo_file);
    const app::SweepSpec spec = app::parse_sweep(root, pseudo_file);
    app::validate_sweep(spec);
    (void)app::base_scenario(spec);
    return 0;
  } catch (const InputError&) {
    return 2;
  }
}

int hf_config_input(const std::uint8_t* data, std::size_t size, const std::string& pseudo_file) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const HfImport imp = import_hf_config(text, pseudo_file);
    // The imported keys as a scenario's model, under the loader's own checks, on 8 GPUs with
    // EP over the node when the expert count allows it.
    YAML::Node root = YAML::Load(R"(name: hf-fuzz
cluster:
  gpu: h100-sxm
  nodes: 1
  gpus_per_node: 8
  intra_node: {kind: nvswitch}
  inter_node: {kind: none}
strategies:
  - {name: baseline}
)");
    YAML::Node model = YAML::Clone(imp.model);
    model["batch_per_gpu"] = 1;
    model["seq_len"] = 64;
    model["dtype"] = "bf16";
    root["model"] = model;
    const int experts = model["experts"] ? model["experts"].as<int>(0) : 0;
    root["parallelism"]["ep"] = experts > 0 && experts % 8 == 0 ? 8 : 1;
    root["parallelism"]["dp"] = "auto";
    const Scenario sc = parse_scenario(root, pseudo_file);
    const auto topo = topology::build_topology(sc.cluster);
    const auto d = strategies::first_decision(sc, sc.strategies.front(), *topo,
                                              strategies::nominal_capacity(sc));
    (void)strategies::estimate_memory(sc, d, strategies::nominal_capacity(sc));
    return 0;
  } catch (const InputError&) {
    return 2;
  }
}

}  // namespace moesim::fuzz
