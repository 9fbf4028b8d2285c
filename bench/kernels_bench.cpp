// kernels_bench: the MoE kernels at training sizes (docs/design.md §4.2).
//   CUDA (a device present): encode / decode and their backward passes at S = 16,384 tokens,
//     M = 4,096, fp16 and bf16, as achieved HBM GB/s and % of --hbm-gbs (H200: 4,800 GB/s), next to
//     a device-to-device cudaMemcpy of the same bytes; the 2DH stride copy; the expert FFN GEMMs
//     in TFLOP/s against one plain cuBLAS GEMM of the same total shape (the "cuBLAS peak for the
//     shape") and against --peak-tflops.
//   CPU (no device, or --cpu): the reference twins at the same S and a smaller M (--cpu-model-dim)
//     in GB/s, and the blocked reference GEMM in GFLOP/s.
// Every figure is the median of --reps timed runs (each run averages --iters launches on the GPU).
//
//   kernels_bench [--tokens 16384] [--model-dim 4096] [--experts 64] [--top-k 2] [--reps 5]
//                 [--iters 20] [--gpu h200-sxm] [--hbm-gbs GBS] [--peak-tflops TF] [--cpu]
//                 [--cpu-model-dim 1024] [--threads N]
// --gpu takes the HBM bandwidth and the dense fp16 tensor peak the percentages are of from the GPU
// catalog (topology/gpu_catalog.hpp; h200-sxm: 4,800 GB/s, 989.5 TFLOP/s); --hbm-gbs and
// --peak-tflops override them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/moe_kernels.hpp"
#include "topology/gpu_catalog.hpp"

#if MOESIM_KERNELS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace moesim::kernels;
using Clock = std::chrono::steady_clock;

