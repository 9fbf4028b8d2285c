#include "exec/cuda_executor.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "exec/layer_program.hpp"
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

const std::vector<int>* my_group(const Grouping& g, int me, int* index) {
  for (size_t gi = 0; gi < g.groups.size(); ++gi)
    if (std::find(g.groups[gi].begin(), g.groups[gi].end(), me) != g.groups[gi].end()) {
      *index = static_cast<int>(gi);
      return &g.groups[gi];
    }
  return nullptr;
}

// The device side of one MoE layer: its layer-program record and each buffer's arena offset.
struct DevLayer {
  ProgramLayerRef ref;  // the data path's layout and host buffers
  std::map<BufId, std::size_t> off;
};

// The layer program's backend on the device (exec/layer_program.hpp): the CUDA kernels and cuBLAS
// on the op's stream, the plan's collectives through the shared lowering as NCCL grouped
// send/recv (`lowered`), all-gathers and all-reduces as NCCL's own on the op's group and channel.
// Data buffers are in the run's dtype, the gate's in fp32.
class DeviceLayerOps final : public LayerOps {
 public:
  // The op's lowering on the given buffers; phase_count >= 0: phases [first, first + count) only.
  using Lowered = std::function<std::int64_t(const Op&, CollectiveSpec, const std::byte*,
                                             std::size_t, std::byte*, std::size_t, int, int)>;
  DeviceLayerOps(kcu::Context& cx, cudaStream_t st, DType dtype, const MoeShape& shape,
                 const DevLayer& L, const Arena& a, NcclCommunicator& comm, const Plan& plan,
                 int channel, const collectives::CostContext& cost, const topology::Topology& topo,
                 Lowered lowered)
      : cx_(cx),
        st_(st),
        dtype_(dtype),
        es_(kernels::dtype_size(dtype)),
        shape_(shape),
        L_(L),
        a_(a),
        comm_(comm),
        plan_(plan),
        channel_(channel),
        cost_(cost),
        topo_(topo),
        lowered_(std::move(lowered)) {}

