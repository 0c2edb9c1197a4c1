// cuda_lane.cpp - a CUDA build refuses to start, with the reason, where it cannot serve;
// without this it would fall back to the CPU unnoticed (ggml-cuda registers no device and
// logs one line) or fail on its first allocation.
#include "cuda_lane.h"

#include "cpu_backend.h"

#ifdef MESHNET_CUDA_MAJOR
#include "ggml-backend.h"

#include <dlfcn.h>
#endif

namespace meshnet {

#ifdef MESHNET_CUDA_MAJOR
namespace {

// The driver branch each CUDA major needs (NVIDIA's CUDA release notes, table 3).
int min_driver(int cuda_major) {
    return cuda_major >= 13 ? 580 : 525;
}

// Asks the driver itself, through dlopen: a portable build's CUDA module that cannot load
// leaves no error of its own, and the driver's CUDA version says what it can run.
std::string driver_problem() {
    void * driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == nullptr) {
        return "no NVIDIA driver: libcuda.so.1 is not found (in a pod, the NVIDIA container "
               "runtime mounts it when the pod requests nvidia.com/gpu)";
    }
    using get_version_fn = int (*)(int *);
    auto get_version = reinterpret_cast<get_version_fn>(dlsym(driver, "cuDriverGetVersion"));
    int version = 0;
    if (get_version == nullptr || get_version(&version) != 0) {
        return "libcuda.so.1 is not a working NVIDIA driver (a stub library, or the kernel "
               "module is not loaded)";
    }
    if (version / 1000 < MESHNET_CUDA_MAJOR) {
        return "the NVIDIA driver runs CUDA " + std::to_string(version / 1000) + "." +
               std::to_string(version % 1000 / 10) + " at most: update it";
    }
    return "";
}

} // namespace

std::string cuda_lane_refusal() {
    const std::string lane = "this worker is built for CUDA " + std::to_string(MESHNET_CUDA_MAJOR) +
                             " (NVIDIA driver " + std::to_string(min_driver(MESHNET_CUDA_MAJOR)) +
                             " or newer) and cannot serve here: ";
    if (const std::string problem = driver_problem(); !problem.empty()) {
        return lane + problem;
    }
    std::string error;
    if (!backends_init(error)) {
        return error;
    }
    ggml_backend_reg_t cuda = ggml_backend_reg_by_name("CUDA");
    if (cuda == nullptr || ggml_backend_reg_dev_count(cuda) == 0) {
        return lane + "the driver sees no CUDA device (NVIDIA_VISIBLE_DEVICES, or the pod's "
                      "nvidia.com/gpu request)";
    }
    return "";
}
#else
std::string cuda_lane_refusal() {
    return "";
}
#endif

} // namespace meshnet