struct Options {
  int tokens = 16384;
  int model_dim = 4096;
  int experts = 64;
  int top_k = 2;
  int reps = 5;
  int iters = 20;
  std::string gpu = "h200-sxm";
  double hbm_gbs = 0;      // 0: from the catalog entry of `gpu`
  double peak_tflops = 0;  // 0: from the catalog entry of `gpu`
  bool cpu = false;
  int cpu_model_dim = 1024;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        fmt::print(stderr, "kernels_bench: {} needs a value\n", a);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens")
      o.tokens = std::atoi(next());
    else if (a == "--model-dim")
      o.model_dim = std::atoi(next());
    else if (a == "--experts")
      o.experts = std::atoi(next());
    else if (a == "--top-k")
      o.top_k = std::atoi(next());
    else if (a == "--reps")
      o.reps = std::max(1, std::atoi(next()));
    else if (a == "--iters")
      o.iters = std::max(1, std::atoi(next()));
    else if (a == "--gpu")
      o.gpu = next();
    else if (a == "--hbm-gbs")
      o.hbm_gbs = std::atof(next());
    else if (a == "--peak-tflops")
      o.peak_tflops = std::atof(next());
    else if (a == "--cpu")
      o.cpu = true;
    else if (a == "--cpu-model-dim")
      o.cpu_model_dim = std::atoi(next());
    else if (a == "--threads")
      o.threads = std::max(1, std::atoi(next()));
    else {
      fmt::print(stderr, "kernels_bench: unknown option {}\n", a);
      std::exit(2);
    }
  }
  const moesim::GpuSpec* spec = moesim::topology::find_gpu(o.gpu);
  if (!spec) {
    fmt::print(stderr, "kernels_bench: --gpu: '{}' is not in the GPU catalog\n", o.gpu);
    std::exit(2);
  }
  if (o.hbm_gbs <= 0) o.hbm_gbs = spec->hbm_bandwidth.value() / 1e9;
  if (o.peak_tflops <= 0) {
    auto it = spec->peak.find(moesim::Dtype::kFp16);
    o.peak_tflops = it == spec->peak.end() ? 0 : it->second.value() / 1e12;
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// A host routing for S tokens with capacity factor 1 (C = k S / E), from random logits.
struct HostRouting {
  int s, k, e, c;
  std::vector<std::int32_t> expert, slot, slot_entry, count;
  std::vector<float> weight;
  long long kept = 0;
  HostRouting(int s_, int k_, int e_)
      : s(s_),
        k(k_),
        e(e_),
        c(std::max(1, k_ * s_ / e_)),
        expert(std::size_t(s_) * k_),
        slot(expert.size()),
        slot_entry(std::size_t(e_) * c),
        count(e_),
        weight(expert.size()) {
    GateParams p;
    p.num_tokens = s;
    p.num_experts = e;
    p.top_k = k;
    p.capacity = c;
    const std::vector<float> logits = random_floats(std::size_t(s) * e, 1);
    cpu::Context ctx;
    cpu::gate_from_logits(
        ctx, p, logits.data(),
        RoutingOut{expert.data(), slot.data(), weight.data(), slot_entry.data(), count.data()});
    for (int n : count) kept += n;
  }
  Routing view(const std::int32_t* ex, const std::int32_t* sl, const float* w,
               const std::int32_t* se) const {
    return Routing{s, k, e, c, ex, sl, w, se};
  }
};

// Bytes each kernel moves through memory (reads + writes of activations; routing tables ignored).
struct Traffic {
  double encode, decode, encode_bwd, decode_bwd;
};
Traffic traffic(const HostRouting& r, int m, std::size_t es) {
  const double row = double(m) * es;
  const double slots = double(r.e) * r.c;
  return Traffic{
      (r.kept + slots) * row,                    // read kept tokens, write every slot row
      (r.kept + r.s) * row,                      // read kept slot rows, write every token row
      (r.kept + r.s) * row,                      // gather: same as decode
      (r.kept + slots) * row + 2 * r.kept * row  // scatter + the grad-weight dot products
  };
}

void print_row(const char* what, const char* dtype, double seconds, double bytes, double peak_gbs) {
  const double gbs = bytes / seconds / 1e9;
  if (peak_gbs > 0) {
    fmt::print("  {:<18} {:<5} {:>9.1f} us {:>9.1f} GB/s {:>6.1f}% of HBM\n", what, dtype,
               seconds * 1e6, gbs, 100 * gbs / peak_gbs);
  } else {
    fmt::print("  {:<18} {:<5} {:>9.1f} us {:>9.2f} GB/s\n", what, dtype, seconds * 1e6, gbs);
  }
}

// --- CPU ---------------------------------------------------------------------------------------

double time_cpu(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(t);
}

void run_cpu(const Options& o) {
  const int m = o.cpu_model_dim;
  fmt::print("CPU reference kernels: S={} M={} E={} k={} (median of {} runs)\n", o.tokens, m,
             o.experts, o.top_k, o.reps);
  const HostRouting r(o.tokens, o.top_k, o.experts);
  const Routing view = r.view(r.expert.data(), r.slot.data(), r.weight.data(), r.slot_entry.data());
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    const std::size_t es = dtype_size(d);
    std::vector<std::byte> x(std::size_t(r.s) * m * es), disp(std::size_t(r.e) * r.c * m * es),
        y(x.size()), gdisp(disp.size());
    const std::vector<float> xf = random_floats(std::size_t(r.s) * m, 2);
    convert(DType::kF32, xf.data(), d, x.data(), xf.size());
    std::vector<float> gw(r.expert.size());
    cpu::Context ctx(o.threads);
    const Traffic tr = traffic(r, m, es);
    print_row("encode", dtype_name(d),
              time_cpu(o.reps, [&] { cpu::encode(ctx, d, view, m, x.data(), disp.data()); }),
              tr.encode, 0);
    print_row("decode", dtype_name(d),
              time_cpu(o.reps, [&] { cpu::decode(ctx, d, view, m, disp.data(), y.data()); }),
              tr.decode, 0);
    print_row(
        "encode_backward", dtype_name(d),
        time_cpu(o.reps, [&] { cpu::encode_backward(ctx, d, view, m, disp.data(), y.data()); }),
        tr.encode_bwd, 0);
    print_row("decode_backward", dtype_name(d),
              time_cpu(o.reps,
                       [&] {
                         cpu::decode_backward(ctx, d, view, m, disp.data(), x.data(), gdisp.data(),
                                              gw.data());
                       }),
              tr.decode_bwd, 0);
  }
  // Reference GEMM (expert FFN first GEMM shape, scaled down).
  const int rows = 256, mm = 1024, h = 4096;
  const std::vector<float> a = random_floats(std::size_t(rows) * mm, 3);
  const std::vector<float> b = random_floats(std::size_t(mm) * h, 4);
  std::vector<float> c(std::size_t(rows) * h);
  for (int threads : {1, o.threads}) {
    cpu::Context ctx(threads);
    const double t = time_cpu(
        o.reps, [&] { cpu::gemm(ctx, DType::kF32, rows, h, mm, a.data(), b.data(), c.data()); });
    fmt::print("  gemm fp32 {}x{}x{} threads={}: {:.1f} ms, {:.2f} GFLOP/s\n", rows, h, mm, threads,
               t * 1e3, 2.0 * rows * h * mm / t / 1e9);
    if (o.threads == 1) break;
  }
}

// --- CUDA --------------------------------------------------------------------------------------

#if MOESIM_KERNELS_HAVE_CUDA

