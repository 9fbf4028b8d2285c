#include "topology/gpu_catalog.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.hpp"
#include "test_util.hpp"
#include "topology/nic_catalog.hpp"
#include "topology/topology.hpp"

namespace moesim::topology {
namespace {

using ::testing::HasSubstr;

TEST(GpuCatalog, HasTheNineModelsWithPositiveFigures) {
  const auto names = gpu_names();
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("a100-sxm-80gb", "a100-sxm-40gb", "h100-sxm",
                                                     "h200-sxm", "h800-sxm", "b200", "gb200",
                                                     "rtx-2080-ti", "rtx-4090"));
  for (const auto& n : names) {
    const GpuSpec* g = find_gpu(n);
    ASSERT_NE(g, nullptr) << n;
    EXPECT_EQ(g->name, n);
    EXPECT_GT(g->hbm_bandwidth.value(), 0) << n;
    EXPECT_GT(g->memory.value(), 0) << n;
    EXPECT_GT(g->pcie_bandwidth.value(), 0) << n;
    ASSERT_TRUE(g->peak.count(Dtype::kFp32)) << n;
    ASSERT_TRUE(g->peak.count(Dtype::kFp16)) << n;
    // Tensor-core fp16 is always faster than plain fp32.
    EXPECT_GT(g->peak.at(Dtype::kFp16), g->peak.at(Dtype::kFp32)) << n;
  }
}

TEST(GpuCatalog, SpecSheetFigures) {
  const GpuSpec* a100 = find_gpu("a100-sxm-80gb");
  ASSERT_NE(a100, nullptr);
  EXPECT_DOUBLE_EQ(a100->peak.at(Dtype::kFp16).value(), 312e12);
  EXPECT_DOUBLE_EQ(a100->peak.at(Dtype::kBf16).value(), 312e12);
  EXPECT_DOUBLE_EQ(a100->peak.at(Dtype::kTf32).value(), 156e12);
  EXPECT_FALSE(a100->peak.count(Dtype::kFp8));              // Ampere has no FP8
  EXPECT_DOUBLE_EQ(a100->nvlink_bandwidth.value(), 300e9);  // 600 GB/s bidirectional
  EXPECT_DOUBLE_EQ(a100->memory.value(), 80.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(find_gpu("a100-sxm-40gb")->hbm_bandwidth.value(), 1555e9);

  const GpuSpec* h100 = find_gpu("h100-sxm");
  EXPECT_DOUBLE_EQ(h100->peak.at(Dtype::kFp8).value(), 1979e12);  // 3,958 with sparsity / 2
  EXPECT_DOUBLE_EQ(h100->nvlink_bandwidth.value(), 450e9);
  EXPECT_GT(find_gpu("h200-sxm")->hbm_bandwidth, h100->hbm_bandwidth);
  EXPECT_GT(find_gpu("h200-sxm")->memory, h100->memory);

  // H800: an H100 with 400 GB/s NVLink (200 GB/s per direction).
  const GpuSpec* h800 = find_gpu("h800-sxm");
  EXPECT_DOUBLE_EQ(h800->nvlink_bandwidth.value(), 200e9);
  EXPECT_EQ(h800->peak.at(Dtype::kBf16), h100->peak.at(Dtype::kBf16));
  // Blackwell: per-GPU shares of the system datasheets, dense.
  const GpuSpec* b200 = find_gpu("b200");
  EXPECT_DOUBLE_EQ(b200->peak.at(Dtype::kFp8).value(), 72e15 / 8 / 2);
  EXPECT_DOUBLE_EQ(b200->nvlink_bandwidth.value(), 900e9);  // 1.8 TB/s bidirectional
  EXPECT_DOUBLE_EQ(b200->memory.value(), 180.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(find_gpu("gb200")->peak.at(Dtype::kFp8).value(), 720e15 / 72 / 2);
  EXPECT_GT(find_gpu("gb200")->peak.at(Dtype::kBf16), b200->peak.at(Dtype::kBf16));

  // L2 caches, binary sizes as the device query reports them.
  constexpr double kMiB = 1024.0 * 1024.0;
  EXPECT_DOUBLE_EQ(find_gpu("a100-sxm-40gb")->l2_cache.value(), 40 * kMiB);
  EXPECT_DOUBLE_EQ(h800->l2_cache.value(), 50 * kMiB);
  EXPECT_DOUBLE_EQ(b200->l2_cache.value(), 126 * kMiB);
  EXPECT_DOUBLE_EQ(find_gpu("rtx-2080-ti")->l2_cache.value(), 5.5 * kMiB);
  EXPECT_DOUBLE_EQ(find_gpu("rtx-4090")->l2_cache.value(), 72 * kMiB);

  EXPECT_DOUBLE_EQ(find_gpu("rtx-4090")->nvlink_bandwidth.value(), 0);
  EXPECT_FALSE(find_gpu("rtx-2080-ti")->peak.count(Dtype::kBf16));
  EXPECT_EQ(find_gpu("A100"), nullptr);
}

TEST(GpuCatalog, CommunicationSmsSetTheDefaultInterference) {
  // 20 SMs for communication kernels: 20 / (132 - 20) on Hopper, 20 / (108 - 20) on A100.
  EXPECT_EQ(find_gpu("h800-sxm")->sms, 132);
  EXPECT_EQ(find_gpu("a100-sxm-40gb")->sms, 108);
  EXPECT_DOUBLE_EQ(default_interference(*find_gpu("h100-sxm")), 20.0 / 112.0);
  EXPECT_DOUBLE_EQ(default_interference(*find_gpu("a100-sxm-80gb")), 20.0 / 88.0);
  EXPECT_DOUBLE_EQ(default_interference(*find_gpu("gb200")), 20.0 / 128.0);
  for (const auto& name : gpu_names()) EXPECT_GT(find_gpu(name)->sms, 20) << name;
  // A scenario's GPU before resolution (a catalog name only) gets its entry's figure.
  GpuSpec named;
  named.name = "rtx-2080-ti";
  EXPECT_DOUBLE_EQ(default_interference(named), 20.0 / 48.0);
  // Inline GPUs: the formula on their `sms`; none without it, or with too few SMs to share.
  GpuSpec inline_gpu;
  inline_gpu.from_catalog = false;
  EXPECT_EQ(default_interference(inline_gpu), 0.0);
  inline_gpu.sms = 100;
  EXPECT_DOUBLE_EQ(default_interference(inline_gpu), 0.25);
  inline_gpu.sms = 20;
  EXPECT_EQ(default_interference(inline_gpu), 0.0);
}

TEST(GpuCatalog, GemmCeilingIsTheMeasuredMatmulRateOverThePeak) {
  // The maximum achievable matmul TFLOPS of the cited table over the dense BF16 peak.
  EXPECT_DOUBLE_EQ(default_gemm_ceiling(*find_gpu("a100-sxm-80gb"), Dtype::kBf16), 271.2 / 312);
  EXPECT_DOUBLE_EQ(default_gemm_ceiling(*find_gpu("h800-sxm"), Dtype::kFp16), 794.5 / 989);
  EXPECT_DOUBLE_EQ(default_gemm_ceiling(*find_gpu("gb200"), Dtype::kBf16), 0.7288);
  EXPECT_DOUBLE_EQ(default_gemm_ceiling(*find_gpu("b200"), Dtype::kBf16), 1745.0 / 2250);
  // Every figure is a fraction of a peak the catalog holds, below the generic ceiling's cap 1.
  for (const auto& name : gpu_names()) {
    const double c = default_gemm_ceiling(*find_gpu(name), Dtype::kBf16);
    EXPECT_GT(c, 0.7) << name;
    EXPECT_LT(c, 0.9) << name;
  }
  // Unmeasured: other dtypes, the RTX cards, inline GPUs.
  EXPECT_EQ(default_gemm_ceiling(*find_gpu("gb200"), Dtype::kFp32), kGemmCeilingUnmeasured);
  EXPECT_EQ(default_gemm_ceiling(*find_gpu("rtx-2080-ti"), Dtype::kFp16), kGemmCeilingUnmeasured);
  GpuSpec named;  // a scenario's GPU before resolution
  named.name = "h100-sxm";
  EXPECT_DOUBLE_EQ(default_gemm_ceiling(named, Dtype::kBf16), 794.5 / 989);
  GpuSpec inline_gpu;
  inline_gpu.name = "h100-sxm";
  inline_gpu.from_catalog = false;
  EXPECT_EQ(default_gemm_ceiling(inline_gpu, Dtype::kBf16), kGemmCeilingUnmeasured);
}

TEST(GpuCatalog, ResolveFillsFiguresAndKeepsLocation) {
  GpuSpec g;
  g.name = "h100-sxm";
  g.where = SourceLocation{"s.yaml", 3, 8};
  resolve_gpu(g);
  EXPECT_DOUBLE_EQ(g.hbm_bandwidth.value(), 3350e9);
  EXPECT_EQ(g.where.file, "s.yaml");
  EXPECT_EQ(g.where.line, 3);
}

TEST(GpuCatalog, InlineGpuIsLeftAlone) {
  GpuSpec g;
  g.name = "my-gpu";
  g.from_catalog = false;
  g.hbm_bandwidth = BytesPerSecond(1e12);
  resolve_gpu(g);
  EXPECT_EQ(g.name, "my-gpu");
  EXPECT_DOUBLE_EQ(g.hbm_bandwidth.value(), 1e12);
}

TEST(GpuCatalog, UnknownGpuNamesLocationAndChoices) {
  GpuSpec g;
  g.name = "x100";
  g.where = SourceLocation{"s.yaml", 4, 8};
  try {
    resolve_gpu(g);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.location().line, 4);
    EXPECT_EQ(e.key(), "cluster.gpu");
    EXPECT_THAT(e.message(), HasSubstr("unknown GPU 'x100', expected one of a100-sxm-80gb"));
    EXPECT_THAT(e.message(), HasSubstr("rtx-4090"));
  }
}

TEST(GpuCatalog, LinksRunAtTheirAchievableFraction) {
  // Unset fractions: NVLink 0.8 of 300 GB/s, the NICs 0.95 of 25 GB/s; the fabric's links and
  // the NIC share follow the achieved rate; the spec-sheet figures stay as nominal.
  auto spec = testing::make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch);
  spec.intra.efficiency = 0;
  spec.inter.nic_efficiency = 0;
  auto topo = build_topology(spec);
  EXPECT_DOUBLE_EQ(topo->spec().intra.bandwidth.value(), 240e9);
  EXPECT_DOUBLE_EQ(topo->spec().intra.nominal_bandwidth.value(), 300e9);
  EXPECT_DOUBLE_EQ(topo->spec().intra.efficiency, 0.8);
  EXPECT_DOUBLE_EQ(topo->spec().inter.nic_bandwidth.value(), 23.75e9);
  EXPECT_DOUBLE_EQ(topo->spec().inter.nominal_nic_bandwidth.value(), 25e9);
  EXPECT_DOUBLE_EQ(topo->nic_share_bandwidth(0).value(), 23.75e9);
  double fastest = 0;
  for (const auto& l : topo->links()) fastest = std::max(fastest, l.bandwidth.value());
  EXPECT_DOUBLE_EQ(fastest, 240e9);
  // Building from a resolved spec changes nothing (the nominal figure is kept).
  auto again = build_topology(topo->spec());
  EXPECT_DOUBLE_EQ(again->spec().intra.bandwidth.value(), 240e9);
  EXPECT_DOUBLE_EQ(again->spec().inter.nic_bandwidth.value(), 23.75e9);
  // A scenario's own fraction wins; PCIe's default is 1.
  spec.intra.efficiency = 0.5;
  EXPECT_DOUBLE_EQ(build_topology(spec)->spec().intra.bandwidth.value(), 150e9);
  EXPECT_DOUBLE_EQ(default_intra_efficiency(IntraKind::kPcie), 1.0);
  EXPECT_DOUBLE_EQ(default_intra_efficiency(IntraKind::kNvlinkRing), 0.8);
}

TEST(NicCatalog, EachGpuGetsTheNicOfItsGeneration) {
  auto spec = testing::make_spec(2, 8, IntraKind::kNvswitch, InterKind::kSwitch);
  ASSERT_NE(cluster_nic(spec), nullptr);
  EXPECT_EQ(cluster_nic(spec)->name, "cx6");  // A100: ConnectX-6 HDR
  spec.gpu.name = "h800-sxm";
  EXPECT_EQ(cluster_nic(spec)->name, "cx7");
  spec.inter.nic = "cx8";  // the scenario's name wins
  EXPECT_EQ(cluster_nic(spec)->name, "cx8");
  spec.inter.nic.clear();
  spec.gpu.from_catalog = false;  // an inline GPU has no generation
  EXPECT_EQ(cluster_nic(spec), nullptr);
  EXPECT_EQ(nic_peer_state(spec).peer_cache, 0);
  auto one = testing::make_spec(1, 8, IntraKind::kNvswitch, InterKind::kNone);
  EXPECT_EQ(cluster_nic(one), nullptr);  // no NIC traffic on one node
}

TEST(NicCatalog, LineRateFillsAnUnsetNicBandwidth) {
  auto spec = testing::make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch);
  spec.inter.nic = "cx7";
  spec.inter.nic_bandwidth = BytesPerSecond(0);
  spec.inter.nic_efficiency = 0;
  auto topo = build_topology(spec);
  EXPECT_DOUBLE_EQ(topo->spec().inter.nominal_nic_bandwidth.value(), 50e9);  // 400 Gb/s
  EXPECT_DOUBLE_EQ(topo->spec().inter.nic_bandwidth.value(), 47.5e9);        // x 0.95
  spec.inter.nic_bandwidth =
      BytesPerSecond(12.5e9);  // a scenario's rate wins (a ConnectX-7 at HDR100)
  EXPECT_DOUBLE_EQ(build_topology(spec)->spec().inter.nominal_nic_bandwidth.value(), 12.5e9);
}

