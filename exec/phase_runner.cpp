#include "exec/phase_runner.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "kernels/moe_kernels.hpp"

namespace moesim::exec {

namespace {

using collectives::Buffer;
using collectives::Phase;

std::size_t whole(double v) { return static_cast<std::size_t>(std::llround(v)); }

struct Buffers {
  const std::byte* send;
  std::size_t send_bytes;
  std::byte* recv;
  std::size_t recv_bytes;
  std::vector<std::byte> scratch;

  std::size_t size(Buffer b) const {
    return b == Buffer::kSend ? send_bytes : b == Buffer::kRecv ? recv_bytes : scratch.size();
  }
  const std::byte* read(Buffer b, std::size_t off, std::size_t bytes) const {
    check(b, off, bytes);
    return (b == Buffer::kSend ? send : b == Buffer::kRecv ? recv : scratch.data()) + off;
  }
  std::byte* write(Buffer b, std::size_t off, std::size_t bytes) {
    MOESIM_ASSERT(b != Buffer::kSend, "a collective phase writes into its send buffer");
    check(b, off, bytes);
    return (b == Buffer::kRecv ? recv : scratch.data()) + off;
  }
  void check(Buffer b, std::size_t off, std::size_t bytes) const {
    MOESIM_ASSERT(off + bytes <= size(b),
                  fmt::format("phase access [{}, {}) outside buffer {} of {} bytes", off,
                              off + bytes, static_cast<int>(b), size(b)));
  }
};

// Scratch bytes this rank's phases touch (the lowering documents its sizing; measuring it here
// keeps exec independent of each algorithm's formula).
std::size_t scratch_extent(const std::vector<Phase>& phases, int me) {
  std::size_t ext = 0;
  auto touch = [&](Buffer b, double off, double bytes) {
    if (b == Buffer::kScratch) ext = std::max(ext, whole(off) + whole(bytes));
  };
  for (const Phase& ph : phases) {
    if (ph.kind == Phase::Kind::kTransfers) {
      for (size_t i = 0; i < ph.transfers.size(); ++i) {
        const auto& t = ph.transfers[i];
        if (t.src == me) touch(ph.src, ph.chunks[i].send_offset, t.bytes);
        if (t.dst == me) touch(ph.dst, ph.chunks[i].recv_offset, t.bytes);
      }
    }
    if (ph.kind == Phase::Kind::kCopy && ph.stride_h > 0) {
      const double all = static_cast<double>(ph.stride_h) * ph.stride_w * ph.chunk_bytes;
      touch(ph.src, 0, all);
      touch(ph.dst, 0, all);
    }
    for (const auto& c : ph.copies)
      if (c.rank == me) {
        touch(ph.src, c.src_offset, c.bytes);
        touch(ph.dst, c.dst_offset, c.bytes);
      }
  }
  return ext;
}

}  // namespace

PhaseStats run_phases(Communicator& comm, const std::vector<Phase>& phases, const std::byte* send,
                      std::size_t send_bytes, std::byte* recv, std::size_t recv_bytes, int tag) {
  const int me = comm.rank();
  Buffers buf{send, send_bytes, recv, recv_bytes, {}};
  buf.scratch.resize(scratch_extent(phases, me));
  PhaseStats stats;
  kernels::cpu::Context kctx;
  std::vector<SendSpec> sends;
  std::vector<RecvSpec> recvs;
  for (const Phase& ph : phases) {
    if (ph.kind == Phase::Kind::kReduce || ph.repeat != 1)
      throw InternalError(fmt::format(
          "phase '{}' ({}) is a reduction or repeated ring step: run through the communicator's "
          "collectives, not run_phases",
          ph.label, ph.kind == Phase::Kind::kReduce ? "reduce" : "repeat"));
    if (ph.kind == Phase::Kind::kTransfers) {
      MOESIM_ASSERT(ph.chunks.size() == ph.transfers.size(),
                    "exec needs the lowering with layout (CollectiveCall::with_layout)");
      sends.clear();
      recvs.clear();
      for (size_t i = 0; i < ph.transfers.size(); ++i) {
        const auto& t = ph.transfers[i];
        const std::size_t bytes = whole(t.bytes);
        if (bytes == 0) continue;
        if (t.src == me && t.dst == me) {
          std::memmove(buf.write(ph.dst, whole(ph.chunks[i].recv_offset), bytes),
                       buf.read(ph.src, whole(ph.chunks[i].send_offset), bytes), bytes);
          continue;
        }
        if (t.src == me) {
          sends.push_back({t.dst, buf.read(ph.src, whole(ph.chunks[i].send_offset), bytes), bytes});
          stats.sent_bytes += bytes;
        }
        if (t.dst == me)
          recvs.push_back(
              {t.src, buf.write(ph.dst, whole(ph.chunks[i].recv_offset), bytes), bytes});
      }
      // Self copies run while the messages fly (they touch disjoint ranges of the buffers).
      for (const auto& c : ph.copies)
        if (c.rank == me && whole(c.bytes) > 0) {
          const std::size_t bytes = whole(c.bytes);
          std::memcpy(buf.write(ph.dst, whole(c.dst_offset), bytes),
                      buf.read(ph.src, whole(c.src_offset), bytes), bytes);
          stats.copied_bytes += bytes;
        }
      comm.exchange(sends, recvs, tag);
      ++stats.exchanges;
      continue;
    }
    // kCopy: a uniform stride copy, or explicit variable-size blocks (2DH all_to_allv).
    if (ph.stride_h > 0) {
      const std::size_t chunk = whole(ph.chunk_bytes);
      const std::size_t all = chunk * ph.stride_h * ph.stride_w;
      if (all > 0) {
        kernels::cpu::stride_copy(kctx, buf.read(ph.src, 0, all), buf.write(ph.dst, 0, all),
                                  ph.stride_h, ph.stride_w, chunk);
        stats.copied_bytes += all;
      }
    }
    for (const auto& c : ph.copies)
      if (c.rank == me && whole(c.bytes) > 0) {
        const std::size_t bytes = whole(c.bytes);
        std::memcpy(buf.write(ph.dst, whole(c.dst_offset), bytes),
                    buf.read(ph.src, whole(c.src_offset), bytes), bytes);
        stats.copied_bytes += bytes;
      }
  }
  return stats;
}

}  // namespace moesim::exec
