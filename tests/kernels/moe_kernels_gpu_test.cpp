// CUDA kernels against their CPU twins on random inputs (label gpu). Every test skips cleanly when
// no device is present (no driver, or cudaGetDeviceCount returns 0), so the binary also runs in CI.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/moe_kernels.hpp"
#include "tests/kernels/kernel_test_util.hpp"

namespace moesim::kernels {
namespace {

using testing::HostBuffer;
using testing::HostRouting;
using testing::kAllDTypes;
using testing::random_floats;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// A device copy of a host byte range; copies back on demand.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes ? bytes : 1) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  DeviceBuffer(const void* host, std::size_t bytes) : DeviceBuffer(bytes) {
    if (cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy");
    }
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.data(), v.size() * sizeof(T)) {}
  explicit DeviceBuffer(const HostBuffer& b) : DeviceBuffer(b.data(), b.bytes.size()) {}
  ~DeviceBuffer() { (void)cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  void to_host(void* host) const {
    if (cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) {
      throw std::runtime_error("cudaMemcpy back");
    }
  }
  template <typename T>
  std::vector<T> to_vector() const {
    std::vector<T> v(bytes_ / sizeof(T));
    to_host(v.data());
    return v;
  }
  HostBuffer to_buffer(DType d) const {
    HostBuffer b(d, bytes_ / dtype_size(d));
    to_host(b.data());
    return b;
  }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

// Routing arrays on the device, same sizes as a HostRouting.
struct DeviceRouting {
  int s, k, e, c;
  DeviceBuffer expert, slot, weight, slot_entry, count;
  explicit DeviceRouting(const HostRouting& h)
      : s(h.s),
        k(h.k),
        e(h.e),
        c(h.c),
        expert(h.expert),
        slot(h.slot),
        weight(h.weight),
        slot_entry(h.slot_entry),
        count(h.count) {}
  RoutingOut out() const {
    return RoutingOut{expert.get<std::int32_t>(), slot.get<std::int32_t>(), weight.get<float>(),
                      slot_entry.get<std::int32_t>(), count.get<std::int32_t>()};
  }
  Routing view() const {
    return Routing{s,
                   k,
                   e,
                   c,
                   expert.get<std::int32_t>(),
                   slot.get<std::int32_t>(),
                   weight.get<float>(),
                   slot_entry.get<std::int32_t>()};
  }
};

class KernelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    ctx_ = std::make_unique<cuda::Context>();
  }
  cuda::Context& ctx() { return *ctx_; }
  std::unique_ptr<cuda::Context> ctx_;
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  float abs, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], abs + rel * std::abs(want[i])) << what << " at " << i;
  }
}

GateParams random_params(bool prioritized) {
  GateParams p;
  p.num_tokens = 1500;
  p.model_dim = 64;
  p.num_experts = 16;
  p.top_k = 2;
  p.capacity = 150;  // 3000 entries for 2400 slots: drops on popular experts
  p.batch_prioritized = prioritized;
  return p;
}

// Logits whose top gate values are far apart from token to token. The batch-prioritised order
// sorts tokens by their top softmax value, and expf on the device may differ from the host's exp
// by an ulp; random logits could then put two nearly equal tokens in a different order. Here every
// token has one top expert at 2 + 3 rank / S (rank a random permutation), a second one at 1 and
// zeros elsewhere, so the top values are strictly ordered by rank with gaps far above an ulp.
std::vector<float> separated_logits(const GateParams& p, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> rank(p.num_tokens);
  std::iota(rank.begin(), rank.end(), 0);
  std::shuffle(rank.begin(), rank.end(), gen);
  std::uniform_int_distribution<int> pick(0, p.num_experts - 1);
  std::vector<float> logits(std::size_t(p.num_tokens) * p.num_experts, 0.0f);
  for (int t = 0; t < p.num_tokens; ++t) {
    const int top = pick(gen);
    int second = pick(gen);
    if (second == top) second = (top + 1) % p.num_experts;
    float* row = logits.data() + std::size_t(t) * p.num_experts;
    row[top] = 2.0f + 3.0f * float(rank[t]) / float(p.num_tokens);
    row[second] = 1.0f;
  }
  return logits;
}

