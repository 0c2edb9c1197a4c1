// test-boundary-codec.cpp - wire dtypes: exact where they can be, rounding to nearest
// even, and the NaN/Inf policy (rejected on decode).
#include "boundary_codec.h"
#include "service_test.h"

#include <cmath>
#include <limits>

using namespace meshnet;

TEST("f16 round trips every value it can represent exactly") {
    for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(3.0f, -20), -1000.5f}) {
        CHECK_EQ(f16_to_f32(f32_to_f16(v)), v);
    }
}

TEST("f16 rounds to nearest even and overflows to infinity") {
    CHECK_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 4096.0f)), 1.0f);          // halfway: to even
    CHECK_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 2048.0f)), 1.0f + 2.0f / 1024.0f); // halfway: to even
    CHECK_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 4096.0f)), 1.0f + 1.0f / 1024.0f);
    CHECK(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
    CHECK_EQ(f16_to_f32(f32_to_f16(1e-9f)), 0.0f);
}

TEST("bf16 keeps the f32 exponent and rounds the mantissa to nearest even") {
    CHECK_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
    CHECK(std::fabs(bf16_to_f32(f32_to_bf16(3.0e38f)) / 3.0e38f - 1.0f) < 0.004f);
    CHECK(std::fabs(bf16_to_f32(f32_to_bf16(3.14159f)) - 3.140625f) < 1e-6f);
    CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST("a boundary decodes back to what was encoded in every dtype") {
    const std::vector<float> values{0.5f, -1.25f, 3.0f, 100.0f};
    for (wire_dtype dtype : {wire_dtype::f32, wire_dtype::f16, wire_dtype::bf16}) {
        std::string bytes;
        boundary_encode(values.data(), values.size(), dtype, bytes);
        CHECK_EQ(bytes.size(), values.size() * wire_dtype_size(dtype));
        std::vector<float> decoded;
        std::string error;
        CHECK(boundary_decode(bytes, values.size(), dtype, decoded, error));
        CHECK(decoded == values);
    }
}

TEST("a boundary with the wrong byte length is refused") {
    std::string error;
    std::vector<float> out;
    CHECK(!boundary_decode(std::string(15, '\0'), 4, wire_dtype::f32, out, error));
    CHECK(error.find("bytes") != std::string::npos);
}

TEST("a boundary holding NaN or Inf is refused") {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        for (wire_dtype dtype : {wire_dtype::f32, wire_dtype::f16, wire_dtype::bf16}) {
            const std::vector<float> values{1.0f, bad};
            std::string bytes, error;
            boundary_encode(values.data(), values.size(), dtype, bytes);
            std::vector<float> out;
            CHECK(!boundary_decode(bytes, values.size(), dtype, out, error));
            CHECK(error.find("not finite") != std::string::npos);
        }
    }
}

TEST_MAIN()
