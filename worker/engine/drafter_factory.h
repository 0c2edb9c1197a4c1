// drafter_factory.h - the one place a drafter kind becomes the last stage's tail drafter:
// whether the stage can host it, what the stage's model load brings for it, and the drafter
// built on the loaded stage with the facts it reports of itself (GetInfo drafter).
#pragma once

#include "engine.h"
#include "gguf_facts.h"
#include "layer_range.h"
#include "tail_drafter.h"

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace meshnet {

// Why the stage owning `range` of the model `facts` describes cannot host `params.drafter`
// ("" when it can, or when it hosts none). Checked before anything loads.
std::string drafter_problem(const engine_params & params, const gguf_facts & facts, const layer_range & range);

// Whether the stage's model loads the MTP layers and what they need beside its own layers
// (patch 0016): mtp runs them; dspark borrows the token embeddings loaded so (patch 0017).
bool drafter_loads_mtp(drafter_kind kind);

// The loaded stage a drafter joins.
struct drafter_host {
    llama_model *   model     = nullptr;
    llama_context * ctx       = nullptr; // the stage's own context
    int32_t         n_batch   = 0;
    int32_t         n_threads = 1;
};

// A drafter built for a stage, and what it changes of the stage's facts.
struct hosted_drafter {
    std::unique_ptr<tail_drafter> drafter;               // null when the stage hosts none
    drafter_facts                 facts;                 // kind none when the stage hosts none
    size_t                        own_weight_bytes = 0;  // weights loaded outside the stage's model
                                                         // (a DSpark GGUF): its footprint holds them
    bool                          needs_token_ids = false; // it pairs rows with their tokens: the
                                                           // stage takes ids beside the boundary
};

// Builds the drafter `params` asks for on the stage `stage` describes (as loaded, before the
// drafter joins it); an empty `out` when it asks for none. False with `error` when the
// drafter cannot be built.
bool drafter_build(const engine_params & params, const gguf_facts & facts, const engine_info & stage,
                   const drafter_host & host, hosted_drafter & out, std::string & error);

} // namespace meshnet
