#include "core/units.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace moesim {
namespace {

TEST(Units, ParsesSizes) {
  EXPECT_DOUBLE_EQ(parse_bytes("128MiB").value(), 128.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_bytes("4KB").value(), 4000.0);
  EXPECT_DOUBLE_EQ(parse_bytes("1.5 GiB").value(), 1.5 * 1073741824.0);
  EXPECT_DOUBLE_EQ(parse_bytes("7B").value(), 7.0);
}

TEST(Units, ParsesRatesBitsAndBytes) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("300GB/s").value(), 300e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("200Gb/s").value(), 25e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("100Gbps").value(), 12.5e9);
  EXPECT_DOUBLE_EQ(parse_flops_rate("312TFLOPS").value(), 312e12);
}

TEST(Units, ParsesDurations) {
  EXPECT_DOUBLE_EQ(parse_seconds("2us").value(), 2e-6);
  EXPECT_DOUBLE_EQ(parse_seconds("1.5ms").value(), 1.5e-3);
  EXPECT_DOUBLE_EQ(parse_seconds("500ns").value(), 500e-9);
  EXPECT_DOUBLE_EQ(parse_seconds("3s").value(), 3.0);
  EXPECT_DOUBLE_EQ(parse_seconds("1e-3s").value(), 1e-3);
}

TEST(Units, BareNumberIsAnError) {
  auto p = parse_quantity("300", UnitKind::kBytesPerSecond);
  EXPECT_FALSE(p.value.has_value());
  EXPECT_NE(p.error.find("without a unit"), std::string::npos) << p.error;
  EXPECT_NE(p.error.find("bandwidth"), std::string::npos) << p.error;
}

TEST(Units, WrongKindNamesBothKinds) {
  auto p = parse_quantity("300GB/s", UnitKind::kSeconds);
  EXPECT_FALSE(p.value.has_value());
  EXPECT_NE(p.error.find("which is a bandwidth"), std::string::npos) << p.error;
  EXPECT_NE(p.error.find("expected a duration"), std::string::npos) << p.error;
}

TEST(Units, UnknownUnitAndGarbage) {
  EXPECT_THROW(parse_bytes("12 parsecs"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("MiB"), std::invalid_argument);
  EXPECT_THROW(parse_bytes(""), std::invalid_argument);
  EXPECT_THROW(parse_bytes("-4MiB"), std::invalid_argument);
}

TEST(Units, PrintsHumanReadable) {
  EXPECT_EQ(to_string(Bytes(128.0 * 1024 * 1024)), "128 MiB");
  EXPECT_EQ(to_string(Seconds(2e-6)), "2 us");
  EXPECT_EQ(to_string(Seconds(1.5e-3)), "1.5 ms");
  EXPECT_EQ(to_string(BytesPerSecond(300e9)), "300 GB/s");
  EXPECT_EQ(to_string(BytesPerSecond(25e9)), "25 GB/s");
  EXPECT_EQ(to_string(FlopsPerSecond(312e12)), "312 TFLOP/s");
  EXPECT_EQ(to_string(Bytes(0)), "0 B");
  EXPECT_EQ(to_string(Bytes(1000)), "1000 B");
}

TEST(Units, TypedArithmetic) {
  using namespace literals;
  Seconds t = 128_MiB / BytesPerSecond(128.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(t.value(), 1.0);
  EXPECT_DOUBLE_EQ((2_us + 3_us).value(), 5e-6);
  EXPECT_DOUBLE_EQ((25_GBps * Seconds(2.0)).value(), 50e9);
}

}  // namespace
}  // namespace moesim
