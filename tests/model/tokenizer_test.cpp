// Tokenizers: the byte-level vocabulary (encode/decode, its GGUF round trip),
// foreign vocabularies read from GGUF metadata, and types we do not run,
// which decode but refuse to encode text. The SentencePiece algorithm itself
// is tested in spm_tokenizer_test.cpp, and against llama.cpp in
// spm_llamacpp_test.cpp.

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "model/gguf.hpp"
#include "model/gguf_writer.hpp"
#include "model/model_gen.hpp"
#include "model/tokenizer.hpp"

using namespace exa;
using namespace exa::model;
using Catch::Matchers::Contains;

namespace {

constexpr token_id space_token = 259;
const std::string spm_space = "\xE2\x96\x81";

gguf_file parse_or_fail(const gguf_writer& w) {
  auto f = gguf_file::parse(w.serialize());
  REQUIRE(f.has_value());
  return std::move(*f);
}

}  // namespace

TEST_CASE("byte-level tokenizer round-trips ASCII and UTF-8 text", "[model]") {
  const tokenizer tok = tokenizer::byte_level(260);
  CHECK(tok.can_encode());
  CHECK(tok.type_name() == "llama");
  CHECK(tok.vocab_size() == 260);
  CHECK(tok.bos() == 1);
  CHECK(tok.eos() == 2);

  for (const std::string text : {"hello world", "h\xC3\xA9llo w\xC3\xB6rld \xE2\x9C\x93", "",
                                 "  two  spaces\n\ttab\x01\xff"}) {
    INFO(text);
    auto ids = tok.encode(text, true);
    REQUIRE(ids.has_value());
    REQUIRE(ids->size() == text.size() + 1);
    CHECK(ids->front() == 1);
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      CHECK((*ids)[i + 1] == (b == ' ' ? space_token : static_cast<token_id>(3 + b)));
    }
    CHECK(tok.decode(*ids) == text);
  }
  auto no_bos = tok.encode("a b", false);
  REQUIRE(no_bos.has_value());
  CHECK(*no_bos == std::vector<token_id>{3 + 'a', space_token, 3 + 'b'});
}

TEST_CASE("byte-level decode_token handles every kind and range", "[model]") {
  const tokenizer tok = tokenizer::byte_level(300);
  CHECK(tok.decode_token(3 + 0x41) == "A");
  CHECK(tok.decode_token(3) == std::string(1, '\0'));
  CHECK(tok.decode_token(258) == "\xFF");
  CHECK(tok.decode_token(space_token) == " ");
  CHECK(tok.decode_token(0).empty());    // <unk>
  CHECK(tok.decode_token(1).empty());    // <s>
  CHECK(tok.decode_token(2).empty());    // </s>
  CHECK(tok.decode_token(299).empty());  // unused padding
  CHECK(tok.decode_token(300).empty());  // out of range
  CHECK(tok.decode_token(-1).empty());
  CHECK(tok.decode({1, 3 + 'h', 3 + 'i', 2, 280}) == "hi");
}

TEST_CASE("byte-level tokenizer survives a GGUF round trip", "[model]") {
  gguf_writer w;
  tokenizer::byte_level(300).write_gguf(w);
  const gguf_file f = parse_or_fail(w);
  CHECK(f.get_string("tokenizer.ggml.model").value() == "llama");
  CHECK(f.get_array("tokenizer.ggml.tokens").value()->strings.size() == 300);
  CHECK(f.get_array("tokenizer.ggml.tokens").value()->strings[259] == spm_space);
  CHECK(f.get_array("tokenizer.ggml.tokens").value()->strings[3 + 0x0a] == "<0x0A>");
  CHECK(f.get_bool("tokenizer.ggml.add_bos_token").value());
  CHECK_FALSE(f.get_bool("tokenizer.ggml.add_space_prefix").value());

  auto tok = tokenizer::from_gguf(f, 300);
  REQUIRE(tok.has_value());
  CHECK(tok->can_encode());
  CHECK(tok->bos() == 1);
  CHECK(tok->eos() == 2);
  const auto a = tok->encode("round trip", true);
  const auto b = tokenizer::byte_level(300).encode("round trip", true);
  REQUIRE(a.has_value());
  CHECK(*a == *b);
}

TEST_CASE("a generated model's tokenizer is byte-level", "[model]") {
  std::filesystem::create_directories(EXA_TEST_TMPDIR);
  const std::string path = std::string(EXA_TEST_TMPDIR) + "/tokenizer-tiny.gguf";
  REQUIRE(generate_model(*preset_spec("tiny"), path).has_value());
  auto f = gguf_file::open(path);
  REQUIRE(f.has_value());
  auto tok = tokenizer::from_gguf(*f, 260);
  REQUIRE(tok.has_value());
  CHECK(tok->can_encode());
  CHECK(tok->type_name() == "llama");
  auto ids = tok->encode("hi there", true);
  REQUIRE(ids.has_value());
  CHECK(ids->at(3) == space_token);
  CHECK(tok->decode(*ids) == "hi there");
}

