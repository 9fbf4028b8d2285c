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

/// Catalog names in catalog order, for error hints and `moesim --help`.
std::vector<std::string> gpu_names();

/// Fills a GpuSpec that names a catalog entry (from_catalog == true) with the entry's figures,
/// keeping its `where`. Inline GPUs (from_catalog == false) are left as they are. Throws
/// InputError at gpu.where ("unknown GPU 'x', expected one of ...") for an unknown name.
void resolve_gpu(GpuSpec& gpu);

}  // namespace moesim::topology
