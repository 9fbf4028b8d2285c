#include "apps/moesim/chakra_export.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/gemm_model.hpp"

#ifdef MOESIM_HAVE_CHAKRA
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "apps/moesim/chakra_et.pb.h"
#endif

namespace moesim::app {

namespace fs = std::filesystem;

namespace {
constexpr const char* kManifest = "moesim_chakra.json";
}  // namespace

bool chakra_available() {
#ifdef MOESIM_HAVE_CHAKRA
  return true;
#else
  return false;
#endif
}

void check_chakra_dir(const std::string& dir) {
  if (dir.empty()) return;
  if (!chakra_available())
    throw InputError(fmt::format(
        "--chakra {}: this moesim was built without protobuf (Debian: libprotobuf-dev "
        "protobuf-compiler; scripts/setup.sh installs them), so it cannot write Chakra traces",
        dir));
  const fs::path p(dir);
  fs::path parent = p.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    throw InputError(
        fmt::format("--chakra {}: the directory '{}' does not exist", dir, parent.string()));
  if (::access(parent.c_str(), W_OK) != 0)
    throw InputError(
        fmt::format("--chakra {}: the directory '{}' is not writable", dir, parent.string()));
  if (fs::exists(p, ec)) {
    if (!fs::is_directory(p, ec))
      throw InputError(fmt::format("--chakra {}: exists and is not a directory", dir));
    if (!fs::is_empty(p, ec) && !fs::exists(p / kManifest, ec))
      throw InputError(fmt::format(
          "--chakra {}: the directory holds files that are not a moesim Chakra export (no {}); "
          "expected a new or empty directory, or an earlier export to replace",
          dir, kManifest));
  }
}

#ifdef MOESIM_HAVE_CHAKRA
namespace {

using ChakraProtoMsg::AttributeProto;
using ChakraProtoMsg::Node;

void attr_u64(Node& n, const char* name, std::uint64_t v) {
  AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_uint64_val(v);
}
void attr_i32(Node& n, const char* name, std::int32_t v) {
  AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_int32_val(v);
}
void attr_i64(Node& n, const char* name, std::int64_t v) {
  AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_int64_val(v);
}
void attr_bool(Node& n, const char* name, bool v) {
  AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_bool_val(v);
}
void attr_str(Node& n, const char* name, const std::string& v) {
  AttributeProto* a = n.add_attr();
  a->set_name(name);
  a->set_string_val(v);
}

std::uint64_t micros(double s) {
  return std::isfinite(s) && s > 0 ? static_cast<std::uint64_t>(std::llround(s * 1e6)) : 0;
}

ChakraProtoMsg::CollectiveCommType comm_type(CollectiveType t) {
  switch (t) {
    case CollectiveType::kAllReduce:
      return ChakraProtoMsg::ALL_REDUCE;
    case CollectiveType::kAllGather:
      return ChakraProtoMsg::ALL_GATHER;
    case CollectiveType::kReduceScatter:
      return ChakraProtoMsg::REDUCE_SCATTER;
    default:
      return ChakraProtoMsg::ALL_TO_ALL;
  }
}

// One process group per distinct rank list, numbered from 1 (ASTRA-sim's comm group file).
class GroupIds {
 public:
  int id_of(const std::vector<int>& ranks) {
    auto [it, added] = ids_.try_emplace(ranks, static_cast<int>(ids_.size()) + 1);
    return it->second;
  }
  nlohmann::ordered_json json() const {
    std::vector<std::pair<int, const std::vector<int>*>> by_id;
    for (const auto& [ranks, id] : ids_) by_id.emplace_back(id, &ranks);
    std::sort(by_id.begin(), by_id.end());
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const auto& [id, ranks] : by_id) j[std::to_string(id)] = *ranks;
    return j;
  }

 private:
  std::map<std::vector<int>, int> ids_;
};

// The group (of the op's grouping) that holds `rank`, and the rank's position in it.
std::pair<const std::vector<int>*, int> group_of(const Plan& plan, const CollectiveSpec& spec,
                                                 int rank, int* group_index) {
  const auto& groups = plan.grouping(spec.grouping).groups;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto& grp = groups[g];
    const auto it = std::find(grp.begin(), grp.end(), rank);
    if (it != grp.end()) {
      *group_index = static_cast<int>(g);
      return {&grp, static_cast<int>(it - grp.begin())};
    }
  }
  return {nullptr, -1};
}

const ByteMatrix* matrix_of(const CollectiveSpec& spec, int group_index) {
  if (!spec.per_group.empty())
    return spec.per_group.at(static_cast<std::size_t>(group_index)).get();
  return spec.matrix.get();
}

