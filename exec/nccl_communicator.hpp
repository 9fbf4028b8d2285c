// The NCCL communicator (docs/design.md §4.2), built only with MOESIM_WITH_CUDA and NCCL found
// (MOESIM_HAVE_NCCL). Bootstrap: rank 0 creates the unique id, MPI broadcasts it, every rank
// binds GPU local_rank % device_count and joins one world communicator.
//
// Two modes:
//  * Host buffers (the Communicator interface): every phase is one grouped ncclSend/ncclRecv
//    (ncclGroupStart/End) on an internal stream, staged through a device buffer; group collectives
//    are built from grouped send/recv among the members (no sub-communicators needed, so any rank
//    subset may call them lazily). Used by tests and the host data layout.
//  * Device buffers (the executor's GPU path, the *_on methods): device pointers, enqueued on the
//    caller's stream and returned at once (no host sync). Communicators are made once, before the
//    step, by collective calls every world rank makes in the same order (prepare_channels,
//    prepare_group: ncclCommSplit of the world communicator), so there is no lazy creation that
//    could deadlock: one world communicator per channel (the executor uses one channel per plan
//    stream plus SAA's second stream, so operations issued on different streams never share a
//    communicator, whose operations NCCL requires in one issue order), and per (grouping, channel)
//    a sub-communicator per group (colour = group index, key = position) for ncclAllReduce /
//    ncclAllGather / ncclReduceScatter.
// Waits poll the streams and ncclCommGetAsyncError against exec_timeout_s() and abort every
// communicator instead of hanging.
#pragma once

#include <memory>
#include <string>

#include "core/plan.hpp"
#include "exec/communicator.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::exec {

class MpiSession;

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(const MpiSession& session);
  ~NcclCommunicator() override;

  std::string_view name() const override { return "nccl"; }

  void exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, int tag) override;
  void all_to_allv(const std::byte* send, std::span<const std::size_t> send_counts,
                   std::span<const std::size_t> send_displs, std::byte* recv,
                   std::span<const std::size_t> recv_counts,
                   std::span<const std::size_t> recv_displs, std::span<const int> group) override;
  void all_reduce_sum(float* data, std::size_t count, std::span<const int> group) override;
  void all_gather(const std::byte* in, std::size_t bytes, std::byte* out,
                  std::span<const int> group) override;
  void reduce_scatter_sum(const float* in, float* out, std::size_t count,
                          std::span<const int> group) override;
  void barrier() override;

  // --- Device-buffer mode ------------------------------------------------------------------------
  using Stream = kernels::cuda::Stream;
  /// The GPU this rank bound (local_rank % device count).
  int device() const;
  /// Makes world communicators for channels [0, channels) that do not exist yet. Collective.
  void prepare_channels(int channels);
  /// Makes the sub-communicators of `grouping` on `channel` unless made before. Collective: every
  /// world rank calls it with the same arguments in the same order (ranks outside every group
  /// pass no colour).
  void prepare_group(const Grouping& grouping, int channel);
  /// One grouped send/recv phase among global ranks on `channel`, enqueued on `stream`.
  void exchange_on(int channel, Stream stream, std::span<const SendSpec> sends,
                   std::span<const RecvSpec> recvs);
  /// Two send/recv sets that run at the same time, each on its own channel and stream (SAA's
  /// all-to-all and all-gather transfers): one NCCL group around both, as NCCL requires of
  /// operations on several communicators that are in flight together (two groups issued one
  /// after the other may deadlock when one's kernels wait for SMs the other holds).
  void exchange_two_on(int channel, Stream stream, std::span<const SendSpec> sends,
                       std::span<const RecvSpec> recvs, int channel2, Stream stream2,
                       std::span<const SendSpec> sends2, std::span<const RecvSpec> recvs2);
  /// In-place sum of `count` elements of `dtype` over this rank's group of `grouping`.
  void all_reduce_on(const Grouping& grouping, int channel, Stream stream, void* data,
                     std::size_t count, kernels::DType dtype);
  /// out (group size * bytes) receives every member's `bytes` of `in`, in group order.
  void all_gather_on(const Grouping& grouping, int channel, Stream stream, const void* in,
                     std::size_t bytes, void* out);
  /// in: group size blocks of `count` elements; out: the sum of this member's block.
  void reduce_scatter_on(const Grouping& grouping, int channel, Stream stream, const void* in,
                         void* out, std::size_t count, kernels::DType dtype);
  /// Waits until every stream is idle, polling them and the communicators' asynchronous errors;
  /// on an error or after exec_timeout_s() aborts every communicator and throws ExecError.
  void wait_streams(std::span<const Stream> streams, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moesim::exec
