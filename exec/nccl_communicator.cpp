#include "exec/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "exec/device_binding.hpp"
#include "exec/mpi_communicator.hpp"

namespace moesim::exec {

namespace {

void cuda_check(cudaError_t rc, const char* what, const char* /*file*/, int /*line*/) {
  if (rc != cudaSuccess)
    throw ExecError(fmt::format("{} failed: {}", what, cudaGetErrorString(rc)));
}
void nccl_check(ncclResult_t rc, const char* what, const char* /*file*/, int /*line*/) {
  if (rc != ncclSuccess)
    throw ExecError(fmt::format("{} failed: {}", what, ncclGetErrorString(rc)));
}
#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) nccl_check((call), #call, __FILE__, __LINE__)

// ncclGroupStart() ... ncclGroupEnd() that cannot stay open: a send or receive that throws inside
// the group still closes it on the way out (NCCL's group state is per thread, so an open group
// would swallow every later call of this rank). end() reports the group's own error.
class NcclGroup {
 public:
  NcclGroup() { NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();  // unwinding: the first error is the one reported
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  void end() {
    open_ = false;
    NCCL_CHECK(ncclGroupEnd());
  }

 private:
  bool open_ = true;
};

ncclDataType_t nccl_type(kernels::DType d) {
  switch (d) {
    case kernels::DType::kF32:
      return ncclFloat32;
    case kernels::DType::kF16:
      return ncclFloat16;
    case kernels::DType::kBF16:
      return ncclBfloat16;
  }
  return ncclFloat32;
}

}  // namespace

struct NcclCommunicator::Impl {
  int device = 0;
  ncclComm_t comm = nullptr;  // the world communicator (host-buffer mode, barrier, splits)
  cudaStream_t stream = nullptr;
  std::byte* dev = nullptr;
  std::size_t dev_bytes = 0;
  std::vector<ncclComm_t> channels;  // device mode: one world communicator per channel
  // device mode: (grouping's groups, channel) -> this rank's group communicator (null outside).
  std::map<std::pair<std::vector<std::vector<int>>, int>, ncclComm_t> groups;

  ncclComm_t group_comm(const Grouping& g, int channel) const {
    auto it = groups.find({g.groups, channel});
    if (it == groups.end() || it->second == nullptr)
      throw ExecError(
          fmt::format("no NCCL communicator for grouping '{}' on channel {} (call "
                      "prepare_group first; is this rank a member?)",
                      g.name, channel));
    return it->second;
  }

  // Aborts every communicator (after an error or a timeout nothing on them can complete).
  void abort_all() {
    for (auto& [key, c] : groups)
      if (c) {
        ncclCommAbort(c);
        c = nullptr;
      }
    for (auto& c : channels)
      if (c) {
        ncclCommAbort(c);
        c = nullptr;
      }
    if (comm) {
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  std::byte* device_buffer(std::size_t bytes) {
    if (bytes > dev_bytes) {
      if (dev) CUDA_CHECK(cudaFree(dev));
      dev = nullptr;
      CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), bytes));
      dev_bytes = bytes;
    }
    return dev;
  }

