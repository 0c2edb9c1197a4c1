// gguf_facts.h - the few model facts a stage must know before loading anything
// (architecture, layer count, residual width), read from the GGUF header only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

struct gguf_facts {
    std::string arch;
    int32_t     n_layer = 0; // main layers: block_count minus nextn (MTP) layers
    int32_t     n_embd  = 0;
    int32_t     n_nextn = 0;          // MTP (nextn) layers after the main ones
    std::vector<size_t> nextn_tensors; // their tensors' bytes, one entry each
    size_t      token_embd_bytes = 0; // the token embeddings' bytes
    bool        nextn_embeds     = false; // the MTP layers carry token embeddings of their own
};

// Reads the header of `path`; on failure returns false and sets `error` (never aborts).
bool gguf_facts_read(const std::string & path, gguf_facts & out, std::string & error);

} // namespace meshnet