#define BENCH_CUDA(expr)                                                                   \
  do {                                                                                     \
    const cudaError_t e_ = (expr);                                                         \
    if (e_ != cudaSuccess) {                                                               \
      fmt::print(stderr, "kernels_bench: {} failed: {}\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

struct DevMem {
  void* p = nullptr;
  explicit DevMem(std::size_t bytes) {
    BENCH_CUDA(cudaMalloc(&p, std::max<std::size_t>(bytes, 1)));
  }
  template <typename T>
  explicit DevMem(const std::vector<T>& v) : DevMem(v.size() * sizeof(T)) {
    BENCH_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DevMem() { (void)cudaFree(p); }
  DevMem(const DevMem&) = delete;
  DevMem& operator=(const DevMem&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p);
  }
};

// Median over reps of the mean time per launch of `iters` launches (CUDA events on the stream).
double time_gpu(const Options& o, cuda::Context& ctx, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  fn();  // warm-up (cuBLAS heuristics, workspace growth)
  ctx.synchronize();
  std::vector<double> t;
  for (int rep = 0; rep < o.reps; ++rep) {
    BENCH_CUDA(cudaEventRecord(start, ctx.stream()));
    for (int i = 0; i < o.iters; ++i) fn();
    BENCH_CUDA(cudaEventRecord(stop, ctx.stream()));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(ms * 1e-3 / o.iters);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return median(t);
}

void run_cuda(const Options& o) {
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cuda::Context ctx(0);
  const int m = o.model_dim;
  fmt::print("CUDA kernels on {}: S={} M={} E={} k={} (median of {} runs x {} launches)\n",
             prop.name, o.tokens, m, o.experts, o.top_k, o.reps, o.iters);
  const HostRouting r(o.tokens, o.top_k, o.experts);
  fmt::print("  capacity C={} (f=1), kept entries {} of {}\n", r.c, r.kept, std::size_t(r.s) * r.k);
  DevMem dex(r.expert), dsl(r.slot), dw(r.weight), dse(r.slot_entry);
  const Routing view = r.view(dex.get<std::int32_t>(), dsl.get<std::int32_t>(), dw.get<float>(),
                              dse.get<std::int32_t>());
  DevMem dgw(r.weight.size() * 4);
  for (DType d : {DType::kF16, DType::kBF16}) {
    const std::size_t es = dtype_size(d);
    const std::size_t token_bytes = std::size_t(r.s) * m * es;
    const std::size_t slot_bytes = std::size_t(r.e) * r.c * m * es;
    DevMem x(token_bytes), y(token_bytes), disp(slot_bytes), gdisp(slot_bytes);
    BENCH_CUDA(cudaMemset(x.get(), 0x3c, token_bytes));
    BENCH_CUDA(cudaMemset(disp.get(), 0x3c, slot_bytes));
    const Traffic tr = traffic(r, m, es);
    const double copy = time_gpu(o, ctx, [&] {
      BENCH_CUDA(cudaMemcpyAsync(disp.get(), gdisp.get(), slot_bytes, cudaMemcpyDeviceToDevice,
                                 ctx.stream()));
    });
    print_row("cudaMemcpy D2D", dtype_name(d), copy, 2.0 * slot_bytes, o.hbm_gbs);
    print_row("encode", dtype_name(d),
              time_gpu(o, ctx, [&] { cuda::encode(ctx, d, view, m, x.get(), disp.get()); }),
              tr.encode, o.hbm_gbs);
    print_row("decode", dtype_name(d),
              time_gpu(o, ctx, [&] { cuda::decode(ctx, d, view, m, disp.get(), y.get()); }),
              tr.decode, o.hbm_gbs);
    print_row(
        "encode_backward", dtype_name(d),
        time_gpu(o, ctx, [&] { cuda::encode_backward(ctx, d, view, m, disp.get(), y.get()); }),
        tr.encode_bwd, o.hbm_gbs);
    print_row("decode_backward", dtype_name(d),
              time_gpu(o, ctx,
                       [&] {
                         cuda::decode_backward(ctx, d, view, m, disp.get(), x.get(), gdisp.get(),
                                               dgw.get<float>());
                       }),
              tr.decode_bwd, o.hbm_gbs);
  }
  {  // The gate after its GEMM: top-k on S x E fp32 logits, then capacity slots in priority order
     // (choice level, token order; and batch-prioritised: sorted by top probability first) and
     // the slot index. Latency-bound rather than HBM-bound: shown in us and tokens per us.
    const std::vector<float> logits = random_floats(std::size_t(r.s) * r.e, 1);
    DevMem dl(logits), gex(r.expert.size() * 4), gsl(r.slot.size() * 4), gw(r.weight.size() * 4),
        gse(r.slot_entry.size() * 4), gcount(r.count.size() * 4);
    const RoutingOut out{gex.get<std::int32_t>(), gsl.get<std::int32_t>(), gw.get<float>(),
                         gse.get<std::int32_t>(), gcount.get<std::int32_t>()};
    for (bool prioritized : {false, true}) {
      GateParams p;
      p.num_tokens = r.s;
      p.num_experts = r.e;
      p.top_k = r.k;
      p.capacity = r.c;
      p.batch_prioritized = prioritized;
      const double t =
          time_gpu(o, ctx, [&] { cuda::gate_from_logits(ctx, p, dl.get<float>(), out); });
      fmt::print("  {:<18} {:<5} {:>9.1f} us {:>9.1f} tokens/us\n",
                 prioritized ? "gate (prioritized)" : "gate (top-k+slots)", "fp32", t * 1e6,
                 r.s / (t * 1e6));
    }
  }
  {  // 2DH stride copy of the dispatched fp16 buffer, T(h = 8, w = 4) (4 nodes x 8 GPUs).
    const std::size_t bytes = std::size_t(r.e) * r.c * m * 2;
    DevMem a(bytes), b(bytes);
    const std::size_t chunk = bytes / 32;
    print_row("stride_copy 8x4", "bytes",
              time_gpu(o, ctx, [&] { cuda::stride_copy(ctx, a.get(), b.get(), 8, 4, chunk); }),
              2.0 * chunk * 32, o.hbm_gbs);
  }
  // Expert FFN GEMMs: 4 local experts of C = 2,048 rows, M = 4,096, H = 16,384 (fp16 / bf16).
  const FfnShape shape{4, 2048, 4096, 16384};
  const double flops =
      4.0 * shape.num_experts * shape.rows * double(shape.model_dim) * shape.hidden_dim;
  for (DType d : {DType::kF16, DType::kBF16}) {
    const std::size_t es = dtype_size(d);
    const std::size_t nx = std::size_t(shape.num_experts) * shape.rows * shape.model_dim;
    const std::size_t nw = std::size_t(shape.num_experts) * shape.model_dim * shape.hidden_dim;
    const std::size_t nh = std::size_t(shape.num_experts) * shape.rows * shape.hidden_dim;
    DevMem x(nx * es), w1(nw * es), w2(nw * es), h(nh * es), y(nx * es);
    // Small non-zero values (bytes 0x20: fp16 ~0.008, bf16 ~1e-19): all-zero operands would run
    // the tensor cores at unrealistically low power, and larger ones overflow fp16 at H = 16,384.
    BENCH_CUDA(cudaMemset(x.get(), 0x20, nx * es));
    BENCH_CUDA(cudaMemset(w1.get(), 0x20, nw * es));
    BENCH_CUDA(cudaMemset(w2.get(), 0x20, nw * es));
    const double t_ffn = time_gpu(o, ctx, [&] {
      cuda::expert_ffn(ctx, d, Activation::kGelu, shape, x.get(), w1.get(), w2.get(), h.get(),
                       y.get());
    });
    // Reference: the same FLOPs as two plain (E*rows) x M x H and (E*rows) x H x M GEMMs.
    const int rows_all = shape.num_experts * shape.rows;
    const double t_ref = time_gpu(o, ctx, [&] {
      cuda::gemm(ctx, d, rows_all, shape.hidden_dim, shape.model_dim, x.get(), w1.get(), h.get());
      cuda::gemm(ctx, d, rows_all, shape.model_dim, shape.hidden_dim, h.get(), w2.get(), y.get());
    });
    const double tf_ffn = flops / t_ffn / 1e12, tf_ref = flops / t_ref / 1e12;
    fmt::print(
        "  expert_ffn {} E={} rows={} M={} H={} gelu: {:.3f} ms {:.1f} TFLOP/s = {:.1f}% of "
        "cuBLAS for the shape ({:.1f} TFLOP/s), {:.1f}% of {:.0f} peak\n",
        dtype_name(d), shape.num_experts, shape.rows, shape.model_dim, shape.hidden_dim,
        t_ffn * 1e3, tf_ffn, 100 * tf_ffn / tf_ref, tf_ref, 100 * tf_ffn / o.peak_tflops,
        o.peak_tflops);
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
#if MOESIM_KERNELS_HAVE_CUDA
  if (!o.cpu && cuda_device_count() > 0) {
    run_cuda(o);
    return 0;
  }
  if (!o.cpu) fmt::print("no CUDA device: running the CPU reference kernels\n");
#else
  if (!o.cpu) fmt::print("built without CUDA: running the CPU reference kernels\n");
#endif
  run_cpu(o);
  return 0;
}