  // Polls the stream; on timeout or an asynchronous NCCL error aborts the communicator.
  void wait(const std::string& what) {
    const double limit = exec_timeout_s();
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (async != ncclSuccess || waited > limit) {
        abort_all();
        throw ExecError(
            async != ncclSuccess
                ? fmt::format("NCCL error during {}: {}", what, ncclGetErrorString(async))
                : fmt::format("timed out after {:.0f} s waiting for {}", waited, what));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
};

NcclCommunicator::NcclCommunicator(const MpiSession& session) : impl_(std::make_unique<Impl>()) {
  rank_ = session.rank();
  size_ = session.size();
  // One GPU per rank, bound as exec/device_binding.hpp says (local rank modulo the devices the
  // rank sees). Every rank learns the verdicts (collectives), so all ranks throw the same
  // InputError and rank 0 reports it once (exit 2) instead of some ranks failing alone and the
  // others timing out in the NCCL bootstrap.
  int devices = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&devices);
  if (count_err != cudaSuccess) devices = 0;
  const long long blind_ranks = session.all_reduce_sum(devices < 1 ? 1 : 0);
  if (blind_ranks > 0) {
    throw InputError(fmt::format(
        "--backend nccl needs one CUDA device per rank: {} rank(s) see no CUDA device{}; run "
        "where every rank sees a GPU, or use --backend mpi (the host path)",
        blind_ranks,
        count_err != cudaSuccess && session.rank() == 0
            ? fmt::format(" (rank 0: cudaGetDeviceCount: {})", cudaGetErrorString(count_err))
            : ""));
  }
  impl_->device = device_for_local_rank(session.local_rank(), devices);
  CUDA_CHECK(cudaSetDevice(impl_->device));
  // Two ranks on one GPU (a host showing fewer GPUs than it runs ranks, with no per-rank masks):
  // found by comparing host and PCI bus id, before NCCL would refuse them in its bootstrap.
  char bus_id[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), impl_->device));
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "rank-%d", rank_);
  const std::vector<double> ids = session.all_gather_doubles({device_identity(host, bus_id)});
  if (const auto shared = ranks_sharing_a_device(ids)) {
    const int most_ranks = static_cast<int>(session.all_reduce_max(session.local_size()));
    const int fewest = static_cast<int>(-session.all_reduce_max(-static_cast<double>(devices)));
    throw InputError(fmt::format(
        "--backend nccl needs one CUDA device per rank: ranks {} and {} would share one GPU (a "
        "host shows fewer CUDA devices than it runs ranks: fewest devices a rank sees: {}, most "
        "ranks on a host: {}); start at most as many ranks per node as it has GPUs, give each "
        "rank its own GPU (e.g. Slurm --gpus-per-task=1), or use --backend mpi (the host path)",
        shared->first, shared->second, fewest, most_ranks));
  }
  ncclUniqueId id;
  if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "NCCL unique id broadcast");
  CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  {
    // NCCL's bootstrap waits inside the library for every rank: bounded by a watchdog.
    BlockingCallWatchdog guard("the NCCL bootstrap (ncclCommInitRank)", rank_);
    NCCL_CHECK(ncclCommInitRank(&impl_->comm, size_, id, rank_));
  }
}

NcclCommunicator::~NcclCommunicator() {
  for (auto& [key, c] : impl_->groups)
    if (c) ncclCommDestroy(c);
  for (auto c : impl_->channels)
    if (c) ncclCommDestroy(c);
  if (impl_->comm) ncclCommDestroy(impl_->comm);
  if (impl_->dev) cudaFree(impl_->dev);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void NcclCommunicator::exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                                int tag) {
  // One device buffer holds every outgoing then every incoming message of the phase.
  std::size_t total = 0;
  for (const auto& s : sends) total += s.bytes;
  std::size_t send_total = total;
  for (const auto& r : recvs) total += r.bytes;
  std::byte* dev = impl_->device_buffer(std::max<std::size_t>(total, 1));
  std::size_t off = 0;
  for (const auto& s : sends) {
    CUDA_CHECK(cudaMemcpyAsync(dev + off, s.data, s.bytes, cudaMemcpyHostToDevice, impl_->stream));
    off += s.bytes;
  }
  NcclGroup group;
  off = 0;
  for (const auto& s : sends) {
    NCCL_CHECK(ncclSend(dev + off, s.bytes, ncclChar, s.peer, impl_->comm, impl_->stream));
    off += s.bytes;
  }
  for (const auto& r : recvs) {
    NCCL_CHECK(ncclRecv(dev + off, r.bytes, ncclChar, r.peer, impl_->comm, impl_->stream));
    off += r.bytes;
  }
  group.end();
  off = send_total;
  for (const auto& r : recvs) {
    CUDA_CHECK(cudaMemcpyAsync(r.data, dev + off, r.bytes, cudaMemcpyDeviceToHost, impl_->stream));
    off += r.bytes;
  }
  impl_->wait(fmt::format("grouped send/recv (tag {}) on rank {}", tag, rank_));
}

void NcclCommunicator::all_to_allv(const std::byte* send, std::span<const std::size_t> send_counts,
                                   std::span<const std::size_t> send_displs, std::byte* recv,
                                   std::span<const std::size_t> recv_counts,
                                   std::span<const std::size_t> recv_displs,
                                   std::span<const int> group) {
  std::vector<SendSpec> s;
  std::vector<RecvSpec> r;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] == rank_) {
      std::memcpy(recv + recv_displs[i], send + send_displs[i], send_counts[i]);
      continue;
    }
    if (send_counts[i] > 0) s.push_back({group[i], send + send_displs[i], send_counts[i]});
    if (recv_counts[i] > 0) r.push_back({group[i], recv + recv_displs[i], recv_counts[i]});
  }
  exchange(s, r, 0);
}

