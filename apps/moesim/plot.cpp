#include "apps/moesim/plot.hpp"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "apps/moesim/output.hpp"
#include "core/error.hpp"

namespace moesim::app {

namespace fs = std::filesystem;

namespace {

// A gnuplot single-quoted string ('' stands for a quote inside).
std::string gp_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += '\'';
    if (c != '\n') q += c;
  }
  return q + "'";
}

// A shell single-quoted word.
std::string sh_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

// A data-file label: double-quoted so spaces do not split columns.
std::string dat_label(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\n') ? '\'' : c;
  return q + "\"";
}

std::string extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (auto& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

std::string with_extension(const std::string& image_path, const char* ext) {
  fs::path p(image_path);
  p.replace_extension(ext);
  return p.string();
}

std::string terminal_line(const std::string& image_path, int width_px = 960, int height_px = 540) {
  // noenhanced: axis keys like model.capacity_factor must not turn '_' into subscripts.
  if (extension(image_path) == ".png")
    return fmt::format("set terminal pngcairo size {},{} noenhanced font 'sans,11'", width_px,
                       height_px);
  return fmt::format(
      "set terminal svg size {},{} dynamic noenhanced font 'sans,12' background rgb 'white'",
      width_px, height_px);
}

// Eight colours told apart also by colour-blind readers (Okabe and Ito), black last; a ninth
// series name reuses the first colour with another dash pattern.
constexpr std::array<const char*, 8> kPalette = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                 "#E69F00", "#56B4E9", "#999933", "#000000"};

std::string fmt_value(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : "?"; }

// Runs the script in the image's folder (the script names its files relative to it, so it can
// be re-run from there).
void run_gnuplot(const std::string& image_path) {
  std::string gnuplot = find_gnuplot();
  if (gnuplot.empty()) require_gnuplot();
  fs::path dir = fs::path(image_path).parent_path();
  if (dir.empty()) dir = ".";
  std::string cmd =
      fmt::format("cd {} && {} {} 2>&1", sh_quote(dir.string()), sh_quote(gnuplot),
                  sh_quote(fs::path(plot_script_path(image_path)).filename().string()));
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw RuntimeError("cannot start gnuplot");
  std::string out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(image_path))
    throw RuntimeError(fmt::format("gnuplot failed on {} (exit {}): {}",
                                   plot_script_path(image_path),
                                   WIFEXITED(status) ? WEXITSTATUS(status) : -1, out));
}

std::string header(const std::string& image_path, const std::string& title, int width_px = 960,
                   int height_px = 540) {
  std::string s = "# Written by moesim. Edit freely and re-run `gnuplot " +
                  fs::path(plot_script_path(image_path)).filename().string() +
                  "` in this folder.\n";
  s += terminal_line(image_path, width_px, height_px) + "\n";
  s += "set output " + gp_quote(fs::path(image_path).filename().string()) + "\n";
  s += "set title " + gp_quote(title) + "\n";
  s += "set datafile missing '?'\n";
  s += "set grid ytics\n";
  s += "set key outside right top\n";
  return s;
}

}  // namespace

std::string plot_data_path(const std::string& image_path) {
  return with_extension(image_path, ".dat");
}
std::string plot_script_path(const std::string& image_path) {
  return with_extension(image_path, ".gp");
}

std::string find_gnuplot() {
  if (const char* env = std::getenv("MOESIM_GNUPLOT")) {
    std::string p = env;
    return access(p.c_str(), X_OK) == 0 ? p : "";
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    fs::path cand = fs::path(dir) / "gnuplot";
    if (access(cand.c_str(), X_OK) == 0) return cand.string();
  }
  return "";
}

void require_gnuplot() {
  if (!find_gnuplot().empty()) return;
  throw RuntimeError(
      "--plot/--report need gnuplot, which was not found on PATH (or $MOESIM_GNUPLOT). Install it "
      "(Debian/Ubuntu: apt-get install gnuplot-nox; scripts/setup.sh does) or drop the option; "
      "the CSV/JSON outputs do not need it");
}

void check_plot_path(const std::string& path, const std::string& flag) {
  std::string ext = extension(path);
  if (ext != ".svg" && ext != ".png")
    throw InputError(
        fmt::format("{} {}: found extension '{}', expected .svg or .png", flag, path, ext));
}

void render_bar_chart(const BarChart& chart, const std::string& image_path) {
  check_plot_path(image_path, "--plot");
  require_gnuplot();
  std::string dat = plot_data_path(image_path);
  write_file_atomic(dat, [&](std::ostream& os) {
    os << "# group";
    for (const auto& s : chart.series) os << " " << dat_label(s);
    os << "\n";
    for (std::size_t g = 0; g < chart.groups.size(); ++g) {
      os << dat_label(chart.groups[g]);
      for (std::size_t s = 0; s < chart.series.size(); ++s)
        os << " " << fmt_value(s < chart.values[g].size() ? chart.values[g][s] : NAN);
      os << "\n";
    }
  });
  std::string datname = fs::path(dat).filename().string();
  write_file_atomic(plot_script_path(image_path), [&](std::ostream& os) {
    os << header(image_path, chart.title);
    os << "set ylabel " << gp_quote(chart.ylabel) << "\n";
    os << "set style data histograms\n";
    os << "set style histogram clustered gap 1\n";
    os << "set style fill solid 0.85 border -1\n";
    os << "set boxwidth 0.9\n";
    os << "set yrange [0:*]\n";
    if (chart.reference_line > 0)
      os << fmt::format(
          "set arrow from graph 0, first {0} to graph 1, first {0} nohead dt 2 "
          "lc rgb 'black'\n",
          chart.reference_line);
    os << "plot ";
    for (std::size_t s = 0; s < chart.series.size(); ++s) {
      if (s) os << ", \\\n     ";
      os << (s ? "''" : gp_quote(datname)) << " using " << s + 2 << (s ? "" : ":xtic(1)")
         << " title " << gp_quote(chart.series[s]);
    }
    os << "\n";
  });
  run_gnuplot(image_path);
}

