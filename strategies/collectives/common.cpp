#include "strategies/collectives/common.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/error.hpp"

namespace moesim::collectives {

const ByteMatrix* CollectiveCall::matrix() const {
  if (spec == nullptr) return nullptr;
  if (!spec->per_group.empty()) {
    if (group_index < 0 || group_index >= static_cast<int>(spec->per_group.size())) return nullptr;
    return spec->per_group[group_index].get();
  }
  return spec->matrix.get();
}

Seconds phases_time(const std::vector<Phase>& phases, const CostContext& ctx) {
  MOESIM_ASSERT(ctx.topo != nullptr, "phases_time needs a topology");
  double t = 0;
  for (const Phase& p : phases)
    t += detail::phase_time_s(detail::phase_shape(p, *ctx.topo, 1.0), 1.0, ctx);
  return Seconds(t);
}

namespace detail {

int group_size(const CollectiveCall& call) {
  MOESIM_ASSERT(call.spec != nullptr && call.group != nullptr,
                "collective call without spec/group");
  return static_cast<int>(call.group->size());
}

const ByteMatrix& require_matrix(const CollectiveCall& call) {
  const int w = group_size(call);
  const ByteMatrix* m = call.matrix();
  if (m == nullptr) throw InputError("all_to_allv needs a byte matrix (spec.matrix or per_group)");
  if (m->size != w) {
    throw InputError("all_to_allv matrix is " + std::to_string(m->size) + "x" +
                     std::to_string(m->size) + " but the group has " + std::to_string(w) +
                     " ranks");
  }
  return *m;
}

std::optional<NodeGrid> node_grid(const std::vector<int>& group, const topology::Topology& topo,
                                  std::string* why) {
  auto fail = [&](std::string msg) -> std::optional<NodeGrid> {
    if (why != nullptr) *why = std::move(msg);
    return std::nullopt;
  };
  const int w = static_cast<int>(group.size());
  if (w == 0) return fail("empty group");
  const int node0 = topo.node_of(group[0]);
  int m = 0;
  while (m < w && topo.node_of(group[m]) == node0) ++m;
  if (w % m != 0) {
    return fail("group of " + std::to_string(w) + " ranks is not node-aligned: its first " +
                std::to_string(m) + " ranks are on node " + std::to_string(node0) + " and " +
                std::to_string(w) + " is not a multiple of " + std::to_string(m));
  }
  const int n = w / m;
  std::vector<char> seen(static_cast<size_t>(topo.num_nodes()), 0);
  for (int a = 0; a < n; ++a) {
    const int node = topo.node_of(group[a * m]);
    if (seen[node]) {
      return fail("group is not node-aligned: node " + std::to_string(node) +
                  " appears in two separate blocks of " + std::to_string(m) + " ranks");
    }
    seen[node] = 1;
    for (int j = 0; j < m; ++j) {
      const int r = group[a * m + j];
      if (topo.node_of(r) != node) {
        return fail("group is not node-aligned: rank " + std::to_string(r) + " at position " +
                    std::to_string(a * m + j) + " is not on node " + std::to_string(node) +
                    " with the rest of its block of " + std::to_string(m));
      }
      if (topo.local_of(r) != topo.local_of(group[j])) {
        return fail("group local order differs between nodes: position " +
                    std::to_string(a * m + j) + " has local index " +
                    std::to_string(topo.local_of(r)) + ", position " + std::to_string(j) + " has " +
                    std::to_string(topo.local_of(group[j])));
      }
    }
  }
  return NodeGrid{m, n};
}

std::shared_ptr<const GridInfo> grid_info(const std::vector<int>& group,
                                          const topology::Topology& topo) {
  return cached<GridInfo>(topo, kTagGrid, 0, group, [&] {
    GridInfo info;
    info.grid = node_grid(group, topo, &info.why);
    return info;
  });
}

double copy_bandwidth(const CostContext& ctx) {
  if (ctx.local_copy_bandwidth.value() > 0) return ctx.local_copy_bandwidth.value();
  if (ctx.topo != nullptr) return ctx.topo->gpu().hbm_bandwidth.value();
  return 0.0;
}

void prune_lines(std::vector<CostLine>& lines) {
  std::sort(lines.begin(), lines.end());
  lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
  if (lines.size() > 256) return;  // quadratic pruning only where it is cheap
  std::vector<CostLine> kept;
  for (size_t i = 0; i < lines.size(); ++i) {
    bool dominated = false;
    for (size_t j = 0; j < lines.size() && !dominated; ++j) {
      if (i == j) continue;
      const CostLine& a = lines[i];
      const CostLine& b = lines[j];
      dominated = b.messages >= a.messages && b.alpha_s >= a.alpha_s &&
                  b.s_per_byte >= a.s_per_byte && !(a == b);
    }
    if (!dominated) kept.push_back(lines[i]);
  }
  lines = std::move(kept);
}

double phase_time_s(const PhaseShape& shape, double size, const CostContext& ctx) {
  const double bw = copy_bandwidth(ctx);
  const double local = bw > 0 ? shape.local_per_byte * size / bw : 0.0;
  double net = 0;
  for (const CostLine& l : shape.lines) {
    net = std::max(net, ctx.net.message_latency_s + l.messages * ctx.net.overhead_s(l.messages) +
                            l.alpha_s + size * l.s_per_byte);
  }
  for (const topology::CutMeter::Line& l : shape.cut_lines) {
    net = std::max(net, ctx.net.message_latency_s + shape.cut_alpha_s + size * l.per_byte +
                            ctx.net.overhead_s(shape.cut_messages) * l.per_overhead);
  }
  return shape.repeat * std::max(net, local);
}

double shape_time_s(const CostShape& shape, double size, const CostContext& ctx) {
  double t = 0;
  for (const PhaseShape& p : shape.phases) t += phase_time_s(p, size, ctx);
  return t;
}

namespace {
// Per-rank, per-side accumulator of the formula's terms; class 0 = same node, 1 = other node.
struct Side {
  int messages = 0;
  int count[2] = {0, 0};
  double alpha[2] = {0, 0};
  double sum[2] = {0, 0};
  void add(int cls, double alpha_s, double s) {
    ++messages;
    ++count[cls];
    alpha[cls] = std::max(alpha[cls], alpha_s);
    sum[cls] += s;
  }
  void emit(std::vector<CostLine>& out) const {
    for (int k = 0; k < 2; ++k)
      if (count[k] > 0) out.push_back({messages, alpha[k], sum[k]});
  }
};
}  // namespace

PhaseShape phase_shape(const Phase& phase, const topology::Topology& topo, double scale) {
  PhaseShape shape;
  shape.kind = phase.kind;
  shape.repeat = phase.repeat;
  shape.local_per_byte = phase.local_bytes.value() * scale;
  if (phase.kind != Phase::Kind::kTransfers || phase.transfers.empty()) return shape;
  const size_t p = static_cast<size_t>(topo.num_gpus());
  std::vector<Side> send(p), recv(p);
  std::vector<int> touched;
  const auto cuts = fabric_cuts(topo);
  topology::CutMeter meter(*cuts);
  std::vector<int> crossing_senders;
  for (const Transfer& t : phase.transfers) {
    MOESIM_ASSERT(t.src != t.dst, "collective transfer from a rank to itself");
    const topology::PairCost pc = topo.pair_cost(t.src, t.dst);
    MOESIM_ASSERT(pc.bandwidth.value() > 0, "pair without bandwidth");
    const int cls = topo.node_of(t.src) == topo.node_of(t.dst) ? 0 : 1;
    if (cls == 1) {
      meter.add(t.src, t.dst, t.bytes * scale);
      crossing_senders.push_back(t.src);
      shape.cut_alpha_s = std::max(shape.cut_alpha_s, pc.alpha.value());
    }
    const double s = t.bytes * scale / pc.bandwidth.value();
    if (send[t.src].messages == 0 && recv[t.src].messages == 0) touched.push_back(t.src);
    if (send[t.dst].messages == 0 && recv[t.dst].messages == 0) touched.push_back(t.dst);
    send[t.src].add(cls, pc.alpha.value(), s);
    recv[t.dst].add(cls, pc.alpha.value(), s);
  }
  for (int r : touched) {
    send[r].emit(shape.lines);
    recv[r].emit(shape.lines);
  }
  prune_lines(shape.lines);
  shape.cut_lines = meter.lines();
  for (int g : crossing_senders)
    shape.cut_messages = std::max(shape.cut_messages, send[g].messages);
  return shape;
}

std::shared_ptr<const topology::FabricCuts> fabric_cuts(const topology::Topology& topo) {
  static const std::vector<int> kNoGroup;
  return cached<topology::FabricCuts>(topo, kTagFabricCuts, 0, kNoGroup,
                                      [&] { return topology::compute_fabric_cuts(topo); });
}

const UniformCut& uniform_exchange_cut(const CollectiveCall& call, const topology::Topology& topo) {
  return *cached<UniformCut>(topo, kTagUniformCut, 0, *call.group, [&] {
    const auto cuts = fabric_cuts(topo);
    const std::vector<int>& g = *call.group;
    const double w = static_cast<double>(g.size());
    UniformCut out;
    for (int gpu : g) out.injection = std::max(out.injection, cuts->injection[gpu]);
    std::vector<int> members;
    for (const topology::CutTier& t : cuts->tiers) {
      members.assign(static_cast<size_t>(t.classes), 0);
      for (int gpu : g) ++members[t.gpu_class[gpu]];
      for (int c = 0; c < t.classes; ++c) {
        const double crossing = members[c] * (w - members[c]);  // chunks out (and in)
        const double cap = std::min(t.egress[c], t.ingress[c]);
        if (crossing > 0 && cap > 0) out.s_per_byte = std::max(out.s_per_byte, crossing / cap);
      }
    }
    return out;
  });
}

double matrix_cut_s(const ByteMatrix& mat, const std::vector<int>& group,
                    const topology::Topology& topo, double overhead_s) {
  const auto cuts = fabric_cuts(topo);
  if (cuts->tiers.empty()) return 0;
  topology::CutMeter meter(*cuts);
  for (int s = 0; s < mat.size; ++s) {
    for_each_in_row(mat, s, [&](int d, double bytes) {
      if (d != s) meter.add(group[s], group[d], bytes);
    });
  }
  return meter.seconds(overhead_s);
}

void ClassStats::add(const topology::PairCost& pc) {
  MOESIM_ASSERT(pc.bandwidth.value() > 0, "pair without bandwidth");
  ++count;
  max_alpha_s = std::max(max_alpha_s, pc.alpha.value());
  sum_inv_bw += 1.0 / pc.bandwidth.value();
}

void ClassStats::merge_max(const ClassStats& o) {
  count = std::max(count, o.count);
  max_alpha_s = std::max(max_alpha_s, o.max_alpha_s);
  sum_inv_bw = std::max(sum_inv_bw, o.sum_inv_bw);
}

std::vector<int> representative_positions(int group_size) {
  std::vector<int> out;
  if (group_size <= 16) {
    for (int p = 0; p < group_size; ++p) out.push_back(p);
    return out;
  }
  constexpr int kReps = 8;
  for (int i = 0; i < kReps; ++i) {
    out.push_back(
        static_cast<int>(std::llround(static_cast<double>(i) * (group_size - 1) / (kReps - 1))));
  }
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

namespace {
// Entries are keyed by Topology::instance_id(), unique per topology object in the process: a
// sweep that frees a topology and builds the next one (another NIC bandwidth, a calibrated
// copy) at the same address never hits the old summaries.
struct CacheEntry {
  std::uint64_t topo_id = 0;
  int tag = 0, extra = 0;
  std::vector<int> group;
  std::shared_ptr<const void> value;
};

struct Cache {
  std::mutex mu;
  std::unordered_multimap<std::uint64_t, CacheEntry> map;
};

Cache& cache() {
  static Cache c;
  return c;
}

std::uint64_t cache_hash(const topology::Topology& topo, int tag, int extra,
                         const std::vector<int>& group) {
  // Hashing the group is on the hot path (every analytical evaluation looks its summary up), so
  // the group part is a position-weighted sum the compiler vectorises; equal hashes are always
  // confirmed by a full comparison, so collisions cost time, never correctness.
  std::uint32_t sum = 0;
  const size_t n = group.size();
  for (size_t i = 0; i < n; ++i) {
    sum += static_cast<std::uint32_t>(group[i]) *
           (static_cast<std::uint32_t>(i) * 2654435761u + 0x9E3779B9u);
  }
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::uint64_t x) {
    h ^= x;
    h *= 1099511628211ull;
  };
  mix(topo.instance_id());
  mix(static_cast<std::uint64_t>(tag));
  mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(extra)));
  mix(n);
  mix(sum);
  if (n > 0) {
    mix(static_cast<std::uint32_t>(group.front()));
    mix(static_cast<std::uint32_t>(group.back()));
  }
  return h;
}

bool matches(const CacheEntry& e, const topology::Topology& topo, int tag, int extra,
             const std::vector<int>& group) {
  // Cheap fields first; the group comparison only runs for a likely hit.
  return e.tag == tag && e.extra == extra && e.topo_id == topo.instance_id() &&
         e.group.size() == group.size() && e.group == group;
}
}  // namespace

