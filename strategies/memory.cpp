#include "strategies/memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "core/error.hpp"
#include "strategies/model_params.hpp"
#include "strategies/schedules/lina.hpp"
#include "strategies/stage_schedule.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::strategies {

int optimizer_bytes_per_param(Dtype dtype, Dtype moments) {
  // Adam's two moments; mixed precision adds the fp32 master copy of the weights.
  return 2 * dtype_bytes(moments) + (dtype_bytes(dtype) < 4 ? 4 : 0);
}

int dense_replicas(const Scenario& sc) { return sc.stage_gpus() / sc.parallelism.mp; }

int expert_replicas(const Scenario& sc) {
  const auto& p = sc.parallelism;
  return p.dp * (p.moe_major() ? 1 : p.mp);
}

int in_flight_micro_batches(const Scenario& sc, int stage) {
  if (sc.model.mode != Mode::kTraining) return 1;
  // The schedule's own order (1F1B: stage s runs min(pp - s, m) forwards before its first
  // backward; interleaved: Megatron's warm-up + 1 chunks; DualPipe: pp + 1 on the first stage).
  return peak_in_flight(stage_order(sc, stage));
}

namespace {

// What one pipeline stage holds (the whole model when pp = 1).
struct StageShare {
  int moe_layers = 0, dense_layers = 0;
  bool embedding = true, head = true;
  int in_flight = 1;  // model chunks of this share's activations kept (training)
  int chunks = 1;     // model chunks the share is made of (interleaved: vp; DualPipe: 2)
  // A pipeline_layout whose chunks on this stage hold different blocks: each chunk's blocks and
  // the stage's order, so the chunks in flight count their own activations. Empty: every chunk
  // is 1 / chunks of the share.
  struct Chunk {
    int moe_layers = 0, dense_layers = 0;
    bool head = false;
  };
  std::vector<Chunk> chunk_blocks;
  std::vector<StageAction> order;
};

// Bytes of the tensors one block keeps for backward, per micro-batch (docs/model.md, "Memory":
// Korthikanti et al. 2022's accounting with flash attention: no L x L scores). `rc` drops what
// selective recomputation recomputes; pass a default RecomputeSpec for everything.
struct BlockActivations {
  double attention = 0, dense_ffn = 0, moe_ffn = 0;
};

BlockActivations block_activations(const Scenario& sc, const Decision& decision,
                                   std::int64_t capacity, const RecomputeSpec& rc) {
  const auto& m = sc.model;
  const auto& a = m.attention;
  const double M = m.model_dim, E = m.experts;
  const double S = static_cast<double>(m.tokens_per_gpu());
  const double mp = sc.parallelism.mp, esp = sc.parallelism.esp, rho = decision.parallel_degree;
  // Rows of the tensors after the TP all-gather: layout folded (sequence parallel) keeps the
  // rank's S tokens in the norms and their gathered S * tp rows, split by heads / width, after
  // them (Korthikanti et al.'s accounting with SP: every tensor / tp).
  const double R = sc.parallelism.folded() ? S * mp : S;
  const double b = dtype_bytes(m.dtype);
  // GEMM inputs saved for backward: TransformerEngine (and DeepSeek-V3) keep the fp8 cast copy.
  const double g = m.precision.gemm == Dtype::kFp8 ? 1 : b;
  const bool ln = rc.has(RecomputeModule::kLayernorm);
  BlockActivations out;

  // Attention: the norm's input (the residual stream) and output (the projections' input).
  const double h = a.heads;
  double attn = S * M * b + (ln ? 0 : S * M * g);
  // The core (flash attention) keeps Q, K, V, its output O and the fp32 logsumexp per head.
  double qkv = 0;
  double o_width = h * a.value_head_dim() / mp;
  if (a.is_mla()) {
    // The latents: the q and kv norms' inputs (dtype) and outputs (the up-projections' inputs).
    const double q_lora = a.q_lora_rank, kv_lora = a.kv_lora_rank;
    attn += R * (q_lora + kv_lora) * (b + g);
    // Q and K of (nope + rope) per head, V of v_head_dim: the up-projections' outputs.
    qkv = R * h * (2.0 * a.qk_head_dim() + a.v_head_dim) / mp * b;
    if (rc.has(RecomputeModule::kMlaUpProj)) qkv = 0;
  } else {
    qkv = R * (h + 2.0 * a.kv_heads) * a.head_dim / mp * b;
  }
  attn += qkv;
  const double o = R * o_width * b, lse = R * h / mp * 4;
  // The out projection's input is O itself, unless fp8 GEMMs keep their own 1-byte copy of it;
  // core_attn recomputation drops what the core keeps beyond its inputs Q, K, V (its O is still
  // the projection's input when that has no copy of its own).
  const bool own_copy = g < b;
  if (rc.has(RecomputeModule::kCoreAttn))
    attn += own_copy ? R * o_width * g : o;
  else
    attn += o + lse + (own_copy ? R * o_width * g : 0);
  out.attention = attn;

  // Dense FFN (hidden Hd): the norm's input and output (fc1's input), fc1's output (the
  // activation's input), the activation's output (fc2's input). mlp recomputation keeps the
  // FFN's input only (the checkpoint's, at dtype).
  const double Hd = static_cast<double>(m.dense_hidden());
  const bool mlp = rc.has(RecomputeModule::kMlp);
  out.dense_ffn = S * M * b + (ln ? 0 : S * M * (mlp ? b : g)) +
                  (mlp ? 0 : R * m.fc1_width(m.dense_hidden()) / mp * b + R * Hd / mp * g);

  // MoE FFN. Gate input S' M (S' = S esp, the ESP-gathered tokens; the router stays at dtype)
  // and probabilities S' E; R = E dC esp rho expert rows received (the padded buffer) of H_s =
  // ceil(H / (esp rho)) hidden each: the permuted rows (fc1's input), fc1's output, the
  // activation's output (fc2's input), and what the probabilities' gradient needs: a capacity-
  // factor layer (GShard, Tutel, DeepSpeed-MoE) weights the expert outputs in the combine and keeps
  // them; a dropless one (Megatron-Core's grouped MLP, DeepSeek-V3) multiplies each row's fp32
  // probability into the activation (weighted SwiGLU) and keeps those R probabilities instead.
  // Folded ETP gathers the dispatched rows, not the gate's tokens: the gate sees the rank's S.
  const double s_esp = sc.parallelism.folded() ? S : S * esp;
  const double rows = E * static_cast<double>(capacity) * esp * rho;
  const std::int64_t slices = static_cast<std::int64_t>(esp * rho);
  const std::int64_t h_slice = (m.hidden_dim + slices - 1) / slices;
  const bool moe = rc.has(RecomputeModule::kMoe);
  const bool moe_act = moe || rc.has(RecomputeModule::kMoeAct);
  // Under moe_act, fc1's output is kept only as the activation's recompute input, in the GEMMs'
  // precision: DeepSeek-V3 caches the SwiGLU's input in fp8 (its report, section 3.3).
  const double fc1_out = moe_act ? g : b;
  const double prob_grad = m.capacity_is_dropless() ? rows * 4 : rows * M * b;
  const double experts_kept = moe ? 0
                                  : s_esp * E * b + rows * M * g +
                                        rows * static_cast<double>(m.fc1_width(h_slice)) * fc1_out +
                                        prob_grad;
  // moe_act recomputes the activation from fc1's output: its output (fc2's input) is dropped.
  const double act_out = moe_act ? 0 : rows * static_cast<double>(h_slice) * g;
  // Shared experts (N of width H: one FFN of hidden N H) read the norm's output (their own fp8
  // copy of it under fp8 GEMMs) and keep fc1's and the activation's outputs.
  double shared = 0;
  if (m.shared_experts > 0 && !moe && !rc.has(RecomputeModule::kSharedExperts)) {
    const std::int64_t hs = static_cast<std::int64_t>(m.shared_experts) * m.hidden_dim;
    shared = (own_copy ? S * M * g : 0) + R * static_cast<double>(m.fc1_width(hs)) / mp * b +
             R * static_cast<double>(hs) / mp * g;
  }
  // The norm's output as the gate's input (kept by moe recomputation as the checkpoint's input).
  const double gate_in = ln && !moe ? 0 : s_esp * M * b;
  out.moe_ffn = S * M * b + gate_in + experts_kept + act_out + shared;
  return out;
}

MemoryEstimate estimate_share(const Scenario& sc, const Decision& decision, std::int64_t capacity,
                              const StageShare& part) {
  const auto& m = sc.model;
  const double M = m.model_dim, H = m.hidden_dim, E = m.experts;
  const double S = static_cast<double>(m.tokens_per_gpu());
  const double mp = sc.parallelism.mp, esp = sc.parallelism.esp;
  const double n = m.expert_shards(), rho = decision.parallel_degree;
  const double local = m.local_experts();
  const double b = dtype_bytes(m.dtype);
  const int moe_layers = part.moe_layers;
  const int dense_layers = part.dense_layers;
  const int layers = moe_layers + dense_layers;
  const bool training = m.mode == Mode::kTraining;

  MemoryEstimate est;
  est.capacity = capacity;
  est.in_flight = part.in_flight;
  est.chunks = part.chunks;
  est.recompute = training ? m.recompute.granularity : RecomputeGranularity::kNone;
  est.expert_pack = decision.expert_pack;
  est.parallel_degree = decision.parallel_degree;

  // Parameters. Dense: attention and norms of every block, the dense FFN (hidden Hd) and the
  // shared experts (one FFN of hidden N H) split over mp, the gate M E held whole by every rank.
  const double Hd = static_cast<double>(m.dense_hidden());
  const double Hs = static_cast<double>(m.shared_experts) * H;
  const auto ffn = [&](double hidden) { return (m.swiglu() ? 3 : 2) * M * hidden; };
  // Vocabulary: the V x M embedding, and as much again for an untied LM head, split over mp. With
  // pipeline stages the embedding sits on the first stage and the head on the last, each a V x M
  // matrix even when tied (the last stage keeps its own copy, as Megatron does); the final norm
  // sits with the head.
  const double V = m.vocab_size;
  const double vocab_copies = part.embedding && part.head
                                  ? (m.tie_embeddings ? 1 : 2)
                                  : (part.embedding ? 1 : 0) + (part.head ? 1 : 0);
  const double final_norm = V > 0 && part.head ? M : 0;
  // MTP modules (their blocks are counted above): the 2M -> M projection split over mp, its two
  // input norms, and an embedding copy where the stage with the head lacks the embedding.
  const double mtp = part.head ? m.mtp_blocks() : 0;
  const double mtp_params =
      mtp * (2 * M * M / mp + 2 * M) + (mtp > 0 && !part.embedding ? V * M / mp : 0);
  est.dense_params = layers * (attention_params(m, mp) + norm_params(m)) +
                     dense_layers * ffn(Hd) / mp + moe_layers * (M * E + ffn(Hs) / mp) +
                     vocab_copies * V * M / mp + final_norm + mtp_params;
  // Experts: an expert's FFN split over its esp hidden slices and n shards.
  est.expert_params = moe_layers * local * ffn(H) / (esp * n);
  const double params = est.dense_params + est.expert_params;
  est.weights_bytes = params * b;
  if (training) {
    est.gradients_bytes = params * dtype_bytes(m.precision.main_grads);
    // ZeRO-1 (Megatron's distributed optimizer): each rank keeps the master copy and moments of
    // 1 / (the parameter's replica count) of it; the gradient buffer stays whole.
    const bool zero = sc.parallelism.zero >= 1;
    const double dense_shards = zero ? dense_replicas(sc) : 1.0;
    const double expert_shards = zero ? expert_replicas(sc) : 1.0;
    est.optimizer_bytes = (est.dense_params / dense_shards + est.expert_params / expert_shards) *
                          optimizer_bytes_per_param(m.dtype, m.precision.moments);
  }

  // Activations. The LM head: the final norm's input, the head's input and its S V / mp logits
  // (kept for the loss's backward); the embedding's token ids are not counted.
  const double rows_tp = sc.parallelism.folded() ? S * mp : S;  // folded: the gathered rows
  // Each MTP module keeps as much again for its own head and loss, and its projection's input
  // (the two normalised halves, 2 S M) with the norms' inputs (2 S M).
  const double head = V > 0 && part.head
                          ? (1 + mtp) * (2 * S * M * b + rows_tp * V / mp * b) + mtp * 4 * S * M * b
                          : 0;
  const RecomputeSpec none;
  if (training) {
    const RecomputeSpec& rc = m.recompute;
    const BlockActivations full = block_activations(sc, decision, capacity, none);
    double per_micro_batch = 0;
    double extra = 0;
    BlockActivations per_block;  // what one block of each kind keeps
    if (rc.full()) {
      // Full recomputation keeps each block's input; the block being back-propagated
      // rematerialises all of its own (the largest block kind of the stage).
      per_block.attention = S * M * b;
      if (dense_layers > 0) extra = std::max(extra, full.attention + full.dense_ffn);
      if (moe_layers > 0) extra = std::max(extra, full.attention + full.moe_ffn);
    } else {
      per_block = block_activations(sc, decision, capacity, rc);
    }
    // One micro-batch's activations of `moe` MoE and `dense` dense blocks.
    const auto blocks_bytes = [&](int moe, int dense) {
      return (moe + dense) * per_block.attention + dense * per_block.dense_ffn +
             moe * per_block.moe_ffn;
    };
    per_micro_batch = blocks_bytes(moe_layers, dense_layers) + head;
    // Every micro-batch chunk in flight keeps its own (1F1B: min(pp - s, m) on stage s); a
    // chunk is 1 / chunks of the share (exact when the chunks hold equal blocks).
    est.activations_bytes =
        static_cast<double>(part.in_flight) / part.chunks * per_micro_batch + extra;
    if (!part.chunk_blocks.empty()) {  // a layout's uneven chunks: each counts its own blocks
      std::vector<double> chunk_bytes;
      for (const StageShare::Chunk& c : part.chunk_blocks)
        chunk_bytes.push_back(blocks_bytes(c.moe_layers, c.dense_layers) + (c.head ? head : 0.0));
      est.activations_bytes = peak_in_flight_bytes(part.order, chunk_bytes) + extra;
    }
  } else {
    // Inference keeps nothing for backward: the largest block in flight.
    const BlockActivations full = block_activations(sc, decision, capacity, none);
    double block = 0;
    if (dense_layers > 0) block = std::max(block, full.attention + full.dense_ffn);
    if (moe_layers > 0) block = std::max(block, full.attention + full.moe_ffn);
    est.activations_bytes = std::max(block, head);
  }

  // Buffers: the dispatch send buffer (the encode's padded output) and the combine send buffer
  // (the expert outputs), R M each at their precision (fp8 adds DeepEP's fp32 scale per 128
  // elements), of the MoE layer in flight. Pipeline chunks are slices of these buffers (as in
  // Tutel), so r does not multiply them.
  // Folded (ETP): the send buffers hold the rank's own E dC rows; the ETP-gathered ones are the
  // experts' activations above.
  const double rows = E * static_cast<double>(capacity) * (sc.parallelism.folded() ? 1 : esp) * rho;
  const auto wire = [](Dtype d) { return dtype_bytes(d) + (d == Dtype::kFp8 ? 4.0 / 128 : 0.0); };
  if (moe_layers > 0)
    est.buffers_bytes = rows * M * (wire(m.precision.dispatch) + wire(m.precision.combine));
  // Sharded experts with n / rho > 1 (P1, intermediate rho): the all-gathered 1 / rho of an
  // expert's FFN of every MoE layer is kept from forward to backward (no re-gather), plus one
  // layer's full-size gradient before its reduce-scatter; inference gathers one layer at a time.
  if (moe_layers > 0 && n / rho > 1) {
    const double gathered = ffn(H) / rho;
    est.buffers_bytes += training ? (moe_layers + 1) * gathered * b : gathered * b;
  }
  return est;
}

}  // namespace

