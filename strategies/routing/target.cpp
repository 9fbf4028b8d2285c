#include "strategies/routing/target.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/push_relabel_max_flow.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>
#include <unordered_map>

#include "core/error.hpp"
#include "topology/topology.hpp"

namespace moesim::routing {

namespace {

struct ClassKey {
  std::int64_t alpha_q, bw_q;
  int tier;
  bool operator==(const ClassKey& o) const {
    return alpha_q == o.alpha_q && bw_q == o.bw_q && tier == o.tier;
  }
};
struct ClassKeyHash {
  std::size_t operator()(const ClassKey& k) const {
    std::size_t h = std::hash<std::int64_t>()(k.alpha_q);
    h = h * 1000003u ^ std::hash<std::int64_t>()(k.bw_q);
    return h * 31u ^ static_cast<std::size_t>(k.tier);
  }
};

// Interns pair classes: quantised alpha (0.1 ps) and bandwidth (1 B/s) so that two routes of the
// same shape summed in a different order land in the same class.
class ClassTable {
 public:
  std::uint32_t intern(double alpha_s, double beta, int tier) {
    const ClassKey key{std::llround(alpha_s * 1e13), std::llround(1.0 / beta), tier};
    if (last_ < classes_.size() && key == last_key_) return static_cast<std::uint32_t>(last_);
    auto [it, inserted] = ids_.emplace(key, classes_.size());
    if (inserted) classes_.push_back(PairClass{alpha_s, beta, tier});
    last_ = it->second;
    last_key_ = key;
    return static_cast<std::uint32_t>(it->second);
  }
  std::vector<PairClass> take() { return std::move(classes_); }

 private:
  std::unordered_map<ClassKey, std::size_t, ClassKeyHash> ids_;
  std::vector<PairClass> classes_;
  std::size_t last_ = std::numeric_limits<std::size_t>::max();
  ClassKey last_key_{0, 0, 0};
};

double even_time(const PairCostMatrix& costs, std::int64_t supply, double b) {
  const double x = static_cast<double>(supply) / costs.size;
  if (x <= 0) return 0;
  double t = 0;
  std::vector<char> seen(costs.classes.size(), 0);
  for (std::uint32_t c : costs.cls) seen[c] = 1;
  for (std::size_t c = 0; c < seen.size(); ++c)
    if (seen[c]) t = std::max(t, costs.classes[c].alpha_s + costs.classes[c].beta_s_per_b * x * b);
  return t;
}

// Water-filling over cost classes (exact when is_tier_symmetric): every pair of class c carries
// x_c(T) = max(0, (T - alpha_c) / (beta_c b)) and sum_c n_c x_c(T) = supply fixes T.
void solve_symmetric(const PairCostMatrix& costs, std::int64_t supply, double b,
                     TargetPattern& out) {
  const int W = costs.size;
  std::vector<double> n(costs.classes.size(), 0.0);
  for (int j = 0; j < W; ++j) n[costs.cls[j]] += 1.0;  // row 0: every row has the same counts
  std::vector<std::size_t> order;
  for (std::size_t c = 0; c < n.size(); ++c)
    if (n[c] > 0) order.push_back(c);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) {
    return costs.classes[a].alpha_s < costs.classes[c].alpha_s;
  });
  const double s = static_cast<double>(supply);
  double T = 0, rate_sum = 0, offset_sum = 0;  // sum n/(beta b), sum n alpha/(beta b)
  for (std::size_t idx = 0; idx < order.size(); ++idx) {
    const PairClass& pc = costs.classes[order[idx]];
    const double r = n[order[idx]] / (pc.beta_s_per_b * b);
    rate_sum += r;
    offset_sum += r * pc.alpha_s;
    T = (s + offset_sum) / rate_sum;
    const bool last = idx + 1 == order.size();
    if (last || T <= costs.classes[order[idx + 1]].alpha_s) break;
  }
  out.block_tokens.assign(costs.classes.size(), 0.0);
  out.classes = static_cast<int>(costs.classes.size());
  double used_max = 0;
  for (std::size_t c : order) {
    const PairClass& pc = costs.classes[c];
    const double x = std::max(0.0, (T - pc.alpha_s) / (pc.beta_s_per_b * b));
    out.block_tokens[c] = x;
    if (x > 0) used_max = std::max(used_max, pc.alpha_s + pc.beta_s_per_b * x * b);
  }
  out.cls = costs.cls;
  out.time_s = supply > 0 ? used_max : 0;
  out.method = TargetMethod::kSymmetric;
}

