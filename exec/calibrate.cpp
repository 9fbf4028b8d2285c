#include "exec/calibrate.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "core/error.hpp"
#include "exec/mpi_communicator.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  MOESIM_ASSERT(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::size_t round_up(std::size_t x, std::size_t m) { return (x + m - 1) / m * m; }

std::vector<std::size_t> sweep_sizes(std::size_t max_bytes) {
  std::vector<std::size_t> sizes;
  for (std::size_t s = 1024; s <= max_bytes; s *= 4) sizes.push_back(s);
  if (sizes.empty()) sizes.push_back(1024);
  return sizes;
}

// One repeat of one collective at one size on this rank: runs it (timed) and, when `check`,
// counts the received elements that differ from the fill rule's expectation.
struct Rep {
  double time_s = 0;
  long long wrong = 0;
};

class Sweeper {
 public:
  Sweeper(const Scenario& sc, const topology::Topology& topo, MpiSession& session,
          Communicator& comm, const CalibrateOptions& opt)
      : sc_(sc), topo_(topo), session_(session), comm_(comm), opt_(opt) {
    me_ = comm.rank();
    w_ = comm.size();
    for (int r = 0; r < w_; ++r) group_.push_back(r);
    ctx_.topo = &topo_;
    ctx_.net = strategies::scenario_network_params(sc);
    ctx_.net.calibration = nullptr;  // predictions from the closed forms, not from a calibration
  }

  // Median over repeats of the slowest rank's time, #wrong summed over ranks (last repeat).
  SweepRow measure(std::size_t size, std::size_t count, CollectiveType type,
                   const std::function<Rep(bool check)>& once) {
    once(false);  // warm-up: connections, allocations, page faults
    std::vector<double> times;
    long long wrong = 0;
    for (int i = 0; i < opt_.repeats; ++i) {
      session_.barrier("calibrate repeat");
      const bool last = i + 1 == opt_.repeats;
      const Rep r = once(last);
      times.push_back(session_.all_reduce_max(r.time_s));
      if (last) wrong = session_.all_reduce_sum(r.wrong);
    }
    SweepRow row;
    row.size_bytes = size;
    row.count = count;
    row.time_s = median(times);
    row.algbw_Bps = row.time_s > 0 ? static_cast<double>(size) / row.time_s : 0;
    row.busbw_Bps =
        row.algbw_Bps * collectives::busbw_factor(type, type == CollectiveType::kSendRecv ? 2 : w_);
    row.wrong = wrong;
    return row;
  }

  SweepLine all_to_all(CollectiveAlgo algo, const std::vector<std::size_t>& sizes, int tag) {
    SweepLine line = begin_line(CollectiveType::kAllToAll, algo);
    const auto* a = collectives::find_algorithm(CollectiveType::kAllToAll, algo);
    MOESIM_ASSERT(a != nullptr, "all_to_all algorithm missing from the registry");
    for (std::size_t size : sizes) {
      // Whole floats in each of the W chunks, as the executor rounds.
      const std::size_t s = round_up(size, 4 * static_cast<std::size_t>(w_));
      CollectiveSpec spec;
      spec.type = CollectiveType::kAllToAll;
      spec.algo = algo;
      spec.bytes = Bytes(static_cast<double>(s));
      collectives::CollectiveCall call{&spec, &group_, 0, true};
      const auto phases = a->lower(call, topo_);
      const std::size_t n = s / 4, c = n / static_cast<std::size_t>(w_);
      std::vector<float> send(n), recv(n);
      for (std::size_t i = 0; i < n; ++i) send[i] = fill_value(opt_.seed, me_, i);
      line.rows.push_back(measure(s, n, line.type, [&](bool check) {
        std::fill(recv.begin(), recv.end(), 0.0f);
        const auto t0 = Clock::now();
        run_phases(comm_, phases, reinterpret_cast<const std::byte*>(send.data()), s,
                   reinterpret_cast<std::byte*>(recv.data()), s, tag);
        Rep r{seconds_since(t0), 0};
        if (check)
          for (int src = 0; src < w_; ++src)
            for (std::size_t j = 0; j < c; ++j)
              if (recv[src * c + j] != fill_value(opt_.seed, src, me_ * c + j)) ++r.wrong;
        return r;
      }));
    }
    return finish_line(std::move(line));
  }

