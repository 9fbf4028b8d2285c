#include "tests/exec/mpi_test_main.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

namespace moesim::exec {
MpiSession* g_session = nullptr;
}  // namespace moesim::exec

int main(int argc, char** argv) {
  moesim::exec::MpiSession session(&argc, &argv);
  moesim::exec::g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  if (session.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
