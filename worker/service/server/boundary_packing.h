// boundary_packing.h - a Boundary message's encoding on a link (shard_service.proto
// BoundaryEncoding): packed by a sender whose link compresses, unpacked and checked by the
// receiver before anything reads its values or digests its bytes.
#pragma once

#include "boundary_compression.h"

#include "meshnet/shard/v1/shard_service.pb.h"

#include <cstddef>
#include <string>

namespace meshnet {

namespace pb = ::meshnet::shard::v1;

pb::BoundaryEncoding encoding_to_pb(boundary_encoding encoding);

// Packs `boundary`'s raw data in `encoding` (raw: left as it is), with the raw size and CRC-32
// the receiver checks.
void boundary_pack(pb::Boundary & boundary, boundary_encoding encoding);

// `boundary`'s raw bytes, which its shape makes `expected_size` bytes of `value_size`-byte
// values: its data as it is when raw (`raw` then points at it), else unpacked into `storage`
// and checked. False with `error` set for an encoding this worker does not take or bytes that
// do not unpack to exactly what the sender stated.
bool boundary_unpack(const pb::Boundary & boundary, size_t value_size, size_t expected_size,
                     std::string & storage, const std::string *& raw, std::string & error);

} // namespace meshnet
