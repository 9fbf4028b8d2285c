// The `serving:` section: the request description and the serving pools (docs/serving.md).
#include "core/serving_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace moesim {

namespace {

LengthSpec parse_length(const yaml::MapReader& parent, std::string_view key) {
  const yaml::MapReader m =
      parent.get_map(key, {"distribution", "tokens", "min", "max", "mean", "cv"});
  LengthSpec l;
  m.require("distribution", "fixed, uniform or lognormal");
  l.kind = static_cast<LengthSpec::Kind>(
      *m.get_choice("distribution", {"fixed", "uniform", "lognormal"}));
  auto only = [&](std::vector<std::string_view> allowed) {
    for (const std::string& k : m.keys())
      if (k != "distribution" && std::find(allowed.begin(), allowed.end(), k) == allowed.end())
        m.fail(k, fmt::format("'{}' does not apply to distribution {} (its keys: {})", k,
                              *m.get_string("distribution"), yaml::join_alternatives(allowed)));
  };
  switch (l.kind) {
    case LengthSpec::Kind::kFixed:
      only({"tokens"});
      m.require("tokens", "a token count >= 1");
      l.tokens = static_cast<int>(*m.get_int("tokens", 1, kMaxRequestTokens));
      break;
    case LengthSpec::Kind::kUniform:
      only({"min", "max"});
      m.require("min", "the shortest length, >= 1");
      m.require("max", "the longest length, >= min");
      l.min = static_cast<int>(*m.get_int("min", 1, kMaxRequestTokens));
      l.max = static_cast<int>(*m.get_int("max", 1, kMaxRequestTokens));
      break;
    case LengthSpec::Kind::kLognormal:
      only({"mean", "cv", "min", "max"});
      m.require("mean", "the mean length in tokens, >= 1");
      m.require("cv", "the coefficient of variation (standard deviation / mean), > 0");
      l.mean = *m.get_number("mean");
      l.cv = *m.get_number("cv");
      if (!(l.mean >= 1 && l.mean <= kMaxRequestTokens))
        m.fail("mean", fmt::format("found {}, expected a mean length in [1, {}]", l.mean,
                                   kMaxRequestTokens));
      if (!(l.cv > 0 && l.cv <= 100))
        m.fail("cv",
               fmt::format("found {}, expected a coefficient of variation in (0, 100]", l.cv));
      l.min = static_cast<int>(m.get_int("min", 1, kMaxRequestTokens).value_or(1));
      l.max = static_cast<int>(m.get_int("max", 1, kMaxRequestTokens).value_or(0));
      break;
  }
  if (l.max > 0 && l.max < l.min)  // uniform's bounds, lognormal's clip (max 0: none)
    m.fail("max", fmt::format("found max {} below min {}, expected max >= min", l.max, l.min));
  return l;
}

// One pool's map. `whole_cluster`: `nodes` may be left out (the instance spans the cluster).
ServingPool parse_pool(const yaml::MapReader& parent, std::string_view key,
                       const ClusterSpec& cluster, int experts, bool whole_cluster) {
  const yaml::MapReader m = parent.get_map(
      key, {"nodes", "instances", "ep", "redundant_experts", "kv_tokens_per_gpu",
            "memory_utilization", "block_tokens", "max_batch_tokens", "max_running"});
  ServingPool p;
  p.key = m.path();
  p.where = m.where();
  if (!whole_cluster) m.require("nodes", "the nodes of one instance (an integer >= 1)");
  p.nodes = static_cast<int>(m.get_int("nodes", 1, cluster.nodes).value_or(cluster.nodes));
  const int gpus = p.nodes * cluster.gpus_per_node;
  p.instances = static_cast<int>(m.get_int("instances", 1, cluster.nodes)
                                     .value_or(whole_cluster ? cluster.nodes / p.nodes : 1));
  p.ep = static_cast<int>(m.get_int("ep", 1, gpus).value_or(gpus));
  if (gpus % p.ep != 0)
    m.fail("ep",
           fmt::format("found {}, expected a divisor of the instance's {} GPUs ({} nodes x {})",
                       p.ep, gpus, p.nodes, cluster.gpus_per_node));
  p.redundant_experts = static_cast<int>(m.get_int("redundant_experts", 0, 1 << 20).value_or(0));
  const int slots = experts + p.redundant_experts;
  if (slots % p.ep != 0) {
    const int fit = (slots + p.ep - 1) / p.ep * p.ep - experts;
    m.fail(m.has("redundant_experts") ? "redundant_experts" : "ep",
           fmt::format("the model's {} experts{} over ep = {}: expected ep to divide the expert "
                       "slots (every EP rank holds the same number); redundant_experts: {} fits",
                       experts,
                       p.redundant_experts > 0 ? fmt::format(" + {} redundant", p.redundant_experts)
                                               : std::string(),
                       p.ep, fit));
  }
  p.kv_tokens_per_gpu = m.get_int("kv_tokens_per_gpu", 1, kMaxServingKvTokens).value_or(0);
  p.memory_utilization = m.get_number("memory_utilization").value_or(0.9);
  if (!(p.memory_utilization > 0 && p.memory_utilization <= 1))
    m.fail("memory_utilization",
           fmt::format("found {}, expected the share of GPU memory the server uses, in (0, 1]",
                       p.memory_utilization));
  if (m.has("memory_utilization") && m.has("kv_tokens_per_gpu"))
    m.fail("memory_utilization",
           "memory_utilization sizes the KV cache from HBM; kv_tokens_per_gpu gives it: keep one");
  p.block_tokens = static_cast<int>(m.get_int("block_tokens", 1, 1 << 16).value_or(16));
  p.max_batch_tokens =
      static_cast<int>(m.get_int("max_batch_tokens", 1, kMaxRequestTokens).value_or(8192));
  p.max_running = static_cast<int>(m.get_int("max_running", 1, 1 << 20).value_or(256));
  if (p.max_running > p.max_batch_tokens)
    m.fail("max_running",
           fmt::format("found {} above max_batch_tokens {}: every running request decodes a token "
                       "per iteration, expected max_running <= max_batch_tokens",
                       p.max_running, p.max_batch_tokens));
  return p;
}

}  // namespace