  SweepLine all_reduce(const std::vector<std::size_t>& sizes) {
    SweepLine line = begin_line(CollectiveType::kAllReduce, CollectiveAlgo::kAuto);
    for (std::size_t size : sizes) {
      const std::size_t n = round_up(size, 4) / 4;
      std::vector<float> buf(n);
      line.rows.push_back(measure(n * 4, n, line.type, [&](bool check) {
        for (std::size_t i = 0; i < n; ++i) buf[i] = fill_value(opt_.seed, me_, i);
        const auto t0 = Clock::now();
        comm_.all_reduce_sum(buf.data(), n, group_);
        Rep r{seconds_since(t0), 0};
        if (check)
          for (std::size_t i = 0; i < n; ++i)
            if (buf[i] != sum_over_ranks(i)) ++r.wrong;
        return r;
      }));
    }
    return finish_line(std::move(line));
  }

  SweepLine all_gather(const std::vector<std::size_t>& sizes) {
    SweepLine line = begin_line(CollectiveType::kAllGather, CollectiveAlgo::kAuto);
    for (std::size_t size : sizes) {
      // size = the gathered output (CollectiveSpec::bytes of all_gather); block = one rank's.
      const std::size_t bc = round_up(size, 4 * static_cast<std::size_t>(w_)) / 4 / w_;
      std::vector<float> in(bc), out(bc * w_);
      for (std::size_t j = 0; j < bc; ++j) in[j] = fill_value(opt_.seed, me_, j);
      line.rows.push_back(measure(bc * w_ * 4, bc * w_, line.type, [&](bool check) {
        std::fill(out.begin(), out.end(), 0.0f);
        const auto t0 = Clock::now();
        comm_.all_gather(reinterpret_cast<const std::byte*>(in.data()), bc * 4,
                         reinterpret_cast<std::byte*>(out.data()), group_);
        Rep r{seconds_since(t0), 0};
        if (check)
          for (int s = 0; s < w_; ++s)
            for (std::size_t j = 0; j < bc; ++j)
              if (out[s * bc + j] != fill_value(opt_.seed, s, j)) ++r.wrong;
        return r;
      }));
    }
    return finish_line(std::move(line));
  }

  SweepLine reduce_scatter(const std::vector<std::size_t>& sizes) {
    SweepLine line = begin_line(CollectiveType::kReduceScatter, CollectiveAlgo::kAuto);
    for (std::size_t size : sizes) {
      // size = the whole input (CollectiveSpec::bytes of reduce_scatter); count per block.
      const std::size_t bc = round_up(size, 4 * static_cast<std::size_t>(w_)) / 4 / w_;
      std::vector<float> in(bc * w_), out(bc);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = fill_value(opt_.seed, me_, i);
      line.rows.push_back(measure(bc * w_ * 4, bc * w_, line.type, [&](bool check) {
        const auto t0 = Clock::now();
        comm_.reduce_scatter_sum(in.data(), out.data(), bc, group_);
        Rep r{seconds_since(t0), 0};
        if (check)
          for (std::size_t j = 0; j < bc; ++j)
            if (out[j] != sum_over_ranks(me_ * bc + j)) ++r.wrong;
        return r;
      }));
    }
    return finish_line(std::move(line));
  }

  // Both ranks of the pair send `size` bytes to each other at once (nccl-tests sendrecv); the
  // other ranks wait at the barriers.
  SweepLine point_to_point(int tier, int peer, const std::vector<std::size_t>& sizes, int tag) {
    SweepLine line = begin_line(CollectiveType::kSendRecv, CollectiveAlgo::kLinear);
    line.tier = tier;
    line.ranks = 2;
    line.name = fmt::format("p2p tier {} (0<->{})", tier, peer);
    const bool in_pair = me_ == 0 || me_ == peer;
    const int other = me_ == 0 ? peer : 0;
    for (std::size_t size : sizes) {
      const std::size_t n = round_up(size, 4) / 4;
      std::vector<float> send(in_pair ? n : 0), recv(in_pair ? n : 0);
      for (std::size_t i = 0; i < send.size(); ++i) send[i] = fill_value(opt_.seed, me_, i);
      line.rows.push_back(measure(n * 4, n, line.type, [&](bool check) {
        if (!in_pair) return Rep{};
        std::fill(recv.begin(), recv.end(), 0.0f);
        const SendSpec s{other, reinterpret_cast<const std::byte*>(send.data()), n * 4};
        const RecvSpec r{other, reinterpret_cast<std::byte*>(recv.data()), n * 4};
        const auto t0 = Clock::now();
        comm_.exchange(std::span<const SendSpec>(&s, 1), std::span<const RecvSpec>(&r, 1), tag);
        Rep rep{seconds_since(t0), 0};
        if (check)
          for (std::size_t i = 0; i < n; ++i)
            if (recv[i] != fill_value(opt_.seed, other, i)) ++rep.wrong;
        return rep;
      }));
    }
    return finish_line(std::move(line));
  }