// GPU types for the typed solver: the coarsest equitable partition reachable by refinement
// (colour refinement): rows of one type see the same number of pairs of every (column type, cost
// class), columns of one type the same number of every (row type, cost class). Averaging any
// feasible plan over the blocks (row type, column type, class) keeps row and column sums and
// capacities, so an optimum constant on blocks exists: the typed problem is exact.
struct Types {
  std::vector<std::uint32_t> row, col;
  int rows = 1, cols = 1;
};

// One refinement pass over rows (by_row) or columns: new type = (old type, histogram over
// (other side's type, class)). Returns false when the histogram space is too large.
bool refine_side(const PairCostMatrix& c, bool by_row, const std::vector<std::uint32_t>& own,
                 const std::vector<std::uint32_t>& other, int other_types,
                 std::vector<std::uint32_t>& out, int& out_types) {
  const int W = c.size;
  const std::size_t C = c.classes.size();
  const std::size_t keys = static_cast<std::size_t>(other_types) * C;
  if (keys > (std::size_t{1} << 22)) return false;
  std::vector<std::uint32_t> hist(keys, 0);
  std::vector<std::size_t> touched;
  std::map<std::vector<std::uint64_t>, std::uint32_t> ids;
  out.assign(static_cast<std::size_t>(W), 0);
  std::vector<std::uint64_t> sig;
  for (int a = 0; a < W; ++a) {
    touched.clear();
    for (int b = 0; b < W; ++b) {
      const std::size_t p =
          by_row ? static_cast<std::size_t>(a) * W + b : static_cast<std::size_t>(b) * W + a;
      const std::size_t key = static_cast<std::size_t>(other[b]) * C + c.cls[p];
      if (hist[key]++ == 0) touched.push_back(key);
    }
    std::sort(touched.begin(), touched.end());
    sig.assign(1, own[a]);
    for (std::size_t key : touched) {
      sig.push_back((static_cast<std::uint64_t>(key) << 32) | hist[key]);
      hist[key] = 0;
    }
    auto [it, inserted] = ids.emplace(sig, static_cast<std::uint32_t>(ids.size()));
    out[a] = it->second;
  }
  out_types = static_cast<int>(ids.size());
  return true;
}

bool find_types(const PairCostMatrix& c, Types& t) {
  const auto W = static_cast<std::size_t>(c.size);
  t.row.assign(W, 0);
  t.col.assign(W, 0);
  t.rows = t.cols = 1;
  for (int pass = 0; pass < 64; ++pass) {
    std::vector<std::uint32_t> row, col;
    int rows = 0, cols = 0;
    if (!refine_side(c, true, t.row, t.col, t.cols, row, rows)) return false;
    if (!refine_side(c, false, t.col, t.row, t.rows, col, cols)) return false;
    const bool stable = rows == t.rows && cols == t.cols;
    t.row = std::move(row);
    t.col = std::move(col);
    t.rows = rows;
    t.cols = cols;
    if (stable) return true;
  }
  return false;
}

// Transportation feasibility by push-relabel max-flow over blocks: left node l supplies
// left_supply[l], right node r demands right_demand[r], block k joins (left, right) with
// capacity pairs_k * u_{class_k}(T). Built once; only block capacities change per bound.
class FlowSolver {
 public:
  struct Block {
    std::uint32_t left, right, cls;
    std::int64_t pairs;
  };

  FlowSolver(std::vector<std::int64_t> left_supply, std::vector<std::int64_t> right_demand,
             std::vector<Block> blocks, std::int64_t per_pair_supply)
      : supply_(std::move(left_supply)),
        blocks_(std::move(blocks)),
        per_pair_supply_(per_pair_supply),
        g_(supply_.size() + right_demand.size() + 2) {
    cap_ = boost::get(boost::edge_capacity, g_);
    res_ = boost::get(boost::edge_residual_capacity, g_);
    auto rev = boost::get(boost::edge_reverse, g_);
    auto add = [&](std::size_t u, std::size_t v, std::int64_t cap) {
      auto e = boost::add_edge(u, v, g_).first;
      auto r = boost::add_edge(v, u, g_).first;
      cap_[e] = cap;
      cap_[r] = 0;
      rev[e] = r;
      rev[r] = e;
      return e;
    };
    const std::size_t L = supply_.size(), R = right_demand.size();
    source_ = L + R;
    sink_ = source_ + 1;
    for (std::size_t l = 0; l < L; ++l) {
      add(source_, l, supply_[l]);
      total_ += supply_[l];
    }
    for (std::size_t r = 0; r < R; ++r) add(L + r, sink_, right_demand[r]);
    edges_.reserve(blocks_.size());
    for (const Block& b : blocks_) edges_.push_back(add(b.left, L + b.right, 0));
  }

