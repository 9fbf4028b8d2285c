// A scenario (docs/design.md §6): the cluster, the MoE model, how it is parallelised, the workload
// the gate produces, the simulation engine settings, and the strategy stacks to compare. Plain data
// filled and validated by core/scenario_loader; every other layer reads it, never YAML.
//
// After loading, every field holds a resolved, validated value (dp and ep resolved from `auto`,
// experts and experts-per-GPU both filled, relative paths made absolute), so consumers do not
// repeat the schema's defaulting rules. `locations` keeps where each key was written, so later
// layers (topology, strategies) can raise InputError at the offending line.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/cluster_spec.hpp"
#include "core/error.hpp"
#include "core/serving_spec.hpp"
#include "core/units.hpp"

namespace moesim {

/// One row of a name table: the YAML spelling of an enum value. The tables live in scenario.cpp
/// (one place), so a later issue adds a role value by adding an enum value and a row.
template <typename E>
struct NamedValue {
  E value;
  std::string_view name;
};

// ---------------------------------------------------------------------------------------------
// model:

enum class Mode { kTraining, kInference };

// model.attention: the head layout of the attention projections and core (docs/model.md,
// "Attention"). MHA / GQA: heads query heads of head_dim, kv_heads key/value heads (GQA when
// kv_heads < heads). MLA (DeepSeek-V2/V3): queries and keys/values projected through low-rank
// latents (q_lora_rank, 0 = queries projected from M directly; kv_lora_rank), per-head q/k of
// qk_nope_head_dim + qk_rope_head_dim, values of v_head_dim. Absent from the file: MHA with
// head_dim 128 (M / 128 heads) when 128 divides M, else one head of width M.
enum class AttentionKind { kMha, kMla };

struct AttentionSpec {
  AttentionKind kind = AttentionKind::kMha;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  // A causal mask (decoder LMs): the core's FLOPs are half of the full L x L product, as
  // FlashAttention skips the masked blocks and Megatron counts them.
  bool causal = true;

