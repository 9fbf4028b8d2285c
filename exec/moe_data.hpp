// Seeded data of the real MoE layer and its single-process reference (docs/design.md §4.2 "data is
// real"). Every rank generates its own tokens and the (shared) gate and expert weights from the
// scenario's seed, so no data is broadcast; the reference recomputes a whole layer for any rank
// from the same seeds with plain loops (softmax, top-k, capacity rule, FFN, weighted
// sum), independent of the kernels and of the distributed layout it checks.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "core/scenario.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::exec {

/// Shape of one MoE layer as the executor runs it (fp32 on the host path).
struct MoeShape {
  int tokens = 0;      // S per rank
  int model_dim = 0;   // M
  int hidden_dim = 0;  // H
  int experts = 0;     // E (global)
  int top_k = 1;       // k
  // Node-limited routing (workload.routing.node_limit; kernels::GateParams): experts
  // [g * experts_per_group, (g + 1) * experts_per_group) sit on node g of the EP group, and a
  // token's choices come from at most group_limit of them. 0: no limit.
  int experts_per_group = 0;
  int group_limit = 0;
  bool node_limit_binds() const {
    return experts_per_group > 0 && group_limit > 0 && group_limit < top_k &&
           group_limit < experts / experts_per_group;
  }
};

/// The node-limit fields of MoeShape / GateParams for `sc` as rank `rank`'s EP group places the
/// experts (workload::expert_nodes): {experts per node, node_limit}, or {0, 0} without a limit.
/// Throws InputError when the group's nodes do not each hold the same number of consecutive
/// experts (the kernels' groups are equal blocks of expert ids).
std::pair<int, int> node_limit_groups(const Scenario& sc, int rank);

/// The gate's parameters for `tokens` of this shape's tokens (S, or an MP group's share) and
/// `capacity` slots per expert, node limit included: every data path's gate (host and GPU).
kernels::GateParams gate_params(const MoeShape& s, int tokens, int capacity);

/// Deterministic uniform floats in [-scale, scale] for stream (seed, a, b, c); element i of the
/// stream does not depend on how many elements are drawn.
void fill_uniform(std::vector<float>& out, std::uint64_t seed, std::uint64_t a, std::uint64_t b,
                  std::uint64_t c, float scale);

/// The rank whose key generates `rank`'s tokens: the first rank of its MP group (Megatron MP
/// ranks hold the same activations; ranks are MP-innermost, strategies::make_groups). `rank`
/// itself when mp = 1. Every data path and the check key tokens by it.
int token_key_rank(const ParallelismSpec& p, int rank);

/// Layer inputs and weights. Weight streams are keyed by (layer, expert) so every replica of an
/// expert (DP) holds the same parameters; token streams by (iteration, layer, global rank).
std::vector<float> make_tokens(const MoeShape& s, std::uint64_t seed, int iteration, int layer,
                               int rank);
std::vector<float> make_gate_weights(const MoeShape& s, std::uint64_t seed, int layer);    // M x E
std::vector<float> make_w1(const MoeShape& s, std::uint64_t seed, int layer, int expert);  // M x H
std::vector<float> make_w2(const MoeShape& s, std::uint64_t seed, int layer, int expert);  // H x M

/// Hidden-dim slice `part` of `parts` of an expert's weights (ESP shards, Tutel's P2 / r > 1
/// slices): columns [part * H / parts, (part + 1) * H / parts) of W1 (M x H/parts) and the same
/// rows of W2 (H/parts x M), cut from make_w1 / make_w2 so that the slices' partial outputs
/// relu(x W1_s) W2_s sum to the unsharded expert's output exactly (ReLU acts per hidden unit).
/// H must be a multiple of `parts`.
std::vector<float> make_w1_slice(const MoeShape& s, std::uint64_t seed, int layer, int expert,
                                 int part, int parts);
std::vector<float> make_w2_slice(const MoeShape& s, std::uint64_t seed, int layer, int expert,
                                 int part, int parts);

/// The reference gate of one rank's tokens: per (token, choice) entry t*k + c the chosen expert,
/// its softmax probability and whether it kept a capacity slot (all first choices in token order
/// before any second choice, ...; at most `capacity` per expert).
///
/// The kernel's logits (GateLogits, optional): the discrete decisions (which experts, which
/// nodes) are taken on them, and each is checked against the reference's own logit (|kernel -
/// reference| <= tolerance x (1 + |reference|)). A GPU GEMM sums in another order, so a token
/// whose k-th and (k+1)-th logits lie within rounding of each other could otherwise pick another
/// expert than the reference and fail --check although both are right; a wrong logit still
/// fails it (logits_wrong). Probabilities stay the reference's.
struct GateLogits {
  const float* logits =
      nullptr;  // S x E, the kernel's gate output; null: decide on the reference's
  double tolerance = 0;
};
struct ReferenceRouting {
  std::vector<int> expert;
  std::vector<float> prob;
  std::vector<char> kept;
  long long dropped = 0;
  long long logits_wrong = 0;  // kernel logits beyond the tolerance (GateLogits given)
};
ReferenceRouting reference_routing(const MoeShape& s, const std::vector<float>& tokens,
                                   const std::vector<float>& gate_w, int capacity,
                                   GateLogits kernel = {});

