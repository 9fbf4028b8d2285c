// Continuous batching: one instance's iteration loop, run per instance over the requests dealt to
// it; the latency summaries.
#include "strategies/serving/continuous_batching.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>

#include "core/error.hpp"

namespace moesim::serving {

namespace {

constexpr const char* kKey = "serving.kv_cache";

// A request on an instance. KV holds `kv` tokens (`admit_kv` when admitted); prefill computes
// `target` tokens (the prompt less its cached prefix, plus what it had generated when
// preempted), `done` of them so far. A request whose KV arrives ready (a disaggregated decode
// pool's) has nothing to prefill and its first token generated.
struct Live {
  int index = 0;
  long long kv = 0, blocks = 0, admit_kv = 0;
  int target = 0, done = 0;
  int generated = 0;
  bool decoding() const { return done == target; }
};

long long blocks_for(long long tokens, int block) { return (tokens + block - 1) / block; }

struct InstanceRun {
  long long iterations = 0, preemptions = 0;
  double first_arrival = 0, last_finish = 0;
  double busy_s = 0, block_seconds = 0;
};

class Instance {
 public:
  Instance(const std::vector<workload::Request>& requests, const InstanceConfig& config,
           const IterationTime& time, std::vector<RequestOutcome>& out, bool kv_ready)
      : req_(requests), cfg_(config), time_(time), out_(out), kv_ready_(kv_ready) {
    capacity_blocks_ = config.kv_capacity_tokens / config.block_tokens;
  }

  InstanceRun run(const std::vector<int>& mine) {
    InstanceRun r;
    if (mine.empty()) return r;
    r.first_arrival = req_[static_cast<std::size_t>(mine.front())].arrival_s;
    double now = r.first_arrival;
    std::size_t next = 0, finished = 0;
    while (finished < mine.size()) {
      while (next < mine.size() && req_[at(mine[next])].arrival_s <= now)
        waiting_.push_back(fresh(mine[next++]));
      if (running_.empty() && waiting_.empty()) {
        now = req_[at(mine[next])].arrival_s;
        continue;
      }
      const BatchShape shape = plan_iteration(r);
      const double dt = time_(shape);
      if (!(dt > 0) || !std::isfinite(dt))
        throw InternalError(fmt::format("serving: an iteration of {} tokens priced at {} s",
                                        shape.decode_tokens + shape.prefill_tokens, dt));
      r.block_seconds += static_cast<double>(used_blocks_) * dt;
      r.busy_s += dt;
      now += dt;
      ++r.iterations;
      TokenEvent& ev = events_.emplace_back();
      ev.time_s = now;
      finished += advance(now, ev);
    }
    r.last_finish = now;
    return r;
  }

  // Each iteration's tokens, in time order.
  const std::vector<TokenEvent>& events() const { return events_; }

 private:
  static std::size_t at(int i) { return static_cast<std::size_t>(i); }

  Live fresh(int i) const {
    const workload::Request& q = req_[at(i)];
    Live l;
    l.index = i;
    l.admit_kv = q.prompt_tokens;
    if (kv_ready_) {
      l.generated = 1;
      return l;
    }
    l.target = q.prompt_tokens - q.cached_tokens;
    return l;
  }

  // Frees the latest-admitted request's KV and puts it first in line: it recomputes its prompt
  // and what it had generated (its cached prefix still hits).
  void preempt_latest(InstanceRun& r) {
    Live l = running_.back();
    running_.pop_back();
    used_blocks_ -= l.blocks;
    const workload::Request& q = req_[at(l.index)];
    l.kv = l.blocks = 0;
    l.admit_kv = q.prompt_tokens + l.generated;
    l.target = q.prompt_tokens - q.cached_tokens + l.generated;
    l.done = 0;
    ++out_[at(l.index)].preemptions;
    ++r.preemptions;
    waiting_.push_front(l);
  }

