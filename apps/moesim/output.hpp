// Output helpers for the CLI: files are written to a temporary sibling and renamed into place, so
// a failed run never leaves a half-written report behind.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace moesim::app {

/// Calls write(os) on a temporary file next to `path`, then renames it to `path`. On any
/// exception the temporary is removed and the exception propagates. Throws RuntimeError when the
/// file cannot be created. A symlink is followed (its target is replaced, not the link); an
/// existing device, FIFO or socket is written in place with the complete content, never replaced.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);

/// Checks, before a run, that write_file_atomic(path) will be able to put its file there: the
/// directory exists, is a directory and is writable, and `path` is not a directory. InputError
/// naming `flag` and `path` otherwise, so a bad output path fails in a moment instead of after the
/// whole run. Creates and truncates nothing. An empty path (flag not given) passes.
void check_output_path(const std::string& path, const std::string& flag);

/// check_output_path for each (flag, path).
void check_output_paths(const std::vector<std::pair<std::string, std::string>>& flag_paths);

/// Peak resident set size of this process so far, in bytes (getrusage).
double peak_rss_bytes();

}  // namespace moesim::app
