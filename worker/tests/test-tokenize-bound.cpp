// test-tokenize-bound.cpp - the bytes-to-tokens bound holds only for tokenizers that turn
// every byte into some token, and counts what whitespace-stripping tokens cannot take.
#include "service_test.h"
#include "tokenize_bound.h"

#include <string>
#include <vector>

using namespace meshnet;

namespace {

// GPT-2's byte-level symbols for every byte (as tokenizer_bound spells them), plus `extra`.
std::vector<std::string> byte_level_tokens(const std::vector<std::string> & extra) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) {
        int codepoint = b, shifted = 0;
        auto printable = [](int c) { return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255); };
        if (!printable(b)) {
            for (int c = 0; c < b; ++c) shifted += printable(c) ? 0 : 1;
            codepoint = 256 + shifted;
        }
        std::string symbol;
        if (codepoint < 0x80) {
            symbol += static_cast<char>(codepoint);
        } else {
            symbol += static_cast<char>(0xC0 | (codepoint >> 6));
            symbol += static_cast<char>(0x80 | (codepoint & 0x3F));
        }
        tokens.push_back(symbol);
    }
    tokens.insert(tokens.end(), extra.begin(), extra.end());
    return tokens;
}

vocab_spec bpe(std::vector<std::string> merges, std::vector<std::string> extra = {}) {
    return {"gpt2", "smollm", byte_level_tokens(extra), std::move(merges)};
}

} // namespace

std::string repeat(const std::string & piece, int times) {
    std::string out;
    for (int i = 0; i < times; ++i) out += piece;
    return out;
}

TEST("an SPM vocabulary is bounded by its longest token, byte tokens by one byte") {
    const vocab_spec spm{"llama", "", {"<unk>", "<0x41>", "\xE2\x96\x81the", "<|im_start|>"}, {}};
    CHECK(vocab_tokenize_bound(spm).token_bytes == 12);
    CHECK(vocab_tokenize_bound({"llama", "", {"a"}, {}}).token_bytes == 1);
    CHECK(min_tokens(repeat("<|im_start|>", 1000), vocab_tokenize_bound(spm)) == 1000);
}

TEST("byte-level BPE is bounded only when every merge's result is a token") {
    CHECK(vocab_tokenize_bound(bpe({"h e", "he llo"}, {"he", "hello", "<|im_start|>"})).token_bytes == 12);
    CHECK(vocab_tokenize_bound(bpe({"h e", "he llo"}, {"he", "<|im_start|>"})).token_bytes == 0); // "hello" dropped
    vocab_spec raw_utf8 = bpe({"h e"}, {"he"});
    raw_utf8.pre = "gemma4"; // symbols are raw UTF-8: a character may be no token
    CHECK(vocab_tokenize_bound(raw_utf8).token_bytes == 0);
}

TEST("a byte whose symbol the BPE vocabulary lacks may become no token: it is not counted") {
    vocab_spec missing = bpe({"h e"}, {"he", "<|im_start|>"});
    missing.tokens.erase(missing.tokens.begin() + 4); // byte 4's symbol (U+0104)
    const tokenize_bound bound = vocab_tokenize_bound(missing);
    CHECK(bound.token_bytes == 12);
    CHECK(min_tokens(std::string(1000, '\x04'), bound) == 0);
    CHECK(min_tokens(std::string(1000, '\x05'), bound) == 84);
}

TEST("tokenizers that may drop or merge unbounded text have no bound") {
    CHECK(vocab_tokenize_bound({"bert", "", {"[UNK]", "hello"}, {}}).token_bytes == 0);
    CHECK(vocab_tokenize_bound({"t5", "", {"hello"}, {}}).token_bytes == 0);
    CHECK(vocab_tokenize_bound({"llama", "", {}, {}}).token_bytes == 0);
    CHECK(min_tokens("anything at all", vocab_tokenize_bound({"bert", "", {"x"}, {}})) == 0);
}

TEST("whitespace, which special tokens may strip, is not counted") {
    const tokenize_bound bound = vocab_tokenize_bound(bpe({"h e"}, {"he", "<|im_start|>"}));
    CHECK(min_tokens(repeat("<|im_start|>", 1000) + "x", bound) == 1001);
    CHECK(min_tokens(std::string(100000, ' ') + "\n\t\r\v\f", bound) == 0);
    CHECK(min_tokens(repeat("<|im_start|> \n", 10), bound) == 10);
}

TEST_MAIN()
