// The exaserve command-line contract: outputs scripts rely on, exit statuses,
// and errors that name the problem -- never a signal, whatever the input.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/cpu_engine.hpp"
#include "engine/thread_pool.hpp"
#include "gpu/cpu_memory_pool.hpp"
#include "model/gguf_writer.hpp"
#include "model/llama_model.hpp"
#include "run_command.hpp"
#include "../common/poisoned_model.hpp"

using namespace exa;

namespace {

const std::string exaserve = std::string(EXA_BIN_DIR) + "/exaserve";

std::string tmp(const std::string& name) {
  const std::string dir = std::string(EXA_TEST_TMPDIR) + "/cli";
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

test::command_result run(std::vector<std::string> args) {
  args.insert(args.begin(), exaserve);
  auto r = test::run_command(args);
  INFO("stderr: " << r.err);
  REQUIRE_FALSE(r.signaled);
  return r;
}

const std::string& tiny_model() {
  static const std::string path = [] {
    const std::string p = tmp("tiny.gguf");
    auto r = run({"gen-model", "--preset", "tiny", "--seed", "3", "--out", p});
    REQUIRE(r.exit_code == 0);
    return p;
  }();
  return path;
}

std::vector<std::int32_t> parse_ids(const std::string& line) {
  std::vector<std::int32_t> ids;
  std::stringstream ss(line);
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

}  // namespace

TEST_CASE("generate --ids prints the engine's greedy tokens", "[cli]") {
  const auto r = run({"generate", "--model", tiny_model(), "--prompt-ids", "1,72,105,33", "--max-tokens", "12",
                      "--ids", "--ignore-eos", "--threads", "1"});
  REQUIRE(r.exit_code == 0);
  const auto ids = parse_ids(r.out);
  REQUIRE(ids.size() == 12);

  // The same request straight through the engine, in-process.
  auto m = model::llama_model::load(tiny_model());
  REQUIRE(m.has_value());
  auto pool = gpu::cpu_memory_pool::create(engine::cpu_engine::kv_block_bytes((*m)->config(), 16), 4);
  REQUIRE(pool.has_value());
  engine::thread_pool threads(2);
  engine::cpu_engine eng(*m, **pool, threads);
  engine::generation_request req;
  req.prompt = {1, 72, 105, 33};
  req.max_tokens = 12;
  REQUIRE(eng.submit(req));
  std::vector<std::int32_t> expected;
  while (!eng.idle())
    for (const auto& t : eng.step().tokens) expected.push_back(t.token);
  CHECK(ids == expected);
}

TEST_CASE("generate on a model file that overflows prints what came before and fails naming the problem", "[cli]") {
  // Token 105 of the prompt has an infinite embedding: nothing can follow it.
  const std::string poisoned = test::write_poisoned_copy(tiny_model(), 105);
  auto r = run({"generate", "--model", poisoned, "--prompt-ids", "1,72,105,33", "--max-tokens", "12", "--ids",
                "--ignore-eos", "--threads", "1"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("no finite logit for generated token 0"));
  // A prompt without it generates as on the clean file.
  const std::vector<std::string> clean_args = {"--prompt-ids", "1,72,104,33", "--max-tokens", "6", "--ids",
                                               "--ignore-eos", "--threads", "1"};
  auto args = clean_args;
  args.insert(args.begin(), {"generate", "--model", tiny_model()});
  const auto clean = run(args);
  args[2] = poisoned;
  const auto same = run(args);
  REQUIRE(clean.exit_code == 0);
  const auto ids = parse_ids(clean.out);
  REQUIRE(std::find(ids.begin(), ids.end(), 105) == ids.end());  // nor does it generate the token
  CHECK(same.exit_code == 0);
  CHECK(same.out == clean.out);
}

TEST_CASE("check-model passes a clean file and names the tensor, row and column of a non-finite value",
          "[cli]") {
  auto r = run({"check-model", "--model", tiny_model()});
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("OK: every value is finite"));
  const std::string poisoned = test::write_poisoned_copy(tiny_model(), 105);
  r = run({"check-model", "--model", poisoned});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("token_embd.weight: 1 of "));
  CHECK_THAT(r.out, Catch::Contains("the first at row 105, column 0"));
  CHECK_THAT(r.out, Catch::Contains("FAIL: 1 non-finite value in 1 tensor;"));
  r = run({"check-model", "--model", poisoned, "--json"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains(R"("nonfinite":1,"nonfinite_tensors":[{"tensor":"token_embd.weight","nonfinite":1,"first_row":105,"first_col":0,"nonfinite_blocks":1,"block_values":1}])"));
  // A quantized file: the whole block of the poisoned scale, and which
  // fields can be the cause.
  const std::string q8 = tmp("tiny-q8_0.gguf");
  REQUIRE(run({"gen-model", "--preset", "tiny", "--seed", "3", "--type", "q8_0", "--out", q8}).exit_code == 0);
  r = run({"check-model", "--model", test::write_poisoned_copy(q8, 105)});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("token_embd.weight: 32 of ") &&
                        Catch::Contains(" values NaN or infinite in 1 block (32 values each: their f16 scale), "
                                        "the first at row 105, column 0"));
  // Not a model, no file, no --model: errors that name the problem.
  r = run({"check-model", "--model", tmp("no-such.gguf")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("no-such.gguf"));
  r = run({"check-model"});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("--model FILE is required"));
}

TEST_CASE("generate --tp 2 runs over two CPU devices and prints one device's greedy tokens", "[cli][tp]") {
  const std::vector<std::string> base = {"generate", "--model", tiny_model(), "--prompt-ids", "1,72,105,33",
                                         "--max-tokens", "12", "--ids", "--ignore-eos"};
  auto with = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  const auto one = with({"--threads", "1"});
  const auto two = with({"--threads", "2", "--tp", "2"});
  REQUIRE(one.exit_code == 0);
  REQUIRE(two.exit_code == 0);
  // Logits differ from one device's by float rounding only (tests/engine/
  // tp_test.cpp bounds it); this prompt has no near tie in 12 steps.
  CHECK(parse_ids(two.out) == parse_ids(one.out));
  CHECK_THAT(two.err, Catch::Contains("event=tensor_parallel devices=2 threads_per_device=1"));

  const auto uneven = with({"--tp", "4"});  // the tiny model has 2 KV heads
  CHECK(uneven.exit_code != 0);
  CHECK_THAT(uneven.err, Catch::Contains("attention.head_count_kv (2) is not divisible by the tensor-parallel size 4"));
  const auto zero = with({"--tp", "0"});
  CHECK(zero.exit_code != 0);
  CHECK_THAT(zero.err, Catch::Contains("--tp"));
}

TEST_CASE("generate with a text prompt prints valid text and is reproducible", "[cli]") {
  const std::vector<std::string> args = {"generate", "--model", tiny_model(), "--prompt", "Hello", "--max-tokens", "20",
                                         "--temperature", "0.9", "--seed", "5"};
  const auto a = run(args), b = run(args);
  REQUIRE(a.exit_code == 0);
  CHECK(a.out == b.out);
  CHECK_FALSE(a.out.empty());
}

TEST_CASE("gen-model is deterministic and validates its flags", "[cli]") {
  const auto p1 = tmp("q8a.gguf"), p2 = tmp("q8b.gguf");
  REQUIRE(run({"gen-model", "--preset", "tiny", "--type", "q8_0", "--seed", "9", "--out", p1}).exit_code == 0);
  REQUIRE(run({"gen-model", "--preset", "tiny", "--type", "q8_0", "--seed", "9", "--out", p2}).exit_code == 0);
  std::ifstream f1(p1, std::ios::binary), f2(p2, std::ios::binary);
  CHECK(std::string(std::istreambuf_iterator<char>(f1), {}) == std::string(std::istreambuf_iterator<char>(f2), {}));

  auto bad = run({"gen-model", "--preset", "huge", "--out", p1});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("unknown preset 'huge'"));
  bad = run({"gen-model", "--preset", "tiny", "--heads", "5", "--out", p1});
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("head"));
  bad = run({"gen-model", "--type", "q3_k", "--out", p1});
  CHECK_THAT(bad.err, Catch::Contains("unknown --type"));
  CHECK(run({"gen-model", "--preset", "tiny"}).exit_code == 2);  // no --out
}