  // Chooses this iteration's batch: decodes first (each may need one more KV block, taken from the
  // latest-admitted request when none is free), then running prefills, then admissions in
  // arrival order while tokens, batch slots and KV blocks last. `chunk_` holds each running
  // request's prefill tokens this iteration.
  BatchShape plan_iteration(InstanceRun& r) {
    BatchShape s;
    // Requests whose KV arrived ready join first, to decode in this iteration.
    while (!waiting_.empty() && waiting_.front().decoding() &&
           static_cast<int>(running_.size()) < cfg_.max_running && admit())
      ;
    for (std::size_t k = 0; k < running_.size(); ++k) {
      Live& l = running_[k];
      if (!l.decoding()) continue;
      const long long need = blocks_for(l.kv + 1, cfg_.block_tokens) - l.blocks;
      while (need > 0 && used_blocks_ + need > capacity_blocks_) {
        const bool itself = running_.size() - 1 == k;
        preempt_latest(r);
        if (itself) break;
      }
      if (k >= running_.size()) break;  // it was the latest and gave its own blocks up
      l.blocks += need;
      used_blocks_ += need;
    }
    int budget = cfg_.max_batch_tokens;
    chunk_.assign(running_.size(), 0);
    for (std::size_t k = 0; k < running_.size(); ++k) {
      const Live& l = running_[k];
      if (l.decoding()) {
        ++s.decode_tokens;
        s.context_tokens += l.kv + 1;
        s.decode_pairs += l.kv + 1;
        --budget;
      }
    }
    for (std::size_t k = 0; k < running_.size() && budget > 0; ++k) {
      const Live& l = running_[k];
      if (l.decoding()) continue;
      chunk_[k] = std::min(budget, l.target - l.done);
      budget -= chunk_[k];
    }
    while (!waiting_.empty() && budget > 0 && !waiting_.front().decoding() &&
           static_cast<int>(running_.size()) < cfg_.max_running && admit()) {
      chunk_.push_back(std::min(budget, running_.back().target));
      budget -= chunk_.back();
    }
    for (std::size_t k = 0; k < running_.size(); ++k) {
      if (chunk_[k] == 0) continue;
      const Live& l = running_[k];
      const workload::Request& q = req_[at(l.index)];
      s.prefill_tokens += chunk_[k];
      // A chunk attends to the cached prefix, the earlier chunks and itself.
      s.context_tokens += q.cached_tokens + l.done + chunk_[k];
      // Causal: the chunk's i-th query (1-based) sees everything before the chunk and i keys of it.
      const double before = static_cast<double>(q.cached_tokens) + l.done;
      const double c = chunk_[k];
      s.prefill_pairs += c * before + c * (c + 1) / 2;
    }
    s.requests = static_cast<int>(running_.size());
    return s;
  }

  // Moves the head of the queue to the running batch with the blocks of its whole KV (a prompt's
  // and what it had generated): a chunked prefill then never stalls for KV half-way. False when
  // the blocks are not free.
  bool admit() {
    Live l = waiting_.front();
    const long long need = blocks_for(l.admit_kv, cfg_.block_tokens);
    if (used_blocks_ + need > capacity_blocks_) return false;
    waiting_.pop_front();
    l.kv = l.admit_kv;
    l.blocks = need;
    used_blocks_ += need;
    running_.push_back(l);
    return true;
  }

  // Applies the iteration that ended at `now`, counting its tokens in `ev`; returns the requests
  // it finished.
  std::size_t advance(double now, TokenEvent& ev) {
    std::size_t finished = 0, kept = 0;
    for (std::size_t k = 0; k < running_.size(); ++k) {
      Live l = running_[k];
      RequestOutcome& o = out_[at(l.index)];
      const workload::Request& q = req_[at(l.index)];
      bool emitted = false;
      if (l.decoding()) {
        ++l.kv;
        emitted = true;
      } else if (chunk_[k] > 0) {
        l.done += chunk_[k];
        emitted = l.decoding();  // the prefill's last chunk gives a token
        if (emitted && l.generated == 0) {
          o.first_token_s = now;
          ev.input_tokens += q.prompt_tokens;
        }
      }
      if (emitted) ++ev.output_tokens;
      if (emitted && ++l.generated == q.output_tokens) {
        o.finish_s = now;
        used_blocks_ -= l.blocks;
        ++finished;
        continue;
      }
      running_[kept++] = l;
    }
    running_.resize(kept);
    return finished;
  }

