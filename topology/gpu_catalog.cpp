#include "topology/gpu_catalog.hpp"

#include <array>

#include "core/error.hpp"

namespace moesim::topology {

namespace {

constexpr double kTera = 1e12;
constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

GpuSpec make(std::string name, double fp32_tflops, double tf32_tflops, double fp16_tflops,
             double bf16_tflops, double fp8_tflops, double hbm_gbps, double memory_gib,
             double nvlink_gbps, double pcie_gbps, int sms, double l2_mib) {
  GpuSpec g;
  g.name = std::move(name);
  g.from_catalog = true;
  // A zero means "not supported by this GPU's tensor cores": such dtypes are left out of the map,
  // so asking for them is an error rather than a silent zero rate.
  const std::array<std::pair<Dtype, double>, 5> peaks = {{{Dtype::kFp32, fp32_tflops},
                                                          {Dtype::kTf32, tf32_tflops},
                                                          {Dtype::kFp16, fp16_tflops},
                                                          {Dtype::kBf16, bf16_tflops},
                                                          {Dtype::kFp8, fp8_tflops}}};
  for (const auto& [dtype, tflops] : peaks) {
    if (tflops > 0) g.peak[dtype] = FlopsPerSecond(tflops * kTera);
  }
  g.hbm_bandwidth = BytesPerSecond(hbm_gbps * kGB);
  // Capacities on spec sheets ("80GB") are binary sizes: nvidia-smi shows 81920 MiB for 80GB.
  g.memory = Bytes(memory_gib * kGiB);
  g.nvlink_bandwidth = BytesPerSecond(nvlink_gbps * kGB);
  g.pcie_bandwidth = BytesPerSecond(pcie_gbps * kGB);
  g.sms = sms;
  g.l2_cache = Bytes(l2_mib * 1024.0 * 1024.0);
  return g;
}

// Spec sheets quote NVLink and PCIe as bidirectional totals ("600 GB/s NVLink", "PCIe Gen4
// 64 GB/s"); the catalog stores one direction, i.e. half of that. Peaks are dense: where the
// sheet lists only the with-sparsity figure (marked *), the dense peak is half of it. The last
// figure is the SM count: the architecture whitepapers' (A100 108, H100 SXM5 132, Turing
// TU102 as in the 2080 Ti 68, Ada AD102 as in the 4090 128); H800 and H200 are GH100 SXM parts
// with H100's 132 (DeepSeek-V3 report, section 3.2.2: "132 SMs" on H800); B200 and GB200's
// GPUs 148, as the CUDA device query reports them. After it the L2 cache in MiB (the device
// query's binary size): A100 40 (A100 whitepaper), GH100 parts 50 (H100 whitepaper; H800 and
// H200 are GH100 SXM), B200 126 over its two dies (Chips and Cheese's B200 measurement, 2025),
// TU102 as in the 2080 Ti 5.5 and AD102 as in the 4090 72 (the whitepapers' Appendix A).
const std::vector<GpuSpec>& catalog() {
  static const std::vector<GpuSpec> entries = {
      // NVIDIA A100 Tensor Core GPU datasheet (2021), A100 80GB SXM column: FP32 19.5, TF32 156,
      // BF16/FP16 312 TFLOPS dense; HBM2e 2,039 GB/s; 80GB; NVLink 600 GB/s; PCIe Gen4 64 GB/s.
      make("a100-sxm-80gb", 19.5, 156, 312, 312, 0, 2039, 80, 300, 32, 108, 40),
      // Same datasheet, A100 40GB SXM column: same compute; HBM2 1,555 GB/s; 40GB.
      make("a100-sxm-40gb", 19.5, 156, 312, 312, 0, 1555, 40, 300, 32, 108, 40),
      // NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column: FP32 67; TF32 989*, BF16/FP16
      // 1,979*, FP8 3,958* (with sparsity); HBM3 3.35 TB/s; 80GB; NVLink 900 GB/s; PCIe Gen5
      // 128 GB/s.
      make("h100-sxm", 67, 494.5, 989.5, 989.5, 1979, 3350, 80, 450, 64, 132, 50),
      // NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: compute as H100 SXM; HBM3e
      // 4.8 TB/s; 141GB; NVLink 900 GB/s; PCIe Gen5 128 GB/s.
      make("h200-sxm", 67, 494.5, 989.5, 989.5, 1979, 4800, 141, 450, 64, 132, 50),
      // H800 SXM (the H100 SXM for the Chinese market; DeepSeek-V3's cluster): compute, HBM3
      // and memory as H100 SXM; NVLink cut to 400 GB/s (8 links instead of 18).
      make("h800-sxm", 67, 494.5, 989.5, 989.5, 1979, 3350, 80, 200, 64, 132, 50),
      // NVIDIA DGX B200 datasheet (8 x B200, 1,000 W each): FP8 72 PFLOPS* per system, i.e.
      // 9,000* per GPU: dense FP8 4,500, FP16/BF16 2,250, TF32 1,100; FP32 80 TFLOPS;
      // 1,440 GB HBM3e and 64 TB/s per system: 180GB and 8 TB/s per GPU; NVLink 5 1.8 TB/s;
      // PCIe Gen5 x16 to the host and NICs.
      make("b200", 80, 1100, 2250, 2250, 4500, 8000, 180, 900, 64, 148, 126),
      // NVIDIA GB200 NVL72 datasheet (72 x B200 at 1,200 W, per GPU = rack / 72): FP8 720
      // PFLOPS* -> 5,000 dense; FP16/BF16 360* -> 2,500; TF32 180* -> 1,250; FP32 90 (the
      // 1,200 W part); 13.4 TB HBM3e, 576 TB/s -> 186GB and 8 TB/s; NVLink 5 1.8 TB/s. The NICs
      // hang off PCIe Gen6 x16 (ConnectX-8): 256 GB/s bidirectional.
      make("gb200", 90, 1250, 2500, 2500, 5000, 8000, 186, 900, 128, 148, 126),
      // NVIDIA Turing GPU Architecture whitepaper, Appendix A, GeForce RTX 2080 Ti (reference
      // 1545 MHz boost): FP32 13.4; FP16 tensor with FP32 accumulate 53.8 TFLOPS (no TF32, BF16
      // or FP8); GDDR6 616 GB/s; 11GB; NVLink bridge 2 links, 100 GB/s total; PCIe Gen3 x16.
      make("rtx-2080-ti", 13.4, 0, 53.8, 0, 0, 616, 11, 50, 16, 68, 5.5),
      // NVIDIA Ada GPU Architecture whitepaper, Appendix A, GeForce RTX 4090: FP32 82.6; dense
      // tensor TF32 82.6, FP16/BF16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3;
      // GDDR6X 1,008 GB/s; 24GB; no NVLink; PCIe Gen4 x16.
      make("rtx-4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008, 24, 0, 32, 128, 72),
  };
  return entries;
}

}  // namespace

double default_intra_efficiency(IntraKind kind) { return kind == IntraKind::kPcie ? 1.0 : 0.8; }

double default_interference(const GpuSpec& gpu) {
  // A scenario's GPU may still be a catalog name (resolved when the topology is built).
  const GpuSpec* entry = gpu.from_catalog ? find_gpu(gpu.name) : nullptr;
  const int sms = entry != nullptr ? entry->sms : gpu.sms;
  if (sms <= kCommunicationSms) return 0.0;
  return static_cast<double>(kCommunicationSms) / static_cast<double>(sms - kCommunicationSms);
}

double default_gemm_ceiling(const GpuSpec& gpu, Dtype dtype) {
  if (dtype != Dtype::kBf16 && dtype != Dtype::kFp16) return kGemmCeilingUnmeasured;
  if (!gpu.from_catalog) return kGemmCeilingUnmeasured;
  // MAMF / dense peak (TFLOPS) per the table cited in the header.
  static const std::array<std::pair<std::string_view, double>, 7> measured = {{
      {"a100-sxm-80gb", 271.2 / 312},
      {"a100-sxm-40gb", 271.2 / 312},
      {"h100-sxm", 794.5 / 989},
      {"h200-sxm", 794.5 / 989},
      {"h800-sxm", 794.5 / 989},
      {"b200", 1745.0 / 2250},
      {"gb200", 1822.0 / 2500},
  }};
  for (const auto& [name, ceiling] : measured)
    if (gpu.name == name) return ceiling;
  return kGemmCeilingUnmeasured;
}

const GpuSpec* find_gpu(std::string_view name) {
  for (const auto& g : catalog()) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

std::vector<std::string> gpu_names() {
  std::vector<std::string> names;
  for (const auto& g : catalog()) names.push_back(g.name);
  return names;
}

void resolve_gpu(GpuSpec& gpu) {
  if (!gpu.from_catalog) return;
  const GpuSpec* entry = find_gpu(gpu.name);
  if (entry == nullptr) {
    std::string expected;
    for (const auto& n : gpu_names()) expected += (expected.empty() ? "" : ", ") + n;
    throw InputError(gpu.where, "cluster.gpu",
                     "unknown GPU '" + gpu.name + "', expected one of " + expected +
                         " (or a map with peak_tflops, hbm_bandwidth, memory)");
  }
  SourceLocation where = gpu.where;
  gpu = *entry;
  gpu.where = std::move(where);
}

}  // namespace moesim::topology