void NcclCommunicator::all_gather(const std::byte* in, std::size_t bytes, std::byte* out,
                                  std::span<const int> group) {
  std::vector<SendSpec> s;
  std::vector<RecvSpec> r;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] == rank_) {
      std::memcpy(out + i * bytes, in, bytes);
      continue;
    }
    s.push_back({group[i], in, bytes});
    r.push_back({group[i], out + i * bytes, bytes});
  }
  exchange(s, r, 0);
}

void NcclCommunicator::all_reduce_sum(float* data, std::size_t count, std::span<const int> group) {
  // Gather every member's buffer, then sum in group order (same order on every member, so every
  // member ends with bitwise the same result).
  std::vector<float> all(count * group.size());
  all_gather(reinterpret_cast<const std::byte*>(data), count * sizeof(float),
             reinterpret_cast<std::byte*>(all.data()), group);
  for (std::size_t j = 0; j < count; ++j) {
    float acc = 0;
    for (size_t i = 0; i < group.size(); ++i) acc += all[i * count + j];
    data[j] = acc;
  }
}

void NcclCommunicator::reduce_scatter_sum(const float* in, float* out, std::size_t count,
                                          std::span<const int> group) {
  // Block i of every member goes to member i, which sums the blocks in group order.
  std::vector<float> blocks(count * group.size());
  std::vector<SendSpec> s;
  std::vector<RecvSpec> r;
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] == rank_) {
      const size_t me = i;
      std::memcpy(&blocks[me * count], in + me * count, count * sizeof(float));
      continue;
    }
    s.push_back(
        {group[i], reinterpret_cast<const std::byte*>(in + i * count), count * sizeof(float)});
    r.push_back(
        {group[i], reinterpret_cast<std::byte*>(&blocks[i * count]), count * sizeof(float)});
  }
  exchange(s, r, 0);
  for (std::size_t j = 0; j < count; ++j) {
    float acc = 0;
    for (size_t i = 0; i < group.size(); ++i) acc += blocks[i * count + j];
    out[j] = acc;
  }
}

void NcclCommunicator::barrier() {
  float one = 1.0f;
  std::byte* dev = impl_->device_buffer(sizeof(float));
  CUDA_CHECK(cudaMemcpyAsync(dev, &one, sizeof(float), cudaMemcpyHostToDevice, impl_->stream));
  NCCL_CHECK(ncclAllReduce(dev, dev, 1, ncclFloat, ncclSum, impl_->comm, impl_->stream));
  impl_->wait("NCCL barrier");
}

// --- Device-buffer mode
// ----------------------------------------------------------------------------

int NcclCommunicator::device() const { return impl_->device; }

void NcclCommunicator::prepare_channels(int channels) {
  while (static_cast<int>(impl_->channels.size()) < channels) {
    ncclComm_t c = nullptr;
    {
      BlockingCallWatchdog guard("ncclCommSplit (a per-stream communicator)", rank_);
      NCCL_CHECK(ncclCommSplit(impl_->comm, 0, rank_, &c, nullptr));
    }
    impl_->channels.push_back(c);
  }
}

void NcclCommunicator::prepare_group(const Grouping& g, int channel) {
  auto key = std::make_pair(g.groups, channel);
  if (impl_->groups.count(key)) return;
  int color = NCCL_SPLIT_NOCOLOR, position = 0;
  for (size_t gi = 0; gi < g.groups.size(); ++gi) {
    auto it = std::find(g.groups[gi].begin(), g.groups[gi].end(), rank_);
    if (it == g.groups[gi].end()) continue;
    color = static_cast<int>(gi);
    position = static_cast<int>(it - g.groups[gi].begin());
  }
  ncclComm_t c = nullptr;
  {
    BlockingCallWatchdog guard("ncclCommSplit (a group communicator)", rank_);
    NCCL_CHECK(ncclCommSplit(impl_->comm, color, position, &c, nullptr));
  }
  impl_->groups.emplace(std::move(key), c);
}

