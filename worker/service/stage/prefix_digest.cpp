// prefix_digest.cpp - see prefix_digest.h. OpenSSL's (or BoringSSL's) SHA-256: the one gRPC
// links already.
#include "prefix_digest.h"

#include <openssl/sha.h>

namespace meshnet {

std::string sha256_digest(std::string_view bytes) {
    std::string digest(SHA256_DIGEST_LENGTH, '\0');
    SHA256(reinterpret_cast<const unsigned char *>(bytes.data()), bytes.size(),
           reinterpret_cast<unsigned char *>(digest.data()));
    return digest;
}

std::string chain_digest(std::string_view previous, std::string_view block) {
    std::string linked;
    linked.reserve(previous.size() + block.size());
    linked.append(previous).append(block);
    return sha256_digest(linked);
}

} // namespace meshnet
