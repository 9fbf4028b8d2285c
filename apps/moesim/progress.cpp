#include "apps/moesim/progress.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace moesim::app {

namespace {

// A duration in seconds >= 0 from the environment; `fallback` when unset or not such a number
// (a typo in a test knob should not make every run chatty or silent).
double env_seconds(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  if (end == v || *end != '\0' || !std::isfinite(x) || x < 0) return fallback;
  return x;
}

std::string wall_text(double s) {
  if (s < 60) return fmt::format("{:.0f}s", std::floor(s));
  if (s < 3600)
    return fmt::format("{}m{:02d}s", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  return fmt::format("{}h{:02d}m", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
}

std::string sim_text(double s) {
  if (s < 1e-3) return fmt::format("{:.3f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.3f} s", s);
}

std::string rate_text(double per_s) {
  if (per_s >= 1e6) return fmt::format("{:.1f}M", per_s / 1e6);
  if (per_s >= 1e3) return fmt::format("{:.1f}k", per_s / 1e3);
  return fmt::format("{:.0f}", per_s);
}

std::string plural(int n, const std::string& unit) { return n == 1 ? unit : unit + "s"; }

void on_sigint(int) { sim::request_interrupt(); }

}  // namespace

ProgressOptions progress_options(bool quiet) {
  ProgressOptions o;
  o.enabled = !quiet;
  o.tty = isatty(STDERR_FILENO) != 0;
  o.every_s = o.tty ? 0.5 : 5.0;
  o.after_s = env_seconds("MOESIM_PROGRESS_AFTER_S", o.after_s);
  o.every_s = env_seconds("MOESIM_PROGRESS_EVERY_S", o.every_s);
  return o;
}

ProgressReporter::ProgressReporter(ProgressOptions options, int total_units)
    : opt_(options),
      total_units_(total_units),
      t0_(Clock::now()),
      unit_t0_(t0_),
      latest_events_(sim::progress_detail::ticks),
      last_print_events_(latest_events_),
      scope_(this) {
  if (opt_.enabled) printer_ = std::thread([this] { printer(); });
}

ProgressReporter::~ProgressReporter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    finish_locked();
  }
  wake_.notify_all();
  if (printer_.joinable()) printer_.join();
}

void ProgressReporter::printer() {
  // Wakes often enough for every_s (and for after_s to take effect on time), not more.
  const auto period = std::chrono::duration<double>(std::max(0.05, std::min(opt_.every_s, 1.0)));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, period, [this] { return stop_; });
    if (!stop_) maybe_print_locked();
  }
}

void ProgressReporter::set_total_units(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  total_units_ = n;
}

double ProgressReporter::elapsed_s() const {
  return std::chrono::duration<double>(Clock::now() - t0_).count();
}

void ProgressReporter::begin_group(std::string label, int count, std::string unit_name) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back({std::move(label), std::move(unit_name), count, 0});
  paused_ = false;
}

void ProgressReporter::begin_unit() {
  sim::throw_if_interrupted();  // a plan too small to reach a poll still stops here
  std::lock_guard<std::mutex> lock(mu_);
  in_unit_ = true;
  paused_ = false;
  have_sample_ = false;
  unit_t0_ = Clock::now();
  maybe_print_locked();
}

void ProgressReporter::end_unit() {
  std::lock_guard<std::mutex> lock(mu_);
  in_unit_ = false;
  if (!groups_.empty()) ++groups_.back().done;
  ++units_done_;
  finished_units_wall_s_ = elapsed_s();
  maybe_print_locked();
}

void ProgressReporter::poll(const sim::ProgressSample& s) {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = s;
  have_sample_ = true;
  latest_events_ = s.events;
  maybe_print_locked();
}