void write_delimited(google::protobuf::io::CodedOutputStream& out,
                     const google::protobuf::Message& msg) {
  out.WriteVarint32(static_cast<std::uint32_t>(msg.ByteSizeLong()));
  msg.SerializeWithCachedSizes(&out);
}

// One rank's trace of one plan.
void write_rank(const Plan& plan, const RunResult& result, int rank, GroupIds& groups,
                const ChakraOptions& options, const std::string& path) {
  std::ofstream file(path, std::ios::binary);
  if (!file) throw RuntimeError(fmt::format("--chakra: cannot create {}", path));
  {
    google::protobuf::io::OstreamOutputStream zero(&file);
    google::protobuf::io::CodedOutputStream out(&zero);
    ChakraProtoMsg::GlobalMetadata meta;
    meta.set_version("0.0.4");
    {
      AttributeProto* a = meta.add_attr();
      a->set_name("producer");
      a->set_string_val("moesim");
    }
    write_delimited(out, meta);
    // Plan op id -> this file's node ids (a send_recv is a send and a receive).
    std::vector<std::vector<std::uint64_t>> nodes_of(plan.ops().size());
    std::vector<std::uint64_t> last_on_stream(plan.stream_names().size(), ~std::uint64_t{0});
    std::uint64_t next_id = 0;
    for (const Op& op : plan.ops()) {
      const int pos = op.ranks.index_of(rank);
      if (pos < 0) continue;
      std::vector<std::uint64_t> deps;
      for (OpId d : op.deps)
        for (std::uint64_t id : nodes_of[d]) deps.push_back(id);  // empty unless d is on `rank`
      const std::uint64_t prev = last_on_stream[static_cast<std::size_t>(op.stream)];
      const double start = result.op_start(op.id, pos), end = result.op_end(op.id, pos);
      auto base = [&](Node& n, ChakraProtoMsg::NodeType type, const std::string& name) {
        n.set_id(next_id++);
        n.set_name(name);
        n.set_type(type);
        for (std::uint64_t d : deps) n.add_data_deps(d);
        if (prev != ~std::uint64_t{0}) n.add_ctrl_deps(prev);
        n.set_start_time_micros(micros(start));
        n.set_duration_micros(micros(end - start));
        nodes_of[static_cast<std::size_t>(op.id)].push_back(n.id());
      };
      auto emit = [&](const Node& n) { write_delimited(out, n); };
      // One point-to-point half: a send from `src` or a receive at `dst` (this rank is the other).
      auto p2p = [&](ChakraProtoMsg::NodeType type, int src, int dst, double bytes) {
        Node n;
        const bool send = type == ChakraProtoMsg::COMM_SEND_NODE;
        base(n, type, op.label + (send ? ".send" : ".recv"));
        attr_i32(n, "comm_src", src);
        attr_i32(n, "comm_dst", dst);
        attr_i32(n, "comm_tag", op.id);
        attr_i64(n, "comm_size", std::llround(bytes));
        emit(n);
      };
      auto send_recv = [&](int peer_to, int peer_from, double bytes_out, double bytes_in) {
        if (peer_to >= 0) p2p(ChakraProtoMsg::COMM_SEND_NODE, rank, peer_to, bytes_out);
        if (peer_from >= 0) p2p(ChakraProtoMsg::COMM_RECV_NODE, peer_from, rank, bytes_in);
      };
      if (op.kind != OpKind::kCollective) {
        Node n;
        base(n, ChakraProtoMsg::COMP_NODE, op.label);
        double flops = 0, bytes = 0;
        if (op.kind == OpKind::kCompute) {
          const ComputeSpec& c = op.compute();
          const double scale = c.rank_scale ? (*c.rank_scale)[static_cast<std::size_t>(pos)] : 1.0;
          flops = c.flops.value() * scale;
          bytes = c.bytes.value();
          if (bytes <= 0 && c.gemm)  // the engines' own floor for a GEMM's HBM traffic
            bytes = gemm_min_bytes(*c.gemm, c.fp8 ? 1.0 : options.bytes_per_element);
          bytes *= scale;
        } else {
          bytes = op.copy().bytes.value();
        }
        attr_i64(n, "num_ops", std::llround(flops));
        attr_u64(n, "tensor_size", static_cast<std::uint64_t>(std::llround(bytes)));
        attr_bool(n, "is_cpu_op", false);
        emit(n);
      } else {
        const CollectiveSpec& spec = op.collective();
        int gi = -1;
        const auto [grp, p] = group_of(plan, spec, rank, &gi);
        MOESIM_ASSERT(grp != nullptr, "a collective's rank is in none of its groups");
        const int w = static_cast<int>(grp->size());
        const ByteMatrix* m =
            spec.type == CollectiveType::kAllToAllv ? matrix_of(spec, gi) : nullptr;
        if (spec.type == CollectiveType::kSendRecv) {
          const int off = ((spec.peer_offset % w) + w) % w;
          if (off != 0)
            send_recv((*grp)[static_cast<std::size_t>((p + off) % w)],
                      (*grp)[static_cast<std::size_t>((p - off + w) % w)], spec.bytes.value(),
                      spec.bytes.value());
        } else if (m != nullptr && !options.a2av_as_collective) {
          // Exact per-pair sizes: sends in destination order, then receives in source order.
          for (int d = 0; d < w; ++d)
            if (d != p && m->at(p, d).value() > 0)
              send_recv((*grp)[static_cast<std::size_t>(d)], -1, m->at(p, d).value(), 0);
          for (int q = 0; q < w; ++q)
            if (q != p && m->at(q, p).value() > 0)
              send_recv(-1, (*grp)[static_cast<std::size_t>(q)], 0, m->at(q, p).value());
        } else {
          Node n;
          base(n, ChakraProtoMsg::COMM_COLL_NODE, op.label);
          attr_i64(n, "comm_type", comm_type(spec.type));
          // The approximation (a2av_as_collective): every rank of the group sends the mean row.
          const double size = m != nullptr ? m->total().value() / w : spec.bytes.value();
          attr_i64(n, "comm_size", std::llround(size));
          if (m != nullptr)
            attr_str(n, "moesim_approximation",
                     "all_to_allv as an all_to_all of the group's mean row; rows differ per rank");
          attr_str(n, "pg_name", std::to_string(groups.id_of(*grp)));
          emit(n);
        }
      }
      if (!nodes_of[static_cast<std::size_t>(op.id)].empty())
        last_on_stream[static_cast<std::size_t>(op.stream)] =
            nodes_of[static_cast<std::size_t>(op.id)].back();
      else  // nothing to move on this rank: later ops depend on what it depended on
        nodes_of[static_cast<std::size_t>(op.id)] = deps;
    }
  }
  if (!file) throw RuntimeError(fmt::format("--chakra: writing {} failed", path));
}

}  // namespace
#endif

