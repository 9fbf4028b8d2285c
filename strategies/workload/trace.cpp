// Routing trace files: reading with validation against the scenario's shape, and writing
// (docs/workload.md has the format).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>

#include "core/error.hpp"
#include "strategies/workload/csv.hpp"
#include "strategies/workload/workload.hpp"

namespace moesim::workload {

using detail::Field;
using detail::split_fields;
using detail::trim;

namespace {

constexpr const char* kKey = "workload.routing.trace";
// Bounds the dense (iteration, layer) table a hostile or mistyped iteration number could ask for.
constexpr std::int64_t kMaxTraceIterations = 1'000'000;

enum Column { kIteration, kLayer, kGpu, kExpert, kCount, kChoice, kNumColumns };
constexpr std::array<const char*, kNumColumns> kColumnNames = {"iteration", "layer", "gpu",
                                                               "expert",    "count", "choice"};

std::optional<Column> column_of(std::string_view name) {
  if (name == "src") return kGpu;       // aliases: the source GPU ...
  if (name == "tokens") return kCount;  // ... and its token count
  for (int c = 0; c < kNumColumns; ++c)
    if (name == kColumnNames[static_cast<std::size_t>(c)]) return static_cast<Column>(c);
  return std::nullopt;
}

[[noreturn]] void trace_error(const std::string& path, int line, int column,
                              const std::string& message) {
  throw InputError(SourceLocation{path, line, column}, kKey, message);
}

struct Row {
  TraceEntry entry;
  int iteration = 0;
  int layer = 0;
  int line = 0;
};

}  // namespace

RoutingTrace read_routing_trace(const std::string& path, int num_gpus, int num_experts,
                                int num_layers, int top_k) {
  std::ifstream in = detail::open_trace(path, kKey, "routing trace");
  auto fail = [&path](int line, int column, const std::string& message) {
    trace_error(path, line, column, message);
  };

  std::array<int, kNumColumns> index{};  // field index of each column, -1 when absent
  index.fill(-1);
  std::size_t num_fields = 0;
  bool have_header = false;
  std::vector<Row> rows;
  std::int64_t max_iteration = -1;

  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    const std::string_view content = trim(text);
    if (content.empty() || content.front() == '#') continue;
    const std::vector<Field> fields = split_fields(text);
    if (!have_header) {
      for (std::size_t i = 0; i < fields.size(); ++i) {
        const auto col = column_of(fields[i].text);
        if (!col)
          fail(line, fields[i].column,
               fmt::format("found column '{}' in the header, expected iteration, layer, gpu (or "
                           "src), expert, count (or tokens) and optionally choice",
                           fields[i].text));
        if (index[*col] >= 0)
          fail(line, fields[i].column,
               fmt::format("found column '{}' twice in the header", kColumnNames[*col]));
        index[*col] = static_cast<int>(i);
      }
      for (int c = 0; c < kNumColumns; ++c)
        if (c != kChoice && index[static_cast<std::size_t>(c)] < 0)
          fail(line, 1,
               fmt::format("found no '{}' column in the header '{}', expected the columns "
                           "iteration,layer,gpu,expert,count[,choice]",
                           kColumnNames[static_cast<std::size_t>(c)], content));
      num_fields = fields.size();
      have_header = true;
      continue;
    }
    if (fields.size() != num_fields)
      fail(line, 1,
           fmt::format("found {} fields, expected {} as in the header", fields.size(), num_fields));
    std::array<std::int64_t, kNumColumns> value{};
    for (int c = 0; c < kNumColumns; ++c) {
      const int i = index[static_cast<std::size_t>(c)];
      if (i < 0) continue;
      const Field& f = fields[static_cast<std::size_t>(i)];
      std::int64_t v = -1;
      const auto [ptr, ec] = std::from_chars(f.text.data(), f.text.data() + f.text.size(), v);
      if (ec != std::errc() || ptr != f.text.data() + f.text.size() || v < 0 || f.text.empty())
        fail(line, f.column,
             fmt::format("found '{}' in column {}, expected a non-negative integer", f.text,
                         kColumnNames[static_cast<std::size_t>(c)]));
      const std::int64_t limits[kNumColumns] = {kMaxTraceIterations, num_layers,    num_gpus,
                                                num_experts,         0x100000000LL, top_k};
      if (v >= limits[c]) {
        static constexpr std::array<const char*, kNumColumns> what = {"the trace iteration limit",
                                                                      "the scenario's MoE layers",
                                                                      "the scenario's GPUs (P)",
                                                                      "the scenario's experts (E)",
                                                                      "2^32 tokens",
                                                                      "top_k (choice is 0-based)"};
        fail(line, f.column,
             fmt::format("found {} = {}, expected less than {} ({})",
                         kColumnNames[static_cast<std::size_t>(c)], v, limits[c],
                         what[static_cast<std::size_t>(c)]));
      }
      value[static_cast<std::size_t>(c)] = v;
    }
    Row row;
    row.iteration = static_cast<int>(value[kIteration]);
    row.layer = static_cast<int>(value[kLayer]);
    row.entry =
        TraceEntry{static_cast<int>(value[kGpu]), static_cast<int>(value[kExpert]),
                   static_cast<int>(value[kChoice]), static_cast<std::uint32_t>(value[kCount])};
    row.line = line;
    max_iteration = std::max<std::int64_t>(max_iteration, row.iteration);
    rows.push_back(row);
  }
  if (!have_header)
    fail(0, 0, "found no header line, expected 'iteration,layer,gpu,expert,count[,choice]'");
  if (rows.empty()) fail(0, 0, "found no data rows, expected at least one");

  // Duplicates: sort by key, keeping file order among equals so the later line is reported.
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.iteration, a.layer, a.entry.gpu, a.entry.expert, a.entry.choice) <
           std::tie(b.iteration, b.layer, b.entry.gpu, b.entry.expert, b.entry.choice);
  });
  RoutingTrace trace;
  trace.num_iterations = static_cast<int>(max_iteration + 1);
  trace.num_layers = num_layers;
  trace.entries.resize(static_cast<std::size_t>(trace.num_iterations) * num_layers);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const Row& row = rows[r];
    if (r > 0) {
      const Row& prev = rows[r - 1];
      if (prev.iteration == row.iteration && prev.layer == row.layer &&
          prev.entry.gpu == row.entry.gpu && prev.entry.expert == row.entry.expert &&
          prev.entry.choice == row.entry.choice)
        fail(row.line, 1,
             fmt::format("found a second row for iteration {}, layer {}, gpu {}, expert {}, "
                         "choice {} (first on line {}), expected one row per key",
                         row.iteration, row.layer, row.entry.gpu, row.entry.expert,
                         row.entry.choice, prev.line));
    }
    if (row.entry.count == 0) continue;
    trace.entries[static_cast<std::size_t>(row.iteration) * num_layers + row.layer].push_back(
        row.entry);
  }
  return trace;
}

void write_routing_trace(std::ostream& out, const std::vector<IterationWorkload>& iterations) {
  out << "iteration,layer,gpu,expert,count\n";
  for (const IterationWorkload& it : iterations)
    for (std::size_t l = 0; l < it.layers.size(); ++l) {
      const LayerDispatch& d = it.layers[l];
      for (int i = 0; i < d.num_gpus; ++i)
        for (int e = 0; e < d.num_experts; ++e)
          if (const std::uint32_t c = d.demanded_at(i, e); c > 0)
            out << fmt::format("{},{},{},{},{}\n", it.index, l, i, e, c);
    }
}

}  // namespace moesim::workload
