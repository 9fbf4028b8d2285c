// The `serving:` section of a scenario (docs/serving.md): the requests a deployment serves, the
// pools of model instances that serve them (co-located, or prefill and decode disaggregated),
// their batching limits and KV cache, and the latency objective. Plain data read by
// core/scenario_loader; strategies/serving/ simulates it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/cluster_spec.hpp"
#include "core/units.hpp"
#include "core/yaml_reader.hpp"

namespace moesim {

// Bounds a generated or traced workload (a mistyped count must not exhaust memory) and a length
// (a prompt beyond any model's context is a typo).
inline constexpr long long kMaxServingRequests = 100'000'000;
inline constexpr int kMaxRequestTokens = 1 << 24;
inline constexpr long long kMaxServingKvTokens = 1LL << 40;

/// A length distribution in tokens. Lognormal is given by its mean and coefficient of variation
/// (the shape measured serving traces report) and clipped to [min, max].
struct LengthSpec {
  enum class Kind { kFixed, kUniform, kLognormal };
  Kind kind = Kind::kFixed;
  int tokens = 0;        // kFixed
  int min = 1, max = 0;  // kUniform bounds; kLognormal clip (max 0: no upper clip)
  double mean = 0;       // kLognormal
  double cv = 0;         // kLognormal: standard deviation / mean
};

/// `serving.requests`: generated (Poisson or gamma arrivals, length distributions, a prefix-cache
/// hit share, a seed) or a request trace file.
struct RequestSpec {
  enum class Arrival { kPoisson, kGamma, kTrace };
  Arrival arrival = Arrival::kPoisson;
  double requests_per_s = 0;
  // Gamma inter-arrival shape: 1 is Poisson, below 1 burstier (same mean rate), above 1 smoother.
  double burstiness = 1;
  long long count = 0;
  LengthSpec prompt, output;
  double prefix_hit = 0;  // share of every prompt found in the prefix cache, [0, 1)
  std::uint64_t seed = 1;
  std::string trace;  // kTrace: the request trace file, resolved against the scenario's folder
};

/// Reads a `requests:` map (keys: arrival, requests_per_s, burstiness, count, prompt, output,
/// prefix_hit, seed, trace); InputError with the key, its line and what is expected. `dir` is the
/// folder relative trace paths are resolved against.
RequestSpec parse_request_spec(yaml::Context& ctx, const YAML::Node& node, const std::string& path,
                               const std::string& dir);

/// One pool of identical model instances. An instance is `nodes` whole nodes running one copy of
/// the model: attention data-parallel over every GPU (each GPU its own requests' attention and KV
/// cache, as DeepSeek's and SGLang's DP attention run it), the routed experts expert-parallel over
/// `ep` GPUs (replicated over instance GPUs / ep groups). Batch limits are per attention rank (each
/// DP rank schedules its own batch); the instance's iteration runs them together.
struct ServingPool {
  int nodes = 1;      // per instance
  int instances = 1;  // data-parallel copies, requests dealt round-robin
  int ep = 0;         // 0: every GPU of the instance
  // Extra copies of experts beside the model's E (DeepSeek's redundant experts): E + R expert
  // slots over the EP group, so ep divides E + R, and every GPU holds (E + R) / ep experts.
  int redundant_experts = 0;
  // KV cache: tokens one attention rank holds; 0 = what HBM holds after the weights, at
  // memory_utilization of the GPU's memory (vLLM's gpu_memory_utilization, default 0.9).
  long long kv_tokens_per_gpu = 0;
  double memory_utilization = 0.9;
  int block_tokens = 16;        // paged KV block (vLLM's default block size)
  int max_batch_tokens = 8192;  // per attention rank and iteration (vLLM's chunked-prefill budget)
  int max_running = 256;        // requests per attention rank (vLLM's max_num_seqs)
  SourceLocation where;         // of the pool's map, for errors about it
  std::string key;              // "serving.instance", "serving.prefill", "serving.decode"
};

struct ServingSpec {
  RequestSpec requests;
  // Co-located: `instance` serves prefill and decode. Disaggregated: prefill and decode pools.
  bool disaggregated = false;
  ServingPool instance;  // co-located
  ServingPool prefill, decode;
  Dtype kv_dtype = Dtype::kFp16;  // unset in the file: model.dtype
  // The objective a request is judged by (0: not judged): time to first token and time per
  // output token.
  Seconds slo_ttft{0};
  Seconds slo_tpot{0};
};

/// Reads `serving:` (keys: requests, instance, prefill, decode, kv_dtype, slo). `instance` and
/// prefill / decode exclude each other; pools are checked against the cluster's node count.
ServingSpec parse_serving_spec(const yaml::MapReader& root, const ClusterSpec& cluster,
                               Dtype model_dtype, int model_experts);

}  // namespace moesim
