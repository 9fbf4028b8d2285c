// CPU reference kernels against hand-computed cases (exact slots and drops, encode / decode
// layouts, stride copy, GEMM / FFN), adjoint identities and finite differences for the backward
// passes, in fp32, fp16 and bf16.
#include "kernels/moe_kernels.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "tests/kernels/kernel_test_util.hpp"

namespace moesim::kernels {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::HostBuffer;
using testing::HostRouting;
using testing::kAllDTypes;
using testing::random_floats;

// --- dtype conversions ---------------------------------------------------------------------------

TEST(KernelDType, HalfKnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);  // halfway rounds to even = inf
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);         // tie to even (0)
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 ulp -> 2 (even)
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even mantissa
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even mantissa
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
}

TEST(KernelDType, HalfRoundTripsEveryFiniteValue) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) continue;  // NaN payloads
    ASSERT_EQ(float_to_half(half_to_float(static_cast<std::uint16_t>(bits))), bits) << bits;
  }
}

TEST(KernelDType, Bf16KnownValuesAndRounding) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie -> even
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  for (std::uint32_t bits = 0; bits < 0x10000; bits += 7) {
    if ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0) continue;
    ASSERT_EQ(float_to_bf16(bf16_to_float(static_cast<std::uint16_t>(bits))), bits);
  }
}

// --- gate ----------------------------------------------------------------------------------------

// 4 tokens, 3 experts, k = 2, C = 2. Logits (rows = tokens):
//   t0 [3 1 0] -> (e0, e1)   t1 [2 0 1] -> (e0, e2)   t2 [0 5 1] -> (e1, e2)
//   t3 [6 0 0] -> (e0, e1)   (tie between e1 and e2: lower index)
const std::vector<float> kLogits = {3, 1, 0, 2, 0, 1, 0, 5, 1, 6, 0, 0};

GateParams hand_params(bool prioritized) {
  GateParams p;
  p.num_tokens = 4;
  p.model_dim = 3;
  p.num_experts = 3;
  p.top_k = 2;
  p.capacity = 2;
  p.batch_prioritized = prioritized;
  return p;
}

float softmax_of(int t, int j) {
  float sum = 0.0f;
  for (int i = 0; i < 3; ++i) sum += std::exp(kLogits[t * 3 + i]);
  return std::exp(kLogits[t * 3 + j]) / sum;
}

TEST(KernelGate, FirstChoicesBeforeSecondChoicesInTokenOrder) {
  cpu::Context ctx;
  HostRouting r(4, 2, 3, 2);
  cpu::gate_from_logits(ctx, hand_params(false), kLogits.data(), r.out());
  EXPECT_THAT(r.expert, ElementsAre(0, 1, 0, 2, 1, 2, 0, 1));
  // First choices: t0 e0#0, t1 e0#1, t2 e1#0, t3 e0 full -> dropped. Second choices: t0 e1#1,
  // t1 e2#0, t2 e2#1, t3 e1 full -> dropped.
  EXPECT_THAT(r.slot, ElementsAre(0, 1, 1, 0, 0, 1, -1, -1));
  EXPECT_THAT(r.slot_entry, ElementsAre(0, 2, 4, 1, 3, 5));
  EXPECT_THAT(r.count, ElementsAre(2, 2, 2));
  EXPECT_FLOAT_EQ(r.weight[0], softmax_of(0, 0));
  EXPECT_FLOAT_EQ(r.weight[3], softmax_of(1, 2));
  EXPECT_FLOAT_EQ(r.weight[7], softmax_of(3, 1));  // dropped entries keep their gate value
}

TEST(KernelGate, BatchPrioritizedKeepsTheMostConfidentTokens) {
  cpu::Context ctx;
  HostRouting r(4, 2, 3, 2);
  cpu::gate_from_logits(ctx, hand_params(true), kLogits.data(), r.out());
  // Top values: t3 0.995 > t2 0.976 > t0 0.844 > t1 0.665. First level: t3 e0#0, t2 e1#0,
  // t0 e0#1, t1 e0 dropped. Second level: t3 e1#1, t2 e2#0, t0 e1 dropped, t1 e2#1.
  EXPECT_THAT(r.expert, ElementsAre(0, 1, 0, 2, 1, 2, 0, 1));
  EXPECT_THAT(r.slot, ElementsAre(1, -1, -1, 1, 0, 0, 0, 1));
  EXPECT_THAT(r.slot_entry, ElementsAre(6, 0, 4, 7, 5, 3));
  EXPECT_THAT(r.count, ElementsAre(2, 2, 2));
}

TEST(KernelGate, LargeCapacityDropsNothingAndCountsDemand) {
  cpu::Context ctx;
  GateParams p = hand_params(false);
  p.capacity = 5;
  HostRouting r(4, 2, 3, 5);
  cpu::gate_from_logits(ctx, p, kLogits.data(), r.out());
  EXPECT_THAT(r.slot, ElementsAre(0, 1, 1, 0, 0, 1, 2, 2));
  EXPECT_THAT(r.count, ElementsAre(3, 3, 2));
  EXPECT_THAT(r.slot_entry, ElementsAre(0, 2, 6, -1, -1, 4, 1, 7, -1, -1, 3, 5, -1, -1, -1));
}

