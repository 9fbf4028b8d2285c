// Element-type helpers shared by the CPU kernels, the tests and exec/, and the CUDA device probe.
#include <bit>
#include <cmath>
#include <cstring>

#include "kernels/errors.hpp"
#include "kernels/moe_kernels.hpp"

#if MOESIM_KERNELS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moesim::kernels {

int cuda_device_count() {
#if MOESIM_KERNELS_HAVE_CUDA
  int count = 0;
  // No driver, no device or a broken install all mean "no GPU here" for callers (tests skip).
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later CUDA calls are not poisoned
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "fp32";
    case DType::kF16:
      return "fp16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

float load_element(DType dtype, const void* data, std::size_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return half_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
  }
  throw ArgumentError("kernels: unknown dtype");
  return 0.0f;
}

void store_element(DType dtype, void* data, std::size_t i, float value) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(data)[i] = value;
      return;
    case DType::kF16:
      static_cast<std::uint16_t*>(data)[i] = float_to_half(value);
      return;
    case DType::kBF16:
      static_cast<std::uint16_t*>(data)[i] = float_to_bf16(value);
      return;
  }
  throw ArgumentError("kernels: unknown dtype");
}

void convert(DType from, const void* src, DType to, void* dst, std::size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_element(to, dst, i, load_element(from, src, i));
}

}  // namespace moesim::kernels
