// The serving engine (docs/serving.md): a scenario's `serving:` section run end to end. Requests
// from the description, continuous batching on every pool's instances, each iteration priced by
// the plan of one forward pass of its batch on the instance's simulated nodes (the training
// model's attention, dispatch, experts and combine, with the attention core reading each
// request's KV cache), the KV cache sized from HBM after the weights, and the KV moved between
// disaggregated pools over the fabric.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/scenario.hpp"
#include "strategies/runner.hpp"
#include "strategies/serving/continuous_batching.hpp"
#include "strategies/workload/requests.hpp"

namespace moesim::topology {
class Topology;
}

namespace moesim::serving {

/// What prices a plan on one instance's nodes: its topology and a backend on it. apps/ builds
/// both from sim/ (strategies/ does not see the engines).
struct InstanceBackend {
  std::unique_ptr<topology::Topology> topology;
  strategies::Backend backend;
  // The backend's time for one compute op alone (the attention core, to key the price cache).
  std::function<double(const ComputeSpec&)> kernel_seconds;
};
using MakeInstanceBackend = std::function<InstanceBackend(const Scenario& instance)>;

/// Where an instance's HBM goes (per GPU).
struct KvGeometry {
  double kv_bytes_per_token = 0;  // every attention layer's KV of one token
  double weights_bytes = 0;       // the dense weights (attention DP: whole) and 1/ep of the experts
  double hbm_bytes = 0;           // the GPU's memory
  double usable_bytes = 0;        // hbm x memory_utilization
  long long kv_tokens = 0;        // the KV cache, in tokens
};

/// The weights and the KV cache of one GPU of `pool` (its kv_tokens_per_gpu when given, else
/// what usable HBM holds after the weights). InputError at the pool's key when the weights leave
/// no room for one block of KV.
KvGeometry kv_geometry(const Scenario& sc, const ServingPool& pool, double gpu_memory_bytes);

/// The scenario one instance of `pool` runs: its nodes, inference, dropless, the routed experts
/// EP over pool.ep GPUs (replicated over gpus / ep groups), one iteration.
Scenario instance_scenario(const Scenario& sc, const ServingPool& pool);

/// Prices iterations of one instance: the plan of one forward pass of the batch (per GPU: the
/// batch's tokens, attention pairs and KV reads over the instance's attention ranks), for a
/// model of D dense and N MoE blocks and an LM head as D x dense + N x MoE + head, each from a
/// one- or two-block plan. A serving run is thousands of iterations, so plans are priced once per
/// bucket of tokens per GPU (exact below 32, then steps of 2^(1/16), about 4.4%): the rest of the
/// pass depends on the tokens only, and the blocks' attention cores (what the requests' contexts
/// change) run one after the other, so another batch of the bucket costs the bucket's price plus
/// the difference of its cores' time (the backend's, for the core alone) once per block.
class IterationPricer {
 public:
  IterationPricer(const Scenario& instance, const StrategySpec& spec,
                  const MakeInstanceBackend& make);
  ~IterationPricer();
  double operator()(const BatchShape& batch);
  /// Token buckets priced (each up to three plans).
  long long evaluations() const;
  /// The seconds of a batch of `tokens_per_gpu` tokens per GPU with the given attention load
  /// per GPU (exact: no grid).
  double price_per_gpu(long long tokens_per_gpu, double decode_pairs, double prefill_pairs,
                       double kv_read_tokens);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct PoolReport {
  std::string key;  // "serving.instance", "serving.prefill", "serving.decode"
  int nodes = 0, instances = 0, gpus_per_instance = 0, ep = 0;
  KvGeometry kv;
  InstanceConfig config;
  long long priced_batches = 0;  // the pricer's grid points
  ServingResult result;
};

struct ServingReport {
  std::string strategy;
  bool disaggregated = false;
  workload::RequestStats requests;
  ServingMetrics metrics;
  ServingResult overall;
  std::vector<PoolReport> pools;  // co-located: one; disaggregated: prefill, decode
  double kv_transfer_mean_s = 0;  // disaggregated: prefill to decode, per request
  // Throughput per node of the pool that does the work, in the steady window (from the arrival of
  // the request a tenth of the way in to the last arrival: warm-up and drain left out; the whole
  // run when those arrive together, as a single request does): input
  // tokens (prompt, cached included) per second over the prefill nodes (co-located: all nodes),
  // output tokens over the decode nodes.
  WindowThroughput window;
  double input_tokens_per_s_per_node = 0;
  double output_tokens_per_s_per_node = 0;
  double output_tokens_per_s_per_user = 0;  // 1 / mean TPOT
};

/// Runs `sc.serving` (which must be set) with strategy `spec`. `cluster` is the whole cluster's
/// topology (the KV transfer's route); `make` builds each pool's instance backend.
ServingReport run_serving(const Scenario& sc, const StrategySpec& spec,
                          const topology::Topology& cluster, const MakeInstanceBackend& make);

}  // namespace moesim::serving
