// `cluster.custom`: a topology given as explicit vertices and links. Nothing is known about its
// shape, so routing uses a generic table: for each destination GPU, the hop distance of every
// vertex to it (GPUs other than the endpoints are never transit). Custom topologies are written by
// hand and small, so P x V distances are affordable; route() still walks in O(path x degree).
#include <deque>
#include <limits>
#include <unordered_map>

#include "core/error.hpp"
#include "topology/detail.hpp"

namespace moesim::topology::detail {

namespace {

constexpr std::uint16_t kUnreached = std::numeric_limits<std::uint16_t>::max();

VertexKind parse_kind(const CustomVertex& v, std::size_t index, const SourceLocation& where) {
  static const std::pair<const char*, VertexKind> kinds[] = {
      {"gpu", VertexKind::kGpu},
      {"nic", VertexKind::kNic},
      {"nvswitch", VertexKind::kNvswitch},
      {"pcie_switch", VertexKind::kPcieSwitch},
      {"host_bridge", VertexKind::kHostBridge},
      {"switch", VertexKind::kSwitch}};
  for (const auto& [name, kind] : kinds) {
    if (v.kind == name) return kind;
  }
  throw InputError(
      where, "cluster.custom.vertices[" + std::to_string(index) + "].kind",
      "found '" + v.kind + "', expected gpu, nic, nvswitch, pcie_switch, host_bridge or switch");
}

class CustomTopology final : public Topology {
 public:
  explicit CustomTopology(const ClusterSpec& spec);
  void route(int src, int dst, std::vector<LinkId>& out) const override;

 private:
  std::size_t num_vertices() const { return vertices_.size(); }
  void compute_levels(const Graph& g);
  void compute_distances(const Graph& g);
  void compute_nic_shares(const Graph& g);

