// layer_range.cpp - see layer_range.h.
#include "layer_range.h"

#include <cstdlib>

namespace meshnet {

namespace {

bool parse_index(const std::string & text, int32_t & out) {
    if (text.empty() || text.size() > 9) {
        return false;
    }
    for (char c : text) {
        if (c < '0' || c > '9') {
            return false;
        }
    }
    out = static_cast<int32_t>(std::strtol(text.c_str(), nullptr, 10));
    return true;
}

} // namespace

std::string layer_range::str() const {
    return std::to_string(begin) + ":" + (end == to_n_layer ? std::string() : std::to_string(end));
}

bool layer_range_parse(const std::string & text, layer_range & out, std::string & error, bool open_end) {
    const size_t colon = text.find(':');
    if (colon == std::string::npos || text.find(':', colon + 1) != std::string::npos) {
        error = "layer range '" + text + "' is not of the form BEGIN:END (e.g. 0:15)";
        return false;
    }
    layer_range range;
    const std::string tail = text.substr(colon + 1);
    if (open_end && tail.empty() && parse_index(text.substr(0, colon), range.begin)) {
        range.end = layer_range::to_n_layer;
        out       = range;
        return true;
    }
    if (!parse_index(text.substr(0, colon), range.begin) || !parse_index(tail, range.end)) {
        error = "layer range '" + text + "' needs two non-negative layer indices, BEGIN:END";
        return false;
    }
    out = range;
    return true;
}

bool layer_split_parse(const std::string & text, std::vector<layer_range> & out, std::string & error) {
    std::vector<layer_range> split;
    size_t start = 0;
    while (true) {
        const size_t comma = text.find(',', start);
        const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        layer_range range;
        if (!layer_range_parse(part, range, error)) {
            error = "split '" + text + "': " + error;
            return false;
        }
        split.push_back(range);
        if (comma == std::string::npos) {
            break;
        }
        start = comma + 1;
    }
    out = std::move(split);
    return true;
}

std::string layer_range_check(const layer_range & range, int32_t n_layer) {
    if (range.begin == range.end) {
        return "layer range " + range.str() + " is empty";
    }
    if (range.begin > range.end) {
        return "layer range " + range.str() + " is reversed (BEGIN must be below END)";
    }
    if (range.begin < 0 || range.end > n_layer) {
        return "layer range " + range.str() + " is outside the model's layers 0:" + std::to_string(n_layer);
    }
    return "";
}

std::string layer_split_check(const std::vector<layer_range> & split, int32_t n_layer) {
    if (split.empty()) {
        return "a split needs at least one layer range";
    }
    int32_t next = 0;
    for (const layer_range & range : split) {
        const std::string problem = layer_range_check(range, n_layer);
        if (!problem.empty()) {
            return "split " + layer_split_str(split) + ": " + problem;
        }
        if (range.begin != next) {
            return "split " + layer_split_str(split) + " does not cover the model contiguously: " +
                   (range.begin > next ? "layers " + std::to_string(next) + ":" + std::to_string(range.begin) + " are missing"
                                       : "layers " + std::to_string(range.begin) + ":" + std::to_string(next) + " overlap")
                   + " before " + range.str();
        }
        next = range.end;
    }
    if (next != n_layer) {
        return "split " + layer_split_str(split) + " does not cover the model contiguously: layers " +
               std::to_string(next) + ":" + std::to_string(n_layer) + " are missing at the end";
    }
    return "";
}

std::string layer_split_str(const std::vector<layer_range> & split) {
    std::string out;
    for (const layer_range & range : split) {
        if (!out.empty()) {
            out += ",";
        }
        out += range.str();
    }
    return out;
}

} // namespace meshnet
