// Output helpers for the CLI: files are written to a temporary sibling and renamed into place, so
// a failed run never leaves a half-written report behind.
#pragma once

#include <functional>
#include <ostream>
#include <string>

namespace moesim::app {

/// Calls write(os) on a temporary file next to `path`, then renames it to `path`. On any
/// exception the temporary is removed and the exception propagates. Throws RuntimeError when the
/// file cannot be created.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);

/// Peak resident set size of this process so far, in bytes (getrusage).
double peak_rss_bytes();

}  // namespace moesim::app
