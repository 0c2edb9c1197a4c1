// gguf_vocab.h - vocabulary facts the engine contract does not carry (end-of-generation
// ids), read straight from the GGUF header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

// tokenizer.ggml.eos_token_id and .eot_token_id when present (deduplicated); empty on
// any failure.
std::vector<int32_t> gguf_eos_token_ids(const std::string & model_path);

} // namespace meshnet