TEST(KernelGate, ZeroCapacityDropsEverything) {
  cpu::Context ctx;
  GateParams p = hand_params(false);
  p.capacity = 0;
  HostRouting r(4, 2, 3, 0);
  cpu::gate_from_logits(ctx, p, kLogits.data(), r.out());
  EXPECT_THAT(r.slot, ::testing::Each(-1));
  EXPECT_THAT(r.count, ElementsAre(0, 0, 0));
}

TEST(KernelGate, OptionalOutputsMayBeNullAndNoTokensIsFine) {
  cpu::Context ctx;
  HostRouting r(4, 2, 3, 2);
  RoutingOut out{r.expert.data(), r.slot.data(), r.weight.data(), nullptr, nullptr};
  cpu::gate_from_logits(ctx, hand_params(false), kLogits.data(), out);
  EXPECT_THAT(r.slot, ElementsAre(0, 1, 1, 0, 0, 1, -1, -1));
  // No tokens: every slot empty, every count 0; encode then writes zero rows only.
  GateParams p = hand_params(false);
  p.num_tokens = 0;
  HostRouting empty(0, 2, 3, 2);
  empty.count = {7, 7, 7};
  cpu::gate_from_logits(ctx, p, nullptr, empty.out());
  EXPECT_THAT(empty.slot_entry, ::testing::Each(-1));
  EXPECT_THAT(empty.count, ElementsAre(0, 0, 0));
  std::vector<float> disp(12, 5.0f);
  cpu::encode(ctx, DType::kF32, empty.view(), 2, nullptr, disp.data());
  EXPECT_THAT(disp, ::testing::Each(0.0f));
}

TEST(KernelGate, NormalizedTopKWeightsSumToOne) {
  cpu::Context ctx;
  GateParams p = hand_params(false);
  p.normalize_top_k = true;
  HostRouting r(4, 2, 3, 2);
  cpu::gate_from_logits(ctx, p, kLogits.data(), r.out());
  const float p0 = softmax_of(0, 0), p1 = softmax_of(0, 1);
  EXPECT_FLOAT_EQ(r.weight[0], p0 / (p0 + p1));
  EXPECT_FLOAT_EQ(r.weight[1], p1 / (p0 + p1));
  for (int t = 0; t < 4; ++t) EXPECT_NEAR(r.weight[2 * t] + r.weight[2 * t + 1], 1.0f, 1e-6f);
}

TEST(KernelGate, GemmGateGivesTheSameRoutingInEveryDType) {
  // X = the logits, Wg = identity: the GEMM reproduces the small-integer logits exactly.
  const std::vector<float> identity = {1, 0, 0, 0, 1, 0, 0, 0, 1};
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer x(d, kLogits), wg(d, identity);
    std::vector<float> logits(12);
    HostRouting r(4, 2, 3, 2);
    cpu::gate(ctx, d, hand_params(false), x.data(), wg.data(), logits.data(), r.out());
    EXPECT_EQ(logits, kLogits) << dtype_name(d);
    EXPECT_THAT(r.slot, ElementsAre(0, 1, 1, 0, 0, 1, -1, -1)) << dtype_name(d);
  }
}

TEST(KernelGate, TopKHandlesEightChoicesAndRejectsBadShapes) {
  cpu::Context ctx;
  std::vector<float> logits = {0, 7, 1, 6, 2, 5, 3, 4, 9};  // one token, 9 experts
  GateParams p;
  p.num_tokens = 1;
  p.num_experts = 9;
  p.top_k = 8;
  p.capacity = 1;
  HostRouting r(1, 8, 9, 1);
  cpu::gate_from_logits(ctx, p, logits.data(), r.out());
  EXPECT_THAT(r.expert, ElementsAre(8, 1, 3, 5, 7, 6, 4, 2));
  EXPECT_THAT(r.slot, ::testing::Each(0));
  p.top_k = 9;
  HostRouting bad(1, 9, 9, 1);
  EXPECT_THROW(cpu::gate_from_logits(ctx, p, logits.data(), bad.out()), ArgumentError);
  p.top_k = 2;
  p.num_experts = 1;
  EXPECT_THROW(cpu::gate_from_logits(ctx, p, logits.data(), bad.out()), ArgumentError);
}

TEST(KernelGate, NodeLimitedGateKeepsEveryTokenOnItsNodes) {
  // 64 tokens, 16 experts on 4 nodes of 4, top-4 from at most 2 nodes; random logits. Every
  // token's choices lie on <= 2 nodes; without the limit some token's span 3+ (the check can
  // fail), and the capacity rule is the same either way (slots by choice level).
  GateParams p;
  p.num_tokens = 64;
  p.model_dim = 1;
  p.num_experts = 16;
  p.top_k = 4;
  p.capacity = 64;
  std::vector<float> logits(64 * 16);
  std::uint32_t x = 12345;
  for (float& v : logits) v = static_cast<float>((x = x * 1664525u + 1013904223u) >> 8) / (1 << 24);
  cpu::Context ctx;
  int widest_free = 0;
  for (const int limit : {0, 2}) {
    p.experts_per_group = limit ? 4 : 0;
    p.group_limit = limit;
    HostRouting r(64, 4, 16, 64);
    cpu::gate_from_logits(ctx, p, logits.data(), r.out());
    for (int t = 0; t < 64; ++t) {
      std::set<int> nodes;
      for (int c = 0; c < 4; ++c) nodes.insert(r.expert[t * 4 + c] / 4);
      if (limit) {
        EXPECT_LE(nodes.size(), 2u) << "token " << t;
      } else {
        widest_free = std::max(widest_free, static_cast<int>(nodes.size()));
      }
    }
    EXPECT_EQ(std::count(r.slot.begin(), r.slot.end(), -1), 0);
  }
  EXPECT_GE(widest_free, 3);
  // Groups that do not divide E, or too few experts on `limit` groups for k, are refused.
  HostRouting r(64, 4, 16, 64);
  p.experts_per_group = 3;
  EXPECT_THROW(cpu::gate_from_logits(ctx, p, logits.data(), r.out()), ArgumentError);
  p.experts_per_group = 1;
  p.group_limit = 3;
  EXPECT_THROW(cpu::gate_from_logits(ctx, p, logits.data(), r.out()), ArgumentError);
}

