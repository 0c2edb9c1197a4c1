// route_key.cpp - see route_key.h.
#include "route_key.h"
#include "relay_frames.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace meshnet {

namespace {

constexpr size_t key_bytes = 32;

std::string hmac_sha256(const std::string & key, const std::string & message) {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int  length = 0;
    HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char *>(message.data()), message.size(), out, &length);
    return std::string(reinterpret_cast<const char *>(out), length);
}

std::string hex(const std::string & bytes) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (unsigned char byte : bytes) {
        out.push_back(digits[byte >> 4]);
        out.push_back(digits[byte & 15]);
    }
    return out;
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

} // namespace

bool route_key::load(const std::string & path, route_key & key, std::string & error) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        error = "--route-key-file: cannot read " + path;
        return false;
    }
    std::ostringstream buffer;
    buffer << in.rdbuf();
    std::string text = buffer.str();
    const size_t begin = text.find_first_not_of(" \t\r\n");
    const size_t end   = text.find_last_not_of(" \t\r\n");
    text = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
    std::string secret;
    for (size_t i = 0; i + 1 < text.size(); i += 2) {
        const int high = hex_value(text[i]), low = hex_value(text[i + 1]);
        if (high < 0 || low < 0) {
            break;
        }
        secret.push_back(static_cast<char>(high << 4 | low));
    }
    if (text.size() != 2 * key_bytes || secret.size() != key_bytes) {
        error = "--route-key-file " + path + ": expected 64 hex digits (32 random bytes, e.g. `openssl rand -hex 32`)";
        return false;
    }
    key = of_bytes(std::move(secret));
    return true;
}

route_key route_key::of_bytes(std::string secret) {
    route_key key;
    key.secret_ = std::move(secret);
    key.proof_  = hex(hmac_sha256(key.secret_, "meshnet-route-auth-v1"));
    return key;
}

bool route_key::accepts(const std::string & offered) const {
    return present() && same_token(offered, proof_); // constant time
}

std::string route_key::local_relay_token(const std::string & incarnation) const {
    return hmac_sha256(secret_, "meshnet-local-relay-v1" + incarnation);
}

} // namespace meshnet