MemoryEstimate estimate_memory(const Scenario& scenario, const Decision& decision,
                               std::int64_t capacity) {
  MOESIM_ASSERT(capacity >= 0, "capacity must be >= 0");
  MOESIM_ASSERT(decision.expert_pack >= 1 && decision.parallel_degree >= 1,
                "decision degrees must be >= 1");
  // Lina's expert packing: the same job on fewer, fuller EP ranks (what the plan builder builds).
  // A copy only when packing changes it: a Scenario copy carries every strategy.
  std::optional<Scenario> packed;
  if (decision.expert_pack > 1)
    packed.emplace(schedules::packed_scenario(scenario, decision.expert_pack));
  const Scenario& sc = packed ? *packed : scenario;
  const auto& m = sc.model;
  const int pp = sc.parallelism.pp;
  MemoryEstimate worst;
  // With pipeline stages every stage holds its own blocks; the estimate is the fullest stage's.
  // A stage holds the blocks of every model chunk it runs (DualPipe: two stages' worth).
  const int chunks = chunks_per_stage(sc), pieces = model_pieces(sc);
  for (int stage = 0; stage < pp; ++stage) {
    StageShare part;
    part.embedding = part.head = false;
    std::vector<StageShare::Chunk> own;  // the stage's chunks, each with its own blocks
    bool uneven = false;
    for (int c = 0; c < chunks; ++c) {
      const int k = piece_of(sc, stage, c);
      const auto [begin, end] = piece_blocks(sc, k);
      StageShare::Chunk x;
      for (int l = begin; l < end; ++l) ++(m.is_moe_block(l) ? x.moe_layers : x.dense_layers);
      x.head = k == pieces - 1;
      // The MTP modules' blocks run with the LM head.
      for (int l = m.layers; x.head && l < m.num_blocks(); ++l)
        ++(m.is_moe_block(l) ? x.moe_layers : x.dense_layers);
      part.moe_layers += x.moe_layers;
      part.dense_layers += x.dense_layers;
      part.embedding = part.embedding || k == 0;
      part.head = part.head || x.head;
      uneven = uneven || (!own.empty() && (x.moe_layers != own.front().moe_layers ||
                                           x.dense_layers != own.front().dense_layers));
      own.push_back(x);
    }
    part.chunks = m.mode == Mode::kTraining ? chunks : 1;
    part.in_flight = in_flight_micro_batches(sc, stage);
    // A layout may give this stage's chunks different blocks; the even split never does (its
    // estimate stays the evenly spread one).
    if (!sc.parallelism.pipeline_layout.empty() && part.chunks > 1 && uneven) {
      part.chunk_blocks = std::move(own);
      part.order = stage_order(sc, stage);
    }
    MemoryEstimate est = estimate_share(sc, decision, capacity, part);
    est.stage = stage;
    if (stage == 0 || est.total_bytes() > worst.total_bytes()) worst = est;
  }
  return worst;
}

