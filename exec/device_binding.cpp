#include "exec/device_binding.hpp"

#include <map>

namespace moesim::exec {

int device_for_local_rank(int local_rank, int visible_devices) {
  return visible_devices > 0 ? local_rank % visible_devices : -1;
}

double device_identity(const std::string& host, const std::string& pci_bus_id) {
  std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits
  for (unsigned char c : host + '\n' + pci_bus_id) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return static_cast<double>(h >> 12);  // 52 bits: exact in a double
}

std::optional<std::pair<int, int>> ranks_sharing_a_device(const std::vector<double>& ids) {
  std::map<double, int> first_rank;
  for (int r = 0; r < static_cast<int>(ids.size()); ++r) {
    const auto [it, fresh] = first_rank.emplace(ids[static_cast<std::size_t>(r)], r);
    if (!fresh) return std::make_pair(it->second, r);
  }
  return std::nullopt;
}

}  // namespace moesim::exec
