// Progress on stderr for long simulate / compare runs, and Ctrl-C handling.
//
// A run is a sequence of units (iterations, or sizes of `simulate --collective`) in groups (a
// strategy on a topology). The reporter is the sim::ProgressObserver of the thread running them:
// the event loops poll it (sim/progress.hpp), the runner tells it where units start and end. It
// prints nothing until the run has lasted `after_s` (so short runs, and the expected outputs of
// tests, stay as they were); then, on a terminal, one line rewritten with '\r' at most every
// `every_s` and cleared at the end, otherwise a plain line at most every `every_s`. A thread of
// its own prints on time even while the run is in a stretch without polls (building a plan,
// SimGrid's own loop): the line then shows the latest state the run reported.
//
// The ETA is the mean wall time per finished unit times the units left, less the time already
// spent in the current one; before the first unit finishes it is "ETA unknown": the share of op
// instances done inside an iteration is shown but not turned into a time, since one all-to-all op
// can hold most of an iteration's wall time.
#pragma once

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sim/progress.hpp"

namespace moesim::app {

/// Exit code of a run stopped by Ctrl-C (the shell's 128 + SIGINT).
inline constexpr int kInterruptedExitCode = 130;

struct ProgressOptions {
  bool enabled = true;  // false with --quiet
  bool tty = false;     // stderr is a terminal: one line rewritten in place
  double after_s = 2;   // print nothing before the run has lasted this long
  double every_s = 5;   // at most one line (or rewrite) per this many seconds
};

/// The defaults for this process: tty from isatty(stderr), every_s 0.5 on a terminal and 5
/// otherwise. MOESIM_PROGRESS_AFTER_S and MOESIM_PROGRESS_EVERY_S (seconds >= 0) override
/// after_s and every_s, for tests and for users who want more or fewer lines.
ProgressOptions progress_options(bool quiet);

class ProgressReporter : public sim::ProgressObserver {
 public:
  /// total_units: units of the whole run, over all groups (for the ETA; 0 = not known yet).
  explicit ProgressReporter(ProgressOptions options, int total_units = 0);
  ~ProgressReporter() override;

  void set_total_units(int n);

  /// The next group starts: `label` (a strategy, "tutel on ndv4", ...), `count` units of
  /// `unit_name` ("iteration", "size").
  void begin_group(std::string label, int count, std::string unit_name = "iteration");
  /// The next unit of the current group starts / finished.
  void begin_unit();
  void end_unit();

  void poll(const sim::ProgressSample& s) override;

  /// Clears the terminal line and prints nothing more until the next group or unit starts (call
  /// before printing results, which may go to the same terminal).
  void finish();

  /// What was completed, for the message after Ctrl-C: elapsed time, per group the units done,
  /// and the simulated time the unit in flight had reached.
  std::string summary() const;

 private:
  struct Group {
    std::string label;
    std::string unit_name;
    int count = 0;
    int done = 0;
  };
  using Clock = std::chrono::steady_clock;
  double elapsed_s() const;
  void maybe_print_locked();
  void finish_locked();
  void printer();

  ProgressOptions opt_;
  int total_units_;
  int units_done_ = 0;
  std::vector<Group> groups_;
  bool in_unit_ = false;
  Clock::time_point t0_;
  Clock::time_point unit_t0_;
  double finished_units_wall_s_ = 0;
  sim::ProgressSample last_;  // the latest poll of the unit in flight
  bool have_sample_ = false;
  std::int64_t latest_events_;  // the run's thread's event count at its latest poll
  // Events per second between two printed lines.
  double last_print_s_ = -1;
  std::int64_t last_print_events_ = 0;
  bool line_open_ = false;  // a '\r' line is on the terminal
  bool paused_ = false;     // after finish(), until the next group or unit
  // Everything above is shared with the printer thread.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread printer_;
  sim::ProgressScope scope_;
};

/// While alive: SIGINT calls sim::request_interrupt() (the event loops then throw
/// sim::Interrupted), once: the handler resets itself, so a second Ctrl-C kills the process as
/// usual when a run does not stop quickly enough.
class InterruptHandler {
 public:
  InterruptHandler();
  ~InterruptHandler();
  InterruptHandler(const InterruptHandler&) = delete;
  InterruptHandler& operator=(const InterruptHandler&) = delete;

 private:
  struct sigaction previous_ {};
};

/// Runs `body` (a command's work) with a ProgressReporter (progress_options(quiet)) and Ctrl-C
/// handling: on sim::Interrupted it clears the progress line, prints "moesim: interrupted after
/// ...: <what was completed>; no output files written" and rethrows (main exits 130). The body
/// writes its output files only after its runs, once sim::throw_if_interrupted() has passed.
void run_interruptible(bool quiet, const std::function<void(ProgressReporter&)>& body);

}  // namespace moesim::app
