#include "apps/moesim/serving_tune.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

#include "apps/moesim/engine_setup.hpp"
#include "apps/moesim/overrides.hpp"
#include "apps/moesim/serving_output.hpp"
#include "core/error.hpp"

namespace moesim::app {

namespace {

// One pool's shape: nodes per instance, instances, EP degree (0 never: resolved).
struct PoolShape {
  int nodes = 1, instances = 1, ep = 1;
  auto key() const { return std::tie(nodes, instances, ep); }
};

struct Shape {
  PoolShape first;   // co-located: the instance pool; disaggregated: prefill
  PoolShape second;  // disaggregated: decode
  int changes = 0;
};

// Powers of two up to `limit`, and the scenario's own size.
std::vector<int> node_sizes(int limit, int written) {
  std::vector<int> out;
  for (int n = 1; n <= limit; n *= 2) out.push_back(n);
  if (written <= limit) out.push_back(written);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// EP degrees of an instance of `gpus`: all of them, a half, a quarter, an eighth (whole
// numbers), and the scenario's where it divides the instance. The loader refuses those the
// experts do not divide.
std::vector<int> ep_degrees(int gpus, int written) {
  std::vector<int> out;
  for (int d : {1, 2, 4, 8})
    if (gpus % d == 0) out.push_back(gpus / d);
  if (written > 0 && gpus % written == 0) out.push_back(written);
  std::sort(out.rbegin(), out.rend());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

PoolShape written_shape(const ServingPool& p, int gpus_per_node) {
  return {p.nodes, p.instances, p.ep > 0 ? p.ep : p.nodes * gpus_per_node};
}

int differences(const PoolShape& a, const PoolShape& b) {
  return (a.nodes != b.nodes) + (a.instances != b.instances) + (a.ep != b.ep);
}

// Every shape over the nodes the scenario's pools hold, fewest changes from the scenario first.
std::vector<Shape> candidate_shapes(const ServingSpec& sv, int gpus_per_node) {
  std::vector<Shape> out;
  const int g = gpus_per_node;
  if (!sv.disaggregated) {
    const PoolShape own = written_shape(sv.instance, g);
    const int total = own.nodes * own.instances;
    for (int n : node_sizes(total, own.nodes)) {
      if (total % n != 0) continue;
      for (int ep : ep_degrees(n * g, n == own.nodes ? own.ep : 0)) {
        Shape s{{n, total / n, ep}, {}, 0};
        s.changes = differences(s.first, own);
        out.push_back(s);
      }
    }
  } else {
    const PoolShape own_p = written_shape(sv.prefill, g), own_d = written_shape(sv.decode, g);
    const int total = own_p.nodes * own_p.instances + own_d.nodes * own_d.instances;
    for (int np : node_sizes(total - 1, own_p.nodes))
      for (int nd : node_sizes(total - 1, own_d.nodes))
        for (int ep_p : ep_degrees(np * g, np == own_p.nodes ? own_p.ep : 0))
          for (int ep_d : ep_degrees(nd * g, nd == own_d.nodes ? own_d.ep : 0))
            for (int kp = 1; kp * np + nd <= total; ++kp) {
              Shape s{{np, kp, ep_p}, {nd, (total - kp * np) / nd, ep_d}, 0};
              s.changes = differences(s.first, own_p) + differences(s.second, own_d);
              out.push_back(s);
            }
  }
  std::stable_sort(out.begin(), out.end(), [](const Shape& a, const Shape& b) {
    return std::make_tuple(a.changes, a.first.key(), a.second.key()) <
           std::make_tuple(b.changes, b.first.key(), b.second.key());
  });
  return out;
}

std::vector<std::string> shape_edits(const Shape& s, bool disaggregated) {
  auto pool = [](const std::string& key, const PoolShape& p) {
    return std::vector<std::string>{fmt::format("serving.{}.nodes={}", key, p.nodes),
                                    fmt::format("serving.{}.instances={}", key, p.instances),
                                    fmt::format("serving.{}.ep={}", key, p.ep)};
  };
  if (!disaggregated) return pool("instance", s.first);
  auto edits = pool("prefill", s.first);
  for (auto& e : pool("decode", s.second)) edits.push_back(std::move(e));
  return edits;
}

std::string pool_text(const char* name, const PoolShape& p) {
  return fmt::format("{} {} x {} node{} ep {}", name, p.instances, p.nodes, p.nodes > 1 ? "s" : "",
                     p.ep);
}

std::string shape_text(const Shape& s, bool disaggregated) {
  if (!disaggregated) return pool_text("instance", s.first);
  return pool_text("prefill", s.first) + ", " + pool_text("decode", s.second);
}

// The shared state of the workers: the shapes in order, the next one, the rows.
struct SearchState {
  YAML::Node tree;  // the scenario with the command line's --set edits
  std::string path;
  std::vector<Shape> shapes;
  bool disaggregated = false;
  double attainment = 0;
  std::atomic<std::size_t> next{0};
  std::mutex mu;  // rows, counters, and the tree (yaml-cpp nodes are not safe to share)
  ServingTuneResult* result = nullptr;
};

// One shape: its scenario (refused shapes counted with the loader's message), every strategy's
// serving run, its rows.
void run_shape(SearchState& st, const Shape& shape) {
  const auto edits = shape_edits(shape, st.disaggregated);
  std::vector<serving::ServingReport> reports;
  Scenario sc;
  try {
    YAML::Node t;
    {
      std::lock_guard lock(st.mu);
      t = YAML::Clone(st.tree);
    }
    sc = parse_scenario_with(t, st.path, edits);
    const auto topo = simulation_topology(sc);
    const sim::EngineConfig cfg = engine_config_from(sc, "");
    reports = run_serving_stacks(sc, sc.strategies, *topo, cfg);
  } catch (const InputError& e) {
    std::lock_guard lock(st.mu);
    ++st.result->refused;
    if (st.result->refused_examples.size() < 3)
      st.result->refused_examples.push_back(shape_text(shape, st.disaggregated) + ": " + e.what());
    return;
  }
  const int nodes = shape.first.nodes * shape.first.instances +
                    (st.disaggregated ? shape.second.nodes * shape.second.instances : 0);
  std::lock_guard lock(st.mu);
  ++st.result->run;
  for (const auto& rep : reports) {
    ServingTuneRow row;
    row.shape = shape_text(shape, st.disaggregated);
    row.edits = edits;
    row.changes = shape.changes;
    row.strategy = rep.strategy;
    row.nodes = nodes;
    row.figures = serving_row_figures(rep);
    row.goodput_per_node = row.figures.goodput_requests_per_s / nodes;
    row.meets = row.figures.slo_attainment >= st.attainment;
    st.result->ranked.push_back(std::move(row));
  }
}

// How far a row's latency is from the SLO: its worse figure at the target attainment's percentile
// (p50, p90 or p99, the one at or above it) over the objective; <= 1 within it.
double slo_excess(const ServingTuneResult& r, const ServingRowFigures& f) {
  const bool p99 = r.attainment > 0.9, p90 = r.attainment > 0.5;
  const double ttft = p99 ? f.ttft_p99_s : p90 ? f.ttft_p90_s : f.ttft_p50_s;
  const double tpot = p99 ? f.tpot_p99_s : p90 ? f.tpot_p90_s : f.tpot_p50_s;
  double excess = 0;
  if (r.slo_ttft_s > 0) excess = std::max(excess, ttft / r.slo_ttft_s);
  if (r.slo_tpot_s > 0) excess = std::max(excess, tpot / r.slo_tpot_s);
  return excess;
}

// Rows meeting the SLO first, by goodput per node (then attainment); the rest by attainment, then
// by how far their latency is from the SLO: the first row is the answer, or the closest miss.
void rank_rows(ServingTuneResult& r) {
  auto key = [&r](const ServingTuneRow& x) {
    const double a = x.figures.slo_attainment;
    return x.meets ? std::make_tuple(0, -x.goodput_per_node, -a, x.changes)
                   : std::make_tuple(1, -a, slo_excess(r, x.figures), x.changes);
  };
  std::stable_sort(
      r.ranked.begin(), r.ranked.end(),
      [&](const ServingTuneRow& a, const ServingTuneRow& b) { return key(a) < key(b); });
}

void check_slo(const Scenario& sc) {
  MOESIM_ASSERT(sc.serving.has_value(), "tune_serving needs a serving deployment");
  const ServingSpec& sv = *sc.serving;
  if (sv.slo_ttft.value() > 0 || sv.slo_tpot.value() > 0) return;
  throw InputError(sc.location_of("serving"), "serving.slo",
                   "found none, expected an objective (slo: {ttft: 2s, tpot: 50ms}): `moesim tune` "
                   "on a serving deployment searches for the pools that meet it");
}

}  // namespace

ServingTuneResult tune_serving(const YAML::Node& tree, const std::string& path,
                               const std::vector<std::string>& sets, const ServingTuneOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchState st;
  st.tree = edited_tree(tree, sets);
  const Scenario base = parse_scenario_with(YAML::Clone(st.tree), path, {});
  check_slo(base);
  const ServingSpec& sv = *base.serving;
  ServingTuneResult result;
  result.scenario = base.name;
  result.slo_ttft_s = sv.slo_ttft.value();
  result.slo_tpot_s = sv.slo_tpot.value();
  result.attainment = o.attainment;

  st.path = path;
  st.shapes = candidate_shapes(sv, base.cluster.gpus_per_node);
  st.disaggregated = sv.disaggregated;
  st.attainment = o.attainment;
  st.result = &result;
  result.shapes = static_cast<int>(st.shapes.size());
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const int jobs =
      o.jobs > 0 ? o.jobs : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::exception_ptr error;
  std::vector<std::thread> pool;
  std::atomic<bool> spent{false};
  for (int t = 0; t < jobs; ++t)
    pool.emplace_back([&] {
      // The scenario's own shape always runs; then shapes while the budget lasts.
      for (std::size_t i; (i = st.next++) < st.shapes.size();) {
        if (i > 0 && elapsed() >= o.budget_s) {
          spent = true;
          return;
        }
        try {
          run_shape(st, st.shapes[i]);
        } catch (...) {
          std::lock_guard lock(st.mu);
          if (!error) error = std::current_exception();
          return;
        }
        if (o.progress) {
          std::lock_guard lock(st.mu);
          std::fprintf(stderr, "moesim tune: %d of %d shapes run (%d refused), %.1f s\n",
                       result.run, result.shapes, result.refused, elapsed());
        }
      }
    });
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  result.budget_spent = spent;
  rank_rows(result);
  return result;
}

namespace {

std::string slo_text(const ServingTuneResult& r) {
  std::string s;
  if (r.slo_ttft_s > 0) s += fmt::format("TTFT <= {:g} ms", r.slo_ttft_s * 1e3);
  if (r.slo_tpot_s > 0)
    s += fmt::format("{}TPOT <= {:g} ms", s.empty() ? "" : ", ", r.slo_tpot_s * 1e3);
  return s;
}

}  // namespace

void print_serving_tune(const ServingTuneResult& r, int top) {
  fmt::print(
      "# tune {}: SLO {} for {:.0f}% of requests; {} of {} shapes run{}, {} refused by the "
      "scenario's rules\n",
      r.scenario, slo_text(r), 100 * r.attainment, r.run, r.shapes,
      r.budget_spent ? " (budget spent: --budget runs more)" : "", r.refused);
  for (const auto& e : r.refused_examples) fmt::print("#   refused: {}\n", e);
  fmt::print("{:>4}  {:<56} {:<12} {:>7} {:>8} {:>10} {:>10} {:>12} {:>9}\n", "rank", "shape",
             "strategy", "SLO ok", "good/s/nd", "TTFT p99", "TPOT p99", "out tok/s/nd",
             "tok/s/usr");
  int rank = 0;
  for (const auto& row : r.ranked) {
    if (rank >= top) break;
    const auto& f = row.figures;
    fmt::print("{:>4}  {:<56} {:<12} {:>6.1f}% {:>9.2f} {:>8.1f}ms {:>8.2f}ms {:>12.0f} {:>9.1f}\n",
               ++rank, row.shape + (row.changes == 0 ? " (scenario)" : ""), row.strategy,
               100 * f.slo_attainment, row.goodput_per_node, f.ttft_p99_s * 1e3, f.tpot_p99_s * 1e3,
               f.output_tokens_per_s_per_node, f.output_tokens_per_s_per_user);
  }
  if (r.ranked.empty()) {
    fmt::print("# no shape ran: every one was refused (above)\n");
  } else if (r.met()) {
    const auto& b = r.ranked.front();
    fmt::print(
        "# best: {} with {}: {:.1f}% of requests within the SLO, {:.2f} requests/s within "
        "it per node\n",
        b.shape, b.strategy, 100 * b.figures.slo_attainment, b.goodput_per_node);
  } else {
    const auto& b = r.ranked.front();
    fmt::print(
        "# no shape meets the SLO ({:.0f}% of requests within {}): the closest, {} with "
        "{}, serves {:.1f}% within it{}\n",
        100 * r.attainment, slo_text(r), b.shape, b.strategy, 100 * b.figures.slo_attainment,
        r.budget_spent ? "; shapes the budget left out may" : "");
  }
}

nlohmann::ordered_json serving_tune_json(const ServingTuneResult& r) {
  nlohmann::ordered_json j;
  j["moesim_version"] = MOESIM_VERSION;
  j["scenario"] = r.scenario;
  j["slo"] = {{"ttft_s", r.slo_ttft_s}, {"tpot_s", r.slo_tpot_s}, {"attainment", r.attainment}};
  j["met"] = r.met();
  j["shapes"] = r.shapes;
  j["run"] = r.run;
  j["refused"] = r.refused;
  j["refused_examples"] = r.refused_examples;
  j["budget_spent"] = r.budget_spent;
  auto& rows = j["ranked"] = nlohmann::ordered_json::array();
  for (const auto& row : r.ranked) {
    nlohmann::ordered_json o;
    o["shape"] = row.shape;
    o["edits"] = row.edits;
    o["changes"] = row.changes;
    o["strategy"] = row.strategy;
    o["nodes"] = row.nodes;
    o["meets"] = row.meets;
    o["goodput_per_node"] = row.goodput_per_node;
    for (const auto& [name, field] : ServingRowFigures::fields()) o[name] = row.figures.*field;
    rows.push_back(std::move(o));
  }
  return j;
}

std::string serving_tune_csv(const ServingTuneResult& r) {
  std::ostringstream os;
  os << "rank,shape,strategy,nodes,changes,meets,goodput_per_node";
  for (const auto& [name, field] : ServingRowFigures::fields()) os << ',' << name;
  os << '\n';
  int rank = 0;
  for (const auto& row : r.ranked) {
    os << fmt::format("{},{},{},{},{},{},{:.9g}", ++rank, csv_field(row.shape), row.strategy,
                      row.nodes, row.changes, row.meets ? 1 : 0, row.goodput_per_node);
    for (const auto& [name, field] : ServingRowFigures::fields())
      os << fmt::format(",{:.9g}", row.figures.*field);
    os << '\n';
  }
  return os.str();
}

std::string serving_tuned_yaml(const YAML::Node& tree, const std::vector<std::string>& sets,
                               const ServingTuneRow& best) {
  YAML::Emitter out;
  std::vector<std::string> all = sets;
  all.insert(all.end(), best.edits.begin(), best.edits.end());
  out << edited_tree(tree, all);
  return fmt::format("# moesim tune: {} with {} ({:.1f}% of requests within the SLO)\n{}\n",
                     best.shape, best.strategy, 100 * best.figures.slo_attainment, out.c_str());
}

}  // namespace moesim::app