void write_chakra(const std::string& dir, const std::string& scenario,
                  const std::vector<ChakraRun>& runs, const ChakraOptions& options) {
#ifndef MOESIM_HAVE_CHAKRA
  (void)scenario;
  (void)runs;
  (void)options;
  check_chakra_dir(dir);  // throws: no protobuf
#else
  const fs::path target(dir);
  const fs::path tmp =
      target.parent_path() / fmt::format(".{}.tmp-{}", target.filename().string(), ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    fs::create_directories(tmp);
    nlohmann::ordered_json manifest;
    manifest["producer"] = "moesim";
    manifest["scenario"] = scenario;
    manifest["schema"] = "Chakra ET (ChakraProtoMsg), version 0.0.4";
    manifest["all_to_allv"] = options.a2av_as_collective
                                  ? "one all_to_all node of the group's mean row (approximation)"
                                  : "per-peer send and receive nodes of the plan's exact sizes";
    auto& list = manifest["strategies"] = nlohmann::ordered_json::array();
    for (const ChakraRun& r : runs) {
      MOESIM_ASSERT(r.plan != nullptr && r.result != nullptr, "Chakra export of a missing run");
      const fs::path sub = tmp / r.strategy;
      fs::create_directories(sub);
      GroupIds groups;
      for (int rank = 0; rank < r.plan->num_ranks(); ++rank)
        write_rank(*r.plan, *r.result, rank, groups, options,
                   (sub / fmt::format("et.{}.et", rank)).string());
      std::ofstream cg(sub / "comm_group.json");
      cg << groups.json().dump() << "\n";
      if (!cg)
        throw RuntimeError(
            fmt::format("--chakra: writing {} failed", (sub / "comm_group.json").string()));
      list.push_back({{"strategy", r.strategy},
                      {"ranks", r.plan->num_ranks()},
                      {"workload_prefix", r.strategy + "/et"},
                      {"comm_group", r.strategy + "/comm_group.json"}});
    }
    {
      std::ofstream mf(tmp / kManifest);
      mf << manifest.dump(2) << "\n";
      if (!mf) throw RuntimeError(fmt::format("--chakra: writing {} failed", kManifest));
    }
    if (fs::exists(target)) fs::remove_all(target);  // an earlier export (check_chakra_dir)
    fs::rename(tmp, target);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
#endif
}

}  // namespace moesim::app
