// bench_oracle.cpp - see bench_oracle.h. Linked only into meshnet-shard-worker-bench: at
// start it reads MESHNET_BENCH_ORACLE and, when set, has every decode loop draft with it.
#include "bench_oracle.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace meshnet {

namespace {

// A uniform draw in [0, 1) fixed by the seed and the position (splitmix64).
double coin(uint64_t seed, uint64_t position) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (position + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) / static_cast<double>(1ULL << 53);
}

} // namespace

bool bench_oracle_read(const std::string & path, bench_oracle_config & config, std::string & error) {
    std::ifstream in(path);
    std::string   header;
    if (!in || !std::getline(in, header)) {
        error = "cannot read " + path;
        return false;
    }
    bool has_p = false;
    std::stringstream parts(header);
    std::string part;
    while (std::getline(parts, part, ',')) {
        const size_t eq = part.find('=');
        const std::string key = part.substr(0, eq);
        const std::string value = eq == std::string::npos ? "" : part.substr(eq + 1);
        char * end = nullptr;
        if (key == "p") {
            config.acceptance = std::strtod(value.c_str(), &end);
            has_p = !value.empty() && *end == '\0' && config.acceptance >= 0 && config.acceptance <= 1;
            if (!has_p) {
                error = path + ": p must be a number from 0 to 1, not '" + value + "'";
                return false;
            }
        } else if (key == "seed") {
            config.seed = std::strtoull(value.c_str(), &end, 10);
            if (value.empty() || *end != '\0') {
                error = path + ": seed must be a whole number, not '" + value + "'";
                return false;
            }
        } else {
            error = path + ": unknown key '" + key + "' (p, seed)";
            return false;
        }
    }
    if (!has_p) {
        error = path + ": its first line must set p (p=0.8,seed=1)";
        return false;
    }
    long long id = 0;
    while (in >> id) {
        config.sequence.push_back(static_cast<int32_t>(id));
    }
    if (!in.eof() || config.sequence.empty()) {
        error = path + ": after its first line it must hold token ids separated by white space";
        return false;
    }
    return true;
}

bench_oracle_drafter::bench_oracle_drafter(bench_oracle_config config, int most,
                                           const std::vector<int32_t> & context)
    : config_(std::move(config)), most_(most) {
    commit(context);
}

void bench_oracle_drafter::answered(const std::vector<int32_t> &, const std::vector<int32_t> & produced) {
    commit(produced);
}

void bench_oracle_drafter::commit(const std::vector<int32_t> & tokens) {
    for (int32_t token : tokens) {
        on_sequence_ = on_sequence_ && committed_ < config_.sequence.size() && config_.sequence[committed_] == token;
        ++committed_;
    }
}

std::vector<int32_t> bench_oracle_drafter::drafts_from(size_t position, int room) const {
    std::vector<int32_t> drafts;
    if (!on_sequence_) {
        return drafts;
    }
    for (size_t at = position; at < config_.sequence.size() && static_cast<int>(drafts.size()) < room; ++at) {
        const int32_t truth = config_.sequence[at];
        const bool    right = coin(config_.seed, at) < config_.acceptance;
        drafts.push_back(right ? truth : (truth == 0 ? 1 : truth - 1));
    }
    return drafts;
}

namespace {

const char * oracle_path = nullptr;

std::unique_ptr<loop_draft_source> make_oracle(int most, const std::vector<int32_t> & context) {
    bench_oracle_config config;
    std::string         error;
    if (!bench_oracle_read(oracle_path, config, error)) {
        // a benchmark's setup is wrong: its figures would be too
        std::fprintf(stderr, "error: MESHNET_BENCH_ORACLE: %s\n", error.c_str());
        std::exit(2);
    }
    return std::make_unique<bench_oracle_drafter>(std::move(config), most, context);
}

// Runs before main: installs the oracle when MESHNET_BENCH_ORACLE names its file.
const bool installed = [] {
    oracle_path = std::getenv("MESHNET_BENCH_ORACLE");
    if (oracle_path == nullptr || *oracle_path == '\0') {
        return false;
    }
    bench_loop_draft_source = make_oracle;
    std::fprintf(stderr, "meshnet-shard-worker-bench: decode loops draft from %s\n", oracle_path);
    return true;
}();

} // namespace

} // namespace meshnet