namespace {
// A few most recent hits per thread, checked before the shared map: no hashing, no lock, just a
// comparison of the group (the same group is typically evaluated many times in a row: `auto`
// asks every candidate, a sweep varies only the size).
struct Memo {
  static constexpr size_t kSlots = 8;
  std::array<CacheEntry, kSlots> slots{};
  size_t next = 0;
};
thread_local Memo t_memo;

void memo_put(const CacheEntry& e) {
  t_memo.slots[t_memo.next] = e;
  t_memo.next = (t_memo.next + 1) % Memo::kSlots;
}
}  // namespace

std::shared_ptr<const void> cache_find(const topology::Topology& topo, int tag, int extra,
                                       const std::vector<int>& group) {
  for (const CacheEntry& e : t_memo.slots)
    if (e.value && matches(e, topo, tag, extra, group)) return e.value;
  const std::uint64_t h = cache_hash(topo, tag, extra, group);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto [b, e] = c.map.equal_range(h);
  for (auto it = b; it != e; ++it) {
    if (matches(it->second, topo, tag, extra, group)) {
      memo_put(it->second);
      return it->second.value;
    }
  }
  return nullptr;
}

void cache_insert(const topology::Topology& topo, int tag, int extra, const std::vector<int>& group,
                  std::shared_ptr<const void> value) {
  const std::uint64_t h = cache_hash(topo, tag, extra, group);
  CacheEntry entry{topo.instance_id(), tag, extra, group, std::move(value)};
  memo_put(entry);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  constexpr size_t kMaxEntries = 4096;  // bound memory across long sweeps
  if (c.map.size() >= kMaxEntries) c.map.clear();
  auto [b, e] = c.map.equal_range(h);
  for (auto it = b; it != e; ++it)
    if (matches(it->second, topo, tag, extra, group)) return;  // another thread won the race
  c.map.emplace(h, std::move(entry));
}

