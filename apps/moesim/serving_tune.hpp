// `moesim tune` on a serving deployment (docs/serving.md, "Tuning for an SLO"): the pool shapes
// (nodes per instance, EP degree) and, disaggregated, the split of the deployment's nodes between
// prefill and decode that serve its requests within its SLO with the most goodput per node. A
// budgeted search: the scenario's own shape first, then shapes that change one setting, then
// more; every candidate is a full serving run of every strategy. An SLO no candidate meets is an
// outcome (reported, exit 0), not an error.
#pragma once

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/moesim/sweep.hpp"

namespace moesim::app {

struct ServingTuneOptions {
  double budget_s = 60;     // wall clock; runs in flight when it is spent still finish
  double attainment = 0.9;  // share of requests within the SLO a candidate must reach
  int top = 10;             // rows printed
  int jobs = 0;             // runs in parallel; 0: one per hardware thread
  bool progress = true;
};

/// One candidate shape with one strategy.
struct ServingTuneRow {
  std::string shape;               // "instance 1 node x 2, ep 8" / "prefill ..., decode ..."
  std::vector<std::string> edits;  // --set edits from the scenario to this shape
  int changes = 0;                 // settings that differ from the scenario's
  std::string strategy;
  int nodes = 0;  // nodes the shape uses
  ServingRowFigures figures;
  double goodput_per_node = 0;  // requests/s within the SLO, per node used
  bool meets = false;           // figures.slo_attainment >= the target
};

struct ServingTuneResult {
  std::string scenario;
  double slo_ttft_s = 0, slo_tpot_s = 0, attainment = 0;
  int shapes = 0;   // candidate shapes generated
  int run = 0;      // shapes run
  int refused = 0;  // shapes the scenario's rules refuse (ep not dividing the experts, KV, ...)
  std::vector<std::string> refused_examples;  // the first few, with the loader's message
  bool budget_spent = false;
  // Meeting the SLO first, then goodput per node, then SLO attainment.
  std::vector<ServingTuneRow> ranked;
  bool met() const { return !ranked.empty() && ranked.front().meets; }
};

/// Runs the search on the scenario `tree` (read from `path`, with the --set edits `sets`). The
/// scenario must have `serving:` with an SLO (InputError at serving.slo otherwise).
ServingTuneResult tune_serving(const YAML::Node& tree, const std::string& path,
                               const std::vector<std::string>& sets, const ServingTuneOptions& o);

void print_serving_tune(const ServingTuneResult& r, int top);
nlohmann::ordered_json serving_tune_json(const ServingTuneResult& r);
std::string serving_tune_csv(const ServingTuneResult& r);
/// The scenario with the best shape's edits (after the --set edits), as YAML.
std::string serving_tuned_yaml(const YAML::Node& tree, const std::vector<std::string>& sets,
                               const ServingTuneRow& best);

}  // namespace moesim::app
