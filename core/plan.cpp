#include "core/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <unordered_set>

#include "core/error.hpp"

namespace moesim {

RankSet RankSet::range(int first, int count, int stride) {
  MOESIM_ASSERT(count >= 0 && stride >= 1, "RankSet::range needs count >= 0 and stride >= 1");
  RankSet s;
  s.first_ = first;
  s.count_ = count;
  s.stride_ = stride;
  return s;
}

RankSet RankSet::list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  // Compress to a range when the list is arithmetic: keeps ops compact whatever the builder did.
  if (ranks.size() >= 2) {
    int stride = ranks[1] - ranks[0];
    bool arithmetic = stride >= 1;
    for (size_t i = 2; arithmetic && i < ranks.size(); ++i)
      arithmetic = ranks[i] - ranks[i - 1] == stride;
    if (arithmetic) return range(ranks[0], static_cast<int>(ranks.size()), stride);
  } else if (ranks.size() == 1) {
    return range(ranks[0], 1, 1);
  } else {
    return RankSet();
  }
  RankSet s;
  s.list_ = std::move(ranks);
  return s;
}

RankSet RankSet::shifted(int offset) const {
  RankSet s = *this;
  if (list_.empty())
    s.first_ += offset;
  else
    for (int& r : s.list_) r += offset;
  return s;
}

bool RankSet::contains(int rank) const { return index_of(rank) >= 0; }

int RankSet::index_of(int rank) const {
  if (list_.empty()) {
    if (count_ == 0 || rank < first_) return -1;
    int d = rank - first_;
    if (stride_ == 1) return d < count_ ? d : -1;  // no division: the engine asks per instance
    if (d % stride_ != 0) return -1;
    int i = d / stride_;
    return i < count_ ? i : -1;
  }
  auto it = std::lower_bound(list_.begin(), list_.end(), rank);
  if (it == list_.end() || *it != rank) return -1;
  return static_cast<int>(it - list_.begin());
}

bool RankSet::operator==(const RankSet& o) const {
  if (size() != o.size()) return false;
  for (int i = 0; i < size(); ++i)
    if (at(i) != o.at(i)) return false;
  return true;
}

namespace {
constexpr std::array kOpKinds = {"compute", "collective", "copy"};
constexpr std::array kComputeClasses = {"gemm",      "gate",  "encode", "decode",   "elementwise",
                                        "attention", "other", "norm",   "optimizer"};
constexpr std::array kCollectiveTypes = {"all_to_all", "all_to_allv",    "all_reduce",
                                         "all_gather", "reduce_scatter", "send_recv"};
constexpr std::array kCollectiveAlgos = {"auto",         "linear", "2dh", "ring",  "tree",
                                         "hierarchical", "saa",    "3dh", "deepep"};
}  // namespace

std::string_view op_kind_name(OpKind k) { return kOpKinds[static_cast<int>(k)]; }
std::string_view compute_class_name(ComputeClass c) { return kComputeClasses[static_cast<int>(c)]; }
std::string_view collective_type_name(CollectiveType t) {
  return kCollectiveTypes[static_cast<int>(t)];
}
std::string_view collective_algo_name(CollectiveAlgo a) {
  return kCollectiveAlgos[static_cast<int>(a)];
}
std::optional<CollectiveType> parse_collective_type(std::string_view s) {
  for (size_t i = 0; i < kCollectiveTypes.size(); ++i)
    if (s == kCollectiveTypes[i]) return static_cast<CollectiveType>(i);
  return std::nullopt;
}
std::optional<CollectiveAlgo> parse_collective_algo(std::string_view s) {
  for (size_t i = 0; i < kCollectiveAlgos.size(); ++i)
    if (s == kCollectiveAlgos[i]) return static_cast<CollectiveAlgo>(i);
  return std::nullopt;
}

Bytes ByteMatrix::at(int src, int dst) const {
  if (dense) return unit * static_cast<double>(counts[static_cast<size_t>(src) * size + dst]);
  auto b = cols.begin() + row_offsets[src], e = cols.begin() + row_offsets[src + 1];
  auto it = std::lower_bound(b, e, dst);
  if (it == e || *it != dst) return Bytes(0);
  return unit * static_cast<double>(values[it - cols.begin()]);
}

Bytes ByteMatrix::row_sum(int src) const {
  double s = 0;
  if (dense) {
    for (int j = 0; j < size; ++j) s += counts[static_cast<size_t>(src) * size + j];
  } else {
    for (auto i = row_offsets[src]; i < row_offsets[src + 1]; ++i) s += values[i];
  }
  return unit * s;
}

