#include "core/error.hpp"

#include <fmt/format.h>

namespace moesim {

namespace {
std::string format_input_error(const SourceLocation& loc, const std::string& key,
                               const std::string& message) {
  std::string out;
  if (!loc.file.empty()) {
    out += loc.file;
    if (loc.line > 0) out += fmt::format(":{}", loc.line);
    if (loc.column > 0) out += fmt::format(":{}", loc.column);
    out += ": ";
  }
  if (!key.empty()) out += key + ": ";
  out += message;
  return out;
}
}  // namespace

InputError::InputError(SourceLocation loc, std::string key, std::string message)
    : std::runtime_error(format_input_error(loc, key, message)),
      loc_(std::move(loc)),
      key_(std::move(key)),
      message_(std::move(message)) {}

InputError::InputError(std::string message)
    : std::runtime_error(message), message_(std::move(message)) {}

void assert_fail(const char* expr, const char* /*file*/, int /*line*/, const std::string& msg) {
  // The message reaches users (main prints it), so it carries no build path: __FILE__ names the
  // machine the binary was built on. The failed condition identifies the check well enough.
  throw InternalError(fmt::format(
      "internal error (a bug in moesim, please report it): {} (check failed: {})", msg, expr));
}

}  // namespace moesim
