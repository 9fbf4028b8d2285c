// libFuzzer entry point (clang -fsanitize=fuzzer), built by bench/fuzz.sh with
// -DMOESIM_FUZZ=ON: MOESIM_FUZZ_SWEEP selects the sweep target, else the scenario target. A crash
// is any exception other than InputError, a sanitizer report, or an input over -timeout.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/loader_fuzz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Relative references resolve from the bundled scenarios, so mutated paths can hit real files.
#if defined(MOESIM_FUZZ_SWEEP)
  moesim::fuzz::sweep_input(data, size, MOESIM_SOURCE_DIR "/scenarios/sweeps/fuzz.yaml");
#elif defined(MOESIM_FUZZ_HF_CONFIG)
  moesim::fuzz::hf_config_input(data, size, MOESIM_SOURCE_DIR "/scenarios/models/hf/fuzz.json");
#else
  moesim::fuzz::scenario_input(data, size, MOESIM_SOURCE_DIR "/scenarios/fuzz.yaml");
#endif
  return 0;
}
