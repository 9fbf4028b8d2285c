// Error types shared by every library. Invalid input (scenario files, CLI values, plans built from
// them) is an InputError and maps to exit code 2; everything that goes wrong while running is a
// RuntimeError (exit code 1). Library code never calls exit().
#pragma once

#include <stdexcept>
#include <string>

namespace moesim {

/// Where in an input file something is: 1-based line and column, 0 when unknown.
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;
};

/// Invalid user input. what() is the one-line message the CLI prints:
///   "file:line:col: key.path: found X, expected Y"
class InputError : public std::runtime_error {
 public:
  InputError(SourceLocation loc, std::string key, std::string message);
  explicit InputError(std::string message);  // no file context (CLI flags, API misuse)

  const SourceLocation& location() const { return loc_; }
  const std::string& key() const { return key_; }
  const std::string& message() const { return message_; }

 private:
  SourceLocation loc_;
  std::string key_;
  std::string message_;
};

/// A failure while running (simulation engine, real execution). Exit code 1.
class RuntimeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by MOESIM_ASSERT: a broken internal invariant (a bug in moesim, not bad input).
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void assert_fail(const char* expr, const char* file, int line, const std::string& msg);

}  // namespace moesim

/// Invariant check that stays on in release builds (simulation results must not be silently
/// wrong); the message is built only on failure.
#define MOESIM_ASSERT(cond, msg)                                          \
  do {                                                                    \
    if (!(cond)) ::moesim::assert_fail(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