  bool is_mla() const { return kind == AttentionKind::kMla; }
  /// Width of one query / key head (MLA: nope + rope) and of one value head.
  int qk_head_dim() const { return is_mla() ? qk_nope_head_dim + qk_rope_head_dim : head_dim; }
  int value_head_dim() const { return is_mla() ? v_head_dim : head_dim; }
  /// Key/value heads the core reads (MLA: every query head has its own after the up-projection).
  int core_kv_heads() const { return is_mla() ? heads : kv_heads; }
};

// The FFN's activation. gelu: fc1 M -> H, activation, fc2 H -> M (2 M H weights). swiglu (Llama,
// Mixtral, Qwen, DeepSeek): fc1 M -> 2H (gate and up projections fused, as Megatron does), the
// SiLU-gated product to H, fc2 H -> M (3 M H weights); H is the published intermediate size.
enum class FfnActivation { kGelu, kSwiglu };

// model.precision: what each part of the step computes and moves in (docs/model.md,
// "Precision"). Every field defaults to model.dtype. gemm fp8 runs the GEMMs on the GPU's fp8
// peak (refused on GPUs without fp8 tensor cores) and keeps their inputs for backward in fp8
// (TransformerEngine and DeepSeek cache the cast copy); dispatch fp8 sends tokens as fp8 with one
// fp32 scale per 128 elements (DeepEP); main_grads is the dtype gradients are accumulated and
// reduced in (Megatron: fp32 by default, bf16 with --grad-reduce-in-bf16); moments is the dtype
// of Adam's two moments (fp32 by default; bf16 as DeepSeek-V3 and Megatron's precision-aware
// optimizer with --exp-avg-dtype / --exp-avg-sq-dtype bf16 keep them).
struct PrecisionSpec {
  Dtype gemm = Dtype::kFp16;
  Dtype dispatch = Dtype::kFp16;
  Dtype combine = Dtype::kFp16;
  Dtype main_grads = Dtype::kFp16;
  Dtype moments = Dtype::kFp32;
};

// model.recompute (Megatron's --recompute-granularity / --recompute-modules): activations not
// kept for backward are recomputed from a checkpoint, and the recomputed forward is in the plan.
// full: each block keeps only its input; selective: the listed modules' internals are dropped.
enum class RecomputeGranularity { kNone, kSelective, kFull };
enum class RecomputeModule {
  kCoreAttn,
  kLayernorm,
  kMlaUpProj,
  kMlp,
  kMoeAct,
  kMoe,
  kSharedExperts
};

struct RecomputeSpec {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  std::vector<RecomputeModule> modules;  // selective only; Megatron's default [core_attn]
  bool has(RecomputeModule m) const {
    return granularity == RecomputeGranularity::kSelective &&
           std::find(modules.begin(), modules.end(), m) != modules.end();
  }
  bool full() const { return granularity == RecomputeGranularity::kFull; }
};

struct ModelSpec {
  Mode mode = Mode::kTraining;
  int layers = 1;     // transformer blocks
  int moe_every = 1;  // every n-th block's FFN is an MoE layer (blocks n, 2n, ...)
  // The first K blocks are dense (DeepSeek-V3's first_k_dense_replace = 3); moe_every counts from
  // block K on: block l >= K is MoE when (l - K + 1) % moe_every == 0.
  int first_dense_layers = 0;
  int batch_per_gpu = 0;  // B, samples per GPU
  int seq_len = 0;        // L, tokens per sample
  int model_dim = 0;      // M
  int hidden_dim = 0;     // H, expert FFN hidden size (YAML `expert_hidden_dim` or `hidden_dim`)
  // Dense FFN hidden size of the blocks without an MoE FFN (YAML `dense_hidden_dim`); 0 means the
  // GPT/Megatron convention 4 M. Fine-grained MoE models use an expert H far below it (DeepSeek-V3:
  // 2,048 per expert, 18,432 dense).
  int dense_hidden_dim = 0;
  // Shared experts (DeepSeek-MoE, DeepSeek-V2/V3): N always-active experts of width hidden_dim
  // each, computed on every token beside the routed ones (one FFN of hidden N*H), their output
  // added at the decode. Their weights are dense parameters (replicated, all-reduced over DP).
  int shared_experts = 0;
  // Vocabulary (0: no embedding or LM head, the step is the blocks alone). With V > 0 the step
  // starts with the token embedding and ends with the LM head GEMM and the loss, split over mp
  // (Megatron's vocab-parallel layers); tie_embeddings: one V x M matrix for both (GPT-2), whose
  // gradient is complete only after the embedding's backward; untied (Mixtral, Qwen3, DeepSeek-V3):
  // the LM head's gradient is all-reduced as soon as its backward ran, at the start of backward.
  int vocab_size = 0;
  bool tie_embeddings = true;
  // Micro-batches per step (Megatron's gradient accumulation steps): a step runs m forward and
  // backward passes of batch_per_gpu x seq_len tokens per GPU each and all-reduces the gradients
  // once, after the last. With parallelism.pp > 1 they flow through the stages under a 1F1B
  // schedule (strategies/plan_builder.hpp, "Pipeline stages").
  int micro_batches = 1;
  // Multi-token prediction (DeepSeek-V3's MTP of depth D; Megatron's mtp_num_layers): D modules
  // after the last block, on the stage that holds the LM head, in training only. Module k
  // normalises the previous depth's hidden states and the embeddings of the tokens k + 1 ahead,
  // projects their concatenation 2M -> M, runs one block (an MoE FFN when the model's last block
  // has one) and the shared LM head with a loss of its own.
  int mtp_layers = 0;
  // Global experts E and local experts per GPU (the EP group is parallelism.ep GPUs). Exactly one
  // of `experts` / `experts_per_gpu` is written in the file; the loader fills both:
  // experts_per_gpu >= 1: E = experts_per_gpu * ep;
  // experts_per_gpu = -x: each expert is sharded over x GPUs, E = ep / x.
  int experts = 0;
  int experts_per_gpu = 0;
  int top_k = 2;
  // docs/strategy-specs.md §1: f > 0 fixed factor; f = 0 dropless (capacity = the largest
  // demand of any (GPU, expert) pair); f < 0 dropless but capped at -f.
  double capacity_factor = 1.0;
  Dtype dtype = Dtype::kFp16;
  AttentionSpec attention;
  FfnActivation activation = FfnActivation::kGelu;
  PrecisionSpec precision;
  RecomputeSpec recompute;
  // A serving iteration (strategies/serving/serving_engine.hpp sets these; no YAML key): the
  // batch's tokens belong to independent requests that attend to their own KV caches, not to one
  // sequence of seq_len. Per GPU: the query-key pairs of decode queries and of prefill chunks'
  // queries, and the KV tokens the core reads from HBM (in serving_kv_dtype). All 0: the
  // training-shaped core (seq_len queries x seq_len keys).
  double serving_decode_pairs = 0;
  double serving_prefill_pairs = 0;
  double serving_kv_read_tokens = 0;
  Dtype serving_kv_dtype = Dtype::kFp16;
  bool serving_iteration() const {
    return serving_decode_pairs > 0 || serving_prefill_pairs > 0 || serving_kv_read_tokens > 0;
  }

