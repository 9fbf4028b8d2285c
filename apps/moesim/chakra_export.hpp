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
//    tensor_size (bytes moved), is_cpu_op false;
//  - all_to_all / all_reduce / all_gather / reduce_scatter and multi-rank all_to_allv:
//    COMM_COLL_NODE, comm_type, comm_size (bytes this rank sends: the collective's per-rank size,
//    the all_to_allv's row), pg_name (the group, in comm_group.json);
//  - a one-way two-rank all_to_allv (a pipeline stage's send) and send_recv: COMM_SEND_NODE /
//    COMM_RECV_NODE with comm_src, comm_dst, comm_tag (the op id) and comm_size;
//  - data_deps: the op's dependencies on this rank; ctrl_deps: the previous op of the same stream
//    on this rank (streams run in plan order); start_time_micros / duration_micros: the
//    simulated times.
#pragma once

#include <string>
#include <vector>

#include "core/plan.hpp"
#include "core/run_result.hpp"

namespace moesim::app {

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
                  const std::vector<ChakraRun>& runs);

}  // namespace moesim::app