LineChart facet_line_chart(const LineChart& chart) {
  LineChart out = chart;
  out.panels.clear();
  const std::size_t cap = LineChart::kMaxSeriesPerPanel;
  std::size_t wanted = 0;
  for (const auto& p : chart.panels) {
    const std::size_t parts = std::max<std::size_t>(1, (p.series.size() + cap - 1) / cap);
    for (std::size_t k = 0; k < parts; ++k, ++wanted) {
      if (out.panels.size() == LineChart::kMaxPanels) continue;
      LineChart::Panel q;
      q.title = parts == 1
                    ? p.title
                    : fmt::format("{}{}({}/{})", p.title, p.title.empty() ? "" : " ", k + 1, parts);
      const std::size_t end = std::min(p.series.size(), (k + 1) * cap);
      q.series.assign(p.series.begin() + static_cast<std::ptrdiff_t>(k * cap),
                      p.series.begin() + static_cast<std::ptrdiff_t>(end));
      out.panels.push_back(std::move(q));
    }
  }
  if (wanted > out.panels.size())
    out.note += fmt::format("{}first {} of {} panels; the CSV has every point",
                            out.note.empty() ? "" : "; ", out.panels.size(), wanted);
  return out;
}

void render_line_chart(const LineChart& input, const std::string& image_path) {
  check_plot_path(image_path, "--plot");
  require_gnuplot();
  const LineChart chart = facet_line_chart(input);
  // A series keeps its colour (and dash pattern) in every panel: by first appearance of its name.
  std::vector<std::string> names;
  auto style_of = [&](const std::string& name) {
    auto it = std::find(names.begin(), names.end(), name);
    const std::size_t i = static_cast<std::size_t>(it - names.begin());
    if (it == names.end()) names.push_back(name);
    return fmt::format("lc rgb '{}' dt {}", kPalette[i % kPalette.size()], 1 + i / kPalette.size());
  };
  std::string dat = plot_data_path(image_path);
  // One block per series of every panel, in order, separated by two blank lines (gnuplot's
  // `index`).
  write_file_atomic(dat, [&](std::ostream& os) {
    for (const auto& p : chart.panels)
      for (const auto& se : p.series) {
        os << "# " << (p.title.empty() ? "" : p.title + ": ") << se.name << "\n";
        for (std::size_t i = 0; i < se.x.size(); ++i)
          os << fmt_value(se.x[i]) << " " << fmt_value(se.y[i]) << "\n";
        os << "\n\n";
      }
  });
  const std::size_t n = std::max<std::size_t>(1, chart.panels.size());
  const std::size_t cols = n == 1 ? 1 : n <= 4 ? 2 : 3;
  const std::size_t rows = (n + cols - 1) / cols;
  const int width = n == 1 ? 960 : static_cast<int>(cols) * 520;
  const int height = n == 1 ? 540 : 60 + static_cast<int>(rows) * 360;
  const std::string title =
      chart.note.empty() ? chart.title : chart.title + " (" + chart.note + ")";
  std::string datname = fs::path(dat).filename().string();
  write_file_atomic(plot_script_path(image_path), [&](std::ostream& os) {
    os << header(image_path, n == 1 ? title : "", width, height);
    os << "set xlabel " << gp_quote(chart.xlabel) << "\n";
    os << "set ylabel " << gp_quote(chart.ylabel) << "\n";
    if (chart.log_x) os << "set logscale x 2\n";
    if (!chart.x_labels.empty()) {
      os << "set xtics (";
      for (std::size_t i = 0; i < chart.x_labels.size(); ++i)
        os << (i ? ", " : "") << gp_quote(chart.x_labels[i]) << " " << i;
      os << ")\n";
      os << fmt::format("set xrange [-0.5:{}]\n", static_cast<double>(chart.x_labels.size()) - 0.5);
    }
    os << "set yrange [0:*]\n";
    if (n > 1) {
      // Facets: one plot per panel, each with its own key (the colours agree across panels).
      os << "set key inside top left opaque font ',9' samplen 2\n";
      os << fmt::format("set multiplot layout {},{} title {}\n", rows, cols, gp_quote(title));
    }
    std::size_t index = 0;
    for (const auto& p : chart.panels) {
      if (n > 1) os << "set title " << gp_quote(p.title) << "\n";
      os << "plot ";
      for (std::size_t s = 0; s < p.series.size(); ++s, ++index) {
        if (s) os << ", \\\n     ";
        os << gp_quote(datname) << " index " << index << " using 1:2 with linespoints lw 2 "
           << style_of(p.series[s].name) << " title " << gp_quote(p.series[s].name);
      }
      if (p.series.empty()) os << "NaN notitle";
      os << "\n";
    }
    if (chart.panels.empty()) os << "plot NaN notitle\n";
    if (n > 1) os << "unset multiplot\n";
  });
  run_gnuplot(image_path);
}

}  // namespace moesim::app