TEST_CASE("bad flags and bad files end in an error, never a signal", "[cli]") {
  struct bad_case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::string garbage = tmp("garbage.gguf"), truncated = tmp("truncated.gguf");
  {
    std::ofstream(garbage, std::ios::binary) << std::string(4096, '\x7f');
    std::ifstream in(tiny_model(), std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  const std::vector<bad_case> cases = {
      {{"frobnicate"}, "unknown command"},
      {{"generate", "--model", tiny_model()}, "--prompt"},
      {{"generate", "--model", tiny_model(), "--prompt", "a", "--prompt-ids", "1"}, "exactly one"},
      {{"generate", "--model", tiny_model(), "--prompt-ids", "1,,2"}, "bad token id"},
      {{"generate", "--model", tiny_model(), "--prompt-ids", "1,99999"}, "outside the vocabulary"},
      {{"generate", "--model", tiny_model(), "--prompt", "a", "--max-tokens", "-3"}, "--max-tokens"},
      {{"generate", "--model", tiny_model(), "--prompt", "a", "--max-tokens", "100000"}, "context length"},
      {{"generate", "--model", tiny_model(), "--prompt", "a", "--temperature", "hot"}, "--temperature"},
      {{"generate", "--model", tiny_model(), "--prompt", "a", "--bogus"}, "unknown flag --bogus"},
      {{"generate", "--model", "/nonexistent/x.gguf", "--prompt", "a"}, "No such file"},
      {{"generate", "--model", garbage, "--prompt", "a"}, "magic"},
      {{"generate", "--model", truncated, "--prompt", "a"}, "past end of file"},
      {{"bench-engine"}, "--model"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.args);
    const auto r = run(c.args);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, Catch::Contains(c.message));
  }
}

TEST_CASE("a vocabulary we cannot encode still generates from ids", "[cli]") {
  // The tiny model's tensors with a t5-type vocabulary (one we do not encode) of the same size.
  auto m = model::llama_model::load(tiny_model());
  REQUIRE(m.has_value());
  model::gguf_writer w;
  for (const auto& kv : (*m)->file().metadata()) {
    if (kv.key.rfind("tokenizer.", 0) == 0 || kv.key == "general.alignment") continue;
    const auto& v = kv.value;
    if (auto* i = std::get_if<std::int64_t>(&v.v)) w.add_u32(kv.key, static_cast<std::uint32_t>(*i));
    else if (auto* f = std::get_if<double>(&v.v)) w.add_f32(kv.key, static_cast<float>(*f));
    else if (auto* s = std::get_if<std::string>(&v.v)) w.add_string(kv.key, *s);
  }
  std::vector<std::string> tokens;
  for (std::uint32_t i = 0; i < (*m)->config().vocab_size; ++i) tokens.push_back("tok" + std::to_string(i));
  w.add_string("tokenizer.ggml.model", "t5");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  for (const auto& t : (*m)->file().tensors())
    w.add_tensor(t.name, t.shape, *t.type, std::span<const std::byte>(t.data, t.size_bytes));
  const auto path = tmp("t5-vocab.gguf");
  REQUIRE(w.write(path));

  auto text = run({"generate", "--model", path, "--prompt", "hi"});
  CHECK(text.exit_code != 0);
  CHECK_THAT(text.err, Catch::Contains("tokenizer type 't5'"));
  auto ids = run({"generate", "--model", path, "--prompt-ids", "5,6,7", "--max-tokens", "4", "--ids"});
  CHECK(ids.exit_code == 0);
  CHECK(parse_ids(ids.out).size() == 4);
}

TEST_CASE("tokenize and detokenize follow llama.cpp on a --vocab model", "[cli]") {
  // A SentencePiece vocabulary whose pieces build "hello" step by step; the
  // ids below are the ones llama.cpp gives for this file.
  const std::string vocab_path = tmp("cli-spm-vocab.json");
  {
    std::ofstream out(vocab_path);
    out << R"({"model": "llama", "tokens": ["<unk>", "<s>", "</s>")";
    for (int b = 0; b < 256; ++b) {
      char buf[16];
      std::snprintf(buf, sizeof buf, ", \"<0x%02X>\"", b);
      out << buf;
    }
    out << R"(, "\u2581", "\u2581h", "\u2581he", "\u2581hel", "\u2581hell", "\u2581hello", "l", "e", "h", "o",)"
        << R"( "<|eot_id|>", "<tool>"], "scores": [0, 0, 0)";
    for (int b = 0; b < 256; ++b) out << ", 0";
    out << R"(, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10, 0, 0], "token_type": [2, 3, 3)";
    for (int b = 0; b < 256; ++b) out << ", 6";
    out << R"(, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4], "bos_token_id": 1, "eos_token_id": 2})";
  }
  const std::string model_path = tmp("cli-spm.gguf");
  REQUIRE(run({"gen-model", "--vocab", vocab_path, "--out", model_path}).exit_code == 0);

  auto plain = run({"tokenize", "--model", model_path, "--text", "hello hell"});
  CHECK(plain.exit_code == 0);
  CHECK(plain.out == "264,263\n");
  CHECK(run({"tokenize", "--model", model_path, "--text", "hello", "--bos"}).out == "1,264\n");
  // <|eot_id|> is plain text unless --special; <tool> (user-defined) always parses.
  auto special = run({"tokenize", "--model", model_path, "--text", "he<|eot_id|>llo<tool>x", "--special"});
  CHECK(special.out == "261,269,259,265,265,268,270,259,123\n");
  auto not_special = run({"tokenize", "--model", model_path, "--text", "he<|eot_id|>llo<tool>x"});
  CHECK(parse_ids(not_special.out).size() == 17);

  auto text = run({"detokenize", "--model", model_path, "--ids", "264,263"});
  CHECK(text.exit_code == 0);
  CHECK(text.out == "hello hell");  // exactly, no newline added
  CHECK(run({"detokenize", "--model", model_path, "--ids", "1,264,269"}).out == " hello");
  CHECK(run({"detokenize", "--model", model_path, "--ids", "1,264,269", "--special"}).out == "<s> hello<|eot_id|>");

  auto out_of_range = run({"detokenize", "--model", model_path, "--ids", "5,99999"});
  CHECK(out_of_range.exit_code != 0);
  CHECK_THAT(out_of_range.err, Catch::Contains("99999"));
  auto both = run({"tokenize", "--model", model_path, "--text", "a", "--text-file", vocab_path});
  CHECK(both.exit_code != 0);
  CHECK_THAT(both.err, Catch::Contains("exactly one of --text"));
  auto missing = run({"tokenize", "--model", tmp("no-such.gguf"), "--text", "a"});
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.err, Catch::Contains("no-such.gguf"));
}

