// Random number machinery of the workload generator (internal header).
//
// Determinism without call-order coupling: instead of one generator advanced through the whole
// run, every (purpose, iteration, layer, GPU) gets its own substream, seeded by hashing the
// run's seed with those indices (SplitMix64 finaliser). The same scenario then gives the same
// counts whichever iterations are sampled, in whichever order, on however many threads.
// xoshiro256** is the generator: 4 words of state (cheap to seed 4,096 times per layer, unlike
// mt19937_64's 312) and about 1 ns per 64-bit draw.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace moesim::workload::detail {

/// SplitMix64 step: a bijective 64-bit mixer; good for turning structured keys into seeds.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// What a substream is for, so different uses of the same indices never share draws.
enum class Stream : std::uint64_t {
  kTokens = 1,        // (iteration, layer, gpu): the tokens' expert choices
  kZipfRanking = 2,   // (layer): the popularity ranking of experts
  kDirichlet = 3,     // (iteration, layer): the expert popularity vector
  kCapacityWalk = 4,  // (iteration): the random walk's step direction
  kBalanced = 5,      // (iteration, layer, node + 1 or 0): balanced routing's expert order
};

inline std::uint64_t substream_key(std::uint64_t seed, Stream purpose, std::uint64_t a = 0,
                                   std::uint64_t b = 0, std::uint64_t c = 0) {
  std::uint64_t h = mix64(seed ^ 0x6d6f6573696d2d77ULL);  // "moesim-w"
  h = mix64(h ^ static_cast<std::uint64_t>(purpose));
  h = mix64(h ^ a);
  h = mix64(h ^ b);
  return mix64(h ^ c);
}

/// xoshiro256** (Blackman & Vigna); satisfies UniformRandomBitGenerator, so std distributions
/// (binomial, gamma) accept it.
class Xoshiro256 {
 public:
  using result_type = std::uint64_t;
  explicit Xoshiro256(std::uint64_t key) {
    // Fill the state from SplitMix64 of the key (never all zero).
    for (auto& w : s_) {
      key += 0x9e3779b97f4a7c15ULL;
      std::uint64_t z = key;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      w = z ^ (z >> 31);
    }
  }
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return std::numeric_limits<result_type>::max(); }
  result_type operator()() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n) (Lemire's multiply-shift on 32 bits; bias below n / 2^32).
  std::uint32_t below(std::uint32_t n) {
    return static_cast<std::uint32_t>(((*this)() >> 32) * n >> 32);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

/// Binomial(n, p) variate, exact in distribution up to double rounding, and the same on every
/// standard library (std::binomial_distribution's algorithm is implementation-defined and sets
/// up per call, ~0.1-1 us; this is ~20-40 ns). n * min(p, 1 - p) < 10: inversion (sequential
/// search from 0 with the pmf recurrence; ~n*p + 1 steps). Otherwise Hoermann's BTRS
/// ("transformed rejection with squeeze", 1993): a hat over the inverse of a transformed
/// uniform, a cheap squeeze accepting ~85%, the exact log-pmf ratio for the rest.
std::int64_t binomial(Xoshiro256& rng, std::int64_t n, double p);

/// Walker/Vose alias table: O(n) to build, one 64-bit draw per sample. Probabilities are
/// quantised to 2^-32 (the coin compares 32 random bits), far below any sampling noise here.
/// Threshold and alias of a column share one 64-bit word, so a draw touches one cache line
/// (8,192 experts: a 64 KiB table).
class AliasTable {
 public:
  AliasTable() = default;
  /// weights >= 0 with a positive sum.
  explicit AliasTable(std::span<const double> weights);

  std::uint32_t size() const { return static_cast<std::uint32_t>(table_.size()); }
  std::uint32_t sample(Xoshiro256& rng) const {
    const std::uint64_t u = rng();
    // Low 32 bits pick the column, high 32 bits toss the column's coin.
    const auto col = static_cast<std::uint32_t>((u & 0xffffffffULL) * size() >> 32);
    const std::uint64_t entry = table_[col];
    return (u >> 32) < (entry & 0xffffffffULL) ? col : static_cast<std::uint32_t>(entry >> 32);
  }

 private:
  // Low half: P(keep column) * 2^32 (a column kept with probability 1 has itself as alias, so
  // the 2^32 that does not fit is never needed); high half: the alias column.
  std::vector<std::uint64_t> table_;
};

}  // namespace moesim::workload::detail