Bytes ByteMatrix::col_sum(int dst) const {
  double s = 0;
  for (int i = 0; i < size; ++i) s += at(i, dst).value() / unit.value();
  return unit * s;
}

Bytes ByteMatrix::total() const {
  double s = 0;
  if (dense) {
    for (auto c : counts) s += c;
  } else {
    for (auto c : values) s += c;
  }
  return unit * s;
}

StreamId Plan::stream(const std::string& name) {
  for (size_t i = 0; i < streams_.size(); ++i)
    if (streams_[i] == name) return static_cast<StreamId>(i);
  streams_.push_back(name);
  return static_cast<StreamId>(streams_.size() - 1);
}

GroupingId Plan::add_grouping(Grouping g) {
  groupings_.push_back(std::move(g));
  return static_cast<GroupingId>(groupings_.size() - 1);
}

std::string role_label(const OpRole& role) {
  const char* name = "?";
  switch (role.kind) {
    case OpRoleKind::kNone:
      name = "?";
      break;
    case OpRoleKind::kGate:
      name = "gate";
      break;
    case OpRoleKind::kEncode:
      name = "encode";
      break;
    case OpRoleKind::kDispatch:
      name = "dispatch";
      break;
    case OpRoleKind::kFc1:
      name = "expert.fc1";
      break;
    case OpRoleKind::kFc2:
      name = "expert.fc2";
      break;
    case OpRoleKind::kCombine:
      name = "combine";
      break;
    case OpRoleKind::kDecode:
      name = "decode";
      break;
    case OpRoleKind::kParamGather:
      name = "param_allgather";
      break;
    case OpRoleKind::kPartialSum:
      name = "partial_sum";
      break;
    case OpRoleKind::kEspAllGather:
      name = "esp_allgather";
      break;
    case OpRoleKind::kEspAllReduce:
      name = "esp_allreduce";
      break;
    case OpRoleKind::kCombineSaa:
      name = "combine_saa";
      break;
    case OpRoleKind::kParmLocalDump:
      name = "parm.local_dump";
      break;
    case OpRoleKind::kParmLocalCombine:
      name = "parm.local_combine";
      break;
    case OpRoleKind::kParmJoin:
      name = "parm.join";
      break;
    case OpRoleKind::kParmMpAllGather:
      name = "parm.mp_allgather";
      break;
    case OpRoleKind::kDenseGradSync:
      name = "dense_allreduce";
      break;
    case OpRoleKind::kExpertGradSync:
      name = "expert_allreduce";
      break;
    case OpRoleKind::kExpertMpGradSync:
      name = "expert_mp_allreduce";
      break;
  }
  if (role.chunk < 0)
    return fmt::format("L{}.{}.{}", role.block, role.backward ? "bwd" : "fwd", name);
  return fmt::format("L{}.{}.{}.c{}", role.block, role.backward ? "bwd" : "fwd", name,
                     role.chunk + 1);
}