TEST(KernelGate, BuildSlotIndexMatchesGateAndRejectsOutOfRange) {
  cpu::Context ctx;
  HostRouting r(4, 2, 3, 2);
  cpu::gate_from_logits(ctx, hand_params(true), kLogits.data(), r.out());
  std::vector<std::int32_t> rebuilt(6, 42);
  cpu::build_slot_index(ctx, r.view(), rebuilt.data());
  EXPECT_EQ(rebuilt, r.slot_entry);
  r.slot[0] = 2;  // == capacity
  EXPECT_THROW(cpu::build_slot_index(ctx, r.view(), rebuilt.data()), ArgumentError);
}

// --- encode / decode -----------------------------------------------------------------------------

// Token t's row is (10t, 10t+1) and the routing is the hand case above (non-prioritised).
HostRouting hand_routing() {
  cpu::Context ctx;
  HostRouting r(4, 2, 3, 2);
  cpu::gate_from_logits(ctx, hand_params(false), kLogits.data(), r.out());
  return r;
}

TEST(KernelEncode, ScattersTokensToExpertSlotsAndZeroesEmptySlots) {
  HostRouting r = hand_routing();
  r.slot_entry[5] = -1;  // pretend expert 2 slot 1 is empty
  const std::vector<float> x = {0, 1, 10, 11, 20, 21, 30, 31};
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer xb(d, x), out(d, std::vector<float>(12, 99.0f));
    cpu::encode(ctx, d, r.view(), 2, xb.data(), out.data());
    // e0: t0, t1; e1: t2, t0; e2: t1, empty.
    EXPECT_THAT(out.to_float(), ElementsAre(0, 1, 10, 11, 20, 21, 0, 1, 10, 11, 0, 0))
        << dtype_name(d);
  }
}

TEST(KernelDecode, WeightedGatherSumsKeptChoicesOnly) {
  HostRouting r = hand_routing();
  // Rows of the (3, 2, 2) expert output: row index e*2+s holds (e*2+s+1) * (1, -1).
  std::vector<float> eo;
  for (int row = 0; row < 6; ++row) eo.insert(eo.end(), {row + 1.0f, -(row + 1.0f)});
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer eob(d, eo), y(d, 8);
    cpu::decode(ctx, d, r.view(), 2, eob.data(), y.data());
    const std::vector<float> yf = y.to_float();
    const float tol = 4 * testing::dtype_eps(d) * 6;
    // t0: w0 * row0 (e0 s0) + w1 * row3 (e1 s1); t3: both dropped -> 0.
    const float y0 = r.weight[0] * 1 + r.weight[1] * 4;
    const float y1 = r.weight[2] * 2 + r.weight[3] * 5;
    const float y2 = r.weight[4] * 3 + r.weight[5] * 6;
    EXPECT_NEAR(yf[0], y0, tol * y0);
    EXPECT_NEAR(yf[1], -y0, tol * y0);
    EXPECT_NEAR(yf[2], y1, tol * y1);
    EXPECT_NEAR(yf[4], y2, tol * y2);
    EXPECT_EQ(yf[6], 0.0f);
    EXPECT_EQ(yf[7], 0.0f);
  }
}

// Random routing with drops: S = 64 tokens, E = 8, k = 2, C = 12 (demand 128 > 96 slots).
HostRouting random_routing(bool prioritized, std::uint32_t seed) {
  const int s = 64, e = 8, k = 2, c = 12;
  std::vector<float> logits = random_floats(std::size_t(s) * e, seed, -2.0f, 2.0f);
  GateParams p;
  p.num_tokens = s;
  p.num_experts = e;
  p.top_k = k;
  p.capacity = c;
  p.batch_prioritized = prioritized;
  HostRouting r(s, k, e, c);
  cpu::Context ctx;
  cpu::gate_from_logits(ctx, p, logits.data(), r.out());
  return r;
}

