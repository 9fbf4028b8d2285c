// The strict YAML reading helpers under the scenario loader (core/yaml_reader).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/scenario_loader.hpp"
#include "core/yaml_reader.hpp"

namespace moesim::yaml {
namespace {

using ::testing::HasSubstr;

TEST(ScenarioYaml, ClosestMatchOnlyForPlausibleTypos) {
  const std::vector<std::string_view> keys = {"nodes", "gpus_per_node", "intra_node", "inter_node"};
  EXPECT_EQ(closest_match("nodse", keys), "nodes");  // transposition: distance 2
  EXPECT_EQ(closest_match("gpus_per_nod", keys), "gpus_per_node");
  EXPECT_EQ(closest_match("intra-node", keys), "intra_node");
  EXPECT_EQ(closest_match("bandwidth", keys), "");  // nothing close
  EXPECT_EQ(did_you_mean("nodes", keys), " (did you mean 'nodes'?)");
  EXPECT_EQ(did_you_mean("xyzzy", keys), "");
  EXPECT_EQ(join_alternatives({"a"}), "a");
  EXPECT_EQ(join_alternatives({"a", "b", "c"}), "a, b or c");
}

TEST(ScenarioYaml, DescribeIsOneShortLine) {
  EXPECT_EQ(describe(YAML::Load("[1, 2]")), "a list of 2 item(s)");
  EXPECT_EQ(describe(YAML::Load("{a: 1}")), "a map");
  EXPECT_EQ(describe(YAML::Load("~")), "nothing (an empty value)");
  EXPECT_EQ(describe(YAML::Load("abc")), "'abc'");
  std::string text = describe(YAML::Load("|\n  line one\n  line two\n"));
  EXPECT_EQ(text.find('\n'), std::string::npos);
  EXPECT_THAT(text, HasSubstr("line one\\nline two"));
  EXPECT_LE(describe(YAML::Load(std::string(200, 'x'))).size(), 50u);
}

TEST(ScenarioYaml, ScalarConversionsNameFoundAndExpected) {
  Context ctx("f.yaml");
  YAML::Node n = YAML::Load("{i: 42, neg: -3, f: 2.5, t: yes, q: 300GB/s, w: fast}");
  EXPECT_EQ(ctx.to_int(n["i"], "i"), 42);
  EXPECT_EQ(ctx.to_int(n["neg"], "neg"), -3);
  EXPECT_DOUBLE_EQ(ctx.to_number(n["f"], "f"), 2.5);
  EXPECT_TRUE(ctx.to_bool(n["t"], "t"));
  EXPECT_DOUBLE_EQ(ctx.to_quantity(n["q"], "q", UnitKind::kBytesPerSecond), 300e9);
  EXPECT_EQ(ctx.to_choice(n["w"], "w", {"slow", "fast"}), 1u);
  try {
    ctx.to_int(n["i"], "i", 1, 10);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "f.yaml:1:5: i: found 42, expected an integer in [1, 10]");
  }
  try {
    ctx.to_number(n["q"], "q");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("q: found '300GB/s', expected a plain number (no unit)"));
  }
  try {
    ctx.to_choice(n["w"], "w", {"fist", "slow"});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("found 'fast', expected one of fist or slow (did you mean "
                                    "'fist'?)"));
  }
}

TEST(ScenarioYaml, SyntaxErrorsCarryTheParserPosition) {
  try {
    parse_yaml_string("a: 1\nb: [2,\nc: 3\n", "s.yaml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.location().file, "s.yaml");
    EXPECT_GE(e.location().line, 2);
    EXPECT_THAT(e.what(), HasSubstr("YAML syntax error"));
  }
}

}  // namespace
}  // namespace moesim::yaml