  /// GPUs one expert is sharded over (x for experts_per_gpu = -x, else 1).
  int expert_shards() const { return experts_per_gpu < 0 ? -experts_per_gpu : 1; }
  /// Whole or partial experts held by one GPU (1 when sharded).
  int local_experts() const { return experts_per_gpu < 0 ? 1 : experts_per_gpu; }
  /// S = B * L, tokens per GPU per iteration.
  std::int64_t tokens_per_gpu() const {
    return static_cast<std::int64_t>(batch_per_gpu) * static_cast<std::int64_t>(seq_len);
  }
  /// MoE layers in the model: blocks K + moe_every - 1, K + 2*moe_every - 1, ... below `layers`
  /// (K = first_dense_layers; 1-based: blocks moe_every, 2*moe_every, ... when K = 0).
  /// MTP modules (model.mtp_layers) run: training only (inference drops them).
  int mtp_blocks() const { return mode == Mode::kTraining ? mtp_layers : 0; }
  /// Blocks a step runs: the model's `layers`, then the MTP modules' blocks (indices layers ...).
  int num_blocks() const { return layers + mtp_blocks(); }
  /// MoE layers a step runs: the model's (blocks K + moe_every - 1, K + 2*moe_every - 1, ...
  /// below `layers`; K = first_dense_layers) and the MTP blocks' when the last block is MoE.
  int num_moe_layers() const {
    const int main = std::max(0, layers - first_dense_layers) / moe_every;
    return main + (layers > 0 && is_moe_block(layers - 1) ? mtp_blocks() : 0);
  }
  /// Whether block l (0-based; l >= layers: an MTP block, MoE like the last block) has an MoE FFN.
  bool is_moe_block(int l) const {
    if (l >= layers) return layers > 0 && is_moe_block(layers - 1);
    return l >= first_dense_layers && (l - first_dense_layers + 1) % moe_every == 0;
  }
  /// The MoE layer index of block l (0-based, counting MoE blocks only); -1 for a dense block.
  int moe_layer_of_block(int l) const {
    if (!is_moe_block(l)) return -1;
    if (l >= layers) return moe_layer_of_block(layers - 1) + (l - layers + 1);
    return (l - first_dense_layers + 1) / moe_every - 1;
  }
  bool capacity_is_dropless() const { return capacity_factor <= 0.0; }
  int bytes_per_element() const { return dtype_bytes(dtype); }
  bool swiglu() const { return activation == FfnActivation::kSwiglu; }
  /// Width of fc1's output for an FFN of hidden size h: 2h for SwiGLU (gate and up), else h.
  std::int64_t fc1_width(std::int64_t h) const { return swiglu() ? 2 * h : h; }
  /// Weights of an FFN of hidden size h: 3Mh for SwiGLU, 2Mh otherwise.
  std::int64_t ffn_params(std::int64_t h) const {
    return (swiglu() ? 3 : 2) * static_cast<std::int64_t>(model_dim) * h;
  }
  /// The dense FFN's hidden size: dense_hidden_dim, or 4 M when it is not set.
  std::int64_t dense_hidden() const {
    return dense_hidden_dim > 0 ? dense_hidden_dim : 4 * static_cast<std::int64_t>(model_dim);
  }
};

// ---------------------------------------------------------------------------------------------
// parallelism. Two ways to place the MP (tensor-parallel) ranks, docs/model.md "Rank layout":
//  disjoint (default): ep * esp * mp * dp = P, rank = ((d*ep + e)*esp + s)*mp + t; every MP rank
//    has an EP x ESP group of its own (the experts are replicated over MP).
//  overlapped (DeepSpeed-MoE, Parm): the MP ranks are the same GPUs as the EP x ESP ranks:
//    ep * esp * dp = P, rank = (d*ep + e)*esp + s for the MoE layer, and the MP groups are the
//    blocks of mp consecutive ranks (t = rank % mp), so mp must divide ep * esp.
//  folded (Megatron-Core's MoE parallel folding, Liu et al. 2025): two factorisations of the same
//    P / pp GPUs. Attention / dense: tp * cp * adp, rank = (a*cp + c)*tp + t (mp = tp); experts:
//    etp * ep * edp, rank = (d*ep + e)*etp + s (esp = etp, dp = edp), the overlapped formula.
//    A GPU holds S = batch_per_gpu * seq_len tokens of the residual stream (sequence parallel).

enum class MpLayout { kDisjoint, kOverlapped, kFolded };
// The order pipeline stages run their micro-batches in (docs/model.md, "Pipeline stages").
enum class PipelineSchedule { kOneFOneB, kInterleaved, kDualPipe };

// parallelism.grad_bucket: how backward groups the dense gradients into all-reduces (docs/model.md,
// "Gradient buckets"): PyTorch DDP's default buckets (the first 1 MiB, then 25 MiB), Megatron-
// Core's (max(40M, 1M x DP) parameters), one per block, or a given size.
enum class GradBucketKind { kPytorch, kMegatron, kBlock, kBytes };

struct ParallelismSpec {
  // Pipeline stages (Megatron's pipeline-model-parallel size): the blocks are split into pp
  // stages of P / pp GPUs each (whole nodes, or an equal part of one node); ep / esp / mp / dp
  // describe one stage, so their product is P / pp. Rank = stage * (P / pp) + the rank inside the
  // stage.
  int pp = 1;
  // Pipeline schedule and model chunks per rank-stage (Megatron's virtual pipeline size): with
  // vp > 1 (interleaved) the blocks split into pp * vp chunks, stage s holding s, s + pp, ...
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int vp = 1;
  // parallelism.pipeline_layout (Megatron-LM's --pipeline-model-parallel-layout): blocks per
  // model piece, in model order (pp pieces, or pp * vp interleaved); empty: the even split.
  std::vector<int> pipeline_layout;
  // ZeRO stage (Rajbhandari et al. 2020): 0, or 1 = the optimizer state sharded over the ranks
  // that hold a replica of the parameters (dense: the dense DP group of P / pp / mp ranks;
  // experts: the dp replicas). Memory only: ZeRO-1's reduce-scatter of the gradients plus
  // all-gather of the updated parameters move what the all-reduce the plan holds moves.
  int zero = 0;
  GradBucketKind grad_bucket = GradBucketKind::kPytorch;
  Bytes grad_bucket_bytes{0};  // kBytes only
  int ep = 0;   // expert-parallel group size (resolved; `auto` = P / (esp * mp * dp), overlapped:
                // P / (esp * dp))
  int esp = 1;  // expert-sharding-parallel group size (Parm)
  int mp = 1;   // tensor model-parallel group size
  int dp = 0;   // data-parallel degree of the experts (resolved; `auto` = P / (ep * esp * mp),
                // overlapped: P / (ep * esp))
  MpLayout layout = MpLayout::kDisjoint;
  bool ep_auto = false;
  bool dp_auto = false;
  // Folded layout only (1 / false otherwise): the attention side's context-parallel and data-
  // parallel degrees (tp * cp * adp = P / pp, tp = mp) and whether the TP ranks run sequence
  // parallel (Megatron's --sequence-parallel; required with tp > 1, as Megatron's MoE requires).
  int cp = 1;
  int adp = 1;
  bool sp = false;