namespace {
// The sends and receives of one set, on `c` and `stream`, inside the caller's group.
void post_exchange(ncclComm_t c, cudaStream_t stream, std::span<const SendSpec> sends,
                   std::span<const RecvSpec> recvs) {
  for (const auto& snd : sends)
    if (snd.bytes > 0) NCCL_CHECK(ncclSend(snd.data, snd.bytes, ncclChar, snd.peer, c, stream));
  for (const auto& r : recvs)
    if (r.bytes > 0) NCCL_CHECK(ncclRecv(r.data, r.bytes, ncclChar, r.peer, c, stream));
}
}  // namespace

void NcclCommunicator::exchange_on(int channel, Stream stream, std::span<const SendSpec> sends,
                                   std::span<const RecvSpec> recvs) {
  if (channel < 0 || channel >= static_cast<int>(impl_->channels.size()))
    throw ExecError(fmt::format("NCCL channel {} not prepared", channel));
  NcclGroup group;
  post_exchange(impl_->channels[channel], stream, sends, recvs);
  group.end();
}

void NcclCommunicator::exchange_two_on(int channel, Stream stream, std::span<const SendSpec> sends,
                                       std::span<const RecvSpec> recvs, int channel2,
                                       Stream stream2, std::span<const SendSpec> sends2,
                                       std::span<const RecvSpec> recvs2) {
  for (int ch : {channel, channel2})
    if (ch < 0 || ch >= static_cast<int>(impl_->channels.size()))
      throw ExecError(fmt::format("NCCL channel {} not prepared", ch));
  if (channel == channel2)
    throw ExecError("exchange_two_on: the two sets need channels of their own");
  NcclGroup group;  // one group may mix streams (NCCL user guide, "CUDA stream semantics")
  post_exchange(impl_->channels[channel2], stream2, sends2, recvs2);
  post_exchange(impl_->channels[channel], stream, sends, recvs);
  group.end();
}

void NcclCommunicator::all_reduce_on(const Grouping& g, int channel, Stream stream, void* data,
                                     std::size_t count, kernels::DType dtype) {
  if (count == 0) return;
  NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum,
                           impl_->group_comm(g, channel), stream));
}

void NcclCommunicator::all_gather_on(const Grouping& g, int channel, Stream stream, const void* in,
                                     std::size_t bytes, void* out) {
  if (bytes == 0) return;
  NCCL_CHECK(ncclAllGather(in, out, bytes, ncclChar, impl_->group_comm(g, channel), stream));
}

void NcclCommunicator::reduce_scatter_on(const Grouping& g, int channel, Stream stream,
                                         const void* in, void* out, std::size_t count,
                                         kernels::DType dtype) {
  if (count == 0) return;
  NCCL_CHECK(ncclReduceScatter(in, out, count, nccl_type(dtype), ncclSum,
                               impl_->group_comm(g, channel), stream));
}

void NcclCommunicator::wait_streams(std::span<const Stream> streams, const std::string& what) {
  const double limit = exec_timeout_s();
  const auto t0 = std::chrono::steady_clock::now();
  for (long polls = 0;; ++polls) {
    bool idle = true;
    for (Stream st : streams) {
      const cudaError_t q = cudaStreamQuery(st);
      if (q == cudaErrorNotReady) {
        idle = false;
        break;
      }
      if (q != cudaSuccess) {
        impl_->abort_all();
        CUDA_CHECK(q);
      }
    }
    if (idle) return;
    ncclResult_t async = ncclSuccess;
    std::vector<ncclComm_t> all(impl_->channels);
    for (const auto& [key, c] : impl_->groups)
      if (c) all.push_back(c);
    for (ncclComm_t c : all) {
      if (!c) continue;
      NCCL_CHECK(ncclCommGetAsyncError(c, &async));
      if (async != ncclSuccess) break;
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (async != ncclSuccess || waited > limit) {
      impl_->abort_all();
      throw ExecError(async != ncclSuccess
                          ? fmt::format("NCCL error during {} on rank {}: {}", what, rank_,
                                        ncclGetErrorString(async))
                          : fmt::format("timed out after {:.0f} s waiting for {} on rank {} (a "
                                        "peer died, diverged or is stuck; raise "
                                        "MOESIM_EXEC_TIMEOUT_S if the run is just slow)",
                                        waited, what, rank_));
    }
    // Spin first (short steps finish in microseconds), then yield the CPU.
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace moesim::exec
