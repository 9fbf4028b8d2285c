#include "core/text_file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "core/error.hpp"

namespace moesim {

namespace fs = std::filesystem;

std::string read_text_file(const std::string& path, const std::string& kind,
                           std::uintmax_t max_bytes) {
  std::error_code ec;
  auto fail = [&](const std::string& what) {
    throw InputError(SourceLocation{path, 0, 0}, "", what);
  };
  if (!fs::exists(path, ec))
    fail(fmt::format("file not found; expected the path of an existing {}", kind));
  if (fs::is_directory(path, ec))
    fail(fmt::format("found a directory, expected the path of {}", kind));
  if (!fs::is_regular_file(path, ec))
    fail(fmt::format("found a device, pipe or socket, expected the path of {} (a regular file)",
                     kind));
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > max_bytes)
    fail(fmt::format("found a file of {} bytes, expected {} of at most {} bytes ({} MiB)", size,
                     kind, max_bytes, max_bytes >> 20));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(fmt::format("cannot read the file ({})", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace moesim
