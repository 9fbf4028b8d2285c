// The moesim subcommands. Each registers itself on the CLI11 app and runs when selected; errors
// propagate as exceptions (InputError -> exit 2, anything else -> exit 1, see main.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

namespace moesim {
struct Scenario;
namespace exec {
class Communicator;
class MpiSession;
}  // namespace exec
namespace topology {
class Topology;
}
}  // namespace moesim

namespace moesim::app {

/// Path of the bundled quickstart scenario, used when a command gets no scenario.
std::string default_scenario_path();

void register_validate(CLI::App& app);
void register_topo(CLI::App& app);
void register_simulate(CLI::App& app);
void register_compare(CLI::App& app);
void register_route_train(CLI::App& app);  // cmd_route_train.cpp (TA-MoE gate-training lab)
/// Only in builds with MPI (MOESIM_HAVE_EXEC).
void register_exec(CLI::App& app);
/// `moesim calibrate` (cmd_calibrate.cpp); only in builds with MPI.
void register_calibrate(CLI::App& app);
/// Runs an MPI subcommand's body inside one MpiSession (cmd_exec.cpp; builds with MPI): an
/// InputError, found identically by every rank, is reported once by rank 0 and exits 2 through
/// MPI_Finalize; any other failure names its rank and aborts the whole job with exit 1.
void run_mpi_command(const std::function<int(exec::MpiSession&)>& body);
/// check_output_path (output.hpp) on rank 0, whose verdict every rank then shares: collective (all
/// ranks call it at the same point); InputError on every rank when rank 0 cannot write `path`
/// (cmd_exec.cpp; builds with MPI).
void check_output_path_on_root(exec::MpiSession& session, const std::string& path,
                               const std::string& flag);
/// The communicator `--backend` names: "mpi" (host path) or "nccl" (builds with NCCL); InputError
/// otherwise (cmd_exec.cpp; builds with MPI).
std::unique_ptr<exec::Communicator> make_communicator(const std::string& backend,
                                                      exec::MpiSession& session);
void register_sweep(CLI::App& app);
void register_tune(CLI::App& app);  // cmd_tune.cpp (apps/moesim/tune.hpp)
void register_list(CLI::App& app);

/// `topo --ta-moe`: TA-MoE target per tier and predicted all-to-all times (cmd_route_train.cpp);
/// json (optional) receives the report as a JSON object.
void print_ta_moe(const Scenario& sc, const topology::Topology& topo, std::string* json);

}  // namespace moesim::app
