// The interface between the discrete-event engine (sim/engine) and the network models
// (analytical, flow, simgrid). The engine lowers every collective into phases of transfers
// (strategies/collectives) and hands each phase to the model as one batch; the model tells the
// engine when batches complete. Concurrent batches (two collectives on different streams, two
// groups) share the network inside the model, which is where contention is seen.
//
// Time is in seconds of simulated time, a double. The engine calls, in a loop:
//   start_batch(now, ...)  zero or more times at the current time,
//   t = next_completion_time(),
//   advance_to(min(t, engine's next own event)) and handles the batches it returns.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

namespace moesim {
struct Calibration;
}
namespace moesim::topology {
class Topology;
}

namespace moesim::sim {

/// One message between two GPUs (global ranks), `bytes` of payload. Each transfer is one message
/// for the per-message endpoint cost, so a batch of many small transfers is slower than one of
/// few large ones with the same bytes.
struct Transfer {
  std::int32_t src = 0;
  std::int32_t dst = 0;
  double bytes = 0;
};

using BatchId = std::int64_t;

struct BatchCompletion {
  BatchId id = -1;
  double time_s = 0;
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

class NetworkModel {
 public:
  virtual ~NetworkModel() = default;
  virtual std::string_view name() const = 0;

  /// Starts a batch of transfers at `now_s` (never earlier than any earlier call). An empty
  /// batch, or one whose transfers all have zero bytes, completes at now_s (plus latency for
  /// non-empty ones). `priority` lets models that support it favour a batch; others ignore it.
  virtual BatchId start_batch(double now_s, const std::vector<Transfer>& transfers,
                              int priority = 0) = 0;

  /// Earliest time at which a started batch completes; +infinity when none is in flight.
  virtual double next_completion_time() = 0;

  /// Advances the model's clock to t (<= next_completion_time()) and returns the batches that
  /// complete at exactly t (all of them, in increasing id order).
  virtual std::vector<BatchCompletion> advance_to(double t) = 0;

  /// Bytes carried per directed link so far (for utilisation reports); empty if not tracked.
  virtual std::vector<double> link_bytes() const { return {}; }

  static constexpr double kNever = std::numeric_limits<double>::infinity();
};

}  // namespace moesim::sim
