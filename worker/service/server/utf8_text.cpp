// utf8_text.cpp - see utf8_text.h.
#include "utf8_text.h"

#include <cstddef>
#include <cstdint>

namespace meshnet {

namespace {

const char replacement[] = "\xEF\xBF\xBD";

// The length of the sequence `lead` starts (0: not a lead byte), and the range its
// second byte must fall in (RFC 3629: no overlong forms, no surrogates, <= U+10FFFF).
size_t sequence_length(uint8_t lead, uint8_t & low, uint8_t & high) {
    low = 0x80;
    high = 0xBF;
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) {
        if (lead == 0xE0) low = 0xA0;
        if (lead == 0xED) high = 0x9F;
        return 3;
    }
    if (lead >= 0xF0 && lead <= 0xF4) {
        if (lead == 0xF0) low = 0x90;
        if (lead == 0xF4) high = 0x8F;
        return 4;
    }
    return 0;
}

} // namespace

utf8_text utf8_complete(const std::string & bytes) {
    utf8_text out;
    out.text.reserve(bytes.size());
    size_t i = 0;
    while (i < bytes.size()) {
        uint8_t low = 0, high = 0;
        const size_t length = sequence_length(static_cast<uint8_t>(bytes[i]), low, high);
        if (length == 0) {
            out.text += replacement;
            ++i;
            continue;
        }
        size_t valid = 1; // bytes of the sequence that are what they must be
        while (valid < length && i + valid < bytes.size()) {
            const uint8_t b = static_cast<uint8_t>(bytes[i + valid]);
            const bool ok = valid == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
            if (!ok) break;
            ++valid;
        }
        if (valid == length) {
            out.text.append(bytes, i, length);
        } else if (i + valid == bytes.size()) {
            out.pending = bytes.substr(i); // cut short by the end, not broken: more will come
        } else {
            out.text += replacement;       // broken: one U+FFFD, then go on after the lead
            valid = 1;
        }
        i += valid;
    }
    return out;
}

} // namespace meshnet
