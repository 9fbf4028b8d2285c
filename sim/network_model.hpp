// The interface between the discrete-event engine (sim/engine) and the network models
// (analytical, flow, simgrid). The engine lowers every collective into phases of transfers
// (strategies/collectives) and hands each phase to the model as one batch; the model tells the
// engine when batches complete. Concurrent batches (two collectives on different streams, two
// groups) share the network inside the model, which is where contention is seen.
//
// Time is in seconds of simulated time, a double. The engine calls, in a loop:
//   start_batch(now, ...)  zero or more times at the current time,
//   t = next_completion_time_before(engine's next own event),
//   advance_to(min(t, engine's next own event)) and handles the batches it returns.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include "strategies/collectives/transfer.hpp"

namespace moesim {
struct Calibration;
}
namespace moesim::topology {
class Topology;
}

namespace moesim::sim {

// The transfer and message-cost types are the strategies' (strategies/collectives/transfer.hpp:
// collectives are lowered into them there); the engines use them under these names.
using collectives::NetworkParams;
using collectives::SenderMessages;
using collectives::Transfer;

using BatchId = std::int64_t;

struct BatchCompletion {
  BatchId id = -1;
  double time_s = 0;
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

  /// The same, found without simulating past `horizon` (the engine's own next event, at which it
  /// may start batches): next_completion_time() when a batch completes at or before horizon,
  /// else +infinity (asked again later, the model goes on from where it stopped). A model that
  /// looks ahead speculatively (flow) then never has to rewind for a batch started at horizon.
  virtual double next_completion_time_before(double /*horizon*/) { return next_completion_time(); }

  /// Advances the model's clock to t (<= next_completion_time()) and returns the batches that
  /// complete at exactly t (all of them, in increasing id order).
  virtual std::vector<BatchCompletion> advance_to(double t) = 0;

  /// Bytes carried per directed link so far (for utilisation reports); empty if not tracked.
  virtual std::vector<double> link_bytes() const { return {}; }

  static constexpr double kNever = std::numeric_limits<double>::infinity();
};

}  // namespace moesim::sim