TEST_CASE("a gpt2 vocabulary decodes its byte-level text and encodes", "[model]") {
  gguf_writer w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  // GPT-2 stores bytes as printable code points: U+0120 'Ġ' is a space, U+010A 'Ċ' a newline.
  w.add_string_array("tokenizer.ggml.tokens",
                     {"<|endoftext|>", "Hello", "\xC4\xA0world", "!", "\xC4\x8A", "<tool>"});
  w.add_i32_array("tokenizer.ggml.token_type", {3, 1, 1, 1, 1, 4});
  w.add_string_array("tokenizer.ggml.merges", {"H e"});
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_u32("tokenizer.ggml.eos_token_id", 0);
  const gguf_file f = parse_or_fail(w);
  auto tok = tokenizer::from_gguf(f, 6);
  REQUIRE(tok.has_value());
  CHECK(tok->type_name() == "gpt2");
  CHECK(tok->can_encode());
  CHECK(tok->decode({0, 1, 2, 3, 4}) == "Hello world!\n");
  CHECK(tok->decode_token(5) == "<tool>");  // user-defined: verbatim
  CHECK(tok->is_eog(0));
  auto enc = tok->encode("<tool>", false);
  REQUIRE(enc.has_value());
  CHECK(*enc == std::vector<token_id>{5});
}

TEST_CASE("a vocabulary type we do not run decodes but refuses to encode text", "[model]") {
  gguf_writer w;
  w.add_string("tokenizer.ggml.model", "t5");
  w.add_string_array("tokenizer.ggml.tokens", {"<pad>", "</s>", "\xE2\x96\x81hi"});
  const gguf_file f = parse_or_fail(w);
  auto tok = tokenizer::from_gguf(f, 3);
  REQUIRE(tok.has_value());
  CHECK_FALSE(tok->can_encode());
  CHECK(tok->decode_token(2) == " hi");
  auto enc = tok->encode("hi", true);
  REQUIRE_FALSE(enc.has_value());
  CHECK(enc.error().code == errc::unsupported);
  CHECK_THAT(enc.error().message, Contains("'t5'") && Contains("--prompt-ids"));
}

TEST_CASE("a SentencePiece vocabulary that is not ours encodes with SentencePiece", "[model]") {
  tokenizer ours = tokenizer::byte_level(262);
  gguf_writer w;
  w.add_string("tokenizer.ggml.model", "llama");
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.emplace_back(buf);
  }
  tokens.push_back(spm_space);
  tokens.push_back(spm_space + "hello");  // a merged piece: needs a real SentencePiece
  std::vector<std::int32_t> types(tokens.size(), 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  for (int b = 0; b < 256; ++b) types[3 + b] = 6;
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  const gguf_file f = parse_or_fail(w);
  auto tok = tokenizer::from_gguf(f, 261);
  REQUIRE(tok.has_value());
  CHECK(tok->can_encode());
  // No add_space_prefix key: llama.cpp's default for "llama" is true, so
  // "hello" becomes "▁hello" and decoding drops the first leading space.
  // SentencePiece only merges pairs that are pieces themselves, and no
  // "▁h" or "he" exists, so "▁hello" cannot form: ▁ and five bytes.
  CHECK(tok->add_space_prefix());
  CHECK(tok->decode_token(260) == " hello");
  CHECK(tok->decode({260, 3 + '!'}) == "hello!");
  auto enc = tok->encode("hello", false);
  REQUIRE(enc.has_value());
  CHECK(*enc == std::vector<token_id>{259, 3 + 'h', 3 + 'e', 3 + 'l', 3 + 'l', 3 + 'o'});
  auto with_bos = tok->encode("!", true);
  REQUIRE(with_bos.has_value());
  CHECK(*with_bos == std::vector<token_id>{1, 259, 3 + '!'});
  CHECK(ours.can_encode());
}

TEST_CASE("tokenizer arrays shorter or longer than the model vocabulary stay in range", "[model]") {
  gguf_writer w;
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", {"<unk>", spm_space + "a", "b"});
  w.add_f32_array("tokenizer.ggml.scores", {0.0f});
  const gguf_file f = parse_or_fail(w);

  auto longer = tokenizer::from_gguf(f, 10);
  REQUIRE(longer.has_value());
  CHECK(longer->vocab_size() == 10);
  CHECK(longer->decode_token(1) == " a");
  CHECK(longer->decode_token(2) == "b");
  CHECK(longer->decode_token(7).empty());
  CHECK(longer->decode_token(10).empty());

  auto shorter = tokenizer::from_gguf(f, 2);
  REQUIRE(shorter.has_value());
  CHECK(shorter->vocab_size() == 2);
  CHECK(shorter->decode_token(2).empty());
}

TEST_CASE("tokenizer metadata errors name the key", "[model]") {
  gguf_writer w;
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_u32("tokenizer.ggml.eos_token_id", 500);
  const gguf_file f = parse_or_fail(w);
  auto tok = tokenizer::from_gguf(f, 260);
  REQUIRE_FALSE(tok.has_value());
  CHECK(tok.error().code == errc::invalid_argument);
  CHECK_THAT(tok.error().message, Contains("tokenizer.ggml.eos_token_id"));

  gguf_writer bad_tokens;
  bad_tokens.add_i32_array("tokenizer.ggml.tokens", {1, 2});
  auto t2 = tokenizer::from_gguf(parse_or_fail(bad_tokens), 2);
  REQUIRE_FALSE(t2.has_value());
  CHECK_THAT(t2.error().message, Contains("tokenizer.ggml.tokens"));
}

TEST_CASE("a file without tokenizer metadata gives a tokenizer that cannot encode", "[model]") {
  gguf_writer w;
  w.add_string("general.architecture", "llama");
  const gguf_file f = parse_or_fail(w);
  auto tok = tokenizer::from_gguf(f, 300);
  REQUIRE(tok.has_value());
  CHECK(tok->type_name() == "none");
  CHECK(tok->vocab_size() == 300);
  CHECK_FALSE(tok->bos().has_value());
  CHECK(tok->decode_token(5).empty());
  auto enc = tok->encode("x", true);
  REQUIRE_FALSE(enc.has_value());
  CHECK(enc.error().code == errc::unsupported);
  CHECK_THAT(enc.error().message, Contains("'none'"));
}
