// Parameter sweeps (docs/design.md §6): a base scenario, axes over any key path of its YAML tree,
// expanded as a cartesian product or zipped, run in parallel, written as one CSV row per point x
// strategy (every axis a column) and JSON. Resumable: points already in the output CSV are skipped,
// provided the CSV was written by the same setup (SweepFingerprint).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/moesim/report.hpp"
#include "core/error.hpp"
#include "core/scenario.hpp"
#include "strategies/serving/serving_engine.hpp"

namespace moesim::app {

enum class SweepMode { kCartesian, kZip };

/// One axis: a key path of the scenario tree ("model.capacity_factor", "strategies[1].pipeline")
/// and the values it takes, as YAML scalars (the CSV writes them verbatim).
struct SweepAxis {
  std::string key;
  std::vector<std::string> values;
  bool geometric = false;  // written as {from, to, times}: plots use a log x axis
  SourceLocation where;    // the axis key in the sweep file
};

struct SweepSpec {
  std::string file;  // the sweep file as given
  std::string name;  // `name:`, else the file stem
  std::string description;
  std::string base_path;  // resolved against the sweep file's directory
  SweepMode mode = SweepMode::kCartesian;
  std::vector<SweepAxis> axes;
  // `set:` fixed overrides applied to every point before the axes (key path -> YAML value).
  std::vector<std::pair<std::string, YAML::Node>> fixed;
  // Per `fixed` entry: the key as its errors name it ("set.<key>" in the file, "<key>" for a
  // command-line --set) and where it was written.
  std::vector<std::pair<std::string, SourceLocation>> fixed_where;
  std::vector<std::string> strategies;  // subset of the base's strategies; empty = all
  SourceLocation strategies_where;
};

/// Reads a sweep file: InputError (file:line, key) for unknown keys, bad ranges, zip axes of
/// unequal length. Does not read the base scenario (see validate_sweep).
SweepSpec parse_sweep(const YAML::Node& root, const std::string& file);
SweepSpec load_sweep(const std::string& path);

/// Appends the command line's `--set KEY=VALUE` edits to `spec.fixed`, after the file's `set:`
/// (a later edit wins), so they reach every point and the fingerprint. InputError (exit 2) for a
/// malformed edit, or a key an axis varies (the axis would silently replace it).
void add_command_line_sets(SweepSpec& spec, const std::vector<std::string>& sets);

/// The value lists of a {from, to, times} / {from, to, step} range (exposed for tests). Numbers
/// may carry a unit ("100Gb/s"); values are written in the unit of `from`.
std::vector<std::string> expand_range(const YAML::Node& range, const std::string& file,
                                      const std::string& key);

/// One point of the sweep: its index in expansion order and one value per axis.
struct SweepPoint {
  std::size_t index = 0;
  std::vector<std::string> values;
};

/// Cartesian: the last axis varies fastest. Zip: the i-th value of every axis.
std::vector<SweepPoint> expand_points(const SweepSpec& spec);

/// Sets `value` at the dotted key path in `root`, creating maps on the way; "name[i]" indexes a
/// list. InputError at `where` when the path runs into a scalar or past the end of a list.
void set_key_path(YAML::Node root, const std::string& key, const YAML::Node& value,
                  const SourceLocation& where);

/// The scenario of one point: the base tree (cloned), `set:`, then the axis values.
Scenario point_scenario(const SweepSpec& spec, const YAML::Node& base_tree,
                        const SweepPoint& point);

/// The base scenario with `set:` applied (the plain base when `set:` alone does not validate,
/// e.g. when it needs the axes' values too).
Scenario base_scenario(const SweepSpec& spec);

/// Checks the base scenario loads, the strategy subset exists, and every axis key is a valid key
/// of the scenario (applied alone with its first value): errors name the sweep file's line.
void validate_sweep(const SweepSpec& spec);

/// Spreads a sweep over processes (MPI ranks under mpirun). The sweep code stays free of MPI: the
/// CLI supplies the MPI implementation (cmd_sweep.cpp), tests may supply another.
class SweepTransport {
 public:
  virtual ~SweepTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Collective: every rank ends up with rank 0's `text`.
  virtual void broadcast(std::string& text) = 0;
  /// Ranks > 0: one message to rank 0; messages of one rank arrive in the order sent.
  virtual void send_to_root(const std::string& text) = 0;
  /// Rank 0: a message from another rank if one has arrived; never blocks.
  virtual std::optional<std::string> try_receive() = 0;
};

struct SweepOptions {
  int jobs = 0;        // 0 = hardware threads (per rank under a transport)
  std::string engine;  // "" = the scenario's
  std::string csv_path;
  std::string json_path;
  bool progress = true;  // progress line with ETA on stderr
  // With more than one rank: rank 0 decides which points remain (resume) and broadcasts them;
  // each rank runs its share with `jobs` threads and sends the rows to rank 0, which alone writes
  // the CSV and JSON and prints the progress. Null = this process runs everything.
  SweepTransport* transport = nullptr;
  // Hidden measurement aid: every progress update appends "elapsed_s done total eta_s" here.
  std::string eta_log_path;
  // Discard the rows of an existing CSV (whatever setup wrote it) and run every point.
  bool restart = false;
};

/// What decides a sweep's rows besides their own axis values, recorded beside the CSV
/// (sweep_fingerprint_path) and in the JSON: a resumed run reuses rows only
/// when every part matches, so it never reports figures computed for another setup under this
/// run's labels. Axis values are not part of it: each row carries its own, so extending an axis
/// resumes the points already done.
struct SweepFingerprint {
  std::string version;  // MOESIM_VERSION
  std::string engine;   // the network model the points run on (--engine, else the base's)
  // 16 hex digits: FNV-1a of the base scenario's tree with `set:` applied, in a canonical form
  // (keys sorted, comments and layout gone: only values count), and of the bytes of the files it
  // references (calibration, routing trace).
  std::string base;
  std::string axes;  // 16 hex digits: FNV-1a of the axes' key paths, in order

