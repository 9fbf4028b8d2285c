// The NCCL communicator (DESIGN §4.2), built only with MOESIM_WITH_CUDA and NCCL found
// (MOESIM_HAVE_NCCL). Bootstrap: rank 0 creates the unique id, MPI broadcasts it, every rank
// binds GPU local_rank % device_count and joins one world communicator.
//
// Every phase is one grouped ncclSend/ncclRecv (ncclGroupStart/End) on one CUDA stream, exactly
// the transfers the collective library lowers. This first version takes host buffers (the
// executor's host data path) and stages them through device buffers, so the same executor and
// --check run over NCCL; group collectives (all_reduce, all_gather, reduce_scatter) are built
// from grouped send/recv among the members (NCCL sub-communicators would need every world rank
// to split together, which the per-op lazy use here cannot promise). Waits poll the stream and
// ncclCommGetAsyncError against exec_timeout_s() and abort the communicator instead of hanging.
#pragma once

#include <memory>

#include "exec/communicator.hpp"

namespace moesim::exec {

class MpiSession;

class NcclCommunicator : public Communicator {
 public:
  explicit NcclCommunicator(const MpiSession& session);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace moesim::exec