  bool overlapped() const { return layout == MpLayout::kOverlapped; }
  bool folded() const { return layout == MpLayout::kFolded; }
  /// The MoE coordinates alone fix the GPU (overlapped and folded): mp is not a factor of P.
  bool moe_major() const { return layout != MpLayout::kDisjoint; }
  /// GPUs the product of the degrees covers (P once resolved).
  std::int64_t product() const {
    return static_cast<std::int64_t>(ep) * esp * dp * (moe_major() ? 1 : mp);
  }
  /// Ranks of one DP index: an MoE layer's all-to-all world (Parm's EP&ESP x MP group).
  int ranks_per_dp() const { return ep * esp * (moe_major() ? 1 : mp); }
  /// The rank of (d, e, s, t); overlapped / folded: t must be 0 (the MoE coordinates fix the GPU).
  int rank_of(int d, int e, int s, int t) const {
    return moe_major() ? (d * ep + e) * esp + s : ((d * ep + e) * esp + s) * mp + t;
  }
  int mp_index(int rank) const { return rank % mp; }
  int esp_index(int rank) const { return moe_major() ? rank % esp : (rank / mp) % esp; }
  int ep_index(int rank) const {
    return moe_major() ? (rank / esp) % ep : (rank / (mp * esp)) % ep;
  }
  /// Folded: the context-parallel index of a rank (rank = (a*cp + c)*tp + t); 0 otherwise.
  int cp_index(int rank) const { return (rank / mp) % cp; }
};

// ---------------------------------------------------------------------------------------------
// workload:

// kCorrelated: the multi-layer routing generator of inference (strategies/inference/,
// docs/strategy-specs.md §7): per-layer Zipf marginals (skew) and tokens that follow their path.
// kBalanced: force-balanced routing (every expert the same load, docs/workload.md).
enum class RoutingDistribution { kUniform, kZipf, kDirichlet, kTrace, kCorrelated, kBalanced };

struct RoutingWorkloadSpec {
  RoutingDistribution distribution = RoutingDistribution::kUniform;
  double skew = 0.0;             // zipf exponent over experts (0 = uniform); also per-layer skew
  std::uint64_t seed = 1;        // every random draw of the run derives from it
  std::string trace_path;        // distribution trace: absolute path (resolved against the file)
  double dirichlet_alpha = 1.0;  // distribution dirichlet: concentration (> 0)
  // distribution correlated (strategies/inference/correlated_routing.hpp): probability that a
  // token's first choice is the dominant next expert of its path group, in [0, 1]; and how many
  // previous MoE layers' first choices form that group (>= 1); how much a batch's popularity
  // varies around the layer's Zipf marginals (relative standard deviation scale, in [0, 1)).
  double stickiness = 0.4;
  int memory = 3;
  double batch_variation = 0.1;
  // Node-limited routing (DeepSeek's device-limited routing): every token's experts lie on at most
  // this many nodes of its EP group (0: no limit). docs/workload.md, "Node-limited routing".
  int node_limit = 0;
};

enum class CapacityKind { kFixed, kTrace, kRandomWalk };

/// How the capacity factor evolves over iterations (Tutel's dynamic workload).
struct CapacityWorkloadSpec {
  CapacityKind kind = CapacityKind::kFixed;  // fixed: model.capacity_factor every iteration
  std::vector<double> factors;               // trace: factor of iteration i is factors[i % size]
  // random_walk: starts at model.capacity_factor clamped to [min, max], moves by +-step.
  double min = 1.0;
  double max = 1.0;
  double step = 0.5;
};

struct WorkloadSpec {
  RoutingWorkloadSpec routing;
  CapacityWorkloadSpec capacity;
  int iterations = 10;
};

// ---------------------------------------------------------------------------------------------
// engine:

enum class NetworkModelKind { kAnalytical, kFlow, kSimgrid };

// engine.flow.sharing: how concurrent collectives share a link in the flow engine
// (sim::FlowSharing).
enum class FlowSharingKind { kPerCollective, kPerFlow };

// engine.simgrid.mode (sim::SimgridMode): auto = per_flow up to 64 GPUs, ptask above.
enum class SimgridModeKind { kAuto, kPerFlow, kPtask };

struct EngineSpec {
  NetworkModelKind network = NetworkModelKind::kFlow;
  Seconds message_latency{0};      // extra startup latency per message
  Seconds message_overhead{1e-6};  // endpoint cost per message (bounds the message rate)
  // Per-peer connection state (sim::NetworkParams::overhead_s): peers an endpoint keeps hot
  // (0 = unlimited) and the extra time of a message to a peer outside them. Unset: the NIC
  // model's (topology::nic_peer_state: its queue-pair cache shared by the GPUs on the NIC).
  std::optional<int> peer_cache;
  std::optional<Seconds> peer_miss_overhead;
  Seconds launch_overhead{5e-6};  // per kernel / collective launch
  // Compute slow-down factor while communication runs on the GPU (>= 0); unset: the GPU's
  // (topology::default_interference, from the SMs communication kernels hold).
  std::optional<double> interference;
  // engine.flow.event_tolerance: flows finishing (or starting to move) within this relative time
  // of each other are handled together, in one recomputation (bounded error of about this much
  // per event). 1e-9 is the exact model. The default keeps a skewed MoE step within 0.1% of it
  // (-0.08% at 256 GPUs) and lets a 4,096-GPU one finish (1e-3 does not in minutes).
  double flow_event_tolerance = 3e-3;
  // engine.flow.sharing: per_collective (each collective phase one party on its most crowded
  // link, as NCCL's per-collective channels behave; docs/validation.md V1) or per_flow (plain
  // max-min, SimGrid's model).
  FlowSharingKind flow_sharing = FlowSharingKind::kPerCollective;
  // engine.simgrid.mode: per_flow (one SimGrid comm per flow: the faithful reference), ptask (one
  // parallel task per node pair: fast, one rate per task) or auto (per_flow up to 64 GPUs).
  SimgridModeKind simgrid_mode = SimgridModeKind::kAuto;
};

// ---------------------------------------------------------------------------------------------
// strategies: each role is optional; omitted = the first (baseline) value of its table.

enum class RoutingRole { kEven, kTaMoe, kFasterMoeHir };
enum class ParallelRole { kP1, kP2, kDegree, kTutelRouter };
enum class PipelineRole { kDegree, kPipeMoe, kTutelOnline };
enum class A2aRole { kLinear, k2dh, kAuto, k3dh, kDeepep };
enum class LayoutRole { kPlain, kFlexible };
enum class ScheduleRole {
  kNone,
  kParmBaseline,
  kParmS1,
  kParmS2,
  kParmAuto,
  kLina,
  kFair,
  kBetweenA2a
};
enum class InferenceRole { kBaseline, kLina, kIdeal };

/// routing: ta_moe (docs/strategy-specs.md §8).
struct TaMoeParams {
  double lambda = 0.1;     // smoothing towards uniform, in [0, 1]
  double adherence = 1.0;  // how far the count matrix moves towards the target, in [0, 1]
};
/// routing: faster_moe_hir (FasterMoE hierarchical gate).
struct FasterMoeHirParams {
  double max_offnode_share = 0.5;  // share of a GPU's tokens allowed to leave its node, in [0, 1]
};
/// pipeline: tutel_online (docs/strategy-specs.md §3): width of capacity-factor buckets.
struct TutelOnlineParams {
  double bucket_width = 0.5;  // > 0
};
/// schedule: lina (docs/strategy-specs.md §6).
struct LinaParams {
  Bytes micro_op{30e6};      // allreduce micro-op size (> 0)
  bool pack_experts = true;  // double experts per GPU while the FFN is shorter than the a2a
  // Most experts packed on one GPU (a power of two >= 1; 1 = no packing). Lina packs at most 2
  // (4 for Transformer-XL, §7.2): each doubling doubles the expert weights, gradients and
  // optimizer state a GPU holds, so packing stops well before the EP group collapses.
  int max_pack = 2;
};
/// inference: lina (docs/strategy-specs.md §7).
struct LinaInferenceParams {
  int path_length = 3;      // experts of previous layers that form a token's path (>= 1)
  int profile_batches = 8;  // batches of the profiling trace the path profile is built from
};

struct StrategySpec {
  std::string name;  // unique within the scenario
  RoutingRole routing = RoutingRole::kEven;
  ParallelRole parallel = ParallelRole::kP1;
  // Token repeat factor r of the parallel mode (docs/strategy-specs.md §4): 1 for p1, the expert
  // shard count n for p2, the integer given for kDegree; unused for tutel_router.
  int parallel_degree = 1;
  PipelineRole pipeline = PipelineRole::kDegree;
  int pipeline_degree = 1;  // for PipelineRole::kDegree
  A2aRole a2a = A2aRole::kLinear;
  LayoutRole layout = LayoutRole::kPlain;
  ScheduleRole schedule = ScheduleRole::kNone;
  InferenceRole inference = InferenceRole::kBaseline;

