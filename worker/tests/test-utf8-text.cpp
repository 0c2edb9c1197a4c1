// test-utf8-text.cpp - detokenized bytes to valid UTF-8: complete characters pass, a
// character cut by the end waits as pending, broken bytes become U+FFFD.
#include "service_test.h"
#include "utf8_text.h"

#include <string>
#include <vector>

using namespace meshnet;

namespace {

const std::string fffd = "\xEF\xBF\xBD";

} // namespace

TEST("every cut of non-Latin and emoji text is its complete characters plus the rest pending") {
    const std::string text = "Привет, 世界! 🙂 ok";
    for (size_t cut = 0; cut <= text.size(); ++cut) {
        const utf8_text split = utf8_complete(text.substr(0, cut));
        CHECK(split.text + split.pending == text.substr(0, cut));
        CHECK(split.pending.size() < 4);
        // the text is the longest prefix that ends on a character boundary
        CHECK(split.pending.empty() || (static_cast<unsigned char>(split.pending[0]) & 0xC0) == 0xC0);
    }
}

TEST("bytes that cannot be UTF-8 become U+FFFD, one each") {
    struct row { std::string in, text, pending; };
    const std::vector<row> table = {
        {"a\xFF" "b",          "a" + fffd + "b",        ""},
        {"\xC0\xAF",           fffd + fffd,             ""},  // overlong
        {"\xED\xA0\x80",       fffd + fffd + fffd,      ""},  // a surrogate
        {"\xF4\x90\x80\x80",   fffd + fffd + fffd + fffd, ""},  // past U+10FFFF
        {"\xE4\xB8" "x",       fffd + fffd + "x",       ""},  // cut, then not continued
        {"x\x80",              "x" + fffd,              ""},  // a lone continuation byte
        {"ok\xF0\x9F\x99",     "ok",                    "\xF0\x9F\x99"},
    };
    for (const row & r : table) {
        const utf8_text split = utf8_complete(r.in);
        CHECK(split.text == r.text);
        CHECK(split.pending == r.pending);
    }
}

int main(int argc, char ** argv) {
    return meshnet_test::run_all(argc, argv);
}
