#include "core/run_result.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <thread>
#include <tuple>
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

void init_op_offsets(const Plan& plan, RunResult& result) {
  const auto& ops = plan.ops();
  result.num_ranks = plan.num_ranks();
  result.op_offset.assign(ops.size() + 1, 0);
  for (size_t i = 0; i < ops.size(); ++i)
    result.op_offset[i + 1] = result.op_offset[i] + ops[i].ranks.size();
}

void init_run_result(const Plan& plan, RunResult& result) {
  init_op_offsets(plan, result);
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

  // Bucket intervals per (category, rank), a few ranks at a time (a DeepSeek-V3 step has ~50 M
  // instances), and measure each bucket's union.
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
    if (op.collective().stage_send) {  // a pipeline stage's send, not a MoE all-to-all
      out[1] = kSendRecv;
      return 2;
    }
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
  // the thread count.
  constexpr int kBlock = 128;
  // A block's ranks are bucketed kSub at a time: one rank's intervals fill ~1 MiB on DeepSeek-V3,
  // so a whole block's buckets, two blocks in flight, were 200 MiB of the peak memory.
  constexpr int kSub = 32;
  const int num_blocks = (P + kBlock - 1) / kBlock;
  // Per rank: the kNum category measures, then the overlap, then the exposed communication.
  constexpr int kPerRank = kNum + 2;
  std::vector<double> per_rank(static_cast<size_t>(kPerRank) * P, 0.0);
  struct BlockError {
    size_t op = std::numeric_limits<size_t>::max();
    int pos = 0;
    bool operator<(const BlockError& o) const { return std::tie(op, pos) < std::tie(o.op, o.pos); }
  };
  std::vector<BlockError> errors(static_cast<size_t>(num_blocks));
  std::vector<double> block_makespan(static_cast<size_t>(num_blocks), 0.0);

  // An op with instances in the block: its index and the positions of them not bucketed yet.
  struct Span {
    size_t op;
    int pos, end;
  };
  struct Scratch {
    std::vector<Span> spans;
    std::vector<Interval> buckets[kNum][kSub];  // capacity kept from one sub-block to the next
  };
  auto run_block = [&](int b, Scratch& sc) {
    const int r0 = b * kBlock;
    const int r1 = std::min(P, r0 + kBlock);
    sc.spans.clear();
    for (size_t i = 0; i < ops.size(); ++i) {
      const OpInfo& o = info[i];
      if (o.last_rank < r0 || o.first_rank >= r1) continue;
      const auto [lo, hi] = positions(ops[i].ranks, r0, r1);
      if (lo < hi) sc.spans.push_back({i, lo, hi});
    }
    double makespan = 0;
    BlockError first;
    for (int s0 = r0; s0 < r1; s0 += kSub) {
      const int s1 = std::min(r1, s0 + kSub), nr = s1 - s0;
      for (auto& cat : sc.buckets)
        for (auto& bucket : cat) bucket.clear();
      // Instances in op order, so every bucket holds its intervals in op order, as one pass over
      // the block did; a missing time is kept if it is the block's lowest (op, position).
      bool complete = true;
      for (Span& sp : sc.spans) {
        const RankSet& ranks = ops[sp.op].ranks;
        const OpInfo& o = info[sp.op];
        int p = sp.pos;
        for (; p < sp.end; ++p) {
          const int r = ranks.at(p);
          if (r >= s1) break;
          const auto e = result.op_offset[sp.op] + p;
          const double st = result.start_s[e], t = result.end_s[e];
          if (std::isnan(st) || std::isnan(t)) {
            first = std::min(first, BlockError{sp.op, p});
            complete = false;
          }
          makespan = std::max(makespan, t);
          for (int c = 0; c < o.nc; ++c) sc.buckets[o.cats[c]][r - s0].push_back({st, t});
        }
        sp.pos = p;
      }
      if (!complete) continue;
      std::span<Interval> merged[kNum];
      for (int r = 0; r < nr; ++r) {
        double* out = per_rank.data() + static_cast<size_t>(kPerRank) * (s0 + r);
        for (int c = 0; c < kNum; ++c) {
          // Merged where they lie: each bucket is used once.
          merged[c] = merge_intervals(sc.buckets[c][r]);
          out[c] = measure(merged[c]);
        }
        const double ov = intersection_measure(merged[kComm], merged[kCompute]);
        out[kNum] = ov;
        out[kNum + 1] = out[kComm] - ov;
      }
    }
    errors[static_cast<size_t>(b)] = first;
    block_makespan[static_cast<size_t>(b)] = makespan;
  };
  // Threads only where the instances are many (a thread costs ~10-50 us to start).
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::clamp(threads, 1, std::max(1, std::min(2, num_blocks)));
  if (result.op_offset.back() < 4'000'000) threads = 1;
  std::atomic<int> next_block{0};
  std::vector<std::exception_ptr> failure(static_cast<size_t>(threads));
  auto worker = [&](int t) {
    try {
      auto scratch = std::make_unique<Scratch>();
      for (int b; (b = next_block.fetch_add(1)) < num_blocks;) run_block(b, *scratch);
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
