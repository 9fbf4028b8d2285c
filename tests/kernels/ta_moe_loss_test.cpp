// TA-MoE loss, CPU twin (kernels/ta_moe_loss.hpp): hand-computed losses and gradients, the GShard
// reduction under uniform weights, the gradient against finite differences, the weight helper.
#include "kernels/ta_moe_loss.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace moesim::kernels {
namespace {

struct Result {
  float loss = 0;
  std::vector<float> grad, m, c;
};

Result run(int T, int E, int k, const std::vector<float>& probs,
           const std::vector<std::int32_t>& expert, const std::vector<float>& w, float scale) {
  Result r;
  r.grad.resize(static_cast<std::size_t>(T) * E);
  r.m.resize(E);
  r.c.resize(E);
  TaMoeLossArgs a;
  a.num_tokens = T;
  a.num_experts = E;
  a.top_k = k;
  a.probs = probs.data();
  a.expert = expert.data();
  a.expert_weight = w.data();
  a.scale = scale;
  a.loss = &r.loss;
  a.grad_probs = r.grad.data();
  a.mean_prob = r.m.data();
  a.choice_share = r.c.data();
  cpu::Context ctx;
  cpu::ta_moe_loss(ctx, a);
  return r;
}

TEST(TaMoeLossCpu, TopOneByHand) {
  // m = (0.625, 0.375), c = (1, 0), w = (1, 3), scale 2: l = 2 * 0.625 = 1.25.
  const Result r = run(2, 2, 1, {0.75f, 0.25f, 0.5f, 0.5f}, {0, 0}, {1.0f, 3.0f}, 2.0f);
  EXPECT_FLOAT_EQ(r.loss, 1.25f);
  EXPECT_FLOAT_EQ(r.m[0], 0.625f);
  EXPECT_FLOAT_EQ(r.c[0], 1.0f);
  EXPECT_FLOAT_EQ(r.c[1], 0.0f);
  // d l / d p[t, e] = scale * w_e * c_e / T = (1, 0) for both tokens.
  EXPECT_EQ(r.grad, (std::vector<float>{1.0f, 0.0f, 1.0f, 0.0f}));
}

TEST(TaMoeLossCpu, TopTwoByHand) {
  // c = (1/4, 2/4, 0, 1/4), m = (0.25, 0.4, 0.15, 0.2), w = (1, 1, 2, 2), scale 4:
  // l = 4 * (0.0625 + 0.2 + 0 + 0.1) = 1.45; gradient columns 4 * w * c / 2 = (0.5, 1, 0, 1).
  const Result r = run(2, 4, 2, {0.4f, 0.3f, 0.2f, 0.1f, 0.1f, 0.5f, 0.1f, 0.3f}, {0, 1, 1, 3},
                       {1, 1, 2, 2}, 4.0f);
  EXPECT_NEAR(r.loss, 1.45f, 1e-6f);
  const std::vector<float> col{0.5f, 1.0f, 0.0f, 1.0f};
  for (int t = 0; t < 2; ++t)
    for (int e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(r.grad[t * 4 + e], col[e]);
}

TEST(TaMoeLossCpu, DroppedChoicesAreNotCountedAndBadIndicesThrow) {
  const Result r = run(2, 2, 2, {0.5f, 0.5f, 0.5f, 0.5f}, {0, -1, 1, -1}, {1, 1}, 2.0f);
  EXPECT_FLOAT_EQ(r.c[0], 0.25f);  // 1 of T*k = 4 entries
  EXPECT_FLOAT_EQ(r.c[1], 0.25f);
  EXPECT_THROW(run(1, 2, 1, {0.5f, 0.5f}, {2}, {1, 1}, 1.0f), ArgumentError);
  EXPECT_THROW(run(0, 2, 1, {}, {}, {1, 1}, 1.0f), ArgumentError);
}

// Random probabilities and top-k choices.
void random_case(int T, int E, int k, unsigned seed, std::vector<float>& probs,
                 std::vector<std::int32_t>& expert) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  probs.assign(static_cast<std::size_t>(T) * E, 0);
  expert.clear();
  for (int t = 0; t < T; ++t) {
    float s = 0;
    for (int e = 0; e < E; ++e) s += probs[t * E + e] = u(gen);
    for (int e = 0; e < E; ++e) probs[t * E + e] /= s;
    for (int c = 0; c < k; ++c) expert.push_back(static_cast<std::int32_t>(gen() % E));
  }
}

TEST(TaMoeLossCpu, UniformWeightsGiveTheGShardBalanceLoss) {
  std::vector<float> probs;
  std::vector<std::int32_t> expert;
  const int T = 64, E = 8, k = 2;
  random_case(T, E, k, 3, probs, expert);
  const Result r = run(T, E, k, probs, expert, std::vector<float>(E, 1.0f), static_cast<float>(E));
  double gshard = 0;
  for (int e = 0; e < E; ++e) {
    double m = 0, c = 0;
    for (int t = 0; t < T; ++t) m += probs[t * E + e] / T;
    for (int i = 0; i < T * k; ++i) c += expert[i] == e ? 1.0 / (T * k) : 0.0;
    gshard += c * m;
  }
  EXPECT_NEAR(r.loss, E * gshard, 1e-6);
}

TEST(TaMoeLossCpu, GradientMatchesFiniteDifferences) {
  std::vector<float> probs;
  std::vector<std::int32_t> expert;
  const int T = 16, E = 6, k = 2;
  random_case(T, E, k, 11, probs, expert);
  const std::vector<float> w{0.5f, 0.5f, 0.5f, 1.5f, 1.5f, 1.5f};
  const Result base = run(T, E, k, probs, expert, w, 6.0f);
  const float h = 1e-2f;
  for (int t : {0, 7, 15})
    for (int e = 0; e < E; ++e) {
      std::vector<float> up = probs, dn = probs;
      up[t * E + e] += h;
      dn[t * E + e] -= h;
      const double fd =
          (run(T, E, k, up, expert, w, 6.0f).loss - run(T, E, k, dn, expert, w, 6.0f).loss) /
          (2.0 * h);
      EXPECT_NEAR(base.grad[t * E + e], fd, 1e-4) << "t " << t << " e " << e;
    }
}

TEST(TaMoeLossCpu, WeightsAreInverseTargetSharesWithMeanOne) {
  const double share[] = {0.4, 0.4, 0.1, 0.1};
  const std::vector<float> w = ta_moe_expert_weights(share, 4, 2);
  ASSERT_EQ(w.size(), 8u);
  EXPECT_FLOAT_EQ(w[0], 0.4f);
  EXPECT_FLOAT_EQ(w[1], 0.4f);
  EXPECT_FLOAT_EQ(w[4], 1.6f);
  EXPECT_FLOAT_EQ(w[7], 1.6f);
  const double uniform[] = {0.25, 0.25, 0.25, 0.25};
  for (float x : ta_moe_expert_weights(uniform, 4, 1)) EXPECT_FLOAT_EQ(x, 1.0f);
  const double zero[] = {0.5, 0.0};
  EXPECT_THROW(ta_moe_expert_weights(zero, 2, 1), ArgumentError);
}

}  // namespace
}  // namespace moesim::kernels
