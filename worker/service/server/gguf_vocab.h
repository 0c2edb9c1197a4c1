// gguf_vocab.h - vocabulary facts the engine contract does not carry (end-of-generation
// ids, the chat template, how many bytes of text a token can stand for), read straight
// from the GGUF header.
#pragma once

#include "tokenize_bound.h"

#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

struct gguf_vocab_facts {
    std::vector<int32_t> eos_token_ids; // tokenizer.ggml.eos_token_id and .eot_token_id
    std::string          chat_template; // tokenizer.chat_template (Jinja), "" when absent
    tokenize_bound       tokenize;        // how text bytes bound its tokens
};

// Reads them from the header of `model_path`; empty facts on any failure.
gguf_vocab_facts gguf_vocab_read(const std::string & model_path);

} // namespace meshnet
