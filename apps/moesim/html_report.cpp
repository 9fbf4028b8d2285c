#include "apps/moesim/html_report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "apps/moesim/output.hpp"
#include "core/error.hpp"

namespace moesim::app {

namespace fs = std::filesystem;

namespace {

const char* kStyle = R"(
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.6em; border-bottom: 2px solid #36c; padding-bottom: .2em; }
h2 { font-size: 1.25em; margin-top: 1.6em; color: #234; }
table { border-collapse: collapse; margin: .6em 0; font-size: .92em; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: right; }
th { background: #eef2f8; }
td.l, th.l { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.best { font-weight: bold; color: #063; }
.note { color: #666; font-size: .9em; }
.plot svg, .plot img { max-width: 100%; height: auto; border: 1px solid #ddd; }
details { margin: .4em 0; }
summary { cursor: pointer; }
)";

std::string ms(double s) { return fmt::format("{:.3f}", s * 1e3); }

std::string speedup_text(double x) { return x > 0 ? fmt::format("{:.2f}x", x) : "-"; }

std::string read_all(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  if (!is) throw RuntimeError(fmt::format("cannot read '{}' for the report", path));
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(in[i]) << 16) |
                 (static_cast<unsigned char>(in[i + 1]) << 8) |
                 static_cast<unsigned char>(in[i + 2]);
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += t[(v >> 6) & 63];
    out += t[v & 63];
  }
  if (i < in.size()) {
    unsigned v = static_cast<unsigned char>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += i + 1 < in.size() ? t[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string row(const std::vector<std::string>& cells, bool head = false,
                std::size_t left_cols = 1) {
  std::string s = "<tr>";
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const char* tag = head ? "th" : "td";
    s += fmt::format("<{}{}>{}</{}>", tag, i < left_cols ? " class=\"l\"" : "", cells[i], tag);
  }
  return s + "</tr>\n";
}

std::string page_start(const std::string& title) {
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n"
      "<style>{}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
      html_escape(title), kStyle, html_escape(title));
}

std::string page_end() {
  return fmt::format("<p class=\"note\">Written by moesim {}.</p>\n</body>\n</html>\n",
                     MOESIM_VERSION);
}

// `cluster`: what the box says of the cluster ("" = none: the caller shows it elsewhere).
std::string scenario_section(const Scenario& sc, const std::string& cluster = "") {
  const auto& m = sc.model;
  const auto& p = sc.parallelism;
  std::string s = "<h2>Scenario</h2>\n";
  s += fmt::format("<p><b>{}</b>: {}</p>\n", html_escape(sc.name), html_escape(sc.description));
  s += "<table>\n";
  auto kv = [&](const std::string& k, const std::string& v) {
    s += row({k, html_escape(v)}, false, 2);
  };
  if (!cluster.empty()) kv("cluster", cluster);
  kv("model",
     fmt::format("{}, {} layer(s), MoE every {}",
                 m.mode == Mode::kTraining ? "training" : "inference", m.layers, m.moe_every));
  kv("tokens per GPU",
     fmt::format("B={} x L={} = {}", m.batch_per_gpu, m.seq_len, sc.tokens_per_gpu()));
  kv("dimensions", fmt::format("M={} H={} (dense FFN {}) {}", m.model_dim, m.hidden_dim,
                               m.dense_hidden(), dtype_name(m.dtype)));
  kv("experts",
     fmt::format("E={} (top-{}, capacity factor {})", m.experts, m.top_k, m.capacity_factor));
  kv("parallelism", fmt::format("{}ep={} esp={} mp={} dp={} layout={}",
                                p.pp > 1 ? fmt::format("pp={} ", p.pp) : "", p.ep, p.esp, p.mp,
                                p.dp, name_of(p.layout)));
  kv("workload", fmt::format("{} iteration(s), routing seed {}", sc.workload.iterations,
                             sc.workload.routing.seed));
  s += "</table>\n";
  return s;
}

std::string cluster_row(const std::string& name, const ClusterSpec& c) {
  std::string inter = std::string(inter_kind_name(c.inter.kind));
  if (c.inter.kind != InterKind::kNone && c.inter.kind != InterKind::kCustom)
    inter += fmt::format(", {} NIC(s)/node x {}", c.inter.nics_per_node,
                         to_string(c.inter.nic_bandwidth));
  if (c.inter.kind == InterKind::kFatTree || c.inter.kind == InterKind::kRailOptimized)
    inter += fmt::format(", oversubscription {}", c.inter.oversubscription);
  return row({html_escape(name), std::to_string(c.num_gpus()), html_escape(c.gpu.name),
              fmt::format("{} x {}", c.nodes, c.gpus_per_node),
              html_escape(fmt::format("{} {}", intra_kind_name(c.intra.kind),
                                      to_string(c.intra.bandwidth))),
              html_escape(inter)},
             false, 6);
}

std::string topology_header() {
  return row({"topology", "GPUs", "GPU", "nodes x GPUs", "intra-node", "inter-node"}, true, 6);
}

std::string plot_block(const std::string& plot_path, const std::string& note) {
  std::string s = "<h2>Plot</h2>\n";
  if (!plot_path.empty())
    s += "<div class=\"plot\">\n" + inline_image(plot_path) + "\n</div>\n";
  else
    s += fmt::format("<p class=\"note\">{}</p>\n", html_escape(note));
  return s;
}

}  // namespace

std::string html_escape(const std::string& in) {
  std::string s;
  s.reserve(in.size());
  for (char c : in) {
    switch (c) {
      case '&':
        s += "&amp;";
        break;
      case '<':
        s += "&lt;";
        break;
      case '>':
        s += "&gt;";
        break;
      case '"':
        s += "&quot;";
        break;
      case '\'':
        s += "&#39;";
        break;
      default:
        s += c;
    }
  }
  return s;
}

std::string inline_image(const std::string& path) {
  std::string data = read_all(path);
  std::string ext = fs::path(path).extension().string();
  if (ext == ".png" || ext == ".PNG")
    return fmt::format("<img alt=\"plot\" src=\"data:image/png;base64,{}\">", base64(data));
  // Inline SVG: drop the XML prolog and DOCTYPE, which are not allowed inside HTML.
  std::size_t at = data.find("<svg");
  if (at == std::string::npos) throw RuntimeError(fmt::format("'{}' is not an SVG image", path));
  return data.substr(at);
}

void write_compare_report(const std::string& path, const CompareReport& r) {
  MOESIM_ASSERT(!r.scenarios.empty() && r.runs.size() == r.scenarios.size(),
                "a report needs one run list per topology");
  const Scenario& base = *r.scenarios.front();
  std::string h = page_start(fmt::format("moesim {}: {}", r.command, base.name));
  h +=
      fmt::format("<p>Engine <b>{}</b>; {} strateg{} on {} topolog{}.</p>\n", html_escape(r.engine),
                  r.strategies.size(), r.strategies.size() == 1 ? "y" : "ies",
                  r.topology_names.size(), r.topology_names.size() == 1 ? "y" : "ies");
  // compare replaces the cluster per topology: the file's description names its own cluster,
  // which the runs below may not have used.
  const auto& c = base.cluster;
  h += scenario_section(
      base, r.command == "compare"
                ? "one per topology (below); the description is the scenario file's, written "
                  "for its own cluster"
                : fmt::format("{} nodes x {} {} ({})", c.nodes, c.gpus_per_node, c.gpu.name,
                              r.topology_names.front()));

  h += "<h2>Topologies</h2>\n<table>\n" + topology_header();
  for (std::size_t t = 0; t < r.scenarios.size(); ++t)
    h += cluster_row(r.topology_names[t], r.scenarios[t]->cluster);
  h += "</table>\n";

  h += "<h2>Comparison</h2>\n<p class=\"note\">Mean step time in ms (speedup vs the baseline on "
       "the same topology); the fastest strategy per topology in bold.</p>\n";
  h += "<table id=\"comparison\">\n";
  std::vector<std::string> head = {"strategy"};
  for (const auto& t : r.topology_names) head.push_back(html_escape(t));
  h += row(head, true);
  for (std::size_t s = 0; s < r.strategies.size(); ++s) {
    std::vector<std::string> cells = {html_escape(r.strategies[s])};
    for (std::size_t t = 0; t < r.runs.size(); ++t) {
      const auto& sum = r.runs[t][s].summary;
      bool best = true;
      for (const auto& other : r.runs[t])
        if (other.summary.step_mean_s < sum.step_mean_s) best = false;
      std::string cell = ms(sum.step_mean_s);
      if (sum.speedup > 0) cell += " (" + speedup_text(sum.speedup) + ")";
      cells.push_back(best ? "<span class=\"best\">" + cell + "</span>" : cell);
    }
    h += row(cells);
  }
  h += "</table>\n";

  h += "<h2>Breakdown</h2>\n<table>\n";
  // The figures and the compute classes (docs/figures.md) before the decisions, which stay last
  // (left-aligned below).
  h += row({"topology",          "strategy",
            "step (ms)",         "p50 (ms)",
            "p95 (ms)",          "MoE layer (ms)",
            "all-to-all (ms)",   "allreduce (ms)",
            "compute (ms)",      "exposed comm (ms)",
            "speedup",           "tokens/s/GPU",
            "model TFLOP/s/GPU", "MFU",
            "GEMM (ms)",         "attention (ms)",
            "memory-bound (ms)", "optimizer (ms)",
            "recompute (ms)",    "decisions (last iteration)"},
           true, 2);
  for (std::size_t t = 0; t < r.runs.size(); ++t)
    for (const auto& run : r.runs[t]) {
      const auto& m = run.summary;
      std::vector<std::string> cells = {html_escape(r.topology_names[t]),
                                        html_escape(m.strategy),
                                        ms(m.step_mean_s),
                                        ms(m.step_p50_s),
                                        ms(m.step_p95_s),
                                        ms(m.moe_layer_mean_s),
                                        ms(m.a2a_mean_s),
                                        ms(m.allreduce_mean_s),
                                        ms(m.compute_mean_s),
                                        ms(m.exposed_comm_mean_s),
                                        speedup_text(m.speedup),
                                        tokens_text(m),
                                        tflops_text(m),
                                        mfu_text(m),
                                        ms(m.gemm_mean_s),
                                        ms(m.attention_mean_s),
                                        ms(m.memory_bound_mean_s),
                                        ms(m.optimizer_mean_s),
                                        ms(m.recompute_mean_s),
                                        html_escape(m.decisions)};
      std::string line = row(cells, false, 2);
      // The decisions column reads better left-aligned.
      auto pos = line.rfind("<td>");
      line.replace(pos, 4, "<td class=\"l\">");
      h += line;
    }
  h += "</table>\n";

  h += plot_block(r.plot_path, r.plot_note);

  h += "<h2>Decisions per iteration</h2>\n";
  for (std::size_t t = 0; t < r.runs.size(); ++t)
    for (const auto& run : r.runs[t]) {
      if (!run.run) continue;
      h += fmt::format("<details><summary>{} on {} ({} iteration(s))</summary>\n<table>\n",
                       html_escape(run.summary.strategy), html_escape(r.topology_names[t]),
                       run.run->iterations.size());
      h += row({"iteration", "capacity factor", "step (ms)", "MoE layer (ms)", "dropped tokens",
                "decisions"},
               true, 0);
      for (const auto& it : run.run->iterations) {
        std::string line =
            row({std::to_string(it.index), fmt::format("{:g}", it.capacity_factor),
                 ms(it.step_time_s), ms(it.moe_layer_time_s), std::to_string(it.dropped_tokens),
                 html_escape(it.decision.describe())},
                false, 0);
        auto pos = line.rfind("<td>");
        line.replace(pos, 4, "<td class=\"l\">");
        h += line;
      }
      h += "</table></details>\n";
    }
  if (!r.trace_paths.empty()) {
    h += "<h2>Traces</h2>\n<ul>\n";
    for (const auto& tp : r.trace_paths)
      h += fmt::format("<li><a href=\"{0}\">{0}</a> (open in chrome://tracing or Perfetto)</li>\n",
                       html_escape(tp));
    h += "</ul>\n";
  }
  h += page_end();
  write_file_atomic(path, [&](std::ostream& os) { os << h; });
}

namespace {

// A serving sweep's rows: latency percentiles and throughput per node and per user.
std::string serving_rows(const SweepResult& res, std::vector<std::string> head,
                         std::size_t max_rows) {
  for (const char* c :
       {"strategy", "GPUs", "TTFT p50 (ms)", "TTFT p99 (ms)", "TPOT p50 (ms)", "TPOT p99 (ms)",
        "input tokens/s/node", "output tokens/s/node", "tokens/s/user", "SLO attainment", "KV use"})
    head.push_back(c);
  std::string h = row(head, true, 0);
  for (std::size_t i = 0; i < res.rows.size() && i < max_rows; ++i) {
    const auto& r = res.rows[i];
    const ServingRowFigures& f = *r.serving;
    std::vector<std::string> cells = {std::to_string(r.point)};
    for (const auto& v : r.values) cells.push_back(html_escape(v));
    cells.push_back(html_escape(r.summary.strategy));
    cells.push_back(std::to_string(r.summary.gpus));
    for (double s : {f.ttft_p50_s, f.ttft_p99_s, f.tpot_p50_s, f.tpot_p99_s})
      cells.push_back(ms(s));
    cells.push_back(fmt::format("{:.0f}", f.input_tokens_per_s_per_node));
    cells.push_back(fmt::format("{:.0f}", f.output_tokens_per_s_per_node));
    cells.push_back(fmt::format("{:.1f}", f.output_tokens_per_s_per_user));
    cells.push_back(fmt::format("{:.1f}%", 100 * f.slo_attainment));
    cells.push_back(fmt::format("{:.1f}%", 100 * f.kv_utilization));
    h += row(cells, false, 0);
  }
  return h;
}

}  // namespace

void write_sweep_report(const std::string& path, const SweepReport& r) {
  MOESIM_ASSERT(r.spec && r.result && r.base, "a sweep report needs its spec, result and base");
  const SweepSpec& spec = *r.spec;
  const SweepResult& res = *r.result;
  std::string h = page_start(fmt::format("moesim sweep: {}", spec.name));
  if (!spec.description.empty()) h += fmt::format("<p>{}</p>\n", html_escape(spec.description));
  h += fmt::format(
      "<p>Engine <b>{}</b>; {} point(s) ({} run now, {} resumed from the CSV), {} mode; base "
      "scenario <code>{}</code>.</p>\n",
      html_escape(res.engine), res.points_total, res.points_run, res.points_skipped,
      spec.mode == SweepMode::kZip ? "zip" : "cartesian", html_escape(spec.base_path));
  h += "<h2>Axes</h2>\n<table>\n" + row({"key path", "values"}, true, 2);
  for (const auto& a : spec.axes) {
    std::string vals;
    for (std::size_t i = 0; i < a.values.size(); ++i) {
      if (i == 12 && a.values.size() > 16) {
        vals += fmt::format(", ... ({} values)", a.values.size());
        break;
      }
      vals += (i ? ", " : "") + a.values[i];
    }
    h += row({"<code>" + html_escape(a.key) + "</code>", html_escape(vals)}, false, 2);
  }
  h += "</table>\n";
  h += scenario_section(*r.base);
  h += "<h2>Base topology</h2>\n<table>\n" + topology_header();
  h += cluster_row(r.base->cluster.name.empty() ? r.base->name : r.base->cluster.name,
                   r.base->cluster);
  h += "</table>\n";
  h += plot_block(r.plot_path, r.plot_note);

  h += "<h2>Results</h2>\n";
  if (res.rows.size() > r.max_rows)
    h += fmt::format("<p class=\"note\">First {} of {} rows; the CSV has them all.</p>\n",
                     r.max_rows, res.rows.size());
  h += "<table id=\"comparison\">\n";
  std::vector<std::string> head = {"point"};
  for (const auto& a : spec.axes) head.push_back(html_escape(a.key));
  if (!res.rows.empty() && res.rows.front().serving) {
    h += serving_rows(res, head, r.max_rows);
    h += "</table>\n";
    h += page_end();
    write_file_atomic(path, [&](std::ostream& os) { os << h; });
    return;
  }
  for (const char* c :
       {"strategy", "GPUs", "step (ms)", "MoE layer (ms)", "all-to-all (ms)", "exposed comm (ms)",
        "speedup", "tokens/s/GPU", "model TFLOP/s/GPU", "MFU", "decisions (last iteration)"})
    head.push_back(c);
  h += row(head, true, 0);
  for (std::size_t i = 0; i < res.rows.size() && i < r.max_rows; ++i) {
    const auto& row_ = res.rows[i];
    const auto& m = row_.summary;
    std::vector<std::string> cells = {std::to_string(row_.point)};
    for (const auto& v : row_.values) cells.push_back(html_escape(v));
    cells.push_back(html_escape(m.strategy));
    cells.push_back(std::to_string(m.gpus));
    cells.push_back(ms(m.step_mean_s));
    cells.push_back(ms(m.moe_layer_mean_s));
    cells.push_back(ms(m.a2a_mean_s));
    cells.push_back(ms(m.exposed_comm_mean_s));
    cells.push_back(speedup_text(m.speedup));
    cells.push_back(tokens_text(m));
    cells.push_back(tflops_text(m));
    cells.push_back(mfu_text(m));
    cells.push_back(html_escape(m.decisions));
    h += row(cells, false, 0);
  }
  h += "</table>\n";
  h += page_end();
  write_file_atomic(path, [&](std::ostream& os) { os << h; });
}

namespace {

// Horizontal bars of step time, the reference first, as inline SVG (no plotting tool needed).
std::string tune_bars(const TuneResult& r) {
  struct Bar {
    std::string label;
    double s;
    bool reference;
  };
  const bool rerun = r.baseline_rerun.has_value();
  std::vector<Bar> bars;
  bars.push_back({"reference (baseline)",
                  rerun ? r.baseline_rerun->step_mean_s : r.baseline_screen.step_mean_s, true});
  int rank = 0;
  for (const TuneRow& row : r.ranked) {
    std::string roles = row.roles;
    if (roles.size() > 44) roles = roles.substr(0, 41) + "...";
    bars.push_back({fmt::format("{}. {}", ++rank, roles), row.time_s(), false});
  }
  double top = 0;
  for (const Bar& b : bars) top = std::max(top, b.s);
  if (!(top > 0)) return "";
  constexpr int kLabel = 330, kBar = 520, kRow = 22;
  const int height = static_cast<int>(bars.size()) * kRow + 30;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
      kLabel + kBar + 110, height);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const int y = static_cast<int>(i) * kRow + 8;
    const double w = kBar * b.s / top;
    svg += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>"
        "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{}\">{} ms</text>\n",
        kLabel - 6, y + 13, html_escape(b.label), kLabel, y, w, kRow - 6,
        b.reference ? "#999" : (i == 1 ? "#2a7" : "#58c"), kLabel + w + 6, y + 13, ms(b.s));
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" fill=\"#666\">step time on {} (shorter is better)</text>\n", kLabel,
      height - 6, html_escape(rerun ? r.rerun_engine : r.screen_engine));
  return svg + "</svg>\n";
}

std::string gib_text(double bytes) { return fmt::format("{:.1f}", bytes / (1024.0 * 1024 * 1024)); }

}  // namespace

void write_tune_report(const std::string& path, const TuneReport& rep) {
  MOESIM_ASSERT(rep.result && rep.scenario, "a tune report needs its result and scenario");
  const TuneResult& r = *rep.result;
  const Scenario& sc = *rep.scenario;
  std::string h = page_start(fmt::format("moesim tune: {}", sc.name));
  const bool rerun = r.baseline_rerun.has_value();
  h += fmt::format(
      "<p>Scenario <code>{}</code>, {} GPUs. Searched {} layouts ({} fit the GPU memory, {} got "
      "a stack search) and {} stacks in all: {} runs on <b>{}</b> ({} inapplicable, {} over "
      "memory){}, the best {} re-run on <b>{}</b>. {} worker(s){}; {:.1f} s screening, {:.1f} s "
      "re-running; best found after {:.1f} s; the search {}.</p>\n",
      html_escape(r.scenario), r.gpus, r.layouts.size(), r.layouts_fit, r.layouts_searched,
      r.stacks_in_space, r.evaluated, html_escape(r.screen_engine), r.inapplicable, r.over_memory,
      r.probes > 0 ? fmt::format(" + {} one-iteration layout probes", r.probes) : "",
      std::count_if(r.ranked.begin(), r.ranked.end(),
                    [](const TuneRow& x) { return x.rerun.has_value(); }),
      html_escape(r.rerun_engine), r.workers,
      r.runs_per_rank.size() > 1 ? fmt::format(" on {} ranks", r.runs_per_rank.size()) : "",
      r.screen_wall_s, r.rerun_wall_s, r.time_to_best_s,
      r.complete ? "completed" : "was cut short by the budget (see the notes)");
  if (!r.ranked.empty()) {
    const TuneRow& best = r.ranked.front();
    h += fmt::format(
        "<p class=\"best\">Best: {} on layout {}: {} ms, {} the scenario's baseline.</p>\n",
        html_escape(best.roles), html_escape(r.layouts[best.layout].describe()), ms(best.time_s()),
        speedup_text(best.rerun ? best.rerun->speedup : best.screen.speedup));
    h += "<p class=\"note\">`moesim tune ... --emit best.yaml` writes it as a scenario that "
         "`moesim simulate`, `compare` and `exec` run as is.</p>\n";
  }
  h += scenario_section(sc);
  h += "<h2>Cluster</h2>\n<table>\n" + topology_header();
  h += cluster_row(sc.cluster.name.empty() ? sc.name : sc.cluster.name, sc.cluster);
  h += "</table>\n";

  h += "<h2>Ranked candidates</h2>\n<div class=\"plot\">\n" + tune_bars(r) + "</div>\n";
  h += "<table id=\"ranked\">\n";
  h += row({"rank", fmt::format("{} (ms)", html_escape(r.screen_engine)),
            rerun ? fmt::format("{} (ms)", html_escape(r.rerun_engine)) : std::string("-"),
            "speedup", "memory (GiB)", "layout", "stack", "decisions (last iteration)",
            "all-to-all (ms)", "compute (ms)", "exposed comm (ms)"},
           true, 0);
  h += row({"ref", ms(r.baseline_screen.step_mean_s),
            rerun ? ms(r.baseline_rerun->step_mean_s) : std::string("-"), "1.00x",
            gib_text(r.baseline_screen.memory_bytes), "the scenario's", "baseline",
            html_escape(r.baseline_screen.decisions), ms(r.baseline_screen.a2a_mean_s),
            ms(r.baseline_screen.compute_mean_s), ms(r.baseline_screen.exposed_comm_mean_s)},
           false, 0);
  int rank = 0;
  for (const TuneRow& x : r.ranked) {
    const RunSummary& s = x.rerun ? *x.rerun : x.screen;
    h += row({std::to_string(++rank), ms(x.screen.step_mean_s),
              x.rerun ? ms(x.rerun->step_mean_s) : std::string("-"), speedup_text(s.speedup),
              gib_text(x.screen.memory_bytes), html_escape(r.layouts[x.layout].describe()),
              "<code>" + html_escape(x.stack_yaml) + "</code>", html_escape(s.decisions),
              ms(s.a2a_mean_s), ms(s.compute_mean_s), ms(s.exposed_comm_mean_s)},
             false, 0);
  }
  h += "</table>\n";

  // Layouts: screened ones by their screen time, then the rest.
  std::vector<std::size_t> order(r.layouts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](std::size_t i) {
    const double t = r.layouts[i].screen_s;
    return std::isnan(t) ? INFINITY : t;
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  const double gpu_bytes = sc.cluster.gpu.memory.value();
  h += fmt::format(
      "<h2>Layouts</h2>\n<p class=\"note\">Every layout of the space with the baseline stack's "
      "memory estimate (the {}'s {} GiB) and its screen: the best of the baseline and parm_auto "
      "{}.</p>\n<details><summary>{} layouts</summary>\n<table id=\"layouts\">\n",
      html_escape(sc.cluster.gpu.name), gib_text(gpu_bytes),
      r.probes > 0 ? "over one iteration" : "over the scenario's iterations", r.layouts.size());
  h += row({"layout", "memory (GiB)", "fits", "screen (ms)", "stack search"}, true, 1);
  // Every screened layout, then at most 300 more: a 2,048-GPU model has ten thousand.
  constexpr std::size_t kUnscreenedShown = 300;
  std::size_t unscreened = 0, hidden = 0;
  for (std::size_t i : order) {
    const TuneLayout& l = r.layouts[i];
    if (std::isnan(l.screen_s) && ++unscreened > kUnscreenedShown) {
      ++hidden;
      continue;
    }
    const bool fits = gpu_bytes <= 0 || l.memory_bytes <= gpu_bytes;
    const std::string screen = std::isnan(l.screen_s)   ? (fits ? "not screened" : "-")
                               : std::isinf(l.screen_s) ? "refused"
                                                        : ms(l.screen_s);
    h += row({html_escape(l.describe()) + (l.is_scenario ? " (the scenario's)" : ""),
              gib_text(l.memory_bytes), fits ? "yes" : "no", screen,
              l.search.empty() ? "-" : html_escape(l.search)},
             false, 1);
  }
  h += "</table>\n";
  if (hidden > 0)
    h += fmt::format("<p class=\"note\">{} more layouts, none screened, are not listed.</p>\n",
                     hidden);
  h += "</details>\n";
  if (!r.notes.empty()) {
    h += "<h2>Notes</h2>\n<ul>\n";
    for (const auto& n : r.notes) h += "<li>" + html_escape(n) + "</li>\n";
    h += "</ul>\n";
  }
  h += page_end();
  write_file_atomic(path, [&](std::ostream& os) { os << h; });
}

}  // namespace moesim::app
