#include "core/units.hpp"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace moesim {

std::string_view unit_kind_name(UnitKind k) {
  switch (k) {
    case UnitKind::kBytes:
      return "a size (e.g. 128MiB, 4KB)";
    case UnitKind::kSeconds:
      return "a duration (e.g. 2us, 1.5ms)";
    case UnitKind::kBytesPerSecond:
      return "a bandwidth (e.g. 300GB/s, 200Gb/s)";
    case UnitKind::kFlopsPerSecond:
      return "a compute rate (e.g. 312TFLOPS)";
  }
  return "?";
}

double max_quantity(UnitKind k) {
  switch (k) {
    case UnitKind::kBytes:
      return 1125899906842624.0;  // 2^50
    case UnitKind::kSeconds:
      return 3600.0;
    case UnitKind::kBytesPerSecond:
      return 1e15;
    case UnitKind::kFlopsPerSecond:
      return 1e18;
  }
  return 0;
}

std::string_view max_quantity_text(UnitKind k) {
  switch (k) {
    case UnitKind::kBytes:
      return "1024TiB";
    case UnitKind::kSeconds:
      return "3600s";
    case UnitKind::kBytesPerSecond:
      return "1000TB/s";
    case UnitKind::kFlopsPerSecond:
      return "1000PFLOPS";
  }
  return "?";
}

namespace {

struct UnitDef {
  std::string_view name;
  UnitKind kind;
  double factor;
};

// Longest names first is not needed: we match the whole suffix exactly.
constexpr std::array kUnits = {
    UnitDef{"B", UnitKind::kBytes, 1.0},
    UnitDef{"KB", UnitKind::kBytes, 1e3},
    UnitDef{"MB", UnitKind::kBytes, 1e6},
    UnitDef{"GB", UnitKind::kBytes, 1e9},
    UnitDef{"TB", UnitKind::kBytes, 1e12},
    UnitDef{"KiB", UnitKind::kBytes, 1024.0},
    UnitDef{"MiB", UnitKind::kBytes, 1048576.0},
    UnitDef{"GiB", UnitKind::kBytes, 1073741824.0},
    UnitDef{"TiB", UnitKind::kBytes, 1099511627776.0},
    UnitDef{"ns", UnitKind::kSeconds, 1e-9},
    UnitDef{"us", UnitKind::kSeconds, 1e-6},
    UnitDef{"ms", UnitKind::kSeconds, 1e-3},
    UnitDef{"s", UnitKind::kSeconds, 1.0},
    UnitDef{"b/s", UnitKind::kBytesPerSecond, 1.0 / 8},
    UnitDef{"Kb/s", UnitKind::kBytesPerSecond, 1e3 / 8},
    UnitDef{"Mb/s", UnitKind::kBytesPerSecond, 1e6 / 8},
    UnitDef{"Gb/s", UnitKind::kBytesPerSecond, 1e9 / 8},
    UnitDef{"Tb/s", UnitKind::kBytesPerSecond, 1e12 / 8},
    UnitDef{"bps", UnitKind::kBytesPerSecond, 1.0 / 8},
    UnitDef{"Kbps", UnitKind::kBytesPerSecond, 1e3 / 8},
    UnitDef{"Mbps", UnitKind::kBytesPerSecond, 1e6 / 8},
    UnitDef{"Gbps", UnitKind::kBytesPerSecond, 1e9 / 8},
    UnitDef{"Tbps", UnitKind::kBytesPerSecond, 1e12 / 8},
    UnitDef{"B/s", UnitKind::kBytesPerSecond, 1.0},
    UnitDef{"KB/s", UnitKind::kBytesPerSecond, 1e3},
    UnitDef{"MB/s", UnitKind::kBytesPerSecond, 1e6},
    UnitDef{"GB/s", UnitKind::kBytesPerSecond, 1e9},
    UnitDef{"TB/s", UnitKind::kBytesPerSecond, 1e12},
    UnitDef{"KiB/s", UnitKind::kBytesPerSecond, 1024.0},
    UnitDef{"MiB/s", UnitKind::kBytesPerSecond, 1048576.0},
    UnitDef{"GiB/s", UnitKind::kBytesPerSecond, 1073741824.0},
    UnitDef{"GBps", UnitKind::kBytesPerSecond, 1e9},
    UnitDef{"TBps", UnitKind::kBytesPerSecond, 1e12},
    UnitDef{"FLOPS", UnitKind::kFlopsPerSecond, 1.0},
    UnitDef{"FLOP/s", UnitKind::kFlopsPerSecond, 1.0},
    UnitDef{"GFLOPS", UnitKind::kFlopsPerSecond, 1e9},
    UnitDef{"GFLOP/s", UnitKind::kFlopsPerSecond, 1e9},
    UnitDef{"TFLOPS", UnitKind::kFlopsPerSecond, 1e12},
    UnitDef{"TFLOP/s", UnitKind::kFlopsPerSecond, 1e12},
    UnitDef{"PFLOPS", UnitKind::kFlopsPerSecond, 1e15},
    UnitDef{"PFLOP/s", UnitKind::kFlopsPerSecond, 1e15},
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

ParsedQuantity parse_quantity(std::string_view text, UnitKind expected) {
  std::string_view s = trim(text);
  ParsedQuantity out;
  if (s.empty()) {
    out.error = fmt::format("found an empty value, expected {}", unit_kind_name(expected));
    return out;
  }
  // Split into the numeric prefix and the unit suffix.
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' ||
                          s[i] == '-' || s[i] == '+' || s[i] == 'e' || s[i] == 'E')) {
    // 'e'/'E' belongs to the number only when followed by a digit or sign (1e9, 2.5E-3).
    if ((s[i] == 'e' || s[i] == 'E') &&
        !(i + 1 < s.size() && (std::isdigit(static_cast<unsigned char>(s[i + 1])) ||
                               s[i + 1] == '-' || s[i + 1] == '+')))
      break;
    ++i;
  }
  std::string_view num = s.substr(0, i);
  std::string_view unit = trim(s.substr(i));
  double v = 0;
  auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), v);
  if (num.empty() || ec != std::errc() || ptr != num.data() + num.size() || !std::isfinite(v)) {
    out.error = fmt::format("found '{}', expected {}", text, unit_kind_name(expected));
    return out;
  }
  if (unit.empty()) {
    out.error = fmt::format("found the bare number '{}' without a unit, expected {}", text,
                            unit_kind_name(expected));
    return out;
  }
  for (const auto& u : kUnits) {
    if (u.name == unit) {
      if (u.kind != expected) {
        out.error = fmt::format("found '{}', which is {}, expected {}", text,
                                unit_kind_name(u.kind), unit_kind_name(expected));
        return out;
      }
      if (v < 0) {
        out.error = fmt::format("found the negative value '{}', expected {}", text,
                                unit_kind_name(expected));
        return out;
      }
      out.value = v * u.factor;
      return out;
    }
  }
  out.error = fmt::format("found the unknown unit '{}' in '{}', expected {}", unit, text,
                          unit_kind_name(expected));
  return out;
}