std::shared_ptr<const CostShape> scaled_shape(const Algorithm& algo, const CollectiveCall& call,
                                              const topology::Topology& topo, int tag, int extra) {
  return cached<CostShape>(topo, tag, extra, *call.group, [&] {
    // Every byte count of these lowerings is proportional to spec.bytes, so one lowering at a
    // reference size gives per-byte lines valid for every size.
    const double ref = 1024.0 * static_cast<double>(call.group->size());
    CollectiveSpec spec = *call.spec;
    spec.bytes = Bytes(ref);
    CollectiveCall ref_call = call;
    ref_call.spec = &spec;
    ref_call.with_layout = false;
    CostShape shape;
    for (const Phase& p : algo.lower(ref_call, topo))
      shape.phases.push_back(phase_shape(p, topo, 1.0 / ref));
    return shape;
  });
}

Seconds scaled_time(const Algorithm& algo, const CollectiveCall& call, const CostContext& ctx,
                    int tag, int extra) {
  const auto shape = scaled_shape(algo, call, *ctx.topo, tag, extra);
  return Seconds(shape_time_s(*shape, call.spec->bytes.value(), ctx));
}

std::shared_ptr<const LinearProfile> linear_profile(const CollectiveCall& call,
                                                    const topology::Topology& topo) {
  return cached<LinearProfile>(topo, kTagLinearProfile, 0, *call.group, [&] {
    const std::vector<int>& g = *call.group;
    const int w = static_cast<int>(g.size());
    LinearProfile prof;
    for (int p : representative_positions(w)) {
      ClassStats intra, inter;
      for (int q = 0; q < w; ++q) {
        if (q == p) continue;
        const topology::PairCost pc = topo.pair_cost(g[p], g[q]);
        (topo.node_of(g[p]) == topo.node_of(g[q]) ? intra : inter).add(pc);
      }
      prof.intra.push_back(intra);
      prof.inter.push_back(inter);
      prof.intra_max.merge_max(intra);
      prof.inter_max.merge_max(inter);
    }
    return prof;
  });
}

