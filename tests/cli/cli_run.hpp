// Running the moesim binary from a CLI test: its exit code and its stdout and stderr together,
// and reading back the files it wrote. Tests that include this are compiled with MOESIM_BINARY
// (the binary under test) and MOESIM_SOURCE_DIR (the repository).
#pragma once

#include <fmt/format.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace moesim::cli_test {

inline const std::string kSource = MOESIM_SOURCE_DIR;
inline const std::string kBinary = MOESIM_BINARY;

struct RunOutput {
  int exit_code = -1;
  std::string out;  // stdout and stderr together
};

/// `moesim ARGS` through the shell, killed after `timeout_s`.
inline RunOutput run(const std::string& args, int timeout_s = 300) {
  const std::string cmd = fmt::format("timeout {} '{}' {} 2>&1", timeout_s, kBinary, args);
  RunOutput r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream is(p);
  std::stringstream ss;
  ss << is.rdbuf();
  return ss.str();
}

}  // namespace moesim::cli_test