TEST(KernelDecode, DecodeOfEncodeScalesEachTokenByItsKeptWeights) {
  const HostRouting r = random_routing(false, 7);
  const int m = 24;
  ASSERT_GT(std::count(r.slot.begin(), r.slot.end(), -1), 0) << "the case must drop tokens";
  const std::vector<float> x = random_floats(std::size_t(r.s) * m, 11);
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer xb(d, x), disp(d, std::size_t(r.e) * r.c * m), y(d, x.size());
    cpu::encode(ctx, d, r.view(), m, xb.data(), disp.data());
    cpu::decode(ctx, d, r.view(), m, disp.data(), y.data());
    for (int t = 0; t < r.s; ++t) {
      float kept = 0.0f;
      for (int c = 0; c < r.k; ++c) kept += r.slot[t * r.k + c] >= 0 ? r.weight[t * r.k + c] : 0;
      for (int i = 0; i < m; ++i) {
        const float expect = kept * xb.at(std::size_t(t) * m + i);
        ASSERT_NEAR(y.at(std::size_t(t) * m + i), expect, 2 * testing::dtype_eps(d) + 1e-7f)
            << dtype_name(d) << " t=" << t << " i=" << i;
      }
    }
  }
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// sum |a_i b_i|: bounds the error of dot(a, b) when every b_i carries one relative rounding.
double abs_dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(double(a[i]) * b[i]);
  return s;
}

TEST(KernelBackward, EncodeBackwardIsTheAdjointOfEncode) {
  // <encode(x), G> == <x, encode_backward(G)> for all x, G (encode is linear).
  const HostRouting r = random_routing(true, 3);
  const int m = 16;
  const std::vector<float> x = random_floats(std::size_t(r.s) * m, 5);
  const std::vector<float> g = random_floats(std::size_t(r.e) * r.c * m, 6);
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer xb(d, x), gb(d, g), disp(d, g.size()), gx(d, x.size());
    cpu::encode(ctx, d, r.view(), m, xb.data(), disp.data());
    cpu::encode_backward(ctx, d, r.view(), m, gb.data(), gx.data());
    // encode copies exactly; encode_backward rounds each sum once.
    const double lhs = dot(disp.to_float(), gb.to_float());
    const std::vector<float> gxf = gx.to_float();
    const double rhs = dot(xb.to_float(), gxf);
    EXPECT_NEAR(lhs, rhs, 1.01 * testing::dtype_eps(d) * abs_dot(xb.to_float(), gxf) + 1e-9)
        << dtype_name(d);
  }
}

TEST(KernelBackward, DecodeBackwardMatchesFiniteDifferences) {
  // L(Z, w) = <g, decode(Z, w)>. dL/dZ and dL/dw by central differences in fp32 (L is linear in
  // each, so the differences are exact up to rounding), and the adjoint identity in every dtype.
  HostRouting r = random_routing(false, 9);
  const int m = 8;
  const std::vector<float> z = random_floats(std::size_t(r.e) * r.c * m, 12);
  const std::vector<float> g = random_floats(std::size_t(r.s) * m, 13);
  cpu::Context ctx;
  auto loss = [&](const std::vector<float>& zz, const HostRouting& rr) {
    std::vector<float> y(std::size_t(r.s) * m);
    cpu::decode(ctx, DType::kF32, rr.view(), m, zz.data(), y.data());
    return dot(y, g);
  };
  std::vector<float> gz(z.size());
  std::vector<float> gw(r.weight.size(), 123.0f);
  cpu::decode_backward(ctx, DType::kF32, r.view(), m, z.data(), g.data(), gz.data(), gw.data());
  const float h = 1e-2f;
  for (std::size_t i = 0; i < z.size(); i += 7) {
    std::vector<float> zp = z, zm = z;
    zp[i] += h;
    zm[i] -= h;
    EXPECT_NEAR((loss(zp, r) - loss(zm, r)) / (2 * h), gz[i], 1e-3) << "z[" << i << "]";
  }
  for (std::size_t entry = 0; entry < r.weight.size(); ++entry) {
    HostRouting rp = r, rm = r;
    rp.weight[entry] += h;
    rm.weight[entry] -= h;
    const double fd = (loss(z, rp) - loss(z, rm)) / (2 * h);
    EXPECT_NEAR(fd, gw[entry], 1e-3) << "w[" << entry << "]";
    if (r.slot[entry] < 0) {
      EXPECT_EQ(gw[entry], 0.0f);
    }
  }
  for (DType d : kAllDTypes) {
    HostBuffer zb(d, z), gb(d, g), y(d, g.size()), gzb(d, z.size());
    cpu::decode(ctx, d, r.view(), m, zb.data(), y.data());
    cpu::decode_backward(ctx, d, r.view(), m, zb.data(), gb.data(), gzb.data(), nullptr);
    // One dtype rounding per output element on each side (y, the scattered gradient), plus the
    // fp32 products and sum inside decode (3 roundings bound both).
    const std::vector<float> yf = y.to_float(), gf = gb.to_float(), zf = zb.to_float(),
                             gzf = gzb.to_float();
    const double tol = 3.0 * testing::dtype_eps(d) * (abs_dot(yf, gf) + abs_dot(zf, gzf)) + 1e-6;
    EXPECT_NEAR(dot(yf, gf), dot(zf, gzf), tol) << dtype_name(d);
  }
}