  std::string hash() const;  // of all four parts
  /// "# moesim sweep fingerprint=H version=V engine=E base=B axes=A"
  std::string csv_comment() const;
  /// The parts of a csv_comment() line; nullopt when `line` is not one.
  static std::optional<SweepFingerprint> parse(const std::string& line);
  nlohmann::ordered_json json() const;
  /// "the base scenario", "the axes", "the engine", "the moesim version": the parts that differ,
  /// each with both values, for error messages.
  std::vector<std::string> differences(const SweepFingerprint& file) const;
};

/// The fingerprint of a sweep run with `engine_override` (--engine; "" = the base's engine).
SweepFingerprint sweep_fingerprint(const SweepSpec& spec, const std::string& engine_override);
/// Where the fingerprint of the CSV `csv_path` is kept: PATH.fingerprint, one csv_comment() line,
/// so that the CSV itself is plain (pandas.read_csv reads it as it is).
std::string sweep_fingerprint_path(const std::string& csv_path);

/// One strategy's figures at one point of a serving sweep (docs/serving.md), in the columns of
/// `moesim simulate --csv` on a serving scenario; counts (requests, preemptions) as doubles.
struct ServingRowFigures {
  double requests = 0;
  double ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0;
  double tpot_p50_s = 0, tpot_p90_s = 0, tpot_p99_s = 0;
  double e2e_p50_s = 0;
  double input_tokens_per_s_per_node = 0, output_tokens_per_s_per_node = 0;
  double output_tokens_per_s_per_user = 0;
  double goodput_requests_per_s = 0, slo_attainment = 0, kv_utilization = 0;
  double preemptions = 0;
  /// The CSV / JSON names, in column order, with the field each names.
  static const std::vector<std::pair<std::string, double ServingRowFigures::*>>& fields();
};

/// The figures of one strategy's serving run.
ServingRowFigures serving_row_figures(const serving::ServingReport& r);

/// One strategy's result at one point.
struct SweepRow {
  std::size_t point = 0;
  std::vector<std::string> values;  // one per axis
  std::string scenario;
  // Strategy, topology, GPUs and wall time; the step figures too for a training sweep.
  RunSummary summary;
  std::optional<ServingRowFigures> serving;  // a serving sweep's figures (base has `serving:`)
  nlohmann::ordered_json run;  // run_json of this invocation's points (with --json); else null
};

struct SweepResult {
  std::vector<SweepRow> rows;  // every row (resumed ones too), sorted by point then strategy
  std::size_t points_total = 0, points_skipped = 0, points_run = 0;
  std::vector<std::size_t> points_per_rank;  // points run by each rank (one entry without MPI)
  std::string engine;
  double wall_s = 0;
};

/// CSV header for a spec: point, every axis key, then the result columns (a serving sweep's when
/// `serving`: its base scenario has a `serving:` section).
std::vector<std::string> sweep_csv_columns(const SweepSpec& spec, bool serving = false);

/// Runs the sweep (on rank 0 of a transport: everything, gathered; on other ranks: their share,
/// whose rows are returned but not written). With a CSV path, rows of completed points are appended
/// as they finish (so an interrupted sweep keeps them) and the file is rewritten sorted at the end;
/// points whose rows are all in an existing CSV with the same columns are skipped. An existing CSV
/// with another fingerprint, or none (older moesim), is an InputError naming what differs, unless
/// opts.restart discards its rows.
SweepResult run_sweep(const SweepSpec& spec, const SweepOptions& opts);

/// The ETA of a flow or SimGrid sweep (docs/design.md §6), exposed for tests. Point costs there
/// differ by orders of magnitude, so each point is predicted to cost t0 x runs x GPUs^b (runs =
/// iterations x strategies); b is the least-squares slope of log(time per run) over log(GPUs) of
/// the finished points, pulled towards kEtaPriorExponent (an all-to-all has P^2 flows) so that the
/// first few points do not swing it, and t0 follows from their times. The work left is shared by
/// `workers` (of all ranks), but no point is split: at least the largest one left. It uses the
/// points' own times, not the elapsed time: with a point in flight on every worker, the elapsed
/// time early on overstates the cost of the few finished ones.
struct EtaPoint {
  double gpus = 1;
  double runs = 1;     // iterations x strategies
  double wall_s = -1;  // the point's time once finished (sum of its runs); < 0 = not yet
};
inline constexpr double kEtaPriorExponent = 2.0;
double weighted_eta_s(const std::vector<EtaPoint>& points, std::size_t workers);

/// CSV field quoting (RFC 4180) and splitting one line back (exposed for tests).
std::string csv_field(const std::string& s);
std::vector<std::string> split_csv_line(const std::string& line);

}  // namespace moesim::app
