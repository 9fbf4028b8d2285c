// What a collective is lowered into and what a message costs at its endpoints: the types the
// strategies' collective definitions (strategies/collectives) produce and the network models
// (sim/) consume. They live here, with the strategies, so that strategies include nothing of any
// backend; sim/network_model.hpp names them Transfer etc.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace moesim {
struct Calibration;
}

namespace moesim::collectives {

/// One message between two GPUs (global ranks), `bytes` of payload. Each transfer is one message
/// for the per-message endpoint cost, so a batch of many small transfers is slower than one of
/// few large ones with the same bytes.
struct Transfer {
  std::int32_t src = 0;
  std::int32_t dst = 0;
  double bytes = 0;
};

/// Per-message endpoint cost and other knobs shared by the flow and simgrid models (and the
/// analytical model's alpha terms), so the engines stay comparable.
struct NetworkParams {
  double message_latency_s = 0;   // fixed startup per message, added to the route's latency
  double message_overhead_s = 0;  // endpoint time per message; bounds the message rate
  // Per-peer connection state (engine.peer_cache, engine.peer_miss_overhead): an endpoint keeps
  // the state of `peer_cache` peers hot (RDMA queue pairs in the NIC's cache); a sender posting
  // n > peer_cache messages at once (one per peer, as all-to-alls do) misses on a share
  // 1 - peer_cache / n of them, each miss costing peer_miss_overhead_s more. So the per-peer
  // cost of an all-to-all grows with the peer count, as measured (PipeMoE Fig. 6(b): alpha 45x
  // from 16 to 64 GPUs). peer_cache 0 = unlimited (no misses).
  int peer_cache = 0;
  double peer_miss_overhead_s = 0;
  /// Endpoint time of each message of a sender that posts `messages` messages in one batch.
  double overhead_s(std::int64_t messages) const {
    if (peer_cache <= 0 || messages <= peer_cache) return message_overhead_s;
    return message_overhead_s +
           peer_miss_overhead_s * (1.0 - static_cast<double>(peer_cache) / messages);
  }
  /// Measured per-collective lines (cluster.calibration's `collectives`), read only by the
  /// analytical path (sim/analytical_model: analytical_collective_time); null = closed forms.
  std::shared_ptr<const Calibration> calibration = nullptr;
};

/// Messages each GPU sends in one batch (transfers to another GPU with bytes > 0): what
/// NetworkParams::overhead_s reads. Reusable scratch; O(transfers) per count().
class SenderMessages {
 public:
  void count(const std::vector<Transfer>& transfers) {
    clear();
    for (const Transfer& t : transfers) {
      if (t.src == t.dst || t.bytes <= 0) continue;
      if (static_cast<std::size_t>(t.src) >= n_.size()) n_.resize(t.src + 1, 0);
      if (n_[t.src]++ == 0) touched_.push_back(t.src);
    }
  }
  std::int64_t operator[](int gpu) const {
    return static_cast<std::size_t>(gpu) < n_.size() ? n_[gpu] : 0;
  }
  void clear() {
    for (int g : touched_) n_[g] = 0;
    touched_.clear();
  }

 private:
  std::vector<std::int64_t> n_;
  std::vector<int> touched_;
};

}  // namespace moesim::collectives
