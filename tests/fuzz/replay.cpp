// fuzz_replay: runs every file of the given folders through a fuzz target (tests/fuzz/
// loader_fuzz.hpp) with the compiler the project builds with, no libFuzzer needed: the CTest
// check that the corpus (the bundled scenarios and sweeps, the bad-input files, the inputs fuzzing
// found) is still accepted or refused cleanly, each in under a second.
//
//   fuzz_replay [--max-seconds S] scenario|sweep|hf_config DIR_OR_FILE...
//
// Exit 0 when every input returned 0 or 2 within S seconds (default 1; sanitizer builds pass more);
// 1 when one escaped with another exception or took longer (its path and the exception are
// printed); 2 on a bad command line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/loader_fuzz.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  double max_s = 1.0;
  int first = 1;
  if (argc > 2 && std::string(argv[1]) == "--max-seconds") {
    max_s = std::atof(argv[2]);
    first = 3;
  }
  const std::string kind = argc > first ? argv[first] : "";
  if (argc < first + 2 || max_s <= 0 ||
      (kind != "scenario" && kind != "sweep" && kind != "hf_config")) {
    std::fprintf(stderr,
                 "usage: fuzz_replay [--max-seconds S] scenario|sweep|hf_config DIR_OR_FILE...\n");
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = first + 1; i < argc; ++i) {
    const fs::path p(argv[i]);
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "fuzz_replay: %s: not a file or folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  int accepted = 0, refused = 0, failed = 0;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
    // The input is read as if it were at its own path, so its relative references resolve.
    const std::string pseudo = fs::absolute(f).string();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const int rc = kind == "sweep" ? moesim::fuzz::sweep_input(data, bytes.size(), pseudo)
                     : kind == "hf_config"
                         ? moesim::fuzz::hf_config_input(data, bytes.size(), pseudo)
                         : moesim::fuzz::scenario_input(data, bytes.size(), pseudo);
      (rc == 0 ? accepted : refused)++;
    } catch (const std::exception& e) {
      std::printf("FAIL %s: escaped: %s\n", f.c_str(), e.what());
      ++failed;
      continue;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > max_s) {
      std::printf("FAIL %s: took %.2f s (> %g s)\n", f.c_str(), s, max_s);
      ++failed;
    }
  }
  std::printf("%zu inputs: %d accepted, %d refused (exit 2), %d failed\n", files.size(), accepted,
              refused, failed);
  return failed ? 1 : 0;
}