  const std::vector<workload::Request>& req_;
  const InstanceConfig& cfg_;
  const IterationTime& time_;
  std::vector<RequestOutcome>& out_;
  const bool kv_ready_;  // every request arrives with its KV (a disaggregated decode pool)
  long long capacity_blocks_ = 0, used_blocks_ = 0;
  std::vector<Live> running_;
  std::deque<Live> waiting_;
  std::vector<int> chunk_;
  std::vector<TokenEvent> events_;
};

void check_config(const std::vector<workload::Request>& requests, const InstanceConfig& c) {
  if (c.block_tokens <= 0 || c.max_batch_tokens <= 0 || c.max_running <= 0 || c.instances <= 0)
    throw InputError(SourceLocation{}, kKey,
                     "block_tokens, max_batch_tokens, max_running and instances must be >= 1");
  if (c.max_running > c.max_batch_tokens)
    throw InputError(SourceLocation{}, kKey,
                     fmt::format("max_running {} is above max_batch_tokens {}: a batch of decodes "
                                 "would not fit one iteration's tokens",
                                 c.max_running, c.max_batch_tokens));
  const long long blocks = c.kv_capacity_tokens / c.block_tokens;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const workload::Request& q = requests[i];
    if (i > 0 && q.arrival_s < requests[i - 1].arrival_s)
      throw InternalError("serving: requests must come in arrival order");
    const long long need = blocks_for(q.prompt_tokens + q.output_tokens, c.block_tokens);
    if (need > blocks)
      throw InputError(
          SourceLocation{}, kKey,
          fmt::format("request {} needs {} KV tokens ({} prompt + {} output), one instance holds "
                      "{} ({} blocks of {}): more KV memory per instance (fewer GPUs' worth of "
                      "weights, a larger instance) or shorter requests",
                      i, q.prompt_tokens + q.output_tokens, q.prompt_tokens, q.output_tokens,
                      blocks * c.block_tokens, blocks, c.block_tokens));
  }
}

double percentile(const std::vector<double>& sorted, double p) {
  const double x = p * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(x));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (x - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

// kv_ready: every request arrives with its KV (nothing to prefill, its first token generated).
ServingResult run_instances(const std::vector<workload::Request>& requests,
                            const InstanceConfig& config, const IterationTime& iteration_time,
                            bool kv_ready) {
  check_config(requests, config);
  ServingResult res;
  res.requests.resize(requests.size());
  std::vector<std::vector<int>> dealt(static_cast<std::size_t>(config.instances));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const std::size_t k = i % dealt.size();
    dealt[k].push_back(static_cast<int>(i));
    res.requests[i].instance = static_cast<int>(k);
  }
  double first = INFINITY, last = 0, busy = 0, block_s = 0;
  for (const std::vector<int>& mine : dealt) {
    Instance inst(requests, config, iteration_time, res.requests, kv_ready);
    const InstanceRun r = inst.run(mine);
    if (mine.empty()) continue;
    res.tokens.insert(res.tokens.end(), inst.events().begin(), inst.events().end());
    res.iterations += r.iterations;
    res.preemptions += r.preemptions;
    first = std::min(first, r.first_arrival);
    last = std::max(last, r.last_finish);
    busy += r.busy_s;
    block_s += r.block_seconds;
  }
  if (!requests.empty()) res.makespan_s = last - first;
  const double blocks = static_cast<double>(config.kv_capacity_tokens / config.block_tokens);
  if (busy > 0 && blocks > 0) res.kv_utilization = block_s / (busy * blocks);
  return res;
}

}  // namespace

ServingResult simulate_continuous_batching(const std::vector<workload::Request>& requests,
                                           const InstanceConfig& config,
                                           const IterationTime& iteration_time) {
  return run_instances(requests, config, iteration_time, false);
}

