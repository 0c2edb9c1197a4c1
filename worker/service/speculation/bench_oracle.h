// bench_oracle.h - a drafter for benchmarks only (meshnet-shard-worker-bench): it knows a
// plain run's tokens and proposes each next one with probability p, else a wrong one, so
// the ring's pipelined speculation can be measured at a set acceptance. Never linked into
// meshnet-shard-worker.
#pragma once

#include "loop_drafts.h"

#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

struct bench_oracle_config {
    double               acceptance = 0;  // p: the chance each drafted token is the true one
    uint64_t             seed       = 0;
    std::vector<int32_t> sequence;        // the prompt, then its plain continuation
};

// An oracle file: its first line `p=0.8,seed=1`, then the sequence's token ids separated
// by white space. MESHNET_BENCH_ORACLE names the file, read again as each decode loop
// starts, so a bench can set another acceptance or sequence without restarting workers.
bool bench_oracle_read(const std::string & path, bench_oracle_config & config, std::string & error);

// Drafts the sequence's next tokens while the loop's committed tokens are a prefix of it
// (else nothing), at each position the true token with probability p (a coin fixed by the
// seed and the position, so a re-drafted position draws the same), always the full length.
class bench_oracle_drafter : public loop_draft_source {
public:
    bench_oracle_drafter(bench_oracle_config config, int most, const std::vector<int32_t> & context);

    void answered(const std::vector<int32_t> & fed, const std::vector<int32_t> & produced) override;
    std::vector<int32_t> next(int room) const override { return drafts_from(committed_, room); }
    std::vector<int32_t> after(const std::vector<int32_t> & tail, int room) const override {
        return drafts_from(committed_ + tail.size(), room);
    }
    int wanted() const override { return most_; }

private:
    void                 commit(const std::vector<int32_t> & tokens);
    std::vector<int32_t> drafts_from(size_t position, int room) const;

    const bench_oracle_config config_;
    const int                   most_;
    size_t                      committed_ = 0;   // tokens the loop holds
    bool                        on_sequence_ = true; // they are the sequence's first ones
};

} // namespace meshnet
