// tokenize_bound.h - a lower bound on the tokens a text becomes, from its bytes alone, so
// that text which cannot fit the context is refused before it is tokenized (llama.cpp's
// special-token split is quadratic in the number of special tokens a text holds).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshnet {

// What the GGUF says about the tokenizer (tokenizer.ggml.*).
struct vocab_spec {
    std::string              model;  // tokenizer.ggml.model: "llama" (SPM), "gpt2" (BPE), ...
    std::string              pre;    // tokenizer.ggml.pre
    std::vector<std::string> tokens; // tokenizer.ggml.tokens
    std::vector<std::string> merges; // tokenizer.ggml.merges ("left right")
};

// How llama.cpp's tokenizing (special tokens parsed) can be bounded from a text's bytes.
struct tokenize_bound {
    // The most counted bytes of text one token stands for; 0: no bound holds.
    int64_t token_bytes = 0;
    // Bytes that may become no token: whitespace that special tokens may strip, and in
    // byte-level BPE a byte whose symbol the vocabulary lacks (llama.cpp drops it).
    std::array<bool, 256> uncounted{};
};

// A token stands for at most its own text's bytes: special tokens match their text
// literally, SPM spells a space as the 3-byte U+2581 and its added leading space is not
// in the text, byte-fallback tokens stand for one byte, byte-level BPE spells each byte
// as one or two bytes. It holds where every counted byte becomes part of some token: SPM
// (unknown bytes become byte tokens), and byte-level BPE whose every merge's result is a
// token (then only a lone byte whose symbol is missing becomes no token, and is not
// counted). Other tokenizers (WordPiece, Unigram, ...) may fold unbounded text into one
// token or drop it: no bound.
tokenize_bound vocab_tokenize_bound(const vocab_spec & vocab);

// At least how many tokens `text` becomes (0 without a bound).
int64_t min_tokens(std::string_view text, const tokenize_bound & bound);

} // namespace meshnet
