// exactness_cache.h - a start-up probe's result (exactness_probe.h) kept on disk for the next
// start of the same binary on the same weights, device and settings. Only where
// MESHNET_EXACTNESS_CACHE names a directory (the test suites, which start hundreds of workers
// of a few models); unset, every start measures. The key is every input the probe depends on,
// written out whole in the entry, so an entry is only ever taken for exactly those inputs.
#pragma once

#include "exactness_probe.h"

#include <optional>
#include <string>
#include <vector>

namespace meshnet {

// The directory MESHNET_EXACTNESS_CACHE names ("" when unset or empty).
std::string exactness_cache_dir();

// What a probe's result depends on, one "name=value" per item: files are named by their
// resolved path, size and modification time.
std::string exactness_key(const std::vector<std::pair<std::string, std::string>> & inputs);
std::string file_identity(const std::string & path);

std::optional<exactness> load_exactness(const std::string & dir, const std::string & key);
void store_exactness(const std::string & dir, const std::string & key, const exactness & result);

} // namespace meshnet
