// Continuous batching worked by hand with constant iteration times (prefill, chunking, cached
// prefixes, decode joining, preemption), conservation of computed tokens on a generated workload,
// the latency summaries and the configuration errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "core/error.hpp"
#include "strategies/serving/continuous_batching.hpp"

namespace moesim::serving {
namespace {

using workload::Request;

InstanceConfig roomy() {
  InstanceConfig c;
  c.kv_capacity_tokens = 1 << 20;
  c.block_tokens = 16;
  c.max_batch_tokens = 100;
  c.max_running = 8;
  return c;
}

IterationTime one_second(std::vector<BatchShape>* seen = nullptr) {
  return [seen](const BatchShape& b) {
    if (seen != nullptr) seen->push_back(b);
    return 1.0;
  };
}

// Prompt 10, output 3, 1 s per iteration: the prefill gives the first token at 1 s, two decodes
// the others at 2 and 3 s.
TEST(ContinuousBatching, OneRequestByHand) {
  std::vector<BatchShape> seen;
  const std::vector<Request> q = {{0, 10, 3, 0}};
  const ServingResult r = simulate_continuous_batching(q, roomy(), one_second(&seen));
  ASSERT_EQ(r.iterations, 3);
  EXPECT_EQ(r.requests[0].first_token_s, 1.0);
  EXPECT_EQ(r.requests[0].finish_s, 3.0);
  EXPECT_EQ(r.makespan_s, 3.0);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].prefill_tokens, 10);
  EXPECT_EQ(seen[0].decode_tokens, 0);
  EXPECT_EQ(seen[0].context_tokens, 10);
  EXPECT_EQ(seen[1].decode_tokens, 1);
  EXPECT_EQ(seen[1].context_tokens, 11);  // the prompt and the token being decoded
  EXPECT_EQ(seen[2].context_tokens, 12);
  const ServingMetrics m = serving_metrics(q, r, Slo{1.0, 1.0});
  EXPECT_EQ(m.ttft_s.p50, 1.0);
  EXPECT_EQ(m.tpot_s.p50, 1.0);
  EXPECT_EQ(m.e2e_s.p99, 3.0);
  EXPECT_DOUBLE_EQ(m.input_tokens_per_s, 10.0 / 3.0);
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s, 1.0);
  EXPECT_EQ(m.slo_attainment, 1.0);
  EXPECT_EQ(serving_metrics(q, r, Slo{0.5, 0}).slo_attainment, 0.0);
  // Every iteration's tokens: the prompt and the first token at 1 s, a token at 2 s and 3 s.
  ASSERT_EQ(r.tokens.size(), 3u);
  EXPECT_EQ(r.tokens[0].time_s, 1.0);
  EXPECT_EQ(r.tokens[0].input_tokens, 10);
  EXPECT_EQ(r.tokens[0].output_tokens, 1);
  EXPECT_EQ(r.tokens[2].time_s, 3.0);
  EXPECT_EQ(r.tokens[2].input_tokens, 0);
  EXPECT_EQ(r.tokens[2].output_tokens, 1);
  // The window [1.5, 3] holds the iterations ending at 2 and 3 s: 2 tokens in 1.5 s, no input.
  const WindowThroughput w = window_throughput(r, 1.5, 3.0);
  EXPECT_DOUBLE_EQ(w.output_tokens_per_s, 2.0 / 1.5);
  EXPECT_EQ(w.input_tokens_per_s, 0.0);
  EXPECT_DOUBLE_EQ(window_throughput(r, 0.0, 2.0).input_tokens_per_s, 5.0);
}

// Prompt 250 with 100 tokens per iteration: chunks of 100, 100, 50; the first token at 3 s. With
// 200 of it cached, one chunk of 50 that attends to all 250.
TEST(ContinuousBatching, ChunkedPrefillAndCachedPrefix) {
  std::vector<BatchShape> seen;
  const ServingResult r =
      simulate_continuous_batching({{0, 250, 1, 0}}, roomy(), one_second(&seen));
  EXPECT_EQ(r.requests[0].first_token_s, 3.0);
  EXPECT_EQ(r.requests[0].finish_s, 3.0);  // one output token: the prefill's
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].prefill_tokens, 100);
  EXPECT_EQ(seen[1].context_tokens, 200);
  EXPECT_EQ(seen[2].prefill_tokens, 50);
  EXPECT_EQ(seen[2].context_tokens, 250);
  seen.clear();
  const ServingResult c =
      simulate_continuous_batching({{0, 250, 1, 200}}, roomy(), one_second(&seen));
  EXPECT_EQ(c.requests[0].first_token_s, 1.0);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].prefill_tokens, 50);
  EXPECT_EQ(seen[0].context_tokens, 250);
}

