// CUDA twin of cpu::ta_moe_loss (kernels/ta_moe_loss.hpp). Three launches on ctx.stream():
//  1. one block per expert: m_e (sum of probs[:, e] over tokens, block tree reduction in a fixed
//     order, so the result is deterministic) and the choice count of e (integer, exact);
//  2. one block: l = scale * sum_e w_e c_e m_e;
//  3. the gradient, every element scale * w_e * c_e / T (grid-stride).
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <string>

#include "kernels/errors.hpp"
#include "kernels/ta_moe_loss.hpp"

namespace moesim::kernels::cuda {
namespace {

#define MOESIM_TAMOE_CHECK(expr)                                                                  \
  do {                                                                                            \
    const cudaError_t moesim_err_ = (expr);                                                       \
    if (moesim_err_ != cudaSuccess) {                                                             \
      throw ::moesim::kernels::DeviceError("kernels/ta_moe_loss.cu:" + std::to_string(__LINE__) + \
                                           ": " #expr ": " + cudaGetErrorString(moesim_err_));    \
    }                                                                                             \
  } while (0)

constexpr int kThreads = 256;

__global__ void column_stats(const float* probs, const std::int32_t* expert, int T, int E, int k,
                             float* mean_prob, float* choice_share) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  using ReduceInt = cub::BlockReduce<long long, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ typename ReduceInt::TempStorage tmp_int;
  const int e = blockIdx.x;
  float sum = 0.0f;
  for (int t = threadIdx.x; t < T; t += blockDim.x) sum += probs[static_cast<size_t>(t) * E + e];
  long long count = 0;
  const long long entries = static_cast<long long>(T) * k;
  for (long long i = threadIdx.x; i < entries; i += blockDim.x) count += expert[i] == e;
  const float total = Reduce(tmp).Sum(sum);
  __syncthreads();
  const long long n = ReduceInt(tmp_int).Sum(count);
  if (threadIdx.x == 0) {
    mean_prob[e] = total / static_cast<float>(T);
    choice_share[e] = static_cast<float>(static_cast<double>(n) / static_cast<double>(entries));
  }
}

__global__ void loss_sum(const float* mean_prob, const float* choice_share, const float* weight,
                         int E, float scale, float* loss) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  float acc = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    acc += weight[e] * choice_share[e] * mean_prob[e];
  const float total = Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0) *loss = scale * total;
}

__global__ void fill_grad(const float* choice_share, const float* weight, int T, int E, float scale,
                          float* grad) {
  const size_t n = static_cast<size_t>(T) * E;
  const float inv_t = 1.0f / static_cast<float>(T);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int e = static_cast<int>(i % E);
    grad[i] = scale * weight[e] * choice_share[e] * inv_t;
  }
}

}  // namespace

void ta_moe_loss(Context& ctx, const TaMoeLossArgs& a) {
  if (a.num_tokens < 1 || a.num_experts < 1 || a.top_k < 1)
    throw ArgumentError("ta_moe_loss: num_tokens, num_experts and top_k must be >= 1");
  if (!a.probs || !a.expert || !a.expert_weight || !a.loss)
    throw ArgumentError("ta_moe_loss: probs, expert, expert_weight and loss are required");
  const int E = a.num_experts;
  auto* scratch = static_cast<float*>(ctx.workspace(2 * sizeof(float) * static_cast<size_t>(E)));
  float* mean_prob = a.mean_prob ? a.mean_prob : scratch;
  float* choice_share = a.choice_share ? a.choice_share : scratch + E;
  cudaStream_t s = ctx.stream();
  column_stats<<<E, kThreads, 0, s>>>(a.probs, a.expert, a.num_tokens, E, a.top_k, mean_prob,
                                      choice_share);
  MOESIM_TAMOE_CHECK(cudaGetLastError());
  loss_sum<<<1, kThreads, 0, s>>>(mean_prob, choice_share, a.expert_weight, E, a.scale, a.loss);
  MOESIM_TAMOE_CHECK(cudaGetLastError());
  if (a.grad_probs) {
    const size_t n = static_cast<size_t>(a.num_tokens) * E;
    const int blocks = static_cast<int>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096));
    fill_grad<<<blocks, kThreads, 0, s>>>(choice_share, a.expert_weight, a.num_tokens, E, a.scale,
                                          a.grad_probs);
    MOESIM_TAMOE_CHECK(cudaGetLastError());
  }
}

}  // namespace moesim::kernels::cuda
