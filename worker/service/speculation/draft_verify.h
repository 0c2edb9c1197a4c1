// draft_verify.h - the worker's part of speculative decoding: dropping the KV of rejected
// draft tokens (ForwardRequest.discard_from) and verifying drafts at the last stage
// (OUTPUT_KIND_VERIFIED). The route driver proposes the drafts.
#pragma once

#include "engine.h"
#include "error_info.h"
#include "sampling.h"

#include "meshnet/shard/v1/shard_service.pb.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace meshnet {

// Request checks for `discard_from` (before the step is queued): the stage must be able
// to discard, and the step must build on exactly the positions kept.
std::optional<shard_error> check_discard(const ::meshnet::shard::v1::ForwardRequest & request,
                                         const engine_info & info);

// On the engine thread, before the step's n_past check: drops the slot's positions >= `from`.
// A slot holding no more than `from` is left alone (holding fewer is the CACHE_MISS the
// n_past check then answers). DISCARD_TOO_DEEP (metadata: discard_depth, the positions the
// slot can drop now; positions, those asked) where the memory cannot restore that far.
std::optional<shard_error> discard_suffix(engine_i & engine, int32_t slot, int64_t from);

// Verification of a step's tokens [t0, d1, .., dk] from its rows' logits (row i predicts
// the token after t_i): each row is sampled as OUTPUT_KIND_SAMPLED would (same params, the
// draw of its position), and the samples are kept up to and including the first that is
// not the next draft. For a draft d that accepts with probability p(d), and a rejection
// yields a token drawn from p with d removed (renormalised): the standard rule for a
// deterministic draft, with the very tokens plain decoding would sample.
std::vector<int32_t> verify_drafts(const float * logits, int32_t n_vocab, const sampling_params & params,
                                   const std::vector<int32_t> & positions, const std::vector<int32_t> & tokens);

} // namespace meshnet