  std::vector<std::uint32_t> out_off_;  // CSR of out-links per vertex, from the graph store
  std::vector<LinkId> out_links_;
  std::vector<char> is_gpu_;
  std::vector<std::uint16_t> dist_;  // [dst GPU * V + vertex]: hops from vertex to that GPU
};

CustomTopology::CustomTopology(const ClusterSpec& spec) : Topology(spec) {
  const CustomTopologySpec& custom = *spec_.custom;
  const int p = num_gpus();
  // The loader's locations when it recorded them on the entry, else by key path.
  auto where = [&](const SourceLocation& loc, const std::string& key) {
    return loc.line > 0 ? loc : spec_.location_of(key);
  };
  GraphBuilder b(vertices_, links_);
  std::unordered_map<std::string, VertexId> by_name;
  // GPUs are implicit (gpu0..gpu{P-1}, node-major) and come first, so gpu r is vertex r; listing
  // one is allowed and only checked.
  gpu_vertex_.resize(p);
  for (int r = 0; r < p; ++r) {
    const std::string name = "gpu" + std::to_string(r);
    gpu_vertex_[r] = b.add_vertex(VertexKind::kGpu, r / spec_.gpus_per_node, r, 0, name);
    by_name.emplace(name, gpu_vertex_[r]);
  }
  std::vector<char> listed(p, 0);
  std::vector<int> nics_in_node(spec_.nodes, 0);
  int other = 0;
  for (std::size_t x = 0; x < custom.vertices.size(); ++x) {
    const CustomVertex& cv = custom.vertices[x];
    const std::string key = "cluster.custom.vertices[" + std::to_string(x) + "]";
    const VertexKind kind = parse_kind(cv, x, where(cv.where, key + ".kind"));
    int node = cv.node;
    if (kind == VertexKind::kGpu) {
      int rank = -1;
      if (cv.name.rfind("gpu", 0) == 0 && cv.name.size() > 3 && cv.name.size() < 12 &&
          cv.name.find_first_not_of("0123456789", 3) == std::string::npos) {
        rank = std::stoi(cv.name.substr(3));
      }
      if (rank < 0 || rank >= p) {
        throw InputError(where(cv.where, key + ".name"), key + ".name",
                         "found GPU '" + cv.name + "', expected gpu0..gpu" + std::to_string(p - 1) +
                             " (cluster.nodes x cluster.gpus_per_node GPUs)");
      }
      if (listed[rank]++) {
        throw InputError(where(cv.where, key + ".name"), key + ".name",
                         "found duplicate vertex name '" + cv.name + "'");
      }
      if (node >= 0 && node != rank / spec_.gpus_per_node) {
        throw InputError(where(cv.where, key + ".node"), key + ".node",
                         "found node " + std::to_string(node) + " for " + cv.name + ", expected " +
                             std::to_string(rank / spec_.gpus_per_node) +
                             " (GPU ranks are numbered node by node)");
      }
      continue;
    }
    if (by_name.count(cv.name) != 0) {
      throw InputError(where(cv.where, key + ".name"), key + ".name",
                       "found duplicate vertex name '" + cv.name + "'");
    }
    if (node >= spec_.nodes) {
      throw InputError(
          where(cv.where, key + ".node"), key + ".node",
          "found " + std::to_string(node) + ", expected 0.." + std::to_string(spec_.nodes - 1));
    }
    int index = 0;
    if (kind == VertexKind::kNic) {
      index = node >= 0 ? nics_in_node[node]++ : other++;
    } else {
      index = other++;
      if (kind == VertexKind::kSwitch) node = -1;
    }
    by_name.emplace(cv.name, b.add_vertex(kind, node, index, 0, cv.name));
  }
  for (std::size_t x = 0; x < custom.links.size(); ++x) {
    const CustomLink& cl = custom.links[x];
    const std::string key = "cluster.custom.links[" + std::to_string(x) + "]";
    VertexId ends[2];
    const std::string* names[2] = {&cl.a, &cl.b};
    for (int e = 0; e < 2; ++e) {
      auto it = by_name.find(*names[e]);
      if (it == by_name.end()) {
        throw InputError(where(cl.where, key), key,
                         "found unknown vertex '" + *names[e] +
                             "', expected a name from cluster.custom.vertices");
      }
      ends[e] = it->second;
    }
    if (ends[0] == ends[1]) {
      throw InputError(where(cl.where, key), key, "found a link from '" + cl.a + "' to itself");
    }
    if (cl.bandwidth.value() <= 0) {
      throw InputError(where(cl.where, key + ".bandwidth"), key + ".bandwidth", "must be > 0");
    }
    if (cl.latency.value() < 0)
      throw InputError(where(cl.where, key + ".latency"), key + ".latency", "must be >= 0");
    // A custom link's latency is the link's own (not half of a tier's).
    b.add_cable(ends[0], ends[1], cl.bandwidth, cl.latency, 0);
  }
  const Graph g = make_graph(vertices_.size(), links_);
  compute_levels(g);
  compute_distances(g);
  compute_nic_shares(g);
  out_off_.assign(num_vertices() + 1, 0);
  for (VertexId v = 0; v < num_vertices(); ++v) {
    out_off_[v] = static_cast<std::uint32_t>(out_links_.size());
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e)
      out_links_.push_back(link_id(g, *e));
  }
  out_off_.back() = static_cast<std::uint32_t>(out_links_.size());
}

void CustomTopology::compute_levels(const Graph& g) {
  // Switch level: 1 for switches with a non-switch neighbour (leaves), else one more than the
  // nearest leaf. A link's tier is the highest level among its switch ends (0 with none).
  std::deque<VertexId> queue;
  for (VertexId v = 0; v < num_vertices(); ++v) {
    if (vertices_[v].kind != VertexKind::kSwitch) continue;
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
      if (vertices_[boost::target(*e, g)].kind != VertexKind::kSwitch) {
        vertices_[v].level = 1;
        queue.push_back(v);
        break;
      }
    }
  }
  while (!queue.empty()) {
    const VertexId v = queue.front();
    queue.pop_front();
    for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
      Vertex& w = vertices_[boost::target(*e, g)];
      if (w.kind == VertexKind::kSwitch && w.level == 0) {
        w.level = vertices_[v].level + 1;
        queue.push_back(boost::target(*e, g));
      }
    }
  }
  for (Link& l : links_) {
    l.tier = std::max(vertices_[l.src].kind == VertexKind::kSwitch ? vertices_[l.src].level : 0,
                      vertices_[l.dst].kind == VertexKind::kSwitch ? vertices_[l.dst].level : 0);
  }
}