  bool feasible(const PairCostMatrix& costs, double T, double b) {
    std::vector<std::int64_t> class_cap(costs.classes.size());
    for (std::size_t c = 0; c < costs.classes.size(); ++c) {
      const PairClass& pc = costs.classes[c];
      const double u = (T - pc.alpha_s) / (pc.beta_s_per_b * b);
      // The relative fuzz keeps a bound that lands exactly on an integer volume feasible.
      class_cap[c] =
          u <= 0 ? 0
                 : std::min<std::int64_t>(per_pair_supply_,
                                          static_cast<std::int64_t>(std::floor(u * (1 + 1e-12))));
    }
    std::vector<std::int64_t> row(supply_.size(), 0);
    for (std::size_t k = 0; k < blocks_.size(); ++k) {
      const std::int64_t c = class_cap[blocks_[k].cls] * blocks_[k].pairs;
      cap_[edges_[k]] = c;
      row[blocks_[k].left] += c;
    }
    ++solves_;
    for (std::size_t l = 0; l < row.size(); ++l)
      if (row[l] < supply_[l]) return false;  // a sender cannot place its tokens at all
    return boost::push_relabel_max_flow(g_, source_, sink_) == total_;
  }

  // Flow per pair of every block.
  std::vector<double> per_pair_flows() const {
    std::vector<double> x(edges_.size());
    for (std::size_t k = 0; k < edges_.size(); ++k)
      x[k] = static_cast<double>(cap_[edges_[k]] - res_[edges_[k]]) /
             static_cast<double>(blocks_[k].pairs);
    return x;
  }
  int solves() const { return solves_; }

 private:
  using Traits = boost::adjacency_list_traits<boost::vecS, boost::vecS, boost::directedS>;
  using Graph = boost::adjacency_list<
      boost::vecS, boost::vecS, boost::directedS, boost::no_property,
      boost::property<
          boost::edge_capacity_t, std::int64_t,
          boost::property<boost::edge_residual_capacity_t, std::int64_t,
                          boost::property<boost::edge_reverse_t, Traits::edge_descriptor>>>>;
  std::vector<std::int64_t> supply_;
  std::vector<Block> blocks_;
  std::int64_t per_pair_supply_;
  Graph g_;
  boost::property_map<Graph, boost::edge_capacity_t>::type cap_;
  boost::property_map<Graph, boost::edge_residual_capacity_t>::type res_;
  std::size_t source_ = 0, sink_ = 0;
  std::int64_t total_ = 0;
  std::vector<Traits::edge_descriptor> edges_;
  int solves_ = 0;
};

// Bisection on T with a feasibility oracle; returns the flows at the final feasible bound.
std::vector<double> bisect(FlowSolver& solver, const PairCostMatrix& costs, std::int64_t supply,
                           double b, const TargetOptions& opt) {
  // Even dispatch rounded up is feasible at its time; grow the bound until the flow saturates
  // (it does at the first try unless rounding bites).
  const std::int64_t even_up = (supply + costs.size - 1) / costs.size;
  double hi = 0;
  for (const PairClass& pc : costs.classes)
    hi = std::max(hi, pc.alpha_s + pc.beta_s_per_b * static_cast<double>(even_up) * b);
  while (!solver.feasible(costs, hi, b)) hi *= 2;
  double lo = 0;
  for (int it = 0; it < opt.max_iterations && hi - lo > opt.rel_tolerance * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (solver.feasible(costs, mid, b))
      hi = mid;
    else
      lo = mid;
  }
  // The last solve may have been an infeasible mid: solve at hi once more for its flow.
  solver.feasible(costs, hi, b);
  return solver.per_pair_flows();
}

void solve_max_flow(const PairCostMatrix& costs, std::int64_t supply, double b,
                    const TargetOptions& opt, TargetPattern& out) {
  const int W = costs.size;
  std::vector<FlowSolver::Block> blocks;
  blocks.reserve(static_cast<std::size_t>(W) * W);
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j)
      blocks.push_back({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(j),
                        costs.cls[static_cast<std::size_t>(i) * W + j], 1});
  FlowSolver solver(std::vector<std::int64_t>(W, supply), std::vector<std::int64_t>(W, supply),
                    std::move(blocks), supply);
  out.tokens = bisect(solver, costs, supply, b, opt);  // block k = pair (k / W, k % W)
  out.iterations = solver.solves();
  out.method = TargetMethod::kMaxFlow;
}