TEST(KernelBackward, DecodeBackwardZeroesEmptySlots) {
  HostRouting r = hand_routing();
  r.slot_entry[5] = -1;  // expert 2 slot 1 empty
  const int m = 2;
  std::vector<float> z(12, 1.0f), g = {1, 2, 3, 4, 5, 6, 7, 8}, gz(12, 99.0f);
  cpu::Context ctx;
  cpu::decode_backward(ctx, DType::kF32, r.view(), m, z.data(), g.data(), gz.data(), nullptr);
  // Row 0 = e0 s0 = entry 0 (t0, w0): w0 * g[t0]; row 5 is empty.
  EXPECT_FLOAT_EQ(gz[0], r.weight[0] * 1);
  EXPECT_FLOAT_EQ(gz[1], r.weight[0] * 2);
  EXPECT_FLOAT_EQ(gz[8], r.weight[3] * 3);  // row 4 = e2 s0 = entry 3 (t1)
  EXPECT_EQ(gz[10], 0.0f);
  EXPECT_EQ(gz[11], 0.0f);
}

// --- stride copy ---------------------------------------------------------------------------------

TEST(KernelStrideCopy, MatchesTheCollectiveIndexFormula) {
  // T(2, 3): input chunk i -> slot (i % 2) * 3 + i / 2.
  std::vector<std::int32_t> in = {0, 1, 2, 3, 4, 5}, out(6, -1);
  cpu::Context ctx;
  cpu::stride_copy(ctx, in.data(), out.data(), 2, 3, sizeof(std::int32_t));
  EXPECT_THAT(out, ElementsAre(0, 2, 4, 1, 3, 5));
  // T(3, 2) is the inverse.
  std::vector<std::int32_t> back(6, -1);
  cpu::stride_copy(ctx, out.data(), back.data(), 3, 2, sizeof(std::int32_t));
  EXPECT_EQ(back, in);
  EXPECT_THROW(cpu::stride_copy(ctx, in.data(), out.data(), 0, 3, 4), ArgumentError);
}

TEST(KernelStrideCopy, MultiByteChunksKeepTheirContents) {
  // 2DH with n = 2 nodes x m = 4 local: phase 1 is T(h = 4, w = 2) on 8 chunks of 3 bytes.
  std::vector<unsigned char> in(24), out(24);
  std::iota(in.begin(), in.end(), 0);
  cpu::Context ctx;
  cpu::stride_copy(ctx, in.data(), out.data(), 4, 2, 3);
  for (int i = 0; i < 8; ++i) {
    const int slot = (i % 4) * 2 + i / 4;
    for (int b = 0; b < 3; ++b) EXPECT_EQ(out[slot * 3 + b], in[i * 3 + b]);
  }
}

// --- GEMM and expert FFN -------------------------------------------------------------------------

TEST(KernelGemm, SmallExactProductAlphaBetaAllDTypes) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};   // 2 x 3
  const std::vector<float> b = {1, 0, 0, 1, 2, -1};  // 3 x 2
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer ab(d, a), bb(d, b), c(d, std::vector<float>{1, 1, 1, 1});
    cpu::gemm(ctx, d, 2, 2, 3, ab.data(), bb.data(), c.data(), 2.0f, 1.0f);
    // A B = [[7, -1], [16, -1]]; 2 A B + C.
    EXPECT_THAT(c.to_float(), ElementsAre(15, -1, 33, -1)) << dtype_name(d);
  }
}

TEST(KernelGemm, ThreadCountDoesNotChangeTheResult) {
  const int m = 67, n = 129, k = 300;
  const std::vector<float> a = random_floats(std::size_t(m) * k, 1);
  const std::vector<float> b = random_floats(std::size_t(k) * n, 2);
  std::vector<float> c1(std::size_t(m) * n), c4(c1.size());
  cpu::Context one(1), four(4);
  cpu::gemm(one, DType::kF32, m, n, k, a.data(), b.data(), c1.data());
  cpu::gemm(four, DType::kF32, m, n, k, a.data(), b.data(), c4.data());
  EXPECT_EQ(c1, c4);
  double ref = 0;
  for (int kk = 0; kk < k; ++kk) ref += double(a[5 * k + kk]) * b[std::size_t(kk) * n + 7];
  EXPECT_NEAR(c1[5 * n + 7], ref, 1e-4);
}

TEST(KernelFfn, TwoExpertsReluByHand) {
  // Expert e: W1 = (e+1) * [[1, -1, 0], [0, 1, 1]] (M = 2, H = 3), W2 = ones (H = 3, M = 2).
  const std::vector<float> x = {1, 2, -1, 1, 2, 0, 0, -3};  // E = 2, rows = 2, M = 2
  const std::vector<float> w1 = {1, -1, 0, 0, 1, 1, 2, -2, 0, 0, 2, 2};
  const std::vector<float> w2(12, 1.0f);
  FfnShape shape{2, 2, 2, 3};
  for (DType d : kAllDTypes) {
    cpu::Context ctx;
    HostBuffer xb(d, x), w1b(d, w1), w2b(d, w2), hid(d, 12), y(d, 8);
    cpu::expert_ffn(ctx, d, Activation::kRelu, shape, xb.data(), w1b.data(), w2b.data(), hid.data(),
                    y.data());
    // e0: [1,2] W1 = [1, 1, 2]; [-1,1] -> [-1, 2, 1] -> relu [0, 2, 1].
    // e1: [2,0] 2W1 = [4, -4, 0] -> [4, 0, 0]; [0,-3] -> [0, -6, -6] -> 0.
    EXPECT_THAT(hid.to_float(), ElementsAre(1, 1, 2, 0, 2, 1, 4, 0, 0, 0, 0, 0)) << dtype_name(d);
    EXPECT_THAT(y.to_float(), ElementsAre(4, 4, 3, 3, 4, 4, 0, 0)) << dtype_name(d);
  }
}