  // The algorithm the executor reports for a group collective (kAuto resolved as the plan's
  // collectives resolve it); the communicator runs its own implementation of it.
  CollectiveAlgo resolved_algo(CollectiveType type) const {
    CollectiveSpec spec;
    spec.type = type;
    spec.algo = CollectiveAlgo::kAuto;
    spec.bytes = Bytes(1 << 20);
    collectives::CollectiveCall call{&spec, &group_, 0, false};
    return collectives::select_algorithm(call, ctx_).algo();
  }

  bool applicable(CollectiveType type, CollectiveAlgo algo) const {
    const auto* a = collectives::find_algorithm(type, algo);
    if (a == nullptr) return false;
    CollectiveSpec spec;
    spec.type = type;
    spec.algo = algo;
    spec.bytes = Bytes(1 << 20);
    collectives::CollectiveCall call{&spec, &group_, 0, false};
    return a->applicable(call, topo_);
  }

 private:
  SweepLine begin_line(CollectiveType type, CollectiveAlgo algo) const {
    SweepLine line;
    line.type = type;
    line.algo = algo == CollectiveAlgo::kAuto ? resolved_algo(type) : algo;
    line.ranks = w_;
    line.name = fmt::format("{} {}", collective_type_name(type), collective_algo_name(line.algo));
    return line;
  }
  static SweepLine finish_line(SweepLine line) {
    std::vector<double> x, y;
    for (const auto& r : line.rows) {
      x.push_back(static_cast<double>(r.size_bytes));
      y.push_back(r.time_s);
    }
    if (x.size() >= 2) line.fit = fit_alpha_beta(x, y);
    return line;
  }
  float sum_over_ranks(std::size_t i) const {
    float s = 0;
    for (int r = 0; r < w_; ++r) s += fill_value(opt_.seed, r, i);
    return s;
  }

  const Scenario& sc_;
  const topology::Topology& topo_;
  MpiSession& session_;
  Communicator& comm_;
  CalibrateOptions opt_;
  int me_ = 0, w_ = 1;
  std::vector<int> group_;
  collectives::CostContext ctx_;
};

double rank_median(MpiSession& session, double mine) {
  return median(session.all_gather_doubles({mine}));
}

double time_gemm(const GemmTimer& timer, const GemmShape& g, int repeats) {
  const auto run = [&] {
    return timer(static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k),
                 static_cast<int>(g.batch));
  };
  run();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(run());
  return median(t);
}

}  // namespace

std::vector<GemmShape> gemm_grid(const Scenario& sc, bool quick, bool gpu) {
  // Expert fc1 shapes: m tokens x (k = M) -> (n = H). The scenario's own (M, H) is included so
  // the nearest-shape lookup has the shapes `exec` will run. A GPU needs far larger shapes before
  // its time grows with the FLOPs (an H200 runs 128 x 256 x 64 in launch latency), so its grid
  // starts where the host path's ends.
  std::vector<std::pair<int, int>> mh;
  std::vector<int> ms;
  std::int64_t max_m = 0, max_h = 0;  // the scenario's shape joins the grid up to these
  if (gpu) {
    mh = quick ? std::vector<std::pair<int, int>>{{1024, 4096}}
               : std::vector<std::pair<int, int>>{{512, 2048}, {1024, 4096}, {4096, 16384}};
    ms = quick ? std::vector<int>{16, 256, 2048} : std::vector<int>{16, 64, 256, 1024, 4096, 16384};
    max_m = 16384;
    max_h = 65536;
  } else {
    mh = quick ? std::vector<std::pair<int, int>>{{64, 128}, {128, 256}}
               : std::vector<std::pair<int, int>>{{128, 256}, {256, 512}, {512, 1024}};
    ms = quick ? std::vector<int>{8, 32, 128} : std::vector<int>{8, 32, 128, 512, 1024};
    max_m = quick ? 256 : 1024;
    max_h = quick ? 512 : 4096;
  }
  const std::int64_t sm = sc.model.model_dim, sh = sc.model.hidden_dim;
  const bool own = sm <= max_m && sh <= max_h;
  if (own) mh.emplace_back(static_cast<int>(sm), static_cast<int>(sh));
  std::vector<GemmShape> out;
  const auto add = [&](const GemmShape& g) {
    // Operands of at most 4 GiB in fp32 (A, B and C, every batch): the sweep must fit beside the
    // rank's other buffers on any GPU it calibrates, not only on an 80 GB one.
    const double elems = (static_cast<double>(g.m) * g.k + static_cast<double>(g.k) * g.n +
                          static_cast<double>(g.m) * g.n) *
                         static_cast<double>(g.batch);
    if (gpu && elems * 4.0 > 4.0 * 1024 * 1024 * 1024) return;
    for (const auto& o : out)
      if (o.m == g.m && o.n == g.n && o.k == g.k && o.batch == g.batch) return;
    out.push_back(g);
  };
  for (auto [m_dim, h_dim] : mh)
    for (int m : ms) add(GemmShape{m, h_dim, m_dim, 1});
  // On the GPU also the expert FFN's second GEMM (m x H -> M), whose k is H: at small m its time
  // is not fc1's. And the plan's batched expert GEMMs (plain layout: ep x local experts per
  // call), up to 64 Ki rows in all, always with the smallest m.
  const std::int64_t batch =
      static_cast<std::int64_t>(sc.parallelism.ep) * std::max(sc.model.local_experts(), 1);
  if (gpu && own) {
    for (int m : ms) add(GemmShape{m, sm, sh, 1});
    if (batch > 1)
      for (int m : ms)
        if (m == ms.front() || m * batch <= 65536) {
          add(GemmShape{m, sh, sm, batch});
          add(GemmShape{m, sm, sh, batch});
        }
  }
  return out;
}

