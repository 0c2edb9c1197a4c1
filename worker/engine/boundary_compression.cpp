// boundary_compression.cpp - byte-plane shuffle + LZ4 (Debian's liblz4), CRC-32 from zlib.
#include "boundary_compression.h"

#include <lz4.h>
#include <zlib.h>

#include <algorithm>
#include <climits>

namespace meshnet {

namespace {

// Byte b of value i goes to plane b at i: planes of n bytes each.
void shuffle(const char * values, size_t n, size_t value_size, char * planes) {
    for (size_t i = 0; i < n; ++i) {
        for (size_t b = 0; b < value_size; ++b) {
            planes[b * n + i] = values[i * value_size + b];
        }
    }
}

void unshuffle(const char * planes, size_t n, size_t value_size, char * values) {
    for (size_t b = 0; b < value_size; ++b) {
        for (size_t i = 0; i < n; ++i) {
            values[i * value_size + b] = planes[b * n + i];
        }
    }
}

} // namespace

const char * boundary_encoding_name(boundary_encoding encoding) {
    return encoding == boundary_encoding::shuffle_lz4 ? "shuffle-lz4" : "off";
}

bool boundary_encoding_parse(const std::string & name, boundary_encoding & out) {
    if (name == "off")         { out = boundary_encoding::raw;         return true; }
    if (name == "shuffle-lz4") { out = boundary_encoding::shuffle_lz4; return true; }
    return false;
}

uint32_t boundary_crc32(const std::string & bytes) {
    uLong crc = crc32(0L, Z_NULL, 0);
    size_t done = 0;
    while (done < bytes.size()) { // zlib takes a uInt length
        const size_t part = std::min<size_t>(bytes.size() - done, UINT_MAX);
        crc = crc32(crc, reinterpret_cast<const Bytef *>(bytes.data() + done), static_cast<uInt>(part));
        done += part;
    }
    return static_cast<uint32_t>(crc);
}

void boundary_compress(const std::string & raw, size_t value_size, std::string & out) {
    std::string planes(raw.size(), '\0');
    shuffle(raw.data(), raw.size() / value_size, value_size, planes.data());
    // A boundary is far below LZ4's 2 GB input limit (the service caps a message at less).
    const int capacity = LZ4_compressBound(static_cast<int>(planes.size()));
    out.resize(static_cast<size_t>(capacity));
    const int written = LZ4_compress_default(planes.data(), out.data(), static_cast<int>(planes.size()), capacity);
    out.resize(static_cast<size_t>(written > 0 ? written : 0));
}

bool boundary_decompress(const std::string & packed, size_t value_size, size_t expected_size, uint64_t raw_size,
                         uint32_t raw_crc32, std::string & raw, std::string & error) {
    if (raw_size != expected_size) {
        error = "compressed boundary states " + std::to_string(raw_size) + " raw bytes, its shape makes " +
                std::to_string(expected_size);
        return false;
    }
    if (expected_size > static_cast<size_t>(LZ4_MAX_INPUT_SIZE) || expected_size % value_size != 0 ||
        packed.size() > static_cast<size_t>(INT_MAX)) {
        error = "compressed boundary of " + std::to_string(expected_size) + " raw bytes cannot be LZ4's";
        return false;
    }
    const size_t raw_bytes = expected_size;
    std::string planes(raw_bytes, '\0');
    const int got = LZ4_decompress_safe(packed.data(), planes.data(), static_cast<int>(packed.size()),
                                        static_cast<int>(raw_bytes));
    if (got < 0 || static_cast<size_t>(got) != raw_bytes) {
        error = "compressed boundary does not decompress to its " + std::to_string(raw_bytes) + " raw bytes";
        return false;
    }
    raw.assign(raw_bytes, '\0');
    unshuffle(planes.data(), raw_bytes / value_size, value_size, raw.data());
    if (boundary_crc32(raw) != raw_crc32) {
        error = "compressed boundary's CRC-32 does not match its raw bytes";
        return false;
    }
    return true;
}

} // namespace meshnet