/// Reference output of one rank's layer: y (S x M) for `tokens`, capacity `capacity` slots per
/// expert assigned all first choices (in token order) before any second choice; a choice beyond
/// capacity is dropped. Expert FFN: relu(x W1) W2; output = sum over kept choices of the softmax
/// probability times the expert output. `dropped` receives the number of dropped choices.
std::vector<float> reference_layer(const MoeShape& s, const std::vector<float>& tokens,
                                   const std::vector<float>& gate_w,
                                   const std::vector<std::vector<float>>& w1,
                                   const std::vector<std::vector<float>>& w2, int capacity,
                                   long long* dropped);

/// reference_layer with the layer's seeded gate and expert weights (make_*), each expert's weights
/// generated only while its tokens are processed: what --check runs on every rank for its own
/// tokens. `kernel`: the gate's logits to decide on (GateLogits); `logits_wrong` receives how
/// many of them the reference rejects.
std::vector<float> reference_layer_seeded(const MoeShape& s, const std::vector<float>& tokens,
                                          std::uint64_t seed, int layer, int capacity,
                                          long long* dropped, GateLogits kernel = {},
                                          long long* logits_wrong = nullptr);

/// reference_layer_seeded for rows [first, first + count) of a routing unit: the gate and the
/// capacity rule see all s.tokens rows of `tokens` (a schedule that gates several ranks' tokens
/// together, or a slice of them, applies the capacity to that unit), the expert FFN runs only for
/// the rows asked for. Returns count x M; `dropped` receives the drops among those rows.
/// `kernel` / `logits_wrong`: the unit's gate logits to decide on, as reference_layer_seeded.
std::vector<float> reference_layer_seeded_rows(const MoeShape& s, const std::vector<float>& tokens,
                                               std::uint64_t seed, int layer, int capacity,
                                               int first, int count, long long* dropped,
                                               GateLogits kernel = {},
                                               long long* logits_wrong = nullptr);

/// reference_layer_seeded for a routing decided elsewhere (plan-routed layers,
/// exec/routed_path.hpp): entry t * k + c goes to expert[entry] (-1: dropped) with the gate's
/// softmax probability of that expert (the gate GEMM and softmax in double, as above).
std::vector<float> reference_layer_seeded_routed(const MoeShape& s,
                                                 const std::vector<float>& tokens,
                                                 std::uint64_t seed, int layer,
                                                 const std::vector<int>& expert);

/// The seeded output gradient dY (S x M) of one rank's layer (stream 5, keyed like the tokens):
/// the backward data path starts from it, so no loss function is needed.
std::vector<float> make_grad_output(const MoeShape& s, std::uint64_t seed, int iteration, int layer,
                                    int rank);

/// Reference gradients of one rank's layer for output gradient dY (double accumulation, the
/// routing of reference_routing: the discrete choices and drops are held fixed). dx (S x M) and
/// dgate_w (M x E) of this rank's tokens; dw1[e] (M x H) and dw2[e] (H x M) this rank's tokens'
/// contribution to every expert's gradient (zeros for experts none of them reached). The ReLU's
/// derivative at a pre-activation within rounding of 0 is a choice: the reference takes the fp32
/// CPU GEMM's sign (what the executor computes); every value is accumulated in double.
struct ReferenceGrads {
  std::vector<double> dx, dgate_w;
  std::vector<std::vector<double>> dw1, dw2;
  long long dropped = 0;
};
ReferenceGrads reference_backward(const MoeShape& s, const std::vector<float>& tokens,
                                  const std::vector<float>& gate_w,
                                  const std::vector<std::vector<float>>& w1,
                                  const std::vector<std::vector<float>>& w2,
                                  const std::vector<float>& dy, int capacity);
/// reference_backward with the layer's seeded weights, one expert at a time (E x M x H doubles
/// would not fit at real sizes): on_expert(e, dw1, dw2) is called for EVERY expert e = 0..E-1 in
/// order (so a caller may run a collective per expert); returns dx and dgate_w (dw1 / dw2 empty).
/// `routed_expert` (plan-routed layers): each entry's expert, -1 dropped, as
/// reference_layer_seeded_routed, instead of the capacity rule.
ReferenceGrads reference_backward_seeded(
    const MoeShape& s, const std::vector<float>& tokens, std::uint64_t seed, int layer,
    int capacity, const std::vector<float>& dy,
    const std::function<void(int, const std::vector<double>&, const std::vector<double>&)>&
        on_expert,
    const std::vector<int>* routed_expert = nullptr);

/// Relative tolerance of --check for a layer run in `dtype` against the (fp32-input, double-
/// accumulating) reference: |y - ref| <= tol * (1 + |ref|). fp32: 1e-4; fp16: 5e-3 (about 10
/// units of its rounding 2^-11); bf16: 2e-2 (about 5 units of 2^-8). Tokens, weights, hidden
/// activations and expert outputs are each rounded once to the dtype (the reference's inputs are
/// not) and every product accumulates in fp32; the gate runs in fp32 on fp32 tokens on every path,
/// so routing and drops match the reference exactly. tests/exec/exec_plan_test.cpp replays the GPU
/// path's arithmetic with the CPU kernels (M = 64, H = 128: max errors 1.3e-4 fp16, 1.0e-3 bf16,
/// expected to grow about as sqrt(K) with the GEMM depth, so 4-5x on exec-gpu-1's M = 512,
/// H = 2,048).
double check_tolerance(kernels::DType dtype);

/// The kernels' element type for a scenario dtype: tf32 runs as fp32 data, fp8 as fp16 (there
/// are no fp8 kernels). The GPU path's data and `calibrate --backend nccl`'s GEMMs use it.
kernels::DType kernel_dtype(Dtype d);

}  // namespace moesim::exec
