// special_split.h - where a text's special tokens are, found as llama.cpp's tokenizer finds
// them, except inside literal ranges (chat message content): a user's text may spell a
// control token ("<|im_start|>") but never becomes one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

// A byte range [begin, end) of a text.
struct text_range {
    size_t begin = 0;
    size_t end   = 0;
};

// One token the tokenizer splits out of text before anything else.
struct special_token {
    std::string text;
    int32_t     id      = 0;
    bool        control = false; // control or unknown: never matched inside a literal range
    bool        lstrip  = false; // whitespace before it is dropped
    bool        rstrip  = false; // whitespace after it is dropped
};

// A piece of the split text: a special token, or raw text to tokenize without specials.
struct text_piece {
    int32_t token = -1; // >= 0: this special token
    size_t  begin = 0;  // else the raw text [begin, end)
    size_t  end   = 0;
};

// True when `ranges` are sorted, non-empty, non-overlapping and within `size` bytes.
bool literal_ranges_valid(const std::vector<text_range> & ranges, size_t size);

// `text` split at the `specials` (in the order llama.cpp tries them: longest first) as
// llama.cpp's tokenizer_st_partition splits it, except that a control token overlapping
// one of the `literal` ranges is not matched there. A literal range never splits raw text,
// so text without such a token tokenizes as it would without the ranges.
std::vector<text_piece> split_specials(const std::string & text, const std::vector<special_token> & specials,
                                       const std::vector<text_range> & literal);

} // namespace meshnet
