#include "exec/host_layer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.hpp"
#include "exec/phase_runner.hpp"
#include "kernels/moe_kernels.hpp"
#include "strategies/collectives/collective.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

namespace kc = kernels::cpu;
constexpr auto kF32 = kernels::DType::kF32;

std::size_t kind_index(LayerBuf b) { return static_cast<std::size_t>(b); }

// This rank's group of `g`: (index, position), or (-1, -1).
std::pair<int, int> my_group(const Grouping& g, int rank) {
  for (size_t gi = 0; gi < g.groups.size(); ++gi)
    for (size_t p = 0; p < g.groups[gi].size(); ++p)
      if (g.groups[gi][p] == rank) return {static_cast<int>(gi), static_cast<int>(p)};
  return {-1, -1};
}

}  // namespace

void HostLayerBuffers::allocate(const LayerLayout& L, const MoeShape& s) {
  for (auto& v : f_) v.clear();
  for (auto& v : i_) v.clear();
  for (const BufferSize& b : layer_buffers(L, s)) {
    if (resolve(b.id.buf) != b.id.buf) continue;  // an alias (kX of kX32, kTokIn32 of kTokIn)
    const std::size_t k = kind_index(b.id.buf), idx = static_cast<std::size_t>(b.id.index);
    if (elem_type(b.id.buf) == ElemType::kI32) {
      if (i_[k].size() <= idx) i_[k].resize(idx + 1);
      i_[k][idx].assign(b.elements, 0);
    } else {
      if (f_[k].size() <= idx) f_[k].resize(idx + 1);
      f_[k][idx].assign(b.elements, 0.0f);
    }
  }
  allocated_ = true;
}

std::vector<float>& HostLayerBuffers::f(BufId id) {
  auto& v = f_[kind_index(resolve(id.buf))];
  MOESIM_ASSERT(static_cast<std::size_t>(id.index) < v.size(),
                fmt::format("layer buffer {}[{}] not allocated", layer_buf_name(id.buf), id.index));
  return v[static_cast<std::size_t>(id.index)];
}
const std::vector<float>& HostLayerBuffers::f(BufId id) const {
  return const_cast<HostLayerBuffers*>(this)->f(id);
}
std::vector<std::int32_t>& HostLayerBuffers::i(BufId id) {
  auto& v = i_[kind_index(id.buf)];
  MOESIM_ASSERT(static_cast<std::size_t>(id.index) < v.size(),
                fmt::format("layer buffer {}[{}] not allocated", layer_buf_name(id.buf), id.index));
  return v[static_cast<std::size_t>(id.index)];
}
const std::vector<std::int32_t>& HostLayerBuffers::i(BufId id) const {
  return const_cast<HostLayerBuffers*>(this)->i(id);
}
const std::vector<std::vector<float>>& HostLayerBuffers::all(LayerBuf b) const {
  return f_[kind_index(resolve(b))];
}

kernels::Routing HostLayerOps::routing(int tokens, int num_experts, int capacity) const {
  kernels::Routing r;
  r.num_tokens = tokens;
  r.top_k = shape_.top_k;
  r.num_experts = num_experts;
  r.capacity = capacity;
  r.expert = b_.i({LayerBuf::kExpert}).data();
  r.slot = b_.i({LayerBuf::kSlot}).data();
  r.weight = b_.f({LayerBuf::kWeight}).data();
  r.slot_entry = b_.i({LayerBuf::kSlotEntry}).data();
  return r;
}

void HostLayerOps::gate(const kernels::GateParams& params) {
  kc::Context ctx;
  const kernels::RoutingOut out{b_.i({LayerBuf::kExpert}).data(), b_.i({LayerBuf::kSlot}).data(),
                                b_.f({LayerBuf::kWeight}).data(),
                                b_.i({LayerBuf::kSlotEntry}).data(),
                                b_.i({LayerBuf::kCount}).data()};
  kc::gate(ctx, kF32, params, b_.f({LayerBuf::kX32}).data(), b_.f({LayerBuf::kGateW}).data(),
           b_.f({LayerBuf::kLogits}).data(), out);
}

