#include "core/scenario_loader.hpp"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "core/hf_config.hpp"
#include "core/text_file.hpp"
#include "core/yaml_reader.hpp"

namespace moesim {

namespace fs = std::filesystem;
using yaml::Context;
using yaml::describe;
using yaml::MapReader;

namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

template <typename E>
std::vector<std::string_view> names_of(const std::vector<NamedValue<E>>& table) {
  std::vector<std::string_view> out;
  out.reserve(table.size());
  for (const auto& row : table) out.push_back(row.name);
  return out;
}

template <typename E>
std::optional<E> get_enum(const MapReader& m, std::string_view key,
                          const std::vector<NamedValue<E>>& table) {
  auto i = m.get_choice(key, names_of(table));
  if (!i) return std::nullopt;
  return table[*i].value;
}

// Dtype / intra / inter names are defined once, by dtype_name() & co. in cluster_spec.cpp.
const std::vector<NamedValue<Dtype>>& dtype_table() {
  static const std::vector<NamedValue<Dtype>> t = [] {
    std::vector<NamedValue<Dtype>> v;
    for (Dtype d : {Dtype::kFp32, Dtype::kTf32, Dtype::kFp16, Dtype::kBf16, Dtype::kFp8})
      v.push_back({d, dtype_name(d)});
    return v;
  }();
  return t;
}

const std::vector<NamedValue<IntraKind>>& intra_table() {
  static const std::vector<NamedValue<IntraKind>> t = [] {
    std::vector<NamedValue<IntraKind>> v;
    for (IntraKind k : {IntraKind::kNvswitch, IntraKind::kNvlinkRing, IntraKind::kPcie})
      v.push_back({k, intra_kind_name(k)});
    return v;
  }();
  return t;
}

const std::vector<NamedValue<InterKind>>& inter_table() {
  static const std::vector<NamedValue<InterKind>> t = [] {
    std::vector<NamedValue<InterKind>> v;
    for (InterKind k :
         {InterKind::kNone, InterKind::kSwitch, InterKind::kFatTree, InterKind::kRailOptimized,
          InterKind::kDragonfly, InterKind::kTree, InterKind::kCustom})
      v.push_back({k, inter_kind_name(k)});
    return v;
  }();
  return t;
}

int to_int32(std::int64_t v) { return static_cast<int>(v); }
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

// Upper bounds of the model's sizes. Each is far above any real model, and together they keep
// every size the plan derives from them (tokens x dims x bytes, experts x capacity) inside int64
// and the doubles' exact range; check_plan_sizes() bounds the products themselves.
constexpr std::int64_t kMaxLayers = 1 << 16;
constexpr std::int64_t kMaxDim = 1 << 20;  // model_dim, hidden_dim
constexpr std::int64_t kMaxSharedExperts = 1024;
constexpr std::int64_t kMaxVocab = 1 << 24;  // vocab_size
// GPUs in a cluster: 4x the largest fabric the benchmarks target (32,768); a validate of 2^17 GPUs
// takes seconds, of 2^19 two minutes, and 10^6 nodes x 8 ran 38 s into bad_alloc.
constexpr std::int64_t kMaxGpus = std::int64_t{1} << 17;
constexpr std::int64_t kMaxHeads = 1 << 16;  // attention heads
// Every key of `model:` (parse_model and resolve_experts read the same map).
const std::vector<std::string_view> kModelKeys = {"mode",
                                                  "layers",
                                                  "moe_every",
                                                  "batch_per_gpu",
                                                  "seq_len",
                                                  "model_dim",
                                                  "hidden_dim",
                                                  "expert_hidden_dim",
                                                  "dense_hidden_dim",
                                                  "shared_experts",
                                                  "first_dense_layers",
                                                  "vocab_size",
                                                  "tie_embeddings",
                                                  "experts",
                                                  "experts_per_gpu",
                                                  "top_k",
                                                  "capacity_factor",
                                                  "dtype",
                                                  "micro_batches",
                                                  "mtp_layers",
                                                  "hf_config",
                                                  "attention",
                                                  "activation",
                                                  "precision",
                                                  "recompute"};
constexpr std::int64_t kMaxExperts = 1 << 20;                     // E, experts_per_gpu
constexpr std::int64_t kMaxTokensPerGpu = std::int64_t{1} << 31;  // S = batch_per_gpu x seq_len
constexpr double kMaxCapacityFactor = 1024;  // |capacity factor|; dC = k f S / E slots
// The bytes one GPU sends in one dispatch all-to-all (E x dC x M x bytes x esp x repeats).
constexpr double kMaxA2aBytes = 1125899906842624.0;  // 2^50
constexpr std::int64_t kMaxIterations = 1'000'000;   // the routing trace's limit, too
// Micro-batches per step: the plan holds every one's ops (per pipeline stage), so bounded.
constexpr std::int64_t kMaxMicroBatches = 4096;
// MTP depth (DeepSeek-V3 trains with 1; each module is a block and an LM head on the last stage).
constexpr std::int64_t kMaxMtpLayers = 16;

// A plain number in [lo, hi] ((lo, hi] when lo_open), with the range stated when out of it.
double number_in(const MapReader& m, std::string_view key, double lo, double hi,
                 bool lo_open = false) {
  const double v = *m.get_number(key);
  if (v < lo || v > hi || (lo_open && v == lo))
    m.fail(key,
           fmt::format("found {}, expected a number in {}{}, {}]", v, lo_open ? "(" : "[", lo, hi));
  return v;
}

// A path written in the file, resolved against the file's directory; must exist.
std::string resolve_existing(const MapReader& m, std::string_view key, std::string_view what) {
  std::string rel = *m.get_string(key);
  if (rel.empty()) m.fail(key, fmt::format("found an empty path, expected the path of {}", what));
  fs::path p(rel);
  if (p.is_relative()) {
    fs::path base = fs::path(m.context().file()).parent_path();
    p = base / p;
  }
  p = p.lexically_normal();
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) {
    m.fail(key, fmt::format("found '{}' (resolved to '{}'), which does not exist; expected the "
                            "path of {}, relative to the scenario file",
                            rel, p.string(), what));
  }
  return p.string();
}

std::string file_stem(const std::string& file) {
  std::string stem = fs::path(file).stem().string();
  return stem.empty() ? file : stem;
}

// A positive rate (bandwidth) or fail.
BytesPerSecond positive_rate(const MapReader& m, std::string_view key) {
  double v = *m.get_quantity(key, UnitKind::kBytesPerSecond);
  if (v <= 0) m.fail(key, "found a zero bandwidth, expected a positive bandwidth");
  return BytesPerSecond(v);
}

std::string p_text(const ClusterSpec& c, int pp = 1) {
  if (pp > 1)
    return fmt::format(
        "P / pp = {} (cluster.nodes {} x cluster.gpus_per_node {} / parallelism.pp "
        "{}: the GPUs of one pipeline stage)",
        c.num_gpus() / pp, c.nodes, c.gpus_per_node, pp);
  return fmt::format("P = {} (cluster.nodes {} x cluster.gpus_per_node {})", c.num_gpus(), c.nodes,
                     c.gpus_per_node);
}

// ---------------------------------------------------------------------------------------------
// cluster

GpuSpec parse_gpu(const MapReader& cluster) {
  GpuSpec gpu;
  gpu.where = cluster.key_location("gpu");
  YAML::Node n = cluster.get("gpu");
  if (n.IsScalar()) {
    gpu.name = n.Scalar();
    gpu.from_catalog = true;
    if (gpu.name.empty())
      cluster.fail("gpu", "found an empty name, expected a GPU catalog name or a map");
    return gpu;
  }
  if (!n.IsMap())
    cluster.fail("gpu", fmt::format("found {}, expected a GPU catalog name (e.g. a100-sxm-80gb) "
                                    "or a map with peak_tflops, hbm_bandwidth, memory",
                                    describe(n)));
  MapReader g = cluster.get_map("gpu", {"name", "peak_tflops", "hbm_bandwidth", "memory",
                                        "nvlink_bandwidth", "pcie_bandwidth", "sms", "l2_cache"});
  gpu.from_catalog = false;
  gpu.name = g.get_string("name").value_or("custom-gpu");
  g.require("peak_tflops", "a compute rate such as 312TFLOPS, or a map dtype -> rate");
  g.require("hbm_bandwidth", "a bandwidth such as 2039GB/s");
  g.require("memory", "a size such as 80GiB");
  YAML::Node peak = g.get("peak_tflops");
  if (peak.IsMap()) {
    std::vector<std::string_view> dtypes = names_of(dtype_table());
    MapReader pm = g.get_map("peak_tflops", dtypes);
    for (const auto& row : dtype_table()) {
      if (!pm.has(row.name)) continue;
      double v = *pm.get_quantity(row.name, UnitKind::kFlopsPerSecond);
      if (v <= 0) pm.fail(row.name, "found a zero rate, expected a positive compute rate");
      gpu.peak[row.value] = FlopsPerSecond(v);
    }
    if (gpu.peak.empty()) g.fail("peak_tflops", "found an empty map, expected at least one dtype");
  } else {
    // A single rate is the fp16 dense tensor-core peak.
    double v = *g.get_quantity("peak_tflops", UnitKind::kFlopsPerSecond);
    if (v <= 0) g.fail("peak_tflops", "found a zero rate, expected a positive compute rate");
    gpu.peak[Dtype::kFp16] = FlopsPerSecond(v);
  }
  gpu.hbm_bandwidth = positive_rate(g, "hbm_bandwidth");
  gpu.memory = Bytes(*g.get_quantity("memory", UnitKind::kBytes));
  if (gpu.memory.value() <= 0) g.fail("memory", "found a zero size, expected a positive size");
  if (g.has("nvlink_bandwidth"))
    gpu.nvlink_bandwidth =
        BytesPerSecond(*g.get_quantity("nvlink_bandwidth", UnitKind::kBytesPerSecond));
  if (g.has("pcie_bandwidth")) gpu.pcie_bandwidth = positive_rate(g, "pcie_bandwidth");
  if (auto v = g.get_int("sms", 1, 100000)) gpu.sms = to_int32(*v);
  if (g.has("l2_cache")) {
    gpu.l2_cache = Bytes(*g.get_quantity("l2_cache", UnitKind::kBytes));
    if (gpu.l2_cache.value() < 0) g.fail("l2_cache", "found a negative size, expected a size");
  }
  return gpu;
}

// A fraction of a spec-sheet bandwidth that transfers achieve: in (0, 1].
double achievable_fraction(const MapReader& m, std::string_view key) {
  const double v = *m.get_number(key);
  if (!(v > 0 && v <= 1))
    m.fail(key, fmt::format("found {}, expected the achievable fraction of the spec-sheet "
                            "bandwidth, a number in (0, 1]",
                            v));
  return v;
}

IntraNodeSpec parse_intra(const MapReader& cluster, int gpus_per_node) {
  IntraNodeSpec intra;
  MapReader m =
      cluster.get_map("intra_node", {"kind", "bandwidth", "efficiency", "latency",
                                     "gpus_per_pcie_switch", "sockets", "socket_link_bandwidth"});
  m.require("kind", "nvswitch, nvlink_ring or pcie");
  intra.kind = *get_enum(m, "kind", intra_table());
  // Absent: 0, which the topology builder replaces by the GPU's own NVLink or PCIe figure.
  if (m.has("bandwidth")) intra.bandwidth = positive_rate(m, "bandwidth");
  if (m.has("efficiency")) intra.efficiency = achievable_fraction(m, "efficiency");
  if (auto v = m.get_quantity("latency", UnitKind::kSeconds)) intra.latency = Seconds(*v);
  // PCIe-tree keys make no sense for NVLink fabrics: reject rather than silently ignore.
  for (std::string_view key : {"gpus_per_pcie_switch", "sockets", "socket_link_bandwidth"}) {
    if (m.has(key) && intra.kind != IntraKind::kPcie)
      m.fail(key, fmt::format("'{}' applies only to kind pcie, but kind is {}", key,
                              intra_kind_name(intra.kind)));
  }
  if (intra.kind == IntraKind::kPcie) {
    if (auto v = m.get_int("gpus_per_pcie_switch", 1, kIntMax)) {
      intra.gpus_per_pcie_switch = to_int32(*v);
      if (gpus_per_node % intra.gpus_per_pcie_switch != 0)
        m.fail("gpus_per_pcie_switch",
               fmt::format("found {}, expected a divisor of cluster.gpus_per_node = {}",
                           intra.gpus_per_pcie_switch, gpus_per_node));
    } else {
      intra.gpus_per_pcie_switch = gpus_per_node % 2 == 0 ? 2 : 1;
    }
    if (auto v = m.get_int("sockets", 1, kIntMax)) intra.sockets = to_int32(*v);
    int switches = gpus_per_node / intra.gpus_per_pcie_switch;
    if (switches % intra.sockets != 0)
      m.fail(m.has("sockets") ? "sockets" : "gpus_per_pcie_switch",
             fmt::format("{} PCIe switch(es) ({} GPUs / {} per switch) cannot be spread evenly "
                         "over {} socket(s); expected sockets to divide the switch count",
                         switches, gpus_per_node, intra.gpus_per_pcie_switch, intra.sockets));
    if (m.has("socket_link_bandwidth"))
      intra.socket_link_bandwidth = positive_rate(m, "socket_link_bandwidth");
  }
  return intra;
}

