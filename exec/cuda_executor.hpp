// The GPU path of the plan executor (docs/design.md §4.2), built with CUDA and NCCL
// (MOESIM_HAVE_NCCL). Executor creates it when its communicator is an NcclCommunicator; the host
// path (executor.cpp) is untouched. Per step:
//  * Memory: per MoE layer one cudaMalloc'd arena sized from the plan (weights, tokens, routing
//    tables, dispatched / expert buffers, per chunk send / input / hidden / output / receive
//    buffers), grown only between steps; one arena for the GEMM operands of the ops outside the
//    MoE data path (largest shape of the plan, zeroed once) and one for copy ops. Collective
//    buffers outside the data path and phase scratch come from the stream-ordered allocator
//    (cudaMallocAsync / cudaFreeAsync on the op's stream, a pool that is never trimmed), so no
//    allocation inside the step synchronises the device.
//  * Streams: one CUDA stream per plan stream (compute, comm, comm_out, param, grad, ...) plus
//    SAA's second stream ("comm2"); each with its own kernels::cuda::Context (cuBLAS handle).
//  * Order: ops are issued in priority_issue_order(plan) (Lina's priorities). A dep on another
//    stream is a cudaStreamWaitEvent on the dep's end event; same-stream deps are stream order.
//    Lina's micro-op gate: a collective of negative priority (a gradient all-reduce micro-op)
//    also waits for the end of the latest positive-priority collective (all-to-all) issued before
//    it on every other stream, so micro-ops run in the gaps between all-to-alls.
//  * Data: the layer program (exec/layer_program.hpp), the host path's steps, through
//    DeviceLayerOps: gate (fp32 GEMM + top-k + capacity on fp32 tokens), encode, dispatch
//    all-to-all (the lowered linear / 2DH / SAA phases as NCCL grouped send/recv on the op's
//    stream), expert fc1 + ReLU and fc2 as cuBLAS strided-batched GEMMs with fp32 compute in the
//    scenario's dtype (the plan's chunk shapes), combine, decode; the buffers are the program's
//    layer_buffers() in one arena per layer. all_reduce / all_gather / reduce_scatter go to
//    ncclAllReduce / ncclAllGather / ncclReduceScatter on per-group sub-communicators. Other
//    compute ops with a GEMM shape run that GEMM (cuBLAS, operands from the GEMM arena); other
//    compute ops are empty (an event pair); copy ops are device-to-device copies of their bytes.
//  * Timing: an event pair per op (start after its deps, end after its work), read after one
//    synchronize of every stream at the end of the step (polled against the timeout, NCCL errors
//    abort); times are seconds from a base event every stream waits on after a world barrier.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/plan.hpp"
#include "core/scenario.hpp"
#include "exec/executor.hpp"
#include "exec/host_layer.hpp"
#include "exec/moe_data.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::exec {

class NcclCommunicator;

/// What one step on the device produced for this rank.
struct DeviceStep {
  std::vector<double> times;  // (start, end) of every op of this rank, op id order
};

class DevicePath {
 public:
  /// data_path: run the MoE forward on real data (the layers run() is given); otherwise every
  /// op runs on scratch buffers of the plan's sizes.
  DevicePath(const Scenario& sc, const topology::Topology& topo, NcclCommunicator& comm,
             const MoeShape& shape, kernels::DType dtype, bool data_path);
  ~DevicePath();
  DevicePath(const DevicePath&) = delete;
  DevicePath& operator=(const DevicePath&) = delete;

  /// One step of `plan` (a collective call on every rank). `layers`: the MoE layers the data
  /// paths built for this rank (plain, plan-routed, sharded, Parm), run through the layer program;
  /// their host buffers are uploaded before and receive the outputs, kSlot and kLogits after
  /// (ProgramLayerRef). `barrier` runs after every buffer is ready and before the first op is
  /// issued. collective_algo[op] receives each collective's resolved algorithm.
  DeviceStep run(const Plan& plan, const std::vector<ProgramLayerRef>& layers,
                 std::vector<std::int64_t>& collective_algo, const std::function<void()>& barrier);

  kernels::DType dtype() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim::exec
