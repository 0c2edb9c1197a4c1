// gguf_facts.cpp - see gguf_facts.h; uses ggml's GGUF reader without tensor data.
#include "gguf_facts.h"

#include "gguf.h"

#include <cstdint>
#include <cstdio>
#include <memory>

namespace meshnet {

namespace {

struct gguf_context_deleter {
    void operator()(gguf_context * ctx) const { gguf_free(ctx); }
};
using gguf_context_ptr = std::unique_ptr<gguf_context, gguf_context_deleter>;

// an unsigned or signed integer key of any width; false when missing or not an integer
bool read_int(const gguf_context * ctx, const std::string & key, int64_t & out) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0) {
        return false;
    }
    switch (gguf_get_kv_type(ctx, id)) {
        case GGUF_TYPE_UINT8:  out = gguf_get_val_u8(ctx, id);  return true;
        case GGUF_TYPE_INT8:   out = gguf_get_val_i8(ctx, id);  return true;
        case GGUF_TYPE_UINT16: out = gguf_get_val_u16(ctx, id); return true;
        case GGUF_TYPE_INT16:  out = gguf_get_val_i16(ctx, id); return true;
        case GGUF_TYPE_UINT32: out = gguf_get_val_u32(ctx, id); return true;
        case GGUF_TYPE_INT32:  out = gguf_get_val_i32(ctx, id); return true;
        case GGUF_TYPE_UINT64: out = static_cast<int64_t>(gguf_get_val_u64(ctx, id)); return true;
        case GGUF_TYPE_INT64:  out = gguf_get_val_i64(ctx, id); return true;
        default:               return false;
    }
}

} // namespace

bool gguf_facts_read(const std::string & path, gguf_facts & out, std::string & error) {
    gguf_init_params params = { /*no_alloc =*/ true, /*ctx =*/ nullptr };
    gguf_context_ptr ctx(gguf_init_from_file(path.c_str(), params));
    if (!ctx) {
        error = "cannot read a GGUF header from " + path + " (missing, unreadable or not a GGUF file)";
        return false;
    }
    const int64_t arch_id = gguf_find_key(ctx.get(), "general.architecture");
    if (arch_id < 0 || gguf_get_kv_type(ctx.get(), arch_id) != GGUF_TYPE_STRING) {
        error = path + ": GGUF header has no general.architecture";
        return false;
    }
    gguf_facts facts;
    facts.arch = gguf_get_val_str(ctx.get(), arch_id);

    int64_t block_count = 0;
    int64_t n_nextn     = 0;
    int64_t n_embd      = 0;
    if (!read_int(ctx.get(), facts.arch + ".block_count", block_count) || block_count <= 0) {
        error = path + ": GGUF header has no positive " + facts.arch + ".block_count";
        return false;
    }
    read_int(ctx.get(), facts.arch + ".nextn_predict_layers", n_nextn);
    if (!read_int(ctx.get(), facts.arch + ".embedding_length", n_embd) || n_embd <= 0) {
        error = path + ": GGUF header has no positive " + facts.arch + ".embedding_length";
        return false;
    }
    if (n_nextn < 0 || n_nextn >= block_count || block_count > INT32_MAX || n_embd > INT32_MAX) {
        error = path + ": implausible layer counts in the GGUF header";
        return false;
    }
    facts.n_layer = static_cast<int32_t>(block_count - n_nextn);
    facts.n_embd  = static_cast<int32_t>(n_embd);
    facts.n_nextn = static_cast<int32_t>(n_nextn);
    // what an MTP drafter adds to the stage owning the last layer: the blocks after the main
    // layers (blk.N.* for N >= n_layer) and, unless they embed on their own, the embeddings
    for (int64_t i = 0; i < gguf_get_n_tensors(ctx.get()); ++i) {
        const std::string name  = gguf_get_tensor_name(ctx.get(), i);
        const size_t      bytes = gguf_get_tensor_size(ctx.get(), i);
        int32_t block = -1;
        if (std::sscanf(name.c_str(), "blk.%d.", &block) == 1 && block >= facts.n_layer) {
            facts.nextn_tensors.push_back(bytes);
            facts.nextn_embeds = facts.nextn_embeds || name.find(".nextn.embed_tokens.") != std::string::npos;
        } else if (name == "token_embd.weight") {
            facts.token_embd_bytes = bytes;
        }
    }
    out = std::move(facts);
    return true;
}

} // namespace meshnet
