// gguf_facts.h - the few model facts a stage must know before loading anything
// (architecture, layer count, residual width), read from the GGUF header only.
#pragma once

#include <cstdint>
#include <string>

namespace meshnet {

struct gguf_facts {
    std::string arch;
    int32_t     n_layer = 0; // main layers: block_count minus nextn (MTP) layers
    int32_t     n_embd  = 0;
};

// Reads the header of `path`; on failure returns false and sets `error` (never aborts).
bool gguf_facts_read(const std::string & path, gguf_facts & out, std::string & error);

} // namespace meshnet