DisaggregatedResult simulate_disaggregated(const std::vector<workload::Request>& requests,
                                           const InstanceConfig& prefill,
                                           const IterationTime& prefill_time,
                                           const InstanceConfig& decode,
                                           const IterationTime& decode_time,
                                           const KvTransferTime& kv_transfer) {
  DisaggregatedResult d;
  // The prefill pool generates each request's first token and nothing more.
  std::vector<workload::Request> first = requests;
  for (workload::Request& q : first) q.output_tokens = 1;
  d.prefill = run_instances(first, prefill, prefill_time, false);
  // The decode pool: requests with more to generate, arriving when their KV has moved.
  std::vector<std::pair<double, int>> order;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].output_tokens <= 1) continue;
    const double t = kv_transfer(requests[i]);
    if (!(t >= 0) || !std::isfinite(t))
      throw InternalError(fmt::format("serving: a KV transfer priced at {} s", t));
    order.emplace_back(d.prefill.requests[i].first_token_s + t, static_cast<int>(i));
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<workload::Request> second;
  for (const auto& [arrival, i] : order) {
    workload::Request q = requests[static_cast<std::size_t>(i)];
    q.arrival_s = arrival;
    second.push_back(q);
  }
  d.decode = run_instances(second, decode, decode_time, true);
  std::vector<RequestOutcome> by_input(requests.size());  // back in the input's order
  for (std::size_t k = 0; k < order.size(); ++k)
    by_input[static_cast<std::size_t>(order[k].second)] = d.decode.requests[k];
  d.decode.requests = std::move(by_input);
  // Overall: the first token from the prefill pool, the last from the decode pool.
  ServingResult& all = d.overall;
  all.requests = d.prefill.requests;
  double start = INFINITY, end = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    RequestOutcome& o = all.requests[i];
    if (requests[i].output_tokens > 1) {
      o.finish_s = d.decode.requests[i].finish_s;
      o.preemptions += d.decode.requests[i].preemptions;
      o.instance = d.decode.requests[i].instance;
    }
    start = std::min(start, requests[i].arrival_s);
    end = std::max(end, o.finish_s);
  }
  all.iterations = d.prefill.iterations + d.decode.iterations;
  all.preemptions = d.prefill.preemptions + d.decode.preemptions;
  all.makespan_s = requests.empty() ? 0 : end - start;
  all.kv_utilization = d.decode.kv_utilization;
  all.tokens = d.prefill.tokens;
  all.tokens.insert(all.tokens.end(), d.decode.tokens.begin(), d.decode.tokens.end());
  return d;
}

Latency latency_of(std::vector<double> samples) {
  Latency l;
  if (samples.empty()) return l;
  std::sort(samples.begin(), samples.end());
  double sum = 0;
  for (double v : samples) sum += v;
  l.mean = sum / static_cast<double>(samples.size());
  l.p50 = percentile(samples, 0.50);
  l.p90 = percentile(samples, 0.90);
  l.p99 = percentile(samples, 0.99);
  return l;
}

ServingMetrics serving_metrics(const std::vector<workload::Request>& requests,
                               const ServingResult& result, const Slo& slo) {
  ServingMetrics m;
  std::vector<double> ttft, tpot, e2e;
  double input = 0, output = 0;
  long long good = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const workload::Request& q = requests[i];
    const RequestOutcome& o = result.requests[i];
    const double t = o.first_token_s - q.arrival_s;
    ttft.push_back(t);
    e2e.push_back(o.finish_s - q.arrival_s);
    const double p = q.output_tokens > 1
                         ? (o.finish_s - o.first_token_s) / static_cast<double>(q.output_tokens - 1)
                         : 0.0;
    if (q.output_tokens > 1) tpot.push_back(p);
    input += q.prompt_tokens;
    output += q.output_tokens;
    good += (slo.ttft_s <= 0 || t <= slo.ttft_s) && (slo.tpot_s <= 0 || p <= slo.tpot_s);
  }
  m.ttft_s = latency_of(ttft);
  m.tpot_s = latency_of(tpot);
  m.e2e_s = latency_of(e2e);
  if (result.makespan_s > 0) {
    m.input_tokens_per_s = input / result.makespan_s;
    m.output_tokens_per_s = output / result.makespan_s;
    m.goodput_requests_per_s = static_cast<double>(good) / result.makespan_s;
  }
  if (!requests.empty())
    m.slo_attainment = static_cast<double>(good) / static_cast<double>(requests.size());
  return m;
}

WindowThroughput window_throughput(const ServingResult& result, double start_s, double end_s) {
  WindowThroughput w;
  w.start_s = start_s;
  w.end_s = end_s;
  if (!(end_s > start_s)) return w;
  double in = 0, out = 0;
  for (const TokenEvent& e : result.tokens)
    if (e.time_s >= start_s && e.time_s <= end_s) {
      in += static_cast<double>(e.input_tokens);
      out += e.output_tokens;
    }
  w.input_tokens_per_s = in / (end_s - start_s);
  w.output_tokens_per_s = out / (end_s - start_s);
  return w;
}

}  // namespace moesim::serving
