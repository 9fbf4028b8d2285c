#include "exec/phase_runner.hpp"

#include <fmt/format.h>

#include <algorithm>
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
  std::byte* scratch;
  std::size_t scratch_bytes;

  std::size_t size(Buffer b) const {
    return b == Buffer::kSend ? send_bytes : b == Buffer::kRecv ? recv_bytes : scratch_bytes;
  }
  const std::byte* read(Buffer b, std::size_t off, std::size_t bytes) const {
    check(b, off, bytes);
    return (b == Buffer::kSend ? send : b == Buffer::kRecv ? recv : scratch) + off;
  }
  std::byte* write(Buffer b, std::size_t off, std::size_t bytes) {
    MOESIM_ASSERT(b != Buffer::kSend, "a collective phase writes into its send buffer");
    check(b, off, bytes);
    return (b == Buffer::kRecv ? recv : scratch) + off;
  }
  void check(Buffer b, std::size_t off, std::size_t bytes) const {
    MOESIM_ASSERT(off + bytes <= size(b),
                  fmt::format("phase access [{}, {}) outside buffer {} of {} bytes", off,
                              off + bytes, static_cast<int>(b), size(b)));
  }
};

}  // namespace

// Bytes of `which` this rank's phases touch (the lowering documents its sizing; measuring it here
// keeps exec independent of each algorithm's formula).
std::size_t phase_buffer_extent(const std::vector<Phase>& phases, int me, Buffer which) {
  std::size_t ext = 0;
  auto touch = [&](Buffer b, double off, double bytes) {
    if (b == which) ext = std::max(ext, whole(off) + whole(bytes));
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

namespace {
std::size_t scratch_extent(const std::vector<Phase>& phases, int me) {
  return phase_buffer_extent(phases, me, Buffer::kScratch);
}
}  // namespace

std::byte* HostPhaseIo::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void HostPhaseIo::copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::memmove(dst, src, bytes);
}

void HostPhaseIo::stride_copy(const std::byte* src, std::byte* dst, int h, int w,
                              std::size_t chunk_bytes) {
  kernels::cpu::Context kctx;
  kernels::cpu::stride_copy(kctx, src, dst, h, w, chunk_bytes);
}

void HostPhaseIo::exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                           std::span<const SendSpec> sends2, std::span<const RecvSpec> recvs2,
                           int tag) {
  if (sends2.empty() && recvs2.empty()) {
    comm_.exchange(sends, recvs, tag);
    return;
  }
  s_.assign(sends.begin(), sends.end());
  s_.insert(s_.end(), sends2.begin(), sends2.end());
  r_.assign(recvs.begin(), recvs.end());
  r_.insert(r_.end(), recvs2.begin(), recvs2.end());
  comm_.exchange(s_, r_, tag);
}

PhaseStats run_phases(Communicator& comm, const std::vector<Phase>& phases, const std::byte* send,
                      std::size_t send_bytes, std::byte* recv, std::size_t recv_bytes, int tag,
                      const SaaLayout* saa) {
  HostPhaseIo io(comm);
  return run_phases(io, comm.rank(), phases, send, send_bytes, recv, recv_bytes, tag, saa);
}

PhaseStats run_phases(PhaseIo& io, int me, const std::vector<Phase>& phases, const std::byte* send,
                      std::size_t send_bytes, std::byte* recv, std::size_t recv_bytes, int tag,
                      const SaaLayout* saa) {
  const std::size_t scratch_bytes = scratch_extent(phases, me);
  Buffers buf{send,
              send_bytes,
              recv,
              recv_bytes,
              scratch_bytes > 0 ? io.scratch(scratch_bytes) : nullptr,
              scratch_bytes};
  PhaseStats stats;
  // SAA: n + 1 saa_step phases; step k < n starts with the W * (A - 1) all-to-all transfers.
  int saa_steps = 0, saa_step = 0, saa_a = 1;
  double saa_c = 0, saa_q = 0;
  if (saa) {
    for (const Phase& ph : phases) saa_steps += ph.saa_step ? 1 : 0;
    MOESIM_ASSERT(saa->sub_group >= 1 && saa->group_size % saa->sub_group == 0,
                  "saa layout: sub_group must divide the group size");
    saa_a = saa->a2a_peers();
    saa_c = saa->bytes / saa_a;
    saa_q = saa_steps > 1 ? saa_c / (saa_steps - 1) : 0;
  }
  std::vector<SendSpec> sends, sends2;
  std::vector<RecvSpec> recvs, recvs2;
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
      sends2.clear();
      recvs2.clear();
      std::size_t first_forward = ph.transfers.size();
      if (saa && ph.saa_step) {
        const std::size_t a2a =
            saa_step < saa_steps - 1 ? static_cast<std::size_t>(saa->group_size) * (saa_a - 1) : 0;
        first_forward = std::min(a2a, ph.transfers.size());
        ++saa_step;
      }
      for (size_t i = 0; i < ph.transfers.size(); ++i) {
        const auto& t = ph.transfers[i];
        const std::size_t bytes = whole(t.bytes);
        if (bytes == 0) continue;
        if (i >= first_forward) {
          // A forwarded SAA slice: A pieces of q bytes, strided by c, same offsets both sides,
          // in kRecv (the all-to-all's output), as one grouped set of messages to the peer.
          const std::size_t piece = whole(saa_q);
          for (int a = 0; a < saa_a && piece > 0; ++a) {
            const std::size_t off = whole(ph.chunks[i].send_offset + a * saa_c);
            if (t.src == me) {
              sends2.push_back({t.dst, buf.read(Buffer::kRecv, off, piece), piece});
              stats.sent_bytes += piece;
            }
            if (t.dst == me) recvs2.push_back({t.src, buf.write(Buffer::kRecv, off, piece), piece});
          }
          continue;
        }
        if (t.src == me && t.dst == me) {
          io.copy(buf.write(ph.dst, whole(ph.chunks[i].recv_offset), bytes),
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
          io.copy(buf.write(ph.dst, whole(c.dst_offset), bytes),
                  buf.read(ph.src, whole(c.src_offset), bytes), bytes);
          stats.copied_bytes += bytes;
        }
      io.exchange(sends, recvs, sends2, recvs2, tag);
      ++stats.exchanges;
      continue;
    }
    // kCopy: a uniform stride copy, or explicit variable-size blocks (2DH all_to_allv).
    if (ph.stride_h > 0) {
      const std::size_t chunk = whole(ph.chunk_bytes);
      const std::size_t all = chunk * ph.stride_h * ph.stride_w;
      if (all > 0) {
        io.stride_copy(buf.read(ph.src, 0, all), buf.write(ph.dst, 0, all), ph.stride_h,
                       ph.stride_w, chunk);
        stats.copied_bytes += all;
      }
    }
    for (const auto& c : ph.copies)
      if (c.rank == me && whole(c.bytes) > 0) {
        const std::size_t bytes = whole(c.bytes);
        io.copy(buf.write(ph.dst, whole(c.dst_offset), bytes),
                buf.read(ph.src, whole(c.src_offset), bytes), bytes);
        stats.copied_bytes += bytes;
      }
  }
  return stats;
}

}  // namespace moesim::exec
