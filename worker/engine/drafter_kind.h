// drafter_kind.h - the kinds of drafter a last stage can host, named one way on the command
// line (--drafter) and in GetInfo (DrafterInfo.kind): parsed once where a name comes in,
// compared as a kind everywhere else.
#pragma once

#include <string>

namespace meshnet {

enum class drafter_kind {
    none,   // the stage drafts nothing
    mtp,    // the model's own MTP (nextn) block (patch 0016)
    dspark, // a DSpark drafter GGUF beside the model (patch 0017)
};

// "" for none, else "mtp" or "dspark".
inline const char * drafter_kind_name(drafter_kind kind) {
    switch (kind) {
        case drafter_kind::none:   return "";
        case drafter_kind::mtp:    return "mtp";
        case drafter_kind::dspark: return "dspark";
    }
    return "";
}

// The kind `name` names ("" is none); false for a name no kind has.
inline bool drafter_kind_parse(const std::string & name, drafter_kind & out) {
    for (drafter_kind kind : {drafter_kind::none, drafter_kind::mtp, drafter_kind::dspark}) {
        if (name == drafter_kind_name(kind)) {
            out = kind;
            return true;
        }
    }
    return false;
}

} // namespace meshnet