  // Role parameters; meaningful only when the matching role value is selected.
  TaMoeParams ta_moe;
  FasterMoeHirParams faster_moe_hir;
  TutelOnlineParams tutel_online;
  LinaParams lina;
  LinaInferenceParams lina_inference;

  SourceLocation where;  // location of this entry in `strategies:`

  /// True when every role has its baseline value.
  bool is_baseline() const;
};

/// "a2a=auto pipeline=tutel_online parallel=tutel_router" (non-baseline roles only; "baseline"
/// when none), for summaries and logs.
std::string describe_roles(const StrategySpec& s);

// ---------------------------------------------------------------------------------------------

// Where model.hf_config took the architecture from (empty without one): the config's path,
// the family it was read as, and its fields moesim does not use (core/hf_config.hpp).
struct ModelImport {
  std::string hf_config;
  std::string family;
  std::vector<std::string> unknown;  // neither mapped nor known
  std::vector<std::string> ignored;  // "field: what moesim does not model"
};

struct Scenario {
  std::string name;
  std::string description;
  std::string source_file;  // as given to the loader (or the pseudo file name)
  ClusterSpec cluster;
  ModelSpec model;
  ModelImport model_import;
  ParallelismSpec parallelism;
  WorkloadSpec workload;
  EngineSpec engine;
  std::vector<StrategySpec> strategies;
  // `serving:` (docs/serving.md): requests served by pools of model instances; absent for a
  // scenario of training or batch-inference steps.
  std::optional<ServingSpec> serving;
  // Every key path present in the file ("cluster.gpu", "strategies[1].pipeline",
  // "cluster.inter_node.tree") -> its file:line:col. List items are "key[i]". Shared, not
  // copied: every strategy's run copies its scenario, and with thousands of strategies a copied
  // map made validate quadratic.
  using Locations = std::map<std::string, SourceLocation>;
  std::shared_ptr<const Locations> locations = std::make_shared<const Locations>();
  /// Whether the file wrote `key_path`.
  bool written(const std::string& key_path) const { return locations->count(key_path) > 0; }

