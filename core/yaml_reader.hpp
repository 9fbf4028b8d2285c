// Strict, location-aware reading of YAML trees for the scenario and cluster loaders (and for the
// sweep loader, which edits a tree before parsing it).
//
// Every failure is an InputError carrying file:line:col, the dotted key path ("cluster.gpu",
// "strategies[1].pipeline") and a one-line "found X, expected Y" message. Maps are read through
// MapReader, which rejects unknown and duplicate keys up front (with a "did you mean" hint) and
// records where every key is, so later layers can point at the right line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "core/units.hpp"

namespace moesim::yaml {

/// What a node holds, for "found X" messages: "a list", "a map", "nothing", "'text'" (one line,
/// truncated).
std::string describe(const YAML::Node& node);

/// The candidate closest to `word` by edit distance, or "" when none is close enough to be a
/// plausible typo (distance <= max(2, len/3)).
std::string closest_match(std::string_view word, const std::vector<std::string_view>& candidates);

/// " (did you mean 'x'?)" or "".
std::string did_you_mean(std::string_view word, const std::vector<std::string_view>& candidates);

/// "a, b or c".
std::string join_alternatives(const std::vector<std::string_view>& items);

/// "an integer in [1, 2^31-1]": the range every integer error states (type limits as powers of
/// two). Shared with the command-line flag parsers, so both say the same thing.
std::string int_range_text(std::int64_t min, std::int64_t max);

/// The file being read and the locations of the keys seen so far.
class Context {
 public:
  explicit Context(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }
  /// 1-based location of a node; line 0 when the node was built in memory (edited trees).
  SourceLocation at(const YAML::Node& node) const;
  [[noreturn]] void fail(const YAML::Node& node, const std::string& path,
                         const std::string& message) const;
  [[noreturn]] void fail(const SourceLocation& loc, const std::string& path,
                         const std::string& message) const;

  void record(const std::string& path, const SourceLocation& loc) { locations_[path] = loc; }
  /// Where `path` was written; falls back to the file alone.
  SourceLocation location_of(const std::string& path) const;
  const std::map<std::string, SourceLocation>& locations() const { return locations_; }

  // Scalar conversions. Each throws InputError at `node`, naming `path`, what was found and what
  // was expected.
  std::string to_string(const YAML::Node& node, const std::string& path) const;
  std::int64_t to_int(const YAML::Node& node, const std::string& path,
                      std::int64_t min = std::numeric_limits<std::int64_t>::min(),
                      std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  double to_number(const YAML::Node& node, const std::string& path) const;
  bool to_bool(const YAML::Node& node, const std::string& path) const;
  /// A number with a unit of kind `kind` ("300GB/s"); a bare number or a unit of another kind is
  /// an error. Returns the value in base units.
  double to_quantity(const YAML::Node& node, const std::string& path, UnitKind kind) const;
  /// One of `names` (exact match); otherwise an error listing them, with a "did you mean".
  std::size_t to_choice(const YAML::Node& node, const std::string& path,
                        const std::vector<std::string_view>& names) const;

  /// Requires a sequence; returns it. Records "path[i]" for each item.
  YAML::Node require_list(const YAML::Node& node, const std::string& path);

 private:
  std::string file_;
  std::map<std::string, SourceLocation> locations_;
};

/// A YAML map with a fixed set of known keys.
class MapReader {
 public:
  /// Checks `node` is a map whose keys are all in `known` and unique; records every key's
  /// location under "path.key". `where` is the location used for "missing key" errors (the
  /// key that owns this map); by default the map's own location.
  MapReader(Context& ctx, const YAML::Node& node, std::string path,
            std::vector<std::string_view> known, std::optional<SourceLocation> where = {});

  const std::string& path() const { return path_; }
  std::string path_of(std::string_view key) const;
  const SourceLocation& where() const { return where_; }
  Context& context() const { return *ctx_; }

  bool has(std::string_view key) const { return entries_.count(std::string(key)) > 0; }
  /// The value node of `key`; an invalid node when absent.
  YAML::Node get(std::string_view key) const;
  /// Location of `key` (its value) when present, else of this map.
  SourceLocation location(std::string_view key) const;
  /// Location of the key `key` itself (for `where` fields), else of this map.
  SourceLocation key_location(std::string_view key) const;
  /// Keys in file order.
  const std::vector<std::string>& keys() const { return order_; }

  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  [[noreturn]] void fail_here(const std::string& message) const;
  /// Fails with "missing required key 'k' (expected <what>)" unless present.
  void require(std::string_view key, std::string_view what) const;

  // Typed optional getters: nullopt when the key is absent.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<std::int64_t> get_int(
      std::string_view key, std::int64_t min = std::numeric_limits<std::int64_t>::min(),
      std::int64_t max = std::numeric_limits<std::int64_t>::max()) const;
  std::optional<double> get_number(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<double> get_quantity(std::string_view key, UnitKind kind) const;
  std::optional<std::size_t> get_choice(std::string_view key,
                                        const std::vector<std::string_view>& names) const;
  /// A map value read as a nested MapReader ("path.key").
  MapReader get_map(std::string_view key, std::vector<std::string_view> known) const;

 private:
  struct Entry {
    YAML::Node key;
    YAML::Node value;
  };
  Context* ctx_;
  YAML::Node node_;
  std::string path_;
  SourceLocation where_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

}  // namespace moesim::yaml