TEST(KernelFfn, GeluIsTheTanhApproximation) {
  const std::vector<float> x = {-2, -0.5f, 0, 0.5f, 1, 3};  // rows = 6, M = 1, H = 1, W = 1
  const std::vector<float> one = {1};
  FfnShape shape{1, 6, 1, 1};
  cpu::Context ctx;
  std::vector<float> hid(6), y(6);
  cpu::expert_ffn(ctx, DType::kF32, Activation::kGelu, shape, x.data(), one.data(), one.data(),
                  hid.data(), y.data());
  for (int i = 0; i < 6; ++i) {
    const double v = x[i];
    const double expect =
        0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], expect, 1e-6) << v;
  }
  EXPECT_NEAR(y[4], 0.841192, 1e-6);  // GeLU_tanh(1)
}

TEST(KernelFfn, MatchesTwoGemmsPlusActivation) {
  const int e = 3, rows = 5, m = 16, h = 24;
  const std::vector<float> x = random_floats(std::size_t(e) * rows * m, 21);
  const std::vector<float> w1 = random_floats(std::size_t(e) * m * h, 22);
  const std::vector<float> w2 = random_floats(std::size_t(e) * h * m, 23);
  cpu::Context ctx;
  std::vector<float> hid(std::size_t(e) * rows * h), y(std::size_t(e) * rows * m);
  cpu::expert_ffn(ctx, DType::kF32, Activation::kRelu, FfnShape{e, rows, m, h}, x.data(), w1.data(),
                  w2.data(), hid.data(), y.data());
  for (int ex = 0; ex < e; ++ex) {
    std::vector<float> hh(std::size_t(rows) * h), yy(std::size_t(rows) * m);
    cpu::gemm(ctx, DType::kF32, rows, h, m, x.data() + ex * rows * m, w1.data() + ex * m * h,
              hh.data());
    for (float& v : hh) v = std::max(v, 0.0f);
    cpu::gemm(ctx, DType::kF32, rows, m, h, hh.data(), w2.data() + ex * h * m, yy.data());
    for (int i = 0; i < rows * m; ++i) ASSERT_NEAR(y[ex * rows * m + i], yy[i], 1e-4);
  }
}

// Two 2x2 products with a shared right operand (stride 0), exact in every dtype (small integers).
TEST(KernelGemmStridedBatched, SharedWeightsExactInEveryDType) {
  const std::vector<float> a = {1, 2, 3, 4, /* second */ 0, 1, 1, 0};
  const std::vector<float> b = {1, 1, 0, 2};
  const std::vector<float> want = {1, 5, 3, 11, /* second */ 0, 2, 1, 1};
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer ha(d, a), hb(d, b), hc(d, std::vector<float>(8, -7.0f));
    cpu::Context ctx;
    cpu::gemm_strided_batched(ctx, d, 2, 2, 2, ha.data(), 4, hb.data(), 0, hc.data(), 4, 2);
    EXPECT_EQ(hc.to_float(), want);
  }
  cpu::Context ctx;
  float x = 0;
  EXPECT_THROW(cpu::gemm_strided_batched(ctx, DType::kF32, 1, 1, 1, &x, -1, &x, 0, &x, 0, 1),
               ArgumentError);
}

// The backward GEMMs' operands read transposed: A (3 x 2) stored as its 2 x 3 transpose, B (2 x 2)
// as its transpose, C accumulated (beta 1) onto its old value; each entry worked by hand.
TEST(KernelGemmStridedBatchedT, TransposedOperandsAndAccumulationByHand) {
  // op(A) = {{1, 2}, {3, 4}, {5, 6}} stored as {{1, 3, 5}, {2, 4, 6}}; op(B) = {{1, 0}, {1, 2}}
  // stored as {{1, 1}, {0, 2}}. op(A) op(B) = {{3, 4}, {7, 8}, {11, 12}}; C starts at 1.
  const std::vector<float> at = {1, 3, 5, 2, 4, 6}, bt = {1, 1, 0, 2};
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer ha(d, at), hb(d, bt), hc(d, std::vector<float>(6, 1.0f));
    cpu::Context ctx;
    cpu::gemm_strided_batched_t(ctx, d, GemmLayout{true, true}, 3, 2, 2, ha.data(), 0, hb.data(), 0,
                                hc.data(), 0, 1, 1.0f);
    EXPECT_EQ(hc.to_float(), (std::vector<float>{4, 5, 8, 9, 12, 13}));
    // The same with C in fp32 whatever the inputs' dtype (a gradient accumulated in fp32): 1/3
    // is kept to fp32's precision, not the dtype's.
    std::vector<float> c32(6, 1.0f / 3);
    cpu::gemm_strided_batched_t(ctx, d, GemmLayout{true, true, true}, 3, 2, 2, ha.data(), 0,
                                hb.data(), 0, c32.data(), 0, 1, 1.0f);
    EXPECT_EQ(c32, (std::vector<float>{3 + 1.0f / 3, 4 + 1.0f / 3, 7 + 1.0f / 3, 8 + 1.0f / 3,
                                       11 + 1.0f / 3, 12 + 1.0f / 3}));
  }
  // Untransposed with beta 0 is gemm_strided_batched, batch entries included.
  const std::vector<float> a = random_floats(2 * 3 * 4, 7), b = random_floats(4 * 5, 8);
  HostBuffer ha(DType::kF32, a), hb(DType::kF32, b), want(DType::kF32, std::size_t(30)),
      got(DType::kF32, std::vector<float>(30, 9.0f));
  cpu::Context ctx;
  cpu::gemm_strided_batched(ctx, DType::kF32, 3, 5, 4, ha.data(), 12, hb.data(), 0, want.data(), 15,
                            2);
  cpu::gemm_strided_batched_t(ctx, DType::kF32, GemmLayout{}, 3, 5, 4, ha.data(), 12, hb.data(), 0,
                              got.data(), 15, 2, 0.0f);
  EXPECT_EQ(got.to_float(), want.to_float());
  float x = 0;
  EXPECT_THROW(cpu::gemm_strided_batched_t(ctx, DType::kF32, GemmLayout{}, -1, 1, 1, &x, 0, &x, 0,
                                           &x, 0, 1, 0.0f),
               ArgumentError);
}