// TA-MoE nested-list notation: a list is a switch over its items, an integer n a leaf switch
// with n nodes. Returns the height (leaf switch = 1).
int parse_tree(Context& ctx, const YAML::Node& n, const std::string& path, TreeSpec& out) {
  if (n.IsScalar()) {
    out.is_leaf = true;
    // At most the GPUs supported, so the leaves' sum cannot overflow before it is checked.
    out.leaf_nodes = to_int32(ctx.to_int(n, path, 1, kMaxGpus));
    return 1;
  }
  if (!n.IsSequence() || n.size() == 0)
    ctx.fail(n, path,
             fmt::format("found {}, expected a non-empty nested list of node counts such as "
                         "[[2, 2], [2]]",
                         describe(n)));
  ctx.require_list(n, path);
  out.is_leaf = false;
  int height = 0;
  for (std::size_t i = 0; i < n.size(); ++i) {
    out.children.emplace_back();
    height = std::max(height,
                      parse_tree(ctx, n[i], fmt::format("{}[{}]", path, i), out.children.back()));
  }
  return height + 1;
}

int tree_leaf_nodes(const TreeSpec& t) {
  if (t.is_leaf) return t.leaf_nodes;
  int sum = 0;
  for (const auto& c : t.children) sum += tree_leaf_nodes(c);
  return sum;
}

InterNodeSpec parse_inter(const MapReader& cluster, int nodes, int gpus_per_node) {
  InterNodeSpec inter;
  MapReader m =
      cluster.get_map("inter_node", {"kind", "nic", "nic_bandwidth", "nic_efficiency",
                                     "nics_per_node", "latency", "oversubscription", "switch_radix",
                                     "levels", "groups", "routers_per_group", "global_bandwidth",
                                     "local_bandwidth", "tree", "tree_level_bandwidth", "ecmp"});
  m.require("kind", "none, switch, fat_tree, rail_optimized, dragonfly, tree or custom");
  inter.kind = *get_enum(m, "kind", inter_table());
  const InterKind k = inter.kind;
  if (k == InterKind::kNone && nodes != 1)
    m.fail("kind", fmt::format("found 'none' with cluster.nodes = {}, expected a network kind "
                               "(none is only valid for a single node)",
                               nodes));

  // Which keys each kind reads; any other key present is an error, not silently ignored.
  using KS = std::vector<InterKind>;
  const KS networked = {InterKind::kSwitch, InterKind::kFatTree, InterKind::kRailOptimized,
                        InterKind::kDragonfly, InterKind::kTree};
  const std::vector<std::pair<std::string_view, KS>> applies = {
      {"nic", networked},
      {"nic_bandwidth", networked},
      {"nic_efficiency", networked},
      {"nics_per_node", networked},
      {"latency", networked},
      {"oversubscription", {InterKind::kFatTree, InterKind::kRailOptimized, InterKind::kTree}},
      {"switch_radix", {InterKind::kFatTree, InterKind::kRailOptimized, InterKind::kDragonfly}},
      {"levels", {InterKind::kFatTree}},
      {"ecmp", {InterKind::kFatTree, InterKind::kRailOptimized}},
      {"groups", {InterKind::kDragonfly}},
      {"routers_per_group", {InterKind::kDragonfly}},
      {"global_bandwidth", {InterKind::kDragonfly}},
      {"local_bandwidth", {InterKind::kDragonfly}},
      {"tree", {InterKind::kTree}},
      {"tree_level_bandwidth", {InterKind::kTree}},
  };
  for (const auto& [key, kinds] : applies) {
    if (!m.has(key) || std::find(kinds.begin(), kinds.end(), k) != kinds.end()) continue;
    std::vector<std::string_view> names;
    for (InterKind a : kinds) names.push_back(inter_kind_name(a));
    m.fail(key, fmt::format("'{}' applies only to kind {}, but kind is {}", key,
                            yaml::join_alternatives(names), inter_kind_name(k)));
  }
  if (k == InterKind::kNone || k == InterKind::kCustom) return inter;

  // The NIC's name is checked against the catalog when the topology is built (as the GPU's).
  if (auto v = m.get_string("nic")) inter.nic = *v;
  if (m.has("nic_bandwidth")) inter.nic_bandwidth = positive_rate(m, "nic_bandwidth");
  if (m.has("nic_efficiency")) inter.nic_efficiency = achievable_fraction(m, "nic_efficiency");
  if (auto v = m.get_int("nics_per_node", 1, kIntMax)) {
    inter.nics_per_node = to_int32(*v);
    if (inter.nics_per_node > gpus_per_node || gpus_per_node % inter.nics_per_node != 0)
      m.fail("nics_per_node",
             fmt::format("found {}, expected a divisor of cluster.gpus_per_node = {} (GPUs share "
                         "NICs evenly)",
                         inter.nics_per_node, gpus_per_node));
  }
  if (auto v = m.get_quantity("latency", UnitKind::kSeconds)) inter.latency = Seconds(*v);
  if (auto v = m.get_number("oversubscription")) {
    if (*v <= 0 || *v > 1024)
      m.fail("oversubscription",
             fmt::format("found {}, expected a positive down/up capacity ratio of at most 1024 "
                         "(1 = non-blocking)",
                         *v));
    inter.oversubscription = *v;
  }
  if (auto v = m.get_int("switch_radix", 2, 1 << 16)) inter.switch_radix = to_int32(*v);
  if (auto v = m.get_int("levels", 0, 3)) {
    if (*v == 1) m.fail("levels", "found 1, expected 2 or 3 (or 0 for the smallest that fits)");
    inter.levels = to_int32(*v);
  }
  if (auto v = m.get_choice("ecmp", {"dmodk", "hash", "spray"})) {
    constexpr EcmpMode kModes[] = {EcmpMode::kDmodk, EcmpMode::kHash, EcmpMode::kSpray};
    inter.ecmp = kModes[*v];
  }
  if (k == InterKind::kDragonfly) {
    // 0 = auto (about sqrt(nodes) groups); group sizes may differ by one node.
    if (auto v = m.get_int("groups", 0, nodes)) inter.groups = to_int32(*v);
    if (auto v = m.get_int("routers_per_group", 0, 1 << 16)) inter.routers_per_group = to_int32(*v);
    if (m.has("global_bandwidth")) inter.global_bandwidth = positive_rate(m, "global_bandwidth");
    if (m.has("local_bandwidth")) inter.local_bandwidth = positive_rate(m, "local_bandwidth");
  }
  if (k == InterKind::kTree) {
    m.require("tree", "a nested list of node counts such as [[2, 2], [2]]");
    Context& ctx = m.context();
    int height = parse_tree(ctx, m.get("tree"), m.path_of("tree"), inter.tree);
    int leaves = tree_leaf_nodes(inter.tree);
    if (leaves != nodes)
      m.fail("tree", fmt::format("the tree's leaves hold {} nodes, expected cluster.nodes = {}",
                                 leaves, nodes));
    if (m.has("tree_level_bandwidth")) {
      std::string path = m.path_of("tree_level_bandwidth");
      YAML::Node list = m.get("tree_level_bandwidth");
      if (!list.IsSequence())
        m.fail("tree_level_bandwidth",
               fmt::format("found {}, expected a list of bandwidths, bottom-up", describe(list)));
      ctx.require_list(list, path);
      // One uplink bandwidth per switch level below the root, bottom-up; levels left out
      // get (capacity below) / oversubscription.
      if (static_cast<int>(list.size()) > height - 1)
        m.fail("tree_level_bandwidth",
               fmt::format("found {} bandwidth(s), expected at most {} (one uplink bandwidth per "
                           "switch level below the root, bottom-up)",
                           list.size(), height - 1));
      for (std::size_t i = 0; i < list.size(); ++i) {
        std::string item = fmt::format("{}[{}]", path, i);
        double v = ctx.to_quantity(list[i], item, UnitKind::kBytesPerSecond);
        if (v <= 0) ctx.fail(list[i], item, "found a zero bandwidth, expected a positive one");
        inter.tree_level_bandwidth.push_back(BytesPerSecond(v));
      }
    }
  }
  return inter;
}

CustomTopologySpec parse_custom(const MapReader& cluster, int nodes, int gpus_per_node) {
  const int num_gpus = nodes * gpus_per_node;
  CustomTopologySpec custom;
  MapReader m = cluster.get_map("custom", {"vertices", "links"});
  Context& ctx = m.context();
  static const std::vector<std::string_view> kKinds = {"gpu",         "nic",         "nvswitch",
                                                       "pcie_switch", "host_bridge", "switch"};
  // Name -> union-find index. GPUs are gpu0..gpu{P-1} (node-major ranks) and take indices
  // 0..P-1; listing them is optional, and the ones not listed are added to `vertices` (first, in
  // rank order) so the topology builder sees every GPU.
  std::map<std::string, int> index;
  for (int g = 0; g < num_gpus; ++g) index[fmt::format("gpu{}", g)] = g;
  std::vector<bool> gpu_listed(num_gpus, false);
  std::vector<CustomVertex> listed;
  if (m.has("vertices")) {
    std::string path = m.path_of("vertices");
    YAML::Node list = ctx.require_list(m.get("vertices"), path);
    for (std::size_t i = 0; i < list.size(); ++i) {
      std::string item = fmt::format("{}[{}]", path, i);
      MapReader v(ctx, list[i], item, {"name", "kind", "node"});
      v.require("name", "a vertex name");
      v.require("kind", "gpu, nic, nvswitch, pcie_switch, host_bridge or switch");
      CustomVertex cv;
      cv.where = ctx.at(list[i]);
      cv.name = *v.get_string("name");
      cv.kind = std::string(kKinds[*v.get_choice("kind", kKinds)]);
      if (auto n = v.get_int("node", 0, nodes - 1)) cv.node = to_int32(*n);
      if (cv.name.empty()) v.fail("name", "found an empty name, expected a vertex name");
      auto known = index.find(cv.name);
      const bool names_gpu = known != index.end() && known->second < num_gpus;
      if (cv.kind == "gpu") {
        if (!names_gpu)
          v.fail("name", fmt::format("found '{}' for a vertex of kind gpu, expected gpu0..gpu{} "
                                     "(cluster.nodes x cluster.gpus_per_node GPUs)",
                                     cv.name, num_gpus - 1));
        const int rank = known->second;
        if (gpu_listed[rank]) v.fail("name", fmt::format("duplicate vertex name '{}'", cv.name));
        const int node = rank / gpus_per_node;
        if (cv.node >= 0 && cv.node != node)
          v.fail("node", fmt::format("found {} for {}, expected {} (GPU ranks are numbered node "
                                     "by node)",
                                     cv.node, cv.name, node));
        cv.node = node;
        gpu_listed[rank] = true;
        listed.push_back(std::move(cv));
        continue;
      }
      if (names_gpu)
        v.fail("name", fmt::format("found '{}', which names a GPU, with kind {}; expected kind gpu "
                                   "or another name",
                                   cv.name, cv.kind));
      if (known != index.end()) v.fail("name", fmt::format("duplicate vertex name '{}'", cv.name));
      if (cv.kind == "nic" && cv.node < 0)
        v.require("node", "the node (0-based) this NIC belongs to");
      index[cv.name] = static_cast<int>(index.size());
      listed.push_back(std::move(cv));
    }
  }
  for (int g = 0; g < num_gpus; ++g) {
    if (gpu_listed[g]) continue;
    custom.vertices.push_back(
        CustomVertex{fmt::format("gpu{}", g), "gpu", g / gpus_per_node, m.where()});
  }
  for (auto& cv : listed) custom.vertices.push_back(std::move(cv));
  m.require("links", "a list of {a, b, bandwidth, latency}");
  std::vector<int> parent(index.size());
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&parent](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  std::vector<std::string_view> all_names;
  for (const auto& [name, i] : index) all_names.push_back(name);
  std::string path = m.path_of("links");
  YAML::Node list = ctx.require_list(m.get("links"), path);
  if (list.size() == 0) m.fail("links", "found an empty list, expected at least one link");
  for (std::size_t i = 0; i < list.size(); ++i) {
    std::string item = fmt::format("{}[{}]", path, i);
    MapReader l(ctx, list[i], item, {"a", "b", "bandwidth", "latency"});
    CustomLink cl;
    cl.where = ctx.at(list[i]);
    for (std::string_view end : {"a", "b"}) {
      l.require(end, "a vertex name (gpuN or a name from custom.vertices)");
      std::string name = *l.get_string(end);
      if (!index.count(name))
        l.fail(end, fmt::format("found '{}', expected a GPU (gpu0..gpu{}) or a vertex from "
                                "cluster.custom.vertices{}",
                                name, num_gpus - 1, yaml::did_you_mean(name, all_names)));
      (end == "a" ? cl.a : cl.b) = name;
    }
    if (cl.a == cl.b) l.fail("b", fmt::format("found a link from '{}' to itself", cl.a));
    l.require("bandwidth", "a per-direction bandwidth such as 100GB/s");
    cl.bandwidth = positive_rate(l, "bandwidth");
    if (auto v = l.get_quantity("latency", UnitKind::kSeconds)) cl.latency = Seconds(*v);
    parent[find(index[cl.a])] = find(index[cl.b]);
    custom.links.push_back(std::move(cl));
  }
  // Every GPU must reach GPU 0, or collectives over all GPUs are impossible.
  for (int g = 1; g < num_gpus; ++g) {
    if (find(g) != find(0))
      m.fail("links", fmt::format("gpu{} is not connected to gpu0; expected links joining every "
                                  "GPU (gpu0..gpu{})",
                                  g, num_gpus - 1));
  }
  return custom;
}

