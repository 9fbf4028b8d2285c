#include "core/scenario.hpp"

#include <fmt/format.h>

namespace moesim {

// The one table of known values per key. To add a role value (a new strategy module): add the
// enum value in scenario.hpp and a row here; the loader, its "did you mean" hints, describe_roles
// and the README's tables follow from these rows.

const std::vector<NamedValue<Mode>>& mode_names() {
  static const std::vector<NamedValue<Mode>> t = {{Mode::kTraining, "training"},
                                                  {Mode::kInference, "inference"}};
  return t;
}

const std::vector<NamedValue<AttentionKind>>& attention_kind_names() {
  static const std::vector<NamedValue<AttentionKind>> t = {{AttentionKind::kMha, "mha"},
                                                           {AttentionKind::kMla, "mla"}};
  return t;
}

const std::vector<NamedValue<FfnActivation>>& ffn_activation_names() {
  static const std::vector<NamedValue<FfnActivation>> t = {{FfnActivation::kGelu, "gelu"},
                                                           {FfnActivation::kSwiglu, "swiglu"}};
  return t;
}

const std::vector<NamedValue<RecomputeGranularity>>& recompute_granularity_names() {
  static const std::vector<NamedValue<RecomputeGranularity>> t = {
      {RecomputeGranularity::kNone, "none"},
      {RecomputeGranularity::kSelective, "selective"},
      {RecomputeGranularity::kFull, "full"}};
  return t;
}

// Megatron-Core's --recompute-modules spellings.
const std::vector<NamedValue<RecomputeModule>>& recompute_module_names() {
  static const std::vector<NamedValue<RecomputeModule>> t = {
      {RecomputeModule::kCoreAttn, "core_attn"},
      {RecomputeModule::kLayernorm, "layernorm"},
      {RecomputeModule::kMlaUpProj, "mla_up_proj"},
      {RecomputeModule::kMlp, "mlp"},
      {RecomputeModule::kMoeAct, "moe_act"},
      {RecomputeModule::kMoe, "moe"},
      {RecomputeModule::kSharedExperts, "shared_experts"}};
  return t;
}

const std::vector<NamedValue<PipelineSchedule>>& pipeline_schedule_names() {
  static const std::vector<NamedValue<PipelineSchedule>> t = {
      {PipelineSchedule::kOneFOneB, "1f1b"},
      {PipelineSchedule::kInterleaved, "interleaved"},
      {PipelineSchedule::kDualPipe, "dualpipe"}};
  return t;
}

const std::vector<NamedValue<GradBucketKind>>& grad_bucket_names() {
  static const std::vector<NamedValue<GradBucketKind>> t = {{GradBucketKind::kPytorch, "pytorch"},
                                                            {GradBucketKind::kMegatron, "megatron"},
                                                            {GradBucketKind::kBlock, "block"}};
  return t;
}

const std::vector<NamedValue<MpLayout>>& mp_layout_names() {
  static const std::vector<NamedValue<MpLayout>> t = {{MpLayout::kDisjoint, "disjoint"},
                                                      {MpLayout::kOverlapped, "overlapped"},
                                                      {MpLayout::kFolded, "folded"}};
  return t;
}

const std::vector<NamedValue<RoutingDistribution>>& routing_distribution_names() {
  static const std::vector<NamedValue<RoutingDistribution>> t = {
      {RoutingDistribution::kUniform, "uniform"},
      {RoutingDistribution::kZipf, "zipf"},
      {RoutingDistribution::kDirichlet, "dirichlet"},
      {RoutingDistribution::kTrace, "trace"},
      {RoutingDistribution::kCorrelated, "correlated"},
      {RoutingDistribution::kBalanced, "balanced"}};
  return t;
}

const std::vector<NamedValue<CapacityKind>>& capacity_kind_names() {
  static const std::vector<NamedValue<CapacityKind>> t = {
      {CapacityKind::kFixed, "fixed"},
      {CapacityKind::kTrace, "trace"},
      {CapacityKind::kRandomWalk, "random_walk"}};
  return t;
}

const std::vector<NamedValue<NetworkModelKind>>& network_model_names() {
  static const std::vector<NamedValue<NetworkModelKind>> t = {
      {NetworkModelKind::kAnalytical, "analytical"},
      {NetworkModelKind::kFlow, "flow"},
      {NetworkModelKind::kSimgrid, "simgrid"}};
  return t;
}

const std::vector<NamedValue<FlowSharingKind>>& flow_sharing_names() {
  static const std::vector<NamedValue<FlowSharingKind>> t = {
      {FlowSharingKind::kPerCollective, "per_collective"}, {FlowSharingKind::kPerFlow, "per_flow"}};
  return t;
}

const std::vector<NamedValue<SimgridModeKind>>& simgrid_mode_names() {
  static const std::vector<NamedValue<SimgridModeKind>> t = {
      {SimgridModeKind::kAuto, "auto"},
      {SimgridModeKind::kPerFlow, "per_flow"},
      {SimgridModeKind::kPtask, "ptask"}};
  return t;
}

const std::vector<NamedValue<RoutingRole>>& routing_role_names() {
  static const std::vector<NamedValue<RoutingRole>> t = {
      {RoutingRole::kEven, "even"},
      {RoutingRole::kTaMoe, "ta_moe"},
      {RoutingRole::kFasterMoeHir, "faster_moe_hir"}};
  return t;
}

const std::vector<NamedValue<ParallelRole>>& parallel_role_names() {
  static const std::vector<NamedValue<ParallelRole>> t = {
      {ParallelRole::kP1, "p1"},
      {ParallelRole::kP2, "p2"},
      {ParallelRole::kTutelRouter, "tutel_router"}};
  return t;
}

const std::vector<NamedValue<PipelineRole>>& pipeline_role_names() {
  static const std::vector<NamedValue<PipelineRole>> t = {
      {PipelineRole::kPipeMoe, "pipemoe"}, {PipelineRole::kTutelOnline, "tutel_online"}};
  return t;
}

const std::vector<NamedValue<A2aRole>>& a2a_role_names() {
  static const std::vector<NamedValue<A2aRole>> t = {{A2aRole::kLinear, "linear"},
                                                     {A2aRole::k2dh, "2dh"},
                                                     {A2aRole::k3dh, "3dh"},
                                                     {A2aRole::kDeepep, "deepep"},
                                                     {A2aRole::kAuto, "auto"}};
  return t;
}

const std::vector<NamedValue<LayoutRole>>& layout_role_names() {
  static const std::vector<NamedValue<LayoutRole>> t = {{LayoutRole::kPlain, "plain"},
                                                        {LayoutRole::kFlexible, "flexible"}};
  return t;
}

const std::vector<NamedValue<ScheduleRole>>& schedule_role_names() {
  static const std::vector<NamedValue<ScheduleRole>> t = {
      {ScheduleRole::kNone, "none"},          {ScheduleRole::kParmBaseline, "parm_baseline"},
      {ScheduleRole::kParmS1, "parm_s1"},     {ScheduleRole::kParmS2, "parm_s2"},
      {ScheduleRole::kParmAuto, "parm_auto"}, {ScheduleRole::kLina, "lina"},
      {ScheduleRole::kFair, "fair"},          {ScheduleRole::kBetweenA2a, "between_a2a"}};
  return t;
}

const std::vector<NamedValue<InferenceRole>>& inference_role_names() {
  static const std::vector<NamedValue<InferenceRole>> t = {{InferenceRole::kBaseline, "baseline"},
                                                           {InferenceRole::kLina, "lina"},
                                                           {InferenceRole::kIdeal, "ideal"}};
  return t;
}

namespace {
template <typename E>
std::string_view lookup(const std::vector<NamedValue<E>>& table, E v) {
  for (const auto& row : table)
    if (row.value == v) return row.name;
  return "?";
}
}  // namespace

std::string_view name_of(Mode v) { return lookup(mode_names(), v); }
std::string_view name_of(AttentionKind v) { return lookup(attention_kind_names(), v); }
std::string_view name_of(FfnActivation v) { return lookup(ffn_activation_names(), v); }
std::string_view name_of(RecomputeGranularity v) {
  return lookup(recompute_granularity_names(), v);
}
std::string_view name_of(RecomputeModule v) { return lookup(recompute_module_names(), v); }
std::string_view name_of(MpLayout v) { return lookup(mp_layout_names(), v); }
std::string_view name_of(PipelineSchedule v) { return lookup(pipeline_schedule_names(), v); }
std::string_view name_of(RoutingDistribution v) { return lookup(routing_distribution_names(), v); }
std::string_view name_of(CapacityKind v) { return lookup(capacity_kind_names(), v); }
std::string_view name_of(NetworkModelKind v) { return lookup(network_model_names(), v); }
std::string_view name_of(FlowSharingKind v) { return lookup(flow_sharing_names(), v); }
std::string_view name_of(SimgridModeKind v) { return lookup(simgrid_mode_names(), v); }
std::string_view name_of(RoutingRole v) { return lookup(routing_role_names(), v); }
std::string_view name_of(ParallelRole v) {
  return v == ParallelRole::kDegree ? "degree" : lookup(parallel_role_names(), v);
}
std::string_view name_of(PipelineRole v) {
  return v == PipelineRole::kDegree ? "degree" : lookup(pipeline_role_names(), v);
}
std::string_view name_of(A2aRole v) { return lookup(a2a_role_names(), v); }
std::string_view name_of(LayoutRole v) { return lookup(layout_role_names(), v); }
std::string_view name_of(ScheduleRole v) { return lookup(schedule_role_names(), v); }
std::string_view name_of(InferenceRole v) { return lookup(inference_role_names(), v); }

bool StrategySpec::is_baseline() const {
  return routing == RoutingRole::kEven &&
         (parallel == ParallelRole::kP1 ||
          (parallel == ParallelRole::kDegree && parallel_degree == 1)) &&
         pipeline == PipelineRole::kDegree && pipeline_degree == 1 && a2a == A2aRole::kLinear &&
         layout == LayoutRole::kPlain && schedule == ScheduleRole::kNone &&
         inference == InferenceRole::kBaseline;
}

std::string describe_roles(const StrategySpec& s) {
  std::string out;
  auto add = [&out](std::string_view role, const std::string& value) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}={}", role, value);
  };
  if (s.routing != RoutingRole::kEven) add("routing", std::string(name_of(s.routing)));
  if (s.parallel == ParallelRole::kDegree && s.parallel_degree != 1)
    add("parallel", std::to_string(s.parallel_degree));
  else if (s.parallel != ParallelRole::kP1 && s.parallel != ParallelRole::kDegree)
    add("parallel", std::string(name_of(s.parallel)));
  if (s.pipeline == PipelineRole::kDegree) {
    if (s.pipeline_degree != 1) add("pipeline", std::to_string(s.pipeline_degree));
  } else {
    add("pipeline", std::string(name_of(s.pipeline)));
  }
  if (s.a2a != A2aRole::kLinear) add("a2a", std::string(name_of(s.a2a)));
  if (s.layout != LayoutRole::kPlain) add("layout", std::string(name_of(s.layout)));
  if (s.schedule != ScheduleRole::kNone) add("schedule", std::string(name_of(s.schedule)));
  if (s.inference != InferenceRole::kBaseline) add("inference", std::string(name_of(s.inference)));
  return out.empty() ? "baseline" : out;
}

