// tokenize_bound.cpp - see tokenize_bound.h.
#include "tokenize_bound.h"

#include <algorithm>
#include <unordered_set>

namespace meshnet {

namespace {

// The bytes llama.cpp's special-token split may strip next to a token (isspace, C locale).
bool strippable(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// GPT-2's byte-level alphabet: the symbol (UTF-8) that spells byte b.
std::string byte_symbol(int b) {
    int codepoint = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int shifted = 0; // the n-th byte outside the printable ranges is U+0100 + n
        for (int c = 0; c < b; ++c) {
            shifted += (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255) ? 0 : 1;
        }
        codepoint = 256 + shifted;
    }
    std::string out;
    if (codepoint < 0x80) {
        out += static_cast<char>(codepoint);
    } else {
        out += static_cast<char>(0xC0 | (codepoint >> 6));
        out += static_cast<char>(0x80 | (codepoint & 0x3F));
    }
    return out;
}

// Pre-tokenizers that do not byte-encode (raw UTF-8 symbols, which may be no token), as
// llama.cpp selects them by name.
bool raw_utf8_bpe(const std::string & pre) {
    static const std::unordered_set<std::string> names = {
        "gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace", "kimi-k2"};
    return names.count(pre) > 0;
}

// Every merge's result is a token: a word's symbols then end as tokens, but for lone
// bytes whose symbol is missing.
bool merges_make_tokens(const vocab_spec & vocab, const std::unordered_set<std::string_view> & tokens) {
    std::string merged;
    for (const std::string & merge : vocab.merges) {
        const size_t space = merge.find(' ', 1);
        if (space == std::string::npos) {
            return false;
        }
        merged.assign(merge, 0, space);
        merged.append(merge, space + 1);
        if (tokens.count(merged) == 0) {
            return false;
        }
    }
    return true;
}

} // namespace

tokenize_bound vocab_tokenize_bound(const vocab_spec & vocab) {
    tokenize_bound bound;
    for (int b = 0; b < 256; ++b) {
        bound.uncounted[b] = strippable(static_cast<char>(b));
    }
    const bool spm = vocab.model == "llama";
    const bool bpe = vocab.model == "gpt2" && !raw_utf8_bpe(vocab.pre) && !vocab.merges.empty();
    if (vocab.tokens.empty() || !(spm || bpe)) {
        return bound;
    }
    if (bpe) {
        const std::unordered_set<std::string_view> tokens(vocab.tokens.begin(), vocab.tokens.end());
        if (!merges_make_tokens(vocab, tokens)) {
            return bound;
        }
        for (int b = 0; b < 256; ++b) {
            bound.uncounted[b] = bound.uncounted[b] || tokens.count(byte_symbol(b)) == 0;
        }
    }
    size_t longest = 1; // a byte token stands for one byte
    for (const std::string & token : vocab.tokens) {
        longest = std::max(longest, token.size());
    }
    bound.token_bytes = static_cast<int64_t>(longest);
    return bound;
}

int64_t min_tokens(std::string_view text, const tokenize_bound & bound) {
    if (bound.token_bytes <= 0) {
        return 0;
    }
    const int64_t counted = static_cast<int64_t>(std::count_if(text.begin(), text.end(),
        [&bound](char c) { return !bound.uncounted[static_cast<unsigned char>(c)]; }));
    return (counted + bound.token_bytes - 1) / bound.token_bytes;
}

} // namespace meshnet