ClusterSpec parse_cluster(const MapReader& root) {
  ClusterSpec c;
  c.where = root.key_location("cluster");
  MapReader m = root.get_map("cluster", {"gpu", "nodes", "gpus_per_node", "intra_node",
                                         "inter_node", "custom", "calibration"});
  m.require("gpu", "a GPU catalog name (e.g. a100-sxm-80gb) or a map");
  m.require("gpus_per_node", "an integer >= 1");
  c.gpu = parse_gpu(m);
  c.gpus_per_node = to_int32(*m.get_int("gpus_per_node", 1, kMaxGpus));
  c.nodes = to_int32(m.get_int("nodes", 1, kMaxGpus).value_or(1));
  if (static_cast<std::int64_t>(c.nodes) * c.gpus_per_node > kMaxGpus)
    m.fail("nodes", fmt::format("found {}, expected an integer in [1, 2^17/gpus_per_node = {}] "
                                "({} nodes x {} GPUs is more than the 2^17 = 131,072 GPUs moesim "
                                "simulates: its per-GPU tables outgrow memory beyond)",
                                c.nodes, kMaxGpus / c.gpus_per_node, c.nodes, c.gpus_per_node));

  if (m.has("inter_node")) {
    c.inter = parse_inter(m, c.nodes, c.gpus_per_node);
  } else if (c.nodes > 1) {
    m.require("inter_node",
              fmt::format("an inter-node network, since cluster.nodes = {}", c.nodes));
  }
  const bool custom = c.inter.kind == InterKind::kCustom;
  if (m.has("intra_node")) {
    c.intra = parse_intra(m, c.gpus_per_node);
  } else if (c.gpus_per_node > 1 && !custom) {
    m.require("intra_node", fmt::format("an intra-node interconnect, since "
                                        "cluster.gpus_per_node = {}",
                                        c.gpus_per_node));
  }
  if (custom) {
    m.require("custom", "the explicit graph {vertices, links}, since inter_node.kind is custom");
    c.custom = parse_custom(m, c.nodes, c.gpus_per_node);
  } else if (m.has("custom")) {
    m.fail("custom", fmt::format("found a custom graph, but inter_node.kind is {}; expected "
                                 "inter_node.kind: custom",
                                 inter_kind_name(c.inter.kind)));
  }
  if (m.has("calibration"))
    c.calibration_path = resolve_existing(m, "calibration", "a calibration YAML file");
  return c;
}

// Copies the cluster's key locations into the ClusterSpec (topology errors point at them).
void attach_cluster_locations(ClusterSpec& c, const Context& ctx) {
  for (const auto& [path, loc] : ctx.locations())
    if (path == "cluster" || path.rfind("cluster.", 0) == 0) c.locations[path] = loc;
}

// ---------------------------------------------------------------------------------------------
// model, parallelism

// model.attention (AttentionSpec). Absent: MHA of 128-wide heads when 128 divides M, else one
// head of width M (the projections' FLOPs and weights are 4 M^2 either way).
AttentionSpec parse_attention(const MapReader& model, int M) {
  AttentionSpec a;
  if (!model.has("attention")) {
    a.head_dim = M % 128 == 0 ? 128 : M;
    a.heads = a.kv_heads = M / a.head_dim;
    return a;
  }
  MapReader m = model.get_map(
      "attention", {"kind", "heads", "kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank",
                    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "causal"});
  if (auto v = get_enum(m, "kind", attention_kind_names())) a.kind = *v;
  if (auto v = m.get_bool("causal")) a.causal = *v;
  m.require("heads", "the number of query heads (an integer >= 1)");
  a.heads = to_int32(*m.get_int("heads", 1, kMaxHeads));
  const std::vector<std::string_view> mla_keys = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                  "qk_rope_head_dim", "v_head_dim"};
  if (!a.is_mla()) {
    for (std::string_view k : mla_keys)
      if (m.has(k))
        m.fail(k, fmt::format("'{}' is a multi-head latent attention rank, expected kind: mla "
                              "with it (kind is mha)",
                              k));
    a.kv_heads = a.heads;
    if (auto v = m.get_int("kv_heads", 1, kMaxHeads)) a.kv_heads = to_int32(*v);
    if (a.heads % a.kv_heads != 0)
      m.fail("kv_heads", fmt::format("found {}, expected a divisor of heads = {} (each key/value "
                                     "head serves heads / kv_heads query heads)",
                                     a.kv_heads, a.heads));
    if (m.has("head_dim")) {
      a.head_dim = to_int32(*m.get_int("head_dim", 1, kMaxDim));
    } else {
      if (M % a.heads != 0)
        m.fail("heads", fmt::format("found {}, expected a divisor of model_dim = {} (or head_dim "
                                    "written: the head width is model_dim / heads)",
                                    a.heads, M));
      a.head_dim = M / a.heads;
    }
    return a;
  }
  for (std::string_view k : {"kv_heads", "head_dim"})
    if (m.has(k))
      m.fail(k, fmt::format("'{}' applies to kind mha (MLA's heads are described by "
                            "qk_nope_head_dim, qk_rope_head_dim and v_head_dim)",
                            k));
  m.require("kv_lora_rank", "the rank of MLA's compressed key/value latent (DeepSeek-V3: 512)");
  m.require("qk_nope_head_dim", "the per-head query/key width without rotary (DeepSeek-V3: 128)");
  m.require("qk_rope_head_dim", "the per-head rotary query/key width (DeepSeek-V3: 64)");
  m.require("v_head_dim", "the per-head value width (DeepSeek-V3: 128)");
  if (auto v = m.get_int("q_lora_rank", 0, kMaxDim)) a.q_lora_rank = to_int32(*v);
  a.kv_lora_rank = to_int32(*m.get_int("kv_lora_rank", 1, kMaxDim));
  a.qk_nope_head_dim = to_int32(*m.get_int("qk_nope_head_dim", 0, kMaxDim));
  a.qk_rope_head_dim = to_int32(*m.get_int("qk_rope_head_dim", 0, kMaxDim));
  a.v_head_dim = to_int32(*m.get_int("v_head_dim", 1, kMaxDim));
  if (a.qk_head_dim() < 1)
    m.fail("qk_nope_head_dim", "qk_nope_head_dim + qk_rope_head_dim is 0, expected at least 1");
  a.kv_heads = a.heads;
  return a;
}

// model.precision (PrecisionSpec): every field defaults to model.dtype.
PrecisionSpec parse_precision(const MapReader& model, Dtype dtype) {
  PrecisionSpec p{dtype, dtype, dtype, dtype, Dtype::kFp32};
  if (!model.has("precision")) return p;
  MapReader m =
      model.get_map("precision", {"gemm", "dispatch", "combine", "main_grads", "moments"});
  if (auto v = get_enum(m, "gemm", dtype_table())) p.gemm = *v;
  if (auto v = get_enum(m, "dispatch", dtype_table())) p.dispatch = *v;
  if (auto v = get_enum(m, "combine", dtype_table())) p.combine = *v;
  if (auto v = get_enum(m, "main_grads", dtype_table())) p.main_grads = *v;
  if (p.main_grads == Dtype::kFp8)
    m.fail("main_grads",
           "found fp8, expected fp32, bf16 or fp16 (gradients are accumulated and "
           "reduced in a 16- or 32-bit type)");
  if (auto v = get_enum(m, "moments", dtype_table())) p.moments = *v;
  if (p.moments == Dtype::kFp8)
    m.fail("moments",
           "found fp8, expected fp32, bf16 or fp16 (Adam's moments in a 16- or 32-bit type; "
           "fp32 by default, bf16 as DeepSeek-V3 keeps them)");
  return p;
}

// model.recompute (RecomputeSpec): {granularity, modules}. Modules the model lacks are refused:
// recomputing what does not run would change nothing and hide a typo.
RecomputeSpec parse_recompute(const MapReader& model, const ModelSpec& spec) {
  RecomputeSpec r;
  if (!model.has("recompute")) return r;
  MapReader m = model.get_map("recompute", {"granularity", "modules"});
  m.require("granularity", "none, selective or full");
  r.granularity = *get_enum(m, "granularity", recompute_granularity_names());
  if (!m.has("modules")) {
    if (r.granularity == RecomputeGranularity::kSelective)
      r.modules = {RecomputeModule::kCoreAttn};  // Megatron's default for selective
    return r;
  }
  if (r.granularity != RecomputeGranularity::kSelective)
    m.fail("modules", fmt::format("found modules with granularity {}, expected granularity: "
                                  "selective (full recomputes the whole block, none nothing)",
                                  name_of(r.granularity)));
  Context& ctx = m.context();
  const std::string path = m.path_of("modules");
  YAML::Node list = m.get("modules");
  const std::vector<std::string_view> names = names_of(recompute_module_names());
  if (!list.IsSequence() || list.size() == 0)
    m.fail("modules", fmt::format("found {}, expected a non-empty list of {}", describe(list),
                                  yaml::join_alternatives(names)));
  ctx.require_list(list, path);
  const bool has_dense = spec.first_dense_layers > 0 || spec.moe_every > 1;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string item = fmt::format("{}[{}]", path, i);
    const std::string word = list[i].IsScalar() ? list[i].Scalar() : std::string();
    std::optional<RecomputeModule> mod;
    for (const auto& row : recompute_module_names())
      if (row.name == word) mod = row.value;
    if (!mod)
      ctx.fail(list[i], item,
               fmt::format("found {}, expected one of {}{}", describe(list[i]),
                           yaml::join_alternatives(names), yaml::did_you_mean(word, names)));
    std::string lacks;
    if (*mod == RecomputeModule::kMlaUpProj && !spec.attention.is_mla())
      lacks =
          "mla_up_proj recomputes multi-head latent attention's up-projections, but "
          "model.attention.kind is mha";
    if (*mod == RecomputeModule::kSharedExperts && spec.shared_experts == 0)
      lacks = "shared_experts recomputes the shared experts, but model.shared_experts is 0";
    if (*mod == RecomputeModule::kMlp && !has_dense)
      lacks = "mlp recomputes the dense FFNs, but every block of the model has an MoE FFN";
    if (!lacks.empty())
      ctx.fail(list[i], item, fmt::format("{}; expected a module the model has", lacks));
    if (std::find(r.modules.begin(), r.modules.end(), *mod) != r.modules.end())
      ctx.fail(list[i], item, fmt::format("found '{}' twice, expected each module once", word));
    r.modules.push_back(*mod);
  }
  return r;
}

