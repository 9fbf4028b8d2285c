#include "strategies/routing/gate_lab.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.hpp"
#include "kernels/ta_moe_loss.hpp"

namespace moesim::routing {

namespace {

struct Dataset {
  int tokens = 0;            // per GPU
  std::vector<double> x;     // [gpu][token][D]
  std::vector<int> teacher;  // [gpu][token]
};

class Lab {
 public:
  explicit Lab(const GateLabConfig& c) : c_(c) {
    P_ = c.num_gpus;
    E_ = P_ * c.experts_per_gpu;
    D_ = c.feature_dim > 0 ? c.feature_dim : default_feature_dim(E_);
    C_ = c.clusters > 0 ? c.clusters : 2 * E_;
    in_ = D_ + P_;
    if (P_ < 1 || c.experts_per_gpu < 1 || c.top_k < 1 || c.top_k > E_ || c.feature_dim < 0 ||
        c.batch < 1 || c.tokens_per_gpu < c.batch || c.eval_tokens_per_gpu < 1 || c.epochs < 0 ||
        !(c.label_smoothing >= 0 && c.label_smoothing < 1))
      throw InputError(
          "gate lab: need gpus, experts_per_gpu, top_k <= E, batch >= 1, feature_dim >= 0 "
          "and tokens_per_gpu >= batch");
    if (static_cast<int>(c.node_of.size()) != P_ ||
        static_cast<int>(c.target_share.size()) != P_ * P_)
      throw InputError("gate lab: node_of needs P entries and target_share P x P");
    std::mt19937_64 rng(c.seed);
    std::normal_distribution<double> n01(0.0, 1.0);
    centres_.resize(static_cast<std::size_t>(C_) * D_);
    for (double& v : centres_) v = c.separation * n01(rng);
    train_ = make_data(c.tokens_per_gpu, c.seed * 7919 + 1);
    eval_ = make_data(c.eval_tokens_per_gpu, c.seed * 7919 + 2);
    // Small random initial gate, the same for both runs.
    w0_.resize(static_cast<std::size_t>(in_) * E_);
    for (double& v : w0_) v = 0.01 * n01(rng);
  }

