// host_facts.h - where this worker computes (GetInfo's ComputePlacement): the host's boot
// id and the CPUs its compute threads may use, read once at start.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshnet {

// The kernel's boot id ("" when unreadable): equal for every process on one host.
std::string host_boot_id();

// The CPUs of GOMP_CPU_AFFINITY when it binds the compute threads (a list of CPU numbers
// and ranges, as `meshnet worker run --cpus` sets it), else the process's affinity mask.
// Call before the engine starts its threads: binding narrows the mask afterwards.
std::vector<int32_t> compute_cpus();

// "0 1", "0,1", "2-5": the CPUs named, sorted and unique; empty when anything else.
std::vector<int32_t> parse_cpu_list(const std::string & text);

// What GetInfo reports so a driver can tell stages that take turns on the same CPUs.
struct compute_placement {
    std::string          host_id;
    std::vector<int32_t> cpus;
    int32_t              threads    = 0;
    int32_t              gpu_layers = 0;
};

// This process's placement; call before the engine starts (see compute_cpus).
compute_placement read_placement(int32_t threads, int32_t gpu_layers);

} // namespace meshnet