float fill_value(std::uint64_t seed, int rank, std::size_t i) {
  // splitmix64 of (seed, rank, index): a fixed pseudo-random pattern per rank, reproducible.
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull +
                    static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ull +
                    static_cast<std::uint64_t>(i) * 0x94D049BB133111EBull + 0x2545F4914F6CDD1Dull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<int>(z % 17) - 8);
}

GemmTimer host_gemm_timer() {
  struct Buffers {
    std::vector<float> a, b, c;
    kernels::cpu::Context ctx{1};
  };
  auto buf = std::make_shared<Buffers>();
  return [buf](int m, int n, int k, int batch) {
    const auto need = [](std::vector<float>& v, std::size_t size) {
      if (v.size() < size) {
        v.resize(size);
        for (std::size_t i = 0; i < size; ++i) v[i] = static_cast<float>(i % 7) * 0.125f;
      }
    };
    need(buf->a, static_cast<std::size_t>(m) * k);
    need(buf->b, static_cast<std::size_t>(k) * n);
    need(buf->c, static_cast<std::size_t>(m) * n);
    const auto t0 = Clock::now();
    for (int i = 0; i < batch; ++i)  // the same operands: the host path's grid has batch 1
      kernels::cpu::gemm(buf->ctx, kernels::DType::kF32, m, n, k, buf->a.data(), buf->b.data(),
                         buf->c.data());
    return seconds_since(t0);
  };
}

