// utf8_text.h - detokenized bytes as the valid UTF-8 a proto3 string must hold (pure).
#pragma once

#include <string>

namespace meshnet {

struct utf8_text {
    std::string text;     // valid UTF-8: every complete character, U+FFFD for each invalid byte
    std::string pending;  // the first bytes of a character the input ends inside
};

// Splits `bytes` into its complete, valid text and the unfinished character at its end
// (a token can end in the middle of a multi-byte character; the next tokens finish it).
utf8_text utf8_complete(const std::string & bytes);

} // namespace meshnet