  void gate(const kernels::GateParams& params) override {
    const kernels::RoutingOut out{
        at<std::int32_t>({LayerBuf::kExpert}), at<std::int32_t>({LayerBuf::kSlot}),
        at<float>({LayerBuf::kWeight}), at<std::int32_t>({LayerBuf::kSlotEntry}),
        at<std::int32_t>({LayerBuf::kCount})};
    // fp32 tokens and gate weights whatever the dtype: routing identical to the reference.
    kcu::gate(cx_, DType::kF32, params, at({LayerBuf::kX32}), at({LayerBuf::kGateW}),
              at<float>({LayerBuf::kLogits}), out);
  }
  void routed_weights(BufId logits, BufId expert, BufId weight, int tokens, int experts,
                      int top_k) override {
    kcu::softmax_pick(cx_, tokens, experts, top_k, at<float>(logits), at<std::int32_t>(expert),
                      at<float>(weight));
  }
  void gather_rows(BufId src, BufId dst, BufId index, int rows, std::size_t row_elems) override {
    kcu::gather_rows(cx_, dtype_, at(src), at<std::int32_t>(index), rows, row_elems, at(dst));
  }
  void sum_rows(BufId src, BufId dst, BufId table, int rows, int terms, std::size_t row_elems,
                bool weighted, BufId weight) override {
    const std::int32_t* t = at<std::int32_t>(table);
    const std::int32_t* src_row = t + rows + 1;
    kcu::sum_rows(cx_, dtype_, at(src), t, src_row, weighted ? at<float>(weight) : nullptr,
                  weighted ? src_row + terms : nullptr, rows, row_elems, at(dst));
  }
  void widen(BufId src, BufId dst, std::size_t elements) override {
    kcu::convert(cx_, dtype_, at(src), DType::kF32, at(dst), elements);
  }
  void encode(BufId dst, int tokens, int num_experts, int capacity) override {
    kcu::encode(cx_, dtype_, routing(tokens, num_experts, capacity), shape_.model_dim,
                at({LayerBuf::kX}), at(dst));
  }
  void decode(BufId src, BufId dst, int tokens, int num_experts, int capacity) override {
    kcu::decode(cx_, dtype_, routing(tokens, num_experts, capacity), shape_.model_dim, at(src),
                at(dst));
  }
  void decode_backward(BufId out, BufId d_out, int tokens, int num_experts, int capacity) override {
    kcu::decode_backward(cx_, dtype_, routing(tokens, num_experts, capacity), shape_.model_dim,
                         at(out), at({LayerBuf::kDY}), at(d_out), at<float>({LayerBuf::kDWeight}));
  }
  void encode_backward(BufId d_slots, int tokens, int num_experts, int capacity) override {
    kcu::encode_backward(cx_, dtype_, routing(tokens, num_experts, capacity), shape_.model_dim,
                         at(d_slots), at({LayerBuf::kDX}));
  }
  void relu_backward(BufId activated, BufId grad, std::size_t elements) override {
    kcu::relu_backward(cx_, dtype_, at(activated), at(grad), elements);
  }
  void softmax_backward(BufId logits, BufId expert, BufId d_weight, BufId d_logits, int tokens,
                        int experts, int top_k) override {
    kcu::softmax_backward(cx_, tokens, experts, top_k, at<float>(logits), at<std::int32_t>(expert),
                          at<float>(d_weight), at<float>(d_logits));
  }
  void narrow(BufId src, BufId dst, std::size_t elements) override {
    kcu::convert(cx_, DType::kF32, at(src), dtype_, at(dst), elements);
  }
  void dot_rows(BufId a, BufId a_row, BufId b, int rows, std::size_t row_elems, BufId out_index,
                BufId out) override {
    kcu::dot_rows(cx_, dtype_, at(a), at<std::int32_t>(a_row), at(b), rows, row_elems,
                  at<std::int32_t>(out_index), at<float>(out));
  }
  void widen_tokens(std::size_t elements) override {
    kcu::convert(cx_, dtype_, at({LayerBuf::kX}), DType::kF32, at({LayerBuf::kX32}), elements);
  }
  void zero(BufId buf, std::size_t elements) override {
    CUDA_OK(cudaMemsetAsync(at(buf), 0, elements * elem_bytes(buf.buf), st_));
  }
  void copy(const BlockCopy& c) override {
    const std::size_t es = elem_bytes(c.src.buf);
    if (c.run == 0 || c.count == 0) return;
    std::byte* dst = at(c.dst) + c.dst_off * es;
    const std::byte* src = at(c.src) + c.src_off * es;
    if (c.accumulate) {
      MOESIM_ASSERT(elem_type(c.src.buf) == ElemType::kData, "summed copy of a non-data buffer");
      kcu::add_rows(cx_, dtype_, src, c.src_pitch, dst, c.dst_pitch, c.run, c.count);
    } else if (c.count == 1) {
      CUDA_OK(cudaMemcpyAsync(dst, src, c.run * es, cudaMemcpyDeviceToDevice, st_));
    } else {
      CUDA_OK(cudaMemcpy2DAsync(dst, c.dst_pitch * es, src, c.src_pitch * es, c.run * es,
                                static_cast<std::size_t>(c.count), cudaMemcpyDeviceToDevice, st_));
    }
  }
  void gemm(const GemmJob& g, bool f32) override {
    const std::size_t es = f32 ? sizeof(float) : es_;
    if (!g.trans_a && !g.trans_b && !g.accumulate) {
      kcu::gemm_strided_batched(cx_, f32 ? DType::kF32 : dtype_, g.m, g.n, g.k,
                                at(g.a) + g.a_off * es, g.a_stride, at(g.b) + g.b_off * es, 0,
                                at(g.c) + g.c_off * es, g.c_stride, g.batch);
      return;
    }
    MOESIM_ASSERT(!g.accumulate || g.batch == 1 || g.c_stride != 0, "accumulating GEMMs share C");
    // A gradient in fp32 (kDW) from operands in the dtype: cuBLAS's mixed-precision GEMM.
    const bool c_f32 = !f32 && elem_type(g.c.buf) == ElemType::kF32;
    kcu::gemm_strided_batched_t(
        cx_, f32 ? DType::kF32 : dtype_, kernels::GemmLayout{g.trans_a, g.trans_b, c_f32}, g.m, g.n,
        g.k, at(g.a) + g.a_off * es, g.a_stride, at(g.b) + g.b_off * es, 0,
        at(g.c) + g.c_off * elem_bytes(g.c.buf), g.c_stride, g.batch, g.accumulate ? 1.0f : 0.0f);
  }
  void relu(BufId buf, std::size_t elements) override {
    kcu::activation(cx_, dtype_, kernels::Activation::kRelu, at(buf), elements);
  }
  void sum_slices(BufId src, BufId dst, int groups, int terms, std::size_t run) override {
    CUDA_OK(cudaMemsetAsync(at(dst), 0, static_cast<std::size_t>(groups) * run * es_, st_));
    for (int q = 0; q < terms; ++q)
      kcu::add_rows(cx_, dtype_, at(src) + static_cast<std::size_t>(q) * run * es_,
                    static_cast<std::size_t>(terms) * run, at(dst), run, run, groups);
  }
  std::int64_t exchange(const Op& op, const Exchange& x) override {
    const CollectiveSpec spec = exchange_spec(plan_, op, x, comm_.rank(), es_);
    if (x.row_elems == 0 || spec.algo == CollectiveAlgo::kDeepep)
      return lowered_(op, spec, at(x.send) + x.send_off * es_, x.send_elems * es_,
                      at(x.recv) + x.recv_off * es_, x.recv_elems * es_, x.first_phase,
                      x.phase_count);
    const Grouping& g = plan_.grouping(spec.grouping);
    int gi = -1;
    const std::vector<int>* group = my_group(g, comm_.rank(), &gi);
    MOESIM_ASSERT(group != nullptr, "row exchange: rank outside the op's groups");
    // 2DH stages forwarded blocks in the receive buffer: give it room in a stream-ordered
    // temporary when the layer's buffer has none (phase_buffer_extent), then keep its head.
    const collectives::CollectiveCall call{&spec, group, gi, true};
    const std::size_t recv_bytes = x.recv_elems * es_;
    const std::size_t need =
        phase_buffer_extent(collectives::select_algorithm(call, cost_).lower(call, topo_),
                            comm_.rank(), collectives::Buffer::kRecv);
    std::byte* recv = at(x.recv) + x.recv_off * es_;
    if (need <= recv_bytes)
      return lowered_(op, spec, at(x.send) + x.send_off * es_, x.send_elems * es_, recv, recv_bytes,
                      0, -1);
    StreamBuffer staged(need, st_);
    const std::int64_t algo = lowered_(op, spec, at(x.send) + x.send_off * es_, x.send_elems * es_,
                                       staged.get(), need, 0, -1);
    if (recv_bytes > 0)
      CUDA_OK(cudaMemcpyAsync(recv, staged.get(), recv_bytes, cudaMemcpyDeviceToDevice, st_));
    return algo;
  }
  std::int64_t all_gather(const Op& op, BufId in, std::size_t elements, BufId out) override {
    comm_.all_gather_on(plan_.grouping(op.collective().grouping), channel_, st_, at(in),
                        elements * elem_bytes(in.buf), at(out));
    return kLibraryAlgo;  // NCCL's own algorithm runs
  }
  std::int64_t reduce_scatter(const Op& op, BufId in, std::size_t elements, BufId out) override {
    comm_.reduce_scatter_on(plan_.grouping(op.collective().grouping), channel_, st_, at(in),
                            at(out), elements, buf_dtype(in.buf));
    return kLibraryAlgo;
  }
  std::int64_t all_reduce(const Op& op, BufId buf, std::size_t offset,
                          std::size_t elements) override {
    comm_.all_reduce_on(plan_.grouping(op.collective().grouping), channel_, st_,
                        at(buf) + offset * elem_bytes(buf.buf), elements, buf_dtype(buf.buf));
    return kLibraryAlgo;
  }

