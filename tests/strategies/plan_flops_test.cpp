// The plan's FLOPs per token against Megatron's model-FLOPs accounting (strategies/model_flops),
// on the bundled model presets: the operator-level blocks must do the work the model needs, no
// more (padding aside) and no less. The routed deepep dispatch is used so that the expert GEMMs
// run on the tokens really routed (rank_scale), not on dropless buffers padded to the largest
// expert's count.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "apps/moesim/engine_setup.hpp"
#include "core/scenario_loader.hpp"
#include "sim/engine.hpp"
#include "strategies/model_flops.hpp"
#include "strategies/runner.hpp"

namespace moesim::strategies {
namespace {

struct PlanFlops {
  double model = 0;       // the model's FLOPs (GEMMs and the attention core), per token
  double recomputed = 0;  // replayed forward kernels, per token
};

PlanFlops plan_flops_per_token(const std::string& preset) {
  Scenario sc =
      load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/models/" + preset + ".yaml");
  sc.model.micro_batches = 1;  // the same work per token, one instance of each op
  sc.workload.iterations = 1;
  StrategySpec spec;
  spec.name = "deepep";
  spec.a2a = A2aRole::kDeepep;
  sc.strategies = {spec};
  const auto topo = app::simulation_topology(sc);
  sim::EngineConfig cfg = app::engine_config_from(sc, "analytical");
  const Backend backend = [&](const Plan& p) { return sim::run_plan(p, *topo, cfg); };
  const StackRun run = run_stack(sc, spec, *topo, backend, 1);
  PlanFlops out;
  for (const Op& op : run.last_plan.plan.ops()) {
    if (op.kind != OpKind::kCompute) continue;
    const ComputeSpec& c = op.compute();
    // Megatron counts the linear layers and the attention core; not the router's GEMM.
    if (c.cls != ComputeClass::kGemm && c.cls != ComputeClass::kAttention) continue;
    double ranks = 0;
    for (int i = 0; i < op.ranks.size(); ++i)
      ranks += c.rank_scale ? (*c.rank_scale)[static_cast<std::size_t>(i)] : 1.0;
    (c.recompute ? out.recomputed : out.model) += c.flops.value() * ranks;
  }
  const double tokens = static_cast<double>(tokens_per_step(sc));
  out.model /= tokens;
  out.recomputed /= tokens;
  return out;
}

TEST(PlanFlops, PresetsMatchMegatronsModelFlopsWithinFivePercent) {
  for (const std::string preset : {"mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"}) {
    const Scenario sc =
        load_scenario(std::string(MOESIM_SOURCE_DIR) + "/scenarios/models/" + preset + ".yaml");
    const double megatron = model_flops(sc.model).training();
    const PlanFlops plan = plan_flops_per_token(preset);
    RecordProperty(preset + "_plan_gflops_per_token", fmt::format("{:.2f}", plan.model / 1e9));
    RecordProperty(preset + "_megatron_gflops_per_token", fmt::format("{:.2f}", megatron / 1e9));
    EXPECT_NEAR(plan.model / megatron, 1.0, 0.05)
        << preset << ": plan " << plan.model << " vs Megatron " << megatron << " FLOPs/token";
    // Recomputation adds work the model FLOPs do not count (DeepSeek-V3's MLA up-projections).
    if (preset == "deepseek-v3")
      EXPECT_GT(plan.recomputed, 0.0);
    else
      EXPECT_EQ(plan.recomputed, 0.0);
  }
}

}  // namespace
}  // namespace moesim::strategies