void HostLayerOps::routed_weights(BufId logits, BufId expert, BufId weight, int tokens, int experts,
                                  int top_k) {
  const std::size_t entries = static_cast<std::size_t>(tokens) * top_k;
  MOESIM_ASSERT(b_.f(logits).size() >= static_cast<std::size_t>(tokens) * experts &&
                    b_.i(expert).size() >= entries && b_.f(weight).size() >= entries,
                "routed weights out of bounds");
  kc::Context ctx;
  kc::softmax_pick(ctx, tokens, experts, top_k, b_.f(logits).data(), b_.i(expert).data(),
                   b_.f(weight).data());
}

void HostLayerOps::gather_rows(BufId src, BufId dst, BufId index, int rows, std::size_t row_elems) {
  const std::vector<float>& in = b_.f(src);
  std::vector<float>& out = b_.f(dst);
  const std::vector<std::int32_t>& at = b_.i(index);
  MOESIM_ASSERT(rows >= 0 && at.size() >= static_cast<std::size_t>(rows) &&
                    out.size() >= static_cast<std::size_t>(rows) * row_elems,
                fmt::format("row gather {} -> {} out of bounds", layer_buf_name(src.buf),
                            layer_buf_name(dst.buf)));
  for (int i = 0; i < rows; ++i)
    MOESIM_ASSERT(
        static_cast<std::size_t>(at[static_cast<std::size_t>(i)] + 1) * row_elems <= in.size(),
        fmt::format("row gather from {}: row out of bounds", layer_buf_name(src.buf)));
  kc::Context ctx;
  kc::gather_rows(ctx, kF32, in.data(), at.data(), rows, row_elems, out.data());
}

void HostLayerOps::sum_rows(BufId src, BufId dst, BufId table, int rows, int terms,
                            std::size_t row_elems, bool weighted, BufId weight) {
  const std::vector<float>& in = b_.f(src);
  std::vector<float>& out = b_.f(dst);
  const std::vector<std::int32_t>& t = b_.i(table);
  const auto r = static_cast<std::size_t>(rows), n = static_cast<std::size_t>(terms);
  MOESIM_ASSERT(
      rows >= 0 && terms >= 0 && t.size() >= r + 1 + n * (weighted ? 2 : 1) && t[r] == terms &&
          out.size() >= r * row_elems,
      fmt::format("row sum {} -> {} by {}: table or rows out of bounds", layer_buf_name(src.buf),
                  layer_buf_name(dst.buf), layer_buf_name(table.buf)));
  const std::int32_t* src_row = t.data() + r + 1;
  for (std::size_t j = 0; j < n; ++j)
    MOESIM_ASSERT(static_cast<std::size_t>(src_row[j] + 1) * row_elems <= in.size(),
                  fmt::format("row sum from {}: row out of bounds", layer_buf_name(src.buf)));
  const float* w = nullptr;
  const std::int32_t* wi = nullptr;
  if (weighted) {
    w = b_.f(weight).data();
    wi = src_row + n;
    for (std::size_t j = 0; j < n; ++j)
      MOESIM_ASSERT(static_cast<std::size_t>(wi[j]) < b_.f(weight).size(),
                    "row sum: weight out of bounds");
  }
  kc::Context ctx;
  kc::sum_rows(ctx, kF32, in.data(), t.data(), src_row, w, wi, rows, row_elems, out.data());
}

void HostLayerOps::widen(BufId src, BufId dst, std::size_t elements) {
  const std::vector<float>& in = b_.f(src);
  std::vector<float>& out = b_.f(dst);
  MOESIM_ASSERT(elements <= in.size() && elements <= out.size(), "widen out of bounds");
  if (&in != &out) std::copy_n(in.begin(), elements, out.begin());  // aliased on the host path
}

void HostLayerOps::encode(BufId dst, int tokens, int num_experts, int capacity) {
  kc::Context ctx;
  kc::encode(ctx, kF32, routing(tokens, num_experts, capacity), shape_.model_dim,
             b_.f({LayerBuf::kX}).data(), b_.f(dst).data());
}

