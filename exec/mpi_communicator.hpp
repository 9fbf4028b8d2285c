// MPI bootstrap and the MPI host communicator (docs/design.md §4.2 host backend).
//
// MpiSession owns MPI_Init/MPI_Finalize for one `moesim exec` run and provides the world-level
// helpers the executor needs whatever the data backend is (timing gathers, broadcasts). Every wait
// polls with MPI_Test* against exec_timeout_s(), so a dead or diverging peer becomes an ExecError
// naming what was awaited instead of a hang; the CLI then calls abort_all(), since a collective
// MPI_Finalize would hang too.
#pragma once

#include <mpi.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "exec/communicator.hpp"

namespace moesim::exec {

/// Throws ExecError with file and line when an MPI call fails.
void mpi_check(int rc, const char* what, const char* file, int line);
#define MPI_CHECK(call) ::moesim::exec::mpi_check((call), #call, __FILE__, __LINE__)

/// Waits for all requests, polling; ExecError after exec_timeout_s() naming `what`.
void wait_all(std::vector<MPI_Request>& requests, const std::string& what);

/// Bounds a blocking call that cannot be polled (NCCL's ncclCommInitRank / ncclCommSplit wait for
/// every peer inside the library): if the guard is still alive after `timeout_s`, `on_timeout`
/// runs on a watchdog thread, by default printing "rank R: timed out after N s in WHAT" and
/// MPI_Abort-ing the job (exit 1), since the blocked thread cannot be interrupted. The destructor
/// (the call returned) disarms it.
class BlockingCallWatchdog {
 public:
  BlockingCallWatchdog(std::string what, int rank, double timeout_s = exec_timeout_s(),
                       std::function<void(const std::string& message)> on_timeout = {});
  ~BlockingCallWatchdog();
  BlockingCallWatchdog(const BlockingCallWatchdog&) = delete;
  BlockingCallWatchdog& operator=(const BlockingCallWatchdog&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

class MpiSession {
 public:
  /// MPI_Init (thread level FUNNELED) unless MPI is already initialised (tests own their init).
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize if this object initialised MPI
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank among the processes of this host (MPI_COMM_TYPE_SHARED): picks the GPU.
  int local_rank() const { return local_rank_; }
  /// Number of processes on this host.
  int local_size() const { return local_size_; }

  /// Barrier over the world, bounded by the timeout.
  void barrier(const std::string& what) const;
  /// Every rank contributes `mine`; all ranks receive the concatenation in rank order.
  std::vector<double> all_gather_doubles(const std::vector<double>& mine) const;
  /// Sum / max of one value over the world.
  double all_reduce_max(double v) const;
  long long all_reduce_sum(long long v) const;
  /// Concatenation of every rank's floats on rank 0 (empty elsewhere).
  std::vector<float> gather_floats(const std::vector<float>& mine) const;
  /// MPI_Abort(MPI_COMM_WORLD, code): ends every rank after a failure on some of them.
  [[noreturn]] static void abort_all(int code);

 private:
  bool owns_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
};

/// The host communicator: point-to-point phases as MPI_Isend/MPI_Irecv on MPI_COMM_WORLD,
/// group collectives as non-blocking MPI collectives on per-group communicators (created on first
/// use by MPI_Comm_create_group, which only the group's members call, and cached).
class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator();
  ~MpiCommunicator() override;

  std::string_view name() const override { return "mpi"; }

  void exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs, int tag) override;
  void all_to_allv(const std::byte* send, std::span<const std::size_t> send_counts,
                   std::span<const std::size_t> send_displs, std::byte* recv,
                   std::span<const std::size_t> recv_counts,
                   std::span<const std::size_t> recv_displs, std::span<const int> group) override;
  void all_reduce_sum(float* data, std::size_t count, std::span<const int> group) override;
  void all_gather(const std::byte* in, std::size_t bytes, std::byte* out,
                  std::span<const int> group) override;
  void reduce_scatter_sum(const float* in, float* out, std::size_t count,
                          std::span<const int> group) override;
  void barrier() override;

 private:
  MPI_Comm group_comm(std::span<const int> group);

  std::map<std::vector<int>, MPI_Comm> comms_;
};

}  // namespace moesim::exec
