// discard_bytes.cpp - see discard_bytes.h.
#include "discard_bytes.h"

#include <algorithm>

namespace meshnet {

namespace {

uint64_t memory_bytes(llama_model * model, llama_context_params cparams, uint32_t depth) {
    cparams.n_rs_seq = depth;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        return 0;
    }
    const uint64_t bytes = llama_memory_buffer_size(llama_get_memory(ctx));
    llama_free(ctx);
    return bytes;
}

} // namespace

size_t discard_bytes_per_slot(llama_model * model, llama_context_params cparams, uint32_t depth) {
    cparams.n_seq_max = 1;
    cparams.n_ctx     = 256;
    cparams.n_batch   = std::max<uint32_t>(depth + 1, 8); // a step keeps its last depth + 1 rows together
    cparams.n_ubatch  = cparams.n_batch;
    const uint64_t with    = memory_bytes(model, cparams, depth);
    const uint64_t without = memory_bytes(model, cparams, 0);
    return with > without && without > 0 ? static_cast<size_t>(with - without) : 0;
}

} // namespace meshnet
