// gen-model --vocab's JSON vocabularies: what a file may say, what it may
// not, and that the written GGUF carries it back unchanged.

#include <catch2/catch.hpp>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/tokenizer.hpp"
#include "model/vocab_json.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;

TEST_CASE("a JSON vocabulary round-trips through GGUF metadata", "[model][vocab]") {
  auto v = vocab_from_json(R"({"model": "llama", "tokens": ["<unk>", "<s>", "</s>", "\u2581", "<|eot_id|>"],
      "scores": [0, 0, 0, -1.5, 0], "token_type": [2, 3, 3, 1, 3], "bos_token_id": 1, "eos_token_id": 2,
      "eot_token_id": 4, "unknown_token_id": 0, "add_bos_token": false, "add_eos_token": true,
      "add_space_prefix": true, "chat_template": "{{ bos_token }}"})");
  REQUIRE(v.has_value());
  gguf_writer w;
  v->write_gguf(w);
  auto f = gguf_file::parse(w.serialize());
  REQUIRE(f.has_value());
  auto back = vocab::from_gguf(*f);
  REQUIRE(back.has_value());
  CHECK(back->model == "llama");
  CHECK(back->tokens == v->tokens);
  CHECK(back->scores == v->scores);
  CHECK(back->kinds == v->kinds);
  CHECK(back->ids.eot == 4);
  CHECK(back->add_bos == false);
  CHECK(back->add_eos == true);
  CHECK(back->chat_template == "{{ bos_token }}");
  auto tok = tokenizer::from_gguf(*f, 5);
  REQUIRE(tok.has_value());
  CHECK_FALSE(tok->add_bos());
  CHECK(tok->add_eos());
  CHECK(tok->eot() == 4);
  CHECK(tok->token_text(*tok->bos()) == "<s>");
  CHECK(tok->chat_template() == "{{ bos_token }}");
  CHECK(*tok->encode("", true) == std::vector<token_id>{2});
  CHECK(*tok->encode(" ", false) == std::vector<token_id>{3, 3});  // the space prefix, then the space
}

TEST_CASE("JSON vocabulary errors name the field", "[model][vocab]") {
  struct bad {
    const char* json;
    const char* message;
  };
  const bad cases[] = {
      {"[1]", "JSON object"},
      {"{\"tokens\": [\"a\"", "not JSON"},
      {"{}", "\"tokens\""},
      {"{\"tokens\": [\"a\", 3]}", "\"tokens\"[1]"},
      {"{\"tokens\": [\"a\", \"a\"]}", "appears twice"},
      {"{\"tokens\": [\"a\", \"\"]}", "token 1"},
      {"{\"tokens\": [\"a\"], \"scores\": [1, 2]}", "2 scores for 1 tokens"},
      {"{\"tokens\": [\"a\"], \"token_type\": [7]}", "\"token_type\"[0]"},
      {"{\"tokens\": [\"a\"], \"bos_token_id\": 1}", "bos_token_id = 1 is out of range"},
      {"{\"tokens\": [\"a\"], \"eos_token_id\": -1}", "\"eos_token_id\""},
      {"{\"tokens\": [\"a\"], \"add_bos_token\": 1}", "\"add_bos_token\""},
      {"{\"tokens\": [\"a\"], \"merges\": [1]}", "\"merges\"[0]"},
      {"{\"tokens\": [\"a\"], \"bos\": 0}", "unknown vocabulary field \"bos\""},
  };
  for (const bad& b : cases) {
    INFO(b.json);
    auto v = vocab_from_json(b.json);
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().code == errc::invalid_argument);
    CHECK_THAT(v.error().message, Contains(b.message));
  }
  auto missing = vocab_from_json_file("/nonexistent/vocab.json");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == errc::io_error);
}
