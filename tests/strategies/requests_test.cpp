// Serving requests: the seeded generators (rates, burstiness, length distributions, prefix hits),
// the request trace reader and the description's errors.
#include "strategies/workload/requests.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"

namespace moesim::workload {
namespace {

namespace fs = std::filesystem;

RequestSpec spec_of(const std::string& yaml_text, const std::string& dir = "") {
  yaml::Context ctx("s.yaml");
  return parse_request_spec(ctx, YAML::Load(yaml_text), "serving.requests", dir);
}

std::string spec_error(const std::string& yaml_text) {
  try {
    spec_of(yaml_text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("moesim_requests_" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

// Worked by hand: arrivals 0, 1, 3 s: span 3 s, 2 gaps in 3 s, gaps 1 and 2 (mean 1.5, standard
// deviation 0.5); prompts 10 and 30 with 5 and 15 cached.
TEST(Requests, StatsOfAHandWrittenList) {
  const std::vector<Request> r = {{0, 10, 4, 5}, {1, 30, 8, 15}, {3, 20, 6, 0}};
  const RequestStats s = request_stats(r);
  EXPECT_EQ(s.count, 3);
  EXPECT_DOUBLE_EQ(s.span_s, 3.0);
  EXPECT_DOUBLE_EQ(s.requests_per_s, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.mean_prompt, 20.0);
  EXPECT_DOUBLE_EQ(s.mean_output, 6.0);
  EXPECT_DOUBLE_EQ(s.cached_share, 20.0 / 60.0);
  EXPECT_DOUBLE_EQ(s.interarrival_cv, 0.5 / 1.5);
}

TEST(Requests, PoissonArrivalsHaveTheRateAndUnitVariation) {
  const RequestSpec spec = spec_of(
      "{arrival: poisson, requests_per_s: 10, count: 20000, seed: 7,"
      " prompt: {distribution: fixed, tokens: 1000}, output: {distribution: fixed, tokens: 200}}");
  const std::vector<Request> r = make_requests(spec);
  ASSERT_EQ(r.size(), 20000u);
  EXPECT_EQ(r.front().arrival_s, 0.0);
  for (std::size_t i = 1; i < r.size(); ++i) ASSERT_GE(r[i].arrival_s, r[i - 1].arrival_s);
  for (const Request& q : r) {
    ASSERT_EQ(q.prompt_tokens, 1000);
    ASSERT_EQ(q.output_tokens, 200);
    ASSERT_EQ(q.cached_tokens, 0);
  }
  const RequestStats s = request_stats(r);
  // 20,000 exponential gaps: the sample mean and CV are within ~0.7% of 1 (one standard error);
  // 3% is over four of them.
  EXPECT_NEAR(s.requests_per_s, 10.0, 0.3);
  EXPECT_NEAR(s.interarrival_cv, 1.0, 0.03);
}

TEST(Requests, GammaBurstinessKeepsTheRateAndSetsTheVariation) {
  for (const double shape : {0.25, 4.0}) {
    const RequestSpec spec = spec_of(fmt::format(
        "{{arrival: gamma, burstiness: {}, requests_per_s: 50, count: 20000, seed: 3,"
        " prompt: {{distribution: fixed, tokens: 8}}, output: {{distribution: fixed, tokens: 8}}}}",
        shape));
    const RequestStats s = request_stats(make_requests(spec));
    EXPECT_NEAR(s.requests_per_s / 50.0, 1.0, 0.05) << shape;
    // Gamma of shape k: CV 1 / sqrt(k), 2 at k = 0.25, 0.5 at k = 4.
    EXPECT_NEAR(s.interarrival_cv, 1.0 / std::sqrt(shape), 0.1 / std::sqrt(shape)) << shape;
  }
}

TEST(Requests, SameSeedSameRequestsAndLengthsDoNotMoveArrivals) {
  const std::string base =
      "{arrival: poisson, requests_per_s: 2, count: 500, seed: 11, prompt: {distribution: "
      "uniform, min: 10, max: 20}, output: ";
  const auto a = make_requests(spec_of(base + "{distribution: fixed, tokens: 5}}"));
  const auto b = make_requests(spec_of(base + "{distribution: fixed, tokens: 5}}"));
  const auto c = make_requests(spec_of(base + "{distribution: lognormal, mean: 300, cv: 1}}"));
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  int same_prompt = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    EXPECT_EQ(a[i].prompt_tokens, b[i].prompt_tokens);
    EXPECT_EQ(a[i].arrival_s, c[i].arrival_s);  // arrivals have their own stream
    same_prompt += a[i].prompt_tokens == c[i].prompt_tokens;
  }
  EXPECT_LT(same_prompt, 500);  // the lengths' stream interleaves prompt and output draws
  const auto d = make_requests(spec_of(
      "{arrival: poisson, requests_per_s: 2, count: 500, seed: 12, prompt: {distribution: fixed, "
      "tokens: 1}, output: {distribution: fixed, tokens: 1}}"));
  EXPECT_NE(a[1].arrival_s, d[1].arrival_s);
}

TEST(Requests, LengthDistributions) {
  const auto u = make_requests(spec_of(
      "{requests_per_s: 1, count: 20000, prompt: {distribution: uniform, min: 100, max: 300},"
      " output: {distribution: lognormal, mean: 500, cv: 0.5}}"));
  const auto clipped = make_requests(
      spec_of("{requests_per_s: 1, count: 20000, prompt: {distribution: fixed, tokens: 64},"
              " output: {distribution: lognormal, mean: 500, cv: 2, min: 50, max: 800}}"));
  int lo = 1 << 30, hi = 0;
  for (const Request& r : u) {
    lo = std::min(lo, r.prompt_tokens);
    hi = std::max(hi, r.prompt_tokens);
  }
  EXPECT_EQ(lo, 100);
  EXPECT_EQ(hi, 300);
  const RequestStats s = request_stats(u);
  EXPECT_NEAR(s.mean_prompt, 200.0, 2.0);   // uniform on 100..300: standard error 0.4
  EXPECT_NEAR(s.mean_output, 500.0, 10.0);  // lognormal of mean 500, CV 0.5: standard error 1.8
  for (const Request& r : clipped) {
    ASSERT_GE(r.output_tokens, 50);
    ASSERT_LE(r.output_tokens, 800);
  }
  EXPECT_LT(request_stats(clipped).mean_output, 500.0);  // the clip takes the long tail
}

TEST(Requests, PrefixHitCachesWholeTokensAndLeavesOneToPrefill) {
  const auto r = make_requests(spec_of(
      "{requests_per_s: 1, count: 3, prefix_hit: 0.563, prompt: {distribution: fixed, tokens: "
      "1000}, output: {distribution: fixed, tokens: 1}}"));
  for (const Request& q : r) EXPECT_EQ(q.cached_tokens, 563);
  const auto one = make_requests(spec_of(
      "{requests_per_s: 1, count: 1, prefix_hit: 0.99, prompt: {distribution: fixed, tokens: 1},"
      " output: {distribution: fixed, tokens: 1}}"));
  EXPECT_EQ(one[0].cached_tokens, 0);
}

TEST(Requests, TraceReadsAnyColumnOrderAndIsResolvedAgainstTheScenario) {
  const fs::path d = temp_dir();
  std::ofstream(d / "t.csv") << "# a request trace\n"
                                "output_tokens, arrival_s, prompt_tokens, cached_tokens\n"
                                "10, 0.0, 100, 0\n"
                                "\n"
                                "20, 0.25, 4096, 2048\n"
                                "1, 0.25, 7, 6\n";
  const RequestSpec spec = spec_of("{arrival: trace, trace: t.csv}", d.string());
  EXPECT_EQ(spec.trace, (d / "t.csv").string());
  const auto r = make_requests(spec);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].arrival_s, 0.25);
  EXPECT_EQ(r[1].prompt_tokens, 4096);
  EXPECT_EQ(r[1].output_tokens, 20);
  EXPECT_EQ(r[1].cached_tokens, 2048);
  EXPECT_EQ(r[2].cached_tokens, 6);
  fs::remove_all(d);
}

TEST(Requests, TheBundledExampleTraceReads) {
  const auto r =
      read_request_trace(std::string(MOESIM_SOURCE_DIR) + "/scenarios/traces/requests-example.csv");
  ASSERT_EQ(r.size(), 8u);
  EXPECT_EQ(r.back().arrival_s, 0.322);
  EXPECT_EQ(r[6].prompt_tokens, 15000);
  EXPECT_EQ(r[6].cached_tokens, 12288);
  const RequestStats s = request_stats(r);
  EXPECT_DOUBLE_EQ(s.requests_per_s, 7 / 0.322);
}

TEST(Requests, TraceErrorsNameTheLineAndColumn) {
  const fs::path d = temp_dir();
  auto error_of = [&](const std::string& text) -> std::string {
    std::ofstream(d / "bad.csv") << text;
    try {
      read_request_trace((d / "bad.csv").string());
    } catch (const InputError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_THAT(error_of("arrival_s,prompt,output_tokens\n"),
              ::testing::HasSubstr("bad.csv:1:11: serving.requests.trace: found column 'prompt'"));
  EXPECT_THAT(error_of("arrival_s,output_tokens\n0,1\n"),
              ::testing::HasSubstr("found no 'prompt_tokens' column"));
  EXPECT_THAT(error_of("arrival_s,prompt_tokens,output_tokens\n1,5,5\n0.5,5,5\n"),
              ::testing::HasSubstr("bad.csv:3:1: serving.requests.trace: found arrival 0.5 s "
                                   "before the previous row's 1 s"));
  EXPECT_THAT(
      error_of("arrival_s,prompt_tokens,output_tokens\n0,5\n"),
      ::testing::HasSubstr("bad.csv:2:1: serving.requests.trace: found 2 fields, expected 3"));
  EXPECT_THAT(error_of("arrival_s,prompt_tokens,output_tokens\n0,5,0\n"),
              ::testing::HasSubstr("bad.csv:2:5: serving.requests.trace: found '0' in column "
                                   "output_tokens, expected an integer in [1, 16777216]"));
  EXPECT_THAT(error_of("arrival_s,prompt_tokens,output_tokens,cached_tokens\n0,5,1,5\n"),
              ::testing::HasSubstr("bad.csv:2:7: serving.requests.trace: found 5 cached tokens of "
                                   "a 5-token prompt"));
  EXPECT_THAT(error_of("arrival_s,prompt_tokens,output_tokens\n-1,5,1\n"),
              ::testing::HasSubstr("expected a time in seconds >= 0"));
  EXPECT_THAT(error_of("# nothing\n"), ::testing::HasSubstr("found no header"));
  EXPECT_THAT(error_of("arrival_s,prompt_tokens,output_tokens\n"),
              ::testing::HasSubstr("found a header but no requests"));
  EXPECT_THAT(error_of(""), ::testing::HasSubstr("found no header"));
  try {
    read_request_trace((d / "missing.csv").string());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("cannot open the request trace file"));
  }
  fs::remove_all(d);
}

TEST(Requests, DescriptionErrorsNameTheKeyAndWhatFits) {
  const std::string lengths =
      ", prompt: {distribution: fixed, tokens: 5}, output: {distribution: fixed, tokens: 5}";
  EXPECT_THAT(spec_error("{requests_per_s: 1" + lengths + "}"), ::testing::HasSubstr("count"));
  EXPECT_THAT(spec_error("{requests_per_s: 0, count: 1" + lengths + "}"),
              ::testing::HasSubstr("serving.requests.requests_per_s: found 0, expected a rate"));
  EXPECT_THAT(spec_error("{burstiness: 0.5, requests_per_s: 1, count: 1" + lengths + "}"),
              ::testing::HasSubstr("burstiness applies to arrival: gamma"));
  EXPECT_THAT(
      spec_error("{arrival: gamma, burstiness: 0, requests_per_s: 1, count: 1" + lengths + "}"),
      ::testing::HasSubstr("expected a gamma shape in [0.01, 100]"));
  EXPECT_THAT(spec_error("{arrival: poison, requests_per_s: 1, count: 1" + lengths + "}"),
              ::testing::HasSubstr("did you mean 'poisson'"));
  EXPECT_THAT(spec_error("{arrival: trace, trace: t.csv, count: 3}"),
              ::testing::HasSubstr("'count' does not apply to arrival: trace"));
  EXPECT_THAT(spec_error("{trace: t.csv}"), ::testing::HasSubstr("add arrival: trace"));
  EXPECT_THAT(spec_error("{requests_per_s: 1, count: 1, prefix_hit: 1" + lengths + "}"),
              ::testing::HasSubstr("in [0, 1)"));
  EXPECT_THAT(spec_error("{requests_per_s: 1, count: 1, prompt: {distribution: uniform, min: 9, "
                         "max: 3}, output: {distribution: fixed, tokens: 5}}"),
              ::testing::HasSubstr("serving.requests.prompt.max: found max 3 below min 9"));
  EXPECT_THAT(spec_error("{requests_per_s: 1, count: 1, prompt: {distribution: lognormal, mean: "
                         "100, cv: 0}, output: {distribution: fixed, tokens: 5}}"),
              ::testing::HasSubstr("serving.requests.prompt.cv: found 0"));
  EXPECT_THAT(
      spec_error("{requests_per_s: 1, count: 1, prompt: {distribution: fixed, tokens: 5, "
                 "mean: 3}, output: {distribution: fixed, tokens: 5}}"),
      ::testing::HasSubstr("'mean' does not apply to distribution fixed (its keys: tokens)"));
  EXPECT_THAT(spec_error("{requests_per_s: 1, count: 1, prompt: {tokens: 5}, output: "
                         "{distribution: fixed, tokens: 5}}"),
              ::testing::HasSubstr("distribution"));
}

}  // namespace
}  // namespace moesim::workload