 private:
  std::size_t elem_bytes(LayerBuf b) const {
    return elem_type(b) == ElemType::kData ? es_ : std::size_t{4};
  }
  DType buf_dtype(LayerBuf b) const {
    return elem_type(b) == ElemType::kData ? dtype_ : DType::kF32;
  }
  template <typename T = std::byte>
  T* at(BufId id) const {
    const auto it = L_.off.find(id);
    MOESIM_ASSERT(it != L_.off.end(), fmt::format("device layer buffer {}[{}] not reserved",
                                                  layer_buf_name(id.buf), id.index));
    return a_.at<T>(it->second);
  }
  kernels::Routing routing(int tokens, int num_experts, int capacity) const {
    kernels::Routing r;
    r.num_tokens = tokens;
    r.top_k = shape_.top_k;
    r.num_experts = num_experts;
    r.capacity = capacity;
    r.expert = at<std::int32_t>({LayerBuf::kExpert});
    r.slot = at<std::int32_t>({LayerBuf::kSlot});
    r.weight = at<float>({LayerBuf::kWeight});
    r.slot_entry = at<std::int32_t>({LayerBuf::kSlotEntry});
    return r;
  }

  kcu::Context& cx_;
  cudaStream_t st_;
  DType dtype_;
  std::size_t es_;
  const MoeShape& shape_;
  const DevLayer& L_;
  const Arena& a_;
  NcclCommunicator& comm_;
  const Plan& plan_;
  int channel_;
  const collectives::CostContext& cost_;
  const topology::Topology& topo_;
  Lowered lowered_;
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
  std::size_t es;  // bytes per element of dtype

