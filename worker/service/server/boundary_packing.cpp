// boundary_packing.cpp - see boundary_packing.h.
#include "boundary_packing.h"

#include <utility>

namespace meshnet {

pb::BoundaryEncoding encoding_to_pb(boundary_encoding encoding) {
    return encoding == boundary_encoding::shuffle_lz4 ? pb::BOUNDARY_ENCODING_SHUFFLE_LZ4
                                                      : pb::BOUNDARY_ENCODING_UNSPECIFIED;
}

void boundary_pack(pb::Boundary & boundary, boundary_encoding encoding) {
    if (encoding == boundary_encoding::raw || boundary.encoding() != pb::BOUNDARY_ENCODING_UNSPECIFIED) {
        return;
    }
    const size_t value_size = boundary.dtype() == pb::BOUNDARY_DTYPE_F32 ? 4 : 2;
    std::string packed;
    boundary_compress(boundary.data(), value_size, packed);
    boundary.set_raw_size(boundary.data().size());
    boundary.set_raw_crc32(boundary_crc32(boundary.data()));
    boundary.set_encoding(encoding_to_pb(encoding));
    boundary.set_data(std::move(packed));
}

bool boundary_unpack(const pb::Boundary & boundary, size_t value_size, size_t expected_size,
                     std::string & storage, const std::string *& raw, std::string & error) {
    switch (boundary.encoding()) {
        case pb::BOUNDARY_ENCODING_UNSPECIFIED:
            raw = &boundary.data();
            return true;
        case pb::BOUNDARY_ENCODING_SHUFFLE_LZ4:
            if (!boundary_decompress(boundary.data(), value_size, expected_size, boundary.raw_size(),
                                     boundary.raw_crc32(), storage, error)) {
                return false;
            }
            raw = &storage;
            return true;
        default:
            error = "boundary encoding " + std::to_string(static_cast<int>(boundary.encoding())) +
                    " is not one this stage takes";
            return false;
    }
}

} // namespace meshnet
