#pragma once
// Drafts for speculative decoding derived from their target: the target's
// file cut to its first L transformer blocks. Token embeddings, the output
// norm and head, every tokenizer key and blocks 0..L-1 are copied byte for
// byte, so the draft shares the target's vocabulary and, early layers doing
// much of the work, often agrees with it on the next token (for trained
// models as for generated ones, whose residual stream is dominated by the
// embedding). The draft runs L/N of the target's layer work plus the head.

#include <cstdint>
#include <string>

#include "common/error.hpp"

namespace exa::model {

/// Writes the draft of the GGUF file `target_path` with its first `layers`
/// blocks to `out_path` (atomically); {arch}.block_count becomes `layers`,
/// general.name gains "-draft-L<layers>". Errors: those of opening the
/// target, invalid_argument when `layers` is 0 or not below the target's
/// block count, unsupported for a metadata array type the writer cannot
/// write, io_error from writing.
expected<void> derive_draft(const std::string& target_path, std::uint32_t layers, const std::string& out_path);

}  // namespace exa::model
