// What `moesim validate` and `moesim sweep` do with an input file, as functions of its bytes: the
// fuzz targets (libFuzzer, bench/fuzz.sh) and the corpus replay test (CTest) share them.
//
// Contract, the same as the CLI's: every input is either accepted (returns 0) or refused with an
// InputError (returns 2, the CLI's exit 2). Any other exception escapes: for the CLI it would be
// exit 1 ("internal error"), for libFuzzer a crash to report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace moesim::fuzz {

/// Largest cluster whose topology the scenario target builds (see scenario_input).
inline constexpr int kMaxBuiltGpus = 512;

/// Parses `data` as a scenario file (pseudo path `pseudo_file`: relative references resolve
/// from its folder), builds its topology and estimates each strategy's first decision and memory,
/// as `moesim validate` does (clusters of up to kMaxBuiltGpus GPUs; larger ones are parsed and
/// checked by the loader only).
int scenario_input(const std::uint8_t* data, std::size_t size, const std::string& pseudo_file);

/// Parses `data` as a sweep file, loads its base scenario (with `set:`) and checks every axis key
/// with its first value, as `moesim sweep` does before running a point.
int sweep_input(const std::uint8_t* data, std::size_t size, const std::string& pseudo_file);

/// A Hugging Face config.json (core/hf_config.hpp, what `model: {hf_config: ...}` reads): 0 when
/// it imports and the imported model loads and sizes as a scenario's on one 8-GPU node, 2 on an
/// InputError; anything else escaping is a finding.
int hf_config_input(const std::uint8_t* data, std::size_t size, const std::string& pseudo_file);

}  // namespace moesim::fuzz
