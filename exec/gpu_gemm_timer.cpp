// The GPU path's GemmTimer for `moesim calibrate --backend nccl` (exec/calibrate.hpp): one cuBLAS
// call (kernels::cuda::gemm, or gemm_strided_batched for a batch, the call the expert FFN makes)
// in the scenario's dtype, timed by a CUDA event pair around the launch on a stream of its own. Its
// own non-blocking stream keeps it independent of the NCCL streams, so the interference sweep (the
// GEMM on a second thread while the main thread runs all-to-alls) measures SM and HBM sharing
// rather than stream serialisation.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "exec/calibrate.hpp"
#include "exec/communicator.hpp"
#include "kernels/moe_kernels.hpp"

namespace moesim::exec {

namespace {

void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw ExecError(fmt::format("{} failed: {}", what, cudaGetErrorString(rc)));
}

// Device buffers and events of one timer, grown to the largest shape asked so far.
struct GemmState {
  int device = 0;
  kernels::DType dtype = kernels::DType::kF32;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  std::unique_ptr<kernels::cuda::Context> ctx;
  void* buf[3] = {nullptr, nullptr, nullptr};  // A, B, C
  std::size_t cap[3] = {0, 0, 0};

  ~GemmState() {
    cudaSetDevice(device);
    if (stream) cudaStreamSynchronize(stream);
    for (void* p : buf) cudaFree(p);
    ctx.reset();
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
  }

  void need(int i, std::size_t bytes) {
    if (cap[i] >= bytes) return;
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cuda_ok(cudaFree(buf[i]), "cudaFree");
    buf[i] = nullptr;
    cap[i] = 0;
    cuda_ok(cudaMalloc(&buf[i], bytes), "cudaMalloc (calibrate GEMM)");
    cap[i] = bytes;
    // Non-zero operands (every byte 0x3c: 1.05 in fp16, 0.0115 in bf16 and fp32): GEMMs on zeros
    // run measurably faster on Hopper (less switching power), which would flatter beta.
    cuda_ok(cudaMemsetAsync(buf[i], 0x3c, bytes, stream), "cudaMemsetAsync");
  }
};

}  // namespace

GemmTimer device_gemm_timer(kernels::DType dtype, int device) {
  auto st = std::make_shared<GemmState>();
  st->device = device;
  st->dtype = dtype;
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  cuda_ok(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cuda_ok(cudaEventCreate(&st->start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&st->stop), "cudaEventCreate");
  st->ctx = std::make_unique<kernels::cuda::Context>(device, st->stream);
  return [st](int m, int n, int k, int batch) {
    // The interference sweep calls this from a second thread: bind the device there too.
    cuda_ok(cudaSetDevice(st->device), "cudaSetDevice");
    const std::size_t e = kernels::dtype_size(st->dtype);
    const std::size_t b = static_cast<std::size_t>(std::max(batch, 1));
    st->need(0, std::max<std::size_t>(1, b * m * k * e));
    st->need(1, std::max<std::size_t>(1, b * k * n * e));
    st->need(2, std::max<std::size_t>(1, b * m * n * e));
    cuda_ok(cudaEventRecord(st->start, st->stream), "cudaEventRecord");
    if (batch <= 1) {
      kernels::cuda::gemm(*st->ctx, st->dtype, m, n, k, st->buf[0], st->buf[1], st->buf[2]);
    } else {
      kernels::cuda::gemm_strided_batched(
          *st->ctx, st->dtype, m, n, k, st->buf[0], static_cast<long long>(m) * k, st->buf[1],
          static_cast<long long>(k) * n, st->buf[2], static_cast<long long>(m) * n, batch);
    }
    cuda_ok(cudaEventRecord(st->stop, st->stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(st->stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, st->start, st->stop), "cudaEventElapsedTime");
    return static_cast<double>(ms) * 1e-3;
  };
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return prop.name;
}

}  // namespace moesim::exec
