// cpu_backend.cpp - ggml backend loading with the MESHNET_CPU_VARIANT override.
#include "cpu_backend.h"

#include "ggml-backend.h"
#include "llama.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace meshnet {

namespace {

std::string executable_dir() {
    char path[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n <= 0) {
        return ".";
    }
    const std::string exe(path, static_cast<size_t>(n));
    const size_t slash = exe.rfind('/');
    return slash == std::string::npos ? "." : exe.substr(0, slash);
}

bool file_exists(const std::string & path) {
    return access(path.c_str(), R_OK) == 0;
}

const char * forced_variant() {
    const char * variant = std::getenv("MESHNET_CPU_VARIANT");
    return variant != nullptr && *variant != '\0' ? variant : nullptr;
}

// The forced CPU module, then the lane's GPU modules found beside it (ggml's own loader
// would add a second, best-scoring CPU module).
std::string load_forced(const std::string & variant) {
    const std::string dir  = executable_dir();
    const std::string path = dir + "/libggml-cpu-" + variant + ".so";
    if (!file_exists(path)) {
        return "MESHNET_CPU_VARIANT=" + variant + ": no CPU module " + path;
    }
    if (ggml_backend_load(path.c_str()) == nullptr) {
        return "MESHNET_CPU_VARIANT=" + variant + ": " + path +
               " does not load (this CPU lacks instructions it needs, or it is broken)";
    }
    for (const char * gpu : { "cuda", "hip", "vulkan" }) {
        const std::string module = dir + "/libggml-" + gpu + ".so";
        if (file_exists(module)) {
            ggml_backend_load(module.c_str());
        }
    }
    return "";
}

} // namespace

bool backends_init(std::string & error) {
    static std::once_flag once;
    static std::string    failure;
    std::call_once(once, [] {
        if (const char * variant = forced_variant()) {
#ifndef MESHNET_BACKEND_MODULES
            failure = std::string("MESHNET_CPU_VARIANT=") + variant +
                      ": this is a native build with one CPU backend compiled in; only a "
                      "portable build (meshnet worker build --portable) has variants";
            return;
#endif
            if (ggml_backend_reg_count() > 0) {
                failure = std::string("MESHNET_CPU_VARIANT=") + variant +
                          ": the backends were loaded before it could choose (call backends_init first)";
                return;
            }
            failure = load_forced(variant);
            if (!failure.empty()) {
                return;
            }
        }
        llama_backend_init(); // loads every backend when none is registered yet
    });
    error = failure;
    return failure.empty();
}

std::string cpu_backend_describe() {
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (dev == nullptr) {
        return "none";
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_features = reinterpret_cast<ggml_backend_get_features_t>(
        ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features"));
    std::string isa;
    if (get_features != nullptr) {
        for (const ggml_backend_feature * f = get_features(reg); f->name != nullptr; ++f) {
            // instruction sets only (OPENMP, REPACK, ... are not), each reported as "1"
            const bool simd = std::strncmp(f->name, "SSE", 3) == 0 || std::strncmp(f->name, "AVX", 3) == 0 ||
                              std::strcmp(f->name, "F16C") == 0 || std::strcmp(f->name, "FMA") == 0 ||
                              std::strcmp(f->name, "BMI2") == 0 || std::strncmp(f->name, "AMX", 3) == 0;
            if (simd && std::strcmp(f->value, "1") == 0) {
                isa += (isa.empty() ? "" : " ") + std::string(f->name);
            }
        }
    }
    const char * variant = forced_variant();
    return (isa.empty() ? std::string("x64") : isa) +
           (variant != nullptr ? std::string(" (MESHNET_CPU_VARIANT=") + variant + ")" : std::string());
}

} // namespace meshnet
