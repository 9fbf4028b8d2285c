// Progress and interruption hook of the simulator's event loops.
//
// Long runs (a 4,096-GPU flow all-to-all, a SimGrid iteration) spend minutes inside run_plan, so
// whoever drives them (the CLI) can neither show progress nor stop them cleanly from outside.
// The event loops (the engine's, the flow model's) call progress_tick() once per event, and
// progress_work() inside long events (routing millions of flows, a rate solve at 4,096 GPUs takes
// seconds). They only decrement a thread-local countdown; every kProgressPollWeight units of weight
// it does the slow part: it throws Interrupted when request_interrupt() was called (a SIGINT
// handler may call it), and hands this thread's ProgressObserver, if any, the simulated time
// reached and the events and plan op instances done so far. The observer decides what to print and
// when (wall clock).
//
// Per thread: a sweep runs plans on several threads; each may have its own observer (or none),
// while the interruption request is process-wide.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace moesim::sim {

/// Thrown out of run_plan (from an event loop) once request_interrupt() has been called. The run
/// is abandoned: its engine and network model are destroyed by the unwinding, no result exists.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

/// Asks every running and future event loop of the process to stop (throw Interrupted) at its
/// next poll. Async-signal-safe: only stores to a lock-free atomic.
void request_interrupt() noexcept;
/// Whether request_interrupt() was called (and not cleared since).
bool interrupt_requested() noexcept;
/// Forgets an earlier request (tests; a driver that handled it and goes on).
void clear_interrupt() noexcept;
/// Throws Interrupted if it was requested: for drivers between runs (a plan too small to reach a
/// poll, the moment before writing output files).
inline void throw_if_interrupted() {
  if (interrupt_requested()) throw Interrupted();
}

/// What an event loop knows at a poll. Ops are the plan's op instances (one per op and rank):
/// how many finished, of how many (0 when no engine run is active on this thread).
struct ProgressSample {
  double sim_time_s = 0;    // simulated time reached by the loop that polled (this plan's clock)
  std::int64_t events = 0;  // events processed on this thread (a running count; use differences)
  std::int64_t ops_done = 0;
  std::int64_t ops_total = 0;
};

/// Receives polls on the thread it is installed on. poll() runs inside the event loop: it must be
/// cheap when it has nothing to do (read a clock, compare) and must not call back into the sim.
class ProgressObserver {
 public:
  virtual ~ProgressObserver() = default;
  virtual void poll(const ProgressSample& s) = 0;
};

/// Installs `observer` (may be null) as this thread's observer for the scope's lifetime and
/// restores the previous one after.
class ProgressScope {
 public:
  explicit ProgressScope(ProgressObserver* observer);
  ~ProgressScope();
  ProgressScope(const ProgressScope&) = delete;
  ProgressScope& operator=(const ProgressScope&) = delete;

 private:
  ProgressObserver* previous_;
};

/// The engine registers its op instance counters for the duration of one run (so polls from the
/// network model, which does not know the plan, can report them too).
class ProgressOpsScope {
 public:
  ProgressOpsScope(const std::int64_t* done, std::int64_t total);
  ~ProgressOpsScope();
  ProgressOpsScope(const ProgressOpsScope&) = delete;
  ProgressOpsScope& operator=(const ProgressOpsScope&) = delete;

 private:
  const std::int64_t* previous_done_;
  std::int64_t previous_total_;
};

/// Weight between two slow polls. An engine event (a heap pop and a few array updates) has weight
/// 1, so the clock is read every 256 events; loops with heavier events pass a larger weight.
inline constexpr std::int32_t kProgressPollWeight = 256;

namespace progress_detail {
// Constant-initialised, so access needs no TLS guard: two updates and a branch per event.
inline thread_local std::int32_t countdown = kProgressPollWeight;
inline thread_local std::int64_t ticks = 0;  // events on this thread, whatever their weight
void poll(double sim_time_s);
}  // namespace progress_detail

/// The hook for work inside an event (routing one flow, one level of a rate solve): long events
/// still poll. `weight` (1 to kProgressPollWeight) is how much work the call stands for;
/// kProgressPollWeight polls on every call.
inline void progress_work(double sim_time_s, std::int32_t weight = 1) {
  progress_detail::countdown -= weight;
  if (progress_detail::countdown <= 0) [[unlikely]]
    progress_detail::poll(sim_time_s);
}

/// The hook: call once per event with the simulated time reached (counted in
/// ProgressSample::events); `weight` as for progress_work.
inline void progress_tick(double sim_time_s, std::int32_t weight = 1) {
  ++progress_detail::ticks;
  progress_work(sim_time_s, weight);
}

}  // namespace moesim::sim
