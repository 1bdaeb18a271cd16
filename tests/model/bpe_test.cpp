// Byte-level BPE: the GPT-2 byte mapping, the merge order (lowest rank first,
// leftmost on ties), llama.cpp's fallbacks, and the ids of a realistic
// vocabulary compared with llama.cpp's on a broad set of strings for every
// pre-tokenizer we run (fixtures from scripts/make_bpe_vocab.py).

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/bpe.hpp"
#include "model/pre_tokenizer.hpp"

using namespace exa;
using namespace exa::model;

namespace {

bpe make_bpe(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
             bool ignore_merges = false) {
  auto b = bpe::create(tokens, merges, ignore_merges);
  REQUIRE(b.has_value());
  return std::move(*b);
}

std::vector<token_id> encode(const bpe& b, std::string_view piece) {
  std::vector<token_id> out;
  b.encode_piece(piece, out);
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

const std::string fixtures = std::string(EXA_FIXTURES_DIR) + "/tokenizer/";

}  // namespace

TEST_CASE("gpt2 byte mapping covers every byte and inverts", "[bpe]") {
  CHECK(gpt2_byte_encode(" ") == "\xC4\xA0");   // Ġ
  CHECK(gpt2_byte_encode("\n") == "\xC4\x8A");  // Ċ
  CHECK(gpt2_byte_encode("az~!") == "az~!");
  CHECK(gpt2_byte_encode("\xAD") == "\xC5\x83");  // soft hyphen is not printable: U+0143
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string mapped = gpt2_byte_encode(all);
  auto back = gpt2_byte_decode(mapped);
  REQUIRE(back.has_value());
  CHECK(*back == all);
  CHECK_FALSE(gpt2_byte_decode("\xE2\x82\xAC").has_value());  // € is no byte's image
  CHECK_FALSE(gpt2_byte_decode("\xC5\x84").has_value());      // U+0144, one past the last
}

TEST_CASE("bpe merges the lowest rank first, whatever its position", "[bpe]") {
  // "b c" outranks "a b": abc -> a|bc -> abc, never ab|c.
  const bpe b = make_bpe({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "a bc", "ab c"});
  CHECK(encode(b, "abc") == std::vector<token_id>{5});
  CHECK(encode(b, "ab") == std::vector<token_id>{3});
  CHECK(encode(b, "cab") == std::vector<token_id>{2, 3});
}

TEST_CASE("bpe merges the leftmost pair when ranks tie", "[bpe]") {
  const bpe b = make_bpe({"a", "aa"}, {"a a"});
  CHECK(encode(b, "aaa") == std::vector<token_id>{1, 0});
  CHECK(encode(b, "aaaa") == std::vector<token_id>{1, 1});
  CHECK(encode(b, "aaaaa") == std::vector<token_id>{1, 1, 0});
}

TEST_CASE("bpe re-queues merges formed by earlier merges", "[bpe]") {
  // x y -> xy, then xy z -> xyz even though "xy z" was not a pair at the start.
  const bpe b = make_bpe({"x", "y", "z", "xy", "xyz"}, {"x y", "xy z"});
  CHECK(encode(b, "xyz") == std::vector<token_id>{4});
  CHECK(encode(b, "zxyzx") == std::vector<token_id>{2, 4, 0});
}

TEST_CASE("a merge whose result is no token falls back to one-byte tokens", "[bpe]") {
  // llama.cpp looks each byte of the mapped text up as a token and drops the
  // bytes that have none.
  const bpe b = make_bpe({"a", "b"}, {"a b"});
  CHECK(encode(b, "ab") == std::vector<token_id>{0, 1});
  // " a" merges to "Ġa", no token; its bytes are C4 A0 61: the two bytes of
  // "Ġ" have no one-byte token and are dropped, 'a' is kept.
  const bpe c = make_bpe({"a", "\xC4\xA0"}, {"\xC4\xA0 a"});
  CHECK(encode(c, " a") == std::vector<token_id>{0});
  CHECK(encode(c, " ") == std::vector<token_id>{1});
}

TEST_CASE("merges are keyed as llama.cpp splits them, and the first listing wins", "[bpe]") {
  const bpe b = make_bpe({"a", "b", "ab"}, {"nospace", "a b", "a b"});
  CHECK(b.merge_rank("a", "b") == 1);
  CHECK_FALSE(b.merge_rank("b", "a").has_value());
  CHECK_FALSE(b.merge_rank("nospace", "").has_value());
}

TEST_CASE("ignore_merges takes a whole piece that is a token as it is", "[bpe]") {
  // No merge makes "ab", yet the piece is a token: Llama 3 style vocabularies
  // emit it whole; the others merge (here: nothing) and emit bytes.
  const std::vector<std::string> tokens{"a", "b", "ab"};
  CHECK(encode(make_bpe(tokens, {}, true), "ab") == std::vector<token_id>{2});
  CHECK(encode(make_bpe(tokens, {}, false), "ab") == std::vector<token_id>{0, 1});
}

TEST_CASE("a vocabulary with a token listed twice is refused", "[bpe]") {
  auto b = bpe::create({"a", "b", "a"}, {}, false);
  REQUIRE_FALSE(b.has_value());
  CHECK(b.error().code == errc::corrupt_data);
  CHECK_THAT(b.error().message, Catch::Matchers::Contains("'a'"));
  // Empty texts stand for "[EMPTY_<id>]", so two of them do not collide.
  CHECK(bpe::create({"", "", "x"}, {}, false).has_value());
}

namespace {

// Encodes every case of one expected-ids fixture; returns how many matched,
// failing a CHECK (with the text) for each that did not.
std::size_t check_against_llama(const std::string& vocab_file, const std::string& expected_file,
                                const std::string& pre) {
  const nlohmann::json vocab = read_json(fixtures + vocab_file);
  const auto tokens = vocab.at("tokens").get<std::vector<std::string>>();
  const auto merges = vocab.at("merges").get<std::vector<std::string>>();
  REQUIRE(merges.size() >= 8000);
  const nlohmann::json expected = read_json(fixtures + expected_file);
  REQUIRE(expected.at("pre") == pre);
  auto pt = pre_tokenizer::create(pre);
  REQUIRE(pt.has_value());
  const bpe b = make_bpe(tokens, merges, pt->traits().ignore_merges);
  bpe_piece_cache cache;
  std::size_t matched = 0;
  for (const auto& c : expected.at("cases")) {
    const auto text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<token_id>>();
    std::string scratch;
    auto pieces = pt->split(text, scratch);
    REQUIRE(pieces.has_value());
    std::vector<token_id> got, got_cached;
    for (auto p : *pieces) {
      b.encode_piece(p, got);
      b.encode_piece(p, got_cached, &cache);
    }
    CHECK(got_cached == got);
    INFO(vocab_file << " under " << pre << ", text " << nlohmann::json(text).dump());
    CHECK(nlohmann::json(got).dump() == nlohmann::json(want).dump());
    matched += got == want;
  }
  CHECK(expected.at("cases").size() >= 100);
  return matched;
}

}  // namespace

TEST_CASE("bpe ids equal llama.cpp's for every supported pre-tokenizer", "[bpe][llama.cpp]") {
  for (const char* pre : {"llama-bpe", "qwen2", "gpt-2", "default", "smollm", "starcoder", "qwen35",
                          "tekken", "gpt-4o"}) {
    const std::string file = std::string("bpe-expected-") + pre + ".json";
    const std::size_t n = read_json(fixtures + file).at("cases").size();
    CHECK(check_against_llama("bpe-vocab.json", file, pre) == n);
  }
}

TEST_CASE("bpe falls back as llama.cpp does where tokens are missing", "[bpe][llama.cpp]") {
  // Every 7th merged token and two byte tokens removed, a merge listed twice.
  for (const char* pre : {"llama-bpe", "gpt-2"}) {
    const std::string file = std::string("bpe-expected-holes-") + pre + ".json";
    const std::size_t n = read_json(fixtures + file).at("cases").size();
    CHECK(check_against_llama("bpe-holes-vocab.json", file, pre) == n);
  }
}
