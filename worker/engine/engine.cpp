// engine.cpp - the parts of the engine contract (engine.h) shared by every engine.
#include "engine.h"

namespace meshnet {

const char * engine_status_name(engine_status status) {
    switch (status) {
        case engine_status::ok:                 return "ok";
        case engine_status::invalid_argument:   return "invalid_argument";
        case engine_status::cache_miss:         return "cache_miss";
        case engine_status::capacity_exhausted: return "capacity_exhausted";
        case engine_status::context_overflow:   return "context_overflow";
        case engine_status::internal:           return "internal";
    }
    return "unknown";
}

} // namespace meshnet