std::shared_ptr<const TwoDhProfile> two_dh_profile(const CollectiveCall& call,
                                                   const topology::Topology& topo,
                                                   const NodeGrid& grid) {
  return cached<TwoDhProfile>(topo, kTagTwoDhProfile, 0, *call.group, [&] {
    const std::vector<int>& g = *call.group;
    const int w = static_cast<int>(g.size());
    const int m = grid.m, n = grid.n;
    TwoDhProfile prof;
    prof.grid = grid;
    for (int p : representative_positions(w)) {
      const int a = p / m, j = p % m;
      ClassStats intra, rail;
      for (int k = 0; k < m; ++k)
        if (k != j) intra.add(topo.pair_cost(g[p], g[a * m + k]));
      for (int b = 0; b < n; ++b)
        if (b != a) rail.add(topo.pair_cost(g[p], g[b * m + j]));
      prof.intra.push_back(intra);
      prof.rail.push_back(rail);
      prof.intra_max.merge_max(intra);
      prof.rail_max.merge_max(rail);
    }
    return prof;
  });
}

void append_ring_step(Phase& phase, const std::vector<int>& ring, double chunk_bytes,
                      int send_shift, double base_offset, bool with_layout) {
  const int r = static_cast<int>(ring.size());
  if (r < 2) return;
  for (int p = 0; p < r; ++p) {
    phase.transfers.push_back({ring[p], ring[(p + 1) % r], chunk_bytes});
    if (with_layout) {
      const int k = ((p + send_shift) % r + r) % r;
      const double off = base_offset + k * chunk_bytes;
      phase.chunks.push_back({off, off});
    }
  }
}

