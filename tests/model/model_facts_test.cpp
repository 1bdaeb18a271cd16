// What /v1/models says of a file: architecture, quantization, tokenizer.

#include <catch2/catch.hpp>

#include <vector>

#include "model/gguf_writer.hpp"
#include "model/model_facts.hpp"

using namespace exa;

namespace {

model::gguf_file parsed(const model::gguf_writer& w) {
  const std::vector<std::byte> bytes = w.serialize();
  auto f = model::gguf_file::parse(bytes);
  REQUIRE(f.has_value());
  return std::move(*f);
}

std::vector<std::byte> zeros(std::size_t n) { return std::vector<std::byte>(n); }

}  // namespace

TEST_CASE("model facts name llama.cpp's file type, the architecture and the tokenizer", "[model_facts]") {
  model::gguf_writer w;
  w.add_string("general.architecture", "qwen2");
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_u32("general.file_type", 15);
  const auto f = model::describe_model(parsed(w));
  CHECK(f.architecture == "qwen2");
  CHECK(f.tokenizer == "gpt2");
  CHECK(f.quantization == "Q4_K_M");
  CHECK(model::file_type_name(0) == "F32");
  CHECK(model::file_type_name(7) == "Q8_0");
  CHECK(model::file_type_name(17) == "Q5_K_M");
  CHECK(model::file_type_name(32) == "BF16");
  CHECK(model::file_type_name(5).empty());  // removed from llama.cpp
}

TEST_CASE("without a known file type the dominant 2-D weight type is the quantization", "[model_facts]") {
  model::gguf_writer w;
  w.add_string("general.architecture", "llama");
  w.add_u32("general.file_type", 9999);  // not a type llama.cpp defines
  // A large q8_0 matrix, a smaller f16 one, and an f32 norm that is not counted.
  w.add_tensor("a.weight", {64, 8}, model::tensor_type::q8_0, zeros(8 * 2 * 34));
  w.add_tensor("b.weight", {64, 4}, model::tensor_type::f16, zeros(64 * 4 * 2));
  w.add_tensor("n.weight", {4096}, model::tensor_type::f32, zeros(4096 * 4));
  const auto f = model::describe_model(parsed(w));
  CHECK(f.quantization == "q8_0");
  CHECK(f.tokenizer.empty());
}