void HostLayerOps::decode(BufId src, BufId dst, int tokens, int num_experts, int capacity) {
  kc::Context ctx;
  kc::decode(ctx, kF32, routing(tokens, num_experts, capacity), shape_.model_dim, b_.f(src).data(),
             b_.f(dst).data());
}

void HostLayerOps::decode_backward(BufId out, BufId d_out, int tokens, int num_experts,
                                   int capacity) {
  const std::size_t rows = static_cast<std::size_t>(num_experts) * capacity * shape_.model_dim;
  const std::size_t entries = static_cast<std::size_t>(tokens) * shape_.top_k;
  MOESIM_ASSERT(
      b_.f(out).size() >= rows && b_.f(d_out).size() >= rows &&
          b_.f({LayerBuf::kDY}).size() >= static_cast<std::size_t>(tokens) * shape_.model_dim &&
          b_.f({LayerBuf::kDWeight}).size() >= entries &&
          b_.i({LayerBuf::kSlotEntry}).size() >= static_cast<std::size_t>(num_experts) * capacity,
      "decode backward out of bounds");
  kc::Context ctx;
  kc::decode_backward(ctx, kF32, routing(tokens, num_experts, capacity), shape_.model_dim,
                      b_.f(out).data(), b_.f({LayerBuf::kDY}).data(), b_.f(d_out).data(),
                      b_.f({LayerBuf::kDWeight}).data());
}

void HostLayerOps::encode_backward(BufId d_slots, int tokens, int num_experts, int capacity) {
  MOESIM_ASSERT(
      b_.f(d_slots).size() >= static_cast<std::size_t>(num_experts) * capacity * shape_.model_dim &&
          b_.f({LayerBuf::kDX}).size() >= static_cast<std::size_t>(tokens) * shape_.model_dim,
      "encode backward out of bounds");
  kc::Context ctx;
  kc::encode_backward(ctx, kF32, routing(tokens, num_experts, capacity), shape_.model_dim,
                      b_.f(d_slots).data(), b_.f({LayerBuf::kDX}).data());
}

void HostLayerOps::relu_backward(BufId activated, BufId grad, std::size_t elements) {
  const std::vector<float>& a = b_.f(activated);
  std::vector<float>& g = b_.f(grad);
  MOESIM_ASSERT(elements <= a.size() && elements <= g.size(), "relu backward out of bounds");
  kc::Context ctx;
  kc::relu_backward(ctx, kF32, a.data(), g.data(), elements);
}

void HostLayerOps::softmax_backward(BufId logits, BufId expert, BufId d_weight, BufId d_logits,
                                    int tokens, int experts, int top_k) {
  const std::size_t entries = static_cast<std::size_t>(tokens) * top_k;
  const std::size_t n = static_cast<std::size_t>(tokens) * experts;
  MOESIM_ASSERT(b_.f(logits).size() >= n && b_.f(d_logits).size() >= n &&
                    b_.i(expert).size() >= entries && b_.f(d_weight).size() >= entries,
                "softmax backward out of bounds");
  kc::Context ctx;
  kc::softmax_backward(ctx, tokens, experts, top_k, b_.f(logits).data(), b_.i(expert).data(),
                       b_.f(d_weight).data(), b_.f(d_logits).data());
}

void HostLayerOps::narrow(BufId src, BufId dst, std::size_t elements) {
  widen(src, dst, elements);  // one element type on the host path: a copy, or nothing if aliased
}

void HostLayerOps::dot_rows(BufId a, BufId a_row, BufId b, int rows, std::size_t row_elems,
                            BufId out_index, BufId out) {
  const std::vector<float>& x = b_.f(a);
  const std::vector<float>& y = b_.f(b);
  const std::vector<std::int32_t>& xr = b_.i(a_row);
  const std::vector<std::int32_t>& oi = b_.i(out_index);
  std::vector<float>& o = b_.f(out);
  const auto r = static_cast<std::size_t>(rows);
  MOESIM_ASSERT(rows >= 0 && xr.size() >= r && oi.size() >= r && y.size() >= r * row_elems,
                "row dots out of bounds");
  for (std::size_t i = 0; i < r; ++i)
    MOESIM_ASSERT(xr[i] >= 0 && static_cast<std::size_t>(xr[i] + 1) * row_elems <= x.size() &&
                      oi[i] >= 0 && static_cast<std::size_t>(oi[i]) < o.size(),
                  "row dots: row out of bounds");
  kc::Context ctx;
  kc::dot_rows(ctx, kF32, x.data(), xr.data(), y.data(), rows, row_elems, oi.data(), o.data());
}