// A request arriving mid-iteration joins the next one beside the running decode; an idle instance
// waits for the next arrival.
TEST(ContinuousBatching, ArrivalsJoinTheNextIterationAndIdleTimeIsSkipped) {
  std::vector<BatchShape> seen;
  const std::vector<Request> q = {{0, 10, 3, 0}, {0.5, 20, 2, 0}, {10, 5, 1, 0}};
  const ServingResult r = simulate_continuous_batching(q, roomy(), one_second(&seen));
  EXPECT_EQ(r.requests[1].first_token_s, 2.0);  // admitted at 1 s, prefilled by 2 s
  EXPECT_EQ(r.requests[1].finish_s, 3.0);
  EXPECT_EQ(r.requests[0].finish_s, 3.0);
  EXPECT_EQ(seen[1].decode_tokens, 1);
  EXPECT_EQ(seen[1].prefill_tokens, 20);
  EXPECT_EQ(seen[1].requests, 2);
  EXPECT_EQ(r.requests[2].first_token_s, 11.0);
  EXPECT_EQ(r.iterations, 4);
  EXPECT_EQ(r.makespan_s, 11.0);
  const ServingMetrics m = serving_metrics(q, r, Slo{});
  EXPECT_DOUBLE_EQ(m.ttft_s.mean, (1.0 + 1.5 + 1.0) / 3);
}

// KV of 12 one-token blocks, two requests of prompt 5 and output 4. Both prefill (10 blocks) and
// decode once (12); at the third iteration the first needs a 13th block, so the latest admitted
// gives its 6 up and waits. The first finishes at 4 s; the second then recomputes its prompt and
// two generated tokens (7 tokens, 5 s) and decodes its last token at 6 s.
TEST(ContinuousBatching, PreemptionByHand) {
  InstanceConfig c = roomy();
  c.kv_capacity_tokens = 12;
  c.block_tokens = 1;
  std::vector<BatchShape> seen;
  const std::vector<Request> q = {{0, 5, 4, 0}, {0, 5, 4, 0}};
  const ServingResult r = simulate_continuous_batching(q, c, one_second(&seen));
  EXPECT_EQ(r.preemptions, 1);
  EXPECT_EQ(r.requests[0].preemptions, 0);
  EXPECT_EQ(r.requests[1].preemptions, 1);
  EXPECT_EQ(r.requests[0].finish_s, 4.0);
  EXPECT_EQ(r.requests[1].first_token_s, 1.0);
  EXPECT_EQ(r.requests[1].finish_s, 6.0);
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[4].prefill_tokens, 7);
  // Blocks in use per iteration: 10, 12, 7, 8, 7, 8 of 12 over 6 s.
  EXPECT_DOUBLE_EQ(r.kv_utilization, (10.0 + 12 + 7 + 8 + 7 + 8) / (6 * 12));
}

TEST(ContinuousBatching, InstancesAreDealtRoundRobin) {
  InstanceConfig c = roomy();
  c.instances = 2;
  const std::vector<Request> q = {{0, 10, 2, 0}, {0, 10, 2, 0}, {0, 10, 2, 0}, {0, 10, 2, 0}};
  const ServingResult r = simulate_continuous_batching(q, c, one_second());
  for (std::size_t i = 0; i < q.size(); ++i)
    EXPECT_EQ(r.requests[i].instance, static_cast<int>(i % 2));
  EXPECT_EQ(r.iterations, 4);  // each instance: one prefill of two requests, one decode
  EXPECT_EQ(r.makespan_s, 2.0);
}

// Disaggregated: prefill 1 s per iteration, decode 0.5 s, KV moves in 0.25 s. A (prompt 10,
// output 3) gets its first token at 1 s in the prefill pool, reaches the decode pool at 1.25 s and
// decodes tokens 2 and 3 by 1.75 and 2.25 s; B (output 1) is done by its prefill.
TEST(ContinuousBatching, DisaggregatedPrefillAndDecodeByHand) {
  std::vector<BatchShape> pre, dec;
  const std::vector<Request> q = {{0, 10, 3, 0}, {0, 10, 1, 0}};
  const IterationTime half = [&dec](const BatchShape& b) {
    dec.push_back(b);
    return 0.5;
  };
  const DisaggregatedResult d = simulate_disaggregated(q, roomy(), one_second(&pre), roomy(), half,
                                                       [](const Request&) { return 0.25; });
  ASSERT_EQ(pre.size(), 1u);
  EXPECT_EQ(pre[0].prefill_tokens, 20);
  ASSERT_EQ(dec.size(), 2u);
  EXPECT_EQ(dec[0].prefill_tokens, 0);
  EXPECT_EQ(dec[0].decode_tokens, 1);
  EXPECT_EQ(dec[0].context_tokens, 11);  // the moved prompt and the first token
  EXPECT_EQ(d.overall.requests[0].first_token_s, 1.0);
  EXPECT_EQ(d.overall.requests[0].finish_s, 2.25);
  EXPECT_EQ(d.overall.requests[1].finish_s, 1.0);
  EXPECT_EQ(d.overall.makespan_s, 2.25);
  EXPECT_EQ(d.overall.iterations, 3);
  const ServingMetrics m = serving_metrics(q, d.overall, Slo{});
  EXPECT_DOUBLE_EQ(m.tpot_s.p50, 0.625);  // (2.25 - 1) / 2: the move is part of the decode time
}

