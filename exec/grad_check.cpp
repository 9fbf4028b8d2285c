#include "exec/grad_check.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.hpp"
#include "exec/mpi_communicator.hpp"

namespace moesim::exec {

namespace {

const std::vector<int>* my_group(const Plan& plan, const Op& op, int rank) {
  const Grouping& g = plan.grouping(op.collective().grouping);
  for (const auto& members : g.groups)
    if (std::find(members.begin(), members.end(), rank) != members.end()) return &members;
  return nullptr;
}

}  // namespace

LayerBackwardPlan layer_backward_plan(const Plan& plan, int block, int rank) {
  LayerBackwardPlan bp;
  bp.ep_group = {rank};
  std::set<int> parts;
  for (const Op& op : plan.ops()) {
    if (op.role.block != block) continue;
    if (op.role.backward && op.role.kind == OpRoleKind::kDecode && op.ranks.contains(rank))
      ++bp.passes;
    if (op.kind != OpKind::kCollective) continue;
    if (op.role.kind == OpRoleKind::kDispatch && !op.role.backward && op.role.chunk == 0) {
      if (const auto* g = my_group(plan, op, rank)) bp.ep_group = *g;
    } else if (op.role.kind == OpRoleKind::kExpertGradSync) {
      if (const auto* g = my_group(plan, op, rank)) {
        parts.insert(op.role.chunk);
        bp.dp_group = *g;
      }
    } else if (op.role.kind == OpRoleKind::kExpertMpGradSync) {
      if (const auto* g = my_group(plan, op, rank)) bp.mp_group = *g;
    }
  }
  bp.sync_parts = static_cast<int>(parts.size());  // Lina's micro-ops, once per step
  return bp;
}

GradCheck check_backward_layer(Communicator& comm, const MpiSession& session,
                               const LayerGradients& lg, const MoeShape& s, std::uint64_t seed,
                               int iteration, int key_rank, double tol) {
  const int M = s.model_dim, H = s.hidden_dim, dE = lg.local_experts;
  const LayerBackwardPlan& bp = *lg.plan;
  const double passes = std::max(1, bp.passes);
  GradCheck chk;
  chk.iteration = iteration;
  chk.layer = lg.moe;
  long long compared = 0, wrong = 0;
  double max_err = 0;
  auto compare = [&](const float* got, std::size_t got_n, const double* ref, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const double err = std::fabs((got_n == n ? got[i] : NAN) - ref[i]);
      if (!(err <= tol * (1.0 + std::fabs(ref[i])))) ++wrong;
      if (err > max_err || std::isnan(err)) max_err = std::isnan(err) ? INFINITY : err;
    }
    compared += static_cast<long long>(n);
  };
  std::vector<GradUnit> own_tokens;
  if (lg.units.empty()) {  // the rank's own S tokens
    GradUnit u;
    u.tokens = make_tokens(s, seed, iteration, lg.moe, key_rank);
    u.dy = make_grad_output(s, seed, iteration, lg.moe, key_rank);
    u.rows = s.tokens;
    u.dx_rows = s.tokens;
    own_tokens.push_back(std::move(u));
  }
  const std::vector<GradUnit>& units = lg.units.empty() ? own_tokens : lg.units;
  const bool dp_summed = !bp.dp_group.empty();
  std::vector<float> sum(2 * static_cast<size_t>(M) * H);
  const std::size_t per = static_cast<size_t>(M) * H;
  // The owned hidden units [h0, h0 + cols) of each owned expert: dW1's columns, dW2's rows.
  const int h0 = lg.hidden_first, cols = lg.hidden_cols > 0 ? lg.hidden_cols : H;
  MOESIM_ASSERT(h0 >= 0 && h0 + cols <= H, "gradient check: hidden units out of range");
  const std::size_t own = static_cast<size_t>(M) * static_cast<size_t>(cols);
  const std::vector<float>& dw = *lg.dw;
  MOESIM_ASSERT(dw.size() == 2 * own * static_cast<std::size_t>(dE),
                "gradient check: dW is not [dW1 | dW2] of the owned experts");
  std::vector<double> r1(own), r2(own);
  auto on_expert = [&](int e, const std::vector<double>& dw1, const std::vector<double>& dw2) {
    // Every rank's contribution to expert e, summed over its EP group (x the MP copies and
    // the DP replicas): the expected gradient on e's owner(s). One all-reduce per expert, so
    // only one expert's M x H x 2 values live at a time.
    for (size_t i = 0; i < per; ++i) {
      sum[i] = static_cast<float>(dw1[i] * lg.dw_share);
      sum[per + i] = static_cast<float>(dw2[i] * lg.dw_share);
    }
    comm.all_reduce_sum(sum.data(), sum.size(), bp.ep_group);
    if (!bp.mp_group.empty()) comm.all_reduce_sum(sum.data(), sum.size(), bp.mp_group);
    if (dp_summed) comm.all_reduce_sum(sum.data(), sum.size(), bp.dp_group);
    const int le = e - lg.expert_first;
    if (le < 0 || le >= dE) return;
    // Every micro-batch of the step runs the same tokens: the accumulated gradient is
    // passes x one pass's.
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < cols; ++c) {
        const auto at = static_cast<std::size_t>(m) * static_cast<std::size_t>(cols) +
                        static_cast<std::size_t>(c);
        r1[at] = passes * sum[static_cast<std::size_t>(m) * H + static_cast<std::size_t>(h0 + c)];
        r2[static_cast<std::size_t>(c) * M + static_cast<std::size_t>(m)] =
            passes * sum[per + static_cast<std::size_t>(h0 + c) * M + static_cast<std::size_t>(m)];
      }
    compare(dw.data() + static_cast<std::size_t>(le) * own, own, r1.data(), own);
    compare(dw.data() + (static_cast<std::size_t>(dE) + le) * own, own, r2.data(), own);
  };
  // Exactly one unit is this rank's (its gate's and experts' contributions; the per-expert
  // collectives run once on every rank); the others give their dX rows only.
  std::vector<double> dx, dgate_w;
  int owned = 0;
  for (const GradUnit& u : units) {
    MoeShape us = s;
    us.tokens = u.rows;
    const ReferenceGrads ref =
        u.own ? reference_backward_seeded(us, u.tokens, seed, lg.moe, lg.capacity, u.dy, on_expert,
                                          lg.routed_expert)
              : reference_backward_seeded(us, u.tokens, seed, lg.moe, lg.capacity, u.dy,
                                          [](int, const auto&, const auto&) {});
    if (u.own) {
      ++owned;
      dgate_w = ref.dgate_w;
    }
    const auto first = ref.dx.begin() + static_cast<std::ptrdiff_t>(u.dx_first) * M;
    dx.insert(dx.end(), first, first + static_cast<std::ptrdiff_t>(u.dx_rows) * M);
  }
  MOESIM_ASSERT(owned == 1, "gradient check: one routing unit is the rank's own");
  compare(lg.dx->data(), lg.dx->size(), dx.data(), dx.size());
  std::vector<double> dgate(dgate_w.begin(), dgate_w.end());
  for (double& v : dgate) v *= passes;
  if (lg.gate_on_targets) {
    // Both sides summed over the EP group (each rank's reference rounded once to float).
    std::vector<float> got(*lg.dgate_w), want(dgate.begin(), dgate.end());
    comm.all_reduce_sum(got.data(), got.size(), bp.ep_group);
    comm.all_reduce_sum(want.data(), want.size(), bp.ep_group);
    const std::vector<double> total(want.begin(), want.end());
    compare(got.data(), got.size(), total.data(), total.size());
  } else {
    compare(lg.dgate_w->data(), lg.dgate_w->size(), dgate.data(), dgate.size());
  }
  chk.compared = session.all_reduce_sum(compared);
  chk.wrong = session.all_reduce_sum(wrong);
  chk.max_abs_error = session.all_reduce_max(max_err);
  return chk;
}

GradCheck idle_backward_check(const MpiSession& session, int iteration, int layer) {
  GradCheck chk;
  chk.iteration = iteration;
  chk.layer = layer;
  chk.compared = session.all_reduce_sum(0LL);  // check_backward_layer's three, in its order
  chk.wrong = session.all_reduce_sum(0LL);
  chk.max_abs_error = session.all_reduce_max(0.0);
  return chk;
}

}  // namespace moesim::exec
