#include "model/llama_model.hpp"

namespace exa::model {
namespace {

error in_file(const std::string& path, error e) {
  e.message = path + ": " + e.message;
  return e;
}

}  // namespace

expected<std::shared_ptr<const llama_model>> llama_model::load(const std::string& path) {
  auto file = gguf_file::open(path);  // its errors already name the path
  if (!file) return std::unexpected(file.error());
  std::shared_ptr<llama_model> m(new llama_model(path, std::move(*file)));
  auto config = read_llama_config(m->file_);
  if (!config) return std::unexpected(in_file(path, config.error()));
  m->config_ = *config;
  auto weights = bind_llama_weights(m->file_, m->config_);
  if (!weights) return std::unexpected(in_file(path, weights.error()));
  m->weights_ = std::move(*weights);
  auto tok = tokenizer::from_gguf(m->file_, m->config_.vocab_size);
  if (!tok) return std::unexpected(in_file(path, tok.error()));
  m->tokenizer_ = std::move(*tok);
  return std::shared_ptr<const llama_model>(std::move(m));
}

}  // namespace exa::model