TEST(KernelReluBackward, PassesTheGradientWhereTheUnitWasActive) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer act(d, std::vector<float>{0, 2, 0, 0.5f}), grad(d, std::vector<float>{1, -3, 5, 7});
    cpu::Context ctx;
    cpu::relu_backward(ctx, d, act.data(), grad.data(), 4);
    EXPECT_EQ(grad.to_float(), (std::vector<float>{0, -3, 0, 7}));
  }
}

// Softmax backward by hand: token 0 has logits {0, ln 3} (p = {1/4, 3/4}), its choice of expert 1
// has dWeight 2, so g = {0, 2}, <p, g> = 3/2, dLogits = {1/4 (0 - 3/2), 3/4 (2 - 3/2)} =
// {-3/8, 3/8}. Token 1 (p = {1/2, 1/2}) chose expert 0 twice over (dWeight 1 and 3: g = {4, 0})
// and a dropped choice that counts nothing: <p, g> = 2, dLogits = {1, -1}. Rows sum to zero.
TEST(KernelSoftmaxBackward, ByHandAndAgainstFiniteDifferences) {
  const float ln3 = std::log(3.0f), ln2 = std::log(2.0f);
  const std::vector<float> logits{0.0f, ln3, ln2, ln2};
  const std::vector<std::int32_t> expert{1, -1, 0, 0};
  const std::vector<float> dweight{2.0f, 5.0f, 1.0f, 3.0f};
  std::vector<float> dl(4, -9.0f);
  cpu::Context ctx;
  cpu::softmax_backward(ctx, 2, 2, 2, logits.data(), expert.data(), dweight.data(), dl.data());
  EXPECT_NEAR(dl[0], -0.375f, 1e-6f);
  EXPECT_NEAR(dl[1], 0.375f, 1e-6f);
  EXPECT_NEAR(dl[2], 1.0f, 1e-6f);
  EXPECT_NEAR(dl[3], -1.0f, 1e-6f);
  // L = sum_c dWeight_c p[expert_c]: its derivative by each logit, by central differences.
  const int E = 5, k = 2;
  const std::vector<float> row = random_floats(E, 11, -2.0f, 2.0f);
  const std::vector<std::int32_t> ex{3, 1};
  const std::vector<float> gw{0.7f, -1.3f};
  std::vector<float> grad(E);
  cpu::softmax_backward(ctx, 1, E, k, row.data(), ex.data(), gw.data(), grad.data());
  auto loss = [&](const std::vector<double>& l) {
    double mx = *std::max_element(l.begin(), l.end()), sum = 0;
    for (double v : l) sum += std::exp(v - mx);
    return gw[0] * std::exp(l[3] - mx) / sum + gw[1] * std::exp(l[1] - mx) / sum;
  };
  for (int j = 0; j < E; ++j) {
    std::vector<double> up(row.begin(), row.end()), down(row.begin(), row.end());
    up[j] += 1e-4;
    down[j] -= 1e-4;
    EXPECT_NEAR(grad[j], (loss(up) - loss(down)) / 2e-4, 1e-5) << "logit " << j;
  }
  const std::vector<std::int32_t> bad{2, 0, 0, 0};
  EXPECT_THROW(
      cpu::softmax_backward(ctx, 2, 2, 2, logits.data(), bad.data(), dweight.data(), dl.data()),
      ArgumentError);
}

// Each row of b dotted with the row of a it names, written where out_index says: by hand.
TEST(KernelDotRows, DotsEachRowWithItsIndexedRowInEveryDType) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer a(d, std::vector<float>{1, 2, 3, 4}), b(d, std::vector<float>{1, 1, 2, 0, 0, 3});
    const std::vector<std::int32_t> a_row{1, 0, 1}, out_index{2, 0, 1};
    std::vector<float> out(4, -1.0f);
    cpu::Context ctx;
    cpu::dot_rows(ctx, d, a.data(), a_row.data(), b.data(), 3, 2, out_index.data(), out.data());
    // b row 0 . a row 1 = 3 + 4 -> out[2]; b row 1 . a row 0 = 2 -> out[0]; b row 2 . a row 1 =
    // 12 -> out[1]; out[3] untouched.
    EXPECT_EQ(out, (std::vector<float>{2, 12, 7, -1}));
  }
}

