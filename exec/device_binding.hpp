// Which CUDA device an exec rank binds, as plain functions the CPU tests cover:
// the NCCL communicator only feeds them what CUDA and MPI report.
//
// A rank binds device local_rank % visible, where `visible` is the number of devices it sees. That
// covers both ways clusters hand out GPUs: a node that shows all its GPUs to every rank (local
// rank r takes GPU r), and launchers that give each rank its own (Slurm `--gpus-per-task=1`, a
// per-rank CUDA_VISIBLE_DEVICES: every rank sees one device, device 0, a different GPU each). The
// rule alone cannot tell a host that shows 4 GPUs to 8 ranks from either, so the ranks then
// compare what they bound (host and PCI bus id): two ranks on one GPU is the error NCCL would
// otherwise report from inside its bootstrap.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moesim::exec {

/// The device local rank `local_rank` binds when it sees `visible_devices` (>= 1) devices.
int device_for_local_rank(int local_rank, int visible_devices);

/// A GPU's identity across the job, from its host name and PCI bus id ("0000:3B:00.0"), as a
/// double (exact: 52 bits of an FNV-1a hash) so that MpiSession::all_gather_doubles carries it.
double device_identity(const std::string& host, const std::string& pci_bus_id);

/// The first two ranks (in rank order) whose identities are equal, or nullopt when every rank has
/// a GPU of its own. `ids` is indexed by rank.
std::optional<std::pair<int, int>> ranks_sharing_a_device(const std::vector<double>& ids);

}  // namespace moesim::exec