  int num_gpus() const { return cluster.num_gpus(); }                     // P
  std::int64_t tokens_per_gpu() const { return model.tokens_per_gpu(); }  // S = B * L
  int num_experts() const { return model.experts; }                       // E
  int bytes_per_element() const { return model.bytes_per_element(); }

  /// GPUs of one pipeline stage, P / pp (P without pipeline stages).
  int stage_gpus() const { return num_gpus() / parallelism.pp; }
  /// The scenario of one pipeline stage: the same model, workload and strategies on P / pp GPUs
  /// with pp = 1: cluster.nodes / pp nodes, or, when several stages share a node, one node of
  /// P / pp GPUs with its share of the node's NICs (docs/model.md, "Pipeline stages"). Everything
  /// that reasons about one MoE layer (the workload sampler, the strategies, the stage's plan) runs
  /// on it; the topology and the engine keep the whole cluster. The scenario itself when pp = 1.
  Scenario stage_scenario() const;
  /// Blocks of pipeline stage s: [first, end). L blocks over pp stages as evenly as possible, the
  /// L % pp extra blocks on the first stages (the last one also runs the LM head and the loss);
  /// with parallelism.pipeline_layout (1f1b, dualpipe: one piece per stage), its piece s.
  std::pair<int, int> stage_blocks(int stage) const;

