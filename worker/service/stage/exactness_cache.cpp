// exactness_cache.cpp - see exactness_cache.h.
#include "exactness_cache.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace meshnet {

namespace {

// FNV-1a: names the entry's file; the entry holds the whole key, which a load compares.
std::string file_name(const std::string & key) {
    uint64_t hash = 1469598103934665603ULL;
    for (unsigned char c : key) {
        hash = (hash ^ c) * 1099511628211ULL;
    }
    char name[32];
    std::snprintf(name, sizeof(name), "%016llx.exactness", static_cast<unsigned long long>(hash));
    return name;
}

} // namespace

std::string exactness_cache_dir() {
    const char * dir = std::getenv("MESHNET_EXACTNESS_CACHE");
    return dir ? dir : "";
}

std::string file_identity(const std::string & path) {
    char * resolved = realpath(path.c_str(), nullptr);
    const std::string name = resolved ? resolved : path;
    std::free(resolved);
    struct stat st {};
    if (stat(name.c_str(), &st) != 0) {
        return name + " (missing)";
    }
    return name + " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
           std::to_string(st.st_mtim.tv_nsec);
}

std::string exactness_key(const std::vector<std::pair<std::string, std::string>> & inputs) {
    std::string key;
    for (const auto & [name, value] : inputs) {
        key += name + "=" + value + "\n";
    }
    return key;
}

std::optional<exactness> load_exactness(const std::string & dir, const std::string & key) {
    std::ifstream in(dir + "/" + file_name(key));
    if (!in) {
        return std::nullopt;
    }
    std::stringstream text;
    text << in.rdbuf();
    const std::string entry = text.str();
    if (entry.compare(0, key.size(), key) != 0) {
        return std::nullopt; // another key with the same file name
    }
    std::istringstream rest(entry.substr(key.size()));
    exactness result;
    int batching = 0;
    if (!(rest >> result.step_rows >> batching)) {
        return std::nullopt;
    }
    result.batching = batching != 0;
    rest.ignore(1);
    std::getline(rest, result.detail);
    return result;
}

void store_exactness(const std::string & dir, const std::string & key, const exactness & result) {
    mkdir(dir.c_str(), 0755);
    const std::string path = dir + "/" + file_name(key);
    const std::string partial = path + "." + std::to_string(getpid());
    {
        std::ofstream out(partial);
        out << key << result.step_rows << " " << (result.batching ? 1 : 0) << "\n" << result.detail << "\n";
        if (!out) {
            std::remove(partial.c_str());
            return; // a cache that cannot be written only costs the next start a probe
        }
    }
    std::rename(partial.c_str(), path.c_str()); // whole or not at all, for workers starting together
}

} // namespace meshnet