  GateLabRun train(bool topo) {
    GateLabRun run;
    run.topology_loss = topo;
    std::vector<double> w = w0_;
    // Per-GPU expert weights: w_{o(e)} from the GPU's target row, or 1 (GShard balance loss).
    std::vector<std::vector<float>> weights(static_cast<std::size_t>(P_));
    for (int g = 0; g < P_; ++g) {
      try {
        weights[g] = topo ? kernels::ta_moe_expert_weights(
                                c_.target_share.data() + static_cast<std::size_t>(g) * P_, P_,
                                c_.experts_per_gpu)
                          : std::vector<float>(static_cast<std::size_t>(E_), 1.0f);
      } catch (const kernels::ArgumentError& e) {
        // The target shares come from the user's topology and smoothing (lambda): their input.
        throw InputError(e.what());
      }
    }
    run.epochs.push_back(evaluate(w, weights, 0));
    const int B = c_.batch, steps = c_.tokens_per_gpu / B;
    std::vector<double> grad(w.size());
    std::vector<double> probs(static_cast<std::size_t>(B) * E_);
    std::vector<float> probs_f(probs.size()), dprob(probs.size());
    std::vector<std::int32_t> choice(static_cast<std::size_t>(B) * c_.top_k);
    std::vector<int> order(static_cast<std::size_t>(c_.tokens_per_gpu));
    std::mt19937_64 shuffle(c_.seed * 104729 + 3);  // the same order in both runs
    kernels::cpu::Context kctx;
    const double eps = c_.label_smoothing;
    for (int epoch = 1; epoch <= c_.epochs; ++epoch) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), shuffle);
      for (int s = 0; s < steps; ++s) {
        std::fill(grad.begin(), grad.end(), 0.0);
        for (int g = 0; g < P_; ++g) {
          const int* idx = order.data() + static_cast<std::size_t>(s) * B;
          forward(w, train_, g, idx, B, probs, choice);
          for (std::size_t i = 0; i < probs.size(); ++i) probs_f[i] = static_cast<float>(probs[i]);
          float aux = 0;
          kernels::TaMoeLossArgs a;
          a.num_tokens = B;
          a.num_experts = E_;
          a.top_k = c_.top_k;
          a.probs = probs_f.data();
          a.expert = choice.data();
          a.expert_weight = weights[g].data();
          a.scale = static_cast<float>(E_);
          a.loss = &aux;
          a.grad_probs = dprob.data();
          kernels::cpu::ta_moe_loss(kctx, a);
          // d(task)/dz = (p - smoothed onehot) / B; d(aux)/dz = p * (g - sum p g) (softmax
          // Jacobian).
          for (int t = 0; t < B; ++t) {
            const double* p = probs.data() + static_cast<std::size_t>(t) * E_;
            const float* ga = dprob.data() + static_cast<std::size_t>(t) * E_;
            double pg = 0;
            for (int e = 0; e < E_; ++e) pg += p[e] * ga[e];
            const int tok = idx[t];
            const int teacher = train_.teacher[static_cast<std::size_t>(g) * train_.tokens + tok];
            const double* x = feature(train_, g, tok);
            for (int e = 0; e < E_; ++e) {
              const double target = (e == teacher ? 1.0 - eps : 0.0) + eps / E_;
              const double dz = (p[e] - target) / B + c_.aux_weight * p[e] * (ga[e] - pg);
              for (int d = 0; d < D_; ++d) grad[static_cast<std::size_t>(d) * E_ + e] += dz * x[d];
              grad[static_cast<std::size_t>(D_ + g) * E_ + e] += dz;  // the GPU one-hot input
            }
          }
        }
        // Shared rows (token features): the mean of the GPUs' gradients (data-parallel
        // all-reduce). GPU-private rows (the one-hot input of GPU g, which only g's tokens
        // touch): g's own gradient, like expert weights under expert parallelism, which are not
        // all-reduced either. Averaging them over P replicas, P - 1 of which contribute zero,
        // divided their learning rate by P: on 48 GPUs the per-GPU preference the topology loss
        // asks for moved 48x slower than on 1 GPU, and 30 epochs barely moved it.
        const std::size_t shared = static_cast<std::size_t>(D_) * E_;
        for (std::size_t i = 0; i < shared; ++i) w[i] -= c_.learning_rate / P_ * grad[i];
        for (std::size_t i = shared; i < w.size(); ++i) w[i] -= c_.learning_rate * grad[i];
      }
      run.epochs.push_back(evaluate(w, weights, epoch));
    }
    return run;
  }

 private:
  Dataset make_data(int tokens, std::uint64_t seed) const {
    Dataset ds;
    ds.tokens = tokens;
    ds.x.resize(static_cast<std::size_t>(P_) * tokens * D_);
    ds.teacher.resize(static_cast<std::size_t>(P_) * tokens);
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> n01(0.0, 1.0);
    std::uniform_int_distribution<int> pick(0, C_ - 1);
    for (int g = 0; g < P_; ++g)
      for (int t = 0; t < tokens; ++t) {
        const int cl = pick(rng);
        ds.teacher[static_cast<std::size_t>(g) * tokens + t] = cl % E_;
        double* x = ds.x.data() + (static_cast<std::size_t>(g) * tokens + t) * D_;
        for (int d = 0; d < D_; ++d)
          x[d] = centres_[static_cast<std::size_t>(cl) * D_ + d] + n01(rng);
      }
    return ds;
  }

  const double* feature(const Dataset& ds, int g, int t) const {
    return ds.x.data() + (static_cast<std::size_t>(g) * ds.tokens + t) * D_;
  }

  // Softmax gate probabilities and top-k choices of tokens idx[0..n) of GPU g.
  void forward(const std::vector<double>& w, const Dataset& ds, int g, const int* idx, int n,
               std::vector<double>& probs, std::vector<std::int32_t>& choice) const {
    std::vector<int> rank(static_cast<std::size_t>(E_));
    for (int t = 0; t < n; ++t) {
      const double* x = feature(ds, g, idx ? idx[t] : t);
      double* z = probs.data() + static_cast<std::size_t>(t) * E_;
      for (int e = 0; e < E_; ++e) z[e] = w[static_cast<std::size_t>(D_ + g) * E_ + e];
      for (int d = 0; d < D_; ++d) {
        const double* wr = w.data() + static_cast<std::size_t>(d) * E_;
        for (int e = 0; e < E_; ++e) z[e] += x[d] * wr[e];
      }
      const double mx = *std::max_element(z, z + E_);
      double sum = 0;
      for (int e = 0; e < E_; ++e) sum += z[e] = std::exp(z[e] - mx);
      for (int e = 0; e < E_; ++e) z[e] /= sum;
      std::iota(rank.begin(), rank.end(), 0);
      std::partial_sort(rank.begin(), rank.begin() + c_.top_k, rank.end(),
                        [&](int a, int b) { return z[a] != z[b] ? z[a] > z[b] : a < b; });
      for (int c = 0; c < c_.top_k; ++c)
        choice[static_cast<std::size_t>(t) * c_.top_k + c] = rank[c];
    }
  }

  GateLabEpoch evaluate(const std::vector<double>& w,
                        const std::vector<std::vector<float>>& weights, int epoch) const {
    GateLabEpoch r;
    r.epoch = epoch;
    const int n = eval_.tokens;
    std::vector<double> probs(static_cast<std::size_t>(n) * E_);
    std::vector<float> probs_f(probs.size());
    std::vector<std::int32_t> choice(static_cast<std::size_t>(n) * c_.top_k);
    std::vector<double> load(static_cast<std::size_t>(E_), 0.0);
    double correct = 0, off = 0, ce = 0, aux_sum = 0;
    kernels::cpu::Context kctx;
    for (int g = 0; g < P_; ++g) {
      forward(w, eval_, g, nullptr, n, probs, choice);
      for (int t = 0; t < n; ++t) {
        const int teacher = eval_.teacher[static_cast<std::size_t>(g) * n + t];
        const std::int32_t* ch = choice.data() + static_cast<std::size_t>(t) * c_.top_k;
        correct += ch[0] == teacher;
        ce -= std::log(std::max(1e-300, probs[static_cast<std::size_t>(t) * E_ + teacher]));
        for (int c = 0; c < c_.top_k; ++c) {
          load[ch[c]] += 1;
          off += c_.node_of[ch[c] / c_.experts_per_gpu] != c_.node_of[g];
        }
      }
      for (std::size_t i = 0; i < probs.size(); ++i) probs_f[i] = static_cast<float>(probs[i]);
      float aux = 0;
      kernels::TaMoeLossArgs a;
      a.num_tokens = n;
      a.num_experts = E_;
      a.top_k = c_.top_k;
      a.probs = probs_f.data();
      a.expert = choice.data();
      a.expert_weight = weights[g].data();
      a.scale = static_cast<float>(E_);
      a.loss = &aux;
      kernels::cpu::ta_moe_loss(kctx, a);
      aux_sum += aux;
    }
    const double tokens = static_cast<double>(n) * P_;
    r.accuracy = correct / tokens;
    r.task_loss = ce / tokens;
    r.aux_loss = aux_sum / P_;
    r.offnode_share = off / (tokens * c_.top_k);
    const double mean = tokens * c_.top_k / E_;
    r.balance = *std::max_element(load.begin(), load.end()) / mean;
    return r;
  }

  const GateLabConfig& c_;
  int P_ = 0, E_ = 0, D_ = 0, C_ = 0, in_ = 0;
  std::vector<double> centres_, w0_;
  Dataset train_, eval_;
};

}  // namespace

int default_feature_dim(int experts) { return std::max(16, experts); }

GateLabRun train_gate(const GateLabConfig& config, bool topology_loss) {
  Lab lab(config);
  return lab.train(topology_loss);
}

std::vector<GateLabRun> run_gate_lab(const GateLabConfig& config) {
  Lab lab(config);
  std::vector<GateLabRun> runs;
  runs.push_back(lab.train(false));
  runs.push_back(lab.train(true));
  return runs;
}

}  // namespace moesim::routing
