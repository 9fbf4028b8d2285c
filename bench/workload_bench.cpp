// workload_bench: the workload generator at Tutel's scaling case (docs/strategy-specs.md §1): one
// iteration, one MoE layer at 4,096 GPUs, S = 16,384 tokens per GPU, dE = 2 (E = 8,192), k = 2, f
// = 1. Prints the wall time of WorkloadGenerator::next (median of --reps runs) and the process RSS,
// for uniform and zipf routing; then the per-GPU cost of the sampling methods (token-level,
// count-level, pair) over S / E ratios, which is what ChoiceSampler::kPairsMinRatio and
// kTokenMethodMaxRatio are set by. The per-GPU costs are thread CPU time (the development machine
// is shared, so wall time there mostly measures the other users).
//
//   workload_bench [--gpus 4096] [--tokens 16384] [--experts-per-gpu 2] [--reps 3]
//                  [--crossover-only 1]
#include <fmt/format.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "strategies/workload/random.hpp"
#include "strategies/workload/sampling.hpp"
#include "strategies/workload/workload.hpp"

namespace {

using moesim::RoutingDistribution;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double current_rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * 4096.0 / (1 << 20);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

moesim::Scenario tutel_case(int gpus, int tokens, int experts_per_gpu, RoutingDistribution dist,
                            double skew) {
  moesim::Scenario s;
  s.name = "workload-bench";
  s.cluster.nodes = gpus / 8;
  s.cluster.gpus_per_node = 8;
  s.model.layers = 1;
  s.model.batch_per_gpu = 1;
  s.model.seq_len = tokens;
  s.model.experts_per_gpu = experts_per_gpu;
  s.model.experts = experts_per_gpu * gpus;
  s.model.top_k = 2;
  s.model.capacity_factor = 1.0;
  s.parallelism.ep = gpus;
  s.parallelism.dp = 1;
  s.workload.routing.distribution = dist;
  s.workload.routing.skew = skew;
  s.workload.routing.seed = 1;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = 4096, tokens = 16384, experts_per_gpu = 2, reps = 3;
  bool crossover_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int v = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--gpus"))
      gpus = v;
    else if (!std::strcmp(argv[i], "--tokens"))
      tokens = v;
    else if (!std::strcmp(argv[i], "--experts-per-gpu"))
      experts_per_gpu = v;
    else if (!std::strcmp(argv[i], "--reps"))
      reps = v;
    else if (!std::strcmp(argv[i], "--crossover-only"))
      crossover_only = v != 0;
  }
  fmt::print("workload_bench: P = {} GPUs, S = {} tokens/GPU, E = {} experts, k = 2, f = 1\n", gpus,
             tokens, gpus * experts_per_gpu);
  fmt::print("{:<10} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>12} {:>6} {:>10}\n", "routing",
             "method", "threads", "median_s", "min_s", "max_s", "cpu_s", "draws/s", "dC",
             "imbalance");
  struct Case {
    const char* name;
    RoutingDistribution dist;
    double skew;
  };
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const Case c : crossover_only
                          ? std::vector<Case>{}
                          : std::vector<Case>{Case{"uniform", RoutingDistribution::kUniform, 0.0},
                                              Case{"zipf1.0", RoutingDistribution::kZipf, 1.0}}) {
    for (const int threads : {1, hw}) {
      if (threads == hw && hw == 1) continue;
      std::vector<double> times, cpu;
      moesim::workload::IterationWorkload w;
      for (int r = 0; r < reps; ++r) {
        moesim::workload::WorkloadGenerator gen(
            tutel_case(gpus, tokens, experts_per_gpu, c.dist, c.skew));
        gen.set_threads(threads);
        const auto t0 = Clock::now();
        const double c0 = cpu_seconds();
        w = gen.next(r);
        times.push_back(seconds_since(t0));
        cpu.push_back(cpu_seconds() - c0);
      }
      const auto& d = w.layers[0];
      const std::int64_t experts = static_cast<std::int64_t>(gpus) * experts_per_gpu;
      const char* method =
          moesim::workload::detail::ChoiceSampler({}, static_cast<int>(experts), 2, tokens)
                      .method() == moesim::workload::detail::ChoiceSampler::Method::kPairs
              ? "pairs"
          : tokens <= moesim::workload::detail::ChoiceSampler::kTokenMethodMaxRatio * experts
              ? "tokens"
              : "counts";
      fmt::print(
          "{:<10} {:>8} {:>8} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.3g} {:>6} "
          "{:>10.3f}\n",
          c.name, method, threads, median(times), *std::min_element(times.begin(), times.end()),
          *std::max_element(times.begin(), times.end()), median(cpu),
          2.0 * gpus * tokens / median(times), d.capacity, d.imbalance());
    }
  }
  fmt::print("RSS: current {:.0f} MiB, peak {:.0f} MiB (one LayerDispatch = {:.0f} MiB)\n",
             current_rss_mib(), peak_rss_mib(),
             2.0 * 4 * gpus * static_cast<double>(gpus) * experts_per_gpu / (1 << 20));

  // Method crossover: CPU time per GPU row of each method at fixed E, growing S.
  fmt::print("\nper-GPU sampling cost, k = 2 (median of {}; thread CPU microseconds per GPU)\n",
             reps);
  fmt::print("{:<8} {:>6} {:>8} {:>6} {:>12} {:>12} {:>12}\n", "routing", "E", "S", "S/E",
             "tokens_us", "counts_us", "pairs_us");
  using moesim::workload::detail::ChoiceSampler;
  for (const bool zipf : {false, true}) {
    for (const int E : {16, 64, 8192}) {
      for (const int ratio : {1, 4, 16, 32, 64, 128, 256, 512}) {
        if (E > 64 && ratio > 32) break;  // the large-E rows only show the small-ratio regime
        const int S = E * ratio;
        const int rows = std::max(4, 4'000'000 / (2 * S));
        std::vector<double> p;
        if (zipf) p = moesim::workload::detail::zipf_popularity(E, 1.0, 1, 0);
        double us[3];
        int m = 0;
        for (const auto method : {ChoiceSampler::Method::kTokens, ChoiceSampler::Method::kCounts,
                                  ChoiceSampler::Method::kPairs}) {
          const ChoiceSampler sampler(p, E, 2, S, method);
          std::vector<std::uint32_t> counts(2 * static_cast<std::size_t>(E));
          std::vector<double> t;
          for (int r = 0; r < reps; ++r) {
            const double t0 = thread_cpu_seconds();
            for (int row = 0; row < rows; ++row) {
              moesim::workload::detail::Xoshiro256 rng(static_cast<std::uint64_t>(row + 1));
              sampler.sample(rng, counts);
            }
            t.push_back((thread_cpu_seconds() - t0) / rows * 1e6);
          }
          us[m++] = median(t);
        }
        fmt::print("{:<8} {:>6} {:>8} {:>6} {:>12.1f} {:>12.1f} {:>12.1f}\n",
                   zipf ? "zipf1.0" : "uniform", E, S, ratio, us[0], us[1], us[2]);
      }
    }
  }
  return 0;
}