namespace {

// The GEMM sweep: each grid shape's time (median of repeats, median over ranks), the alpha-beta
// fit of the large half and the efficiency table that reproduces every measured time.
void calibrate_gemms(const Scenario& sc, MpiSession& session, const GemmTimer& gemm,
                     const CalibrateOptions& opt, CalibrationRun& run) {
  Calibration& cal = run.calibration;
  const auto shapes = gemm_grid(sc, opt.quick, opt.gemm_on_gpu);
  for (const auto& g : shapes) {
    session.barrier("calibrate gemm");
    GemmPoint p;
    p.shape = g;
    p.time_s = rank_median(session, time_gemm(gemm, g, opt.repeats));
    run.gemm.push_back(p);
  }
  {
    std::vector<double> flops;
    for (const auto& p : run.gemm) flops.push_back(p.shape.flops());
    const double cut = median(flops);
    std::vector<double> x, y;
    for (auto& p : run.gemm)
      if (p.shape.flops() >= cut) {
        p.in_fit = true;
        x.push_back(p.shape.flops());
        y.push_back(p.time_s);
      }
    const LinearFit f = fit_alpha_beta(x, y);
    run.fit = f;
    // The fixed cost cannot exceed what the smallest GEMM takes: the large shapes' intercept is
    // an extrapolation, so it is capped at half the fastest measured time (the efficiency table
    // then carries the small shapes).
    double t_min = run.gemm.front().time_s;
    for (const auto& p : run.gemm) t_min = std::min(t_min, p.time_s);
    const double alpha = std::min(f.alpha.value(), 0.5 * t_min);
    cal.gemm.alpha_gemm = Seconds(alpha);
    // beta = time per FLOP of the fastest measured shape (net of alpha), and each shape's
    // efficiency = beta * flops / (t - alpha) in (0, 1], 1 for the fastest: then
    // alpha + flops * beta / efficiency (core/gemm_model.hpp) is each measured time exactly.
    double beta = std::numeric_limits<double>::infinity();
    for (const auto& p : run.gemm) beta = std::min(beta, (p.time_s - alpha) / p.shape.flops());
    cal.gemm.beta_gemm_s_per_flop = beta;
    for (const auto& p : run.gemm) {
      const double eff = std::clamp(beta * p.shape.flops() / (p.time_s - alpha), 1e-9, 1.0);
      cal.gemm.efficiency_table.push_back({p.shape, eff});
    }
    GemmModelParams params;
    for (auto& p : run.gemm) {
      GemmWork work{static_cast<double>(p.shape.m),
                    static_cast<double>(p.shape.n),
                    static_cast<double>(p.shape.k),
                    static_cast<double>(p.shape.batch),
                    p.shape.flops(),
                    0.0};
      p.predicted_s =
          gemm_time(params, cal.gemm, FlopsPerSecond(0), BytesPerSecond(0), work).value();
    }
  }
}

// The collectives (linear and 2DH all-to-all, all-reduce, all-gather, reduce-scatter) and one
// point-to-point line per tier, each over the size sweep, with their alpha-beta fits.
void calibrate_collectives(const Scenario& sc, const topology::Topology& topo, MpiSession& session,
                           Communicator& comm, const CalibrateOptions& opt, CalibrationRun& run) {
  Calibration& cal = run.calibration;
  const int w = comm.size();
  const auto sizes = sweep_sizes(opt.max_bytes);
  Sweeper sw(sc, topo, session, comm, opt);
  if (w > 1) {
    run.lines.push_back(sw.all_to_all(CollectiveAlgo::kLinear, sizes, 31001));
    if (topo.num_nodes() > 1 && sw.applicable(CollectiveType::kAllToAll, CollectiveAlgo::k2dh))
      run.lines.push_back(sw.all_to_all(CollectiveAlgo::k2dh, sizes, 31002));
    run.lines.push_back(sw.all_reduce(sizes));
    run.lines.push_back(sw.all_gather(sizes));
    run.lines.push_back(sw.reduce_scatter(sizes));
    // Point-to-point per tier, the first peer of rank 0 in each tier.
    std::vector<int> seen;
    for (int peer = 1; peer < w; ++peer) {
      const int tier = topo.tier(0, peer);
      if (std::find(seen.begin(), seen.end(), tier) != seen.end()) continue;
      seen.push_back(tier);
      run.lines.push_back(sw.point_to_point(tier, peer, sizes, 31100 + tier));
    }
  } else {
    cal.comments.push_back("One rank: no collectives or point-to-point measured.");
  }
  for (const auto& l : run.lines) {
    for (const auto& r : l.rows) run.wrong += r.wrong;
    if (l.tier >= 0) {
      cal.point_to_point.push_back({l.tier, l.fit, {}});
    } else {
      cal.collectives.push_back({l.type, l.algo, l.ranks, l.fit, {}});
    }
  }
}

// Interference: a GEMM's slowdown while the largest linear all-to-all runs beside it (on a second
// thread), as the compute model's factor.
void calibrate_interference(const topology::Topology& topo, MpiSession& session, Communicator& comm,
                            const GemmTimer& gemm, const std::string& device,
                            const CalibrateOptions& opt, CalibrationRun& run) {
  Calibration& cal = run.calibration;
  const int w = comm.size();
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  if (w == 1) {
    cal.interference = 0.0;
    cal.comments.push_back("interference: 0, one rank has no communication to overlap.");
  } else if (provided < MPI_THREAD_FUNNELED) {
    cal.interference = 0.0;
    cal.comments.push_back(
        "interference: 0, not measured: MPI gave MPI_THREAD_SINGLE, so no second thread may run "
        "the GEMM while the main thread communicates.");
  } else {
    // The largest shape whose GEMM takes <= 20 ms (bounded window), else the smallest.
    GemmShape g = run.gemm.front().shape;
    for (const auto& p : run.gemm)
      if (p.time_s <= 0.02 && p.shape.flops() > g.flops()) g = p.shape;
    const SweepLine& a2a = run.lines.front();
    const SweepRow& row = a2a.rows.back();
    const std::size_t s = row.size_bytes;
    CollectiveSpec spec;
    spec.type = CollectiveType::kAllToAll;
    spec.algo = CollectiveAlgo::kLinear;
    spec.bytes = Bytes(static_cast<double>(s));
    std::vector<int> group;
    for (int r = 0; r < w; ++r) group.push_back(r);
    collectives::CollectiveCall call{&spec, &group, 0, true};
    const auto phases =
        collectives::find_algorithm(CollectiveType::kAllToAll, CollectiveAlgo::kLinear)
            ->lower(call, topo);
    std::vector<std::byte> send(s), recv(s);

    session.barrier("calibrate interference");
    const double alone = time_gemm(gemm, g, opt.repeats);
    // Enough all-to-alls to cover `repeats` GEMMs on the slowest rank (at least as many as the
    // repeats themselves), the same count on every rank.
    const double want = (opt.repeats + 1) * alone / std::max(row.time_s, 1e-7) + opt.repeats;
    const int iters =
        static_cast<int>(std::clamp(std::ceil(session.all_reduce_max(want)), 1.0, 20000.0));
    std::atomic<bool> stop{false};
    std::vector<double> overlapped;
    session.barrier("calibrate interference start");
    std::thread worker([&] {
      while (!stop.load()) {
        const double t = gemm(static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k),
                              static_cast<int>(g.batch));
        if (!stop.load()) overlapped.push_back(t);  // only GEMMs that ran entirely overlapped
      }
    });
    try {
      for (int i = 0; i < iters; ++i)
        run_phases(comm, phases, send.data(), s, recv.data(), s, 31200);
    } catch (...) {
      stop = true;
      worker.join();
      throw;
    }
    stop = true;
    worker.join();
    const double concurrent = overlapped.empty() ? alone : median(overlapped);
    run.gemm_alone_s = rank_median(session, alone);
    run.gemm_concurrent_s = rank_median(session, concurrent);
    const double f = run.gemm_alone_s > 0 ? run.gemm_concurrent_s / run.gemm_alone_s - 1.0 : 0.0;
    cal.interference = std::max(0.0, f);
    cal.comments.push_back(fmt::format(
        "interference: GEMM {}x{}x{} alone {:.4g} us, during {} linear all_to_all of {} B "
        "{:.4g} us (medians over ranks).",
        g.m, g.n, g.k, run.gemm_alone_s * 1e6, iters, s, run.gemm_concurrent_s * 1e6));
    if (device == "host-cpu")
      cal.comments.push_back(
          "Host path: this is CPU contention between the GEMM thread and MPI progress, not GPU "
          "SM/HBM sharing; recalibrate on the GPU path for a GPU figure.");
  }
}

}  // namespace

