// The kernels' exceptions. kernels/ depends on nothing of moesim's (it builds
// and tests on its own, and a CUDA build does not drag yaml-cpp in through moesim_core), so it
// throws standard-derived types of its own, and its callers map them: exec lets them reach its
// per-rank error path (a kernel refusing its arguments at run time is a bug of the caller's shapes,
// not the user's input), strategies/routing/gate_lab turns ArgumentError into InputError.
#pragma once

#include <stdexcept>
#include <string>

namespace moesim::kernels {

/// A kernel's arguments are invalid: a shape, a null pointer, an entry out of range.
class ArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A CUDA or cuBLAS call failed; the message names the call, its source line and the error.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace moesim::kernels
