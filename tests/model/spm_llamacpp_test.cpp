// Our SentencePiece tokenizer against llama.cpp: tests/fixtures/tokenizer/
// spm-expected.json holds the ids llama.cpp gave for a few hundred strings
// (whitespace runs, digits, contractions, CJK, emoji sequences, combining
// marks, special-token texts, long inputs, random mixes) on the vocabulary
// spm-vocab.json, in three variants (add_space_prefix on and off, a Phi-3
// name), and the text llama.cpp decoded those ids to. The test builds the
// same GGUF files with generate_model and must agree on every id and text.
// scripts/make_spm_vocab.py regenerates both files.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/gguf.hpp"
#include "model/model_gen.hpp"
#include "model/tokenizer.hpp"
#include "model/vocab_json.hpp"

using namespace exa;
using namespace exa::model;
using json = nlohmann::json;

namespace {

const std::string fixtures = std::string(EXA_FIXTURES_DIR) + "/tokenizer/";

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::stringstream buf;
  buf << in.rdbuf();
  return json::parse(buf.str());
}

// The variant's GGUF, written as scripts/make_spm_vocab.py writes it (the
// same vocabulary overrides and general.name; the weights do not matter).
tokenizer variant_tokenizer(const json& variant) {
  auto v = vocab_from_json_file(fixtures + "spm-vocab.json");
  REQUIRE(v.has_value());
  const json& o = variant.at("overrides");
  if (o.contains("add_space_prefix")) v->add_space_prefix = o.at("add_space_prefix").get<bool>();
  if (o.contains("add_bos_token")) v->add_bos = o.at("add_bos_token").get<bool>();
  model_spec spec;
  spec.name = variant.at("model_name").get<std::string>();
  spec.n_layers = 1;
  spec.dim = 32;
  spec.n_heads = 2;
  spec.n_kv_heads = 1;
  spec.ff_dim = 64;
  spec.vocab_size = static_cast<std::uint32_t>(v->tokens.size());
  spec.vocabulary = std::move(*v);
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/spm-" + variant.at("name").get<std::string>() + ".gguf";
  REQUIRE(generate_model(spec, path).has_value());
  auto file = gguf_file::open(path);
  REQUIRE(file.has_value());
  auto tok = tokenizer::from_gguf(*file, spec.vocab_size);
  REQUIRE(tok.has_value());
  return std::move(*tok);
}

std::string show(const std::string& s) { return json(s).dump(); }

}  // namespace

TEST_CASE("SentencePiece ids and texts equal llama.cpp's on every fixture string", "[model][spm][llamacpp]") {
  const json expected = read_json(fixtures + "spm-expected.json");
  std::size_t strings = 0, ids_matched = 0, texts_matched = 0;
  for (const json& variant : expected.at("variants")) {
    const tokenizer tok = variant_tokenizer(variant);
    const json& info = variant.at("info");
    CHECK(tok.bos() == info.at("bos").get<token_id>());
    CHECK(tok.eos() == info.at("eos").get<token_id>());
    CHECK(tok.add_bos() == info.at("shouldPrependBos").get<bool>());
    // Two texts qualify as end of turn here (<|im_end|>, <|endoftext|>):
    // llama.cpp's choice depends on its hash map's order, which we reproduce.
    CHECK(tok.eot() == info.at("eot").get<token_id>());
    const json& cases = variant.at("cases");
    REQUIRE(cases.size() == expected.at("strings").size());
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const json& c = cases[i];
      const std::string text = expected.at("strings")[i].get<std::string>();
      const std::string want_detok = c.value("detok", text);
      const std::string want_detok_special = c.value("detok_special", text);
      INFO(variant.at("name").get<std::string>() << ": " << show(text));
      const auto want = c.at("ids").get<std::vector<token_id>>();
      const auto want_special = c.at("ids_special").get<std::vector<token_id>>();
      auto got = tok.encode(text, false, false);
      auto got_special = tok.encode(text, false, true);
      REQUIRE(got.has_value());
      REQUIRE(got_special.has_value());
      CHECK(*got == want);
      CHECK(*got_special == want_special);
      const std::string detok = tok.decode(want, false);
      const std::string detok_special = tok.decode(want_special, true);
      CHECK(detok == want_detok);
      CHECK(detok_special == want_detok_special);
      ++strings;
      ids_matched += (*got == want) + (*got_special == want_special);
      texts_matched += (detok == want_detok) + (detok_special == want_detok_special);
    }
  }
  WARN("llama.cpp cross-check: " << strings << " strings x 2 modes; ids matched " << ids_matched << "/"
                                 << 2 * strings << ", texts matched " << texts_matched << "/" << 2 * strings);
  CHECK(strings >= 600);
}

TEST_CASE("add_special adds BOS where llama.cpp's --bos does", "[model][spm][llamacpp]") {
  const json expected = read_json(fixtures + "spm-expected.json");
  const json& variant = expected.at("variants").at(0);
  const tokenizer tok = variant_tokenizer(variant);
  REQUIRE(tok.add_bos());
  for (std::size_t i = 0; i < variant.at("cases").size(); ++i) {
    auto want = variant.at("cases")[i].at("ids").get<std::vector<token_id>>();
    want.insert(want.begin(), *tok.bos());
    auto got = tok.encode(expected.at("strings")[i].get<std::string>(), true);
    REQUIRE(got.has_value());
    CHECK(*got == want);
  }
}
