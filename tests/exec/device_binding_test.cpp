// exec/device_binding.hpp: the GPU an exec rank binds, and the check that no two ranks share one
// (device binding used to throw when a rank saw fewer devices than local ranks, which broke
// Slurm --gpus-per-task=1 and per-rank CUDA_VISIBLE_DEVICES).
#include "exec/device_binding.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace moesim::exec {
namespace {

TEST(DeviceBinding, LocalRankModuloVisibleDevices) {
  // A node showing its 8 GPUs to 8 ranks: rank r takes GPU r.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(device_for_local_rank(r, 8), r);
  // --gpus-per-task=1: every rank sees one device, its own, as device 0.
  for (int r = 0; r < 8; ++r) EXPECT_EQ(device_for_local_rank(r, 1), 0);
  // --gpus-per-task=2: rank r sees two, takes the second when r is odd.
  EXPECT_EQ(device_for_local_rank(3, 2), 1);
  EXPECT_EQ(device_for_local_rank(4, 2), 0);
  EXPECT_EQ(device_for_local_rank(0, 0), -1);  // no device at all
}

// 8 ranks on 2 hosts. Per-rank masks: every rank binds device 0 of its own mask, each a different
// PCI bus: no sharing. A host showing 2 GPUs to 4 ranks: ranks 0 and 2 bind the same GPU.
TEST(DeviceBinding, RanksSharingAGpuAreFoundByHostAndBus) {
  const std::vector<std::string> bus = {"0000:07:00.0", "0000:0F:00.0", "0000:47:00.0",
                                        "0000:4E:00.0"};
  std::vector<double> masked;
  for (int r = 0; r < 8; ++r)
    masked.push_back(device_identity(r < 4 ? "node-a" : "node-b", bus[r % 4]));
  EXPECT_EQ(ranks_sharing_a_device(masked), std::nullopt);

  std::vector<double> shown_two;
  for (int r = 0; r < 4; ++r)
    shown_two.push_back(device_identity("node-a", bus[device_for_local_rank(r, 2)]));
  const auto shared = ranks_sharing_a_device(shown_two);
  ASSERT_TRUE(shared.has_value());
  EXPECT_EQ(shared->first, 0);
  EXPECT_EQ(shared->second, 2);

  // The same bus id on two hosts is two GPUs.
  EXPECT_NE(device_identity("node-a", bus[0]), device_identity("node-b", bus[0]));
  // Identities are exact in a double (52 bits) and stable.
  const double id = device_identity("node-a", bus[0]);
  EXPECT_EQ(id, static_cast<double>(static_cast<std::uint64_t>(id)));
  EXPECT_LT(id, 4503599627370496.0);  // 2^52
  EXPECT_EQ(id, device_identity("node-a", bus[0]));
}

}  // namespace
}  // namespace moesim::exec
