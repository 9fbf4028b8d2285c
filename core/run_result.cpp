#include "core/run_result.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <span>
#include <thread>
#include <utility>

#include "core/error.hpp"

namespace moesim {

double RunResult::op_first_start(OpId op) const {
  double t = std::numeric_limits<double>::infinity();
  for (auto e = op_offset[op]; e < op_offset[op + 1]; ++e) t = std::min(t, start_s[e]);
  return t;
}

double RunResult::op_last_end(OpId op) const {
  double t = -std::numeric_limits<double>::infinity();
  for (auto e = op_offset[op]; e < op_offset[op + 1]; ++e) t = std::max(t, end_s[e]);
  return t;
}

std::string_view record_algo_name(const CollectiveRecord& rec) {
  return rec.library_algo ? std::string_view("nccl") : collective_algo_name(rec.algo);
}

const CollectiveRecord* RunResult::collective(OpId op) const {
  auto it = std::lower_bound(collectives.begin(), collectives.end(), op,
                             [](const CollectiveRecord& c, OpId id) { return c.op < id; });
  return it != collectives.end() && it->op == op ? &*it : nullptr;
}

void init_run_result(const Plan& plan, RunResult& result) {
  const auto& ops = plan.ops();
  result.num_ranks = plan.num_ranks();
  result.op_offset.assign(ops.size() + 1, 0);
  for (size_t i = 0; i < ops.size(); ++i)
    result.op_offset[i + 1] = result.op_offset[i] + ops[i].ranks.size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  result.start_s.assign(result.op_offset.back(), nan);
  result.end_s.assign(result.op_offset.back(), nan);
}

namespace {

using Interval = std::pair<double, double>;

// Sorts and merges in place; the merged list (disjoint, ascending) is the prefix it returns.
std::span<Interval> merge_intervals(std::span<Interval> v) {
  // Mostly in start order already (a stream's ops are recorded in plan order): sort only if not.
  const auto by_start = [](const Interval& a, const Interval& b) { return a.first < b.first; };
  if (!std::is_sorted(v.begin(), v.end(), by_start)) std::sort(v.begin(), v.end(), by_start);
  size_t out = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i].second <= v[i].first) continue;  // empty intervals take no time
    if (out > 0 && v[i].first <= v[out - 1].second) {
      v[out - 1].second = std::max(v[out - 1].second, v[i].second);
    } else {
      v[out++] = v[i];
    }
  }
  return v.first(out);
}

double measure(std::span<const Interval> merged) {
  double s = 0;
  for (const auto& [a, b] : merged) s += b - a;
  return s;
}

// Measure of the intersection of two merged interval lists.
double intersection_measure(std::span<const Interval> a, std::span<const Interval> b) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    double lo = std::max(a[i].first, b[j].first);
    double hi = std::min(a[i].second, b[j].second);
    if (hi > lo) s += hi - lo;
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return s;
}

// Interval categories per rank. An op is in at most kMaxCats of them: a collective in kComm and
// its type's; a compute op in kCompute, its class group and kRecompute when flagged.
enum Cat {
  kCompute,
  kCopy,
  kComm,
  kA2a,
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kSendRecv,
  kGemmClass,
  kAttentionClass,
  kMemoryBoundClass,
  kOptimizerClass,
  kRecompute,
  kNum
};
constexpr int kMaxCats = 3;

Cat class_group(ComputeClass c) {
  switch (c) {
    case ComputeClass::kGemm:
    case ComputeClass::kGate:
      return kGemmClass;
    case ComputeClass::kAttention:
      return kAttentionClass;
    case ComputeClass::kOptimizer:
      return kOptimizerClass;
    case ComputeClass::kEncode:
    case ComputeClass::kDecode:
    case ComputeClass::kElementwise:
    case ComputeClass::kNorm:
    case ComputeClass::kOther:
      break;
  }
  return kMemoryBoundClass;
}

}  // namespace

