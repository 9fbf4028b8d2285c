// Strong unit types for the quantities the simulator works with, and parsing of the unit strings
// used in scenario YAML ("300GB/s", "200Gb/s", "2us", "128MiB", "312TFLOPS").
//
// All quantities hold a double in base SI units (bytes, seconds, bytes per second, FLOP, FLOP per
// second). Doubles are exact for byte counts up to 2^53 (8 PiB), far above any single transfer.
// Arithmetic between compatible types is provided where it is meaningful (Bytes / BytesPerSecond
// gives Seconds, ...); everything else needs an explicit `.value()`, so a latency can never be
// added to a bandwidth by accident.
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <string_view>

namespace moesim {

template <typename Tag>
class Quantity {
 public:
  constexpr Quantity() = default;
  constexpr explicit Quantity(double v) : v_(v) {}
  constexpr double value() const { return v_; }

  constexpr Quantity operator+(Quantity o) const { return Quantity(v_ + o.v_); }
  constexpr Quantity operator-(Quantity o) const { return Quantity(v_ - o.v_); }
  constexpr Quantity& operator+=(Quantity o) {
    v_ += o.v_;
    return *this;
  }
  constexpr Quantity& operator-=(Quantity o) {
    v_ -= o.v_;
    return *this;
  }
  constexpr Quantity operator*(double s) const { return Quantity(v_ * s); }
  constexpr Quantity operator/(double s) const { return Quantity(v_ / s); }
  constexpr double operator/(Quantity o) const { return v_ / o.v_; }
  friend constexpr Quantity operator*(double s, Quantity q) { return Quantity(s * q.v_); }
  constexpr auto operator<=>(const Quantity&) const = default;

 private:
  double v_ = 0.0;
};

struct BytesTag {};
struct SecondsTag {};
struct BytesPerSecondTag {};
struct FlopsTag {};
struct FlopsPerSecondTag {};

using Bytes = Quantity<BytesTag>;
using Seconds = Quantity<SecondsTag>;
using BytesPerSecond = Quantity<BytesPerSecondTag>;
using Flops = Quantity<FlopsTag>;
using FlopsPerSecond = Quantity<FlopsPerSecondTag>;

constexpr Seconds operator/(Bytes b, BytesPerSecond r) { return Seconds(b.value() / r.value()); }
constexpr Bytes operator*(BytesPerSecond r, Seconds t) { return Bytes(r.value() * t.value()); }
constexpr Bytes operator*(Seconds t, BytesPerSecond r) { return Bytes(r.value() * t.value()); }
constexpr BytesPerSecond operator/(Bytes b, Seconds t) {
  return BytesPerSecond(b.value() / t.value());
}
constexpr Seconds operator/(Flops f, FlopsPerSecond r) { return Seconds(f.value() / r.value()); }

namespace literals {
constexpr Bytes operator""_B(unsigned long long v) { return Bytes(static_cast<double>(v)); }
constexpr Bytes operator""_KiB(unsigned long long v) { return Bytes(v * 1024.0); }
constexpr Bytes operator""_MiB(unsigned long long v) { return Bytes(v * 1048576.0); }
constexpr Bytes operator""_GiB(unsigned long long v) { return Bytes(v * 1073741824.0); }
constexpr Seconds operator""_s(long double v) { return Seconds(static_cast<double>(v)); }
constexpr Seconds operator""_us(unsigned long long v) { return Seconds(v * 1e-6); }
constexpr Seconds operator""_ns(unsigned long long v) { return Seconds(v * 1e-9); }
constexpr Seconds operator""_ms(unsigned long long v) { return Seconds(v * 1e-3); }
constexpr BytesPerSecond operator""_GBps(unsigned long long v) { return BytesPerSecond(v * 1e9); }
constexpr BytesPerSecond operator""_Gbps(unsigned long long v) {
  return BytesPerSecond(v * 1e9 / 8.0);
}
}  // namespace literals

/// Which kind of quantity a unit string denotes; used for "a bandwidth where a latency belongs".
enum class UnitKind { kBytes, kSeconds, kBytesPerSecond, kFlopsPerSecond };
std::string_view unit_kind_name(UnitKind k);

/// The largest value a scenario may give a quantity of kind `k`, in base units, and how messages
/// print it: 1024TiB, 3600s, 1000TB/s, 1000PFLOPS. Far above real hardware, and low enough that the
/// products the simulator forms (bytes x ranks, bytes / bandwidth) stay exact and finite.
double max_quantity(UnitKind k);
std::string_view max_quantity_text(UnitKind k);

/// Result of parsing: the value in base units, or an error message saying what was expected.
struct ParsedQuantity {
  std::optional<double> value;
  std::string error;  // empty on success
};

/// Parses "<number><unit>" (optional space between). The unit must be of kind `expected`; a bare
/// number, an unknown unit or a unit of another kind is an error naming what was found and what
/// is expected. Units: B KB MB GB TB KiB MiB GiB TiB | ns us ms s | b/s Kb/s Mb/s Gb/s Tb/s B/s
/// KB/s MB/s GB/s TB/s (also Gbps, GBps) | FLOPS GFLOPS TFLOPS PFLOPS (also FLOP/s).
/// Decimal prefixes are powers of 1000, binary (Ki, Mi, Gi) powers of 1024.
ParsedQuantity parse_quantity(std::string_view text, UnitKind expected);

/// Throwing wrappers (std::invalid_argument with the same message), for code and tests.
Bytes parse_bytes(std::string_view text);
Seconds parse_seconds(std::string_view text);
BytesPerSecond parse_bandwidth(std::string_view text);
FlopsPerSecond parse_flops_rate(std::string_view text);

/// Human-readable printing with 3 significant digits and a fitting unit:
/// "128 MiB", "2 us", "300 GB/s", "312 TFLOP/s".
std::string to_string(Bytes b);
std::string to_string(Seconds s);
std::string to_string(BytesPerSecond r);
std::string to_string(FlopsPerSecond r);

}  // namespace moesim
