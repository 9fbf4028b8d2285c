// Chakra execution-trace export (`moesim simulate ... --chakra DIR`): the simulated
// plan of each strategy as one trace per rank in the Chakra ET schema (apps/moesim/
// chakra_et.proto, a wire-compatible part of MLCommons Chakra's), so that ASTRA-sim or Chakra's
// tools can replay or analyse what moesim planned.
//
// Layout: DIR/<strategy>/et.<rank>.et (ASTRA-sim's workload prefix is DIR/<strategy>/et),
// DIR/<strategy>/comm_group.json (the process groups the collectives name, ASTRA-sim's
// --comm-group-configuration: {"1": [ranks], ...}) and DIR/moesim_chakra.json (what was written).
// Each .et file is the GlobalMetadata message, then one Node per op instance on that rank in plan
// order, each length-prefixed (protobuf's delimited format, Chakra's encodeMessage):
//  - compute and copy ops: COMP_NODE, attributes num_ops (FLOPs, the rank's skew applied),
//    tensor_size (HBM bytes: the op's, or a GEMM's operands and result read and written once at
//    the run's element size), is_cpu_op false;
//  - all_to_all / all_reduce / all_gather / reduce_scatter: COMM_COLL_NODE, comm_type,
//    comm_size (the collective's per-rank size), pg_name (the group, in comm_group.json);
//  - all_to_allv (routed dispatch and combine, pipeline stage sends) and send_recv: one
//    COMM_SEND_NODE per peer this rank sends to and one COMM_RECV_NODE per peer it receives from,
//    each with comm_src, comm_dst, comm_tag (the op id) and the plan's exact comm_size for that
//    pair (zero-byte pairs and the rank's own entry move nothing and get no node). ASTRA-sim
//    matches a collective's ranks by one size, so an all_to_allv whose rows differ cannot be a
//    collective node without deadlocking it. ChakraOptions::a2av_as_collective asks for the
//    approximation instead: one ALL_TO_ALL node per rank with the group's mean row as comm_size
//    (attribute moesim_approximation says so);
//  Attribute types are the ones Chakra's trace feeder (src/feeder/et_feeder_node.cpp) reads:
//  num_ops and comm_size int64, tensor_size uint64, comm_src / comm_dst / comm_tag int32 (a value
//  of another type reads as 0 there).
//  - data_deps: the op's dependencies on this rank; ctrl_deps: the previous op of the same stream
//    on this rank (streams run in plan order); start_time_micros / duration_micros: the
//    simulated times.
#pragma once

#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/run_result.hpp"

namespace moesim::app {

struct ChakraOptions {
  /// Bytes per element of the run's data type (Scenario::bytes_per_element): GEMM tensor sizes.
  double bytes_per_element = 2;
  /// all_to_allv as one ALL_TO_ALL node of the group's mean row size (an approximation) instead
  /// of exact per-peer sends and receives.
  bool a2av_as_collective = false;
};

struct ChakraRun {
  std::string strategy;
  const Plan* plan = nullptr;
  const RunResult* result = nullptr;
};

/// Whether this build writes Chakra traces (protobuf was found).
bool chakra_available();

/// Before a run: DIR's parent must be a writable directory, and DIR must not exist or be an
/// earlier export (it holds moesim_chakra.json; it is replaced). InputError naming --chakra
/// otherwise, or when this build has no protobuf.
void check_chakra_dir(const std::string& dir);

/// Writes the traces into a temporary sibling of `dir` and renames it into place (an earlier
/// export there is replaced): a failed write leaves nothing half-written.
void write_chakra(const std::string& dir, const std::string& scenario,
                  const std::vector<ChakraRun>& runs, const ChakraOptions& options = {});

}  // namespace moesim::app