// E = 16 (one thread per token) and E = 256, top-8 (one warp per token, topk_warp_kernel; the
// separated logits are zero but for two experts, so choices 3..8 are ties the lower index wins).
TEST_F(KernelGpuTest, GateFromLogitsMatchesCpuExactly) {
  for (auto [experts, top_k] : {std::pair{16, 2}, std::pair{256, 8}}) {
    SCOPED_TRACE("E " + std::to_string(experts) + " top-" + std::to_string(top_k));
    for (bool prioritized : {false, true}) {
      for (bool normalize : {false, true}) {
        GateParams p = random_params(prioritized);
        p.normalize_top_k = normalize;
        p.num_experts = experts;
        p.top_k = top_k;
        p.capacity = 150 * 16 / experts * top_k / 2;  // 80% of the entries: drops
        const std::vector<float> logits =
            prioritized ? separated_logits(p, 31)
                        : random_floats(std::size_t(p.num_tokens) * p.num_experts, 31, -3, 3);
        HostRouting want(p.num_tokens, p.top_k, p.num_experts, p.capacity);
        cpu::Context cctx;
        cpu::gate_from_logits(cctx, p, logits.data(), want.out());
        ASSERT_GT(std::count(want.slot.begin(), want.slot.end(), -1), 0);
        DeviceBuffer dl(logits);
        DeviceRouting got(want);  // allocated with the CPU values, then overwritten
        ASSERT_CUDA(cudaMemset(got.slot.get(), 0x7f, want.slot.size() * 4));
        cuda::gate_from_logits(ctx(), p, dl.get<float>(), got.out());
        ctx().synchronize();
        EXPECT_EQ(got.expert.to_vector<std::int32_t>(), want.expert);
        EXPECT_EQ(got.slot.to_vector<std::int32_t>(), want.slot);
        EXPECT_EQ(got.slot_entry.to_vector<std::int32_t>(), want.slot_entry);
        EXPECT_EQ(got.count.to_vector<std::int32_t>(), want.count);
        expect_close(got.weight.to_vector<float>(), want.weight, 1e-5f, 1e-7f, "weight");
      }
    }
  }
}

TEST_F(KernelGpuTest, NodeLimitedGateMatchesCpuExactly) {
  // The node-limited top-k (rules::route_token with groups) on the device, against the CPU twin:
  // 2,048 tokens, 64 experts on 8 nodes, top-8 from at most 4 (DeepSeek-V3's shape, scaled).
  GateParams p;
  p.num_tokens = 2048;
  p.model_dim = 1;
  p.num_experts = 64;
  p.top_k = 8;
  p.capacity = 200;
  p.experts_per_group = 8;
  p.group_limit = 4;
  const std::vector<float> logits = random_floats(std::size_t(p.num_tokens) * 64, 47, -3, 3);
  HostRouting want(p.num_tokens, p.top_k, p.num_experts, p.capacity);
  cpu::Context cctx;
  cpu::gate_from_logits(cctx, p, logits.data(), want.out());
  DeviceBuffer dl(logits);
  DeviceRouting got(want);
  ASSERT_CUDA(cudaMemset(got.expert.get(), 0x7f, want.expert.size() * 4));
  cuda::gate_from_logits(ctx(), p, dl.get<float>(), got.out());
  ctx().synchronize();
  EXPECT_EQ(got.expert.to_vector<std::int32_t>(), want.expert);
  EXPECT_EQ(got.slot.to_vector<std::int32_t>(), want.slot);
  // 16,384 entries: the capacity passes' 8 tiles of 2,048, with slots left empty.
  EXPECT_EQ(got.slot_entry.to_vector<std::int32_t>(), want.slot_entry);
  EXPECT_EQ(got.count.to_vector<std::int32_t>(), want.count);
  expect_close(got.weight.to_vector<float>(), want.weight, 1e-5f, 1e-7f, "weight");
}