OpId Plan::add(Op op) {
  op.id = static_cast<OpId>(ops_.size());
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

OpId Plan::add_compute(RankSet ranks, StreamId stream, ComputeSpec spec, std::vector<OpId> deps,
                       OpTag tag) {
  Op op;
  op.kind = OpKind::kCompute;
  op.ranks = std::move(ranks);
  op.stream = stream;
  op.deps = std::move(deps);
  op.label = std::move(tag.label);
  op.role = tag.role;
  op.spec = std::move(spec);
  return add(std::move(op));
}

OpId Plan::add_collective(StreamId stream, CollectiveSpec spec, std::vector<OpId> deps, OpTag tag) {
  const Grouping& g = grouping(spec.grouping);
  std::vector<int> all;
  for (const auto& grp : g.groups) all.insert(all.end(), grp.begin(), grp.end());
  Op op;
  op.kind = OpKind::kCollective;
  op.ranks = RankSet::list(std::move(all));
  op.stream = stream;
  op.deps = std::move(deps);
  op.label = std::move(tag.label);
  op.role = tag.role;
  op.spec = std::move(spec);
  return add(std::move(op));
}

OpId Plan::add_copy(RankSet ranks, StreamId stream, CopySpec spec, std::vector<OpId> deps,
                    OpTag tag) {
  Op op;
  op.kind = OpKind::kCopy;
  op.ranks = std::move(ranks);
  op.stream = stream;
  op.deps = std::move(deps);
  op.label = std::move(tag.label);
  op.role = tag.role;
  op.spec = spec;
  return add(std::move(op));
}

namespace {
bool ranksets_intersect(const RankSet& a, const RankSet& b) {
  const RankSet& small = a.size() <= b.size() ? a : b;
  const RankSet& big = a.size() <= b.size() ? b : a;
  for (int i = 0; i < small.size(); ++i)
    if (big.contains(small.at(i))) return true;
  return false;
}
}  // namespace

void Plan::validate() const {
  auto fail = [](const Op& op, const std::string& what) {
    throw InputError(fmt::format("plan: op {} '{}': {}", op.id, op.label, what));
  };
  for (size_t gi = 0; gi < groupings_.size(); ++gi) {
    const auto& g = groupings_[gi];
    std::unordered_set<int> seen;
    for (const auto& grp : g.groups) {
      if (static_cast<int>(grp.size()) != g.group_size() || grp.empty())
        throw InputError(fmt::format("plan: grouping '{}' has groups of different sizes", g.name));
      for (int r : grp) {
        if (r < 0 || r >= num_ranks_)
          throw InputError(fmt::format("plan: grouping '{}' names rank {}, outside [0, {})", g.name,
                                       r, num_ranks_));
        if (!seen.insert(r).second)
          throw InputError(
              fmt::format("plan: grouping '{}' puts rank {} in two groups", g.name, r));
      }
    }
  }
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op& op = ops_[i];
    if (op.id != static_cast<OpId>(i)) fail(op, fmt::format("id does not match position {}", i));
    if (op.ranks.size() == 0) fail(op, "runs on no rank");
    if (op.ranks.at(0) < 0 || op.ranks.at(op.ranks.size() - 1) >= num_ranks_)
      fail(op, fmt::format("names a rank outside [0, {})", num_ranks_));
    if (op.stream < 0 || op.stream >= static_cast<StreamId>(streams_.size()))
      fail(op, fmt::format("uses unknown stream {}", op.stream));
    for (OpId d : op.deps) {
      if (d < 0 || d >= op.id)
        fail(op, fmt::format("depends on op {}, which is not an earlier op (a cycle or an "
                             "unknown op)",
                             d));
      if (!ranksets_intersect(ops_[d].ranks, op.ranks))
        fail(op,
             fmt::format("depends on op {} '{}', which shares no rank with it", d, ops_[d].label));
    }
    if (op.kind == OpKind::kCollective) {
      const auto& c = op.collective();
      if (c.grouping < 0 || c.grouping >= static_cast<GroupingId>(groupings_.size()))
        fail(op, fmt::format("uses unknown grouping {}", c.grouping));
      const Grouping& g = groupings_[c.grouping];
      if (c.type == CollectiveType::kAllToAllv) {
        if (!c.matrix && c.per_group.empty()) fail(op, "all_to_allv without a byte matrix");
        if (!c.per_group.empty() && c.per_group.size() != g.groups.size())
          fail(op, fmt::format("has {} per-group matrices for {} groups", c.per_group.size(),
                               g.groups.size()));
        auto check = [&](const ByteMatrix& m) {
          if (m.size != g.group_size())
            fail(op, fmt::format("byte matrix is {}x{} but groups have {} ranks", m.size, m.size,
                                 g.group_size()));
        };
        if (c.matrix) check(*c.matrix);
        for (const auto& m : c.per_group)
          if (m) check(*m);
      }
      if (c.type == CollectiveType::kSendRecv && g.group_size() < 2)
        fail(op, "send_recv needs groups of at least 2 ranks");
    } else if (op.kind == OpKind::kCompute) {
      const auto& c = op.compute();
      if (c.rank_scale && static_cast<int>(c.rank_scale->size()) != op.ranks.size())
        fail(op, fmt::format("rank_scale has {} entries for {} ranks", c.rank_scale->size(),
                             op.ranks.size()));
    }
  }
}

Plan world_collective_plan(int gpus, CollectiveType type, CollectiveAlgo algo, Bytes size,
                           std::shared_ptr<const ByteMatrix> matrix,
                           std::shared_ptr<const NodeDedup> dedup) {
  Plan plan(gpus);
  StreamId comm = plan.stream("comm");
  Grouping world{"world", {{}}};
  for (int r = 0; r < gpus; ++r) world.groups[0].push_back(r);
  GroupingId g = plan.add_grouping(std::move(world));
  CollectiveSpec spec;
  spec.type = type;
  spec.algo = algo;
  spec.grouping = g;
  spec.bytes = size;
  spec.matrix = std::move(matrix);
  if (dedup) spec.node_dedup = {std::move(dedup)};
  plan.add_collective(
      comm, spec, {},
      std::string(collective_type_name(type)) + "." + std::string(collective_algo_name(algo)));
  return plan;
}

}  // namespace moesim
