// NIC catalog: the inter-node adapters a scenario can name (`cluster.inter_node.nic: cx7`), with
// the figures the network models read: line rate, the fraction of it transfers achieve, and the
// per-peer connection state that makes an all-to-all's cost per peer grow with the peer count.
// Each figure's source is next to it in nic_catalog.cpp. A scenario's own keys
// (`inter_node.nic_bandwidth`, `nic_efficiency`, `engine.peer_cache`, `peer_miss_overhead`) and a
// calibration file replace them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/cluster_spec.hpp"

namespace moesim::topology {

struct NicModel {
  std::string_view name;         // catalog name, as a scenario writes it
  std::string_view description;  // for `moesim topo` and error hints
  BytesPerSecond line_rate{0};   // per port per direction (the signalling rate's payload share)
  double efficiency = 0;         // achievable fraction of line_rate for large transfers
  // Reliable-connection RDMA keeps one queue pair's context per peer connection; the NIC caches
  // `qp_cache` of them on chip and fetches the rest from host memory over PCIe, each such
  // message costing `qp_miss` more.
  int qp_cache = 0;
  Seconds qp_miss{0};
};

/// The catalog entry named `name` (exact), or nullptr.
const NicModel* find_nic(std::string_view name);

/// Catalog names in catalog order, for error hints.
std::vector<std::string> nic_names();

/// The NIC a cluster uses: `inter_node.nic` when set (InputError at that key listing the names
/// when it is not in the catalog), else the NIC that ships with the GPU's generation (A100:
/// ConnectX-6 HDR; Hopper and Blackwell: ConnectX-7 NDR; see nic_catalog.cpp). nullptr for a
/// single node (no NIC traffic) and for an inline GPU without `inter_node.nic`.
const NicModel* cluster_nic(const ClusterSpec& cluster);

/// Per-peer state as the engines charge it (collectives::NetworkParams::overhead_s counts
/// messages per sending GPU): the NIC's queue-pair cache split among the GPUs that share it
/// (at least 1), and its miss cost. {0, 0} (no misses) when cluster_nic is nullptr.
struct PeerState {
  int peer_cache = 0;
  Seconds peer_miss_overhead{0};
};
PeerState nic_peer_state(const ClusterSpec& cluster);

}  // namespace moesim::topology
