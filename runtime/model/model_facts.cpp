#include "model/model_facts.hpp"

#include <map>

#include "model/tensor_type.hpp"

namespace exa::model {

std::string_view file_type_name(std::int64_t ftype) noexcept {
  // llama.h's llama_ftype; 4 (Q4_1_SOME_F16), 5 and 6 were removed upstream.
  switch (ftype) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 7: return "Q8_0";
    case 8: return "Q5_0";
    case 9: return "Q5_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K_S";
    case 12: return "Q3_K_M";
    case 13: return "Q3_K_L";
    case 14: return "Q4_K_S";
    case 15: return "Q4_K_M";
    case 16: return "Q5_K_S";
    case 17: return "Q5_K_M";
    case 18: return "Q6_K";
    case 32: return "BF16";
    default: return "";
  }
}

namespace {

// The ggml type that holds the most bytes among 2-D (and larger) tensors:
// norms and biases are f32 in every file and say nothing of its quantization.
std::string dominant_weight_type(const gguf_file& file) {
  std::map<std::uint32_t, std::uint64_t> bytes_by_type;
  for (const auto& t : file.tensors())
    if (t.shape.size() >= 2) bytes_by_type[t.type_id] += t.size_bytes;
  std::uint32_t best = 0;
  std::uint64_t best_bytes = 0;
  for (const auto& [type, bytes] : bytes_by_type)
    if (bytes > best_bytes) best = type, best_bytes = bytes;
  if (best_bytes == 0) return "";
  const ggml_type_traits* info = ggml_type_info(best);
  return info ? std::string(info->name) : "type " + std::to_string(best);
}

}  // namespace

model_facts describe_model(const gguf_file& file) {
  model_facts out;
  if (auto arch = file.get_string("general.architecture")) out.architecture = *arch;
  if (auto tok = file.get_string("tokenizer.ggml.model")) out.tokenizer = *tok;
  if (auto ftype = file.get_int("general.file_type")) out.quantization = std::string(file_type_name(*ftype));
  if (out.quantization.empty()) out.quantization = dominant_weight_type(file);
  return out;
}

}  // namespace exa::model