TEST(NicCatalog, QueuePairCacheIsSharedByTheGpusOnANic) {
  auto spec = testing::make_spec(4, 8, IntraKind::kNvswitch, InterKind::kSwitch);
  EXPECT_EQ(nic_peer_state(spec).peer_cache, 60);  // one NIC per GPU
  EXPECT_DOUBLE_EQ(nic_peer_state(spec).peer_miss_overhead.value(), 2.4e-6);
  spec.inter.nics_per_node = 2;  // 4 GPUs per NIC: PipeMoE's testbed, 15 each
  EXPECT_EQ(nic_peer_state(spec).peer_cache, 15);
  spec.inter.nics_per_node = 1;
  EXPECT_EQ(nic_peer_state(spec).peer_cache, 7);
}

TEST(NicCatalog, UnknownNicNamesLocationAndChoices) {
  auto spec = testing::make_spec(2, 2, IntraKind::kNvswitch, InterKind::kSwitch);
  spec.inter.nic = "cx9";
  try {
    build_topology(spec);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.key(), "cluster.inter_node.nic");
    EXPECT_THAT(e.message(),
                HasSubstr("unknown NIC 'cx9', expected one of cx5, cx6, cx7, cx8, roce400"));
  }
  EXPECT_EQ(nic_names().size(), 5u);
}

TEST(GpuCatalog, BuildTopologyResolvesTheGpu) {
  auto spec = testing::make_spec(1, 2, IntraKind::kNvswitch, InterKind::kNone);
  auto topo = build_topology(spec);
  EXPECT_DOUBLE_EQ(topo->gpu().hbm_bandwidth.value(), 2039e9);
  spec.gpu.name = "x100";
  EXPECT_THROW(build_topology(spec), InputError);
}

}  // namespace
}  // namespace moesim::topology
