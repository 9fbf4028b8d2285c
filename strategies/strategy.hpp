// The strategy stack (docs/design.md §1, §6; docs/strategy-specs.md §2-§4). A strategy entry of the
// scenario composes one module per role (layout, parallel, pipeline, a2a, ...); every iteration the
// stack asks each module in turn to fill its part of the Decision, and after the backend ran the
// plan it shows every module the measured IterationRecord, so adaptive modules (Tutel's online
// search) learn in simulation and on real GPUs alike.
//
// Module order (fixed, because later roles read earlier choices): layout, parallel, pipeline,
// a2a, schedule. The pipeline module may also set the a2a algorithm (tutel_online searches
// (r, algo) pairs; pipemoe with a2a: auto optimises both); the a2a module then only resolves
// what is still open.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/scenario.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/decision.hpp"
#include "strategies/runner.hpp"

namespace moesim::topology {
class Topology;
}
namespace moesim::workload {
struct IterationWorkload;
}

namespace moesim::strategies {

/// What a module may read when it decides (one iteration) or observes (after the run).
struct StrategyContext {
  const Scenario& scenario;
  const StrategySpec& spec;
  const topology::Topology& topo;
  const CostModel& cost;
  int iteration = 0;
  double capacity_factor = 0;  // f in force this iteration
  /// dC at f before rounding to the pipeline degree (for dropless f <= 0: the sampled value).
  std::int64_t capacity = 0;
  /// Earlier iterations of this run, oldest first.
  const std::vector<IterationRecord>* history = nullptr;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  /// "pipemoe", "tutel_online", ... (for logs and errors).
  virtual std::string_view name() const = 0;
  /// Fills this module's part of `decision`. Throws InputError when the spec cannot apply to the
  /// scenario (naming the strategy entry's location and role key).
  virtual void decide(const StrategyContext& ctx, Decision& decision) = 0;
  /// The backend's result of the decision taken this iteration. Default: nothing to learn.
  virtual void observe(const StrategyContext& ctx, const IterationRecord& record) {
    (void)ctx;
    (void)record;
  }
  /// Routing modules (docs/strategy-specs.md §8) reshape this iteration's sampled counts after
  /// decide() and before the plan is built. Default: the gate's routing stands.
  virtual void route(const StrategyContext& ctx, const Decision& decision,
                     workload::IterationWorkload& work) {
    (void)ctx;
    (void)decision;
    (void)work;
  }
};

/// The composed modules of one StrategySpec, in role order; itself a Strategy.
class StrategyStack final : public Strategy {
 public:
  explicit StrategyStack(std::vector<std::unique_ptr<Strategy>> modules)
      : modules_(std::move(modules)) {}
  std::string_view name() const override { return "stack"; }
  void decide(const StrategyContext& ctx, Decision& decision) override;
  void observe(const StrategyContext& ctx, const IterationRecord& record) override;
  void route(const StrategyContext& ctx, const Decision& decision,
             workload::IterationWorkload& work) override;
  const std::vector<std::unique_ptr<Strategy>>& modules() const { return modules_; }

 private:
  std::vector<std::unique_ptr<Strategy>> modules_;
};

/// One module per role of `spec` (roles left out take their baseline module).
std::unique_ptr<StrategyStack> make_stack(const StrategySpec& spec);

/// InputError at the strategy entry's `role` key ("strategies[i].pipeline" when the scenario
/// knows where the entry is).
[[noreturn]] void throw_role_error(const StrategyContext& ctx, std::string_view role,
                                   const std::string& message);

}  // namespace moesim::strategies
