#include "exec/mpi_communicator.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace moesim::exec {

double exec_timeout_s() {
  if (const char* v = std::getenv("MOESIM_EXEC_TIMEOUT_S")) {
    char* end = nullptr;
    double t = std::strtod(v, &end);
    if (end != v && t > 0) return t;
  }
  return 120.0;
}

void mpi_check(int rc, const char* what, const char* /*file*/, int /*line*/) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw ExecError(fmt::format("{} failed: {}", what, std::string(msg, len)));
}

void wait_all(std::vector<MPI_Request>& requests, const std::string& what) {
  if (requests.empty()) return;
  const double limit = exec_timeout_s();
  const auto t0 = std::chrono::steady_clock::now();
  // Spin briefly (most host phases complete in microseconds), then back off to 50 us sleeps so
  // oversubscribed ranks (4 ranks on 2 cores in CI) leave the CPU to the peer they wait for.
  for (long spins = 0;; ++spins) {
    int done = 0;
    MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                          MPI_STATUSES_IGNORE));
    if (done) return;
    if (spins > 1000) {
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > limit)
        throw ExecError(fmt::format(
            "timed out after {:.0f} s waiting for {} (a peer rank died, diverged or is stuck; "
            "raise MOESIM_EXEC_TIMEOUT_S if the run is just slow)",
            waited, what));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

namespace {

int checked_int(std::size_t v, const char* what) {
  if (v > static_cast<std::size_t>(INT_MAX))
    throw ExecError(fmt::format("{} of {} bytes exceeds MPI's int count limit", what, v));
  return static_cast<int>(v);
}

std::string group_text(std::span<const int> group) {
  const size_t shown = std::min<size_t>(group.size(), 8);
  return fmt::format("{{{}{}}}", fmt::join(group.begin(), group.begin() + shown, ","),
                     group.size() > shown ? ",..." : "");
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owns_ = true;
  }
  // Errors come back as codes (mpi_check turns them into ExecError) instead of aborting inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm local;
  MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local));
  MPI_Comm_rank(local, &local_rank_);
  MPI_Comm_size(local, &local_size_);
  MPI_Comm_free(&local);
}

MpiSession::~MpiSession() {
  if (owns_) MPI_Finalize();
}

void MpiSession::barrier(const std::string& what) const {
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req[0]));
  wait_all(req, "barrier (" + what + ")");
}

std::vector<double> MpiSession::all_gather_doubles(const std::vector<double>& mine) const {
  std::vector<int> counts(size_), displs(size_);
  int n = checked_int(mine.size(), "timing gather");
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Iallgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "timing counts all-gather");
  long long total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  std::vector<double> all(static_cast<size_t>(total));
  MPI_CHECK(MPI_Iallgatherv(mine.data(), n, MPI_DOUBLE, all.data(), counts.data(), displs.data(),
                            MPI_DOUBLE, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "timing all-gather");
  return all;
}

double MpiSession::all_reduce_max(double v) const {
  double out = 0;
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "max all-reduce");
  return out;
}

long long MpiSession::all_reduce_sum(long long v) const {
  long long out = 0;
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Iallreduce(&v, &out, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "sum all-reduce");
  return out;
}

std::vector<float> MpiSession::gather_floats(const std::vector<float>& mine) const {
  std::vector<int> counts(size_), displs(size_);
  int n = checked_int(mine.size(), "float gather");
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Igather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "output counts gather");
  long long total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = static_cast<int>(total);
    total += counts[r];
  }
  std::vector<float> all(rank_ == 0 ? static_cast<size_t>(total) : 0);
  MPI_CHECK(MPI_Igatherv(mine.data(), n, MPI_FLOAT, all.data(), counts.data(), displs.data(),
                         MPI_FLOAT, 0, MPI_COMM_WORLD, &req[0]));
  wait_all(req, "output gather");
  return all;
}

struct BlockingCallWatchdog::State {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
};

BlockingCallWatchdog::BlockingCallWatchdog(std::string what, int rank, double timeout_s,
                                           std::function<void(const std::string&)> on_timeout)
    : state_(std::make_shared<State>()) {
  if (!on_timeout)
    on_timeout = [](const std::string& message) {
      std::fprintf(stderr, "moesim: error: %s\n", message.c_str());
      std::fflush(stderr);
      MpiSession::abort_all(1);
    };
  thread_ = std::thread([state = state_, what = std::move(what), rank, timeout_s,
                         on_timeout = std::move(on_timeout)] {
    std::unique_lock lock(state->mutex);
    if (state->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [&] { return state->done; }))
      return;
    lock.unlock();
    on_timeout(fmt::format(
        "rank {}: timed out after {:.0f} s in {} (a peer rank died, never started or cannot be "
        "reached; raise MOESIM_EXEC_TIMEOUT_S if the run is just slow)",
        rank, timeout_s, what));
  });
}