ModelSpec parse_model(const MapReader& root) {
  ModelSpec model;
  MapReader m = root.get_map("model", kModelKeys);
  // A serving scenario's batches come from its requests (docs/serving.md): the model runs
  // inference, and batch_per_gpu / seq_len only shape `simulate`'s plain step when written.
  const bool serving = root.has("serving");
  if (serving) model.mode = Mode::kInference;
  if (auto v = get_enum(m, "mode", mode_names())) model.mode = *v;
  if (serving && model.mode != Mode::kInference)
    m.fail("mode", "found training beside a serving: section, expected inference (or no mode)");
  if (auto v = m.get_int("layers", 1, kMaxLayers)) model.layers = to_int32(*v);
  if (auto v = m.get_int("moe_every", 1, kIntMax)) model.moe_every = to_int32(*v);
  if (auto v = m.get_int("first_dense_layers", 0, kMaxLayers))
    model.first_dense_layers = to_int32(*v);
  if (model.first_dense_layers >= model.layers)
    m.fail("first_dense_layers",
           fmt::format("found {} with model.layers = {}, expected at most {} (the model would have "
                       "no MoE layer)",
                       model.first_dense_layers, model.layers, model.layers - 1));
  if (model.moe_every > model.layers - model.first_dense_layers)
    m.fail("moe_every",
           fmt::format("found {} with model.layers = {} and first_dense_layers = {}, expected at "
                       "most {} (the model would have no MoE layer)",
                       model.moe_every, model.layers, model.first_dense_layers,
                       model.layers - model.first_dense_layers));
  if (!serving) {
    m.require("batch_per_gpu", "B, samples per GPU (an integer >= 1)");
    m.require("seq_len", "L, tokens per sample (an integer >= 1)");
  }
  m.require("model_dim", "M, the model dimension (an integer >= 1)");
  // `expert_hidden_dim` names the expert FFN's width beside `dense_hidden_dim`; `hidden_dim` is
  // its older name, kept so that every existing scenario means what it meant.
  if (m.has("hidden_dim") && m.has("expert_hidden_dim"))
    m.fail("expert_hidden_dim",
           "found both 'hidden_dim' and 'expert_hidden_dim' (the same H, the expert FFN's hidden "
           "dimension), expected only one");
  if (!m.has("expert_hidden_dim"))
    m.require("hidden_dim",
              "H, the expert hidden dimension (an integer >= 1; also written expert_hidden_dim)");
  model.batch_per_gpu = to_int32(m.get_int("batch_per_gpu", 1, kIntMax).value_or(1));
  model.seq_len = to_int32(m.get_int("seq_len", 1, kIntMax).value_or(1));
  // S = B x L tokens per GPU: the workload counts tokens in 32 bits and the plan multiplies S by
  // the dimensions, so the product is bounded, not just each factor.
  if (model.tokens_per_gpu() > kMaxTokensPerGpu)
    m.fail("seq_len", fmt::format("found {}, expected an integer in [1, 2^31/batch_per_gpu = {}] "
                                  "(S = batch_per_gpu x seq_len tokens per GPU is at most 2^31)",
                                  model.seq_len, kMaxTokensPerGpu / model.batch_per_gpu));
  model.model_dim = to_int32(*m.get_int("model_dim", 1, kMaxDim));
  const char* h_key = m.has("expert_hidden_dim") ? "expert_hidden_dim" : "hidden_dim";
  model.hidden_dim = to_int32(*m.get_int(h_key, 1, kMaxDim));
  if (auto v = m.get_int("dense_hidden_dim", 1, kMaxDim)) model.dense_hidden_dim = to_int32(*v);
  if (auto v = m.get_int("vocab_size", 0, kMaxVocab)) model.vocab_size = to_int32(*v);
  if (auto v = m.get_bool("tie_embeddings")) model.tie_embeddings = *v;
  if (auto v = m.get_int("shared_experts", 0, kMaxSharedExperts)) {
    // Their FFN is one GEMM pair of hidden N*H, so the product is bounded like a dimension.
    if (*v * model.hidden_dim > kMaxDim)
      m.fail("shared_experts",
             fmt::format("found {}, expected an integer in [0, 2^20/H = {}] (N shared experts x "
                         "H = {} is one FFN of hidden N*H, at most 2^20)",
                         *v, kMaxDim / model.hidden_dim, model.hidden_dim));
    model.shared_experts = to_int32(*v);
  }
  if (m.has("experts") && m.has("experts_per_gpu"))
    m.fail("experts_per_gpu", "found both 'experts' and 'experts_per_gpu', expected only one");
  if (!m.has("experts") && !m.has("experts_per_gpu"))
    m.require("experts_per_gpu", "experts per GPU (or 'experts: E', the global count)");
  if (auto v = m.get_int("experts", 1, kMaxExperts)) model.experts = to_int32(*v);
  if (auto v = m.get_int("experts_per_gpu", -kMaxExperts, kMaxExperts)) {
    if (*v == 0)
      m.fail("experts_per_gpu",
             "found 0, expected an integer >= 1, or -x to shard one expert "
             "over x GPUs");
    model.experts_per_gpu = to_int32(*v);
  }
  if (auto v = m.get_int("top_k", 1, kMaxExperts)) model.top_k = to_int32(*v);
  if (serving) model.capacity_factor = 0;  // servers drop no token (docs/serving.md)
  if (m.has("capacity_factor"))
    model.capacity_factor =
        number_in(m, "capacity_factor", -kMaxCapacityFactor, kMaxCapacityFactor);
  if (auto v = get_enum(m, "dtype", dtype_table())) model.dtype = *v;
  if (auto v = m.get_int("micro_batches", 1, kMaxMicroBatches)) model.micro_batches = to_int32(*v);
  if (auto v = m.get_int("mtp_layers", 0, kMaxMtpLayers)) {
    // A module ends in the shared LM head: without a vocabulary there is nothing to predict.
    if (*v > 0 && model.vocab_size == 0)
      m.fail("mtp_layers", fmt::format("found {} with model.vocab_size = 0, expected 0 (an MTP "
                                       "module predicts tokens through the LM head: set "
                                       "vocab_size)",
                                       *v));
    model.mtp_layers = to_int32(*v);
  }
  if (auto v = get_enum(m, "activation", ffn_activation_names())) model.activation = *v;
  model.attention = parse_attention(m, model.model_dim);
  model.precision = parse_precision(m, model.dtype);
  model.recompute = parse_recompute(m, model);
  return model;
}

// Reads `ep`/`dp`: an integer >= 1 or `auto` (0 here).
int int_or_auto(const MapReader& m, std::string_view key, int fallback) {
  if (!m.has(key)) return fallback;
  YAML::Node n = m.get(key);
  if (n.IsScalar() && n.Scalar() == "auto") return 0;
  if (n.IsScalar()) {
    std::int64_t v = 0;
    const std::string& s = n.Scalar();
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && ptr == s.data() + s.size() && v >= 1 && v <= kIntMax)
      return to_int32(v);
  }
  m.fail(key, fmt::format("found {}, expected an integer >= 1 or 'auto'", describe(n)));
}

// parallelism.schedule and parallelism.vp (docs/model.md, "Pipeline schedules"): the rules each
// schedule's order needs, each refused at the key that can fix it.
void parse_pipeline_schedule(const MapReader& root, const MapReader& m, const ModelSpec& model,
                             ParallelismSpec& par) {
  if (auto v = m.get_int("vp", 1, kMaxLayers)) par.vp = to_int32(*v);
  const auto schedule = get_enum(m, "schedule", pipeline_schedule_names());
  par.schedule =
      schedule.value_or(par.vp > 1 ? PipelineSchedule::kInterleaved : PipelineSchedule::kOneFOneB);
  if (par.schedule == PipelineSchedule::kOneFOneB && par.pp == 1 && par.vp == 1) return;
  const std::string_view key = schedule ? "schedule" : "vp";
  const std::string name(name_of(par.schedule));
  if (par.vp > 1 && par.schedule != PipelineSchedule::kInterleaved)
    m.fail("vp", fmt::format("found vp = {} with schedule {}, expected vp = 1 (model chunks per "
                             "stage are the interleaved schedule's)",
                             par.vp, name));
  if (par.schedule == PipelineSchedule::kOneFOneB) return;
  if (model.mode != Mode::kTraining)
    m.fail(key, fmt::format("found schedule {} with model.mode {}, expected model.mode training "
                            "(inference runs the forwards in order: schedule 1f1b)",
                            name, name_of(model.mode)));
  MapReader mm = root.get_map("model", kModelKeys);
  const int micro = model.micro_batches;
  if (par.schedule == PipelineSchedule::kInterleaved) {
    if (par.vp < 2)
      m.fail(key,
             "found schedule interleaved with vp = 1, expected parallelism.vp >= 2 (model "
             "chunks per stage; vp = 1 is 1f1b)");
    if (par.pp < 2)
      m.fail("vp", fmt::format("found vp = {} with pp = 1, expected pp >= 2 (interleaving "
                               "splits pipeline stages)",
                               par.vp));
    // Each rank-stage's blocks split into vp equal chunks (Megatron: layers % (pp * vp) == 0);
    // a pipeline_layout places the blocks itself.
    const bool even = !m.has("pipeline_layout");
    if (even && model.layers % par.pp != 0)
      m.fail("vp", fmt::format("found vp = {}, but model.layers = {} does not split evenly over "
                               "pp = {} stages ({} or {} blocks), so only vp = 1 fits",
                               par.vp, model.layers, par.pp, model.layers / par.pp + 1,
                               model.layers / par.pp));
    const int per_stage = model.layers / par.pp;
    if (even && per_stage % par.vp != 0) {
      std::string fits;
      for (int d = 1; d <= per_stage; ++d)
        if (per_stage % d == 0) fits += fmt::format("{}{}", fits.empty() ? "" : ", ", d);
      m.fail("vp", fmt::format("found vp = {}, expected a divisor of the {} blocks per stage "
                               "(model.layers / pp = {} / {}): {}",
                               par.vp, per_stage, model.layers, par.pp, fits));
    }
    if (micro % par.pp != 0)
      mm.fail("micro_batches",
              fmt::format("found {} with parallelism.pp = {} and the interleaved schedule, "
                          "expected a multiple of pp (Megatron's interleaved order)",
                          micro, par.pp));
    return;
  }
  // DualPipe: two directions of pp / 2 stage pairs, m / 2 micro-batches fed from each end.
  if (par.pp < 2 || par.pp % 2 != 0)
    m.fail(key, fmt::format("found schedule dualpipe with pp = {}, expected an even pp >= 2 "
                            "(each rank holds stage s and stage pp - 1 - s)",
                            par.pp));
  if (micro % 2 != 0 || micro < 2 * par.pp)
    mm.fail("micro_batches",
            fmt::format("found {} with parallelism.schedule dualpipe and pp = {}, expected an "
                        "even number >= 2 * pp = {} (half enter at each end; DualPipe's order "
                        "needs pp micro-batches per direction)",
                        micro, par.pp, 2 * par.pp));
}

// A character of an expanded pipeline layout and where it was written (1-based, in the string).
struct LayoutSymbol {
  char c;
  int pos;
};

// A syntax error of a layout string at character `pos` (1-based).
struct LayoutSyntaxError {
  int pos;
  std::string what;
};

// Expands Megatron's layout string: `X*N` repeats the symbol (or parenthesised group) before it
// N times, groups nest, whitespace is dropped. Bounded: a layout has about 2 symbols per block.
class LayoutExpander {
 public:
  static constexpr std::size_t kMaxSymbols = 4 * kMaxLayers;

  explicit LayoutExpander(const std::string& text) : s_(text) {}

  std::vector<LayoutSymbol> run() { return sequence(false); }

 private:
  [[noreturn]] void fail(std::size_t at, std::string what) const {
    throw LayoutSyntaxError{static_cast<int>(at) + 1, std::move(what)};
  }
  void skip_space() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_])) != 0) ++i_;
  }

  std::vector<LayoutSymbol> sequence(bool in_group) {
    std::vector<LayoutSymbol> out;
    for (skip_space(); i_ < s_.size(); skip_space()) {
      const std::size_t at = i_;
      const char c = s_[i_];
      std::vector<LayoutSymbol> unit;
      if (c == ')') {
        if (!in_group) fail(at, "')' without a matching '('");
        return out;
      }
      if (c == '(') {
        ++i_;
        unit = sequence(true);
        if (i_ >= s_.size()) fail(at, "'(' without a matching ')'");
        ++i_;  // the ')'
      } else if (c == 'E' || c == 't' || c == 'L' || c == 'm' || c == '|') {
        unit.push_back({c, static_cast<int>(at) + 1});
        ++i_;
      } else if (c == '*') {
        fail(at, "'*' with nothing before it to repeat");
      } else if (std::isdigit(static_cast<unsigned char>(c)) != 0) {
        fail(at, fmt::format("a count '{}' without a '*' before it", c));
      } else {
        fail(at, fmt::format("unknown symbol '{}' (expected E, t, L, |, ( ) or *N)", c));
      }
      skip_space();
      std::int64_t count = 1;
      if (i_ < s_.size() && s_[i_] == '*') {
        const std::size_t star = i_++;
        skip_space();
        std::size_t end = i_;
        while (end < s_.size() && std::isdigit(static_cast<unsigned char>(s_[end])) != 0) ++end;
        if (end == i_) fail(star, "'*' without a count after it");
        count = 0;
        for (std::size_t j = i_; j < end; ++j)  // capped: anything above the bound fails below
          count = std::min<std::int64_t>(count * 10 + (s_[j] - '0'), kMaxSymbols + 1);
        if (count < 1) fail(i_, "a count of 0 (counts are >= 1)");
        i_ = end;
      }
      if (static_cast<double>(unit.size()) * count + out.size() > kMaxSymbols)
        fail(at, fmt::format("this repeat expands the layout past {} symbols", kMaxSymbols));
      for (std::int64_t r = 0; r < count; ++r) out.insert(out.end(), unit.begin(), unit.end());
    }
    return out;  // in a group: the caller reports the missing ')'
  }

  const std::string& s_;
  std::size_t i_ = 0;
};

