// Plots rendered by gnuplot from data files. For an image F.svg (or F.png) the data goes to F.dat
// and the script to F.gp next to it, so users can restyle the script and re-run `gnuplot F.gp`
// in that folder.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace moesim::app {

/// Grouped bars: one group per entry of `groups` (topologies), one bar per series (strategies).
struct BarChart {
  std::string title;
  std::string ylabel;
  std::vector<std::string> groups;
  std::vector<std::string> series;
  std::vector<std::vector<double>> values;  // [group][series]; NaN = missing
  double reference_line = 0;                // > 0: dashed horizontal line (speedup 1.0)
};

/// Lines along an x axis, in one or more panels (facets) that share the axes: numeric x, or
/// categorical when `x_labels` is non-empty (then x holds indices into it). A series keeps its
/// colour in every panel (by name); a panel shows at most kMaxSeriesPerPanel series, so
/// render_line_chart splits a fuller panel into several, and draws at most kMaxPanels panels.
struct LineChart {
  static constexpr std::size_t kMaxSeriesPerPanel = 8;
  static constexpr std::size_t kMaxPanels = 12;
  std::string title;
  std::string xlabel;
  std::string ylabel;
  bool log_x = false;
  std::vector<std::string> x_labels;
  struct Series {
    std::string name;
    std::vector<double> x, y;
  };
  struct Panel {
    std::string title;  // "" for a single panel: the chart's title says it all
    std::vector<Series> series;
  };
  std::vector<Panel> panels;
  std::string note;  // appended to the title, e.g. what was left out
};

/// The panels render_line_chart draws: every panel of more than kMaxSeriesPerPanel series split
/// into consecutive parts titled "(1/2)", "(2/2)"; at most kMaxPanels of them (the chart's note
/// says how many were left out).
LineChart facet_line_chart(const LineChart& chart);

/// The gnuplot executable: $MOESIM_GNUPLOT if set (tests point it at a missing file), else the
/// first `gnuplot` on PATH; "" when none is found.
std::string find_gnuplot();

/// Throws RuntimeError with an installation hint when gnuplot cannot be found. Commands call it
/// before running anything, so a missing gnuplot does not cost a whole sweep.
void require_gnuplot();

/// Checks that `path` ends in .svg or .png (InputError naming `flag` otherwise).
void check_plot_path(const std::string& path, const std::string& flag);

/// Writes the data file and the script, then runs gnuplot. RuntimeError when gnuplot is missing
/// or fails (with its output).
void render_bar_chart(const BarChart& chart, const std::string& image_path);
void render_line_chart(const LineChart& chart, const std::string& image_path);

/// Companion paths of an image: F.dat and F.gp.
std::string plot_data_path(const std::string& image_path);
std::string plot_script_path(const std::string& image_path);

}  // namespace moesim::app