void ProgressReporter::maybe_print_locked() {
  if (!opt_.enabled || paused_) return;
  const double now = elapsed_s();
  if (now < opt_.after_s) return;
  if (last_print_s_ >= 0 && now - last_print_s_ < opt_.every_s) return;
  std::string line = "moesim: ";
  if (!groups_.empty()) {
    const Group& g = groups_.back();
    const int k = std::min(g.count, g.done + (in_unit_ ? 1 : 0));
    line += fmt::format("{} {} {}/{}", g.label, g.unit_name, std::max(k, 1), g.count);
    if (total_units_ > g.count)
      line += fmt::format(" (all: {}/{} done)", units_done_, total_units_);
  }
  if (in_unit_ && have_sample_) {
    line += fmt::format(", sim {}", sim_text(last_.sim_time_s));
    if (last_.ops_total > 0) line += fmt::format(", ops {}/{}", last_.ops_done, last_.ops_total);
  }
  // The run's thread's event count as of its latest poll (this may be the printer thread).
  const std::int64_t events = latest_events_;
  const double span = now - std::max(0.0, last_print_s_);
  line += fmt::format(
      ", {} events/s",
      rate_text(span > 0 ? static_cast<double>(events - last_print_events_) / span : 0.0));
  line += fmt::format(", {} elapsed", wall_text(now));
  if (units_done_ > 0 && total_units_ > 0) {
    const double mean = finished_units_wall_s_ / units_done_;
    const int left = std::max(0, total_units_ - units_done_);
    const double in_current = in_unit_ ? now - finished_units_wall_s_ : 0;
    const double eta = std::max(mean * std::max(0, left - 1), mean * left - in_current);
    line += fmt::format(", ETA {}", wall_text(eta));
  } else if (in_unit_ && have_sample_ && last_.ops_total > 0 && last_.ops_done > 0 &&
             total_units_ > 0) {
    // No unit finished yet (a one-iteration run): extrapolate from the op instances done in this
    // one. Rough (events bunch up where collectives overlap), hence the "~".
    const double in_current = now - finished_units_wall_s_;
    const double unit =
        in_current * static_cast<double>(last_.ops_total) / static_cast<double>(last_.ops_done);
    const int left = std::max(0, total_units_ - units_done_ - 1);
    line += fmt::format(", ETA ~{}", wall_text(std::max(0.0, unit - in_current) + unit * left));
  } else {
    line += ", ETA unknown";
  }
  if (opt_.tty) {
    // Clear to the end of the line: the previous line may have been longer.
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    line_open_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
  last_print_s_ = now;
  last_print_events_ = events;
}

void ProgressReporter::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  finish_locked();
}

void ProgressReporter::finish_locked() {
  paused_ = true;
  if (!line_open_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  line_open_ = false;
}

std::string ProgressReporter::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string parts;
  for (const Group& g : groups_) {
    if (!parts.empty()) parts += ", ";
    parts += fmt::format("{} {}/{} {}", g.label, g.done, g.count, plural(g.count, g.unit_name));
  }
  if (parts.empty()) parts = "nothing completed";
  std::string s = fmt::format("after {}: {}", wall_text(elapsed_s()), parts);
  if (in_unit_ && !groups_.empty()) {
    const Group& g = groups_.back();
    s += fmt::format(" ({} {} stopped", g.unit_name, g.done + 1);
    if (have_sample_) s += fmt::format(" at {} simulated", sim_text(last_.sim_time_s));
    s += ")";
  }
  const int skipped = total_units_ - units_done_;
  if (skipped > 0)
    s += fmt::format("; {} of {} {} not completed", skipped, total_units_,
                     plural(total_units_, groups_.empty() ? "unit" : groups_.back().unit_name));
  return s;
}

InterruptHandler::InterruptHandler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  // One-shot: the second Ctrl-C gets the default action (terminate) if the first is not enough.
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &sa, &previous_);
}

InterruptHandler::~InterruptHandler() { sigaction(SIGINT, &previous_, nullptr); }

void run_interruptible(bool quiet, const std::function<void(ProgressReporter&)>& body) {
  const InterruptHandler on_ctrl_c;
  ProgressReporter progress(progress_options(quiet));
  try {
    body(progress);
  } catch (const sim::Interrupted&) {
    progress.finish();
    std::fprintf(stderr, "moesim: interrupted %s; no output files written\n",
                 progress.summary().c_str());
    std::fflush(stderr);
    throw;
  }
}

}  // namespace moesim::app
