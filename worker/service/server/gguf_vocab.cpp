// gguf_vocab.cpp - reads only the header's key/value section (no tensor data).
#include "gguf_vocab.h"

#include <gguf.h>

#include <algorithm>

namespace meshnet {

namespace {

std::string string_of(const gguf_context * ctx, const char * key) {
    const int64_t index = gguf_find_key(ctx, key);
    return index >= 0 && gguf_get_kv_type(ctx, index) == GGUF_TYPE_STRING ? gguf_get_val_str(ctx, index) : "";
}

std::vector<std::string> strings_of(const gguf_context * ctx, const char * key) {
    std::vector<std::string> out;
    const int64_t index = gguf_find_key(ctx, key);
    if (index >= 0 && gguf_get_kv_type(ctx, index) == GGUF_TYPE_ARRAY &&
        gguf_get_arr_type(ctx, index) == GGUF_TYPE_STRING) {
        const size_t n = gguf_get_arr_n(ctx, index);
        out.reserve(n);
        for (size_t i = 0; i < n; ++i) {
            out.emplace_back(gguf_get_arr_str(ctx, index, i));
        }
    }
    return out;
}

} // namespace

gguf_vocab_facts gguf_vocab_read(const std::string & model_path) {
    gguf_vocab_facts facts;
    gguf_init_params params{};
    params.no_alloc = true;
    params.ctx      = nullptr;
    gguf_context * ctx = gguf_init_from_file(model_path.c_str(), params);
    if (!ctx) {
        return facts;
    }
    for (const char * key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
        const int64_t index = gguf_find_key(ctx, key);
        if (index < 0) continue;
        int64_t value = -1;
        switch (gguf_get_kv_type(ctx, index)) {
            case GGUF_TYPE_UINT32: value = gguf_get_val_u32(ctx, index); break;
            case GGUF_TYPE_INT32:  value = gguf_get_val_i32(ctx, index); break;
            default: break;
        }
        if (value >= 0 && std::find(facts.eos_token_ids.begin(), facts.eos_token_ids.end(), value) ==
                              facts.eos_token_ids.end()) {
            facts.eos_token_ids.push_back(static_cast<int32_t>(value));
        }
    }
    facts.chat_template = string_of(ctx, "tokenizer.chat_template");
    vocab_spec vocab;
    vocab.model  = string_of(ctx, "tokenizer.ggml.model");
    vocab.pre    = string_of(ctx, "tokenizer.ggml.pre");
    vocab.tokens = strings_of(ctx, "tokenizer.ggml.tokens");
    vocab.merges = strings_of(ctx, "tokenizer.ggml.merges");
    facts.tokenize = vocab_tokenize_bound(vocab);
    gguf_free(ctx);
    return facts;
}

} // namespace meshnet
