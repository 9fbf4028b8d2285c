#include "apps/moesim/output.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"

namespace moesim::app {

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path tmp = target;
  tmp += fmt::format(".tmp.{}", static_cast<long>(getpid()));
  try {
    {
      std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
      if (!os) throw RuntimeError(fmt::format("cannot write '{}': cannot create the file", path));
      write(os);
      os.flush();
      if (!os) throw RuntimeError(fmt::format("cannot write '{}': write failed", path));
    }
    fs::rename(tmp, target);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
}

void check_output_path(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  const fs::path target(path);
  // The temporary goes next to the target (then a rename): its directory must take new files.
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  auto fail = [&](const std::string& why) {
    throw InputError(fmt::format("{} {}: cannot write the file there: {}", flag, path, why));
  };
  std::error_code ec;
  if (target.filename().empty() || fs::is_directory(target, ec))
    fail("it is a directory; expected a file name");
  const auto st = fs::status(dir, ec);
  if (!fs::exists(st))
    fail(fmt::format("the directory '{}' does not exist (create it first)", dir.string()));
  if (!fs::is_directory(st)) fail(fmt::format("'{}' is not a directory", dir.string()));
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    fail(fmt::format("the directory '{}' is not writable", dir.string()));
}

void check_output_paths(const std::vector<std::pair<std::string, std::string>>& flag_paths) {
  for (const auto& [flag, path] : flag_paths) check_output_path(path, flag);
}

double peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;  // Linux reports KiB
}

}  // namespace moesim::app