  std::map<std::string, cudaStream_t> streams;  // per plan stream name, plus "comm2"
  std::map<cudaStream_t, std::unique_ptr<kcu::Context>> contexts;
  std::vector<cudaEvent_t> start_ev, end_ev;
  cudaEvent_t base = nullptr;
  std::vector<Arena> arenas;  // per MoE layer
  std::vector<DevLayer> layers;
  DeviceBlock gemm_block, copy_block;
  std::size_t gemm_a = 0, gemm_b = 0, gemm_c = 0;  // offsets in gemm_block
  std::vector<int> layer_of_op;  // per op of the current plan: its layer's index, or -1

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

  void setup_layers(const std::vector<ProgramLayerRef>& refs);
  void download_outputs();
  void setup_scratch(const Plan& plan);
  void issue(const Plan& plan, const Op& op, cudaStream_t st, int channel,
             std::vector<std::int64_t>& collective_algo);
  void moe_op(const Plan& plan, const Op& op, int layer, cudaStream_t st, int channel,
              std::vector<std::int64_t>& collective_algo);
  void collective(const Plan& plan, const Op& op, cudaStream_t st, int channel,
                  std::vector<std::int64_t>& collective_algo);
  void run_lowered(const Plan& plan, const Op& op, CollectiveSpec spec, cudaStream_t st,
                   int channel, const std::byte* send, std::size_t send_bytes, std::byte* recv,
                   std::size_t recv_bytes, std::vector<std::int64_t>& collective_algo,
                   int first_phase = 0, int phase_count = -1);
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

int checked_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX)
    throw ExecError(fmt::format("{} = {} does not fit cuBLAS's int dimensions", what, v));
  return static_cast<int>(v);
}

}  // namespace