RequestSpec parse_request_spec(yaml::Context& ctx, const YAML::Node& node, const std::string& path,
                               const std::string& dir) {
  const yaml::MapReader m(ctx, node, path,
                          {"arrival", "requests_per_s", "burstiness", "count", "prompt", "output",
                           "prefix_hit", "seed", "trace"});
  RequestSpec s;
  s.arrival = static_cast<RequestSpec::Arrival>(
      m.get_choice("arrival", {"poisson", "gamma", "trace"}).value_or(0));
  if (s.arrival == RequestSpec::Arrival::kTrace) {
    m.require("trace", "the request trace file (CSV: arrival_s,prompt_tokens,output_tokens)");
    for (std::string_view k :
         {"requests_per_s", "burstiness", "count", "prompt", "output", "prefix_hit", "seed"})
      if (m.has(k))
        m.fail(k, fmt::format("'{}' does not apply to arrival: trace (the trace gives the "
                              "arrivals and lengths)",
                              k));
    const std::filesystem::path p(*m.get_string("trace"));
    s.trace =
        p.is_absolute() || dir.empty() ? p.string() : (std::filesystem::path(dir) / p).string();
    return s;
  }
  if (m.has("trace"))
    m.fail("trace", "a trace applies to arrival: trace only (add arrival: trace)");
  m.require("requests_per_s", "the mean arrival rate in requests per second, > 0");
  m.require("count", "the number of requests, >= 1");
  m.require("prompt", "the prompt length distribution ({distribution: ..., ...})");
  m.require("output", "the output length distribution ({distribution: ..., ...})");
  s.requests_per_s = *m.get_number("requests_per_s");
  if (!(s.requests_per_s > 0 && s.requests_per_s <= 1e9))
    m.fail(
        "requests_per_s",
        fmt::format("found {}, expected a rate in (0, 1e9] requests per second", s.requests_per_s));
  if (m.has("burstiness")) {
    if (s.arrival != RequestSpec::Arrival::kGamma)
      m.fail("burstiness", "burstiness applies to arrival: gamma (poisson is burstiness 1)");
    s.burstiness = *m.get_number("burstiness");
    if (!(s.burstiness >= 0.01 && s.burstiness <= 100))
      m.fail("burstiness",
             fmt::format("found {}, expected a gamma shape in [0.01, 100] (1: Poisson, below 1 "
                         "burstier)",
                         s.burstiness));
  }
  s.count = *m.get_int("count", 1, kMaxServingRequests);
  s.prompt = parse_length(m, "prompt");
  s.output = parse_length(m, "output");
  s.prefix_hit = m.get_number("prefix_hit").value_or(0);
  if (!(s.prefix_hit >= 0 && s.prefix_hit < 1))
    m.fail("prefix_hit",
           fmt::format("found {}, expected the share of a prompt found in the prefix cache, in "
                       "[0, 1)",
                       s.prefix_hit));
  s.seed = static_cast<std::uint64_t>(m.get_int("seed", 0).value_or(1));
  return s;
}

