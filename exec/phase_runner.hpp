// Runs this rank's part of a lowered collective (strategies/collectives: the same phases and
// chunk layout the simulator prices), so what is simulated is what runs: every kTransfers phase
// becomes one grouped exchange of exactly the phase's transfers at their ChunkRef offsets, kCopy
// phases the 2DH stride copies or the explicit LocalCopy blocks.
//
// Where the bytes live and how they move is a PhaseIo: the host (memcpy, kernels::cpu::
// stride_copy, Communicator::exchange, blocking) or the device (the executor's GPU path:
// cudaMemcpyAsync, kernels::cuda::stride_copy and NCCL grouped send/recv enqueued on the op's
// stream, see exec/cuda_executor.cpp). The walk over the phases is the same for both.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "exec/communicator.hpp"
#include "strategies/collectives/collective.hpp"

namespace moesim::exec {

/// What one phase list moved from this rank (for tests and records).
struct PhaseStats {
  int exchanges = 0;  // kTransfers phases run
  std::size_t sent_bytes = 0;
  std::size_t copied_bytes = 0;  // local copies and stride copies
};

/// The memory and transport a phase list runs on. Calls are issued in phase order; a backend may
/// return before the work is done as long as it keeps that order (a CUDA stream does).
class PhaseIo {
 public:
  virtual ~PhaseIo() = default;
  /// Scratch of at least `bytes` for one phase list (valid until the next call).
  virtual std::byte* scratch(std::size_t bytes) = 0;
  virtual void copy(std::byte* dst, const std::byte* src, std::size_t bytes) = 0;
  virtual void stride_copy(const std::byte* src, std::byte* dst, int h, int w,
                           std::size_t chunk_bytes) = 0;
  /// One kTransfers phase. `sends2` / `recvs2` are a second set of the same phase that may run
  /// concurrently on a second stream (SAA's all-gather part); the phase ends when both have.
  virtual void exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                        std::span<const SendSpec> sends2, std::span<const RecvSpec> recvs2,
                        int tag) = 0;
};

/// Host memory through a (host-buffer) Communicator: both transfer sets as one blocking exchange.
class HostPhaseIo final : public PhaseIo {
 public:
  explicit HostPhaseIo(Communicator& comm) : comm_(comm) {}
  std::byte* scratch(std::size_t bytes) override;
  void copy(std::byte* dst, const std::byte* src, std::size_t bytes) override;
  void stride_copy(const std::byte* src, std::byte* dst, int h, int w,
                   std::size_t chunk_bytes) override;
  void exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                std::span<const SendSpec> sends2, std::span<const RecvSpec> recvs2,
                int tag) override;

 private:
  Communicator& comm_;
  std::vector<std::byte> scratch_;
  std::vector<SendSpec> s_;
  std::vector<RecvSpec> r_;
};

/// SAA's layout (strategies/collectives/saa.cpp) for run_phases: which transfers of a step are
/// the all-to-all part and where a forwarded slice's strided pieces are.
struct SaaLayout {
  int group_size = 0;            // W
  int sub_group = 1;             // m
  double bytes = 0;              // S, what each rank sends in the all-to-all
  bool a2a_spans_group = false;  // the all-to-all peers: all W positions, or the W / m of one t

  SaaLayout(const CollectiveSpec& spec, int w, double send_bytes)
      : group_size(w),
        sub_group(std::max(1, spec.sub_group)),
        bytes(send_bytes),
        a2a_spans_group(spec.saa_a2a_spans_group) {}
  /// A: the all-to-all peers of a rank (itself included).
  int a2a_peers() const { return a2a_spans_group ? group_size : group_size / sub_group; }
};

/// Bytes of buffer `which` that rank `me`'s part of `phases` reaches (largest offset + size).
/// A 2DH all_to_allv stages the intra-node phase's blocks in the receive buffer: a rank that
/// forwards more than it finally receives needs a receive buffer larger than its column sum.
std::size_t phase_buffer_extent(const std::vector<collectives::Phase>& phases, int me,
                                collectives::Buffer which);

/// Runs `phases` on rank `me` with its kSend / kRecv buffers through `io`; kScratch is taken
/// from io.scratch() to the extent the phases use. Offsets are rounded to whole bytes; every
/// access is checked against the buffer sizes (InternalError if a lowering reaches outside them).
/// Ring phases with repeat > 1 and kReduce phases are not run here (the executor sends
/// all_reduce, all_gather and reduce_scatter to the communicator's own collectives) and throw
/// InternalError. With `saa`, each saa_step phase's all-to-all transfers go as the first set and
/// the forwarded slices (A pieces strided by the chunk size c = S / A, each c / n bytes) as the
/// second set of io.exchange().
PhaseStats run_phases(PhaseIo& io, int me, const std::vector<collectives::Phase>& phases,
                      const std::byte* send, std::size_t send_bytes, std::byte* recv,
                      std::size_t recv_bytes, int tag, const SaaLayout* saa = nullptr);

/// Host-memory shorthand: run_phases through HostPhaseIo(comm) as rank comm.rank().
PhaseStats run_phases(Communicator& comm, const std::vector<collectives::Phase>& phases,
                      const std::byte* send, std::size_t send_bytes, std::byte* recv,
                      std::size_t recv_bytes, int tag, const SaaLayout* saa = nullptr);

}  // namespace moesim::exec
