// CPU-only tests of the backward MoE layer's pieces (exec/layer_program.hpp, exec/moe_data.hpp):
// reference_backward against central finite differences of reference_layer, the seeded variant
// against the explicit one, and which ops are the program's backward steps.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "exec/layer_program.hpp"
#include "exec/moe_data.hpp"

namespace moesim::exec {
namespace {

// Loss = <dY, y>, so dLoss/dθ is exactly what reference_backward returns for that dY.
double loss(const MoeShape& s, const std::vector<float>& x, const std::vector<float>& wg,
            const std::vector<std::vector<float>>& w1, const std::vector<std::vector<float>>& w2,
            const std::vector<float>& dy, int capacity) {
  const std::vector<float> y = reference_layer(s, x, wg, w1, w2, capacity, nullptr);
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += static_cast<double>(dy[i]) * y[i];
  return l;
}

// Central difference of the loss in parameter p (step h): the step actually taken in fp32 is
// (p + h) - (p - h), so the quotient uses it rather than 2h.
template <typename Loss>
double central_difference(float& p, float h, Loss&& f) {
  const float p0 = p;
  p = p0 + h;
  const float hi = p;
  const double up = f();
  p = p0 - h;
  const float lo = p;
  const double down = f();
  p = p0;
  return (up - down) / (static_cast<double>(hi) - lo);
}

// S = 4, M = 3, H = 5, E = 3, k = 2 with capacity 2: 8 choices for at most 6 slots, so at least
// two drop. The FD step 1e-3 in fp32: rounding error ~ 1e-7 / 1e-3 = 1e-4 on an O(1) loss,
// truncation O(h^2) ~ 1e-6 (the loss is piecewise smooth: the seeded data keeps every logit gap
// and every ReLU input far from the step, checked by the routing being the same at +-h below).
TEST(ReferenceBackward, MatchesCentralFiniteDifferencesWithADrop) {
  const MoeShape s{4, 3, 5, 3, 2};
  const int capacity = 2;
  const std::uint64_t seed = 12345;
  std::vector<float> x(static_cast<size_t>(s.tokens) * s.model_dim), dy(x.size()),
      wg(static_cast<size_t>(s.model_dim) * s.experts);
  fill_uniform(x, seed, 1, 0, 0, 1.0f);
  fill_uniform(dy, seed, 5, 0, 0, 1.0f);
  fill_uniform(wg, seed, 2, 0, 0, 1.5f);  // a wide spread of logits: no near-ties
  std::vector<std::vector<float>> w1(s.experts), w2(s.experts);
  for (int e = 0; e < s.experts; ++e) {
    w1[e].resize(static_cast<size_t>(s.model_dim) * s.hidden_dim);
    w2[e].resize(static_cast<size_t>(s.hidden_dim) * s.model_dim);
    fill_uniform(w1[e], seed, 3, 0, e, 1.0f);
    fill_uniform(w2[e], seed, 4, 0, e, 1.0f);
  }
  const ReferenceGrads g = reference_backward(s, x, wg, w1, w2, dy, capacity);
  ASSERT_GT(g.dropped, 0);
  ASSERT_EQ(g.dx.size(), x.size());
  ASSERT_EQ(g.dgate_w.size(), wg.size());
  ASSERT_EQ(g.dw1.size(), static_cast<size_t>(s.experts));
  const ReferenceRouting routing = reference_routing(s, x, wg, capacity);
  const float h = 1e-3f;
  const double tol = 2e-3;
  long long checked = 0;
  double max_grad = 0;
  auto expect_fd = [&](float& p, double analytic, const char* what, size_t i) {
    const double fd = central_difference(p, h, [&] {
      // The discrete decisions must not change inside the FD interval.
      const ReferenceRouting r = reference_routing(s, x, wg, capacity);
      EXPECT_EQ(r.expert, routing.expert);
      EXPECT_EQ(r.kept, routing.kept);
      return loss(s, x, wg, w1, w2, dy, capacity);
    });
    EXPECT_NEAR(analytic, fd, tol) << what << "[" << i << "]";
    max_grad = std::max(max_grad, std::fabs(analytic));
    ++checked;
  };
  for (size_t i = 0; i < x.size(); ++i) expect_fd(x[i], g.dx[i], "dx", i);
  for (size_t i = 0; i < wg.size(); ++i) expect_fd(wg[i], g.dgate_w[i], "dWgate", i);
  for (int e = 0; e < s.experts; ++e) {
    for (size_t i = 0; i < w1[e].size(); ++i) expect_fd(w1[e][i], g.dw1[e][i], "dW1", i);
    for (size_t i = 0; i < w2[e].size(); ++i) expect_fd(w2[e][i], g.dw2[e][i], "dW2", i);
  }
  EXPECT_EQ(checked, 12 + 9 + 3 * 15 * 2);
  EXPECT_GT(max_grad, 0.1);  // not trivially zero
  // Experts a dropped choice would have used get nothing from it: an expert no kept choice
  // reaches has zero gradients.
  for (int e = 0; e < s.experts; ++e) {
    bool reached = false;
    for (size_t entry = 0; entry < routing.expert.size(); ++entry)
      reached |= routing.kept[entry] && routing.expert[entry] == e;
    if (reached) continue;
    for (double v : g.dw1[e]) EXPECT_EQ(v, 0.0);
  }
}

// The seeded variant (one expert at a time, what --check runs) equals the explicit one on the
// seeded weights, and visits every expert in order.
TEST(ReferenceBackward, SeededEqualsExplicitAndVisitsEveryExpert) {
  const MoeShape s{6, 4, 8, 4, 2};
  const std::uint64_t seed = 9;
  const int layer = 1, capacity = 2;
  const std::vector<float> x = make_tokens(s, seed, 0, layer, 3);
  const std::vector<float> dy = make_grad_output(s, seed, 0, layer, 3);
  EXPECT_NE(dy, x);  // its own stream
  std::vector<std::vector<float>> w1, w2;
  for (int e = 0; e < s.experts; ++e) {
    w1.push_back(make_w1(s, seed, layer, e));
    w2.push_back(make_w2(s, seed, layer, e));
  }
  const ReferenceGrads a =
      reference_backward(s, x, make_gate_weights(s, seed, layer), w1, w2, dy, capacity);
  std::vector<int> visited;
  const ReferenceGrads b = reference_backward_seeded(
      s, x, seed, layer, capacity, dy,
      [&](int e, const std::vector<double>& dw1, const std::vector<double>& dw2) {
        visited.push_back(e);
        EXPECT_EQ(dw1, a.dw1[e]);
        EXPECT_EQ(dw2, a.dw2[e]);
      });
  EXPECT_EQ(visited, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(b.dx, a.dx);
  EXPECT_EQ(b.dgate_w, a.dgate_w);
  EXPECT_EQ(b.dropped, a.dropped);
}

// The backward steps of the layer program are read from the role, never the label.
TEST(BackwardRoles, ReadFromTheRole) {
  auto step = [](OpRoleKind kind, bool backward, int chunk) {
    Op op;
    op.role = OpRole{kind, backward, 3, chunk};
    return is_backward_step(op);
  };
  for (OpRoleKind k :
       {OpRoleKind::kDecode, OpRoleKind::kCombine, OpRoleKind::kFc2, OpRoleKind::kFc1,
        OpRoleKind::kDispatch, OpRoleKind::kEncode, OpRoleKind::kGate, OpRoleKind::kExpertGradSync,
        OpRoleKind::kPartialSum, OpRoleKind::kParamGather, OpRoleKind::kEspAllGather,
        OpRoleKind::kEspAllReduce, OpRoleKind::kParmLocalDump, OpRoleKind::kParmLocalCombine,
        OpRoleKind::kParmJoin, OpRoleKind::kParmMpAllGather, OpRoleKind::kExpertMpGradSync})
    EXPECT_TRUE(step(k, true, 1)) << static_cast<int>(k);
  // Forward ops, other backward ops, other gradient collectives and ops with no role are not
  // the program's backward steps.
  EXPECT_FALSE(step(OpRoleKind::kGate, false, -1));
  EXPECT_FALSE(step(OpRoleKind::kNone, true, -1));
  EXPECT_FALSE(step(OpRoleKind::kPartialSum, false, -1));
  EXPECT_FALSE(step(OpRoleKind::kEspAllReduce, false, 0));
  EXPECT_FALSE(step(OpRoleKind::kCombineSaa, true, 0));  // SAA's backward is the dispatch's
  EXPECT_FALSE(step(OpRoleKind::kDenseGradSync, true, -1));
  Op labelled;
  labelled.label = "L5.grad.expert_allreduce";
  EXPECT_FALSE(is_backward_step(labelled));
}

}  // namespace
}  // namespace moesim::exec
