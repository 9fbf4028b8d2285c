// Reading an input file whole, bounded: what every loader of a user's file (scenarios, sweeps,
// topologies, calibrations, Hugging Face configs) checks before parsing it.
#pragma once

#include <cstdint>
#include <string>

namespace moesim {

/// The text of the regular file `path`. InputError at `path` when it does not exist, is a
/// directory, a device, pipe or socket (reading one may never end), is larger than `max_bytes`,
/// or cannot be read. `kind` names what was expected in the messages ("a YAML file",
/// "a Hugging Face config.json").
std::string read_text_file(const std::string& path, const std::string& kind,
                           std::uintmax_t max_bytes);

}  // namespace moesim