void DevicePath::Impl::setup_layers(const std::vector<ProgramLayerRef>& refs) {
  layers.assign(refs.size(), DevLayer{});
  if (arenas.size() < refs.size()) arenas.resize(refs.size());
  for (size_t li = 0; li < refs.size(); ++li) {
    DevLayer& L = layers[li];
    L.ref = refs[li];
    Arena& a = arenas[li];
    a.reset();
    // The layer program's buffers (layer_buffers: the host path allocates the same list).
    const std::vector<BufferSize> bufs = layer_buffers(*L.ref.lay, shape);
    for (const BufferSize& b : bufs)
      L.off[b.id] =
          a.reserve(b.elements * (elem_type(b.id.buf) == ElemType::kData ? es : sizeof(float)));
    a.commit();
    // Every buffer from the host (inputs loaded by the data path, zeros elsewhere), before the
    // timed step: data buffers converted to the dtype (kX from the fp32 tokens it aliases there).
    for (const BufferSize& b : bufs) {
      std::byte* dst = a.at(L.off.at(b.id));
      if (elem_type(b.id.buf) == ElemType::kI32) {
        const auto& v = L.ref.buf->i(b.id);
        MOESIM_ASSERT(v.size() == b.elements, "host layer buffer size");
        CUDA_OK(cudaMemcpy(dst, v.data(), v.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
        continue;
      }
      const auto& v = L.ref.buf->f(b.id);
      MOESIM_ASSERT(v.size() == b.elements, "host layer buffer size");
      const DType to = elem_type(b.id.buf) == ElemType::kData ? dtype : DType::kF32;
      std::vector<std::byte> host(v.size() * kernels::dtype_size(to));
      kernels::convert(DType::kF32, v.data(), to, host.data(), v.size());
      CUDA_OK(cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice));
    }
  }
}

// After the step: each layer's output rows, routing slots and gate logits back into the data
// path's host buffers (fp32), where the executor and --check read them as on the host path.
void DevicePath::Impl::download_outputs() {
  for (size_t li = 0; li < layers.size(); ++li) {
    const DevLayer& L = layers[li];
    const Arena& a = arenas[li];
    HostLayerBuffers& h = *L.ref.buf;
    const BufId out{L.ref.lay->output_buffer()};
    std::vector<float>& y = h.f(out);
    std::vector<std::byte> raw(y.size() * es);
    CUDA_OK(cudaMemcpy(raw.data(), a.at(L.off.at(out)), raw.size(), cudaMemcpyDeviceToHost));
    kernels::convert(dtype, raw.data(), DType::kF32, y.data(), y.size());
    std::vector<std::int32_t>& slot = h.i({LayerBuf::kSlot});
    CUDA_OK(cudaMemcpy(slot.data(), a.at(L.off.at({LayerBuf::kSlot})),
                       slot.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    std::vector<float>& logits = h.f({LayerBuf::kLogits});
    CUDA_OK(cudaMemcpy(logits.data(), a.at(L.off.at({LayerBuf::kLogits})),
                       logits.size() * sizeof(float), cudaMemcpyDeviceToHost));
    if (!L.ref.lay->backward) continue;
    // The gradients the check compares: dX (fp32, or in the dtype where it moved as the forward's
    // rows did: Parm), dWgate and the experts' owned dW (fp32).
    for (LayerBuf g : {input_grad_buffer(*L.ref.lay), LayerBuf::kDGateW, owned_dw(*L.ref.lay)}) {
      std::vector<float>& v = h.f({g});
      if (elem_type(g) == ElemType::kF32) {
        CUDA_OK(cudaMemcpy(v.data(), a.at(L.off.at({g})), v.size() * sizeof(float),
                           cudaMemcpyDeviceToHost));
        continue;
      }
      std::vector<std::byte> data(v.size() * es);
      CUDA_OK(cudaMemcpy(data.data(), a.at(L.off.at({g})), data.size(), cudaMemcpyDeviceToHost));
      kernels::convert(dtype, data.data(), DType::kF32, v.data(), v.size());
    }
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
    if (layer_of_op[op.id] >= 0) continue;  // the layer program's own buffers
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
                                   std::vector<std::int64_t>& collective_algo, int first_phase,
                                   int phase_count) {
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
  std::vector<collectives::Phase> phases = algo.lower(call, topo);
  if (phase_count >= 0) {  // deepep's two sets, with the layer program's row work between them
    MOESIM_ASSERT(
        first_phase >= 0 && static_cast<std::size_t>(first_phase + phase_count) <= phases.size(),
        "device exchange: phase range out of the lowering");
    phases.erase(phases.begin() + first_phase + phase_count, phases.end());
    phases.erase(phases.begin(), phases.begin() + first_phase);
  }
  run_phases(io, comm.rank(), phases, send, send_bytes, recv, recv_bytes, op.id % 32000,
             algo.algo() == CollectiveAlgo::kSaa ? &saa : nullptr);
}

void DevicePath::Impl::moe_op(const Plan& plan, const Op& op, int layer, cudaStream_t st,
                              int channel, std::vector<std::int64_t>& collective_algo) {
  const DevLayer& L = layers[static_cast<std::size_t>(layer)];
  DeviceLayerOps ops(
      ctx(st), st, dtype, shape, L, arenas[static_cast<std::size_t>(layer)], comm, plan, channel,
      cost, topo,
      [&](const Op& o, CollectiveSpec spec, const std::byte* send, std::size_t send_bytes,
          std::byte* recv, std::size_t recv_bytes, int first_phase, int phase_count) {
        run_lowered(plan, o, std::move(spec), st, channel, send, send_bytes, recv, recv_bytes,
                    collective_algo, first_phase, phase_count);
        return collective_algo[o.id];
      });
  // The layer program (exec/layer_program.hpp), the same steps the host path runs.
  const std::int64_t algo =
      op.role.backward ? run_backward_step(*L.ref.lay, shape, op.role.kind, op.role.chunk, op, ops)
                       : run_forward_step(*L.ref.lay, shape, op.role.kind, op.role.chunk, op, ops);
  if (algo != -1) collective_algo[op.id] = algo;
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
      // (deepep's intra phase sends from the forwarder's rows, which can outnumber its own.)
      const std::size_t send_room =
          std::max(send_bytes,
                   phase_buffer_extent(collectives::select_algorithm(call, cctx).lower(call, topo),
                                       comm.rank(), collectives::Buffer::kSend));
      StreamBuffer send(send_room, st), recv(recv_bytes, st);
      run_lowered(plan, op, s, st, channel, send.get(), send_room, recv.get(), recv_bytes,
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
  if (layer_of_op[op.id] >= 0) {
    moe_op(plan, op, layer_of_op[op.id], st, channel, collective_algo);
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

DeviceStep DevicePath::run(const Plan& plan, const std::vector<ProgramLayerRef>& layers,
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
  // The ops the layer program runs: forward steps of the given layers (by block), and backward
  // steps of those that run their backward there (LayerLayout::backward).
  d.layer_of_op.assign(plan.ops().size(), -1);
  if (d.data_path) {
    std::map<int, int> by_block;
    for (size_t li = 0; li < layers.size(); ++li) by_block[layers[li].block] = static_cast<int>(li);
    for (const Op& op : plan.ops()) {
      const auto it = by_block.find(op.role.block);
      if (it == by_block.end()) continue;
      if (is_forward_step(op) ||
          (is_backward_step(op) && layers[static_cast<std::size_t>(it->second)].lay->backward))
        d.layer_of_op[op.id] = it->second;
    }
    d.setup_layers(layers);
  } else {
    d.layers.clear();  // no outputs this step
  }
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
  d.download_outputs();
  return step;
}

}  // namespace moesim::exec
