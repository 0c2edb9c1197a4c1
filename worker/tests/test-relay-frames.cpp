// test-relay-frames.cpp - the local relay's frames cut from bytes as they arrive: memory
// follows the bytes, not what a header announces; a frame over the limit is bad.
#include "relay_frames.h"
#include "service_test.h"

#include <string>

using namespace meshnet;

namespace {

std::string header(uint32_t size) {
    std::string bytes(4, '\0');
    for (int i = 0; i < 4; ++i) {
        bytes[static_cast<size_t>(i)] = static_cast<char>((size >> (8 * i)) & 0xff);
    }
    return bytes;
}

} // namespace

TEST("a header announcing a large frame holds only its four bytes") {
    frame_reader frames(200u << 20);
    const std::string big = header(100u << 20);
    frames.feed(big.data(), big.size());
    std::string body;
    CHECK(frames.next(body) == frame_reader::result::more);
    CHECK(frames.held() == 4);
}

TEST("frames come out whole however the bytes are cut") {
    const std::string stream = header(3) + "abc" + header(0) + header(5) + "hello";
    for (size_t piece = 1; piece <= stream.size(); ++piece) {
        frame_reader frames(16);
        std::string  got, body;
        for (size_t at = 0; at < stream.size(); at += piece) {
            const std::string part = stream.substr(at, piece);
            frames.feed(part.data(), part.size());
            while (frames.next(body) == frame_reader::result::frame) {
                got += "[" + body + "]";
            }
        }
        CHECK(got == "[abc][][hello]");
        CHECK(frames.held() == 0);
    }
}

TEST("a frame over the limit is bad before its body comes") {
    frame_reader frames(8);
    const std::string bytes = header(9);
    frames.feed(bytes.data(), bytes.size());
    std::string body;
    CHECK(frames.next(body) == frame_reader::result::bad);
}

TEST("tokens are compared whole") {
    const std::string token(local_relay_token_bytes, '\x5a');
    CHECK(same_token(token, token));
    CHECK(!same_token(token.substr(0, 31), token));
    std::string flipped = token;
    flipped[31] = static_cast<char>(flipped[31] ^ 1);
    CHECK(!same_token(flipped, token));
    CHECK(!same_token("", ""));
}

TEST_MAIN()