// A gate wider than the capacity histogram's shared memory (16,384 experts > 12,288) and than
// the warp top-k's row buffer: global-atomic histogram, one thread per token; 20 capacity tiles.
TEST_F(KernelGpuTest, VeryWideGateMatchesCpuExactly) {
  GateParams p;
  p.num_tokens = 5000;
  p.model_dim = 1;
  p.num_experts = 16384;
  p.top_k = 8;
  p.capacity = 2;  // 40,000 entries for 32,768 slots: drops on the experts chosen 3+ times
  const std::vector<float> logits = random_floats(std::size_t(p.num_tokens) * p.num_experts, 53);
  HostRouting want(p.num_tokens, p.top_k, p.num_experts, p.capacity);
  cpu::Context cctx;
  cpu::gate_from_logits(cctx, p, logits.data(), want.out());
  ASSERT_GT(std::count(want.slot.begin(), want.slot.end(), -1), 0);
  DeviceBuffer dl(logits);
  DeviceRouting got(want);
  ASSERT_CUDA(cudaMemset(got.slot.get(), 0x7f, want.slot.size() * 4));
  cuda::gate_from_logits(ctx(), p, dl.get<float>(), got.out());
  ctx().synchronize();
  EXPECT_EQ(got.expert.to_vector<std::int32_t>(), want.expert);
  EXPECT_EQ(got.slot.to_vector<std::int32_t>(), want.slot);
  EXPECT_EQ(got.slot_entry.to_vector<std::int32_t>(), want.slot_entry);
  EXPECT_EQ(got.count.to_vector<std::int32_t>(), want.count);
}

TEST_F(KernelGpuTest, GateWithCublasGemmAllDTypes) {
  for (DType d : kAllDTypes) {
    GateParams p = random_params(false);
    const std::vector<float> x = random_floats(std::size_t(p.num_tokens) * p.model_dim, 41);
    const std::vector<float> wg = random_floats(std::size_t(p.model_dim) * p.num_experts, 42);
    HostBuffer xb(d, x), wb(d, wg);
    std::vector<float> logits(std::size_t(p.num_tokens) * p.num_experts);
    HostRouting want(p.num_tokens, p.top_k, p.num_experts, p.capacity);
    cpu::Context cctx;
    cpu::gate(cctx, d, p, xb.data(), wb.data(), logits.data(), want.out());
    DeviceBuffer dx(xb), dw(wb), dlog(logits.size() * 4);
    DeviceRouting got(want);
    cuda::gate(ctx(), d, p, dx.get(), dw.get(), dlog.get<float>(), got.out());
    ctx().synchronize();
    expect_close(dlog.to_vector<float>(), logits, 1e-4f, 1e-5f, dtype_name(d));
    // Summation order differs between cuBLAS and the CPU GEMM, so near-ties may flip a choice:
    // compare the routing that follows from the device logits.
    HostRouting from_dev(p.num_tokens, p.top_k, p.num_experts, p.capacity);
    const std::vector<float> dev_logits = dlog.to_vector<float>();
    cpu::gate_from_logits(cctx, p, dev_logits.data(), from_dev.out());
    EXPECT_EQ(got.expert.to_vector<std::int32_t>(), from_dev.expert) << dtype_name(d);
    EXPECT_EQ(got.slot.to_vector<std::int32_t>(), from_dev.slot) << dtype_name(d);
  }
}

TEST_F(KernelGpuTest, BuildSlotIndexMatchesCpu) {
  GateParams p = random_params(true);
  const std::vector<float> logits =
      random_floats(std::size_t(p.num_tokens) * p.num_experts, 51, -3, 3);
  HostRouting r(p.num_tokens, p.top_k, p.num_experts, p.capacity);
  cpu::Context cctx;
  cpu::gate_from_logits(cctx, p, logits.data(), r.out());
  DeviceRouting d(r);
  ASSERT_CUDA(cudaMemset(d.slot_entry.get(), 0, r.slot_entry.size() * 4));
  cuda::build_slot_index(ctx(), d.view(), d.slot_entry.get<std::int32_t>());
  ctx().synchronize();
  EXPECT_EQ(d.slot_entry.to_vector<std::int32_t>(), r.slot_entry);
}