void HostLayerOps::zero(BufId buf, std::size_t elements) {
  std::vector<float>& v = b_.f(buf);
  MOESIM_ASSERT(elements <= v.size(), "zero out of bounds");
  std::fill_n(v.begin(), elements, 0.0f);
}

void HostLayerOps::expect_plan_elements(const Op& op, std::size_t elements) const {
  if (plan_bytes_per_element_ <= 0) return;
  const double plan = op.collective().bytes.value() / plan_bytes_per_element_;
  MOESIM_ASSERT(
      std::fabs(plan - static_cast<double>(elements)) < 0.5,
      fmt::format("'{}': the data path moves {} elements, the plan {}", op.label, elements, plan));
}

void HostLayerOps::copy(const BlockCopy& c) {
  const std::vector<float>& src = b_.f(c.src);
  std::vector<float>& dst = b_.f(c.dst);
  for (int r = 0; r < c.count; ++r) {
    const std::size_t s = c.src_off + static_cast<std::size_t>(r) * c.src_pitch;
    const std::size_t d = c.dst_off + static_cast<std::size_t>(r) * c.dst_pitch;
    MOESIM_ASSERT(s + c.run <= src.size() && d + c.run <= dst.size(),
                  fmt::format("block copy {} -> {} out of bounds", layer_buf_name(c.src.buf),
                              layer_buf_name(c.dst.buf)));
    if (c.accumulate) {
      kc::Context ctx;
      kc::add_rows(ctx, kF32, &src[s], 0, &dst[d], 0, c.run, 1);
    } else {
      std::memcpy(&dst[d], &src[s], c.run * sizeof(float));
    }
  }
}

void HostLayerOps::gemm(const GemmJob& g, bool /*f32: the host path's data is fp32*/) {
  const std::vector<float>& a = b_.f(g.a);
  const std::vector<float>& w = b_.f(g.b);
  std::vector<float>& c = b_.f(g.c);
  const auto last = [&](long long stride, std::size_t rows_cols) {
    return static_cast<std::size_t>(stride) * static_cast<std::size_t>(g.batch - 1) + rows_cols;
  };
  MOESIM_ASSERT(g.a_off + last(g.a_stride, static_cast<std::size_t>(g.m) * g.k) <= a.size() &&
                    g.b_off + static_cast<std::size_t>(g.k) * g.n <= w.size() &&
                    g.c_off + last(g.c_stride, static_cast<std::size_t>(g.m) * g.n) <= c.size(),
                fmt::format("layer GEMM {} x {} -> {} out of bounds", layer_buf_name(g.a.buf),
                            layer_buf_name(g.b.buf), layer_buf_name(g.c.buf)));
  // Accumulating batch entries into one C would race on the GPU: every entry has its own.
  MOESIM_ASSERT(!g.accumulate || g.batch == 1 || g.c_stride != 0, "accumulating GEMMs share C");
  kc::Context ctx;
  if (!g.trans_a && !g.trans_b && !g.accumulate) {
    kc::gemm_strided_batched(ctx, kF32, g.m, g.n, g.k, a.data() + g.a_off, g.a_stride,
                             w.data() + g.b_off, 0, c.data() + g.c_off, g.c_stride, g.batch);
    return;
  }
  kc::gemm_strided_batched_t(ctx, kF32, kernels::GemmLayout{g.trans_a, g.trans_b}, g.m, g.n, g.k,
                             a.data() + g.a_off, g.a_stride, w.data() + g.b_off, 0,
                             c.data() + g.c_off, g.c_stride, g.batch, g.accumulate ? 1.0f : 0.0f);
}

