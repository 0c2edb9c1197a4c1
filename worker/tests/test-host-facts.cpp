// test-host-facts.cpp - the compute CPUs GetInfo reports: GOMP_CPU_AFFINITY's lists as
// `meshnet worker run --cpus` writes them (and as people write them by hand), else the
// process's mask; forms we do not read fall back to the mask rather than guess.
#include "service_test.h"

#include "host_facts.h"

#include <sched.h>

#include <cstdlib>

using meshnet::parse_cpu_list;
using cpus = std::vector<int32_t>;

TEST("cpu lists of numbers and ranges read as sorted unique cpus") {
    CHECK(parse_cpu_list("0 1") == cpus({0, 1}));
    CHECK(parse_cpu_list("3,1, 2") == cpus({1, 2, 3}));
    CHECK(parse_cpu_list("2-5 0") == cpus({0, 2, 3, 4, 5}));
    CHECK(parse_cpu_list("0 0 1") == cpus({0, 1}));
}

TEST("other cpu list forms are not interpreted") {
    CHECK(parse_cpu_list("").empty());
    CHECK(parse_cpu_list("0-7:2").empty()); // libgomp's strides
    CHECK(parse_cpu_list("5-3").empty());
    CHECK(parse_cpu_list("one").empty());
    CHECK(parse_cpu_list("-1").empty());
}

TEST("compute cpus follow GOMP_CPU_AFFINITY, else the process mask") {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    CHECK(sched_getaffinity(0, sizeof mask, &mask) == 0);
    cpus allowed;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &mask)) allowed.push_back(cpu);
    }
    unsetenv("GOMP_CPU_AFFINITY");
    CHECK(meshnet::compute_cpus() == allowed);
    setenv("GOMP_CPU_AFFINITY", "7 3", 1);
    CHECK(meshnet::compute_cpus() == cpus({3, 7}));
    setenv("GOMP_CPU_AFFINITY", "0-7:2", 1);
    CHECK(meshnet::compute_cpus() == allowed);
    unsetenv("GOMP_CPU_AFFINITY");
    CHECK(!meshnet::host_boot_id().empty()); // Linux: /proc/sys/kernel/random/boot_id
}

TEST_MAIN()
