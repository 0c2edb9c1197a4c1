// boundary_codec.cpp - dtype conversions for boundary rows (host byte order is
// little-endian on every lane we build).
#include "boundary_codec.h"

#include <cmath>
#include <cstring>

namespace meshnet {

size_t wire_dtype_size(wire_dtype dtype) {
    return dtype == wire_dtype::f32 ? 4 : 2;
}

const char * wire_dtype_name(wire_dtype dtype) {
    switch (dtype) {
        case wire_dtype::f32:  return "f32";
        case wire_dtype::f16:  return "f16";
        case wire_dtype::bf16: return "bf16";
    }
    return "?";
}

bool wire_dtype_parse(const std::string & name, wire_dtype & out) {
    if (name == "f32")  { out = wire_dtype::f32;  return true; }
    if (name == "f16")  { out = wire_dtype::f16;  return true; }
    if (name == "bf16") { out = wire_dtype::bf16; return true; }
    return false;
}

static uint32_t float_bits(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    return bits;
}

static float bits_float(uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    return value;
}

uint16_t f32_to_f16(float value) {
    const uint32_t bits = float_bits(value);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t abs  = bits & 0x7fffffffu;
    if (abs >= 0x7f800000u) {                       // inf or nan
        return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) {                       // rounds past 65504
        return static_cast<uint16_t>(sign | 0x7c00u);
    }
    if (abs < 0x38800000u) {                        // f16 subnormal or zero
        if (abs < 0x33000000u) {
            return sign;
        }
        const uint32_t exponent = abs >> 23;
        const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
        const uint32_t shift    = 126u - exponent;  // 14 + (112 - exponent + 1) - 1
        uint32_t half = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (half & 1u))) {
            half++;
        }
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = ((abs - 0x38000000u) >> 13);     // rebias exponent 127 -> 15
    const uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) {
        half++;
    }
    return static_cast<uint16_t>(sign | half);
}

float f16_to_f32(uint16_t value) {
    const uint32_t sign     = static_cast<uint32_t>(value & 0x8000u) << 16;
    const uint32_t exponent = (value >> 10) & 0x1fu;
    const uint32_t mantissa = value & 0x3ffu;
    if (exponent == 0) {
        const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31) {
        return bits_float(sign | 0x7f800000u | (mantissa << 13));
    }
    return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t f32_to_bf16(float value) {
    const uint32_t bits = float_bits(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return static_cast<uint16_t>((bits >> 16) | 0x40u); // keep it a (quiet) nan
    }
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>((bits + rounding) >> 16);
}

float bf16_to_f32(uint16_t value) {
    return bits_float(static_cast<uint32_t>(value) << 16);
}

void boundary_encode(const float * values, size_t n, wire_dtype dtype, std::string & out) {
    const size_t offset = out.size();
    out.resize(offset + n * wire_dtype_size(dtype));
    char * dst = &out[offset];
    switch (dtype) {
        case wire_dtype::f32:
            std::memcpy(dst, values, n * sizeof(float));
            break;
        case wire_dtype::f16:
            for (size_t i = 0; i < n; ++i) {
                const uint16_t half = f32_to_f16(values[i]);
                std::memcpy(dst + 2 * i, &half, 2);
            }
            break;
        case wire_dtype::bf16:
            for (size_t i = 0; i < n; ++i) {
                const uint16_t half = f32_to_bf16(values[i]);
                std::memcpy(dst + 2 * i, &half, 2);
            }
            break;
    }
}

bool boundary_decode(const std::string & bytes, size_t n, wire_dtype dtype,
                     std::vector<float> & out, std::string & error) {
    const size_t width = wire_dtype_size(dtype);
    if (bytes.size() != n * width) {
        error = "boundary holds " + std::to_string(bytes.size()) + " bytes, expected " +
                std::to_string(n * width) + " (" + std::to_string(n) + " x " + wire_dtype_name(dtype) + ")";
        return false;
    }
    out.resize(n);
    const char * src = bytes.data();
    if (dtype == wire_dtype::f32) {
        std::memcpy(out.data(), src, n * sizeof(float));
    } else {
        for (size_t i = 0; i < n; ++i) {
            uint16_t half;
            std::memcpy(&half, src + 2 * i, 2);
            out[i] = dtype == wire_dtype::f16 ? f16_to_f32(half) : bf16_to_f32(half);
        }
    }
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(out[i])) {
            error = "boundary value " + std::to_string(i) + " is not finite (NaN/Inf are rejected)";
            return false;
        }
    }
    return true;
}

} // namespace meshnet
