// Continuous batching of serving requests on model instances (docs/serving.md): iteration-level
// scheduling with chunked prefill, a paged KV cache with admission and preemption, and the
// latency figures serving is judged by (TTFT, TPOT, goodput under an SLO). What one iteration of
// a batch costs is a callback: the serving engine prices it with the plan of one forward pass on
// the simulated topology; the tests with hand-checkable constants.
#pragma once

#include <functional>
#include <vector>

#include "strategies/workload/requests.hpp"

namespace moesim::serving {

/// What one iteration's batch computes: decode tokens (one per decoding request), prefill tokens
/// (chunks of prompts), the KV tokens the batch's attention reads, and the query-key pairs its
/// attention computes (a decode: its whole context; a prefill chunk: causal over the cached
/// prefix, the earlier chunks and itself).
struct BatchShape {
  int requests = 0;
  int decode_tokens = 0;
  int prefill_tokens = 0;
  long long context_tokens = 0;
  long long decode_pairs = 0;
  double prefill_pairs = 0;
};

/// Seconds one iteration of `batch` takes on an instance.
using IterationTime = std::function<double(const BatchShape& batch)>;

struct InstanceConfig {
  long long kv_capacity_tokens = 0;  // KV cache of one instance, in tokens
  int block_tokens = 16;             // paged KV blocks of this many tokens
  int max_batch_tokens = 8192;       // tokens one iteration computes (decode + prefill chunks)
  int max_running = 256;             // requests one batch holds
  int instances = 1;                 // data-parallel copies; requests dealt round-robin
};

struct RequestOutcome {
  double first_token_s = 0;  // end of the iteration that finished its first prefill
  double finish_s = 0;       // end of the iteration that generated its last token
  int preemptions = 0;       // times its KV was freed to make room (then recomputed)
  int instance = 0;
};

/// Tokens one iteration of one instance produced, at its end: output tokens emitted, and the
/// prompt tokens (cached ones included) of the prefills it finished.
struct TokenEvent {
  double time_s = 0;
  int output_tokens = 0;
  long long input_tokens = 0;
};

struct ServingResult {
  std::vector<RequestOutcome> requests;  // in the input's order
  std::vector<TokenEvent> tokens;        // every iteration's, instance by instance
  long long iterations = 0;
  long long preemptions = 0;
  double makespan_s = 0;      // first arrival to last finish
  double kv_utilization = 0;  // time-averaged share of KV blocks in use while busy
};

/// Runs `requests` (in arrival order) through continuous batching. InputError (key
/// `serving.kv_cache`) when a request's prompt and output cannot fit one instance's KV cache, or
/// when the configuration is inconsistent (max_running above max_batch_tokens, sizes <= 0).
ServingResult simulate_continuous_batching(const std::vector<workload::Request>& requests,
                                           const InstanceConfig& config,
                                           const IterationTime& iteration_time);

/// Seconds to move one request's KV cache from its prefill instance to its decode instance.
using KvTransferTime = std::function<double(const workload::Request& request)>;

struct DisaggregatedResult {
  ServingResult overall;  // first tokens from the prefill pool, finishes from the decode pool;
                          // kv_utilization the decode pool's
  ServingResult prefill;  // each request through its first token (requests in the input's order)
  ServingResult decode;   // requests with more than one output token (others: zeros)
};

/// Prefill / decode disaggregation: the prefill pool runs every request to its first token; the
/// request then arrives at the decode pool when its KV has moved (`kv_transfer` after the first
/// token), with nothing to prefill, and decodes the rest there.
DisaggregatedResult simulate_disaggregated(const std::vector<workload::Request>& requests,
                                           const InstanceConfig& prefill,
                                           const IterationTime& prefill_time,
                                           const InstanceConfig& decode,
                                           const IterationTime& decode_time,
                                           const KvTransferTime& kv_transfer);

/// Distribution of one latency figure (percentiles by linear interpolation between order
/// statistics).
struct Latency {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};
Latency latency_of(std::vector<double> samples);

/// A latency objective: a request meets it when its TTFT and its TPOT are both within.
struct Slo {
  double ttft_s = 0;  // 0: not judged
  double tpot_s = 0;
};

struct ServingMetrics {
  Latency ttft_s, tpot_s, e2e_s;  // TPOT over requests with more than one output token
  double input_tokens_per_s = 0, output_tokens_per_s = 0;  // over the makespan
  double goodput_requests_per_s = 0;                       // requests meeting the SLO
  double slo_attainment = 0;                               // their share of all requests
};
ServingMetrics serving_metrics(const std::vector<workload::Request>& requests,
                               const ServingResult& result, const Slo& slo);

/// Steady-state throughput: the input and output tokens of `result`'s iterations that ended in
/// [start_s, end_s], per second of that window (warm-up and drain left out).
struct WindowThroughput {
  double start_s = 0, end_s = 0;
  double input_tokens_per_s = 0, output_tokens_per_s = 0;
};
WindowThroughput window_throughput(const ServingResult& result, double start_s, double end_s);

}  // namespace moesim::serving
