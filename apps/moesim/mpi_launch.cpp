#include "apps/moesim/mpi_launch.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "apps/moesim/progress.hpp"
#include "core/error.hpp"

#ifdef MOESIM_HAVE_EXEC
#include <mpi.h>

#include "exec/mpi_communicator.hpp"
#endif

namespace moesim::app {

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(var)) {
      int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return 1;
}

namespace {

#ifdef MOESIM_HAVE_EXEC
// Messages over MPI_COMM_WORLD. Every call comes from the thread that initialised MPI (sweep and
// tune keep MPI on their main thread; workers only compute), so MPI_THREAD_FUNNELED is enough.
class MpiTransport : public SweepTransport {
 public:
  explicit MpiTransport(const exec::MpiSession& s) : rank_(s.rank()), size_(s.size()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool synced() const { return synced_; }

  void broadcast(std::string& text) override {
    unsigned long long n = text.size();
    MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
    text.resize(n);
    MPI_CHECK(MPI_Bcast(text.data(), checked(n), MPI_CHAR, 0, MPI_COMM_WORLD));
    synced_ = true;
  }
  void send_to_root(const std::string& text) override {
    MPI_CHECK(MPI_Send(text.data(), checked(text.size()), MPI_CHAR, 0, kTag, MPI_COMM_WORLD));
  }
  std::optional<std::string> try_receive() override {
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kTag, MPI_COMM_WORLD, &flag, &st));
    if (!flag) return std::nullopt;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string text(static_cast<std::size_t>(n), '\0');
    MPI_CHECK(
        MPI_Recv(text.data(), n, MPI_CHAR, st.MPI_SOURCE, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    return text;
  }

 private:
  static constexpr int kTag = 8;
  static int checked(std::size_t n) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw RuntimeError(fmt::format("MPI message of {} bytes exceeds MPI's int count", n));
    return static_cast<int>(n);
  }
  int rank_, size_;
  bool synced_ = false;
};
#endif

}  // namespace

void run_spread(const char* what, const std::function<void(SweepTransport*)>& body) {
  const int world = launcher_world_size();
  if (world <= 1) {
    // Ctrl-C stops the runs in flight; the command says what was kept; exit 130 (main.cpp).
    // Under mpirun, mpirun owns SIGINT (it ends every rank).
    const InterruptHandler on_ctrl_c;
    body(nullptr);
    return;
  }
#ifdef MOESIM_HAVE_EXEC
  (void)what;  // named only by the error of a build without MPI
  int code = 0;
  {
    exec::MpiSession session(nullptr, nullptr);
    MpiTransport transport(session);
    try {
      body(&transport);
    } catch (const std::exception& e) {
      code = dynamic_cast<const InputError*>(&e) != nullptr ? 2 : 1;
      if (session.rank() != 0 && !transport.synced()) {
        // Before rank 0's first broadcast: rank 0 meets the same input and reports it (and
        // aborts this rank); if it gets past, the error is this rank's own.
        std::string ignored;
        transport.broadcast(ignored);
      }
      if (session.rank() == 0)
        std::fprintf(stderr, "moesim: error: %s\n", e.what());
      else
        std::fprintf(stderr, "moesim: error: rank %d: %s\n", session.rank(), e.what());
      std::fflush(stderr);
      std::fflush(stdout);
      exec::MpiSession::abort_all(code);
    }
  }  // MPI_Finalize
  std::fflush(stdout);
#else
  throw InputError(fmt::format(
      "this moesim was built without MPI, so it cannot share {} among the {} processes mpirun "
      "started (each would run all of it): run it without mpirun, or rebuild with "
      "libopenmpi-dev installed",
      what, world));
#endif
}

}  // namespace moesim::app