void CustomTopology::compute_distances(const Graph& g) {
  const int p = num_gpus();
  const std::size_t n = num_vertices();
  is_gpu_.assign(n, 0);
  for (VertexId v : gpu_vertex_) is_gpu_[v] = 1;
  dist_.assign(static_cast<std::size_t>(p) * n, kUnreached);
  for (int t = 0; t < p; ++t) {
    std::uint16_t* dist = &dist_[static_cast<std::size_t>(t) * n];
    const VertexId target = gpu_vertex_[t];
    std::deque<VertexId> queue{target};
    dist[target] = 0;
    while (!queue.empty()) {
      const VertexId v = queue.front();
      queue.pop_front();
      if (v != target && is_gpu_[v]) continue;  // a GPU is an endpoint, not a router
      for (auto [e, end] = boost::in_edges(v, g); e != end; ++e) {
        const VertexId u = boost::source(*e, g);
        if (dist[u] == kUnreached) {
          dist[u] = static_cast<std::uint16_t>(dist[v] + 1);
          queue.push_back(u);
        }
      }
    }
    for (int s = 0; s < p; ++s) {
      if (dist[gpu_vertex_[s]] == kUnreached) {
        throw InputError(spec_.location_of("cluster.custom.links"), "cluster.custom.links",
                         "gpu" + std::to_string(s) + " cannot reach gpu" + std::to_string(t) +
                             " (GPUs do not forward traffic), expected a connected topology");
      }
    }
  }
}

void CustomTopology::compute_nic_shares(const Graph& g) {
  // Each GPU's NIC is the nearest one reachable without passing a GPU or a fabric switch; GPUs
  // with the same NIC share its fabric-facing bandwidth.
  const int p = num_gpus();
  std::vector<VertexId> nic_of(p, std::numeric_limits<VertexId>::max());
  std::unordered_map<VertexId, int> users;
  for (int r = 0; r < p; ++r) {
    std::vector<char> seen(num_vertices(), 0);
    std::deque<VertexId> queue{gpu_vertex_[r]};
    seen[gpu_vertex_[r]] = 1;
    while (!queue.empty() && nic_of[r] == std::numeric_limits<VertexId>::max()) {
      const VertexId v = queue.front();
      queue.pop_front();
      for (auto [e, end] = boost::out_edges(v, g); e != end; ++e) {
        const VertexId w = boost::target(*e, g);
        if (seen[w]) continue;
        seen[w] = 1;
        const VertexKind k = vertices_[w].kind;
        if (k == VertexKind::kNic) {
          nic_of[r] = w;
          break;
        }
        if (k != VertexKind::kGpu && k != VertexKind::kSwitch) queue.push_back(w);
      }
    }
    if (nic_of[r] != std::numeric_limits<VertexId>::max()) ++users[nic_of[r]];
  }
  nic_share_bandwidth_.assign(p, BytesPerSecond(0));
  for (int r = 0; r < p; ++r) {
    const VertexId nic = nic_of[r];
    if (nic == std::numeric_limits<VertexId>::max()) continue;
    double bw = 0;
    for (auto [e, end] = boost::out_edges(nic, g); e != end; ++e) {
      if (vertices_[boost::target(*e, g)].kind == VertexKind::kSwitch) {
        bw = std::max(bw, links_[link_id(g, *e)].bandwidth.value());
      }
    }
    if (bw > 0) nic_share_bandwidth_[r] = BytesPerSecond(bw / users[nic]);
    gpus_per_nic_ = std::max(gpus_per_nic_, users[nic]);
  }
}

void CustomTopology::route(int src, int dst, std::vector<LinkId>& out) const {
  const std::uint16_t* dist = &dist_[static_cast<std::size_t>(dst) * num_vertices()];
  const VertexId target = gpu_vertex_[dst];
  VertexId cur = gpu_vertex_[src];
  for (int hop = 0; cur != target; ++hop) {
    // Next hops: one step closer, and not a GPU other than the destination.
    auto ok = [&](LinkId l) {
      const VertexId w = links_[l].dst;
      return dist[w] + 1 == dist[cur] && (w == target || !is_gpu_[w]);
    };
    std::uint32_t n = 0;
    for (std::uint32_t x = out_off_[cur]; x < out_off_[cur + 1]; ++x) n += ok(out_links_[x]);
    std::uint32_t pick = ecmp_pick(src, dst, hop, n);
    for (std::uint32_t x = out_off_[cur]; x < out_off_[cur + 1]; ++x) {
      const LinkId l = out_links_[x];
      if (ok(l) && pick-- == 0) {
        out.push_back(l);
        cur = links_[l].dst;
        break;
      }
    }
  }
}

}  // namespace

std::unique_ptr<Topology> build_custom(const ClusterSpec& spec) {
  return std::make_unique<CustomTopology>(spec);
}

}  // namespace moesim::topology::detail
