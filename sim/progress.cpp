#include "sim/progress.hpp"

#include <atomic>

namespace moesim::sim {

namespace {

// Set from a signal handler: a lock-free atomic is async-signal-safe to store to.
std::atomic<bool> g_interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free);

thread_local ProgressObserver* t_observer = nullptr;
thread_local const std::int64_t* t_ops_done = nullptr;
thread_local std::int64_t t_ops_total = 0;

}  // namespace

void request_interrupt() noexcept { g_interrupt.store(true, std::memory_order_relaxed); }
bool interrupt_requested() noexcept { return g_interrupt.load(std::memory_order_relaxed); }
void clear_interrupt() noexcept { g_interrupt.store(false, std::memory_order_relaxed); }

ProgressScope::ProgressScope(ProgressObserver* observer) : previous_(t_observer) {
  t_observer = observer;
}

ProgressScope::~ProgressScope() { t_observer = previous_; }

ProgressOpsScope::ProgressOpsScope(const std::int64_t* done, std::int64_t total)
    : previous_done_(t_ops_done), previous_total_(t_ops_total) {
  t_ops_done = done;
  t_ops_total = total;
}

ProgressOpsScope::~ProgressOpsScope() {
  t_ops_done = previous_done_;
  t_ops_total = previous_total_;
}

namespace progress_detail {

void poll(double sim_time_s) {
  countdown = kProgressPollWeight;
  if (interrupt_requested()) throw Interrupted();
  if (t_observer == nullptr) return;
  ProgressSample s;
  s.sim_time_s = sim_time_s;
  s.events = ticks;
  s.ops_done = t_ops_done != nullptr ? *t_ops_done : 0;
  s.ops_total = t_ops_done != nullptr ? t_ops_total : 0;
  t_observer->poll(s);
}

}  // namespace progress_detail

}  // namespace moesim::sim