NodeGrid require_grid(const CollectiveCall& call, const topology::Topology& topo,
                      std::string_view what) {
  const auto info = grid_info(*call.group, topo);
  if (!info->grid)
    throw InputError(std::string(what) + " needs a node-aligned group: " + info->why);
  return *info->grid;
}

namespace {

// One in-place ring step phase in kRecv over all rings (ring i's chunks at base i * ring_stride),
// repeated r - 1 times: see append_ring_step for send_shift.
void add_ring_steps(std::vector<Phase>& phases, std::span<const std::vector<int>> rings, int r,
                    double chunk_bytes, double ring_stride, std::string_view label, int send_shift,
                    bool with_layout) {
  Phase& ph = phases.emplace_back();
  ph.kind = Phase::Kind::kTransfers;
  ph.label = label;
  ph.src = ph.dst = Buffer::kRecv;
  ph.repeat = r - 1;
  for (size_t i = 0; i < rings.size(); ++i)
    append_ring_step(ph, rings[i], chunk_bytes, send_shift, static_cast<double>(i) * ring_stride,
                     with_layout);
}

int common_ring_size(std::span<const std::vector<int>> rings) {
  if (rings.empty()) return 0;
  const int r = static_cast<int>(rings.front().size());
  for (const auto& ring : rings)
    MOESIM_ASSERT(static_cast<int>(ring.size()) == r, "parallel rings need equal sizes");
  return r;
}

}  // namespace

