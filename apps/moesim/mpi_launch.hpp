// Commands that spread their work over the ranks mpirun started (`moesim sweep`, `moesim tune`):
// how many there are, the MPI message transport, and the one way a failure on any rank ends the
// whole job. Part of the binary (it needs exec's MPI session); the command code itself sees only
// the SweepTransport interface, so it stays free of MPI and tests can supply their own transport.
#pragma once

#include <functional>

#include "apps/moesim/sweep.hpp"

namespace moesim::app {

/// The number of processes mpirun started this one among, or 1 when it was started without a
/// launcher: MPI is only initialised under one, so a plain run never needs it.
int launcher_world_size();

/// Runs `body(nullptr)` with a Ctrl-C handler when there is no launcher; under mpirun,
/// initialises MPI and runs `body(&transport)` on every rank. An exception on any rank prints
/// "moesim: error: [rank R: ]..." and ends the whole job (exit 2 for an InputError, else 1): a
/// rank left waiting for the others would hang. `what` names the work in the error of a build
/// without MPI ("a sweep").
void run_spread(const char* what, const std::function<void(SweepTransport*)>& body);

}  // namespace moesim::app
