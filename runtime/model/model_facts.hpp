#pragma once
// What a model file is, in the words operators search for: its architecture,
// its quantization ("Q4_K_M") and its tokenizer type. /v1/models and
// `exaserve-cli models` show them per deployment.

#include <cstdint>
#include <string>
#include <string_view>

#include "model/gguf.hpp"

namespace exa::model {

struct model_facts {
  std::string architecture;  // general.architecture: "llama", "qwen2"; "" when absent
  /// llama.cpp's name for general.file_type ("Q4_K_M", "Q8_0", "F16"); when
  /// the file has none or one we do not know, the type holding most of the
  /// 2-D weight bytes, in ggml's spelling ("q4_K"). "" for a file without tensors.
  std::string quantization;
  std::string tokenizer;  // tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (BPE); "" when absent
};

/// Reads the facts from an opened file (metadata and the tensor directory only).
model_facts describe_model(const gguf_file& file);

/// llama.cpp's LLAMA_FTYPE name without its prefix ("MOSTLY_Q4_K_M" -> "Q4_K_M",
/// "ALL_F32" -> "F32"); "" for ids it does not define (or no longer does).
std::string_view file_type_name(std::int64_t ftype) noexcept;

}  // namespace exa::model