ServingSpec parse_serving_spec(const yaml::MapReader& root, const ClusterSpec& cluster,
                               Dtype model_dtype, int model_experts) {
  const yaml::MapReader m =
      root.get_map("serving", {"requests", "instance", "prefill", "decode", "kv_dtype", "slo"});
  ServingSpec s;
  m.require("requests",
            "the requests served ({requests_per_s: ..., count: ..., prompt: ..., "
            "output: ...} or {arrival: trace, trace: file.csv})");
  const std::string dir = std::filesystem::path(m.context().file()).parent_path().string();
  s.requests = parse_request_spec(m.context(), m.get("requests"), m.path_of("requests"), dir);
  const bool pre = m.has("prefill"), dec = m.has("decode");
  if (m.has("instance") && (pre || dec))
    m.fail(pre ? "prefill" : "decode",
           "'instance' (co-located serving) and prefill / decode pools (disaggregated) exclude "
           "each other: keep one");
  if (pre || dec) {
    m.require("prefill", "the prefill pool ({nodes: ..., instances: ...}) beside the decode pool");
    m.require("decode", "the decode pool ({nodes: ..., instances: ...}) beside the prefill pool");
    s.disaggregated = true;
    s.prefill = parse_pool(m, "prefill", cluster, model_experts, false);
    s.decode = parse_pool(m, "decode", cluster, model_experts, false);
    const long long used = static_cast<long long>(s.prefill.nodes) * s.prefill.instances +
                           static_cast<long long>(s.decode.nodes) * s.decode.instances;
    if (used > cluster.nodes)
      m.fail("decode",
             fmt::format("the pools need {} x {} + {} x {} = {} nodes, the cluster has {}",
                         s.prefill.instances, s.prefill.nodes, s.decode.instances, s.decode.nodes,
                         used, cluster.nodes));
  } else {
    if (m.has("instance")) {
      s.instance = parse_pool(m, "instance", cluster, model_experts, true);
    } else {
      s.instance.key = m.path_of("instance");
      s.instance.where = m.where();
      s.instance.nodes = cluster.nodes;
      s.instance.ep = cluster.num_gpus();
      if (model_experts % s.instance.ep != 0)
        m.fail_here(
            fmt::format("one instance over the cluster's {} GPUs needs an expert count "
                        "they divide, found {} experts: add instance: {{nodes: ..., ep: "
                        "...}}",
                        s.instance.ep, model_experts));
    }
    const long long used = static_cast<long long>(s.instance.nodes) * s.instance.instances;
    if (used > cluster.nodes)
      m.fail("instance", fmt::format("{} instances of {} nodes need {} nodes, the cluster has {}",
                                     s.instance.instances, s.instance.nodes, used, cluster.nodes));
  }
  s.kv_dtype = model_dtype;
  // The spellings are dtype_name's, as model.dtype reads them.
  constexpr Dtype kDtypes[] = {Dtype::kFp32, Dtype::kTf32, Dtype::kFp16, Dtype::kBf16, Dtype::kFp8};
  std::vector<std::string_view> names;
  for (Dtype d : kDtypes) names.push_back(dtype_name(d));
  if (auto i = m.get_choice("kv_dtype", names)) s.kv_dtype = kDtypes[*i];
  if (m.has("slo")) {
    const yaml::MapReader slo = m.get_map("slo", {"ttft", "tpot"});
    if (slo.keys().empty()) slo.fail_here("found an empty map, expected ttft and / or tpot");
    const auto read = [&slo](std::string_view k) {
      const double t = slo.get_quantity(k, UnitKind::kSeconds).value_or(0);
      if (slo.has(k) && !(t > 0))
        slo.fail(k, "expected a time > 0 (leave the key out to not judge it)");
      return Seconds(t);
    };
    s.slo_ttft = read("ttft");
    s.slo_tpot = read("tpot");
  }
  return s;
}

}  // namespace moesim
