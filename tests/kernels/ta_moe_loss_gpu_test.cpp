// TA-MoE loss, CUDA twin against the CPU twin: the hand-computed cases and random ones (loss,
// gradient, m_e, c_e). Skips without a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/ta_moe_loss.hpp"

namespace moesim::kernels {
namespace {

template <class T>
struct Dev {
  T* p = nullptr;
  std::size_t n = 0;
  explicit Dev(const std::vector<T>& v) : n(v.size()) {
    void* raw = nullptr;
    if (cudaMalloc(&raw, (n ? n : 1) * sizeof(T)) != cudaSuccess)
      throw std::runtime_error("malloc");
    p = static_cast<T*>(raw);
    if (n && cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("memcpy");
  }
  explicit Dev(std::size_t count) : Dev(std::vector<T>(count)) {}
  ~Dev() { (void)cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> v(n);
    if (n && cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("memcpy");
    return v;
  }
};

void compare(int T, int E, int k, const std::vector<float>& probs,
             const std::vector<std::int32_t>& expert, const std::vector<float>& w, float scale) {
  // CPU reference.
  std::vector<float> grad(static_cast<std::size_t>(T) * E), m(E), c(E);
  float loss = 0;
  TaMoeLossArgs a{T,     E,     k,           probs.data(), expert.data(), w.data(),
                  scale, &loss, grad.data(), m.data(),     c.data()};
  cpu::Context cctx;
  cpu::ta_moe_loss(cctx, a);
  // CUDA.
  Dev<float> dp(probs), dw(w), dl(1), dg(grad.size()), dm(E), dc(E);
  Dev<std::int32_t> de(expert);
  TaMoeLossArgs d{T, E, k, dp.p, de.p, dw.p, scale, dl.p, dg.p, dm.p, dc.p};
  cuda::Context ctx;
  cuda::ta_moe_loss(ctx, d);
  ctx.synchronize();
  EXPECT_NEAR(dl.host()[0], loss, 1e-5f * std::max(1.0f, std::abs(loss)));
  const auto g = dg.host(), gm = dm.host(), gc = dc.host();
  for (std::size_t i = 0; i < grad.size(); ++i)
    ASSERT_NEAR(g[i], grad[i], 1e-6f * std::max(1.0f, std::abs(grad[i]))) << i;
  for (int e = 0; e < E; ++e) {
    EXPECT_NEAR(gm[e], m[e], 1e-6f);
    EXPECT_FLOAT_EQ(gc[e], c[e]);
  }
}

class TaMoeLossGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(TaMoeLossGpu, HandCasesMatchTheCpuTwin) {
  compare(2, 2, 1, {0.75f, 0.25f, 0.5f, 0.5f}, {0, 0}, {1.0f, 3.0f}, 2.0f);
  compare(2, 4, 2, {0.4f, 0.3f, 0.2f, 0.1f, 0.1f, 0.5f, 0.1f, 0.3f}, {0, 1, 1, -1}, {1, 1, 2, 2},
          4.0f);
}

TEST_F(TaMoeLossGpu, RandomCasesMatchTheCpuTwin) {
  std::mt19937 gen(5);
  for (auto [T, E, k] : {std::tuple{1000, 8, 2}, std::tuple{4096, 64, 2}, std::tuple{37, 5, 1}}) {
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> probs(static_cast<std::size_t>(T) * E), w(E);
    std::vector<std::int32_t> expert(static_cast<std::size_t>(T) * k);
    for (auto& p : probs) p = u(gen) / E;
    for (auto& x : expert) x = static_cast<std::int32_t>(gen() % E);
    for (auto& x : w) x = 0.5f + u(gen);
    compare(T, E, k, probs, expert, w, static_cast<float>(E));
  }
}

}  // namespace
}  // namespace moesim::kernels