// Encode / decode and backward passes vs CPU, for a row size that takes the 16-byte path (M = 96)
// and one that does not (M = 35), at top-2, top-3 and top-8 (the combine kernel's register
// sizes: k rounded up to 2, 4 and 8).
TEST_F(KernelGpuTest, EncodeDecodeAndBackwardMatchCpu) {
  for (int top_k : {2, 3, 8}) {
    SCOPED_TRACE("top_k " + std::to_string(top_k));
    GateParams p = random_params(false);
    p.top_k = top_k;
    p.capacity = 75 * top_k;  // 1,500 k entries for 1,200 k slots: drops on popular experts
    const std::vector<float> logits =
        random_floats(std::size_t(p.num_tokens) * p.num_experts, 61, -3, 3);
    HostRouting r(p.num_tokens, p.top_k, p.num_experts, p.capacity);
    cpu::Context cctx;
    cpu::gate_from_logits(cctx, p, logits.data(), r.out());
    DeviceRouting dr(r);
    for (int m : {96, 35}) {
      const std::size_t tokens = std::size_t(r.s) * m, slots = std::size_t(r.e) * r.c * m;
      for (DType d : kAllDTypes) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " M=" + std::to_string(m));
        const float tol = 2 * testing::dtype_eps(d);
        HostBuffer x(d, random_floats(tokens, 62)), z(d, random_floats(slots, 63)),
            gy(d, random_floats(tokens, 64)), gd(d, random_floats(slots, 65));
        DeviceBuffer dx(x), dz(z), dgy(gy), dgd(gd);
        // encode: exact copy.
        HostBuffer disp(d, slots);
        cpu::encode(cctx, d, r.view(), m, x.data(), disp.data());
        DeviceBuffer ddisp(slots * dtype_size(d));
        ASSERT_CUDA(cudaMemset(ddisp.get(), 0x55, slots * dtype_size(d)));
        cuda::encode(ctx(), d, dr.view(), m, dx.get(), ddisp.get());
        // decode, encode backward, decode backward.
        HostBuffer y(d, tokens), gx(d, tokens), gz(d, slots);
        std::vector<float> gw(r.weight.size());
        cpu::decode(cctx, d, r.view(), m, z.data(), y.data());
        cpu::encode_backward(cctx, d, r.view(), m, gd.data(), gx.data());
        cpu::decode_backward(cctx, d, r.view(), m, z.data(), gy.data(), gz.data(), gw.data());
        DeviceBuffer dy(tokens * dtype_size(d)), dgx(tokens * dtype_size(d)),
            dgz(slots * dtype_size(d)), dgw(gw.size() * 4);
        cuda::decode(ctx(), d, dr.view(), m, dz.get(), dy.get());
        cuda::encode_backward(ctx(), d, dr.view(), m, dgd.get(), dgx.get());
        cuda::decode_backward(ctx(), d, dr.view(), m, dz.get(), dgy.get(), dgz.get(),
                              dgw.get<float>());
        ctx().synchronize();
        EXPECT_EQ(ddisp.to_buffer(d).bytes, disp.bytes);
        expect_close(dy.to_buffer(d).to_float(), y.to_float(), tol, 1e-6f, "decode");
        expect_close(dgx.to_buffer(d).to_float(), gx.to_float(), tol, 1e-6f, "encode_backward");
        expect_close(dgz.to_buffer(d).to_float(), gz.to_float(), tol, 1e-6f, "decode_backward");
        // fp32 dot products in a different order: relative to the size of the sum.
        expect_close(dgw.to_vector<float>(), gw, 1e-4f, 1e-4f * m, "grad_weight");
      }
    }
  }
}

TEST_F(KernelGpuTest, StrideCopyMatchesCpuForAlignedAndOddChunks) {
  for (std::size_t chunk : {std::size_t(4096), std::size_t(12), std::size_t(7)}) {
    for (auto [h, w] : {std::pair{4, 2}, std::pair{2, 4}, std::pair{8, 16}}) {
      std::vector<unsigned char> in(chunk * h * w), want(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i * 131 + 7);
      cpu::Context cctx;
      cpu::stride_copy(cctx, in.data(), want.data(), h, w, chunk);
      DeviceBuffer din(in), dout(in.size());
      cuda::stride_copy(ctx(), din.get(), dout.get(), h, w, chunk);
      ctx().synchronize();
      EXPECT_EQ(dout.to_vector<unsigned char>(), want) << chunk << " " << h << "x" << w;
    }
  }
}