void HostLayerOps::relu(BufId buf, std::size_t elements) {
  kc::Context ctx;
  std::vector<float>& v = b_.f(buf);
  MOESIM_ASSERT(elements <= v.size(), "relu out of bounds");
  kc::activation(ctx, kF32, kernels::Activation::kRelu, v.data(), elements);
}

void HostLayerOps::sum_slices(BufId src, BufId dst, int groups, int terms, std::size_t run) {
  const std::vector<float>& in = b_.f(src);
  std::vector<float>& out = b_.f(dst);
  MOESIM_ASSERT(static_cast<std::size_t>(groups) * terms * run <= in.size() &&
                    static_cast<std::size_t>(groups) * run <= out.size(),
                "slice sum out of bounds");
  std::fill_n(out.begin(), static_cast<std::size_t>(groups) * run, 0.0f);
  kc::Context ctx;
  for (int q = 0; q < terms; ++q)
    kc::add_rows(ctx, kF32, in.data() + static_cast<std::size_t>(q) * run,
                 static_cast<std::size_t>(terms) * run, out.data(), run, run, groups);
}

std::int64_t HostLayerOps::exchange(const Op& op, const Exchange& x) {
  const CollectiveSpec& spec = op.collective();
  const Grouping& g = plan_.grouping(spec.grouping);
  const auto [gi, pos] = my_group(g, comm_.rank());
  MOESIM_ASSERT(gi >= 0, fmt::format("'{}': this rank is in none of its groups", op.label));
  const bool deepep = spec.algo == CollectiveAlgo::kDeepep;
  if (!deepep && x.row_elems == 0) expect_plan_elements(op, x.send_elems);
  const CollectiveSpec s = exchange_spec(plan_, op, x, comm_.rank(), sizeof(float));
  collectives::CollectiveCall call{&s, &g.groups[gi], gi, true};
  const auto& algo = collectives::select_algorithm(call, cost_);
  std::vector<collectives::Phase> phases = algo.lower(call, topo_);
  if (x.phase_count >= 0) {
    MOESIM_ASSERT(x.first_phase >= 0 &&
                      static_cast<std::size_t>(x.first_phase + x.phase_count) <= phases.size(),
                  fmt::format("'{}': phases {}+{} of {}", op.label, x.first_phase, x.phase_count,
                              phases.size()));
    phases.erase(phases.begin() + x.first_phase + x.phase_count, phases.end());
    phases.erase(phases.begin(), phases.begin() + x.first_phase);
  }
  if (deepep)
    MOESIM_ASSERT(
        phase_buffer_extent(phases, comm_.rank(), collectives::Buffer::kSend) ==
                x.send_elems * sizeof(float) &&
            phase_buffer_extent(phases, comm_.rank(), collectives::Buffer::kRecv) <=
                x.recv_elems * sizeof(float),
        fmt::format("'{}': buffers disagree with the plan's per-node token counts", op.label));
  // SAA (Parm S2's combine) receives the all-to-all all-gathered over its sub-group, and
  // run_phases posts each slice as whole bytes: the per-peer chunk must split evenly.
  const bool saa = algo.algo() == CollectiveAlgo::kSaa;
  const SaaLayout layout(s, static_cast<int>(g.groups[gi].size()),
                         static_cast<double>(x.send_elems * sizeof(float)));
  if (saa) {
    int steps = 0;
    for (const auto& ph : phases) steps += ph.saa_step ? 1 : 0;
    const auto peers = static_cast<std::size_t>(layout.a2a_peers());
    const std::size_t chunk = x.send_elems * sizeof(float) / peers;
    if (steps < 2 || chunk % static_cast<std::size_t>(steps - 1) != 0)
      throw InputError(fmt::format(
          "--check: '{}': SAA cuts the {}-byte chunk per peer into {} slices; choose sizes "
          "it divides",
          op.label, chunk, steps - 1));
  }
  std::vector<float>& send = b_.f(x.send);
  std::vector<float>& recv = b_.f(x.recv);
  MOESIM_ASSERT(
      x.send_off + x.send_elems <= send.size() && x.recv_off + x.recv_elems <= recv.size(),
      fmt::format("'{}': exchange out of its buffers", op.label));
  // 2DH stages forwarded blocks in the receive buffer (phase_buffer_extent): give it room in a
  // temporary when the layer's buffer has none; the result is its first recv_elems.
  const std::size_t need = phase_buffer_extent(phases, comm_.rank(), collectives::Buffer::kRecv);
  const std::size_t recv_bytes = x.recv_elems * sizeof(float);
  std::vector<float> staged;
  float* out = recv.data() + x.recv_off;
  if (need > recv_bytes) {
    staged.assign((need + sizeof(float) - 1) / sizeof(float), 0.0f);
    out = staged.data();
  }
  run_phases(comm_, phases, reinterpret_cast<const std::byte*>(send.data() + x.send_off),
             x.send_elems * sizeof(float), reinterpret_cast<std::byte*>(out),
             std::max(need, recv_bytes), op.id % 32000, saa ? &layout : nullptr);
  if (!staged.empty()) std::copy_n(staged.data(), x.recv_elems, recv.data() + x.recv_off);
  return static_cast<std::int64_t>(algo.algo());
}

