// boundary_compression.h - lossless compression of a boundary's wire bytes for a slow link:
// the values' bytes regrouped into byte planes (every value's byte 0, then every byte 1, ...),
// which puts the slowly varying sign/exponent bytes together, then one LZ4 block. The receiver
// gets the raw size and a CRC-32 (zlib's) of the raw bytes beside it and refuses anything that
// does not come back to exactly those bytes: never a silently wrong value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshnet {

enum class boundary_encoding { raw, shuffle_lz4 };

// "off" / "shuffle-lz4" (the worker flag's words).
const char * boundary_encoding_name(boundary_encoding encoding);
bool         boundary_encoding_parse(const std::string & name, boundary_encoding & out);

// zlib's CRC-32 of `bytes`.
uint32_t boundary_crc32(const std::string & bytes);

// `raw` (values of `value_size` bytes each, so its size is a multiple of it) as byte planes,
// then one LZ4 block, into `out` (replaced).
void boundary_compress(const std::string & raw, size_t value_size, std::string & out);

// The inverse: `packed` back into `raw` (replaced), which must come out exactly
// `expected_size` bytes (what the boundary's shape and dtype make; a multiple of `value_size`),
// the size the sender states (`raw_size`), with CRC-32 `raw_crc32`. False with `error` set on
// anything else: a stated size the shape does not make, a block that does not decompress to
// exactly that size (truncated, oversized, not LZ4), or a checksum mismatch. Nothing larger than
// `expected_size` is ever allocated.
bool boundary_decompress(const std::string & packed, size_t value_size, size_t expected_size, uint64_t raw_size,
                         uint32_t raw_crc32, std::string & raw, std::string & error);

} // namespace meshnet
