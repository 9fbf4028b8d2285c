#include "core/calibration.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

#include "core/scenario_loader.hpp"
#include "core/yaml_reader.hpp"

namespace moesim {

namespace fs = std::filesystem;
using yaml::Context;
using yaml::MapReader;

namespace {

constexpr std::string_view kFormat = "moesim-calibration/1";

// A time per unit ("0.02ns/FLOP", "1.5e-10s/B"): the time part is any time quantity; `per` is
// the unit of x. Bare numbers are refused like every other quantity.
double time_per(const MapReader& m, std::string_view key, std::string_view per) {
  const YAML::Node node = m.get(key);
  const std::string text = m.context().to_string(node, m.path_of(key));
  const std::string suffix = fmt::format("/{}", per);
  const std::string what = fmt::format("a time per {} such as '0.05ns{}'", per, suffix);
  if (text.size() <= suffix.size() ||
      text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0)
    m.fail(key, fmt::format("found '{}', expected {}", text, what));
  const ParsedQuantity q = parse_quantity(
      std::string_view(text).substr(0, text.size() - suffix.size()), UnitKind::kSeconds);
  if (!q.value) m.fail(key, fmt::format("found '{}', expected {}", text, what));
  // A second per byte or FLOP is already absurd; bounding it keeps time = beta x size finite
  // (1e308s/B x 1 MiB is infinite).
  if (*q.value > 1)
    m.fail(key, fmt::format("found '{}', expected {} of at most 1s{}", text, what, suffix));
  return *q.value;
}

LinearFit read_fit(const MapReader& m, std::string_view per) {
  m.require("alpha", "a time such as 5us");
  m.require("beta", fmt::format("a time per {}", per));
  LinearFit f;
  f.alpha = Seconds(*m.get_quantity("alpha", UnitKind::kSeconds));
  f.beta = time_per(m, "beta", per);
  return f;
}

const std::vector<std::string_view>& collective_names() {
  static const std::vector<std::string_view> names{"all_to_all", "all_to_allv",    "all_reduce",
                                                   "all_gather", "reduce_scatter", "send_recv"};
  return names;
}
const std::vector<std::string_view>& algo_names() {
  static const std::vector<std::string_view> names{"linear", "2dh",          "ring",
                                                   "tree",   "hierarchical", "saa"};
  return names;
}

std::string read_text(const std::string& path, const std::optional<SourceLocation>& from) {
  auto fail = [&](const std::string& msg) -> InputError {
    if (from) return InputError(*from, "cluster.calibration", msg);
    return InputError(SourceLocation{path, 0, 0}, "", msg);
  };
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw fail(
        fmt::format("found '{}', which does not exist; expected the path of a calibration "
                    "YAML file written by `moesim calibrate`",
                    path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw fail(fmt::format("cannot read '{}'", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string seconds_text(double s) { return fmt::format("{}s", s); }

}  // namespace

std::string exact_seconds(double s) { return seconds_text(s); }

LinearFit fit_alpha_beta(const std::vector<double>& x, const std::vector<double>& y) {
  MOESIM_ASSERT(x.size() == y.size() && x.size() >= 2, "fit needs >= 2 points");
  const double n = static_cast<double>(x.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < x.size(); ++i) mx += x[i], my += y[i];
  mx /= n, my /= n;
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
  }
  MOESIM_ASSERT(sxx > 0, "fit needs two distinct x");
  LinearFit f;
  f.beta = std::max(0.0, sxy / sxx);
  double alpha = my - f.beta * mx;
  if (alpha < 0) {
    // A negative startup cost is not physical: least squares through the origin.
    double sx2 = 0, sxy0 = 0;
    for (size_t i = 0; i < x.size(); ++i) sx2 += x[i] * x[i], sxy0 += x[i] * y[i];
    f.beta = sx2 > 0 ? std::max(0.0, sxy0 / sx2) : 0.0;
    alpha = 0;
  }
  f.alpha = Seconds(alpha);
  return f;
}

const TierCalibration* Calibration::tier(int t) const {
  for (const auto& p : point_to_point)
    if (p.tier == t) return &p;
  return nullptr;
}

const CollectiveCalibration* Calibration::collective(CollectiveType type, CollectiveAlgo algo,
                                                     int ranks) const {
  for (const auto& c : collectives)
    if (c.type == type && c.algo == algo && c.ranks == ranks) return &c;
  return nullptr;
}

Calibration parse_calibration(const std::string& text, const std::string& file) {
  const YAML::Node root = parse_yaml_string(text, file);
  Context ctx(file);
  static const std::vector<std::string_view> top{
      "format", "gpu",           "device", "backend",        "dtype",       "ranks",
      "nodes",  "gpus_per_node", "gemm",   "point_to_point", "collectives", "interference"};
  if (!root.IsDefined() || root.IsNull())
    throw InputError(SourceLocation{file, 1, 1}, "",
                     "found an empty document, expected a calibration map (format: " +
                         std::string(kFormat) + ")");
  MapReader m(ctx, root, "", top, SourceLocation{file, 1, 1});
  m.require("format", std::string(kFormat));
  if (*m.get_string("format") != kFormat)
    m.fail("format", fmt::format("found '{}', expected '{}'", *m.get_string("format"), kFormat));
  Calibration cal;
  cal.file = file;
  cal.gpu = m.get_string("gpu").value_or("");
  cal.device = m.get_string("device").value_or("");
  cal.backend = m.get_string("backend").value_or("");
  cal.dtype = m.get_string("dtype").value_or("");
  cal.ranks = static_cast<int>(m.get_int("ranks", 1, 1 << 24).value_or(0));
  cal.nodes = static_cast<int>(m.get_int("nodes", 1, 1 << 24).value_or(0));
  cal.gpus_per_node = static_cast<int>(m.get_int("gpus_per_node", 1, 1 << 24).value_or(0));

  if (m.has("gemm")) {
    MapReader g = m.get_map("gemm", {"alpha", "beta", "efficiency"});
    if (g.has("alpha")) cal.gemm.alpha_gemm = Seconds(*g.get_quantity("alpha", UnitKind::kSeconds));
    if (g.has("beta")) {
      const double beta = time_per(g, "beta", "FLOP");
      if (beta <= 0) g.fail("beta", "found 0, expected a positive time per FLOP");
      cal.gemm.beta_gemm_s_per_flop = beta;
    }
    if (g.has("efficiency")) {
      if (!g.has("beta"))
        g.fail("efficiency",
               "found an efficiency table without gemm.beta; expected both (efficiencies are "
               "relative to the shapes beta was fitted on)");
      const std::string path = g.path_of("efficiency");
      YAML::Node list = ctx.require_list(g.get("efficiency"), path);
      for (size_t i = 0; i < list.size(); ++i) {
        MapReader p(ctx, list[i], fmt::format("{}[{}]", path, i),
                    {"m", "n", "k", "batch", "efficiency"});
        for (auto key : {"m", "n", "k", "efficiency"}) p.require(key, "a number");
        GemmEfficiencyPoint pt;
        // GEMM dimensions as the executor passes them to cuBLAS (32-bit ints).
        constexpr std::int64_t kMaxDim = std::numeric_limits<int>::max();
        pt.shape.m = *p.get_int("m", 1, kMaxDim);
        pt.shape.n = *p.get_int("n", 1, kMaxDim);
        pt.shape.k = *p.get_int("k", 1, kMaxDim);
        pt.shape.batch = p.get_int("batch", 1, kMaxDim).value_or(1);
        pt.efficiency = *p.get_number("efficiency");
        if (!(pt.efficiency > 0 && pt.efficiency <= 1))
          p.fail("efficiency", fmt::format("found {}, expected a number in (0, 1]", pt.efficiency));
        cal.gemm.efficiency_table.push_back(pt);
      }
    }
  }
  if (m.has("point_to_point")) {
    const std::string path = m.path_of("point_to_point");
    YAML::Node list = ctx.require_list(m.get("point_to_point"), path);
    for (size_t i = 0; i < list.size(); ++i) {
      MapReader p(ctx, list[i], fmt::format("{}[{}]", path, i), {"tier", "alpha", "beta"});
      p.require("tier", "the tier number `moesim topo` prints (0 = inside a node)");
      TierCalibration t;
      t.tier = static_cast<int>(*p.get_int("tier", 0, 16));
      t.fit = read_fit(p, "B");
      t.where = p.where();
      if (cal.tier(t.tier) != nullptr)
        p.fail("tier", fmt::format("found tier {} twice, expected one entry per tier", t.tier));
      cal.point_to_point.push_back(t);
    }
  }
  if (m.has("collectives")) {
    const std::string path = m.path_of("collectives");
    YAML::Node list = ctx.require_list(m.get("collectives"), path);
    for (size_t i = 0; i < list.size(); ++i) {
      MapReader p(ctx, list[i], fmt::format("{}[{}]", path, i),
                  {"collective", "algo", "ranks", "alpha", "beta"});
      p.require("collective", yaml::join_alternatives(collective_names()));
      p.require("algo", yaml::join_alternatives(algo_names()));
      p.require("ranks", "the group size measured");
      CollectiveCalibration c;
      c.type = *parse_collective_type(
          collective_names()[*p.get_choice("collective", collective_names())]);
      c.algo = *parse_collective_algo(algo_names()[*p.get_choice("algo", algo_names())]);
      c.ranks = static_cast<int>(*p.get_int("ranks", 1, 1 << 24));
      c.fit = read_fit(p, "B");
      c.where = p.where();
      if (cal.collective(c.type, c.algo, c.ranks) != nullptr)
        p.fail("collective", "found a second entry for the same collective, algo and ranks");
      cal.collectives.push_back(c);
    }
  }
  if (m.has("interference")) {
    const double v = *m.get_number("interference");
    if (!(v >= 0 && v <= 100))
      m.fail("interference", fmt::format("found {}, expected a number in [0, 100]", v));
    cal.interference = v;
  }
  return cal;
}

Calibration load_calibration(const std::string& path,
                             const std::optional<SourceLocation>& referenced_from) {
  return parse_calibration(read_text(path, referenced_from), path);
}

std::shared_ptr<const Calibration> load_calibration_cached(
    const std::string& path, const std::optional<SourceLocation>& referenced_from) {
  // Keyed by path AND the file's modification time and size, so a file rewritten in place (a new
  // `moesim calibrate --out` between two runs of a long-lived process, a sweep over calibrations)
  // is read again. A file that cannot be stat'ed is not cached: load_calibration reports it.
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  const auto size = ec ? 0 : std::filesystem::file_size(path, ec);
  if (ec) return std::make_shared<const Calibration>(load_calibration(path, referenced_from));
  using Key = std::tuple<std::string, std::filesystem::file_time_type, std::uintmax_t>;
  static std::mutex mu;
  static std::map<Key, std::shared_ptr<const Calibration>> cache;
  const Key key{path, mtime, size};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  auto cal = std::make_shared<const Calibration>(load_calibration(path, referenced_from));
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(key, std::move(cal)).first->second;
}

std::string calibration_yaml(const Calibration& cal) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  for (const auto& c : cal.comments) line(c.empty() ? "#" : "# " + c);
  line(fmt::format("format: {}", kFormat));
  if (!cal.gpu.empty()) line(fmt::format("gpu: {}", cal.gpu));
  if (!cal.device.empty()) line(fmt::format("device: {}", cal.device));
  if (!cal.backend.empty()) line(fmt::format("backend: {}", cal.backend));
  if (!cal.dtype.empty()) line(fmt::format("dtype: {}", cal.dtype));
  if (cal.ranks > 0) line(fmt::format("ranks: {}", cal.ranks));
  if (cal.nodes > 0) line(fmt::format("nodes: {}", cal.nodes));
  if (cal.gpus_per_node > 0) line(fmt::format("gpus_per_node: {}", cal.gpus_per_node));
  const auto& g = cal.gemm;
  if (!g.empty()) {
    line("gemm:");
    if (g.alpha_gemm) line(fmt::format("  alpha: {}", seconds_text(g.alpha_gemm->value())));
    if (g.beta_gemm_s_per_flop)
      line(fmt::format("  beta: {}/FLOP   # {:.4g} GFLOP/s", seconds_text(*g.beta_gemm_s_per_flop),
                       1e-9 / *g.beta_gemm_s_per_flop));
    if (!g.efficiency_table.empty()) {
      line("  efficiency:");
      for (const auto& p : g.efficiency_table)
        line(fmt::format("    - {{m: {}, n: {}, k: {}, batch: {}, efficiency: {}}}", p.shape.m,
                         p.shape.n, p.shape.k, p.shape.batch, p.efficiency));
    }
  }
  auto fit_text = [](const LinearFit& f) {
    const std::string bw =
        f.beta > 0 ? fmt::format("  # {:.4g} GB/s", 1e-9 / f.beta) : std::string();
    return fmt::format("alpha: {}, beta: {}/B}}{}", seconds_text(f.alpha.value()),
                       seconds_text(f.beta), bw);
  };
  if (!cal.point_to_point.empty()) {
    line("point_to_point:");
    for (const auto& t : cal.point_to_point)
      line(fmt::format("  - {{tier: {}, {}", t.tier, fit_text(t.fit)));
  }
  if (!cal.collectives.empty()) {
    line("collectives:");
    for (const auto& c : cal.collectives)
      line(fmt::format("  - {{collective: {}, algo: {}, ranks: {}, {}",
                       collective_type_name(c.type), collective_algo_name(c.algo), c.ranks,
                       fit_text(c.fit)));
  }
  if (cal.interference) line(fmt::format("interference: {}", *cal.interference));
  return out;
}

}  // namespace moesim
