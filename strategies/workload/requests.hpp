// Serving requests: the arrival process and the prompt / output lengths of an inference workload
// (docs/workload.md, "Serving requests"). Either generated from a seeded description (Poisson or
// gamma arrivals, fixed, uniform or lognormal lengths, a prefix-cache hit share) or read from a
// request trace file; the same description and seed give the same requests on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/yaml_reader.hpp"

namespace moesim::workload {

/// One request: when it arrives, its prompt, how many tokens it generates, and how many of its
/// prompt tokens already have their KV cache (a prefix-cache hit, not recomputed in prefill).
struct Request {
  double arrival_s = 0;
  int prompt_tokens = 0;
  int output_tokens = 0;
  int cached_tokens = 0;
};

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
