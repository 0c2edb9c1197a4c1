// prefix_digest.h - what ties a cached prefix to the input its KV was computed from: on a
// stage that computes from a boundary, each block's KV is only as honest as that block's
// incoming boundary, so a slot's exact prefix keeps, beside its token ids, a chain of
// SHA-256 digests over the blocks' boundary bytes as they came over the wire, and a hit
// must name the same chain (docs/architecture.md, "Prefix cache"). The chain link:
//   d_k = SHA-256(d_{k-1} || SHA-256(block k's boundary bytes)),  d_0 empty.
// The block's own digest is taken when its step arrives (outside the engine thread), so
// only 32 bytes wait for the engine to extend a slot's chain. Forging a link takes a
// SHA-256 second preimage.
#pragma once

#include <string>
#include <string_view>

namespace meshnet {

// SHA-256 of `bytes`: 32 raw bytes.
std::string sha256_digest(std::string_view bytes);

// The chain's next link after `previous` ("" before the first block) for a block whose
// boundary bytes have the digest `block`.
std::string chain_digest(std::string_view previous, std::string_view block);

} // namespace meshnet
