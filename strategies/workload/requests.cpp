// Serving requests: parsing the description, generating seeded requests, reading request traces.
#include "strategies/workload/requests.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <optional>

#include "core/error.hpp"
#include "strategies/workload/csv.hpp"
#include "strategies/workload/random.hpp"

namespace moesim::workload {

namespace {

constexpr long long kMaxRequests = kMaxServingRequests;
constexpr int kMaxTokens = kMaxRequestTokens;

// Our own normal and gamma draws (not std::*_distribution, whose algorithms differ between
// standard libraries): the same seed gives the same requests everywhere.
double normal(detail::Xoshiro256& rng) {
  const double u1 = 1.0 - rng.uniform();  // (0, 1]
  const double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Marsaglia and Tsang's method; shape < 1 through the boost g * U^(1 / shape).
double gamma(detail::Xoshiro256& rng, double shape) {
  const bool boost = shape < 1;
  const double a = boost ? shape + 1 : shape;
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  double g = 0;
  while (true) {
    double x = 0, v = 0;
    do {
      x = normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - rng.uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) {
      g = d * v;
      break;
    }
  }
  if (boost) g *= std::pow(1.0 - rng.uniform(), 1.0 / shape);
  return g;
}

int draw_length(const LengthSpec& l, detail::Xoshiro256& rng) {
  switch (l.kind) {
    case LengthSpec::Kind::kFixed:
      return l.tokens;
    case LengthSpec::Kind::kUniform:
      return l.min + static_cast<int>(rng.below(static_cast<std::uint32_t>(l.max - l.min + 1)));
    case LengthSpec::Kind::kLognormal: {
      const double s2 = std::log1p(l.cv * l.cv);
      const double x = std::exp(std::log(l.mean) - 0.5 * s2 + std::sqrt(s2) * normal(rng));
      double t = std::max(static_cast<double>(l.min), std::round(x));
      if (l.max > 0) t = std::min(t, static_cast<double>(l.max));
      return static_cast<int>(std::min(t, static_cast<double>(kMaxTokens)));
    }
  }
  return l.tokens;
}

constexpr const char* kTraceKey = "serving.requests.trace";

[[noreturn]] void trace_fail(const std::string& path, int line, int column,
                             const std::string& message) {
  throw InputError(SourceLocation{path, line, column}, kTraceKey, message);
}

enum Column { kArrival, kPrompt, kOutput, kCached, kNumColumns };
constexpr std::array<const char*, kNumColumns> kColumns = {"arrival_s", "prompt_tokens",
                                                           "output_tokens", "cached_tokens"};

}  // namespace

std::vector<Request> make_requests(const RequestSpec& spec) {
  if (spec.arrival == RequestSpec::Arrival::kTrace) return read_request_trace(spec.trace);
  // One substream per purpose, so changing the length distribution keeps the arrival times.
  detail::Xoshiro256 arrivals(detail::mix64(spec.seed ^ 0x7365727665ULL));              // "serve"
  detail::Xoshiro256 lengths(detail::mix64(detail::mix64(spec.seed) ^ 0x6c656e67ULL));  // "leng"
  const double shape = spec.arrival == RequestSpec::Arrival::kGamma ? spec.burstiness : 1.0;
  std::vector<Request> out(static_cast<std::size_t>(spec.count));
  double t = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    Request& r = out[i];
    // Gamma gaps of mean 1 / rate: shape k, scale 1 / (k rate). The first request arrives at 0.
    if (i > 0)
      t += shape == 1.0 ? -std::log(1.0 - arrivals.uniform()) / spec.requests_per_s
                        : gamma(arrivals, shape) / (shape * spec.requests_per_s);
    r.arrival_s = t;
    r.prompt_tokens = draw_length(spec.prompt, lengths);
    r.output_tokens = draw_length(spec.output, lengths);
    // The cached prefix is whole tokens and leaves at least one prompt token to prefill.
    r.cached_tokens = std::min(r.prompt_tokens - 1,
                               static_cast<int>(std::floor(spec.prefix_hit * r.prompt_tokens)));
  }
  return out;
}

std::vector<Request> read_request_trace(const std::string& path) {
  std::ifstream in = detail::open_trace(path, kTraceKey, "request trace");
  std::array<int, kNumColumns> index{};
  index.fill(-1);
  std::size_t num_fields = 0;
  std::vector<Request> out;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    const std::string_view content = detail::trim(text);
    if (content.empty() || content.front() == '#') continue;
    const std::vector<detail::Field> fields = detail::split_fields(text);
    if (num_fields == 0) {  // the header
      for (std::size_t i = 0; i < fields.size(); ++i) {
        const auto it = std::find(kColumns.begin(), kColumns.end(), fields[i].text);
        if (it == kColumns.end())
          trace_fail(path, line, fields[i].column,
                     fmt::format("found column '{}' in the header, expected arrival_s, "
                                 "prompt_tokens, output_tokens and optionally cached_tokens",
                                 fields[i].text));
        const auto c = static_cast<std::size_t>(it - kColumns.begin());
        if (index[c] >= 0)
          trace_fail(path, line, fields[i].column,
                     fmt::format("found column '{}' twice in the header", kColumns[c]));
        index[c] = static_cast<int>(i);
      }
      for (std::size_t c = 0; c < kCached; ++c)
        if (index[c] < 0)
          trace_fail(path, line, 1,
                     fmt::format("found no '{}' column in the header '{}', expected "
                                 "arrival_s,prompt_tokens,output_tokens[,cached_tokens]",
                                 kColumns[c], content));
      num_fields = fields.size();
      continue;
    }
    if (fields.size() != num_fields)
      trace_fail(
          path, line, 1,
          fmt::format("found {} fields, expected {} as in the header", fields.size(), num_fields));
    if (static_cast<long long>(out.size()) >= kMaxRequests)
      trace_fail(path, line, 1, fmt::format("more than {} requests", kMaxRequests));
    Request r;
    for (std::size_t c = 0; c < kNumColumns; ++c) {
      if (index[c] < 0) continue;
      const detail::Field& f = fields[static_cast<std::size_t>(index[c])];
      const char* end = f.text.data() + f.text.size();
      if (c == kArrival) {
        double v = -1;
        const auto [ptr, e] = std::from_chars(f.text.data(), end, v);
        if (e != std::errc() || ptr != end || f.text.empty() || !std::isfinite(v) || v < 0)
          trace_fail(path, line, f.column,
                     fmt::format("found '{}' in column arrival_s, expected a time in seconds "
                                 ">= 0",
                                 f.text));
        if (!out.empty() && v < out.back().arrival_s)
          trace_fail(path, line, f.column,
                     fmt::format("found arrival {} s before the previous row's {} s, expected "
                                 "requests in arrival order",
                                 v, out.back().arrival_s));
        r.arrival_s = v;
        continue;
      }
      long long v = -1;
      const auto [ptr, e] = std::from_chars(f.text.data(), end, v);
      const long long lo = c == kCached ? 0 : 1;
      if (e != std::errc() || ptr != end || f.text.empty() || v < lo || v > kMaxTokens)
        trace_fail(path, line, f.column,
                   fmt::format("found '{}' in column {}, expected an integer in [{}, {}]", f.text,
                               kColumns[c], lo, kMaxTokens));
      (c == kPrompt   ? r.prompt_tokens
       : c == kOutput ? r.output_tokens
                      : r.cached_tokens) = static_cast<int>(v);
    }
    if (r.cached_tokens >= r.prompt_tokens)
      trace_fail(path, line, fields[static_cast<std::size_t>(index[kCached])].column,
                 fmt::format("found {} cached tokens of a {}-token prompt, expected fewer than the "
                             "prompt (at least one token to prefill)",
                             r.cached_tokens, r.prompt_tokens));
    out.push_back(r);
  }
  if (out.empty())
    trace_fail(path, 0, 0,
               num_fields == 0 ? "found no header, expected arrival_s,prompt_tokens,output_tokens"
                               : "found a header but no requests");
  return out;
}

RequestStats request_stats(const std::vector<Request>& requests) {
  RequestStats s;
  s.count = static_cast<long long>(requests.size());
  if (requests.empty()) return s;
  double prompt = 0, output = 0, cached = 0;
  for (const Request& r : requests) {
    prompt += r.prompt_tokens;
    output += r.output_tokens;
    cached += r.cached_tokens;
  }
  s.mean_prompt = prompt / static_cast<double>(s.count);
  s.mean_output = output / static_cast<double>(s.count);
  s.cached_share = prompt > 0 ? cached / prompt : 0;
  s.span_s = requests.back().arrival_s - requests.front().arrival_s;
  if (s.count > 1 && s.span_s > 0) {
    const double gaps = static_cast<double>(s.count - 1);
    s.requests_per_s = gaps / s.span_s;
    const double mean_gap = s.span_s / gaps;
    double var = 0;
    for (std::size_t i = 1; i < requests.size(); ++i) {
      const double d = requests[i].arrival_s - requests[i - 1].arrival_s - mean_gap;
      var += d * d;
    }
    s.interarrival_cv = std::sqrt(var / gaps) / mean_gap;
  }
  return s;
}

}  // namespace moesim::workload