void summarize_run(const Plan& plan, RunResult& result) {
  const auto& ops = plan.ops();
  MOESIM_ASSERT(result.op_offset.size() == ops.size() + 1, "RunResult not initialised for plan");
  const int P = plan.num_ranks();

  // Bucket intervals per (category, rank) with a counting pass first, so the arrays are sized
  // exactly (4,096 ranks x many ops must not reallocate per push). Ranks are taken in blocks, so
  // the buckets hold one block's intervals at a time (a DeepSeek-V3 step has ~50 M instances).
  auto cats_of = [](const Op& op, int out[kMaxCats]) {
    if (op.kind == OpKind::kCompute) {
      const ComputeSpec& c = op.compute();
      out[0] = kCompute;
      out[1] = class_group(c.cls);
      if (!c.recompute) return 2;
      out[2] = kRecompute;
      return 3;
    }
    if (op.kind == OpKind::kCopy) {
      out[0] = kCopy;
      return 1;
    }
    out[0] = kComm;
    switch (op.collective().type) {
      case CollectiveType::kAllToAll:
      case CollectiveType::kAllToAllv:
        out[1] = kA2a;
        break;
      case CollectiveType::kAllReduce:
        out[1] = kAllReduce;
        break;
      case CollectiveType::kAllGather:
        out[1] = kAllGather;
        break;
      case CollectiveType::kReduceScatter:
        out[1] = kReduceScatter;
        break;
      case CollectiveType::kSendRecv:
        out[1] = kSendRecv;
        break;
    }
    return 2;
  };
  // Positions [lo, hi) of an op's ranks inside [r0, r1) (rank sets are ascending).
  auto positions = [](const RankSet& rs, int r0, int r1) {
    auto first_at_least = [&rs](int r) {
      int lo = 0, hi = rs.size();
      while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (rs.at(mid) < r)
          lo = mid + 1;
        else
          hi = mid;
      }
      return lo;
    };
    return std::pair{first_at_least(r0), first_at_least(r1)};
  };

  // Each op's categories and rank span, once: a block skips the ops outside it without a search
  // (a pipeline stage's ops touch one block in 16 on DeepSeek-V3).
  struct OpInfo {
    int first_rank, last_rank;  // last < first: no ranks
    std::int8_t nc;
    std::int8_t cats[kMaxCats];
  };
  std::vector<OpInfo> info(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    OpInfo& o = info[i];
    int cats[kMaxCats];
    o.nc = static_cast<std::int8_t>(cats_of(op, cats));
    for (int c = 0; c < o.nc; ++c) o.cats[c] = static_cast<std::int8_t>(cats[c]);
    const int n = op.ranks.size();
    o.first_rank = n > 0 ? op.ranks.at(0) : 1;
    o.last_rank = n > 0 ? op.ranks.at(n - 1) : 0;
  }

  // Blocks are independent: threads take them in turn and write per-rank measures, which are
  // summed in rank order afterwards, so the totals are the same sums in the same order whatever
  // the thread count. Two 128-rank blocks in flight hold what one 256-rank block did.
  constexpr int kBlock = 128;
  const int num_blocks = (P + kBlock - 1) / kBlock;
  // Per rank: the kNum category measures, then the overlap, then the exposed communication.
  constexpr int kPerRank = kNum + 2;
  std::vector<double> per_rank(static_cast<size_t>(kPerRank) * P, 0.0);
  struct BlockError {
    size_t op = std::numeric_limits<size_t>::max();
    int pos = 0;
  };
  std::vector<BlockError> errors(static_cast<size_t>(num_blocks));
  std::vector<double> block_makespan(static_cast<size_t>(num_blocks), 0.0);

  auto run_block = [&](int b, std::vector<std::int64_t>& count, std::vector<std::int64_t>& fill,
                       std::vector<Interval>& iv) {
    const int r0 = b * kBlock;
    const int r1 = std::min(P, r0 + kBlock), nr = r1 - r0;
    count.assign(static_cast<size_t>(kNum) * nr + 1, 0);
    // f(op index, position, bucket) for every instance of the block's ranks and category;
    // stops (returning false) as soon as f does.
    const auto for_each_instance = [&](const auto& f) {
      for (size_t i = 0; i < ops.size(); ++i) {
        const OpInfo& o = info[i];
        if (o.last_rank < r0 || o.first_rank >= r1) continue;
        const RankSet& ranks = ops[i].ranks;
        const auto [lo, hi] = positions(ranks, r0, r1);
        for (int p = lo; p < hi; ++p) {
          const size_t r = static_cast<size_t>(ranks.at(p) - r0);
          for (int c = 0; c < o.nc; ++c)
            if (!f(i, p, static_cast<size_t>(o.cats[c]) * nr + r)) return false;
        }
      }
      return true;
    };
    // Counting needs the rank sets only; the times are read once, by the fill pass, which meets
    // the instances in the same order, so a missing time is found where the count pass found it.
    for_each_instance([&](size_t, int, size_t bucket) {
      ++count[bucket + 1];
      return true;
    });
    for (size_t k = 1; k < count.size(); ++k) count[k] += count[k - 1];
    iv.resize(static_cast<size_t>(count.back()));
    fill.assign(count.begin(), count.end() - 1);
    double makespan = 0;
    const bool complete = for_each_instance([&](size_t i, int p, size_t bucket) {
      const auto e = result.op_offset[i] + p;
      const double s = result.start_s[e], t = result.end_s[e];
      if (std::isnan(s) || std::isnan(t)) {
        errors[static_cast<size_t>(b)] = {i, p};
        return false;
      }
      makespan = std::max(makespan, t);
      iv[fill[bucket]++] = {s, t};
      return true;
    });
    block_makespan[static_cast<size_t>(b)] = makespan;
    if (!complete) return;
    std::span<Interval> merged[kNum];
    for (int r = 0; r < nr; ++r) {
      double* out = per_rank.data() + static_cast<size_t>(kPerRank) * (r0 + r);
      for (int c = 0; c < kNum; ++c) {
        const size_t k = static_cast<size_t>(c) * nr + r;
        // Merged where they lie: each bucket is used once.
        merged[c] = merge_intervals(std::span<Interval>(iv).subspan(
            static_cast<size_t>(count[k]), static_cast<size_t>(count[k + 1] - count[k])));
        out[c] = measure(merged[c]);
      }
      const double ov = intersection_measure(merged[kComm], merged[kCompute]);
      out[kNum] = ov;
      out[kNum + 1] = out[kComm] - ov;
    }
  };
  // Threads only where the instances are many (a thread costs ~10-50 us to start).
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::clamp(threads, 1, std::max(1, std::min(2, num_blocks)));
  if (result.op_offset.back() < 4'000'000) threads = 1;
  std::atomic<int> next_block{0};
  std::vector<std::exception_ptr> failure(static_cast<size_t>(threads));
  auto worker = [&](int t) {
    try {
      std::vector<std::int64_t> count, fill;
      std::vector<Interval> iv;
      for (int b; (b = next_block.fetch_add(1)) < num_blocks;) run_block(b, count, fill, iv);
    } catch (...) {
      failure[static_cast<size_t>(t)] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(worker, t);
    worker(0);
  }
  for (const auto& f : failure)
    if (f) std::rethrow_exception(f);
  // The instance the one-pass, 256-rank-block version reported first: the lowest (op, position)
  // of the first 256 ranks with a missing time.
  for (int b = 0; b < num_blocks; b += 2) {
    BlockError first = errors[static_cast<size_t>(b)];
    if (b + 1 < num_blocks && errors[static_cast<size_t>(b) + 1].op < first.op)
      first = errors[static_cast<size_t>(b) + 1];
    if (first.op != std::numeric_limits<size_t>::max())
      throw InternalError(fmt::format("run result: op {} '{}' has no time on rank {}",
                                      ops[first.op].id, ops[first.op].label,
                                      ops[first.op].ranks.at(first.pos)));
  }
  double makespan = 0;
  for (const double m : block_makespan) makespan = std::max(makespan, m);
  double sum[kNum] = {};
  double exposed = 0, overlap = 0;
  for (int r = 0; r < P; ++r) {
    const double* in = per_rank.data() + static_cast<size_t>(kPerRank) * r;
    for (int c = 0; c < kNum; ++c) sum[c] += in[c];
    overlap += in[kNum];
    exposed += in[kNum + 1];
  }

  const double inv = P > 0 ? 1.0 / P : 0.0;
  Breakdown& b = result.breakdown;
  b.compute_s = sum[kCompute] * inv;
  b.copy_s = sum[kCopy] * inv;
  b.comm_s = sum[kComm] * inv;
  b.a2a_s = sum[kA2a] * inv;
  b.allreduce_s = sum[kAllReduce] * inv;
  b.allgather_s = sum[kAllGather] * inv;
  b.reduce_scatter_s = sum[kReduceScatter] * inv;
  b.send_recv_s = sum[kSendRecv] * inv;
  b.exposed_comm_s = exposed * inv;
  b.overlap_s = overlap * inv;
  b.gemm_s = sum[kGemmClass] * inv;
  b.attention_s = sum[kAttentionClass] * inv;
  b.memory_bound_s = sum[kMemoryBoundClass] * inv;
  b.optimizer_s = sum[kOptimizerClass] * inv;
  b.recompute_s = sum[kRecompute] * inv;
  result.makespan_s = makespan;
}

std::int64_t process_peak_rss_bytes() {
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<std::int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace moesim
