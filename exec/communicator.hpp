// The communicator abstraction of the real backend (docs/design.md §4.2): what the executor needs
// from MPI (host path) or NCCL (GPU path). Buffers of this interface are host byte ranges (the NCCL
// communicator stages them through the device; its device-buffer mode, used by the executor's
// GPU path, takes device pointers and a stream per call, see nccl_communicator.hpp). Ranks are
// global (MPI_COMM_WORLD) ranks; groups are lists of global ranks in group order, as in
// core/plan.hpp's Grouping.
//
// Every blocking call is bounded by a timeout (ExecError instead of a hang, docs/design.md §4.2
// "never a hang"): a peer that died or never posts its half of an exchange is reported by name.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace moesim::exec {

/// A failure at the execution boundary (MPI, NCCL, CUDA, a timeout). Exit code 1.
class ExecError : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

/// One message of a grouped phase: `bytes` from/to `data`, to/from global rank `peer`.
struct SendSpec {
  int peer = 0;
  const std::byte* data = nullptr;
  std::size_t bytes = 0;
};
struct RecvSpec {
  int peer = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

// What the MPI and the NCCL communicator share lives here: the world rank and size (both bind to
// MPI_COMM_WORLD's numbering), and the host-buffer interface below. The NCCL communicator adds a
// device-buffer mode of its own (nccl_communicator.hpp) for the executor's GPU path.
class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "mpi" or "nccl": the RunResult::backend string.
  virtual std::string_view name() const = 0;

  /// One grouped phase of a lowered collective (collectives::Phase kTransfers): every send and
  /// receive is posted at once and the call returns when all have completed (NCCL: one
  /// ncclGroupStart/End of ncclSend/ncclRecv). `tag` separates concurrent collectives.
  virtual void exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                        int tag) = 0;
  /// Variable all-to-all over `group` (global ranks; this rank must be a member): counts and
  /// displacements in bytes, indexed by group position.
  virtual void all_to_allv(const std::byte* send, std::span<const std::size_t> send_counts,
                           std::span<const std::size_t> send_displs, std::byte* recv,
                           std::span<const std::size_t> recv_counts,
                           std::span<const std::size_t> recv_displs,
                           std::span<const int> group) = 0;
  /// In-place sum of `count` floats over `group`.
  virtual void all_reduce_sum(float* data, std::size_t count, std::span<const int> group) = 0;
  /// out (group_size * bytes) receives every member's `bytes` of `in`, in group order.
  virtual void all_gather(const std::byte* in, std::size_t bytes, std::byte* out,
                          std::span<const int> group) = 0;
  /// in holds group_size blocks of `count` floats; out receives the sum of block `position`.
  virtual void reduce_scatter_sum(const float* in, float* out, std::size_t count,
                                  std::span<const int> group) = 0;
  virtual void barrier() = 0;

 protected:
  int rank_ = 0, size_ = 1;  // set by the derived constructor from MPI_COMM_WORLD
};

/// Seconds a blocking call may wait before ExecError: $MOESIM_EXEC_TIMEOUT_S, default 120.
double exec_timeout_s();

}  // namespace moesim::exec
