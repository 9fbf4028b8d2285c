// Runs this rank's part of a lowered collective (strategies/collectives: the same phases and
// chunk layout the simulator prices), so what is simulated is what runs: every kTransfers phase
// becomes one grouped exchange of exactly the phase's transfers at their ChunkRef offsets, kCopy
// phases the 2DH stride copies (kernels::cpu::stride_copy) or the explicit LocalCopy blocks.
#pragma once

#include <cstddef>
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

/// Runs `phases` on this rank (comm.rank()) with its kSend / kRecv buffers; kScratch is allocated
/// to the extent the phases use. Offsets are rounded to whole bytes; every access is checked
/// against the buffer sizes (InternalError if a lowering reaches outside them). Ring phases with
/// repeat > 1 and kReduce phases are not run here (the executor sends all_reduce, all_gather and
/// reduce_scatter to the communicator's own collectives) and throw InternalError.
PhaseStats run_phases(Communicator& comm, const std::vector<collectives::Phase>& phases,
                      const std::byte* send, std::size_t send_bytes, std::byte* recv,
                      std::size_t recv_bytes, int tag);

}  // namespace moesim::exec