// parallelism.pipeline_layout (Megatron-LM's --pipeline-model-parallel-layout; docs/model.md,
// "Pipeline schedules"): blocks per model piece, as Megatron's string or a list of integers.
// After parse_pipeline_schedule: the piece count depends on the schedule.
void parse_pipeline_layout(const MapReader& m, const ModelSpec& model, ParallelismSpec& par) {
  if (!m.has("pipeline_layout")) return;
  const YAML::Node node = m.get("pipeline_layout");
  const bool interleaved = par.schedule == PipelineSchedule::kInterleaved;
  const int want = interleaved ? par.pp * par.vp : par.pp;
  const std::string why =
      interleaved
          ? fmt::format("the interleaved schedule runs pp * vp = {} * {} pieces, vp on each stage",
                        par.pp, par.vp)
      : par.schedule == PipelineSchedule::kDualPipe
          ? fmt::format("dualpipe runs pp = {} pieces: stage s holds piece s and pp - 1 - s",
                        par.pp)
          : fmt::format("schedule 1f1b runs one piece on each of the pp = {} stages", par.pp);
  std::vector<int> layout;
  if (node.IsSequence()) {
    Context& ctx = m.context();
    const std::string path = m.path_of("pipeline_layout");
    if (node.size() == 0)
      m.fail("pipeline_layout",
             fmt::format("found an empty list, expected {} integers ({})", want, why));
    ctx.require_list(node, path);
    for (std::size_t i = 0; i < node.size(); ++i)
      layout.push_back(
          to_int32(ctx.to_int(node[i], fmt::format("{}[{}]", path, i), 0, kMaxLayers)));
  } else if (node.IsScalar()) {
    const std::string text = node.Scalar();
    std::vector<LayoutSymbol> symbols;
    try {
      symbols = LayoutExpander(text).run();
    } catch (const LayoutSyntaxError& e) {
      m.fail("pipeline_layout",
             fmt::format("found '{}', at character {}: {}; expected Megatron's layout syntax "
                         "(E, t, L, pieces split by |, X*N and ( ... )*N repeats)",
                         text, e.pos, e.what));
    }
    // Split on '|'; E may open the first piece and L close the last (moesim places the
    // embedding and the LM head there whatever the string says).
    std::vector<std::vector<LayoutSymbol>> pieces(1);
    for (const LayoutSymbol& x : symbols) {
      if (x.c == '|')
        pieces.emplace_back();
      else
        pieces.back().push_back(x);
    }
    int mtp = 0;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
      const auto& piece = pieces[k];
      int blocks = 0;
      for (std::size_t j = 0; j < piece.size(); ++j) {
        const LayoutSymbol& x = piece[j];
        // The MTP modules run with the LM head (Megatron writes them as m before the L).
        const bool before_head =
            j + 1 < piece.size() && (piece[j + 1].c == 'm' || piece[j + 1].c == 'L');
        if (x.c == 'm' && (k + 1 != pieces.size() || !before_head))
          m.fail("pipeline_layout",
                 fmt::format("found '{}', m at character {} (piece {}), expected m only at the "
                             "end of the last piece, before its L (the MTP modules run with the "
                             "LM head)",
                             text, x.pos, k));
        mtp += x.c == 'm' ? 1 : 0;
        if (x.c == 'E' && (k != 0 || j != 0))
          m.fail("pipeline_layout",
                 fmt::format("found '{}', E at character {} (piece {}), expected E only at the "
                             "start of the first piece (the embedding is the first piece's)",
                             text, x.pos, k));
        if (x.c == 'L' && (k + 1 != pieces.size() || j + 1 != piece.size()))
          m.fail("pipeline_layout",
                 fmt::format("found '{}', L at character {} (piece {}), expected L only at the "
                             "end of the last piece (the LM head and loss are the last piece's)",
                             text, x.pos, k));
        blocks += x.c == 't' ? 1 : 0;
      }
      layout.push_back(blocks);
    }
    if (mtp > 0 && mtp != model.mtp_layers)
      m.fail("pipeline_layout",
             fmt::format("found '{}' with {} m, expected model.mtp_layers = {} of them (or none: "
                         "the MTP modules run with the LM head either way)",
                         text, mtp, model.mtp_layers));
  } else {
    m.fail("pipeline_layout",
           fmt::format("found {}, expected Megatron's layout string (e.g. 'Et*4|(t*4|)*14tL') or "
                       "a list of blocks per piece (e.g. [4, 4, 4, 1])",
                       describe(node)));
  }
  const int pieces = static_cast<int>(layout.size());
  if (pieces != want)
    m.fail("pipeline_layout", fmt::format("found {} pieces, expected {} ({})", pieces, want, why));
  std::int64_t blocks = 0;
  for (int n : layout) blocks += n;
  if (blocks != model.layers)
    m.fail("pipeline_layout",
           fmt::format("found {} blocks (t) in the pieces, expected model.layers = {}", blocks,
                       model.layers));
  // A piece without blocks has no op to run and pass its input on; the first and the last piece
  // still run the embedding and the LM head when the model has a vocabulary.
  for (int k = 0; k < pieces; ++k) {
    const bool ends = (k == 0 || k == pieces - 1) && model.vocab_size > 0;
    if (layout[static_cast<std::size_t>(k)] == 0 && !ends)
      m.fail("pipeline_layout",
             fmt::format("found piece {} of {} without blocks, expected each piece to hold at "
                         "least one t (only the first piece may hold the embedding alone and the "
                         "last the LM head alone, with model.vocab_size > 0)",
                         k, pieces));
  }
  par.pipeline_layout = std::move(layout);
}

// parallelism.layout: folded (Megatron-Core's MoE parallel folding; docs/model.md "Rank layout"):
// the attention side tp * cp * dp and the expert side etp * ep * edp each cover the stage's p
// GPUs. ParallelismSpec keeps the expert side in ep / esp / dp (so every MoE grouping is the
// overlapped one) and the attention side in mp / cp / adp.
ParallelismSpec parse_folded(const MapReader& m, const ClusterSpec& cluster, const ModelSpec& model,
                             ParallelismSpec par, int p) {
  // DeepSpeed-MoE's ESP (tokens gathered before the gate) is not Megatron's ETP: refuse esp > 1
  // rather than reinterpret it (esp: 1 is harmless, as a file switched by --set may carry it).
  if (auto v = m.get_int("esp", 1, kIntMax); v && *v > 1)
    m.fail("esp", fmt::format("found {} with layout folded, expected etp (the expert "
                              "tensor-parallel degree) instead",
                              *v));
  if (m.has("mp") && m.has("tp"))
    m.fail("mp", "found both mp and tp, expected one of them (tp is mp's name in layout folded)");
  const std::string_view tp_key = m.has("mp") ? "mp" : "tp";
  if (auto v = m.get_int(tp_key, 1, kIntMax)) par.mp = to_int32(*v);
  if (auto v = m.get_int("cp", 1, kIntMax)) par.cp = to_int32(*v);
  if (auto v = m.get_int("etp", 1, kIntMax)) par.esp = to_int32(*v);
  par.sp = par.mp > 1;
  // Megatron refuses an MoE model with tensor but no sequence parallelism: its token dispatcher
  // starts from each TP rank's S / tp tokens.
  if (auto v = m.get_bool("sp"); v && !*v && par.mp > 1)
    m.fail("sp", fmt::format("found false with {} = {}, expected true (layout folded: the MoE "
                             "token dispatcher starts from each TP rank's share of the sequence)",
                             tp_key, par.mp));
  if (par.cp > 1 && model.seq_len % par.cp != 0)
    m.fail("cp", fmt::format("found {}, expected a divisor of model.seq_len = {} (context "
                             "parallelism splits every sequence into cp chunks)",
                             par.cp, model.seq_len));
  if (par.esp > 1 && model.hidden_dim % par.esp != 0)
    m.fail("etp", fmt::format("found {}, expected a divisor of model.hidden_dim = {} (expert "
                              "tensor parallelism splits each expert's FFN width)",
                              par.esp, model.hidden_dim));
  if (model.experts_per_gpu < 0)
    m.fail("layout", fmt::format("found folded with model.experts_per_gpu = {} (sharded "
                                 "experts), expected whole experts per GPU: layout folded "
                                 "splits an expert over etp GPUs",
                                 model.experts_per_gpu));
  const std::string per = p_text(cluster, par.pp);
  // Attention / dense side: tp * cp * dp = p.
  const std::int64_t tp_cp = static_cast<std::int64_t>(par.mp) * par.cp;
  const int adp = int_or_auto(m, "dp", 0);
  if (adp == 0) {
    if (tp_cp > p || p % tp_cp != 0)
      m.fail(m.has("cp") ? "cp" : tp_key,
             fmt::format("tp*cp = {}*{} = {} does not divide {}; expected tp*cp*dp = {} "
                         "(layout folded, attention side)",
                         par.mp, par.cp, tp_cp, per, per));
    par.adp = static_cast<int>(p / tp_cp);
  } else if (tp_cp * adp != p) {
    m.fail("dp", fmt::format("tp*cp*dp = {}*{}*{} = {}, expected {} (layout folded, attention "
                             "side)",
                             par.mp, par.cp, adp, tp_cp * adp, per));
  } else {
    par.adp = adp;
  }
  // Expert side: etp * ep * edp = p.
  par.ep = int_or_auto(m, "ep", 0);
  par.dp = int_or_auto(m, "edp", 0);
  par.ep_auto = par.ep == 0;
  par.dp_auto = par.dp == 0;
  if (par.ep_auto && par.dp_auto) par.dp = 1;
  const std::int64_t fixed =
      static_cast<std::int64_t>(par.esp) * std::max(1, par.ep) * std::max(1, par.dp);
  const std::string_view fixed_key = !par.ep_auto   ? "ep"
                                     : !par.dp_auto ? "edp"
                                     : m.has("etp") ? "etp"
                                                    : "layout";
  if (par.ep_auto || par.dp_auto) {
    if (fixed > p || p % fixed != 0)
      m.fail(fixed_key, fmt::format("etp*{} = {} does not divide {}; expected etp*ep*edp = {} "
                                    "(layout folded, expert side)",
                                    par.ep_auto ? "edp" : "ep", fixed, per, per));
    (par.ep_auto ? par.ep : par.dp) = static_cast<int>(p / fixed);
  } else if (fixed != p) {
    m.fail("edp", fmt::format("etp*ep*edp = {}*{}*{} = {}, expected {} (layout folded, expert "
                              "side)",
                              par.esp, par.ep, par.dp, fixed, per));
  }
  if (model.experts > 0 && model.experts % par.ep != 0)
    m.fail(par.ep_auto ? "layout" : "ep",
           fmt::format("ep = {} does not divide model.experts = {}; expected a divisor (layout "
                       "folded places whole experts, etp splits them)",
                       par.ep, model.experts));
  return par;
}

// parallelism.grad_bucket: pytorch | megatron | block, or a positive size such as 25MiB.
void parse_grad_bucket(const MapReader& m, ParallelismSpec& par) {
  const auto text = m.get_string("grad_bucket");
  if (!text) return;
  for (const auto& n : grad_bucket_names()) {
    if (*text == n.name) {
      par.grad_bucket = n.value;
      return;
    }
  }
  const ParsedQuantity q = parse_quantity(*text, UnitKind::kBytes);
  if (!q.value || *q.value <= 0)
    m.fail("grad_bucket", fmt::format("found '{}', expected pytorch, megatron, block or a "
                                      "positive size such as 25MiB",
                                      *text));
  par.grad_bucket = GradBucketKind::kBytes;
  par.grad_bucket_bytes = Bytes(*q.value);
}