std::int64_t HostLayerOps::all_gather(const Op& op, BufId in, std::size_t elements, BufId out) {
  const Grouping& g = plan_.grouping(op.collective().grouping);
  const auto [gi, pos] = my_group(g, comm_.rank());
  MOESIM_ASSERT(gi >= 0, fmt::format("'{}': this rank is in none of its groups", op.label));
  const std::vector<int>& group = g.groups[static_cast<std::size_t>(gi)];
  std::vector<float>& src = b_.f(in);
  std::vector<float>& dst = b_.f(out);
  MOESIM_ASSERT(src.size() >= elements && dst.size() >= elements * group.size(),
                "all_gather out of its buffers");
  expect_plan_elements(op, elements * group.size());  // the plan counts the gathered total
  collectives::CollectiveCall call{&op.collective(), &group, gi, true};
  const auto algo = collectives::select_algorithm(call, cost_).algo();
  comm_.all_gather(reinterpret_cast<const std::byte*>(src.data()), elements * sizeof(float),
                   reinterpret_cast<std::byte*>(dst.data()), group);
  return static_cast<std::int64_t>(algo);
}

std::int64_t HostLayerOps::reduce_scatter(const Op& op, BufId in, std::size_t elements, BufId out) {
  const Grouping& g = plan_.grouping(op.collective().grouping);
  const auto [gi, pos] = my_group(g, comm_.rank());
  MOESIM_ASSERT(gi >= 0, fmt::format("'{}': this rank is in none of its groups", op.label));
  const std::vector<int>& group = g.groups[static_cast<std::size_t>(gi)];
  const std::vector<float>& src = b_.f(in);
  std::vector<float>& dst = b_.f(out);
  MOESIM_ASSERT(src.size() >= elements * group.size() && dst.size() >= elements,
                "reduce_scatter out of its buffers");
  expect_plan_elements(op, elements * group.size());  // the plan counts the gathered input
  collectives::CollectiveCall call{&op.collective(), &group, gi, true};
  const auto algo = collectives::select_algorithm(call, cost_).algo();
  comm_.reduce_scatter_sum(src.data(), dst.data(), elements, group);
  return static_cast<std::int64_t>(algo);
}

std::int64_t HostLayerOps::all_reduce(const Op& op, BufId buf, std::size_t offset,
                                      std::size_t elements) {
  const Grouping& g = plan_.grouping(op.collective().grouping);
  const auto [gi, pos] = my_group(g, comm_.rank());
  MOESIM_ASSERT(gi >= 0, fmt::format("'{}': this rank is in none of its groups", op.label));
  const std::vector<int>& group = g.groups[static_cast<std::size_t>(gi)];
  std::vector<float>& v = b_.f(buf);
  MOESIM_ASSERT(offset + elements <= v.size(), "all_reduce out of its buffer");
  expect_plan_elements(op, elements);
  collectives::CollectiveCall call{&op.collective(), &group, gi, true};
  const auto algo = collectives::select_algorithm(call, cost_).algo();
  comm_.all_reduce_sum(v.data() + offset, elements, group);
  return static_cast<std::int64_t>(algo);
}

}  // namespace moesim::exec
