// Helpers shared by the CPU and GPU kernel tests: typed host buffers, random data, the hand-made
// gate case of moe_kernels_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/moe_kernels.hpp"

namespace moesim::kernels::testing {

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

/// A host buffer of n elements of one dtype.
struct HostBuffer {
  DType dtype = DType::kF32;
  std::vector<std::byte> bytes;

  HostBuffer(DType d, std::size_t n) : dtype(d), bytes(n * dtype_size(d)) {}
  HostBuffer(DType d, const std::vector<float>& values) : HostBuffer(d, values.size()) {
    convert(DType::kF32, values.data(), d, bytes.data(), values.size());
  }
  std::size_t size() const { return bytes.size() / dtype_size(dtype); }
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  float at(std::size_t i) const { return load_element(dtype, bytes.data(), i); }
  std::vector<float> to_float() const {
    std::vector<float> out(size());
    convert(dtype, bytes.data(), DType::kF32, out.data(), out.size());
    return out;
  }
};

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& v : out) v = dist(gen);
  return out;
}

/// Unit roundoff of the dtype (relative error of one rounding).
inline float dtype_eps(DType d) {
  switch (d) {
    case DType::kF32:
      return 6e-8f;
    case DType::kF16:
      return 4.9e-4f;
    case DType::kBF16:
      return 3.9e-3f;
  }
  return 0.0f;
}

/// Routing arrays owned on the host.
struct HostRouting {
  int s, k, e, c;
  std::vector<std::int32_t> expert, slot, slot_entry, count;
  std::vector<float> weight;
  HostRouting(int s_, int k_, int e_, int c_)
      : s(s_),
        k(k_),
        e(e_),
        c(c_),
        expert(s_ * k_),
        slot(s_ * k_),
        slot_entry(e_ * c_),
        count(e_),
        weight(s_ * k_) {}
  RoutingOut out() {
    return RoutingOut{expert.data(), slot.data(), weight.data(), slot_entry.data(), count.data()};
  }
  Routing view() const {
    return Routing{s, k, e, c, expert.data(), slot.data(), weight.data(), slot_entry.data()};
  }
};

}  // namespace moesim::kernels::testing