// The typed solver (see Types). False when the partition has too many blocks to pay off.
bool solve_typed(const PairCostMatrix& costs, const Types& t, std::int64_t supply, double b,
                 const TargetOptions& opt, TargetPattern& out) {
  const int W = costs.size;
  const std::size_t C = costs.classes.size();
  const std::size_t nblocks = static_cast<std::size_t>(t.rows) * t.cols * C;
  if (nblocks > opt.max_blocks ||
      static_cast<std::size_t>(t.rows) * t.cols * 4 > static_cast<std::size_t>(W) * W)
    return false;
  std::vector<std::int64_t> pairs(nblocks, 0), rows(t.rows, 0), cols(t.cols, 0);
  for (int i = 0; i < W; ++i) {
    ++rows[t.row[i]];
    ++cols[t.col[i]];
    const std::size_t base = static_cast<std::size_t>(t.row[i]) * t.cols;
    const std::uint32_t* r = costs.cls.data() + static_cast<std::size_t>(i) * W;
    for (int j = 0; j < W; ++j) ++pairs[(base + t.col[j]) * C + r[j]];
  }
  std::vector<FlowSolver::Block> blocks;
  std::vector<std::size_t> index;
  for (std::size_t k = 0; k < nblocks; ++k)
    if (pairs[k] > 0) {
      blocks.push_back({static_cast<std::uint32_t>(k / C / t.cols),
                        static_cast<std::uint32_t>(k / C % t.cols),
                        static_cast<std::uint32_t>(k % C), pairs[k]});
      index.push_back(k);
    }
  for (auto& r : rows) r *= supply;
  for (auto& c : cols) c *= supply;
  FlowSolver solver(std::move(rows), std::move(cols), std::move(blocks), supply);
  const std::vector<double> y = bisect(solver, costs, supply, b, opt);
  out.block_tokens.assign(nblocks, 0.0);
  for (std::size_t k = 0; k < index.size(); ++k) out.block_tokens[index[k]] = y[k];
  out.cls = costs.cls;
  out.row_type = t.row;
  out.col_type = t.col;
  out.row_types = t.rows;
  out.col_types = t.cols;
  out.classes = static_cast<int>(C);
  out.iterations = solver.solves();
  out.method = TargetMethod::kTypedMaxFlow;
  return true;
}

}  // namespace

std::string_view target_method_name(TargetMethod m) {
  switch (m) {
    case TargetMethod::kSymmetric:
      return "symmetric";
    case TargetMethod::kTypedMaxFlow:
      return "typed_max_flow";
    case TargetMethod::kMaxFlow:
      break;
  }
  return "max_flow";
}

PairCostMatrix pair_costs(const topology::Topology& topo, std::span<const int> ranks) {
  const int W = static_cast<int>(ranks.size());
  PairCostMatrix m;
  m.size = W;
  m.cls.resize(static_cast<std::size_t>(W) * W);
  ClassTable table;
  for (int i = 0; i < W; ++i) {
    // The local pair is priced as the nearest peer (header): lowest alpha, then widest.
    double best_alpha = 0, best_beta = 0;
    int best_tier = 0;
    bool have = false;
    std::uint32_t* row = m.cls.data() + static_cast<std::size_t>(i) * W;
    for (int j = 0; j < W; ++j) {
      if (i == j) continue;
      const topology::PairCost pc = topo.pair_cost(ranks[i], ranks[j]);
      const double a = pc.alpha.value(), be = pc.beta();
      row[j] = table.intern(a, be, pc.tier);
      if (!have || a < best_alpha || (a == best_alpha && be < best_beta)) {
        best_alpha = a;
        best_beta = be;
        best_tier = pc.tier;
        have = true;
      }
    }
    if (!have) {  // a group of one GPU: its own HBM
      const topology::PairCost pc = topo.pair_cost(ranks[i], ranks[i]);
      best_alpha = pc.alpha.value();
      best_beta = pc.beta();
    }
    (void)best_tier;
    row[i] = table.intern(best_alpha, best_beta, 0);
  }
  m.classes = table.take();
  return m;
}