CalibrationRun run_calibration(const Scenario& sc, const topology::Topology& topo,
                               MpiSession& session, Communicator& comm, const GemmTimer& gemm,
                               const std::string& device, const CalibrateOptions& options) {
  CalibrateOptions opt = options;
  if (opt.repeats <= 0) opt.repeats = opt.quick ? 3 : 7;
  if (opt.max_bytes == 0) opt.max_bytes = opt.quick ? (64u << 10) : (16u << 20);
  const int w = comm.size();
  CalibrationRun run;
  Calibration& cal = run.calibration;
  cal.gpu = sc.cluster.gpu.name;
  cal.device = device;
  cal.backend = std::string(comm.name());
  cal.dtype = opt.gemm_dtype;
  cal.ranks = w;
  cal.nodes = topo.num_nodes();
  cal.gpus_per_node = topo.gpus_per_node();
  cal.comments.push_back(
      fmt::format("Written by `moesim calibrate{}` on {} rank(s) ({} x {}), scenario '{}'.",
                  opt.quick ? " --quick" : "", w, topo.num_nodes(), topo.gpus_per_node(), sc.name));
  cal.comments.push_back(fmt::format(
      "GEMMs: {} ({}), median of {} repeats per rank, median over ranks; collectives: {}, "
      "median over {} repeats of the slowest rank.",
      device, opt.gemm_dtype, opt.repeats, cal.backend, opt.repeats));

  calibrate_gemms(sc, session, gemm, opt, run);
  calibrate_collectives(sc, topo, session, comm, opt, run);
  calibrate_interference(topo, session, comm, gemm, device, opt, run);
  return run;
}

}  // namespace moesim::exec
