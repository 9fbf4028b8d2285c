// The shared main of the mpirun-launched GoogleTest binaries of exec/ (mpi_test_main.cpp): MPI
// is initialised once for the whole binary (MpiSession), progress prints from rank 0 only
// (failures still print on the rank where they happen) and any rank failing fails the job.
#pragma once

#include "exec/mpi_communicator.hpp"

namespace moesim::exec {
/// The binary's MPI session, set before any test runs.
extern MpiSession* g_session;
}  // namespace moesim::exec
