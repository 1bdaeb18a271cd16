// Pieces under the filters: Python's float repr, str semantics, json.dumps.
#include <catch2/catch.hpp>

#include "template/pystr.hpp"
#include "template/value_json.hpp"

using namespace exa::jinja;

TEST_CASE("python_float_repr matches CPython's repr", "[template]") {
  CHECK(python_float_repr(1.0) == "1.0");
  CHECK(python_float_repr(0.1) == "0.1");
  CHECK(python_float_repr(0.1 + 0.2) == "0.30000000000000004");
  CHECK(python_float_repr(1e16) == "1e+16");
  CHECK(python_float_repr(1234567890123456.0) == "1234567890123456.0");
  CHECK(python_float_repr(0.0001) == "0.0001");
  CHECK(python_float_repr(0.00001) == "1e-05");
  CHECK(python_float_repr(-2.5e-10) == "-2.5e-10");
  CHECK(python_float_repr(1.5e300) == "1.5e+300");
  CHECK(python_float_repr(-0.0) == "-0.0");
  CHECK(python_float_repr(100.0) == "100.0");
}

TEST_CASE("pystr: code points, whitespace and invalid bytes", "[template]") {
  CHECK(pystr::length("héllo👋") == 6);
  CHECK(pystr::strip("\u00a0 x \u3000", std::nullopt, true, true) == "x");
  CHECK(pystr::strip("\xff x \xfe", std::nullopt, true, true) == "\xff x \xfe");
  const std::string bad = "a\xc3(b\xe2\x82";
  CHECK(pystr::encode(pystr::decode(bad)) == bad);
  CHECK(pystr::split("  a  b ", std::nullopt, -1) == std::vector<std::string>{"a", "b"});
  CHECK(pystr::split("a,,b", std::string(","), -1) == std::vector<std::string>{"a", "", "b"});
  CHECK(pystr::split("a b c", std::nullopt, 1) == std::vector<std::string>{"a", "b c"});
  CHECK(pystr::replace("ab", "", "-", -1) == "-a-b-");
  CHECK(pystr::title("hello wORLD 2nd") == "Hello World 2Nd");
}

TEST_CASE("to_json writes what json.dumps(ensure_ascii=False) writes", "[template]") {
  dict d;
  d.set("b", value(list{value(1), value(2.0), value(none_t{}), value(true)}));
  d.set("a", value("é\"\n\x01"));
  CHECK(*to_json(value(d), {}, 1 << 20) == "{\"b\": [1, 2.0, null, true], \"a\": \"é\\\"\\n\\u0001\"}");
  json_format indented;
  indented.indent = "  ";
  CHECK(*to_json(value(d), indented, 1 << 20) ==
        "{\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"a\": \"é\\\"\\n\\u0001\"\n}");
  json_format sorted;
  sorted.sort_keys = true;
  CHECK(to_json(value(d), sorted, 1 << 20)->starts_with("{\"a\""));
  CHECK_FALSE(to_json(value(d), {}, 10));  // bounded
  CHECK_FALSE(to_json(value(), {}, 100));  // undefined is not JSON
}

TEST_CASE("from_json keeps key order and refuses hostile depth", "[template]") {
  auto v = from_json(nlohmann::ordered_json::parse(R"({"z": 1, "a": [true, null, 1.5, "s"]})"));
  REQUIRE(v);
  REQUIRE(v->is_dict());
  CHECK(v->as_dict().items()[0].first == "z");
  std::string deep(100, '[');
  deep += std::string(100, ']');
  CHECK_FALSE(from_json(nlohmann::ordered_json::parse(deep)));
}
