// exaserve tokenize / detokenize: a model file's tokenizer on the command
// line, with llama.cpp's semantics (llama_tokenize with add_special = --bos
// and parse_special = --special; llama_detokenize with remove_special = false
// and unparse_special = --special). Only the tokenizer metadata is read; the
// file needs no loadable weights.

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"
#include "model/gguf.hpp"
#include "model/tokenizer.hpp"

namespace exa::app {
namespace {

// Texts above the tokenizer's own limit are refused there; files are read up
// to the same size.
constexpr std::size_t max_text_file_bytes = model::tokenizer_max_text_bytes;

const std::vector<flag_spec> tokenize_flags = {
    {"model", true, "GGUF file whose tokenizer to use (required)"},
    {"text", true, "the text to tokenize"},
    {"text-file", true, "read the text from this file instead (bytes as they are)"},
    {"special", false, "parse control tokens' texts (e.g. <|eot_id|>) as those tokens"},
    {"bos", false, "add BOS/EOS as the file says (add_bos_token / add_eos_token)"},
    {"repeat", true, "tokenize N times and report the speed on stderr (benchmarks; default 1)"},
    {"help", false, "show this help"},
};

const std::vector<flag_spec> detokenize_flags = {
    {"model", true, "GGUF file whose tokenizer to use (required)"},
    {"ids", true, "comma-separated token ids (required)"},
    {"special", false, "show control tokens' texts instead of hiding them"},
    {"help", false, "show this help"},
};

expected<model::tokenizer> load_tokenizer(const std::string& path) {
  auto file = model::gguf_file::open(path);
  if (!file) return std::unexpected(file.error());
  const auto* tokens = file->find("tokenizer.ggml.tokens");
  if (tokens == nullptr) {
    return make_error(errc::unsupported, fmt::format("{} has no tokenizer (no tokenizer.ggml.tokens)", path));
  }
  auto list = file->get_array("tokenizer.ggml.tokens");
  if (!list) return std::unexpected(list.error());
  return model::tokenizer::from_gguf(*file, static_cast<std::uint32_t>((*list)->size()));
}

expected<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::io_error, fmt::format("cannot open {}", path));
  std::ostringstream buf;
  buf << in.rdbuf();
  std::string text = std::move(buf).str();
  if (text.size() > max_text_file_bytes) {
    return make_error(errc::invalid_argument,
                      fmt::format("{} is larger than {} bytes", path, max_text_file_bytes));
  }
  return text;
}

expected<std::string> input_text(const args& a) {
  if (a.has("text") == a.has("text-file")) {
    return make_error(errc::invalid_argument, "give exactly one of --text TEXT or --text-file FILE");
  }
  if (auto t = a.get("text")) return *t;
  return read_text_file(*a.get("text-file"));
}

std::string join_ids(const std::vector<model::token_id>& ids) {
  std::string out;
  out.reserve(ids.size() * 6);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, tokenize_flags);
  if (!a) return fail("tokenize", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve tokenize --model FILE (--text TEXT | --text-file FILE) [--special] [--bos]\n"
                "Prints the ids comma-separated on one line, as llama.cpp tokenizes: no BOS/EOS unless\n"
                "--bos, special-token texts are plain text unless --special.\n%s",
                describe_flags(tokenize_flags).c_str());
    return 0;
  }
  const auto path = a->get("model");
  if (!path) return fail("tokenize", {errc::invalid_argument, "--model FILE is required"});
  auto repeat = a->get_int("repeat", 1, 1, 1'000'000);
  if (!repeat) return fail("tokenize", repeat.error());
  auto text = input_text(*a);
  if (!text) return fail("tokenize", text.error());
  auto tok = load_tokenizer(*path);
  if (!tok) return fail("tokenize", tok.error());
  const auto t0 = std::chrono::steady_clock::now();
  expected<std::vector<model::token_id>> ids;
  for (std::int64_t i = 0; i < *repeat; ++i) ids = tok->encode(*text, a->has("bos"), a->has("special"));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!ids) return fail("tokenize", ids.error());
  if (*repeat > 1) {
    const double mb = static_cast<double>(text->size()) * static_cast<double>(*repeat) / 1e6;
    std::fprintf(stderr, "tokenize: %zu bytes x %lld in %.3f s = %.2f MB/s, %zu tokens\n", text->size(),
                 static_cast<long long>(*repeat), secs, mb / secs, ids->size());
  }
  std::printf("%s\n", join_ids(*ids).c_str());
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, detokenize_flags);
  if (!a) return fail("detokenize", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve detokenize --model FILE --ids 1,2,3 [--special]\n"
                "Prints the text exactly, with no newline added, as llama.cpp detokenizes: control tokens\n"
                "hidden unless --special, the first token's leading space dropped when the file adds a\n"
                "space prefix.\n%s",
                describe_flags(detokenize_flags).c_str());
    return 0;
  }
  const auto path = a->get("model");
  if (!path) return fail("detokenize", {errc::invalid_argument, "--model FILE is required"});
  const auto id_text = a->get("ids");
  if (!id_text) return fail("detokenize", {errc::invalid_argument, "--ids 1,2,3 is required"});
  auto ids = parse_id_list(*id_text);
  if (!ids) return fail("detokenize", ids.error());
  auto tok = load_tokenizer(*path);
  if (!tok) return fail("detokenize", tok.error());
  for (model::token_id id : *ids) {
    if (static_cast<std::uint32_t>(id) >= tok->vocab_size()) {
      return fail("detokenize", {errc::invalid_argument, fmt::format("token id {} is out of range for vocabulary "
                                                                     "size {}", id, tok->vocab_size())});
    }
  }
  const std::string text = tok->decode(*ids, a->has("special"));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace exa::app
