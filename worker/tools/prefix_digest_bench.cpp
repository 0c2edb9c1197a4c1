// meshnet-prefix-digest-bench: what the prefix cache's boundary digest costs a stage per
// block (prefix_digest.h): SHA-256 over one grid block's boundary bytes plus the chain
// link, as a stage takes it for the block it receives and for the block it sends on.
//   meshnet-prefix-digest-bench [ROW_FLOATS BLOCK [DTYPE_BYTES]]
// With no arguments: SmolLM2 (576-float rows, block 128) and deepseek4 V4 (4 x 4096-float
// rows, block 512), f32 on the wire. Prints microseconds per block (min / median of runs).
#include "prefix_digest.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

void measure(const char * name, size_t row_floats, size_t block, size_t dtype_bytes) {
    std::string bytes(row_floats * block * dtype_bytes, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
        bytes[i] = static_cast<char>((i * 2654435761u) >> 13); // not all zeros
    }
    const size_t runs = std::max<size_t>(5, std::min<size_t>(200, (512u << 20) / bytes.size()));
    std::vector<double> micros;
    std::string link;
    for (size_t run = 0; run < runs; ++run) {
        const auto started = std::chrono::steady_clock::now();
        link = meshnet::chain_digest(link, meshnet::sha256_digest(bytes));
        micros.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count());
    }
    std::sort(micros.begin(), micros.end());
    const double median = micros[micros.size() / 2];
    std::printf("%-10s rows %zu x %zu B x block %zu = %.1f KiB: %.1f us/block min, %.1f median (%.2f GB/s), %zu runs\n",
                name, row_floats, dtype_bytes, block, static_cast<double>(bytes.size()) / 1024.0, micros.front(),
                median, static_cast<double>(bytes.size()) / median / 1e3, runs);
}

} // namespace

int main(int argc, char ** argv) {
    if (argc >= 3) {
        measure("custom", std::strtoul(argv[1], nullptr, 10), std::strtoul(argv[2], nullptr, 10),
                argc >= 4 ? std::strtoul(argv[3], nullptr, 10) : 4);
        return 0;
    }
    measure("SmolLM2", 576, 128, 4);
    measure("V4", 4 * 4096, 512, 4);
    return 0;
}
