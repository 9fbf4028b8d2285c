#include "core/cluster_spec.hpp"

namespace moesim {

// The names here are the YAML spellings: the scenario loader matches user input against them, so
// they are the one place where these enum names are defined.

std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
      return "fp32";
    case Dtype::kTf32:
      return "tf32";
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp8:
      return "fp8";
  }
  return "?";
}

int dtype_bytes(Dtype d) {
  switch (d) {
    case Dtype::kFp32:
    case Dtype::kTf32:
      return 4;
    case Dtype::kFp16:
    case Dtype::kBf16:
      return 2;
    case Dtype::kFp8:
      return 1;
  }
  return 0;
}

std::string_view intra_kind_name(IntraKind k) {
  switch (k) {
    case IntraKind::kNvswitch:
      return "nvswitch";
    case IntraKind::kNvlinkRing:
      return "nvlink_ring";
    case IntraKind::kPcie:
      return "pcie";
  }
  return "?";
}

std::string_view inter_kind_name(InterKind k) {
  switch (k) {
    case InterKind::kNone:
      return "none";
    case InterKind::kSwitch:
      return "switch";
    case InterKind::kFatTree:
      return "fat_tree";
    case InterKind::kRailOptimized:
      return "rail_optimized";
    case InterKind::kDragonfly:
      return "dragonfly";
    case InterKind::kTree:
      return "tree";
    case InterKind::kCustom:
      return "custom";
  }
  return "?";
}

SourceLocation ClusterSpec::location_of(const std::string& key_path) const {
  if (auto it = locations.find(key_path); it != locations.end()) return it->second;
  return where;
}

}  // namespace moesim
