#include "apps/moesim/plot.hpp"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

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

std::string terminal_line(const std::string& image_path) {
  // noenhanced: axis keys like model.capacity_factor must not turn '_' into subscripts.
  if (extension(image_path) == ".png")
    return "set terminal pngcairo size 960,540 noenhanced font 'sans,11'";
  return "set terminal svg size 960,540 dynamic noenhanced font 'sans,12' background rgb 'white'";
}

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

std::string header(const std::string& image_path, const std::string& title) {
  std::string s = "# Written by moesim. Edit freely and re-run `gnuplot " +
                  fs::path(plot_script_path(image_path)).filename().string() +
                  "` in this folder.\n";
  s += terminal_line(image_path) + "\n";
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

void render_line_chart(const LineChart& chart, const std::string& image_path) {
  check_plot_path(image_path, "--plot");
  require_gnuplot();
  std::string dat = plot_data_path(image_path);
  // One block per series, separated by two blank lines (gnuplot's `index`).
  write_file_atomic(dat, [&](std::ostream& os) {
    for (std::size_t s = 0; s < chart.series.size(); ++s) {
      const auto& se = chart.series[s];
      os << "# " << se.name << "\n";
      for (std::size_t i = 0; i < se.x.size(); ++i)
        os << fmt_value(se.x[i]) << " " << fmt_value(se.y[i]) << "\n";
      os << "\n\n";
    }
  });
  std::string datname = fs::path(dat).filename().string();
  write_file_atomic(plot_script_path(image_path), [&](std::ostream& os) {
    os << header(image_path, chart.title);
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
    os << "plot ";
    for (std::size_t s = 0; s < chart.series.size(); ++s) {
      if (s) os << ", \\\n     ";
      os << (s ? "''" : gp_quote(datname)) << " index " << s
         << " using 1:2 with linespoints lw 2 title " << gp_quote(chart.series[s].name);
    }
    if (chart.series.empty()) os << "NaN notitle";
    os << "\n";
  });
  run_gnuplot(image_path);
}

}  // namespace moesim::app
