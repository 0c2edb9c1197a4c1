// boundary_codec.h - boundary rows between f32 (engine) and the wire dtype (f32, f16,
// bf16, little-endian), with the NaN/Inf policy: non-finite input is rejected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

enum class wire_dtype { f32, f16, bf16 };

size_t      wire_dtype_size(wire_dtype dtype);
const char * wire_dtype_name(wire_dtype dtype);
bool        wire_dtype_parse(const std::string & name, wire_dtype & out);

uint16_t f32_to_f16(float value);   // round to nearest even; overflow -> inf
float    f16_to_f32(uint16_t value);
uint16_t f32_to_bf16(float value);  // round to nearest even
float    bf16_to_f32(uint16_t value);

// Appends n values in `dtype` to `out`.
void boundary_encode(const float * values, size_t n, wire_dtype dtype, std::string & out);

// Decodes `bytes` (exactly n values of `dtype`) into `out`; false with `error` set on a
// length mismatch or a non-finite value.
bool boundary_decode(const std::string & bytes, size_t n, wire_dtype dtype,
                     std::vector<float> & out, std::string & error);

} // namespace meshnet