// Property: with room for everything, the iterations compute every prompt's uncached tokens once
// and every output token after the first once; outcomes are ordered in time.
TEST(ContinuousBatching, ComputedTokensAreConserved) {
  yaml::Context ctx("s.yaml");
  const workload::RequestSpec spec = workload::parse_request_spec(
      ctx,
      YAML::Load("{arrival: gamma, burstiness: 0.5, requests_per_s: 40, count: 3000, seed: 5,"
                 " prefix_hit: 0.3, prompt: {distribution: lognormal, mean: 600, cv: 1, max: "
                 "4000}, output: {distribution: uniform, min: 1, max: 300}}"),
      "serving.requests", "");
  const std::vector<Request> q = workload::make_requests(spec);
  InstanceConfig c;
  c.kv_capacity_tokens = 1 << 24;
  c.max_batch_tokens = 2048;
  c.max_running = 64;
  c.instances = 3;
  long long prefill = 0, decode = 0;
  const IterationTime t = [&](const BatchShape& b) {
    prefill += b.prefill_tokens;
    decode += b.decode_tokens;
    return 0.005 + 2e-5 * (b.prefill_tokens + b.decode_tokens) + 1e-8 * b.context_tokens;
  };
  const ServingResult r = simulate_continuous_batching(q, c, t);
  long long want_prefill = 0, want_decode = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    want_prefill += q[i].prompt_tokens - q[i].cached_tokens;
    want_decode += q[i].output_tokens - 1;
    ASSERT_GT(r.requests[i].first_token_s, q[i].arrival_s);
    ASSERT_GE(r.requests[i].finish_s, r.requests[i].first_token_s);
  }
  EXPECT_EQ(r.preemptions, 0);
  EXPECT_EQ(prefill, want_prefill);
  EXPECT_EQ(decode, want_decode);
  const ServingMetrics m = serving_metrics(q, r, Slo{});
  EXPECT_GE(m.ttft_s.p99, m.ttft_s.p90);
  EXPECT_GE(m.ttft_s.p90, m.ttft_s.p50);
  EXPECT_GT(r.kv_utilization, 0.0);
  EXPECT_LT(r.kv_utilization, 1.0);

  // Disaggregated, the same tokens: prefills in one pool, decodes in the other.
  prefill = decode = 0;
  const DisaggregatedResult d = simulate_disaggregated(
      q, c, t, c, t, [](const Request& x) { return 1e-6 * x.prompt_tokens; });
  EXPECT_EQ(prefill, want_prefill);
  EXPECT_EQ(decode, want_decode);
  EXPECT_EQ(d.overall.preemptions, 0);
  // A decode pool short of KV preempts and recomputes, and still finishes everything in order.
  InstanceConfig small = c;
  small.kv_capacity_tokens = 8192;
  const DisaggregatedResult p =
      simulate_disaggregated(q, c, t, small, t, [](const Request&) { return 0.0; });
  EXPECT_GT(p.decode.preemptions, 0);
  for (std::size_t i = 0; i < q.size(); ++i) {
    ASSERT_GE(p.overall.requests[i].finish_s, p.overall.requests[i].first_token_s);
    ASSERT_GE(p.overall.requests[i].finish_s, d.overall.requests[i].first_token_s);
  }
}

TEST(ContinuousBatching, PercentilesInterpolateBetweenOrderStatistics) {
  const Latency l = latency_of({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(l.mean, 2.5);
  EXPECT_DOUBLE_EQ(l.p50, 2.5);
  EXPECT_DOUBLE_EQ(l.p90, 3.7);
  EXPECT_DOUBLE_EQ(l.p99, 3.97);
}

TEST(ContinuousBatching, ConfigurationErrorsSayWhatFits) {
  InstanceConfig c = roomy();
  c.kv_capacity_tokens = 64;
  try {
    simulate_continuous_batching({{0, 60, 10, 0}}, c, one_second());
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("serving.kv_cache: request 0 needs 70 KV tokens "
                                               "(60 prompt + 10 output), one instance holds 64"));
  }
  c = roomy();
  c.max_running = 200;
  EXPECT_THROW(simulate_continuous_batching({{0, 5, 1, 0}}, c, one_second()), InputError);
}

}  // namespace
}  // namespace moesim::serving