TEST_F(KernelGpuTest, GemmAndExpertFfnMatchCpu) {
  const FfnShape shape{4, 40, 64, 96};
  for (DType d : kAllDTypes) {
    for (Activation act : {Activation::kRelu, Activation::kGelu}) {
      SCOPED_TRACE(dtype_name(d));
      const std::size_t nx = std::size_t(shape.num_experts) * shape.rows * shape.model_dim;
      const std::size_t nw = std::size_t(shape.num_experts) * shape.model_dim * shape.hidden_dim;
      const std::size_t nh = std::size_t(shape.num_experts) * shape.rows * shape.hidden_dim;
      HostBuffer x(d, random_floats(nx, 71)), w1(d, random_floats(nw, 72, -0.2f, 0.2f)),
          w2(d, random_floats(nw, 73, -0.2f, 0.2f)), hid(d, nh), y(d, nx);
      cpu::Context cctx;
      cpu::expert_ffn(cctx, d, act, shape, x.data(), w1.data(), w2.data(), hid.data(), y.data());
      DeviceBuffer dx(x), dw1(w1), dw2(w2), dh(nh * dtype_size(d)), dy(nx * dtype_size(d));
      cuda::expert_ffn(ctx(), d, act, shape, dx.get(), dw1.get(), dw2.get(), dh.get(), dy.get());
      ctx().synchronize();
      // Accumulation order differs (cuBLAS vs blocked CPU loop): a few dtype ulps.
      const float tol = 4 * testing::dtype_eps(d) + 1e-5f;
      expect_close(dh.to_buffer(d).to_float(), hid.to_float(), tol, tol, "hidden");
      expect_close(dy.to_buffer(d).to_float(), y.to_float(), tol, 4 * tol, "y");
    }
    // Plain GEMM with alpha / beta.
    const int m = 33, n = 17, k = 50;
    HostBuffer a(d, random_floats(std::size_t(m) * k, 81)),
        b(d, random_floats(std::size_t(k) * n, 82)), c(d, random_floats(std::size_t(m) * n, 83));
    DeviceBuffer da(a), db(b), dc(c);
    cpu::Context cctx;
    cpu::gemm(cctx, d, m, n, k, a.data(), b.data(), c.data(), 0.5f, 2.0f);
    cuda::gemm(ctx(), d, m, n, k, da.get(), db.get(), dc.get(), 0.5f, 2.0f);
    ctx().synchronize();
    expect_close(dc.to_buffer(d).to_float(), c.to_float(), 4 * testing::dtype_eps(d), 1e-4f,
                 "gemm");
  }
}

// The executor's expert GEMM: per local expert, W source blocks against one weight (stride 0),
// cuBLAS strided-batched vs the CPU twin, then ReLU on the device vs the CPU.
TEST_F(KernelGpuTest, GemmStridedBatchedAndActivationMatchCpu) {
  const int m = 24, n = 40, k = 56, batch = 3;
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer a(d, random_floats(std::size_t(batch) * m * k, 91)),
        b(d, random_floats(std::size_t(k) * n, 92, -0.3f, 0.3f)), c(d, std::size_t(batch) * m * n);
    cpu::Context cctx;
    cpu::gemm_strided_batched(cctx, d, m, n, k, a.data(), static_cast<long long>(m) * k, b.data(),
                              0, c.data(), static_cast<long long>(m) * n, batch);
    cpu::activation(cctx, d, Activation::kRelu, c.data(), c.size());
    DeviceBuffer da(a), db(b), dc(std::size_t(batch) * m * n * dtype_size(d));
    cuda::gemm_strided_batched(ctx(), d, m, n, k, da.get(), static_cast<long long>(m) * k, db.get(),
                               0, dc.get(), static_cast<long long>(m) * n, batch);
    cuda::activation(ctx(), d, Activation::kRelu, dc.get(), c.size());
    ctx().synchronize();
    const float tol = 4 * testing::dtype_eps(d) + 1e-5f;
    expect_close(dc.to_buffer(d).to_float(), c.to_float(), tol, tol, "gemm_strided_batched");
  }
}

