// test-boundary-compression.cpp - the slow link's boundary packing: bit-exact round trips of
// f32 and f16 rows, and every way a packed boundary can be wrong refused, never decoded to
// other values.
#include "boundary_codec.h"
#include "boundary_compression.h"
#include "boundary_packing.h"
#include "service_test.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

using namespace meshnet;

namespace {

// Rows of few significant bits around zero, which the byte planes compress (the low mantissa
// planes are zeros; noise with every mantissa bit random would not: LZ4 may grow it by a few
// bytes), plus the awkward values.
std::vector<float> residual_rows(size_t n, uint32_t seed) {
    std::mt19937 random(seed);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    std::vector<float> rows(n);
    for (float & value : rows) value = std::round(normal(random) * 64.0f) / 64.0f;
    rows[0] = 0.0f;
    rows[1] = -0.0f;
    rows[2] = std::numeric_limits<float>::denorm_min();
    rows[3] = 65504.0f;
    rows[4] = -1e30f;
    return rows;
}

std::string wire_bytes(const std::vector<float> & rows, wire_dtype dtype) {
    std::string bytes;
    boundary_encode(rows.data(), rows.size(), dtype, bytes);
    return bytes;
}

} // namespace

TEST("f32 and f16 rows come back bit for bit, and smaller") {
    const std::vector<float> rows = residual_rows(3 * 576, 7);
    for (wire_dtype dtype : {wire_dtype::f32, wire_dtype::f16, wire_dtype::bf16}) {
        const std::string raw = wire_bytes(rows, dtype);
        const size_t value_size = wire_dtype_size(dtype);
        std::string packed, back, error;
        boundary_compress(raw, value_size, packed);
        CHECK(packed.size() < raw.size());
        CHECK(boundary_decompress(packed, value_size, raw.size(), raw.size(), boundary_crc32(raw), back, error));
        CHECK(back == raw); // the bytes, so -0.0, denormals and every mantissa bit
        if (back != raw) std::printf("  %s: %s\n", wire_dtype_name(dtype), error.c_str());
    }
}

TEST("byte planes group each value's bytes: the shuffle's inverse is exact on every position") {
    std::string raw;
    for (int i = 0; i < 1000; ++i) raw.push_back(static_cast<char>(i * 37 + i / 7)); // no pattern LZ4 hides
    for (size_t value_size : {size_t{2}, size_t{4}}) {
        std::string packed, back, error;
        boundary_compress(raw, value_size, packed);
        CHECK(boundary_decompress(packed, value_size, raw.size(), raw.size(), boundary_crc32(raw), back, error));
        CHECK(back == raw);
    }
}

TEST("a checksum that does not match the unpacked bytes is refused") {
    const std::string raw = wire_bytes(residual_rows(576, 1), wire_dtype::f32);
    std::string packed, back, error;
    boundary_compress(raw, 4, packed);
    CHECK(!boundary_decompress(packed, 4, raw.size(), raw.size(), boundary_crc32(raw) ^ 1u, back, error));
    CHECK(error.find("CRC-32") != std::string::npos);
}

TEST("a packed block with one byte changed is refused, not decoded to other values") {
    const std::string raw = wire_bytes(residual_rows(576, 2), wire_dtype::f32);
    std::string packed;
    boundary_compress(raw, 4, packed);
    int refused = 0;
    for (size_t at = 0; at < packed.size(); at += 7) {
        std::string bad = packed, back, error;
        bad[at] = static_cast<char>(bad[at] ^ 0x5a);
        const bool ok = boundary_decompress(bad, 4, raw.size(), raw.size(), boundary_crc32(raw), back, error);
        CHECK(!ok || back == raw); // (a flip LZ4 never reads could leave the bytes whole)
        refused += ok ? 0 : 1;
    }
    CHECK(refused > 0);
}

TEST("truncated and oversized input is refused") {
    const std::string raw = wire_bytes(residual_rows(576, 3), wire_dtype::f16);
    std::string packed, back, error;
    boundary_compress(raw, 2, packed);
    const uint32_t crc = boundary_crc32(raw);
    CHECK(!boundary_decompress(packed.substr(0, packed.size() - 1), 2, raw.size(), raw.size(), crc, back, error));
    CHECK(!boundary_decompress(packed.substr(0, packed.size() / 2), 2, raw.size(), raw.size(), crc, back, error));
    CHECK(!boundary_decompress(packed + packed, 2, raw.size(), raw.size(), crc, back, error)); // decompresses past
    CHECK(!boundary_decompress(packed + std::string(16, '\0'), 2, raw.size(), raw.size(), crc, back, error));
    CHECK(!boundary_decompress(std::string(), 2, raw.size(), raw.size(), crc, back, error));
    // a stated size the shape does not make is refused before anything is unpacked
    CHECK(!boundary_decompress(packed, 2, raw.size(), raw.size() + 2, crc, back, error));
    CHECK(error.find("states") != std::string::npos);
    // a block of a smaller boundary that the shape says is larger
    CHECK(!boundary_decompress(packed, 2, raw.size() * 2, raw.size() * 2, crc, back, error));
}

TEST("a Boundary message packs and unpacks to the same values, and an unknown encoding is refused") {
    const std::vector<float> rows = residual_rows(2 * 576, 4);
    pb::Boundary boundary;
    boundary.set_dtype(pb::BOUNDARY_DTYPE_F32);
    boundary.set_data(wire_bytes(rows, wire_dtype::f32));
    const std::string raw_bytes = boundary.data();
    boundary_pack(boundary, boundary_encoding::shuffle_lz4);
    CHECK(boundary.encoding() == pb::BOUNDARY_ENCODING_SHUFFLE_LZ4);
    CHECK_EQ(boundary.raw_size(), raw_bytes.size());
    CHECK(boundary.data().size() < raw_bytes.size());
    std::string storage, error;
    const std::string * raw = nullptr;
    CHECK(boundary_unpack(boundary, 4, raw_bytes.size(), storage, raw, error));
    CHECK(raw != nullptr && *raw == raw_bytes);

    pb::Boundary plain;
    plain.set_data(raw_bytes);
    boundary_pack(plain, boundary_encoding::raw);
    CHECK(plain.encoding() == pb::BOUNDARY_ENCODING_UNSPECIFIED && plain.data() == raw_bytes);
    CHECK(boundary_unpack(plain, 4, raw_bytes.size(), storage, raw, error) && raw == &plain.data());

    boundary.set_encoding(static_cast<pb::BoundaryEncoding>(7));
    CHECK(!boundary_unpack(boundary, 4, raw_bytes.size(), storage, raw, error));
    CHECK(error.find("not one this stage takes") != std::string::npos);
}

TEST("the flag's words parse to the encodings and back") {
    boundary_encoding encoding = boundary_encoding::raw;
    CHECK(boundary_encoding_parse("shuffle-lz4", encoding) && encoding == boundary_encoding::shuffle_lz4);
    CHECK(boundary_encoding_parse("off", encoding) && encoding == boundary_encoding::raw);
    CHECK(!boundary_encoding_parse("lz4", encoding));
    CHECK(std::strcmp(boundary_encoding_name(boundary_encoding::shuffle_lz4), "shuffle-lz4") == 0);
}

TEST_MAIN()