ParallelismSpec parse_parallelism(const MapReader& root, const ClusterSpec& cluster,
                                  const ModelSpec& model, const Context& ctx) {
  ParallelismSpec par;
  if (!root.has("parallelism")) {
    par.ep_auto = par.dp_auto = true;
    par.ep = cluster.num_gpus();
    par.dp = 1;
    // A serving scenario's pools set their own layouts; the scenario's plain step (what validate
    // and tune read) gets the widest EP group that both the GPUs and the experts divide.
    if (root.has("serving") && model.experts > 0) {
      par.ep = std::gcd(cluster.num_gpus(), model.experts);
      par.dp = cluster.num_gpus() / par.ep;
    }
    return par;
  }
  MapReader m = root.get_map(
      "parallelism", {"pp", "vp", "schedule", "pipeline_layout", "zero", "grad_bucket", "ep", "esp",
                      "mp", "dp", "layout", "tp", "sp", "cp", "etp", "edp"});
  if (auto v = m.get_int("zero", 0, 1)) par.zero = to_int32(*v);
  parse_grad_bucket(m, par);
  (void)ctx;
  if (auto v = m.get_int("pp", 1, kMaxLayers)) {
    par.pp = to_int32(*v);
    // Every stage must see the same topology, so one stage's decisions (2dh / 3dh, the
    // strategies' cost model) hold for all: a stage is whole nodes or an equal part of one node.
    const std::int64_t gpus = cluster.num_gpus(), gpn = cluster.gpus_per_node;
    const auto fits = [&](std::int64_t pp) {
      if (gpus % pp != 0) return false;
      const std::int64_t stage = gpus / pp;
      return stage % gpn == 0 || gpn % stage == 0;
    };
    if (!fits(par.pp)) {
      std::string good;
      for (std::int64_t pp = 1; pp <= std::min<std::int64_t>(gpus, model.layers); ++pp)
        if (fits(pp)) good += (good.empty() ? "" : ", ") + std::to_string(pp);
      m.fail("pp", fmt::format("found {}, expected pp dividing P = {} GPUs (cluster.nodes {} x "
                               "cluster.gpus_per_node {}) into stages of whole nodes or of a "
                               "divisor of gpus_per_node GPUs; pp values that fit (up to "
                               "model.layers): {}",
                               par.pp, gpus, cluster.nodes, gpn, good));
    }
    if (par.pp > model.layers)
      m.fail("pp", fmt::format("found {}, expected at most model.layers = {} (every stage runs at "
                               "least one block)",
                               par.pp, model.layers));
  }
  const int p = cluster.num_gpus() / par.pp;
  if (auto v = get_enum(m, "layout", mp_layout_names())) par.layout = *v;
  if (par.folded()) {
    par = parse_folded(m, cluster, model, par, p);
    parse_pipeline_schedule(root, m, model, par);
    parse_pipeline_layout(m, model, par);
    return par;
  }
  for (std::string_view key : {"tp", "sp", "cp", "etp", "edp"})
    if (m.has(key))
      m.fail(key, fmt::format("found {} with layout {}, expected layout: folded (the folded "
                              "degrees; mp / esp / dp name the other layouts' degrees)",
                              key, name_of(par.layout)));
  par.ep = int_or_auto(m, "ep", 0);
  par.dp = int_or_auto(m, "dp", 0);
  if (auto v = m.get_int("esp", 1, kIntMax)) par.esp = to_int32(*v);
  if (auto v = m.get_int("mp", 1, kIntMax)) par.mp = to_int32(*v);
  par.ep_auto = par.ep == 0;
  par.dp_auto = par.dp == 0;
  // Overlapped: the MP ranks are the EP x ESP GPUs themselves, so mp is not a factor of P.
  const bool ov = par.overlapped();
  const std::string per = par.pp > 1 ? "P / pp" : "P";
  const std::string rule =
      ov ? "ep*esp*dp = " + per + " (layout overlapped)" : "ep*esp*mp*dp = " + per;
  auto need_divide = [&](std::string_view key, std::int64_t fixed, std::string_view product) {
    if (fixed > p || p % fixed != 0)
      m.fail(key, fmt::format("{} = {} does not divide {}; expected {}", product, fixed,
                              p_text(cluster, par.pp), rule));
    return static_cast<int>(p / fixed);
  };
  const std::int64_t esp_mp = static_cast<std::int64_t>(par.esp) * (ov ? 1 : par.mp);
  const std::string_view esp_mp_text = ov ? "esp" : "esp*mp";
  std::string_view where_fixed = m.has("mp") && !ov ? "mp" : "esp";
  if (par.ep_auto && par.dp_auto) {
    par.dp = 1;
    par.ep = need_divide(where_fixed, esp_mp, esp_mp_text);
  } else if (par.ep_auto) {
    par.ep = need_divide("dp", esp_mp * par.dp, ov ? "esp*dp" : "esp*mp*dp");
  } else if (par.dp_auto) {
    par.dp = need_divide("ep", esp_mp * par.ep, ov ? "ep*esp" : "ep*esp*mp");
  } else {
    const std::int64_t prod = esp_mp * par.ep * par.dp;
    if (prod != p) {
      if (ov)
        m.fail("dp", fmt::format("ep*esp*dp = {}*{}*{} = {}, expected {} (layout overlapped: the "
                                 "mp ranks share those GPUs)",
                                 par.ep, par.esp, par.dp, prod, p_text(cluster, par.pp)));
      m.fail("dp", fmt::format("ep*esp*mp*dp = {}*{}*{}*{} = {}, expected {}", par.ep, par.esp,
                               par.mp, par.dp, prod, p_text(cluster, par.pp)));
    }
  }
  // Overlapped MP groups are blocks of mp consecutive ranks inside one DP index's ep*esp GPUs.
  if (ov && static_cast<std::int64_t>(par.ep) * par.esp % par.mp != 0)
    m.fail("mp", fmt::format("found mp = {}, expected a divisor of ep*esp = {}*{} = {} (layout "
                             "overlapped: the MP groups are blocks of mp consecutive ranks "
                             "among the EP x ESP GPUs of one DP index)",
                             par.mp, par.ep, par.esp, static_cast<std::int64_t>(par.ep) * par.esp));
  parse_pipeline_schedule(root, m, model, par);
  parse_pipeline_layout(m, model, par);
  return par;
}

