// kernels/rules.hpp: the per-element and per-row rules that the CPU twins and the CUDA kernels
// both call, on hand-computed cases. What passes here is the arithmetic and the
// tie-breaking the GPU runs.
#include "kernels/rules.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "strategies/collectives/collective.hpp"

namespace moesim::kernels::rules {
namespace {

TEST(KernelRules, ActivationValues) {
  EXPECT_EQ(activate(Activation::kNone, -1.5f), -1.5f);
  EXPECT_EQ(activate(Activation::kRelu, -1.5f), 0.0f);
  EXPECT_EQ(activate(Activation::kRelu, 2.25f), 2.25f);
  EXPECT_EQ(activate(Activation::kRelu, 0.0f), 0.0f);
  EXPECT_EQ(activate(Activation::kGelu, 0.0f), 0.0f);
  // gelu_tanh(1) = 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.841191990...
  EXPECT_NEAR(activate(Activation::kGelu, 1.0f), 0.8411920f, 1e-6f);
  // Odd-ish symmetry of the tanh form: gelu(x) - gelu(-x) = x.
  for (float x : {0.5f, 1.0f, 3.0f}) {
    EXPECT_NEAR(activate(Activation::kGelu, x) - activate(Activation::kGelu, -x), x, 1e-6f) << x;
  }
}

// Logits (0, ln 3, ln 3, 0) over 4 experts: probabilities 1/8, 3/8, 3/8, 1/8. Experts 1 and 2
// tie; the lower index comes first, then 2, then 0 (ties with 3: lower index).
// Node-limited routing: 8 experts in 4 groups of 2, top-4.
//   logits (9, 0 | 5, 4 | 6, 1 | 8, 2): groups' top-2 sums 9, 9, 7, 10.
//   limit 2 (r = 2): groups 3 (10) and 0 (9, before group 1's tie) -> choices 0, 6, 7, 1.
//   limit 3 (r = 2): groups 3, 0, 1 -> 0, 6, 2, 3. Without a limit: 0, 6, 4, 2.
TEST(KernelRules, RouteTokenNodeLimitPicksGroupsByTheirBestLogits) {
  const std::vector<float> row = {9, 0, 5, 4, 6, 1, 8, 2};
  std::int32_t expert[kMaxTopK];
  float weight[kMaxTopK];
  EXPECT_FLOAT_EQ(group_score(row.data(), 1, 2, 2), 9.0f);
  EXPECT_FLOAT_EQ(group_score(row.data(), 3, 2, 1), 8.0f);
  route_token(row.data(), 8, 4, false, expert, weight, 2, 2);
  EXPECT_EQ(std::vector<std::int32_t>(expert, expert + 4), (std::vector<std::int32_t>{0, 6, 7, 1}));
  // The weights stay the softmax over all 8 experts.
  double sum = 0;
  for (float x : row) sum += std::exp(x - 9.0);
  EXPECT_NEAR(weight[2], std::exp(2.0 - 9.0) / sum, 1e-7);
  route_token(row.data(), 8, 4, false, expert, weight, 2, 3);
  EXPECT_EQ(std::vector<std::int32_t>(expert, expert + 4), (std::vector<std::int32_t>{0, 6, 2, 3}));
  route_token(row.data(), 8, 4, false, expert, weight);
  EXPECT_EQ(std::vector<std::int32_t>(expert, expert + 4), (std::vector<std::int32_t>{0, 6, 4, 2}));
  // A limit that cannot bind (>= k, or >= the groups) is no limit.
  EXPECT_FALSE(group_limit_binds(8, 4, 2, 4));
  EXPECT_FALSE(group_limit_binds(8, 8, 2, 4));
  EXPECT_TRUE(group_limit_binds(8, 4, 2, 3));
  route_token(row.data(), 8, 4, false, expert, weight, 2, 4);
  EXPECT_EQ(std::vector<std::int32_t>(expert, expert + 4), (std::vector<std::int32_t>{0, 6, 4, 2}));
}

TEST(KernelRules, RouteTokenSoftmaxTopKAndTies) {
  const float l3 = std::log(3.0f);
  const std::vector<float> row = {0.0f, l3, l3, 0.0f};
  std::int32_t expert[kMaxTopK];
  float weight[kMaxTopK];
  const float top = route_token(row.data(), 4, 3, false, expert, weight);
  EXPECT_EQ(expert[0], 1);
  EXPECT_EQ(expert[1], 2);
  EXPECT_EQ(expert[2], 0);
  EXPECT_NEAR(weight[0], 0.375f, 1e-6f);
  EXPECT_NEAR(weight[1], 0.375f, 1e-6f);
  EXPECT_NEAR(weight[2], 0.125f, 1e-6f);
  EXPECT_NEAR(top, 0.375f, 1e-6f);
  // Renormalised over the 2 choices: 1/2 each; the returned top probability is not renormalised.
  const float top2 = route_token(row.data(), 4, 2, true, expert, weight);
  EXPECT_EQ(expert[0], 1);
  EXPECT_EQ(expert[1], 2);
  EXPECT_NEAR(weight[0], 0.5f, 1e-6f);
  EXPECT_NEAR(weight[1], 0.5f, 1e-6f);
  EXPECT_NEAR(top2, 0.375f, 1e-6f);
  // Large logits do not overflow (the max is subtracted first); all-equal logits pick 0, 1, ...
  const std::vector<float> big = {1000.0f, 1000.0f, 1000.0f};
  route_token(big.data(), 3, 3, false, expert, weight);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(expert[c], c);
    EXPECT_NEAR(weight[c], 1.0f / 3, 1e-6f);
  }
}

// s = 3 tokens, k = 2: every first choice (c = 0) before any second choice; within a level the
// given token order.
TEST(KernelRules, PriorityEntryOrdersChoiceLevelsThenTokens) {
  std::vector<std::int64_t> plain, ordered;
  const std::int32_t order[3] = {2, 0, 1};
  for (std::int64_t p = 0; p < 6; ++p) {
    plain.push_back(priority_entry(p, 3, 2, nullptr));
    ordered.push_back(priority_entry(p, 3, 2, order));
  }
  EXPECT_EQ(plain, (std::vector<std::int64_t>{0, 2, 4, 1, 3, 5}));
  EXPECT_EQ(ordered, (std::vector<std::int64_t>{4, 0, 2, 5, 1, 3}));
  // No int overflow past 2^31 entries (S = 2^30 tokens, k = 4).
  EXPECT_EQ(priority_entry(3 * (std::int64_t{1} << 30) + 5, std::int64_t{1} << 30, 4, nullptr),
            5 * 4 + 3);
}

// The kernels' stride index is the plan's (strategies/collectives stride_copy_index), and a
// permutation, for every T(h, w) up to 16 x 16.
TEST(KernelRules, StrideSlotIsThePlansStrideIndexAndAPermutation) {
  EXPECT_EQ(stride_slot(1, 2, 3), 3);  // chunk 1 = (a 0, j 1) -> slot 1*3 + 0
  EXPECT_EQ(stride_slot(2, 2, 3), 1);  // chunk 2 = (a 1, j 0) -> slot 0*3 + 1
  for (int h = 1; h <= 16; ++h) {
    for (int w = 1; w <= 16; ++w) {
      std::vector<int> seen(static_cast<std::size_t>(h * w), 0);
      for (int i = 0; i < h * w; ++i) {
        ASSERT_EQ(stride_slot(i, h, w), collectives::stride_copy_index(i, h, w)) << h << " " << w;
        ++seen[static_cast<std::size_t>(stride_slot(i, h, w))];
      }
      for (int n : seen) ASSERT_EQ(n, 1) << h << " " << w;
    }
  }
}

}  // namespace
}  // namespace moesim::kernels::rules