// The backward GEMMs (every transpose combination, accumulating), the ReLU / softmax backward and
// the row dot products against their CPU twins.
TEST_F(KernelGpuTest, BackwardGemmsReluAndSoftmaxBackwardMatchCpu) {
  const int m = 24, n = 40, k = 56, batch = 3;
  for (DType d : kAllDTypes)
    for (int t = 0; t < 4; ++t) {
      const GemmLayout trans{(t & 1) != 0, (t & 2) != 0};
      SCOPED_TRACE(std::string(dtype_name(d)) + " trans " + std::to_string(t));
      HostBuffer a(d, random_floats(std::size_t(batch) * m * k, 96)),
          b(d, random_floats(std::size_t(batch) * k * n, 97, -0.3f, 0.3f)),
          c(d, random_floats(std::size_t(batch) * m * n, 98));
      DeviceBuffer da(a), db(b), dc(c);
      cpu::Context cctx;
      cpu::gemm_strided_batched_t(cctx, d, trans, m, n, k, a.data(), static_cast<long long>(m) * k,
                                  b.data(), static_cast<long long>(k) * n, c.data(),
                                  static_cast<long long>(m) * n, batch, 1.0f);
      cuda::gemm_strided_batched_t(
          ctx(), d, trans, m, n, k, da.get(), static_cast<long long>(m) * k, db.get(),
          static_cast<long long>(k) * n, dc.get(), static_cast<long long>(m) * n, batch, 1.0f);
      ctx().synchronize();
      const float tol = 4 * testing::dtype_eps(d) + 1e-5f;
      expect_close(dc.to_buffer(d).to_float(), c.to_float(), tol, tol, "gemm_strided_batched_t");
    }
  for (DType d : kAllDTypes) {  // C in fp32 (the parameter gradients' accumulation)
    SCOPED_TRACE(std::string(dtype_name(d)) + " fp32 C");
    HostBuffer a(d, random_floats(std::size_t(k) * m, 105)),
        b(d, random_floats(std::size_t(k) * n, 106));
    std::vector<float> c = random_floats(std::size_t(m) * n, 107);
    DeviceBuffer da(a), db(b), dc(c);
    cpu::Context cctx;
    cpu::gemm_strided_batched_t(cctx, d, GemmLayout{true, false, true}, m, n, k, a.data(), 0,
                                b.data(), 0, c.data(), 0, 1, 1.0f);
    cuda::gemm_strided_batched_t(ctx(), d, GemmLayout{true, false, true}, m, n, k, da.get(), 0,
                                 db.get(), 0, dc.get(), 0, 1, 1.0f);
    ctx().synchronize();
    expect_close(dc.to_vector<float>(), c, 1e-5f, 1e-5f, "gemm_strided_batched_t fp32 C");
  }
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer act(d, random_floats(1000, 99)), grad(d, random_floats(1000, 100));
    DeviceBuffer dact(act), dgrad(grad);
    cpu::Context cctx;
    cpu::relu_backward(cctx, d, act.data(), grad.data(), 1000);
    cuda::relu_backward(ctx(), d, dact.get(), dgrad.get(), 1000);
    ctx().synchronize();
    expect_close(dgrad.to_buffer(d).to_float(), grad.to_float(), 0.0f, 0.0f, "relu_backward");
  }
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    const int rows = 300;
    const std::size_t elems = 70;
    HostBuffer a(d, random_floats(50 * elems, 103)), b(d, random_floats(rows * elems, 104));
    std::vector<std::int32_t> a_row(rows), out_index(rows);
    for (int i = 0; i < rows; ++i) {
      a_row[static_cast<std::size_t>(i)] = (i * 7) % 50;
      out_index[static_cast<std::size_t>(i)] = rows - 1 - i;
    }
    std::vector<float> want(rows);
    cpu::Context cctx;
    cpu::dot_rows(cctx, d, a.data(), a_row.data(), b.data(), rows, elems, out_index.data(),
                  want.data());
    DeviceBuffer da(a), db(b), dr(a_row), di(out_index), dout(want.size() * sizeof(float));
    cuda::dot_rows(ctx(), d, da.get(), static_cast<const std::int32_t*>(dr.get()), db.get(), rows,
                   elems, static_cast<const std::int32_t*>(di.get()),
                   static_cast<float*>(dout.get()));
    ctx().synchronize();
    expect_close(dout.to_vector<float>(), want, 0.0f, 0.0f, "dot_rows");
  }
  const int tokens = 37, experts = 24, top_k = 3;
  const std::vector<float> logits = random_floats(std::size_t(tokens) * experts, 101, -4.0f, 4.0f);
  const std::vector<float> gw = random_floats(std::size_t(tokens) * top_k, 102);
  std::vector<std::int32_t> expert(std::size_t(tokens) * top_k);
  for (std::size_t i = 0; i < expert.size(); ++i)
    expert[i] = i % 7 == 0 ? -1 : static_cast<std::int32_t>((i * 5) % experts);
  std::vector<float> want(std::size_t(tokens) * experts);
  cpu::Context cctx;
  cpu::softmax_backward(cctx, tokens, experts, top_k, logits.data(), expert.data(), gw.data(),
                        want.data());
  DeviceBuffer dl(logits), de(expert), dg(gw), dout(want.size() * sizeof(float));
  cuda::softmax_backward(ctx(), tokens, experts, top_k, static_cast<const float*>(dl.get()),
                         static_cast<const std::int32_t*>(de.get()),
                         static_cast<const float*>(dg.get()), static_cast<float*>(dout.get()));
  ctx().synchronize();
  expect_close(dout.to_vector<float>(), want, 1e-6f, 1e-6f, "softmax_backward");
}