namespace {
double parse_or_throw(std::string_view text, UnitKind k) {
  auto p = parse_quantity(text, k);
  if (!p.value) throw std::invalid_argument(p.error);
  return *p.value;
}

// Formats v with 3 significant digits, dropping trailing zeros ("128", "1.5", "0.25").
std::string sig3(double v) {
  std::string s = fmt::format("{:.3g}", v);
  if (s.find('e') != std::string::npos) s = fmt::format("{:.0f}", v);
  return s;
}

template <size_t N>
std::string scaled(double v, const std::array<std::pair<double, const char*>, N>& steps) {
  // steps ordered from largest to smallest; pick the first whose factor <= |v|.
  double a = std::fabs(v);
  for (const auto& [f, name] : steps) {
    if (a >= f * 0.9995) return sig3(v / f) + " " + name;
  }
  const auto& last = steps.back();
  return sig3(v / last.first) + " " + last.second;
}
}  // namespace

Bytes parse_bytes(std::string_view t) { return Bytes(parse_or_throw(t, UnitKind::kBytes)); }
Seconds parse_seconds(std::string_view t) { return Seconds(parse_or_throw(t, UnitKind::kSeconds)); }
BytesPerSecond parse_bandwidth(std::string_view t) {
  return BytesPerSecond(parse_or_throw(t, UnitKind::kBytesPerSecond));
}
FlopsPerSecond parse_flops_rate(std::string_view t) {
  return FlopsPerSecond(parse_or_throw(t, UnitKind::kFlopsPerSecond));
}

std::string to_string(Bytes b) {
  static const std::array<std::pair<double, const char*>, 5> k = {{{1099511627776.0, "TiB"},
                                                                   {1073741824.0, "GiB"},
                                                                   {1048576.0, "MiB"},
                                                                   {1024.0, "KiB"},
                                                                   {1.0, "B"}}};
  if (b.value() == 0) return "0 B";
  return scaled(b.value(), k);
}

std::string to_string(Seconds s) {
  static const std::array<std::pair<double, const char*>, 4> k = {
      {{1.0, "s"}, {1e-3, "ms"}, {1e-6, "us"}, {1e-9, "ns"}}};
  if (s.value() == 0) return "0 s";
  return scaled(s.value(), k);
}

std::string to_string(BytesPerSecond r) {
  static const std::array<std::pair<double, const char*>, 5> k = {
      {{1e12, "TB/s"}, {1e9, "GB/s"}, {1e6, "MB/s"}, {1e3, "KB/s"}, {1.0, "B/s"}}};
  if (r.value() == 0) return "0 B/s";
  return scaled(r.value(), k);
}

std::string to_string(FlopsPerSecond r) {
  static const std::array<std::pair<double, const char*>, 4> k = {
      {{1e15, "PFLOP/s"}, {1e12, "TFLOP/s"}, {1e9, "GFLOP/s"}, {1.0, "FLOP/s"}}};
  if (r.value() == 0) return "0 FLOP/s";
  return scaled(r.value(), k);
}

}  // namespace moesim
