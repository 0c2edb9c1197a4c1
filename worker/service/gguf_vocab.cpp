// gguf_vocab.cpp - reads only the header's key/value section (no tensor data).
#include "gguf_vocab.h"

#include <gguf.h>

#include <algorithm>

namespace meshnet {

std::vector<int32_t> gguf_eos_token_ids(const std::string & model_path) {
    std::vector<int32_t> ids;
    gguf_init_params params{};
    params.no_alloc = true;
    params.ctx      = nullptr;
    gguf_context * ctx = gguf_init_from_file(model_path.c_str(), params);
    if (!ctx) {
        return ids;
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
        if (value >= 0 && std::find(ids.begin(), ids.end(), value) == ids.end()) {
            ids.push_back(static_cast<int32_t>(value));
        }
    }
    gguf_free(ctx);
    return ids;
}

} // namespace meshnet