const StrategySpec* Scenario::find_strategy(std::string_view wanted) const {
  for (const auto& s : strategies)
    if (s.name == wanted) return &s;
  return nullptr;
}

Scenario Scenario::stage_scenario() const {
  if (parallelism.pp <= 1) return *this;
  const int stage = stage_gpus(), gpn = cluster.gpus_per_node;
  MOESIM_ASSERT(num_gpus() % parallelism.pp == 0 && (stage % gpn == 0 || gpn % stage == 0),
                "pipeline stages must be whole nodes or equal parts of one (the loader checks)");
  Scenario out = *this;
  out.parallelism.pp = 1;
  out.parallelism.vp = 1;
  out.parallelism.schedule = PipelineSchedule::kOneFOneB;
  out.parallelism.pipeline_layout.clear();  // one stage: its pieces are the caller's StageParts
  if (stage % gpn == 0) {
    out.cluster.nodes /= parallelism.pp;
    return out;
  }
  // Several stages per node: the stage is one node of `stage` GPUs with its share of the node's
  // NICs, so per-GPU NIC bandwidth (what the fabric cuts and NIC sharing price) stays the same.
  out.cluster.nodes = 1;
  out.cluster.gpus_per_node = stage;
  InterNodeSpec& inter = out.cluster.inter;
  const std::int64_t nic_share = static_cast<std::int64_t>(inter.nics_per_node) * stage;
  if (nic_share % gpn == 0) {
    inter.nics_per_node = static_cast<int>(nic_share / gpn);
  } else {  // a fraction of a NIC: one NIC of that share's bandwidth
    inter.nic_bandwidth = inter.nic_bandwidth * (static_cast<double>(nic_share) / gpn);
    inter.nics_per_node = 1;
  }
  return out;
}

std::pair<int, int> Scenario::stage_blocks(int stage) const {
  const int pp = parallelism.pp;
  MOESIM_ASSERT(stage >= 0 && stage < pp, "pipeline stage out of range");
  if (const auto& layout = parallelism.pipeline_layout; !layout.empty()) {
    MOESIM_ASSERT(static_cast<int>(layout.size()) == pp,
                  "a pipeline layout of pp pieces (the loader checks; interleaved: piece_blocks)");
    int first = 0;
    for (int s = 0; s < stage; ++s) first += layout[static_cast<std::size_t>(s)];
    return {first, first + layout[static_cast<std::size_t>(stage)]};
  }
  const int base = model.layers / pp, extra = model.layers % pp;
  const int first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

SourceLocation Scenario::location_of(const std::string& key_path) const {
  if (auto it = locations->find(key_path); it != locations->end()) return it->second;
  return SourceLocation{source_file, 0, 0};
}

}  // namespace moesim
