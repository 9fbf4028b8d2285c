// The host backend of the MoE layer program (exec/layer_program.hpp): the layer's buffers as
// host vectors (fp32 data) and LayerOps on the CPU kernels (kernels/moe_kernels.hpp) and the
// Communicator, collectives through the shared lowering (select_algorithm + run_phases). The
// plain, sharded and plan-routed host data paths all run their forward through it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "exec/communicator.hpp"
#include "exec/layer_program.hpp"

namespace moesim::topology {
class Topology;
}
namespace moesim::collectives {
struct CostContext;
}

namespace moesim::exec {

/// One layer's host buffers, allocated (zeroed) from layer_buffers(). kX aliases kX32, kTokIn32
/// kTokIn, kDX32 kDX and kDTokIn32 kDTokIn (the host path's data type is fp32).
class HostLayerBuffers {
 public:
  void allocate(const LayerLayout& L, const MoeShape& s);
  std::vector<float>& f(BufId id);
  const std::vector<float>& f(BufId id) const;
  std::vector<std::int32_t>& i(BufId id);
  const std::vector<std::int32_t>& i(BufId id) const;
  /// Every index of a buffer kind (kW1's slices, kIn's chunks, ...).
  const std::vector<std::vector<float>>& all(LayerBuf b) const;
  bool allocated() const { return allocated_; }

 private:
  static constexpr std::size_t kKinds = kLayerBufKinds;
  // The host path's data type is fp32: its fp32 copies of token rows are the rows themselves.
  static LayerBuf resolve(LayerBuf b) {
    if (b == LayerBuf::kX) return LayerBuf::kX32;
    if (b == LayerBuf::kTokIn32) return LayerBuf::kTokIn;
    if (b == LayerBuf::kDX32) return LayerBuf::kDX;
    if (b == LayerBuf::kDTokIn32) return LayerBuf::kDTokIn;
    return b;
  }
  std::array<std::vector<std::vector<float>>, kKinds> f_;
  std::array<std::vector<std::vector<std::int32_t>>, kKinds> i_;
  bool allocated_ = false;
};

/// One layer a data path built for the layer program, as another backend takes it over: the GPU
/// path uploads `buf` (loaded with the weights, tokens and routing tables) before the step and
/// downloads the output rows, kSlot and kLogits into it after, so the data path reads its results
/// as on the host path.
struct ProgramLayerRef {
  int block = -1;
  const LayerLayout* lay = nullptr;
  HostLayerBuffers* buf = nullptr;
};

/// plan_bytes_per_element > 0 (the Parm path): every padded exchange and group collective is
/// checked against the plan op's element count.
class HostLayerOps final : public LayerOps {
 public:
  HostLayerOps(Communicator& comm, const collectives::CostContext& cost,
               const topology::Topology& topo, const Plan& plan, const MoeShape& shape,
               HostLayerBuffers& buffers, int plan_bytes_per_element = 0)
      : comm_(comm),
        cost_(cost),
        topo_(topo),
        plan_(plan),
        shape_(shape),
        b_(buffers),
        plan_bytes_per_element_(plan_bytes_per_element) {}

  void gate(const kernels::GateParams& params) override;
  void routed_weights(BufId logits, BufId expert, BufId weight, int tokens, int experts,
                      int top_k) override;
  void gather_rows(BufId src, BufId dst, BufId index, int rows, std::size_t row_elems) override;
  void sum_rows(BufId src, BufId dst, BufId table, int rows, int terms, std::size_t row_elems,
                bool weighted, BufId weight) override;
  void widen(BufId src, BufId dst, std::size_t elements) override;
  void encode(BufId dst, int tokens, int num_experts, int capacity) override;
  void decode(BufId src, BufId dst, int tokens, int num_experts, int capacity) override;
  void decode_backward(BufId out, BufId d_out, int tokens, int num_experts, int capacity) override;
  void encode_backward(BufId d_slots, int tokens, int num_experts, int capacity) override;
  void relu_backward(BufId activated, BufId grad, std::size_t elements) override;
  void softmax_backward(BufId logits, BufId expert, BufId d_weight, BufId d_logits, int tokens,
                        int experts, int top_k) override;
  void narrow(BufId src, BufId dst, std::size_t elements) override;
  void dot_rows(BufId a, BufId a_row, BufId b, int rows, std::size_t row_elems, BufId out_index,
                BufId out) override;
  void zero(BufId buf, std::size_t elements) override;
  void widen_tokens(std::size_t) override {}  // kX is kX32 on the host path
  void copy(const BlockCopy& c) override;
  void gemm(const GemmJob& g, bool f32) override;
  void relu(BufId buf, std::size_t elements) override;
  void sum_slices(BufId src, BufId dst, int groups, int terms, std::size_t run) override;
  std::int64_t exchange(const Op& op, const Exchange& x) override;
  std::int64_t all_gather(const Op& op, BufId in, std::size_t elements, BufId out) override;
  std::int64_t reduce_scatter(const Op& op, BufId in, std::size_t elements, BufId out) override;
  std::int64_t all_reduce(const Op& op, BufId buf, std::size_t offset,
                          std::size_t elements) override;

 private:
  kernels::Routing routing(int tokens, int num_experts, int capacity) const;
  /// With plan_bytes_per_element > 0: `elements` must be what the plan's op counts (its bytes in
  /// the scenario's dtype), so the data path moves what the simulation charged.
  void expect_plan_elements(const Op& op, std::size_t elements) const;
  Communicator& comm_;
  const collectives::CostContext& cost_;
  const topology::Topology& topo_;
  const Plan& plan_;
  const MoeShape& shape_;
  HostLayerBuffers& b_;
  int plan_bytes_per_element_;
};

}  // namespace moesim::exec
