// Comma-separated lines of the workload's trace files (routing traces, request traces): fields
// trimmed, each with the 1-based column it starts at, for file:line:column errors. Internal header.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace moesim::workload::detail {

inline std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

struct Field {
  std::string_view text;
  int column = 0;  // 1-based character column of the field's first character
};

inline std::vector<Field> split_fields(std::string_view line) {
  std::vector<Field> fields;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = line.find(',', start);
    const std::string_view raw = line.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::size_t lead = std::min(raw.find_first_not_of(" \t"), raw.size());
    fields.push_back({trim(raw), static_cast<int>(start + lead) + 1});
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return fields;
}

/// Opens a trace file for reading; InputError under `key` when it is not a regular file (a device
/// or pipe may never end: /dev/zero) or cannot be opened. `what`: "routing trace", ...
inline std::ifstream open_trace(const std::string& path, const std::string& key,
                                const std::string& what) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw InputError(SourceLocation{path, 0, 0}, key,
                     "found a directory, device or pipe, expected a " + what + " CSV file");
  std::ifstream in(path);
  if (!in) throw InputError(SourceLocation{path, 0, 0}, key, "cannot open the " + what + " file");
  return in;
}

}  // namespace moesim::workload::detail
