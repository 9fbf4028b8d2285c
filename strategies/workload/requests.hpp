// Serving requests: the arrival process and the prompt / output lengths of an inference workload
// (docs/workload.md, "Serving requests"). Either generated from a seeded description (Poisson or
// gamma arrivals, fixed, uniform or lognormal lengths, a prefix-cache hit share) or read from a
// request trace file; the same description and seed give the same requests on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/serving_spec.hpp"

namespace moesim::workload {

/// One request: when it arrives, its prompt, how many tokens it generates, and how many of its
/// prompt tokens already have their KV cache (a prefix-cache hit, not recomputed in prefill).
struct Request {
  double arrival_s = 0;
  int prompt_tokens = 0;
  int output_tokens = 0;
  int cached_tokens = 0;
};

// The description's types and reader live with the scenario (core/serving_spec.hpp).
using ::moesim::LengthSpec;
using ::moesim::parse_request_spec;
using ::moesim::RequestSpec;

/// The requests `spec` describes, in arrival order (a trace's, or count generated ones).
std::vector<Request> make_requests(const RequestSpec& spec);

/// A request trace: CSV with a header naming arrival_s, prompt_tokens, output_tokens and
/// optionally cached_tokens, in any order; '#' lines are comments. Arrivals non-decreasing,
/// prompt and output >= 1, 0 <= cached < prompt. InputError at file:line:column otherwise.
std::vector<Request> read_request_trace(const std::string& path);

/// What a request list amounts to, for the report and the tests.
struct RequestStats {
  long long count = 0;
  double span_s = 0;          // last arrival - first
  double requests_per_s = 0;  // (count - 1) / span
  double mean_prompt = 0, mean_output = 0;
  double cached_share = 0;     // cached prompt tokens / prompt tokens
  double interarrival_cv = 0;  // of the gaps between arrivals (1 for Poisson)
};
RequestStats request_stats(const std::vector<Request>& requests);

}  // namespace moesim::workload
