#include "exec/cuda_executor.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "exec/nccl_communicator.hpp"
#include "exec/phase_runner.hpp"
#include "strategies/collectives/collective.hpp"
#include "strategies/cost_model.hpp"
#include "strategies/plan_builder.hpp"
#include "topology/topology.hpp"

namespace moesim::exec {

namespace {

namespace kcu = kernels::cuda;
using kernels::DType;

void cuda_check(cudaError_t rc, const char* what, const char* /*file*/, int /*line*/) {
  if (rc != cudaSuccess)
    throw ExecError(fmt::format("{} failed: {}", what, cudaGetErrorString(rc)));
}
#define CUDA_OK(call) cuda_check((call), #call, __FILE__, __LINE__)

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

// One cudaMalloc'd block, grown (never shrunk) between steps.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  DeviceBlock(DeviceBlock&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBlock& operator=(DeviceBlock&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBlock() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  // Only between steps: cudaFree synchronises the device.
  void ensure(std::size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_) CUDA_OK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    CUDA_OK(cudaMalloc(&ptr_, bytes));
    bytes_ = bytes;
  }
  std::byte* get() const { return static_cast<std::byte*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

// Sizes first (reserve), then one allocation (commit): the arena of one MoE layer.
class Arena {
 public:
  void reset() { total_ = 0; }
  std::size_t reserve(std::size_t bytes) {
    const std::size_t off = total_;
    total_ += round_up(std::max<std::size_t>(bytes, 1), 256);
    return off;
  }
  void commit() { block_.ensure(total_); }
  template <typename T = std::byte>
  T* at(std::size_t off) const {
    return reinterpret_cast<T*>(block_.get() + off);
  }

 private:
  std::size_t total_ = 0;
  DeviceBlock block_;
};

// A stream-ordered temporary: allocated and freed on one stream (cudaMallocAsync pool).
struct StreamBuffer {
  cudaStream_t stream = nullptr;
  void* ptr = nullptr;
  StreamBuffer(std::size_t bytes, cudaStream_t s) : stream(s) {
    if (bytes > 0) CUDA_OK(cudaMallocAsync(&ptr, bytes, s));
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer() {
    if (ptr) (void)cudaFreeAsync(ptr, stream);
  }
  std::byte* get() const { return static_cast<std::byte*>(ptr); }
};

// The device side of one MoE layer: offsets into its arena.
struct DevLayer {
  MoeLayerPlan plan;
  std::size_t gate_w = 0, x32 = 0, xd = 0, logits = 0, expert = 0, slot = 0, weight = 0,
              slot_entry = 0, count = 0, dispatched = 0, expert_out = 0, y = 0;
  std::vector<std::size_t> w1, w2;                       // per local expert
  std::vector<std::size_t> send, in, hidden, out, back;  // per chunk
};

}  // namespace

struct DevicePath::Impl {
  const Scenario& sc;
  const topology::Topology& topo;
  collectives::CostContext cost;  // the simulator's selection context (scenario_cost_context)
  NcclCommunicator& comm;
  MoeShape shape;
  DType dtype;
  bool data_path;
  // This step runs the MoE forward on real data: data_path and no plan-routed layer (all_to_allv
  // dispatch, exec/routed_path.hpp: host path only so far; such steps run on scratch buffers and
  // the executor refuses --check for them).
  bool step_data_path = false;
  std::size_t es;  // bytes per element of dtype

  std::map<std::string, cudaStream_t> streams;  // per plan stream name, plus "comm2"
  std::map<cudaStream_t, std::unique_ptr<kcu::Context>> contexts;
  std::vector<cudaEvent_t> start_ev, end_ev;
  cudaEvent_t base = nullptr;
  std::vector<Arena> arenas;  // per MoE layer
  std::vector<DevLayer> layers;
  DeviceBlock gemm_block, copy_block;
  std::size_t gemm_a = 0, gemm_b = 0, gemm_c = 0;  // offsets in gemm_block
  std::vector<MoeOpRef> refs;  // per op of the current plan, parsed before the clock starts

  Impl(const Scenario& s, const topology::Topology& t, NcclCommunicator& c, const MoeShape& sh,
       DType d, bool dp)
      : sc(s),
        topo(t),
        cost(strategies::scenario_cost_context(s, t)),
        comm(c),
        shape(sh),
        dtype(d),
        data_path(dp),
        es(kernels::dtype_size(d)) {
    CUDA_OK(cudaSetDevice(comm.device()));
    // Stream-ordered allocations come back to the pool and stay there (no trim between steps).
    cudaMemPool_t pool;
    CUDA_OK(cudaDeviceGetDefaultMemPool(&pool, comm.device()));
    std::uint64_t keep = UINT64_MAX;
    CUDA_OK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    CUDA_OK(cudaEventCreate(&base));
  }

  ~Impl() {
    // Destructors never throw; a failed step already reported its error.
    for (auto e : start_ev) (void)cudaEventDestroy(e);
    for (auto e : end_ev) (void)cudaEventDestroy(e);
    if (base) (void)cudaEventDestroy(base);
    contexts.clear();
    for (auto& [name, st] : streams) (void)cudaStreamDestroy(st);
  }

  cudaStream_t stream(const std::string& name) {
    auto it = streams.find(name);
    if (it != streams.end()) return it->second;
    cudaStream_t st = nullptr;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    streams.emplace(name, st);
    contexts.emplace(st, std::make_unique<kcu::Context>(comm.device(), st));
    return st;
  }
  kcu::Context& ctx(cudaStream_t st) { return *contexts.at(st); }

  void ensure_events(std::size_t n) {
    while (start_ev.size() < n) {
      cudaEvent_t a = nullptr, b = nullptr;
      CUDA_OK(cudaEventCreate(&a));
      CUDA_OK(cudaEventCreate(&b));
      start_ev.push_back(a);
      end_ev.push_back(b);
    }
  }

  void setup_layers(const std::vector<MoeLayerPlan>& plans, int iteration);
  void setup_scratch(const Plan& plan);
  void issue(const Plan& plan, const Op& op, cudaStream_t st, int channel,
             std::vector<std::int64_t>& collective_algo);
  void moe_op(const Plan& plan, const Op& op, const MoeOpRef& ref, cudaStream_t st, int channel,
              std::vector<std::int64_t>& collective_algo);
  void collective(const Plan& plan, const Op& op, cudaStream_t st, int channel,
                  std::vector<std::int64_t>& collective_algo);
  void run_lowered(const Plan& plan, const Op& op, CollectiveSpec spec, cudaStream_t st,
                   int channel, const std::byte* send, std::size_t send_bytes, std::byte* recv,
                   std::size_t recv_bytes, std::vector<std::int64_t>& collective_algo);
};

namespace {

// Phases on the device: copies and stride copies on the op's stream, transfers as NCCL grouped
// send/recv on the op's channel; SAA's second transfer set on the comm2 stream and channel,
// forked from and joined back into the op's stream with events.
class DevicePhaseIo final : public PhaseIo {
 public:
  DevicePhaseIo(NcclCommunicator& comm, kcu::Context& ctx, int channel, cudaStream_t second,
                int second_channel)
      : comm_(comm),
        ctx_(ctx),
        stream_(ctx.stream()),
        channel_(channel),
        second_(second),
        second_channel_(second_channel) {}
  ~DevicePhaseIo() override {
    if (fork_) (void)cudaEventDestroy(fork_);
    if (join_) (void)cudaEventDestroy(join_);
  }

  std::byte* scratch(std::size_t bytes) override {
    scratch_ = std::make_unique<StreamBuffer>(bytes, stream_);
    return scratch_->get();
  }
  void copy(std::byte* dst, const std::byte* src, std::size_t bytes) override {
    CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void stride_copy(const std::byte* src, std::byte* dst, int h, int w,
                   std::size_t chunk_bytes) override {
    kcu::stride_copy(ctx_, src, dst, h, w, chunk_bytes);
  }
  void exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                std::span<const SendSpec> sends2, std::span<const RecvSpec> recvs2, int) override {
    const bool two = !sends2.empty() || !recvs2.empty();
    if (two) {
      if (!fork_) {
        CUDA_OK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
        CUDA_OK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
      }
      // The second set may start once everything before this phase on the op's stream is done
      // (it forwards what the previous step received). Both sets in one NCCL group: they are
      // in flight together on two communicators.
      CUDA_OK(cudaEventRecord(fork_, stream_));
      CUDA_OK(cudaStreamWaitEvent(second_, fork_, 0));
      comm_.exchange_two_on(channel_, stream_, sends, recvs, second_channel_, second_, sends2,
                            recvs2);
      CUDA_OK(cudaEventRecord(join_, second_));  // after the group: both are enqueued now
      CUDA_OK(cudaStreamWaitEvent(stream_, join_, 0));
      return;
    }
    comm_.exchange_on(channel_, stream_, sends, recvs);
  }

 private:
  NcclCommunicator& comm_;
  kcu::Context& ctx_;
  cudaStream_t stream_;
  int channel_;
  cudaStream_t second_;
  int second_channel_;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  std::unique_ptr<StreamBuffer> scratch_;
};

const std::vector<int>* my_group(const Grouping& g, int me, int* index) {
  for (size_t gi = 0; gi < g.groups.size(); ++gi)
    if (std::find(g.groups[gi].begin(), g.groups[gi].end(), me) != g.groups[gi].end()) {
      *index = static_cast<int>(gi);
      return &g.groups[gi];
    }
  return nullptr;
}

int checked_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw ExecError(fmt::format("{} = {} does not fit cuBLAS's int dimensions", what, v));
  return static_cast<int>(v);
}

}  // namespace

void DevicePath::Impl::setup_layers(const std::vector<MoeLayerPlan>& plans, int iteration) {
  const int S = shape.tokens, M = shape.model_dim, H = shape.hidden_dim, E = shape.experts,
            k = shape.top_k;
  const std::uint64_t seed = sc.workload.routing.seed;
  layers.assign(plans.size(), DevLayer{});
  if (arenas.size() < plans.size()) arenas.resize(plans.size());
  const std::size_t f4 = sizeof(float), i4 = sizeof(std::int32_t);
  for (size_t li = 0; li < plans.size(); ++li) {
    DevLayer& L = layers[li];
    L.plan = plans[li];
    Arena& a = arenas[li];
    a.reset();
    const int W = L.plan.ep, dE = L.plan.local_experts, pos = L.plan.ep_pos;
    const std::size_t C = static_cast<std::size_t>(L.plan.capacity);
    const std::size_t SM = static_cast<std::size_t>(S) * M, Sk = static_cast<std::size_t>(S) * k;
    L.gate_w = a.reserve(static_cast<std::size_t>(M) * E * f4);
    for (int le = 0; le < dE; ++le) {
      L.w1.push_back(a.reserve(static_cast<std::size_t>(M) * H * es));
      L.w2.push_back(a.reserve(static_cast<std::size_t>(H) * M * es));
    }
    L.x32 = a.reserve(SM * f4);
    L.xd = a.reserve(SM * es);
    L.logits = a.reserve(static_cast<std::size_t>(S) * E * f4);
    L.expert = a.reserve(Sk * i4);
    L.slot = a.reserve(Sk * i4);
    L.weight = a.reserve(Sk * f4);
    L.slot_entry = a.reserve(E * C * i4);
    L.count = a.reserve(E * i4);
    L.dispatched = a.reserve(E * C * M * es);
    L.expert_out = a.reserve(E * C * M * es);
    L.y = a.reserve(SM * es);
    for (int c : L.plan.caps) {
      const std::size_t blk = static_cast<std::size_t>(W) * dE * c;  // = E * c rows
      L.send.push_back(a.reserve(blk * M * es));
      L.in.push_back(a.reserve(blk * M * es));
      L.hidden.push_back(a.reserve(blk * H * es));
      L.out.push_back(a.reserve(blk * M * es));
      L.back.push_back(a.reserve(blk * M * es));
    }
    a.commit();
    // Inputs and weights, before the timed step: the data generation is not part of the model.
    auto upload = [&](std::size_t off, const std::vector<float>& v, DType to) {
      std::vector<std::byte> host(v.size() * kernels::dtype_size(to));
      kernels::convert(DType::kF32, v.data(), to, host.data(), v.size());
      CUDA_OK(cudaMemcpy(a.at(off), host.data(), host.size(), cudaMemcpyHostToDevice));
    };
    upload(L.gate_w, make_gate_weights(shape, seed, L.plan.moe), DType::kF32);
    for (int le = 0; le < dE; ++le) {
      upload(L.w1[le], make_w1(shape, seed, L.plan.moe, pos * dE + le), dtype);
      upload(L.w2[le], make_w2(shape, seed, L.plan.moe, pos * dE + le), dtype);
    }
    const auto x = make_tokens(shape, seed, iteration, L.plan.moe, comm.rank());
    upload(L.x32, x, DType::kF32);
    upload(L.xd, x, dtype);
  }
}

void DevicePath::Impl::setup_scratch(const Plan& plan) {
  // GEMM operands of the ops outside the MoE data path: the largest of each operand, zeroed once
  // (values do not change a GEMM's time; zeros keep fp16 / bf16 free of inf and NaN).
  std::size_t a = 0, b = 0, c = 0, copy = 0;
  for (const Op& op : plan.ops()) {
    if (op.kind == OpKind::kCopy)
      copy = std::max(copy, static_cast<std::size_t>(std::ceil(op.copy().bytes.value())));
    if (op.kind != OpKind::kCompute || !op.compute().gemm) continue;
    if (step_data_path && moe_op_ref(op).kind != OpRoleKind::kNone) continue;
    const GemmShape& g = *op.compute().gemm;
    a = std::max(a, static_cast<std::size_t>(g.m * g.k * g.batch) * es);
    b = std::max(b, static_cast<std::size_t>(g.k * g.n * g.batch) * es);
    c = std::max(c, static_cast<std::size_t>(g.m * g.n * g.batch) * es);
  }
  gemm_a = 0;
  gemm_b = round_up(a, 256);
  gemm_c = gemm_b + round_up(b, 256);
  const std::size_t total = gemm_c + round_up(c, 256);
  if (total > gemm_block.bytes()) {
    gemm_block.ensure(total);
    CUDA_OK(cudaMemset(gemm_block.get(), 0, total));
  }
  copy_block.ensure(2 * round_up(copy, 256));
}

void DevicePath::Impl::run_lowered(const Plan& plan, const Op& op, CollectiveSpec spec,
                                   cudaStream_t st, int channel, const std::byte* send,
                                   std::size_t send_bytes, std::byte* recv, std::size_t recv_bytes,
                                   std::vector<std::int64_t>& collective_algo) {
  const Grouping& g = plan.grouping(spec.grouping);
  int gi = -1;
  const std::vector<int>* group = my_group(g, comm.rank(), &gi);
  if (!group) return;
  collectives::CollectiveCall call{&spec, group, gi, true};
  const collectives::CostContext& cctx = cost;
  const auto& algo = collectives::select_algorithm(call, cctx);
  collective_algo[op.id] = static_cast<std::int64_t>(algo.algo());
  const SaaLayout saa(spec, static_cast<int>(group->size()), static_cast<double>(send_bytes));
  DevicePhaseIo io(comm, ctx(st), channel, stream("comm2"),
                   static_cast<int>(plan.stream_names().size()));
  run_phases(io, comm.rank(), algo.lower(call, topo), send, send_bytes, recv, recv_bytes,
             op.id % 32000, algo.algo() == CollectiveAlgo::kSaa ? &saa : nullptr);
}

void DevicePath::Impl::moe_op(const Plan& plan, const Op& op, const MoeOpRef& ref, cudaStream_t st,
                              int channel, std::vector<std::int64_t>& collective_algo) {
  const int moe = sc.model.moe_layer_of_block(ref.block);
  MOESIM_ASSERT(moe >= 0 && moe < static_cast<int>(layers.size()), "MoE layer out of range");
  DevLayer& L = layers[moe];
  const Arena& a = arenas[moe];
  kcu::Context& cx = ctx(st);
  const int S = shape.tokens, M = shape.model_dim, H = shape.hidden_dim, E = shape.experts,
            k = shape.top_k;
  const int W = L.plan.ep, dE = L.plan.local_experts;
  const std::size_t C = static_cast<std::size_t>(L.plan.capacity);
  auto routing = [&] {
    kernels::Routing r;
    r.num_tokens = S;
    r.top_k = k;
    r.num_experts = E;
    r.capacity = L.plan.capacity;
    r.expert = a.at<std::int32_t>(L.expert);
    r.slot = a.at<std::int32_t>(L.slot);
    r.weight = a.at<float>(L.weight);
    r.slot_entry = a.at<std::int32_t>(L.slot_entry);
    return r;
  };
  // Chunk j of the (E, C, M) buffer at `full` <-> the (E, c, M) buffer at `part`: one 2D copy
  // (E rows of c * M elements, pitches C * M and c * M).
  auto chunk_copy = [&](int j, bool to_part, std::byte* full, std::byte* part) {
    const std::size_t c = static_cast<std::size_t>(L.plan.caps[j]);
    const std::size_t row = c * M * es, pitch = C * M * es;
    std::byte* f = full + static_cast<std::size_t>(L.plan.offset[j]) * M * es;
    if (row == 0) return;
    if (to_part)
      CUDA_OK(cudaMemcpy2DAsync(part, row, f, pitch, row, E, cudaMemcpyDeviceToDevice, st));
    else
      CUDA_OK(cudaMemcpy2DAsync(f, pitch, part, row, row, E, cudaMemcpyDeviceToDevice, st));
  };
  switch (ref.kind) {
    case OpRoleKind::kGate: {
      const kernels::GateParams gp = gate_params(shape, S, L.plan.capacity);
      kernels::RoutingOut out{a.at<std::int32_t>(L.expert), a.at<std::int32_t>(L.slot),
                              a.at<float>(L.weight), a.at<std::int32_t>(L.slot_entry),
                              a.at<std::int32_t>(L.count)};
      // fp32 tokens and gate weights whatever the dtype: routing identical to the reference.
      kcu::gate(cx, DType::kF32, gp, a.at(L.x32), a.at(L.gate_w), a.at<float>(L.logits), out);
      return;
    }
    case OpRoleKind::kEncode:
      kcu::encode(cx, dtype, routing(), M, a.at(L.xd), a.at(L.dispatched));
      return;
    case OpRoleKind::kDispatch: {
      const int j = ref.chunk;
      const std::size_t bytes = static_cast<std::size_t>(E) * L.plan.caps[j] * M * es;
      chunk_copy(j, true, a.at(L.dispatched), a.at(L.send[j]));
      CollectiveSpec spec = op.collective();
      spec.bytes = Bytes(static_cast<double>(bytes));
      run_lowered(plan, op, spec, st, channel, a.at(L.send[j]), bytes, a.at(L.in[j]), bytes,
                  collective_algo);
      return;
    }
    case OpRoleKind::kFc1: {
      const int j = ref.chunk, c = L.plan.caps[j];
      if (!L.plan.has_a2a) chunk_copy(j, true, a.at(L.dispatched), a.at(L.in[j]));
      // Block (w, le) of the chunk: source position w's tokens for local expert le; one
      // strided-batched GEMM per local expert over the W source blocks (weights shared).
      const long long blk_x = static_cast<long long>(dE) * c * M;
      const long long blk_h = static_cast<long long>(dE) * c * H;
      for (int le = 0; le < dE; ++le)
        kcu::gemm_strided_batched(
            cx, dtype, c, H, M, a.at(L.in[j]) + static_cast<std::size_t>(le) * c * M * es, blk_x,
            a.at(L.w1[le]), 0, a.at(L.hidden[j]) + static_cast<std::size_t>(le) * c * H * es, blk_h,
            W);
      kcu::activation(cx, dtype, kernels::Activation::kRelu, a.at(L.hidden[j]),
                      static_cast<std::size_t>(W) * dE * c * H);
      return;
    }
    case OpRoleKind::kFc2: {
      const int j = ref.chunk, c = L.plan.caps[j];
      const long long blk_x = static_cast<long long>(dE) * c * M;
      const long long blk_h = static_cast<long long>(dE) * c * H;
      for (int le = 0; le < dE; ++le)
        kcu::gemm_strided_batched(
            cx, dtype, c, M, H, a.at(L.hidden[j]) + static_cast<std::size_t>(le) * c * H * es,
            blk_h, a.at(L.w2[le]), 0, a.at(L.out[j]) + static_cast<std::size_t>(le) * c * M * es,
            blk_x, W);
      if (!L.plan.has_a2a) chunk_copy(j, false, a.at(L.expert_out), a.at(L.out[j]));
      return;
    }
    case OpRoleKind::kCombine: {
      const int j = ref.chunk;
      const std::size_t bytes = static_cast<std::size_t>(E) * L.plan.caps[j] * M * es;
      CollectiveSpec spec = op.collective();
      spec.bytes = Bytes(static_cast<double>(bytes));
      run_lowered(plan, op, spec, st, channel, a.at(L.out[j]), bytes, a.at(L.back[j]), bytes,
                  collective_algo);
      // Received (source position s, dE, c, M) = (E, c, M): expert s * dE + le's outputs.
      chunk_copy(j, false, a.at(L.expert_out), a.at(L.back[j]));
      return;
    }
    case OpRoleKind::kDecode:
      kcu::decode(cx, dtype, routing(), M, a.at(L.expert_out), a.at(L.y));
      return;
    case OpRoleKind::kParamGather:
    case OpRoleKind::kPartialSum:
      // Only sharded-expert plans have these, and the GPU path runs those with scratch buffers
      // (data_path is false, so refs stay kNone): reaching here is a bug.
      MOESIM_ASSERT(false, "sharded-expert op on the GPU data path");
      return;
    default:  // kNone: moe_op_ref / moe_bwd_op_ref list no other kind
      return;
  }
}

void DevicePath::Impl::collective(const Plan& plan, const Op& op, cudaStream_t st, int channel,
                                  std::vector<std::int64_t>& collective_algo) {
  const CollectiveSpec& spec = op.collective();
  const Grouping& g = plan.grouping(spec.grouping);
  int gi = -1;
  const std::vector<int>* group = my_group(g, comm.rank(), &gi);
  if (!group) return;
  const std::size_t W = group->size();
  const std::size_t bytes = static_cast<std::size_t>(std::ceil(spec.bytes.value()));
  CollectiveSpec s = spec;
  collectives::CollectiveCall call{&s, group, gi, true};
  const collectives::CostContext& cctx = cost;
  const int pos =
      static_cast<int>(std::find(group->begin(), group->end(), comm.rank()) - group->begin());
  switch (spec.type) {
    case CollectiveType::kAllToAll:
    case CollectiveType::kSendRecv:
    case CollectiveType::kAllToAllv: {
      const ExchangeSizes sz = exchange_sizes(spec, call.matrix(), W, pos);
      const std::size_t send_bytes = sz.send;
      std::size_t recv_bytes = sz.recv;
      if (spec.type != CollectiveType::kAllToAllv)
        s.bytes = Bytes(static_cast<double>(sz.send));
      else  // a 2DH all_to_allv stages forwarded blocks in the receive buffer (phase_runner.hpp)
        recv_bytes = std::max(
            recv_bytes,
            phase_buffer_extent(collectives::select_algorithm(call, cctx).lower(call, topo),
                                comm.rank(), collectives::Buffer::kRecv));
      // Contents are whatever the pool hands out: collectives move bytes, values do not matter.
      StreamBuffer send(send_bytes, st), recv(recv_bytes, st);
      run_lowered(plan, op, s, st, channel, send.get(), send_bytes, recv.get(), recv_bytes,
                  collective_algo);
      return;
    }
    case CollectiveType::kAllReduce: {
      collective_algo[op.id] = kLibraryAlgo;  // NCCL's own algorithm runs
      const std::size_t count = (bytes + es - 1) / es;
      StreamBuffer buf(count * es, st);
      CUDA_OK(cudaMemsetAsync(buf.get(), 0, count * es, st));  // sums of garbage could be NaN
      comm.all_reduce_on(g, channel, st, buf.get(), count, dtype);
      return;
    }
    case CollectiveType::kAllGather: {
      collective_algo[op.id] = kLibraryAlgo;  // NCCL's own algorithm runs
      const std::size_t block = (bytes + W - 1) / W;
      StreamBuffer in(block, st), out(block * W, st);
      comm.all_gather_on(g, channel, st, in.get(), block, out.get());
      return;
    }
    case CollectiveType::kReduceScatter: {
      collective_algo[op.id] = kLibraryAlgo;  // NCCL's own algorithm runs
      const std::size_t count = ((bytes + es - 1) / es + W - 1) / W;
      StreamBuffer in(count * W * es, st), out(count * es, st);
      CUDA_OK(cudaMemsetAsync(in.get(), 0, count * W * es, st));
      comm.reduce_scatter_on(g, channel, st, in.get(), out.get(), count, dtype);
      return;
    }
  }
}

void DevicePath::Impl::issue(const Plan& plan, const Op& op, cudaStream_t st, int channel,
                             std::vector<std::int64_t>& collective_algo) {
  const MoeOpRef& ref = refs[op.id];
  if (ref.kind != OpRoleKind::kNone) {
    moe_op(plan, op, ref, st, channel, collective_algo);
    return;
  }
  switch (op.kind) {
    case OpKind::kCollective:
      collective(plan, op, st, channel, collective_algo);
      return;
    case OpKind::kCopy: {
      const std::size_t bytes = static_cast<std::size_t>(std::ceil(op.copy().bytes.value()));
      if (bytes > 0)
        CUDA_OK(cudaMemcpyAsync(copy_block.get() + copy_block.bytes() / 2, copy_block.get(), bytes,
                                cudaMemcpyDeviceToDevice, st));
      return;
    }
    case OpKind::kCompute: {
      const ComputeSpec& cs = op.compute();
      if (!cs.gemm) return;  // no kernel for it on this path: an empty op (its event pair)
      const GemmShape& g = *cs.gemm;
      if (g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0) return;
      // Every batch entry reads its own operands (strides = one matrix), as the plan's shape.
      const int m = checked_int(g.m, "gemm m"), n = checked_int(g.n, "gemm n"),
                k = checked_int(g.k, "gemm k"), batch = checked_int(g.batch, "gemm batch");
      kcu::gemm_strided_batched(ctx(st), dtype, m, n, k, gemm_block.get() + gemm_a, g.m * g.k,
                                gemm_block.get() + gemm_b, g.k * g.n, gemm_block.get() + gemm_c,
                                g.m * g.n, batch);
      return;
    }
  }
}

DevicePath::DevicePath(const Scenario& sc, const topology::Topology& topo, NcclCommunicator& comm,
                       const MoeShape& shape, kernels::DType dtype, bool data_path)
    : impl_(std::make_unique<Impl>(sc, topo, comm, shape, dtype, data_path)) {}

DevicePath::~DevicePath() = default;

kernels::DType DevicePath::dtype() const { return impl_->dtype; }

DeviceStep DevicePath::run(const Plan& plan, const std::vector<MoeLayerPlan>& layers, int iteration,
                           std::vector<std::int64_t>& collective_algo,
                           const std::function<void()>& barrier) {
  Impl& d = *impl_;
  const int me = d.comm.rank();
  CUDA_OK(cudaSetDevice(d.comm.device()));
  // Streams and communicators first, in plan order on every rank (collective NCCL calls).
  std::vector<cudaStream_t> by_id;
  for (const std::string& name : plan.stream_names()) by_id.push_back(d.stream(name));
  cudaStream_t second = d.stream("comm2");
  const int channels = static_cast<int>(plan.stream_names().size()) + 1;
  d.comm.prepare_channels(channels);
  for (const Op& op : plan.ops()) {
    if (op.kind != OpKind::kCollective) continue;
    const CollectiveType t = op.collective().type;
    if (t == CollectiveType::kAllReduce || t == CollectiveType::kAllGather ||
        t == CollectiveType::kReduceScatter)
      d.comm.prepare_group(plan.grouping(op.collective().grouping), op.stream);
  }
  d.refs.assign(plan.ops().size(), MoeOpRef{});
  d.step_data_path = d.data_path && std::none_of(layers.begin(), layers.end(),
                                                 [](const MoeLayerPlan& l) { return l.routed; });
  if (d.step_data_path)
    for (const Op& op : plan.ops()) d.refs[op.id] = moe_op_ref(op);
  if (d.step_data_path)
    d.setup_layers(layers, iteration);
  else
    d.layers.clear();  // no outputs this step
  d.setup_scratch(plan);
  d.ensure_events(plan.ops().size());
  CUDA_OK(cudaDeviceSynchronize());  // uploads and allocations done before the clock starts

  const std::vector<OpId> order = priority_issue_order(plan);
  barrier();
  CUDA_OK(cudaEventRecord(d.base, by_id.empty() ? second : by_id[0]));
  std::vector<cudaStream_t> all_streams;
  for (const auto& [name, st] : d.streams) {
    all_streams.push_back(st);
    CUDA_OK(cudaStreamWaitEvent(st, d.base, 0));
  }
  // Lina's gate: a low-priority collective (a gradient micro-op) also waits for every
  // high-priority collective (an all-to-all) issued before it on this rank, so the micro-ops
  // fill the gaps between all-to-alls instead of competing with them for the links.
  std::map<StreamId, OpId> last_high;  // per stream: latest issued priority > 0 collective
  for (OpId id : order) {
    const Op& op = plan.op(id);
    if (!op.ranks.contains(me)) continue;
    cudaStream_t st = by_id.at(static_cast<size_t>(op.stream));
    for (OpId dep : op.deps) {
      const Op& dop = plan.op(dep);
      if (dop.stream != op.stream && dop.ranks.contains(me))
        CUDA_OK(cudaStreamWaitEvent(st, d.end_ev[dep], 0));
    }
    if (op.kind == OpKind::kCollective && op.priority < 0)
      for (const auto& [sid, high] : last_high)
        if (sid != op.stream) CUDA_OK(cudaStreamWaitEvent(st, d.end_ev[high], 0));
    if (op.kind == OpKind::kCollective && op.priority > 0) last_high[op.stream] = id;
    CUDA_OK(cudaEventRecord(d.start_ev[id], st));
    d.issue(plan, op, st, op.stream, collective_algo);
    CUDA_OK(cudaEventRecord(d.end_ev[id], st));
  }
  d.comm.wait_streams(all_streams, fmt::format("the step's {} ops", plan.ops().size()));

  DeviceStep step;
  for (const Op& op : plan.ops()) {
    if (!op.ranks.contains(me)) continue;
    float start_ms = 0, end_ms = 0;
    CUDA_OK(cudaEventElapsedTime(&start_ms, d.base, d.start_ev[op.id]));
    CUDA_OK(cudaEventElapsedTime(&end_ms, d.base, d.end_ev[op.id]));
    step.times.push_back(start_ms * 1e-3);
    step.times.push_back(end_ms * 1e-3);
  }
  for (size_t li = 0; li < d.layers.size(); ++li) {
    const DevLayer& L = d.layers[li];
    const Arena& a = d.arenas[li];
    const std::size_t n = static_cast<std::size_t>(d.shape.tokens) * d.shape.model_dim;
    std::vector<std::byte> raw(n * d.es);
    CUDA_OK(cudaMemcpy(raw.data(), a.at(L.y), raw.size(), cudaMemcpyDeviceToHost));
    std::vector<float> y(n);
    kernels::convert(d.dtype, raw.data(), DType::kF32, y.data(), n);
    std::vector<std::int32_t> slot(static_cast<std::size_t>(d.shape.tokens) * d.shape.top_k);
    CUDA_OK(cudaMemcpy(slot.data(), a.at(L.slot), slot.size() * sizeof(std::int32_t),
                       cudaMemcpyDeviceToHost));
    long long dropped = 0;
    for (auto s : slot) dropped += s < 0 ? 1 : 0;
    std::vector<float> logits(static_cast<std::size_t>(d.shape.tokens) * d.shape.experts);
    CUDA_OK(cudaMemcpy(logits.data(), a.at(L.logits), logits.size() * sizeof(float),
                       cudaMemcpyDeviceToHost));
    step.outputs.push_back(std::move(y));
    step.dropped.push_back(dropped);
    step.logits.push_back(std::move(logits));
  }
  return step;
}

}  // namespace moesim::exec