// Tensor parallelism splits attention by heads (Megatron): mp must divide the query heads and,
// for GQA, the key/value heads (or be a multiple of them, each MP rank then holding a copy).
void check_attention_split(const MapReader& root, const ModelSpec& model,
                           const ParallelismSpec& par) {
  MapReader m = root.get_map("model", kModelKeys);
  if (!m.has("attention") || par.mp == 1) return;
  MapReader a = m.get_map("attention",
                          {"kind", "heads", "kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank",
                           "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "causal"});
  const AttentionSpec& at = model.attention;
  if (at.heads % par.mp != 0)
    a.fail("heads", fmt::format("found {} with parallelism.mp = {}, expected a multiple of mp "
                                "(tensor parallelism splits attention by heads)",
                                at.heads, par.mp));
  if (!at.is_mla() && at.kv_heads % par.mp != 0 && par.mp % at.kv_heads != 0)
    a.fail(a.has("kv_heads") ? "kv_heads" : "heads",
           fmt::format("found {} key/value heads with parallelism.mp = {}, expected a multiple "
                       "or a divisor of mp",
                       at.kv_heads, par.mp));
}

// Fills experts / experts_per_gpu from whichever was given; checks top_k against E.
void resolve_experts(const MapReader& root, ModelSpec& model, const ParallelismSpec& par) {
  MapReader m = root.get_map("model", kModelKeys);
  const int ep = par.ep;
  if (m.has("experts_per_gpu")) {
    int d = model.experts_per_gpu;
    if (d >= 1) {
      std::int64_t e = static_cast<std::int64_t>(d) * ep;
      if (e > kMaxExperts)
        m.fail("experts_per_gpu",
               fmt::format("found {}, expected an integer in [1, 2^20/ep = {}] ({} x "
                           "parallelism.ep {} is more than the 2^20 experts supported)",
                           d, kMaxExperts / ep, d, ep));
      model.experts = static_cast<int>(e);
    } else {
      int x = -d;
      if (x > ep || ep % x != 0)
        m.fail("experts_per_gpu",
               fmt::format("found {} (one expert sharded over {} GPUs), expected -x with x "
                           "dividing parallelism.ep = {}",
                           d, x, ep));
      model.experts = ep / x;
    }
  } else {
    int e = model.experts;
    if (e % ep == 0) {
      model.experts_per_gpu = e / ep;
    } else if (ep % e == 0) {
      model.experts_per_gpu = -(ep / e);
    } else {
      m.fail("experts", fmt::format("found {}, expected a multiple or a divisor of "
                                    "parallelism.ep = {} (experts spread evenly over the EP group)",
                                    e, ep));
    }
  }
  if (model.top_k > model.experts)
    m.fail("top_k", fmt::format("found {}, expected at most the {} experts (E)", model.top_k,
                                model.experts));
}

// ---------------------------------------------------------------------------------------------
// workload, engine

WorkloadSpec parse_workload(const MapReader& root) {
  WorkloadSpec w;
  if (!root.has("workload")) return w;
  MapReader m = root.get_map("workload", {"routing", "capacity", "iterations"});
  if (auto v = m.get_int("iterations", 1, kMaxIterations)) w.iterations = to_int32(*v);
  if (m.has("routing")) {
    MapReader r = m.get_map("routing", {"distribution", "skew", "seed", "trace", "alpha",
                                        "stickiness", "memory", "batch_variation", "node_limit"});
    auto& rt = w.routing;
    if (auto v = get_enum(r, "distribution", routing_distribution_names())) rt.distribution = *v;
    if (r.has("skew")) rt.skew = number_in(r, "skew", 0, 100);
    // Balanced routing gives every expert the same load by construction: a skew would be ignored.
    if (r.has("skew") && rt.distribution == RoutingDistribution::kBalanced)
      r.fail("skew",
             "'skew' does not apply to distribution balanced (every expert gets the same "
             "load); expected no skew, or distribution zipf");
    if (auto v = r.get_int("seed", 0, std::numeric_limits<std::int64_t>::max()))
      rt.seed = static_cast<std::uint64_t>(*v);
    const bool is_trace = rt.distribution == RoutingDistribution::kTrace;
    if (is_trace) r.require("trace", "the path of a routing trace file");
    if (r.has("trace")) {
      if (!is_trace)
        r.fail("trace", fmt::format("a trace file is given, but distribution is {}; expected "
                                    "distribution: trace",
                                    name_of(rt.distribution)));
      rt.trace_path = resolve_existing(r, "trace", "a routing trace file");
    }
    if (auto v = r.get_number("alpha")) {
      if (rt.distribution != RoutingDistribution::kDirichlet)
        r.fail("alpha", fmt::format("'alpha' applies only to distribution dirichlet, but "
                                    "distribution is {}",
                                    name_of(rt.distribution)));
      rt.dirichlet_alpha = number_in(r, "alpha", 0, 1e6, true);
    }
    // The correlated generator's keys (strategies/inference/correlated_routing.hpp).
    for (std::string_view key : {"stickiness", "memory", "batch_variation"})
      if (r.has(key) && rt.distribution != RoutingDistribution::kCorrelated)
        r.fail(key, fmt::format("'{}' applies only to distribution correlated, but distribution "
                                "is {}",
                                key, name_of(rt.distribution)));
    if (auto v = r.get_number("stickiness")) {
      if (!(*v >= 0 && *v <= 1))
        r.fail("stickiness", fmt::format("found {}, expected a probability in [0, 1]", *v));
      rt.stickiness = *v;
    }
    if (auto v = r.get_int("memory", 1, 16)) rt.memory = to_int32(*v);
    if (auto v = r.get_number("batch_variation")) {
      if (!(*v >= 0 && *v < 1))
        r.fail("batch_variation", fmt::format("found {}, expected a number in [0, 1)", *v));
      rt.batch_variation = *v;
    }
    if (auto v = r.get_int("node_limit", 1, 64)) {
      // The limit shapes how choices are drawn (or, on real GPUs, how the gate picks them): a
      // trace already fixes the choices, and the correlated generator draws its own paths.
      if (is_trace || rt.distribution == RoutingDistribution::kCorrelated)
        r.fail("node_limit", fmt::format("'node_limit' applies to sampled routing (uniform, zipf, "
                                         "dirichlet, balanced), but distribution is {}",
                                         name_of(rt.distribution)));
      rt.node_limit = to_int32(*v);
    }
  }
  if (m.has("capacity")) {
    MapReader c = m.get_map("capacity", {"kind", "factors", "min", "max", "step"});
    auto& cap = w.capacity;
    c.require("kind", "fixed, trace or random_walk");
    cap.kind = *get_enum(c, "kind", capacity_kind_names());
    const std::vector<std::pair<std::string_view, CapacityKind>> applies = {
        {"factors", CapacityKind::kTrace},
        {"min", CapacityKind::kRandomWalk},
        {"max", CapacityKind::kRandomWalk},
        {"step", CapacityKind::kRandomWalk}};
    for (const auto& [key, kind] : applies)
      if (c.has(key) && cap.kind != kind)
        c.fail(key, fmt::format("'{}' applies only to kind {}, but kind is {}", key, name_of(kind),
                                name_of(cap.kind)));
    if (cap.kind == CapacityKind::kTrace) {
      c.require("factors", "a list of capacity factors, one per iteration (cycled)");
      Context& ctx = c.context();
      std::string path = c.path_of("factors");
      YAML::Node list = c.get("factors");
      if (!list.IsSequence() || list.size() == 0)
        c.fail("factors",
               fmt::format("found {}, expected a non-empty list of numbers", describe(list)));
      ctx.require_list(list, path);
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string item = fmt::format("{}[{}]", path, i);
        const double f = ctx.to_number(list[i], item);
        if (!(std::abs(f) <= kMaxCapacityFactor))
          ctx.fail(list[i], item,
                   fmt::format("found {}, expected a number in [{}, {}]", f, -kMaxCapacityFactor,
                               kMaxCapacityFactor));
        cap.factors.push_back(f);
      }
    }
    if (cap.kind == CapacityKind::kRandomWalk) {
      c.require("min", "the smallest capacity factor of the walk (> 0)");
      c.require("max", "the largest capacity factor of the walk");
      cap.min = number_in(c, "min", 0, kMaxCapacityFactor, true);
      cap.max = number_in(c, "max", 0, kMaxCapacityFactor, true);
      if (cap.max < cap.min)
        c.fail("max", fmt::format("found {}, expected a number in [min = {}, {}]", cap.max, cap.min,
                                  kMaxCapacityFactor));
      if (c.has("step")) cap.step = number_in(c, "step", 0, kMaxCapacityFactor, true);
    }
  }
  return w;
}

EngineSpec parse_engine(const MapReader& root) {
  EngineSpec e;
  if (!root.has("engine")) return e;
  MapReader m = root.get_map(
      "engine", {"network", "message_latency", "message_overhead", "peer_cache",
                 "peer_miss_overhead", "launch_overhead", "interference", "flow", "simgrid"});
  if (auto v = get_enum(m, "network", network_model_names())) e.network = *v;
  if (auto v = m.get_quantity("message_latency", UnitKind::kSeconds))
    e.message_latency = Seconds(*v);
  if (auto v = m.get_quantity("message_overhead", UnitKind::kSeconds))
    e.message_overhead = Seconds(*v);
  // An endpoint never holds more than a million peers' state; the bound keeps the count an int.
  if (auto v = m.get_int("peer_cache", 0, 1'000'000)) e.peer_cache = to_int32(*v);
  if (auto v = m.get_quantity("peer_miss_overhead", UnitKind::kSeconds))
    e.peer_miss_overhead = Seconds(*v);
  if (auto v = m.get_quantity("launch_overhead", UnitKind::kSeconds))
    e.launch_overhead = Seconds(*v);
  if (auto v = m.get_number("interference")) {
    if (*v < 0 || *v > 100)
      m.fail("interference", fmt::format("found {}, expected a number in [0, 100]", *v));
    e.interference = *v;
  }
  if (m.has("flow")) {
    MapReader f = m.get_map("flow", {"event_tolerance", "sharing"});
    if (auto v = f.get_number("event_tolerance")) {
      if (!(*v > 0 && *v < 0.1))
        f.fail("event_tolerance",
               fmt::format("found {}, expected a relative time in (0, 0.1) such as 1e-3", *v));
      e.flow_event_tolerance = *v;
    }
    if (auto v = get_enum(f, "sharing", flow_sharing_names())) e.flow_sharing = *v;
  }
  if (m.has("simgrid")) {
    MapReader g = m.get_map("simgrid", {"mode"});
    if (auto v = get_enum(g, "mode", simgrid_mode_names())) e.simgrid_mode = *v;
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// strategies

// `parallel` / `pipeline`: an integer r >= 1 or one of the named values. Returns the row index
// into `table`, or nullopt with `degree` set for an integer.
template <typename E>
std::optional<E> role_or_degree(const MapReader& m, std::string_view key,
                                const std::vector<NamedValue<E>>& table, int& degree) {
  YAML::Node n = m.get(key);
  std::vector<std::string_view> names = names_of(table);
  std::string expected = "an integer >= 1 or " + yaml::join_alternatives(names);
  if (!n.IsScalar()) m.fail(key, fmt::format("found {}, expected {}", describe(n), expected));
  const std::string& s = n.Scalar();
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (!s.empty() && ptr == s.data() + s.size()) {
    if (ec != std::errc() || v < 1 || v > 1024)
      m.fail(key, fmt::format("found {}, expected an integer in [1, 1024] or {}", describe(n),
                              yaml::join_alternatives(names)));
    degree = to_int32(v);
    return std::nullopt;
  }
  for (const auto& row : table)
    if (row.name == s) return row.value;
  m.fail(key, fmt::format("found {}, expected {}{}", describe(n), expected,
                          yaml::did_you_mean(s, names)));
}

// A role parameter map is only meaningful with its role value: reject it otherwise.
void check_params_apply(const MapReader& m, std::string_view params, bool applies,
                        std::string_view role, std::string_view value) {
  if (m.has(params) && !applies)
    m.fail(params, fmt::format("'{}' parameters are given, but {} is not {}; expected {}: {}",
                               params, role, value, role, value));
}

double fraction(const MapReader& m, std::string_view key, double fallback) {
  auto v = m.get_number(key);
  if (!v) return fallback;
  if (*v < 0 || *v > 1) m.fail(key, fmt::format("found {}, expected a number in [0, 1]", *v));
  return *v;
}

StrategySpec parse_strategy(Context& ctx, const YAML::Node& node, const std::string& path,
                            const ModelSpec& model) {
  MapReader m(ctx, node, path,
              {"name", "routing", "parallel", "pipeline", "a2a", "layout", "schedule", "inference",
               "ta_moe", "faster_moe_hir", "tutel_online", "lina", "lina_inference"});
  StrategySpec s;
  s.where = ctx.at(node);
  m.require("name", "a unique strategy name");
  s.name = *m.get_string("name");
  if (s.name.empty()) m.fail("name", "found an empty name, expected a unique strategy name");
  if (auto v = get_enum(m, "routing", routing_role_names())) s.routing = *v;
  if (m.has("parallel")) {
    int r = 1;
    if (auto v = role_or_degree(m, "parallel", parallel_role_names(), r)) {
      s.parallel = *v;
      s.parallel_degree = s.parallel == ParallelRole::kP2 ? model.expert_shards() : 1;
    } else {
      const int n = model.expert_shards();
      if (n % r != 0)
        m.fail("parallel", fmt::format("found {}, expected a divisor of the expert shard count "
                                       "n = {} (model.experts_per_gpu = {})",
                                       r, n, model.experts_per_gpu));
      s.parallel = ParallelRole::kDegree;
      s.parallel_degree = r;
    }
  }
  if (m.has("pipeline")) {
    int r = 1;
    if (auto v = role_or_degree(m, "pipeline", pipeline_role_names(), r)) {
      s.pipeline = *v;
    } else {
      s.pipeline = PipelineRole::kDegree;
      s.pipeline_degree = r;
    }
  }
  if (auto v = get_enum(m, "a2a", a2a_role_names())) s.a2a = *v;
  if (auto v = get_enum(m, "layout", layout_role_names())) s.layout = *v;
  if (auto v = get_enum(m, "schedule", schedule_role_names())) s.schedule = *v;
  if (auto v = get_enum(m, "inference", inference_role_names())) s.inference = *v;
  if (s.inference != InferenceRole::kBaseline && model.mode != Mode::kInference)
    m.fail("inference", fmt::format("found '{}' with model.mode = {}, expected model.mode: "
                                    "inference",
                                    name_of(s.inference), name_of(model.mode)));

  if (model.shared_experts > 0 &&
      (s.schedule == ScheduleRole::kParmS1 || s.schedule == ScheduleRole::kParmS2 ||
       s.schedule == ScheduleRole::kParmAuto))
    m.fail("schedule",
           fmt::format("found '{}' with model.shared_experts = {}, expected another schedule: "
                       "Parm's fused MoE layer has no shared experts",
                       name_of(s.schedule), model.shared_experts));
  check_params_apply(m, "ta_moe", s.routing == RoutingRole::kTaMoe, "routing", "ta_moe");
  check_params_apply(m, "faster_moe_hir", s.routing == RoutingRole::kFasterMoeHir, "routing",
                     "faster_moe_hir");
  check_params_apply(m, "tutel_online", s.pipeline == PipelineRole::kTutelOnline, "pipeline",
                     "tutel_online");
  // fair and between_a2a (Lina's baselines) partition the all-reduce the same way as lina.
  check_params_apply(m, "lina",
                     s.schedule == ScheduleRole::kLina || s.schedule == ScheduleRole::kFair ||
                         s.schedule == ScheduleRole::kBetweenA2a,
                     "schedule", "lina");
  check_params_apply(m, "lina_inference", s.inference == InferenceRole::kLina, "inference", "lina");
  if (m.has("ta_moe")) {
    MapReader p = m.get_map("ta_moe", {"lambda", "adherence"});
    s.ta_moe.lambda = fraction(p, "lambda", s.ta_moe.lambda);
    s.ta_moe.adherence = fraction(p, "adherence", s.ta_moe.adherence);
  }
  if (m.has("faster_moe_hir")) {
    MapReader p = m.get_map("faster_moe_hir", {"max_offnode_share"});
    s.faster_moe_hir.max_offnode_share =
        fraction(p, "max_offnode_share", s.faster_moe_hir.max_offnode_share);
  }
  if (m.has("tutel_online")) {
    MapReader p = m.get_map("tutel_online", {"bucket_width"});
    if (p.has("bucket_width"))
      s.tutel_online.bucket_width = number_in(p, "bucket_width", 0, kMaxCapacityFactor, true);
  }
  if (m.has("lina")) {
    MapReader p = m.get_map("lina", {"micro_op", "pack_experts", "max_pack"});
    if (auto v = p.get_quantity("micro_op", UnitKind::kBytes)) {
      if (*v <= 0) p.fail("micro_op", "found a zero size, expected a positive size such as 30MB");
      s.lina.micro_op = Bytes(*v);
    }
    if (auto v = p.get_bool("pack_experts")) s.lina.pack_experts = *v;
    if (auto v = p.get_int("max_pack", 1, 1 << 20)) {
      // Packing doubles the experts per GPU, so only powers of two are reachable.
      if ((*v & (*v - 1)) != 0)
        p.fail("max_pack", fmt::format("found {}, expected a power of two (1, 2, 4, ...): packing "
                                       "doubles the experts per GPU",
                                       *v));
      s.lina.max_pack = to_int32(*v);
    }
  }
  if (m.has("lina_inference")) {
    MapReader p = m.get_map("lina_inference", {"path_length", "profile_batches"});
    if (auto v = p.get_int("path_length", 1, 64)) s.lina_inference.path_length = to_int32(*v);
    if (auto v = p.get_int("profile_batches", 1, 1024))
      s.lina_inference.profile_batches = to_int32(*v);
  }
  return s;
}

std::vector<StrategySpec> parse_strategies(const MapReader& root, const ModelSpec& model) {
  Context& ctx = root.context();
  YAML::Node list = root.get("strategies");
  if (!list.IsSequence())
    root.fail("strategies", fmt::format("found {}, expected a list of strategies such as "
                                        "[{{name: baseline}}]",
                                        describe(list)));
  if (list.size() == 0)
    root.fail("strategies", "found an empty list, expected at least one strategy");
  ctx.require_list(list, "strategies");
  std::vector<StrategySpec> out;
  std::map<std::string, int> first_line;
  for (std::size_t i = 0; i < list.size(); ++i) {
    std::string path = fmt::format("strategies[{}]", i);
    StrategySpec s = parse_strategy(ctx, list[i], path, model);
    if (auto it = first_line.find(s.name); it != first_line.end())
      ctx.fail(ctx.location_of(path + ".name"), path + ".name",
               fmt::format("duplicate strategy name '{}' (first defined at line {}); expected "
                           "unique names",
                           s.name, it->second));
    first_line[s.name] = s.where.line;
    out.push_back(std::move(s));
  }
  return out;
}

// The largest buffer the plan builder derives from the model (strategies/plan_builder.cpp,
// a2a_bytes): one GPU's dispatch all-to-all sends E x dC x M x bytes x esp x r bytes, with
// dC = ceil(k f S / E) slots per expert at the largest capacity factor f the workload reaches
// (dropless: at most S) and r at most the expert shard count. Every key is within its own range
// by now, but their product can still leave int64 (capacity_factor 1024 x 2^31 tokens x 2^20
// dims), so the product is bounded too, at the same 2^50 bytes as a size key.
void check_plan_sizes(const Context& ctx, const Scenario& s) {
  const ModelSpec& m = s.model;
  const CapacityWorkloadSpec& cap = s.workload.capacity;
  std::vector<double> factors = {m.capacity_factor};
  std::string key = "model.capacity_factor";
  if (cap.kind == CapacityKind::kTrace) {
    factors = cap.factors;
    key = "workload.capacity.factors";
  } else if (cap.kind == CapacityKind::kRandomWalk) {
    factors = {cap.max};
    key = "workload.capacity.max";
  }
  const double tokens = static_cast<double>(m.tokens_per_gpu());
  double slots = 0, factor = 0;
  for (double f : factors) {
    const double fixed = std::ceil(m.top_k * std::abs(f) * tokens / m.experts);
    const double c = f > 0 ? fixed : f == 0 ? tokens : std::min(tokens, fixed);
    if (c > slots) {
      slots = c;
      factor = f;
    }
  }
  const double repeats = static_cast<double>(s.parallelism.esp) * m.expert_shards();
  const double bytes = m.experts * slots * m.model_dim * m.bytes_per_element() * repeats;
  if (bytes <= kMaxA2aBytes) return;
  // Blame a fixed capacity factor when it inflates dC past S k / E, else the token count.
  if (!(factor > 1)) key = "model.seq_len";
  ctx.fail(
      ctx.location_of(key), key,
      fmt::format("found {}: one GPU's dispatch all-to-all would send E x dC x M x bytes x "
                  "esp x shards = {} x {} x {} x {} x {} x {} = {:.4g} bytes, expected at "
                  "most 2^50 (1024TiB); lower model.capacity_factor, seq_len, "
                  "batch_per_gpu or model_dim",
                  key == "model.seq_len" ? fmt::format("{}", m.seq_len) : fmt::format("{}", factor),
                  m.experts, slots, m.model_dim, m.bytes_per_element(), s.parallelism.esp,
                  m.expert_shards(), bytes));
}

const std::vector<std::string_view>& top_level_keys() {
  static const std::vector<std::string_view> k = {"name",   "description", "cluster",
                                                  "model",  "parallelism", "workload",
                                                  "engine", "serving",     "strategies"};
  return k;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Alias bombs: a YAML alias (*a) re-uses the node anchored &a, so a 2 KB document of nested
// aliases expands exponentially, and every reader here walks the expanded tree. The bound is
// checked on the parser's events before any node is built, in time linear in the text: each
// anchor's expanded size is known when its node ends, so an alias costs one lookup.

namespace {

class ExpansionCheck final : public YAML::EventHandler {
 public:
  explicit ExpansionCheck(const std::string& file) : file_(file) {}

  void OnDocumentStart(const YAML::Mark& /*mark*/) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor, 1, ""); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    const auto it = size_.find(anchor);
    leaf(mark, 0, it == size_.end() ? 1 : it->second, "*");
  }
  void OnScalar(const YAML::Mark& mark, const std::string& /*tag*/, YAML::anchor_t anchor,
                const std::string& value) override {
    leaf(mark, anchor, 1, value);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& /*tag*/, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value /*style*/) override {
    open(mark, anchor, false);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string& /*tag*/, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value /*style*/) override {
    open(mark, anchor, true);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    YAML::anchor_t anchor = 0;
    std::int64_t size = 1;  // expanded nodes, itself included
    bool map = false;
    std::int64_t items = 0;  // children so far (keys and values for a map)
    std::string key;         // map: the key of the value being read
  };

  // A child of the innermost collection (or the root) that expands to n nodes.
  void child(std::int64_t n, const std::string& scalar) {
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    if (f.map && f.items % 2 == 0) f.key = scalar.empty() ? "?" : scalar;
    ++f.items;
    f.size += n;
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor, std::int64_t n,
            const std::string& scalar) {
    if (anchor != 0) size_[anchor] = n;
    grow(mark, n);
    child(n, scalar);
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor, bool map) {
    grow(mark, 1);
    if (static_cast<int>(stack_.size()) >= kMaxYamlDepth) {
      fail(mark, fmt::format("found collections nested deeper than {} levels, expected at most {}",
                             kMaxYamlDepth, kMaxYamlDepth));
    }
    stack_.push_back({anchor, 1, map, 0, ""});
  }
  void close() {
    const Frame f = stack_.back();
    stack_.pop_back();
    if (f.anchor != 0) size_[f.anchor] = f.size;
    child(f.size, "");
  }
  void grow(const YAML::Mark& mark, std::int64_t n) {
    // yaml-cpp 0.7 can loop on some malformed text, emitting events without consuming input
    // (fuzzing found "\n,ba$*": endless null entries at one position). A document's events
    // advance through the text; thousands at one position are that loop, stopped here at once
    // rather than after a million expanded nodes (0.3 s; 3 s under the sanitizers).
    if (mark.pos == last_pos_) {
      if (++same_pos_ > kMaxEventsAtOnePosition) {
        fail(mark, fmt::format("found malformed YAML the parser cannot get past (more than {} "
                               "parser events without reading a character), expected a YAML "
                               "document: check the quoting and flow collections ({{ }}, [ ], "
                               "commas) here",
                               kMaxEventsAtOnePosition));
      }
    } else {
      last_pos_ = mark.pos;
      same_pos_ = 0;
    }
    total_ += n;
    if (total_ > kMaxYamlNodes) {
      fail(mark, fmt::format("the document expands to more than {} nodes through aliases (*name "
                             "re-using the node anchored &name), expected at most {}: remove the "
                             "nested aliases",
                             kMaxYamlNodes, kMaxYamlNodes));
    }
  }
  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& what) const {
    std::string path;
    for (const Frame& f : stack_) {
      if (f.map) {
        if (!f.key.empty()) path += (path.empty() ? "" : ".") + f.key;
      } else {
        path += fmt::format("[{}]", f.items);
      }
    }
    throw InputError(SourceLocation{file_, mark.line >= 0 ? mark.line + 1 : 0,
                                    mark.column >= 0 ? mark.column + 1 : 0},
                     path, what);
  }

  const std::string& file_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, std::int64_t> size_;
  std::int64_t total_ = 0;
  static constexpr int kMaxEventsAtOnePosition = 10'000;
  int last_pos_ = -1;
  int same_pos_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API

void check_yaml_expansion(std::string_view yaml, const std::string& pseudo_file) {
  std::stringstream in{std::string(yaml)};
  YAML::Parser parser(in);
  ExpansionCheck check(pseudo_file);
  while (parser.HandleNextDocument(check)) {
  }
}

namespace {

// The position of the first byte of `text` that does not start or continue a valid UTF-8 sequence
// (overlong forms, surrogates and code points above U+10FFFF included), or npos.
std::size_t first_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = p[i];
    std::size_t len = 0;
    unsigned cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

SourceLocation location_of_offset(std::string_view text, std::size_t at, const std::string& file) {
  int line = 1, column = 1;
  for (std::size_t i = 0; i < at && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return SourceLocation{file, line, column};
}

}  // namespace

YAML::Node parse_yaml_string(std::string_view yaml, const std::string& pseudo_file) {
  // Text that is not UTF-8 parses, but fails later when a name reaches the JSON writer.
  if (const std::size_t bad = first_invalid_utf8(yaml); bad != std::string_view::npos)
    throw InputError(location_of_offset(yaml, bad, pseudo_file), "",
                     fmt::format("found the byte 0x{:02X}, which is not UTF-8; expected UTF-8 text "
                                 "(re-save the file as UTF-8)",
                                 static_cast<unsigned>(static_cast<unsigned char>(yaml[bad]))));
  try {
    check_yaml_expansion(yaml, pseudo_file);
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(yaml));
    if (docs.size() > 1) {
      const YAML::Mark m = docs[1].Mark();
      throw InputError(SourceLocation{pseudo_file, m.line >= 0 ? m.line + 1 : 0,
                                      m.column >= 0 ? m.column + 1 : 0},
                       "",
                       fmt::format("found {} YAML documents (separated by ---), expected one: "
                                   "the later ones would be ignored",
                                   docs.size()));
    }
    return docs.empty() ? YAML::Node() : docs.front();
  } catch (const YAML::ParserException& e) {
    SourceLocation loc{pseudo_file, e.mark.line >= 0 ? e.mark.line + 1 : 0,
                       e.mark.column >= 0 ? e.mark.column + 1 : 0};
    throw InputError(loc, "", fmt::format("YAML syntax error: {}", e.msg));
  }
}

YAML::Node load_yaml_file(const std::string& path) {
  return parse_yaml_string(read_text_file(path, "a YAML file", kMaxYamlFileBytes), path);
}

namespace {

// model.hf_config (docs/model.md, "Importing a Hugging Face config"): the architecture keys of a
// Hugging Face config.json, under the keys the scenario writes itself. Returns `root` unchanged
// without one; else a copy whose model map holds the imported keys.
YAML::Node with_hf_config(const YAML::Node& root, const std::string& file, ModelImport& out) {
  if (!root.IsMap() || !root["model"] || !root["model"].IsMap() || !root["model"]["hf_config"])
    return root;
  Context scratch(file);  // the model map is read again, with its locations, by parse_model
  const MapReader model(scratch, root["model"], "model", kModelKeys);
  const std::string path = resolve_existing(model, "hf_config", "a Hugging Face config.json");
  HfImport imp;
  try {
    imp = import_hf_config(path);
  } catch (const InputError& e) {
    model.fail("hf_config", e.what());
  }
  YAML::Node merged = YAML::Clone(root);
  YAML::Node keys = merged["model"];
  for (const auto& kv : imp.model) {
    const std::string key = kv.first.as<std::string>();
    if (!keys[key]) keys[key] = kv.second;
  }
  out = ModelImport{path, imp.family, std::move(imp.unknown), std::move(imp.ignored)};
  return merged;
}

}  // namespace

Scenario parse_scenario(const YAML::Node& written, const std::string& file) {
  Context ctx(file);
  ModelImport imported;
  const YAML::Node root = with_hf_config(written, file, imported);
  if (!root.IsDefined() || root.IsNull())
    throw InputError(SourceLocation{file, 1, 1}, "",
                     fmt::format("found an empty document, expected a map with keys {}",
                                 yaml::join_alternatives(top_level_keys())));
  MapReader m(ctx, root, "", top_level_keys(), SourceLocation{file, 1, 1});
  Scenario s;
  s.source_file = file;
  s.name = m.get_string("name").value_or(file_stem(file));
  if (s.name.empty()) m.fail("name", "found an empty name, expected a scenario name");
  s.description = m.get_string("description").value_or("");
  m.require("cluster", "the cluster section (gpu, nodes, gpus_per_node, intra_node, inter_node)");
  m.require("model", "the model section (batch_per_gpu, seq_len, model_dim, hidden_dim, ...)");
  m.require("strategies", "a list of strategies such as [{name: baseline}]");
  s.cluster = parse_cluster(m);
  s.cluster.name = s.name;
  s.model = parse_model(m);
  s.model_import = std::move(imported);
  s.parallelism = parse_parallelism(m, s.cluster, s.model, ctx);
  resolve_experts(m, s.model, s.parallelism);
  check_attention_split(m, s.model, s.parallelism);
  s.workload = parse_workload(m);
  check_plan_sizes(ctx, s);
  s.engine = parse_engine(m);
  s.strategies = parse_strategies(m, s.model);
  if (m.has("serving"))
    s.serving = parse_serving_spec(m, s.cluster, s.model.dtype, s.model.experts);
  attach_cluster_locations(s.cluster, ctx);
  s.locations = std::make_shared<const Scenario::Locations>(ctx.locations());
  return s;
}

Scenario parse_scenario_string(std::string_view yaml, const std::string& pseudo_file) {
  return parse_scenario(parse_yaml_string(yaml, pseudo_file), pseudo_file);
}

Scenario load_scenario(const std::string& path) {
  return parse_scenario(load_yaml_file(path), path);
}

ClusterSpec load_cluster_file(const std::string& path) {
  YAML::Node root = load_yaml_file(path);
  Context ctx(path);
  if (!root.IsDefined() || root.IsNull())
    throw InputError(SourceLocation{path, 1, 1}, "",
                     "found an empty document, expected a map with a 'cluster:' section");
  // A whole scenario is accepted too (its cluster is taken), so `compare --topology` can point
  // at another scenario file; it is then validated in full.
  if (root.IsMap()) {
    for (std::string_view key : {"model", "parallelism", "workload", "engine", "strategies"})
      if (root[std::string(key)]) return parse_scenario(root, path).cluster;
  }
  MapReader m(ctx, root, "", {"name", "description", "cluster"}, SourceLocation{path, 1, 1});
  m.require("cluster", "the cluster section (gpu, nodes, gpus_per_node, intra_node, inter_node)");
  ClusterSpec c = parse_cluster(m);
  c.name = m.get_string("name").value_or(file_stem(path));
  if (c.name.empty()) m.fail("name", "found an empty name, expected a topology name");
  attach_cluster_locations(c, ctx);
  return c;
}

}  // namespace moesim
