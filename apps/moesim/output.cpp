#include "apps/moesim/output.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace moesim::app {

namespace {

namespace fs = std::filesystem;

// `path` with every symlink along its last component followed (a dangling link resolves to the
// file it names), so an output replaces the link's target, never the link. InputError on a loop.
fs::path resolve_links(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  for (int hops = 0; fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    if (hops == 40) throw InputError(fmt::format("'{}': too many levels of symbolic links", path));
    fs::path next = fs::read_symlink(p, ec);
    if (ec) break;
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  return p;
}

// An existing file that is not a regular one (a character device such as /dev/null, a FIFO, a
// socket): written in place, never replaced by a regular file.
bool is_special(const fs::path& p) {
  std::error_code ec;
  const auto st = fs::status(p, ec);
  return !ec && fs::exists(st) && !fs::is_regular_file(st) && !fs::is_directory(st);
}

}  // namespace

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const fs::path target = resolve_links(path);
  if (is_special(target)) {
    // The whole content first, so a failing writer leaves nothing half-written there either.
    std::ostringstream content;
    write(content);
    std::ofstream os(target, std::ios::binary);
    if (!os) throw RuntimeError(fmt::format("cannot write '{}': cannot open it", path));
    os << content.str();
    os.flush();
    if (!os) throw RuntimeError(fmt::format("cannot write '{}': write failed", path));
    return;
  }
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
  if (path.empty()) return;
  auto fail = [&](const std::string& why) {
    throw InputError(fmt::format("{} {}: cannot write the file there: {}", flag, path, why));
  };
  const fs::path target = resolve_links(path);
  std::error_code ec;
  if (is_special(target)) {
    if (access(target.c_str(), W_OK) != 0) fail("it is not writable");
    return;
  }
  // The temporary goes next to the target (then a rename): its directory must take new files.
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
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