PairCostMatrix pair_costs(int size, std::span<const double> alpha_s,
                          std::span<const double> beta_s_per_b, std::span<const int> tier) {
  const std::size_t n = static_cast<std::size_t>(size) * size;
  if (size < 1 || alpha_s.size() != n || beta_s_per_b.size() != n ||
      (!tier.empty() && tier.size() != n))
    throw InputError(fmt::format("pair_costs: expected {} x {} matrices", size, size));
  PairCostMatrix m;
  m.size = size;
  m.cls.resize(n);
  ClassTable table;
  for (std::size_t p = 0; p < n; ++p) {
    if (!(beta_s_per_b[p] > 0) || alpha_s[p] < 0)
      throw InputError("pair_costs: beta must be > 0 and alpha >= 0");
    m.cls[p] = table.intern(alpha_s[p], beta_s_per_b[p], tier.empty() ? 0 : tier[p]);
  }
  m.classes = table.take();
  return m;
}

bool is_tier_symmetric(const PairCostMatrix& costs) {
  const std::size_t C = costs.classes.size();
  const int W = costs.size;
  if (C > 4096 || C > static_cast<std::size_t>(W) * 4 + 16) return false;
  std::vector<int> ref(C, 0), row(C, 0);
  std::vector<int> cols(static_cast<std::size_t>(W) * C, 0);
  for (int j = 0; j < W; ++j) ++ref[costs.cls[j]];
  for (int i = 0; i < W; ++i) {
    std::fill(row.begin(), row.end(), 0);
    const std::uint32_t* r = costs.cls.data() + static_cast<std::size_t>(i) * W;
    for (int j = 0; j < W; ++j) {
      ++row[r[j]];
      ++cols[static_cast<std::size_t>(j) * C + r[j]];
    }
    if (row != ref) return false;
  }
  for (int j = 0; j < W; ++j)
    if (!std::equal(ref.begin(), ref.end(), cols.begin() + static_cast<std::ptrdiff_t>(j * C)))
      return false;
  return true;
}

TargetPattern solve_target(const PairCostMatrix& costs, std::int64_t supply, double bytes_per_token,
                           double lambda, const TargetOptions& opt) {
  if (costs.size < 1) throw InputError("TA-MoE target: empty group");
  if (supply < 0) throw InputError(fmt::format("TA-MoE target: supply {} < 0", supply));
  if (!(bytes_per_token > 0))
    throw InputError(fmt::format("TA-MoE target: bytes per token {} must be > 0", bytes_per_token));
  if (!(lambda >= 0 && lambda <= 1))
    throw InputError(fmt::format("ta_moe.lambda = {}, expected a value in [0, 1]", lambda));
  TargetPattern out;
  out.size = costs.size;
  out.supply = supply;
  out.bytes_per_token = bytes_per_token;
  out.lambda = lambda;
  out.even_time_s = even_time(costs, supply, bytes_per_token);
  Types types;
  if (opt.allow_symmetric && is_tier_symmetric(costs))
    solve_symmetric(costs, supply, bytes_per_token, out);
  else if (!(opt.allow_symmetric && find_types(costs, types) &&
             solve_typed(costs, types, supply, bytes_per_token, opt, out)))
    solve_max_flow(costs, supply, bytes_per_token, opt, out);
  if (out.method != TargetMethod::kSymmetric)
    out.time_s = predicted_time_s(
        costs, [&](int i, int j) { return out.tokens_at(i, j); }, bytes_per_token);
  return out;
}

std::vector<TierShare> tier_shares(const PairCostMatrix& costs, const TargetPattern& pattern) {
  std::map<int, TierShare> by_tier;
  const int W = costs.size;
  const double s = pattern.supply > 0 ? static_cast<double>(pattern.supply) : 1.0;
  for (int i = 0; i < W; ++i)
    for (int j = 0; j < W; ++j) {
      TierShare& t = by_tier[i == j ? 0 : costs.at(i, j).tier];
      t.peers += 1.0;
      t.even += 1.0 / W;
      t.target += pattern.supply > 0 ? pattern.tokens_at(i, j) / s : 1.0 / W;
      t.smoothed += pattern.share_at(i, j);
    }
  std::vector<TierShare> rows;
  for (auto& [tier, t] : by_tier) {
    t.tier = tier;
    t.peers /= W;
    t.even /= W;
    t.target /= W;
    t.smoothed /= W;
    rows.push_back(t);
  }
  return rows;
}

}  // namespace moesim::routing