BlockingCallWatchdog::~BlockingCallWatchdog() {
  {
    std::lock_guard lock(state_->mutex);
    state_->done = true;
  }
  state_->cv.notify_all();
  thread_.join();
}

void MpiSession::abort_all(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; keeps [[noreturn]] honest
}

MpiCommunicator::MpiCommunicator() {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  for (auto& [group, comm] : comms_)
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

void MpiCommunicator::exchange(std::span<const SendSpec> sends, std::span<const RecvSpec> recvs,
                               int tag) {
  // Messages above INT_MAX bytes go as several pieces with the same tag: MPI keeps messages of one
  // (source, tag, communicator) in order, so the pieces land where they belong.
  constexpr std::size_t kPiece = static_cast<std::size_t>(INT_MAX) / 2;
  std::vector<MPI_Request> req;
  req.reserve(sends.size() + recvs.size());
  for (const RecvSpec& r : recvs)
    for (std::size_t off = 0; off < r.bytes; off += kPiece) {  // 0 bytes: no message either side
      req.emplace_back();
      MPI_CHECK(MPI_Irecv(r.data + off, static_cast<int>(std::min(kPiece, r.bytes - off)), MPI_BYTE,
                          r.peer, tag, MPI_COMM_WORLD, &req.back()));
    }
  for (const SendSpec& s : sends)
    for (std::size_t off = 0; off < s.bytes; off += kPiece) {
      req.emplace_back();
      MPI_CHECK(MPI_Isend(s.data + off, static_cast<int>(std::min(kPiece, s.bytes - off)), MPI_BYTE,
                          s.peer, tag, MPI_COMM_WORLD, &req.back()));
    }
  wait_all(req, fmt::format("exchange tag {} on rank {} ({} sends, {} receives)", tag, rank_,
                            sends.size(), recvs.size()));
}

MPI_Comm MpiCommunicator::group_comm(std::span<const int> group) {
  std::vector<int> key(group.begin(), group.end());
  auto it = comms_.find(key);
  if (it != comms_.end()) return it->second;
  MOESIM_ASSERT(std::find(key.begin(), key.end(), rank_) != key.end(),
                "group collective called on a rank outside the group");
  MPI_Group world_group, sub;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_CHECK(MPI_Group_incl(world_group, static_cast<int>(key.size()), key.data(), &sub));
  MPI_Comm comm = MPI_COMM_NULL;
  // Tag 77: group creation only involves the members, so different groups build concurrently.
  MPI_CHECK(MPI_Comm_create_group(MPI_COMM_WORLD, sub, 77, &comm));
  MPI_Group_free(&sub);
  MPI_Group_free(&world_group);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  comms_.emplace(std::move(key), comm);
  return comm;
}

void MpiCommunicator::all_to_allv(const std::byte* send, std::span<const std::size_t> send_counts,
                                  std::span<const std::size_t> send_displs, std::byte* recv,
                                  std::span<const std::size_t> recv_counts,
                                  std::span<const std::size_t> recv_displs,
                                  std::span<const int> group) {
  MPI_Comm comm = group_comm(group);
  const size_t w = group.size();
  std::vector<int> sc(w), sd(w), rc(w), rd(w);
  for (size_t i = 0; i < w; ++i) {
    sc[i] = checked_int(send_counts[i], "all_to_allv block");
    sd[i] = checked_int(send_displs[i], "all_to_allv displacement");
    rc[i] = checked_int(recv_counts[i], "all_to_allv block");
    rd[i] = checked_int(recv_displs[i], "all_to_allv displacement");
  }
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(),
                           MPI_BYTE, comm, &req[0]));
  wait_all(req, "all_to_allv over " + group_text(group));
}

void MpiCommunicator::all_reduce_sum(float* data, std::size_t count, std::span<const int> group) {
  MPI_Comm comm = group_comm(group);
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, checked_int(count, "all_reduce"), MPI_FLOAT, MPI_SUM,
                           comm, &req[0]));
  wait_all(req, "all_reduce over " + group_text(group));
}

void MpiCommunicator::all_gather(const std::byte* in, std::size_t bytes, std::byte* out,
                                 std::span<const int> group) {
  MPI_Comm comm = group_comm(group);
  int n = checked_int(bytes, "all_gather block");
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm, &req[0]));
  wait_all(req, "all_gather over " + group_text(group));
}

void MpiCommunicator::reduce_scatter_sum(const float* in, float* out, std::size_t count,
                                         std::span<const int> group) {
  MPI_Comm comm = group_comm(group);
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Ireduce_scatter_block(in, out, checked_int(count, "reduce_scatter block"),
                                      MPI_FLOAT, MPI_SUM, comm, &req[0]));
  wait_all(req, "reduce_scatter over " + group_text(group));
}

void MpiCommunicator::barrier() {
  std::vector<MPI_Request> req(1);
  MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &req[0]));
  wait_all(req, "barrier");
}

}  // namespace moesim::exec