// The plan-routed layers' combine weights and Parm's / sharded experts' sums of returned rows:
// the device against the CPU twin (both call rules::softmax_prob; add_rows sums in fp32).
TEST_F(KernelGpuTest, SoftmaxPickAndAddRowsMatchCpu) {
  const int tokens = 37, experts = 24, k = 3;
  const std::vector<float> logits = random_floats(std::size_t(tokens) * experts, 93, -4.0f, 4.0f);
  std::vector<std::int32_t> expert(std::size_t(tokens) * k);
  for (std::size_t i = 0; i < expert.size(); ++i)
    expert[i] = i % 7 == 0 ? -1 : static_cast<std::int32_t>((i * 5) % experts);
  std::vector<float> want(expert.size());
  cpu::Context cctx;
  cpu::softmax_pick(cctx, tokens, experts, k, logits.data(), expert.data(), want.data());
  DeviceBuffer dl(logits), de(expert), dw(want.size() * sizeof(float));
  cuda::softmax_pick(ctx(), tokens, experts, k, static_cast<const float*>(dl.get()),
                     static_cast<const std::int32_t*>(de.get()), static_cast<float*>(dw.get()));
  ctx().synchronize();
  expect_close(dw.to_vector<float>(), want, 1e-6f, 1e-6f, "softmax_pick");
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    const std::size_t run = 300, rows = 5;
    HostBuffer src(d, random_floats(rows * 320, 94)), dst(d, random_floats(rows * 400, 95));
    HostBuffer host = dst;
    cpu::add_rows(cctx, d, src.data(), 320, host.data(), 400, run, static_cast<int>(rows));
    DeviceBuffer ds(src), dd(dst);
    cuda::add_rows(ctx(), d, ds.get(), 320, dd.get(), 400, run, static_cast<int>(rows));
    ctx().synchronize();
    expect_close(dd.to_buffer(d).to_float(), host.to_float(), 0.0f, 0.0f, "add_rows");
  }
}