TEST(KernelActivation, ReluAndGeluInPlace) {
  HostBuffer h(DType::kF32, std::vector<float>{-2, -0.5f, 0, 1.5f});
  cpu::Context ctx;
  cpu::activation(ctx, DType::kF32, Activation::kRelu, h.data(), 4);
  EXPECT_EQ(h.to_float(), (std::vector<float>{0, 0, 0, 1.5f}));
  HostBuffer g(DType::kF32, std::vector<float>{1.0f});
  cpu::activation(ctx, DType::kF32, Activation::kGelu, g.data(), 1);
  // 0.5 (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.841192
  EXPECT_NEAR(g.to_float()[0], 0.841192f, 1e-5f);
}

// Plan-routed combine weights: softmax over all experts, picked at each entry's expert.
TEST(KernelSoftmaxPick, WeighsTheChosenExpertOfEveryEntry) {
  // Token 0: logits {0, ln 3} -> {1/4, 3/4}; token 1: {ln 2, ln 2} -> {1/2, 1/2}.
  const float ln3 = std::log(3.0f), ln2 = std::log(2.0f);
  const std::vector<float> logits{0.0f, ln3, ln2, ln2};
  const std::vector<std::int32_t> expert{1, 0, -1, 1};  // token 1's first choice dropped
  std::vector<float> weight(4, -1.0f);
  cpu::Context ctx;
  cpu::softmax_pick(ctx, 2, 2, 2, logits.data(), expert.data(), weight.data());
  EXPECT_NEAR(weight[0], 0.75f, 1e-7f);
  EXPECT_NEAR(weight[1], 0.25f, 1e-7f);
  EXPECT_EQ(weight[2], 0.0f);
  EXPECT_NEAR(weight[3], 0.5f, 1e-7f);
  const std::vector<std::int32_t> bad{2, 0, 0, 0};
  EXPECT_THROW(cpu::softmax_pick(ctx, 2, 2, 2, logits.data(), bad.data(), weight.data()),
               ArgumentError);
}

TEST(KernelAddRows, SumsStridedRunsInEveryDType) {
  // Two runs of 3: src rows at pitch 4, dst rows at pitch 5; the gaps stay untouched.
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer src(d, std::vector<float>{1, 2, 3, 99, 4, 5, 6, 99});
    HostBuffer dst(d, std::vector<float>{10, 20, 30, 7, 7, 40, 50, 60, 7, 7});
    cpu::Context ctx;
    cpu::add_rows(ctx, d, src.data(), 4, dst.data(), 5, 3, 2);
    EXPECT_EQ(dst.to_float(), (std::vector<float>{11, 22, 33, 7, 7, 44, 55, 66, 7, 7}));
  }
}

TEST(KernelGatherRows, CopiesIndexedRowsAndSkipsNegativeOnes) {
  // Rows of 2: dst row 0 = src row 2, row 1 untouched (-1), row 2 = src row 0, row 3 = src row 2.
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer src(d, std::vector<float>{1, 2, 3, 4, 5, 6});
    HostBuffer dst(d, std::vector<float>{9, 9, 8, 8, 9, 9, 9, 9});
    const std::vector<std::int32_t> index{2, -1, 0, 2};
    cpu::Context ctx;
    cpu::gather_rows(ctx, d, src.data(), index.data(), 4, 2, dst.data());
    EXPECT_EQ(dst.to_float(), (std::vector<float>{5, 6, 8, 8, 1, 2, 5, 6}));
  }
}

TEST(KernelSumRows, AddsEachRowsTableInOrderWithItsWeights) {
  // Rows of 2. dst row 0 += 0.5 * src 1 + 2 * src 0; row 1 has no terms; row 2 += 1 * src 2
  // (weight[3]). Unweighted, the same table adds the rows as they are.
  const std::vector<std::int32_t> begin{0, 2, 2, 3}, src_row{1, 0, 2}, weight_index{0, 1, 3};
  const std::vector<float> weight{0.5f, 2.0f, 7.0f, 1.0f};
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer src(d, std::vector<float>{1, 2, 4, 8, 16, 32});
    HostBuffer dst(d, std::vector<float>{1, 1, 3, 3, 0, 0});
    cpu::Context ctx;
    cpu::sum_rows(ctx, d, src.data(), begin.data(), src_row.data(), weight.data(),
                  weight_index.data(), 3, 2, dst.data());
    EXPECT_EQ(dst.to_float(), (std::vector<float>{1 + 2 + 2, 1 + 4 + 4, 3, 3, 16, 32}));
    HostBuffer plain(d, std::vector<float>{0, 0, 0, 0, 0, 0});
    cpu::sum_rows(ctx, d, src.data(), begin.data(), src_row.data(), nullptr, nullptr, 3, 2,
                  plain.data());
    EXPECT_EQ(plain.to_float(), (std::vector<float>{4 + 1, 8 + 2, 0, 0, 16, 32}));
  }
}

}  // namespace
}  // namespace moesim::kernels
