// Element-type helpers shared by the CPU kernels, the tests and exec/, and the CUDA device probe.
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.hpp"
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

std::uint16_t float_to_half(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN (NaN keeps a quiet mantissa bit)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs < 0x38800000u) {
    // Below 2^-14: a half subnormal is m * 2^-24. The multiply by 2^24 is exact, and nearbyint
    // rounds to nearest even in the default rounding mode; m = 1024 encodes 2^-14 correctly.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t exp = (abs >> 23) - 127 + 15;
  const std::uint32_t mant = abs & 0x7fffffu;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

std::uint16_t float_to_bf16(float value) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

float bf16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
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
  MOESIM_ASSERT(false, "unknown dtype");
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
  MOESIM_ASSERT(false, "unknown dtype");
}

void convert(DType from, const void* src, DType to, void* dst, std::size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtype_size(from));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_element(to, dst, i, load_element(from, src, i));
}

}  // namespace moesim::kernels