TEST_CASE("bench-engine --json reports the documented fields", "[cli]") {
  const auto r = run({"bench-engine", "--model", tiny_model(), "--json", "--batches", "1,4", "--prefill-tokens", "32",
                      "--decode-steps", "4", "--repeat", "1", "--threads", "1"});
  REQUIRE(r.exit_code == 0);
  for (const char* field : {"\"copy_gbps\":", "\"prefill_tok_s\":", "\"stage_launch_us\":0.00", "\"decode\":[", "\"batch\":1", "\"batch\":4",
                            "\"tok_s\":", "\"weight_gbps\":", "\"matmul_gmacs\":", "\"roofline_tok_s\":",
                            "\"roofline\":{", "\"matmul_macs_per_token\":", "\"peak\":\"f32\"", "\"read_gbps\":",
                            "\"weight_copy_bytes\":", "\"huge_pages\":"})
    CHECK_THAT(r.out, Catch::Contains(field));
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);  // one JSON object on one line
  CHECK_THAT(r.out, !Catch::Contains("\"peak_gmacs\":0.00"));  // measured
  CHECK_THAT(r.out, !Catch::Contains("\"roofline_tok_s\":0.0"));
  // Each batch against batch 1 (the batch-32 target's ratio): 1 for batch 1
  // itself, batch 4's tokens/s over batch 1's (to the printed rounding).
  const auto number_after = [&](const std::string& key, std::size_t from) {
    const auto at = r.out.find(key, from);
    REQUIRE(at != std::string::npos);
    return std::stod(r.out.substr(at + key.size()));
  };
  const auto b1 = r.out.find("\"batch\":1,"), b4 = r.out.find("\"batch\":4,");
  REQUIRE(b1 != std::string::npos);
  REQUIRE(b4 != std::string::npos);
  CHECK(number_after("\"vs_batch1\":", b1) == Approx(1.0));
  const double ratio4 = number_after("\"tok_s\":", b4) / number_after("\"tok_s\":", b1);
  CHECK(number_after("\"vs_batch1\":", b4) == Approx(ratio4).margin(0.006));

  // --no-copy-bandwidth skips the machine measurements: no peaks, no bound.
  const auto quick = run({"bench-engine", "--model", tiny_model(), "--json", "--batches", "1", "--prefill-tokens",
                          "8", "--decode-steps", "2", "--repeat", "1", "--threads", "1", "--no-copy-bandwidth"});
  REQUIRE(quick.exit_code == 0);
  CHECK_THAT(quick.out, Catch::Contains("\"peak_gmacs\":0.00"));
  CHECK_THAT(quick.out, Catch::Contains("\"roofline_tok_s\":0.0"));
  // The table says the same; without batch 1 there is no ratio.
  const auto table = run({"bench-engine", "--model", tiny_model(), "--batches", "1,2", "--prefill-tokens", "8",
                          "--decode-steps", "2", "--repeat", "1", "--threads", "1", "--no-copy-bandwidth"});
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::Contains("vs b1"));
  CHECK_THAT(table.out, Catch::Contains("1.00x"));
  const auto table_no_b1 = run({"bench-engine", "--model", tiny_model(), "--batches", "2", "--prefill-tokens", "8",
                                "--decode-steps", "2", "--repeat", "1", "--threads", "1", "--no-copy-bandwidth"});
  REQUIRE(table_no_b1.exit_code == 0);
  CHECK_THAT(table_no_b1.out, Catch::EndsWith("        -\n"));  // the ratio column of the one row
  CHECK_THAT(table_no_b1.out, !Catch::Contains("x\n"));
  const auto no_b1 = run({"bench-engine", "--model", tiny_model(), "--json", "--batches", "2", "--prefill-tokens", "8",
                          "--decode-steps", "2", "--repeat", "1", "--threads", "1", "--no-copy-bandwidth"});
  REQUIRE(no_b1.exit_code == 0);
  CHECK_THAT(no_b1.out, Catch::Contains("\"vs_batch1\":0.00"));
  // The tiny model is f32: its matrices are copied by default (under 2 MiB:
  // not worth a huge page), read from the file's mapping when asked.
  CHECK_THAT(quick.out, !Catch::Contains("\"weight_copy_bytes\":0,"));
  CHECK_THAT(quick.out, Catch::Contains("\"huge_pages\":false"));
  const auto mapped = run({"bench-engine", "--model", tiny_model(), "--json", "--batches", "1", "--prefill-tokens",
                           "8", "--decode-steps", "2", "--repeat", "1", "--threads", "1", "--no-copy-bandwidth",
                           "--mapped-weights"});
  REQUIRE(mapped.exit_code == 0);
  CHECK_THAT(mapped.out, Catch::Contains("\"weight_copy_bytes\":0,"));
}