namespace {

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024)); }

}  // namespace

std::vector<RecomputeModule> light_modules(const ModelSpec& m) {
  std::vector<RecomputeModule> out = {RecomputeModule::kCoreAttn, RecomputeModule::kLayernorm};
  if (m.attention.is_mla()) out.push_back(RecomputeModule::kMlaUpProj);
  if (m.num_moe_layers() < m.num_blocks()) out.push_back(RecomputeModule::kMlp);
  if (m.num_moe_layers() > 0) out.push_back(RecomputeModule::kMoeAct);
  if (m.shared_experts > 0 && m.num_moe_layers() > 0)
    out.push_back(RecomputeModule::kSharedExperts);
  return out;
}

std::string fit_advice(const Scenario& sc, const MemoryEstimate& est, double gpu_memory_bytes) {
  if (gpu_memory_bytes <= 0 || est.total_bytes() <= gpu_memory_bytes) return "";
  Decision d;
  d.expert_pack = est.expert_pack;
  d.parallel_degree = est.parallel_degree;
  struct Option {
    std::string key;
    Scenario sc;
  };
  std::vector<Option> options;
  const auto& m = sc.model;
  const bool training = m.mode == Mode::kTraining;
  if (training && sc.parallelism.zero == 0) {
    Option o{"parallelism.zero: 1", sc};
    o.sc.parallelism.zero = 1;
    options.push_back(std::move(o));
  }
  if (training && !m.recompute.full()) {
    const auto modules = light_modules(m);
    bool more = false;  // does the selective set add a module to the scenario's?
    for (auto mod : modules) more = more || !m.recompute.has(mod);
    if (more) {
      std::string names;
      for (auto mod : modules)
        names += fmt::format("{}{}", names.empty() ? "" : ", ", name_of(mod));
      Option o{fmt::format("model.recompute: {{granularity: selective, modules: [{}]}}", names),
               sc};
      o.sc.model.recompute.granularity = RecomputeGranularity::kSelective;
      o.sc.model.recompute.modules = modules;
      options.push_back(std::move(o));
    }
    Option f{"model.recompute: {granularity: full}", sc};
    f.sc.model.recompute.granularity = RecomputeGranularity::kFull;
    f.sc.model.recompute.modules.clear();
    options.push_back(std::move(f));
  }
  // The smallest larger pipeline depth that divides the nodes and keeps the stage's degrees (dp
  // absorbs the change, as `dp: auto` does).
  const auto& p = sc.parallelism;
  const int per_dp = p.ep * p.esp * (p.moe_major() ? 1 : p.mp);
  // A pipeline_layout is written for its own pp: another pp needs another layout.
  const int max_pp = p.pipeline_layout.empty() ? std::min(sc.cluster.nodes, m.layers) : 0;
  for (int pp = p.pp + 1; pp <= max_pp; ++pp) {
    if (sc.cluster.nodes % pp != 0) continue;
    const int stage_gpus = sc.num_gpus() / pp;
    if (stage_gpus % per_dp != 0) continue;
    // Folded: the attention side's dp absorbs the change too.
    if (p.folded() && stage_gpus % (p.mp * p.cp) != 0) continue;
    Scenario s = sc;
    s.parallelism.pp = pp;
    s.parallelism.dp = stage_gpus / per_dp;
    if (!schedule_applies(s)) continue;  // e.g. an odd pp under DualPipe
    if (p.folded()) s.parallelism.adp = stage_gpus / (p.mp * p.cp);
    if (estimate_memory(s, d, est.capacity).total_bytes() > gpu_memory_bytes) continue;
    options.push_back(Option{fmt::format("parallelism.pp: {}", pp), std::move(s)});
    break;
  }
  if (m.precision.gemm != Dtype::kFp8 && sc.cluster.gpu.peak.count(Dtype::kFp8) > 0) {
    Option o{"model.precision.gemm: fp8", sc};
    o.sc.model.precision.gemm = Dtype::kFp8;
    options.push_back(std::move(o));
  }
  if (training && dtype_bytes(m.precision.moments) == 4) {
    Option o{"model.precision.moments: bf16", sc};
    o.sc.model.precision.moments = Dtype::kBf16;
    options.push_back(std::move(o));
  }
  std::string fits, tried;
  for (const auto& o : options) {
    const double bytes = estimate_memory(o.sc, d, est.capacity).total_bytes();
    tried += fmt::format("{}{}", tried.empty() ? "" : ", ", o.key);
    if (bytes <= gpu_memory_bytes)
      fits += fmt::format("{}{} ({})", fits.empty() ? "" : " or ", o.key, gib(bytes));
  }
  std::string out = fmt::format("does not fit {}; ", gib(gpu_memory_bytes));
  if (!fits.empty()) return out + "fits with " + fits;
  if (tried.empty()) return out + "no single key of the scenario makes it fit";
  return out + "no single change fits (tried " + tried + ")";
}

std::int64_t nominal_capacity(const Scenario& sc, int multiple) {
  const auto& m = sc.model;
  // The largest factor the workload reaches (an upper bound of every iteration's dC); dropless
  // factors count as their cap -f, or 1 when uncapped.
  auto as_bound = [](double f) { return f > 0 ? f : f < 0 ? -f : 1.0; };
  double f = as_bound(m.capacity_factor);
  const auto& cap = sc.workload.capacity;
  if (cap.kind == CapacityKind::kTrace) {
    f = 0;
    for (double x : cap.factors) f = std::max(f, as_bound(x));
  } else if (cap.kind == CapacityKind::kRandomWalk) {
    f = cap.max;
  }
  return workload::capacity_slots(f, m.top_k, m.tokens_per_gpu(), m.experts, 0,
                                  std::max(multiple, 1));
}

}  // namespace moesim::strategies
