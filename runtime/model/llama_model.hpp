#pragma once
// A loaded Llama model: the mapped GGUF file, its config, bound weights and
// tokenizer. Immutable once loaded, so any number of engines (replicas on one
// node) share one instance and one mapping.

#include <memory>
#include <string>

#include "common/error.hpp"
#include "model/gguf.hpp"
#include "model/llama_config.hpp"
#include "model/llama_weights.hpp"
#include "model/tokenizer.hpp"

namespace exa::model {

class llama_model {
 public:
  /// Opens, validates and binds a GGUF file. Errors name the file and the
  /// problem (I/O, corruption, missing or mis-shaped tensor, unsupported type).
  static expected<std::shared_ptr<const llama_model>> load(const std::string& path);

  const std::string& path() const noexcept { return path_; }
  const gguf_file& file() const noexcept { return file_; }
  const llama_config& config() const noexcept { return config_; }
  const llama_weights& weights() const noexcept { return weights_; }
  const model::tokenizer& tokenizer() const noexcept { return tokenizer_; }

 private:
  llama_model(std::string path, gguf_file file) : path_(std::move(path)), file_(std::move(file)) {}

  std::string path_;
  gguf_file file_;
  llama_config config_;
  llama_weights weights_;
  model::tokenizer tokenizer_;
};

}  // namespace exa::model