  /// The strategy named `name`, or nullptr.
  const StrategySpec* find_strategy(std::string_view name) const;
  /// Location of `key_path` if present in the file; else the file with no line.
  SourceLocation location_of(const std::string& key_path) const;
};

// ---------------------------------------------------------------------------------------------
// Name tables (YAML spellings). For every role but pipeline (whose baseline is the integer 1),
// the first row is the baseline value.

const std::vector<NamedValue<Mode>>& mode_names();
const std::vector<NamedValue<AttentionKind>>& attention_kind_names();
const std::vector<NamedValue<FfnActivation>>& ffn_activation_names();
const std::vector<NamedValue<RecomputeGranularity>>& recompute_granularity_names();
const std::vector<NamedValue<RecomputeModule>>& recompute_module_names();
const std::vector<NamedValue<MpLayout>>& mp_layout_names();
const std::vector<NamedValue<PipelineSchedule>>& pipeline_schedule_names();
// grad_bucket's named values (a size is kBytes).
const std::vector<NamedValue<GradBucketKind>>& grad_bucket_names();
const std::vector<NamedValue<RoutingDistribution>>& routing_distribution_names();
const std::vector<NamedValue<CapacityKind>>& capacity_kind_names();
const std::vector<NamedValue<NetworkModelKind>>& network_model_names();
const std::vector<NamedValue<FlowSharingKind>>& flow_sharing_names();
const std::vector<NamedValue<SimgridModeKind>>& simgrid_mode_names();
const std::vector<NamedValue<RoutingRole>>& routing_role_names();
// parallel and pipeline also accept an integer r >= 1 (ParallelRole::kDegree /
// PipelineRole::kDegree); their tables hold the named values only.
const std::vector<NamedValue<ParallelRole>>& parallel_role_names();
const std::vector<NamedValue<PipelineRole>>& pipeline_role_names();
const std::vector<NamedValue<A2aRole>>& a2a_role_names();
const std::vector<NamedValue<LayoutRole>>& layout_role_names();
const std::vector<NamedValue<ScheduleRole>>& schedule_role_names();
const std::vector<NamedValue<InferenceRole>>& inference_role_names();

std::string_view name_of(Mode v);
std::string_view name_of(AttentionKind v);
std::string_view name_of(FfnActivation v);
std::string_view name_of(RecomputeGranularity v);
std::string_view name_of(RecomputeModule v);
std::string_view name_of(MpLayout v);
std::string_view name_of(PipelineSchedule v);
std::string_view name_of(RoutingDistribution v);
std::string_view name_of(CapacityKind v);
std::string_view name_of(NetworkModelKind v);
std::string_view name_of(FlowSharingKind v);
std::string_view name_of(SimgridModeKind v);
std::string_view name_of(RoutingRole v);
std::string_view name_of(ParallelRole v);  // kDegree -> "degree"
std::string_view name_of(PipelineRole v);  // kDegree -> "degree"
std::string_view name_of(A2aRole v);
std::string_view name_of(LayoutRole v);
std::string_view name_of(ScheduleRole v);
std::string_view name_of(InferenceRole v);

}  // namespace moesim
