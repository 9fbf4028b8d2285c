// GPU catalog: the GPU models a scenario can name (`cluster.gpu: a100-sxm-80gb`), with the figures
// the cost models read. All figures are NVIDIA's public spec-sheet values: dense peaks (no
// structured sparsity), per direction for interconnects, base units (FLOP/s, B/s, bytes).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/cluster_spec.hpp"

namespace moesim::topology {

/// The catalog entry named `name` (exact, case-sensitive), or nullptr when there is none.
const GpuSpec* find_gpu(std::string_view name);

/// SMs the communication kernels of a training step hold while they run: DeepSeek-V3's report
/// (section 3.2.2) gives 20 of H800's 132 to its all-to-all kernels, DeepEP's default
/// (Buffer.num_sms) is 20, and NCCL's collectives run one thread block per channel, 16 to 32 on
/// NVLink and InfiniBand systems.
inline constexpr int kCommunicationSms = 20;

/// engine.interference when the scenario does not set it: compute beside communication runs on
/// the SMs the communication kernels leave, sms / (sms - kCommunicationSms) times slower (0.18
/// on H100 / H800, 0.23 on A100). 0 when the SM count is unknown (an inline GPU without `sms`).
double default_interference(const GpuSpec& gpu);

/// Ceiling of a 16-bit (bf16 / fp16) GEMM as a fraction of the dense peak, the compute model's
/// max_gemm_efficiency when no calibration measures the GPU: the best matmul rate measured on the
/// GPU over a brute-force search of shapes ("maximum achievable matmul FLOPS", the comparison
/// table of stas00/ml-engineering, compute/accelerator, torch.matmul in BF16, mean of 100 runs):
/// A100 SXM 0.869, H100 SXM 0.803 (H200 and H800, the same GH100 SXM silicon, alike), B200
/// 0.776, GB200 0.729. Other dtypes, GPUs without a measurement and inline GPUs get
/// kGemmCeilingUnmeasured.
double default_gemm_ceiling(const GpuSpec& gpu, Dtype dtype);

/// The ceiling where no measurement is known: a large square GEMM at 80% of peak (cuBLAS on
/// Ampere and Hopper parts reaches 0.8-0.87 in the table above).
inline constexpr double kGemmCeilingUnmeasured = 0.8;

/// Achievable fraction of a scale-up link's spec-sheet bandwidth, the `intra_node.efficiency`
/// default. NVLink (nvswitch, nvlink_ring): 0.8, DeepEP's measurement on H800 (about 160 of the
/// 200 GB/s per direction; NVLink's packet headers and flow control take the rest). PCIe: 1.0,
/// no cited figure yet (the bundled PCIe testbeds state their measured rates).
double default_intra_efficiency(IntraKind kind);

/// Achievable fraction of a NIC's line rate, the `inter_node.nic_efficiency` default: 0.95,
/// the 46-49 GB/s nccl-tests' maintainers measure through a 400 Gb/s (50 GB/s) ConnectX-7.
inline constexpr double kNicEfficiency = 0.95;

/// Catalog names in catalog order, for error hints and `moesim --help`.
std::vector<std::string> gpu_names();

/// Fills a GpuSpec that names a catalog entry (from_catalog == true) with the entry's figures,
/// keeping its `where`. Inline GPUs (from_catalog == false) are left as they are. Throws
/// InputError at gpu.where ("unknown GPU 'x', expected one of ...") for an unknown name.
void resolve_gpu(GpuSpec& gpu);

}  // namespace moesim::topology
