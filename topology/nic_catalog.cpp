#include "topology/nic_catalog.hpp"

#include <algorithm>
#include <array>
#include <utility>

#include "core/error.hpp"
#include "topology/gpu_catalog.hpp"

namespace moesim::topology {

namespace {

constexpr double kGbps = 1e9 / 8;  // bytes per second in one Gb/s
constexpr double kUs = 1e-6;

// Line rates: the InfiniBand signalling generations' data rates per 4x port (EDR 100, HDR 200,
// NDR 400, XDR 800 Gb/s), the ConnectX-5/6/7/8 adapters' port speeds; RoCE at Ethernet's
// 400 Gb/s. Achievable fraction 0.95 for every one: the 46-49 GB/s nccl-tests' maintainers
// measure through a 400 Gb/s (50 GB/s) ConnectX-7 (kNicEfficiency); no other generation has a
// cited figure.
//
// Per-peer state: reliable-connection RDMA holds a queue pair per peer connection, and a NIC
// keeps a bounded number of their contexts on chip. The only multi-size all-to-all fit we have
// is PipeMoE's (Fig. 6(b): 4, 8 and 16 nodes of 4 GPUs behind one EDR NIC, linear NCCL
// all-to-all, alpha 17.2 / 209 / 783 us at 16 / 32 / 64 GPUs): 60 peers per NIC (15 per GPU
// there) and 2.4 us per message beyond them reproduce alpha and its 45x growth (docs/validation.md
// V2; scenarios/rtx2080ti-16x4.yaml). It agrees within 2x with the connection counts measured on
// RDMA NICs: StaR (ICNP 2021) keeps peak performance below 450 connections, and NCCL holds about
// four queue pairs per all-to-all peer (two channels, each with a send and a receive side), about
// 110 peers; ScalaRNIC (ISCAS 2023) and PipeDevice report ~50% lower throughput at a few thousand.
// No ConnectX generation has a published per-peer all-to-all figure, so every ConnectX entry
// (InfiniBand or RoCE) uses this one; a calibration or the engine keys replace it.
constexpr int kConnectXQpCache = 60;
constexpr double kConnectXQpMissUs = 2.4;

const std::array<NicModel, 5> kCatalog = {{
    {"cx5", "ConnectX-5 EDR InfiniBand, 100 Gb/s", BytesPerSecond(100 * kGbps), kNicEfficiency,
     kConnectXQpCache, Seconds(kConnectXQpMissUs* kUs)},
    {"cx6", "ConnectX-6 HDR InfiniBand, 200 Gb/s", BytesPerSecond(200 * kGbps), kNicEfficiency,
     kConnectXQpCache, Seconds(kConnectXQpMissUs* kUs)},
    {"cx7", "ConnectX-7 NDR InfiniBand, 400 Gb/s", BytesPerSecond(400 * kGbps), kNicEfficiency,
     kConnectXQpCache, Seconds(kConnectXQpMissUs* kUs)},
    {"cx8", "ConnectX-8 XDR InfiniBand, 800 Gb/s", BytesPerSecond(800 * kGbps), kNicEfficiency,
     kConnectXQpCache, Seconds(kConnectXQpMissUs* kUs)},
    {"roce400", "ConnectX-7 in 400 GbE RoCE v2 mode", BytesPerSecond(400 * kGbps), kNicEfficiency,
     kConnectXQpCache, Seconds(kConnectXQpMissUs* kUs)},
}};

// The NIC each catalog GPU's reference systems ship with.
const std::array<std::pair<std::string_view, std::string_view>, 9> kGpuNic = {{
    {"a100-sxm-80gb", "cx6"},
    {"a100-sxm-40gb", "cx6"},
    {"h100-sxm", "cx7"},
    {"h200-sxm", "cx7"},
    {"h800-sxm", "cx7"},
    {"b200", "cx7"},
    {"gb200", "cx7"},
    {"rtx-2080-ti", "cx5"},
    {"rtx-4090", "cx6"},
}};

}  // namespace

const NicModel* find_nic(std::string_view name) {
  for (const auto& n : kCatalog) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

std::vector<std::string> nic_names() {
  std::vector<std::string> names;
  for (const auto& n : kCatalog) names.emplace_back(n.name);
  return names;
}

const NicModel* cluster_nic(const ClusterSpec& cluster) {
  const auto& inter = cluster.inter;
  if (!inter.nic.empty()) {
    if (const NicModel* n = find_nic(inter.nic)) return n;
    std::string expected;
    for (const auto& n : kCatalog) expected += (expected.empty() ? "" : ", ") + std::string(n.name);
    throw InputError(cluster.location_of("cluster.inter_node.nic"), "cluster.inter_node.nic",
                     "unknown NIC '" + inter.nic + "', expected one of " + expected);
  }
  if (cluster.nodes <= 1 || inter.kind == InterKind::kNone || inter.kind == InterKind::kCustom)
    return nullptr;
  if (!cluster.gpu.from_catalog) return nullptr;
  for (const auto& [gpu, nic] : kGpuNic) {
    if (gpu == cluster.gpu.name) return find_nic(nic);
  }
  return nullptr;
}

PeerState nic_peer_state(const ClusterSpec& cluster) {
  if (cluster.nodes <= 1) return {};
  const NicModel* nic = cluster_nic(cluster);
  if (nic == nullptr || nic->qp_cache <= 0) return {};
  const int gpus_per_nic =
      std::max(1, cluster.gpus_per_node / std::max(1, cluster.inter.nics_per_node));
  return {std::max(1, nic->qp_cache / gpus_per_nic), nic->qp_miss};
}

}  // namespace moesim::topology
