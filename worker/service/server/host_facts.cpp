// host_facts.cpp - boot id from /proc, compute CPUs from GOMP_CPU_AFFINITY or the mask.
#include "host_facts.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace meshnet {

std::string host_boot_id() {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(in, id);
    return id;
}

std::vector<int32_t> parse_cpu_list(const std::string & text) {
    std::string spaced = text;
    std::replace(spaced.begin(), spaced.end(), ',', ' ');
    std::istringstream words(spaced);
    std::vector<int32_t> cpus;
    std::string word;
    while (words >> word) {
        const size_t dash = word.find('-');
        const std::string first = word.substr(0, dash);
        const std::string last  = dash == std::string::npos ? first : word.substr(dash + 1);
        if (first.empty() || last.empty() ||
            first.find_first_not_of("0123456789") != std::string::npos ||
            last.find_first_not_of("0123456789") != std::string::npos) {
            return {}; // strides and other forms: not ours to interpret
        }
        const long begin = std::strtol(first.c_str(), nullptr, 10);
        const long end   = std::strtol(last.c_str(), nullptr, 10);
        if (end < begin || end >= CPU_SETSIZE) {
            return {};
        }
        for (long cpu = begin; cpu <= end; ++cpu) {
            cpus.push_back(static_cast<int32_t>(cpu));
        }
    }
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
}

std::vector<int32_t> compute_cpus() {
    if (const char * bound = std::getenv("GOMP_CPU_AFFINITY")) {
        std::vector<int32_t> cpus = parse_cpu_list(bound);
        if (!cpus.empty()) {
            return cpus;
        }
    }
    std::vector<int32_t> cpus;
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
        for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
            if (CPU_ISSET(cpu, &mask)) {
                cpus.push_back(cpu);
            }
        }
    }
    return cpus;
}

compute_placement read_placement(int32_t threads, int32_t gpu_layers) {
    compute_placement placement;
    placement.host_id    = host_boot_id();
    placement.cpus       = compute_cpus();
    placement.threads    = threads;
    placement.gpu_layers = gpu_layers;
    return placement;
}

} // namespace meshnet