void append_ring_reduce_scatter(std::vector<Phase>& phases, std::span<const std::vector<int>> rings,
                                double chunk_bytes, double ring_stride, const RingLabels& labels,
                                bool with_layout) {
  const int r = common_ring_size(rings);
  if (r < 2) return;
  add_ring_steps(phases, rings, r, chunk_bytes, ring_stride, labels.rs_step, -1, with_layout);
  Phase& red = phases.emplace_back();
  red.kind = Phase::Kind::kReduce;
  red.label = labels.rs_reduce;
  red.src = red.dst = Buffer::kRecv;
  red.local_bytes = Bytes(3 * chunk_bytes * (r - 1));
}

void append_ring_all_gather(std::vector<Phase>& phases, std::span<const std::vector<int>> rings,
                            double chunk_bytes, double ring_stride, const RingLabels& labels,
                            bool with_layout) {
  const int r = common_ring_size(rings);
  if (r < 2) return;
  add_ring_steps(phases, rings, r, chunk_bytes, ring_stride, labels.ag_step, 0, with_layout);
}

void fill_level_exchange(Phase& copy, Phase& exchange, const std::vector<int>& group, int dim,
                         int stride, double chunk_bytes, bool with_layout) {
  const int w = static_cast<int>(group.size()), other = w / dim;
  const double c = chunk_bytes;
  copy.stride_h = dim;
  copy.stride_w = other;
  copy.chunk_bytes = c;
  copy.local_bytes = Bytes(2 * w * c);
  exchange.local_bytes = Bytes(2 * other * c);
  exchange.transfers.reserve(static_cast<size_t>(w) * (dim - 1));
  for (int p = 0; p < w; ++p) {
    const int own = (p / stride) % dim;
    append_exchange(
        exchange, group[p], own, dim, [&](int k) { return group[p + (k - own) * stride]; },
        [&](int) { return other * c; }, [&](int k) { return k * other * c; },
        [&](int) { return own * other * c; }, with_layout);
  }
}

std::vector<Phase> two_dh_phases() {
  std::vector<Phase> phases(4);
  const auto set = [&](int i, Phase::Kind kind, std::string_view label, Buffer src, Buffer dst) {
    phases[i].kind = kind;
    phases[i].label = label;
    phases[i].src = src;
    phases[i].dst = dst;
  };
  set(kStrideCopy1, Phase::Kind::kCopy, "stride_copy_1", Buffer::kSend, Buffer::kScratch);
  set(kIntra, Phase::Kind::kTransfers, "intra", Buffer::kScratch, Buffer::kRecv);
  set(kStrideCopy2, Phase::Kind::kCopy, "stride_copy_2", Buffer::kRecv, Buffer::kScratch);
  set(kInter, Phase::Kind::kTransfers, "inter", Buffer::kScratch, Buffer::kRecv);
  return phases;
}

}  // namespace detail
}  // namespace moesim::collectives