// The row gather and the CSR row sum of the DeepEP-style data path (exec/deepep_path.hpp) against
// the CPU twin: random indices (some -1), random tables with repeated sources, weighted and not.
// Both sum in fp32 in table order with unfused products (rules::mul_add): equal results.
TEST_F(KernelGpuTest, GatherAndSumRowsMatchCpu) {
  const int src_rows = 23, rows = 31;
  const std::size_t elems = 300;
  std::vector<std::int32_t> index(rows), begin{0}, src_row, weight_index;
  for (int i = 0; i < rows; ++i) {
    index[static_cast<std::size_t>(i)] = i % 5 == 0 ? -1 : (i * 7) % src_rows;
    for (int t = 0; t < i % 4; ++t) {
      src_row.push_back((i * 3 + t * 11) % src_rows);
      weight_index.push_back((i + t) % 9);
    }
    begin.push_back(static_cast<std::int32_t>(src_row.size()));
  }
  const std::vector<float> weight = random_floats(9, 96, -1.0f, 1.0f);
  cpu::Context cctx;
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    HostBuffer src(d, random_floats(src_rows * elems, 97)), dst(d, random_floats(rows * elems, 98));
    HostBuffer gathered = dst, summed = dst, plain = dst;
    cpu::gather_rows(cctx, d, src.data(), index.data(), rows, elems, gathered.data());
    cpu::sum_rows(cctx, d, src.data(), begin.data(), src_row.data(), weight.data(),
                  weight_index.data(), rows, elems, summed.data());
    cpu::sum_rows(cctx, d, src.data(), begin.data(), src_row.data(), nullptr, nullptr, rows, elems,
                  plain.data());
    DeviceBuffer ds(src), di(index), db(begin), dr(src_row), dw(weight), dwi(weight_index);
    DeviceBuffer dg(dst), dsum(dst), dplain(dst);
    const auto i32 = [](const DeviceBuffer& b) {
      return static_cast<const std::int32_t*>(b.get());
    };
    cuda::gather_rows(ctx(), d, ds.get(), i32(di), rows, elems, dg.get());
    cuda::sum_rows(ctx(), d, ds.get(), i32(db), i32(dr), static_cast<const float*>(dw.get()),
                   i32(dwi), rows, elems, dsum.get());
    cuda::sum_rows(ctx(), d, ds.get(), i32(db), i32(dr), nullptr, nullptr, rows, elems,
                   dplain.get());
    ctx().synchronize();
    expect_close(dg.to_buffer(d).to_float(), gathered.to_float(), 0.0f, 0.0f, "gather_rows");
    expect_close(dsum.to_buffer(d).to_float(), summed.to_float(), 0.0f, 0.0f, "sum_rows");
    expect_close(dplain.to_buffer(d).to_float(), plain.to_float(), 0.0f, 0.0f, "sum_rows plain");
  }
}

TEST_F(KernelGpuTest, NoTokensLeavesEverySlotEmpty) {
  GateParams p = random_params(false);
  p.num_tokens = 0;
  HostRouting h(0, p.top_k, p.num_experts, p.capacity);
  std::fill(h.slot_entry.begin(), h.slot_entry.end(), 3);
  std::fill(h.count.begin(), h.count.end(), 3);
  DeviceRouting d(h);
  cuda::gate_from_logits(ctx(), p, nullptr, d.out());
  const std::size_t bytes = std::size_t(p.num_experts) * p.capacity * 8 * 4;
  DeviceBuffer disp(bytes);
  ASSERT_CUDA(cudaMemset(disp.get(), 0x55, bytes));
  cuda::encode(ctx(), DType::kF32, d.view(), 8, nullptr, disp.get());
  ctx().synchronize();
  EXPECT_THAT(d.slot_entry.to_vector<std::int32_t>(), ::testing::Each(-1));
  EXPECT_THAT(d.count.to_vector<std::int32_t>(), ::testing::Each(0));
  EXPECT_THAT(disp.to_vector<float>(), ::testing::Each(0.0f));
}

// The probe reports what the runtime reports (0 when the runtime cannot start: no driver, no
// device), and where there is a device its query leaves no error behind: the last device it
// counts can be selected right after.
TEST(KernelGpuProbe, DeviceCountMatchesTheRuntime) {
  EXPECT_TRUE(kCudaCompiled);
  int runtime = 0;
  if (cudaGetDeviceCount(&runtime) != cudaSuccess) {
    (void)cudaGetLastError();
    runtime = 0;
  }
  const int count = cuda_device_count();
  EXPECT_EQ(count, runtime);
  if (count > 0) {
    EXPECT_EQ(cudaSetDevice(count - 1), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }
}

}  // namespace
}  // namespace moesim::kernels
